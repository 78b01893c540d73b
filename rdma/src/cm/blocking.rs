//! Connect and accept in one call, returning a connected QP with its CQ.
//!
//! Built on the non-blocking layer: every connection has an
//! [`EventChannel`] of its own (accepted ids are migrated off the
//! listener's), a borrowed context from its id, and a crate [`QueuePair`]
//! moved through INIT/RTR/RTS by [`CmId::connect_qp`],
//! [`CmId::establish_qp`] and [`CmId::accept_qp`]. Every wait is bounded by
//! [`ConnectOptions::timeout`].
//!
//! ```no_run
//! use rdma::cm::blocking::{Connection, ConnectOptions, Listener};
//! # fn main() -> rdma::Result<()> {
//! let opts = ConnectOptions::default();
//! let listener = Listener::bind("10.8.0.1:0".parse().unwrap(), 8)?;
//! let addr = listener.local_addr().expect("bound");
//! let server = std::thread::spawn(move || listener.accept(&opts));
//! let client = Connection::connect(addr, &ConnectOptions::default())?;
//! let server = server.join().unwrap()?;
//! # drop((client, server));
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use super::{CmEvent, CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use crate::error::{Error, Result};
use crate::{CompletionQueue, ProtectionDomain, QpState, QpType, QueuePair};

/// Options of [`Connection::connect`] and [`Listener::accept`].
///
/// ```no_run
/// # fn main() -> rdma::Result<()> {
/// use rdma::cm::blocking::{ConnectOptions, Connection};
/// let options = ConnectOptions::default();
/// let mut conn = Connection::connect("10.8.0.1:7471".parse().unwrap(), &options)?;
/// println!("connected: QP {:#x}", conn.qp().qp_num());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Bound of every wait (address, route, connection, disconnection).
    pub timeout: Duration,
    /// What is sent with the request or the accept (private data, depths).
    pub conn_param: ConnParam,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per request.
    pub max_sge: u32,
    /// Completion queue size (one CQ for both queues).
    pub cqe: u32,
    /// Bytes a send may carry inline (`max_inline_data`; 0: the provider's
    /// default). The QP's [`caps`](QueuePair::caps) say what it got.
    pub max_inline_data: u32,
    /// Source address for connecting (`None`: chosen by the route). A
    /// port given here is kept even when TCP holds it on iWARP (the connect
    /// then fails with `EADDRINUSE`); port 0 lets the connection manager
    /// choose, and choose again when its choice turns out taken.
    pub src: Option<SocketAddr>,
}

impl Default for ConnectOptions {
    /// 5 s timeout, 64 requests per queue, 1 SGE, 256 CQ entries, the
    /// provider's inline size.
    fn default() -> Self {
        ConnectOptions {
            timeout: Duration::from_secs(5),
            conn_param: ConnParam::default(),
            max_send_wr: 64,
            max_recv_wr: 64,
            max_sge: 1,
            cqe: 256,
            max_inline_data: 0,
            src: None,
        }
    }
}

/// A connected RC queue pair with its CQ, PD and connection manager id.
///
/// The CQ has a completion channel of its own: wait for a completion with a
/// bound with [`CompletionQueue::wait`] (`conn.cq().wait(Some(timeout))`)
/// instead of spinning on [`CompletionQueue::poll`].
///
/// Field order is teardown order: the QP is destroyed before its CQ and PD,
/// and the id after them.
///
/// # Examples
/// Connect, send one message, wait for its completion, disconnect.
///
/// ```no_run
/// use rdma::cm::blocking::{ConnectOptions, Connection};
/// use rdma::{AccessFlags, PostError, SendWr};
/// # fn main() -> rdma::Result<()> {
/// let dst = "10.8.0.1:7471".parse().unwrap();
/// let mut conn = Connection::connect(dst, &ConnectOptions::default())?;
/// let msg = conn.pd().reg_mr(b"ping".to_vec(), AccessFlags::empty())?;
/// conn.qp()
///     .post_send(SendWr::send(1, msg))
///     .map_err(PostError::drop_buffers)?;
/// let done = loop {
///     if let Some(c) = conn.cq().poll_one()? {
///         break c.ok()?;
///     }
/// };
/// println!("sent {} ({:?})", done.wr_id, done.opcode);
/// conn.disconnect()?;
/// # Ok(())
/// # }
/// ```
pub struct Connection {
    qp: QueuePair,
    cq: CompletionQueue,
    pd: ProtectionDomain,
    private_data: Vec<u8>,
    timeout: Duration,
    id: CmId,
    channel: EventChannel,
}

