//! The async listener ([`RdmaListener`]): takes connection requests from
//! rdma-verbs' async listener, rejects those that are not rsocket's, and
//! answers the rest, several at once, into [`RdmaStream`]s.
//!
//! Answering a request is two steps: making the connection's objects and
//! buffers and sending the reply (done in the poll that takes the request),
//! then waiting for `ESTABLISHED` (a round trip, and on iWARP the MPA
//! exchange). The listener keeps up to [`RdmaListener::max_accepting`]
//! requests in the second step at once instead of one, so a burst of
//! clients is answered in about the time of the slowest, not the sum: siw's
//! initiator gives up 10 s after its MPA request (Linux 6.1), which a burst
//! of 64 answered one after the other overran under TCG. The bound is what
//! a flood of requests can make the server hold (each a PD, CQ, QP and the
//! stream's registered buffers); past it, requests wait in the listener's
//! backlog.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use rdma::aio::{PendingConnection, Reactor};

use super::{connect_options, RdmaStream};
use crate::local::Local;
use crate::setup::{self, Options};
use crate::wire::ConnData;

/// Requests answered at once by default ([`RdmaListener::set_max_accepting`]),
/// by the blocking listener too.
pub const DEFAULT_MAX_ACCEPTING: usize = setup::DEFAULT_MAX_ACCEPTING;

/// One request being answered: its reply sent, `ESTABLISHED` awaited.
type Accepting = Pin<Box<dyn Future<Output = io::Result<(RdmaStream, SocketAddr)>> + Send>>;

/// A listener for rsocket streams on an async runtime.
///
/// Requests are answered while a task awaits [`RdmaListener::accept`]:
/// accept in a loop, handing each stream to a task of its own.
///
/// ```no_run
/// # #[cfg(feature = "tokio")]
/// # async fn f() -> std::io::Result<()> {
/// use rdma::aio::tokio_rt::Tokio;
/// use rdma_stream::{aio::RdmaListener, Options};
///
/// let mut listener = RdmaListener::bind(&Tokio, "10.8.0.1:7471".parse().unwrap(), Options::default())?;
/// loop {
///     let (stream, peer) = listener.accept().await?;
///     tokio::spawn(async move {
///         let (mut r, mut w) = tokio::io::split(stream);
///         let _ = tokio::io::copy(&mut r, &mut w).await;
///         let _ = peer;
///     });
/// }
/// # }
/// ```
pub struct RdmaListener {
    /// The device's context, held while the listener lives (from bind, or
    /// a wildcard listener's first request): on siw it holds rdma-verbs' key
    /// plug (`CmId::context`), which would otherwise be made and destroyed
    /// again (a 1 MiB CQ) whenever the server's connections all came and went.
    device: Option<rdma::Context>,
    listener: rdma::aio::Listener,
    opts: Options,
    /// Requests whose reply is sent, waiting for `ESTABLISHED`.
    accepting: Vec<Accepting>,
    /// Answered (or failed) while another was returned; returned first.
    done: VecDeque<io::Result<(RdmaStream, SocketAddr)>>,
    max_accepting: usize,
}

impl std::fmt::Debug for RdmaListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaListener")
            .field("local", &self.listener.local_addr())
            .field("accepting", &self.accepting.len())
            .finish_non_exhaustive()
    }
}

