//! Awaiting completions, connection manager events, room in a queue and
//! device events: a runtime-agnostic core, with adapters for tokio (feature
//! `tokio`) and async-io/smol (feature `async-io`).
//!
//! # Connections in one call
//! [`Connection::connect`] and [`Listener::accept`] are the async mirror of
//! [`cm::blocking`](crate::cm::blocking): one call resolves, makes the PD,
//! the CQ (awaited through an [`AsyncCq`]) and the RC QP on the route's
//! device, moves the QP to INIT (so that [`Connection::connect_with`]'s and
//! [`Listener::accept_with`]'s closure can post the first receives, which
//! iWARP needs before the peer sends) and connects, each wait bounded by
//! [`ConnectOptions::timeout`] (a timer registered with the reactor like the
//! channels: the core needs no runtime's timer). [`Listener::incoming`]
//! accepts in two phases ([`PendingConnection`]); [`Connection::into_parts`]
//! hands the pieces to a layer built on top. The steps below them stay
//! available for what these do not cover ([`AsyncCmId`], [`Incoming`]).
//!
//! ```no_run
//! # #[cfg(feature = "tokio")]
//! # async fn f() -> rdma::Result<()> {
//! use rdma::aio::{tokio_rt::Tokio, ConnectOptions, Connection, Listener};
//!
//! let opts = ConnectOptions::default();
//! let mut listener = Listener::bind(&Tokio, "10.8.0.1:0".parse().unwrap(), 16)?;
//! let addr = listener.local_addr();
//! let (server, client) = tokio::join!(
//!     listener.accept(&opts),
//!     Connection::connect(&Tokio, addr, &opts)
//! );
//! let (mut server, client) = (server?, client?);
//! assert_eq!(server.peer_addr(), client.local_addr());
//! server.disconnect().await?;
//! # drop(client); Ok(()) }
//! ```
//!
//! # The seams
//! - [`CqChannel`] drives a [`CompletionChannel`] from a reactor; an
//!   [`AsyncCq`] awaits the completions of one CQ that signals it. One channel
//!   serves any number of CQs: each wake-up reads every pending event until
//!   `EAGAIN` (what an edge-triggered reactor needs), notes which CQ fired,
//!   and wakes only that CQ's waiter. Events are acknowledged in batches
//!   (`ibv_ack_cq_events` takes a lock), and always before the CQ can be
//!   destroyed: an unacknowledged event keeps its CQ alive.
//! - [`CmChannel`] drives an [`EventChannel`](crate::cm::EventChannel): it
//!   routes each event to the [`AsyncCmId`] it is about (a connect request to
//!   its listener), whose connection steps are futures: resolving, connecting,
//!   accepting in two phases ([`Incoming`]), disconnecting.
//! - [`DeviceEvents`] awaits a context's asynchronous events (port changes,
//!   QP errors, an SRQ's limit).
//! - [`AsyncCq::send_room`] / [`AsyncCq::recv_room`] wait until a queue pair
//!   has room for another request, and [`AsyncCq::post_send`] /
//!   [`AsyncCq::post_recv`] post once it has: a full queue waits instead of
//!   failing.
//!
//! Every type is usable from any reactor: it is built from a [`Reactor`],
//! which registers a file descriptor and hands back a [`Readiness`], the one
//! trait an adapter implements; the types themselves expose `poll_*(cx)`
//! methods and futures built on them. `aio::tokio_rt` (feature
//! `tokio`) and `aio::async_io_rt` (feature `async-io`) are such adapters,
//! named so that neither shadows the runtime crate it adapts.
//!
//! # The wait, and why no wake-up is lost
//! [`AsyncCq`] polls the CQ; when it is empty it arms it
//! (`ibv_req_notify_cq`) and polls **again** (a completion that arrived
//! between the first poll and the arm produces no event), and only then
//! waits for the channel. When the channel reports the CQ, the arm is spent:
//! the next wait polls, arms and polls again.
//!
//! # Cancellation
//! Every future of this module may be dropped at any await point without
//! losing anything; each method says what happens. In short: completions
//! polled from a CQ wait in their [`AsyncCq`] (never in a future), CM events
//! wait in their id's mailbox in the [`CmChannel`], a request handed to a
//! posting future is either posted (its memory then belongs to the queue and
//! comes back with its completion) or dropped unposted with the future
//! (the device never saw it), and no event is left unacknowledged past the
//! drop of the handle that holds it, so `ibv_destroy_cq` and
//! `rdma_destroy_id` never wait forever.
//!
//! # Misuse
//! A CQ without a channel, a CQ signalling another channel, a channel read
//! both by a [`CqChannel`] and by a blocking wait
//! ([`CompletionQueue::wait`], [`CompletionChannel::get_event`]), and a
//! runtime adapter used outside its runtime are [`Error::Async`] errors that
//! say which, never a hang.
//!
//! ```no_run
//! # #[cfg(feature = "tokio")]
//! # async fn f() -> rdma::Result<()> {
//! use rdma::aio::{tokio_rt::Tokio, AsyncCq, CqChannel};
//! let ctx = rdma::Context::open("rxe0")?;
//! let channel = ctx.create_comp_channel()?;
//! let cq = ctx.create_cq(64, Some(&channel), 0)?;
//! let driver = CqChannel::new(&channel, &Tokio)?;
//! let mut completions = AsyncCq::new(&driver, &cq)?;
//! // ... post work on a QP that uses `cq` ...
//! let done = completions.next().await?;
//! println!("{} finished: {}", done.wr_id, done.status);
//! # Ok(()) }
//! ```