fn resources(
    id: &CmId,
    opts: &ConnectOptions,
) -> Result<(ProtectionDomain, CompletionQueue, QueuePair)> {
    let ctx = id.context()?;
    let pd = ctx.alloc_pd()?;
    // With a channel of its own, so that `cq().wait(timeout)` can sleep.
    let channel = ctx.create_comp_channel()?;
    let cq = ctx.create_cq(opts.cqe, Some(&channel), 0)?;
    let qp = pd
        .qp_builder(QpType::Rc, &cq, &cq)
        .max_send_wr(opts.max_send_wr)
        .max_recv_wr(opts.max_recv_wr)
        .max_send_sge(opts.max_sge)
        .max_recv_sge(opts.max_sge)
        .max_inline_data(opts.max_inline_data)
        .build()?;
    Ok((pd, cq, qp))
}

/// A new id on `channel`, its address and route to `dst` resolved.
fn routed_id(channel: &EventChannel, dst: SocketAddr, opts: &ConnectOptions) -> Result<CmId> {
    let id = channel.create_id(PortSpace::Tcp)?;
    let t = opts.timeout;
    id.resolve_addr(opts.src.map(super::CmAddr::from), dst, t)?;
    drop(channel.wait_for(&id, &[CmEventType::AddrResolved], "rdma_resolve_addr", t)?);
    id.resolve_route(t)?;
    drop(channel.wait_for(&id, &[CmEventType::RouteResolved], "rdma_resolve_route", t)?);
    Ok(id)
}

/// Connection requests sent in all when the source port the connection
/// manager chose turns out taken ([`another_source_port`]).
const PORT_TRIES: usize = 3;

/// Whether a connect whose request failed with `e` (the `tries`-th) sends
/// it again from an id of its own, so from another source port. On iWARP
/// the connection manager picks the port in its own port space, not TCP's,
/// and the TCP connection that `rdma_connect` makes can find it taken
/// (`EADDRINUSE`, seen on siw while many connections come and go); TCP's
/// `connect` never reports its ephemeral port taken, and neither does this
/// one. A port the caller chose (`src` with a port) is never changed: that
/// error is the caller's.
pub(crate) fn another_source_port(e: &Error, src: Option<SocketAddr>, tries: usize) -> bool {
    let again = tries < PORT_TRIES
        && e.verb() == Some("rdma_connect")
        && e.errno() == Some(libc::EADDRINUSE)
        && src.is_none_or(|a| a.port() == 0);
    if again {
        log::debug!("{e}: connecting again from another source port");
    }
    again
}

impl Connection {
    /// Connects to `dst` (TCP port space): resolves the address and route,
    /// creates the PD, CQ and QP on the device the route uses, and connects.
    ///
    /// As TCP's `connect`, it never fails because the source port it chose
    /// is taken: on iWARP, where the connection manager's ports are not
    /// TCP's, `rdma_connect` can find it so (`EADDRINUSE`), and the request
    /// goes again from a new id (up to 3 tries). A port given in
    /// [`ConnectOptions::src`] is kept, and that error returned.
    ///
    /// # Errors
    /// [`Error::CmEvent`] when the peer rejects (with its private data) or is
    /// unreachable, or resolution fails; `ETIMEDOUT` when an event does not
    /// come within the timeout; the errors of the calls on the way.
    pub fn connect(dst: SocketAddr, opts: &ConnectOptions) -> Result<Connection> {
        Self::connect_with(dst, opts, |_, _| Ok(()))
    }

