//! Posting receives (`ibv_post_recv(3)`).

use super::QueuePair;
use crate::error::{check_errno_ret, Error};
use crate::ffi;
use crate::track::{self, Pending};
use crate::wr::{PostError, WrBuffers};

impl QueuePair {
    /// Posts one receive request (`ibv_post_recv(3)`); its memory comes back
    /// with the receive completion.
    ///
    /// # Errors
    /// As [`QueuePair::post_recv_batch`].
    pub fn post_recv(
        &mut self,
        wr_id: u64,
        buffers: impl Into<WrBuffers>,
    ) -> std::result::Result<(), PostError> {
        let buffers = buffers.into();
        let plainly_valid = self.plain_recvs
            && self
                .buffers_plainly_valid(&buffers, self.caps.max_recv_sge, true)
                .is_some();
        let check = if plainly_valid {
            Ok(())
        } else if self.srq.is_some() {
            Err(Error::InvalidArgument {
                verb: "ibv_post_recv",
                reason: format!(
                    "QP {} takes its receives from an SRQ: post them there",
                    self.qp_num()
                ),
            })
        } else {
            self.check_buffers(&buffers, self.caps.max_recv_sge, true, "ibv_post_recv")
        };
        if let Err(error) = check {
            return Err(PostError {
                error,
                returned: vec![(wr_id, buffers)],
            });
        }
        let qp = self.as_raw();
        // SAFETY: `&mut self`: the only poster to this QP's receive queue, which
        // pushes at most the count given; the QP holds its CQs.
        let mut ring = unsafe { self.owned.tracker.producer(true, 1) };
        // SAFETY: `post_chain` hands over a well-formed request whose memory
        // is parked below, before `ring` publishes it (a poll that sees the
        // completion first waits for that); the QP is live.
        let (rc, _) = track::post_chain(&[(ring.wr_id(0), &buffers)], |wr, bad| unsafe {
            ffi::ibv_post_recv(qp, wr, bad)
        });
        if rc != 0 {
            drop(ring);
            return Err(self.not_posted("ibv_post_recv", rc, (wr_id, buffers)));
        }
        ring.push(Pending::memory(wr_id, buffers));
        Ok(())
    }

    /// Posts several receive requests with one doorbell.
    ///
    /// # Errors
    /// The error and the memory of the requests not posted:
    /// [`Error::InvalidArgument`] (too many SGEs, wrong PD, no `LOCAL_WRITE`),
    /// [`Error::Verb`] naming `ibv_post_recv` (e.g. `ENOMEM`: queue full).
    pub fn post_recv_batch(
        &mut self,
        wrs: impl IntoIterator<Item = (u64, WrBuffers)>,
    ) -> std::result::Result<(), PostError> {
        let wrs: Vec<(u64, WrBuffers)> = wrs.into_iter().collect();
        if self.srq.is_some() {
            return Err(PostError {
                error: Error::InvalidArgument {
                    verb: "ibv_post_recv",
                    reason: format!(
                        "QP {} takes its receives from an SRQ: post them there",
                        self.qp_num()
                    ),
                },
                returned: wrs,
            });
        }
        for (_, b) in &wrs {
            if let Err(error) = self.check_buffers(b, self.caps.max_recv_sge, true, "ibv_post_recv")
            {
                return Err(PostError {
                    error,
                    returned: wrs,
                });
            }
        }
        let qp = self.as_raw();
        // SAFETY: `&mut self`: the only poster to this QP's receive queue, which
        // pushes at most the count given; the QP holds its CQs.
        let mut ring = unsafe { self.owned.tracker.producer(true, wrs.len()) };
        let chain: Vec<(u64, &WrBuffers)> = wrs
            .iter()
            .enumerate()
            .map(|(i, (_, b))| (ring.wr_id(i as u32), b))
            .collect();
        // SAFETY: `post_chain` hands over a well-formed chain whose memory
        // is parked below, before `ring` publishes it; the QP is live.
        let (rc, posted) = track::post_chain(&chain, |chain, bad| unsafe {
            ffi::ibv_post_recv(qp, chain, bad)
        });
        drop(chain);
        let mut wrs = wrs;
        let unposted = wrs.split_off(posted);
        for (wr_id, buffers) in wrs {
            ring.push(Pending::memory(wr_id, buffers));
        }
        drop(ring);
        if rc == 0 {
            return Ok(());
        }
        let qpn = self.qp_num();
        let error = check_errno_ret(
            "ibv_post_recv",
            || format!("QP {qpn}: {} requests not posted", unposted.len()).into(),
            rc,
        )
        .expect_err("rc != 0");
        Err(PostError {
            error,
            returned: unposted,
        })
    }
}
