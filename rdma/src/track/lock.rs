//! The data path's bookkeeping lock.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

/// The lock of the data path's bookkeeping (a CQ's registry, held from the
/// poll to the resolution; a shared receive queue's slots).
///
/// Its critical sections are short (a poll of the provider's queue and the
/// lookups that follow; a post to an SRQ), never block and never run user
/// code, and nearly always find the lock free: one atomic exchange to take it and a plain
/// store to release it, without `Mutex`'s poisoning bookkeeping, which the
/// latency benchmark measured on every post and completion. A waiter spins
/// briefly, then yields its CPU. Nothing is ever dropped under it except
/// what the section itself moves (see `Resolver`).
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

/// Spins briefly, then yields the CPU.
#[inline]
pub(crate) fn backoff(spins: &mut u32) {
    if *spins < 100 {
        std::hint::spin_loop();
        *spins += 1;
    } else {
        std::thread::yield_now();
    }
}
