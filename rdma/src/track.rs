//! Bookkeeping of the memory held by work requests in flight.
//!
//! Every work request posted through the safe API gets a `wr_id` of its own
//! (bit 63 set, bit 62 for the receive queue, a 30-bit QP serial and a 32-bit
//! sequence number), and its memory is parked in the QP's [`Tracker`] until
//! the completion with that id is polled. The caller's own `wr_id` is kept
//! beside the memory and put back into the [`Completion`].
//!
//! Send completions arrive in posting order per send queue, so a completion
//! also releases the unsignaled requests posted before it. Completions whose
//! QP is gone, or whose serial belongs to an older QP that had the same QP
//! number, find no tracker and are passed through without memory (the QP's
//! drop already destroyed the QP, then released the memory).

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};
use std::sync::Arc;

use crate::ffi;
use crate::wc::{Completion, WrBuffers};
use crate::AddressHandle;

pub(crate) const TAG: u64 = 1 << 63;
const RECV: u64 = 1 << 62;
const SERIAL_BITS: u32 = 30;
const SERIAL_MASK: u32 = (1 << SERIAL_BITS) - 1;

static NEXT_SERIAL: AtomicU32 = AtomicU32::new(1);

pub(crate) fn next_serial() -> u32 {
    NEXT_SERIAL.fetch_add(1, Ordering::Relaxed) & SERIAL_MASK
}

pub(crate) fn encode(serial: u32, recv: bool, seq: u32) -> u64 {
    TAG | if recv { RECV } else { 0 } | (u64::from(serial & SERIAL_MASK) << 32) | u64::from(seq)
}

pub(crate) fn decode(wr_id: u64) -> Option<(u32, bool, u32)> {
    if wr_id & TAG == 0 {
        return None;
    }
    let serial = ((wr_id >> 32) as u32) & SERIAL_MASK;
    Some((serial, wr_id & RECV != 0, wr_id as u32))
}

/// The lock of the data path's bookkeeping (a CQ's registry; the producers
/// and consumers of a shared receive queue's ring).
///
/// Its critical sections are a few instructions long (push or pop one
/// entry, find a tracker), never block and never run user code, and nearly
/// always find the lock free: one atomic exchange to take it and a plain
/// store to release it, without `Mutex`'s poisoning bookkeeping, which the
/// latency benchmark measured on every post and completion. A waiter spins
/// briefly, then yields its CPU. Nothing is ever dropped under it except
/// what the section itself moves (see `Tracker::complete`).
pub(crate) struct Spin<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is only reached through a guard, and only one guard
// exists at a time (the `locked` flag, taken with Acquire and released with
// Release); so `Spin<T>` is a mutex, and like `Mutex<T>` it is Send and Sync
// when `T` is Send.
unsafe impl<T: Send> Send for Spin<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Spin<T> {}

impl<T: Default> Default for Spin<T> {
    fn default() -> Self {
        Spin::new(T::default())
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Spin<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spin")
            .field("value", &*self.lock())
            .finish()
    }
}

impl<T> Spin<T> {
    pub const fn new(value: T) -> Self {
        Spin {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    #[inline]
    pub fn lock(&self) -> SpinGuard<'_, T> {
        let mut spins = 0u32;
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            while self.locked.load(Ordering::Relaxed) {
                backoff(&mut spins);
            }
        }
        SpinGuard { lock: self }
    }
}

pub(crate) struct SpinGuard<'a, T> {
    lock: &'a Spin<T>,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock, so no other reference to the
        // value exists.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference
        // derived from the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

/// One work request in flight. Its sequence number is its index in its
/// queue's [`Queue`].
#[derive(Debug)]
pub(crate) struct Pending {
    pub wr_id: u64,
    pub buffers: WrBuffers,
    /// Keeps a UD destination alive until the send completes.
    pub _ah: Option<AddressHandle>,
    /// Keeps a memory window alive until its bind completes.
    pub _mw: Option<Arc<crate::mw::MwInner>>,
}

/// Entries per block of a [`Queue`] (a power of two, so indices that wrap at
/// `u32::MAX` stay consistent).
const BLOCK: usize = 32;

/// A block of queue slots; blocks form a singly linked list from the
/// consumer's block to the producer's.
struct Block {
    /// `None`: free (beyond the producer), taken (behind the consumer), or a
    /// hole (taken out of order, between the two).
    slots: [UnsafeCell<Option<Pending>>; BLOCK],
    next: AtomicPtr<Block>,
}

impl Block {
    fn alloc() -> NonNull<Block> {
        let b = Box::new(Block {
            slots: std::array::from_fn(|_| UnsafeCell::new(None)),
            next: AtomicPtr::new(std::ptr::null_mut()),
        });
        NonNull::from(Box::leak(b))
    }
}

/// The requests in flight on one work queue, in posting order: a FIFO with
/// one producer and one consumer at a time, whose hot paths use no atomic
/// read-modify-write (the latency benchmark measured each locked
/// instruction; see CONVENTIONS.md).
///
/// Slot `i` holds the request with sequence number `i` (wrapping at
/// `u32::MAX`). The producer writes slots at and after `tail`, then
/// publishes them by storing `tail` (Release); the consumer reads only slots
/// before the `tail` it loaded (Acquire) and moves `head` on. The producer
/// links a new block when it fills one, before publishing its last slot; the
/// consumer frees (or hands back through `spare`) the blocks it has passed.
/// Who may act as producer and consumer is decided by the [`Ring`] around it.
pub(crate) struct Queue {
    /// Published entries (sequence number of the next one), producer-written.
    tail: AtomicU32,
    /// Sequence number of the oldest entry, consumer-written.
    head: AtomicU32,
    /// Entries between `head` and `tail` taken out of order, consumer-written.
    holes: AtomicU32,
    /// Set by the producer while requests it handed to the provider may not
    /// be published yet: their completion can be polled in that window.
    posting: AtomicBool,
    /// Producer only: the block holding slot `staged` (`None` until the
    /// first push), and `staged` (the entries written, published or not).
    prod: UnsafeCell<(Option<NonNull<Block>>, u32)>,
    /// Consumer only: the block holding slot `head`. `None` until the first
    /// push, which sets it before it publishes anything (the consumer reads
    /// it only for a published entry, so after loading a tail past it).
    cons: UnsafeCell<Option<NonNull<Block>>>,
    /// A passed block the consumer hands back for reuse (null: none); only
    /// the consumer stores a block and only the producer takes it.
    spare: AtomicPtr<Block>,
}

