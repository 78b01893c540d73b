//! The server's side of [`Connection`]: [`Listener`] and the two-phase
//! accept's [`PendingConnection`] (the client's side, with the connection
//! itself, is in `conn`).

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use super::conn::{addresses, resources, Connection};
use super::timer::Timer;
use super::{AsyncCmId, AsyncCq, CmChannel, Reactor};
use crate::cm::blocking::ConnectOptions;
use crate::cm::{CmEventType, CmId, ConnParam, EventChannel};
use crate::error::Result;
use crate::{ProtectionDomain, QueuePair};

/// A listening id on an event channel of its own, driven by a reactor: the
/// async mirror of [`cm::blocking::Listener`](crate::cm::blocking::Listener).
///
/// Each accepted connection gets an event channel of its own (its id is
/// migrated off the listener's), so it stays usable after the listener is
/// dropped. Waiting takes `&mut self`: one task accepts at a time; the
/// two-phase [`Listener::incoming`] hands the rest of each handshake to
/// another task.
///
/// # Examples
/// Serve each connection in a task of its own, with a receive posted before
/// the accept (the client may send at once):
///
/// ```no_run
/// # #[cfg(feature = "tokio")]
/// # async fn f() -> rdma::Result<()> {
/// use rdma::aio::{tokio_rt::Tokio, ConnectOptions, Listener};
/// use rdma::{AccessFlags, PostError};
///
/// let mut listener = Listener::bind(&Tokio, "10.8.0.1:7471".parse().unwrap(), 16)?;
/// println!("listening on {}", listener.local_addr());
/// let opts = ConnectOptions::default();
/// loop {
///     let mut conn = listener
///         .accept_with(&opts, |qp, pd| {
///             let buf = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
///             qp.post_recv(1, buf).map_err(PostError::drop_buffers)
///         })
///         .await?;
///     tokio::spawn(async move {
///         let mut c = conn.cq().next().await?.ok()?;
///         let buf = c.take_buffers().into_one().expect("the receive's region");
///         println!("{}: {:?}", conn.peer_addr(), &buf.to_vec()[..c.byte_len as usize]);
///         conn.disconnected().await
///     });
/// }
/// # }
/// ```
pub struct Listener {
    id: AsyncCmId,
    local: SocketAddr,
    reactor: Arc<dyn Reactor>,
}

