//! rping on the async layer (`rdma::aio`, tokio): speaks rdma-core's `rping`
//! protocol, so either side can be the C tool, and serves many clients at
//! once on one thread (C `rping -s` takes them one by one; `-P` gives each a
//! thread).
//!
//! ```text
//! async_rping -s [-vVd] [-S size] [-a addr] [-p port] [-P | -N clients]
//! async_rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port] [-N connections]
//! ```
//!
//! `-N` is this port's own flag: the server exits after serving that many
//! clients (default 1, as `rping -s`; `-P` serves until killed), the client
//! opens that many connections at once, each running `-C` pings.
//!
//! The protocol (see `rping.rs`): the client advertises its source buffer
//! (16 bytes: address, rkey, length, big-endian), the server RDMA READs it
//! and answers "go ahead", the client advertises its sink, the server RDMA
//! WRITEs the text into it and answers again; `-V` compares.
//!
//! Each connection is a task of one `current_thread` runtime: its
//! completions and its connection manager id ([`rdma::aio::AsyncCmId`]) are
//! awaited together (both waits are cancel-safe, so the branch that loses
//! the race loses nothing).
//!
//! Connections share completion queues, up to [`PER_CQ`] on one CQ (and its
//! completion channel), each CQ awaited through one [`rdma::aio::AsyncCq`]
//! by a task that hands every completion to its connection by QP number.
//! A CQ of its own per connection would cost a process one more queue
//! mapping per connection, and siw (rdma-core 44) allows a process 144
//! pages of queue mappings per device: 48 connections of a CQ, an SQ and an
//! RQ page each (CONVENTIONS.md, Tests). Shared, a connection costs 2 pages
//! and 64 of them fit with their CQ.

use anyhow::{anyhow, Context as _};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::rc::Rc;
use std::time::Duration;

mod common;

use common::args::Flag;
use common::cm::{c_str, Res};
use common::rping::{fill, info, parse_info, Opts, INFO_LEN};
use rdma::aio::{tokio_rt as rt, AsyncCmId, AsyncCq, CmChannel};
use rdma::cm::{CmEventType, ConnParam, PortSpace};
use rdma::{
    AccessFlags, Completion, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpState,
    QpType, QueuePair, RemoteMemory, SendWr, WcOpcode, WcStatus,
};
use tokio::sync::mpsc;

const USAGE: &str = "  async_rping -s [-vVd] [-S size] [-a addr] [-p port] [-P | -N clients]
  async_rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port] [-N connections]";

const RESOLVE_TIMEOUT: Duration = Duration::from_millis(2000);

/// Connections on one shared CQ at most.
const PER_CQ: usize = 64;

/// A connection's send queue. The protocol has at most two sends of a
/// connection in flight (a control message, and the server's RDMA READ or
/// WRITE): [`Conn::send`] waits for the previous control message's
/// completion, the RDMA operation is awaited before the next step.
const SEND_DEPTH: u32 = 4;

/// Completions one connection can have in its CQ at once: its send queue
/// and its receive queue. The CQ has room for all of them, so it cannot
/// overflow. The send queue is smaller than rping's 16 so that the shared
/// CQ of 64 connections fits where siw makes QPs: 384 entries, which siw
/// rounds up to 512 (5 pages), where a depth of 16 would need 1152, rounded
/// up to 2048 (17 pages), and the 64th connection's QP would not fit.
const PER_CONN_CQE: u32 = SEND_DEPTH + RQ_DEPTH;

/// Receives a connection keeps posted (one control message at a time).
const RQ_DEPTH: u32 = 2;

const WR_SEND: u64 = 1;
const WR_RECV: u64 = 2;
const WR_RDMA: u64 = 3;

