//! Making a connection: resolving, the queue pair and buffers on the
//! route's device, and the exchange of rsocket's connection data in the
//! private data of the connect request and the accept. A request is
//! answered in steps that never wait ([`answer`], then
//! [`Handshake::progress`] until `ESTABLISHED`), so that the blocking
//! listener can keep several in progress at once.
//!
//! Each connection has an event channel and a completion channel of its
//! own, so that a stream can wait on both (data, and the peer's
//! disconnection) and outlive its listener.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rdma::cm::{CmEvent, CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use rdma::{
    CompletionChannel, CompletionQueue, ProtectionDomain, QpState, QpType, QueuePair, TransportType,
};

use crate::engine::{Engine, Polled};
use crate::local::{Local, Sizes};
use crate::wire::{self, ConnData};

/// How a stream connects and how large its queues and buffers are.
#[derive(Debug, Clone)]
pub struct Options {
    /// Queue and buffer sizes.
    pub sizes: Sizes,
    /// Bound of each connection step (address, route, connection).
    pub timeout: Duration,
    /// How long a blocked read or write polls the completion queue before
    /// it sleeps (rsocket's `polling_time`, 10 µs by default): replies that
    /// come that soon cost no system call. The async stream spins as long
    /// before its task sleeps on the reactor, holding the executor's thread.
    pub busy_poll: Duration,
    /// How long a dropped stream may take, in the background, to deliver
    /// what was written, send its DISCONNECT and take its peer's messages
    /// until the peer closes too (5 s by default). Zero closes in the
    /// dropping thread as rdma-core's `rclose` does: DISCONNECT, a bounded
    /// wait for the sends, the disconnection. A reader sends credits for
    /// what it reads: over iWARP, credits that reach a queue pair already
    /// gone reset the connection and can cost the reader the end of the
    /// stream. TCP's closed sockets linger in the kernel so.
    pub linger: Duration,
}

impl Default for Options {
    /// rsocket's sizes, 5 s per step.
    fn default() -> Self {
        Options {
            sizes: Sizes::default(),
            timeout: Duration::from_secs(5),
            busy_poll: Duration::from_micros(10),
            linger: Duration::from_secs(5),
        }
    }
}

/// One connection's verbs objects, in teardown order: the queue pair (in
/// the engine) before its CQ, the CQ before its channel, the id last.
pub(crate) struct Parts {
    pub(crate) engine: Engine,
    pub(crate) cq: CompletionQueue,
    pub(crate) comp: CompletionChannel,
    pub(crate) _pd: ProtectionDomain,
    pub(crate) id: CmId,
    pub(crate) events: EventChannel,
    /// What the blocking stream polls completions into.
    pub(crate) polled: Polled,
}

/// An error of a connection step, with what it was doing.
pub(crate) fn step_error(step: &str, e: rdma::Error) -> io::Error {
    let text = format!("{step}: {e}");
    io::Error::new(io::Error::from(e).kind(), text)
}

/// Whether the device of `ctx` is iWARP (messages travel as SENDs).
pub(crate) fn is_iwarp(ctx: &rdma::Context) -> io::Result<bool> {
    let devices = rdma::devices().map_err(|e| step_error("listing devices", e))?;
    Ok(devices
        .iter()
        .find(|d| d.name() == ctx.name())
        .is_some_and(|d| d.transport_type() == TransportType::Iwarp))
}

struct Made {
    pd: ProtectionDomain,
    comp: CompletionChannel,
    cq: CompletionQueue,
    qp: QueuePair,
    local: Local,
    iwarp: bool,
}

