//! Connections over iWARP (siw) inside one process: siw has no connected
//! QP without RDMA CM.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use rdma::cm::{CmEventType, EventChannel, PortSpace};
use rdma::{AccessFlags, QpType, SendWr, WcStatus};

const LW: AccessFlags = AccessFlags::LOCAL_WRITE;

/// The iWARP device's address (`RDMA_TEST_IWARP_IP`).
pub fn iwarp_ip() -> IpAddr {
    std::env::var("RDMA_TEST_IWARP_IP")
        .expect("RDMA_TEST_IWARP_IP is not set: run in the VM (ci/vm run ...)")
        .parse()
        .expect("RDMA_TEST_IWARP_IP is an IP address")
}

/// A listener on the iWARP device's address (any port, backlog 4) on `ch`.
/// Making and dropping one first opens librdmacm's context on siw0, which
/// it keeps for the life of the process (so that a test's baseline counts
/// it).
pub fn listener(ch: &EventChannel) -> rdma::cm::CmId {
    let l = ch.create_id(PortSpace::Tcp).unwrap();
    l.bind_addr(SocketAddr::new(iwarp_ip(), 0)).unwrap();
    l.listen(4).unwrap();
    l
}

/// One end of an iWARP connection: its verbs objects, made on the id's
/// context (librdmacm's).
pub struct End {
    pub qp: rdma::QueuePair,
    pub cq: rdma::CompletionQueue,
    pub pd: rdma::ProtectionDomain,
    pub id: rdma::cm::CmId,
}

/// PD, CQ (16) and RC QP on the id's context.
pub fn end_for(id: &rdma::cm::CmId) -> End {
    end_with(id, None)
}

/// The same, the CQ tied to `channel` (made on the id's context).
pub fn end_with(id: &rdma::cm::CmId, channel: Option<&rdma::CompletionChannel>) -> End {
    let ctx = id.context().expect("the id has a device");
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, channel, 0).unwrap();
    let qp = pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
    End {
        qp,
        cq,
        pd,
        id: id.clone(),
    }
}

/// The next CM event on `ch`, which must be `want` with status 0 (10 s bound).
pub fn next_event(ch: &EventChannel, want: CmEventType) -> rdma::cm::CmEvent {
    let e = ch
        .get_event_timeout(Duration::from_secs(10))
        .expect("rdma_get_cm_event")
        .unwrap_or_else(|| panic!("no {want} within 10 s"));
    assert_eq!((e.event_type(), e.status()), (want, 0), "{e:?}");
    e
}

/// A connection from `listener`'s channel to itself: (client, server).
/// Each end has a receive posted, and one SEND has gone each way.
pub fn iwarp_connection(ch: &EventChannel, listener: &rdma::cm::CmId) -> (End, End) {
    iwarp_connection_with(ch, listener, None)
}

/// The same, the client's CQ tied to `channel` (made on the listener's
/// context: librdmacm's one context of the device, which the client's id
/// shares).
pub fn iwarp_connection_with(
    ch: &EventChannel,
    listener: &rdma::cm::CmId,
    channel: Option<&rdma::CompletionChannel>,
) -> (End, End) {
    let dst = SocketAddr::new(iwarp_ip(), listener.src_port());
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    id.resolve_addr(None, dst, Duration::from_secs(5)).unwrap();
    drop(next_event(ch, CmEventType::AddrResolved));
    id.resolve_route(Duration::from_secs(5)).unwrap();
    drop(next_event(ch, CmEventType::RouteResolved));
    let mut client = end_with(&id, channel);
    id.connect_qp(&client.qp, &rdma::cm::ConnParam::default())
        .unwrap();
    let req = next_event(ch, CmEventType::ConnectRequest);
    let mut server = end_for(req.id());
    drop(req);
    // iWARP has no RNR: receives before the first SEND.
    for e in [&mut server, &mut client] {
        let m = e.pd.alloc_mr(64, LW).unwrap();
        e.qp.post_recv(1, m).unwrap();
    }
    server
        .id
        .accept_qp(&server.qp, &rdma::cm::ConnParam::default())
        .unwrap();
    await_established(ch, &id, &client.qp);
    // One SEND each way, then a receive posted again on each end.
    send_one(&mut client, &mut server, 1);
    send_one(&mut server, &mut client, 2);
    (client, server)
}

/// Waits, on a channel that serves both ends of a connection to itself,
/// until both are established: the passive side's ESTABLISHED and the
/// active side's CONNECT_RESPONSE, on which the active `id` moves its `qp`
/// to RTR and RTS (`establish_qp`). Fails after 10 s without an event.
pub fn await_established(ch: &EventChannel, id: &rdma::cm::CmId, qp: &rdma::QueuePair) {
    let mut established = 0;
    while established < 2 {
        let e = ch
            .get_event_timeout(Duration::from_secs(10))
            .unwrap()
            .expect("the connection established within 10 s");
        match (e.event_type(), e.status()) {
            (CmEventType::ConnectResponse, 0) => {
                drop(e);
                id.establish_qp(qp).unwrap();
                established += 1;
            }
            (CmEventType::Established, 0) => established += 1,
            _ => panic!("connecting: {e:?}"),
        }
    }
}

/// A SEND of 64 bytes of `byte` from `from` to `to`, checked; `to` posts
/// its receive again.
pub fn send_one(from: &mut End, to: &mut End, byte: u8) {
    let msg = from
        .pd
        .reg_mr(vec![byte; 64], AccessFlags::empty())
        .unwrap();
    from.qp.post_send(SendWr::send(2, msg)).unwrap();
    let s = super::wait(&from.cq, 1);
    assert_eq!(s[0].status, WcStatus::Success, "{:?}", s[0]);
    let mut r = super::wait(&to.cq, 1);
    assert_eq!(r[0].status, WcStatus::Success, "{:?}", r[0]);
    assert_eq!(
        r[0].take_buffers().into_one().unwrap().to_vec(),
        vec![byte; 64]
    );
    let m = to.pd.alloc_mr(64, LW).unwrap();
    to.qp.post_recv(1, m).unwrap();
}
