//! Awaitable CQs: [`AsyncCq`], the completions of one CQ awaited through
//! the [`CqChannel`] (`cq_channel.rs`) its CQ signals, and the waits for
//! room in a queue pair's queues.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::cq_channel::{ChanShared, CqChannel};
use crate::error::{Error, Result};
use crate::{Completion, CompletionQueue, PostError, QueuePair, SendWr, WorkCompletion, WrBuffers};

/// Completions one `ibv_poll_cq` round fetches into an [`AsyncCq`].
const POLL_BATCH: usize = 16;
/// The completions of one CQ, awaited: [`AsyncCq::next`] (or the `Stream`
/// with a runtime feature), [`AsyncCq::batch`], and waiting for room in a
/// queue pair's queues.
///
/// The only async waiter of its CQ (a second `AsyncCq` of the CQ is
/// refused); other threads may still poll the CQ directly, and a completion
/// goes to whoever polls it. Completions polled but not yet returned wait in
/// the `AsyncCq`, never in a future: dropping a future loses none.
///
/// ```no_run
/// # #[cfg(feature = "tokio")]
/// # async fn f(qp: &mut rdma::QueuePair, cq: &rdma::CompletionQueue) -> rdma::Result<()> {
/// use rdma::{AccessFlags, PostError};
///
/// // `cq` was created with a completion channel:
/// // `ctx.create_cq(64, Some(&ctx.create_comp_channel()?), 0)`.
/// let mut completions = rdma::aio::tokio_rt::completions(cq)?;
/// let buf = qp.pd().alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
/// qp.post_recv(7, buf).map_err(PostError::drop_buffers)?;
/// // Sleeps until the receive completes (the CQ armed, its event awaited,
/// // acknowledged in batches); the region comes back with it.
/// let mut c = completions.next().await?.ok()?;
/// println!("{} bytes in request {}", c.byte_len, c.wr_id);
/// let _region = c.take_buffers();
/// # Ok(())
/// # }
/// ```
pub struct AsyncCq {
    chan: Arc<ChanShared>,
    cq: CompletionQueue,
    key: usize,
    /// The CQ is armed and its event not seen yet.
    armed: bool,
    /// Polled, not returned yet.
    ready: VecDeque<Completion>,
    scratch: Vec<Completion>,
}