impl Listener {
    /// Binds to `addr` (port 0: any free port) and listens (TCP port space),
    /// on an event channel driven by `reactor`, which the accepted
    /// connections use too.
    ///
    /// # Errors
    /// As [`CmId::bind_addr`] and [`CmId::listen`]; the reactor's errors
    /// ([`Error::Async`](crate::Error::Async) outside its runtime).
    pub fn bind<R: Reactor + Clone + 'static>(
        reactor: &R,
        addr: SocketAddr,
        backlog: i32,
    ) -> Result<Listener> {
        let id = CmChannel::new(&EventChannel::new()?, reactor)?.listen(addr, backlog)?;
        let mut local = id.id().local_addr().unwrap_or(addr);
        local.set_port(id.id().src_port());
        Ok(Listener {
            id,
            local,
            reactor: Arc::new(reactor.clone()),
        })
    }

    /// The bound address, with the port that was picked.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The listening id.
    pub fn id(&self) -> &CmId {
        self.id.id()
    }

    /// Waits for a connection request, accepts it with a new QP, and waits,
    /// at most `opts.timeout`, for `ESTABLISHED`. The wait for the request
    /// itself is not bounded (a server waits for its clients however long;
    /// bound it with the runtime's timeout if needed).
    ///
    /// Cancel safety: dropped while waiting for the request, the future
    /// loses nothing (the request waits in the listener's mailbox for the
    /// next call); dropped while waiting for `ESTABLISHED`, it abandons that
    /// connection (its id destroyed: the client sees a reject or a
    /// disconnection). Nothing is left unacknowledged.
    ///
    /// # Errors
    /// `ETIMEDOUT` when `ESTABLISHED` does not come within the timeout;
    /// [`Error::CmEvent`](crate::Error::CmEvent) for another event of the listener; the errors of
    /// the calls on the way (the request is then rejected).
    pub async fn accept(&mut self, opts: &ConnectOptions) -> Result<Connection> {
        self.accept_with(opts, |_, _| Ok(())).await
    }

    /// As [`Listener::accept`], calling `prepare` with the new QP (in INIT)
    /// and its PD before accepting, to post the first receives (see
    /// [`Connection::connect_with`]; on iWARP this is required when the peer
    /// sends first). To send the peer something made on the new PD (the
    /// rkey of a region), use [`Listener::incoming`] instead. The accept
    /// carries `opts.conn_param`.
    ///
    /// Cancel safety: as [`Listener::accept`].
    ///
    /// # Errors
    /// As [`Listener::accept`], and the error `prepare` returns (the request
    /// is then rejected).
    pub async fn accept_with(
        &mut self,
        opts: &ConnectOptions,
        prepare: impl FnOnce(&mut QueuePair, &ProtectionDomain) -> Result<()>,
    ) -> Result<Connection> {
        let mut pending = self.incoming(opts).await?;
        if let Err(e) = prepare(&mut pending.conn.qp, &pending.conn.pd) {
            let _ = pending.id().reject(&[]);
            return Err(e);
        }
        pending.accept(&opts.conn_param).await
    }

    /// The first phase of a two-phase accept: waits for a connection
    /// request (not bounded, as in [`Listener::accept`]), gives it an event
    /// channel of its own, and makes its PD, CQ and QP (in INIT, so
    /// receives can be posted) without answering it. Register memory on
    /// [`PendingConnection::pd`], put its [`crate::RemoteMemory::to_bytes`]
    /// in the private data, and [`PendingConnection::accept`] (which another
    /// task may await while this one takes the next request).
    ///
    /// ```no_run
    /// # #[cfg(feature = "tokio")]
    /// # async fn f() -> rdma::Result<()> {
    /// use rdma::aio::{tokio_rt, ConnectOptions};
    /// use rdma::cm::ConnParam;
    /// use rdma::AccessFlags;
    ///
    /// let mut listener = tokio_rt::listen("10.8.0.1:7471".parse().unwrap(), 16)?;
    /// let pending = listener.incoming(&ConnectOptions::default()).await?;
    /// let target = pending
    ///     .pd()
    ///     .alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    /// let param = ConnParam::with_private_data(&target.remote().to_bytes());
    /// let conn = pending.accept(&param).await?;
    /// # drop(conn); Ok(()) }
    /// ```
    ///
    /// Cancel safety: dropped while waiting for the request, the future
    /// loses nothing (the request waits in the listener's mailbox). The
    /// rest of the work is done in the poll that takes the request.
    ///
    /// # Errors
    /// [`Error::CmEvent`](crate::Error::CmEvent) for another event of the listener; the errors of
    /// the calls on the way (the request is then rejected).
    pub async fn incoming(&mut self, opts: &ConnectOptions) -> Result<PendingConnection> {
        let request = self
            .id
            .expect(&[CmEventType::ConnectRequest], "rdma_listen")
            .await?;
        let id = request.id().clone();
        let private_data = request.private_data().to_vec();
        // Acknowledged before the id moves: rdma_migrate_id waits for that.
        drop(request);
        self.pending(&id, private_data, opts).inspect_err(|_| {
            let _ = id.reject(&[]);
        })
    }

    fn pending(
        &self,
        id: &CmId,
        private_data: Vec<u8>,
        opts: &ConnectOptions,
    ) -> Result<PendingConnection> {
        let reactor = &*self.reactor;
        let channel = EventChannel::new()?;
        id.migrate_id(Some(&channel))?;
        let timer = Timer::new(reactor)?;
        let async_id = CmChannel::new(&channel, reactor)?.register(id)?;
        let (local, peer) = addresses(id)?;
        let (pd, cq, qp) = resources(id, opts, reactor)?;
        Ok(PendingConnection {
            conn: Connection {
                qp,
                cq,
                pd,
                private_data,
                local,
                peer,
                timeout: opts.timeout,
                timer,
                id: async_id,
            },
        })
    }
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("id", &self.id)
            .field("addr", &self.local)
            .finish_non_exhaustive()
    }
}

