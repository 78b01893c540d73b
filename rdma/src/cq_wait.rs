//! Waiting for a completion without spinning, with a bound
//! ([`CompletionQueue::wait`]).

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::cq::CHANNEL_WAITING;
use crate::error::{last_errno, Error, Result};
use crate::{ffi, Completion, CompletionQueue};

/// Events of the waited CQ acknowledged together.
const ACK_BATCH: u32 = 16;

impl CompletionQueue {
    /// Waits at most `timeout` (`None`: without bound) for the CQ's next
    /// completion, sleeping on its completion channel: polls, arms
    /// (`ibv_req_notify_cq`), polls again (a completion that came before
    /// the arm signals nothing), then waits for the channel with `poll(2)`.
    /// `Ok(None)` when the time ran out.
    ///
    /// One reader per channel: the wait claims the CQ's channel, so a wait
    /// on another CQ of the same channel from another thread, and an
    /// `rdma::aio::CqChannel` on it, are refused (`EBUSY`) while it runs.
    /// Events of the channel's other CQs read meanwhile are acknowledged and
    /// dropped: their next wait arms and polls again, so nothing is lost.
    /// The events of this CQ are acknowledged before the wait returns.
    ///
    /// # Errors
    /// [`Error::Async`]: `EINVAL` for a CQ created without a completion
    /// channel, `EBUSY` while another reader holds the channel; as
    /// [`CompletionQueue::poll`] and [`CompletionQueue::req_notify`];
    /// [`Error::Verb`] naming `poll` or `ibv_get_cq_event`.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<Option<Completion>> {
        self.wait_with("CompletionQueue::wait", timeout, || self.poll_one())
    }

    /// Waits at most `timeout` (`None`: without bound) until `poll`, the
    /// caller's own way of polling this CQ, returns `Some`: the same cycle
    /// as [`CompletionQueue::wait`] (poll, arm, poll again, sleep on the
    /// channel, poll), for a caller that polls into its own slot or batch
    /// (`CompletionQueue::poll_one_into`, `CompletionQueue::poll`, or
    /// `ibv_poll_cq` on [`CompletionQueue::as_raw`]). `Ok(None)` when the
    /// time ran out. `poll` must poll this CQ: the wait arms it and sleeps
    /// until it signals.
    ///
    /// Without a bound, and on a blocking descriptor, the wait reads the
    /// channel directly (`ibv_get_cq_event` blocks): one system call per
    /// sleep, besides the arm. With a bound it waits with `poll(2)` first.
    /// Events are acknowledged 16 at a time, and all before the call
    /// returns.
    ///
    /// # Errors
    /// As [`CompletionQueue::wait`] (converted into `E`), and whatever
    /// `poll` returns.
    pub fn wait_until<T, E: From<Error>>(
        &self,
        timeout: Option<Duration>,
        poll: impl FnMut() -> std::result::Result<Option<T>, E>,
    ) -> std::result::Result<Option<T>, E> {
        self.wait_with("CompletionQueue::wait_until", timeout, poll)
    }

    fn wait_with<T, E: From<Error>>(
        &self,
        operation: &'static str,
        timeout: Option<Duration>,
        mut poll: impl FnMut() -> std::result::Result<Option<T>, E>,
    ) -> std::result::Result<Option<T>, E> {
        let Some(channel) = self.channel() else {
            return Err(Error::Async {
                operation,
                reason: "the CQ was created without a completion channel, so nothing can \
                         wake a waiter: create it with Context::create_cq(.., Some(&channel), ..)"
                    .into(),
                errno: libc::EINVAL,
            }
            .into());
        };
        channel.claim(operation, CHANNEL_WAITING)?;
        struct Claim<'a>(&'a crate::CompletionChannel);
        impl Drop for Claim<'_> {
            fn drop(&mut self) {
                self.0.release();
            }
        }
        let _claim = Claim(channel);
        let mut unacked = 0u32;
        let result = self.wait_claimed(channel, timeout, &mut unacked, &mut poll);
        if unacked > 0 {
            // SAFETY: `unacked` events of this CQ came from ibv_get_cq_event
            // and were not acknowledged; the CQ is alive (`self`).
            unsafe { ffi::ibv_ack_cq_events(self.as_raw(), unacked) };
        }
        result
    }

    fn wait_claimed<T, E: From<Error>>(
        &self,
        channel: &crate::CompletionChannel,
        timeout: Option<Duration>,
        unacked: &mut u32,
        poll: &mut impl FnMut() -> std::result::Result<Option<T>, E>,
    ) -> std::result::Result<Option<T>, E> {
        let mut deadline = None;
        let mut armed = false;
        // Without a bound, read the channel directly; a non-blocking
        // descriptor (EAGAIN) sends the wait to poll(2).
        let mut direct = timeout.is_none();
        loop {
            if let Some(c) = poll()? {
                return Ok(Some(c));
            }
            if !armed {
                self.req_notify(false)?;
                armed = true;
                continue;
            }
            if !direct {
                let ms = match timeout {
                    None => -1,
                    Some(t) => {
                        let d = *deadline.get_or_insert_with(|| Instant::now() + t);
                        let left = d.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            return Ok(None);
                        }
                        // Round up: a wait of 0 ms would spin.
                        let ms = left.as_micros().div_ceil(1000);
                        std::ffi::c_int::try_from(ms).unwrap_or(std::ffi::c_int::MAX)
                    }
                };
                let mut pfd = libc::pollfd {
                    fd: channel.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
                if rc < 0 {
                    let errno = last_errno();
                    if errno == libc::EINTR {
                        continue;
                    }
                    return Err(Error::verb_errno("poll", "completion channel", errno).into());
                }
                if rc == 0 {
                    continue;
                }
            }
            let mut cq: *mut ffi::ibv_cq = std::ptr::null_mut();
            let mut ctx: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: a live channel and this the only reader (claimed);
            // valid out-pointers. On a blocking descriptor without a
            // bound the read sleeps until an armed CQ of the channel fires.
            let rc = unsafe { ffi::ibv_get_cq_event(channel.as_raw(), &mut cq, &mut ctx) };
            if rc != 0 {
                let errno = last_errno();
                if errno == libc::EAGAIN {
                    direct = false;
                    continue;
                }
                if errno == libc::EINTR {
                    continue;
                }
                return Err(Error::verb_errno("ibv_get_cq_event", "", errno).into());
            }
            if cq == self.as_raw() {
                armed = false;
                *unacked += 1;
                if *unacked >= ACK_BATCH {
                    // SAFETY: as in `wait`.
                    unsafe { ffi::ibv_ack_cq_events(cq, *unacked) };
                    *unacked = 0;
                }
            } else {
                // SAFETY: an event of another CQ of the channel, acknowledged
                // once; that CQ cannot be destroyed before this.
                unsafe { ffi::ibv_ack_cq_events(cq, 1) };
            }
        }
    }
}
