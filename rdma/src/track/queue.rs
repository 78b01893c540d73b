//! The in-flight requests of one QP work queue: a FIFO with one producer
//! and one consumer and no atomic read-modify-write on its hot paths.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use super::lock::backoff;
use super::Pending;

/// One request in flight on the queue.
pub(super) enum Entry {
    /// A prepared request's send or receive, which holds nothing (its
    /// memory stays with the request): its `wr_id` is all there is, and a
    /// later completion that finishes it does not list it in
    /// [`Completion::unsignaled`](crate::Completion::unsignaled). Written
    /// and taken as two words: as a `Pending` it would cost a post five
    /// stores and a completion two tests (callgrind).
    Quiet(u64),
    /// Any other, whole.
    Held(Pending),
}

/// One slot of the ring: `None` when free (beyond the producer, or taken by
/// the consumer).
type Slot = UnsafeCell<Option<Entry>>;

/// The ring's storage: `cap` slots (a power of two, or 0 before the first
/// post), `mask` = `cap - 1`.
struct Storage {
    slots: *mut Slot,
    mask: u32,
    cap: u32,
}

impl Storage {
    const EMPTY: Storage = Storage {
        slots: std::ptr::null_mut(),
        mask: 0,
        cap: 0,
    };

    fn alloc(cap: u32) -> Storage {
        let slots: Box<[Slot]> = (0..cap).map(|_| UnsafeCell::new(None)).collect();
        Storage {
            slots: Box::into_raw(slots).cast::<Slot>(),
            mask: cap.wrapping_sub(1),
            cap,
        }
    }

    /// The slot of sequence number `seq`.
    ///
    /// # Safety
    /// The ring has slots (`cap` > 0).
    #[inline(always)]
    unsafe fn slot(&self, seq: u32) -> *mut Option<Entry> {
        // SAFETY: `seq & mask` < `cap`, the length of the allocation.
        unsafe { (*self.slots.add((seq & self.mask) as usize)).get() }
    }

    /// Frees the storage (its slots must be empty or their entries moved).
    fn free(&mut self) {
        if !self.slots.is_null() {
            let slice = std::ptr::slice_from_raw_parts_mut(self.slots, self.cap as usize);
            // SAFETY: allocated by `alloc` as a boxed slice of `cap` slots,
            // and freed once (the pointer is cleared).
            drop(unsafe { Box::from_raw(slice) });
            *self = Storage::EMPTY;
        }
    }
}

/// The requests in flight on one work queue, in posting order: a ring with
/// one producer and one consumer at a time, whose hot paths use no atomic
/// read-modify-write (the latency benchmark measured each locked
/// instruction; see CONVENTIONS.md) and no test of a block boundary.
///
/// Slot `seq & mask` holds the request with sequence number `seq` (wrapping
/// at `u32::MAX`; the capacity is a power of two, so the slot stays the same
/// across the wrap). The producer writes slots at and after `tail`, then
/// publishes them by storing `tail` (Release); the consumer reads only slots
/// before the `tail` it loaded (Acquire) and moves `head` on.
///
/// The ring is allocated at the first post, of the work queue's capacity
/// (the QP's `max_send_wr` or `max_recv_wr` rounded up to a power of two,
/// at most [`FIRST_CAP`]), which bounds the requests the provider holds;
/// completed requests whose completions were not polled yet count too, so a
/// post that would overfill it doubles it first ([`Queue::reserve`]). The
/// ring is replaced only then, before the post hands anything to the
/// provider and under the lock of the consumer (its CQ's registry), which
/// every consumer holds while it reads the ring: a consumer never sees a
/// ring being replaced.
/// Who may act as producer and consumer is decided by the `Ring` around it.
pub(crate) struct Queue {
    /// Published entries (sequence number of the next one), producer-written.
    tail: AtomicU32,
    /// Sequence number of the oldest entry, consumer-written.
    head: AtomicU32,
    /// Set by the producer while requests it handed to the provider may not
    /// be published yet: their completion can be polled in that window.
    posting: AtomicBool,
    /// Producer only: the entries written, published or not.
    staged: UnsafeCell<u32>,
    /// The storage: written by the producer alone, and only under the
    /// consumer's lock ([`Queue::reserve`]); read by the producer, and by
    /// the consumer under that lock.
    store: UnsafeCell<Storage>,
    /// The capacity of the first ring: the work queue's.
    first: u32,
}

