//! An echo server and a load-generating client on the async layer
//! (`rdma::aio`, tokio, one thread each).
//!
//! ```text
//! async_echo -s [-a addr] [-p port] [-N clients] [-S size] [-D depth] [-T]
//! async_echo -c -a addr [-p port] [-n connections] [-m messages] [-S size] [-D depth]
//! ```
//!
//! `-T` runs the same server on the blocking layer instead, one thread per
//! connection (`rdma::cm::blocking`, `CompletionQueue::wait`): the baseline
//! the async server is compared with.
//!
//! The server accepts connections (all at once, one task each) and sends
//! every message back; it exits after `-N` clients have come and gone (0:
//! serves until killed). Messages are `-S` bytes on both sides. Its receive
//! buffers come from a
//! [`rdma::BufferPool`]: a received buffer is sent back as it is (the memory
//! moves from the receive's completion into the echo's request) and returns
//! to the pool with the echo's completion.
//!
//! The client opens `-n` connections at once, keeps `-D` messages in flight
//! on each until `-m` have come back, and prints how long the connections
//! took to come up and the rate, timed from when the last one was up:
//!
//! ```text
//! 8 connections up in 0.052 s
//! 8 connections x 1000 messages of 64 bytes: 8000 echoes in 1.234 s, 6483 messages/s
//! ```

mod common;

use anyhow::{anyhow, Context as _};
use std::cell::Cell;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration, Instant};

use common::args::{ArgError, Cli, Flag, Parsed};
use common::{Report, Res};
use rdma::aio::{tokio_rt as rt, AsyncCq, CmChannel, Incoming};
use rdma::cm::{ConnParam, PortSpace};
use rdma::{AccessFlags, BufferPool, QpState, QpType, SendWr, WcOpcode, WcStatus};

const CLI: Cli<'static, char> = Cli {
    name: "async_echo",
    usage: "  async_echo -s [-a addr] [-p port] [-N clients] [-S size] [-D depth] [-T]\n  \
            async_echo -c -a addr [-p port] [-n connections] [-m messages] [-S size] [-D depth]",
    flags: &[
        Flag::switch('s', 's', "", "be the server"),
        Flag::switch('c', 'c', "", "be the client"),
        Flag::value(
            'a',
            'a',
            "",
            "addr",
            "the server's IP address (default: any)",
        ),
        Flag::value('p', 'p', "", "port", "the port (default 7175)"),
        Flag::value(
            'N',
            'N',
            "",
            "clients",
            "server: exit after this many clients (default 0: serve until killed)",
        ),
        Flag::switch(
            'T',
            'T',
            "",
            "server: the blocking layer, one thread per connection",
        ),
        Flag::value(
            'n',
            'n',
            "",
            "connections",
            "client: connections at once (default 1)",
        ),
        Flag::value(
            'm',
            'm',
            "",
            "messages",
            "client: messages per connection (default 1000)",
        ),
        Flag::value('S', 'S', "", "size", "bytes per message (default 64)"),
        Flag::value(
            'D',
            'D',
            "",
            "depth",
            "messages in flight per connection, 1 to 256 (default 8)",
        ),
    ],
    bad_exit: libc::EINVAL as u8,
};

const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);
/// Receive work requests have this bit; sends do not.
const RECV: u64 = 1 << 63;

#[derive(Debug, Clone)]
struct Opts {
    server: bool,
    addr: IpAddr,
    port: u16,
    clients: u64,
    connections: u64,
    messages: u64,
    size: usize,
    depth: u32,
    threads: bool,
}

