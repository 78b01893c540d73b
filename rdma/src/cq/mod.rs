//! Completion queues and completion channels (`ibv_create_cq(3)`,
//! `ibv_poll_cq(3)`, `ibv_req_notify_cq(3)`, `ibv_get_cq_event(3)`).
//!
//! Here: the CQ, its creation and its polls (each resolving what it polls
//! through the CQ's registry). `channel.rs`: completion channels and their
//! events. `cursor.rs`: an extended CQ's polls through `ibv_start_poll`
//! ([`PollCursor`]).

mod channel;
mod cursor;

pub use channel::{CompletionChannel, CqEvent};
pub(crate) use channel::{CHANNEL_ASYNC, CHANNEL_WAITING};
pub use cursor::PollCursor;

use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use crate::error::{call_ptr, check_errno_ret, Error, Result};
use crate::track::Registry;
use crate::wc::{Completion, WorkCompletion};
use crate::wr::WrBuffers;
use crate::{ffi, Context};

pub(crate) struct CqInner {
    cq: NonNull<ffi::ibv_cq>,
    /// The extended view, for CQs made with `create_cq_ex`.
    ex: Option<NonNull<ffi::ibv_cq_ex>>,
    /// `SLOW_*` bits: whether a poll must take its slow path (the extended
    /// CQ's lock, a failure to report), tested with one load.
    slow: std::sync::atomic::AtomicU8,
    /// A failed `ibv_poll_cq`'s return that the poll that met it could not
    /// report (it returned the completions before it): the next poll's
    /// error.
    failure: std::sync::atomic::AtomicI32,
    /// `wc_flags` the extended CQ was created with.
    ex_flags: u64,
    /// For an extended CQ: held by an open [`PollCursor`] (one
    /// start/next/end sequence at a time) and by every other poll, which
    /// must not run while a cursor is open.
    poll_lock: Mutex<()>,
    /// The thread holding an open cursor ([`thread_mark`]), 0 for none: a
    /// poll from that thread would wait for itself, so it is refused.
    cursor_thread: std::sync::atomic::AtomicUsize,
    pub(crate) registry: Registry,
    // Dropped after the CQ is destroyed (field order).
    channel: Option<CompletionChannel>,
    ctx: Context,
}

// SAFETY: ibv_poll_cq, ibv_req_notify_cq and ibv_resize_cq are thread-safe
// for CQs not created single-threaded (this crate never does).
unsafe impl Send for CqInner {}
// SAFETY: as above; the registry is behind a Mutex.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        if let Some(ch) = &self.channel {
            ch.inner
                .cqs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&(self.cq.as_ptr() as usize));
        }
        self.resolve_leftovers();
        // SAFETY: every QP using the CQ holds an Arc, and every unacked event
        // holds one too, so no QP is attached and all events are acked.
        let rc = unsafe { ffi::ibv_destroy_cq(self.cq.as_ptr()) };
        if rc != 0 {
            crate::error::teardown_failed(format_args!(
                "ibv_destroy_cq on {} failed: errno {rc}",
                self.ctx.name()
            ));
        }
    }
}

impl CqInner {
    /// Polls out and resolves the completions still in the CQ, so that the
    /// queues that outlive it (a shared receive queue) get back the memory
    /// of the requests that completed here, instead of holding it forever.
    /// No QP uses the CQ any more (each holds it), so nothing adds to it.
    fn resolve_leftovers(&self) {
        let mut done = Vec::with_capacity(POLL_BATCH);
        // Each batch's memory goes with `done.clear()`, after the lock.
        while let Ok(POLL_BATCH) = self.poll_into(&mut done, POLL_BATCH) {
            done.clear();
        }
    }

    /// Polls up to `max` completions into `out` and resolves them, under the
    /// registry's lock from the first `ibv_poll_cq` to the last completion;
    /// the provider's negative return on failure (an overrun). A failure
    /// after some were resolved is kept for the next poll (see
    /// [`poll_batches`]).
    fn poll_into(
        &self,
        out: &mut Vec<Completion>,
        max: usize,
    ) -> std::result::Result<usize, std::ffi::c_int> {
        poll_batches(
            &self.registry,
            out,
            max,
            |want, wcs| {
                // SAFETY: `wcs` has room for `want` entries (`poll_batches`'
                // contract); the CQ is live.
                unsafe { ffi::ibv_poll_cq(self.cq.as_ptr(), want, wcs) }
            },
            |n| self.defer_failure(n),
        )
    }

