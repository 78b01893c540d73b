//! RDMA ping-pong over the connection manager: a port of rdma-core's `rping`
//! that speaks its protocol, so either side can be the C tool.
//!
//! ```text
//! rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port] [-P] [-q]
//! rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port] [-q]
//! ```
//!
//! # Protocol (one ping)
//! Control messages are 16 bytes: buffer address (big-endian u64), rkey and
//! length (big-endian u32 each).
//! 1. The client fills its source buffer with `rdma-ping-N: ` and a rolling
//!    run of the letters `A`..`z` (ending in a NUL) and sends its address.
//! 2. The server RDMA READs it and answers with a 16-byte "go ahead".
//! 3. The client sends the address of its sink buffer.
//! 4. The server RDMA WRITEs the string it read into the sink, and sends
//!    another "go ahead".
//! 5. With `-V` the client compares sink and source.
//!
//! The client disconnects after `-C` pings (0: forever); the server ends when
//! the client disconnects (`-P`: serves connections until killed, one thread
//! each).
//!
//! Unlike the C tool, whose buffers are fixed, every buffer here moves into
//! its work request and comes back with the completion (`rdma`'s safe post
//! path); the sink, which the peer writes, is read with
//! [`MemoryRegion::read_at`].

mod common;

use anyhow::{anyhow, Context as _};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::process::ExitCode;
use std::time::Duration;

use common::args::Flag;
use common::cm::{c_str, rearm, wait_readable, Res};
use common::rping::{fill, info, parse_info, Opts, INFO_LEN, SQ_DEPTH};
use rdma::cm::{CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use rdma::{
    AccessFlags, CompletionChannel, CompletionQueue, MemoryRegion, ProtectionDomain, QpType,
    QueuePair, RemoteMemory, SendWr, WcOpcode, WcStatus,
};

const USAGE: &str = "  rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]
  rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]";

/// `rdma_resolve_addr`/`rdma_resolve_route` timeout.
const RESOLVE_TIMEOUT: Duration = Duration::from_millis(2000);

const WR_SEND: u64 = 1;
const WR_RECV: u64 = 2;
const WR_RDMA: u64 = 3;

fn main() -> ExitCode {
    let own = Flag::switch('q', 'q', "", "use a self-created, self-modified QP");
    let opts = match common::rping::read("rping", USAGE, own) {
        Ok(o) => o,
        Err(code) => return code,
    };
    let result = if opts.server {
        run_server(&opts)
    } else {
        run_client(&opts)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", common::Report(&e));
            ExitCode::FAILURE
        }
    }
}

macro_rules! debug {
    ($o:expr, $($arg:tt)*) => {
        if $o.debug {
            println!($($arg)*);
        }
    };
}

/// What the wait for the next step brought.
enum Got {
    /// A control message arrived (its 16 bytes).
    Recv([u8; INFO_LEN]),
    /// The RDMA READ or WRITE finished; its buffer is back.
    Rdma(MemoryRegion),
    /// A send finished (only when waiting for the send buffer).
    SendDone,
    /// The peer disconnected.
    Disconnected,
}

/// One connection: the id, its event channel, and the verbs objects on its
/// device. Field order is drop order: QP before CQ, PD and id.
struct Conn {
    qp: QueuePair,
    cq: CompletionQueue,
    comp: CompletionChannel,
    pd: ProtectionDomain,
    id: CmId,
    events: EventChannel,
    /// The send buffer, when not in flight.
    send_mr: Option<MemoryRegion>,
    /// A control message that arrived while waiting for the send buffer.
    pending: Option<[u8; INFO_LEN]>,
    armed: bool,
    server: bool,
    debug: bool,
}

