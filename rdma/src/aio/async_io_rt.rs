//! The async-io adapter (feature `async-io`): [`AsyncIo`] registers
//! descriptors with async-io's global reactor, which smol and
//! `async_io::block_on` drive. It works from any thread and needs no
//! runtime object.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::task::{Context, Poll};

use super::{Reactor, Readiness};
use crate::error::{Error, Result};

/// async-io's reactor.
#[derive(Debug, Clone, Copy, Default)]
pub struct AsyncIo;

/// A descriptor the registration does not own: its owner (a channel or a
/// context) outlives the registration ([`Reactor::register`]).
struct Fd(RawFd);

impl AsFd for Fd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor stays open while the registration lives
        // (the `Reactor` contract: the registration is dropped first).
        unsafe { BorrowedFd::borrow_raw(self.0) }
    }
}

struct AsyncIoReadiness(async_io::Async<Fd>);

impl Readiness for AsyncIoReadiness {
    fn poll_read(
        &self,
        cx: &mut Context<'_>,
        attempt: &mut dyn FnMut() -> io::Result<()>,
    ) -> Poll<io::Result<()>> {
        // async-io's own read loop: try, and wait for a new readiness event
        // only after WouldBlock.
        loop {
            match attempt() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                result => return Poll::Ready(result),
            }
            match self.0.poll_readable(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Reactor for AsyncIo {
    fn register(&self, fd: BorrowedFd<'_>) -> Result<Box<dyn Readiness>> {
        let registered = async_io::Async::new(Fd(fd.as_raw_fd())).map_err(|e| Error::Verb {
            verb: "epoll_ctl",
            context: "registering with the async-io reactor".into(),
            source: e,
        })?;
        Ok(Box::new(AsyncIoReadiness(registered)))
    }
}