// SAFETY: the queue owns `Pending` entries (which are Send) and its blocks;
// the producer-only and consumer-only cells are reached only by the one
// producer and the one consumer its `Ring` admits (see the unsafe methods'
// contracts), and slots pass between them through the Release/Acquire pairs
// on `tail`, `head` and `spare`.
unsafe impl Send for Queue {}
// SAFETY: as above.
unsafe impl Sync for Queue {}

const _: () = {
    const fn send<T: Send>() {}
    send::<Pending>();
};

impl Queue {
    /// An empty queue. Its first block is allocated by its first push: a
    /// queue that is never posted to (a receive queue fed by an SRQ, a
    /// connection set up and torn down) costs no block, and making one
    /// touches no fresh memory (setting up many connections, cmtime measured
    /// it: a page fault per QP).
    fn new() -> Queue {
        Queue {
            tail: AtomicU32::new(0),
            head: AtomicU32::new(0),
            holes: AtomicU32::new(0),
            posting: AtomicBool::new(false),
            prod: UnsafeCell::new((None, 0)),
            cons: UnsafeCell::new(None),
            spare: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// Entries in flight (a snapshot when other threads post or poll).
    pub fn len(&self) -> usize {
        // Head first: the tail loaded after it is never behind it.
        let head = self.head.load(Ordering::Acquire);
        let tail = self.tail.load(Ordering::Acquire);
        let holes = self.holes.load(Ordering::Acquire);
        tail.wrapping_sub(head).saturating_sub(holes) as usize
    }

    // --- producer side ---

    /// # Safety
    /// The caller is the queue's only producer.
    #[inline]
    unsafe fn staged(&self) -> u32 {
        // SAFETY: producer-only cell, and the caller is the producer.
        unsafe { (*self.prod.get()).1 }
    }

    /// Writes `p` as entry `staged` (not yet visible to the consumer).
    ///
    /// # Safety
    /// The caller is the queue's only producer.
    #[inline]
    unsafe fn push(&self, p: Pending) {
        // SAFETY: producer-only cell, and the caller is the producer.
        let (block, staged) = unsafe { &mut *self.prod.get() };
        let block = match block {
            Some(b) => b,
            // SAFETY: the caller is the producer, and `prod` has no block,
            // so this is the first push.
            None => block.insert(unsafe { self.first_block() }),
        };
        // SAFETY: the producer's block is live (the consumer frees only
        // blocks it has passed, and it never passes unpublished slots).
        let b = unsafe { block.as_ref() };
        let slot = b.slots[*staged as usize % BLOCK].get();
        // SAFETY: slot `staged` is at or after `tail`, so the consumer does
        // not touch it; it is free (`None`), so nothing is dropped.
        unsafe { *slot = Some(p) };
        *staged = staged.wrapping_add(1);
        if *staged as usize % BLOCK == 0 {
            let next = self.take_spare().unwrap_or_else(Block::alloc);
            // Linked before `tail` publishes the block's last slot: a
            // consumer that passes it finds the link.
            b.next.store(next.as_ptr(), Ordering::Release);
            *block = next;
        }
    }

    /// Allocates the first block and makes it the consumer's too.
    ///
    /// # Safety
    /// The caller is the producer, in the queue's first push.
    #[cold]
    unsafe fn first_block(&self) -> NonNull<Block> {
        let b = Block::alloc();
        // SAFETY: nothing is published yet, so the consumer does not read
        // `cons` (it reads it only for an entry before the tail it loaded
        // with Acquire); the Release store of `tail` that publishes the first
        // entry publishes this write too.
        unsafe { *self.cons.get() = Some(b) };
        b
    }

    /// A block the consumer handed back, if any.
    fn take_spare(&self) -> Option<NonNull<Block>> {
        let s = NonNull::new(self.spare.load(Ordering::Acquire))?;
        // Only the consumer stores into `spare`, and only when it is null:
        // until this store, the slot keeps `s` and the consumer leaves it.
        self.spare.store(std::ptr::null_mut(), Ordering::Release);
        Some(s)
    }

    /// Marks the start of a post: completions of the requests handed to the
    /// provider from now on may be polled before [`Queue::publish`].
    ///
    /// # Safety
    /// The caller is the queue's only producer.
    #[inline]
    unsafe fn begin(&self) {
        self.posting.store(true, Ordering::Relaxed);
        // The provider orders this store before the doorbell (a lock, a
        // write barrier or a system call), so a consumer that sees a
        // completion of this post sees `posting` set or the entry published.
        // (Should it not, the consumer leaves the completion bare and the
        // entry's memory is released when the QP goes: a leak, never a
        // double use.)
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
    }

    /// Publishes the written entries and ends the post.
    ///
    /// # Safety
    /// The caller is the queue's only producer.
    #[inline]
    unsafe fn publish(&self) {
        // SAFETY: the caller is the producer.
        let staged = unsafe { self.staged() };
        self.tail.store(staged, Ordering::Release);
        self.posting.store(false, Ordering::Release);
    }

    // --- consumer side ---

    /// The offset of entry `seq` from `head` when it is published; waits
    /// while the producer is posting and `seq` may be one of its requests.
    ///
    /// # Safety
    /// The caller is the queue's only consumer.
    #[inline]
    unsafe fn find(&self, seq: u32) -> Option<u32> {
        let head = self.head.load(Ordering::Relaxed);
        let off = seq.wrapping_sub(head);
        let mut spins = 0u32;
        loop {
            // `posting` first: once it reads false, the tail loaded after it
            // includes everything the last post published.
            let posting = self.posting.load(Ordering::Acquire);
            let tail = self.tail.load(Ordering::Acquire);
            if off < tail.wrapping_sub(head) {
                return Some(off);
            }
            if !posting {
                return None;
            }
            backoff(&mut spins);
        }
    }

    /// Takes the entry at `head` (`None` for a hole) and moves `head` on.
    ///
    /// # Safety
    /// The caller is the queue's only consumer, and `head` is before the
    /// `tail` it loaded ([`Queue::find`] returned an offset past it).
    #[inline]
    unsafe fn advance(&self) -> Option<Pending> {
        let mut out = None;
        // SAFETY: the caller's contract.
        unsafe { self.advance_with(|slot| out = slot.take()) };
        out
    }

    /// Lets `f` take what it needs from the entry at `head` in place (`None`
    /// for a hole), empties the slot and moves `head` on. In place: the
    /// completion path copies only the fields it uses.
    ///
    /// # Safety
    /// As [`Queue::advance`].
    #[inline]
    unsafe fn advance_with(&self, f: impl FnOnce(&mut Option<Pending>)) {
        let head = self.head.load(Ordering::Relaxed);
        // SAFETY: consumer-only cell, and the caller is the consumer.
        let Some(block) = (unsafe { &mut *self.cons.get() }).as_mut() else {
            // Cannot happen: an entry was published, so pushed.
            return;
        };
        // SAFETY: the consumer's block is live until the consumer frees it.
        let b = unsafe { block.as_ref() };
        // SAFETY: slot `head` is published (before the Acquire-loaded
        // `tail`), so the producer no longer touches it.
        let slot = unsafe { &mut *b.slots[head as usize % BLOCK].get() };
        if slot.is_none() {
            let holes = self.holes.load(Ordering::Relaxed);
            self.holes.store(holes.wrapping_sub(1), Ordering::Release);
        }
        f(slot);
        *slot = None;
        let next = head.wrapping_add(1);
        if next as usize % BLOCK == 0 {
            // The producer linked the next block before publishing `head`.
            let Some(n) = NonNull::new(b.next.load(Ordering::Acquire)) else {
                // Cannot happen (see above); stay put rather than lose track.
                return;
            };
            let old = std::mem::replace(block, n);
            // SAFETY: every slot of `old` is behind `head` now: neither side
            // uses it again.
            unsafe { self.recycle(old) };
        }
        self.head.store(next, Ordering::Release);
    }

    /// Moves `head` past holes, up to `tail` (loaded by the caller).
    ///
    /// # Safety
    /// As [`Queue::advance`]; `tail` was loaded with Acquire by the consumer.
    #[inline]
    unsafe fn skip_holes(&self) {
        if self.holes.load(Ordering::Relaxed) == 0 {
            return;
        }
        let tail = self.tail.load(Ordering::Acquire);
        while self.head.load(Ordering::Relaxed) != tail {
            let head = self.head.load(Ordering::Relaxed);
            // SAFETY: consumer-only cell; slot `head` is published.
            let hole = unsafe {
                let Some(b) = *self.cons.get() else {
                    // Cannot happen: entries were published, so pushed.
                    return;
                };
                (*b.as_ref().slots[head as usize % BLOCK].get()).is_none()
            };
            if !hole {
                return;
            }
            // SAFETY: the caller's contract; `head` is before `tail`.
            unsafe { self.advance() };
        }
    }

    /// Takes entry `head + off` out of order, leaving a hole.
    ///
    /// # Safety
    /// As [`Queue::advance`], with `head + off` before the loaded `tail`.
    unsafe fn take_at(&self, off: u32) -> Option<Pending> {
        let head = self.head.load(Ordering::Relaxed);
        // SAFETY: consumer-only cell.
        let mut b = unsafe { *self.cons.get() }?;
        let mut i = head as usize % BLOCK + off as usize;
        while i >= BLOCK {
            // SAFETY: blocks from the consumer's up to the published tail are
            // linked and live.
            b = NonNull::new(unsafe { b.as_ref() }.next.load(Ordering::Acquire))?;
            i -= BLOCK;
        }
        // SAFETY: the slot is published and only the consumer touches it.
        let p = unsafe { (*b.as_ref().slots[i].get()).take() };
        if p.is_some() {
            let holes = self.holes.load(Ordering::Relaxed);
            self.holes.store(holes.wrapping_add(1), Ordering::Release);
        }
        p
    }

    /// Hands a passed block back to the producer, or frees it.
    ///
    /// # Safety
    /// The caller is the consumer and owns `b` (every slot is behind
    /// `head`, so empty).
    unsafe fn recycle(&self, b: NonNull<Block>) {
        // SAFETY: owned by the caller.
        unsafe { b.as_ref() }
            .next
            .store(std::ptr::null_mut(), Ordering::Relaxed);
        if self.spare.load(Ordering::Acquire).is_null() {
            self.spare.store(b.as_ptr(), Ordering::Release);
        } else {
            // SAFETY: allocated by `Block::alloc` (a Box) and owned here.
            drop(unsafe { Box::from_raw(b.as_ptr()) });
        }
    }

    /// Removes every entry, oldest first.
    fn drain(&mut self) -> Vec<Pending> {
        let mut all = Vec::new();
        while self.head.load(Ordering::Relaxed) != self.tail.load(Ordering::Relaxed) {
            // SAFETY: `&mut self`: no producer or consumer runs; `head` is
            // before `tail`.
            if let Some(p) = unsafe { self.advance() } {
                all.push(p);
            }
        }
        all
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        drop(self.drain());
        // Free the chain from the consumer's block (the producer's is its
        // last), then the spare.
        let mut b = *self.cons.get_mut();
        while let Some(blk) = b {
            // SAFETY: the chain's blocks are owned by the queue, which goes.
            let boxed = unsafe { Box::from_raw(blk.as_ptr()) };
            b = NonNull::new(boxed.next.load(Ordering::Relaxed));
        }
        if let Some(s) = NonNull::new(*self.spare.get_mut()) {
            // SAFETY: as above.
            drop(unsafe { Box::from_raw(s.as_ptr()) });
        }
    }
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").field("len", &self.len()).finish()
    }
}

/// Spins briefly, then yields the CPU.
#[inline]
fn backoff(spins: &mut u32) {
    if *spins < 100 {
        std::hint::spin_loop();
        *spins += 1;
    } else {
        std::thread::yield_now();
    }
}

/// One work queue's [`Queue`] and who may produce and consume.
#[derive(Debug)]
struct Ring {
    queue: Queue,
    /// For a QP's queue: the address of the registry (of the one CQ the
    /// queue completes on) whose polls consume it, under that registry's
    /// lock. Zero for a shared receive queue.
    consumer: usize,
    /// For a shared receive queue (any handle posts, any CQ of its QPs
    /// polls): the locks that make producers and consumers take turns.
    locks: Option<(Spin<()>, Spin<()>)>,
}

impl Ring {
    fn new(consumer: Option<&Registry>) -> Ring {
        Ring {
            queue: Queue::new(),
            consumer: consumer.map_or(0, |r| r as *const Registry as usize),
            locks: consumer.is_none().then(|| (Spin::new(()), Spin::new(()))),
        }
    }
}

/// The right to add requests to a ring: a QP's post (which holds the QP
/// mutably) or a shared receive queue's (which holds its producer lock).
/// Dropping it publishes what was pushed.
pub(crate) struct Producer<'a> {
    queue: &'a Queue,
    /// The tracker's serial and which queue: what the `wr_id`s encode.
    serial: u32,
    recv: bool,
    _lock: Option<SpinGuard<'a, ()>>,
}

