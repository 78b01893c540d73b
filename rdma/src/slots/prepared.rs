//! The slot queue's prepared posts, for loops that post the same request
//! again and again (the latency loops): a [`SlotWriter`] (an RDMA WRITE of
//! one slot's first bytes to one target) or a [`SlotSender`] (a SEND of
//! them), each checked once when it is made and holding the queue mutably
//! for its life. A post through one then checks only what changes from
//! post to post (the slot free or without a receive, the sends not seen
//! complete, the provider's answer) and makes the provider's calls.
//!
//! What is checked once stays true while the handle lives: the slot's
//! range and length and the queue's send path are fixed when the queue is
//! made, the target is the handle's own copy, and the handle's unique
//! borrow keeps every other post off the queue (its polls, receives and
//! state changes go through [`SlotWriter::queue`], which changes none of
//! these). That borrow lends the queue mutably, so another queue can be
//! swapped in (`std::mem::swap`): each post compares the queue's id with
//! the one it was made for, and refuses the post when they differ (the
//! handle's cached calls, address and key are the first queue's).

use super::{refused, SlotQueue, SlotTarget};
use crate::error::Result;
use crate::ffi;
use crate::qp::{DirectOne, SendFn, WriteFn};

/// An RDMA WRITE of the first `len` bytes of one slot to one
/// [`SlotTarget`], checked once ([`SlotQueue::writer`]).
pub struct SlotWriter<'q> {
    q: &'q mut SlotQueue,
    /// The direct calls, when the write takes them (the extended path, not
    /// inline); else the queue's prebuilt request.
    direct: Option<DirectOne<WriteFn>>,
    rkey: u32,
    raddr: u64,
    slot: u32,
    len: u32,
    queue_id: u64,
}

/// A SEND of the first `len` bytes of one slot, checked once
/// ([`SlotQueue::sender`]).
pub struct SlotSender<'q> {
    q: &'q mut SlotQueue,
    /// As [`SlotWriter`]'s.
    direct: Option<DirectOne<SendFn>>,
    addr: u64,
    lkey: u32,
    slot: u32,
    len: u32,
    queue_id: u64,
}

impl SlotQueue {
    /// An RDMA WRITE of the first `len` bytes of `slot` to the start of
    /// `target`, checked now, for a loop that posts it again and again
    /// ([`SlotWriter::post`], [`SlotWriter::post_with`]); the queue is
    /// reached through [`SlotWriter::queue`] meanwhile.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a slot out of range, a slot shorter
    /// than `len`, or more bytes than `target`'s remote range holds.
    pub fn writer(&mut self, target: &SlotTarget, slot: u32, len: u32) -> Result<SlotWriter<'_>> {
        self.prepared_checks("SlotQueue::writer", slot, len)?;
        let r = &target.remote;
        if !super::fits_remote(len, r) {
            return Err(self.beyond_remote(slot, len, r));
        }
        let direct = self.write.filter(|_| len > self.write_above);
        Ok(SlotWriter {
            direct,
            rkey: r.rkey,
            raddr: r.addr,
            slot,
            len,
            queue_id: self.id,
            q: self,
        })
    }

    /// A SEND of the first `len` bytes of `slot`, checked now, for a loop
    /// that posts it again and again ([`SlotSender::post`]); the queue is
    /// reached through [`SlotSender::queue`] meanwhile.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a slot out of range or shorter than
    /// `len`.
    pub fn sender(&mut self, slot: u32, len: u32) -> Result<SlotSender<'_>> {
        self.prepared_checks("SlotQueue::sender", slot, len)?;
        let direct = self.send.filter(|_| len > self.send_above);
        Ok(SlotSender {
            direct,
            addr: self.at(slot) as u64,
            lkey: self.lkey,
            slot,
            len,
            queue_id: self.id,
            q: self,
        })
    }

    /// What every post of a prepared handle checks first: that the queue
    /// is still the one the handle was made for (`queue_id`, see the
    /// module's documentation), then the ledger's record of the send
    /// (`FILL`: the caller writes the slot). The send's id and the slot's
    /// word before it.
    #[inline(always)]
    fn prepared_send<const FILL: bool>(
        &mut self,
        verb: &'static str,
        queue_id: u64,
        slot: u32,
    ) -> Result<(u64, u64)> {
        if self.id != queue_id {
            return Err(replaced(verb));
        }
        self.ledger
            .send::<FILL>(slot)
            .map_err(|r| refused("ibv_post_send", slot, r))
    }

    /// What a prepared post checks once: `slot` in range, `len` within it.
    fn prepared_checks(&self, verb: &'static str, slot: u32, len: u32) -> Result<()> {
        if slot >= self.ledger.len() {
            return Err(refused(verb, slot, super::Refusal::NoSlot));
        }
        if len > self.slot_len {
            return Err(super::too_long(slot, len, self.slot_len));
        }
        Ok(())
    }
}