impl AsyncCq {
    /// Awaits the completions of `cq`, which must signal `channel`'s
    /// completion channel.
    ///
    /// # Errors
    /// [`Error::Async`]: `EINVAL` for a CQ created without a completion
    /// channel or signalling another channel, `EBUSY` when the CQ already
    /// has an `AsyncCq`.
    pub fn new(channel: &CqChannel, cq: &CompletionQueue) -> Result<AsyncCq> {
        let invalid = |reason: &'static str| Error::Async {
            operation: "AsyncCq::new",
            reason: reason.into(),
            errno: libc::EINVAL,
        };
        let Some(own) = cq.channel() else {
            return Err(invalid(
                "the CQ was created without a completion channel, so it can never signal \
                 one: create it with Context::create_cq(.., Some(&channel), ..)",
            ));
        };
        if !own.same_channel(channel.channel()) {
            return Err(invalid(
                "the CQ signals another completion channel than the CqChannel drives",
            ));
        }
        let key = channel.shared().attach(cq)?;
        Ok(AsyncCq {
            chan: Arc::clone(channel.shared()),
            cq: cq.clone(),
            key,
            armed: false,
            ready: VecDeque::new(),
            scratch: Vec::with_capacity(POLL_BATCH),
        })
    }

    /// The CQ.
    pub fn cq(&self) -> &CompletionQueue {
        &self.cq
    }

    /// Completions polled from the CQ and not returned yet (by a future
    /// that was dropped, or by waiting for room in a queue).
    pub fn buffered(&self) -> usize {
        self.ready.len()
    }

    /// Buffers new completions (for waiting for room in a queue, which
    /// returns none): polls the CQ, and when it is empty arms it, polls
    /// again, and waits for its event.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.poll_until(cx, |acq| {
            acq.scratch.clear();
            let n = acq.cq.poll(&mut acq.scratch, POLL_BATCH)?;
            if acq.ready.is_empty() {
                // The batch becomes the buffer as it lies (a `Vec` turns
                // into a `VecDeque` without moving its elements; a
                // `Completion` is 112 bytes), and the spent buffer is the
                // next scratch: the two allocations take turns.
                let spent = Vec::from(std::mem::take(&mut acq.ready));
                acq.ready = VecDeque::from(std::mem::replace(&mut acq.scratch, spent));
            } else {
                acq.ready.extend(acq.scratch.drain(..));
            }
            Ok((n > 0).then_some(()))
        })
    }

    /// The one wait of every poll method: runs `poll` (which polls the CQ
    /// and returns `Some` once it found something) until it does, and
    /// after each poll that found nothing, arms the CQ and polls again
    /// before waiting for the CQ's event (a completion that came after a
    /// poll and before the arm sends no event, so the poll after the arm
    /// is what finds it). The event, when it comes, spends the arm (and is
    /// acknowledged by the driver, in batches); the next empty poll arms
    /// again. `Pending` leaves `cx` registered for the event and the arm
    /// in this `AsyncCq`, so a dropped future loses neither; `poll` keeps
    /// what it polls in its own place (the caller's, or this buffer).
    #[inline]
    fn poll_until<T>(
        &mut self,
        cx: &mut Context<'_>,
        mut poll: impl FnMut(&mut Self) -> Result<Option<T>>,
    ) -> Poll<Result<T>> {
        loop {
            match poll(self) {
                Ok(Some(found)) => return Poll::Ready(Ok(found)),
                Ok(None) => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            if let Err(e) = std::task::ready!(self.arm_or_wait(cx)) {
                return Poll::Ready(Err(e));
            }
        }
    }

    /// After a poll that found nothing: arms the CQ, then asks for another
    /// poll before waiting (a completion that came after that poll and
    /// before the arm sends no event), or waits for the CQ's event.
    /// `Ready(Ok(()))`: poll again; `Pending`: `cx` is registered for the
    /// event.
    fn arm_or_wait(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if !self.armed {
            self.cq.req_notify(false)?;
            self.armed = true;
            return Poll::Ready(Ok(()));
        }
        std::task::ready!(self.chan.poll_fired(self.key, cx))?;
        self.armed = false;
        Poll::Ready(Ok(()))
    }

    /// Polls for the next completion: `Ready` with it (memory included),
    /// `Pending` with `cx` registered for the CQ's next event.
    ///
    /// # Errors
    /// As [`CompletionQueue::poll`] and [`CompletionQueue::req_notify`];
    /// the reactor's failure as [`Error::Verb`] naming `ibv_get_cq_event`.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Result<Completion>> {
        // Nothing buffered: one completion polled straight into a slot
        // (`CompletionQueue::poll_one_into`) and moved out once, instead of
        // a batch polled into `scratch` that becomes the buffer: a
        // latency loop's completion comes alone, and the batch's buffering
        // is most of its cost (callgrind, `perf send_lat -e --wait async`).
        // A caller that wants batches has `AsyncCq::batch`; one that keeps
        // its slot, `AsyncCq::next_into`.
        let mut slot = None;
        std::task::ready!(self.poll_next_into(cx, &mut slot))?;
        Poll::Ready(slot.ok_or_else(lost_completion))
    }

    /// Waits for the next completion.
    ///
    /// Cancel safety: dropping the future loses nothing. Completions are
    /// moved out of the CQ into this `AsyncCq` and returned one per call, so
    /// one polled while the future was dropped is returned by the next call;
    /// an armed CQ stays armed and its event is noted for the next call.
    ///
    /// # Errors
    /// As [`AsyncCq::poll_next`].
    #[allow(clippy::should_implement_trait)] // a future, as `StreamExt::next`
    pub fn next(&mut self) -> impl Future<Output = Result<Completion>> + '_ {
        std::future::poll_fn(move |cx| self.poll_next(cx))
    }

    /// [`AsyncCq::poll_next`] into a completion the caller keeps, as
    /// [`CompletionQueue::poll_one_into`] does: `Ready(Ok(()))` when `slot`
    /// holds the next completion (what it held before, memory included,
    /// is dropped first), `Pending` with `cx` registered for the CQ's next
    /// event, `slot` left alone.
    ///
    /// # Errors
    /// As [`AsyncCq::poll_next`].
    pub fn poll_next_into(
        &mut self,
        cx: &mut Context<'_>,
        slot: &mut Option<Completion>,
    ) -> Poll<Result<()>> {
        if let Some(c) = self.ready.pop_front() {
            *slot = Some(c);
            return Poll::Ready(Ok(()));
        }
        self.poll_until(cx, |acq| Ok(acq.cq.poll_one_into(slot)?.map(|_| ())))
    }

    /// Waits for the next completion, polled into `slot` (see
    /// [`AsyncCq::poll_next_into`]): a loop that keeps its slot moves no
    /// 112-byte [`Completion`] around, as the blocking
    /// [`CompletionQueue::poll_one_into`].
    ///
    /// Cancel safety: as [`AsyncCq::next`]: `slot` gets a completion only
    /// in the poll that completes the future.
    ///
    /// # Errors
    /// As [`AsyncCq::poll_next`].
    pub fn next_into<'s>(&mut self, slot: &'s mut Option<Completion>) -> NextInto<'_, 's> {
        NextInto {
            acq: self,
            slot: Some(slot),
        }
    }

    /// Polls for up to `max` completions, appended to `out`: `Ready` with
    /// how many (at least one unless `max` is 0), `Pending` with `cx`
    /// registered for the CQ's next event and `out` left alone. Completions
    /// buffered here come first (and alone); otherwise the CQ is polled
    /// straight into `out`, as [`CompletionQueue::poll`] does, so a loop
    /// that handles them where they lie and then clears `out` moves no
    /// 112-byte [`Completion`] around.
    ///
    /// # Errors
    /// As [`AsyncCq::poll_next`].
    pub fn poll_batch(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Completion>,
        max: usize,
    ) -> Poll<Result<usize>> {
        if max == 0 {
            return Poll::Ready(Ok(0));
        }
        if !self.ready.is_empty() {
            let n = self.ready.len().min(max);
            out.extend(self.ready.drain(..n));
            return Poll::Ready(Ok(n));
        }
        self.poll_until(
            cx,
            |acq| Ok(Some(acq.cq.poll(out, max)?).filter(|&n| n > 0)),
        )
    }

    /// Waits for at least one completion and moves up to `max` into `out`
    /// (appending); returns how many (see [`AsyncCq::poll_batch`]).
    ///
    /// Cancel safety: as [`AsyncCq::next`]; `out` gets completions only in
    /// the poll that completes the future.
    ///
    /// # Errors
    /// As [`AsyncCq::poll_next`].
    pub fn batch<'a>(
        &'a mut self,
        out: &'a mut Vec<Completion>,
        max: usize,
    ) -> impl Future<Output = Result<usize>> + 'a {
        std::future::poll_fn(move |cx| self.poll_batch(cx, out, max))
    }

    /// [`AsyncCq::poll_batch`] in the compact form
    /// ([`CompletionQueue::poll_wc`]): up to `wcs.len()` completions into
    /// `wcs`, the memory of the requests they finish appended to `memory`;
    /// `Ready` with how many (at least one unless `wcs` is empty), `Pending`
    /// with `cx` registered and both left alone. Completions buffered here
    /// (by [`AsyncCq::next`] and its kin) come first, converted.
    ///
    /// # Errors
    /// As [`AsyncCq::poll_next`].
    pub fn poll_batch_wc(
        &mut self,
        cx: &mut Context<'_>,
        wcs: &mut [WorkCompletion],
        memory: &mut Vec<(u64, WrBuffers)>,
    ) -> Poll<Result<usize>> {
        if wcs.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if !self.ready.is_empty() {
            return Poll::Ready(Ok(self.buffered_wc(wcs, memory)));
        }
        self.poll_until(cx, |acq| {
            Ok(Some(acq.cq.poll_wc(wcs, memory)?).filter(|&n| n > 0))
        })
    }

    /// [`AsyncCq::poll_batch_wc`] without waiting: the completions buffered
    /// here first, else one poll of the CQ into `wcs` (memory appended to
    /// `memory`); how many, 0 when there are none. It neither arms the CQ
    /// nor registers a waker, and leaves an arm made before in place.
    ///
    /// For a loop that handles what is already there in ordinary code and
    /// awaits [`AsyncCq::batch_wc`] only when this returns 0 (the wait then
    /// polls, arms, polls again and sleeps): its per-completion work stays
    /// out of the future's state machine, whose variables live in the
    /// future and are reloaded around every call (callgrind, `perf send_bw
    /// -e --wait async`: the spills of an inlined post loop, per message).
    ///
    /// # Errors
    /// As [`CompletionQueue::poll_wc`].
    #[inline]
    pub fn try_batch_wc(
        &mut self,
        wcs: &mut [WorkCompletion],
        memory: &mut Vec<(u64, WrBuffers)>,
    ) -> Result<usize> {
        if !self.ready.is_empty() {
            return Ok(self.buffered_wc(wcs, memory));
        }
        self.cq.poll_wc(wcs, memory)
    }

    /// Moves buffered completions into `wcs` in the compact form.
    fn buffered_wc(
        &mut self,
        wcs: &mut [WorkCompletion],
        memory: &mut Vec<(u64, WrBuffers)>,
    ) -> usize {
        let n = self.ready.len().min(wcs.len());
        for (wc, c) in wcs.iter_mut().zip(self.ready.drain(..n)) {
            *wc = c.into_compact(memory);
        }
        n
    }

    /// Waits for at least one completion and polls up to `wcs.len()` into
    /// `wcs` in the compact form; returns how many (see
    /// [`AsyncCq::poll_batch_wc`]).
    ///
    /// Cancel safety: as [`AsyncCq::next`]; `wcs` and `memory` get
    /// completions only in the poll that completes the future.
    ///
    /// # Errors
    /// As [`AsyncCq::poll_next`].
    pub fn batch_wc<'a>(
        &'a mut self,
        wcs: &'a mut [WorkCompletion],
        memory: &'a mut Vec<(u64, WrBuffers)>,
    ) -> impl Future<Output = Result<usize>> + 'a {
        std::future::poll_fn(move |cx| self.poll_batch_wc(cx, wcs, memory))
    }

    /// Takes every buffered completion without waiting (see
    /// [`AsyncCq::buffered`]).
    pub fn take_buffered(&mut self) -> Vec<Completion> {
        self.ready.drain(..).collect()
    }

    fn check_cq(&self, operation: &'static str, cq: &CompletionQueue, which: &str) -> Result<()> {
        if cq.as_raw() == self.cq.as_raw() {
            return Ok(());
        }
        Err(Error::Async {
            operation,
            reason: format!(
                "the QP's {which} CQ is not this AsyncCq's CQ: no completion polled here \
                 can make room in it"
            )
            .into(),
            errno: libc::EINVAL,
        })
    }

    /// Polls until `room` says the QP has room, polling completions of this
    /// CQ (into the buffer) to make it.
    fn poll_room(&mut self, cx: &mut Context<'_>, room: impl Fn() -> bool) -> Poll<Result<()>> {
        loop {
            if room() {
                return Poll::Ready(Ok(()));
            }
            match self.poll_fill(cx) {
                Poll::Ready(Ok(())) => {}
                other => return other,
            }
        }
    }

    /// Waits until `qp`'s send queue has room for another request: fewer
    /// requests in flight ([`QueuePair::in_flight`]) than its
    /// `max_send_wr`. The completions polled to make room stay buffered for
    /// [`AsyncCq::next`]. Unsignaled sends leave the queue only with a later
    /// signaled one, so a queue full of unsignaled sends never makes room.
    ///
    /// Cancel safety: owns nothing; dropping it loses nothing.
    ///
    /// # Errors
    /// [`Error::Async`] (`EINVAL`) when `qp`'s send CQ is not this CQ; as
    /// [`AsyncCq::poll_next`].
    pub fn send_room<'a>(&'a mut self, qp: &'a QueuePair) -> impl Future<Output = Result<()>> + 'a {
        let check = self.check_cq("AsyncCq::send_room", qp.send_cq(), "send");
        let max = usize::try_from(qp.caps().max_send_wr).unwrap_or(usize::MAX);
        let mut check = Some(check);
        std::future::poll_fn(move |cx| {
            if let Some(Err(e)) = check.take() {
                return Poll::Ready(Err(e));
            }
            self.poll_room(cx, || qp.in_flight().0 < max)
        })
    }

    /// Waits until `qp`'s receive queue has room for another receive (see
    /// [`AsyncCq::send_room`]).
    ///
    /// Cancel safety: owns nothing; dropping it loses nothing.
    ///
    /// # Errors
    /// [`Error::Async`] (`EINVAL`) when `qp` uses a shared receive queue or
    /// its receive CQ is not this CQ; as [`AsyncCq::poll_next`].
    pub fn recv_room<'a>(&'a mut self, qp: &'a QueuePair) -> impl Future<Output = Result<()>> + 'a {
        let check = if qp.srq().is_some() {
            Err(Error::Async {
                operation: "AsyncCq::recv_room",
                reason: "the QP receives through a shared receive queue".into(),
                errno: libc::EINVAL,
            })
        } else {
            self.check_cq("AsyncCq::recv_room", qp.recv_cq(), "receive")
        };
        let max = usize::try_from(qp.caps().max_recv_wr).unwrap_or(usize::MAX);
        let mut check = Some(check);
        std::future::poll_fn(move |cx| {
            if let Some(Err(e)) = check.take() {
                return Poll::Ready(Err(e));
            }
            self.poll_room(cx, || qp.in_flight().1 < max)
        })
    }

    /// Posts `wr` to `qp` ([`QueuePair::post_send`]) once its send queue
    /// has room ([`AsyncCq::send_room`]), instead of failing with `ENOMEM`.
    ///
    /// Cancel safety: the request is posted in the poll that completes the
    /// future, never before. Dropped earlier, the future drops the request
    /// unposted, with its memory: the device never saw it. To keep the
    /// request across a cancellation, await [`AsyncCq::send_room`] and post
    /// it yourself.
    ///
    /// # Errors
    /// As [`QueuePair::post_send`], and the errors of
    /// [`AsyncCq::send_room`], with the request's memory in
    /// [`PostError::returned`].
    pub async fn post_send(
        &mut self,
        qp: &mut QueuePair,
        wr: SendWr,
    ) -> std::result::Result<(), PostError> {
        // Room already (the common case): posted in this first poll, without
        // building `send_room`'s future, as `send_room` would find.
        if qp.send_cq().as_raw() == self.cq.as_raw()
            && qp.in_flight().0 < usize::try_from(qp.caps().max_send_wr).unwrap_or(usize::MAX)
        {
            return qp.post_send(wr);
        }
        if let Err(error) = self.send_room(qp).await {
            return Err(PostError {
                error,
                returned: vec![(wr.wr_id(), wr.into_buffers())],
            });
        }
        qp.post_send(wr)
    }

    /// Posts a receive into `buffers` ([`QueuePair::post_recv`]; a
    /// [`crate::MemoryRegion`] converts with `.into()`) once the
    /// receive queue has room ([`AsyncCq::recv_room`]).
    ///
    /// Cancel safety: as [`AsyncCq::post_send`].
    ///
    /// # Errors
    /// As [`QueuePair::post_recv`] and [`AsyncCq::recv_room`].
    pub async fn post_recv(
        &mut self,
        qp: &mut QueuePair,
        wr_id: u64,
        buffers: WrBuffers,
    ) -> std::result::Result<(), PostError> {
        if let Err(error) = self.recv_room(qp).await {
            return Err(PostError {
                error,
                returned: vec![(wr_id, buffers)],
            });
        }
        qp.post_recv(wr_id, buffers)
    }
}