impl Producer<'_> {
    /// The sequence number the next pushed request gets.
    #[inline]
    pub fn next_seq(&self) -> u32 {
        // SAFETY: a `Producer` is the queue's only producer while it lives.
        unsafe { self.queue.staged() }
    }

    /// Our `wr_id` for the request `i` places after the next one.
    #[inline]
    pub fn wr_id(&self, i: u32) -> u64 {
        encode(self.serial, self.recv, self.next_seq().wrapping_add(i))
    }

    /// Parks a posted request's memory until its completion.
    #[inline]
    pub fn push(&mut self, p: Pending) {
        // SAFETY: as in `next_seq`.
        unsafe { self.queue.push(p) }
    }
}

impl Drop for Producer<'_> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: as in `next_seq`.
        unsafe { self.queue.publish() }
    }
}

/// The in-flight work of one QP (send and receive queue) or of one shared
/// receive queue (its receive queue).
#[derive(Debug)]
pub(crate) struct Tracker {
    pub serial: u32,
    sq: Ring,
    rq: Ring,
}

impl Tracker {
    /// A QP's tracker, registered with the registries of its CQs: its send
    /// queue completes on the CQ of `send` (whose polls alone consume it),
    /// its receive queue on that of `recv`.
    pub fn for_qp(send: &Registry, recv: &Registry) -> Arc<Tracker> {
        let t = Arc::new(Tracker {
            serial: next_serial(),
            sq: Ring::new(Some(send)),
            rq: Ring::new(Some(recv)),
        });
        send.register(&t);
        if !std::ptr::eq(send, recv) {
            recv.register(&t);
        }
        t
    }