fn parse(args: Parsed<char>) -> Result<Opts, ArgError> {
    args.no_operands()?;
    let mut o = Opts {
        server: false,
        addr: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        port: 7175,
        clients: 0,
        connections: 1,
        messages: 1000,
        size: 64,
        depth: 8,
        threads: false,
    };
    let mut side = None;
    for f in args.flags {
        match f.key {
            's' => side = Some(true),
            'c' => side = Some(false),
            'T' => o.threads = true,
            'a' => o.addr = f.value.parse().map_err(|_| f.bad("an IP address"))?,
            'p' => o.port = f.number("a port, 0 to 65535")?,
            'N' => o.clients = f.number("a count")?,
            'n' => o.connections = f.number::<u64>("a count")?.max(1),
            'm' => o.messages = f.number::<u64>("a count")?.max(1),
            'S' => o.size = f.number::<usize>("a size in bytes")?.max(1),
            'D' => o.depth = f.number::<u32>("a depth")?.clamp(1, 256),
            _ => unreachable!("the flags of CLI"),
        }
    }
    o.server = side.ok_or_else(|| ArgError::Bad("one of -s or -c is required".into()))?;
    Ok(o)
}

fn main() -> ExitCode {
    let o = match CLI.read(parse) {
        Ok(o) => o,
        Err(code) => return code,
    };
    if o.server && o.threads {
        return match threaded::server(&o) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("async_echo: {}", common::Report(&e));
                ExitCode::FAILURE
            }
        };
    }
    // The I/O driver only: nothing here sleeps on tokio's timers, and an
    // enabled time driver would be consulted at every park, a cost paid on
    // every echo.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("a tokio runtime");
    // The server's tasks are spawned on the runtime itself, not on a
    // `LocalSet`, whose scheduling is another cost on every echo; the
    // client's share an `Rc` and run on a `LocalSet`.
    let result = if o.server {
        runtime.block_on(server(o))
    } else {
        tokio::task::LocalSet::new().block_on(&runtime, client(o))
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("async_echo: {}", common::Report(&e));
            ExitCode::FAILURE
        }
    }
}

/// A CQ with a channel of its own, awaited on tokio, and an RC QP on it.
fn endpoint(
    ctx: &rdma::Context,
    pd: &rdma::ProtectionDomain,
    depth: u32,
) -> Res<(rdma::QueuePair, AsyncCq)> {
    let channel = ctx.create_comp_channel().context("channel")?;
    let cq = ctx
        .create_cq(depth * 4, Some(&channel), 0)
        .context("ibv_create_cq")?;
    let acq = rt::completions(&cq).context("rdma::aio")?;
    let qp = pd
        .qp_builder(QpType::Rc, &cq, &cq)
        .max_send_wr(depth)
        .max_recv_wr(depth)
        .build()
        .context("ibv_create_qp")?;
    Ok((qp, acq))
}

// ---------------------------------------------------------------------------
// Server

async fn server(o: Opts) -> Res<()> {
    let cm = rt::cm_channel().context("rdma_create_event_channel")?;
    let mut listener = cm
        .listen(SocketAddr::new(o.addr, o.port), 1024)
        .context("rdma_listen")?;
    println!("listening on port {}", listener.id().src_port());
    let mut tasks = tokio::task::JoinSet::new();
    let mut accepted = 0;
    while o.clients == 0 || accepted < o.clients {
        let incoming = listener.get_request().await.context("rdma_get_cm_event")?;
        accepted += 1;
        let o = o.clone();
        tasks.spawn(async move { echo(incoming, &o).await });
    }
    let mut result = Ok(());
    while let Some(r) = tasks.join_next().await {
        if let Err(e) = r.map_err(anyhow::Error::from).and_then(|r| r) {
            eprintln!("connection: {}", common::Report(&e));
            result = Err(anyhow!("a connection failed"));
        }
    }
    result
}

/// Slots a connection's pool needs: `depth` posted receives, up to `depth`
/// echoes in flight (their completions possibly polled and not handled
/// yet), and the receive being replaced.
fn pool_slots(depth: u32) -> usize {
    2 * depth as usize + 1
}

