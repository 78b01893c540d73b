//! The blocking stream and listener: `std::io::Read` and `Write` over the
//! [`Engine`](crate::engine), sleeping on the connection's completion
//! channel and event channel at once (so a peer that disconnects wakes a
//! reader as data does). The listener, which answers several connection
//! requests at once, is in `listener`.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, ToSocketAddrs};
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};
use rdma::cm::CmEventType;

use crate::engine::Engine;
use crate::setup::{self, Options, Parts};

mod listener;
pub use listener::RdmaListener;

/// How long closing waits for the peer to take what was sent.
const CLOSE_LINGER: Duration = Duration::from_secs(5);

/// A non-blocking stream looks at its CM events once in this many calls
/// that would block (each look is a system call).
const LOOK_EVERY: u32 = 32;

/// A byte stream over an RDMA connection that speaks rsocket's protocol:
/// its peer can be rdma-core's `rstream`, `rcopy`, any program under
/// `librspreload.so`, or another `RdmaStream`.
///
/// `Read` and `Write` are implemented for `&RdmaStream` too, so one thread
/// can read while another writes (share it in an `Arc`).
/// [`RdmaStream::shutdown`] with [`Shutdown::Write`] is TCP's half-close: the
/// peer reads to the end, and can still send. Dropping the stream closes it
/// as `rclose` does, in the background as TCP's close: what was written is
/// delivered, then the DISCONNECT, and the stream keeps taking the peer's
/// messages until the peer closes too ([`Options::linger`]);
/// [`RdmaStream::close`] does it in the caller's thread and says whether
/// what was written was delivered.
///
/// ```no_run
/// use std::io::{Read, Write};
/// # fn main() -> std::io::Result<()> {
/// let mut s = rdma_stream::RdmaStream::connect("10.8.0.1:7471")?;
/// s.write_all(b"hello")?;
/// s.shutdown(std::net::Shutdown::Write)?;
/// let mut answer = Vec::new();
/// s.read_to_end(&mut answer)?;
/// # Ok(()) }
/// ```
pub struct RdmaStream {
    conn: Arc<Conn>,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
}

/// The connection a stream drives, shared with the thread that closes it
/// in the background once the stream is dropped (`linger.rs`).
struct Conn {
    parts: Mutex<Parts>,
    /// The channels again, outside the lock: a waiter sleeps on them while
    /// the other direction uses the connection.
    comp: rdma::CompletionChannel,
    events: rdma::cm::EventChannel,
    busy_poll: Duration,
    linger: Duration,
    nonblocking: std::sync::atomic::AtomicBool,
    /// `WouldBlock`s returned: every `LOOK_EVERY`-th looks at the CM events.
    would_blocks: std::sync::atomic::AtomicU32,
}

impl std::fmt::Debug for RdmaStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaStream")
            .field("local", &self.local)
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

fn first_addr(addr: impl ToSocketAddrs) -> io::Result<SocketAddr> {
    addr.to_socket_addrs()?.next().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "the address resolved to nothing",
        )
    })
}

impl RdmaStream {
    /// Connects to an rsocket listener at `addr`, with rsocket's sizes.
    ///
    /// # Errors
    /// Resolution, connection (refused: `ConnectionRefused`), a peer that is
    /// not an rsocket (`InvalidData`), each naming the step that failed.
    pub fn connect(addr: impl ToSocketAddrs) -> io::Result<RdmaStream> {
        Self::connect_with(addr, &Options::default())
    }

    /// As [`RdmaStream::connect`], with `opts`.
    ///
    /// # Errors
    /// As [`RdmaStream::connect`].
    pub fn connect_with(addr: impl ToSocketAddrs, opts: &Options) -> io::Result<RdmaStream> {
        let parts = setup::connect(first_addr(addr)?, opts)?;
        Self::from_parts(parts, opts)
    }

