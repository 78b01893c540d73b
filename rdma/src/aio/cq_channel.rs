//! Completion channels driven by a reactor: [`CqChannel`] reads a
//! [`CompletionChannel`]'s events when its descriptor is readable and wakes
//! the [`AsyncCq`] of each CQ that fired, acknowledging events in batches.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use super::wake::{DrivenSource, DriverWaker, Hub, Source};
#[cfg(doc)]
use super::AsyncCq;
use super::{reactor_error, Reactor, Readiness};
use crate::cq::CHANNEL_ASYNC;
use crate::error::{Error, Result};
use crate::{ffi, CompletionChannel, CompletionQueue};

/// Events of one CQ acknowledged together (`ibv_ack_cq_events` takes the
/// CQ's lock; the rest wait in the count until the CQ's handle goes).
const ACK_BATCH: u32 = 64;

/// One CQ signalling the channel that has an [`AsyncCq`].
struct CqEntry {
    /// Holds the CQ while it has unacknowledged events: `ibv_destroy_cq`
    /// waits for them.
    cq: CompletionQueue,
    /// Events read and not acknowledged yet.
    unacked: u32,
    /// An event came since the CQ's waiter last looked.
    fired: bool,
}

impl CqEntry {
    fn ack(&mut self) {
        if self.unacked > 0 {
            // SAFETY: `unacked` events of this CQ were returned by
            // ibv_get_cq_event and not acknowledged; the CQ is alive (held).
            unsafe { ffi::ibv_ack_cq_events(self.cq.as_raw(), self.unacked) };
            self.unacked = 0;
        }
    }
}

#[derive(Default)]
struct ChanState {
    /// The CQs with an [`AsyncCq`], by the waiter key of their `AsyncCq`
    /// (a slot of the hub's waiters): a waiter's poll finds its entry
    /// without hashing.
    cqs: Vec<Option<CqEntry>>,
    /// The key of each CQ with an [`AsyncCq`], by `ibv_cq` address: what an
    /// event names (one lookup per event read, not per poll).
    keys: HashMap<usize, usize>,
}

impl ChanState {
    fn entry(&mut self, key: usize) -> Option<&mut CqEntry> {
        self.cqs.get_mut(key).and_then(Option::as_mut)
    }
}

pub(super) struct ChanShared {
    /// Dropped first (field order): the registration goes while the
    /// descriptor is open.
    readiness: Box<dyn Readiness>,
    state: Mutex<ChanState>,
    hub: Hub,
    /// Given to the reactor: reads the channel and wakes the waiters of the
    /// CQs that fired (see `wake.rs`).
    driver_waker: Waker,
    /// The descriptor was blocking before: made blocking again on drop.
    was_blocking: bool,
    channel: CompletionChannel,
}

impl ChanShared {
    fn state(&self) -> MutexGuard<'_, ChanState> {
        // Nothing panics while holding it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes `cq` on, for its [`AsyncCq`]: the waiter key the channel's
    /// events for it wake.
    ///
    /// # Errors
    /// [`Error::Async`] (`EBUSY`) when the CQ already has an `AsyncCq`.
    pub(super) fn attach(&self, cq: &CompletionQueue) -> Result<usize> {
        let address = cq.as_raw() as usize;
        let mut st = self.state();
        if st.keys.contains_key(&address) {
            return Err(Error::Async {
                operation: "AsyncCq::new",
                reason: "the CQ already has an AsyncCq (one async waiter per CQ)".into(),
                errno: libc::EBUSY,
            });
        }
        let key = self.hub.waiters.alloc();
        if key >= st.cqs.len() {
            st.cqs.resize_with(key + 1, || None);
        }
        st.cqs[key] = Some(CqEntry {
            cq: cq.clone(),
            unacked: 0,
            fired: false,
        });
        st.keys.insert(address, key);
        Ok(key)
    }

    /// Lets `cq` (attached under `key`) go: its events acknowledged, its
    /// key free for another.
    pub(super) fn detach(&self, cq: &CompletionQueue, key: usize) {
        let entry = {
            let mut st = self.state();
            st.keys.remove(&(cq.as_raw() as usize));
            let mut entry = st.cqs.get_mut(key).and_then(Option::take);
            if let Some(e) = &mut entry {
                e.ack();
            }
            entry
        };
        // After the entry is gone: a new AsyncCq given the key finds none of
        // this one's state.
        self.hub.waiters.release(key);
        // Outside the lock: releasing the CQ may destroy it.
        drop(entry);
    }

    /// Ready once the CQ `key` fired since its waiter last looked; reads the
    /// channel (every pending event, until `EAGAIN`) while not.
    pub(super) fn poll_fired(&self, key: usize, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.hub.waiters.register(key, cx.waker());
        if take_fired(&mut self.state(), key) {
            return Poll::Ready(Ok(()));
        }
        if self.hub.armed() {
            // The reactor holds the driver's waker: the CQ's event, when it
            // comes, is read by it and wakes this waiter (registered above,
            // before the look at `fired`).
            return Poll::Pending;
        }
        let read = self.hub.drive(self, &self.driver_waker, key);
        if take_fired(&mut self.state(), key) {
            return Poll::Ready(Ok(()));
        }
        match read {
            Err(e) => Poll::Ready(Err(e)),
            Ok(()) => Poll::Pending,
        }
    }
}