    /// A shared receive queue's tracker.
    pub fn shared() -> Arc<Tracker> {
        Arc::new(Tracker {
            serial: next_serial(),
            sq: Ring::new(None),
            rq: Ring::new(None),
        })
    }

    #[inline]
    fn ring(&self, recv: bool) -> &Ring {
        if recv {
            &self.rq
        } else {
            &self.sq
        }
    }

    /// Starts a post on the send (`recv` false) or receive queue: requests
    /// handed to the provider while the producer lives are pushed to it
    /// after the provider accepted them.
    ///
    /// # Safety
    /// For a QP's tracker, the caller is the only one posting to that queue
    /// until the producer is dropped (it holds the `QueuePair` mutably). A
    /// shared receive queue's tracker takes a lock instead.
    #[inline]
    pub unsafe fn producer(&self, recv: bool) -> Producer<'_> {
        let ring = self.ring(recv);
        let lock = ring.locks.as_ref().map(|(p, _)| p.lock());
        // SAFETY: the caller's contract, or the lock just taken, make this
        // the only producer.
        unsafe { ring.queue.begin() };
        Producer {
            queue: &ring.queue,
            serial: self.serial,
            recv,
            _lock: lock,
        }
    }

    /// Number of requests in flight on (send, receive) queue.
    pub fn in_flight(&self) -> (usize, usize) {
        (self.sq.queue.len(), self.rq.queue.len())
    }

    /// Removes and returns everything in flight (after the QP is destroyed
    /// and unregistered: `&mut` proves no one posts or polls).
    pub fn drain(&mut self) -> Vec<Pending> {
        let mut all = self.sq.queue.drain();
        all.extend(self.rq.queue.drain());
        all
    }

    /// Fills `c` (whose `wr_id` is our encoded id) from the matching entry,
    /// for a poll of `by`'s CQ (whose lock the caller holds). What the
    /// entries kept alive (address handles, windows) goes to `later`, to be
    /// dropped once no lock is held.
    #[inline]
    fn complete(
        &self,
        recv: bool,
        seq: u32,
        c: &mut Completion,
        later: &mut Vec<Kept>,
        by: &Registry,
    ) {
        let ring = self.ring(recv);
        let _lock = match &ring.locks {
            Some((_, consume)) => Some(consume.lock()),
            None if ring.consumer == by as *const Registry as usize => None,
            // A QP's completion on another CQ than its queue's: no provider
            // does that. Left bare rather than consumed by a second poller.
            None => {
                c.wr_id &= !(TAG | RECV);
                return;
            }
        };
        let q = &ring.queue;
        // SAFETY: this is the queue's only consumer: a QP's queue is
        // consumed only by its CQ's polls, which hold that CQ's registry
        // lock (the registry was checked just above), or by `drain` through
        // `&mut`; a shared receive queue's consumers hold its consume lock.
        match unsafe { q.find(seq) } {
            // Usually the oldest request in flight.
            Some(0) => {
                // SAFETY: the only consumer (above); `find` saw entry 0
                // published.
                unsafe {
                    q.advance_with(|slot| {
                        // Taken whole and unpacked: the slot is left `None`,
                        // so emptying it drops nothing.
                        if let Some(Pending {
                            wr_id,
                            buffers,
                            _ah: ah,
                            _mw: mw,
                        }) = slot.take()
                        {
                            c.wr_id = wr_id;
                            c.buffers = buffers;
                            Kept::keep(later, ah, mw);
                        }
                    })
                };
                // SAFETY: the only consumer (above).
                unsafe { q.skip_holes() };
            }
            // SAFETY: the only consumer (above); `find` saw `off` published.
            Some(off) => unsafe { Self::complete_out_of_order(q, recv, off, c, later) },
            // Not ours (already released): leave the completion bare.
            None => {}
        }
    }

    /// [`Tracker::complete`] when the completion is not for the oldest
    /// request in flight.
    ///
    /// # Safety
    /// As for [`Queue::advance`]: the caller is the only consumer, and
    /// `off` is before the published tail.
    #[cold]
    unsafe fn complete_out_of_order(
        q: &Queue,
        recv: bool,
        off: u32,
        c: &mut Completion,
        later: &mut Vec<Kept>,
    ) {
        let done = if recv {
            // Receives: only this entry is known to be done (an SRQ serves
            // several QPs).
            // SAFETY: the caller's contract.
            unsafe { q.take_at(off) }
        } else {
            // Send queues complete in order: everything before it is done
            // too.
            c.unsignaled.reserve(off as usize);
            for _ in 0..off {
                // SAFETY: the caller's contract; these are before `off`.
                if let Some(p) = unsafe { q.advance() } {
                    c.unsignaled.push((p.wr_id, p.buffers));
                    Kept::keep(later, p._ah, p._mw);
                }
            }
            // SAFETY: as above; the entry is at `head` now.
            unsafe { q.advance() }
        };
        // SAFETY: the caller's contract.
        unsafe { q.skip_holes() };
        if let Some(p) = done {
            c.wr_id = p.wr_id;
            c.buffers = p.buffers;
            Kept::keep(later, p._ah, p._mw);
        }
    }
}

