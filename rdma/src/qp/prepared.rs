//! Prepared sends: a request checked once, which owns one region for its
//! whole life and lends a range of it to each post, written in place into
//! the same C request.
//!
//! A post moves no memory: the send queue's entry for it holds the caller's
//! `wr_id` and nothing to drop, and its completion hands nothing back. The
//! region stays valid for the device until the last send that lent it is
//! done, whatever the caller drops: a prepared request dropped while a send
//! is in flight hands its region (and a UD request's address handle) to the
//! QP's tracker, which releases it once the send queue has passed that send
//! (a completion polled, the QP reset or destroyed).
//!
//! An inline prepared request ([`QueuePair::prepare_inline`]) owns no
//! region: each post hands the provider the caller's bytes, which it copies
//! during the post, so nothing is lent at all; its target address and
//! immediate data may change between posts ([`PreparedSend::set_remote`],
//! [`PreparedSend::set_imm`]), a remote range the peer may refuse but never
//! local memory.

use std::sync::Arc;

use super::outgoing::{fill_request, Op, Outgoing};
use super::wr_ops::Direct;
use super::{QpType, QueuePair};
use crate::error::{Error, Result};
use crate::track::{Orphan, QpTracker};
use crate::wr::{SendFlags, SendOp, UdDest, WrBuffers, SHARED_IS_READ_ONLY};
use crate::{ffi, RemoteMemory};

/// A send request checked once, which owns its region and is posted again
/// and again with a range of it ([`QueuePair::prepare_send`],
/// [`QueuePair::post_prepared`]): what a latency loop or a bandwidth loop
/// does, without building and checking the whole request, nor moving
/// memory, on every post.
///
/// It belongs to the QP that prepared it. Its region is lent to the device
/// by every post: while a send may be in flight, the bytes are reached only
/// through [`PreparedSend::read_at`] and [`PreparedSend::write_at`], which
/// copy word by word with atomic accesses (a torn value is possible, never
/// undefined behaviour); no slice of it is handed out.
/// [`PreparedSend::into_region`] gives the region back once nothing is in
/// flight. Dropped while a send is in flight, it hands the region to its QP,
/// which keeps it until that send is done.
///
/// ```no_run
/// # fn f(qp: &mut rdma::QueuePair, pd: &rdma::ProtectionDomain, peer: rdma::RemoteMemory)
/// #     -> rdma::Result<()> {
/// use rdma::{AccessFlags, PostError, SendFlags, SendOp};
/// let region = pd.alloc_mr(1 << 20, AccessFlags::empty())?;
/// // Checked once; each post lends a range of the region under the caller's
/// // `wr_id`, and nothing moves.
/// let mut write = qp
///     .prepare_send(SendOp::Write(peer), SendFlags::SIGNALED, region)
///     .map_err(PostError::drop_buffers)?;
/// qp.post_prepared(&mut write, 1, 0, 4096)?;
/// qp.post_prepared(&mut write, 2, 4096, 4096)?;
/// # Ok(()) }
/// ```
pub struct PreparedSend {
    /// The request as posted by the legacy path: each post writes `wr_id`
    /// and the scatter entry in place and hands this very struct to the
    /// provider. `next` is null; the UD address handle is null or that of
    /// `ud`; `sg_list` points at `sge` during a post and is not read outside
    /// one.
    raw: ffi::ibv_send_wr,
    sge: ffi::ibv_sge,
    op: SendOp,
    /// A UD request's destination; its address handle is kept alive here
    /// for every post in flight.
    ud: Option<UdDest>,
    /// The region (`One` or `Shared`), and its address, lkey and length;
    /// `None` for an inline request.
    region: WrBuffers,
    base: u64,
    lkey: u32,
    region_len: usize,
    /// Bytes a post may lend: `min_len` to `max_len` (8 and 8 for atomics;
    /// up to the remote range for RDMA, and to the region's length), whose
    /// difference `span` a post compares with once. An inline request:
    /// `min_len` `usize::MAX` and `span` 0, which no range passes (so
    /// [`QueuePair::post_prepared`] refuses it without a test of its own),
    /// and `max_len` the most bytes a post may carry.
    min_len: usize,
    max_len: usize,
    span: usize,
    /// The provider's calls for this request on the extended path, when it
    /// has them (see [`Direct`]); else the post goes through the QP's path.
    direct: Option<Direct>,
    /// The tracker of the QP it was checked for: its identity, and where
    /// the region goes if dropped while in flight.
    tracker: Arc<QpTracker>,
    /// Sequence number of the last send posted that lent the region
    /// (`None`: never posted, or inline).
    last: Option<u32>,
    /// An inline request ([`QueuePair::prepare_inline`]), and the most
    /// bytes the QP takes inline (0 for a request with a region).
    inline: bool,
    inline_limit: usize,
}

