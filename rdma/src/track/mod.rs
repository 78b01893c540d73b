//! Bookkeeping of the memory held by work requests in flight.
//!
//! Every work request posted through the safe API gets a `wr_id` of its own
//! (bit 63 set, bit 62 for a receive, the 30-bit serial of its QP or SRQ and
//! a 32-bit sequence number), and its memory is parked in its queue's
//! tracker until the completion with that id is polled. The caller's own
//! `wr_id` is kept beside the memory and put back into the [`Completion`].
//!
//! - A QP's send and receive queues ([`QpTracker`]) complete in posting
//!   order, so each is a FIFO ([`queue::Queue`]): a completion also releases
//!   the requests posted before it on the same queue (unsignaled sends, and
//!   receives whose completions were lost: a provider that cleaned them out
//!   of the CQ).
//! - A shared receive queue ([`SrqTracker`]) completes in any order on
//!   several CQs: its receives are kept by slot ([`slab::Slab`]).
//! - A CQ's [`Registry`] finds the tracker of a completion by serial, under
//!   one lock held from the poll to the resolution, so completions are
//!   resolved in the CQ's order whichever threads poll.
//! - Serials are unique among live trackers ([`serial`]), and a registry
//!   keeps a destroyed queue's tracker until its CQ is next polled empty, so
//!   a completion left in a CQ never resolves against another queue.
//!
//! Completions whose queue is gone find no tracker and are passed through
//! without memory (the queue's drop destroyed it, then released the memory).

mod lock;
mod queue;
mod recv;
mod registry;
mod serial;
mod sink;
mod slab;

use std::sync::Arc;

use crate::ffi;
use crate::wr::WrBuffers;
use crate::AddressHandle;

pub(crate) use lock::Spin;

use queue::{Entry, Queue};
pub(crate) use recv::post_chain;
pub(crate) use registry::{Registry, Tracked};
pub(crate) use serial::{allocate_serial, Serial};
pub(crate) use sink::{Batch, CompactBatch, Sink};
use slab::Slab;

pub(crate) const TAG: u64 = 1 << 63;
const RECV: u64 = 1 << 62;

pub(crate) fn encode(serial: u32, recv: bool, seq: u32) -> u64 {
    TAG | if recv { RECV } else { 0 } | (u64::from(serial & serial::MASK) << 32) | u64::from(seq)
}

/// What [`encode`] put in: the tests read ids with it (polls compare the
/// upper half whole, see `Registry`).
#[cfg(test)]
pub(crate) fn decode(wr_id: u64) -> Option<(u32, bool, u32)> {
    if wr_id & TAG == 0 {
        return None;
    }
    let serial = ((wr_id >> 32) as u32) & serial::MASK;
    Some((serial, wr_id & RECV != 0, wr_id as u32))
}

/// One work request in flight.
#[derive(Debug)]
pub(crate) struct Pending {
    pub wr_id: u64,
    pub buffers: WrBuffers,
    /// Keeps a UD destination alive until the send completes.
    pub _ah: Option<AddressHandle>,
    /// A bind's window and region, kept until the bind finishes, which
    /// then tells the window how it ended.
    pub _bind: Option<Box<crate::mw::BindInFlight>>,
}

impl Pending {
    /// A request whose memory is all it keeps.
    pub fn memory(wr_id: u64, buffers: WrBuffers) -> Pending {
        Pending {
            wr_id,
            buffers,
            _ah: None,
            _bind: None,
        }
    }

    /// A posted send request: its memory, and its UD destination's address
    /// handle, held until its completion.
    pub fn send(wr: crate::wr::SendWr) -> Pending {
        Pending {
            wr_id: wr.wr_id,
            buffers: wr.buffers,
            _ah: wr.ud.map(|d| d.ah),
            _bind: None,
        }
    }

    /// Moves the request into `c`; what it kept alive goes to `later`.
    #[inline(always)]
    fn finish(self, c: &mut impl Sink, later: &mut Later) {
        let ok = self._bind.is_some() && c.ok();
        c.set_id(self.wr_id);
        c.own(self.buffers, later);
        later.keep(self._ah, self._bind, ok);
    }
}

impl Entry {
    /// Moves the request into `c` (a prepared request's: its id alone);
    /// what it kept alive goes to `later`.
    #[inline(always)]
    fn finish(self, c: &mut impl Sink, later: &mut Later) {
        match self {
            Entry::Quiet(wr_id) => c.set_id(wr_id),
            Entry::Held(p) => p.finish(c, later),
        }
    }
}

