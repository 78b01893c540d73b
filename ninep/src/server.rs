//! The RDMA side: RDMA CM listener, one task and one QP per client.
//!
//! Each connection has its own PD, CQ (with a completion channel awaited on
//! tokio) and RC QP. Before it accepts, it posts `recv_depth` receives of
//! `max_msize` bytes, the largest message it will ever agree to, so a
//! client's first message (`Tversion`, sent with the client's msize, 128 KiB
//! by default for Linux) always finds room.
//!
//! The RDMA work of every connection runs on one thread (a tokio
//! `LocalSet`); the requests run on tokio's blocking pool, so one client's
//! slow request (an fsync, a FIFO without data, a lock) delays neither the
//! other clients nor that client's other requests. Reads and writes of
//! regular files are the exception: they wait only for the file system and,
//! while none of the connection's requests is on the pool, run on the
//! connection's thread as they arrive, which saves two thread wake-ups per
//! request (`Session::is_file_io`). A request
//! starts as soon as a send buffer is free for its reply (`send_depth` per
//! connection) and the connection may start one on the pool
//! (`crate::workers`: at most a quarter of its threads per connection, and
//! a second one only while more than a quarter are free, so that clients
//! whose requests wait for somebody, a lock or a lease, leave the others
//! threads; the connection's later requests wait in its queue, in order), and is
//! answered with one SEND as soon as it is done, in whatever order they
//! finish, which 9P allows; its receive is posted again first. A reply
//! answers a request, and the client posts a receive before each request
//! it sends, so the replies in flight never exceed the receives the client
//! has posted. A `Tflush` of a request still running is answered right
//! after that request's reply; one of a request still in the connection's
//! queue discards it (it is never answered) and is answered at once.
//!
//! What the server reports goes through the `log` crate (the binary
//! prints it with `env_logger`, `RUST_LOG`): connections accepted, refused
//! and ended at info and warn level; every request started, reply sent
//! and completion polled at trace level (for debugging a client); and,
//! under the target `rdma_9p::stats` at debug level, after each burst of
//! reads and writes (a pause of 200 ms ends one) and when a connection
//! ends, where its requests spent their time on the server.
//! `RDMA_9P_POOL_ALL` sends every request to the blocking pool, reads and
//! writes of regular files too (to measure what running them inline saves,
//! `ninep/bench/`).
//! `RDMA_9P_BENCH_NULL`, for benchmarks only, answers reads and writes of
//! regular files without touching them (`ninep/bench/null-bound.sh`).
//!
//! A connection that ends (disconnect, a failed completion, a malformed
//! header) drops its fids (each file closes when the last request using it
//! ends) and its QP, CQ and buffers; the others are served on.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma::aio::{tokio_rt as rt, Incoming};
use rdma::cm::{CmEventType, ConnParam};
use rdma::{BufferPool, MemoryRegion, QpState, SendWr, WcOpcode, WcStatus};

use tokio::task::JoinSet;

use crate::budget::OpenBudget;
use crate::error;
pub use crate::error::Error;
use crate::fs::{Export, Session};
use crate::link::{Queues, RECV};
use crate::proto::{ty, Rmsg, HEADER, NOTAG};
use crate::stats::{self, Stats};
use crate::workers::Workers;

/// The port Linux's 9P RDMA client connects to by default.
pub use crate::client::DEFAULT_PORT;
/// The largest msize agreed by default: Linux's default msize.
pub const DEFAULT_MSIZE: u32 = 128 * 1024;

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
    /// Connections served at once; a client past it is rejected (each holds
    /// `(recv_depth + send_depth) × max_msize` bytes of registered memory
    /// and its share of descriptors from the moment it connects, before it
    /// says anything).
    pub max_connections: usize,
    /// How clients' users map to the server's (root squashed by default).
    pub users: crate::users::Users,
    /// Receives kept posted per connection (Linux's client keeps at most
    /// 32 requests outstanding by default, `rq=32`).
    pub recv_depth: u32,
    /// Replies in flight per connection.
    pub send_depth: u32,
    /// The threads that run requests, shared by every connection (tokio's
    /// blocking pool). One connection runs at most
    /// [`Config::max_running`] of its requests on them at once, and a
    /// second one only while more than a quarter of them are free
    /// ([`Workers`]); the rest wait in order in its queue.
    pub workers: usize,
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
            max_connections: 64,
            users: crate::users::Users::default(),
            recv_depth: 64,
            send_depth: 16,
            workers: DEFAULT_WORKERS,
        }
    }

    /// The most requests of one connection on the worker threads at once:
    /// a quarter of them (at least one), so that one client's requests that
    /// wait (on a lock, a lease, a slow file system) leave three quarters of
    /// the threads to the others ([`Workers::per_connection`]). With the
    /// default 64 workers it is 16, as many as a connection's send buffers.
    pub fn max_running(&self) -> usize {
        Workers::new(self.workers).per_connection()
    }
}

