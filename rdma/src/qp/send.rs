//! Posting sends: the front ends (`post_send`, `post_send_batch`,
//! `post_send_inline`, a type 2 window's bind) over one check each and one
//! submit, which takes the path the QP was built with.

use std::ffi::c_int;

use super::outgoing::{fill_request, Op, Outgoing};
use super::wr_ops::ExtendedQp;
use super::{QueuePair, SendPath};
use crate::error::{check_errno_ret, Result};
use crate::ffi;
use crate::track::{Pending, Producer};
use crate::wr::{link, posted, InlineSend, PostError, SendFlags, SendWr, WrBuffers};

/// Scatter entries one request may have without the post touching the heap.
const SHORT: usize = 4;

impl SendPath {
    /// The extended QP for a post whose requests have at most `sges` scatter
    /// entries (or inline data), or `None` for `ibv_post_send`.
    #[inline]
    pub(super) fn extended(&self, sges: usize, inline: bool) -> Option<&ExtendedQp> {
        match self {
            SendPath::Legacy => None,
            SendPath::Extended(x) => Some(x),
            SendPath::Mixed(x) => (sges <= 1 && !inline).then_some(x),
        }
    }
}

impl QueuePair {
    /// Posts one send request (`ibv_post_send(3)`). Its memory is held until
    /// its completion (or, if unsignaled, a later one) is polled.
    ///
    /// The memory moves into the queue: it cannot be touched until the
    /// completion gives it back.
    ///
    /// ```compile_fail
    /// # fn f(qp: &mut rdma::QueuePair, mr: rdma::MemoryRegion) {
    /// qp.post_send(rdma::SendWr::send(1, mr)).unwrap();
    /// let _ = mr.as_slice(); // moved into the send queue
    /// # }
    /// ```
    ///
    /// Posting needs the QP exclusively:
    ///
    /// ```compile_fail
    /// # fn f(qp: &rdma::QueuePair, mr: rdma::MemoryRegion) {
    /// qp.post_send(rdma::SendWr::send(1, mr)).unwrap(); // needs &mut QueuePair
    /// # }
    /// ```
    ///
    /// # Errors
    /// The error and the request's memory: [`crate::Error::InvalidArgument`]
    /// for a request the QP cannot take (too many SGEs, wrong PD, misaligned
    /// atomic, missing `LOCAL_WRITE`, ...), [`crate::Error::Verb`] naming
    /// `ibv_post_send` (e.g. `EINVAL` in a state that cannot send, `ENOMEM`
    /// when the send queue is full).
    pub fn post_send(&mut self, wr: SendWr) -> std::result::Result<(), PostError> {
        if wr.buffers.len() > SHORT {
            return self.post_send_batch(std::iter::once(wr));
        }
        if let Err(error) = self.check_send_wr(&wr) {
            return Err(PostError {
                error,
                returned: vec![(wr.wr_id, wr.buffers)],
            });
        }
        // The scatter list, on the stack, written only as far as it goes.
        let one;
        let mut many;
        let sges: &[ffi::ibv_sge] = match (&wr.buffers, wr.buffers.single()) {
            (_, Some(m)) => {
                one = m.sge();
                std::slice::from_ref(&one)
            }
            (WrBuffers::Many(v), None) => {
                many = [ffi::ibv_sge::default(); SHORT];
                for (s, m) in many.iter_mut().zip(v) {
                    *s = m.sge();
                }
                &many[..v.len()]
            }
            (WrBuffers::Device(d), None) => {
                one = d.sge();
                std::slice::from_ref(&one)
            }
            _ => &[],
        };
        // SAFETY: `&mut self`: the only poster to this QP's send queue, which
        // pushes at most the count given; the QP holds its CQs.
        let mut ring = unsafe { self.owned.tracker.producer(false, 1) };
        let req = Outgoing {
            op: Op::Send(&wr.op),
            flags: wr.flags,
            ud: wr.ud.as_ref(),
            xrc_srqn: wr.xrc_srqn,
            sges,
            inline: false,
        };
        let (rc, _) = self.submit(std::slice::from_ref(&req), &ring);
        if rc != 0 {
            drop(ring);
            return Err(self.not_posted("ibv_post_send", rc, (wr.wr_id, wr.buffers)));
        }
        ring.push(Pending::send(wr));
        Ok(())
    }