/// The PD, CQ and QP on `id`'s device, the QP in INIT with every receive
/// posted and the buffers registered.
fn make(id: &CmId, sizes: Sizes) -> io::Result<Made> {
    sizes.check()?;
    let ctx = id
        .context()
        .map_err(|e| step_error("the route's device", e))?;
    let iwarp = is_iwarp(&ctx)?;
    let err = |what: &'static str| move |e| step_error(what, e);
    let pd = ctx.alloc_pd().map_err(err("ibv_alloc_pd"))?;
    let comp = ctx
        .create_comp_channel()
        .map_err(err("ibv_create_comp_channel"))?;
    let cqe = sizes.send_queue + sizes.recv_queue;
    let cq = ctx
        .create_cq(cqe, Some(&comp), 0)
        .map_err(err("ibv_create_cq"))?;
    let mut qp = pd
        .qp_builder(QpType::Rc, &cq, &cq)
        .max_send_wr(sizes.send_queue)
        .max_recv_wr(sizes.recv_queue)
        .max_send_sge(1)
        .max_recv_sge(1)
        .max_inline_data(sizes.inline.max(wire::SGE_LEN as u32))
        .build()
        .map_err(err("ibv_create_qp"))?;
    if (qp.caps().max_inline_data as usize) < wire::SGE_LEN {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "{} sends only {} bytes inline; rsocket's control messages need {}",
                ctx.name(),
                qp.caps().max_inline_data,
                wire::SGE_LEN
            ),
        ));
    }
    id.modify_qp(&qp, QpState::Init)
        .map_err(err("moving the QP to INIT"))?;
    let local = Local::new(&pd, &mut qp, sizes)?;
    Ok(Made {
        pd,
        comp,
        cq,
        qp,
        local,
        iwarp,
    })
}

/// What rsocket puts in the connect request or accept besides its data.
pub(crate) fn param(private_data: Vec<u8>, iwarp: bool) -> ConnParam {
    let mut p = ConnParam {
        private_data,
        flow_control: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..ConnParam::default()
    };
    if iwarp {
        // As rsocket: iWARP issues an RDMA READ while connecting.
        p.initiator_depth = 1;
    }
    p
}

