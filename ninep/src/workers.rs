//! The threads that run requests (tokio's blocking pool), shared by every
//! connection, and when a connection may start one more request on them.
//!
//! Two bounds, so that clients whose requests wait (on a lease, a lock, a
//! slow file system) cannot take every thread from the others:
//!
//! - a connection runs at most [`Workers::per_connection`] requests on them
//!   at once (a quarter of the threads, at least one): its other requests
//!   wait in order in its own queue;
//! - a connection that already has a request on them starts another only
//!   while more than [`Workers::reserve`] threads (a quarter) are free: the
//!   reserve is kept for connections with none, whose first request always
//!   starts.
//!
//! So filling every thread takes enough connections to fill all but the
//! reserve with full shares, plus one connection per reserved thread: 3 + 16
//! with the default 64 threads (with 4 threads, 4: one request each).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The shared threads' count and how many of them run requests now.
#[derive(Debug, Clone)]
pub struct Workers {
    threads: usize,
    busy: Arc<AtomicUsize>,
}

/// One request on the threads, counted until dropped (moved into the
/// request's closure, so it counts until the request ends, whether or not
/// its connection still waits for it).
#[derive(Debug)]
pub struct Busy(Arc<AtomicUsize>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Workers {
    /// `threads` threads (at least one).
    pub fn new(threads: usize) -> Workers {
        Workers {
            threads: threads.max(1),
            busy: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The most requests of one connection on the threads at once: a
    /// quarter of them, at least one.
    pub fn per_connection(&self) -> usize {
        (self.threads / 4).max(1)
    }

    /// The threads kept for connections with no request on them: a quarter.
    pub fn reserve(&self) -> usize {
        self.threads / 4
    }

    /// Requests on the threads now (running, or queued by tokio).
    pub fn busy(&self) -> usize {
        self.busy.load(Ordering::Relaxed)
    }

    /// Whether a connection with `running` requests on the threads may
    /// start one more now.
    pub fn may_start(&self, running: usize) -> bool {
        running == 0
            || (running < self.per_connection() && self.busy() + self.reserve() < self.threads)
    }

    /// Counts one request on the threads until the result is dropped.
    pub fn claim(&self) -> Busy {
        self.busy.fetch_add(1, Ordering::Relaxed);
        Busy(Arc::clone(&self.busy))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Connections whose every request waits forever, each starting what
    /// it may: how many it takes to hold every thread.
    fn connections_to_fill(threads: usize) -> usize {
        let w = Workers::new(threads);
        let mut held = Vec::new();
        let mut connections = 0;
        while w.busy() < threads {
            connections += 1;
            let mut running = 0;
            while w.may_start(running) {
                held.push(w.claim());
                running += 1;
            }
            assert!(running <= w.per_connection());
        }
        assert_eq!(w.busy(), threads, "never more than the threads");
        drop(held);
        assert_eq!(w.busy(), 0);
        connections
    }

    #[test]
    fn a_handful_of_clients_cannot_hold_every_thread() {
        // 64 threads: three full shares of 16 reach the reserve of 16,
        // then one connection per reserved thread.
        assert_eq!(connections_to_fill(64), 3 + 16);
        assert_eq!(connections_to_fill(8), 5);
        assert_eq!(connections_to_fill(4), 4);
        assert_eq!(connections_to_fill(1), 1);
        let w = Workers::new(64);
        assert_eq!((w.per_connection(), w.reserve()), (16, 16));
        // A lone client gets its whole share.
        let held: Vec<_> = (0..16).map(|_| w.claim()).collect();
        assert!(!w.may_start(16));
        assert!(w.may_start(0));
        drop(held);
    }

    #[test]
    fn a_connection_s_first_request_always_starts() {
        let w = Workers::new(8);
        let held: Vec<_> = (0..8).map(|_| w.claim()).collect();
        assert!(w.may_start(0), "queued by tokio, but started");
        assert!(!w.may_start(1));
        drop(held);
        assert!(w.may_start(1));
    }
}
