//! Direct placement on the async stream: rsocket's `riomap`, `riowrite`
//! and `riounmap` as [`RdmaStream::iomap`], [`RdmaStream::iowrite`] and
//! [`RdmaStream::iounmap`], the same protocol and checks as the blocking
//! stream's (`crate::iomap` has both, and what one mapping is); here the
//! waits are the task's: a mapping waits for a credit, a write for room in
//! the send queue, and [`RdmaStream::iomap_wait`] for the peer's marker,
//! yielding to the executor in between.

use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use rdma::Buffer;

use super::{Direction, Inner, RdmaStream};
use crate::iomap::{self, Announcement, IoMap};

/// How often [`RdmaStream::iomap_wait`] looks at the connection between
/// its looks at the memory.
const LOOK_EVERY: Duration = Duration::from_millis(1);

/// Frees the slot of a mapping whose announcement did not go (its future
/// dropped, or the connection failed).
struct Unannounced<'a> {
    inner: &'a Inner,
    pending: &'a Announcement,
    posted: bool,
}

impl Drop for Unannounced<'_> {
    fn drop(&mut self) {
        if !self.posted {
            self.pending.abandon(&mut self.inner.lock().engine);
        }
    }
}

/// Ready at its second poll: lets the executor run other tasks between two
/// looks at a mapping.
struct YieldNow(bool);

impl Future for YieldNow {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl RdmaStream {
    /// Maps `buf` for the peer to write at offsets `offset..offset + len`,
    /// as [`crate::RdmaStream::iomap`]; the task waits for a credit if
    /// none is free.
    ///
    /// Cancel safety: dropped before the announcement went, the memory is
    /// deregistered and freed and its slot free again.
    ///
    /// # Errors
    /// As [`crate::RdmaStream::iomap`].
    pub async fn iomap(&self, buf: impl Into<Box<[u8]>>, offset: u64) -> io::Result<IoMap> {
        let pending = {
            let mut s = self.inner.lock();
            let s = &mut *s;
            Announcement::prepare(&mut s.engine, &s._pd, buf.into(), offset)?
        };
        let mut guard = Unannounced {
            inner: &self.inner,
            pending: &pending,
            posted: false,
        };
        poll_fn(|cx| {
            self.inner
                .poll_op(cx, Direction::Write, |e| pending.try_post(e))
        })
        .await?;
        guard.posted = true;
        drop(guard);
        Ok(pending.done())
    }

    /// Writes `buf` to the peer's offset `offset`, as
    /// [`crate::RdmaStream::iowrite`] in blocking mode: when it returns,
    /// every byte is posted (or the rest lies in no mapping).
    ///
    /// Cancel safety: none; dropped midway, a part may have been written.
    ///
    /// # Errors
    /// As [`crate::RdmaStream::iowrite`].
    pub async fn iowrite(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let at = iomap::write_offset(buf.len(), offset, done)?;
            let part = &buf[done..];
            let posted = poll_fn(|cx| {
                self.inner
                    .poll_op(cx, Direction::Write, |e| iomap::post_some(e, part, at))
            })
            .await;
            match posted {
                Ok(n) => done += n,
                Err(e) if iomap::ends_short(&e, done) => break,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// Copies bytes `at..at + out.len()` of `map` into `out`, as
    /// [`crate::RdmaStream::iomap_read`].
    ///
    /// # Errors
    /// As [`crate::RdmaStream::iomap_read`].
    pub fn iomap_read(&self, map: &IoMap, at: usize, out: &mut [u8]) -> io::Result<()> {
        iomap::read_mapped(&self.inner.lock().engine, map, at, out)
    }

    /// Waits until byte `at` of `map` is `value`, as
    /// [`crate::RdmaStream::iomap_wait`]: the task looks at the memory,
    /// yields to the executor, and looks again (nothing wakes it when an
    /// RDMA WRITE lands: the executor's thread stays busy, as C's spin
    /// does); every millisecond it also takes the connection's completions
    /// and events, so a peer that closes or fails ends the wait.
    ///
    /// Run by the task that reads: the wait takes the read side's waker.
    ///
    /// # Errors
    /// As [`crate::RdmaStream::iomap_wait`].
    pub async fn iomap_wait(
        &self,
        map: &IoMap,
        at: usize,
        value: u8,
        timeout: Option<Duration>,
    ) -> io::Result<()> {
        let start = Instant::now();
        let mut look_at = start;
        let mut b = [0];
        loop {
            self.iomap_read(map, at, &mut b)?;
            if b[0] == value {
                return Ok(());
            }
            let now = Instant::now();
            if now >= look_at {
                if timeout.is_some_and(|t| now - start >= t) {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("riomap: byte {at} of the mapping did not become {value}"),
                    ));
                }
                if let Err(e) = self.look_at_connection(at, value).await {
                    // The peer's marker WRITE lands before its DISCONNECT: the
                    // byte may have become `value` since it was read above.
                    self.iomap_read(map, at, &mut b)?;
                    if b[0] == value {
                        return Ok(());
                    }
                    return Err(e);
                }
                look_at = now + LOOK_EVERY;
            }
            YieldNow(false).await;
        }
    }

    /// Takes the completions and events there are (one poll, never a
    /// sleep): an error when the connection is no longer up.
    async fn look_at_connection(&self, at: usize, value: u8) -> io::Result<()> {
        poll_fn(|cx| {
            let up = self
                .inner
                .poll_op(cx, Direction::Read, |e| iomap::still_up(e, at, value));
            match up {
                Poll::Ready(r) => Poll::Ready(r),
                // Nothing more to take: up, as far as it says.
                Poll::Pending => Poll::Ready(Ok(())),
            }
        })
        .await
    }

    /// Unmaps `map` and gives its memory back, as
    /// [`crate::RdmaStream::iounmap`].
    ///
    /// # Errors
    /// As [`crate::RdmaStream::iounmap`].
    pub fn iounmap(&self, map: IoMap) -> io::Result<Buffer> {
        iomap::unmap(&mut self.inner.lock().engine, map)
    }
}