// SAFETY: of the pointers in `raw`, `next` is null, the UD address handle is
// null or that of `ud` (an `AddressHandle`, which is Send and Sync, kept
// alive by this struct), and `sg_list` is only dereferenced (by the provider)
// inside a post, which sets it to this struct's own `sge` first; `direct`'s
// QP and functions are used only by a post to that QP, which holds it
// mutably; the region and the tracker are Send and Sync; the struct is plain
// data otherwise.
unsafe impl Send for PreparedSend {}
// SAFETY: as above; only a post changes it, through `&mut PreparedSend`, and
// `&self` methods only read the region with atomic copies.
unsafe impl Sync for PreparedSend {}

impl std::fmt::Debug for PreparedSend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedSend")
            .field("op", &self.op)
            .field("flags", &self.flags())
            .field("ud", &self.ud)
            .field("region_len", &self.region_len)
            .field("len", &(self.min_len..=self.max_len))
            .field("in_flight", &self.in_flight())
            .field("inline", &self.inline)
            .finish_non_exhaustive()
    }
}

impl PreparedSend {
    /// The operation.
    pub fn op(&self) -> SendOp {
        self.op
    }

    /// The send flags of the next post.
    pub fn flags(&self) -> SendFlags {
        // Kept in the request alone: a copy beside it would cost a load and
        // a store per `set_signaled`.
        SendFlags::from_bits_retain(self.raw.send_flags)
    }

    /// Whether the next posts ask for a completion (`SIGNALED`), as a
    /// bandwidth loop does once every so many requests. An unsignaled send
    /// is done when a later signaled one of its queue completes.
    #[inline]
    pub fn set_signaled(&mut self, signaled: bool) {
        let mut flags = self.flags();
        flags.set(SendFlags::SIGNALED, signaled);
        self.raw.send_flags = flags.bits();
    }

    /// Whether the request is inline ([`QueuePair::prepare_inline`]): it
    /// owns no region, and each post carries its own bytes.
    pub fn is_inline(&self) -> bool {
        self.inline
    }