    /// As [`Connection::connect`], calling `prepare` with the new QP (in
    /// INIT) and its PD before connecting, to post the first receives.
    /// On iWARP a SEND that finds no receive posted breaks the connection
    /// (there is no RNR retry), so post receives here when the peer may send
    /// first.
    ///
    /// # Errors
    /// As [`Connection::connect`], and the error `prepare` returns.
    pub fn connect_with(
        dst: SocketAddr,
        opts: &ConnectOptions,
        prepare: impl FnOnce(&mut QueuePair, &ProtectionDomain) -> Result<()>,
    ) -> Result<Connection> {
        let channel = EventChannel::new()?;
        let mut id = routed_id(&channel, dst, opts)?;
        let t = opts.timeout;
        let (pd, cq, mut qp) = resources(&id, opts)?;
        // INIT first: providers refuse receives on a QP in RESET.
        id.modify_qp(&qp, QpState::Init)?;
        prepare(&mut qp, &pd)?;
        let mut tries = 1;
        while let Err(e) = id.connect_qp(&qp, &opts.conn_param) {
            if !another_source_port(&e, opts.src, tries) {
                return Err(e);
            }
            // The failed connect left the QP as it was (in INIT, with what
            // `prepare` posted): it goes with an id of its own port.
            let again = routed_id(&channel, dst, opts)?;
            if !again.on_device(pd.context()) {
                return Err(e);
            }
            id = again;
            tries += 1;
        }
        let event = channel.wait_for(
            &id,
            &[CmEventType::ConnectResponse, CmEventType::Established],
            "rdma_connect",
            t,
        )?;
        let private_data = event.private_data().to_vec();
        let response = event.event_type() == CmEventType::ConnectResponse;
        drop(event);
        if response {
            id.establish_qp(&qp)?;
        }
        Ok(Connection {
            qp,
            cq,
            pd,
            private_data,
            timeout: t,
            id,
            channel,
        })
    }

    /// The queue pair (post with [`QueuePair::post_send`] and friends).
    pub fn qp(&mut self) -> &mut QueuePair {
        &mut self.qp
    }

    /// The completion queue of both queues.
    pub fn cq(&self) -> &CompletionQueue {
        &self.cq
    }

    /// The protection domain (register memory here).
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The connection manager id.
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// The connection's own event channel.
    pub fn channel(&self) -> &EventChannel {
        &self.channel
    }

    /// The private data the peer sent with its request or accept.
    pub fn peer_private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// The next event of the connection within `timeout` (e.g.
    /// `DISCONNECTED` when the peer disconnects).
    ///
    /// # Errors
    /// As [`EventChannel::get_event_timeout`].
    pub fn next_event(&self, timeout: Duration) -> Result<Option<CmEvent>> {
        self.channel.get_event_timeout(timeout)
    }

    /// Waits until the peer disconnects (`DISCONNECTED`), then completes
    /// the disconnection from this side (on InfiniBand/RoCE that answers the
    /// peer's request, which it waits for).
    ///
    /// # Errors
    /// `ETIMEDOUT` when it does not within the timeout; [`Error::CmEvent`]
    /// for another event.
    pub fn wait_disconnected(&self) -> Result<()> {
        drop(self.channel.wait_for(
            &self.id,
            &[CmEventType::Disconnected],
            "wait for DISCONNECTED",
            self.timeout,
        )?);
        // Already disconnected locally (iWARP) is fine.
        let _ = self.id.disconnect();
        Ok(())
    }

    /// Disconnects (`rdma_disconnect(3)`) and waits for `DISCONNECTED`.
    ///
    /// # Errors
    /// As [`CmId::disconnect`] and [`Connection::wait_disconnected`].
    pub fn disconnect(&self) -> Result<()> {
        self.id.disconnect()?;
        drop(self.channel.wait_for(
            &self.id,
            &[CmEventType::Disconnected],
            "rdma_disconnect",
            self.timeout,
        )?);
        Ok(())
    }
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("qp", &self.qp)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// A listening id with its own event channel.
///
/// # Examples
/// Serve connections one after the other; each gets its own event channel,
/// so it can be handed to another thread and outlive the listener.
///
/// ```no_run
/// use rdma::cm::blocking::{ConnectOptions, Listener};
/// use rdma::{AccessFlags, PostError};
/// # fn main() -> rdma::Result<()> {
/// let listener = Listener::bind("0.0.0.0:7471".parse().unwrap(), 16)?;
/// let opts = ConnectOptions::default();
/// loop {
///     // Post a receive before accepting: the client may send at once.
///     let conn = listener.accept_with(&opts, |qp, pd| {
///         let buf = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
///         qp.post_recv(1, buf).map_err(PostError::drop_buffers)
///     })?;
///     std::thread::spawn(move || -> rdma::Result<()> {
///         let mut c = loop {
///             if let Some(c) = conn.cq().poll_one()? {
///                 break c.ok()?;
///             }
///         };
///         let buf = c.take_buffers().into_one().expect("the receive's region");
///         println!("{:?}", &buf.as_slice()?[..c.byte_len as usize]);
///         conn.wait_disconnected()
///     });
/// }
/// # }
/// ```
pub struct Listener {
    id: CmId,
    channel: EventChannel,
}

impl Listener {
    /// Binds to `addr` (port 0: any free port) and listens (TCP port space).
    ///
    /// # Errors
    /// As [`CmId::bind_addr`] and [`CmId::listen`].
    pub fn bind(addr: SocketAddr, backlog: i32) -> Result<Listener> {
        let channel = EventChannel::new()?;
        let id = channel.create_id(PortSpace::Tcp)?;
        id.bind_addr(addr)?;
        id.listen(backlog)?;
        Ok(Listener { id, channel })
    }