impl Drop for AsyncCq {
    fn drop(&mut self) {
        self.chan.detach(&self.cq, self.key);
    }
}

/// The future of [`AsyncCq::next_into`]: written out rather than an
/// `async fn`, whose state machine costs more per wait than this one poll
/// (callgrind, `perf send_lat -e --wait async`).
#[must_use = "futures do nothing unless polled"]
#[derive(Debug)]
pub struct NextInto<'a, 's> {
    acq: &'a mut AsyncCq,
    /// Handed back when the completion is there; `None` after that.
    slot: Option<&'s mut Option<Completion>>,
}

impl<'s> Future for NextInto<'_, 's> {
    type Output = Result<&'s mut Completion>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let Some(slot) = this.slot.take() else {
            return Poll::Ready(Err(Error::InvalidArgument {
                verb: "ibv_poll_cq",
                reason: "next_into's future was polled again after it completed".into(),
            }));
        };
        match this.acq.poll_next_into(cx, slot) {
            Poll::Ready(Ok(())) => Poll::Ready(Option::as_mut(slot).ok_or_else(lost_completion)),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                this.slot = Some(slot);
                Poll::Pending
            }
        }
    }
}

/// A poll that reported a completion left none in its slot: cannot happen
/// (`poll_next_into` fills the slot whenever it returns `Ready(Ok(()))`),
/// reported rather than a panic.
#[cold]
fn lost_completion() -> Error {
    Error::InvalidArgument {
        verb: "ibv_poll_cq",
        reason: "the slot lost its completion".into(),
    }
}

impl fmt::Debug for AsyncCq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncCq")
            .field("cq", &self.cq)
            .field("armed", &self.armed)
            .field("buffered", &self.ready.len())
            .finish()
    }
}

#[cfg(any(feature = "tokio", feature = "async-io"))]
impl futures_core::Stream for AsyncCq {
    type Item = Result<Completion>;

    /// Never ends: every item is the next completion, or an error.
    fn poll_next(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        AsyncCq::poll_next(self.get_mut(), cx).map(Some)
    }
}