type Res<T> = Result<T, Error>;

/// The threads that run requests by default (tokio's blocking pool).
pub const DEFAULT_WORKERS: usize = 64;

/// Serves until an error stops the listener; `ready` is called with the
/// address once it listens.
///
/// # Errors
/// When the directory cannot be opened or the listener fails.
pub fn run(config: Config, ready: impl FnOnce(SocketAddr)) -> Res<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        // I/O only: the server sets no timers, and tokio's timer driver
        // reads the clock around every wait for an event, a system call
        // each where the clock source has no vDSO path (the TCG guest's).
        .enable_io()
        // The threads that run requests (file I/O blocks): enough for every
        // request of a few clients at once, bounded whatever clients do.
        .max_blocking_threads(config.workers.max(1))
        .build()
        .map_err(error::io("tokio runtime"))?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, serve(config, ready))
}

/// The listener loop (on a tokio `LocalSet`).
///
/// # Errors
/// When the directory cannot be opened or the listener fails.
pub async fn serve(config: Config, ready: impl FnOnce(SocketAddr)) -> Res<()> {
    let nofile = crate::sys::raise_nofile_limit().map_err(error::io("RLIMIT_NOFILE"))?;
    let budget = Arc::new(open_budget(nofile, &config)?);
    log::info!(
        "up to {} connections, {} open files each and {} more shared (of {nofile} \
         descriptors)",
        config.max_connections,
        budget.guaranteed(),
        budget.pool().1
    );
    let export = Rc::new(
        Export::new(&config.dir, config.read_only, config.max_fids)
            .map_err(error::io(format!("cannot serve {}", config.dir.display())))?
            .with_users(config.users)
            .with_open_budget(budget),
    );
    let connections = Rc::new(std::cell::Cell::new(0usize));
    let workers = Workers::new(config.workers);
    let config = Rc::new(config);
    let cm = rt::cm_channel().map_err(error::rdma("rdma_create_event_channel"))?;
    let mut listener = cm
        .listen(SocketAddr::new(config.addr, config.port), 128)
        .map_err(error::rdma("rdma_listen"))?;
    if bench_null() {
        log::warn!(
            "RDMA_9P_BENCH_NULL is set: reads and writes of regular files are answered \
             without touching them (for benchmarks only; the data served is not the files')"
        );
    }
    ready(SocketAddr::new(config.addr, listener.id().src_port()));
    loop {
        let incoming = listener
            .get_request()
            .await
            .map_err(error::rdma("rdma_get_cm_event"))?;
        let peer = incoming.id().peer_addr();
        if connections.get() >= config.max_connections {
            // Rejected before anything is allocated for it.
            log::warn!(
                "{peer:?}: rejected: {} connections already (--max-connections)",
                config.max_connections
            );
            if let Err(e) = incoming.reject(&[]) {
                log::warn!("{peer:?}: rdma_reject: {e}");
            }
            continue;
        }
        connections.set(connections.get() + 1);
        let (export, config) = (Rc::clone(&export), Rc::clone(&config));
        let connections = Rc::clone(&connections);
        let workers = workers.clone();
        tokio::task::spawn_local(async move {
            match connection(incoming, &export, &config, workers).await {
                Ok(()) => log::info!("{peer:?}: disconnected"),
                Err(e) => log::warn!("{peer:?}: {e}"),
            }
            connections.set(connections.get() - 1);
        });
    }
}