    /// The bound address, with the port that was picked.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        let mut a = self.id.local_addr()?;
        a.set_port(self.id.src_port());
        Some(a)
    }

    /// The listening id.
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// Waits (at most `timeout`) for the next connection request.
    ///
    /// # Errors
    /// `ETIMEDOUT` when none comes; [`Error::CmEvent`] for another event.
    pub fn get_request(&self, timeout: Duration) -> Result<CmEvent> {
        self.channel.wait_for(
            &self.id,
            &[CmEventType::ConnectRequest],
            "rdma_listen",
            timeout,
        )
    }

    /// Waits for a connection request, accepts it with a new QP, and waits
    /// for `ESTABLISHED`. The connection gets an event channel of its own, so
    /// it outlives the listener.
    ///
    /// # Errors
    /// `ETIMEDOUT` when no request or no `ESTABLISHED` comes within the
    /// timeout; the errors of the calls on the way.
    pub fn accept(&self, opts: &ConnectOptions) -> Result<Connection> {
        self.accept_with(opts, |_, _| Ok(()))
    }

    /// As [`Listener::accept`], calling `prepare` with the new QP and its PD
    /// before accepting, to post the first receives (see
    /// [`Connection::connect_with`]; on iWARP this is required when the peer
    /// sends first). To send the peer something made on the new PD (the rkey
    /// of a region), use [`Listener::incoming`] instead.
    ///
    /// # Errors
    /// As [`Listener::accept`], and the error `prepare` returns (the request
    /// is then rejected).
    pub fn accept_with(
        &self,
        opts: &ConnectOptions,
        prepare: impl FnOnce(&mut QueuePair, &ProtectionDomain) -> Result<()>,
    ) -> Result<Connection> {
        let mut pending = self.incoming(opts)?;
        if let Err(e) = prepare(&mut pending.qp, &pending.pd) {
            let _ = pending.id.reject(&[]);
            return Err(e);
        }
        pending.accept(&opts.conn_param)
    }

    /// The first phase of a two-phase accept: waits (at most the timeout)
    /// for a connection request, gives it an event channel of its own, and
    /// makes its PD, CQ and QP (in INIT, so receives can be posted) without
    /// answering it. Register memory on [`PendingConnection::pd`], put its
    /// [`crate::RemoteMemory::to_bytes`] in the private data, and
    /// [`PendingConnection::accept`].
    ///
    /// ```no_run
    /// use rdma::cm::{blocking::{ConnectOptions, Listener}, ConnParam};
    /// # fn main() -> rdma::Result<()> {
    /// let listener = Listener::bind("10.8.0.1:7471".parse().unwrap(), 8)?;
    /// let opts = ConnectOptions::default();
    /// let pending = listener.incoming(&opts)?;
    /// let target = pending
    ///     .pd()
    ///     .alloc_mr(4096, rdma::AccessFlags::LOCAL_WRITE | rdma::AccessFlags::REMOTE_WRITE)?;
    /// let conn = pending.accept(&ConnParam::with_private_data(&target.remote().to_bytes()))?;
    /// # drop(conn); Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `ETIMEDOUT` when no request comes within the timeout; the errors of
    /// the calls on the way (the request is then rejected).
    pub fn incoming(&self, opts: &ConnectOptions) -> Result<PendingConnection> {
        let t = opts.timeout;
        let deadline = std::time::Instant::now() + t;
        let request = loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let Some(event) = self.channel.get_event_timeout(left)? else {
                return Err(Error::verb_errno(
                    "rdma_get_cm_event",
                    format!("no connection request within {t:?}"),
                    libc::ETIMEDOUT,
                ));
            };
            if event.event_type() == CmEventType::ConnectRequest {
                break event;
            }
        };
        let id = request.id().clone();
        let private_data = request.private_data().to_vec();
        drop(request);
        let made = (|| {
            let channel = EventChannel::new()?;
            id.migrate_id(Some(&channel))?;
            let (pd, cq, qp) = resources(&id, opts)?;
            // INIT first: providers refuse receives on a QP in RESET.
            id.modify_qp(&qp, QpState::Init)?;
            Ok((channel, pd, cq, qp))
        })();
        let (channel, pd, cq, qp) = match made {
            Ok(m) => m,
            Err(e) => {
                let _ = id.reject(&[]);
                return Err(e);
            }
        };
        Ok(PendingConnection {
            qp,
            cq,
            pd,
            private_data,
            timeout: t,
            id,
            channel,
        })
    }
}

