//! The slot queue's bookkeeping, with no device in it: which slots the
//! device may read or write, what `wr_id` a post carries, and what a
//! completion gives back. Pure Rust, so its unit tests run under Miri
//! (`ci/miri`).
//!
//! A send (SEND, RDMA WRITE) only reads its slot, so a slot may be the source
//! of several sends at once; a receive writes it, so a slot posted as a
//! receive is the device's alone. The send queue of a connected QP completes
//! in order (an unsignaled send is complete once a later send's completion
//! is seen), so sends are numbered and one number, the last completed, says
//! which are done: a slot is the caller's to write again once the last send
//! from it is at or below that number. Receives complete one by one, each
//! once, and a slot holds one receive at a time, so until a reset a
//! receive's completion can only be that of the receive its slot holds; a
//! reset leaves completions in the CQ, so each receive's id carries the
//! queue's epoch (its resets so far), and one left from before a reset
//! cannot finish a later receive of the same slot.
//!
//! A `wr_id` is `slot | number << 32 | RECV` (bit 62 for receives; bit 63,
//! the tracked path's tag, always clear): a completion is an index and a
//! comparison, never a search.
//!
//! A slot's state is one word: the number of its last send, or, while a
//! receive is posted in it, that receive's `wr_id`, which has bit 62 set
//! and so is above every send number. A slot is free (no request in flight
//! uses it) when the word is at or below the last send completed, so a post
//! that writes the slot first, and a receive, check one comparison; a
//! receive's completion is the comparison of its `wr_id` with its slot's
//! word.

/// Bit of a receive's `wr_id`.
pub(crate) const RECV: u64 = 1 << 62;
/// Bits of the send number (receive epoch) a `wr_id` carries.
const NUM_BITS: u32 = 30;
const NUM_MASK: u64 = (1 << NUM_BITS) - 1;
/// Sends that may be posted and not yet seen complete: half the numbers a
/// `wr_id` holds, so that a completion's full number is found without doubt
/// (a provider's send queue is far shorter; this only matters when someone
/// else polls the queue's CQ and the ledger never sees completions).
const MAX_UNSEEN: u64 = 1 << (NUM_BITS - 1);

/// Why the ledger refused a post or an access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No such slot.
    NoSlot,
    /// A receive is posted in the slot: the device may write it.
    Receiving,
    /// A send from the slot is not seen complete: the device may read it.
    Sending,
    /// As many sends are posted and unseen as the `wr_id` numbers allow.
    TooManyUnseen,
}

/// What a completion finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Finished {
    pub(crate) slot: u32,
    pub(crate) recv: bool,
}

/// The state of every slot of one queue.
#[derive(Debug)]
pub(crate) struct Ledger {
    /// Each slot's word: the number of its last send (0: none yet), or the
    /// `wr_id` of the receive posted in it (at or above [`RECV`]).
    slots: Box<[u64]>,
    /// The number of the last send posted.
    sent: u64,
    /// The number of the last send seen complete (`<= sent`).
    done: u64,
    /// The resets so far (wraps).
    epoch: u32,
    /// `RECV` and the low bits of `epoch`: a receive's id without its slot.
    recv_tag: u64,
}

impl Ledger {
    pub(crate) fn new(slots: u32) -> Ledger {
        Ledger {
            slots: vec![0; slots as usize].into_boxed_slice(),
            sent: 0,
            done: 0,
            epoch: 0,
            recv_tag: RECV,
        }
    }

