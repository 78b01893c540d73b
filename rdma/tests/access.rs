//! Access control: a peer that asks for what it was not granted gets an
//! error, and the memory it aimed at is unchanged. Each case: the target
//! filled with a known pattern, the request refused with the status named,
//! the pattern still there afterwards (and, where the QP survives, a
//! legitimate request right after it works, so the refusal was not a
//! broken connection).

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use common::{pair, wait};
use rdma::cm::{CmEventType, EventChannel, PortSpace};
use rdma::{AccessFlags, AhAttr, MemoryRegion, QpType, SendWr, WcStatus};

const LW: AccessFlags = AccessFlags::LOCAL_WRITE;
const ALL_REMOTE: AccessFlags = AccessFlags::REMOTE_WRITE
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);
const PATTERN: u8 = 0xa5;

fn target(pd: &rdma::ProtectionDomain, access: AccessFlags) -> MemoryRegion {
    pd.reg_mr(vec![PATTERN; 64], access).unwrap()
}

fn unchanged(mr: &MemoryRegion) {
    assert_eq!(
        mr.to_vec(),
        vec![PATTERN; 64],
        "the target memory is unchanged"
    );
}

/// The responder refuses: rxe answers a request outside the region's access
/// with a NAK that the requester reports as a remote access error (an
/// invalid-request NAK on some paths of some kernels).
fn refused(c: &rdma::Completion) {
    assert!(
        matches!(c.status, WcStatus::RemAccessErr | WcStatus::RemInvReqErr),
        "refused: {c:?}"
    );
}

/// WRITE, READ and ATOMIC each against a region registered with every remote
/// access but the one the operation needs (the QP grants all of them).
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn write_read_atomic_to_a_region_without_that_access() {
    for (op, missing) in [
        ("write", AccessFlags::REMOTE_WRITE),
        ("read", AccessFlags::REMOTE_READ),
        ("compare-swap", AccessFlags::REMOTE_ATOMIC),
        ("fetch-add", AccessFlags::REMOTE_ATOMIC),
    ] {
        let mut p = pair(QpType::Rc, ALL_REMOTE);
        let t = target(&p.pd, LW | (ALL_REMOTE - missing));
        assert!(!t.access().contains(missing), "{op}");
        let local = p.pd.alloc_mr(64, LW).unwrap();
        let remote = t.remote();
        let wr = match op {
            "write" => SendWr::write(
                1,
                p.pd.reg_mr(vec![1u8; 64], AccessFlags::empty()).unwrap(),
                remote,
            ),
            "read" => SendWr::read(1, local, remote),
            "compare-swap" => SendWr::compare_swap(
                1,
                p.pd.alloc_mr(8, LW).unwrap(),
                remote.slice(0, 8).unwrap(),
                u64::from_ne_bytes([PATTERN; 8]),
                7,
            ),
            _ => SendWr::fetch_add(
                1,
                p.pd.alloc_mr(8, LW).unwrap(),
                remote.slice(0, 8).unwrap(),
                1,
            ),
        };
        p.a.post_send(wr).unwrap();
        let mut c = wait(&p.cq, 1).pop().unwrap();
        refused(&c);
        assert!(c.take_buffers().into_one().is_some() || op == "read");
        unchanged(&t);
        eprintln!("{op} without {missing:?}: {}", c.status);
    }
}

/// A WRITE with the rkey of a region of another protection domain (same
/// device, both domains registered with full remote access).
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rkey_of_another_protection_domain() {
    let mut p = pair(QpType::Rc, ALL_REMOTE);
    let other_pd = p.ctx.alloc_pd().unwrap();
    let foreign = target(&other_pd, LW | ALL_REMOTE);
    let own = target(&p.pd, LW | ALL_REMOTE);
    let src = p.pd.reg_mr(vec![1u8; 64], AccessFlags::empty()).unwrap();
    p.a.post_send(SendWr::write(1, src, foreign.remote()))
        .unwrap();
    refused(&wait(&p.cq, 1).pop().unwrap());
    unchanged(&foreign);
    // The same request with the responder's own region works (a new pair:
    // the refusal put the first one in the error state).
    let mut q = pair(QpType::Rc, ALL_REMOTE);
    let own_q = target(&q.pd, LW | ALL_REMOTE);
    let src = q.pd.reg_mr(vec![1u8; 64], AccessFlags::empty()).unwrap();
    q.a.post_send(SendWr::write(2, src, own_q.remote()))
        .unwrap();
    let c = wait(&q.cq, 1).pop().unwrap();
    assert_eq!(c.status, WcStatus::Success, "{c:?}");
    assert_eq!(own_q.to_vec(), vec![1u8; 64]);
    unchanged(&own);
}