/// A connection request with its PD, CQ and QP made, not answered yet
/// ([`Listener::incoming`]). Dropped unanswered, its id is destroyed, which
/// rejects it.
///
/// ```no_run
/// # #[cfg(feature = "async-io")]
/// # async fn f() -> rdma::Result<()> {
/// use rdma::aio::{async_io_rt::AsyncIo, ConnectOptions, Listener};
/// use rdma::cm::ConnParam;
/// use rdma::{AccessFlags, PostError};
///
/// let mut listener = Listener::bind(&AsyncIo, "10.8.0.1:7471".parse().unwrap(), 16)?;
/// let mut pending = listener.incoming(&ConnectOptions::default()).await?;
/// if !pending.peer_private_data().starts_with(b"hello") {
///     return pending.reject(b"who?");
/// }
/// let buf = pending.pd().alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
/// pending.qp().post_recv(1, buf).map_err(PostError::drop_buffers)?;
/// let conn = pending.accept(&ConnParam::with_private_data(b"welcome")).await?;
/// # drop(conn); Ok(()) }
/// ```
pub struct PendingConnection {
    /// What `accept` hands out once `ESTABLISHED` came (its teardown order).
    conn: Connection,
}

impl PendingConnection {
    /// The new QP, in INIT (post the first receives here).
    pub fn qp(&mut self) -> &mut QueuePair {
        &mut self.conn.qp
    }

    /// The connection's protection domain: memory registered here can be
    /// advertised in the accept's private data.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.conn.pd
    }

    /// The completions of both queues, awaited.
    pub fn cq(&mut self) -> &mut AsyncCq {
        &mut self.conn.cq
    }

    /// The connection manager id of the request.
    pub fn id(&self) -> &CmId {
        self.conn.id.id()
    }

    /// The private data the peer sent with its request (on InfiniBand/RoCE
    /// padded with zeros to the REQ's fixed size).
    pub fn peer_private_data(&self) -> &[u8] {
        &self.conn.private_data
    }

    /// The local address and port the request came to.
    pub fn local_addr(&self) -> SocketAddr {
        self.conn.local
    }

    /// The peer's address and port.
    pub fn peer_addr(&self) -> SocketAddr {
        self.conn.peer
    }

    /// Accepts with `param` (its private data goes to the peer) and waits,
    /// at most the timeout, for `ESTABLISHED`.
    ///
    /// Cancel safety: dropped before `ESTABLISHED`, the future drops the
    /// connection's objects and its id (acknowledging its events): the
    /// connection is abandoned, nothing is left unacknowledged.
    ///
    /// # Errors
    /// As [`CmId::accept_qp`] (the request is then rejected); `ETIMEDOUT`
    /// or [`Error::CmEvent`](crate::Error::CmEvent) when `ESTABLISHED` does not come.
    pub async fn accept(mut self, param: &ConnParam) -> Result<Connection> {
        let c = &mut self.conn;
        if let Err(e) = c.id.id().accept_qp(&c.qp, param) {
            let _ = c.id.id().reject(&[]);
            return Err(e);
        }
        let step = c.id.expect(&[CmEventType::Established], "rdma_accept");
        drop(
            c.timer
                .within(c.timeout, "rdma_accept", "ESTABLISHED", step)
                .await?,
        );
        Ok(self.conn)
    }

    /// Rejects the request with `private_data` ([`CmId::reject`]).
    ///
    /// # Errors
    /// As [`CmId::reject`].
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        self.conn.id.id().reject(private_data)
    }
}

impl fmt::Debug for PendingConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingConnection")
            .field("qp", &self.conn.qp)
            .field("local", &self.conn.local)
            .field("peer", &self.conn.peer)
            .finish_non_exhaustive()
    }
}