pub(crate) fn protocol(e: wire::WireError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Connections tried in all when the source port turns out taken (see
/// [`another_port`]).
const PORT_TRIES: usize = 3;

/// Whether a connection attempt that failed with `e` (the `tries`-th) is
/// tried again with a new id. The connection manager picks the source port
/// in its own port space, which on iWARP is not TCP's: the TCP connection
/// that `rdma_connect` makes can find the port taken (`EADDRINUSE`, seen on
/// siw while many connections came and went). A new id has a port of its
/// own; TCP's `connect` never reports its ephemeral port taken, and neither
/// does this stream's. (The async stream connects through
/// `rdma::aio::Connecting::connect`, which does the same with the same QP.)
fn another_port(e: &io::Error, tries: usize) -> bool {
    let again = e.kind() == io::ErrorKind::AddrInUse && tries < PORT_TRIES;
    if again {
        log::debug!("{e}: connecting again from another port");
    }
    again
}

/// Connects to `dst` and exchanges the connection data.
pub(crate) fn connect(dst: SocketAddr, opts: &Options) -> io::Result<Parts> {
    let mut tries = 1;
    loop {
        match connect_once(dst, opts) {
            Err(e) if another_port(&e, tries) => tries += 1,
            r => return r,
        }
    }
}

/// One try of [`connect`], with an id (and source port) of its own.
fn connect_once(dst: SocketAddr, opts: &Options) -> io::Result<Parts> {
    let err = |what: &'static str| move |e| step_error(what, e);
    let events = EventChannel::new().map_err(err("rdma_create_event_channel"))?;
    let id = events
        .create_id(PortSpace::Tcp)
        .map_err(err("rdma_create_id"))?;
    let t = opts.timeout;
    id.resolve_addr(None, dst, t)
        .map_err(err("rdma_resolve_addr"))?;
    drop(
        events
            .wait_for(&id, &[CmEventType::AddrResolved], "rdma_resolve_addr", t)
            .map_err(err("resolving the address"))?,
    );
    id.resolve_route(t).map_err(err("rdma_resolve_route"))?;
    drop(
        events
            .wait_for(&id, &[CmEventType::RouteResolved], "rdma_resolve_route", t)
            .map_err(err("resolving the route"))?,
    );
    let m = make(&id, opts.sizes)?;
    let ours = m.local.conn_data().encode().to_vec();
    id.connect_qp(&m.qp, &param(ours, m.iwarp))
        .map_err(err("rdma_connect"))?;
    let event = events
        .wait_for(
            &id,
            &[CmEventType::ConnectResponse, CmEventType::Established],
            "rdma_connect",
            t,
        )
        .map_err(err("connecting"))?;
    let peer = ConnData::decode(event.private_data()).map_err(protocol);
    let response = event.event_type() == CmEventType::ConnectResponse;
    drop(event);
    let peer = peer?;
    if response {
        id.establish_qp(&m.qp).map_err(err("rdma_establish"))?;
    }
    Ok(Parts {
        engine: Engine::new(m.qp, m.local, &peer, m.iwarp, false),
        cq: m.cq,
        comp: m.comp,
        _pd: m.pd,
        id,
        events,
        polled: Polled::default(),
    })
}

/// A listening id with its own event channel.
pub(crate) struct Listening {
    /// The bound device's context, held while the listener lives: on siw it
    /// holds rdma-verbs' key plug (`CmId::context`), which would otherwise
    /// be made and destroyed again (a 1 MiB CQ) whenever the server's
    /// connections all came and went.
    device: Option<rdma::Context>,
    pub(crate) id: CmId,
    pub(crate) events: EventChannel,
}

pub(crate) fn listen(addr: SocketAddr, backlog: i32) -> io::Result<Listening> {
    let err = |what: &'static str| move |e| step_error(what, e);
    let events = EventChannel::new().map_err(err("rdma_create_event_channel"))?;
    let id = events
        .create_id(PortSpace::Tcp)
        .map_err(err("rdma_create_id"))?;
    id.bind_addr(addr).map_err(err("rdma_bind_addr"))?;
    id.listen(backlog).map_err(err("rdma_listen"))?;
    // A wildcard listener has no device yet.
    let device = id.context().ok();
    Ok(Listening { device, id, events })
}

impl Listening {
    /// Whether it was bound to a wildcard address, so holds no device.
    pub(crate) fn has_no_device(&self) -> bool {
        self.device.is_none()
    }
}

/// Requests the blocking listener answers at once unless told otherwise
/// (`RdmaListener::set_max_accepting`); the async listener's default is
/// the same number.
pub(crate) const DEFAULT_MAX_ACCEPTING: usize = 16;

/// One connection request answered: the connection's objects made and
/// registered, the accept sent, `ESTABLISHED` awaited on the connection's
/// own event channel (the id was migrated off the listener's). Dropping it
/// abandons the connection (RoCE: the CM rejects it; iWARP: the TCP
/// connection is closed). Fields in teardown order, as [`Parts`].
pub(crate) struct Handshake {
    qp: QueuePair,
    local: Local,
    cq: CompletionQueue,
    comp: CompletionChannel,
    pd: ProtectionDomain,
    iwarp: bool,
    peer: ConnData,
    id: CmId,
    events: EventChannel,
    deadline: Instant,
}

/// Where a [`Handshake`] is.
pub(crate) enum Progress {
    /// Nothing yet: the handshake, to look at again.
    Waiting(Handshake),
    /// `ESTABLISHED`: the connection, ready for a stream
    /// ([`Handshake::into_parts`]).
    Established(Handshake),
    /// Another event of the id (the peer rejected, went away, or the
    /// device did), or its channel failed: the connection is abandoned.
    Failed(io::Error),
}

/// Who is at the other end of `id`, for messages.
pub(crate) fn peer_of(id: &CmId) -> String {
    match id.peer_addr() {
        Some(mut a) => {
            a.set_port(id.dst_port());
            a.to_string()
        }
        None => "an unknown peer".into(),
    }
}

/// Answers the connection request `event` (a `CONNECT_REQUEST` of a
/// listener): `None` when its private data is not rsocket's (it is
/// rejected); otherwise the handshake, its accept sent, which must be
/// established by `Instant::now() + opts.timeout`.
///
/// # Errors
/// Making the connection's objects or sending the accept (the request is
/// then rejected): the failure is this server's, not the peer's.
pub(crate) fn answer(event: CmEvent, opts: &Options) -> io::Result<Option<Handshake>> {
    let id = event.id().clone();
    let peer = ConnData::decode(event.private_data());
    // Acknowledged before the migration, which waits for every event of
    // the id to be.
    drop(event);
    let peer = match peer {
        Ok(p) => p,
        Err(e) => {
            log::warn!("rejected a connection request from {}: {e}", peer_of(&id));
            let _ = id.reject(&[]);
            return Ok(None);
        }
    };
    match start(&id, opts) {
        Ok((m, events)) => Ok(Some(Handshake {
            qp: m.qp,
            local: m.local,
            cq: m.cq,
            comp: m.comp,
            pd: m.pd,
            iwarp: m.iwarp,
            peer,
            id,
            events,
            deadline: Instant::now() + opts.timeout,
        })),
        Err(e) => {
            let _ = id.reject(&[]);
            Err(io::Error::new(
                e.kind(),
                format!("answering a connection request from {}: {e}", peer_of(&id)),
            ))
        }
    }
}

/// The connection's own event channel, its objects, and the accept sent.
fn start(id: &CmId, opts: &Options) -> io::Result<(Made, EventChannel)> {
    let err = |what: &'static str| move |e| step_error(what, e);
    let events = EventChannel::new().map_err(err("rdma_create_event_channel"))?;
    id.migrate_id(Some(&events))
        .map_err(err("rdma_migrate_id"))?;
    let m = make(id, opts.sizes)?;
    let ours = m.local.conn_data().encode().to_vec();
    id.accept_qp(&m.qp, &param(ours, m.iwarp))
        .map_err(err("rdma_accept"))?;
    Ok((m, events))
}

impl Handshake {
    /// The channel its events come on (to sleep on).
    pub(crate) fn events(&self) -> &EventChannel {
        &self.events
    }

    /// By when it must be established.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The peer's address, for messages.
    pub(crate) fn peer(&self) -> String {
        peer_of(&self.id)
    }

    /// Reads its events (without waiting): whether it is established or
    /// failed. Events after `ESTABLISHED` stay on the channel, which the
    /// connection keeps: its stream reads them.
    pub(crate) fn progress(self) -> Progress {
        loop {
            let event = match self.events.try_get_event() {
                Ok(Some(e)) => e,
                Ok(None) => return Progress::Waiting(self),
                Err(e) => {
                    return Progress::Failed(step_error("reading the connection's events", e))
                }
            };
            if !event.id().same_id(&self.id) {
                continue;
            }
            if event.event_type() == CmEventType::Established && event.status() == 0 {
                drop(event);
                return Progress::Established(self);
            }
            return Progress::Failed(step_error("accepting", event.into_error("rdma_accept")));
        }
    }

    /// The established connection's parts.
    pub(crate) fn into_parts(self) -> Parts {
        Parts {
            engine: Engine::new(self.qp, self.local, &self.peer, self.iwarp, true),
            cq: self.cq,
            comp: self.comp,
            _pd: self.pd,
            id: self.id,
            events: self.events,
            polled: Polled::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_taken_port_is_tried_again_and_only_so_often() {
        let taken = io::Error::new(io::ErrorKind::AddrInUse, "rdma_connect: taken");
        assert!(another_port(&taken, 1));
        assert!(another_port(&taken, PORT_TRIES - 1));
        assert!(!another_port(&taken, PORT_TRIES));
        let refused = io::Error::new(io::ErrorKind::ConnectionRefused, "rejected");
        assert!(!another_port(&refused, 1));
        // What `rdma_connect` failing with EADDRINUSE becomes in `connect_once`.
        let verb = rdma::Error::Verb {
            verb: "rdma_connect",
            context: "QP 39".into(),
            source: io::Error::from_raw_os_error(nix::errno::Errno::EADDRINUSE as i32),
        };
        assert!(another_port(&step_error("rdma_connect", verb), 1));
    }
}