impl Source for ChanShared {
    fn hub(&self) -> &Hub {
        &self.hub
    }

    fn read(&self, cx: &mut Context<'_>, woken: &mut Vec<usize>) -> Poll<Result<()>> {
        let mut st = self.state();
        match self
            .readiness
            .poll_read(cx, &mut || drain(&self.channel, &mut st, woken))
        {
            Poll::Ready(Err(e)) => Poll::Ready(Err(reactor_error("ibv_get_cq_event", e))),
            _ => Poll::Pending,
        }
    }
}

impl DrivenSource for ChanShared {
    fn driver_waker(&self) -> &Waker {
        &self.driver_waker
    }
}

fn take_fired(st: &mut ChanState, key: usize) -> bool {
    st.entry(key).is_some_and(|e| std::mem::take(&mut e.fired))
}

/// Reads every pending event of `channel` (non-blocking), noting which CQs
/// fired in `fired`; ends with the `EAGAIN` that tells the reactor the
/// descriptor is drained.
fn drain(
    channel: &CompletionChannel,
    st: &mut ChanState,
    fired: &mut Vec<usize>,
) -> io::Result<()> {
    loop {
        let mut cq: *mut ffi::ibv_cq = std::ptr::null_mut();
        let mut ctx: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: a live channel whose descriptor is non-blocking; valid
        // out-pointers.
        let rc = unsafe { ffi::ibv_get_cq_event(channel.as_raw(), &mut cq, &mut ctx) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let key = st.keys.get(&(cq as usize)).copied();
        match key.and_then(|k| Some((k, st.entry(k)?))) {
            Some((key, entry)) => {
                entry.unacked += 1;
                entry.fired = true;
                if entry.unacked >= ACK_BATCH {
                    entry.ack();
                }
                fired.push(key);
            }
            // A CQ nobody awaits: its next waiter arms and polls anyway.
            // SAFETY: an event of `cq` from ibv_get_cq_event, acknowledged
            // once; the CQ cannot be destroyed before this.
            None => unsafe { ffi::ibv_ack_cq_events(cq, 1) },
        }
    }
}

impl Drop for ChanShared {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for entry in st.cqs.iter_mut().flatten() {
            entry.ack();
        }
        if self.was_blocking {
            // Best effort: the descriptor is the channel's, still open.
            let _ = self.channel.set_nonblocking(false);
        }
        self.channel.release();
    }
}

/// A [`CompletionChannel`] driven by a reactor: the source of the wake-ups
/// of every [`AsyncCq`] whose CQ signals it.
///
/// While it lives it is the channel's only reader: the blocking
/// [`CompletionChannel::get_event`] and [`CompletionQueue::wait`] refuse
/// the channel (`EBUSY`), and a second `CqChannel` on it is refused too. A
/// cheap `Clone` handle; the channel is released when the last handle and
/// the last [`AsyncCq`] are gone.
#[derive(Clone)]
pub struct CqChannel {
    shared: Arc<ChanShared>,
}

impl CqChannel {
    /// Drives `channel` from `reactor`: makes its descriptor non-blocking
    /// (until the driver goes) and registers it.
    ///
    /// # Errors
    /// [`Error::Async`] (`EBUSY`) when another `CqChannel` or a blocking
    /// wait reads the channel; the reactor's errors ([`Error::Async`]
    /// outside its runtime); [`Error::Verb`] naming `fcntl`.
    pub fn new(channel: &CompletionChannel, reactor: &dyn Reactor) -> Result<CqChannel> {
        channel.claim("CqChannel::new", CHANNEL_ASYNC)?;
        let setup = || -> Result<(bool, Box<dyn Readiness>)> {
            // SAFETY: fcntl(F_GETFL) on the channel's open descriptor.
            let flags = unsafe { libc::fcntl(channel.as_raw_fd(), libc::F_GETFL) };
            let was_blocking = flags >= 0 && flags & libc::O_NONBLOCK == 0;
            channel.set_nonblocking(true)?;
            let readiness = reactor.register(channel.as_fd()).inspect_err(|_| {
                if was_blocking {
                    let _ = channel.set_nonblocking(false);
                }
            })?;
            Ok((was_blocking, readiness))
        };
        let (was_blocking, readiness) = setup().inspect_err(|_| channel.release())?;
        Ok(CqChannel {
            shared: Arc::new_cyclic(|me: &std::sync::Weak<ChanShared>| {
                let me: std::sync::Weak<dyn DrivenSource> =
                    std::sync::Weak::<ChanShared>::clone(me);
                ChanShared {
                    readiness,
                    state: Mutex::new(ChanState::default()),
                    hub: Hub::default(),
                    driver_waker: Waker::from(Arc::new(DriverWaker(me))),
                    was_blocking,
                    channel: channel.clone(),
                }
            }),
        })
    }

    /// The channel.
    pub fn channel(&self) -> &CompletionChannel {
        &self.shared.channel
    }

    pub(super) fn shared(&self) -> &Arc<ChanShared> {
        &self.shared
    }
}

impl fmt::Debug for CqChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqChannel")
            .field("channel", &self.shared.channel)
            .field("cqs", &self.shared.state().keys.len())
            .finish()
    }
}