/// The rkey of a region that was deregistered: refused; the region
/// registered after it in the same domain is untouched.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rkey_of_a_deregistered_region() {
    let mut p = pair(QpType::Rc, ALL_REMOTE);
    let gone = target(&p.pd, LW | ALL_REMOTE);
    let stale = gone.remote();
    gone.destroy().map_err(|(_, e)| e).expect("ibv_dereg_mr");
    let live = target(&p.pd, LW | ALL_REMOTE);
    let src = p.pd.reg_mr(vec![1u8; 64], AccessFlags::empty()).unwrap();
    p.a.post_send(SendWr::write(1, src, stale)).unwrap();
    refused(&wait(&p.cq, 1).pop().unwrap());
    unchanged(&live);
}

/// A UD datagram with the wrong Q_Key is dropped by the receiver; the next
/// one, with the right key, is the first and only one it receives.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn ud_send_with_the_wrong_qkey_is_dropped() {
    let mut p = pair(QpType::Ud, AccessFlags::empty());
    let gid = p.ctx.query_gid(1, u32::from(p.gid_index)).unwrap();
    let ah =
        p.pd.create_ah(&AhAttr::global(1, gid, p.gid_index))
            .unwrap();
    // Room for the 40-byte GRH in front of each datagram.
    let recvs = p.pd.alloc_mr(2 * 104, LW).unwrap().chunks(104).unwrap();
    for (i, m) in recvs.into_iter().enumerate() {
        p.b.post_recv(100 + i as u64, m).unwrap();
    }
    let bqpn = p.b.qp_num();
    for (id, byte, qkey) in [(1u64, 0x11u8, !common::QKEY), (2, 0x22, common::QKEY)] {
        let msg = p.pd.reg_mr(vec![byte; 64], AccessFlags::empty()).unwrap();
        p.a.post_send(SendWr::send(id, msg).ud(&ah, bqpn, qkey))
            .unwrap();
    }
    // Two send completions (UD sends succeed whatever the receiver does),
    // one receive: the second datagram's.
    let mut done = wait(&p.cq, 3);
    let mut recv = done
        .iter()
        .position(|c| c.wr_id >= 100)
        .map(|i| done.remove(i))
        .unwrap();
    assert!(
        done.iter().all(|c| c.is_success() && c.wr_id < 100),
        "{done:?}"
    );
    assert_eq!(recv.status, WcStatus::Success, "{recv:?}");
    assert_eq!(
        recv.wr_id, 100,
        "the first receive took the right-key datagram"
    );
    let data = recv.take_buffers().into_one().unwrap().to_vec();
    assert_eq!(&data[40..104], &[0x22u8; 64][..], "the right-key datagram");
    let mut more = Vec::new();
    p.cq.poll(&mut more, 4).unwrap();
    assert!(
        more.is_empty(),
        "the wrong-key datagram never arrived: {more:?}"
    );
    assert_eq!(p.b.in_flight().1, 1, "one receive is still posted");
}

/// A listener bound to one address does not take connections to another
/// address of the same machine on the same port: the client is refused and
/// the listener sees nothing. Here the listener is on rxe0's address and the
/// connection goes to siw0's: refused by iWARP (below, for RoCE).
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE) and the iWARP address (RDMA_TEST_IWARP_IP)"]
fn connect_to_a_listener_bound_to_another_address() {
    let bound: IpAddr = IpAddr::V4(common::ip());
    let other: IpAddr = common::iwarp::iwarp_ip();
    // iWARP connects over TCP at once: refused on the spot (siw).
    drop(refused_by_a_listener_elsewhere(bound, other));
}

