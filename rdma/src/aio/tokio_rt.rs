//! The tokio adapter (feature `tokio`): [`Tokio`] registers descriptors with
//! the current runtime's I/O driver through `tokio::io::unix::AsyncFd`.
//!
//! Every constructor that takes [`Tokio`] must run inside a tokio runtime
//! whose I/O driver is enabled (`Builder::enable_io`/`enable_all`, or
//! `#[tokio::main]`): outside one it fails with [`Error::Async`] (`ENXIO`),
//! never a panic. The futures may then be awaited from any task of that
//! runtime.
//!
//! The name shadows no crate: `use rdma::aio::tokio_rt;` sits beside
//! `#[tokio::main]` (as `use rdma::aio::tokio;` could not: E0433). A client
//! in one call, spawned (the connection's futures are `Send`):
//!
//! ```no_run
//! use rdma::aio::{tokio_rt, ConnectOptions};
//! use rdma::cm::ConnParam;
//!
//! #[tokio::main(flavor = "current_thread")]
//! async fn main() -> rdma::Result<()> {
//!     let opts = ConnectOptions {
//!         conn_param: ConnParam::with_private_data(b"hello"),
//!         ..ConnectOptions::default()
//!     };
//!     let dst = "10.8.0.1:7471".parse().unwrap();
//!     let task = tokio::spawn(async move {
//!         let mut conn = tokio_rt::connect(dst, &opts).await?;
//!         println!("connected to {}", conn.peer_addr());
//!         conn.disconnect().await
//!     });
//!     task.await.expect("the task ran")
//! }
//! ```
//!
//! The lower steps:
//!
//! ```no_run
//! # async fn f() -> rdma::Result<()> {
//! use rdma::aio::tokio_rt;
//! let ctx = rdma::Context::open("rxe0")?;
//! let channel = ctx.create_comp_channel()?;
//! let cq = ctx.create_cq(64, Some(&channel), 0)?;
//! let completions = tokio_rt::completions(&cq)?;
//! let cm = tokio_rt::cm_channel()?;
//! let mut listener = cm.listen("10.8.0.1:7471".parse().unwrap(), 16)?;
//! let request = listener.get_request().await?;
//! # drop((completions, request)); Ok(()) }
//! ```

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::task::{Context, Poll};

use ::tokio::io::unix::AsyncFd;
use ::tokio::io::Interest;

use super::{
    AsyncCq, CmChannel, ConnectOptions, Connection, CqChannel, DeviceEvents, Listener, Reactor,
    Readiness,
};
use crate::cm::EventChannel;
use crate::error::{Error, Result};
use crate::CompletionQueue;

/// The tokio reactor of the current runtime.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tokio;

/// A descriptor the registration does not own (its owner outlives it).
struct Fd(RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

struct TokioReadiness(AsyncFd<Fd>);

impl Readiness for TokioReadiness {
    fn poll_read(
        &self,
        cx: &mut Context<'_>,
        attempt: &mut dyn FnMut() -> io::Result<()>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = match self.0.poll_read_ready(cx) {
                Poll::Ready(Ok(g)) => g,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            // `try_io` clears the readiness this guard saw only on
            // WouldBlock, and never one that came after it.
            if let Ok(result) = guard.try_io(|_| attempt()) {
                return Poll::Ready(result);
            }
        }
    }
}

impl Reactor for Tokio {
    fn register(&self, fd: BorrowedFd<'_>) -> Result<Box<dyn Readiness>> {
        let outside = |reason: &'static str| Error::Async {
            operation: "rdma::aio::tokio_rt::Tokio",
            reason: reason.into(),
            errno: libc::ENXIO,
        };
        let handle = ::tokio::runtime::Handle::try_current().map_err(|_| {
            outside(
                "called outside a tokio runtime: create the CqChannel, CmChannel or \
                 DeviceEvents from a task (or inside Runtime::enter)",
            )
        })?;
        let _enter = handle.enter();
        // tokio panics when the runtime has no I/O driver; say so instead.
        let fd = Fd(fd.as_raw_fd());
        let registered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // Deprecated from tokio 1.52 on (its replacement is `unsafe`, with
            // the contract this call meets): the descriptor stays open for
            // the registration's life (the `Reactor` contract). 1.47 is the
            // newest tokio within the crate's MSRV.
            #[allow(deprecated)]
            AsyncFd::with_interest(fd, Interest::READABLE)
        }))
        .map_err(|_| {
            outside(
                "the tokio runtime has no I/O driver (tokio panicked registering the \
                 descriptor): build it with enable_io() or enable_all()",
            )
        })?
        .map_err(|e| Error::Verb {
            verb: "epoll_ctl",
            context: "registering with the tokio reactor".into(),
            source: e,
        })?;
        Ok(Box::new(TokioReadiness(registered)))
    }
}

/// Awaits the completions of `cq` on a [`CqChannel`] of its own channel.
/// For one channel serving many CQs, make one [`CqChannel`] and an
/// [`AsyncCq`] per CQ instead.
///
/// # Errors
/// As [`CqChannel::new`] and [`AsyncCq::new`] (a CQ without a channel is
/// refused).
pub fn completions(cq: &CompletionQueue) -> Result<AsyncCq> {
    let Some(channel) = cq.channel() else {
        return Err(Error::Async {
            operation: "rdma::aio::tokio_rt::completions",
            reason: "the CQ was created without a completion channel, so it can never \
                     signal one: create it with Context::create_cq(.., Some(&channel), ..)"
                .into(),
            errno: libc::EINVAL,
        });
    };
    let driver = CqChannel::new(channel, &Tokio)?;
    AsyncCq::new(&driver, cq)
}

/// A new event channel, driven by tokio.
///
/// # Errors
/// As [`EventChannel::new`] and [`CmChannel::new`].
pub fn cm_channel() -> Result<CmChannel> {
    CmChannel::new(&EventChannel::new()?, &Tokio)
}

/// The asynchronous events of `ctx`, on tokio.
///
/// # Errors
/// As [`DeviceEvents::new`].
pub fn device_events(ctx: &crate::Context) -> Result<DeviceEvents> {
    DeviceEvents::new(ctx, &Tokio)
}

/// Connects to `dst` on tokio: [`Connection::connect`]`(&Tokio, dst, opts)`.
///
/// Cancel safety: as [`Connection::connect`].
///
/// # Errors
/// As [`Connection::connect`].
pub async fn connect(dst: std::net::SocketAddr, opts: &ConnectOptions) -> Result<Connection> {
    Connection::connect(&Tokio, dst, opts).await
}

/// Listens on `addr` on tokio: [`Listener::bind`]`(&Tokio, addr, backlog)`.
///
/// # Errors
/// As [`Listener::bind`].
pub fn listen(addr: std::net::SocketAddr, backlog: i32) -> Result<Listener> {
    Listener::bind(&Tokio, addr, backlog)
}
