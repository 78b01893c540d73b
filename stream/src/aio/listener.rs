//! The async listener ([`RdmaListener`]): takes connection requests from
//! rdma-verbs' async listener, rejects those that are not rsocket's, and
//! accepts the rest into [`RdmaStream`]s.

use std::io;
use std::net::SocketAddr;

use rdma::aio::Reactor;

use super::{connect_options, RdmaStream};
use crate::local::Local;
use crate::setup::{self, Options};
use crate::wire::ConnData;

/// A listener for rsocket streams on an async runtime.
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
    listener: rdma::aio::Listener,
    opts: Options,
}

impl std::fmt::Debug for RdmaListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaListener")
            .field("local", &self.listener.local_addr())
            .finish_non_exhaustive()
    }
}

impl RdmaListener {
    /// Listens on `addr` (port 0: any free port), the connections it
    /// accepts made with `opts`.
    ///
    /// # Errors
    /// As `rdma_bind_addr` and `rdma_listen`.
    pub fn bind<R: Reactor + Clone + 'static>(
        reactor: &R,
        addr: SocketAddr,
        opts: Options,
    ) -> io::Result<RdmaListener> {
        let listener = rdma::aio::Listener::bind(reactor, addr, 128)
            .map_err(|e| setup::step_error("listening", e))?;
        Ok(RdmaListener { listener, opts })
    }

    /// The bound address, with the port that was picked.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr()
    }

    /// Waits for a connection and accepts it; requests that are not
    /// rsocket's are rejected and the wait goes on.
    ///
    /// Cancel safety: dropped while waiting, no request is lost (it stays
    /// with the listener); dropped while accepting one, that connection is
    /// abandoned.
    ///
    /// # Errors
    /// The errors of accepting one request.
    pub async fn accept(&mut self) -> io::Result<(RdmaStream, SocketAddr)> {
        let copts = connect_options(&self.opts);
        loop {
            let mut pending = self
                .listener
                .incoming(&copts)
                .await
                .map_err(|e| setup::step_error("taking a connection request", e))?;
            let peer = match ConnData::decode(pending.peer_private_data()) {
                Ok(p) => p,
                Err(e) => {
                    log::warn!("rejected a connection request: {e}");
                    let _ = pending.reject(&[]);
                    continue;
                }
            };
            let ctx = pending.id().context().map_err(io::Error::from)?;
            let iwarp = setup::is_iwarp(&ctx)?;
            let pd = pending.pd().clone();
            let local = Local::new(&pd, pending.qp(), self.opts.sizes)?;
            let ours = local.conn_data().encode().to_vec();
            let conn = pending
                .accept(&setup::param(ours, iwarp))
                .await
                .map_err(|e| setup::step_error("accepting", e))?;
            let parts = conn.into_parts();
            let addr = parts.peer_addr;
            return Ok((
                RdmaStream::from_parts(parts, local, &peer, iwarp, true, &self.opts),
                addr,
            ));
        }
    }
}