/// The RoCE side of the same: the listener on siw0's address, the
/// connection to rxe0's address on the same port. rxe's CM finds no
/// listener for the service (the port) on rxe0 and rejects the request:
/// `REJECTED` with status 8 (`IB_CM_REJ_INVALID_SERVICE_ID`); the listener
/// sees nothing, and then takes a connection to its own address as before
/// (a SEND each way). Resources and descriptors back at the baseline.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE) and the iWARP address (RDMA_TEST_IWARP_IP)"]
fn rxe_connect_to_a_listener_bound_to_another_address() {
    let bound = common::iwarp::iwarp_ip();
    let other: IpAddr = IpAddr::V4(common::ip());
    // librdmacm's contexts on both devices (kept for the life of the process).
    for ip in [bound, other] {
        let ch = EventChannel::new().unwrap();
        let l = ch.create_id(PortSpace::Tcp).unwrap();
        l.bind_addr(SocketAddr::new(ip, 0)).unwrap();
    }
    let before = common::baseline();
    let (lch, listener) = refused_by_a_listener_elsewhere(bound, other);
    // Unchanged: the listener still takes a connection to its own address.
    let (client, server) = common::iwarp::iwarp_connection(&lch, &listener);
    drop((client, server, listener, lch));
    common::assert_back_to(before);
}

/// A listener bound to `bound` (its channel returned with it), a connection
/// to `other` on the listener's port from another channel: refused with
/// `ECONNREFUSED` from `rdma_connect` (iWARP) or the CM's `REJECTED` with
/// status 8 (RoCE: no listener for the service on that device). Asserts that
/// the listener saw no request and the client's channel nothing more.
fn refused_by_a_listener_elsewhere(bound: IpAddr, other: IpAddr) -> (EventChannel, rdma::cm::CmId) {
    assert_ne!(bound, other);
    let lch = EventChannel::new().unwrap();
    let listener = lch.create_id(PortSpace::Tcp).unwrap();
    listener.bind_addr(SocketAddr::new(bound, 0)).unwrap();
    listener.listen(4).unwrap();
    let port = listener.src_port();

    let ch = EventChannel::new().unwrap();
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    let t = Duration::from_secs(5);
    id.resolve_addr(None, SocketAddr::new(other, port), t)
        .unwrap();
    let e = ch
        .get_event_timeout(t)
        .unwrap()
        .expect("an event within 5 s");
    assert_eq!(e.event_type(), CmEventType::AddrResolved, "{e:?}");
    drop(e);
    id.resolve_route(t).unwrap();
    let e = ch
        .get_event_timeout(t)
        .unwrap()
        .expect("an event within 5 s");
    assert_eq!(e.event_type(), CmEventType::RouteResolved, "{e:?}");
    drop(e);
    let ctx = id.context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4, None, 0).unwrap();
    let qp = pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
    let iwarp = other == common::iwarp::iwarp_ip();
    match id.connect_qp(&qp, &rdma::cm::ConnParam::default()) {
        Err(e) => {
            assert!(iwarp, "rdma_connect failed on RoCE: {e}");
            assert_eq!(e.errno(), Some(libc::ECONNREFUSED), "{e}");
            eprintln!("connect to {other}:{port}: {e}");
        }
        Ok(()) => {
            assert!(
                !iwarp,
                "rdma_connect to {other}:{port} over iWARP was not refused"
            );
            // 30 s: more than rxe's CM needs to answer (the REJ comes at
            // once); a lost REJ would end in UNREACHABLE after the CM's
            // retries, which fails the assertion below.
            let e = ch
                .get_event_timeout(Duration::from_secs(30))
                .unwrap()
                .expect("an answer within 30 s");
            eprintln!(
                "connect to {other}:{port}: {} status {}",
                e.event_type(),
                e.status()
            );
            assert_eq!(
                (e.event_type(), e.status()),
                (CmEventType::Rejected, 8),
                "REJECTED, invalid service ID: {e:?}"
            );
        }
    }
    assert!(
        lch.try_get_event().unwrap().is_none(),
        "the listener on {bound} saw no request"
    );
    assert!(
        ch.try_get_event().unwrap().is_none(),
        "nothing more for the refused client"
    );
    drop((qp, cq, pd, id, ch));
    (lch, listener)
}