async fn echo(incoming: Incoming, o: &Opts) -> Res<()> {
    let ctx = incoming.context().context("context")?;
    let pd = ctx.alloc_pd().context("ibv_alloc_pd")?;
    let (mut qp, mut acq) = endpoint(&ctx, &pd, o.depth)?;
    let pool = BufferPool::new(&pd, o.size, pool_slots(o.depth), AccessFlags::LOCAL_WRITE)
        .context("BufferPool")?;
    incoming
        .id()
        .modify_qp(&qp, QpState::Init)
        .context("ibv_modify_qp")?;
    for i in 0..o.depth {
        let slot = pool.take().context("pool empty")?;
        qp.post_recv(RECV | u64::from(i), slot)
            .map_err(rdma::PostError::drop_buffers)
            .context("ibv_post_recv")?;
    }
    let mut id = incoming
        .accept(&qp, &ConnParam::default())
        .await
        .context("rdma_accept")?;
    // The completion being handled: polled into this slot, where it stays
    // (`AsyncCq::poll_next_into`), rather than moved out by value.
    let mut slot: Option<rdma::Completion> = None;
    loop {
        // Completions first; the id's events are looked at only when none is
        // ready. One hand-written poll instead of a `select!` of two futures
        // (built and dropped per completion): with the reactor holding the
        // channels' wakers, the look at the id costs a check of its mailbox,
        // not a read of the event channel (`rdma::aio`'s hub).
        let step = std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = acq.poll_next_into(cx, &mut slot) {
                return Poll::Ready(r.map(|()| None).context("poll"));
            }
            id.poll_event(cx)
                .map(|e| e.map(Some).context("rdma_get_cm_event"))
        })
        .await?;
        if let Some(e) = step {
            if e.event_type() == rdma::cm::CmEventType::Disconnected {
                break;
            }
            continue;
        }
        let c = slot.as_mut().context("a completion lost from its slot")?;
        if c.status == WcStatus::WrFlushErr {
            break;
        }
        if c.status != WcStatus::Success {
            return Err(anyhow!("completion {}: {}", c.wr_id, c.status));
        }
        let buf = c
            .take_buffers()
            .into_one()
            .context("a completion without its buffer")?;
        match c.opcode {
            WcOpcode::Recv => {
                if c.byte_len as usize != buf.len() {
                    return Err(anyhow!(
                        "a message of {} bytes: client and server need the same -S ({})",
                        c.byte_len,
                        buf.len()
                    ));
                }
                // A new receive first, then the echo: the client's next
                // message may follow the echo at once.
                let fresh = pool.take().context("pool empty")?;
                qp.post_recv(c.wr_id, fresh)
                    .map_err(rdma::PostError::drop_buffers)
                    .context("ibv_post_recv")?;
                // The received buffer itself goes back to the client.
                acq.post_send(&mut qp, SendWr::send(c.wr_id & !RECV, buf))
                    .await
                    .map_err(rdma::PostError::drop_buffers)
                    .context("post echo")?;
            }
            // The echo went out: its buffer returns to the pool.
            _ => pool
                .put(buf)
                .map_err(|_| anyhow!("not a slot of the pool"))?,
        }
    }
    let _ = qp.to_error();
    let _ = id.id().disconnect();
    Ok(())
}

// ---------------------------------------------------------------------------
// The blocking server: one thread per connection

mod threaded {
    use std::time::Duration;

    use rdma::cm::blocking::{ConnectOptions, Connection, Listener};
    use rdma::cm::CmEventType;
    use rdma::{AccessFlags, BufferPool, SendWr, WcOpcode, WcStatus};

    use anyhow::{anyhow, Context as _};

    use super::{Opts, Report, Res, RECV};

    /// How long a wait for a completion lasts before the connection's
    /// events are looked at (a disconnection flushes nothing here).
    const TICK: Duration = Duration::from_millis(20);

