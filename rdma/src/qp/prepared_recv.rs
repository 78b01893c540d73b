//! Prepared receives: a region checked once and cut into slots, each post
//! lending one slot to a receive of the QP's own receive queue.
//!
//! As for prepared sends (`prepared.rs`), a post moves no memory: the
//! receive queue's entry holds the caller's `wr_id` and nothing to drop, and
//! the completion hands nothing back. The region stays valid for the device
//! until the last receive that lent it is done, whatever the caller drops:
//! dropped while a receive is in flight, it goes to the QP's tracker, which
//! releases it once the receive queue has passed that receive.

use std::sync::Arc;

use super::{QueuePair, END_PADDING_ALIGN};
use crate::error::{Error, Result};
use crate::track::{Orphan, QpTracker};
use crate::wr::WrBuffers;
use crate::{ffi, MemoryRegion};

/// A receive region checked once and lent slot by slot
/// ([`QueuePair::prepare_recv`], [`QueuePair::post_prepared_recv`]): what a
/// loop that receives message after message does, without moving a region
/// into every receive and back out of every completion.
///
/// It belongs to the QP that prepared it. The device and the peer write its
/// slots while receives are in flight, so its bytes are reached only through
/// [`PreparedRecv::read_at`], which copies word by word with atomic loads (a
/// torn value is possible, never undefined behaviour); no slice of it is
/// handed out. A receive queue completes in order: once a slot's receive
/// has completed, what the message wrote there stays until the slot is lent
/// again. [`PreparedRecv::into_region`] gives the region back once nothing
/// is in flight. Dropped while a receive is in flight, it hands the region
/// to its QP, which keeps it until that receive is done.
///
/// ```no_run
/// # fn f(qp: &mut rdma::QueuePair, pd: &rdma::ProtectionDomain, cq: &rdma::CompletionQueue)
/// #     -> rdma::Result<()> {
/// use rdma::{AccessFlags, PostError};
/// let region = pd.alloc_mr(64 * 4096, AccessFlags::LOCAL_WRITE)?;
/// // 64 slots of 4 KiB, each lent to one receive at a time.
/// let mut slots = qp.prepare_recv(region, 4096).map_err(PostError::drop_buffers)?;
/// for slot in 0..64 {
///     qp.post_prepared_recv(&mut slots, slot as u64, slot)?;
/// }
/// if let Some(c) = cq.poll_one()? {
///     let c = c.ok()?;
///     let mut message = vec![0u8; c.byte_len as usize];
///     slots.read_at(c.wr_id as usize, 0, &mut message)?;
/// }
/// # Ok(()) }
/// ```
pub struct PreparedRecv {
    /// `None` only once `into_region` or `drop` took it: a safe `Option`
    /// rather than a `ManuallyDrop` that every new field would have to be
    /// moved out past by hand.
    region: Option<MemoryRegion>,
    base: u64,
    lkey: u32,
    slot_len: usize,
    slots: usize,
    /// The tracker of the QP it was checked for: its identity, and where
    /// the region goes if dropped while in flight.
    tracker: Arc<QpTracker>,
    /// Sequence number of the last receive posted (`None`: never posted).
    last: Option<u32>,
}

impl std::fmt::Debug for PreparedRecv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedRecv")
            .field("slot_len", &self.slot_len)
            .field("slots", &self.slots)
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