    /// Keeps a failed `ibv_poll_cq`'s return for the next poll to report.
    #[cold]
    fn defer_failure(&self, n: std::ffi::c_int) {
        use std::sync::atomic::Ordering;
        self.failure.store(n, Ordering::Relaxed);
        self.slow.fetch_or(SLOW_FAILED, Ordering::Release);
    }

    /// Takes the failure a poll kept for this one, if any.
    #[cold]
    fn take_failure(&self) -> Option<std::ffi::c_int> {
        use std::sync::atomic::Ordering;
        if self.slow.load(Ordering::Relaxed) & SLOW_FAILED == 0
            || self.slow.fetch_and(!SLOW_FAILED, Ordering::Acquire) & SLOW_FAILED == 0
        {
            return None;
        }
        Some(self.failure.swap(0, Ordering::Relaxed)).filter(|&n| n != 0)
    }
}

/// What sends a poll to its slow path ([`CqInner::slow`]): the CQ is
/// extended (its poll lock), a failure waits to be reported.
const SLOW_EXTENDED: u8 = 1;
const SLOW_FAILED: u8 = 2;

/// Polls up to `max` completions into `out` with `poll` (one
/// `ibv_poll_cq` of the CQ: how many entries of at most `want` it wrote
/// from the pointer given, or a negative failure) and resolves them
/// through `registry`, whose lock is held from the first call to the last
/// completion. Returns how many were added, or the failure of the first
/// call.
///
/// A call that fails after earlier ones returned completions does not
/// fail the poll: those completions are out of the CQ and resolved, and
/// the caller could not see them behind an error (their memory would be
/// dropped with the caller's buffer). They come back, and the failure goes
/// to `failed`, to be reported by the next poll.
fn poll_batches(
    registry: &Registry,
    out: &mut Vec<Completion>,
    max: usize,
    mut poll: impl FnMut(std::ffi::c_int, *mut ffi::ibv_wc) -> std::ffi::c_int,
    failed: impl FnOnce(std::ffi::c_int),
) -> std::result::Result<usize, std::ffi::c_int> {
    let mut total = 0;
    // Not initialised: an empty poll (the common case when spinning)
    // must not pay for clearing it; only the entries written are read.
    let mut wcs = [std::mem::MaybeUninit::<ffi::ibv_wc>::uninit(); POLL_BATCH];
    let mut r = registry.resolver();
    while total < max {
        let want = (max - total).min(POLL_BATCH);
        let n = poll(
            want as std::ffi::c_int,
            wcs.as_mut_ptr().cast::<ffi::ibv_wc>(),
        );
        let Ok(n) = usize::try_from(n) else {
            if total == 0 {
                return Err(n);
            }
            failed(n);
            break;
        };
        // A provider never returns more than it was asked for; a count
        // past `want` would read entries it never wrote.
        let n = n.min(want);
        // SAFETY: the poll wrote the first `n` entries; `ibv_wc` is plain
        // data.
        let polled = unsafe { std::slice::from_raw_parts(wcs.as_ptr().cast::<ffi::ibv_wc>(), n) };
        let start = out.len();
        // Resolved where they lie: a `Completion` is 112 bytes, and
        // building one aside and moving it in cost more than its
        // resolution (callgrind).
        out.extend(polled.iter().map(Completion::from_raw));
        r.attach_all(&mut out[start..]);
        total += n;
        if n < want {
            r.cq_empty();
            break;
        }
    }
    Ok(total)
}

/// An address that tells threads apart: that of a thread-local.
fn thread_mark() -> usize {
    thread_local!(static MARK: u8 = const { 0 });
    MARK.with(|m| m as *const u8 as usize)
}

