//! The async stream and listener, on rdma-verbs' async layer: any reactor
//! that implements [`rdma::aio::Reactor`] (tokio's `Tokio`, async-io's
//! `AsyncIo`), with tokio's `AsyncRead`/`AsyncWrite` (feature `tokio`) and
//! futures-io's (feature `futures-io`).
//!
//! A stream's completions and connection events wake one waker that wakes
//! both directions' tasks, so a read half and a write half can wait in two
//! tasks at once ([`RdmaStream::into_split`]). The listener is in
//! `listener`.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use rdma::aio::{AsyncCmId, AsyncCq, ConnectOptions, Connection, ConnectionParts, Reactor};
use rdma::cm::CmEventType;
use rdma::ProtectionDomain;

use crate::engine::{Engine, Polled};
use crate::local::Local;
use crate::setup::{self, Options};
use crate::wire::ConnData;

mod iomap;
mod listener;
pub use listener::{RdmaListener, DEFAULT_MAX_ACCEPTING};

/// How long dropping a stream that does not linger (`Options::linger` 0, or
/// no thread to linger on) waits, spinning, for what was written to be
/// delivered.
const DROP_LINGER: Duration = Duration::from_secs(2);

fn connect_options(opts: &Options) -> ConnectOptions {
    let s = opts.sizes;
    ConnectOptions {
        timeout: opts.timeout,
        max_send_wr: s.send_queue,
        max_recv_wr: s.recv_queue,
        max_sge: 1,
        cqe: s.send_queue + s.recv_queue,
        max_inline_data: s.inline.max(crate::wire::SGE_LEN as u32),
        ..ConnectOptions::default()
    }
}

/// The tasks waiting on each direction.
#[derive(Default)]
struct Wakers {
    read: Mutex<Option<Waker>>,
    write: Mutex<Option<Waker>>,
}

impl Wake for Wakers {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        for slot in [&self.read, &self.write] {
            let w = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(w) = w {
                w.wake();
            }
        }
    }
}

/// The connection, in teardown order: the QP (in the engine) before its CQ,
/// the PD, the id last.
struct Shared {
    engine: Engine,
    cq: AsyncCq,
    _pd: ProtectionDomain,
    id: AsyncCmId,
    /// What every poll of the CQ polls into (compact completions).
    polled: Polled,
}

struct Inner {
    /// Shared with the thread that closes the connection in the background
    /// once the stream is dropped (`linger.rs`).
    shared: Arc<Mutex<Shared>>,
    wakers: Arc<Wakers>,
    fanout: Waker,
    busy_poll: Duration,
    linger: Duration,
    local: SocketAddr,
    peer: SocketAddr,
}

