//! The async-io adapter (feature `async-io`): [`AsyncIo`] registers
//! descriptors with async-io's global reactor, which smol and
//! `async_io::block_on` drive. It works from any thread and needs no
//! runtime object.
//!
//! ```no_run
//! use rdma::aio::{async_io_rt, ConnectOptions};
//!
//! fn main() -> rdma::Result<()> {
//!     async_io::block_on(async {
//!         let opts = ConnectOptions::default();
//!         let mut listener = async_io_rt::listen("10.8.0.1:0".parse().unwrap(), 16)?;
//!         let addr = listener.local_addr();
//!         let (server, client) = futures_lite::future::zip(
//!             listener.accept(&opts),
//!             async_io_rt::connect(addr, &opts),
//!         )
//!         .await;
//!         let (mut server, mut client) = (server?, client?);
//!         client.disconnect().await?;
//!         server.disconnected().await
//!     })
//! }
//! ```

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::task::{Context, Poll};

use super::{ConnectOptions, Connection, Listener, Reactor, Readiness};
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

/// Connects to `dst` on async-io: [`Connection::connect`]`(&AsyncIo, dst,
/// opts)`.
///
/// Cancel safety: as [`Connection::connect`].
///
/// # Errors
/// As [`Connection::connect`].
pub async fn connect(dst: std::net::SocketAddr, opts: &ConnectOptions) -> Result<Connection> {
    Connection::connect(&AsyncIo, dst, opts).await
}

/// Listens on `addr` on async-io: [`Listener::bind`]`(&AsyncIo, addr,
/// backlog)`.
///
/// # Errors
/// As [`Listener::bind`].
pub fn listen(addr: std::net::SocketAddr, backlog: i32) -> Result<Listener> {
    Listener::bind(&AsyncIo, addr, backlog)
}
