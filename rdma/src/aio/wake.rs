//! The waker a driver registers with its reactor, the read it runs when
//! woken, and the waiters it wakes.
//!
//! A driver ([`super::CqChannel`], [`super::CmChannel`]) registers its own
//! waker with the reactor, never a waiter's: tokio keeps one waker per
//! descriptor, and a waiter whose future is dropped would take the channel's
//! wake-ups with it. When the reactor reports the descriptor readable, the
//! driver's waker reads the channel itself (every pending event, until
//! `EAGAIN`) and wakes only the waiters whose events came: a CQ event wakes
//! its CQ's waiter, a CM event its id's, and nobody else runs.
//!
//! # Who reads, and why no wake-up is lost
//! A read happens under [`Hub`]'s read flag, taken with a swap, never
//! waited for: the reactor's thread must not block on a waiter that is
//! reading, and a waiter must not block on the reactor. Whoever wants a
//! read (the driver's waker, a waiter about to sleep) first sets `pending`,
//! then tries the flag; the holder reads again while `pending` is set, and
//! checks it once more after letting the flag go. So a report that comes
//! while someone else reads is read by that reader (or by the one after
//! it), never dropped.
//!
//! A waiter reads only when the reactor may not hold the driver's waker
//! ([`Hub::armed`]): while it does, a waiter with nothing for it registers
//! its own waker, looks for its event once more, and sleeps; the report of
//! the descriptor runs the read that wakes it. Registering before the look
//! is what loses nothing: an event read before the registration is found by
//! the look, one read after it wakes the waiter.
//!
//! A reactor may wake the driver's waker from inside the read that
//! registers it (tokio does when the task's cooperative budget is spent:
//! it wakes the waker and returns `Pending` without registering it). That
//! wake-up is recognised (the thread is inside this hub's read) and then
//! every waiter is woken: each runs its own read later, from a fresh poll,
//! and the first one to get through registers the driver's waker again.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Weak};
use std::task::{Context, Poll, Wake, Waker};

use crate::error::Result;

/// Key of no waiter (`Hub::drive` called by the driver's waker).
pub(super) const NOBODY: usize = usize::MAX;

/// The waiting tasks of one driver, by key: a slot index each CQ or id gets
/// when it is registered ([`Waiters::alloc`]), so that registering a waker
/// and waking one index a `Vec` (no hashing: a waiter registers on every
/// poll that may sleep).
///
/// A key is reused after [`Waiters::release`]: a wake-up noted for the old
/// owner and delivered after the reuse wakes the new one spuriously, which
/// a waiter tolerates (it looks for its own event and sleeps again).
#[derive(Default)]
pub(super) struct Waiters {
    slots: Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    /// The waker of the task waiting on each key.
    wakers: Vec<Option<Waker>>,
    /// Released keys, handed out again first.
    free: Vec<usize>,
    /// Keys handed out so far (the next new one).
    next: usize,
}

impl Waiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        // Nothing panics while holding it.
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A key of no other live waiter: a released one, or a new one.
    pub(super) fn alloc(&self) -> usize {
        let mut s = self.lock();
        if let Some(k) = s.free.pop() {
            return k;
        }
        s.next += 1;
        s.next - 1
    }

    /// Forgets the waiter of `key` (its handle is gone) and frees the key.
    pub(super) fn release(&self, key: usize) {
        let mut s = self.lock();
        let w = s.wakers.get_mut(key).and_then(Option::take);
        if key < s.next {
            s.free.push(key);
        }
        drop(s);
        // Outside the lock: dropping a waker may run anything.
        drop(w);
    }

    /// Records the waker of the task waiting on `key`.
    pub(super) fn register(&self, key: usize, waker: &Waker) {
        let mut s = self.lock();
        if key >= s.wakers.len() {
            s.wakers.resize_with(key + 1, || None);
        }
        match &mut s.wakers[key] {
            Some(w) if w.will_wake(waker) => {}
            Some(w) => w.clone_from(waker),
            slot @ None => *slot = Some(waker.clone()),
        }
    }

    /// Wakes the waiter of `key`, if any.
    pub(super) fn wake(&self, key: usize) {
        let w = self.lock().wakers.get_mut(key).and_then(Option::take);
        if let Some(w) = w {
            w.wake();
        }
    }

    /// Wakes every waiter (outside the lock: a waker may run anything).
    pub(super) fn wake_all(&self) {
        let all: Vec<Waker> = self
            .lock()
            .wakers
            .iter_mut()
            .filter_map(Option::take)
            .collect();
        for w in all {
            w.wake();
        }
    }
}