/// One QP work queue's requests and the registry whose polls consume them.
#[derive(Debug)]
struct Ring {
    queue: Queue,
    /// The registry of the one CQ the queue completes on: its polls, under
    /// its lock, are the queue's only consumer. Compared by address; reached
    /// only by a producer, whose QP keeps that CQ alive.
    consumer: std::ptr::NonNull<Registry>,
    /// What every `wr_id` of the queue carries above its sequence number
    /// ([`encode`] of the tracker's serial and the queue, sequence 0),
    /// computed once.
    prefix: u64,
}

// SAFETY: `consumer` is dereferenced only by a producer, whose caller keeps
// the registry alive (see `QpTracker::producer`), and a `Registry` is Sync
// (its state is behind its lock); the rest is Send and Sync.
unsafe impl Send for Ring {}
// SAFETY: as above.
unsafe impl Sync for Ring {}

/// The right to add requests to a QP's queue (a post, which holds the QP
/// mutably). Dropping it publishes what was pushed.
pub(crate) struct Producer<'a> {
    queue: &'a Queue,
    /// The ring's `prefix`: the tracker's serial and which queue.
    prefix: u64,
}

impl Producer<'_> {
    /// Our `wr_id` for the request `i` places after the next one.
    #[inline]
    pub fn wr_id(&self, i: u32) -> u64 {
        // SAFETY: a `Producer` is the queue's only producer while it lives.
        let next = unsafe { self.queue.staged() };
        self.prefix | u64::from(next.wrapping_add(i))
    }

    /// Parks a posted request's memory until its completion.
    #[inline]
    pub fn push(&mut self, p: Pending) {
        // SAFETY: as in `wr_id`.
        unsafe { self.queue.push(p) }
    }

    /// Records a prepared request's post: its `wr_id` is all it keeps.
    #[inline(always)]
    pub fn push_quiet(&mut self, wr_id: u64) {
        // SAFETY: as in `wr_id`.
        unsafe { self.queue.push_quiet(wr_id) }
    }
}

impl Drop for Producer<'_> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: as in `wr_id`.
        unsafe { self.queue.publish() }
    }
}

/// The in-flight work of one QP: its send and receive queue.
#[derive(Debug)]
pub(crate) struct QpTracker {
    serial: Serial,
    sq: Ring,
    rq: Ring,
    /// Regions of prepared requests dropped while a send they lent was in
    /// flight, each with the sequence number of its last send: released
    /// once the send queue has passed it (by the polls that resolve it, or
    /// when the QP is drained).
    orphans: Spin<Vec<Orphan>>,
    /// Whether `orphans` may hold something: the one load a completion
    /// pays for them.
    has_orphans: std::sync::atomic::AtomicBool,
}

/// A dropped prepared request's memory (its region, a UD request's address
/// handle), kept until its last request, `seq` of the send queue (or of the
/// receive queue, `recv`), is done.
pub(crate) struct Orphan {
    pub seq: u32,
    pub recv: bool,
    pub keep: Box<dyn Send>,
}

impl std::fmt::Debug for Orphan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Orphan")
            .field("seq", &self.seq)
            .field("recv", &self.recv)
            .finish_non_exhaustive()
    }
}

impl QpTracker {
    /// A QP's tracker, registered with the registries of its CQs: its send
    /// queue completes on the CQ of `send` (whose polls alone consume it),
    /// its receive queue on that of `recv`.
    ///
    /// `depth` is the QP's (send, receive) queue capacity, its created
    /// `max_send_wr` and `max_recv_wr`: the size of each queue's ring.
    pub fn new(
        serial: Serial,
        send: &Registry,
        recv: &Registry,
        depth: (u32, u32),
    ) -> Arc<QpTracker> {
        let prefix = |recv| encode(serial.get(), recv, 0);
        let (sq_prefix, rq_prefix) = (prefix(false), prefix(true));
        let t = Arc::new(QpTracker {
            serial,
            sq: Ring {
                queue: Queue::new(depth.0),
                consumer: std::ptr::NonNull::from(send),
                prefix: sq_prefix,
            },
            rq: Ring {
                queue: Queue::new(depth.1),
                consumer: std::ptr::NonNull::from(recv),
                prefix: rq_prefix,
            },
            orphans: Spin::default(),
            has_orphans: std::sync::atomic::AtomicBool::new(false),
        });
        send.register(Tracked::Qp(Arc::clone(&t)));
        if !std::ptr::eq(send, recv) {
            recv.register(Tracked::Qp(Arc::clone(&t)));
        }
        t
    }