    /// Points the next posts of an inline RDMA WRITE (with or without
    /// immediate data) at `remote`: a post carries at most `remote.len`
    /// bytes. Only the peer's memory is named (its key and the device check
    /// it); a request with a region keeps the target it was prepared with.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a request that is not an inline RDMA
    /// WRITE.
    #[inline]
    pub fn set_remote(&mut self, remote: RemoteMemory) -> Result<()> {
        match &mut self.op {
            SendOp::Write(r) | SendOp::WriteWithImm(r, _) if self.inline => {
                *r = remote;
                self.raw.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                };
                self.max_len = self
                    .inline_limit
                    .min(usize::try_from(remote.len).unwrap_or(usize::MAX));
                Ok(())
            }
            _ => Err(self.not_inline("PreparedSend::set_remote", "an inline RDMA WRITE")),
        }
    }

    /// Sets the immediate data of the next posts of an inline request with
    /// immediate data (SEND or RDMA WRITE).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a request that is not inline or has
    /// no immediate data.
    #[inline]
    pub fn set_imm(&mut self, imm: u32) -> Result<()> {
        match &mut self.op {
            SendOp::SendWithImm(i) | SendOp::WriteWithImm(_, i) if self.inline => {
                *i = imm;
                self.raw.__bindgen_anon_1.imm_data = imm.to_be();
                Ok(())
            }
            _ => Err(self.not_inline(
                "PreparedSend::set_imm",
                "an inline request with immediate data",
            )),
        }
    }

    #[cold]
    fn not_inline(&self, verb: &'static str, what: &str) -> Error {
        Error::InvalidArgument {
            verb,
            reason: format!(
                "the request is {} {:?}, not {what}",
                if self.inline {
                    "an inline"
                } else {
                    "a region's"
                },
                self.op
            ),
        }
    }

    /// The length of the region.
    pub fn len(&self) -> usize {
        self.region_len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.region_len == 0
    }

    /// Whether a send posted from this request may still be in flight (its
    /// completion, or a later one of the QP's send queue, not polled yet).
    pub fn in_flight(&self) -> bool {
        self.last
            .is_some_and(|seq| self.tracker.send_in_flight(seq))
    }

    /// Copies bytes out of the region at `offset`, whatever is in flight:
    /// word by word with atomic loads, so a device or peer writing them
    /// meanwhile leaves a torn value in `out`, never undefined behaviour.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range does not fit.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        match self.region.single() {
            Some(m) => m.read_racy("PreparedSend::read_at", offset, out),
            None => Err(Error::InvalidArgument {
                verb: "PreparedSend::read_at",
                reason: "an inline request has no region".into(),
            }),
        }
    }

    /// Copies `data` into the region at `offset`, whatever is in flight:
    /// word by word with atomic stores, so a send reading them meanwhile
    /// may carry part of `data` only. Agree with the peer on what a message
    /// holds (write, then post).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range does not fit, or the region
    /// is shared ([`WrBuffers::Shared`]: its other holders may read it as a
    /// slice).
    #[inline]
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        match &mut self.region {
            WrBuffers::One(m) => m.write_racy(offset, data),
            WrBuffers::None => Err(Error::InvalidArgument {
                verb: "PreparedSend::write_at",
                reason: "an inline request has no region: each post carries its bytes".into(),
            }),
            _ => Err(Error::InvalidArgument {
                verb: "PreparedSend::write_at",
                reason: "the region is shared with other holders, who may read it as a slice: \
                         write it before sharing it"
                    .into(),
            }),
        }
    }

    /// Gives the region back (`One` or `Shared`, as prepared; `None` for an
    /// inline request), when no send that lent it is in flight; else the
    /// request itself comes back.
    ///
    /// # Errors
    /// The request, unchanged (boxed: it is large), while a send is in
    /// flight.
    pub fn into_region(mut self) -> std::result::Result<WrBuffers, Box<PreparedSend>> {
        if self.in_flight() {
            return Err(Box::new(self));
        }
        Ok(std::mem::take(&mut self.region))
    }
}

impl Drop for PreparedSend {
    fn drop(&mut self) {
        if let Some(seq) = self.last {
            if self.tracker.send_in_flight(seq) {
                let keep = (std::mem::take(&mut self.region), self.ud.take());
                self.tracker.adopt(Orphan {
                    seq,
                    recv: false,
                    keep: Box::new(keep),
                });
            }
        }
    }
}

impl QueuePair {
    /// Checks a send request once and gives it `region` for its whole
    /// life, for [`QueuePair::post_prepared`] to post again and again with
    /// a range of it.
    ///
    /// For RC and UC QPs (UD: [`QueuePair::prepare_send_ud`]; a request to
    /// an XRC SRQ goes through [`QueuePair::post_send`]); any operation that
    /// takes memory, with `flags` (`SIGNALED`, `FENCE`, `SOLICITED`; not
    /// `INLINE`). `region` is a [`MemoryRegion`](crate::MemoryRegion) (`One`) or, for SENDs and
    /// RDMA WRITEs, which the device only reads, an `Arc` of one shared with
    /// other holders (`Shared`). A remote range bounds the ranges a post may
    /// lend; an atomic lends 8 bytes.
    ///
    /// ```no_run
    /// # fn f(qp: &mut rdma::QueuePair, cq: &rdma::CompletionQueue, mr: rdma::MemoryRegion,
    /// #      remote: rdma::RemoteMemory) -> Result<(), Box<dyn std::error::Error>> {
    /// use rdma::{SendFlags, SendOp};
    /// let mut write = qp
    ///     .prepare_send(SendOp::Write(remote), SendFlags::SIGNALED, mr)
    ///     .map_err(rdma::PostError::drop_buffers)?;
    /// for i in 0..1000 {
    ///     write.write_at(0, &[i as u8])?;
    ///     qp.post_prepared(&mut write, i, 0, 1)?;
    ///     loop {
    ///         if let Some(c) = cq.poll_one()? {
    ///             c.ok()?;
    ///             break;
    ///         }
    ///     }
    /// }
    /// let _mr = write.into_region().expect("nothing in flight");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `ibv_post_send` for a request
    /// [`QueuePair::post_send`] would refuse with this region, with the
    /// region in [`PostError::returned`](crate::PostError::returned) (under
    /// `wr_id` 0).
    pub fn prepare_send(
        &self,
        op: SendOp,
        flags: SendFlags,
        region: impl Into<WrBuffers>,
    ) -> std::result::Result<PreparedSend, crate::PostError> {
        let region = region.into();
        if !super::builder::sends_plainly(self.qp_type, self.caps.max_send_sge) {
            let e = self.invalid(format!(
                "a prepared send needs an RC or UC QP with a send scatter entry; QP {} is {:?} \
                 with max_send_sge {} (use prepare_send_ud for UD, post_send otherwise)",
                self.qp_num(),
                self.qp_type,
                self.caps.max_send_sge
            ));
            return Err(refused(e, region));
        }
        self.prepare(op, flags, None, region)
    }

