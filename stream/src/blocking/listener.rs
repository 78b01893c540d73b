//! The blocking listener ([`RdmaListener`]): takes connection requests,
//! rejects those that are not rsocket's, and answers the rest, several at
//! once, into [`RdmaStream`]s.
//!
//! Answering a request is two steps: making the connection's objects and
//! buffers and sending the accept (`setup::answer`), then waiting for
//! `ESTABLISHED` (a round trip, and on iWARP the MPA exchange). A caller of
//! [`RdmaListener::accept`] keeps up to [`RdmaListener::max_accepting`]
//! requests in the second step at once, sleeping with `poll(2)` on the
//! listener's event channel and on each answered connection's own, and
//! returns the first to be established. So a peer that sends a request and
//! never completes the handshake holds one place, not the listener, until
//! the connection timeout (`Options::timeout`) releases it; and the round
//! trips of a burst of clients overlap (making each connection's objects is
//! still one after the other, in the calling thread): siw's initiator gives
//! up 10 s after its MPA request, which a burst of 64 answered wholly one
//! after the other overran under TCG. The bound is what a flood of
//! requests can make the server hold (each a PD, CQ, QP and the stream's
//! registered buffers); past it, requests wait in the listener's backlog.
//! The async listener (`aio::RdmaListener`) does the same with the same
//! bound.

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::AsFd;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use nix::poll::{PollFd, PollFlags, PollTimeout};
use rdma::cm::CmEventType;

use super::{first_addr, RdmaStream};
use crate::setup::{self, Handshake, Options, Parts, Progress};

/// A listener for rsocket streams.
///
/// [`RdmaListener::accept`] returns the next connection to be established;
/// it answers up to [`RdmaListener::max_accepting`] requests at once, so a
/// slow or stalled peer does not hold the others. Several threads may call
/// it at once (share the listener in an `Arc`): one of them answers
/// requests at a time, and each call returns a connection of its own.
///
/// ```no_run
/// use std::io::{Read, Write};
/// # fn main() -> std::io::Result<()> {
/// let listener = rdma_stream::RdmaListener::bind("10.8.0.1:7471")?;
/// loop {
///     let (mut s, peer) = listener.accept()?;
///     std::thread::spawn(move || {
///         let mut buf = [0; 4096];
///         while let Ok(n) = s.read(&mut buf) {
///             if n == 0 || s.write_all(&buf[..n]).is_err() {
///                 break;
///             }
///         }
///         let _ = peer;
///     });
/// }
/// # }
/// ```
pub struct RdmaListener {
    listening: setup::Listening,
    opts: Options,
    max_accepting: usize,
    /// Held by the caller of `accept` that answers requests, also while it
    /// sleeps: another caller would wait for the same connections.
    state: Mutex<State>,
}

/// What the listener holds between calls of `accept`.
#[derive(Default)]
struct State {
    /// Requests answered, `ESTABLISHED` not yet come, oldest first.
    accepting: Vec<Handshake>,
    /// Established while another was returned; returned first.
    done: VecDeque<Handshake>,
    /// A wildcard listener's device, held from its first request (a bound
    /// listener holds its own from `bind`): on siw it holds rdma-verbs' key
    /// plug, which would otherwise be made again whenever the server's
    /// connections all came and went.
    device: Option<rdma::Context>,
}

impl std::fmt::Debug for RdmaListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("RdmaListener");
        d.field("local", &self.local_addr());
        // Not waiting for a caller of `accept` that sleeps.
        if let Ok(st) = self.state.try_lock() {
            d.field("accepting", &st.accepting.len());
        }
        d.finish_non_exhaustive()
    }
}

impl RdmaListener {
    /// Listens on `addr` (port 0: any free port), with rsocket's sizes for
    /// the connections it accepts.
    ///
    /// # Errors
    /// As `rdma_bind_addr` and `rdma_listen` (an address no RDMA device
    /// has: `AddrNotAvailable`).
    pub fn bind(addr: impl ToSocketAddrs) -> io::Result<RdmaListener> {
        Self::bind_with(addr, Options::default())
    }

    /// As [`RdmaListener::bind`], with `opts` for each connection; a
    /// request must be established within `opts.timeout` of its answer.
    ///
    /// # Errors
    /// As [`RdmaListener::bind`], and `InvalidInput` for sizes that
    /// [`Sizes::check`](crate::Sizes::check) refuses.
    pub fn bind_with(addr: impl ToSocketAddrs, opts: Options) -> io::Result<RdmaListener> {
        opts.sizes.check()?;
        let listening = setup::listen(first_addr(addr)?, 128)?;
        Ok(RdmaListener {
            listening,
            opts,
            max_accepting: setup::DEFAULT_MAX_ACCEPTING,
            state: Mutex::new(State::default()),
        })
    }