impl Conn {
    /// PD, completion channel, CQ and QP on the id's device
    /// (`rping_setup_qp`), and the receive posted.
    fn setup(id: &CmId, events: &EventChannel, o: &Opts) -> Res<Conn> {
        let ctx = id.context().context("ibv_alloc_pd failed")?;
        let pd = ctx.alloc_pd().context("ibv_alloc_pd failed")?;
        debug!(o, "created pd {:p}", pd.as_raw());
        let comp = ctx
            .create_comp_channel()
            .context("ibv_create_comp_channel failed")?;
        comp.set_nonblocking(true)
            .context("ibv_create_comp_channel failed")?;
        let cq = ctx
            .create_cq(SQ_DEPTH * 2, Some(&comp), 0)
            .context("ibv_create_cq failed")?;
        cq.req_notify(false).context("ibv_req_notify_cq failed")?;
        let mut builder = pd.qp_builder(QpType::Rc, &cq, &cq);
        builder
            .max_send_wr(SQ_DEPTH)
            .max_recv_wr(2)
            .max_send_sge(1)
            .max_recv_sge(1);
        let qp = if o.self_qp {
            let qp = builder.build().context("ibv_create_qp")?;
            id.modify_qp(&qp, rdma::QpState::Init)
                .context("ibv_modify_qp")?;
            qp
        } else {
            id.create_qp(&builder).context("rdma_create_qp")?
        };
        debug!(o, "created qp {:p}", qp.as_raw());
        let send_mr = pd
            .alloc_mr(INFO_LEN, AccessFlags::empty())
            .context("send_buf reg_mr failed")?;
        let mut conn = Conn {
            qp,
            cq,
            comp,
            pd,
            id: id.clone(),
            events: events.clone(),
            send_mr: Some(send_mr),
            pending: None,
            armed: true,
            server: o.server,
            debug: o.debug,
        };
        let recv = conn
            .pd
            .alloc_mr(INFO_LEN, AccessFlags::LOCAL_WRITE)
            .context("recv_buf reg_mr failed")?;
        conn.qp
            .post_recv(WR_RECV, recv)
            .map_err(rdma::PostError::drop_buffers)
            .context("ibv_post_recv failed")?;
        Ok(conn)
    }

    fn param(&self) -> ConnParam {
        ConnParam {
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            ..ConnParam::default()
        }
    }

    /// Sends a control message once the previous send is back.
    fn send(&mut self, msg: &[u8; INFO_LEN]) -> Res<()> {
        while self.send_mr.is_none() {
            match self.wait(true)? {
                Got::SendDone => {}
                Got::Recv(m) if self.pending.is_none() => self.pending = Some(m),
                Got::Recv(_) => return Err(anyhow!("unexpected control message")),
                Got::Rdma(_) => return Err(anyhow!("unexpected RDMA completion")),
                Got::Disconnected => return Err(anyhow!("disconnected while sending")),
            }
        }
        let mut mr = self.send_mr.take().expect("checked above");
        mr.as_mut_slice()
            .expect("the send buffer is local")
            .copy_from_slice(msg);
        self.qp
            .post_send(SendWr::send(WR_SEND, mr))
            .map_err(|e| anyhow!("post send error {e}"))
    }

