//! The in-flight requests of one QP work queue: a FIFO with one producer
//! and one consumer and no atomic read-modify-write on its hot paths.

use std::cell::UnsafeCell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};

use super::lock::backoff;
use super::Pending;

/// Entries per block of a [`Queue`] (a power of two, so indices that wrap at
/// `u32::MAX` stay consistent).
const BLOCK: usize = 32;

/// Passed blocks the consumer keeps for the producer while it has not taken
/// the last ones handed back: a completion that releases a run of unsignaled
/// requests passes several blocks at once, which the producer then needs
/// one by one (callgrind: a `malloc` and a `free` per block otherwise). More
/// are freed.
const KEEP_PASSED: u32 = 4;

/// An entry [`Queue::advance_with`] takes.
pub(super) enum Entry {
    /// A prepared request's ([`Pending::quiet`]): its `wr_id` is all it has.
    Quiet(u64),
    /// Any other, whole.
    Held(Pending),
}

/// A block of queue slots; blocks form a singly linked list from the
/// consumer's block to the producer's.
struct Block {
    /// `None`: free (beyond the producer) or taken (behind the consumer).
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
/// consumer hands the blocks it has passed back through `spare` (or frees
/// them).
/// Who may act as producer and consumer is decided by the `Ring` around it.
pub(crate) struct Queue {
    /// Published entries (sequence number of the next one), producer-written.
    tail: AtomicU32,
    /// Sequence number of the oldest entry, consumer-written.
    head: AtomicU32,
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
    /// Consumer only: passed blocks not handed back yet (a chain through
    /// `next`), and how many.
    passed: UnsafeCell<(Option<NonNull<Block>>, u32)>,
    /// Passed blocks the consumer hands back for reuse, a chain through
    /// `next` (null: none); only the consumer stores one, only into a null
    /// `spare`, and only the producer takes it (whole).
    spare: AtomicPtr<Block>,
    /// Producer only: the blocks it took from `spare` and has not used yet.
    reuse: UnsafeCell<Option<NonNull<Block>>>,
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
    pub(super) fn new() -> Queue {
        Queue {
            tail: AtomicU32::new(0),
            head: AtomicU32::new(0),
            posting: AtomicBool::new(false),
            prod: UnsafeCell::new((None, 0)),
            cons: UnsafeCell::new(None),
            passed: UnsafeCell::new((None, 0)),
            spare: AtomicPtr::new(std::ptr::null_mut()),
            reuse: UnsafeCell::new(None),
        }
    }

    /// Entries in flight (a snapshot when other threads post or poll).
    pub(super) fn len(&self) -> usize {
        // Head first: the tail loaded after it is never behind it.
        let head = self.head.load(Ordering::Acquire);
        let tail = self.tail.load(Ordering::Acquire);
        tail.wrapping_sub(head) as usize
    }

    /// Whether entry `seq` was published and is still in flight (its
    /// completion not resolved, nor the queue drained). A snapshot: another
    /// thread's poll may resolve it at once; once `false` for an entry that
    /// was published, it stays `false`, and the consumer's work on it
    /// (Release store of `head`) happened before (Acquire load).
    pub(super) fn holds(&self, seq: u32) -> bool {
        let head = self.head.load(Ordering::Acquire);
        let tail = self.tail.load(Ordering::Acquire);
        seq.wrapping_sub(head) < tail.wrapping_sub(head)
    }

    // --- producer side ---

    /// # Safety
    /// The caller is the queue's only producer.
    #[inline]
    pub(super) unsafe fn staged(&self) -> u32 {
        // SAFETY: producer-only cell, and the caller is the producer.
        unsafe { (*self.prod.get()).1 }
    }

    /// Writes `p` as entry `staged` (not yet visible to the consumer).
    ///
    /// # Safety
    /// The caller is the queue's only producer.
    #[inline]
    pub(super) unsafe fn push(&self, p: Pending) {
        // SAFETY: the caller's contract.
        unsafe { self.push_with(|| p) }
    }

    /// [`Queue::push`] of [`Pending::quiet`]`(wr_id)`, built in its slot
    /// (callgrind: built by the caller, it was built on the stack and
    /// copied, 8 instructions more per post).
    ///
    /// # Safety
    /// The caller is the queue's only producer.
    #[inline(always)]
    pub(super) unsafe fn push_quiet(&self, wr_id: u64) {
        // SAFETY: the caller's contract.
        unsafe { self.push_with(|| Pending::quiet(wr_id)) }
    }