impl PreparedRecv {
    /// Bytes per slot.
    pub fn slot_len(&self) -> usize {
        self.slot_len
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Whether a receive posted from this region may still be in flight
    /// (its completion, or a later one of the QP's receive queue, not polled
    /// yet).
    pub fn in_flight(&self) -> bool {
        self.last
            .is_some_and(|seq| self.tracker.request_in_flight(true, seq))
    }

    /// Copies bytes out of slot `slot`, from `offset` within it, whatever is
    /// in flight: word by word with atomic loads, so a message arriving
    /// meanwhile leaves a torn value in `out`, never undefined behaviour.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range does not fit in the slot.
    pub fn read_at(&self, slot: usize, offset: usize, out: &mut [u8]) -> Result<()> {
        if slot >= self.slots
            || offset
                .checked_add(out.len())
                .is_none_or(|e| e > self.slot_len)
        {
            return Err(Error::InvalidArgument {
                verb: "PreparedRecv::read_at",
                reason: format!(
                    "{} bytes at {offset} of slot {slot}: the region has {} slots of {} bytes",
                    out.len(),
                    self.slots,
                    self.slot_len
                ),
            });
        }
        // `None` never: see `region`.
        let Some(mr) = &self.region else {
            return Err(Error::InvalidArgument {
                verb: "PreparedRecv::read_at",
                reason: "the region was given back".into(),
            });
        };
        mr.read_racy("PreparedRecv::read_at", slot * self.slot_len + offset, out)
    }

    /// Gives the region back when no receive that lent it is in flight;
    /// else the request itself comes back.
    ///
    /// # Errors
    /// The request, unchanged (boxed), while a receive is in flight.
    pub fn into_region(mut self) -> std::result::Result<MemoryRegion, Box<PreparedRecv>> {
        if self.in_flight() {
            return Err(Box::new(self));
        }
        match self.region.take() {
            Some(region) => Ok(region),
            // Never: only `drop` and this method, which consumes the
            // request, take the region.
            None => Err(Box::new(self)),
        }
    }
}

impl Drop for PreparedRecv {
    fn drop(&mut self) {
        let Some(region) = self.region.take() else {
            return;
        };
        if let Some(seq) = self.last {
            if self.tracker.request_in_flight(true, seq) {
                self.tracker.adopt(Orphan {
                    seq,
                    recv: true,
                    keep: Box::new(region),
                });
            }
        }
    }
}

impl QueuePair {
    /// Checks `region` once as receive memory of this QP (its PD,
    /// `LOCAL_WRITE`) and cuts it into slots of `slot_len` bytes, for
    /// [`QueuePair::post_prepared_recv`] to lend one by one. For QPs with a
    /// receive queue of their own (not an SRQ's) and a receive scatter
    /// entry. A UD QP's slots hold the 40-byte GRH before each message.
    ///
    /// ```no_run
    /// # fn f(qp: &mut rdma::QueuePair, cq: &rdma::CompletionQueue, mr: rdma::MemoryRegion)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// let mut recvs = qp.prepare_recv(mr, 4096).map_err(rdma::PostError::drop_buffers)?;
    /// for slot in 0..recvs.slots() {
    ///     qp.post_prepared_recv(&mut recvs, slot as u64, slot)?;
    /// }
    /// let mut wcs = [rdma::WorkCompletion::default(); 16];
    /// let mut memory = Vec::new();
    /// let n = cq.poll_wc(&mut wcs, &mut memory)?;
    /// for wc in &wcs[..n] {
    ///     let slot = wc.ok()?.wr_id() as usize;
    ///     let mut head = [0u8; 8];
    ///     recvs.read_at(slot, 0, &mut head)?;
    ///     qp.post_prepared_recv(&mut recvs, slot as u64, slot)?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `ibv_post_recv` for a QP that takes
    /// its receives from an SRQ or has no receive scatter entry, a slot
    /// length of 0 or longer than the region, or a region
    /// [`QueuePair::post_recv`] would refuse; the region comes back in
    /// [`PostError::returned`](crate::PostError::returned) (under `wr_id` 0).
    pub fn prepare_recv(
        &self,
        region: MemoryRegion,
        slot_len: usize,
    ) -> std::result::Result<PreparedRecv, crate::PostError> {
        let total = region.len();
        let invalid = |reason: String| Error::InvalidArgument {
            verb: "ibv_post_recv",
            reason,
        };
        let checked = if self.srq.is_some() || self.caps.max_recv_sge == 0 {
            Err(invalid(format!(
                "a prepared receive needs a QP with a receive queue of its own and a receive \
                 scatter entry; QP {} takes {} (max_recv_sge {})",
                self.qp_num(),
                if self.srq.is_some() {
                    "its receives from an SRQ"
                } else {
                    "no receives"
                },
                self.caps.max_recv_sge
            )))
        } else if slot_len == 0 || slot_len > total || slot_len > u32::MAX as usize {
            Err(invalid(format!(
                "slots of {slot_len} bytes in a region of {total} (at least 1 byte, at most the \
                 region and 4 GiB - 1)"
            )))
        } else if self.end_padding
            && (region.addr() % END_PADDING_ALIGN != 0 || slot_len as u64 % END_PADDING_ALIGN != 0)
        {
            Err(invalid(format!(
                "slots of {slot_len} bytes from {:#x} on a QP built with PCI_WRITE_END_PADDING: \
                 the region's address and the slot length must be multiples of \
                 {END_PADDING_ALIGN}, so that no slot's padding reaches the next",
                region.addr()
            )))
        } else {
            self.check_region(&region, true, "ibv_post_recv")
        };
        if let Err(error) = checked {
            return Err(crate::PostError {
                error,
                returned: vec![(0, WrBuffers::One(region))],
            });
        }
        Ok(PreparedRecv {
            base: region.addr(),
            lkey: region.lkey(),
            slot_len,
            slots: total / slot_len,
            region: Some(region),
            tracker: Arc::clone(&self.owned.tracker),
            last: None,
        })
    }