    pub fn serial(&self) -> u32 {
        self.serial.get()
    }

    #[inline]
    fn ring(&self, recv: bool) -> &Ring {
        if recv {
            &self.rq
        } else {
            &self.sq
        }
    }

    /// Starts a post of at most `n` requests on the send (`recv` false) or
    /// receive queue: requests handed to the provider while the producer
    /// lives are pushed to it after the provider accepted them.
    ///
    /// # Safety
    /// The caller is the only one posting to that queue until the producer
    /// is dropped (it holds the `QueuePair` mutably), pushes at most `n`
    /// requests, and keeps the queue's CQs alive meanwhile (the QP holds
    /// them).
    #[inline]
    pub unsafe fn producer(&self, recv: bool, n: usize) -> Producer<'_> {
        let ring = self.ring(recv);
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        // SAFETY: the caller's contract makes this the only producer, before
        // its post; the consumer's registry is alive (the caller keeps its
        // CQ), and its polls read the ring under its lock.
        unsafe {
            ring.queue.reserve(n, || ring.consumer.as_ref().hold());
            ring.queue.begin();
        }
        Producer {
            queue: &ring.queue,
            prefix: ring.prefix,
        }
    }

    /// Whether the send with sequence number `seq` (posted and published)
    /// may still be in flight: its completion, or a later one of the send
    /// queue, not resolved yet.
    pub fn send_in_flight(&self, seq: u32) -> bool {
        self.request_in_flight(false, seq)
    }

    /// [`QpTracker::send_in_flight`] for the send (`recv` false) or receive
    /// queue.
    pub fn request_in_flight(&self, recv: bool, seq: u32) -> bool {
        self.ring(recv).queue.holds(seq)
    }

    /// Takes a dropped prepared request's memory, whose last request is
    /// `o.seq`, until that request is done.
    pub fn adopt(&self, o: Orphan) {
        use std::sync::atomic::Ordering;
        let (recv, seq) = (o.recv, o.seq);
        {
            let mut orphans = self.orphans.lock();
            orphans.push(o);
            self.has_orphans.store(true, Ordering::Relaxed);
        }
        // A poll that resolved `seq` between the caller's test and the push
        // may have missed the flag: take back what is done already. The
        // store-buffering pattern: this side stores the flag and then loads
        // the queue's `head`, a poll stores `head` and then loads the flag
        // (`release_orphans`). With a SeqCst fence between store and load on
        // both sides, at least one of them sees the other's store, so the
        // memory is released by whichever finishes last (a fence on this
        // side alone let both miss: Miri found it, see
        // `an_orphan_adopted_while_its_send_completes_is_released_by_one_side`).
        std::sync::atomic::fence(Ordering::SeqCst);
        if !self.request_in_flight(recv, seq) {
            let done = self.take_orphans(false);
            drop(done);
        }
    }

    /// Removes the orphans whose last send is done (`all`: every one, the
    /// QP being destroyed).
    fn take_orphans(&self, all: bool) -> Vec<Orphan> {
        let mut orphans = self.orphans.lock();
        let mut done = Vec::new();
        let mut i = 0;
        while i < orphans.len() {
            if all || !self.request_in_flight(orphans[i].recv, orphans[i].seq) {
                done.push(orphans.swap_remove(i));
            } else {
                i += 1;
            }
        }
        if orphans.is_empty() {
            self.has_orphans
                .store(false, std::sync::atomic::Ordering::Relaxed);
        }
        done
    }

    /// After a completion moved a queue on (its `head` stored): what
    /// orphans it released go to `later` (dropped after the registry's
    /// lock).
    #[inline(always)]
    fn release_orphans(&self, later: &mut Later) {
        // Pairs with the fence in `adopt` (the store-buffering pattern
        // described there): `head` stored before the flag is loaded. One
        // fence per run of a queue's completions, not per completion.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        if self.has_orphans.load(std::sync::atomic::Ordering::Relaxed) {
            self.release_orphans_slow(later);
        }
    }

    #[cold]
    #[inline(never)]
    fn release_orphans_slow(&self, later: &mut Later) {
        for o in self.take_orphans(false) {
            later.deferred().3.push(o.keep);
        }
    }

    /// Number of requests in flight on (send, receive) queue.
    pub fn in_flight(&self) -> (usize, usize) {
        (self.sq.queue.len(), self.rq.queue.len())
    }

    /// Takes everything in flight on one queue, for `by`'s registry, whose
    /// lock the caller holds (see [`Registry::reclaim`]).
    fn reclaim(&self, recv: bool, by: usize) -> Vec<Pending> {
        let ring = self.ring(recv);
        if !self.consumed_by(recv, by) {
            return Vec::new();
        }
        // SAFETY: the consumer: the polls of `by`'s CQ, whose lock is held.
        unsafe { ring.queue.drain() }
    }

    /// Removes and returns everything in flight, after the QP is destroyed
    /// and unregistered.
    ///
    /// # Safety
    /// Nobody posts to or consumes the queues any more: the QP is destroyed
    /// (and its owner holds it mutably), and its registries no longer map
    /// its serial.
    pub unsafe fn drain(&self) -> Vec<Pending> {
        // SAFETY: the caller's contract: this is the only consumer.
        let mut all = unsafe { self.sq.queue.drain() };
        // SAFETY: as above.
        all.extend(unsafe { self.rq.queue.drain() });
        // The QP is destroyed: nothing in flight any more.
        drop(self.take_orphans(true));
        all
    }

    /// Whether the polls of registry `by` consume the send (`recv` false)
    /// or receive queue: those of its CQ. A registry checks it once, when
    /// the queue's completions start coming (see `Registry`).
    pub(super) fn consumed_by(&self, recv: bool, by: usize) -> bool {
        self.ring(recv).consumer.as_ptr() as usize == by
    }

    /// Fills `c` (whose `wr_id` is our encoded id) from the matching entry,
    /// for a poll of the CQ that consumes the queue (the caller holds its
    /// registry's lock and checked [`QpTracker::consumed_by`]). What the
    /// entries kept alive goes to `later`.
    #[inline(always)]
    fn complete(&self, recv: bool, seq: u32, c: &mut impl Sink, later: &mut Later) {
        let ring = self.ring(recv);
        let q = &ring.queue;
        // SAFETY: this is the queue's only consumer: a QP's queue is
        // consumed only by its CQ's polls, which hold that CQ's registry
        // lock (the caller's contract), or by `drain` once nobody else can.
        match unsafe { q.find(seq) } {
            // Usually the oldest request in flight.
            Some(0) => {
                // SAFETY: the only consumer (above); `find` saw entry 0
                // published.
                unsafe {
                    // Inlined whole: left to itself, LLVM makes the closure a
                    // call of its own once `advance_with` is inlined, a call
                    // per completion (callgrind).
                    q.advance_with(
                        #[inline(always)]
                        |e| e.finish(c, later),
                    )
                };
            }
            // SAFETY: the only consumer (above); `find` saw `off` published.
            Some(off) => unsafe { Self::complete_after_others(q, off, c, later) },
            // Not in flight (released already, or reclaimed at a RESET):
            // left bare.
            None => {}
        }
        self.release_orphans(later);
    }

    /// Resolves the completions of `b` from `from` on while each is for
    /// the next request in flight on the send (`recv` false) or receive
    /// queue, published: a poll's usual run. Returns how many it resolved
    /// (0: `from`'s is not that one, see [`QpTracker::complete`]). The
    /// caller's contract is [`QpTracker::complete`]'s.
    #[inline(always)]
    fn complete_run<B: Batch + ?Sized>(
        &self,
        recv: bool,
        b: &mut B,
        from: usize,
        later: &mut Later,
    ) -> usize {
        let ring = self.ring(recv);
        // SAFETY: this is the queue's only consumer (the caller's contract,
        // as in `complete`).
        let mut run = unsafe { ring.queue.run() };
        // Read once: the loop's stores through `b` might alias it for all
        // the compiler knows.
        let prefix = ring.prefix;
        // One bound for the loop: the completions left, and the entries
        // published, so each completion tests one bound, not two.
        let end = b.len().min(from.saturating_add(run.published() as usize));
        let mut i = from;
        while i < end {
            // Our id of the next request: the queue's prefix and its
            // sequence number, compared whole.
            if b.id(i) != prefix | u64::from(run.next_seq()) {
                break;
            }
            // SAFETY: fewer entries taken than were published (`end`).
            unsafe {
                run.take(
                    #[inline(always)]
                    |e| e.finish(&mut b.item(i), later),
                )
            };
            i += 1;
        }
        let done = run.taken();
        drop(run);
        if done != 0 {
            self.release_orphans(later);
        }
        done as usize
    }

    /// [`QpTracker::complete_run`] over both queues at once, for a registry
    /// whose polls consume the send and the receive queue (a CQ that
    /// serves the QP's two queues: a ping-pong's poll returns a send's
    /// completion and a receive's together). Resolves the completions of
    /// `b` from `from` on while each is for the next published request of
    /// either queue; returns how many (0: `from`'s is neither, see
    /// [`QpTracker::complete`]). Each queue's tail is loaded and its `head`
    /// stored once, and the orphans are looked at once, for the whole pass.
    ///
    /// The caller holds the registry's lock and checked
    /// [`QpTracker::consumed_by`] for both queues (the two-queue form of
    /// [`QpTracker::complete`]'s contract).
    #[inline(always)]
    fn complete_both<B: Batch + ?Sized>(&self, b: &mut B, from: usize, later: &mut Later) -> usize {
        // SAFETY: the only consumer of both queues (the caller's contract,
        // as in `complete`).
        let (mut sq, mut rq) = unsafe { (self.sq.queue.run(), self.rq.queue.run()) };
        // Read once, as in `complete_run`.
        let (sp, rp) = (self.sq.prefix, self.rq.prefix);
        let mut i = from;
        while i < b.len() {
            // Our id of either queue's next request, compared whole: a
            // completion for anything else (a caller's own id, a request
            // not at the head, one released already or reclaimed at a
            // RESET, one not published yet) ends the pass.
            let id = b.id(i);
            if id == sp | u64::from(sq.next_seq()) && sq.published() != 0 {
                // SAFETY: an entry published when the run began.
                unsafe {
                    sq.take(
                        #[inline(always)]
                        |e| e.finish(&mut b.item(i), later),
                    )
                };
            } else if id == rp | u64::from(rq.next_seq()) && rq.published() != 0 {
                // SAFETY: as above.
                unsafe {
                    rq.take(
                        #[inline(always)]
                        |e| e.finish(&mut b.item(i), later),
                    )
                };
            } else {
                break;
            }
            i += 1;
        }
        let done = i - from;
        // Each run stores its queue's `head` once, if it moved.
        drop((sq, rq));
        if done != 0 {
            self.release_orphans(later);
        }
        done
    }

    /// [`QpTracker::complete`] when the completion is not for the oldest
    /// request in flight: the queue completes in order, so the `off`
    /// requests before it are done too (unsignaled sends; receives whose
    /// completions the provider dropped). They come back in
    /// [`Completion::unsignaled`].
    ///
    /// # Safety
    /// As for [`Queue::advance`]: the caller is the only consumer, and
    /// `off` is before the published tail.
    #[inline(never)]
    unsafe fn complete_after_others(q: &Queue, off: u32, c: &mut impl Sink, later: &mut Later) {
        let mut before = off;
        // A request finished by a later one's success took effect.
        let ok = c.ok();
        // SAFETY: the caller's contract: the `off` entries before the
        // completion's and that one are published, and this is the consumer.
        unsafe {
            q.advance_n(off as usize + 1, |e| {
                if before == 0 {
                    return e.finish(c, later);
                }
                before -= 1;
                // A prepared request's send holds nothing: not listed.
                if let Entry::Held(p) = e {
                    c.earlier(p.wr_id, p.buffers, before);
                    later.keep(p._ah, p._bind, ok);
                }
            })
        };
    }
}

