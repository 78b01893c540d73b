//! The waker a driver registers with its reactor, and the waiters it wakes.
//!
//! A driver ([`super::CqChannel`], [`super::CmChannel`]) registers its own
//! waker with the reactor, never a waiter's: tokio keeps one waker per
//! descriptor, and a waiter whose future is dropped would take the channel's
//! wake-ups with it. When the descriptor becomes readable, every waiting
//! task is woken; the first to run reads the channel and the others find
//! their events (or wait again).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::task::{Wake, Waker};

#[derive(Default)]
pub(super) struct Waiters {
    /// Waiting tasks by key (a CQ's or an id's address).
    wakers: Mutex<HashMap<usize, Waker>>,
}

impl Waiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Waker>> {
        // Nothing panics while holding it.
        self.wakers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the waker of the task waiting on `key`.
    pub(super) fn register(&self, key: usize, waker: &Waker) {
        let mut map = self.lock();
        match map.get_mut(&key) {
            Some(w) if w.will_wake(waker) => {}
            Some(w) => w.clone_from(waker),
            None => {
                map.insert(key, waker.clone());
            }
        }
    }

    /// Forgets the waiter of `key` (its handle is gone).
    pub(super) fn remove(&self, key: usize) {
        drop(self.lock().remove(&key));
    }

    /// Wakes the waiter of `key`, if any.
    pub(super) fn wake(&self, key: usize) {
        let w = self.lock().remove(&key);
        if let Some(w) = w {
            w.wake();
        }
    }

    /// Wakes every waiter (outside the lock: a waker may run anything).
    pub(super) fn wake_all(&self) {
        let all: Vec<Waker> = self.lock().drain().map(|(_, w)| w).collect();
        for w in all {
            w.wake();
        }
    }
}

/// The waker a driver gives its reactor: wakes every waiter.
pub(super) struct DriverWaker(pub(super) Arc<Waiters>);

impl Wake for DriverWaker {
    fn wake(self: Arc<Self>) {
        self.0.wake_all();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.wake_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Wake, Waker};

    use super::{DriverWaker, Waiters};

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counter() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        (Arc::clone(&c), Waker::from(c))
    }

    fn n(c: &Count) -> usize {
        c.0.load(Ordering::SeqCst)
    }

    #[test]
    fn a_key_wakes_only_its_waiter_once() {
        let w = Waiters::default();
        let (a, wa) = counter();
        let (b, wb) = counter();
        w.register(1, &wa);
        w.register(1, &wa); // the same waker again: kept once
        w.register(2, &wb);
        w.wake(1);
        assert_eq!((n(&a), n(&b)), (1, 0));
        // Woken waiters are forgotten until they wait again.
        w.wake(1);
        assert_eq!(n(&a), 1);
        w.remove(2);
        w.wake(2);
        assert_eq!(n(&b), 0);
    }

    #[test]
    fn the_driver_waker_wakes_every_waiter_and_a_new_waker_replaces_the_old() {
        let w = Arc::new(Waiters::default());
        let (a, wa) = counter();
        let (old, wold) = counter();
        let (new, wnew) = counter();
        w.register(1, &wa);
        w.register(2, &wold);
        w.register(2, &wnew); // the task of key 2 moved to another waker
        let driver = Waker::from(Arc::new(DriverWaker(Arc::clone(&w))));
        driver.wake_by_ref();
        assert_eq!((n(&a), n(&old), n(&new)), (1, 0, 1));
        driver.wake();
        assert_eq!((n(&a), n(&new)), (1, 1), "nobody was waiting any more");
    }
}
