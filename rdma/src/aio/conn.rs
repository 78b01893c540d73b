//! Connections in one call: [`Connection`], [`Listener`] and
//! [`PendingConnection`], the async mirror of [`crate::cm::blocking`].
//!
//! Every connection owns its objects: an event channel of its own driven by
//! a [`CmChannel`] (an accepted id is migrated off the listener's, so a
//! connection outlives its listener), a completion channel of its own
//! driven by a [`CqChannel`] for its one CQ, and a timer on the same
//! reactor that bounds the waits of the steps it starts.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::timer::Timer;
use super::{AsyncCmId, AsyncCq, CmChannel, CqChannel, Reactor};
use crate::cm::blocking::ConnectOptions;
use crate::cm::{CmAddr, CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use crate::error::{Error, Result};
use crate::{ProtectionDomain, QpState, QpType, QueuePair};

/// The PD, the CQ (with a completion channel of its own, driven from
/// `reactor`) and the RC QP, in INIT (providers refuse receives in RESET),
/// on the id's device.
fn resources(
    id: &CmId,
    opts: &ConnectOptions,
    reactor: &dyn Reactor,
) -> Result<(ProtectionDomain, AsyncCq, QueuePair)> {
    let ctx = id.context()?;
    let pd = ctx.alloc_pd()?;
    let channel = ctx.create_comp_channel()?;
    let cq = ctx.create_cq(opts.cqe, Some(&channel), 0)?;
    // The AsyncCq keeps the driver (and the channel) alive.
    let acq = AsyncCq::new(&CqChannel::new(&channel, reactor)?, &cq)?;
    let qp = pd
        .qp_builder(QpType::Rc, &cq, &cq)
        .max_send_wr(opts.max_send_wr)
        .max_recv_wr(opts.max_recv_wr)
        .max_send_sge(opts.max_sge)
        .max_recv_sge(opts.max_sge)
        .max_inline_data(opts.max_inline_data)
        .build()?;
    id.modify_qp(&qp, QpState::Init)?;
    Ok((pd, acq, qp))
}

/// The id's local and peer IP addresses (an `AF_IB` connection has none).
fn addresses(id: &CmId) -> Result<(SocketAddr, SocketAddr)> {
    match (id.local_addr(), id.peer_addr()) {
        (Some(local), Some(peer)) => Ok((local, peer)),
        _ => Err(Error::Async {
            operation: "aio::Connection",
            reason: "the connection's addresses are not IP addresses (AF_IB): use the \
                     AsyncCmId steps and CmId::local_cm_addr instead"
                .into(),
            errno: libc::EAFNOSUPPORT,
        }),
    }
}

/// A connected RC queue pair with its CQ (awaited through an [`AsyncCq`]),
/// PD and connection manager id, made by [`Connection::connect`] or
/// [`Listener::accept`]: the async mirror of
/// [`cm::blocking::Connection`](crate::cm::blocking::Connection).
///
/// Field order is teardown order: the QP goes before its CQ and PD, the id
/// after them. [`Connection::into_parts`] hands the pieces to a layer built
/// on top.
///
/// # Examples
/// Connect with a receive posted first, send one message, await the
/// answer, disconnect (tokio; `Connection::connect(&AsyncIo, ..)` is the
/// same on async-io).
///
/// ```no_run
/// # #[cfg(feature = "tokio")]
/// # async fn f() -> rdma::Result<()> {
/// use rdma::aio::{tokio_rt::Tokio, ConnectOptions, Connection};
/// use rdma::{AccessFlags, PostError, SendWr};
///
/// let dst = "10.8.0.1:7471".parse().unwrap();
/// let mut conn = Connection::connect_with(&Tokio, dst, &ConnectOptions::default(), |qp, pd| {
///     // In INIT: the receive is there before the peer can send.
///     let buf = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
///     qp.post_recv(1, buf).map_err(PostError::drop_buffers)
/// })
/// .await?;
/// let msg = conn.pd().reg_mr(b"ping".to_vec(), AccessFlags::empty())?;
/// conn.qp()
///     .post_send(SendWr::send(2, msg))
///     .map_err(PostError::drop_buffers)?;
/// for _ in 0..2 {
///     let c = conn.cq().next().await?.ok()?;
///     println!("{} done: {:?}", c.wr_id, c.opcode);
/// }
/// println!("{} -> {}", conn.local_addr(), conn.peer_addr());
/// conn.disconnect().await?;
/// # Ok(()) }
/// ```
pub struct Connection {
    qp: QueuePair,
    cq: AsyncCq,
    pd: ProtectionDomain,
    private_data: Vec<u8>,
    local: SocketAddr,
    peer: SocketAddr,
    timeout: Duration,
    timer: Timer,
    id: AsyncCmId,
}

/// The pieces of a [`Connection`] ([`Connection::into_parts`]), for a layer
/// that owns them itself (a byte stream, a protocol's transport).
///
/// Field order is teardown order, as in [`Connection`]: drop the QP before
/// the CQ and PD, and the id last, when the pieces go separately.
///
/// ```no_run
/// # async fn f(conn: rdma::aio::Connection) -> rdma::Result<()> {
/// let parts = conn.into_parts();
/// let rdma::aio::ConnectionParts { qp, cq, pd, mut id, .. } = parts;
/// // ... the layer's own traffic on `qp` and `cq`, memory on `pd` ...
/// id.disconnect().await?;
/// drop((qp, cq, pd, id));
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct ConnectionParts {
    /// The connected RC queue pair (RTS).
    pub qp: QueuePair,
    /// Its one CQ (both queues), awaited.
    pub cq: AsyncCq,
    /// The protection domain the QP was made on.
    pub pd: ProtectionDomain,
    /// The private data the peer sent with its request or accept.
    pub peer_private_data: Vec<u8>,
    /// The local address and port.
    pub local_addr: SocketAddr,
    /// The peer's address and port.
    pub peer_addr: SocketAddr,
    /// The connection manager id, on an event channel of its own.
    pub id: AsyncCmId,
}

impl Connection {
    /// Connects to `dst` (TCP port space): resolves the address and route,
    /// creates the PD, CQ and QP on the device the route uses, and connects
    /// with `opts.conn_param` (its private data goes to the peer). Each step
    /// waits at most `opts.timeout`.
    ///
    /// Cancel safety: dropped at any await point, the future drops what it
    /// made so far: the id is destroyed (a request already sent is
    /// abandoned, which the peer sees as a reject or a disconnection), its
    /// events and the CQ's are acknowledged first. Nothing is left behind.
    ///
    /// # Errors
    /// [`Error::CmEvent`] when the peer rejects (with its private data) or is
    /// unreachable, or resolution fails; nobody listening on `dst` is
    /// `REJECTED` on InfiniBand/RoCE, and on iWARP (siw) `rdma_connect`'s
    /// own `ECONNREFUSED` ([`Error::Verb`]);
    /// `ETIMEDOUT` when a step's event does not come within the timeout; the
    /// reactor's errors; the errors of the calls on the way.
    pub async fn connect(
        reactor: &dyn Reactor,
        dst: SocketAddr,
        opts: &ConnectOptions,
    ) -> Result<Connection> {
        Self::connect_with(reactor, dst, opts, |_, _| Ok(())).await
    }

    /// As [`Connection::connect`], calling `prepare` with the new QP (in
    /// INIT) and its PD before connecting, to post the first receives. On
    /// iWARP a SEND that finds no receive posted breaks the connection
    /// (there is no RNR retry), so post receives here when the peer may send
    /// first.
    ///
    /// Cancel safety: as [`Connection::connect`].
    ///
    /// # Errors
    /// As [`Connection::connect`], and the error `prepare` returns.
    pub async fn connect_with(
        reactor: &dyn Reactor,
        dst: SocketAddr,
        opts: &ConnectOptions,
        prepare: impl FnOnce(&mut QueuePair, &ProtectionDomain) -> Result<()>,
    ) -> Result<Connection> {
        let mut connecting = Self::resolve(reactor, dst, opts).await?;
        prepare(&mut connecting.qp, &connecting.pd)?;
        connecting.connect(&opts.conn_param).await
    }

    /// The first phase of a two-phase connect: resolves the address and
    /// route and makes the PD, CQ and QP (in INIT) on the route's device,
    /// without sending the request. Register memory on [`Connecting::pd`],
    /// put what the peer needs to know of it (a
    /// [`RemoteMemory`](crate::RemoteMemory)'s bytes) in the request's
    /// private data, and [`Connecting::connect`]: what a protocol that
    /// exchanges keys while connecting needs (rsocket does).
    ///
    /// Cancel safety: as [`Connection::connect`].
    ///
    /// # Errors
    /// As [`Connection::connect`]'s resolution steps.
    pub async fn resolve(
        reactor: &dyn Reactor,
        dst: SocketAddr,
        opts: &ConnectOptions,
    ) -> Result<Connecting> {
        let t = opts.timeout;
        // Declared before the verbs objects: dropped after them on failure.
        let timer = Timer::new(reactor)?;
        let mut id = CmChannel::new(&EventChannel::new()?, reactor)?.create_id(PortSpace::Tcp)?;
        let src = opts.src.map(CmAddr::from);
        let resolve = id.resolve_addr(src, dst, t);
        timer
            .within(t, "rdma_resolve_addr", "ADDR_RESOLVED", resolve)
            .await?;
        let route = id.resolve_route(t);
        timer
            .within(t, "rdma_resolve_route", "ROUTE_RESOLVED", route)
            .await?;
        let (local, peer) = addresses(id.id())?;
        let (pd, cq, qp) = resources(id.id(), opts, reactor)?;
        Ok(Connecting {
            qp,
            cq,
            pd,
            local,
            peer,
            timeout: t,
            timer,
            id,
        })
    }

    /// The queue pair (post with [`QueuePair::post_send`] and friends).
    pub fn qp(&mut self) -> &mut QueuePair {
        &mut self.qp
    }

    /// The completions of both queues, awaited.
    pub fn cq(&mut self) -> &mut AsyncCq {
        &mut self.cq
    }

    /// The queue pair and its CQ at once, for the posting futures
    /// (`let (qp, cq) = conn.qp_and_cq(); cq.post_send(qp, wr).await`).
    pub fn qp_and_cq(&mut self) -> (&mut QueuePair, &mut AsyncCq) {
        (&mut self.qp, &mut self.cq)
    }

    /// The protection domain (register memory here).
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The connection manager id.
    pub fn id(&self) -> &CmId {
        self.id.id()
    }

    /// The id's async handle: its other events ([`AsyncCmId::next_event`]).
    pub fn async_id(&mut self) -> &mut AsyncCmId {
        &mut self.id
    }

    /// The private data the peer sent with its request or accept (on
    /// InfiniBand/RoCE padded with zeros to the message's fixed size).
    pub fn peer_private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// The local address and port.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The peer's address and port.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Disconnects (`rdma_disconnect(3)`) and waits, at most the timeout,
    /// for `DISCONNECTED`.
    ///
    /// Cancel safety: the disconnection is requested in the first poll;
    /// dropped after it, the future leaves `DISCONNECTED`, when it comes, in
    /// the id's mailbox ([`Connection::disconnected`] takes it).
    ///
    /// # Errors
    /// As [`CmId::disconnect`]; `ETIMEDOUT`; [`Error::CmEvent`] for
    /// another event.
    pub async fn disconnect(&mut self) -> Result<()> {
        let step = self.id.disconnect();
        self.timer
            .within(self.timeout, "rdma_disconnect", "DISCONNECTED", step)
            .await
    }

    /// Waits until the peer disconnects (`DISCONNECTED`), then completes the
    /// disconnection from this side. Not bounded: it waits for the peer,
    /// however long (bound it with the runtime's timeout, or await it beside
    /// the traffic in a `select!`).
    ///
    /// Cancel safety: the event is taken from the id's mailbox only in the
    /// poll that returns; dropping the future loses nothing.
    ///
    /// # Errors
    /// [`Error::CmEvent`] for another event; the reactor's errors.
    pub async fn disconnected(&mut self) -> Result<()> {
        self.id.disconnected().await
    }

    /// The pieces, for a layer that owns them (see [`ConnectionParts`]).
    /// The connection's timer goes: bound the id's steps with the
    /// runtime's timeout from here on.
    pub fn into_parts(self) -> ConnectionParts {
        ConnectionParts {
            qp: self.qp,
            cq: self.cq,
            pd: self.pd,
            peer_private_data: self.private_data,
            local_addr: self.local,
            peer_addr: self.peer,
            id: self.id,
        }
    }
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("qp", &self.qp)
            .field("local", &self.local)
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

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
    /// ([`Error::Async`] outside its runtime).
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
    /// [`Error::CmEvent`] for another event of the listener; the errors of
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
        if let Err(e) = prepare(&mut pending.qp, &pending.pd) {
            let _ = pending.id.id().reject(&[]);
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
    /// [`Error::CmEvent`] for another event of the listener; the errors of
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
            qp,
            cq,
            pd,
            private_data,
            local,
            peer,
            timeout: opts.timeout,
            timer,
            id: async_id,
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
/// Field order is teardown order, as in [`Connection`].
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
    qp: QueuePair,
    cq: AsyncCq,
    pd: ProtectionDomain,
    private_data: Vec<u8>,
    local: SocketAddr,
    peer: SocketAddr,
    timeout: Duration,
    timer: Timer,
    id: AsyncCmId,
}

impl PendingConnection {
    /// The new QP, in INIT (post the first receives here).
    pub fn qp(&mut self) -> &mut QueuePair {
        &mut self.qp
    }

    /// The connection's protection domain: memory registered here can be
    /// advertised in the accept's private data.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The completions of both queues, awaited.
    pub fn cq(&mut self) -> &mut AsyncCq {
        &mut self.cq
    }

    /// The connection manager id of the request.
    pub fn id(&self) -> &CmId {
        self.id.id()
    }

    /// The private data the peer sent with its request (on InfiniBand/RoCE
    /// padded with zeros to the REQ's fixed size).
    pub fn peer_private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// The local address and port the request came to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The peer's address and port.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
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
    /// or [`Error::CmEvent`] when `ESTABLISHED` does not come.
    pub async fn accept(mut self, param: &ConnParam) -> Result<Connection> {
        if let Err(e) = self.id.id().accept_qp(&self.qp, param) {
            let _ = self.id.id().reject(&[]);
            return Err(e);
        }
        let step = self.id.expect(&[CmEventType::Established], "rdma_accept");
        drop(
            self.timer
                .within(self.timeout, "rdma_accept", "ESTABLISHED", step)
                .await?,
        );
        Ok(Connection {
            qp: self.qp,
            cq: self.cq,
            pd: self.pd,
            private_data: self.private_data,
            local: self.local,
            peer: self.peer,
            timeout: self.timeout,
            timer: self.timer,
            id: self.id,
        })
    }

    /// Rejects the request with `private_data` ([`CmId::reject`]).
    ///
    /// # Errors
    /// As [`CmId::reject`].
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        self.id.id().reject(private_data)
    }
}

impl fmt::Debug for PendingConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingConnection")
            .field("qp", &self.qp)
            .field("local", &self.local)
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

/// A connection resolved and not requested yet ([`Connection::resolve`]):
/// its PD, CQ and QP (in INIT) exist, so memory can be registered and
/// receives posted before [`Connecting::connect`] sends the request.
/// Dropped, its id is destroyed and nothing was sent.
///
/// Field order is teardown order, as in [`Connection`].
///
/// ```no_run
/// # #[cfg(feature = "tokio")]
/// # async fn f() -> rdma::Result<()> {
/// use rdma::aio::{tokio_rt::Tokio, ConnectOptions, Connection};
/// use rdma::cm::ConnParam;
/// use rdma::AccessFlags;
///
/// let dst = "10.8.0.1:7471".parse().unwrap();
/// let connecting = Connection::resolve(&Tokio, dst, &ConnectOptions::default()).await?;
/// // Memory the server may write, advertised in the request itself.
/// let target = connecting
///     .pd()
///     .alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
/// let param = ConnParam::with_private_data(&target.remote().to_bytes());
/// let conn = connecting.connect(&param).await?;
/// # drop((conn, target)); Ok(()) }
/// ```
pub struct Connecting {
    qp: QueuePair,
    cq: AsyncCq,
    pd: ProtectionDomain,
    local: SocketAddr,
    peer: SocketAddr,
    timeout: Duration,
    timer: Timer,
    id: AsyncCmId,
}

impl Connecting {
    /// The new QP, in INIT (post the first receives here).
    pub fn qp(&mut self) -> &mut QueuePair {
        &mut self.qp
    }

    /// The connection's protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The completions of both queues, awaited.
    pub fn cq(&mut self) -> &mut AsyncCq {
        &mut self.cq
    }

    /// The connection manager id.
    pub fn id(&self) -> &CmId {
        self.id.id()
    }

    /// The local address the route chose.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Sends the request with `param` (its private data goes to the peer)
    /// and waits, at most the timeout, until the connection is up.
    ///
    /// Cancel safety: as [`Connection::connect`].
    ///
    /// # Errors
    /// As [`Connection::connect`]'s last step.
    pub async fn connect(mut self, param: &ConnParam) -> Result<Connection> {
        let step = self.id.connect(&self.qp, param);
        let answer = self
            .timer
            .within(
                self.timeout,
                "rdma_connect",
                "CONNECT_RESPONSE or ESTABLISHED",
                step,
            )
            .await?;
        Ok(Connection {
            qp: self.qp,
            cq: self.cq,
            pd: self.pd,
            private_data: answer.private_data,
            local: self.local,
            peer: self.peer,
            timeout: self.timeout,
            timer: self.timer,
            id: self.id,
        })
    }
}

impl fmt::Debug for Connecting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connecting")
            .field("qp", &self.qp)
            .field("id", &self.id)
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}