/// Open files each connection is guaranteed, at most.
const GUARANTEED_OPEN: u64 = 16;

/// The descriptors the server gives clients' open files, from `nofile` (the raised
/// `RLIMIT_NOFILE`): what is left after what the server keeps whatever clients do (64:
/// standard streams, the CM and verbs devices, the runtime), what its request threads hold
/// while they run (three each: an `O_PATH`, a directory, a listing) and what each
/// connection needs to work (two: its completion channel, one spare). Each connection is
/// guaranteed up to 16 of them ([`OpenBudget`]), the rest is a pool for any, so that one
/// client holding every file it can cannot make another's open, or another connection,
/// fail for lack of descriptors.
///
/// # Errors
/// When the limit leaves no descriptor for open files.
pub fn open_budget(nofile: u64, c: &Config) -> Res<OpenBudget> {
    let connections = c.max_connections.max(1) as u64;
    let reserve = 64 + 3 * c.workers.max(1) as u64 + 2 * connections;
    let files = nofile.saturating_sub(reserve);
    let guaranteed = (files / connections).min(GUARANTEED_OPEN);
    if guaranteed == 0 {
        return Err(Error::Descriptors {
            nofile,
            connections,
            reserve,
        });
    }
    let pool = files - guaranteed * connections;
    let cap = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    Ok(OpenBudget::new(cap(guaranteed).min(c.max_fids), cap(pool)))
}

/// A request handled on a blocking thread, with what it needs back.
struct Done {
    /// The request's receive buffer, to post again.
    recv: MemoryRegion,
    recv_wr: u64,
    /// The send buffer holding the reply, and the reply's length.
    slot: MemoryRegion,
    len: usize,
    tag: u16,
    /// A reason to close the connection instead of answering.
    fatal: Option<Error>,
    /// When the receive was polled and handed over, when the handler began
    /// and ended (only when the stats are logged).
    times: Option<[Instant; 4]>,
}

/// Handles one request (`len` bytes of `recv`) and writes the reply into
/// `slot`; runs on the blocking pool.
fn handle(
    session: &Session,
    recv: MemoryRegion,
    recv_wr: u64,
    len: usize,
    mut slot: MemoryRegion,
    handed: Option<(Instant, Instant)>,
) -> Done {
    let began = handed.map(|h| (h, Instant::now()));
    let tag = tag_of(&recv);
    let written = (|| {
        let msg = recv
            .as_slice()
            .map_err(error::rdma("receive buffer"))?
            .get(..len)
            .ok_or(Error::Internal("a receive longer than its buffer"))?;
        let out = slot.as_mut_slice().map_err(error::rdma("send buffer"))?;
        if bench_null() {
            if let Some(n) = session.null_io_into(msg, out) {
                return Ok(n);
            }
        }
        session.handle_into(msg, out).map_err(Error::Malformed)
    })();
    let (len, fatal) = match written {
        Ok(n) => (n, None),
        Err(e) => (0, Some(e)),
    };
    Done {
        recv,
        recv_wr,
        slot,
        len,
        tag,
        fatal,
        times: began.map(|((r, h), b)| [r, h, b, Instant::now()]),
    }
}

/// `RDMA_9P_POOL_ALL`: every request goes to the blocking pool, reads and
/// writes of regular files too (for comparing that with running them inline).
fn pool_all() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("RDMA_9P_POOL_ALL").is_some())
}

/// `RDMA_9P_BENCH_NULL`, **for benchmarks only**: reads and writes of
/// regular files are answered without touching the file
/// (`Session::null_io_into`: a read gets the send buffer's bytes as they
/// are, a write is told it was done), to measure what the client and the
/// transport allow when the server's file I/O costs nothing
/// (`ninep/bench/null-bound.sh`). Never set it when serving real data.
fn bench_null() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("RDMA_9P_BENCH_NULL").is_some())
}

/// The tag of the message in `buf` (`NOTAG` if it is too short for one).
fn tag_of(buf: &MemoryRegion) -> u16 {
    buf.as_slice()
        .ok()
        .and_then(|b| b.get(5..7))
        .map_or(NOTAG, |t| u16::from_le_bytes([t[0], t[1]]))
}

