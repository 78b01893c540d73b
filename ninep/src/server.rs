//! The RDMA side: RDMA CM listener, one task and one QP per client.
//!
//! Each connection has its own PD, CQ (with a completion channel awaited on
//! tokio) and RC QP. Before it accepts, it posts `recv_depth` receives of
//! `max_msize` bytes, the largest message it will ever agree to, so a
//! client's first message (`Tversion`, sent with the client's msize, 128 KiB
//! by default for Linux) always finds room. Every request is handled in
//! order and answered with one SEND from a send buffer of its own; a
//! request's receive is posted again as soon as it has been handled. A
//! reply answers a request, and the client posts a receive before each
//! request it sends, so the replies in flight never exceed the receives the
//! client has posted; the send buffers (`send_depth`) bound them further.
//!
//! A connection that ends (disconnect, a failed completion, a malformed
//! header) drops its session (every fid and open file) and its QP, CQ and
//! buffers; the others are served on.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::rc::Rc;

use rdma::aio::{tokio as rt, Incoming};
use rdma::cm::{CmEventType, ConnParam};
use rdma::{AccessFlags, BufferPool, MemoryRegion, QpState, QpType, SendWr, WcOpcode, WcStatus};

use crate::fs::{Export, Session};

/// The port Linux's 9P RDMA client connects to by default.
pub const DEFAULT_PORT: u16 = 5640;
/// The largest msize agreed by default: Linux's default msize.
pub const DEFAULT_MSIZE: u32 = 128 * 1024;
/// Receive work requests have this bit; sends do not.
const RECV: u64 = 1 << 63;

/// What `rdma-9p serve` was told.
#[derive(Debug, Clone)]
pub struct Config {
    /// The address to listen on.
    pub addr: IpAddr,
    /// The port (RDMA CM, TCP port space).
    pub port: u16,
    /// The directory served.
    pub dir: PathBuf,
    /// Refuse every change.
    pub read_only: bool,
    /// The largest msize agreed (and the size of every receive).
    pub max_msize: u32,
    /// Fids one connection may hold.
    pub max_fids: usize,
    /// Receives kept posted per connection (Linux's client keeps at most
    /// 32 requests outstanding by default, `rq=32`).
    pub recv_depth: u32,
    /// Replies in flight per connection.
    pub send_depth: u32,
}

impl Config {
    /// The defaults: every address, port 5640, read-write, msize 128 KiB.
    pub fn new(dir: PathBuf) -> Config {
        Config {
            addr: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            port: DEFAULT_PORT,
            dir,
            read_only: false,
            max_msize: DEFAULT_MSIZE,
            max_fids: 4096,
            recv_depth: 64,
            send_depth: 16,
        }
    }
}

type Res<T> = Result<T, String>;

fn fail<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e}")
}

/// Serves until an error stops the listener; `ready` is called with the
/// address once it listens.
///
/// # Errors
/// When the directory cannot be opened or the listener fails.
pub fn run(config: Config, ready: impl FnOnce(SocketAddr)) -> Res<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(fail("tokio runtime"))?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, serve(config, ready))
}

/// The listener loop (on a tokio `LocalSet`).
///
/// # Errors
/// When the directory cannot be opened or the listener fails.
pub async fn serve(config: Config, ready: impl FnOnce(SocketAddr)) -> Res<()> {
    let export = Rc::new(
        Export::new(&config.dir, config.read_only, config.max_fids)
            .map_err(|e| format!("{}: {e}", config.dir.display()))?,
    );
    let config = Rc::new(config);
    let cm = rt::cm_channel().map_err(fail("rdma_create_event_channel"))?;
    let mut listener = cm
        .listen(SocketAddr::new(config.addr, config.port), 128)
        .map_err(fail("rdma_listen"))?;
    ready(SocketAddr::new(config.addr, listener.id().src_port()));
    loop {
        let incoming = listener
            .get_request()
            .await
            .map_err(fail("rdma_get_cm_event"))?;
        let (export, config) = (Rc::clone(&export), Rc::clone(&config));
        tokio::task::spawn_local(async move {
            let peer = incoming.id().peer_addr();
            match connection(incoming, &export, &config).await {
                Ok(()) => eprintln!("rdma-9p: {peer:?}: disconnected"),
                Err(e) => eprintln!("rdma-9p: {peer:?}: {e}"),
            }
        });
    }
}

