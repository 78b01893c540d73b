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
use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
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

/// The lock of the data path's bookkeeping (a tracker's rings, a CQ's
/// registry).
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
                if spins < 100 {
                    std::hint::spin_loop();
                    spins += 1;
                } else {
                    std::thread::yield_now();
                }
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

/// One work request in flight.
#[derive(Debug)]
pub(crate) struct Pending {
    pub seq: u32,
    pub wr_id: u64,
    pub buffers: WrBuffers,
    /// Keeps a UD destination alive until the send completes.
    pub _ah: Option<AddressHandle>,
    /// Keeps a memory window alive until its bind completes.
    pub _mw: Option<Arc<crate::mw::MwInner>>,
}

#[derive(Debug, Default)]
pub(crate) struct Ring {
    pub next_seq: u32,
    pub pending: VecDeque<Pending>,
}

/// The in-flight work of one QP (send and receive queue).
#[derive(Debug)]
pub(crate) struct Tracker {
    pub serial: u32,
    sq: Spin<Ring>,
    rq: Spin<Ring>,
}

impl Tracker {
    pub fn new() -> Arc<Tracker> {
        Arc::new(Tracker {
            serial: next_serial(),
            sq: Spin::default(),
            rq: Spin::default(),
        })
    }

    #[inline]
    pub fn ring(&self, recv: bool) -> SpinGuard<'_, Ring> {
        if recv {
            self.rq.lock()
        } else {
            self.sq.lock()
        }
    }

    /// Number of requests in flight on (send, receive) queue.
    pub fn in_flight(&self) -> (usize, usize) {
        (
            self.ring(false).pending.len(),
            self.ring(true).pending.len(),
        )
    }

    /// Removes and returns everything in flight (after the QP is destroyed).
    pub fn drain(&self) -> Vec<Pending> {
        let mut all: Vec<Pending> = self.ring(false).pending.drain(..).collect();
        all.extend(self.ring(true).pending.drain(..));
        all
    }

    /// Fills `c` (whose `wr_id` is our encoded id) from the matching entry.
    /// What the entries kept alive (address handles, windows) goes to
    /// `later`, to be dropped once no lock is held.
    #[inline]
    fn complete(&self, recv: bool, seq: u32, c: &mut Completion, later: &mut Vec<Kept>) {
        let mut ring = self.ring(recv);
        // Usually the oldest request in flight.
        if ring.pending.front().is_some_and(|p| p.seq == seq) {
            if let Some(p) = ring.pending.pop_front() {
                drop(ring);
                c.wr_id = p.wr_id;
                c.buffers = p.buffers;
                Kept::keep(later, p._ah, p._mw);
            }
            return;
        }
        self.complete_out_of_order(ring, recv, seq, c, later);
    }

    /// [`Tracker::complete`] when the completion is not for the oldest
    /// request in flight.
    #[cold]
    fn complete_out_of_order(
        &self,
        mut ring: SpinGuard<'_, Ring>,
        recv: bool,
        seq: u32,
        c: &mut Completion,
        later: &mut Vec<Kept>,
    ) {
        let mut earlier = Vec::new();
        let done = match ring.pending.iter().position(|p| p.seq == seq) {
            // Not ours (already released): leave the completion bare.
            None => None,
            // Receives: only this entry is known to be done (an SRQ serves
            // several QPs).
            Some(pos) if recv => ring.pending.remove(pos),
            // Send queues complete in order: everything before `pos` is done
            // too.
            Some(pos) => {
                earlier.extend(ring.pending.drain(..pos));
                ring.pending.pop_front()
            }
        };
        drop(ring);
        if !earlier.is_empty() {
            c.unsignaled.reserve(earlier.len());
            for p in earlier {
                c.unsignaled.push((p.wr_id, p.buffers));
                Kept::keep(later, p._ah, p._mw);
            }
        }
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
/// out-pointer) and parks the memory of those posted in `tracker`'s receive
/// ring. Returns the provider's return code and the requests not posted.
pub(crate) fn post_recvs(
    tracker: &Tracker,
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
    let mut ring = tracker.ring(true);
    let first = ring.next_seq;
    let mut raw: Vec<ffi::ibv_recv_wr> = sge_at
        .iter()
        .enumerate()
        .map(|(i, &(at, n))| ffi::ibv_recv_wr {
            wr_id: encode(tracker.serial, true, first.wrapping_add(i as u32)),
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
    // while the ring lock is held, before any completion can be resolved.
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
    for (i, (wr_id, buffers)) in rest.into_iter().enumerate() {
        ring.pending.push_back(Pending {
            seq: first.wrapping_add(i as u32),
            wr_id,
            buffers,
            _ah: None,
            _mw: None,
        });
    }
    ring.next_seq = first.wrapping_add(posted as u32);
    (rc, unposted)
}

/// [`post_recvs`] for one request with at most four scatter/gather entries,
/// without touching the heap. Returns the request when it was not posted.
pub(crate) fn post_recv_one(
    tracker: &Tracker,
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
        let (rc, mut rest) = post_recvs(tracker, vec![(wr_id, buffers)], post);
        return (rc, rest.pop());
    }
    let mut ring = tracker.ring(true);
    let seq = ring.next_seq;
    let mut raw = ffi::ibv_recv_wr {
        wr_id: encode(tracker.serial, true, seq),
        next: std::ptr::null_mut(),
        sg_list: if n == 0 {
            std::ptr::null_mut()
        } else {
            sges.as_mut_ptr()
        },
        num_sge: n as std::ffi::c_int,
    };
    let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
    // As in `post_recvs`: the memory is parked below, under the ring lock.
    let rc = post(&mut raw, &mut bad);
    if rc != 0 {
        return (rc, Some((wr_id, buffers)));
    }
    ring.pending.push_back(Pending {
        seq,
        wr_id,
        buffers,
        _ah: None,
        _mw: None,
    });
    ring.next_seq = seq.wrapping_add(1);
    (0, None)
}

/// The queues whose completions a CQ may report, by serial.
///
/// Holds each tracker strongly: a QP or SRQ unregisters itself after it is
/// destroyed (and before it releases its memory), so resolving a batch takes
/// one lock and no reference-count traffic.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    /// `(serial, tracker)`, most recently resolved first: a CQ serves few
    /// queues, and a linear scan of a short list beats hashing on the poll
    /// path.
    list: Spin<Vec<(u32, Arc<Tracker>)>>,
}

impl Registry {
    #[inline]
    fn list(&self) -> SpinGuard<'_, Vec<(u32, Arc<Tracker>)>> {
        self.list.lock()
    }

    pub fn register(&self, t: &Arc<Tracker>) {
        let mut list = self.list();
        if !list.iter().any(|(s, _)| *s == t.serial) {
            list.insert(0, (t.serial, Arc::clone(t)));
        }
    }

    pub fn unregister(&self, serial: u32) {
        let gone: Vec<_> = {
            let mut list = self.list();
            let (gone, kept) = list.drain(..).partition(|(s, _)| *s == serial);
            *list = kept;
            gone
        };
        // Dropped outside the lock (a last tracker reference frees memory).
        drop(gone);
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
            self.fill(&mut self.list(), c, &mut later);
            Kept::release(later);
        }
    }

    /// Appends the completions of a poll batch to `out`, as
    /// [`Registry::completion`] does for one; one lock for the batch.
    pub fn extend(&self, wcs: &[ffi::ibv_wc], out: &mut Vec<Completion>) {
        out.reserve(wcs.len());
        let mut later = Vec::new();
        {
            let mut list = None;
            for wc in wcs {
                let mut c = Completion::from_raw(wc);
                if c.wr_id & TAG != 0 {
                    let list = list.get_or_insert_with(|| self.list());
                    self.fill(list, &mut c, &mut later);
                }
                out.push(c);
            }
        }
        // The keep-alives are dropped here, after the locks.
        Kept::release(later);
    }

    /// Resolves one completion with our id, under the registry's lock.
    #[inline]
    fn fill(
        &self,
        list: &mut SpinGuard<'_, Vec<(u32, Arc<Tracker>)>>,
        c: &mut Completion,
        later: &mut Vec<Kept>,
    ) {
        let Some((serial, recv, seq)) = decode(c.wr_id) else {
            return;
        };
        let hit = match list.first() {
            Some((s, _)) if *s == serial => true,
            _ => match list.iter().position(|(s, _)| *s == serial) {
                Some(i) => {
                    // Most recently used first.
                    list[..=i].rotate_right(1);
                    true
                }
                None => false,
            },
        };
        if hit {
            list[0].1.complete(recv, seq, c, later);
        } else {
            // The queue is gone: its memory was released after it was
            // destroyed.
            c.wr_id &= !(TAG | RECV);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(ring: &mut Ring, wr_id: u64) -> u32 {
        let seq = ring.next_seq;
        ring.next_seq = ring.next_seq.wrapping_add(1);
        ring.pending.push_back(Pending {
            seq,
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
        let t = Tracker::new();
        let reg = Registry::default();
        reg.register(&t);
        let (a, b, c) = {
            let mut ring = t.ring(false);
            (
                pending(&mut ring, 10),
                pending(&mut ring, 11),
                pending(&mut ring, 12),
            )
        };
        let _ = (a, b);
        let mut done = Vec::new();
        reg.extend(&[wc(encode(t.serial, false, c))], &mut done);
        assert_eq!(done[0].wr_id, 12);
        let ids: Vec<u64> = done[0].unsignaled.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, [10, 11]);
        assert_eq!(t.in_flight(), (0, 0));
    }

    #[test]
    fn receive_completion_takes_only_its_entry() {
        let t = Tracker::new();
        let reg = Registry::default();
        reg.register(&t);
        let (_, second) = {
            let mut ring = t.ring(true);
            (pending(&mut ring, 1), pending(&mut ring, 2))
        };
        let done = [reg.completion(&wc(encode(t.serial, true, second)))];
        assert_eq!(done[0].wr_id, 2);
        assert_eq!(t.in_flight(), (0, 1));
    }

    #[test]
    fn completions_of_a_dropped_qp_pass_through_bare() {
        let t = Tracker::new();
        let reg = Registry::default();
        reg.register(&t);
        let seq = pending(&mut t.ring(false), 7);
        let id = encode(t.serial, false, seq);
        // What a QP's teardown does after destroying the QP.
        reg.unregister(t.serial);
        drop(t.drain());
        let done = [reg.completion(&wc(id))];
        assert!(done[0].buffers.is_empty());
        assert_eq!(decode(done[0].wr_id), None);
    }
}