// SAFETY: the queue owns `Pending` entries (which are Send) and its ring;
// the producer-only cell is reached only by the one producer its `Ring`
// admits, the ring is replaced only under the consumer's lock (see the unsafe
// methods' contracts), and slots pass between the producer and the consumer
// through the Release/Acquire pairs on `tail` and `head`.
unsafe impl Send for Queue {}
// SAFETY: as above.
unsafe impl Sync for Queue {}

const _: () = {
    const fn send<T: Send>() {}
    send::<Pending>();
};

/// The largest first ring: a deep work queue that carries little starts
/// with 64 KiB or so, not a megabyte, and doubles if its traffic needs it.
const FIRST_CAP: u32 = 1024;

/// The largest ring: sequence numbers are 32 bits, and the entries in flight
/// must have distinct slots.
const MAX_CAP: u32 = 1 << 31;

impl Queue {
    /// An empty queue for a work queue of `depth` requests. Its ring is
    /// allocated by its first post: a queue that is never posted to (a
    /// receive queue fed by an SRQ, a connection set up and torn down)
    /// costs no memory, and making one touches no fresh memory (setting up
    /// many connections, cmtime measured it: a page fault per QP).
    pub(super) fn new(depth: u32) -> Queue {
        Queue {
            tail: AtomicU32::new(0),
            head: AtomicU32::new(0),
            posting: AtomicBool::new(false),
            staged: UnsafeCell::new(0),
            store: UnsafeCell::new(Storage::EMPTY),
            first: depth.clamp(1, FIRST_CAP).next_power_of_two(),
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
        unsafe { *self.staged.get() }
    }

    /// Makes room for `n` more entries before a post: allocates the ring, or
    /// doubles it, under the consumer's lock (`lock`), when the entries in
    /// flight and `n` do not fit.
    ///
    /// # Safety
    /// The caller is the queue's only producer, between two posts (nothing
    /// staged and not published, `posting` clear: a consumer holding the
    /// lock never waits for this producer); `lock` takes the lock every
    /// consumer of the queue holds while it reads the ring.
    #[inline(always)]
    pub(super) unsafe fn reserve<G>(&self, n: u32, lock: impl FnOnce() -> G) {
        // SAFETY: the producer reads the ring, which only it replaces.
        let cap = unsafe { (*self.store.get()).cap };
        // SAFETY: the caller is the producer.
        let staged = unsafe { self.staged() };
        let used = staged.wrapping_sub(self.head.load(Ordering::Acquire));
        if u64::from(used) + u64::from(n) > u64::from(cap) {
            // SAFETY: the caller's contract.
            unsafe { self.grow(n, lock) };
        }
    }

    /// [`Queue::reserve`] when the ring is full (or not there yet).
    ///
    /// # Safety
    /// As [`Queue::reserve`].
    #[cold]
    #[inline(never)]
    unsafe fn grow<G>(&self, n: u32, lock: impl FnOnce() -> G) {
        let _consumers = lock();
        // SAFETY: the caller is the producer; no consumer runs (the lock).
        let staged = unsafe { self.staged() };
        let head = self.head.load(Ordering::Acquire);
        let used = staged.wrapping_sub(head);
        // A ring of 2^31 entries is beyond any memory; the allocation fails
        // (an abort) before the sequence numbers could alias.
        let want = used.saturating_add(n).clamp(1, MAX_CAP).next_power_of_two();
        let cap = want.max(self.first);
        // SAFETY: the producer alone replaces the ring, and no consumer
        // reads it while the lock is held.
        let old = unsafe { &mut *self.store.get() };
        if cap <= old.cap {
            return;
        }
        let new = Storage::alloc(cap);
        for i in 0..used {
            let seq = head.wrapping_add(i);
            // SAFETY: the entries from `head` to `staged` are in the old
            // ring (which has slots, as it holds them); the new one has
            // `cap` slots; nobody else touches either now.
            unsafe { new.slot(seq).write((*old.slot(seq)).take()) };
        }
        old.free();
        *old = new;
    }

    /// Writes `p` as entry `staged` (not yet visible to the consumer).
    ///
    /// # Safety
    /// The caller is the queue's only producer, and reserved a slot for the
    /// entry ([`Queue::reserve`]) before the post.
    #[inline]
    pub(super) unsafe fn push(&self, p: Pending) {
        // SAFETY: the caller's contract.
        unsafe { self.push_with(|| Entry::Held(p)) }
    }

    /// [`Queue::push`] of a prepared request's [`Entry::Quiet`], built in
    /// its slot: built by the caller, it would be built on the stack and
    /// copied (callgrind).
    ///
    /// # Safety
    /// As [`Queue::push`].
    #[inline(always)]
    pub(super) unsafe fn push_quiet(&self, wr_id: u64) {
        // SAFETY: the caller's contract.
        unsafe { self.push_with(|| Entry::Quiet(wr_id)) }
    }

    /// Writes what `make` returns as entry `staged`.
    ///
    /// # Safety
    /// As [`Queue::push`].
    #[inline(always)]
    unsafe fn push_with(&self, make: impl FnOnce() -> Entry) {
        // SAFETY: producer-only cell, and the caller is the producer.
        let staged = unsafe { &mut *self.staged.get() };
        // The caller's contract, checked where it costs nothing.
        #[cfg(debug_assertions)]
        {
            // SAFETY: the producer reads the ring, which only it replaces.
            let cap = unsafe { (*self.store.get()).cap };
            let used = staged.wrapping_sub(self.head.load(Ordering::Relaxed));
            assert!(used < cap, "a push past the slots reserved before the post");
        }
        // SAFETY: the producer reads the ring, which only it replaces; the
        // slot was reserved, so the ring has slots and slot `staged` is not
        // one of an entry in flight: it is at or after `tail` (the consumer
        // does not touch it) and free (`None`: nothing to drop), so it is
        // written without reading it first.
        unsafe { (*self.store.get()).slot(*staged).write(Some(make())) };
        *staged = staged.wrapping_add(1);
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
        // Usually published long ago: one load.
        if off < self.tail.load(Ordering::Acquire).wrapping_sub(head) {
            return Some(off);
        }
        self.find_posted(head, off)
    }

    /// [`Queue::find`] when `seq` was not published at the first look.
    #[cold]
    #[inline(never)]
    fn find_posted(&self, head: u32, off: u32) -> Option<u32> {
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
                    Entry::Quiet(id) => Pending::memory(id, crate::WrBuffers::None),
                    Entry::Held(p) => p,
                });
            });
        }
        out
    }

    /// Takes the entry at `head` for `f`, empties its slot and moves `head`
    /// on.
    ///
    /// # Safety
    /// As [`Queue::advance`].
    #[inline(always)]
    pub(super) unsafe fn advance_with(&self, f: impl FnOnce(Entry)) {
        let head = self.head.load(Ordering::Relaxed);
        // A run of the one entry the caller knows is published.
        // SAFETY: the caller's contract.
        let mut run = unsafe { Run::new(self, head, head.wrapping_add(1)) };
        // SAFETY: the caller's contract: the only consumer, and `head` is
        // published.
        unsafe { run.take(f) };
    }

    /// A cursor over the published entries from `head` on, taken one by one
    /// in order, with `head` stored once when it is dropped: a poll's run of
    /// completions of this queue resolved as one, so that the tail is
    /// loaded, `head` stored and the orphans checked once per poll rather
    /// than once per completion.
    ///
    /// # Safety
    /// The caller is the queue's only consumer while the run lives.
    #[inline(always)]
    pub(super) unsafe fn run(&self) -> Run<'_> {
        let head = self.head.load(Ordering::Relaxed);
        let tail = self.tail.load(Ordering::Acquire);
        // SAFETY: the caller's contract.
        unsafe { Run::new(self, head, tail) }
    }

    /// Takes the `n` entries from `head` on, oldest first, handing each to
    /// `f`, and moves `head` past them: [`Queue::advance`] `n` times, with
    /// `head` stored once (a completion that releases a run of unsignaled
    /// requests).
    ///
    /// # Safety
    /// As [`Queue::advance`], for all `n` entries: the caller is the only
    /// consumer, and they are before the `tail` it loaded.
    #[inline]
    pub(super) unsafe fn advance_n(&self, n: usize, mut f: impl FnMut(Entry)) {
        let head = self.head.load(Ordering::Relaxed);
        // SAFETY: as in `advance_with`.
        let store = unsafe { &*self.store.get() };
        // The run as at most two stretches of slots, before and after the
        // ring's end, each walked as a slice: no slot index computed per
        // entry (callgrind).
        let start = (head & store.mask) as usize;
        let first = n.min(store.cap as usize - start);
        for (from, len) in [(start, first), (0, n - first)] {
            // SAFETY: `from + len` <= `cap`: the slots of published
            // entries (before the tail the caller loaded), which the
            // producer no longer touches.
            let run = unsafe { std::slice::from_raw_parts(store.slots.add(from), len) };
            for slot in run {
                // SAFETY: as above; the consumer alone takes them.
                if let Some(e) = unsafe { (*slot.get()).take() } {
                    f(e);
                }
            }
        }
        self.head
            .store(head.wrapping_add(n as u32), Ordering::Release);
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

/// The consumer's walk over published entries in order ([`Queue::run`]).
pub(super) struct Run<'q> {
    queue: &'q Queue,
    /// The ring, reached once: it is not replaced while a consumer runs
    /// (see [`Queue`]).
    store: &'q Storage,
    /// `head` when the run began.
    head: u32,
    /// The sequence number of the next entry to take.
    next: u32,
    /// The tail loaded when the run began: entries before it are published.
    end: u32,
}