    fn from_parts(parts: Parts, opts: &Options) -> io::Result<RdmaStream> {
        parts.comp.set_nonblocking(true).map_err(io::Error::from)?;
        parts.events.set_nonblocking(true);
        let mut local = parts.id.local_addr();
        if let Some(a) = local.as_mut() {
            a.set_port(parts.id.src_port());
        }
        let mut peer = parts.id.peer_addr();
        if let Some(a) = peer.as_mut() {
            a.set_port(parts.id.dst_port());
        }
        let s = RdmaStream {
            conn: Arc::new(Conn {
                comp: parts.comp.clone(),
                events: parts.events.clone(),
                busy_poll: opts.busy_poll,
                linger: opts.linger,
                parts: Mutex::new(parts),
                nonblocking: std::sync::atomic::AtomicBool::new(false),
                would_blocks: std::sync::atomic::AtomicU32::new(0),
            }),
            local,
            peer,
        };
        // The first credits (the second half of the receive buffer).
        s.lock().engine.update_credits();
        Ok(s)
    }

    /// This side's address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// Moves reads and writes into non-blocking mode: where they would
    /// wait they fail with `WouldBlock` (as `O_NONBLOCK`; closing still
    /// waits, bounded). A peer that went away without a word (killed, its
    /// link down) is seen within 32 calls that would block: they look at
    /// the connection's events then (a system call, so not every time).
    ///
    /// # Errors
    /// None today; kept for the shape of `TcpStream::set_nonblocking`.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.conn
            .nonblocking
            .store(nonblocking, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Turns coalescing of small writes off (`true`) or on, as
    /// `TCP_NODELAY`: with it on, a write shorter than 2 KiB (rsocket's
    /// first transfer) is held while data sent before it is in flight, and
    /// goes with the writes after it once that data's completion is taken
    /// (Nagle's rule), or on [`Write::flush`], a shutdown or close. Held
    /// bytes move only while this stream is read, written, flushed or
    /// closed: flush before waiting on something else.
    ///
    /// Off by default (`nodelay()` is `true`), unlike a `TcpStream`:
    /// rsocket's `rsend` posts every write at once and its `TCP_NODELAY`
    /// option is accepted and not used, and the peers this stream talks to
    /// expect that.
    ///
    /// # Errors
    /// None today; kept for the shape of `TcpStream::set_nodelay`.
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.lock().engine.set_nodelay(nodelay);
        Ok(())
    }

    /// Whether every write is sent at once (see [`RdmaStream::set_nodelay`]).
    ///
    /// # Errors
    /// None today; kept for the shape of `TcpStream::nodelay`.
    pub fn nodelay(&self) -> io::Result<bool> {
        Ok(self.lock().engine.nodelay())
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Parts> {
        self.conn.lock()
    }

    /// [`Conn::wait`] on this stream's connection.
    pub(crate) fn wait<T>(
        &self,
        deadline: Option<Instant>,
        attempt: impl FnMut(&mut Engine) -> io::Result<Option<T>>,
    ) -> io::Result<T> {
        self.conn.wait(deadline, attempt)
    }

    /// Shuts down one or both directions: `Write` sends rsocket's SHUTDOWN
    /// (the peer reads to the end), `Both` its DISCONNECT; each waits until
    /// what was written has been delivered.
    ///
    /// # Errors
    /// A connection that failed; `TimedOut` when the peer does not take the
    /// data within a bound.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let deadline = Some(Instant::now() + CLOSE_LINGER);
        match how {
            Shutdown::Read => {
                // Nothing to tell the peer until both directions are shut,
                // as rsocket.
                Ok(())
            }
            Shutdown::Write | Shutdown::Both => {
                let was = self
                    .conn
                    .nonblocking
                    .swap(false, std::sync::atomic::Ordering::Relaxed);
                let both = how == Shutdown::Both;
                let r = self
                    .wait(deadline, |e| Ok(e.try_shutdown(both)?.then_some(())))
                    .and_then(|()| self.wait(deadline, |e| Ok(e.sends_done().then_some(()))));
                self.conn
                    .nonblocking
                    .store(was, std::sync::atomic::Ordering::Relaxed);
                r
            }
        }
    }