    /// Posts several send requests with one doorbell.
    ///
    /// # Errors
    /// As [`QueuePair::post_send`]; requests not posted come back in
    /// [`PostError::returned`], in order.
    pub fn post_send_batch(
        &mut self,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> std::result::Result<(), PostError> {
        let wrs: Vec<SendWr> = wrs.into_iter().collect();
        let give_back = |wrs: Vec<SendWr>, error| PostError {
            error,
            returned: wrs.into_iter().map(|w| (w.wr_id, w.buffers)).collect(),
        };
        if let Some(error) = wrs.iter().find_map(|w| self.check_send_wr(w).err()) {
            return Err(give_back(wrs, error));
        }
        if wrs.is_empty() {
            return Ok(());
        }
        let mut sges: Vec<ffi::ibv_sge> = Vec::new();
        let mut sge_at = Vec::with_capacity(wrs.len());
        for w in &wrs {
            sge_at.push((sges.len(), w.buffers.len()));
            w.buffers.for_each_sge(|s| sges.push(s));
        }
        let reqs: Vec<Outgoing<'_>> = wrs
            .iter()
            .zip(&sge_at)
            .map(|(w, &(at, n))| Outgoing {
                op: Op::Send(&w.op),
                flags: w.flags,
                ud: w.ud.as_ref(),
                xrc_srqn: w.xrc_srqn,
                sges: &sges[at..at + n],
                inline: false,
            })
            .collect();
        // SAFETY: `&mut self`: the only poster to this QP's send queue, which
        // pushes at most the count given; the QP holds its CQs.
        let mut ring = unsafe { self.owned.tracker.producer(false, reqs.len()) };
        let (rc, posted) = self.submit(&reqs, &ring);
        drop(reqs);
        let mut rest = wrs;
        let unposted = rest.split_off(posted);
        for w in rest {
            ring.push(Pending::send(w));
        }
        drop(ring);
        if rc == 0 {
            return Ok(());
        }
        let qpn = self.qp_num();
        let total = posted + unposted.len();
        let err = check_errno_ret(
            "ibv_post_send",
            || {
                format!(
                    "QP {qpn}: {} of {total} requests not posted",
                    unposted.len()
                )
                .into()
            },
            rc,
        )
        .expect_err("rc != 0");
        Err(give_back(unposted, err))
    }

    /// Posts a send whose data is copied at post time (`IBV_SEND_INLINE`).
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] when the data exceeds
    /// `max_inline_data`, [`crate::Error::Verb`] naming `ibv_post_send`.
    pub fn post_send_inline(&mut self, wr: InlineSend<'_>) -> Result<()> {
        self.check_inline(&wr)?;
        let sge = ffi::ibv_sge {
            addr: wr.data.as_ptr() as u64,
            length: wr.data.len() as u32,
            lkey: 0,
        };
        let n = usize::from(!wr.data.is_empty());
        // SAFETY: `&mut self`: the only poster to this QP's send queue, which
        // pushes at most the count given; the QP holds its CQs.
        let mut ring = unsafe { self.owned.tracker.producer(false, 1) };
        let req = Outgoing {
            op: Op::Send(&wr.op),
            flags: wr.flags,
            ud: wr.ud.as_ref(),
            xrc_srqn: wr.xrc_srqn,
            sges: &std::slice::from_ref(&sge)[..n],
            inline: true,
        };
        // The data is copied by the provider during the submit.
        let (rc, _) = self.submit(std::slice::from_ref(&req), &ring);
        if rc == 0 {
            ring.push(Pending {
                wr_id: wr.wr_id,
                buffers: WrBuffers::None,
                _ah: wr.ud.map(|d| d.ah),
                _bind: None,
            });
        }
        drop(ring);
        check_errno_ret("ibv_post_send", || self.ctx_str("inline send"), rc)
    }