/// Objects a finished request kept alive, dropped after the bookkeeping's
/// locks are released (dropping one may call a verb).
pub(crate) struct Kept {
    _ah: Option<AddressHandle>,
    _mw: Option<Arc<crate::mw::MwInner>>,
}

impl Kept {
    /// Drops what `later` kept, once no lock is held. An empty list (the
    /// usual case) never allocated: it is let go without the call that
    /// dropping a `Vec` costs.
    #[inline]
    fn release(later: Vec<Kept>) {
        if later.capacity() == 0 {
            // Nothing allocated, nothing to drop: forgetting it frees nothing.
            std::mem::forget(later);
        } else {
            drop(later);
        }
    }

    #[inline]
    fn keep(later: &mut Vec<Kept>, ah: Option<AddressHandle>, mw: Option<Arc<crate::mw::MwInner>>) {
        if ah.is_some() || mw.is_some() {
            later.push(Kept { _ah: ah, _mw: mw });
        }
    }
}

/// Posts receive requests with `post` (`ibv_post_recv` on a QP or
/// `ibv_post_srq_recv` on an SRQ, given the chain and the bad-request
/// out-pointer) and parks the memory of those posted through `ring`, a
/// receive queue's producer. Returns the provider's return code and
/// the requests not posted.
pub(crate) fn post_recvs(
    mut ring: Producer<'_>,
    wrs: Vec<(u64, WrBuffers)>,
    post: impl FnOnce(*mut ffi::ibv_recv_wr, *mut *mut ffi::ibv_recv_wr) -> std::ffi::c_int,
) -> (std::ffi::c_int, Vec<(u64, WrBuffers)>) {
    if wrs.is_empty() {
        return (0, wrs);
    }
    let mut sges: Vec<ffi::ibv_sge> = Vec::new();
    let mut sge_at = Vec::with_capacity(wrs.len());
    for (_, b) in &wrs {
        sge_at.push((sges.len(), b.len()));
        b.for_each(|m| sges.push(m.sge()));
    }
    let mut raw: Vec<ffi::ibv_recv_wr> = sge_at
        .iter()
        .enumerate()
        .map(|(i, &(at, n))| ffi::ibv_recv_wr {
            wr_id: ring.wr_id(i as u32),
            next: std::ptr::null_mut(),
            sg_list: if n == 0 {
                std::ptr::null_mut()
            } else {
                sges[at..].as_mut_ptr()
            },
            num_sge: n as std::ffi::c_int,
        })
        .collect();
    let base = raw.as_mut_ptr();
    for i in 1..raw.len() {
        // SAFETY: `i` and `i - 1` are in bounds; `raw` is not reallocated.
        unsafe { (*base.add(i - 1)).next = base.add(i) };
    }
    let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
    // The chain's SGEs point into memory held by `wrs`, which is parked below
    // before the producer publishes it (a poll that sees a completion first
    // waits for that).
    let rc = post(base, &mut bad);
    let posted = if rc == 0 {
        wrs.len()
    } else if bad.is_null() {
        0
    } else {
        // SAFETY: the provider points `bad` into the chain it was given.
        usize::try_from(unsafe { bad.offset_from(base) }).unwrap_or(0)
    };
    let mut rest = wrs;
    let unposted = rest.split_off(posted);
    for (wr_id, buffers) in rest {
        ring.push(Pending {
            wr_id,
            buffers,
            _ah: None,
            _mw: None,
        });
    }
    (rc, unposted)
}