/// `Tflush`'s `oldtag`, when `msg` is a well-formed `Tflush`.
fn flush_of(msg: &[u8]) -> Option<(u16, u16)> {
    if msg.len() != HEADER + 2 || msg.get(4) != Some(&ty::TFLUSH) {
        return None;
    }
    let tag = u16::from_le_bytes([msg[5], msg[6]]);
    let old = u16::from_le_bytes([msg[7], msg[8]]);
    Some((tag, old))
}

async fn connection(
    incoming: Incoming,
    export: &Export,
    config: &Config,
    workers: Workers,
) -> Res<()> {
    let msize = config.max_msize.max(crate::fs::MIN_MSIZE) as usize;
    let Queues {
        pd: _pd,
        mut acq,
        mut qp,
        recv_pool,
        send_pool,
    } = Queues::new(incoming.id(), config.send_depth, config.recv_depth, msize)?;
    for i in 0..config.recv_depth {
        let slot = recv_pool
            .take()
            .ok_or(Error::Internal("receive pool empty"))?;
        qp.post_recv(RECV | u64::from(i), slot)
            .map_err(error::post("ibv_post_recv"))?;
    }
    ready_qp(incoming.id(), &qp)?;
    let mut id = incoming
        .accept_ready(&qp, &accept_param())
        .await
        .map_err(error::rdma("rdma_accept"))?;

    let session = Arc::new(Session::new(export, config.max_msize));
    let mut conn = Conn {
        qp,
        send_pool,
        tails: HashMap::new(),
        next_send: 0,
        workers,
    };
    let result = conn.serve(&session, &mut acq, &mut id).await;
    // Every fid goes now; a request still running on the blocking pool
    // closes the file it uses when it ends (its result is dropped).
    session.close_all();
    break_with(&mut conn.qp, &id);
    result
}

/// A connection's sending side.
struct Conn {
    qp: rdma::QueuePair,
    send_pool: BufferPool,
    /// The unused tail of each reply's send buffer, joined back on completion.
    tails: HashMap<u64, MemoryRegion>,
    next_send: u64,
    /// The blocking pool's threads, shared with every connection: when
    /// this one may start a request on them.
    workers: Workers,
}

impl Conn {
    /// Sends the first `len` bytes of `slot` as one SEND.
    async fn send(
        &mut self,
        acq: &mut rdma::aio::AsyncCq,
        mut slot: MemoryRegion,
        len: usize,
    ) -> Res<()> {
        if len < slot.len() {
            let tail = slot.split_off(len).map_err(error::rdma("send buffer"))?;
            self.tails.insert(self.next_send, tail);
        }
        acq.post_send(&mut self.qp, SendWr::send(self.next_send, slot))
            .await
            .map_err(error::post("ibv_post_send"))?;
        self.next_send = (self.next_send + 1) & !RECV;
        Ok(())
    }

    /// Receives requests, hands each to the blocking pool as soon as a send
    /// buffer is free for its reply and the connection may start one more
    /// on the pool (`Workers::may_start`), and sends the replies as they
    /// are ready. The requests in progress never outnumber the send buffers,
    /// and every reply answers a request (the client posted a receive for
    /// it). A `Tflush` goes ahead of the queue: a request it names that
    /// has not started is discarded and the flush answered at once; one in
    /// progress is answered first, the flush right after, as 9P asks.
    async fn serve(
        &mut self,
        session: &Arc<Session>,
        acq: &mut rdma::aio::AsyncCq,
        id: &mut rdma::aio::AsyncCmId,
    ) -> Res<()> {
        // Requests received and not yet started: (buffer, length, wr_id).
        let mut pending: VecDeque<(MemoryRegion, usize, u64, Option<Instant>)> = VecDeque::new();
        let mut stats = Stats::default();
        let mut last_reply: Option<Instant> = None;
        let result = self
            .serve_loop(session, acq, id, &mut pending, &mut stats, &mut last_reply)
            .await;
        stats.print();
        result
    }

