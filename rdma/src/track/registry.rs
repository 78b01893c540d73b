//! A CQ's registry: the queues whose completions its polls resolve.

use std::sync::Arc;

use super::lock::{Spin, SpinGuard};
use super::{Batch, Later, QpTracker, Sink, SrqTracker, RECV, TAG};
#[cfg(test)]
use crate::wc::Completion;

/// A queue whose completions a CQ may report.
#[derive(Debug, Clone)]
pub(crate) enum Tracked {
    Qp(Arc<QpTracker>),
    Srq(Arc<SrqTracker>),
}

impl Tracked {
    fn serial(&self) -> u32 {
        match self {
            Tracked::Qp(t) => t.serial(),
            Tracked::Srq(t) => t.serial(),
        }
    }
}

/// The queues whose completions a CQ may report, by serial.
///
/// Its lock is held from `ibv_poll_cq` to the last completion of that poll
/// resolved (see [`Registry::resolver`]): completions are resolved in the
/// order the CQ gave them, whichever threads poll, and a send completion
/// that releases earlier unsignaled requests never overtakes the completion
/// of one of them.
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
/// time, and in front of it the QP or SRQ resolved last, so that a CQ
/// serving one QP (both its queues: a ping-pong alternates a send's
/// completion and a receive's) or a burst of one queue's completions never
/// hashes.
#[derive(Debug, Default)]
struct Queues {
    /// The QP or SRQ resolved last: a completion of either queue of the
    /// same QP is resolved by comparing its key with the two in
    /// [`Last::keys`]. Its tracker is also in `map`, so dropping this
    /// reference never frees one (unregistering clears both, outside the
    /// lock).
    last: Option<Last>,
    map: std::collections::HashMap<u32, Tracked, SerialHash>,
    /// Unregistered queues, kept (with their serials) until the CQ is next
    /// seen empty: until then it may hold completions of theirs, which must
    /// not meet a new queue under the same serial.
    retired: Vec<Tracked>,
}

/// What resolving a completion of the QP or SRQ resolved last needs,
/// decided once when it became the last rather than for every completion.
#[derive(Debug)]
struct Last {
    serial: u32,
    /// The keys ([`key_of`]) of the send queue's and the receive queue's
    /// `wr_id`s that this registry's polls consume, 0 (no key of ours: it
    /// lacks the tag) for a queue they do not: an SRQ's sends, or a QP's
    /// queue that completes on another CQ (no provider reports its
    /// completions here; should one come, it is left bare rather than
    /// consumed by a second poller). A run of one queue's completions
    /// costs one comparison each, a ping-pong's alternation two.
    keys: [u32; 2],
    /// A QP both of whose queues this registry's polls consume (neither
    /// key 0): a poll's completions of either queue are resolved in one
    /// pass ([`QpTracker::complete_both`]).
    both: bool,
    queue: LastQueue,
}

#[derive(Debug)]
enum LastQueue {
    Qp(Arc<QpTracker>),
    Srq(Arc<SrqTracker>),
}

/// The upper half of a `wr_id` of ours: [`TAG`], [`RECV`] and the serial.
fn key_of(wr_id: u64) -> u32 {
    (wr_id >> 32) as u32
}

/// [`RECV`] in a key.
const RECV_KEY: u32 = (RECV >> 32) as u32;

impl Queues {
    /// Makes the QP or SRQ of `key` the last resolved, for the registry at
    /// `registry`; `false` when no registered queue has its serial.
    #[cold]
    #[inline(never)]
    fn load(&mut self, key: u32, registry: usize) -> bool {
        let serial = key & super::serial::MASK;
        let (send, recv) = (key & !RECV_KEY, key | RECV_KEY);
        let (keys, queue) = match self.map.get(&serial) {
            None => return false,
            Some(Tracked::Qp(t)) => (
                [
                    if t.consumed_by(false, registry) {
                        send
                    } else {
                        0
                    },
                    if t.consumed_by(true, registry) {
                        recv
                    } else {
                        0
                    },
                ],
                LastQueue::Qp(Arc::clone(t)),
            ),
            Some(Tracked::Srq(t)) => ([0, recv], LastQueue::Srq(Arc::clone(t))),
        };
        self.last = Some(Last {
            serial,
            keys,
            both: matches!(queue, LastQueue::Qp(_)) && keys[0] != 0 && keys[1] != 0,
            queue,
        });
        true
    }
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
    pub fn register(&self, t: Tracked) {
        // A tracker registered twice (an SRQ's, once per QP on this CQ) is
        // kept once.
        let mut q = self.queues.lock();
        q.map.entry(t.serial()).or_insert(t);
    }