impl SlotWriter<'_> {
    /// Posts the write; `signaled` asks for its completion.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a slot with a receive posted, too
    /// many sends not seen complete, or another queue swapped in through
    /// `queue()`; `ibv_post_send`'s error (the slot is then as before).
    #[inline(always)]
    pub fn post(&mut self, signaled: bool) -> Result<()> {
        self.post_inner::<false>(signaled, |_| {})
    }

    /// Lets `fill` write the slot (all of it), then posts the write: as
    /// [`SlotQueue::post_write_with`].
    ///
    /// # Errors
    /// As [`SlotWriter::post`], and a slot that a request in flight uses
    /// (`fill` is then not called).
    #[inline(always)]
    pub fn post_with(&mut self, signaled: bool, fill: impl FnOnce(&mut [u8])) -> Result<()> {
        self.post_inner::<true>(signaled, fill)
    }

    #[inline(always)]
    fn post_inner<const FILL: bool>(
        &mut self,
        signaled: bool,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<()> {
        let (slot, len) = (self.slot, self.len);
        let q = &mut *self.q;
        let (wr_id, prev) = q.prepared_send::<FILL>("SlotWriter::post", self.queue_id, slot)?;
        let at = q.at(slot);
        if FILL {
            // SAFETY: as in `SlotQueue::post`: in range (checked when the
            // writer was made; the queue's slots never change) and used by
            // no request in flight (the ledger checked it); the request just
            // recorded is handed to the provider only after this borrow.
            fill(unsafe { std::slice::from_raw_parts_mut(at, q.slot_len as usize) });
        }
        let flags = if signaled { ffi::IBV_SEND_SIGNALED } else { 0 };
        let rc = match &self.direct {
            Some(d) => {
                let (rkey, raddr) = (&self.rkey, &self.raddr);
                // SAFETY: `d` was made for the queue's QP, which lives and
                // which the writer's `&mut` keeps from any other post; the
                // bytes are in the registered slot, which the ledger now
                // holds lent until the completion.
                unsafe { d.post(flags, wr_id, || (*rkey, *raddr), || q.sge(slot, len)) }
            }
            None => {
                let remote = Some((self.rkey, self.raddr));
                q.post_prebuilt(remote, flags, at as u64, len, wr_id, slot, prev)
            }
        };
        q.posted(slot, prev, rc)
    }

    /// The queue, for its polls, receives and other calls meanwhile.
    #[inline(always)]
    pub fn queue(&mut self) -> &mut SlotQueue {
        self.q
    }
}

impl SlotSender<'_> {
    /// Posts the SEND; `signaled` asks for its completion.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a slot with a receive posted, too
    /// many sends not seen complete, or another queue swapped in through
    /// `queue()`; `ibv_post_send`'s error (the slot is then as before).
    #[inline(always)]
    pub fn post(&mut self, signaled: bool) -> Result<()> {
        let (slot, len) = (self.slot, self.len);
        let q = &mut *self.q;
        let (wr_id, prev) = q.prepared_send::<false>("SlotSender::post", self.queue_id, slot)?;
        let flags = if signaled { ffi::IBV_SEND_SIGNALED } else { 0 };
        let (lkey, addr) = (&self.lkey, &self.addr);
        let rc = match &self.direct {
            // SAFETY: as in `SlotWriter::post_inner`.
            Some(d) => unsafe { d.post(flags, wr_id, || (*lkey, *addr, len)) },
            None => q.post_prebuilt(None, flags, *addr, len, wr_id, slot, prev),
        };
        q.posted(slot, prev, rc)
    }

    /// The queue, for its polls, receives and other calls meanwhile.
    #[inline(always)]
    pub fn queue(&mut self) -> &mut SlotQueue {
        self.q
    }
}

/// A prepared post whose queue was swapped for another through its
/// `queue()`.
#[cold]
fn replaced(verb: &'static str) -> crate::Error {
    crate::Error::InvalidArgument {
        verb,
        reason: "the queue was replaced (swapped through `queue()`) after the handle was made \
                 for it: make a new one"
            .into(),
    }
}

impl std::fmt::Debug for SlotWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotWriter")
            .field("slot", &self.slot)
            .field("len", &self.len)
            .field("rkey", &self.rkey)
            .field("raddr", &self.raddr)
            .field("direct", &self.direct.is_some())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for SlotSender<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotSender")
            .field("slot", &self.slot)
            .field("len", &self.len)
            .field("direct", &self.direct.is_some())
            .finish_non_exhaustive()
    }
}
