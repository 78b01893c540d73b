//! The connection manager (`rdma::cm`), modelled on rdma-core's
//! tests/test_rdmacm.py and the librdmacm examples (rping, udaddy, mckey,
//! rdma_server/rdma_client, cmtime). Client and server run in one process:
//! one event loop on one channel, or threads for the synchronous API. Every
//! wait is bounded; a lost event fails the test.
//!
//! Addresses: in the VM, rxe0 and siw0 both exist; librdmacm maps
//! `RDMA_TEST_IP` (10.8.0.1) to rxe0 and `RDMA_TEST_IWARP_IP` (10.8.0.2) to
//! siw0, which is how the `iwarp` tests reach siw0 (measured: binding to
//! 10.8.0.1 gives `cm_id->verbs` = rxe0, 10.8.0.2 gives siw0, and resolving
//! one from the other is an `ADDR_ERROR`, -ETIMEDOUT, since both are local).
//! Connections therefore stay on one address. rdma_cm over 127.0.0.1 does not
//! work with soft-RoCE. Listeners bind port 0 and read the port back.
//!
//! The tests live in the modules below, along what they test; each takes the
//! imports and helpers of this file with `use super::*`.

#[path = "../common/mod.rs"]
mod common;

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::iwarp::iwarp_ip;
use common::{roce_ip, take, wait};
use rdma::cm::{
    self, blocking, AddrInfoFlags, AddrInfoHints, CmAddr, CmEvent, CmEventType, CmId, CmOption,
    ConnParam, EventChannel, IbAddr, McJoinFlags, PortSpace,
};
use rdma::{
    AccessFlags, CompletionQueue, Error, Gid, ProtectionDomain, QpCreateFlags, QpType, QueuePair,
    SendFlags, SendWr, WcOpcode, WcStatus,
};

const T: Duration = Duration::from_secs(5);
const LW: AccessFlags = AccessFlags::LOCAL_WRITE;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

fn next(ch: &EventChannel) -> CmEvent {
    let e = ch
        .get_event_timeout(T)
        .expect("rdma_get_cm_event")
        .unwrap_or_else(|| panic!("lost event: none within {T:?}"));
    eprintln!(
        "event {} status {} on {:?}",
        e.event_type(),
        e.status(),
        e.id()
    );
    e
}

fn expect(ch: &EventChannel, want: CmEventType) -> CmEvent {
    let e = next(ch);
    assert_eq!(e.event_type(), want, "{e:?}");
    assert_eq!(e.status(), 0, "{e:?}");
    e
}

/// One end of a connection: its id and the crate objects on its context.
struct Side {
    qp: QueuePair,
    cq: CompletionQueue,
    pd: ProtectionDomain,
    id: CmId,
}

fn side(id: &CmId, qp_type: QpType) -> Side {
    let ctx = id.context().expect("the id has a device");
    assert!(ctx.is_borrowed());
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None, 0).unwrap();
    let qp = pd.qp_builder(qp_type, &cq, &cq).build().unwrap();
    Side {
        qp,
        cq,
        pd,
        id: id.clone(),
    }
}

fn listen(ch: &EventChannel, ps: PortSpace, ip: IpAddr) -> (CmId, SocketAddr) {
    let listener = ch.create_id(ps).unwrap();
    listener.bind_addr(SocketAddr::new(ip, 0)).unwrap();
    listener.listen(64).unwrap();
    let port = listener.src_port();
    assert_ne!(port, 0, "port 0 picks a free port");
    (listener, SocketAddr::new(ip, port))
}

fn resolve(ch: &EventChannel, id: &CmId, dst: SocketAddr) {
    id.resolve_addr(None, dst, T).unwrap();
    drop(expect(ch, CmEventType::AddrResolved));
    id.resolve_route(T).unwrap();
    drop(expect(ch, CmEventType::RouteResolved));
}