#[derive(Clone, Copy)]
enum Direction {
    Read,
    Write,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        lock(&self.shared)
    }

    /// Runs `op` until it returns `Some`, taking completions and connection
    /// events in between; `Pending` (the task registered for `dir`) when
    /// nothing is left to take.
    ///
    /// Before it arms the CQ and lets the task sleep on the reactor, it
    /// polls the CQ for `busy_poll` (as the blocking stream and rsocket's
    /// `polling_time`): a reply that comes that soon costs no event, no
    /// wake-up and no trip through the runtime. The executor's thread is
    /// held that long.
    fn poll_op<T>(
        &self,
        cx: &mut Context<'_>,
        dir: Direction,
        mut op: impl FnMut(&mut Engine) -> io::Result<Option<T>>,
    ) -> Poll<io::Result<T>> {
        let slot = match dir {
            Direction::Read => &self.wakers.read,
            Direction::Write => &self.wakers.write,
        };
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(cx.waker().clone());
        let mut fcx = Context::from_waker(&self.fanout);
        let mut spin_until: Option<Instant> = None;
        let mut spins = 0;
        loop {
            // The lock is taken anew each round, so the other direction's
            // task (on another thread) is not shut out while this one spins.
            let mut s = self.lock();
            if let Some(v) = op(&mut s.engine)? {
                s.engine.update_credits();
                return Poll::Ready(Ok(v));
            }
            if try_drain(&mut s)? {
                continue;
            }
            // The first polls read no clock, and later ones only once in
            // `UNTIMED_SPINS`: what they wait for (room, a reply) often
            // comes that soon, and a clock read can cost more than a poll
            // (a system call and an emulated timer in a guest).
            spins += 1;
            let spin = spins <= UNTIMED_SPINS || spins % UNTIMED_SPINS != 1 || {
                let now = Instant::now();
                now < *spin_until.get_or_insert(now + self.busy_poll)
            };
            if spin && !self.busy_poll.is_zero() {
                drop(s);
                std::hint::spin_loop();
                continue;
            }
            match progress(&mut s, &mut fcx) {
                Ok(true) => continue,
                Ok(false) => return Poll::Pending,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// Polls of the busy poll before it reads the clock, and between its reads
/// of it (each a look at the CQ in user space, well under the default
/// `busy_poll` of 10 µs).
const UNTIMED_SPINS: u32 = 8;

/// Takes the completions that are there without arming the CQ or
/// registering a waker (those buffered in the `AsyncCq` first); whether any
/// came.
fn try_drain(s: &mut Shared) -> io::Result<bool> {
    // The compact poll (the buffered ones first), which grants what the
    // completions allow.
    let cq = &mut s.cq;
    s.engine
        .poll_with(&mut s.polled, |wcs, memory| cq.try_batch_wc(wcs, memory))
        .map_err(io::Error::from)
}

/// Takes every completion and connection event ready; whether any came.
/// When none did, both sources have `cx`'s waker.
fn progress(s: &mut Shared, cx: &mut Context<'_>) -> io::Result<bool> {
    let mut any = drain_cq(s, cx)?;
    let mut gone = false;
    while let Poll::Ready(ev) = s.id.poll_event(cx) {
        let ev = ev.map_err(io::Error::from)?;
        gone |= matches!(
            ev.event_type(),
            CmEventType::Disconnected | CmEventType::DeviceRemoval | CmEventType::TimewaitExit
        );
    }
    if gone {
        // Completions that came before the disconnection count first.
        drain_cq(s, cx)?;
        s.engine.peer_gone();
        any = true;
    }
    if any {
        s.engine.update_credits();
    }
    Ok(any)
}

/// Takes completions with the compact poll until the CQ is empty and armed
/// (`cx` registered for its event); whether any came.
fn drain_cq(s: &mut Shared, cx: &mut Context<'_>) -> io::Result<bool> {
    let mut any = false;
    loop {
        let (wcs, memory) = s.polled.batch();
        let Poll::Ready(n) = s.cq.poll_batch_wc(cx, wcs, memory) else {
            return Ok(any);
        };
        s.engine.take(&mut s.polled, n.map_err(io::Error::from)?);
        any = true;
    }
}

/// A connection's shared state, locked.
fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // A panic while holding the lock leaves the protocol state as
    // consistent as any error does: keep going.
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drop for Inner {
    fn drop(&mut self) {
        // rclose. With a linger, all of it in the background (`linger.rs`):
        // the DISCONNECT once what was written can go, then the peer's
        // close, so the executor's thread is not held while the peer takes
        // the data. Without one (or without a thread), here, bounded, with
        // no runtime to wait on: poll the CQ until what was sent is
        // delivered.
        let closed = {
            let s = self.lock();
            !s.engine.connected() && s.engine.peer_closed()
        };
        if !closed && !self.linger.is_zero() {
            let (shared, linger) = (Arc::clone(&self.shared), self.linger);
            if crate::linger::spawn(move || close_in_background(&shared, linger)) {
                return;
            }
        }
        let mut s = self.lock();
        if s.engine.connected() && s.engine.try_shutdown(true).unwrap_or(true) {
            let deadline = Instant::now() + DROP_LINGER;
            let s = &mut *s;
            let cq = &mut s.cq;
            while !s.engine.sends_done() && Instant::now() < deadline {
                match s
                    .engine
                    .poll_with(&mut s.polled, |wcs, memory| cq.try_batch_wc(wcs, memory))
                {
                    Ok(true) => {}
                    Ok(false) => std::thread::yield_now(),
                    Err(_) => break,
                }
            }
        }
        let _ = s.id.id().disconnect();
    }
}

/// Closes the connection on a thread of its own: sends the DISCONNECT
/// (once what was written can go, if it has not gone yet), then takes the
/// peer's messages until it closes too or `linger` passes, and
/// disconnects. Woken through the reactor the stream was made on (a
/// reactor that has shut down fails the poll and ends the wait).
fn close_in_background(shared: &Mutex<Shared>, linger: Duration) {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let deadline = Instant::now() + linger;
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut shut = false;
    loop {
        let mut s = lock(shared);
        if !shut {
            shut = !s.engine.connected()
                || s.engine.try_shutdown(true).unwrap_or_else(|e| {
                    log::debug!("closing the stream in the background: {e}");
                    true
                });
        }
        let any = match progress(&mut s, &mut cx) {
            Ok(any) => any,
            Err(e) => {
                log::debug!("closing the stream in the background: {e}");
                break;
            }
        };
        if shut && s.engine.peer_closed() {
            break;
        }
        drop(s);
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            log::debug!("closing the stream: the peer did not close within {linger:?}");
            break;
        }
        if !any {
            std::thread::park_timeout(left);
        }
    }
    let mut s = lock(shared);
    s.engine.stop_waiting_for_peer();
    let _ = s.id.id().disconnect();
}

/// Whether a close in the background has finished, for
/// [`RdmaStream::close`] to wait on.
#[derive(Default)]
struct Finished {
    done: std::sync::atomic::AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Finished {
    fn poll(&self, cx: &mut Context<'_>) -> Poll<()> {
        use std::sync::atomic::Ordering::Acquire;
        if self.done.load(Acquire) {
            return Poll::Ready(());
        }
        *self.waker.lock().unwrap_or_else(|p| p.into_inner()) = Some(cx.waker().clone());
        // Set between the look and the registration: seen now.
        if self.done.load(Acquire) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// Marks its [`Finished`] done when dropped: when the close returns, or
/// unwinds.
struct FinishOnDrop(Arc<Finished>);

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        self.0
            .done
            .store(true, std::sync::atomic::Ordering::Release);
        let w = self
            .0
            .waker
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(w) = w {
            w.wake();
        }
    }
}

/// An rsocket stream on an async runtime: the async mirror of
/// [`crate::RdmaStream`], talking to the same peers.
///
/// Close it with `shutdown().await` (tokio) or `close().await`
/// (futures-io): the peer reads to the end. Dropped, it closes as rsocket's
/// `rclose` does, polling (at most 2 s) until what was written is delivered.
///
/// ```no_run
/// # #[cfg(feature = "tokio")]
/// # async fn f() -> std::io::Result<()> {
/// use rdma::aio::tokio_rt::Tokio;
/// use rdma_stream::{aio::RdmaStream, Options};
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
///
/// let addr = "10.8.0.1:7471".parse().unwrap();
/// let mut s = RdmaStream::connect(&Tokio, addr, &Options::default()).await?;
/// s.write_all(b"ping").await?;
/// s.shutdown().await?;
/// let mut answer = Vec::new();
/// s.read_to_end(&mut answer).await?;
/// # Ok(()) }
/// ```
pub struct RdmaStream {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RdmaStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaStream")
            .field("local", &self.inner.local)
            .field("peer", &self.inner.peer)
            .finish_non_exhaustive()
    }
}

impl RdmaStream {
    /// Connects to an rsocket listener at `addr`, its events on `reactor`.
    /// (A source port found taken on iWARP is replaced by
    /// `rdma::aio::Connecting::connect`, as by the blocking stream's
    /// connect.)
    ///
    /// Cancel safety: dropped before it completes, the connection is
    /// abandoned and everything it made is freed.
    ///
    /// # Errors
    /// As [`crate::RdmaStream::connect`].
    pub async fn connect(
        reactor: &dyn Reactor,
        addr: SocketAddr,
        opts: &Options,
    ) -> io::Result<RdmaStream> {
        let copts = connect_options(opts);
        let mut c = Connection::resolve(reactor, addr, &copts)
            .await
            .map_err(|e| setup::step_error("resolving", e))?;
        let ctx = c.id().context().map_err(io::Error::from)?;
        let iwarp = setup::is_iwarp(&ctx)?;
        let pd = c.pd().clone();
        let local = Local::new(&pd, c.qp(), opts.sizes)?;
        let ours = local.conn_data().encode().to_vec();
        let conn = c
            .connect(&setup::param(ours, iwarp))
            .await
            .map_err(|e| setup::step_error("connecting", e))?;
        let parts = conn.into_parts();
        let peer = ConnData::decode(&parts.peer_private_data).map_err(setup::protocol)?;
        Ok(Self::from_parts(parts, local, &peer, iwarp, false, opts))
    }

    /// `passive`: the stream was accepted.
    fn from_parts(
        parts: ConnectionParts,
        local: Local,
        peer: &ConnData,
        iwarp: bool,
        passive: bool,
        opts: &Options,
    ) -> RdmaStream {
        let ConnectionParts {
            qp,
            cq,
            pd,
            local_addr,
            peer_addr,
            id,
            ..
        } = parts;
        let mut engine = Engine::new(qp, local, peer, iwarp, passive);
        // The first credits (the second half of the receive buffer).
        engine.update_credits();
        let wakers = Arc::new(Wakers::default());
        RdmaStream {
            inner: Arc::new(Inner {
                shared: Arc::new(Mutex::new(Shared {
                    engine,
                    cq,
                    _pd: pd,
                    id,
                    polled: Polled::default(),
                })),
                fanout: Waker::from(Arc::clone(&wakers)),
                wakers,
                busy_poll: opts.busy_poll,
                linger: opts.linger,
                local: local_addr,
                peer: peer_addr,
            }),
        }
    }

    /// This side's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.inner.peer
    }

    /// Turns coalescing of small writes off (`true`, the default) or on,
    /// as [`crate::RdmaStream::set_nodelay`]: held bytes go once the data
    /// before them completes, or on `flush`, shutdown or close.
    pub fn set_nodelay(&self, nodelay: bool) {
        self.inner.lock().engine.set_nodelay(nodelay);
    }

    /// Whether every write is sent at once.
    pub fn nodelay(&self) -> bool {
        self.inner.lock().engine.nodelay()
    }

    /// Splits the stream into a read half and a write half that two tasks
    /// can use at once.
    pub fn into_split(self) -> (ReadHalf, WriteHalf) {
        (
            ReadHalf {
                inner: Arc::clone(&self.inner),
            },
            WriteHalf { inner: self.inner },
        )
    }

    /// Polls a read into `buf`: `Ok(0)` at the end of the stream.
    ///
    /// # Errors
    /// `ConnectionReset` (the peer vanished), `InvalidData` (it broke the
    /// protocol).
    pub fn poll_read_bytes(&self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        poll_read(&self.inner, cx, buf)
    }

    /// Polls a write of (a prefix of) `buf`.
    ///
    /// # Errors
    /// `BrokenPipe` after a shutdown; as [`RdmaStream::poll_read_bytes`].
    pub fn poll_write_bytes(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        poll_write(&self.inner, cx, buf)
    }

    /// Polls the sending of what coalescing held (see
    /// [`RdmaStream::set_nodelay`]); ready at once when nothing is held.
    ///
    /// # Errors
    /// As [`RdmaStream::poll_read_bytes`].
    pub fn poll_flush_bytes(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        poll_flush(&self.inner, cx)
    }

    /// Closes the stream as dropping it does (rsocket's DISCONNECT once
    /// what was written is delivered), then waits, up to
    /// [`Options::linger`], for the peer to close too, where a drop leaves
    /// that wait to a thread in the background: for a program that ends its
    /// runtime or exits once it has closed, which would end that wait early
    /// (see `Options::linger` for why a closed stream waits).
    ///
    /// # Errors
    /// A connection that failed before what was written was delivered. A
    /// peer that does not close within the linger is not an error.
    pub async fn close(self) -> io::Result<()> {
        let inner = &self.inner;
        std::future::poll_fn(|cx| {
            inner.poll_op(cx, Direction::Write, |e| {
                Ok(e.try_shutdown(true)?.then_some(()))
            })
        })
        .await?;
        std::future::poll_fn(|cx| {
            inner.poll_op(cx, Direction::Write, |e| Ok(e.sends_done().then_some(())))
        })
        .await?;
        if inner.linger.is_zero() || inner.lock().engine.peer_closed() {
            return Ok(());
        }
        let finished = Arc::new(Finished::default());
        let on_drop = FinishOnDrop(Arc::clone(&finished));
        let (shared, linger) = (Arc::clone(&inner.shared), inner.linger);
        let spawned = crate::linger::spawn(move || {
            let _on_drop = on_drop;
            close_in_background(&shared, linger);
        });
        if spawned {
            std::future::poll_fn(|cx| finished.poll(cx)).await;
        }
        Ok(())
    }

    /// Polls the shutdown of the write side (rsocket's SHUTDOWN), done when
    /// what was written is delivered.
    ///
    /// # Errors
    /// A connection that failed.
    pub fn poll_shutdown_write(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        poll_shutdown(&self.inner, cx)
    }
}

fn poll_read(inner: &Inner, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
    if buf.is_empty() {
        return Poll::Ready(Ok(0));
    }
    inner.poll_op(cx, Direction::Read, |e| e.try_read(buf))
}

fn poll_write(inner: &Inner, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
    inner.poll_op(cx, Direction::Write, |e| e.try_write(buf))
}

fn poll_flush(inner: &Inner, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    inner.poll_op(cx, Direction::Write, Engine::try_flush)
}

fn poll_shutdown(inner: &Inner, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    inner.poll_op(cx, Direction::Write, |e| {
        if !e.try_shutdown(false)? {
            return Ok(None);
        }
        Ok(e.sends_done().then_some(()))
    })
}

/// The read half of an [`RdmaStream`].
#[derive(Debug)]
pub struct ReadHalf {
    inner: Arc<Inner>,
}

/// The write half of an [`RdmaStream`]; shutting it down is the stream's
/// half-close.
#[derive(Debug)]
pub struct WriteHalf {
    inner: Arc<Inner>,
}

impl ReadHalf {
    /// As [`RdmaStream::poll_read_bytes`].
    ///
    /// # Errors
    /// As [`RdmaStream::poll_read_bytes`].
    pub fn poll_read_bytes(&self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        poll_read(&self.inner, cx, buf)
    }
}

impl WriteHalf {
    /// As [`RdmaStream::poll_write_bytes`].
    ///
    /// # Errors
    /// As [`RdmaStream::poll_write_bytes`].
    pub fn poll_write_bytes(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        poll_write(&self.inner, cx, buf)
    }

    /// As [`RdmaStream::poll_shutdown_write`].
    ///
    /// # Errors
    /// As [`RdmaStream::poll_shutdown_write`].
    pub fn poll_shutdown_write(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        poll_shutdown(&self.inner, cx)
    }

    /// As [`RdmaStream::poll_flush_bytes`].
    ///
    /// # Errors
    /// As [`RdmaStream::poll_flush_bytes`].
    pub fn poll_flush_bytes(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        poll_flush(&self.inner, cx)
    }

    /// As [`RdmaStream::set_nodelay`] (the whole stream's setting).
    pub fn set_nodelay(&self, nodelay: bool) {
        self.inner.lock().engine.set_nodelay(nodelay);
    }

    /// As [`RdmaStream::nodelay`].
    pub fn nodelay(&self) -> bool {
        self.inner.lock().engine.nodelay()
    }
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaStream")
            .field("local", &self.local)
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "tokio")]
mod tokio_io {
    use std::io;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