    /// [`QueuePair::prepare_send`] for a UD QP: every post goes to
    /// `remote_qpn` (Q_Key `remote_qkey`) through `ah`, which the request
    /// keeps alive, as long as a send of it is in flight. A SEND (with or
    /// without immediate data) of at most the path MTU.
    ///
    /// # Errors
    /// As [`QueuePair::prepare_send`]; also for a QP that is not UD.
    pub fn prepare_send_ud(
        &self,
        op: SendOp,
        flags: SendFlags,
        ah: &crate::AddressHandle,
        remote_qpn: u32,
        remote_qkey: u32,
        region: impl Into<WrBuffers>,
    ) -> std::result::Result<PreparedSend, crate::PostError> {
        let region = region.into();
        if self.qp_type != QpType::Ud || self.caps.max_send_sge == 0 {
            let e = self.invalid(format!(
                "prepare_send_ud needs a UD QP with a send scatter entry; QP {} is {:?} \
                 with max_send_sge {} (use prepare_send)",
                self.qp_num(),
                self.qp_type,
                self.caps.max_send_sge
            ));
            return Err(refused(e, region));
        }
        let dest = UdDest {
            ah: ah.clone(),
            remote_qpn,
            remote_qkey,
        };
        self.prepare(op, flags, Some(dest), region)
    }

