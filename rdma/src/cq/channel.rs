//! Completion channels (`ibv_create_comp_channel(3)`) and their events
//! (`ibv_get_cq_event(3)`, acknowledged when dropped).

use std::collections::HashMap;
use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

use super::{CompletionQueue, CqInner};
use crate::error::{call_ptr, check_minus_one, last_errno, Error, Result};
use crate::{ffi, Context};

pub(crate) struct ChannelInner {
    ch: NonNull<ffi::ibv_comp_channel>,
    /// CQs attached to the channel, by `ibv_cq` address, to map events back.
    pub(super) cqs: Mutex<HashMap<usize, Weak<CqInner>>>,
    /// Who reads the channel's events: nobody in particular
    /// ([`CHANNEL_FREE`]), an `aio::CqChannel` ([`CHANNEL_ASYNC`]) or a
    /// blocking [`CompletionQueue::wait`] ([`CHANNEL_WAITING`]). Two readers
    /// would take each other's events (`cq_wait.rs`, `aio/cq.rs`).
    pub(crate) mode: std::sync::atomic::AtomicU8,
    // Dropped after the channel is destroyed (field order).
    pub(crate) ctx: Context,
}

/// [`ChannelInner::mode`]: no reader claims the channel.
pub(crate) const CHANNEL_FREE: u8 = 0;
/// [`ChannelInner::mode`]: an `aio::CqChannel` reads it.
pub(crate) const CHANNEL_ASYNC: u8 = 1;
/// [`ChannelInner::mode`]: a blocking [`CompletionQueue::wait`] reads it.
pub(crate) const CHANNEL_WAITING: u8 = 2;

// SAFETY: a comp channel is a file descriptor; ibv_get_cq_event and friends
// may be called from any thread.
unsafe impl Send for ChannelInner {}
// SAFETY: as above; the CQ map is behind a Mutex.
unsafe impl Sync for ChannelInner {}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // SAFETY: every CQ using the channel holds an Arc to it, so none is
        // left; destroyed once.
        let rc = unsafe { ffi::ibv_destroy_comp_channel(self.ch.as_ptr()) };
        if rc != 0 {
            crate::error::teardown_failed(format_args!(
                "ibv_destroy_comp_channel on {} failed: {}",
                self.ctx.name(),
                std::io::Error::from_raw_os_error(last_errno())
            ));
        }
    }
}

/// A completion event channel (`struct ibv_comp_channel`): a file descriptor
/// that becomes readable when an armed CQ gets a completion.
///
/// Use: [`CompletionQueue::req_notify`] (arm), poll the CQ dry, then
/// [`CompletionChannel::get_event`] (wait). Arm before draining, or a
/// completion that lands in between is never signalled.
///
/// ```no_run
/// # fn main() -> rdma::Result<()> {
/// let ctx = rdma::Context::open("rxe0")?;
/// let channel = ctx.create_comp_channel()?;
/// // A CQ that signals the channel: waited for with `wait` (blocking) or
/// // through `rdma::aio` (async) instead of spinning.
/// let cq = ctx.create_cq(64, Some(&channel), 0)?;
/// if let Some(c) = cq.wait(Some(std::time::Duration::from_secs(1)))? {
///     println!("request {} done", c.wr_id);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct CompletionChannel {
    pub(super) inner: Arc<ChannelInner>,
}

impl Context {
    /// Creates a completion channel (`ibv_create_comp_channel(3)`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_create_comp_channel`.
    pub fn create_comp_channel(&self) -> Result<CompletionChannel> {
        let ch = call_ptr(
            "ibv_create_comp_channel",
            || self.name().to_string().into(),
            || {
                // SAFETY: valid context.
                unsafe { ffi::ibv_create_comp_channel(self.as_raw()) }
            },
        )?;
        Ok(CompletionChannel {
            inner: Arc::new(ChannelInner {
                ch,
                cqs: Mutex::new(HashMap::new()),
                mode: std::sync::atomic::AtomicU8::new(CHANNEL_FREE),
                ctx: self.clone(),
            }),
        })
    }
}

/// A completion event: the CQ that fired. Acknowledged when dropped
/// (`ibv_ack_cq_events`); it keeps its CQ alive until then, because
/// destroying a CQ waits for all its events to be acknowledged.
pub struct CqEvent {
    cq: CompletionQueue,
}

impl CqEvent {
    /// The CQ that has new completions.
    pub fn cq(&self) -> &CompletionQueue {
        &self.cq
    }
}

impl Drop for CqEvent {
    fn drop(&mut self) {
        // SAFETY: the event was returned by ibv_get_cq_event for this CQ and
        // is acknowledged exactly once.
        unsafe { ffi::ibv_ack_cq_events(self.cq.as_raw(), 1) };
    }
}

