//! A timeout on any reactor: a `timerfd` registered like the channels, so
//! the async layer bounds its waits without a runtime's timer.

use std::future::Future;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::pin::pin;
use std::task::{Context, Poll};
use std::time::Duration;

use super::{reactor_error, would_block, Reactor, Readiness};
use crate::error::{Error, Result};

/// A one-shot `CLOCK_MONOTONIC` timer read through a reactor, re-armed for
/// each bounded wait ([`Timer::within`]).
pub(super) struct Timer {
    /// Dropped first (field order): the registration goes while the
    /// descriptor is open.
    readiness: Box<dyn Readiness>,
    fd: OwnedFd,
}

impl Timer {
    /// A disarmed timer registered with `reactor`.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `timerfd_create`; the reactor's errors.
    pub(super) fn new(reactor: &dyn Reactor) -> Result<Timer> {
        // SAFETY: plain call; a non-negative return is a new descriptor.
        let raw = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(Error::Verb {
                verb: "timerfd_create",
                context: "the timer of an async connection's waits".into(),
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: `raw` is a descriptor just created and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let readiness = reactor.register(fd.as_fd())?;
        Ok(Timer { readiness, fd })
    }

    /// Sets the timer to expire once, `after` from now (0 disarms).
    fn set(&self, after: Duration) -> Result<()> {
        let value = libc::timespec {
            tv_sec: libc::time_t::try_from(after.as_secs()).unwrap_or(libc::time_t::MAX),
            // Below 10^9: fits every `c_long`.
            tv_nsec: after.subsec_nanos() as libc::c_long,
        };
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: value,
        };
        // SAFETY: a valid timerfd and itimerspec; the old value is not asked.
        let rc =
            unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if rc < 0 {
            return Err(Error::Verb {
                verb: "timerfd_settime",
                context: format!("arming for {after:?}").into(),
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Reads (and so resets) the expiration count: `Ok` when the timer
    /// expired since the last read, `WouldBlock` when it did not.
    fn read(&self) -> io::Result<()> {
        let mut ticks = 0u64;
        // SAFETY: reads 8 bytes into a u64 from a timerfd.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                std::ptr::addr_of_mut!(ticks).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return Err(if e.kind() == io::ErrorKind::WouldBlock {
                would_block()
            } else {
                e
            });
        }
        Ok(())
    }

    /// Arms the timer for a new wait: disarmed, then emptied (an expiry of
    /// an earlier wait that nobody read must not end this one), then set.
    fn arm(&self, after: Duration) -> Result<()> {
        self.set(Duration::ZERO)?;
        match self.read() {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(reactor_error("read(timerfd)", e)),
        }
        // At least a nanosecond: 0 would disarm it.
        self.set(after.max(Duration::from_nanos(1)))
    }

    /// Ready once the armed time has passed.
    fn poll_expired(&self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        match self.readiness.poll_read(cx, &mut || self.read()) {
            Poll::Ready(Ok(())) => Poll::Ready(Ok(())),
            Poll::Ready(Err(e)) => Poll::Ready(Err(reactor_error("read(timerfd)", e))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Runs `f` for at most `timeout`: `f`'s output, or `ETIMEDOUT` naming
    /// `operation` and what it waited for. `f` is polled first, so an
    /// output that is there wins over an expired timer.
    ///
    /// Cancel safety: dropping the future drops `f` (see its own) and
    /// leaves the timer armed; the next wait re-arms it.
    pub(super) async fn within<T>(
        &self,
        timeout: Duration,
        operation: &'static str,
        waiting_for: &'static str,
        f: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        self.arm(timeout)?;
        let mut f = pin!(f);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(out) = f.as_mut().poll(cx) {
                return Poll::Ready(out);
            }
            match self.poll_expired(cx) {
                Poll::Ready(Ok(())) => Poll::Ready(Err(Error::verb_errno(
                    "rdma_get_cm_event",
                    format!("{operation}: no {waiting_for} within {timeout:?}"),
                    libc::ETIMEDOUT,
                ))),
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }
}

#[cfg(all(test, feature = "async-io"))]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::aio::async_io_rt::AsyncIo;

    fn pending<T>() -> impl Future<Output = Result<T>> {
        std::future::pending()
    }

    #[test]
    fn a_wait_ends_at_its_bound_with_etimedout_naming_the_step() {
        let timer = Timer::new(&AsyncIo).unwrap();
        let start = Instant::now();
        let e = async_io::block_on(timer.within(
            Duration::from_millis(50),
            "rdma_accept",
            "ESTABLISHED",
            pending::<()>(),
        ))
        .unwrap_err();
        let took = start.elapsed();
        assert_eq!(e.errno(), Some(libc::ETIMEDOUT), "{e}");
        assert!(
            e.to_string()
                .contains("rdma_accept: no ESTABLISHED within 50ms"),
            "{e}"
        );
        assert!(took >= Duration::from_millis(50), "{took:?}");
    }

    #[test]
    fn an_output_that_is_there_wins_and_an_unread_expiry_does_not_end_the_next_wait() {
        let timer = Timer::new(&AsyncIo).unwrap();
        let ready = timer.within(Duration::ZERO, "op", "it", async { Ok(7) });
        assert_eq!(async_io::block_on(ready).unwrap(), 7);
        // The zero-length wait above armed a timer that expired unread.
        std::thread::sleep(Duration::from_millis(5));
        let start = Instant::now();
        let e = async_io::block_on(timer.within(
            Duration::from_millis(100),
            "op",
            "it",
            pending::<()>(),
        ))
        .unwrap_err();
        assert_eq!(e.errno(), Some(libc::ETIMEDOUT));
        assert!(start.elapsed() >= Duration::from_millis(100), "ended early");
    }

    #[test]
    fn the_longest_bound_arms() {
        let timer = Timer::new(&AsyncIo).unwrap();
        let out = timer.within(Duration::MAX, "op", "it", async { Ok(()) });
        async_io::block_on(out).unwrap();
    }
}