    /// Writes what `make` returns as entry `staged`.
    ///
    /// # Safety
    /// The caller is the queue's only producer.
    #[inline(always)]
    unsafe fn push_with(&self, make: impl FnOnce() -> Pending) {
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
        // not touch it; it is free (`None`: nothing to drop), so it is
        // written without reading it first.
        unsafe { slot.write(Some(make())) };
        *staged = staged.wrapping_add(1);
        if *staged as usize % BLOCK == 0 {
            // SAFETY: the caller is the producer.
            let next = unsafe { self.next_block() };
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

    /// A block for the producer to fill next: one the consumer handed back,
    /// or a new one.
    ///
    /// # Safety
    /// The caller is the queue's only producer.
    unsafe fn next_block(&self) -> NonNull<Block> {
        // SAFETY: producer-only cell, and the caller is the producer.
        let reuse = unsafe { &mut *self.reuse.get() };
        if reuse.is_none() {
            *reuse = NonNull::new(self.spare.load(Ordering::Acquire));
            if reuse.is_some() {
                // Only the consumer stores into `spare`, and only when it is
                // null: until this store, it leaves the chain alone. The
                // Acquire load above made the chain's links visible.
                self.spare.store(std::ptr::null_mut(), Ordering::Release);
            }
        }
        match *reuse {
            Some(b) => {
                // SAFETY: a block of the chain the producer owns now.
                let b_ref = unsafe { b.as_ref() };
                *reuse = NonNull::new(b_ref.next.load(Ordering::Relaxed));
                b_ref.next.store(std::ptr::null_mut(), Ordering::Relaxed);
                b
            }
            None => Block::alloc(),
        }
    }

    /// Marks the start of a post: completions of the requests handed to the
    /// provider from now on may be polled before [`Queue::publish`].
    ///
    /// # Safety
    /// The caller is the queue's only producer.
    #[inline]
    pub(super) unsafe fn begin(&self) {
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
    pub(super) unsafe fn publish(&self) {
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
    pub(super) unsafe fn find(&self, seq: u32) -> Option<u32> {
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

    /// Takes the entry at `head` and moves `head` on.
    ///
    /// # Safety
    /// The caller is the queue's only consumer, and `head` is before the
    /// `tail` it loaded ([`Queue::find`] returned an offset past it).
    #[inline]
    pub(super) unsafe fn advance(&self) -> Option<Pending> {
        let mut out = None;
        // SAFETY: the caller's contract.
        unsafe {
            self.advance_with(|e| {
                out = Some(match e {
                    Entry::Quiet(id) => Pending::quiet(id),
                    Entry::Held(p) => p,
                });
            });
        }
        out
    }

    /// Takes the entry at `head` for `f`, empties its slot and moves `head`
    /// on: a prepared request's entry ([`Pending::quiet`]) as its `wr_id`
    /// alone, read in place and forgotten (it holds nothing), any other
    /// whole. One test of the entry's kind.
    ///
    /// # Safety
    /// As [`Queue::advance`].
    #[inline(always)]
    pub(super) unsafe fn advance_with(&self, f: impl FnOnce(Entry)) {
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
        match slot {
            Some(p) if p.quiet => {
                let wr_id = p.wr_id;
                // A prepared request's entry holds nothing (see
                // `Pending::quiet`): emptied without its drop glue.
                // SAFETY: a valid place, and the value overwritten owns
                // nothing.
                unsafe { std::ptr::write(slot, None) };
                f(Entry::Quiet(wr_id));
            }
            _ => {
                if let Some(p) = slot.take() {
                    f(Entry::Held(p));
                }
            }
        }
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

    /// Takes the `n` entries from `head` on, oldest first, handing each to
    /// `f`, and moves `head` past them: [`Queue::advance`] `n` times, with
    /// the block found once per block and `head` stored once (a completion
    /// that releases a run of unsignaled requests, callgrind: most of the
    /// per-request cost of a bandwidth loop's completions).
    ///
    /// # Safety
    /// As [`Queue::advance`], for all `n` entries: the caller is the only
    /// consumer, and they are before the `tail` it loaded.
    #[inline]
    pub(super) unsafe fn advance_n(&self, n: usize, mut f: impl FnMut(Pending)) {
        let mut head = self.head.load(Ordering::Relaxed);
        // SAFETY: consumer-only cell, and the caller is the consumer.
        let Some(block) = (unsafe { &mut *self.cons.get() }).as_mut() else {
            // Cannot happen: entries were published, so pushed.
            return;
        };
        let mut left = n;
        while left > 0 {
            // SAFETY: the consumer's block is live until the consumer frees it.
            let b = unsafe { block.as_ref() };
            let start = head as usize % BLOCK;
            let take = (BLOCK - start).min(left);
            for slot in &b.slots[start..start + take] {
                // SAFETY: published slots (before the tail the caller
                // loaded): the producer no longer touches them.
                if let Some(p) = unsafe { (*slot.get()).take() } {
                    f(p);
                }
            }
            head = head.wrapping_add(take as u32);
            left -= take;
            if head as usize % BLOCK == 0 {
                // The producer linked the next block before publishing the
                // last slot of this one.
                let Some(next) = NonNull::new(b.next.load(Ordering::Acquire)) else {
                    // Cannot happen (see above); stay on this block's last
                    // (now empty) slot rather than lose track, as `advance_with`.
                    self.head.store(head.wrapping_sub(1), Ordering::Release);
                    return;
                };
                let old = std::mem::replace(block, next);
                // SAFETY: every slot of `old` is behind `head` now.
                unsafe { self.recycle(old) };
            }
        }
        self.head.store(head, Ordering::Release);
    }

    /// Keeps a passed block for the producer (or frees it, when enough are
    /// kept), and hands the kept ones back when the producer has taken the
    /// last ones.
    ///
    /// # Safety
    /// The caller is the consumer and owns `b` (every slot is behind
    /// `head`, so empty).
    unsafe fn recycle(&self, b: NonNull<Block>) {
        // SAFETY: consumer-only cell, and the caller is the consumer.
        let (kept, n) = unsafe { &mut *self.passed.get() };
        if *n < KEEP_PASSED {
            // SAFETY: owned by the caller.
            unsafe { b.as_ref() }.next.store(
                kept.map_or(std::ptr::null_mut(), NonNull::as_ptr),
                Ordering::Relaxed,
            );
            *kept = Some(b);
            *n += 1;
        } else {
            // SAFETY: allocated by `Block::alloc` (a Box) and owned here.
            drop(unsafe { Box::from_raw(b.as_ptr()) });
        }
        if self.spare.load(Ordering::Acquire).is_null() {
            if let Some(chain) = kept.take() {
                *n = 0;
                // Release: the chain's links are visible to the producer
                // that loads it with Acquire.
                self.spare.store(chain.as_ptr(), Ordering::Release);
            }
        }
    }

    /// Removes every published entry, oldest first.
    ///
    /// # Safety
    /// The caller is the queue's only consumer.
    pub(super) unsafe fn drain(&self) -> Vec<Pending> {
        let mut all = Vec::new();
        while self.head.load(Ordering::Relaxed) != self.tail.load(Ordering::Acquire) {
            // SAFETY: the caller is the consumer; `head` is before the tail
            // just loaded.
            if let Some(p) = unsafe { self.advance() } {
                all.push(p);
            }
        }
        all
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no producer or consumer runs.
        drop(unsafe { self.drain() });
        // Free the chain from the consumer's block (the producer's is its
        // last), then the spare.
        let mut b = *self.cons.get_mut();
        while let Some(blk) = b {
            // SAFETY: the chain's blocks are owned by the queue, which goes.
            let boxed = unsafe { Box::from_raw(blk.as_ptr()) };
            b = NonNull::new(boxed.next.load(Ordering::Relaxed));
        }
        let chains = [
            NonNull::new(*self.spare.get_mut()),
            self.passed.get_mut().0,
            *self.reuse.get_mut(),
        ];
        for mut b in chains {
            while let Some(blk) = b {
                // SAFETY: a chain of unused blocks owned by the queue, which
                // goes.
                let boxed = unsafe { Box::from_raw(blk.as_ptr()) };
                b = NonNull::new(boxed.next.load(Ordering::Relaxed));
            }
        }
    }
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").field("len", &self.len()).finish()
    }
}