    /// Hands checked requests to the provider on the QP's path: the one
    /// place that calls `ibv_post_send` or `ibv_wr_*` for them. Returns the
    /// errno (0 when all were posted) and how many, from the first, were.
    /// The caller holds the requests' memory and parks the posted ones
    /// through `ring` (whose ids the requests get) before publishing it.
    #[inline(always)]
    pub(super) fn submit(&self, reqs: &[Outgoing<'_>], ring: &Producer<'_>) -> (c_int, usize) {
        let (widest, inline) = match reqs {
            [r] => (r.sges.len(), r.inline),
            _ => (
                reqs.iter().map(|r| r.sges.len()).max().unwrap_or(0),
                reqs.iter().any(|r| r.inline),
            ),
        };
        match self.path.extended(widest, inline) {
            Some(q) => Self::submit_extended(q, reqs, ring),
            None => self.submit_legacy(reqs, ring),
        }
    }

    /// `ibv_post_send` over a chain built from `reqs`.
    #[inline]
    fn submit_legacy(&self, reqs: &[Outgoing<'_>], ring: &Producer<'_>) -> (c_int, usize) {
        // One request (the common case) needs no heap.
        let mut single = [ffi::ibv_send_wr::default()];
        let mut many: Vec<ffi::ibv_send_wr> = Vec::new();
        let raw: &mut [ffi::ibv_send_wr] = if reqs.len() == 1 {
            &mut single
        } else {
            many.resize_with(reqs.len(), Default::default);
            &mut many
        };
        for (i, (r, w)) in reqs.iter().zip(raw.iter_mut()).enumerate() {
            let mut flags = r.flags;
            flags.set(SendFlags::INLINE, r.inline);
            w.wr_id = ring.wr_id(i as u32);
            w.sg_list = if r.sges.is_empty() {
                std::ptr::null_mut()
            } else {
                // The provider only reads the list.
                r.sges.as_ptr().cast_mut()
            };
            w.num_sge = r.sges.len() as c_int;
            w.send_flags = flags.bits();
            fill_request(w, r);
        }
        let base = link(raw);
        let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: a well-formed chain on this live QP whose SGEs point into
        // memory the caller holds until it is parked (a poll that sees a
        // completion first waits for the producer to publish it).
        let rc = unsafe { ffi::ibv_post_send(self.as_raw(), base, &mut bad) };
        (rc, posted(rc, base, bad, reqs.len()))
    }

    /// The `ibv_wr_*` path: all requests or none.
    fn submit_extended(
        x: &ExtendedQp,
        reqs: &[Outgoing<'_>],
        ring: &Producer<'_>,
    ) -> (c_int, usize) {
        // SAFETY: `&mut` of the QP is held by the caller's producer, and
        // every SGE points into memory the caller holds; inline data is
        // copied by the provider.
        let rc = unsafe { x.post(reqs, |i| ring.wr_id(i as u32)) };
        (rc, if rc == 0 { reqs.len() } else { 0 })
    }

    /// The provider refused a single request (`rc`, an errno value, not 0):
    /// the error naming `verb`, and the request's memory back.
    #[cold]
    pub(super) fn not_posted(
        &self,
        verb: &'static str,
        rc: c_int,
        req: (u64, WrBuffers),
    ) -> PostError {
        let error = check_errno_ret(verb, || self.ctx_str("1 request not posted"), rc)
            .expect_err("rc != 0");
        PostError {
            error,
            returned: vec![req],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_send_path_is_chosen_per_post_only_by_what_the_qp_was_built_with() {
        let provider = super::super::wr_ops::tests::FakeProvider::new();
        let x = || provider.extended();
        let q = x().as_ptr();
        let via = |p: &SendPath, sges, inline| p.extended(sges, inline).map(|x| x.as_ptr());
        assert_eq!(via(&SendPath::Legacy, 1, false), None);
        assert_eq!(via(&SendPath::Extended(x()), 4, true), Some(q));
        // Auto: one scatter entry or none through ibv_wr_*, the rest legacy.
        assert_eq!(via(&SendPath::Mixed(x()), 1, false), Some(q));
        assert_eq!(via(&SendPath::Mixed(x()), 0, false), Some(q));
        assert_eq!(via(&SendPath::Mixed(x()), 2, false), None);
        assert_eq!(via(&SendPath::Mixed(x()), 1, true), None);
    }
}