async fn connection(incoming: Incoming, export: &Export, config: &Config) -> Res<()> {
    let msize = config.max_msize.max(crate::fs::MIN_MSIZE) as usize;
    let ctx = incoming.context().map_err(fail("context"))?;
    let pd = ctx.alloc_pd().map_err(fail("ibv_alloc_pd"))?;
    let channel = ctx.create_comp_channel().map_err(fail("channel"))?;
    let cq = ctx
        .create_cq(config.recv_depth + config.send_depth, Some(&channel), 0)
        .map_err(fail("ibv_create_cq"))?;
    let mut acq = rt::completions(&cq).map_err(fail("rdma::aio"))?;
    let mut qp = pd
        .qp_builder(QpType::Rc, &cq, &cq)
        .max_send_wr(config.send_depth)
        .max_recv_wr(config.recv_depth)
        .build()
        .map_err(fail("ibv_create_qp"))?;
    let recv_pool = BufferPool::new(
        &pd,
        msize,
        config.recv_depth as usize,
        AccessFlags::LOCAL_WRITE,
    )
    .map_err(fail("receive buffers"))?;
    let send_pool = BufferPool::new(&pd, msize, config.send_depth as usize, AccessFlags::empty())
        .map_err(fail("send buffers"))?;
    incoming
        .id()
        .modify_qp(&qp, QpState::Init)
        .map_err(fail("ibv_modify_qp"))?;
    for i in 0..config.recv_depth {
        let slot = recv_pool.take().ok_or("receive pool empty")?;
        qp.post_recv(RECV | u64::from(i), slot)
            .map_err(|e| format!("ibv_post_recv: {e}"))?;
    }
    ready_qp(incoming.id(), &qp)?;
    let mut id = incoming
        .accept_ready(&qp, &ConnParam::default())
        .await
        .map_err(fail("rdma_accept"))?;

    let mut session = Session::new(export, config.max_msize);
    // Requests received and not yet answered: (buffer, length, wr_id).
    let mut pending: VecDeque<(MemoryRegion, usize, u64)> = VecDeque::new();
    // The unused tail of each reply's send buffer, joined back on completion.
    let mut tails: HashMap<u64, MemoryRegion> = HashMap::new();
    let mut next_send = 0u64;
    let mut out = Vec::with_capacity(msize);
    let result = loop {
        // Answer what has arrived while a send buffer is free.
        while send_pool.available() > 0 {
            let Some((buf, len, wr_id)) = pending.pop_front() else {
                break;
            };
            out.clear();
            let handled = buf
                .as_slice()
                .map_err(fail("receive buffer"))
                .and_then(|b| {
                    let msg = b.get(..len).ok_or("a receive longer than its buffer")?;
                    session
                        .handle(msg, &mut out)
                        .map_err(|e| format!("malformed message, closing: {e}"))
                });
            if let Err(e) = handled {
                break_with(&mut qp, &id);
                return Err(e);
            }
            qp.post_recv(wr_id, buf)
                .map_err(|e| format!("ibv_post_recv: {e}"))?;
            if out.len() > msize {
                break_with(&mut qp, &id);
                return Err(format!("a reply of {} bytes exceeds msize", out.len()));
            }
            let mut slot = send_pool.take().ok_or("send pool empty")?;
            slot.write_at(0, &out).map_err(fail("send buffer"))?;
            if out.len() < slot.len() {
                let tail = slot.split_off(out.len()).map_err(fail("send buffer"))?;
                tails.insert(next_send, tail);
            }
            acq.post_send(&mut qp, SendWr::send(next_send, slot))
                .await
                .map_err(|e| format!("ibv_post_send: {e}"))?;
            next_send = (next_send + 1) & !RECV;
        }
        let c = tokio::select! {
            c = acq.next() => c,
            e = id.next_event() => match e {
                Ok(e) if e.event_type() == CmEventType::Disconnected => break Ok(()),
                Ok(_) => continue,
                Err(e) => break Err(format!("rdma_get_cm_event: {e}")),
            },
        };
        let mut c = match c {
            Ok(c) => c,
            Err(e) => break Err(format!("poll: {e}")),
        };
        if c.status == WcStatus::WrFlushErr {
            break Ok(());
        }
        if c.status != WcStatus::Success {
            break Err(format!("completion {:#x}: {}", c.wr_id, c.status));
        }
        let Some(mut buf) = c.take_buffers().into_one() else {
            break Err("a completion without its buffer".into());
        };
        if c.opcode == WcOpcode::Recv {
            pending.push_back((buf, c.byte_len as usize, c.wr_id));
        } else {
            if let Some(tail) = tails.remove(&c.wr_id) {
                if buf.unsplit(tail).is_err() {
                    break Err("a send buffer's tail does not fit".into());
                }
            }
            if send_pool.put(buf).is_err() {
                break Err("not a send buffer".into());
            }
        }
    };
    break_with(&mut qp, &id);
    result
}

/// Moves the QP to RTR and RTS with the connection manager's attributes,
/// except the retry counts on InfiniBand/RoCE: Linux's 9P client asks for
/// none (its connection parameters are all zero), so one ACK timeout or one
/// reply that finds no receive posted would end the connection. Ours retries
/// 7 times on timeout and without limit on RNR, with an ACK timeout of at
/// least 4.096 µs × 2^14 (67 ms). On iWARP the CM gives no such attributes
/// (TCP retransmits), and none are added.
fn ready_qp(id: &rdma::cm::CmId, qp: &rdma::QueuePair) -> Res<()> {
    id.modify_qp(qp, QpState::Rtr).map_err(fail("QP to RTR"))?;
    let mut rts = id
        .init_qp_attr(QpState::Rts)
        .map_err(fail("rdma_init_qp_attr"))?;
    if rts.mask() & rdma::ffi::IBV_QP_RETRY_CNT != 0 {
        let timeout = rts.as_raw().timeout.max(14);
        rts.retry_cnt(7).rnr_retry(7).timeout(timeout);
    }
    qp.modify(&rts).map_err(fail("QP to RTS"))
}

/// Stops the QP (its receives flush) and disconnects.
fn break_with(qp: &mut rdma::QueuePair, id: &rdma::aio::AsyncCmId) {
    let _ = qp.to_error();
    let _ = id.id().disconnect();
}