    use super::{
        poll_flush, poll_read, poll_shutdown, poll_write, RdmaStream, ReadHalf, WriteHalf,
    };

    /// tokio's `AsyncRead` for a type with an `inner: Arc<Inner>`.
    macro_rules! read {
        ($t:ty) => {
            impl AsyncRead for $t {
                fn poll_read(
                    self: Pin<&mut Self>,
                    cx: &mut Context<'_>,
                    buf: &mut ReadBuf<'_>,
                ) -> Poll<io::Result<()>> {
                    let n =
                        std::task::ready!(poll_read(&self.inner, cx, buf.initialize_unfilled()))?;
                    buf.advance(n);
                    Poll::Ready(Ok(()))
                }
            }
        };
    }

    /// tokio's `AsyncWrite`: shutdown is the stream's half-close.
    macro_rules! write {
        ($t:ty) => {
            impl AsyncWrite for $t {
                fn poll_write(
                    self: Pin<&mut Self>,
                    cx: &mut Context<'_>,
                    buf: &[u8],
                ) -> Poll<io::Result<usize>> {
                    poll_write(&self.inner, cx, buf)
                }

                fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                    poll_flush(&self.inner, cx)
                }

                fn poll_shutdown(
                    self: Pin<&mut Self>,
                    cx: &mut Context<'_>,
                ) -> Poll<io::Result<()>> {
                    poll_shutdown(&self.inner, cx)
                }
            }
        };
    }

    read!(RdmaStream);
    read!(ReadHalf);
    write!(RdmaStream);
    write!(WriteHalf);
}