/// A channel a driver reads: what [`Hub::drive`] calls.
pub(super) trait Source: Send + Sync + 'static {
    /// The channel's hub.
    fn hub(&self) -> &Hub;

    /// Reads the channel through its readiness with `cx` (the driver's
    /// waker): every pending event, until `WouldBlock`, noting each
    /// event's waiter in `woken`. `Ready(Err)` for a failure of the
    /// reactor or of the channel; otherwise `Pending` (the waker is
    /// registered, or was woken during the call).
    fn read(&self, cx: &mut Context<'_>, woken: &mut Vec<usize>) -> Poll<Result<()>>;
}

/// A driver's waiters and the state of its reads.
#[derive(Default)]
pub(super) struct Hub {
    pub(super) waiters: Waiters,
    /// A read is wanted: the reactor reported the descriptor (or a waiter
    /// is about to sleep) since the last read began.
    pending: AtomicBool,
    /// Someone is reading the channel.
    reading: AtomicBool,
    /// The reactor holds the driver's waker: the last read registered it
    /// and no report has taken it since. A report then runs a read (in
    /// [`DriverWaker`]) that wakes every waiter whose event came, so a
    /// waiter with nothing for it registers its waker and sleeps without
    /// reading the channel itself (no `poll_read` of the reactor, no
    /// attempt to read, per sleep).
    armed: AtomicBool,
}

thread_local! {
    /// The hub this thread is reading for (its address; 0: none), and
    /// whether that hub's driver waker was woken during the read.
    static READING: Cell<(usize, bool)> = const { Cell::new((0, false)) };
}

impl Hub {
    /// Whether the reactor holds the driver's waker (see `armed`). A waiter
    /// registers its own waker **before** asking, and looks for its event
    /// in between: an event read after that wakes it, one read before it
    /// is found.
    pub(super) fn armed(&self) -> bool {
        self.armed.load(Ordering::SeqCst)
    }

    /// Reads `source`'s channel (see the module documentation), then wakes
    /// the waiters whose events came, except `me` (the calling waiter,
    /// which looks for its own event itself; [`NOBODY`] from the driver's
    /// waker). Returns the read's failure, if any (every waiter is then
    /// woken, to meet it in its own read).
    pub(super) fn drive<S: Source + ?Sized>(
        &self,
        source: &S,
        driver: &Waker,
        me: usize,
    ) -> Result<()> {
        let this = self as *const Hub as usize;
        let mut result = Ok(());
        self.pending.store(true, Ordering::SeqCst);
        loop {
            if self.reading.swap(true, Ordering::AcqRel) {
                // The reader sees `pending` before it lets go.
                return result;
            }
            let mut woken = Vec::new();
            let mut everyone = false;
            // A read in this turn left the driver's waker with the reactor.
            let mut registered = false;
            while self.pending.swap(false, Ordering::AcqRel) {
                registered = false;
                READING.with(|r| r.set((this, false)));
                let read = source.read(&mut Context::from_waker(driver), &mut woken);
                let (_, woken_inside) = READING.with(|r| r.replace((0, false)));
                if let Poll::Ready(Err(e)) = read {
                    result = Err(e);
                    everyone = true;
                    break;
                }
                if woken_inside {
                    // The reactor did not take the waker (see the module
                    // documentation): the waiters read from their next poll.
                    everyone = true;
                    break;
                }
                registered = true;
            }
            // Before letting the flag go: a report that takes the waker
            // after this clears `armed` (`DriverWaker::run`) before it reads.
            if registered {
                self.armed.store(true, Ordering::SeqCst);
            } else if everyone {
                self.armed.store(false, Ordering::SeqCst);
            }
            self.reading.store(false, Ordering::Release);
            for k in woken {
                if k != me {
                    self.waiters.wake(k);
                }
            }
            if everyone {
                self.waiters.wake_all();
                return result;
            }
            if !self.pending.load(Ordering::SeqCst) {
                return result;
            }
        }
    }
}