impl Run<'_> {
    /// A run over the entries from `head` to `end`.
    ///
    /// # Safety
    /// The caller is the queue's only consumer while the run lives, and the
    /// entries from `head` to `end` are published.
    #[inline(always)]
    unsafe fn new(queue: &Queue, head: u32, end: u32) -> Run<'_> {
        // SAFETY: the consumer reads the ring under the lock the producer
        // replaces it under (the caller's contract).
        let store = unsafe { &*queue.store.get() };
        Run {
            queue,
            store,
            head,
            next: head,
            end,
        }
    }

    /// The number of entries left that were published when the run began.
    #[inline(always)]
    pub fn published(&self) -> u32 {
        self.end.wrapping_sub(self.next)
    }

    /// The sequence number of the next entry.
    #[inline(always)]
    pub fn next_seq(&self) -> u32 {
        self.next
    }

    /// Takes the next entry for `f`, as [`Queue::advance_with`] does, and
    /// moves on.
    ///
    /// # Safety
    /// [`Run::published`] is not 0.
    #[inline(always)]
    pub unsafe fn take(&mut self, f: impl FnOnce(Entry)) {
        // SAFETY: the run's contract makes this the only consumer; entry
        // `next` is before the Acquire-loaded tail (the caller's contract),
        // so the ring has slots and the producer no longer touches it.
        let slot = unsafe { &mut *self.store.slot(self.next) };
        self.next = self.next.wrapping_add(1);
        match slot {
            Some(Entry::Quiet(wr_id)) => {
                let wr_id = *wr_id;
                // Emptied without a test for drop glue.
                // SAFETY: a valid place, and the value overwritten owns
                // nothing.
                unsafe { std::ptr::write(slot, None) };
                f(Entry::Quiet(wr_id));
            }
            _ => {
                if let Some(e) = slot.take() {
                    f(e);
                }
            }
        }
    }

    /// The number of entries taken.
    #[inline(always)]
    pub fn taken(&self) -> u32 {
        self.next.wrapping_sub(self.head)
    }
}

impl Drop for Run<'_> {
    /// Moves `head` past the entries taken, once.
    #[inline(always)]
    fn drop(&mut self) {
        if self.next != self.head {
            self.queue.head.store(self.next, Ordering::Release);
        }
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no producer or consumer runs.
        drop(unsafe { self.drain() });
        self.store.get_mut().free();
    }
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").field("len", &self.len()).finish()
    }
}