/// Connects a client to a listener at `ip` with crate QPs, one channel, one
/// thread. Returns (channel, listener, client, server).
fn connect_pair(ip: IpAddr, device: &str, data: &[u8]) -> (EventChannel, CmId, Side, Side) {
    let ch = EventChannel::new().unwrap();
    let (listener, addr) = listen(&ch, PortSpace::Tcp, ip);
    let client_id = ch.create_id(PortSpace::Tcp).unwrap();
    resolve(&ch, &client_id, addr);
    let client = side(&client_id, QpType::Rc);
    assert_eq!(client.pd.context().name(), device);
    client_id
        .connect_qp(&client.qp, &ConnParam::with_private_data(data))
        .unwrap();
    let request = expect(&ch, CmEventType::ConnectRequest);
    assert!(request.listen_id().unwrap().same_id(&listener));
    assert!(
        request.private_data().starts_with(data),
        "{:?}",
        request.private_data()
    );
    let server_id = request.id().clone();
    drop(request);
    let server = side(&server_id, QpType::Rc);
    server_id
        .accept_qp(&server.qp, &ConnParam::with_private_data(b"welcome"))
        .unwrap();
    let (mut client_up, mut server_up) = (false, false);
    while !(client_up && server_up) {
        let e = next(&ch);
        assert_eq!(e.status(), 0, "{e:?}");
        match e.event_type() {
            CmEventType::ConnectResponse if e.id().same_id(&client_id) => {
                assert!(e.private_data().starts_with(b"welcome"));
                drop(e);
                client_id.establish_qp(&client.qp).unwrap();
                client_up = true;
            }
            CmEventType::Established if e.id().same_id(&client_id) => client_up = true,
            CmEventType::Established if e.id().same_id(&server_id) => server_up = true,
            other => panic!("unexpected {other} in {e:?}"),
        }
    }
    (ch, listener, client, server)
}

/// SEND client → server, RDMA WRITE server → client, RDMA READ client ←
/// server; data checked byte for byte.
fn traffic(c: &mut Side, s: &mut Side) {
    let data = pattern(4096, 1);
    s.qp.post_recv(1, s.pd.alloc_mr(4096, LW).unwrap()).unwrap();
    c.qp.post_send(SendWr::send(
        2,
        c.pd.reg_mr(data.clone(), AccessFlags::empty()).unwrap(),
    ))
    .unwrap();
    let sent = wait(&c.cq, 1).pop().unwrap();
    assert_eq!(sent.status, WcStatus::Success, "{sent:?}");
    let mut recv = wait(&s.cq, 1).pop().unwrap();
    assert_eq!(recv.status, WcStatus::Success, "{recv:?}");
    assert_eq!(recv.byte_len, 4096);
    let got = recv.take_buffers().into_one().unwrap();
    assert_eq!(got.as_slice().unwrap(), &data[..]);

    let target = c.pd.alloc_mr(4096, LW | AccessFlags::REMOTE_WRITE).unwrap();
    let written = pattern(4096, 2);
    s.qp.post_send(SendWr::write(
        3,
        s.pd.reg_mr(written.clone(), AccessFlags::empty()).unwrap(),
        target.remote(),
    ))
    .unwrap();
    let w = wait(&s.cq, 1).pop().unwrap();
    assert_eq!(
        (w.status, w.opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite),
        "{w:?}"
    );
    assert_eq!(target.to_vec(), written);

    let source =
        s.pd.reg_mr(pattern(4096, 3), LW | AccessFlags::REMOTE_READ)
            .unwrap();
    c.qp.post_send(SendWr::read(
        4,
        c.pd.alloc_mr(4096, LW).unwrap(),
        source.remote(),
    ))
    .unwrap();
    let mut r = wait(&c.cq, 1).pop().unwrap();
    assert_eq!(
        (r.status, r.opcode),
        (WcStatus::Success, WcOpcode::RdmaRead),
        "{r:?}"
    );
    assert_eq!(
        r.take_buffers().into_one().unwrap().to_vec(),
        pattern(4096, 3)
    );
}

/// `by` disconnects; the other side answers with its own disconnect (on
/// InfiniBand/RoCE that sends the DREP the initiator waits for).
fn disconnect_both(ch: &EventChannel, by: &CmId, other: &CmId) {
    by.disconnect().unwrap();
    let mut seen = (false, false);
    while !(seen.0 && seen.1) {
        let e = next(ch);
        match e.event_type() {
            CmEventType::Disconnected if e.id().same_id(by) => seen.0 = true,
            CmEventType::Disconnected if e.id().same_id(other) => {
                drop(e);
                let _ = other.disconnect();
                seen.1 = true;
            }
            CmEventType::TimewaitExit => {}
            t => panic!("unexpected {t}: {e:?}"),
        }
    }
}

fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    bounded_for(what, Duration::from_secs(20), f)
}

fn bounded_for<T: Send + 'static>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what} hung or failed (see the panic above, if any)"))
}

mod af_ib;
mod connect;
mod datagrams;
mod errors;
mod events;
mod options;
mod sync_api;