    /// Closes the stream as dropping it does, but in the caller's thread,
    /// where a drop leaves it to a thread of its own: the DISCONNECT once
    /// what was written is delivered, then a wait, up to
    /// [`Options::linger`], for the peer to close too. For a program that
    /// exits once it has closed, which would end that thread early (see
    /// `Options::linger` for why a closed stream waits), or that wants to
    /// know that what it wrote was delivered.
    ///
    /// # Errors
    /// As [`RdmaStream::shutdown`] with [`Shutdown::Both`]: what was written
    /// was not delivered. A peer that does not close within the linger is
    /// not an error (the stream is closed all the same).
    pub fn close(self) -> io::Result<()> {
        let shut = if self.lock().engine.connected() {
            self.shutdown(Shutdown::Both)
        } else {
            Ok(())
        };
        if !self.conn.linger.is_zero() && !self.lock().engine.peer_closed() {
            self.conn
                .nonblocking
                .store(false, std::sync::atomic::Ordering::Relaxed);
            self.conn.close(false);
        }
        shut
    }

    fn read_inner(&self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        // `wait` grants the peer what the read freed.
        self.wait(None, |e| e.try_read(buf))
    }

    fn write_inner(&self, buf: &[u8]) -> io::Result<usize> {
        self.wait(None, |e| e.try_write(buf))
    }

    fn flush_inner(&self) -> io::Result<()> {
        self.wait(None, Engine::try_flush)
    }
}

impl Conn {
    fn lock(&self) -> MutexGuard<'_, Parts> {
        // A panic while holding the lock leaves the protocol state as
        // consistent as any error does: keep going.
        self.parts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `attempt` until it returns `Some`, polling completions and
    /// sleeping on the channels in between; `deadline` bounds the wait.
    ///
    /// Before sleeping it polls for `busy_poll` (as rsocket's
    /// `polling_time`): a reply that comes within it costs no system call.
    fn wait<T>(
        &self,
        deadline: Option<Instant>,
        mut attempt: impl FnMut(&mut Engine) -> io::Result<Option<T>>,
    ) -> io::Result<T> {
        let mut spin_until: Option<Instant> = None;
        // Which channels the last sleep found readable.
        let (mut comp_ready, mut events_ready) = (false, false);
        loop {
            {
                let mut p = self.lock();
                // Only a channel that said something is read: each read is a
                // system call, and a sleep costs enough of them already.
                if std::mem::take(&mut comp_ready) {
                    ack_cq_event(&p)?;
                }
                if std::mem::take(&mut events_ready) {
                    connection_events(&mut p)?;
                }
                // What the engine knows may do (a write with room needs no
                // poll: its completions wait until a call must take them,
                // and coalescing holds short writes behind them); else
                // take the completions there are and try again.
                let mut done = attempt(&mut p.engine)?;
                if done.is_none() && poll_cq(&mut p)? {
                    done = attempt(&mut p.engine)?;
                }
                if let Some(v) = done {
                    p.engine.update_credits();
                    return Ok(v);
                }
                if self.nonblocking.load(std::sync::atomic::Ordering::Relaxed) {
                    // A caller that never sleeps here never reads the event
                    // channel in the sleep below: look at it now and then,
                    // or a peer killed mid-stream would read as "no data
                    // yet" for ever.
                    let n = self
                        .would_blocks
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if n % LOOK_EVERY == LOOK_EVERY - 1 && connection_events(&mut p)? {
                        continue;
                    }
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                let now = Instant::now();
                let until = *spin_until.get_or_insert(now + self.busy_poll);
                if now < until {
                    continue;
                }
                // Arm, then poll again: a completion between the poll and
                // the arm raises no event. A disconnection is looked for
                // only now (a live connection makes progress without it):
                // a CM event already queued makes the sleep below return at
                // once, since its channel stays readable until it is read.
                p.cq.req_notify(false).map_err(io::Error::from)?;
                if poll_cq(&mut p)? {
                    continue;
                }
            }
            let timeout = match deadline {
                None => PollTimeout::NONE,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(io::Error::new(io::ErrorKind::TimedOut, "timed out"));
                    }
                    PollTimeout::try_from(left.as_millis().min(60_000) as i32 + 1)
                        .unwrap_or(PollTimeout::MAX)
                }
            };
            // Sleep without the lock: the other direction may progress.
            let mut fds = [
                PollFd::new(self.comp.as_fd(), PollFlags::POLLIN),
                PollFd::new(self.events.as_fd(), PollFlags::POLLIN),
            ];
            match nix::poll::poll(&mut fds, timeout) {
                Ok(_) => {
                    let said = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
                    comp_ready = said(&fds[0]);
                    events_ready = said(&fds[1]);
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Acknowledges one event of the completion channel (it only says "look").
/// The CQ is armed once per sleep, so a wake-up finds one; another (left by a
/// sleep that a CM event ended first) keeps the channel readable and is
/// taken after the next sleep, which it ends at once. Events never read
/// cost nothing at teardown: `ibv_destroy_cq` waits only for those read.
fn ack_cq_event(p: &Parts) -> io::Result<()> {
    match p.comp.get_event() {
        Ok(ev) => {
            drop(ev);
            Ok(())
        }
        Err(e) if e.errno() == Some(nix::errno::Errno::EAGAIN as i32) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Polls every completion there is into the engine; whether any came.
fn poll_cq(p: &mut Parts) -> io::Result<bool> {
    p.engine.poll(&p.cq, &mut p.polled).map_err(io::Error::from)
}

/// Takes the connection's CM events; whether the peer went away.
fn connection_events(p: &mut Parts) -> io::Result<bool> {
    let mut gone = false;
    while let Some(ev) = p.events.try_get_event().map_err(io::Error::from)? {
        gone |= matches!(
            ev.event_type(),
            CmEventType::Disconnected | CmEventType::DeviceRemoval | CmEventType::TimewaitExit
        );
    }
    if gone {
        // Completions that came before the disconnection count first.
        poll_cq(p)?;
        p.engine.peer_gone();
    }
    Ok(gone)
}

impl Read for &RdmaStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_inner(buf)
    }
}

impl Read for RdmaStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_inner(buf)
    }
}

impl Write for &RdmaStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_inner(buf)
    }

