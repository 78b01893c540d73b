//! A context's asynchronous events, awaited (`ibv_get_async_event(3)`).

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::io;
use std::task::{Context, Poll};

use super::{reactor_error, would_block, Reactor, Readiness};
use crate::error::{Error, Result};
use crate::{AsyncEvent, AsyncEventType, SharedReceiveQueue};

/// The asynchronous events of a device context (port changes, QP and CQ
/// errors, an SRQ's limit), awaited.
///
/// Events are acknowledged as they are read (see [`AsyncEvent`]), so none
/// can hold up the destruction of its object. While this lives, the
/// context's event descriptor is non-blocking (it is made blocking again on
/// drop); read the context's events here only.
pub struct DeviceEvents {
    /// Dropped first (field order): the registration goes while the
    /// descriptor is open.
    readiness: Box<dyn Readiness>,
    /// Read, not returned yet (kept while [`DeviceEvents::wait_for`] looks
    /// for another one).
    pending: VecDeque<AsyncEvent>,
    ctx: crate::Context,
}

impl DeviceEvents {
    /// Awaits the asynchronous events of `ctx` through `reactor`.
    ///
    /// # Errors
    /// As [`crate::Context::async_fd`]; [`Error::Verb`] naming `fcntl`; the
    /// reactor's errors.
    pub fn new(ctx: &crate::Context, reactor: &dyn Reactor) -> Result<DeviceEvents> {
        let fd = ctx.async_fd()?;
        ctx.set_async_nonblocking(true)?;
        let readiness = {
            use std::os::fd::AsFd;
            reactor.register(fd.as_fd())
        }
        .inspect_err(|_| {
            let _ = ctx.set_async_nonblocking(false);
        })?;
        Ok(DeviceEvents {
            readiness,
            pending: VecDeque::new(),
            ctx: ctx.clone(),
        })
    }

    /// Reads at least one more event into `pending` (every one pending,
    /// until `EAGAIN`).
    fn poll_more(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let before = self.pending.len();
        let ctx = &self.ctx;
        let pending = &mut self.pending;
        let mut failure = None;
        let read = self.readiness.poll_read(cx, &mut || loop {
            match ctx.get_async_event() {
                Ok(e) => pending.push_back(e),
                Err(e) if e.errno() == Some(libc::EAGAIN) => return Err(would_block()),
                Err(e) => {
                    let io = io::Error::other(e.to_string());
                    failure = Some(e);
                    return Err(io);
                }
            }
        });
        if self.pending.len() > before {
            return Poll::Ready(Ok(()));
        }
        match (read, failure) {
            (Poll::Ready(Err(_)), Some(e)) => Poll::Ready(Err(e)),
            (Poll::Ready(Err(e)), None) => {
                Poll::Ready(Err(reactor_error("ibv_get_async_event", e)))
            }
            _ => Poll::Pending,
        }
    }

    /// Polls for the next event.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_get_async_event`, or the reactor's
    /// failure.
    pub fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Result<AsyncEvent>> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Poll::Ready(Ok(e));
            }
            match self.poll_more(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Waits for the next event.
    ///
    /// Cancel safety: events are read into this value, never into the
    /// future: dropping it loses nothing.
    ///
    /// # Errors
    /// As [`DeviceEvents::poll_event`].
    #[allow(clippy::should_implement_trait)] // a future, as `StreamExt::next`
    pub fn next(&mut self) -> impl Future<Output = Result<AsyncEvent>> + '_ {
        std::future::poll_fn(move |cx| self.poll_event(cx))
    }

    /// Waits for the first event that `pred` accepts; the others read on the
    /// way stay queued, in order, for [`DeviceEvents::next`].
    ///
    /// Cancel safety: as [`DeviceEvents::next`].
    ///
    /// # Errors
    /// As [`DeviceEvents::poll_event`].
    pub fn wait_for<'a>(
        &'a mut self,
        mut pred: impl FnMut(&AsyncEvent) -> bool + 'a,
    ) -> impl Future<Output = Result<AsyncEvent>> + 'a {
        std::future::poll_fn(move |cx| loop {
            if let Some(i) = self.pending.iter().position(&mut pred) {
                if let Some(e) = self.pending.remove(i) {
                    return Poll::Ready(Ok(e));
                }
            }
            match self.poll_more(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        })
    }

    /// Waits until `srq` reports its limit (`IBV_EVENT_SRQ_LIMIT_REACHED`:
    /// fewer receives left than armed with
    /// [`SharedReceiveQueue::arm_limit`]; the limit is then disarmed).
    ///
    /// Cancel safety: as [`DeviceEvents::wait_for`].
    ///
    /// # Errors
    /// As [`DeviceEvents::poll_event`]; [`Error::Async`] (`EINVAL`) for an
    /// SRQ of another context.
    pub async fn srq_limit(&mut self, srq: &SharedReceiveQueue) -> Result<()> {
        if srq.pd().context().as_raw() != self.ctx.as_raw() {
            return Err(Error::Async {
                operation: "DeviceEvents::srq_limit",
                reason: "the SRQ belongs to another context: its events go to that \
                         context's descriptor"
                    .into(),
                errno: libc::EINVAL,
            });
        }
        self.wait_for(|e| e.event_type == AsyncEventType::SrqLimitReached && e.is_srq(srq))
            .await
            .map(drop)
    }

    /// The context.
    pub fn context(&self) -> &crate::Context {
        &self.ctx
    }
}

impl Drop for DeviceEvents {
    fn drop(&mut self) {
        // Best effort: the descriptor is the context's, still open.
        let _ = self.ctx.set_async_nonblocking(false);
    }
}

impl fmt::Debug for DeviceEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceEvents")
            .field("device", &self.ctx.name())
            .field("pending", &self.pending.len())
            .finish()
    }
}