/// The in-flight receives of one shared receive queue, by slot. Any handle
/// posts, any CQ of its QPs polls: one lock serves both.
#[derive(Debug)]
pub(crate) struct SrqTracker {
    serial: Serial,
    slab: Spin<Slab>,
}

impl SrqTracker {
    pub fn new(serial: Serial) -> Arc<SrqTracker> {
        Arc::new(SrqTracker {
            serial,
            slab: Spin::default(),
        })
    }

    pub fn serial(&self) -> u32 {
        self.serial.get()
    }

    pub fn in_flight(&self) -> usize {
        self.slab.lock().len()
    }

    /// Parks the requests' memory, posts them with `post` (see
    /// [`post_chain`]) and takes back those not posted. All under the
    /// SRQ's lock, which a poll resolving one of them waits for: the verb
    /// only writes the provider's queue (it never blocks), and a completion
    /// may arrive before it returns.
    pub fn post(
        &self,
        wrs: Vec<(u64, WrBuffers)>,
        post: impl FnOnce(*mut ffi::ibv_recv_wr, *mut *mut ffi::ibv_recv_wr) -> std::ffi::c_int,
    ) -> (std::ffi::c_int, Vec<(u64, WrBuffers)>) {
        let mut slab = self.slab.lock();
        let mut slots = Vec::with_capacity(wrs.len());
        let mut wrs = wrs.into_iter();
        // 2^32 receives in flight: what does not fit comes back unposted.
        let mut not_parked = Vec::new();
        for (wr_id, buffers) in wrs.by_ref() {
            match slab.insert(Pending::memory(wr_id, buffers)) {
                Ok(slot) => slots.push(slot),
                Err(p) => {
                    not_parked.push((p.wr_id, p.buffers));
                    break;
                }
            }
        }
        not_parked.extend(wrs);
        let serial = self.serial();
        let chain: Vec<(u64, &WrBuffers)> = slots
            .iter()
            .filter_map(|&s| Some((encode(serial, true, s), &slab.get(s)?.buffers)))
            .collect();
        let (mut rc, posted) = post_chain(&chain, post);
        drop(chain);
        let mut back: Vec<(u64, WrBuffers)> = slots[posted..]
            .iter()
            .filter_map(|&s| slab.remove(s))
            .map(|p| (p.wr_id, p.buffers))
            .collect();
        drop(slab);
        if !not_parked.is_empty() && rc == 0 {
            rc = libc::ENOMEM;
        }
        back.extend(not_parked);
        (rc, back)
    }