    async fn serve_loop(
        &mut self,
        session: &Arc<Session>,
        acq: &mut rdma::aio::AsyncCq,
        id: &mut rdma::aio::AsyncCmId,
        pending: &mut VecDeque<(MemoryRegion, usize, u64, Option<Instant>)>,
        stats: &mut Stats,
        last_reply: &mut Option<Instant>,
    ) -> Res<()> {
        let mut running: JoinSet<Done> = JoinSet::new();
        // Tags in progress, with the flushes that wait for them: (tag, slot).
        let mut in_progress: HashMap<u16, Vec<(u16, MemoryRegion)>> = HashMap::new();
        loop {
            while self.send_pool.available() > 0 {
                // At most a share of the pool, which every connection shares
                // (`Workers::may_start`): the rest wait here, in order
                // (nothing is refused: the queue holds at most the receives
                // the client was given). This connection's own requests
                // ending let it try again. A `Tflush` needs no thread and is
                // never held back by it.
                let Some((front, front_len, ..)) = pending.front() else {
                    break;
                };
                let front_flush = front
                    .as_slice()
                    .ok()
                    .and_then(|b| b.get(..*front_len))
                    .and_then(flush_of)
                    .is_some();
                if !self.workers.may_start(running.len()) && !front_flush {
                    break;
                }
                let Some((buf, len, wr_id, polled)) = pending.pop_front() else {
                    break;
                };
                let slot = self
                    .send_pool
                    .take()
                    .ok_or(Error::Internal("send pool empty"))?;
                let msg = buf.as_slice().ok().and_then(|b| b.get(..len));
                let flush = msg.and_then(flush_of);
                if let Some((tag, old)) = flush {
                    if let Some(waiting) = in_progress.get_mut(&old) {
                        waiting.push((tag, slot));
                        self.qp
                            .post_recv(wr_id, buf)
                            .map_err(error::post("ibv_post_recv"))?;
                        continue;
                    }
                }
                // A read or write of a regular file runs here, on the
                // connection's thread, when none of this connection's
                // requests is on the pool: it waits only for the file system
                // (page cache copies for a local one), and handing it to the
                // blocking pool costs two thread wake-ups per request
                // (the stats' "handoff" and part of "back"). Anything
                // that may wait for another party goes to the pool, and so
                // does everything while a request is there. That second rule
                // is a precaution: with reads run here regardless, a read of
                // a regular file next to a FIFO's waiting read was once seen
                // unanswered (`kernel_mount_concurrent_clients_*`), never
                // reproduced, and no path was found by which the reply could
                // be lost (the receive is posted again and the reply sent
                // before the loop waits again, no lock is held across the
                // FIFO's read, and a reply needs no free receive of this
                // side). The rule costs nothing in a sequential transfer (no
                // request of the connection is on the pool when its next
                // read or write comes); `docs/benchmarks-log.md` has the runs.
                // A `Tflush` of nothing in progress is answered here too (no
                // file is touched): it never waits for a thread.
                let inline = flush.is_some()
                    || (!pool_all()
                        && running.is_empty()
                        && msg.is_some_and(|m| session.is_file_io(m)));
                let tag = tag_of(&buf);
                log::trace!(
                    "start tag {tag} len {len} type {:?} wr {wr_id:#x}{}",
                    buf.as_slice().ok().and_then(|b| b.get(4).copied()),
                    if inline { " inline" } else { "" }
                );
                let handed = polled.map(|p| (p, Instant::now()));
                if inline {
                    let d = handle(session, buf, wr_id, len, slot, handed);
                    let idle = running.is_empty() && pending.is_empty();
                    self.finish(acq, d, Vec::new(), stats, last_reply, idle)
                        .await?;
                    continue;
                }
                in_progress.entry(tag).or_default();
                let s = Arc::clone(session);
                let busy = self.workers.claim();
                running.spawn_blocking(move || {
                    // Counted until the request ends, whether or not the
                    // connection still waits for it.
                    let _busy = busy;
                    handle(&s, buf, wr_id, len, slot, handed)
                });
            }
            tokio::select! {
                done = running.join_next(), if !running.is_empty() => {
                    let Some(done) = done else { continue };
                    let d = done.map_err(|e| Error::Handler(e.to_string()))?;
                    let idle = running.is_empty() && pending.is_empty();
                    let waiting = in_progress.remove(&d.tag).unwrap_or_default();
                    self.finish(acq, d, waiting, stats, last_reply, idle).await?;
                }
                c = acq.next() => {
                    let mut c = c.map_err(error::rdma("poll"))?;
                    if c.status == WcStatus::WrFlushErr {
                        return Ok(());
                    }
                    if c.status != WcStatus::Success {
                        return Err(Error::Completion { wr_id: c.wr_id, status: c.status });
                    }
                    let Some(mut buf) = c.take_buffers().into_one() else {
                        return Err(Error::Internal("a completion without its buffer"));
                    };
                    log::trace!("wc {:?} wr {:#x} status {} len {}", c.opcode, c.wr_id, c.status, c.byte_len);
                    if c.opcode == WcOpcode::Recv {
                        let now = stats::on().then(Instant::now);
                        if let (Some(now), Some(last)) = (now, last_reply.take()) {
                            // A pause: what came before was one burst.
                            if now - last > Duration::from_millis(200) {
                                stats.print();
                                *stats = Stats::default();
                            } else {
                                stats.idle += now - last;
                                stats.idle_n += 1;
                            }
                        }
                        let len = c.byte_len as usize;
                        match buf.as_slice().ok().and_then(|b| b.get(..len)).and_then(flush_of) {
                            Some((_, old)) => {
                                self.flush_queued(pending, old)?;
                                // Ahead of the queue: it needs no thread, and
                                // what it names came before it (started,
                                // answered, or just discarded).
                                pending.push_front((buf, len, c.wr_id, now));
                            }
                            None => pending.push_back((buf, len, c.wr_id, now)),
                        }
                    } else {
                        if let Some(tail) = self.tails.remove(&c.wr_id) {
                            if buf.unsplit(tail).is_err() {
                                return Err(Error::Internal("a send buffer's tail does not fit"));
                            }
                        }
                        if self.send_pool.put(buf).is_err() {
                            return Err(Error::Internal("not a send buffer"));
                        }
                    }
                }
                e = id.next_event() => match e {
                    Ok(e) if e.event_type() == CmEventType::Disconnected => return Ok(()),
                    Ok(_) => {}
                    Err(e) => return Err(error::rdma("rdma_get_cm_event")(e)),
                },
            }
        }
    }