/// A completion queue (`struct ibv_cq`). A cheap `Clone` handle; QPs that
/// use it keep it alive.
///
/// Any number of threads may poll it at once: each poll resolves its
/// completions under one lock, from `ibv_poll_cq` to the memory attached, so
/// every completion carries its own request's `wr_id` and memory whatever
/// the interleaving.
///
/// ```no_run
/// # fn main() -> rdma::Result<()> {
/// let ctx = rdma::Context::open("rxe0")?;
/// // 256 entries, no completion channel (busy polling), vector 0.
/// let cq = ctx.create_cq(256, None, 0)?;
/// // ... queue pairs built on `cq` post work ...
/// let mut done = Vec::new();
/// cq.poll(&mut done, 16)?;
/// for c in done {
///     // A failed completion becomes an error that names its status.
///     let mut c = c.ok()?;
///     let memory = c.take_buffers();
///     println!("request {}: {} bytes, {} regions back", c.wr_id, c.byte_len, memory.len());
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct CompletionQueue {
    pub(crate) inner: Arc<CqInner>,
}

impl Context {
    /// Creates a completion queue of at least `cqe` entries
    /// (`ibv_create_cq(3)`), optionally signalling `channel`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `cqe == 0` or past the device's
    /// `max_cqe`; [`Error::Verb`] naming `ibv_create_cq`.
    pub fn create_cq(
        &self,
        cqe: u32,
        channel: Option<&CompletionChannel>,
        comp_vector: u32,
    ) -> Result<CompletionQueue> {
        let max = u32::try_from(self.limits().max_cqe).unwrap_or(0);
        if cqe == 0 || cqe > max {
            return Err(Error::InvalidArgument {
                verb: "ibv_create_cq",
                reason: format!("cqe {cqe} is outside 1..={max} (the device's max_cqe)"),
            });
        }
        self.check_channel_context("ibv_create_cq", channel)?;
        let ch = channel.map_or(std::ptr::null_mut(), CompletionChannel::as_raw);
        let n = std::ffi::c_int::try_from(cqe).unwrap_or(std::ffi::c_int::MAX);
        let vector = std::ffi::c_int::try_from(comp_vector).unwrap_or(std::ffi::c_int::MAX);
        let cq = call_ptr(
            "ibv_create_cq",
            || format!("{} cqe {cqe} comp_vector {comp_vector}", self.name()).into(),
            || {
                // SAFETY: valid context; channel (if any) belongs to it and is kept
                // alive by the CQ.
                unsafe { ffi::ibv_create_cq(self.as_raw(), n, std::ptr::null_mut(), ch, vector) }
            },
        )?;
        Ok(self.wrap_cq(cq, None, 0, channel))
    }

    /// A CQ signals a channel of its own context only.
    fn check_channel_context(
        &self,
        verb: &'static str,
        channel: Option<&CompletionChannel>,
    ) -> Result<()> {
        match channel {
            Some(ch) if ch.inner.ctx.as_raw() != self.as_raw() => Err(Error::InvalidArgument {
                verb,
                reason: format!(
                    "the completion channel belongs to another context ({} opened \
                     separately): create it with this context's create_comp_channel",
                    ch.inner.ctx.name()
                ),
            }),
            _ => Ok(()),
        }
    }

    fn wrap_cq(
        &self,
        cq: NonNull<ffi::ibv_cq>,
        ex: Option<NonNull<ffi::ibv_cq_ex>>,
        ex_flags: u64,
        channel: Option<&CompletionChannel>,
    ) -> CompletionQueue {
        let slow = if ex.is_some() { SLOW_EXTENDED } else { 0 };
        let inner = Arc::new(CqInner {
            cq,
            ex,
            slow: std::sync::atomic::AtomicU8::new(slow),
            failure: std::sync::atomic::AtomicI32::new(0),
            ex_flags,
            poll_lock: Mutex::new(()),
            cursor_thread: std::sync::atomic::AtomicUsize::new(0),
            registry: Registry::default(),
            channel: channel.cloned(),
            ctx: self.clone(),
        });
        if let Some(ch) = channel {
            ch.inner
                .cqs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(cq.as_ptr() as usize, Arc::downgrade(&inner));
        }
        CompletionQueue { inner }
    }