    pub(super) fn server(o: &Opts) -> Res<()> {
        let listener = Listener::bind(std::net::SocketAddr::new(o.addr, o.port), 1024)
            .context("rdma_listen")?;
        println!("listening on port {}", listener.id().src_port());
        let opts = ConnectOptions {
            timeout: Duration::from_secs(30),
            max_send_wr: o.depth,
            max_recv_wr: o.depth,
            cqe: o.depth * 4,
            ..ConnectOptions::default()
        };
        let mut threads = Vec::new();
        let mut accepted = 0;
        while o.clients == 0 || accepted < o.clients {
            let mut pending = match listener.incoming(&opts) {
                Ok(p) => p,
                // No request within the timeout: keep listening.
                Err(e) if e.errno() == Some(libc::ETIMEDOUT) => continue,
                Err(e) => return Err(anyhow!("rdma_accept: {e}")),
            };
            let pool = BufferPool::new(
                pending.pd(),
                o.size,
                super::pool_slots(o.depth),
                AccessFlags::LOCAL_WRITE,
            )
            .context("BufferPool")?;
            for i in 0..o.depth {
                let slot = pool.take().context("pool empty")?;
                pending
                    .qp()
                    .post_recv(RECV | u64::from(i), slot)
                    .map_err(rdma::PostError::drop_buffers)
                    .context("ibv_post_recv")?;
            }
            let conn = pending.accept(&opts.conn_param).context("rdma_accept")?;
            accepted += 1;
            threads.push(std::thread::spawn(move || echo(conn, &pool)));
        }
        let mut result = Ok(());
        for t in threads {
            if let Err(e) = t.join().map_err(|_| anyhow!("a thread panicked"))? {
                eprintln!("connection: {}", Report(&e));
                result = Err(anyhow!("a connection failed"));
            }
        }
        result
    }