/// A connection request with its PD, CQ and QP made, not answered yet
/// ([`Listener::incoming`]). Dropped unanswered, its id is destroyed, which
/// rejects it.
///
/// Field order is teardown order, as in [`Connection`].
pub struct PendingConnection {
    qp: QueuePair,
    cq: CompletionQueue,
    pd: ProtectionDomain,
    private_data: Vec<u8>,
    timeout: Duration,
    id: CmId,
    channel: EventChannel,
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

    /// The completion queue of both queues.
    pub fn cq(&self) -> &CompletionQueue {
        &self.cq
    }

    /// The connection manager id of the request.
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// The private data the peer sent with its request (on InfiniBand/RoCE
    /// padded with zeros to the REQ's fixed size).
    pub fn peer_private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// Accepts with `param` (its private data goes to the peer) and waits
    /// for `ESTABLISHED`.
    ///
    /// # Errors
    /// As [`CmId::accept_qp`]; `ETIMEDOUT` or [`Error::CmEvent`] when
    /// `ESTABLISHED` does not come.
    pub fn accept(self, param: &ConnParam) -> Result<Connection> {
        if let Err(e) = self.id.accept_qp(&self.qp, param) {
            let _ = self.id.reject(&[]);
            return Err(e);
        }
        drop(self.channel.wait_for(
            &self.id,
            &[CmEventType::Established],
            "rdma_accept",
            self.timeout,
        )?);
        Ok(Connection {
            qp: self.qp,
            cq: self.cq,
            pd: self.pd,
            private_data: self.private_data,
            timeout: self.timeout,
            id: self.id,
            channel: self.channel,
        })
    }

    /// Rejects the request with `private_data` ([`CmId::reject`]).
    ///
    /// # Errors
    /// As [`CmId::reject`].
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        self.id.reject(private_data)
    }
}

impl fmt::Debug for PendingConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingConnection")
            .field("qp", &self.qp)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("id", &self.id)
            .field("addr", &self.local_addr())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(verb: &'static str, errno: i32) -> Error {
        Error::verb_errno(verb, "test", errno)
    }

    #[test]
    fn only_a_port_the_connection_manager_chose_is_replaced_and_only_twice() {
        let taken = failed("rdma_connect", libc::EADDRINUSE);
        let any_port: Option<SocketAddr> = Some("10.8.0.2:0".parse().unwrap());
        let given_port: Option<SocketAddr> = Some("10.8.0.2:7000".parse().unwrap());
        assert!(another_source_port(&taken, None, 1));
        assert!(another_source_port(&taken, any_port, 2));
        assert!(
            !another_source_port(&taken, None, PORT_TRIES),
            "3 tries in all"
        );
        assert!(
            !another_source_port(&taken, given_port, 1),
            "the caller's port"
        );
        let refused = failed("rdma_connect", libc::ECONNREFUSED);
        assert!(!another_source_port(&refused, None, 1));
        let bind = failed("rdma_resolve_addr", libc::EADDRINUSE);
        assert!(!another_source_port(&bind, None, 1), "only the request's");
    }
}