fn main() -> ExitCode {
    let own = Flag::value(
        'N',
        'N',
        "",
        "n",
        "server: exit after n clients; client: n connections at once",
    );
    let o = match common::rping::read("async_rping", USAGE, own) {
        Ok(o) => o,
        Err(code) => return code,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let local = tokio::task::LocalSet::new();
    let result = local.block_on(&runtime, async {
        if o.server {
            server(o).await
        } else {
            clients(o).await
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", common::Report(&e));
            ExitCode::FAILURE
        }
    }
}

/// A control message as the memory it describes.
fn described(m: &[u8; INFO_LEN]) -> RemoteMemory {
    let (addr, rkey, len) = parse_info(m);
    RemoteMemory {
        addr,
        len: u64::from(len),
        rkey,
    }
}

/// What a wait brought.
enum Got {
    Recv([u8; INFO_LEN]),
    Rdma(MemoryRegion),
    Disconnected,
}

/// One connection. Field order is drop order: the QP before its route and
/// PD, the id last.
struct Conn {
    qp: QueuePair,
    route: Route,
    pd: ProtectionDomain,
    /// The send buffer, when not in flight.
    send_mr: Option<MemoryRegion>,
    /// A control message that came while waiting for the send buffer.
    pending: Option<[u8; INFO_LEN]>,
    id: AsyncCmId,
    debug: bool,
}

/// What a connection needs on its id's device, made before it connects
/// (the client) or accepts (the server).
struct Parts {
    pd: ProtectionDomain,
    route: Route,
    qp: QueuePair,
    send_mr: MemoryRegion,
}

impl Parts {
    /// PD and QP on the device of `id`, on a CQ of `cqs`, the QP in INIT
    /// with its receive posted, and the send buffer.
    fn on(id: &rdma::cm::CmId, cqs: &SharedCqs) -> Res<Parts> {
        let ctx = id.context().context("ibv_alloc_pd failed")?;
        let pd = ctx.alloc_pd().context("ibv_alloc_pd failed")?;
        let cq = cqs.take(&ctx)?;
        let mut qp = pd
            .qp_builder(QpType::Rc, &cq.cq, &cq.cq)
            .max_send_wr(SEND_DEPTH)
            .max_recv_wr(RQ_DEPTH)
            .build()
            .context("ibv_create_qp")?;
        let route = cq.route(qp.qp_num());
        id.modify_qp(&qp, QpState::Init).context("ibv_modify_qp")?;
        let recv = pd
            .alloc_mr(INFO_LEN, AccessFlags::LOCAL_WRITE)
            .context("recv_buf reg_mr failed")?;
        qp.post_recv(WR_RECV, recv)
            .map_err(rdma::PostError::drop_buffers)
            .context("ibv_post_recv failed")?;
        let send_mr = pd
            .alloc_mr(INFO_LEN, AccessFlags::empty())
            .context("send_buf reg_mr failed")?;
        Ok(Parts {
            pd,
            route,
            qp,
            send_mr,
        })
    }
}

/// Where completions go: a connection's sender, by QP number.
type Routes = Rc<RefCell<HashMap<u32, mpsc::UnboundedSender<Completion>>>>;

/// One CQ that connections share.
#[derive(Clone)]
struct SharedCq {
    cq: CompletionQueue,
    routes: Routes,
    /// Connections on it now (a route each).
    users: Rc<Cell<usize>>,
}

impl SharedCq {
    /// A CQ for `per_cq` connections with its own completion channel, and
    /// the task that awaits it and hands out its completions.
    fn new(ctx: &Context, per_cq: usize) -> Res<SharedCq> {
        let channel = ctx
            .create_comp_channel()
            .context("ibv_create_comp_channel failed")?;
        let cqe = PER_CONN_CQE * u32::try_from(per_cq).unwrap_or(u32::MAX / PER_CONN_CQE);
        let cq = ctx
            .create_cq(cqe, Some(&channel), 0)
            .context("ibv_create_cq failed")?;
        let acq = rt::completions(&cq).context("rdma::aio")?;
        let shared = SharedCq {
            cq,
            routes: Rc::default(),
            users: Rc::default(),
        };
        tokio::task::spawn_local(dispatch(acq, Rc::clone(&shared.routes)));
        Ok(shared)
    }

    /// The completions of QP `qp_num` from now on.
    fn route(&self, qp_num: u32) -> Route {
        let (tx, rx) = mpsc::unbounded_channel();
        self.routes.borrow_mut().insert(qp_num, tx);
        self.users.set(self.users.get() + 1);
        Route {
            rx,
            qp_num,
            cq: self.clone(),
        }
    }
}

/// Hands each completion of a shared CQ to its connection. A completion of
/// a connection that is gone (a flushed request after its QP was
/// destroyed) is dropped, with the memory it gives back. QP numbers are not
/// reused at once by rxe or siw (cyclic allocation), so a late completion
/// does not reach a newer connection. A failed poll closes every route:
/// their connections see the CQ gone.
async fn dispatch(mut acq: AsyncCq, routes: Routes) {
    loop {
        match acq.next().await {
            Ok(c) => {
                let routes = routes.borrow();
                if let Some(tx) = routes.get(&c.qp_num) {
                    // A closed receiver: the connection is going away.
                    let _ = tx.send(c);
                }
            }
            Err(e) => {
                eprintln!("poll error on a shared CQ: {e}");
                routes.borrow_mut().clear();
                return;
            }
        }
    }
}

/// A connection's share of a [`SharedCq`].
struct Route {
    rx: mpsc::UnboundedReceiver<Completion>,
    qp_num: u32,
    cq: SharedCq,
}

impl Route {
    /// The next completion of the connection's QP. Cancel-safe (tokio's
    /// `recv` is): a completion not returned stays in the channel.
    async fn next(&mut self) -> Res<Completion> {
        self.rx
            .recv()
            .await
            .context("poll error: the shared CQ failed")
    }
}

impl Drop for Route {
    fn drop(&mut self) {
        self.cq.routes.borrow_mut().remove(&self.qp_num);
        self.cq.users.set(self.cq.users.get() - 1);
    }
}

/// The CQs of one process's connections, for one device context each:
/// a new connection joins a CQ with room, or a new CQ.
struct SharedCqs {
    per_cq: usize,
    cqs: RefCell<Vec<SharedCq>>,
}

impl SharedCqs {
    fn new(per_cq: usize) -> SharedCqs {
        SharedCqs {
            per_cq: per_cq.clamp(1, PER_CQ),
            cqs: RefCell::default(),
        }
    }

    /// A CQ of `ctx` with room for one more connection (counted once its
    /// [`Route`] is made; nothing awaits in between, on one thread).
    fn take(&self, ctx: &Context) -> Res<SharedCq> {
        let mut cqs = self.cqs.borrow_mut();
        let found = cqs
            .iter()
            .find(|c| c.cq.context().as_raw() == ctx.as_raw() && c.users.get() < self.per_cq);
        let cq = match found {
            Some(c) => c.clone(),
            None => {
                let c = SharedCq::new(ctx, self.per_cq)?;
                cqs.push(c.clone());
                c
            }
        };
        Ok(cq)
    }
}

impl Conn {
    /// A connection over `parts` (see [`Parts::on`]) once `id` is connected.
    fn new(parts: Parts, id: AsyncCmId, o: &Opts) -> Conn {
        let Parts {
            pd,
            route,
            qp,
            send_mr,
        } = parts;
        Conn {
            qp,
            route,
            pd,
            send_mr: Some(send_mr),
            pending: None,
            id,
            debug: o.debug,
        }
    }

    fn param() -> ConnParam {
        ConnParam {
            responder_resources: 1,
            initiator_depth: 1,
            ..ConnParam::default()
        }
    }

    /// The next completion or connection event that matters. A send's
    /// completion gives the send buffer back; with `until_send` the wait
    /// ends there (`Ok(None)`).
    async fn wait(&mut self, until_send: bool) -> Res<Option<Got>> {
        loop {
            let (route, id) = (&mut self.route, &mut self.id);
            tokio::select! {
                c = route.next() => {
                    let mut c = c?;
                    if c.status == WcStatus::WrFlushErr {
                        return Ok(Some(Got::Disconnected));
                    }
                    if c.status != WcStatus::Success {
                        return Err(anyhow!("cq completion failed status {}", c.status.to_raw()));
                    }
                    match c.opcode {
                        WcOpcode::Send => {
                            self.send_mr = c.take_buffers().into_one();
                            if until_send {
                                return Ok(None);
                            }
                        }
                        WcOpcode::Recv => {
                            if c.byte_len as usize != INFO_LEN {
                                return Err(anyhow!("Received bogus data, size {}", c.byte_len));
                            }
                            let mr = c.take_buffers().into_one().expect("the receive buffer");
                            let mut msg = [0u8; INFO_LEN];
                            mr.read_at(0, &mut msg).context("read")?;
                            self.qp
                                .post_recv(WR_RECV, mr)
                                .map_err(rdma::PostError::drop_buffers).context("post recv error")?;
                            return Ok(Some(Got::Recv(msg)));
                        }
                        WcOpcode::RdmaRead | WcOpcode::RdmaWrite => {
                            let mr = c.take_buffers().into_one().expect("the RDMA buffer");
                            return Ok(Some(Got::Rdma(mr)));
                        }
                        other => return Err(anyhow!("unknown completion {other:?}")),
                    }
                }
                e = id.next_event() => {
                    let e = e.context("rdma_get_cm_event")?;
                    if self.debug {
                        println!("cma_event type {} cma_id {:p}", e.event_type(), e.id().as_raw());
                    }
                    match e.event_type() {
                        CmEventType::Disconnected => return Ok(Some(Got::Disconnected)),
                        CmEventType::DeviceRemoval => {
                            return Err(anyhow!("cma detected device removal!!!!"))
                        }
                        CmEventType::Established | CmEventType::TimewaitExit => {}
                        t => eprintln!("unhandled event: {t}, ignoring"),
                    }
                }
            }
        }
    }

    /// Sends a control message once the previous send is back.
    async fn send(&mut self, msg: &[u8; INFO_LEN]) -> Res<()> {
        while self.send_mr.is_none() {
            match self.wait(true).await? {
                None => {}
                Some(Got::Recv(m)) if self.pending.is_none() => self.pending = Some(m),
                Some(Got::Recv(_)) => return Err(anyhow!("unexpected control message")),
                Some(Got::Rdma(_)) => return Err(anyhow!("unexpected RDMA completion")),
                Some(Got::Disconnected) => return Err(anyhow!("disconnected while sending")),
            }
        }
        let mut mr = self.send_mr.take().expect("checked above");
        mr.write_at(0, msg).context("write")?;
        self.qp
            .post_send(SendWr::send(WR_SEND, mr))
            .map_err(|e| anyhow!("post send error {e}"))
    }

    /// The next control message; `None` on disconnection.
    async fn recv(&mut self, state: &str) -> Res<Option<[u8; INFO_LEN]>> {
        if let Some(m) = self.pending.take() {
            return Ok(Some(m));
        }
        match self.wait(false).await? {
            Some(Got::Recv(m)) => Ok(Some(m)),
            Some(Got::Disconnected) => Ok(None),
            _ => Err(anyhow!("wait for {state}: unexpected completion")),
        }
    }

    /// The RDMA READ or WRITE just posted; `None` on disconnection.
    async fn rdma(&mut self, state: &str) -> Res<MemoryRegion> {
        match self.wait(false).await? {
            Some(Got::Rdma(mr)) => Ok(mr),
            Some(Got::Disconnected) => Err(anyhow!("wait for {state}: disconnected")),
            _ => Err(anyhow!("wait for {state}: unexpected completion")),
        }
    }

    /// `rping_disconnect` for a QP this program made: error state, then
    /// `rdma_disconnect`.
    fn disconnect(&self) {
        let _ = self.qp.to_error();
        let _ = self.id.id().disconnect();
    }
}

// ---------------------------------------------------------------------------
// Client

async fn clients(o: Opts) -> Res<()> {
    let cm = rt::cm_channel().context("rdma_create_event_channel")?;
    let cqs = Rc::new(SharedCqs::new(usize::try_from(o.n).unwrap_or(PER_CQ)));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..o.n {
        let (cm, o, cqs) = (cm.clone(), o.clone(), Rc::clone(&cqs));
        tasks.spawn_local(async move { client(&cm, &o, &cqs).await });
    }
    let mut result = Ok(());
    while let Some(r) = tasks.join_next().await {
        if let Err(e) = r.map_err(anyhow::Error::from).and_then(|r| r) {
            eprintln!("{}", common::Report(&e));
            result = Err(anyhow!("rping client failed"));
        }
    }
    result
}

async fn client(cm: &CmChannel, o: &Opts, cqs: &SharedCqs) -> Res<()> {
    let mut id = cm.create_id(PortSpace::Tcp).context("rdma_create_id")?;
    let dst = SocketAddr::new(o.addr, o.port);
    let src = o.src.map(|ip| SocketAddr::new(ip, 0).into());
    id.resolve_addr(src, dst, RESOLVE_TIMEOUT)
        .await
        .context("rdma_resolve_addr")?;
    id.resolve_route(RESOLVE_TIMEOUT)
        .await
        .context("rdma_resolve_route")?;
    let mut conn = Conn::new(Parts::on(id.id(), cqs)?, id, o);
    let mut start = conn
        .pd
        .alloc_mr(o.size, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
        .context("start_buf reg_mr failed")?;
    let sink = conn
        .pd
        .alloc_mr(o.size, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .context("rdma_buf reg_mr failed")?;
    conn.id
        .connect(&conn.qp, &Conn::param())
        .await
        .context("rdma_connect")?;
    let result = pings(o, &mut conn, &mut start, &sink).await;
    conn.disconnect();
    result
}

async fn pings(
    o: &Opts,
    conn: &mut Conn,
    start: &mut MemoryRegion,
    sink: &MemoryRegion,
) -> Res<()> {
    let mut first: u8 = 65;
    let mut ping: u64 = 0;
    let mut text = vec![0u8; o.size];
    while o.count == 0 || ping < o.count {
        fill(&mut text, ping, first);
        first = if first >= 122 { 65 } else { first + 1 };
        start.write_at(0, &text).context("write")?;
        conn.send(&info(start.remote(), o.size)).await?;
        if conn.recv("RDMA_WRITE_ADV").await?.is_none() {
            return Err(anyhow!("wait for RDMA_WRITE_ADV state: disconnected"));
        }
        conn.send(&info(sink.remote(), o.size)).await?;
        if conn.recv("RDMA_WRITE_COMPLETE").await?.is_none() {
            return Err(anyhow!("wait for RDMA_WRITE_COMPLETE state: disconnected"));
        }
        let got = sink.to_vec();
        if o.validate && got != text {
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

async fn server(o: Opts) -> Res<()> {
    let cm = rt::cm_channel().context("rdma_create_event_channel")?;
    let mut listener = cm
        .listen(SocketAddr::new(o.addr, o.port), 128)
        .context("rdma_bind_addr/rdma_listen")?;
    let per_cq = if o.persistent {
        PER_CQ
    } else {
        usize::try_from(o.n).unwrap_or(PER_CQ)
    };
    let cqs = Rc::new(SharedCqs::new(per_cq));
    let mut tasks = tokio::task::JoinSet::new();
    let mut accepted = 0;
    while o.persistent || accepted < o.n {
        let incoming = listener.get_request().await.context("rdma_get_cm_event")?;
        accepted += 1;
        let (o, cqs) = (o.clone(), Rc::clone(&cqs));
        tasks.spawn_local(async move {
            let id = incoming.id().clone();
            let r = serve(incoming, &o, &cqs).await;
            if let Err(e) = &r {
                eprintln!("{} (connection {:p})", common::Report(e), id.as_raw());
            }
            r
        });
    }
    let mut result = Ok(());
    while let Some(r) = tasks.join_next().await {
        if r.map_err(anyhow::Error::from).and_then(|r| r).is_err() {
            result = Err(anyhow!("rping server failed"));
        }
    }
    result
}

/// Accepts a request and answers pings until the client disconnects.
async fn serve(incoming: rdma::aio::Incoming, o: &Opts, cqs: &SharedCqs) -> Res<()> {
    // Phase one of the accept: the connection's resources on its device.
    let parts = Parts::on(incoming.id(), cqs)?;
    // Phase two.
    let id = incoming
        .accept(&parts.qp, &Conn::param())
        .await
        .context("rdma_accept")?;
    let mut conn = Conn::new(parts, id, o);
    let result = answer(o, &mut conn).await;
    conn.disconnect();
    result
}

async fn answer(o: &Opts, conn: &mut Conn) -> Res<()> {
    let mut buf = conn
        .pd
        .alloc_mr(o.size, AccessFlags::LOCAL_WRITE)
        .context("rdma_buf reg_mr failed")?;
    loop {
        let Some(msg) = conn.recv("RDMA_READ_ADV").await? else {
            return Ok(());
        };
        let remote = described(&msg);
        let len = remote.len as usize;
        if len == 0 || len > buf.len() {
            return Err(anyhow!(
                "client buffer of {len} bytes does not fit the server's {} (-S)",
                buf.len()
            ));
        }
        let tail = (len < buf.len())
            .then(|| buf.split_off(len))
            .transpose()
            .context("split")?;
        conn.qp
            .post_send(SendWr::read(WR_RDMA, buf, remote))
            .map_err(|e| anyhow!("post send error {e}"))?;
        buf = conn.rdma("RDMA_READ_COMPLETE").await?;
        if let Some(t) = tail {
            buf.unsplit(t)
                .map_err(|_| anyhow!("buffer pieces do not join"))?;
        }
        let text = c_str(&buf.to_vec());
        if o.verbose {
            println!("server ping data: {text}");
        }
        conn.send(&[0; INFO_LEN]).await?;
        let Some(msg) = conn.recv("RDMA_WRITE_ADV").await? else {
            return Ok(());
        };
        let sink = described(&msg);
        let n = (text.len() + 1).min(buf.len());
        if n as u64 > sink.len {
            return Err(anyhow!(
                "client sink of {} bytes is too small for {n}",
                sink.len
            ));
        }
        let tail = (n < buf.len())
            .then(|| buf.split_off(n))
            .transpose()
            .context("split")?;
        let remote = RemoteMemory {
            len: n as u64,
            ..sink
        };
        conn.qp
            .post_send(SendWr::write(WR_RDMA, buf, remote))
            .map_err(|e| anyhow!("post send error {e}"))?;
        buf = conn.rdma("RDMA_WRITE_COMPLETE").await?;
        if let Some(t) = tail {
            buf.unsplit(t)
                .map_err(|_| anyhow!("buffer pieces do not join"))?;
        }
        conn.send(&[0; INFO_LEN]).await?;
    }
}