/// The waker a driver gives its reactor: reads the channel and wakes the
/// waiters of what came. It holds its driver weakly (the driver holds it).
pub(super) struct DriverWaker(pub(super) Weak<dyn DrivenSource>);

/// A [`Source`] that knows its driver's waker.
pub(super) trait DrivenSource: Source {
    /// The waker given to the reactor.
    fn driver_waker(&self) -> &Waker;
}

impl DriverWaker {
    fn run(&self) {
        let Some(source) = self.0.upgrade() else {
            return;
        };
        let hub = source.hub();
        // The reactor gave the waker back: the next waiter reads unless this
        // read registers it again.
        hub.armed.store(false, Ordering::SeqCst);
        let inside = READING.with(|r| {
            let (h, _) = r.get();
            if h == hub as *const Hub as usize {
                r.set((h, true));
                true
            } else {
                false
            }
        });
        if !inside {
            // A failure wakes every waiter, which meets it in its own read.
            let _ = hub.drive(&*source, source.driver_waker(), NOBODY);
        }
    }
}

impl Wake for DriverWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.run();
    }

    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.run();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex, OnceLock};
    use std::task::{Context, Poll, Wake, Waker};

    use super::{DrivenSource, DriverWaker, Hub, Source, Waiters, NOBODY};
    use crate::error::Result;

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
        w.release(2);
        w.wake(2);
        assert_eq!(n(&b), 0);
    }

    /// A channel of keyed events with a fake reactor: `events` are what the
    /// descriptor holds, `registered` the waker the reactor keeps.
    #[derive(Default)]
    struct Fake {
        hub: Hub,
        events: Mutex<VecDeque<usize>>,
        registered: Mutex<Option<Waker>>,
        /// Like tokio with a spent budget: wake the waker at once instead
        /// of registering it.
        refuse: AtomicBool,
        reads: AtomicUsize,
        driver: OnceLock<Waker>,
    }

    impl Source for Fake {
        fn hub(&self) -> &Hub {
            &self.hub
        }
        fn read(&self, cx: &mut Context<'_>, woken: &mut Vec<usize>) -> Poll<Result<()>> {
            if self.refuse.load(Ordering::SeqCst) {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            self.reads.fetch_add(1, Ordering::SeqCst);
            woken.extend(self.events.lock().unwrap().drain(..));
            *self.registered.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    impl DrivenSource for Fake {
        fn driver_waker(&self) -> &Waker {
            self.driver.get().unwrap()
        }
    }

    fn fake() -> (Arc<Fake>, Waker) {
        let f = Arc::new(Fake::default());
        let dynf: Arc<dyn DrivenSource> = Arc::<Fake>::clone(&f);
        let driver = Waker::from(Arc::new(DriverWaker(Arc::downgrade(&dynf))));
        assert!(f.driver.set(driver.clone()).is_ok());
        (f, driver)
    }

    /// The reactor reports the descriptor: wakes whatever waker it kept.
    fn report(f: &Fake, key: usize) {
        f.events.lock().unwrap().push_back(key);
        let w = f.registered.lock().unwrap().take();
        w.expect("the driver's waker is registered").wake();
    }

    #[test]
    fn an_event_wakes_its_waiter_and_nobody_else() {
        let (f, driver) = fake();
        let (a, wa) = counter();
        let (b, wb) = counter();
        // Both wait: registered, and a waiter's read registers the driver.
        f.hub.waiters.register(1, &wa);
        f.hub.drive(&*f, &driver, 1).unwrap();
        f.hub.waiters.register(2, &wb);
        f.hub.drive(&*f, &driver, 2).unwrap();
        for _ in 0..10 {
            report(&f, 1);
            f.hub.waiters.register(1, &wa); // waits again
        }
        assert_eq!((n(&a), n(&b)), (10, 0), "b's key never came");
        report(&f, 2);
        assert_eq!((n(&a), n(&b)), (10, 1));
        // The calling waiter is not woken by its own read.
        f.events.lock().unwrap().push_back(1);
        f.hub.waiters.register(1, &wa);
        f.hub.drive(&*f, &driver, 1).unwrap();
        assert_eq!(n(&a), 10);
    }

    #[test]
    fn armed_while_the_reactor_holds_the_drivers_waker() {
        let (f, driver) = fake();
        let (a, wa) = counter();
        assert!(!f.hub.armed(), "nothing registered the driver's waker yet");
        f.hub.waiters.register(1, &wa);
        f.hub.drive(&*f, &driver, 1).unwrap();
        assert!(f.hub.armed(), "the waiter's read registered it");
        // A report takes the waker; its read registers it again and wakes
        // the waiter whose event came.
        report(&f, 1);
        assert!(f.hub.armed());
        assert_eq!(n(&a), 1);
        // A read whose waker is woken inside (spent budget) leaves the
        // waiters to read themselves: not armed.
        f.refuse.store(true, Ordering::SeqCst);
        f.registered.lock().unwrap().take().unwrap().wake();
        assert!(!f.hub.armed(), "the reactor did not keep the waker");
        f.refuse.store(false, Ordering::SeqCst);
        f.hub.waiters.register(1, &wa);
        f.hub.drive(&*f, &driver, 1).unwrap();
        assert!(f.hub.armed());
    }

    #[test]
    fn a_released_key_is_handed_out_again_without_its_waker() {
        let w = Waiters::default();
        let (k0, k1) = (w.alloc(), w.alloc());
        assert_ne!(k0, k1);
        let (a, wa) = counter();
        w.register(k1, &wa);
        w.release(k1);
        let k2 = w.alloc();
        assert_eq!(k2, k1, "the released key is reused");
        w.wake(k2);
        assert_eq!(n(&a), 0, "the old owner's waker went with its key");
        assert_ne!(w.alloc(), k0);
    }

    #[test]
    fn a_report_during_a_read_is_read_by_the_reader() {
        let (f, driver) = fake();
        let (a, wa) = counter();
        f.hub.waiters.register(1, &wa);
        // Someone is reading: the driver's waker only leaves the report.
        f.hub.reading.store(true, Ordering::SeqCst);
        f.events.lock().unwrap().push_back(1);
        driver.wake_by_ref();
        assert_eq!((n(&a), f.reads.load(Ordering::SeqCst)), (0, 0));
        // The reader lets go, finds the report and reads it.
        f.hub.reading.store(false, Ordering::SeqCst);
        f.hub.drive(&*f, &driver, NOBODY).unwrap();
        assert_eq!(n(&a), 1);
    }

    #[test]
    fn a_waker_woken_inside_the_read_wakes_every_waiter_once() {
        let (f, driver) = fake();
        let (a, wa) = counter();
        let (b, wb) = counter();
        f.hub.waiters.register(1, &wa);
        f.hub.waiters.register(2, &wb);
        f.refuse.store(true, Ordering::SeqCst);
        // No recursion, no endless loop: both waiters are woken to read
        // from their next poll.
        f.hub.drive(&*f, &driver, 1).unwrap();
        assert_eq!((n(&a), n(&b)), (1, 1));
        f.refuse.store(false, Ordering::SeqCst);
        f.hub.waiters.register(2, &wb);
        f.hub.drive(&*f, &driver, 2).unwrap();
        report(&f, 2);
        assert_eq!((n(&a), n(&b)), (1, 2));
    }
}