    /// A `Tflush` of `old`: a request with that tag still waiting in the
    /// connection's queue (not started) is discarded, never answered, as 9P
    /// allows, and its receive posted again; the flush is then answered at
    /// once. One in progress is left to finish (its flush waits for it).
    fn flush_queued(
        &mut self,
        pending: &mut VecDeque<(MemoryRegion, usize, u64, Option<Instant>)>,
        old: u16,
    ) -> Res<()> {
        let queued = pending.iter().position(|(b, len, ..)| {
            tag_of(b) == old
                && b.as_slice()
                    .ok()
                    .and_then(|m| m.get(..*len))
                    .and_then(flush_of)
                    .is_none()
        });
        if let Some((buf, _, wr_id, _)) = queued.and_then(|i| pending.remove(i)) {
            log::trace!("flushed tag {old} before it started");
            self.qp
                .post_recv(wr_id, buf)
                .map_err(error::post("ibv_post_recv"))?;
        }
        Ok(())
    }

    /// Answers a request that has been handled: posts its receive again,
    /// sends its reply, then the replies of the flushes that waited for it
    /// (`waiting`: their tags and send buffers).
    async fn finish(
        &mut self,
        acq: &mut rdma::aio::AsyncCq,
        d: Done,
        waiting: Vec<(u16, MemoryRegion)>,
        stats: &mut Stats,
        last_reply: &mut Option<Instant>,
        idle: bool,
    ) -> Res<()> {
        if let Some(e) = d.fatal {
            return Err(e);
        }
        self.qp
            .post_recv(d.recv_wr, d.recv)
            .map_err(error::post("ibv_post_recv"))?;
        let ty = d.slot.as_slice().ok().and_then(|b| b.get(4).copied());
        log::trace!(
            "reply tag {} len {} type {ty:?} free {}",
            d.tag,
            d.len,
            self.send_pool.available()
        );
        self.send(acq, d.slot, d.len).await?;
        let data = ty == Some(ty::TREAD + 1) || ty == Some(ty::TWRITE + 1);
        if let (Some([r, h, b, e]), true) = (d.times, data) {
            let now = Instant::now();
            stats.n += 1;
            stats.queued += h - r;
            stats.handoff += b - h;
            stats.handle += e - b;
            stats.back += now - e;
            if idle {
                *last_reply = Some(now);
            }
        }
        for (tag, mut slot) in waiting {
            let mut out = Vec::with_capacity(HEADER);
            Rmsg::Flush.encode(tag, &mut out);
            slot.write_at(0, &out).map_err(error::rdma("send buffer"))?;
            self.send(acq, slot, out.len()).await?;
        }
        Ok(())
    }
}