/// The same refusals over iWARP (siw: no atomics, no memory windows, no
/// UD): WRITE to a region without remote write, WRITE with the rkey of
/// another PD's region and with the rkey of a deregistered one; and READ
/// from a region without remote read, which siw serves (below). Each on a connection of its own in this
/// process, after a permitted request of the same kind worked on it.
/// iWARP answers an access violation with a TERMINATE that ends the
/// connection: the responder's QP goes to the error state (its posted
/// receive is flushed), and so does the requester's (its receive flushed
/// too). A WRITE carries no acknowledgement in iWARP, so its completion may
/// be a success (siw completes a send when TCP took it), or
/// `LOC_QP_OP_ERR` when the TERMINATE stopped it first (both measured):
/// what shows the refusal is the target left unchanged and the connection
/// ended. Ends at
/// the resource and descriptor baseline.
#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_write_read_without_access_and_foreign_or_stale_rkeys() {
    use common::iwarp::iwarp_connection;
    const RW: AccessFlags = AccessFlags::REMOTE_WRITE.union(AccessFlags::REMOTE_READ);
    let listen = common::iwarp::listener;
    // librdmacm's context on siw0 (kept for the life of the process).
    drop(listen(&EventChannel::new().unwrap()));
    let before = common::baseline();
    for case in [
        "write without remote write",
        "read without remote read",
        "write with another PD's rkey",
        "write with a deregistered region's rkey",
    ] {
        let ch = EventChannel::new().unwrap();
        let listener = listen(&ch);
        let (mut a, b) = iwarp_connection(&ch, &listener);
        let read = case.starts_with("read");
        // Permitted first: the same kind of request to a region that
        // grants it works on this connection.
        let open = target(&b.pd, LW | RW);
        let local = a.pd.alloc_mr(64, LW).unwrap();
        let wr = if read {
            SendWr::read(1, local, open.remote())
        } else {
            let src = a.pd.reg_mr(vec![1u8; 64], AccessFlags::empty()).unwrap();
            SendWr::write(1, src, open.remote())
        };
        a.qp.post_send(wr).unwrap();
        let mut c = wait(&a.cq, 1).pop().unwrap();
        assert_eq!(
            c.status,
            WcStatus::Success,
            "{case}: the permitted one: {c:?}"
        );
        let got = c.take_buffers().into_one().unwrap().to_vec();
        if read {
            assert_eq!(got, vec![PATTERN; 64], "{case}: read");
        } else {
            assert_eq!(open.to_vec(), vec![1u8; 64], "{case}: written");
        }
        // Then the one outside what was granted.
        let other_pd = b.id.context().unwrap().alloc_pd().unwrap();
        let (t, remote) = match case {
            "write without remote write" => {
                let t = target(&b.pd, LW | AccessFlags::REMOTE_READ);
                let r = t.remote();
                (t, r)
            }
            "read without remote read" => {
                let t = target(&b.pd, LW | AccessFlags::REMOTE_WRITE);
                let r = t.remote();
                (t, r)
            }
            "write with another PD's rkey" => {
                let t = target(&other_pd, LW | RW);
                let r = t.remote();
                (t, r)
            }
            _ => {
                let gone = target(&b.pd, LW | RW);
                let stale = gone.remote();
                gone.destroy().map_err(|(_, e)| e).expect("ibv_dereg_mr");
                (target(&b.pd, LW | RW), stale)
            }
        };
        let wr = if read {
            SendWr::read(2, a.pd.alloc_mr(64, LW).unwrap(), remote)
        } else {
            let src = a.pd.reg_mr(vec![2u8; 64], AccessFlags::empty()).unwrap();
            SendWr::write(2, src, remote)
        };
        a.qp.post_send(wr).unwrap();
        if read {
            // siw serves it: a read response's memory is checked with no
            // permissions (`siw_qp_sq_proc_tx`: `siw_check_sgl_tx(qp->pd,
            // wqe, 0)`), so REMOTE_READ is not enforced; the PD and the
            // key still are (the cases below). Measured on Linux 6.1.
            let mut c = wait(&a.cq, 1).pop().unwrap();
            eprintln!("{case}: request {}", c.status);
            assert_eq!(
                (c.wr_id, c.status),
                (2, WcStatus::Success),
                "{case}: siw (6.1) does not check REMOTE_READ; if this fails, it now does: {c:?}"
            );
            assert_eq!(
                c.take_buffers().into_one().unwrap().to_vec(),
                vec![PATTERN; 64],
                "{case}"
            );
            unchanged(&t);
            drop((c, t, other_pd, open));
            drop((a, b, listener, ch));
            continue;
        }
        // The requester: the request's completion and its posted receive
        // (flushed); the responder: its posted receive, flushed.
        let mut at_a = wait(&a.cq, 2);
        let op = common::take(&mut at_a, 2);
        let recv_a = common::take(&mut at_a, 1);
        let recv_b = wait(&b.cq, 1).pop().unwrap();
        eprintln!(
            "{case}: request {}, requester's receive {}, responder's receive {}",
            op.status, recv_a.status, recv_b.status
        );
        assert!(
            matches!(
                op.status,
                WcStatus::Success
                    | WcStatus::RemAccessErr
                    | WcStatus::WrFlushErr
                    | WcStatus::LocQpOpErr
            ),
            "{case}: {op:?}"
        );
        assert_eq!(recv_a.status, WcStatus::WrFlushErr, "{case}: {recv_a:?}");
        assert_eq!(recv_b.status, WcStatus::WrFlushErr, "{case}: {recv_b:?}");
        unchanged(&t);
        drop((op, recv_a, recv_b, t, other_pd, open));
        drop((a, b, listener, ch));
    }
    drop(listen(&EventChannel::new().unwrap()));
    common::assert_back_to(before);
}