mod cm;
mod conn;
mod cq;
mod cq_channel;
mod device;
mod listener;
mod timer;
mod wake;

#[cfg(feature = "async-io")]
#[cfg_attr(docsrs, doc(cfg(feature = "async-io")))]
pub mod async_io_rt;
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub mod tokio_rt;

use std::io;
use std::os::fd::BorrowedFd;
use std::task::{Context, Poll};

pub use cm::{AsyncCmId, CmChannel, Incoming};
pub use conn::{Connecting, Connection, ConnectionParts};
pub use cq::{AsyncCq, NextInto};
pub use cq_channel::CqChannel;
pub use device::DeviceEvents;
pub use listener::{Listener, PendingConnection};

/// The options of [`Connection::connect`] and [`Listener::accept`]: the
/// blocking layer's own ([`crate::cm::blocking::ConnectOptions`]).
pub use crate::cm::blocking::ConnectOptions;

#[allow(unused_imports)] // used by the docs above
use crate::{CompletionChannel, CompletionQueue, Error};

/// Read readiness of one registered file descriptor: what a runtime adapter
/// implements.
///
/// The contract is tokio's `AsyncFd::poll_read_ready` followed by
/// `try_io`: wait until the reactor reports the descriptor readable, run the
/// attempt, and when the attempt fails with [`io::ErrorKind::WouldBlock`],
/// forget the readiness seen **before** the attempt (never one reported
/// while it ran, or an edge-triggered reactor loses a wake-up) and wait
/// again.
pub trait Readiness: Send + Sync {
    /// Runs `attempt` once the descriptor is readable, as described above:
    /// `Ready` with what `attempt` returned, unless it returned
    /// `WouldBlock`; `Pending` (with `cx` registered) while the descriptor is
    /// not readable.
    fn poll_read(
        &self,
        cx: &mut Context<'_>,
        attempt: &mut dyn FnMut() -> io::Result<()>,
    ) -> Poll<io::Result<()>>;
}

/// A reactor that registers file descriptors: a runtime adapter's entry
/// point (`aio::tokio_rt::Tokio`, `aio::async_io_rt::AsyncIo`).
///
/// `Send + Sync`: [`Connection::connect`] and [`Listener`] keep it across
/// their awaits, and their futures stay `Send` (spawnable on a
/// work-stealing runtime).
pub trait Reactor: Send + Sync {
    /// Registers `fd` (already non-blocking) for read readiness. The
    /// registration is dropped before the descriptor is closed.
    ///
    /// # Errors
    /// The adapter's: [`Error::Async`] outside its runtime,
    /// [`Error::Verb`] when the registration fails.
    fn register(&self, fd: BorrowedFd<'_>) -> crate::Result<Box<dyn Readiness>>;
}

/// `Err(WouldBlock)`: the end of a drain.
fn would_block() -> io::Error {
    io::Error::from(io::ErrorKind::WouldBlock)
}

/// A reactor's failure as a crate error.
fn reactor_error(operation: &'static str, e: io::Error) -> Error {
    Error::Verb {
        verb: operation,
        context: "waiting for the descriptor to become readable".into(),
        source: e,
    }
}