/// The connection parameters of the accept. On InfiniBand/RoCE the REP
/// carries the RNR retry count the *client's* QP will use: Linux's 9P
/// client asks for none of its own, so without this one request that found
/// no receive posted here would end its connection (its waiting request then
/// hangs until killed: trans_rdma does not fail it). Seven is "retry without
/// limit". (Its transport retry count is its own, from its REQ: zero.)
fn accept_param() -> ConnParam {
    ConnParam {
        rnr_retry_count: 7,
        ..ConnParam::default()
    }
}

/// Moves the QP to RTR and RTS with the connection manager's attributes,
/// except the retry counts on InfiniBand/RoCE: Linux's 9P client asks for
/// none (its connection parameters are all zero), so one ACK timeout or one
/// reply that finds no receive posted would end the connection. Ours retries
/// 7 times on timeout and without limit on RNR, with an ACK timeout of at
/// least 4.096 µs × 2^14 (67 ms). On iWARP the CM gives no such attributes
/// (TCP retransmits), and none are added.
fn ready_qp(id: &rdma::cm::CmId, qp: &rdma::QueuePair) -> Res<()> {
    id.modify_qp(qp, QpState::Rtr)
        .map_err(error::rdma("QP to RTR"))?;
    let mut rts = id
        .init_qp_attr(QpState::Rts)
        .map_err(error::rdma("rdma_init_qp_attr"))?;
    let raw = rts.as_raw();
    log::trace!(
        "RTS from the CM: timeout {} retry_cnt {} rnr_retry {}",
        raw.timeout,
        raw.retry_cnt,
        raw.rnr_retry
    );
    if rts.mask() & rdma::ffi::IBV_QP_RETRY_CNT != 0 {
        let timeout = rts.as_raw().timeout.max(14);
        rts.retry_cnt(7).rnr_retry(7).timeout(timeout);
    }
    qp.modify(&rts).map_err(error::rdma("QP to RTS"))
}

/// Stops the QP (its receives flush) and disconnects.
fn break_with(qp: &mut rdma::QueuePair, id: &rdma::aio::AsyncCmId) {
    let _ = qp.to_error();
    let _ = id.id().disconnect();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Descriptors are shared out: each connection up to 16 of its own, the rest a
    /// pool, after what the server, its threads and its connections need.
    #[test]
    fn every_connection_gets_a_share_of_the_descriptors() {
        let mut c = Config::new(PathBuf::from("/srv"));
        c.max_connections = 4;
        // 64 kept, 192 for the request threads, 2 per connection: 1024 - 264 = 760.
        let b = open_budget(1024, &c).unwrap();
        assert_eq!((b.guaranteed(), b.pool()), (16, (0, 760 - 64)));
        // Few descriptors for many connections: a smaller share, no pool.
        c.max_connections = 64;
        let b = open_budget(1024, &c).unwrap();
        assert_eq!((b.guaranteed(), b.pool().1), (10, 640 - 640));
        let e = open_budget(300, &c).unwrap_err().to_string();
        assert!(e.contains("RLIMIT_NOFILE 300 leaves no descriptors"), "{e}");
        assert!(e.contains("--max-connections"), "{e}");
    }
}