    /// Removes the queue with `serial` (destroyed: the device makes no more
    /// completions for it) and keeps it until the CQ is next polled empty.
    pub fn unregister(&self, serial: u32) {
        let last = {
            let mut q = self.queues.lock();
            let last = q.last.take_if(|last| last.serial == serial);
            if let Some(t) = q.map.remove(&serial) {
                q.retired.push(t);
            }
            last
        };
        // Dropped outside the lock (it never is the last reference: `retired`
        // holds one).
        drop(last);
    }

    /// Takes the lock for one poll of the CQ: resolve what it returns with
    /// [`Resolver::attach`], and say when the CQ was found empty.
    #[inline]
    pub fn resolver(&self) -> Resolver<'_> {
        Resolver {
            registry: self.address(),
            queues: self.queues.lock(),
            later: Later::default(),
        }
    }

    /// Holds the lock every poll resolves under, for a QP's producer that
    /// replaces its queue's ring.
    pub(super) fn hold(&self) -> impl Sized + '_ {
        self.queues.lock()
    }

    /// What a QP's queue records as the registry whose polls consume it.
    pub(super) fn address(&self) -> usize {
        self as *const Registry as usize
    }

    /// Takes every request in flight on `t`'s send (`recv` false) or
    /// receive queue, as the consumer: after a RESET, which empties the
    /// queue without completions on some providers (rxe) and removes them
    /// from the CQ on others (mlx4, mlx5, hns).
    pub fn reclaim(&self, t: &QpTracker, recv: bool) -> Vec<super::Pending> {
        let _q = self.queues.lock();
        t.reclaim(recv, self.address())
    }

    /// Number of queues registered.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.queues.lock().map.len()
    }

    /// Number of unregistered queues kept for completions still in the CQ.
    #[cfg(test)]
    pub(super) fn retired(&self) -> usize {
        self.queues.lock().retired.len()
    }

    /// Resolves one polled work completion (what a poll does for each).
    #[cfg(test)]
    pub(super) fn completion(&self, wc: &crate::ffi::ibv_wc) -> Completion {
        let mut c = Completion::from_raw(wc);
        self.resolver().attach(&mut c);
        c
    }

    /// Resolves a batch, as one poll does.
    #[cfg(test)]
    pub(super) fn extend(&self, wcs: &[crate::ffi::ibv_wc], out: &mut Vec<Completion>) {
        let start = out.len();
        out.extend(wcs.iter().map(Completion::from_raw));
        self.resolver().attach_all(&mut out[start..]);
    }
}

/// A registry held for one poll of its CQ. What finished requests kept alive
/// (address handles, windows) and the queues released by an empty poll are
/// dropped after the lock is released: dropping them may call a verb.
pub(crate) struct Resolver<'a> {
    /// The registry's address: a QP's queue is consumed only by the polls
    /// of its own CQ.
    registry: usize,
    // Field order: the lock is released before `later` is dropped.
    queues: SpinGuard<'a, Queues>,
    later: Later,
}

