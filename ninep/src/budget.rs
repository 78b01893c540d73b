//! The descriptors a server may give to clients' open files, shared out so that one client
//! cannot take another's.
//!
//! Every connection is guaranteed a share of its own ([`OpenBudget::guaranteed`] open
//! files); past it, it draws on a pool all connections share, while the pool lasts. So a
//! client holding all the files it can gets `EMFILE` for itself, and every other client
//! still opens at least its share (the process never hits its own descriptor limit, which
//! would fail everybody's opens, the connections' own included).

use std::sync::atomic::{AtomicUsize, Ordering};

/// Open files for all connections: a share each, and a pool beyond it.
#[derive(Debug)]
pub struct OpenBudget {
    guaranteed: usize,
    pool: usize,
    pool_used: AtomicUsize,
}

impl OpenBudget {
    /// `guaranteed` open files for each connection, and a pool of `pool` more for any.
    pub fn new(guaranteed: usize, pool: usize) -> OpenBudget {
        OpenBudget {
            guaranteed,
            pool,
            pool_used: AtomicUsize::new(0),
        }
    }

    /// The files each connection may always hold.
    pub fn guaranteed(&self) -> usize {
        self.guaranteed
    }

    /// The files beyond their share that connections hold, and may hold, together.
    pub fn pool(&self) -> (usize, usize) {
        (self.pool_used.load(Ordering::Relaxed), self.pool)
    }

    /// Whether a connection that holds `held` open files may open one more (taking it from
    /// the pool past its share); the caller counts it as held if so.
    pub fn acquire(&self, held: usize) -> bool {
        if held < self.guaranteed {
            return true;
        }
        self.pool_used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                (used < self.pool).then_some(used + 1)
            })
            .is_ok()
    }

    /// A connection that held `held` open files closed `closed` of them: what came from the
    /// pool goes back.
    pub fn release(&self, held: usize, closed: usize) {
        let from_pool = held.saturating_sub(self.guaranteed).min(closed);
        if from_pool > 0 {
            self.pool_used.fetch_sub(from_pool, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Past its share a connection draws on the pool; when the pool is gone, a greedy
    /// connection is refused and another still opens its share; closing gives back.
    #[test]
    fn a_greedy_connection_cannot_take_another_s_share() {
        let b = OpenBudget::new(2, 3);
        // The greedy one: 2 of its own, then 3 from the pool, then no more.
        let mut greedy = 0;
        while b.acquire(greedy) {
            greedy += 1;
        }
        assert_eq!((greedy, b.pool()), (5, (3, 3)));
        // Another: its 2, then nothing the pool has.
        assert!(b.acquire(0) && b.acquire(1));
        assert!(!b.acquire(2));
        // The greedy one closes one: back to the pool, which the other may take.
        b.release(greedy, 1);
        greedy -= 1;
        assert_eq!(b.pool(), (2, 3));
        assert!(b.acquire(2));
        // Closing within its share gives the pool nothing; closing all gives back the rest.
        b.release(3, 1);
        assert_eq!(b.pool(), (2, 3), "the other's third came from the pool");
        b.release(greedy, greedy);
        assert_eq!(b.pool(), (0, 3));
    }
}