    /// Creates an extended completion queue (`ibv_create_cq_ex(3)`), polled
    /// with [`CompletionQueue::start_poll`] (or [`CompletionQueue::poll`]).
    /// The standard fields are always available; `timestamps` adds the
    /// completion timestamp where the device has one.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the provider has no extended CQs (siw);
    /// otherwise as [`Context::create_cq`].
    pub fn create_cq_ex(
        &self,
        cqe: u32,
        channel: Option<&CompletionChannel>,
        comp_vector: u32,
        timestamps: bool,
    ) -> Result<CompletionQueue> {
        let max = u32::try_from(self.limits().max_cqe).unwrap_or(0);
        if cqe == 0 || cqe > max {
            return Err(Error::InvalidArgument {
                verb: "ibv_create_cq_ex",
                reason: format!("cqe {cqe} is outside 1..={max} (the device's max_cqe)"),
            });
        }
        self.check_channel_context("ibv_create_cq_ex", channel)?;
        let mut wc_flags = u64::from(ffi::IBV_WC_STANDARD_FLAGS);
        if timestamps {
            wc_flags |= u64::from(ffi::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP);
        }
        let mut attr = ffi::ibv_cq_init_attr_ex {
            cqe,
            channel: channel.map_or(std::ptr::null_mut(), CompletionChannel::as_raw),
            comp_vector,
            wc_flags,
            ..Default::default()
        };
        let cq = call_ptr(
            "ibv_create_cq_ex",
            || format!("{} cqe {cqe} wc_flags {wc_flags:#x}", self.name()).into(),
            || {
                // SAFETY: valid context and attribute struct; the channel is kept
                // alive by the CQ.
                unsafe { ffi::ibv_create_cq_ex(self.as_raw(), &mut attr) }
            },
        )
        .map_err(|e| match e.errno() {
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => Error::Unsupported {
                what: "extended completion queues".into(),
                device: self.name().to_string(),
                source: e.errno().map(std::io::Error::from_raw_os_error),
            },
            _ => e,
        })?;
        // SAFETY: `cq` is a live extended CQ.
        let base = unsafe { ffi::ibv_cq_ex_to_cq(cq.as_ptr()) };
        let base = NonNull::new(base).expect("ibv_cq_ex_to_cq of a live CQ");
        Ok(self.wrap_cq(base, Some(cq), wc_flags, channel))
    }
}

/// How many completions one `ibv_poll_cq` call fetches at most.
const POLL_BATCH: usize = 16;

impl CompletionQueue {
    /// The raw CQ, valid while this handle lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_cq {
        self.inner.cq.as_ptr()
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The number of entries (may exceed what was asked for).
    pub fn cqe(&self) -> u32 {
        // SAFETY: reads a field of a live CQ.
        u32::try_from(unsafe { (*self.as_raw()).cqe }).unwrap_or(0)
    }

    /// Polls up to `max` completions into `out` (appending), returning how
    /// many were added (`ibv_poll_cq(3)`). Memory of safe posts comes back in
    /// each [`Completion`].
    ///
    /// One poll may call `ibv_poll_cq` several times (16 entries at a
    /// time). When a later call fails, the completions the earlier ones
    /// returned come back as usual, and the failure is reported by the next
    /// poll of the CQ (by any method): no completion is lost behind an
    /// error.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_poll_cq` (a CQ overrun), by the call that
    /// met it or, after completions it returned, by the next.
    pub fn poll(&self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        let _guard = self.legacy_poll_guard()?;
        self.inner
            .poll_into(out, max)
            .map_err(|n| self.poll_failed(n))
    }

    /// Polls up to `wcs.len()` completions into `wcs` (`ibv_poll_cq(3)`, which
    /// writes them there in place), returning how many. The compact form of
    /// [`CompletionQueue::poll`], for loops that poll many: each
    /// [`WorkCompletion`] carries the caller's `wr_id` and nothing to drop,
    /// and the memory of the requests these completions finish (a safe
    /// post's own, and that of the unsignaled requests before it) is appended
    /// to `memory` as `(wr_id, memory)`, in posting order per queue. Prepared
    /// requests' sends ([`QueuePair::post_prepared`](crate::QueuePair::post_prepared))
    /// hold no memory and add nothing: a loop of them never touches `memory`.
    ///
    /// ```no_run
    /// # fn f(cq: &rdma::CompletionQueue) -> rdma::Result<()> {
    /// let mut wcs = [rdma::WorkCompletion::default(); 16];
    /// let mut memory = Vec::new();
    /// let n = cq.poll_wc(&mut wcs, &mut memory)?;
    /// for wc in &wcs[..n] {
    ///     wc.ok()?;
    ///     println!("request {} done", wc.wr_id());
    /// }
    /// for (wr_id, _memory) in memory.drain(..) {
    ///     println!("request {wr_id} gave its memory back");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`CompletionQueue::poll`].
    #[inline(always)]
    pub fn poll_wc(
        &self,
        wcs: &mut [WorkCompletion],
        memory: &mut Vec<(u64, WrBuffers)>,
    ) -> Result<usize> {
        if wcs.is_empty() {
            return Ok(0);
        }
        let _guard = self.legacy_poll_guard()?;
        let want = std::ffi::c_int::try_from(wcs.len()).unwrap_or(std::ffi::c_int::MAX);
        let mut r = self.inner.registry.resolver();
        // SAFETY: `wcs` has room for `want` entries (`WorkCompletion` is an
        // `ibv_wc`, `repr(transparent)`); the CQ is live.
        let n = unsafe {
            ffi::ibv_poll_cq(self.as_raw(), want, wcs.as_mut_ptr().cast::<ffi::ibv_wc>())
        };
        let Ok(n) = usize::try_from(n) else {
            drop(r);
            return Err(self.poll_failed(n));
        };
        r.attach_all(&mut crate::track::CompactBatch {
            wcs: &mut wcs[..n],
            memory,
        });
        if n < wcs.len() {
            r.cq_empty();
        }
        Ok(n)
    }