    /// The bound address, with the port that was picked.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        let mut a = self.listening.id.local_addr()?;
        a.set_port(self.listening.id.src_port());
        Some(a)
    }

    /// How many requests are answered at once (accepted, `ESTABLISHED` not
    /// yet come); 16 unless set, as the async listener's
    /// [`DEFAULT_MAX_ACCEPTING`](crate::aio::DEFAULT_MAX_ACCEPTING).
    pub fn max_accepting(&self) -> usize {
        self.max_accepting
    }

    /// Sets how many requests are answered at once (at least 1): the most
    /// connections a burst of requests, or peers that never complete their
    /// handshake, make the server hold before [`RdmaListener::accept`]
    /// returns them or the connection timeout releases them.
    pub fn set_max_accepting(&mut self, n: usize) {
        self.max_accepting = n.max(1);
    }

    /// Waits for a connection and returns it once established.
    ///
    /// Requests that are not rsocket's are rejected and the wait goes on.
    /// Up to [`RdmaListener::max_accepting`] requests are answered at once:
    /// the first to be established is returned, the others stay with the
    /// listener and go on in the next calls. A request not established
    /// within the connection timeout (`Options::timeout`) of its answer, or
    /// whose peer gives up, is abandoned (logged) and the wait goes on:
    /// like a TCP listener's, this returns established connections only.
    ///
    /// # Errors
    /// This server's failures, each naming its step: reading the listener's
    /// events, or making a connection's objects for a request (that request
    /// is rejected; those in progress stay, and the listener can be used
    /// again).
    pub fn accept(&self) -> io::Result<(RdmaStream, Option<SocketAddr>)> {
        let parts = self.lock().next(self)?;
        let s = RdmaStream::from_parts(parts, &self.opts)?;
        let peer = s.peer_addr();
        Ok((s, peer))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves at worst handshakes
        // dropped, which releases them as the timeout would: keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl State {
    /// Answers requests and drives those answered until one is
    /// established.
    fn next(&mut self, l: &RdmaListener) -> io::Result<Parts> {
        // Events may have come since the last call: look at each once.
        let mut ready = vec![true; self.accepting.len()];
        let mut listener_ready = true;
        loop {
            if let Some(h) = self.done.pop_front() {
                return Ok(h.into_parts());
            }
            if listener_ready {
                self.take_requests(l)?;
            }
            ready.resize(self.accepting.len(), true);
            self.look(&ready);
            self.expire();
            if let Some(h) = self.done.pop_front() {
                return Ok(h.into_parts());
            }
            let room = self.accepting.len() < l.max_accepting;
            (listener_ready, ready) = self.sleep(l, room)?;
        }
    }

    /// Takes requests from the listener's channel (without waiting) while
    /// fewer than `max_accepting` are answered, answering each.
    fn take_requests(&mut self, l: &RdmaListener) -> io::Result<()> {
        let err = |e| setup::step_error("taking a connection request", e);
        while self.accepting.len() < l.max_accepting {
            let Some(event) = l.listening.events.try_get_event().map_err(err)? else {
                return Ok(());
            };
            if event.event_type() != CmEventType::ConnectRequest {
                // The listener's own events (a device removal) end nothing
                // here: its connections see their own.
                log::debug!("listener event {} ignored", event.event_type());
                continue;
            }
            if self.device.is_none() && l.listening.has_no_device() {
                self.device = event.id().context().ok();
            }
            if let Some(h) = setup::answer(event, &l.opts)? {
                self.accepting.push(h);
            }
        }
        Ok(())
    }

    /// Reads the events of the handshakes `ready` marks: the established
    /// move to `done`, the failed are dropped.
    fn look(&mut self, ready: &[bool]) {
        let handshakes = std::mem::take(&mut self.accepting);
        for (h, &ready) in handshakes.into_iter().zip(ready) {
            if !ready {
                self.accepting.push(h);
                continue;
            }
            let peer = h.peer();
            match h.progress() {
                Progress::Waiting(h) => self.accepting.push(h),
                Progress::Established(h) => self.done.push_back(h),
                Progress::Failed(e) => {
                    log::warn!("abandoned the connection request from {peer}: {e}")
                }
            }
        }
    }

    /// Releases the handshakes past their deadline (after a last look at
    /// their events: an `ESTABLISHED` that came while no one called
    /// `accept` counts).
    fn expire(&mut self) {
        if self.accepting.is_empty() {
            return;
        }
        let now = Instant::now();
        if self.accepting.iter().all(|h| h.deadline() > now) {
            return;
        }
        let handshakes = std::mem::take(&mut self.accepting);
        for h in handshakes {
            if h.deadline() > now {
                self.accepting.push(h);
                continue;
            }
            let peer = h.peer();
            match h.progress() {
                Progress::Waiting(h) => {
                    log::warn!(
                        "released the connection request from {peer}: not established \
                         within the connection timeout"
                    );
                    drop(h);
                }
                Progress::Established(h) => self.done.push_back(h),
                Progress::Failed(e) => {
                    log::warn!("abandoned the connection request from {peer}: {e}")
                }
            }
        }
    }

    /// Sleeps until the listener's channel (when there is `room`) or a
    /// handshake's channel is readable, or the first deadline passes:
    /// which were readable.
    fn sleep(&self, l: &RdmaListener, room: bool) -> io::Result<(bool, Vec<bool>)> {
        let timeout = match self.accepting.iter().map(Handshake::deadline).min() {
            None => PollTimeout::NONE,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                // Rounded up: a sleep that ends before the deadline would
                // only sleep again.
                PollTimeout::try_from(left.as_millis().min(60_000) as i32 + 1)
                    .unwrap_or(PollTimeout::MAX)
            }
        };
        let mut fds = Vec::with_capacity(self.accepting.len() + 1);
        if room {
            fds.push(PollFd::new(l.listening.events.as_fd(), PollFlags::POLLIN));
        }
        for h in &self.accepting {
            fds.push(PollFd::new(h.events().as_fd(), PollFlags::POLLIN));
        }
        match nix::poll::poll(&mut fds, timeout) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                return Err(io::Error::new(
                    io::Error::from(e).kind(),
                    format!("waiting for connection requests (poll): {e}"),
                ))
            }
        }
        let said: Vec<bool> = fds
            .iter()
            .map(|fd| fd.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        Ok(if room {
            (said[0], said[1..].to_vec())
        } else {
            (false, said)
        })
    }
}
