//! Prepared sends: a request checked once and posted again and again, each
//! time with a new region, written in place into the same C request.

use super::send::{fill_request, Outgoing};
use super::{QpType, QueuePair};
use crate::error::Result;
use crate::mr::AccessFlags;
use crate::track::Pending;
use crate::wr::{PostError, PreparedSend, SendFlags, SendOp, UdDest, WrBuffers};
use crate::{ffi, MemoryRegion};

impl QueuePair {
    /// Checks a send request once, for [`QueuePair::post_prepared`] to post
    /// again and again with one region each time.
    ///
    /// For RC and UC QPs (UD: [`QueuePair::prepare_send_ud`]; a request to
    /// an XRC SRQ goes through [`QueuePair::post_send`]); any operation that
    /// takes memory, with
    /// `flags` (`SIGNALED`, `FENCE`, `SOLICITED`; not `INLINE`). A remote
    /// range bounds the regions it may be posted with, an atomic takes an
    /// 8-byte region.
    ///
    /// ```no_run
    /// # fn f(qp: &mut rdma::QueuePair, cq: &rdma::CompletionQueue, mut mr: rdma::MemoryRegion,
    /// #      remote: rdma::RemoteMemory) -> Result<(), Box<dyn std::error::Error>> {
    /// use rdma::{SendFlags, SendOp};
    /// let mut write = qp.prepare_send(SendOp::Write(remote), SendFlags::SIGNALED)?;
    /// for i in 0..1000 {
    ///     mr.write_at(0, &[i as u8])?;
    ///     qp.post_prepared(&mut write, i, mr)
    ///         .map_err(rdma::PostError::drop_buffers)?;
    ///     let done = loop {
    ///         if let Some(c) = cq.poll_one()? {
    ///             break c.ok()?;
    ///         }
    ///     };
    ///     mr = done.buffers.into_one().expect("the region comes back");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) naming `ibv_post_send` for a request
    /// [`QueuePair::post_send`] would refuse whatever the region, or that
    /// has no region to take.
    pub fn prepare_send(&self, op: SendOp, flags: SendFlags) -> Result<PreparedSend> {
        if !self.plain_sends {
            return Err(self.invalid(format!(
                "a prepared send needs an RC or UC QP with a send scatter entry; QP {} is {:?} \
                 with max_send_sge {} (use prepare_send_ud for UD, post_send otherwise)",
                self.qp_num(),
                self.qp_type,
                self.caps.max_send_sge
            )));
        }
        self.prepare(op, flags, None)
    }

    /// [`QueuePair::prepare_send`] for a UD QP: every post goes to
    /// `remote_qpn` (Q_Key `remote_qkey`) through `ah`, which the request
    /// keeps alive, as does every post in flight. A SEND (with or without
    /// immediate data) of at most the path MTU.
    ///
    /// # Errors
    /// As [`QueuePair::prepare_send`]; [`Error::InvalidArgument`](crate::Error::InvalidArgument) also for a
    /// QP that is not UD.
    pub fn prepare_send_ud(
        &self,
        op: SendOp,
        flags: SendFlags,
        ah: &crate::AddressHandle,
        remote_qpn: u32,
        remote_qkey: u32,
    ) -> Result<PreparedSend> {
        if self.qp_type != QpType::Ud || self.caps.max_send_sge == 0 {
            return Err(self.invalid(format!(
                "prepare_send_ud needs a UD QP with a send scatter entry; QP {} is {:?} \
                 with max_send_sge {} (use prepare_send)",
                self.qp_num(),
                self.qp_type,
                self.caps.max_send_sge
            )));
        }
        let dest = UdDest {
            ah: ah.clone(),
            remote_qpn,
            remote_qkey,
        };
        self.prepare(op, flags, Some(dest))
    }

    /// The checks and the template of [`QueuePair::prepare_send`] and
    /// [`QueuePair::prepare_send_ud`] (which checked the QP type).
    fn prepare(&self, op: SendOp, flags: SendFlags, ud: Option<UdDest>) -> Result<PreparedSend> {
        if flags.contains(SendFlags::INLINE) {
            return Err(self.invalid(
                "a prepared send posts a region; inline data goes through post_send_inline".into(),
            ));
        }
        if matches!(op, SendOp::LocalInvalidate(_)) {
            return Err(
                self.invalid("a local invalidate takes no memory: post it with post_send".into())
            );
        }
        let (min_len, max_len) = if op.is_atomic() {
            (8, 8)
        } else {
            let remote = op.remote().map_or(u64::MAX, |r| r.len);
            (
                0,
                usize::try_from(remote.min(u64::from(u32::MAX))).unwrap_or(usize::MAX),
            )
        };
        self.check_send(&op, min_len as u64, &ud, None)?;
        let mut raw = ffi::ibv_send_wr {
            num_sge: 1,
            send_flags: flags.bits(),
            ..Default::default()
        };
        fill_request(&mut raw, &Outgoing::prepared(&op, flags, ud.as_ref()));
        Ok(PreparedSend {
            raw,
            sge: ffi::ibv_sge::default(),
            op,
            flags,
            ud,
            serial: self.owned.tracker.serial(),
            min_len,
            max_len,
        })
    }

