//! Event channels (`rdma_create_event_channel(3)`): the channel itself, its
//! descriptor and blocking mode. Reading its events ([`EventChannel::get_event`]
//! and the other waits) is in `event.rs`, next to the [`CmEvent`] they make, so
//! that the channel needs nothing of the ids and events that refer to it.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

#[cfg(doc)]
use super::CmEvent;
use crate::error::{call_ptr, check_minus_one, last_errno, Error, Result};
use crate::ffi;

pub(crate) struct ChannelInner {
    ch: NonNull<ffi::rdma_event_channel>,
    /// Held around `rdma_get_cm_event`, whose processing may touch the id
    /// an event reports, and around the operations on this channel's ids
    /// that such processing could overlap (the rules in `cm/id/locking.rs`).
    lock: Mutex<()>,
    /// Whether [`EventChannel::get_event`] returns `EAGAIN` instead of waiting.
    nonblocking: AtomicBool,
    /// An `aio::CmChannel` reads the channel: the other readers refuse it.
    pub(crate) driven: AtomicBool,
}

// SAFETY: the channel is a file descriptor; librdmacm's calls on it may come
// from any thread, and this crate keeps event processing apart from the
// operations it could overlap with `lock`.
unsafe impl Send for ChannelInner {}
// SAFETY: as above.
unsafe impl Sync for ChannelInner {}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // SAFETY: every id on the channel holds an Arc to it, and every event
        // holds its id, so no id and no unacknowledged event is left;
        // destroyed once.
        unsafe { ffi::rdma_destroy_event_channel(self.ch.as_ptr()) };
    }
}

/// How many times [`ChannelInner::lock`] yields its CPU waiting for the lock
/// before it sleeps on it.
const LOCK_YIELDS: u32 = 200;

impl ChannelInner {
    /// Takes the channel's lock.
    ///
    /// Its holders run one librdmacm call each (a few non-blocking commands
    /// to the kernel), so a waiter first yields its CPU and retries instead
    /// of sleeping at once: a sleeping waiter costs the holder a `futex`
    /// wake and the waiter a context switch on every hand-over, which
    /// `cmtime` measured when its event thread and main thread took turns.
    /// A waiter that keeps finding the lock taken sleeps on it as usual.
    pub(crate) fn lock(&self) -> MutexGuard<'_, ()> {
        for _ in 0..LOCK_YIELDS {
            match self.lock.try_lock() {
                Ok(guard) => return guard,
                Err(std::sync::TryLockError::Poisoned(p)) => return p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => std::thread::yield_now(),
            }
        }
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An event channel (`struct rdma_event_channel`): reports the events of the
/// ids created on it (or migrated to it).
///
/// A cheap `Clone` handle. Its descriptor is always non-blocking underneath;
/// [`EventChannel::get_event`] waits with `poll(2)` unless
/// [`EventChannel::set_nonblocking`] asked it not to, so the descriptor can be
/// handed to any poller ([`AsFd`]). With an edge-triggered poller, call
/// [`EventChannel::try_get_event`] until it returns `Ok(None)`.
///
/// # Examples
/// One channel reports the events of every id made on it; an event is
/// acknowledged (`rdma_ack_cm_event(3)`) when it is dropped.
///
/// ```no_run
/// use std::time::Duration;
/// use rdma::cm::{CmEventType, EventChannel, PortSpace};
/// # fn main() -> rdma::Result<()> {
/// let channel = EventChannel::new()?;
/// let listener = channel.create_id(PortSpace::Tcp)?;
/// listener.bind_addr("10.8.0.1:7471".parse::<std::net::SocketAddr>().unwrap())?;
/// listener.listen(16)?;
/// while let Some(event) = channel.get_event_timeout(Duration::from_secs(10))? {
///     match event.event_type() {
///         CmEventType::ConnectRequest => {
///             // `event.id()` is the new connection's id: make its QP, accept.
///             println!("request with {} bytes of private data", event.private_data().len());
///         }
///         CmEventType::Disconnected => println!("{:?} left", event.id().peer_addr()),
///         other => println!("{other} (status {})", event.status()),
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct EventChannel {
    pub(crate) inner: Arc<ChannelInner>,
}

impl EventChannel {
    /// Opens an event channel (`rdma_create_event_channel(3)`).
    ///
    /// # Errors
    /// [`Error::LibraryMissing`] when librdmacm or libibverbs cannot be opened
    /// (the `dlopen` feature); [`Error::Verb`] naming
    /// `rdma_create_event_channel` (`ENODEV` when the kernel has no RDMA CM,
    /// ...).
    pub fn new() -> Result<EventChannel> {
        crate::error::load_rdmacm()?;
        let ch = call_ptr(
            "rdma_create_event_channel",
            || "".into(),
            || {
                // SAFETY: no preconditions.
                unsafe { ffi::rdma_create_event_channel() }
            },
        )?;
        let channel = EventChannel {
            inner: Arc::new(ChannelInner {
                ch,
                lock: Mutex::new(()),
                nonblocking: AtomicBool::new(false),
                driven: AtomicBool::new(false),
            }),
        };
        channel.set_fd_nonblocking()?;
        Ok(channel)
    }

    fn set_fd_nonblocking(&self) -> Result<()> {
        let fd = self.as_raw_fd();
        // SAFETY: fcntl on the channel's open descriptor.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        check_minus_one("fcntl", || "F_GETFL on an event channel".into(), flags)?;
        // SAFETY: as above.
        let rc = unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) };
        check_minus_one("fcntl", || "F_SETFL on an event channel".into(), rc)?;
        Ok(())
    }

    /// The raw channel, valid while this handle (or a clone) lives. Make
    /// no ids on it by other means than this crate: its events are read as
    /// those of this crate's ids (whose `context` names their owner).
    pub fn as_raw(&self) -> *mut ffi::rdma_event_channel {
        self.inner.ch.as_ptr()
    }

    /// Makes [`EventChannel::get_event`] return `EAGAIN` instead of waiting
    /// when no event is pending (the descriptor itself is always
    /// non-blocking).
    pub fn set_nonblocking(&self, nonblocking: bool) {
        self.inner.nonblocking.store(nonblocking, Ordering::Relaxed);
    }

    /// Whether [`EventChannel::get_event`] waits.
    pub fn is_nonblocking(&self) -> bool {
        self.inner.nonblocking.load(Ordering::Relaxed)
    }

    /// Waits until the descriptor is readable or `timeout` passes.
    pub(super) fn wait_readable(&self, timeout: Option<Duration>) -> Result<()> {
        let mut pfd = libc::pollfd {
            fd: self.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.map_or(-1, |t| {
            std::ffi::c_int::try_from(t.as_millis().max(1)).unwrap_or(std::ffi::c_int::MAX)
        });
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 && last_errno() != libc::EINTR {
            return Err(Error::verb_errno("poll", "event channel", last_errno()));
        }
        Ok(())
    }

    pub(crate) fn same_channel(&self, other: &EventChannel) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor stays open while the channel lives.
        unsafe { BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

impl AsRawFd for EventChannel {
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: reads a field of a live channel.
        unsafe { (*self.as_raw()).fd }
    }
}

impl fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.as_raw_fd())
            .field("nonblocking", &self.is_nonblocking())
            .finish()
    }
}