impl fmt::Debug for CqEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqEvent").field("cq", &self.cq).finish()
    }
}

impl CompletionChannel {
    /// The raw channel, valid while this handle lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_comp_channel {
        self.inner.ch.as_ptr()
    }

    /// Switches the channel's descriptor to non-blocking mode, so
    /// [`CompletionChannel::get_event`] returns `EAGAIN` instead of waiting.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `fcntl`.
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        let fd = self.as_raw_fd();
        // SAFETY: fcntl on a descriptor we own.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        check_minus_one("fcntl", || "F_GETFL on a completion channel".into(), flags)?;
        let flags = if nonblocking {
            flags | libc::O_NONBLOCK
        } else {
            flags & !libc::O_NONBLOCK
        };
        // SAFETY: as above.
        let rc = unsafe { libc::fcntl(fd, libc::F_SETFL, flags) };
        check_minus_one("fcntl", || "F_SETFL on a completion channel".into(), rc)?;
        Ok(())
    }

    /// Waits for the next completion event (`ibv_get_cq_event(3)`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_get_cq_event`; `EAGAIN` (see
    /// [`Error::errno`]) when non-blocking and no event is pending;
    /// [`Error::Async`] (`EBUSY`) while an `aio::CqChannel` or a
    /// [`CompletionQueue::wait`] reads the channel (the two readers would
    /// take each other's events).
    pub fn get_event(&self) -> Result<CqEvent> {
        self.check_unclaimed("CompletionChannel::get_event")?;
        loop {
            let mut cq: *mut ffi::ibv_cq = std::ptr::null_mut();
            let mut ctx: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: valid channel and out-pointers.
            let rc = unsafe { ffi::ibv_get_cq_event(self.as_raw(), &mut cq, &mut ctx) };
            check_minus_one("ibv_get_cq_event", || "".into(), rc)?;
            let found = self
                .inner
                .cqs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&(cq as usize))
                .and_then(Weak::upgrade);
            match found {
                Some(inner) => {
                    return Ok(CqEvent {
                        cq: CompletionQueue { inner },
                    })
                }
                None => {
                    // The CQ is being destroyed and waits for this ack.
                    // SAFETY: the event came from ibv_get_cq_event for `cq`,
                    // which cannot be freed before this ack.
                    unsafe { ffi::ibv_ack_cq_events(cq, 1) };
                }
            }
        }
    }
}

impl CompletionChannel {
    pub(crate) fn same_channel(&self, other: &CompletionChannel) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Refuses a reader of the channel while another one claims it.
    pub(crate) fn check_unclaimed(&self, operation: &'static str) -> Result<()> {
        Self::refuse_claimed(
            operation,
            self.inner.mode.load(std::sync::atomic::Ordering::Acquire),
        )
    }

    /// The error for a reader that finds the channel in `mode` (none when free).
    fn refuse_claimed(operation: &'static str, mode: u8) -> Result<()> {
        match mode {
            CHANNEL_ASYNC => Err(Error::Async {
                operation,
                reason: "the completion channel is driven by an rdma::aio::CqChannel: \
                         await its CQs (rdma::aio::AsyncCq) instead of mixing blocking \
                         and async waits"
                    .into(),
                errno: libc::EBUSY,
            }),
            CHANNEL_WAITING => Err(Error::Async {
                operation,
                reason: "a blocking CompletionQueue::wait is reading the completion channel".into(),
                errno: libc::EBUSY,
            }),
            _ => Ok(()),
        }
    }

    /// Claims the channel for one reader (`mode`), or says who has it.
    pub(crate) fn claim(&self, operation: &'static str, mode: u8) -> Result<()> {
        use std::sync::atomic::Ordering;
        match self.inner.mode.compare_exchange(
            CHANNEL_FREE,
            mode,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => Ok(()),
            // The mode the exchange saw, not a second load: one taken after
            // a release would answer Ok and claim nothing.
            Err(held) => Self::refuse_claimed(operation, held),
        }
    }

    /// Gives up a claim taken with [`CompletionChannel::claim`].
    pub(crate) fn release(&self) {
        self.inner
            .mode
            .store(CHANNEL_FREE, std::sync::atomic::Ordering::Release);
    }
}

impl AsFd for CompletionChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor stays open while the channel lives.
        unsafe { BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

impl AsRawFd for CompletionChannel {
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: reads a field of a live channel.
        unsafe { (*self.as_raw()).fd }
    }
}

impl fmt::Debug for CompletionChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionChannel")
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}

impl crate::AsyncEvent {
    /// True when the event is about `cq`.
    pub fn is_cq(&self, cq: &crate::CompletionQueue) -> bool {
        self.element == crate::AsyncEventElement::Cq(cq.as_raw() as usize)
    }
}