impl Resolver<'_> {
    /// Attaches the memory of a safe post to `c` (built from a polled work
    /// completion): the caller's `wr_id` replaces ours.
    #[inline(always)]
    pub fn attach(&mut self, c: &mut impl Sink) {
        if c.id() & TAG != 0 {
            self.fill(c);
        }
    }

    /// Attaches the memory of safe posts to a poll's completions, as
    /// [`Resolver::attach`] on each: a run of completions of the QP
    /// resolved last, each for the next request of its queue, is resolved
    /// as one, over both queues when this CQ serves both
    /// ([`QpTracker::complete_both`], a CQ of one QP's), else over one
    /// ([`QpTracker::complete_run`]).
    #[inline(always)]
    pub fn attach_all(&mut self, b: &mut (impl Batch + ?Sized)) {
        // A poll of one (a latency loop's) gains nothing from a run and
        // would pay for setting one up (callgrind: measurably more per
        // latency-loop iteration).
        if b.len() == 1 {
            return self.attach(&mut b.item(0));
        }
        let mut i = 0;
        while i < b.len() {
            let id = b.id(i);
            if id & TAG == 0 {
                i += 1;
                continue;
            }
            if let Some(Last {
                keys,
                both,
                queue: LastQueue::Qp(t),
                ..
            }) = &self.queues.last
            {
                let done = if *both {
                    t.complete_both(b, i, &mut self.later)
                } else {
                    let key = key_of(id);
                    let recv = key == keys[1];
                    if key == keys[0] || recv {
                        t.complete_run(recv, b, i, &mut self.later)
                    } else {
                        0
                    }
                };
                if done != 0 {
                    i += done;
                    continue;
                }
            }
            self.fill(&mut b.item(i));
            i += 1;
        }
    }

    /// The CQ was just found empty: every completion of an unregistered
    /// queue is gone from it, so those queues (and their serials) can go.
    #[inline]
    pub fn cq_empty(&mut self) {
        if !self.queues.retired.is_empty() {
            let retired = std::mem::take(&mut self.queues.retired);
            self.later.retire(retired);
        }
    }

    /// Resolves one completion with our id, under the registry's lock.
    /// Inlined into each poll (callgrind: a call per completion otherwise).
    #[inline(always)]
    fn fill(&mut self, c: &mut impl Sink) {
        let id = c.id();
        let key = key_of(id);
        // A QP's send queue first, as one comparison of the key and one
        // test of the variant (a `match` compiles to a jump table over every
        // variant, dearer per completion: callgrind); then its receive
        // queue or an SRQ.
        if let Some(Last { keys, queue, .. }) = &self.queues.last {
            if key == keys[0] {
                if let LastQueue::Qp(t) = queue {
                    return t.complete(false, id as u32, c, &mut self.later);
                }
            } else if key == keys[1] {
                return match queue {
                    LastQueue::Qp(t) => t.complete(true, id as u32, c, &mut self.later),
                    LastQueue::Srq(t) => t.complete(id as u32, c, &mut self.later),
                };
            }
        }
        self.fill_other(c, id, key);
    }

    /// [`Resolver::fill`] for a completion of another QP or SRQ than the
    /// last resolved (a CQ shared by several QPs switches here), or of a
    /// queue this CQ does not consume.
    #[inline(never)]
    fn fill_other(&mut self, c: &mut impl Sink, id: u64, key: u32) {
        let q: &mut Queues = &mut self.queues;
        let serial = key & super::serial::MASK;
        if !matches!(&q.last, Some(last) if last.serial == serial) && !q.load(key, self.registry) {
            // The queue is gone: its memory was released after it was
            // destroyed.
            c.set_id(id & !(TAG | RECV));
            return;
        }
        match &q.last {
            Some(Last {
                keys,
                queue: LastQueue::Qp(t),
                ..
            }) if key == keys[0] || key == keys[1] => {
                t.complete(key == keys[1], id as u32, c, &mut self.later)
            }
            Some(Last {
                keys,
                queue: LastQueue::Srq(t),
                ..
            }) if key == keys[1] => t.complete(id as u32, c, &mut self.later),
            // A queue that completes on another CQ, or a send's id with an
            // SRQ's serial: nothing of ours.
            _ => c.set_id(id & !(TAG | RECV)),
        }
    }
}