/// [`post_recvs`] for one request with at most four scatter/gather entries,
/// without touching the heap. Returns the request when it was not posted.
pub(crate) fn post_recv_one(
    mut ring: Producer<'_>,
    wr_id: u64,
    buffers: WrBuffers,
    post: impl FnOnce(*mut ffi::ibv_recv_wr, *mut *mut ffi::ibv_recv_wr) -> std::ffi::c_int,
) -> (std::ffi::c_int, Option<(u64, WrBuffers)>) {
    let mut sges = [ffi::ibv_sge::default(); 4];
    let mut n = 0;
    buffers.for_each(|m| {
        if n < sges.len() {
            sges[n] = m.sge();
        }
        n += 1;
    });
    if n > sges.len() {
        let (rc, mut rest) = post_recvs(ring, vec![(wr_id, buffers)], post);
        return (rc, rest.pop());
    }
    let mut raw = ffi::ibv_recv_wr {
        wr_id: ring.wr_id(0),
        next: std::ptr::null_mut(),
        sg_list: if n == 0 {
            std::ptr::null_mut()
        } else {
            sges.as_mut_ptr()
        },
        num_sge: n as std::ffi::c_int,
    };
    let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
    // As in `post_recvs`: the memory is parked below, then published.
    let rc = post(&mut raw, &mut bad);
    if rc != 0 {
        return (rc, Some((wr_id, buffers)));
    }
    ring.push(Pending {
        wr_id,
        buffers,
        _ah: None,
        _mw: None,
    });
    (0, None)
}

/// The queues whose completions a CQ may report, by serial.
///
/// Holds each tracker strongly: a QP or SRQ unregisters itself after it is
/// destroyed (and before it releases its memory), so resolving a batch takes
/// one lock and no reference-count traffic while the same queue keeps
/// completing.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    queues: Spin<Queues>,
}

/// A registry's queues: a map by serial, so that a CQ shared by thousands of
/// QPs resolves a completion, registers and unregisters a QP in constant
/// time, and in front of it the queue resolved last, so that a CQ serving
/// one queue (or a burst of one queue's completions) never hashes.
#[derive(Debug, Default)]
struct Queues {
    /// The queue resolved last: also in `map`, so dropping this reference
    /// never frees a tracker (unregistering clears both, outside the lock).
    last: Option<(u32, Arc<Tracker>)>,
    map: std::collections::HashMap<u32, Arc<Tracker>, SerialHash>,
}

/// Hashes serials (a counter) with one multiplication: distinct serials get
/// distinct low bits (the multiplier is odd) and well-mixed high bits, which
/// is what the map's bucket index and tag take.
#[derive(Debug, Default, Clone, Copy)]
struct SerialHash;

impl std::hash::BuildHasher for SerialHash {
    type Hasher = SerialHasher;
    fn build_hasher(&self) -> SerialHasher {
        SerialHasher(0)
    }
}

struct SerialHasher(u64);

impl std::hash::Hasher for SerialHasher {
    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.0 = u64::from(v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only serials (u32) are hashed; any other key still gets a hash.
        for &b in bytes {
            self.write_u32(((self.0 >> 32) as u32) ^ u32::from(b));
        }
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

impl Registry {
    #[inline]
    fn queues(&self) -> SpinGuard<'_, Queues> {
        self.queues.lock()
    }

    pub fn register(&self, t: &Arc<Tracker>) {
        // A tracker registered twice (an SRQ's, once per QP on this CQ) is
        // kept once.
        let mut q = self.queues();
        q.map.entry(t.serial).or_insert_with(|| Arc::clone(t));
    }

    pub fn unregister(&self, serial: u32) {
        let gone = {
            let mut q = self.queues();
            let last = q.last.take_if(|(s, _)| *s == serial);
            (q.map.remove(&serial), last)
        };
        // Dropped outside the lock (a last tracker reference frees memory).
        drop(gone);
    }

    /// Number of queues registered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.queues().map.len()
    }

    /// The completion of one polled work completion. For safe posts, the
    /// caller's `wr_id` replaces ours and the request's memory is attached.
    #[inline]
    pub fn completion(&self, wc: &ffi::ibv_wc) -> Completion {
        let mut c = Completion::from_raw(wc);
        self.attach(&mut c);
        c
    }

    /// Attaches the memory of a safe post to `c` (built from a polled work
    /// completion, without memory): what [`Registry::completion`] does in
    /// place.
    #[inline]
    pub fn attach(&self, c: &mut Completion) {
        if c.wr_id & TAG != 0 {
            let mut later = Vec::new();
            self.fill(&mut self.queues(), c, &mut later);
            Kept::release(later);
        }
    }

    /// Appends the completions of a poll batch to `out`, as
    /// [`Registry::completion`] does for one; one lock for the batch.
    pub fn extend(&self, wcs: &[ffi::ibv_wc], out: &mut Vec<Completion>) {
        out.reserve(wcs.len());
        let mut later = Vec::new();
        {
            let mut queues = None;
            for wc in wcs {
                let mut c = Completion::from_raw(wc);
                if c.wr_id & TAG != 0 {
                    let queues = queues.get_or_insert_with(|| self.queues());
                    self.fill(queues, &mut c, &mut later);
                }
                out.push(c);
            }
        }
        // The keep-alives are dropped here, after the locks.
        Kept::release(later);
    }