#[cfg(feature = "futures-io")]
mod futures_impls {
    use std::io;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use futures_io::{AsyncRead, AsyncWrite};

    use super::{
        poll_flush, poll_read, poll_shutdown, poll_write, RdmaStream, ReadHalf, WriteHalf,
    };

    /// futures-io's `AsyncRead` for a type with an `inner: Arc<Inner>`.
    macro_rules! read {
        ($t:ty) => {
            impl AsyncRead for $t {
                fn poll_read(
                    self: Pin<&mut Self>,
                    cx: &mut Context<'_>,
                    buf: &mut [u8],
                ) -> Poll<io::Result<usize>> {
                    poll_read(&self.inner, cx, buf)
                }
            }
        };
    }

    /// futures-io's `AsyncWrite`: close is the stream's half-close.
    macro_rules! write {
        ($t:ty) => {
            impl AsyncWrite for $t {
                fn poll_write(
                    self: Pin<&mut Self>,
                    cx: &mut Context<'_>,
                    buf: &[u8],
                ) -> Poll<io::Result<usize>> {
                    poll_write(&self.inner, cx, buf)
                }

                fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                    poll_flush(&self.inner, cx)
                }

                fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                    poll_shutdown(&self.inner, cx)
                }
            }
        };
    }

    read!(RdmaStream);
    read!(ReadHalf);
    write!(RdmaStream);
    write!(WriteHalf);
}