impl RdmaListener {
    /// Listens on `addr` (port 0: any free port), the connections it
    /// accepts made with `opts`.
    ///
    /// # Errors
    /// As `rdma_bind_addr` and `rdma_listen`, and `InvalidInput` for sizes
    /// that [`Sizes::check`](crate::Sizes::check) refuses.
    pub fn bind<R: Reactor + Clone + 'static>(
        reactor: &R,
        addr: SocketAddr,
        opts: Options,
    ) -> io::Result<RdmaListener> {
        opts.sizes.check()?;
        let listener = rdma::aio::Listener::bind(reactor, addr, 128)
            .map_err(|e| setup::step_error("listening", e))?;
        Ok(RdmaListener {
            device: listener.id().context().ok(),
            listener,
            opts,
            accepting: Vec::new(),
            done: VecDeque::new(),
            max_accepting: DEFAULT_MAX_ACCEPTING,
        })
    }

    /// The bound address, with the port that was picked.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr()
    }

    /// How many requests are answered at once (replied to, `ESTABLISHED`
    /// not yet come); [`DEFAULT_MAX_ACCEPTING`] unless set.
    pub fn max_accepting(&self) -> usize {
        self.max_accepting
    }

    /// Sets how many requests are answered at once (at least 1): the most
    /// connections a burst of requests makes the server hold before
    /// [`RdmaListener::accept`] returns them.
    pub fn set_max_accepting(&mut self, n: usize) {
        self.max_accepting = n.max(1);
    }

    /// Waits for a connection and returns it once established; requests
    /// that are not rsocket's are rejected and the wait goes on. Up to
    /// [`RdmaListener::max_accepting`] requests are answered at once: the
    /// first to be established is returned, the others stay with the
    /// listener for the next calls. A request whose peer gives up, or that
    /// is not established within the connection timeout
    /// (`Options::timeout`), is abandoned (logged) and the wait goes on:
    /// like a TCP listener's, this returns established connections only,
    /// so a hostile or vanished peer cannot end a server's accept loop.
    ///
    /// Cancel safety: dropped while waiting, nothing is lost: requests not
    /// taken stay with the listener, and those being answered stay in it
    /// and go on when `accept` is awaited again (each within the
    /// connection timeout, `Options::timeout`).
    ///
    /// # Errors
    /// This server's failures: taking a request from the listener, or
    /// making a connection's objects for a request (that request is
    /// rejected; those in progress go on, and the listener can be used
    /// again).
    pub async fn accept(&mut self) -> io::Result<(RdmaStream, SocketAddr)> {
        std::future::poll_fn(|cx| self.poll_accept(cx)).await
    }

    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<(RdmaStream, SocketAddr)>> {
        // Take requests while there is room; each one's reply goes out when
        // its future is first polled, below.
        let copts = connect_options(&self.opts);
        while self.accepting.len() < self.max_accepting {
            // A fresh future each time: `incoming` is cancel safe, and its
            // wait registers this task's waker with the listener's mailbox,
            // which keeps it after the future is dropped.
            let taken = {
                let incoming = self.listener.incoming(&copts);
                let mut incoming = std::pin::pin!(incoming);
                incoming.as_mut().poll(cx)
            };
            match taken {
                Poll::Pending => break,
                Poll::Ready(Err(e)) => {
                    self.done
                        .push_back(Err(setup::step_error("taking a connection request", e)));
                    break;
                }
                Poll::Ready(Ok(pending)) => {
                    if self.device.is_none() {
                        self.device = pending.id().context().ok();
                    }
                    match answer(pending, &self.opts) {
                        Ok(Some(f)) => self.accepting.push(f),
                        Ok(None) => {}
                        Err(e) => self.done.push_back(Err(e)),
                    }
                }
            }
        }
        // Every request in progress polled (a new one sends its reply now),
        // the first established returned, the others kept.
        let mut i = 0;
        while i < self.accepting.len() {
            match self.accepting[i].as_mut().poll(cx) {
                Poll::Pending => i += 1,
                Poll::Ready(r) => {
                    drop(self.accepting.swap_remove(i));
                    match r {
                        Ok(s) => self.done.push_back(Ok(s)),
                        // The peer's doing (it rejected, vanished or was
                        // too slow), not the server's.
                        Err(e) => log::warn!("abandoned a connection request: {e}"),
                    }
                }
            }
        }
        match self.done.pop_front() {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }
}

/// Answers `pending`: `None` (rejected) when it is not rsocket's; otherwise
/// the stream's objects and buffers made and the future that sends the
/// reply and waits for `ESTABLISHED`.
fn answer(mut pending: PendingConnection, opts: &Options) -> io::Result<Option<Accepting>> {
    let peer = match ConnData::decode(pending.peer_private_data()) {
        Ok(p) => p,
        Err(e) => {
            log::warn!("rejected a connection request: {e}");
            let _ = pending.reject(&[]);
            return Ok(None);
        }
    };
    let ctx = pending.id().context().map_err(io::Error::from)?;
    let iwarp = setup::is_iwarp(&ctx)?;
    let pd = pending.pd().clone();
    let local = Local::new(&pd, pending.qp(), opts.sizes)?;
    let param = setup::param(local.conn_data().encode().to_vec(), iwarp);
    let opts = opts.clone();
    Ok(Some(Box::pin(async move {
        let conn = pending
            .accept(&param)
            .await
            .map_err(|e| setup::step_error("accepting", e))?;
        let parts = conn.into_parts();
        let addr = parts.peer_addr;
        Ok((
            RdmaStream::from_parts(parts, local, &peer, iwarp, true, &opts),
            addr,
        ))
    })))
}