    /// Polls one completion (`ibv_poll_cq(3)` for one entry): `None` when
    /// the CQ is empty. The same as [`CompletionQueue::poll`] with `max` 1,
    /// without a `Vec`: the cheapest way to wait for one completion by
    /// spinning.
    ///
    /// # Errors
    /// As [`CompletionQueue::poll`].
    #[inline]
    pub fn poll_one(&self) -> Result<Option<Completion>> {
        let mut slot = None;
        self.poll_one_into(&mut slot)?;
        Ok(slot)
    }

    /// [`CompletionQueue::poll_one`] into a completion the caller keeps:
    /// when the CQ has a completion, `slot` is overwritten with it (what
    /// `slot` held before, memory included, is dropped first) and a
    /// reference to it comes back; when the CQ is empty, `slot` is left
    /// alone and `None` comes back. A loop that polls into the same slot
    /// moves no completion around, the closest the safe API gets to
    /// `ibv_poll_cq` into a `struct ibv_wc` on the stack.
    ///
    /// ```no_run
    /// # fn f(cq: &rdma::CompletionQueue) -> rdma::Result<()> {
    /// let mut slot = None;
    /// loop {
    ///     if let Some(c) = cq.poll_one_into(&mut slot)? {
    ///         println!("{} done: {}", c.wr_id, c.status);
    ///         let _memory = c.take_buffers();
    ///         break;
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`CompletionQueue::poll`].
    #[inline(always)]
    pub fn poll_one_into<'s>(
        &self,
        slot: &'s mut Option<Completion>,
    ) -> Result<Option<&'s mut Completion>> {
        let _guard = self.legacy_poll_guard()?;
        let mut wc = std::mem::MaybeUninit::<ffi::ibv_wc>::uninit();
        let mut r = self.inner.registry.resolver();
        // SAFETY: `wc` has room for one entry.
        let n = unsafe { ffi::ibv_poll_cq(self.as_raw(), 1, wc.as_mut_ptr()) };
        match n {
            0 => {
                r.cq_empty();
                Ok(None)
            }
            1 => {
                // SAFETY: ibv_poll_cq wrote the entry.
                let wc = unsafe { wc.assume_init_ref() };
                let (c, previous) = match slot {
                    Some(c) => {
                        // Memory the caller left in the previous completion
                        // is taken out now and dropped after the lock
                        // (dropping a region may call a verb). Usually
                        // there is none: a test, not a move.
                        let previous = c.holds_memory().then(|| c.take_memory());
                        c.set_raw(wc);
                        (c, previous)
                    }
                    None => (slot.insert(Completion::from_raw(wc)), None),
                };
                r.attach(c);
                drop(r);
                if let Some(p) = previous {
                    drop_cold(p);
                }
                Ok(Some(c))
            }
            n => Err(self.poll_failed(n)),
        }
    }

    /// What a poll does before `ibv_poll_cq`: report a failure an earlier
    /// poll kept for it, and, for an extended CQ, take the lock that keeps
    /// a legacy poll and a cursor apart (an extended CQ must not be polled
    /// while a cursor is open). One load when neither applies.
    #[inline]
    fn legacy_poll_guard(&self) -> Result<Option<std::sync::MutexGuard<'_, ()>>> {
        if self.inner.slow.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            return Ok(None);
        }
        self.slow_poll_guard()
    }

    /// [`CompletionQueue::legacy_poll_guard`]'s slow path: out of line, so
    /// that a plain CQ's poll stays small enough to be inlined.
    #[cold]
    #[inline(never)]
    fn slow_poll_guard(&self) -> Result<Option<std::sync::MutexGuard<'_, ()>>> {
        if let Some(n) = self.inner.take_failure() {
            return Err(self.poll_failed(n));
        }
        match self.inner.ex {
            Some(_) => self.poll_lock("ibv_poll_cq").map(Some),
            None => Ok(None),
        }
    }

    /// An extended CQ's poll lock: waits while another thread's cursor is
    /// open; refused (`EBUSY`) when this thread's own cursor is.
    fn poll_lock(&self, verb: &'static str) -> Result<std::sync::MutexGuard<'_, ()>> {
        use std::sync::atomic::Ordering;
        if self.inner.cursor_thread.load(Ordering::Relaxed) == thread_mark() {
            return Err(Error::verb_errno(
                verb,
                "this thread has a poll cursor open on the CQ (drop it first)",
                libc::EBUSY,
            ));
        }
        // Nothing that holds the lock panics with it: no poisoning to heed.
        Ok(self
            .inner
            .poll_lock
            .lock()
            .unwrap_or_else(|p| p.into_inner()))
    }

    #[cold]
    fn poll_failed(&self, n: std::ffi::c_int) -> Error {
        // Providers return a negative value without a usable errno.
        Error::verb_errno(
            "ibv_poll_cq",
            format!(
                "{}: returned {n} (CQ overrun or device error)",
                self.inner.ctx.name()
            ),
            libc::EIO,
        )
    }

    /// True for CQs made with [`Context::create_cq_ex`].
    pub fn is_extended(&self) -> bool {
        self.inner.ex.is_some()
    }

    /// Arms the CQ: the next completion (or next solicited one) signals its
    /// channel (`ibv_req_notify_cq(3)`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_req_notify_cq`; [`Error::InvalidArgument`]
    /// when the CQ has no channel.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        if self.inner.channel.is_none() {
            return Err(Error::InvalidArgument {
                verb: "ibv_req_notify_cq",
                reason: "the CQ was created without a completion channel".into(),
            });
        }
        // SAFETY: valid CQ.
        let rc = unsafe { ffi::ibv_req_notify_cq(self.as_raw(), i32::from(solicited_only)) };
        check_errno_ret("ibv_req_notify_cq", || "".into(), rc)
    }

    /// The channel the CQ signals, if any.
    pub fn channel(&self) -> Option<&CompletionChannel> {
        self.inner.channel.as_ref()
    }

    /// Resizes the CQ to at least `cqe` entries (`ibv_resize_cq(3)`).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the provider cannot resize;
    /// [`Error::Verb`] naming `ibv_resize_cq` (e.g. `EINVAL` below the number
    /// of completions it holds).
    pub fn resize(&self, cqe: u32) -> Result<()> {
        let n = std::ffi::c_int::try_from(cqe).map_err(|_| Error::InvalidArgument {
            verb: "ibv_resize_cq",
            reason: format!("cqe {cqe} does not fit a C int"),
        })?;
        // SAFETY: valid CQ.
        let rc = unsafe { ffi::ibv_resize_cq(self.as_raw(), n) };
        if rc == libc::EOPNOTSUPP || rc == libc::ENOSYS {
            return Err(Error::Unsupported {
                what: "ibv_resize_cq".into(),
                device: self.inner.ctx.name().to_string(),
                source: Some(std::io::Error::from_raw_os_error(rc)),
            });
        }
        check_errno_ret("ibv_resize_cq", || format!("to {cqe} entries").into(), rc)
    }

    /// Sets the CQ's interrupt moderation (`ibv_modify_cq(3)` with
    /// `IBV_CQ_ATTR_MODERATE`): a completion event fires once `moderation.count`
    /// completions arrived or `moderation.period_us` microseconds passed.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the provider has no CQ moderation
    /// (`EOPNOTSUPP`: soft-RoCE, soft-iWARP); [`Error::Verb`] naming
    /// `ibv_modify_cq` (e.g. `EINVAL` past the device's `cq_mod_caps`).
    pub fn modify_cq(&self, moderation: CqModeration) -> Result<()> {
        let mut attr = ffi::ibv_modify_cq_attr {
            attr_mask: ffi::IBV_CQ_ATTR_MODERATE,
            moderate: ffi::ibv_moderate_cq {
                cq_count: moderation.count,
                cq_period: moderation.period_us,
            },
        };
        // SAFETY: valid CQ and attribute struct.
        let rc = unsafe { ffi::ibv_modify_cq(self.as_raw(), &mut attr) };
        if rc == libc::EOPNOTSUPP || rc == libc::ENOSYS {
            return Err(Error::Unsupported {
                what: "CQ moderation (ibv_modify_cq)".into(),
                device: self.inner.ctx.name().to_string(),
                source: Some(std::io::Error::from_raw_os_error(rc)),
            });
        }
        check_errno_ret(
            "ibv_modify_cq",
            || format!("{} {moderation:?}", self.inner.ctx.name()).into(),
            rc,
        )
    }
}