/// A SEND with invalidate over iWARP (siw, rdma-core 44's libsiw, Linux
/// 6.1) invalidates the region it names: the receive succeeds, and a WRITE
/// with the region's rkey afterwards is refused, the region unchanged.
/// libsiw's `push_send_wqe` takes the STag to invalidate from
/// `wr.rdma.rkey`, not from `invalidate_rkey` where libibverbs puts it;
/// the crate sets both (`fill_send`). Before it did, the SEND_INV named
/// STag 0, the receiver's kernel (`siw_rdmap_complete`,
/// `siw_invalidate_stag`: -EINVAL) completed the receive with
/// `REM_INV_REQ_ERR` and the region stayed reachable (measured). libsiw
/// still reports no completion flags and no invalidated key on a receive
/// (`copy_cqe`): the receiver cannot tell which key went.
#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_send_with_invalidate_invalidates_the_named_region() {
    use common::iwarp::iwarp_connection;
    let listen = common::iwarp::listener;
    drop(listen(&EventChannel::new().unwrap()));
    let ch = EventChannel::new().unwrap();
    let listener = listen(&ch);
    let (mut a, mut b) = iwarp_connection(&ch, &listener);
    let t = target(&b.pd, LW | AccessFlags::REMOTE_WRITE);
    let msg = a.pd.reg_mr(vec![9u8; 64], AccessFlags::empty()).unwrap();
    a.qp.post_send(SendWr::send_with_invalidate(3, msg, t.rkey()))
        .unwrap();
    let s = wait(&a.cq, 1).pop().unwrap();
    let r = wait(&b.cq, 1).pop().unwrap();
    assert_eq!(s.status, WcStatus::Success, "the sender: {s:?}");
    assert_eq!(
        r.status,
        WcStatus::Success,
        "the receiver invalidated the key it was given: {r:?}"
    );
    // The region is invalid now: a WRITE with its rkey is refused and
    // ends the connection; every receive still posted is flushed.
    b.qp.post_recv(5, b.pd.alloc_mr(64, LW).unwrap()).unwrap();
    let src = a.pd.reg_mr(vec![1u8; 64], AccessFlags::empty()).unwrap();
    a.qp.post_send(SendWr::write(4, src, t.remote())).unwrap();
    let mut at_a = wait(&a.cq, 2);
    let op = common::take(&mut at_a, 4);
    let recv_a = common::take(&mut at_a, 1);
    let recv_b = wait(&b.cq, 1).pop().unwrap();
    eprintln!(
        "WRITE to the invalidated rkey: request {}, requester's receive {}, responder's receive {}",
        op.status, recv_a.status, recv_b.status
    );
    assert_eq!(recv_b.status, WcStatus::WrFlushErr, "{recv_b:?}");
    unchanged(&t);
}