    /// Fills `c` from slot `slot`, under the CQ's registry lock.
    #[inline]
    fn complete(&self, slot: u32, c: &mut impl Sink, later: &mut Later) {
        let p = self.slab.lock().remove(slot);
        if let Some(p) = p {
            p.finish(c, later);
        }
    }

    /// Takes every receive in flight (after the SRQ is destroyed).
    pub fn drain(&self) -> Vec<Pending> {
        self.slab.lock().drain()
    }
}

/// Objects a finished request kept alive, dropped after the bookkeeping's
/// locks are released (dropping one may call a verb).
pub(crate) struct Kept {
    _ah: Option<AddressHandle>,
    _bind: Option<Box<crate::mw::BindInFlight>>,
}

/// What a resolution takes out and drops only after the registry's lock:
/// the keep-alives of finished requests, the queues an empty poll released.
/// Nothing is allocated in the common case (neither), so that dropping it is
/// a test, not a call per poll (two empty `Vec`s would be dropped on
/// every poll: callgrind).
#[derive(Default)]
pub(crate) struct Later(std::mem::ManuallyDrop<Option<Box<Deferred>>>);

type Deferred = (Vec<Kept>, Vec<Tracked>, Vec<WrBuffers>, Vec<Box<dyn Send>>);

impl Drop for Later {
    /// A test in line; the drop itself out of line, so that the drop glue
    /// of the whole type is not a call per poll (callgrind).
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: taken once, here, and the field is never used again.
        if let Some(d) = unsafe { std::mem::ManuallyDrop::take(&mut self.0) } {
            drop_deferred(d);
        }
    }
}

#[cold]
#[inline(never)]
fn drop_deferred(d: Box<Deferred>) {
    drop(d);
}

impl Later {
    /// Takes what a finished request kept alive; a bind learns whether it
    /// took effect (`ok`, its completion's status) when this is dropped.
    #[inline(always)]
    fn keep(
        &mut self,
        ah: Option<AddressHandle>,
        bind: Option<Box<crate::mw::BindInFlight>>,
        ok: bool,
    ) {
        if ah.is_some() || bind.is_some() {
            self.push(Kept {
                _ah: ah,
                _bind: bind.map(|b| b.completed(ok)),
            });
        }
    }

    #[cold]
    #[inline(never)]
    fn push(&mut self, k: Kept) {
        self.deferred().0.push(k);
    }

    fn deferred(&mut self) -> &mut Deferred {
        self.0.get_or_insert_with(Default::default)
    }

    /// Takes memory to drop after the lock.
    #[cold]
    #[inline(never)]
    fn keep_memory(&mut self, m: WrBuffers) {
        self.deferred().2.push(m);
    }

    /// Takes the unregistered queues to drop.
    fn retire(&mut self, queues: Vec<Tracked>) {
        self.deferred().1.extend(queues);
    }
}

#[cfg(test)]
mod tests;