/// CQ interrupt moderation for [`CompletionQueue::modify_cq`]
/// (`struct ibv_moderate_cq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CqModeration {
    /// Completions to gather before an event (`cq_count`).
    pub count: u16,
    /// Longest wait before an event, in microseconds (`cq_period`).
    pub period_us: u16,
}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("device", &self.inner.ctx.name())
            .field("cqe", &self.cqe())
            .finish()
    }
}

/// Drops what a caller left in a completion slot, out of line: the drop
/// glue of the `Option` in line would be a call per poll (callgrind).
#[cold]
#[inline(never)]
fn drop_cold<T>(t: T) {
    drop(t);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A provider's `ibv_poll_cq` from a script: each call takes the next
    /// step, a count of completions (numbered on from the last) or a
    /// failure.
    fn scripted(
        steps: &[std::ffi::c_int],
    ) -> impl FnMut(std::ffi::c_int, *mut ffi::ibv_wc) -> std::ffi::c_int + '_ {
        let mut steps = steps.iter();
        let mut next_id = 0u64;
        move |want, wcs| {
            let n = *steps.next().expect("polled past the script");
            for i in 0..n.clamp(0, want) {
                // SAFETY: the caller gave room for `want` entries.
                unsafe {
                    wcs.add(i as usize).write(ffi::ibv_wc {
                        wr_id: next_id,
                        ..Default::default()
                    })
                };
                next_id += 1;
            }
            n
        }
    }

    /// A poll whose second `ibv_poll_cq` fails (an overrun) returns the 16
    /// completions the first one took out of the CQ, and hands the failure
    /// on to the next poll: an error in their place would lose them.
    #[test]
    fn completions_before_a_failed_call_come_back_and_the_failure_waits() {
        let registry = Registry::default();
        let mut out = Vec::new();
        let mut deferred = None;
        let n = poll_batches(&registry, &mut out, 64, scripted(&[16, -5]), |n| {
            deferred = Some(n)
        });
        assert_eq!(n, Ok(16));
        let ids: Vec<u64> = out.iter().map(|c| c.wr_id).collect();
        assert_eq!(ids, (0..16).collect::<Vec<_>>());
        assert_eq!(deferred, Some(-5), "the failure is kept for the next poll");
    }

    /// A failure of the first call is the poll's own error; nothing waits.
    #[test]
    fn a_failure_with_nothing_before_it_is_the_poll_s_error() {
        let registry = Registry::default();
        let mut out = Vec::new();
        let mut deferred = None;
        let n = poll_batches(&registry, &mut out, 64, scripted(&[-5]), |n| {
            deferred = Some(n)
        });
        assert_eq!(n, Err(-5));
        assert!(out.is_empty());
        assert_eq!(deferred, None);
        // A short call ends the poll (the CQ is empty); a full one goes on.
        let n = poll_batches(
            &registry,
            &mut out,
            40,
            scripted(&[16, 16, 3]),
            |_| unreachable!(),
        );
        assert_eq!(n, Ok(35));
        let n = poll_batches(
            &registry,
            &mut out,
            20,
            scripted(&[16, 4]),
            |_| unreachable!(),
        );
        assert_eq!(n, Ok(20), "stops at max");
    }
}