    /// Sends what coalescing held (see [`RdmaStream::set_nodelay`]).
    fn flush(&mut self) -> io::Result<()> {
        self.flush_inner()
    }
}

impl Write for RdmaStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_inner(buf)
    }

    /// Sends what coalescing held (see [`RdmaStream::set_nodelay`]).
    fn flush(&mut self) -> io::Result<()> {
        self.flush_inner()
    }
}

impl Drop for RdmaStream {
    fn drop(&mut self) {
        // rclose, as TCP's close: with a linger, all of it in the
        // background (`linger.rs`): the DISCONNECT once what was written
        // can go, then the peer's close, then the disconnection and the
        // release of everything. Without one (or without a thread), here:
        // DISCONNECT, a bounded wait for what was sent, the disconnection.
        let closed = {
            let p = self.lock();
            !p.engine.connected() && p.engine.peer_closed()
        };
        if !closed && !self.conn.linger.is_zero() {
            let conn = Arc::clone(&self.conn);
            conn.nonblocking
                .store(false, std::sync::atomic::Ordering::Relaxed);
            if crate::linger::spawn(move || conn.close(true)) {
                return;
            }
        }
        if self.lock().engine.connected() {
            if let Err(e) = self.shutdown(Shutdown::Both) {
                log::debug!("closing the stream: {e}");
            }
        }
        let _ = self.lock().id.disconnect();
    }
}

impl Conn {
    /// Sends the DISCONNECT if `disconnect` (once what was written can go),
    /// then takes the peer's messages until it closes too; both within
    /// `linger`. Then disconnects (what the connection holds goes with the
    /// last reference) and awaits nothing more from the peer.
    fn close(&self, disconnect: bool) {
        let deadline = Some(Instant::now() + self.linger);
        let sent = if disconnect {
            self.wait(deadline, |e| Ok(e.try_shutdown(true)?.then_some(())))
        } else {
            Ok(())
        };
        if let Err(e) =
            sent.and_then(|()| self.wait(deadline, |e| Ok(e.peer_closed().then_some(()))))
        {
            log::debug!("closing the stream: {e}");
        }
        let mut p = self.lock();
        p.engine.stop_waiting_for_peer();
        let _ = p.id.disconnect();
    }
}