    fn echo(mut conn: Connection, pool: &BufferPool) -> Res<()> {
        loop {
            let Some(mut c) = conn.cq().wait(Some(TICK)).context("wait")? else {
                if let Some(e) = conn.next_event(Duration::ZERO).context("event")? {
                    if e.event_type() == CmEventType::Disconnected {
                        let _ = conn.qp().to_error();
                        let _ = conn.id().disconnect();
                        return Ok(());
                    }
                }
                continue;
            };
            if c.status != WcStatus::Success {
                return Err(anyhow!("completion {}: {}", c.wr_id, c.status));
            }
            let buf = c
                .take_buffers()
                .into_one()
                .context("a completion without its buffer")?;
            if c.opcode == WcOpcode::Recv {
                let slot = pool.take().context("pool empty")?;
                conn.qp()
                    .post_recv(c.wr_id, slot)
                    .map_err(rdma::PostError::drop_buffers)
                    .context("ibv_post_recv")?;
                conn.qp()
                    .post_send(SendWr::send(c.wr_id & !RECV, buf))
                    .map_err(rdma::PostError::drop_buffers)
                    .context("post echo")?;
            } else {
                pool.put(buf)
                    .map_err(|_| anyhow!("not a slot of the pool"))?;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Client

async fn client(o: Opts) -> Res<()> {
    let cm = rt::cm_channel().context("rdma_create_event_channel")?;
    let begin = Instant::now();
    // The rate counts from when every connection is up (the last to get
    // there starts the clock), so that setting up 64 connections, one at a
    // time on the threaded server, is not part of it.
    let up = Rc::new(Start {
        barrier: tokio::sync::Barrier::new(o.connections as usize),
        at: Cell::new(None),
    });
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..o.connections {
        let (cm, o, up) = (cm.clone(), o.clone(), Rc::clone(&up));
        tasks.spawn_local(async move { load(&cm, &o, n, &up).await });
    }
    let mut echoes = 0;
    while let Some(r) = tasks.join_next().await {
        echoes += r??;
    }
    let start = up.at.get().unwrap_or(begin);
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{} connections up in {:.3} s",
        o.connections,
        start.duration_since(begin).as_secs_f64()
    );
    println!(
        "{} connections x {} messages of {} bytes: {echoes} echoes in {secs:.3} s, {:.0} messages/s",
        o.connections,
        o.messages,
        o.size,
        echoes as f64 / secs
    );
    Ok(())
}

/// Where the client's connections meet once connected, and when the last
/// one got there.
struct Start {
    barrier: tokio::sync::Barrier,
    at: Cell<Option<Instant>>,
}

/// One connection: `depth` messages in flight until `messages` came back;
/// returns how many did.
async fn load(cm: &CmChannel, o: &Opts, n: u64, up: &Start) -> Res<u64> {
    let mut id = cm.create_id(PortSpace::Tcp).context("rdma_create_id")?;
    let dst = SocketAddr::new(o.addr, o.port);
    id.resolve_addr(None, dst, RESOLVE_TIMEOUT)
        .await
        .context("rdma_resolve_addr")?;
    id.resolve_route(RESOLVE_TIMEOUT)
        .await
        .context("rdma_resolve_route")?;
    let ctx = id.id().context().context("context")?;
    let pd = ctx.alloc_pd().context("ibv_alloc_pd")?;
    let (mut qp, mut acq) = endpoint(&ctx, &pd, o.depth)?;
    id.id()
        .modify_qp(&qp, QpState::Init)
        .context("ibv_modify_qp")?;
    for i in 0..o.depth {
        let buf = pd
            .alloc_mr(o.size, AccessFlags::LOCAL_WRITE)
            .context("alloc_mr")?;
        qp.post_recv(RECV | u64::from(i), buf)
            .map_err(rdma::PostError::drop_buffers)
            .context("ibv_post_recv")?;
    }
    id.connect(&qp, &ConnParam::default())
        .await
        .context("rdma_connect")?;
    if up.barrier.wait().await.is_leader() {
        up.at.set(Some(Instant::now()));
    }
    let mut sent = 0u64;
    let mut back = 0u64;
    // Send buffers come back with their completions and are reused.
    let mut spare: Vec<rdma::MemoryRegion> = Vec::new();
    while sent < o.messages && sent < u64::from(o.depth) {
        let mut m = pd
            .alloc_mr(o.size, AccessFlags::empty())
            .context("alloc_mr")?;
        m.write_at(0, &(n << 32 | sent).to_be_bytes()[..o.size.min(8)])
            .context("write")?;
        acq.post_send(&mut qp, SendWr::send(sent, m))
            .await
            .map_err(rdma::PostError::drop_buffers)
            .context("post")?;
        sent += 1;
    }
    while back < o.messages {
        let mut c = tokio::select! {
            c = acq.next() => c.context("poll")?,
            e = id.next_event() => {
                let e = e.context("rdma_get_cm_event")?;
                if e.event_type() == rdma::cm::CmEventType::Disconnected {
                    return Err(anyhow!("the server disconnected after {back} echoes"));
                }
                continue;
            }
        };
        if c.status != WcStatus::Success {
            return Err(anyhow!("completion {}: {}", c.wr_id, c.status));
        }
        let buf = c
            .take_buffers()
            .into_one()
            .context("a completion without its buffer")?;
        if c.opcode != WcOpcode::Recv {
            spare.push(buf);
            continue;
        }
        back += 1;
        qp.post_recv(c.wr_id, buf)
            .map_err(rdma::PostError::drop_buffers)
            .context("ibv_post_recv")?;
        if sent < o.messages {
            let m = match spare.pop() {
                Some(m) => m,
                None => pd
                    .alloc_mr(o.size, AccessFlags::empty())
                    .context("alloc_mr")?,
            };
            acq.post_send(&mut qp, SendWr::send(sent, m))
                .await
                .map_err(rdma::PostError::drop_buffers)
                .context("post")?;
            sent += 1;
        }
    }
    let _ = id.disconnect().await;
    Ok(back)
}