    /// Posts the request `p` ([`QueuePair::prepare_send`]) with `mr` as its
    /// one scatter entry, under the caller's `wr_id`: what
    /// [`QueuePair::post_send`] does with the same request, with only the
    /// checks that depend on the region (its PD, its length, `LOCAL_WRITE`
    /// where the device writes it). The region comes back with the
    /// completion.
    ///
    /// The region moves into the queue, as with [`QueuePair::post_send`]:
    ///
    /// ```compile_fail
    /// # fn f(qp: &mut rdma::QueuePair, p: &mut rdma::PreparedSend, mr: rdma::MemoryRegion) {
    /// qp.post_prepared(p, 1, mr).unwrap();
    /// let _ = mr.len(); // moved into the send queue
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`QueuePair::post_send`], with the region in
    /// [`PostError::returned`]; [`Error::InvalidArgument`](crate::Error::InvalidArgument) also when `p` was
    /// prepared by another QP.
    #[inline]
    pub fn post_prepared(
        &mut self,
        p: &mut PreparedSend,
        wr_id: u64,
        mr: MemoryRegion,
    ) -> std::result::Result<(), PostError> {
        self.post_prepared_with(p, wr_id, WrBuffers::One(mr))
    }

    /// [`QueuePair::post_prepared`] with a region shared with other
    /// requests and holders ([`WrBuffers::Shared`]): for SENDs and RDMA
    /// WRITEs, which the device only reads; this request holds one reference
    /// until its completion gives it back.
    ///
    /// # Errors
    /// As [`QueuePair::post_prepared`]; [`Error::InvalidArgument`](crate::Error::InvalidArgument) also when
    /// the prepared operation writes local memory (RDMA READ, atomics).
    #[inline]
    pub fn post_prepared_shared(
        &mut self,
        p: &mut PreparedSend,
        wr_id: u64,
        mr: std::sync::Arc<MemoryRegion>,
    ) -> std::result::Result<(), PostError> {
        self.post_prepared_with(p, wr_id, WrBuffers::Shared(mr))
    }

    /// The body of both: `buffers` is `One` or `Shared` (anything else is
    /// refused with the full checks' reason).
    #[inline(always)]
    fn post_prepared_with(
        &mut self,
        p: &mut PreparedSend,
        wr_id: u64,
        buffers: WrBuffers,
    ) -> std::result::Result<(), PostError> {
        let Some(mr) = buffers.single() else {
            return Err(self.prepared_refused(p, wr_id, buffers));
        };
        let len = mr.len();
        let max = self.max_msg.load(std::sync::atomic::Ordering::Relaxed) as usize;
        // (The QP's kind again: serials wrap after 2^30 QPs, and a template
        // checked for an RC QP must never reach a UD one, nor the reverse.)
        if p.serial != self.owned.tracker.serial()
            || !(if p.ud.is_some() {
                self.qp_type == QpType::Ud
            } else {
                self.plain_sends
            })
            || len < p.min_len
            || len > p.max_len
            || (max != 0 && len > max)
            || mr.pd().as_raw() != self.pd.as_raw()
            || (p.op.writes_local()
                && (buffers.is_shared() || !mr.access().contains(AccessFlags::LOCAL_WRITE)))
        {
            return Err(self.prepared_refused(p, wr_id, buffers));
        }
        let sge = mr.sge();
        // SAFETY: `&mut self`: the only poster to this QP's send queue.
        let mut ring = unsafe { self.owned.tracker.producer(false) };
        let rc = match self.path.extended(1, false) {
            Some(x) => {
                let req = Outgoing::prepared(&p.op, p.flags, p.ud.as_ref());
                // SAFETY: `&mut self`: the only poster; the one SGE points
                // into `buffers`' region, parked in the tracker below.
                unsafe { x.post_one(&req, &sge, ring.wr_id(0)) }
            }
            None => {
                p.sge = sge;
                p.raw.wr_id = ring.wr_id(0);
                p.raw.sg_list = &mut p.sge;
                let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
                // SAFETY: a well-formed request (checked when prepared, the
                // region just now) whose one SGE points into `buffers`'
                // region, which is parked in the tracker below and published
                // when `ring` is dropped (a poll that sees the completion
                // first waits).
                unsafe { ffi::ibv_post_send(self.as_raw(), &mut p.raw, &mut bad) }
            }
        };
        if rc != 0 {
            drop(ring);
            return Err(self.not_posted("ibv_post_send", rc, (wr_id, buffers)));
        }
        ring.push(Pending {
            wr_id,
            buffers,
            _ah: p.ud.as_ref().map(|d| d.ah.clone()),
            _mw: None,
        });
        Ok(())
    }

    /// Why [`QueuePair::post_prepared`] refused `buffers` (the full checks of
    /// [`QueuePair::post_send`] explain it).
    #[cold]
    fn prepared_refused(&self, p: &PreparedSend, wr_id: u64, buffers: WrBuffers) -> PostError {
        let error = if p.serial != self.owned.tracker.serial() {
            self.invalid(format!(
                "the request was prepared by another QP than QP {}",
                self.qp_num()
            ))
        } else {
            let len = Self::total_len(&buffers);
            match self
                .check_buffers(&buffers, 1, p.op.writes_local(), "ibv_post_send")
                .and_then(|()| self.check_send(&p.op, len, &p.ud, None))
            {
                Err(e) => e,
                Ok(()) => self.invalid(format!(
                    "a {len}-byte region, but the prepared {:?} takes {} to {} bytes",
                    p.op, p.min_len, p.max_len
                )),
            }
        };
        PostError {
            error,
            returned: vec![(wr_id, buffers)],
        }
    }
}