    pub(crate) fn len(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Records a send from `slot`: its `wr_id`, and what [`Ledger::unsend`]
    /// restores if the provider refuses it. With `FREE`, the slot must also
    /// be writable (the caller writes it before the provider is called).
    #[inline(always)]
    pub(crate) fn send<const FREE: bool>(&mut self, slot: u32) -> Result<(u64, u64), Refusal> {
        let done = self.done;
        let s = self.slots.get_mut(slot as usize).ok_or(Refusal::NoSlot)?;
        let prev = *s;
        // With FREE one comparison covers both: a receive's id is above
        // `done` (which is at most `sent`, a count of posts that never
        // reaches 2^62).
        let busy_slot = if FREE { prev > done } else { prev >= RECV };
        if busy_slot {
            return Err(busy(prev));
        }
        if self.sent - done >= MAX_UNSEEN {
            return Err(Refusal::TooManyUnseen);
        }
        self.sent += 1;
        *s = self.sent;
        Ok((((self.sent & NUM_MASK) << 32) | u64::from(slot), prev))
    }

    /// Undoes the last [`Ledger::send`] (from `slot`, which returned `prev`)
    /// when the provider refused the request.
    #[cold]
    pub(crate) fn unsend(&mut self, slot: u32, prev: u64) {
        if let Some(s) = self.slots.get_mut(slot as usize) {
            *s = prev;
            self.sent -= 1;
        }
    }

    /// After an inline send from `slot` was posted: its data was copied
    /// during the post, so the slot is as it was before it (`prev`); the
    /// send keeps its number, whose completion is still to come.
    pub(crate) fn copied(&mut self, slot: u32, prev: u64) {
        if let Some(s) = self.slots.get_mut(slot as usize) {
            *s = prev;
        }
    }

    /// Records a receive into `slot`: its `wr_id`.
    #[inline(always)]
    pub(crate) fn recv(&mut self, slot: u32) -> Result<u64, Refusal> {
        let done = self.done;
        let s = self.slots.get_mut(slot as usize).ok_or(Refusal::NoSlot)?;
        if *s > done {
            return Err(busy(*s));
        }
        let id = self.recv_tag | u64::from(slot);
        *s = id;
        Ok(id)
    }

    /// Undoes the last [`Ledger::recv`] of `slot` (the provider refused it:
    /// no completion of it comes). The slot was free, and one free
    /// word is as good as another (`done` never falls): 0.
    #[cold]
    pub(crate) fn unrecv(&mut self, slot: u32) {
        if let Some(s) = self.slots.get_mut(slot as usize) {
            *s = 0;
        }
    }

    /// A completion's `wr_id`: the slot it gives back, or `None` for an id
    /// that finishes nothing in flight (a completion from before a reset,
    /// or not of this queue), which changes nothing.
    #[inline(always)]
    pub(crate) fn complete(&mut self, wr_id: u64) -> Option<Finished> {
        // Bits 62 and 63 clear: a send's id (one shift, tested first: the
        // latency loops wait on sends).
        if wr_id >> 62 != 0 {
            return self.complete_recv(wr_id);
        }
        let slot = wr_id as u32;
        let num = (wr_id >> 32) & NUM_MASK;
        // The send's full number: the first after `done` whose low bits are
        // `num` (`ahead` of 1 or more); it must have been posted. One
        // comparison: `ahead - 1` wraps above any count when `ahead` is 0.
        let ahead = num.wrapping_sub(self.done) & NUM_MASK;
        if ahead.wrapping_sub(1) >= self.sent - self.done {
            return None;
        }
        self.done += ahead;
        Some(Finished { slot, recv: false })
    }

    /// [`Ledger::complete`] of an id with bit 62 or 63 set: a receive's
    /// when its slot's word is this very id (no word has bit 63 set, so the
    /// tracked path's tag finishes nothing).
    #[inline(always)]
    fn complete_recv(&mut self, wr_id: u64) -> Option<Finished> {
        let slot = wr_id as u32;
        let s = self.slots.get_mut(slot as usize)?;
        if *s != wr_id {
            return None;
        }
        // No send was in flight from the slot when its receive was posted.
        *s = 0;
        Some(Finished { slot, recv: true })
    }

    /// Whether the caller may read `slot` (no receive posted in it).
    #[inline(always)]
    pub(crate) fn readable(&self, slot: u32) -> Result<(), Refusal> {
        let s = *self.slots.get(slot as usize).ok_or(Refusal::NoSlot)?;
        if s >= RECV {
            return Err(Refusal::Receiving);
        }
        Ok(())
    }

    /// Whether the caller may write `slot` (nothing in flight reads or
    /// writes it).
    #[inline(always)]
    pub(crate) fn writable(&self, slot: u32) -> Result<(), Refusal> {
        let s = *self.slots.get(slot as usize).ok_or(Refusal::NoSlot)?;
        if s > self.done {
            return Err(busy(s));
        }
        Ok(())
    }

    /// The QP was reset: the device holds no request any more, every slot
    /// is the caller's, and completions still in the CQ from before finish
    /// nothing (their send numbers are done, their receive epoch is past).
    pub(crate) fn reset(&mut self) {
        self.done = self.sent;
        // The epoch is 32 bits and wraps; an id carries its low 30.
        self.epoch = self.epoch.wrapping_add(1);
        self.recv_tag = RECV | ((u64::from(self.epoch) & NUM_MASK) << 32);
        for s in self.slots.iter_mut() {
            if *s >= RECV {
                *s = 0;
            }
        }
    }

    /// Requests posted and not seen complete: (sends, receives).
    pub(crate) fn in_flight(&self) -> (u64, usize) {
        let recvs = self.slots.iter().filter(|&&s| s >= RECV).count();
        (self.sent - self.done, recvs)
    }
}

/// Why a slot whose state word is `word` is not free.
#[cold]
fn busy(word: u64) -> Refusal {
    if word >= RECV {
        Refusal::Receiving
    } else {
        Refusal::Sending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_send_holds_its_slot_until_its_completion_or_a_later_one() {
        let mut l = Ledger::new(3);
        let (a, _) = l.send::<false>(0).unwrap();
        let (b, _) = l.send::<false>(1).unwrap();
        assert_eq!(l.writable(0), Err(Refusal::Sending));
        assert_eq!(l.readable(0), Ok(()));
        assert_eq!(l.recv(1), Err(Refusal::Sending));
        // Only the second was signaled: its completion finishes both.
        let _ = a;
        assert_eq!(
            l.complete(b),
            Some(Finished {
                slot: 1,
                recv: false
            })
        );
        assert_eq!(l.writable(0), Ok(()));
        assert_eq!(l.writable(1), Ok(()));
        assert_eq!(l.in_flight(), (0, 0));
        // The earlier send's completion, if it came now, finishes nothing.
        assert_eq!(l.complete(a), None);
        assert_eq!(l.complete(b), None);
    }

    #[test]
    fn a_send_that_writes_first_needs_a_free_slot() {
        let mut l = Ledger::new(1);
        let (a, _) = l.send::<true>(0).unwrap();
        assert_eq!(l.send::<true>(0), Err(Refusal::Sending));
        assert!(l.send::<false>(0).is_ok());
        assert!(l.complete(a).is_some());
        assert_eq!(l.send::<true>(0), Err(Refusal::Sending));
        l.reset();
        assert!(l.send::<true>(0).is_ok());
    }

    #[test]
    fn a_slot_sent_twice_is_writable_only_after_the_second_send() {
        let mut l = Ledger::new(1);
        let (a, _) = l.send::<false>(0).unwrap();
        let (b, _) = l.send::<false>(0).unwrap();
        assert!(l.complete(a).is_some());
        assert_eq!(l.writable(0), Err(Refusal::Sending));
        assert!(l.complete(b).is_some());
        assert_eq!(l.writable(0), Ok(()));
    }

    #[test]
    fn a_receive_holds_its_slot_alone() {
        let mut l = Ledger::new(2);
        let r = l.recv(1).unwrap();
        assert_eq!(r & RECV, RECV);
        assert_eq!(l.readable(1), Err(Refusal::Receiving));
        assert_eq!(l.writable(1), Err(Refusal::Receiving));
        assert_eq!(l.send::<false>(1), Err(Refusal::Receiving));
        assert_eq!(l.recv(1), Err(Refusal::Receiving));
        assert_eq!(l.in_flight(), (0, 1));
        assert_eq!(
            l.complete(r),
            Some(Finished {
                slot: 1,
                recv: true
            })
        );
        assert_eq!(l.readable(1), Ok(()));
        // Twice is once.
        assert_eq!(l.complete(r), None);
        // Until a reset the slot's next receive has the same id: the device
        // completes each receive once, so a completion with it is the new
        // receive's.
        let r2 = l.recv(1).unwrap();
        assert_eq!(r, r2);
        assert_eq!(l.readable(1), Err(Refusal::Receiving));
        assert!(l.complete(r2).is_some());
        assert_eq!(l.in_flight(), (0, 0));
    }

    #[test]
    fn a_receive_is_finished_by_its_own_id_alone() {
        let mut l = Ledger::new(2);
        let r0 = l.recv(0).unwrap();
        let r1 = l.recv(1).unwrap();
        // The same epoch: the ids differ by their slots.
        assert_eq!(r0 >> 32, r1 >> 32);
        assert_eq!((r0 as u32, r1 as u32), (0, 1));
        // Slot 1's id with the tracked path's tag finishes nothing.
        assert_eq!(l.complete(r1 | (1 << 63)), None);
        assert_eq!(l.readable(1), Err(Refusal::Receiving));
        assert_eq!(l.in_flight(), (0, 2));
        assert_eq!(
            l.complete(r1),
            Some(Finished {
                slot: 1,
                recv: true
            })
        );
        assert_eq!(l.readable(0), Err(Refusal::Receiving));
        // After a reset, slot 0's next receive has another epoch: the old
        // id (a completion left in the CQ) finishes nothing.
        l.reset();
        let r0b = l.recv(0).unwrap();
        assert_ne!(r0, r0b);
        assert_eq!(l.complete(r0), None);
        assert_eq!(l.readable(0), Err(Refusal::Receiving));
        assert!(l.complete(r0b).is_some());
        assert_eq!(l.in_flight(), (0, 0));
    }

    #[test]
    fn ids_of_no_slot_or_not_posted_finish_nothing() {
        let mut l = Ledger::new(2);
        assert_eq!(l.send::<false>(2), Err(Refusal::NoSlot));
        assert_eq!(l.recv(u32::MAX), Err(Refusal::NoSlot));
        assert_eq!(l.readable(7), Err(Refusal::NoSlot));
        // Nothing posted: no id finishes anything.
        for id in [
            0,
            1,
            1 << 32,
            RECV | (1 << 32),
            RECV | (1 << 32) | 9,
            1 << 63,
            u64::MAX,
        ] {
            assert_eq!(l.complete(id), None, "{id:#x}");
        }
        let (a, _) = l.send::<false>(0).unwrap();
        // The tracked path's tag, or a number not posted yet.
        assert_eq!(l.complete(a | (1 << 63)), None);
        assert_eq!(l.complete(a + (1 << 32)), None);
        assert_eq!(l.writable(0), Err(Refusal::Sending));
        assert!(l.complete(a).is_some());
    }

    #[test]
    fn a_refused_post_is_undone() {
        let mut l = Ledger::new(1);
        let (_, prev) = l.send::<false>(0).unwrap();
        l.unsend(0, prev);
        assert_eq!(l.writable(0), Ok(()));
        assert_eq!(l.in_flight(), (0, 0));
        l.recv(0).unwrap();
        l.unrecv(0);
        assert_eq!(l.readable(0), Ok(()));
        let r = l.recv(0).unwrap();
        assert!(l.complete(r).is_some());
    }

    #[test]
    fn an_inline_send_leaves_its_slot_free_but_keeps_its_number() {
        let mut l = Ledger::new(1);
        let (a, prev) = l.send::<false>(0).unwrap();
        l.copied(0, prev);
        assert_eq!(l.writable(0), Ok(()));
        assert_eq!(l.in_flight(), (1, 0));
        assert!(l.complete(a).is_some());
        assert_eq!(l.in_flight(), (0, 0));
    }

    #[test]
    fn after_a_reset_old_completions_finish_nothing() {
        let mut l = Ledger::new(2);
        let (s, _) = l.send::<false>(0).unwrap();
        let r = l.recv(1).unwrap();
        l.reset();
        assert_eq!(l.writable(0), Ok(()));
        assert_eq!(l.writable(1), Ok(()));
        assert_eq!(l.in_flight(), (0, 0));
        let r2 = l.recv(1).unwrap();
        let (s2, _) = l.send::<false>(0).unwrap();
        // Completions left in the CQ from before the reset.
        assert_eq!(l.complete(r), None);
        assert_eq!(l.complete(s), None);
        assert_eq!(l.readable(1), Err(Refusal::Receiving));
        assert_eq!(l.writable(0), Err(Refusal::Sending));
        assert!(l.complete(r2).is_some());
        assert!(l.complete(s2).is_some());
    }

    #[test]
    fn numbers_wrap_past_what_an_id_holds() {
        let mut l = Ledger::new(1);
        // Near the wrap of the 30 bits an id carries.
        l.sent = NUM_MASK - 2;
        l.done = NUM_MASK - 2;
        let mut ids = Vec::new();
        for _ in 0..6 {
            ids.push(l.send::<false>(0).unwrap().0);
        }
        assert!(ids.iter().any(|i| (i >> 32) & NUM_MASK == 0));
        assert!(l.complete(ids[2]).is_some());
        assert_eq!(l.in_flight(), (3, 0));
        assert_eq!(l.complete(ids[1]), None);
        assert!(l.complete(ids[5]).is_some());
        assert_eq!(l.writable(0), Ok(()));
        // Receive epochs wrap too: the id carries the low 30 bits.
        l.epoch = u32::MAX - 1;
        l.reset();
        let r = l.recv(0).unwrap();
        assert_eq!((r >> 32) & NUM_MASK, NUM_MASK);
        l.reset();
        let r2 = l.recv(0).unwrap();
        assert_eq!(r2, RECV);
        assert_eq!(l.complete(r), None);
        assert!(l.complete(r2).is_some());
    }

    #[test]
    fn one_word_tells_a_receiving_slot_from_a_sending_one() {
        let mut l = Ledger::new(2);
        let r = l.recv(0).unwrap();
        let (s, _) = l.send::<false>(1).unwrap();
        // Every check names the right holder, whichever check refused.
        assert_eq!(l.send::<true>(0), Err(Refusal::Receiving));
        assert_eq!(l.send::<false>(0), Err(Refusal::Receiving));
        assert_eq!(l.writable(0), Err(Refusal::Receiving));
        assert_eq!(l.send::<true>(1), Err(Refusal::Sending));
        assert_eq!(l.recv(1), Err(Refusal::Sending));
        assert_eq!(l.readable(1), Ok(()));
        // A receive's completion leaves its slot free for a send that
        // writes first, while the send numbers go on.
        assert!(l.complete(r).is_some());
        assert!(l.complete(s).is_some());
        let (w, _) = l.send::<true>(0).unwrap();
        assert_eq!(l.in_flight(), (1, 0));
        assert_eq!(l.complete(r), None);
        assert!(l.complete(w).is_some());
        assert_eq!(l.writable(0), Ok(()));
    }

    #[test]
    fn unseen_sends_are_bounded() {
        let mut l = Ledger::new(1);
        l.sent = MAX_UNSEEN;
        assert_eq!(l.send::<false>(0), Err(Refusal::TooManyUnseen));
        l.done = 1;
        assert!(l.send::<false>(0).is_ok());
    }
}
