//! Serials: the identity of a QP's or SRQ's tracker inside our `wr_id`s.
//!
//! A serial is unique among the trackers alive, whatever the counter's
//! wrap-around: allocation skips every serial still held. A tracker holds its
//! serial until it is dropped, and a CQ's registry keeps the trackers of
//! destroyed queues (and with them their serials) until the CQ has been
//! polled empty, so that a completion still waiting in a CQ never meets a new
//! queue with its old identity.

use std::collections::BTreeSet;
use std::sync::Mutex;

use crate::error::{Error, Result};

/// Serials fit in 30 bits of a `wr_id` (see [`super::encode`]).
pub(crate) const BITS: u32 = 30;
pub(crate) const MASK: u32 = (1 << BITS) - 1;

struct Pool {
    /// Where the search for a free serial starts.
    next: u32,
    /// The serials held by live trackers.
    live: BTreeSet<u32>,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    next: 0,
    live: BTreeSet::new(),
});

fn pool() -> std::sync::MutexGuard<'static, Pool> {
    // The pool's state is consistent after every statement: a panic while it
    // was held (allocation failure) leaves nothing half-done.
    POOL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A serial held by one tracker; given back when dropped.
#[derive(Debug)]
pub(crate) struct Serial(u32);

impl Serial {
    /// A serial no live tracker holds, or `None` when all 2^30 are held.
    pub fn allocate() -> Option<Serial> {
        let mut p = pool();
        if p.live.len() > MASK as usize {
            return None;
        }
        loop {
            let s = p.next;
            p.next = s.wrapping_add(1) & MASK;
            if p.live.insert(s) {
                return Some(Serial(s));
            }
        }
    }

    pub fn get(&self) -> u32 {
        self.0
    }
}

impl Drop for Serial {
    fn drop(&mut self) {
        pool().live.remove(&self.0);
    }
}

/// Moves the counter to `next`, as if that many trackers had been made: how
/// the tests force the wrap-around.
/// The identity of a new QP's or SRQ's tracker, taken before the object is
/// created (so that running out is an error, not a created object to undo).
pub(crate) fn allocate_serial(verb: &'static str) -> Result<Serial> {
    Serial::allocate().ok_or_else(|| {
        Error::verb_errno(
            verb,
            "2^30 queue pairs and shared receive queues are alive (or their completions \
             still wait in CQs): no work request identity is left",
            libc::ENOSPC,
        )
    })
}

#[cfg(test)]
pub(crate) fn force_next(next: u32) {
    pool().next = next & MASK;
}

/// Whether a live tracker holds `s`.
#[cfg(test)]
pub(crate) fn is_live(s: u32) -> bool {
    pool().live.contains(&s)
}
