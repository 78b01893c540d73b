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
        let Some(channel) = self.channel() else {
            return Err(Error::Async {
                operation: "CompletionQueue::wait",
                reason: "the CQ was created without a completion channel, so nothing can \
                         wake a waiter: create it with Context::create_cq(.., Some(&channel), ..)"
                    .into(),
                errno: libc::EINVAL,
            });
        };
        channel.claim("CompletionQueue::wait", CHANNEL_WAITING)?;
        struct Claim<'a>(&'a crate::CompletionChannel);
        impl Drop for Claim<'_> {
            fn drop(&mut self) {
                self.0.release();
            }
        }
        let _claim = Claim(channel);
        let mut unacked = 0u32;
        let result = self.wait_claimed(channel, timeout, &mut unacked);
        if unacked > 0 {
            // SAFETY: `unacked` events of this CQ came from ibv_get_cq_event
            // and were not acknowledged; the CQ is alive (`self`).
            unsafe { ffi::ibv_ack_cq_events(self.as_raw(), unacked) };
        }
        result
    }

    fn wait_claimed(
        &self,
        channel: &crate::CompletionChannel,
        timeout: Option<Duration>,
        unacked: &mut u32,
    ) -> Result<Option<Completion>> {
        let mut deadline = None;
        let mut armed = false;
        loop {
            if let Some(c) = self.poll_one()? {
                return Ok(Some(c));
            }
            if !armed {
                self.req_notify(false)?;
                armed = true;
                continue;
            }
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
                return Err(Error::verb_errno("poll", "completion channel", errno));
            }
            if rc == 0 {
                continue;
            }
            let mut cq: *mut ffi::ibv_cq = std::ptr::null_mut();
            let mut ctx: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: a live channel, readable, and this the only reader
            // (claimed), so the read does not block; valid out-pointers.
            let rc = unsafe { ffi::ibv_get_cq_event(channel.as_raw(), &mut cq, &mut ctx) };
            if rc != 0 {
                let errno = last_errno();
                if errno == libc::EAGAIN || errno == libc::EINTR {
                    continue;
                }
                return Err(Error::verb_errno("ibv_get_cq_event", "", errno));
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