    /// The next completion or connection event that matters: receives (the
    /// receive is posted again at once), RDMA completions, disconnection.
    /// Send completions give the send buffer back; with `until_send` the
    /// wait ends there.
    fn wait(&mut self, until_send: bool) -> Res<Got> {
        loop {
            if let Some(mut c) = self.cq.poll_one().context("poll error")? {
                if c.status == WcStatus::WrFlushErr {
                    return Ok(Got::Disconnected);
                }
                if c.status != WcStatus::Success {
                    return Err(anyhow!("cq completion failed status {}", c.status.to_raw()));
                }
                match c.opcode {
                    WcOpcode::Send => {
                        if self.debug {
                            println!("send completion");
                        }
                        self.send_mr = c.take_buffers().into_one();
                        if until_send {
                            return Ok(Got::SendDone);
                        }
                    }
                    WcOpcode::Recv => {
                        if self.debug {
                            println!("recv completion");
                        }
                        if c.byte_len as usize != INFO_LEN {
                            return Err(anyhow!("Received bogus data, size {}", c.byte_len));
                        }
                        let mr = c.take_buffers().into_one().expect("the receive buffer");
                        let mut msg = [0u8; INFO_LEN];
                        msg.copy_from_slice(mr.as_slice().expect("local buffer"));
                        self.qp
                            .post_recv(WR_RECV, mr)
                            .map_err(rdma::PostError::drop_buffers)
                            .context("post recv error")?;
                        return Ok(Got::Recv(msg));
                    }
                    WcOpcode::RdmaRead | WcOpcode::RdmaWrite => {
                        if self.debug {
                            println!("rdma {:?} completion", c.opcode);
                        }
                        let mr = c.take_buffers().into_one().expect("the RDMA buffer");
                        return Ok(Got::Rdma(mr));
                    }
                    other => return Err(anyhow!("unknown completion {other:?}")),
                }
                continue;
            }
            if let Some(e) = self.events.try_get_event().context("rdma_get_cm_event")? {
                if self.debug {
                    println!(
                        "cma_event type {} cma_id {:p}",
                        e.event_type(),
                        e.id().as_raw()
                    );
                }
                match e.event_type() {
                    CmEventType::Disconnected => {
                        eprintln!(
                            "{} DISCONNECT EVENT...",
                            if self.server { "server" } else { "client" }
                        );
                        return Ok(Got::Disconnected);
                    }
                    CmEventType::DeviceRemoval => {
                        return Err(anyhow!("cma detected device removal!!!!"))
                    }
                    CmEventType::Established | CmEventType::TimewaitExit => {}
                    t => eprintln!("unhandled event: {t}, ignoring"),
                }
                continue;
            }
            if !self.armed {
                self.cq.req_notify(false).context("Failed to set notify")?;
                self.armed = true;
                continue;
            }
            let ready = wait_readable(&[self.comp.as_raw_fd(), self.events.as_raw_fd()], None)?;
            if ready[0] {
                rearm(&self.comp, &self.cq)?;
            }
        }
    }

    /// Waits for a receive, giving up on disconnection.
    fn wait_recv(&mut self, state: &str) -> Res<Option<[u8; INFO_LEN]>> {
        if let Some(m) = self.pending.take() {
            return Ok(Some(m));
        }
        match self.wait(false)? {
            Got::Recv(m) => Ok(Some(m)),
            Got::Disconnected => Ok(None),
            Got::Rdma(_) | Got::SendDone => {
                Err(anyhow!("wait for {state}: unexpected RDMA completion"))
            }
        }
    }

    /// `rping_disconnect`: a self-made QP goes to the error state first.
    fn disconnect(&self) -> Res<()> {
        if self.id.raw_qp().is_null() {
            self.qp.to_error().context("ibv_modify_qp")?;
        }
        self.id.disconnect().context("rdma_disconnect")
    }
}

/// Waits for an event of one of `want` on `ch`, printing failures as rping
/// does.
fn expect(ch: &EventChannel, want: &[CmEventType], o: &Opts) -> Res<rdma::cm::CmEvent> {
    loop {
        let e = ch.get_event().context("rdma_get_cm_event")?;
        debug!(
            o,
            "cma_event type {} cma_id {:p}",
            e.event_type(),
            e.id().as_raw()
        );
        if want.contains(&e.event_type()) && e.status() == 0 {
            return Ok(e);
        }
        match e.event_type() {
            CmEventType::TimewaitExit => continue,
            t => return Err(anyhow!("cma event {t}, error {}", e.status())),
        }
    }
}

// ---------------------------------------------------------------------------
// Client

