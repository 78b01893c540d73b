//! The blocking layer's additions for issue 21: accepting in two phases (the
//! accept's private data carries the rkey of memory registered on the new
//! connection's PD, in `RemoteMemory`'s wire encoding), waiting for a
//! completion with a timeout instead of spinning, and a registered buffer
//! pool used with safe posting; and a connect from a given source port that
//! a TCP socket holds.

mod common;

use common::iwarp::iwarp_ip;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use rdma::cm::blocking::{ConnectOptions, Connection, Listener};
use rdma::cm::ConnParam;
use rdma::{AccessFlags, BufferPool, RemoteMemory, SendWr, WcOpcode, WcStatus};

const LW: AccessFlags = AccessFlags::LOCAL_WRITE;
const WAIT: Option<Duration> = Some(Duration::from_secs(10));

fn two_phase(ip: IpAddr) {
    let listener = Listener::bind(SocketAddr::new(ip, 0), 8).unwrap();
    let addr = listener.local_addr().unwrap();
    let pattern: Vec<u8> = (0..128u8).map(|i| i ^ 0x5a).collect();
    let server = std::thread::spawn(move || {
        let opts = ConnectOptions::default();
        let mut pending = listener.incoming(&opts).unwrap();
        assert!(pending.peer_private_data().starts_with(b"req"));
        let target = pending
            .pd()
            .alloc_mr(128, LW | AccessFlags::REMOTE_WRITE)
            .unwrap();
        let note = pending.pd().alloc_mr(8, LW).unwrap();
        pending.qp().post_recv(1, note).unwrap();
        let conn = pending
            .accept(&ConnParam::with_private_data(&target.remote().to_bytes()))
            .unwrap();
        let c = conn.cq().wait(WAIT).unwrap().expect("the note within 10 s");
        assert_eq!(
            (c.wr_id, c.status, c.opcode),
            (1, WcStatus::Success, WcOpcode::Recv)
        );
        let mut seen = vec![0u8; 128];
        target.read_at(0, &mut seen).unwrap();
        conn.wait_disconnected().unwrap();
        seen
    });
    let opts = ConnectOptions {
        conn_param: ConnParam::with_private_data(b"req"),
        ..ConnectOptions::default()
    };
    let mut conn = Connection::connect(addr, &opts).unwrap();
    let remote = RemoteMemory::from_bytes(conn.peer_private_data()).unwrap();
    assert_eq!(remote.len, 128);
    let src = conn
        .pd()
        .reg_mr(pattern.clone(), AccessFlags::empty())
        .unwrap();
    let note = conn.pd().reg_mr(vec![1; 8], AccessFlags::empty()).unwrap();
    conn.qp().post_send(SendWr::write(10, src, remote)).unwrap();
    conn.qp().post_send(SendWr::send(11, note)).unwrap();
    for want in [10, 11] {
        let c = conn.cq().wait(WAIT).unwrap().expect("a send within 10 s");
        assert_eq!((c.wr_id, c.status), (want, WcStatus::Success));
    }
    conn.disconnect().unwrap();
    assert_eq!(server.join().unwrap(), pattern);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn blocking_two_phase_accept_carries_an_rkey() {
    two_phase(IpAddr::V4(common::ip()));
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_blocking_two_phase_accept_carries_an_rkey() {
    two_phase(iwarp_ip());
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn a_pending_connection_dropped_unanswered_is_rejected() {
    let ip = IpAddr::V4(common::ip());
    let listener = Listener::bind(SocketAddr::new(ip, 0), 8).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let pending = listener.incoming(&ConnectOptions::default()).unwrap();
        pending.reject(b"no").unwrap();
    });
    let e = Connection::connect(addr, &ConnectOptions::default()).unwrap_err();
    assert!(
        matches!(&e, rdma::Error::CmEvent { event, .. } if *event == rdma::cm::CmEventType::Rejected),
        "{e}"
    );
    server.join().unwrap();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn buffer_pool_slots_go_through_safe_posting_and_come_back() {
    let mut p = common::pair(rdma::QpType::Rc, AccessFlags::empty());
    let pool = BufferPool::new(&p.pd, 64, 8, LW).unwrap();
    assert_eq!(
        (pool.slots(), pool.slot_len(), pool.available()),
        (8, 64, 8)
    );
    let mut out = Vec::new();
    while let Some(slot) = pool.take() {
        assert!(pool.owns(&slot));
        out.push(slot);
    }
    assert_eq!(out.len(), 8);
    // Distinct slots of one registration.
    let mut addrs: Vec<u64> = out.iter().map(|m| m.addr()).collect();
    addrs.sort_unstable();
    addrs.dedup();
    assert_eq!(addrs.len(), 8);
    for (i, slot) in out.into_iter().enumerate() {
        p.b.post_recv(i as u64, slot).unwrap();
    }
    assert_eq!(pool.available(), 0);
    for i in 0..8u64 {
        let m =
            p.pd.reg_mr(vec![i as u8; 64], AccessFlags::empty())
                .unwrap();
        p.a.post_send(SendWr::send(100 + i, m)).unwrap();
    }
    let mut done = common::wait(&p.cq, 16);
    for i in 0..8u64 {
        let mut c = common::take(&mut done, i);
        let slot = c.take_buffers().into_one().unwrap();
        assert_eq!(slot.to_vec(), vec![i as u8; 64]);
        pool.put(slot).expect("a slot of this pool comes back");
    }
    assert_eq!(pool.available(), 8);
    // What is not a whole slot of this pool is refused, and given back.
    let foreign = p.pd.alloc_mr(64, LW).unwrap();
    assert!(pool.put(foreign).is_err());
    let mut slot = pool.take().unwrap();
    let half = slot.split_off(32).unwrap();
    assert!(!pool.owns(&half));
    let half = pool.put(half).unwrap_err();
    slot.unsplit(half).unwrap();
    pool.put(slot).unwrap();
    assert_eq!(pool.available(), 8);
    let e = BufferPool::new(&p.pd, 0, 8, LW).unwrap_err();
    assert!(e.to_string().contains("non-zero size"), "{e}");
}

/// A connect from a source port that a TCP socket holds
/// (`ConnectOptions::src`): the caller's port is kept, so on iWARP, whose
/// connection is a TCP connection from that port, the connect fails naming
/// `rdma_connect` and `EADDRINUSE` (instead of moving to another port, as
/// it does when the connection manager chose the port); RoCE makes no TCP
/// connection and connects from it.
fn source_port_held_by_tcp(ip: IpAddr, iwarp: bool) {
    let listener = Listener::bind(SocketAddr::new(ip, 0), 4).unwrap();
    let dst = listener.local_addr().unwrap();
    let tcp = std::net::TcpListener::bind(SocketAddr::new(ip, 0)).unwrap();
    let held = tcp.local_addr().unwrap();
    let opts = ConnectOptions {
        src: Some(held),
        ..ConnectOptions::default()
    };
    if iwarp {
        let err = Connection::connect(dst, &opts).unwrap_err();
        assert_eq!(err.verb(), Some("rdma_connect"), "{err}");
        assert_eq!(err.errno(), Some(libc::EADDRINUSE), "{err}");
        return;
    }
    let server = std::thread::spawn(move || {
        let conn = listener.accept(&ConnectOptions::default()).unwrap();
        conn.wait_disconnected().unwrap();
    });
    let conn = Connection::connect(dst, &opts).unwrap();
    assert_eq!(conn.id().src_port(), held.port());
    conn.disconnect().unwrap();
    server.join().unwrap();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn a_source_port_held_by_tcp_is_no_obstacle_to_roce() {
    source_port_held_by_tcp(common::roce_ip(), false);
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_a_given_source_port_held_by_tcp_fails_the_connect_naming_it() {
    source_port_held_by_tcp(iwarp_ip(), true);
}
