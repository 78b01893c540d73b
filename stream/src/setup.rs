//! Making a connection: resolving, the queue pair and buffers on the
//! route's device, and the exchange of rsocket's connection data in the
//! private data of the connect request and the accept.
//!
//! Each connection has an event channel and a completion channel of its
//! own, so that a stream can wait on both (data, and the peer's
//! disconnection) and outlive its listener.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rdma::cm::{CmEventType, CmId, ConnParam, EventChannel, PortSpace};
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
}

impl Default for Options {
    /// rsocket's sizes, 5 s per step.
    fn default() -> Self {
        Options {
            sizes: Sizes::default(),
            timeout: Duration::from_secs(5),
            busy_poll: Duration::from_micros(10),
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

/// Connects to `dst` and exchanges the connection data.
pub(crate) fn connect(dst: SocketAddr, opts: &Options) -> io::Result<Parts> {
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
    _device: Option<rdma::Context>,
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
    Ok(Listening {
        _device: device,
        id,
        events,
    })
}

/// Waits (without bound when `timeout` is `None`) for a connection request
/// and accepts it; a request that is not rsocket's is rejected and the wait
/// goes on.
pub(crate) fn accept(
    l: &Listening,
    opts: &Options,
    timeout: Option<Duration>,
) -> io::Result<Parts> {
    let err = |what: &'static str| move |e| step_error(what, e);
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let event = match deadline {
            None => l.events.get_event().map_err(err("rdma_get_cm_event"))?,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                match l
                    .events
                    .get_event_timeout(left)
                    .map_err(err("rdma_get_cm_event"))?
                {
                    Some(e) => e,
                    None => {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "no connection request in time",
                        ))
                    }
                }
            }
        };
        if event.event_type() != CmEventType::ConnectRequest {
            continue;
        }
        let id = event.id().clone();
        let peer = ConnData::decode(event.private_data());
        drop(event);
        let peer = match peer {
            Ok(p) => p,
            Err(e) => {
                log::warn!("rejected a connection request: {e}");
                let _ = id.reject(&[]);
                continue;
            }
        };
        match accept_one(id.clone(), &peer, opts) {
            Ok(parts) => return Ok(parts),
            Err(e) => {
                let _ = id.reject(&[]);
                return Err(e);
            }
        }
    }
}

fn accept_one(id: CmId, peer: &ConnData, opts: &Options) -> io::Result<Parts> {
    let err = |what: &'static str| move |e| step_error(what, e);
    let events = EventChannel::new().map_err(err("rdma_create_event_channel"))?;
    id.migrate_id(Some(&events))
        .map_err(err("rdma_migrate_id"))?;
    let m = make(&id, opts.sizes)?;
    let ours = m.local.conn_data().encode().to_vec();
    id.accept_qp(&m.qp, &param(ours, m.iwarp))
        .map_err(err("rdma_accept"))?;
    drop(
        events
            .wait_for(
                &id,
                &[CmEventType::Established],
                "rdma_accept",
                opts.timeout,
            )
            .map_err(err("accepting"))?,
    );
    Ok(Parts {
        engine: Engine::new(m.qp, m.local, peer, m.iwarp, true),
        cq: m.cq,
        comp: m.comp,
        _pd: m.pd,
        id,
        events,
        polled: Polled::default(),
    })
}