    /// The checks and the template of [`QueuePair::prepare_send`] and
    /// [`QueuePair::prepare_send_ud`] (which checked the QP type).
    fn prepare(
        &self,
        op: SendOp,
        flags: SendFlags,
        ud: Option<UdDest>,
        region: WrBuffers,
    ) -> std::result::Result<PreparedSend, crate::PostError> {
        let checked = (|| {
            if flags.contains(SendFlags::INLINE) {
                return Err(self.invalid(
                    "a prepared send posts a region; inline data goes through post_send_inline"
                        .into(),
                ));
            }
            if matches!(op, SendOp::LocalInvalidate(_)) {
                return Err(self
                    .invalid("a local invalidate takes no memory: post it with post_send".into()));
            }
            let Some(mr) = region.single() else {
                return Err(self.invalid(
                    "a prepared send owns one region: WrBuffers::One or WrBuffers::Shared".into(),
                ));
            };
            if op.writes_local() && region.is_shared() {
                return Err(self.invalid(SHARED_IS_READ_ONLY.into()));
            }
            if op.writes_local() && self.end_padding {
                return Err(self.invalid(
                    "a prepared request the device writes into, on a QP built with \
                     PCI_WRITE_END_PADDING (each post's range would need its end aligned): \
                     use post_send"
                        .into(),
                ));
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
            // No post lends more than the region either.
            let max_len = max_len.min(mr.len());
            if mr.len() < min_len {
                return Err(self.invalid(format!(
                    "a {}-byte region, but the prepared {op:?} lends {min_len} bytes",
                    mr.len()
                )));
            }
            // The region's PD and access, with one range of the smallest
            // length the request lends (the post checks each length).
            self.check_buffers(&region, 1, op.writes_local(), "ibv_post_send")?;
            self.check_send(&op, (1, min_len as u64), &ud, None)?;
            Ok((min_len, max_len, mr.addr(), mr.lkey(), mr.len()))
        })();
        let (min_len, max_len, base, lkey, region_len) = match checked {
            Ok(c) => c,
            Err(e) => return Err(refused(e, region)),
        };
        let mut raw = ffi::ibv_send_wr {
            num_sge: 1,
            send_flags: flags.bits(),
            ..Default::default()
        };
        fill_request(&mut raw, &Outgoing::prepared(&op, flags, ud.as_ref()));
        let direct = match (&ud, self.path.extended(1, false)) {
            (None, Some(x)) => x.direct(&op),
            _ => None,
        };
        Ok(PreparedSend {
            raw,
            sge: ffi::ibv_sge::default(),
            op,
            ud,
            region,
            base,
            lkey,
            region_len,
            min_len,
            max_len,
            span: max_len - min_len,
            direct,
            tracker: Arc::clone(&self.owned.tracker),
            last: None,
            inline: false,
            inline_limit: 0,
        })
    }

    /// Posts the request `p` ([`QueuePair::prepare_send`]) with the `len`
    /// bytes of its region at `offset` as its one scatter entry, under the
    /// caller's `wr_id`: what [`QueuePair::post_send`] does with the same
    /// request, with only the checks that depend on the range. Nothing
    /// moves: the completion carries the `wr_id`, and the region stays with
    /// `p`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `ibv_post_send` for a range outside
    /// the region or of a length the request does not take, or a request
    /// another QP prepared; [`Error::Verb`] as for [`QueuePair::post_send`]
    /// (e.g. `ENOMEM` when the send queue is full).
    #[inline(always)]
    pub fn post_prepared(
        &mut self,
        p: &mut PreparedSend,
        wr_id: u64,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        let max = self.max_msg.load(std::sync::atomic::Ordering::Relaxed) as usize;
        // `len` in `min_len..=max_len` (so at most the region's length),
        // and the range inside the region.
        if !Arc::ptr_eq(&p.tracker, &self.owned.tracker)
            || len.wrapping_sub(p.min_len) > p.span
            || len > max
            || offset > p.region_len - len
        {
            return Err(self.prepared_refused(p, offset, len));
        }
        let sge = ffi::ibv_sge {
            addr: p.base + offset as u64,
            // At most `max_len`, which is at most u32::MAX.
            length: len as u32,
            lkey: p.lkey,
        };
        // SAFETY: `&mut self`: the only poster to this QP's send queue, which
        // pushes at most the count given; the QP holds its CQs.
        let mut ring = unsafe { self.owned.tracker.producer(false, 1) };
        let ours = ring.wr_id(0);
        let rc = if let Some(d) = &p.direct {
            // SAFETY: `&mut self`: the only poster; `p` was prepared by this
            // QP (checked above), which is live; the one SGE as below.
            unsafe { d.post(p.raw.send_flags, &sge, ours) }
        } else if let Some(x) = self.path.extended(1, false) {
            let req = Outgoing::prepared(&p.op, p.flags(), p.ud.as_ref());
            // SAFETY: `&mut self`: the only poster; the one SGE points
            // into `p`'s region, which `p` keeps (or hands to the
            // tracker) until the send is done.
            unsafe { x.post_one(&req, &sge, ours) }
        } else {
            p.sge = sge;
            p.raw.wr_id = ours;
            p.raw.sg_list = &mut p.sge;
            let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
            // SAFETY: a well-formed request (checked when prepared, the
            // range just now) whose one SGE points into `p`'s region,
            // kept as above; the entry is published when `ring` is
            // dropped (a poll that sees the completion first waits).
            unsafe { ffi::ibv_post_send(self.as_raw(), &mut p.raw, &mut bad) }
        };
        if rc != 0 {
            drop(ring);
            return Err(self
                .not_posted("ibv_post_send", rc, (wr_id, WrBuffers::None))
                .error);
        }
        ring.push_quiet(wr_id);
        p.last = Some(ours as u32);
        Ok(())
    }

    /// Checks an inline send request once (`SEND` or RDMA WRITE, with or
    /// without immediate data; `flags` as for
    /// [`QueuePair::prepare_send`], `INLINE` implied), for
    /// [`QueuePair::post_prepared_inline`] to post again and again with the
    /// caller's bytes: what [`QueuePair::post_send_inline`] does for the
    /// same request, without building and checking it, nor recording more
    /// than its `wr_id`, on every post. It owns no region; the provider
    /// copies each post's bytes during the post. An RDMA WRITE's target and
    /// the immediate data may change between posts
    /// ([`PreparedSend::set_remote`], [`PreparedSend::set_imm`]).
    ///
    /// For RC and UC QPs.
    ///
    /// ```no_run
    /// # fn f(qp: &mut rdma::QueuePair, peer: rdma::RemoteMemory) -> rdma::Result<()> {
    /// use rdma::{SendFlags, SendOp};
    /// let mut write = qp.prepare_inline(SendOp::WriteWithImm(peer, 0), SendFlags::SIGNALED)?;
    /// for i in 0..4u32 {
    ///     let at = u64::from(i) * 8;
    ///     write.set_remote(rdma::RemoteMemory { addr: peer.addr + at, len: 8, ..peer })?;
    ///     write.set_imm(i)?;
    ///     qp.post_prepared_inline(&mut write, u64::from(i), &[i as u8; 8])?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `ibv_post_send` for another QP type
    /// or operation, or a request [`QueuePair::post_send_inline`] would
    /// refuse with no data.
    pub fn prepare_inline(&self, op: SendOp, flags: SendFlags) -> Result<PreparedSend> {
        if !matches!(self.qp_type, QpType::Rc | QpType::Uc) {
            return Err(self.invalid(format!(
                "a prepared inline send needs an RC or UC QP; QP {} is {:?} (use post_send_inline)",
                self.qp_num(),
                self.qp_type
            )));
        }
        if !matches!(
            op,
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::Write(_) | SendOp::WriteWithImm(..)
        ) {
            return Err(self.invalid(format!(
                "only SEND and RDMA WRITE can be inline, not {op:?}"
            )));
        }
        self.check_send(&op, (0, 0), &None, None)?;
        let limit = self.caps.max_inline_data as usize;
        let flags = flags | SendFlags::INLINE;
        let mut raw = ffi::ibv_send_wr {
            send_flags: flags.bits(),
            ..Default::default()
        };
        fill_request(&mut raw, &Outgoing::prepared(&op, flags, None));
        let max_len = match op.remote() {
            Some(r) => limit.min(usize::try_from(r.len).unwrap_or(usize::MAX)),
            None => limit,
        };
        Ok(PreparedSend {
            raw,
            sge: ffi::ibv_sge::default(),
            op,
            ud: None,
            region: WrBuffers::None,
            base: 0,
            lkey: 0,
            region_len: 0,
            min_len: usize::MAX,
            max_len,
            span: 0,
            direct: None,
            tracker: Arc::clone(&self.owned.tracker),
            last: None,
            inline: true,
            inline_limit: limit,
        })
    }

    /// Posts the inline request `p` ([`QueuePair::prepare_inline`]) with
    /// `data` under the caller's `wr_id`: the provider copies `data` during
    /// the call (nothing is lent), and the send queue's entry holds the
    /// `wr_id` alone.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `ibv_post_send` for more bytes than
    /// the QP takes inline or the RDMA WRITE's remote range holds, a request
    /// with a region, or one another QP prepared; [`Error::Verb`] as for
    /// [`QueuePair::post_send_inline`] (e.g. `ENOMEM` when the send queue is
    /// full).
    #[inline(always)]
    pub fn post_prepared_inline(
        &mut self,
        p: &mut PreparedSend,
        wr_id: u64,
        data: &[u8],
    ) -> Result<()> {
        let max = self.max_msg.load(std::sync::atomic::Ordering::Relaxed) as usize;
        // `max_len` bounds an inline request's post (0 for one with a
        // region, whose posts lend it).
        if !Arc::ptr_eq(&p.tracker, &self.owned.tracker)
            || !p.inline
            || data.len() > p.max_len
            || data.len() > max
        {
            return Err(self.inline_refused(p, data.len()));
        }
        let sge = ffi::ibv_sge {
            addr: data.as_ptr() as u64,
            // At most the QP's inline limit, a u32.
            length: data.len() as u32,
            lkey: 0,
        };
        let n = usize::from(!data.is_empty());
        // SAFETY: `&mut self`: the only poster to this QP's send queue, which
        // pushes at most the count given; the QP holds its CQs.
        let mut ring = unsafe { self.owned.tracker.producer(false, 1) };
        let ours = ring.wr_id(0);
        let rc = if let Some(x) = self.path.extended(n, true) {
            let req = Outgoing {
                op: Op::Send(&p.op),
                flags: p.flags(),
                ud: None,
                xrc_srqn: None,
                sges: &std::slice::from_ref(&sge)[..n],
                inline: true,
            };
            // SAFETY: `&mut self`: the only poster; the inline data is
            // copied by the provider during the call.
            unsafe { x.post(std::slice::from_ref(&req), |_| ours) }
        } else {
            p.sge = sge;
            p.raw.wr_id = ours;
            p.raw.sg_list = &mut p.sge;
            p.raw.num_sge = n as std::ffi::c_int;
            let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
            // SAFETY: a well-formed inline request (checked when prepared,
            // the length just now) whose one SGE points at `data`, which the
            // provider copies during the call (`sge` is read only inside a
            // post); the entry is published when `ring` is dropped.
            unsafe { ffi::ibv_post_send(self.as_raw(), &mut p.raw, &mut bad) }
        };
        if rc != 0 {
            drop(ring);
            return Err(self
                .not_posted("ibv_post_send", rc, (wr_id, WrBuffers::None))
                .error);
        }
        // Nothing to keep: the bytes were copied.
        ring.push_quiet(wr_id);
        Ok(())
    }

    /// Why [`QueuePair::post_prepared_inline`] refused a post.
    #[cold]
    fn inline_refused(&self, p: &PreparedSend, len: usize) -> Error {
        if !Arc::ptr_eq(&p.tracker, &self.owned.tracker) {
            return self.invalid(format!(
                "the request was prepared by another QP than QP {}",
                self.qp_num()
            ));
        }
        if !p.inline {
            return self.invalid(
                "the request lends a region: post it with post_prepared (prepare_inline makes \
                 an inline one)"
                    .into(),
            );
        }
        if len > p.inline_limit {
            return self.invalid(format!(
                "{len} bytes of inline data, but QP {} allows {}",
                self.qp_num(),
                p.inline_limit
            ));
        }
        match self.check_send(&p.op, (1, len as u64), &None, None) {
            Err(e) => e,
            Ok(()) => self.invalid(format!(
                "{len} bytes, but the prepared {:?} takes at most {}",
                p.op, p.max_len
            )),
        }
    }

    /// Why [`QueuePair::post_prepared`] refused a range.
    #[cold]
    fn prepared_refused(&self, p: &PreparedSend, offset: usize, len: usize) -> Error {
        if !Arc::ptr_eq(&p.tracker, &self.owned.tracker) {
            return self.invalid(format!(
                "the request was prepared by another QP than QP {}",
                self.qp_num()
            ));
        }
        if p.inline {
            return self.invalid(
                "an inline request carries its bytes: post it with post_prepared_inline".into(),
            );
        }
        if offset.checked_add(len).is_none_or(|end| end > p.region_len) {
            return self.invalid(format!(
                "range {offset}..{} is outside the prepared request's region of {} bytes",
                offset.saturating_add(len),
                p.region_len
            ));
        }
        match self.check_send(&p.op, (1, len as u64), &p.ud, None) {
            Err(e) => e,
            Ok(()) => self.invalid(format!(
                "{len} bytes, but the prepared {:?} lends {} to {} bytes",
                p.op, p.min_len, p.max_len
            )),
        }
    }
}

/// A refused preparation: the error, and the region back under `wr_id` 0.
fn refused(error: Error, region: WrBuffers) -> crate::PostError {
    crate::PostError {
        error,
        returned: vec![(0, region)],
    }
}