    /// Posts a receive into slot `slot` of `r` ([`QueuePair::prepare_recv`])
    /// under the caller's `wr_id` (`ibv_post_recv(3)`). Nothing moves: the
    /// completion carries the `wr_id`, and the message is read from the
    /// slot with [`PreparedRecv::read_at`]. Lending a slot whose previous
    /// receive has not completed yet is the caller's mistake, not undefined
    /// behaviour: two messages may then land in the same bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `ibv_post_recv` for a slot out of
    /// range or a region prepared by another QP; [`Error::Verb`] as for
    /// [`QueuePair::post_recv`] (e.g. `ENOMEM` when the receive queue is
    /// full).
    #[inline(always)]
    pub fn post_prepared_recv(
        &mut self,
        r: &mut PreparedRecv,
        wr_id: u64,
        slot: usize,
    ) -> Result<()> {
        if slot >= r.slots || !Arc::ptr_eq(&r.tracker, &self.owned.tracker) {
            return Err(self.prepared_recv_refused(r, slot));
        }
        let mut sge = ffi::ibv_sge {
            addr: r.base + (slot * r.slot_len) as u64,
            // At most u32::MAX: checked when prepared.
            length: r.slot_len as u32,
            lkey: r.lkey,
        };
        // SAFETY: `&mut self`: the only poster to this QP's receive queue, which
        // pushes at most the count given; the QP holds its CQs.
        let mut ring = unsafe { self.owned.tracker.producer(true, 1) };
        let ours = ring.wr_id(0);
        let mut wr = ffi::ibv_recv_wr {
            wr_id: ours,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: a well-formed request whose one SGE lies in `r`'s region
        // (slot checked just now), which `r` keeps (or hands to the
        // tracker) until the receive is done; the entry is published when
        // `ring` is dropped (a poll that sees the completion first waits).
        let rc = unsafe { ffi::ibv_post_recv(self.as_raw(), &mut wr, &mut bad) };
        if rc != 0 {
            drop(ring);
            return Err(self
                .not_posted("ibv_post_recv", rc, (wr_id, WrBuffers::None))
                .error);
        }
        ring.push_quiet(wr_id);
        r.last = Some(ours as u32);
        Ok(())
    }

    /// Why [`QueuePair::post_prepared_recv`] refused.
    #[cold]
    fn prepared_recv_refused(&self, r: &PreparedRecv, slot: usize) -> Error {
        Error::InvalidArgument {
            verb: "ibv_post_recv",
            reason: if Arc::ptr_eq(&r.tracker, &self.owned.tracker) {
                format!("slot {slot}, but the region has {} slots", r.slots)
            } else {
                format!(
                    "the receive region was prepared by another QP than QP {}",
                    self.qp_num()
                )
            },
        }
    }
}
