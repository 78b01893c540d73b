//! Connections in one call: [`Connection`] and the client's two-phase
//! [`Connecting`], the async mirror of [`crate::cm::blocking`]. The
//! server's side ([`Listener`](super::Listener) and
//! [`PendingConnection`](super::PendingConnection)) is in `listener`.
//!
//! Every connection owns its objects: an event channel of its own driven by
//! a [`CmChannel`] (an accepted id is migrated off the listener's, so a
//! connection outlives its listener), a completion channel of its own
//! driven by a [`CqChannel`] for its one CQ, and a timer on the same
//! reactor that bounds the waits of the steps it starts.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use super::timer::Timer;
use super::{AsyncCmId, AsyncCq, CmChannel, CqChannel, Reactor};
use crate::cm::blocking::{another_source_port, ConnectOptions};
use crate::cm::{CmAddr, CmId, ConnParam, EventChannel, PortSpace};
use crate::error::{Error, Result};
use crate::{ProtectionDomain, QpState, QpType, QueuePair};

/// The PD, the CQ (with a completion channel of its own, driven from
/// `reactor`) and the RC QP, in INIT (providers refuse receives in RESET),
/// on the id's device.
pub(super) fn resources(
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

/// A new id on `channel`, its address and route to `dst` resolved (from
/// `src`), each step bounded by `t`.
async fn routed_id(
    channel: &CmChannel,
    timer: &Timer,
    src: Option<SocketAddr>,
    dst: SocketAddr,
    t: Duration,
) -> Result<AsyncCmId> {
    let mut id = channel.create_id(PortSpace::Tcp)?;
    let resolve = id.resolve_addr(src.map(CmAddr::from), dst, t);
    timer
        .within(t, "rdma_resolve_addr", "ADDR_RESOLVED", resolve)
        .await?;
    let route = id.resolve_route(t);
    timer
        .within(t, "rdma_resolve_route", "ROUTE_RESOLVED", route)
        .await?;
    Ok(id)
}

/// The id's local and peer IP addresses (an `AF_IB` connection has none).
pub(super) fn addresses(id: &CmId) -> Result<(SocketAddr, SocketAddr)> {
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
/// [`Listener::accept`](super::Listener::accept): the async mirror of
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
    // Built here and by `listener.rs`'s accept.
    pub(super) qp: QueuePair,
    pub(super) cq: AsyncCq,
    pub(super) pd: ProtectionDomain,
    pub(super) private_data: Vec<u8>,
    pub(super) local: SocketAddr,
    pub(super) peer: SocketAddr,
    pub(super) timeout: Duration,
    pub(super) timer: Timer,
    pub(super) id: AsyncCmId,
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
        prepare(&mut connecting.conn.qp, &connecting.conn.pd)?;
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
        let channel = CmChannel::new(&EventChannel::new()?, reactor)?;
        let id = routed_id(&channel, &timer, opts.src, dst, t).await?;
        let (local, peer) = addresses(id.id())?;
        let (pd, cq, qp) = resources(id.id(), opts, reactor)?;
        Ok(Connecting {
            conn: Connection {
                qp,
                cq,
                pd,
                private_data: Vec::new(),
                local,
                peer,
                timeout: t,
                timer,
                id,
            },
            src: opts.src,
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

/// A connection resolved and not requested yet ([`Connection::resolve`]):
/// its PD, CQ and QP (in INIT) exist, so memory can be registered and
/// receives posted before [`Connecting::connect`] sends the request.
/// Dropped, its id is destroyed and nothing was sent.
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
    /// What `connect` hands out once the connection is up (its teardown
    /// order; the peer's private data comes with the answer).
    conn: Connection,
    /// The caller's source address (`ConnectOptions::src`).
    src: Option<SocketAddr>,
}

impl Connecting {
    /// The new QP, in INIT (post the first receives here).
    pub fn qp(&mut self) -> &mut QueuePair {
        &mut self.conn.qp
    }

    /// The connection's protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.conn.pd
    }

    /// The completions of both queues, awaited.
    pub fn cq(&mut self) -> &mut AsyncCq {
        &mut self.conn.cq
    }

    /// The connection manager id.
    pub fn id(&self) -> &CmId {
        self.conn.id.id()
    }

    /// The local address the route chose.
    pub fn local_addr(&self) -> SocketAddr {
        self.conn.local
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.conn.peer
    }

    /// Sends the request with `param` (its private data goes to the peer)
    /// and waits, at most the timeout, until the connection is up. A source
    /// port the connection manager chose that turns out taken is replaced,
    /// as by [`cm::blocking::Connection::connect`](crate::cm::blocking::Connection::connect)
    /// (the connection's [`local_addr`](Connection::local_addr) says which).
    ///
    /// Cancel safety: as [`Connection::connect`].
    ///
    /// # Errors
    /// As [`Connection::connect`]'s last step.
    pub async fn connect(mut self, param: &ConnParam) -> Result<Connection> {
        let mut tries = 1;
        let c = &mut self.conn;
        let answer = loop {
            let step = c.id.connect(&c.qp, param);
            let waiting_for = "CONNECT_RESPONSE or ESTABLISHED";
            match c
                .timer
                .within(c.timeout, "rdma_connect", waiting_for, step)
                .await
            {
                Err(e) if another_source_port(&e, self.src, tries) => {
                    // As the blocking connect: the QP, as the failed request
                    // left it, goes with an id of its own port.
                    let channel = c.id.channel();
                    let again = routed_id(&channel, &c.timer, self.src, c.peer, c.timeout).await?;
                    if !again.id().on_device(c.pd.context()) {
                        return Err(e);
                    }
                    c.local = addresses(again.id())?.0;
                    c.id = again;
                    tries += 1;
                }
                answer => break answer?,
            }
        };
        c.private_data = answer.private_data;
        Ok(self.conn)
    }
}

impl fmt::Debug for Connecting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connecting")
            .field("qp", &self.conn.qp)
            .field("id", &self.conn.id)
            .field("peer", &self.conn.peer)
            .finish_non_exhaustive()
    }
}