fn run_client(o: &Opts) -> Res<()> {
    let ch = EventChannel::new().context("rdma_create_event_channel")?;
    let id = ch.create_id(PortSpace::Tcp).context("rdma_create_id")?;
    debug!(o, "created cm_id {:p}", id.as_raw());
    let dst = SocketAddr::new(o.addr, o.port);
    let src = o.src.map(|ip| SocketAddr::new(ip, 0).into());
    id.resolve_addr(src, dst, RESOLVE_TIMEOUT)
        .context("rdma_resolve_addr")?;
    drop(expect(&ch, &[CmEventType::AddrResolved], o)?);
    id.resolve_route(RESOLVE_TIMEOUT)
        .context("rdma_resolve_route")?;
    drop(expect(&ch, &[CmEventType::RouteResolved], o)?);
    debug!(o, "rdma_resolve_addr - rdma_resolve_route successful");

    let mut conn = Conn::setup(&id, &ch, o)?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
    let mut start = conn
        .pd
        .alloc_mr(o.size, access)
        .context("start_buf reg_mr failed")?;
    let sink = conn
        .pd
        .alloc_mr(o.size, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .context("rdma_buf reg_mr failed")?;
    debug!(o, "allocated & registered buffers...");

    // Connect (`rping_connect_client`).
    let param = conn.param();
    if o.self_qp {
        id.connect_qp(&conn.qp, &param).context("rdma_connect")?;
    } else {
        id.connect(&param).context("rdma_connect")?;
    }
    let e = expect(
        &ch,
        &[CmEventType::ConnectResponse, CmEventType::Established],
        o,
    )?;
    let response = e.event_type() == CmEventType::ConnectResponse;
    drop(e);
    if response {
        id.establish_qp(&conn.qp).context("rdma_establish")?;
    }
    debug!(o, "rdma_connect successful");

    let result = ping_loop(o, &mut conn, &mut start, &sink);
    let _ = conn.disconnect();
    result
}

/// The client's side of the pings (`rping_test_client`).
fn ping_loop(o: &Opts, conn: &mut Conn, start: &mut MemoryRegion, sink: &MemoryRegion) -> Res<()> {
    let mut first: u8 = 65;
    let mut ping: u64 = 0;
    while o.count == 0 || ping < o.count {
        {
            let buf = start
                .as_mut_slice()
                .expect("the source is not remotely writable");
            fill(buf, ping, first);
        }
        first = if first >= 122 { 65 } else { first + 1 };

        conn.send(&info(start.remote(), o.size))?;
        if conn.wait_recv("RDMA_WRITE_ADV")?.is_none() {
            return Err(anyhow!("wait for RDMA_WRITE_ADV state: disconnected"));
        }
        conn.send(&info(sink.remote(), o.size))?;
        if conn.wait_recv("RDMA_WRITE_COMPLETE")?.is_none() {
            return Err(anyhow!("wait for RDMA_WRITE_COMPLETE state: disconnected"));
        }
        let got = sink.to_vec();
        if o.validate && got[..] != start.as_slice().expect("local")[..] {
            return Err(anyhow!("data mismatch!"));
        }
        if o.verbose {
            println!("ping data: {}", c_str(&got));
        }
        ping += 1;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Server

fn run_server(o: &Opts) -> Res<()> {
    let ch = EventChannel::new().context("rdma_create_event_channel")?;
    let listener = ch.create_id(PortSpace::Tcp).context("rdma_create_id")?;
    debug!(o, "created cm_id {:p}", listener.as_raw());
    listener
        .bind_addr(SocketAddr::new(o.addr, o.port))
        .context("rdma_bind_addr")?;
    debug!(o, "rdma_bind_addr successful");
    debug!(o, "rdma_listen");
    listener.listen(3).context("rdma_listen")?;

    if o.persistent {
        loop {
            let request = expect(&ch, &[CmEventType::ConnectRequest], o)?;
            let id = request.id().clone();
            drop(request);
            // Each connection reports to a channel of its own, so its thread
            // sees only its events.
            let own = EventChannel::new().context("rdma_create_event_channel")?;
            id.migrate_id(Some(&own)).context("rdma_migrate_id")?;
            let o = o.clone();
            std::thread::spawn(move || {
                if let Err(e) = serve(&o, &id, &own) {
                    eprintln!("{}", common::Report(&e));
                }
            });
        }
    }
    let request = expect(&ch, &[CmEventType::ConnectRequest], o)?;
    let id = request.id().clone();
    debug!(o, "child cma {:p}", id.as_raw());
    drop(request);
    serve(o, &id, &ch).map_err(|e| anyhow!("{}\nrping server failed", common::Report(&e)))
}

/// Accepts `id` and answers pings until the client disconnects
/// (`rping_run_server` after the request).
fn serve(o: &Opts, id: &CmId, ch: &EventChannel) -> Res<()> {
    let mut conn = Conn::setup(id, ch, o)?;
    let mut buf = conn
        .pd
        .alloc_mr(o.size, AccessFlags::LOCAL_WRITE)
        .context("rdma_buf reg_mr failed")?;
    debug!(o, "accepting client connection request");
    let param = conn.param();
    if o.self_qp {
        id.accept_qp(&conn.qp, &param).context("rdma_accept")?;
    } else {
        id.accept(&param).context("rdma_accept")?;
    }
    drop(expect(ch, &[CmEventType::Established], o)?);

    let result = (|| -> Res<()> {
        loop {
            // The client's source buffer.
            let Some(msg) = conn.wait_recv("RDMA_READ_ADV")? else {
                return Ok(());
            };
            let (addr, rkey, len) = parse_info(&msg);
            debug!(
                o,
                "Received rkey {rkey:x} addr {addr:x} len {len} from peer"
            );
            let len = len as usize;
            if len == 0 || len > buf.len() {
                return Err(anyhow!(
                    "client buffer of {len} bytes does not fit the server's {} (-S)",
                    buf.len()
                ));
            }
            let tail = if len < buf.len() {
                Some(buf.split_off(len).context("split")?)
            } else {
                None
            };
            let remote = RemoteMemory {
                addr,
                len: len as u64,
                rkey,
            };
            conn.qp
                .post_send(SendWr::read(WR_RDMA, buf, remote))
                .map_err(|e| anyhow!("post send error {e}"))?;
            debug!(o, "server posted rdma read req ");
            buf = match conn.wait(false)? {
                Got::Rdma(mr) => mr,
                Got::Disconnected => {
                    return Err(anyhow!("wait for RDMA_READ_COMPLETE: disconnected"))
                }
                _ => {
                    return Err(anyhow!(
                        "wait for RDMA_READ_COMPLETE: unexpected completion"
                    ))
                }
            };
            if let Some(t) = tail {
                if buf.unsplit(t).is_err() {
                    return Err(anyhow!("buffer pieces do not join"));
                }
            }
            let text = c_str(buf.as_slice().expect("local buffer"));
            if o.verbose {
                println!("server ping data: {text}");
            }
            // Go ahead.
            conn.send(&[0; INFO_LEN])?;
            debug!(o, "server posted go ahead");

            // The client's sink.
            let Some(msg) = conn.wait_recv("RDMA_WRITE_ADV")? else {
                return Ok(());
            };
            let (addr, rkey, rlen) = parse_info(&msg);
            let n = (text.len() + 1).min(buf.len());
            if n as u64 > u64::from(rlen) {
                return Err(anyhow!("client sink of {rlen} bytes is too small for {n}"));
            }
            let tail = if n < buf.len() {
                Some(buf.split_off(n).context("split")?)
            } else {
                None
            };
            let remote = RemoteMemory {
                addr,
                len: n as u64,
                rkey,
            };
            debug!(o, "rdma write from laddr {:x} len {n}", buf.addr());
            conn.qp
                .post_send(SendWr::write(WR_RDMA, buf, remote))
                .map_err(|e| anyhow!("post send error {e}"))?;
            buf = match conn.wait(false)? {
                Got::Rdma(mr) => mr,
                Got::Disconnected => {
                    return Err(anyhow!("wait for RDMA_WRITE_COMPLETE: disconnected"))
                }
                _ => {
                    return Err(anyhow!(
                        "wait for RDMA_WRITE_COMPLETE: unexpected completion"
                    ))
                }
            };
            if let Some(t) = tail {
                if buf.unsplit(t).is_err() {
                    return Err(anyhow!("buffer pieces do not join"));
                }
            }
            debug!(o, "server rdma write complete ");
            conn.send(&[0; INFO_LEN])?;
            debug!(o, "server posted go ahead");
        }
    })();
    let _ = conn.disconnect();
    result
}