    /// Resolves one completion with our id, under the registry's lock.
    #[inline]
    fn fill(&self, q: &mut SpinGuard<'_, Queues>, c: &mut Completion, later: &mut Vec<Kept>) {
        let Some((serial, recv, seq)) = decode(c.wr_id) else {
            return;
        };
        let q: &mut Queues = q;
        if !matches!(&q.last, Some((s, _)) if *s == serial) {
            let Some(t) = q.map.get(&serial) else {
                // The queue is gone: its memory was released after it was
                // destroyed.
                c.wr_id &= !(TAG | RECV);
                return;
            };
            // The previous `last` is in the map too: replacing it only
            // lowers its count.
            q.last = Some((serial, Arc::clone(t)));
        }
        if let Some((_, t)) = &q.last {
            t.complete(recv, seq, c, later, self);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(t: &Tracker, recv: bool, wr_id: u64) -> u32 {
        // SAFETY: tests post from one thread at a time.
        let mut p = unsafe { t.producer(recv) };
        let seq = p.next_seq();
        p.push(Pending {
            wr_id,
            buffers: WrBuffers::None,
            _ah: None,
            _mw: None,
        });
        seq
    }

    fn wc(id: u64) -> ffi::ibv_wc {
        ffi::ibv_wc {
            wr_id: id,
            ..Default::default()
        }
    }

    fn qp(reg: &Registry) -> Arc<Tracker> {
        Tracker::for_qp(reg, reg)
    }

    #[test]
    fn spin_lock_excludes() {
        // Miri explores interleavings and is slow: fewer rounds there.
        const ROUNDS: u64 = if cfg!(miri) { 200 } else { 20_000 };
        let n = Arc::new(Spin::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let n = Arc::clone(&n);
                std::thread::spawn(move || {
                    for _ in 0..ROUNDS {
                        // A read-modify-write that loses updates unless the
                        // lock excludes the other threads.
                        let mut g = n.lock();
                        let v = *g;
                        std::hint::black_box(&v);
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*n.lock(), 4 * ROUNDS);
    }

    #[test]
    fn ids_round_trip() {
        let id = encode(0x2abc_def1, true, 0xffff_fffe);
        assert_eq!(decode(id), Some((0x2abc_def1, true, 0xffff_fffe)));
        assert_eq!(decode(encode(5, false, 0)), Some((5, false, 0)));
        assert_eq!(decode(42), None);
    }

    #[test]
    fn send_completion_releases_earlier_unsignaled_requests() {
        let reg = Registry::default();
        let t = qp(&reg);
        pending(&t, false, 10);
        pending(&t, false, 11);
        let c = pending(&t, false, 12);
        let mut done = Vec::new();
        reg.extend(&[wc(encode(t.serial, false, c))], &mut done);
        assert_eq!(done[0].wr_id, 12);
        let ids: Vec<u64> = done[0].unsignaled.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, [10, 11]);
        assert_eq!(t.in_flight(), (0, 0));
    }

    #[test]
    fn receive_completion_takes_only_its_entry() {
        let reg = Registry::default();
        let t = qp(&reg);
        let first = pending(&t, true, 1);
        let second = pending(&t, true, 2);
        let third = pending(&t, true, 3);
        let done = [reg.completion(&wc(encode(t.serial, true, second)))];
        assert_eq!(done[0].wr_id, 2);
        assert_eq!(t.in_flight(), (0, 2));
        // The same completion again finds a hole: bare, nothing released.
        let again = reg.completion(&wc(encode(t.serial, true, second)));
        assert!(decode(again.wr_id).is_some(), "left with our id");
        assert_eq!(t.in_flight(), (0, 2));
        // The oldest one moves the head past the hole.
        assert_eq!(reg.completion(&wc(encode(t.serial, true, first))).wr_id, 1);
        assert_eq!(t.in_flight(), (0, 1));
        assert_eq!(reg.completion(&wc(encode(t.serial, true, third))).wr_id, 3);
        assert_eq!(t.in_flight(), (0, 0));
    }

    #[test]
    fn completions_of_a_dropped_qp_pass_through_bare() {
        let reg = Registry::default();
        let mut t = qp(&reg);
        let seq = pending(&t, false, 7);
        let id = encode(t.serial, false, seq);
        // What a QP's teardown does after destroying the QP.
        reg.unregister(t.serial);
        let drained = Arc::get_mut(&mut t).expect("unregistered").drain();
        assert_eq!(drained.len(), 1);
        let done = [reg.completion(&wc(id))];
        assert!(done[0].buffers.is_empty());
        assert_eq!(decode(done[0].wr_id), None);
    }

    #[test]
    fn a_cq_shared_by_many_queues_resolves_each_completion() {
        // Many QPs on one CQ (a server's connections): completions arrive
        // interleaved, each finds its own queue; queues come and go.
        const N: usize = if cfg!(miri) { 40 } else { 2000 };
        let reg = Registry::default();
        let qps: Vec<Arc<Tracker>> = (0..N).map(|_| qp(&reg)).collect();
        assert_eq!(reg.len(), N);
        // Registering again (an SRQ's tracker, once per QP) keeps one entry.
        reg.register(&qps[0]);
        assert_eq!(reg.len(), N);
        let ids: Vec<u64> = qps
            .iter()
            .enumerate()
            .map(|(i, t)| encode(t.serial, false, pending(t, false, i as u64)))
            .collect();
        // Every other queue goes away first (teardown order: unregister,
        // then drain).
        let mut qps: Vec<Option<Arc<Tracker>>> = qps.into_iter().map(Some).collect();
        for slot in qps.iter_mut().skip(1).step_by(2) {
            let mut t = slot.take().expect("registered above");
            reg.unregister(t.serial);
            assert_eq!(Arc::get_mut(&mut t).expect("unregistered").drain().len(), 1);
        }
        assert_eq!(reg.len(), N.div_ceil(2));
        // Completions in an order that defeats a most-recently-used list:
        // from the last queue to the first, the same queue never twice in
        // a row.
        let wcs: Vec<ffi::ibv_wc> = ids.iter().rev().map(|&id| wc(id)).collect();
        let mut done = Vec::new();
        reg.extend(&wcs, &mut done);
        for (c, i) in done.iter().zip((0..N).rev()) {
            if i % 2 == 0 {
                assert_eq!(c.wr_id, i as u64, "queue {i} kept its request");
            } else {
                assert_eq!(decode(c.wr_id), None, "queue {i} is gone");
                assert!(c.buffers.is_empty());
            }
        }
        for t in qps.iter().flatten() {
            assert_eq!(t.in_flight(), (0, 0));
        }
        // The queue resolved last can go too; its completions then pass.
        let last = qps[0].take().expect("kept");
        reg.unregister(last.serial);
        assert_eq!(decode(reg.completion(&wc(ids[0])).wr_id), None);
        assert_eq!(Arc::strong_count(&last), 1, "the registry let go of it");
    }

    #[test]
    fn a_queue_is_consumed_only_through_its_own_cq() {
        let (send, recv, other) = (
            Registry::default(),
            Registry::default(),
            Registry::default(),
        );
        let t = Tracker::for_qp(&send, &recv);
        other.register(&t);
        let s = pending(&t, false, 1);
        let r = pending(&t, true, 2);
        // A send completion polled from the receive CQ (or any other) is
        // left bare and the request stays in flight.
        let wrong = recv.completion(&wc(encode(t.serial, false, s)));
        assert_eq!(decode(wrong.wr_id), None);
        let wrong = other.completion(&wc(encode(t.serial, true, r)));
        assert_eq!(decode(wrong.wr_id), None);
        assert_eq!(t.in_flight(), (1, 1));
        assert_eq!(send.completion(&wc(encode(t.serial, false, s))).wr_id, 1);
        assert_eq!(recv.completion(&wc(encode(t.serial, true, r))).wr_id, 2);
        assert_eq!(t.in_flight(), (0, 0));
    }

    #[test]
    fn queue_crosses_blocks_and_reuses_them() {
        let reg = Registry::default();
        let t = qp(&reg);
        let mut seqs = std::collections::VecDeque::new();
        // Several blocks deep, drained and refilled, across the u32 wrap of
        // nothing (sequence numbers start at 0) but many block boundaries.
        for round in 0..5u64 {
            for i in 0..(BLOCK as u64 * 3 + 5) {
                seqs.push_back((pending(&t, false, round * 1000 + i), round * 1000 + i));
            }
            while seqs.len() > 7 {
                let (seq, id) = seqs.pop_front().unwrap();
                assert_eq!(reg.completion(&wc(encode(t.serial, false, seq))).wr_id, id);
            }
            assert_eq!(t.in_flight(), (7, 0));
        }
        // One completion for the newest releases the rest as unsignaled.
        let (last, last_id) = seqs.pop_back().unwrap();
        let c = reg.completion(&wc(encode(t.serial, false, last)));
        assert_eq!(c.wr_id, last_id);
        let ids: Vec<u64> = c.unsignaled.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, seqs.iter().map(|(_, id)| *id).collect::<Vec<_>>());
        assert_eq!(t.in_flight(), (0, 0));
    }

    #[test]
    fn a_queue_allocates_its_first_block_on_its_first_push() {
        let reg = Registry::default();
        let t = qp(&reg);
        let blocks = |q: &Queue| {
            // SAFETY: no producer or consumer runs in this test meanwhile.
            unsafe { ((*q.prod.get()).0.is_some(), (*q.cons.get()).is_some()) }
        };
        assert_eq!(blocks(&t.sq.queue), (false, false));
        assert_eq!(blocks(&t.rq.queue), (false, false));
        // A completion for a queue that never had an entry is left bare.
        let stray = reg.completion(&wc(encode(t.serial, true, 0)));
        assert_eq!(stray.wr_id, encode(t.serial, true, 0));
        let seq = pending(&t, true, 42);
        assert_eq!(blocks(&t.rq.queue), (true, true));
        assert_eq!(blocks(&t.sq.queue), (false, false));
        assert_eq!(reg.completion(&wc(encode(t.serial, true, seq))).wr_id, 42);
        assert_eq!(t.in_flight(), (0, 0));
        // A tracker that never posted drops without a block to free.
        drop(Tracker::shared());
    }

    #[test]
    fn a_shared_queue_takes_posts_and_polls_from_many_threads() {
        const N: u64 = if cfg!(miri) { 40 } else { 4_000 };
        let regs: Arc<[Registry; 2]> = Arc::new([Registry::default(), Registry::default()]);
        let t = Tracker::shared();
        regs[0].register(&t);
        regs[1].register(&t);
        let (tx, rx) = std::sync::mpsc::channel::<u64>();
        let posters: Vec<_> = (0..2u64)
            .map(|k| {
                let (t, tx) = (Arc::clone(&t), tx.clone());
                std::thread::spawn(move || {
                    for i in 0..N {
                        let seq = pending(&t, true, k * N + i);
                        tx.send(encode(t.serial, true, seq)).unwrap();
                    }
                })
            })
            .collect();
        drop(tx);
        let ids: Vec<u64> = rx.iter().collect();
        for p in posters {
            p.join().unwrap();
        }
        // Two pollers, each on its own CQ, complete everything.
        let halves: Vec<Vec<u64>> = ids.chunks(ids.len() / 2).map(<[u64]>::to_vec).collect();
        let pollers: Vec<_> = halves
            .into_iter()
            .enumerate()
            .map(|(k, half)| {
                let regs = Arc::clone(&regs);
                std::thread::spawn(move || {
                    half.iter()
                        .map(|&id| regs[k].completion(&wc(id)).wr_id)
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        let mut got: Vec<u64> = pollers
            .into_iter()
            .flat_map(|p| p.join().unwrap())
            .collect();
        got.sort_unstable();
        assert_eq!(got, (0..2 * N).collect::<Vec<_>>());
        assert_eq!(t.in_flight(), (0, 0));
    }

    #[test]
    fn a_qp_queue_between_a_producer_and_a_consumer_thread() {
        // The producer publishes after "posting" (as the QP does after the
        // provider call); the consumer polls completions it may see first.
        const N: u32 = if cfg!(miri) { 100 } else { 20_000 };
        let reg = Arc::new(Registry::default());
        let t = qp(&reg);
        let (tx, rx) = std::sync::mpsc::sync_channel::<u64>(64);
        let producer = {
            let t = Arc::clone(&t);
            std::thread::spawn(move || {
                for i in 0..N {
                    // SAFETY: the only producer of this queue.
                    let mut p = unsafe { t.producer(false) };
                    let seq = p.next_seq();
                    // The "completion" is visible before the push.
                    tx.send(encode(t.serial, false, seq)).unwrap();
                    p.push(Pending {
                        wr_id: u64::from(i),
                        buffers: WrBuffers::None,
                        _ah: None,
                        _mw: None,
                    });
                }
            })
        };
        for (i, id) in rx.iter().enumerate() {
            assert_eq!(reg.completion(&wc(id)).wr_id, i as u64);
        }
        producer.join().unwrap();
        assert_eq!(t.in_flight(), (0, 0));
    }
}
