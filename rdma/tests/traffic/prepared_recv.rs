//! Prepared receives (`PreparedRecv`): slots lent from their region, and a region
//! dropped in flight that stays registered, on RoCE and iWARP.

use super::*;

/// `prepare_recv`: receives lend slots of one region, each completion
/// carries the caller's id and no memory, each message is read from its
/// slot; bad slots, other QPs and regions the post would refuse are
/// refused up front.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn prepared_receives_lend_slots_of_their_region() {
    let mut p = common::pair(QpType::Rc, AccessFlags::empty());
    let e =
        p.b.prepare_recv(p.pd.alloc_mr(96, AccessFlags::empty()).unwrap(), 32)
            .expect_err("receive memory needs LOCAL_WRITE");
    assert!(e.error.to_string().contains("LOCAL_WRITE"), "{}", e.error);
    assert_eq!(e.returned.len(), 1, "the region comes back");
    let e =
        p.b.prepare_recv(p.pd.alloc_mr(96, LW).unwrap(), 0)
            .expect_err("empty slots");
    assert!(
        e.error.to_string().contains("slots of 0 bytes"),
        "{}",
        e.error
    );
    let mut recvs =
        p.b.prepare_recv(p.pd.alloc_mr(100, LW).unwrap(), 32)
            .unwrap();
    assert_eq!(
        (recvs.slots(), recvs.slot_len()),
        (3, 32),
        "the tail is unused"
    );
    let e =
        p.b.post_prepared_recv(&mut recvs, 7, 3)
            .expect_err("slot 3 of 3");
    assert!(e.to_string().contains("slot 3"), "{e}");
    let e =
        p.a.post_prepared_recv(&mut recvs, 7, 0)
            .expect_err("prepared by b");
    assert!(e.to_string().contains("another QP"), "{e}");
    assert!(!recvs.in_flight());
    for slot in 0..3 {
        p.b.post_prepared_recv(&mut recvs, 40 + slot as u64, slot)
            .unwrap();
    }
    assert!(recvs.in_flight());
    for i in 0..3u64 {
        let len = 8 * (i as usize + 1);
        let m =
            p.pd.reg_mr(pattern(len, i as u8), AccessFlags::empty())
                .unwrap();
        p.a.post_send(SendWr::send(20 + i, m)).unwrap();
    }
    let mut wcs = [rdma::WorkCompletion::default(); 8];
    let mut memory = Vec::new();
    let mut recv_ids = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut seen = 0;
    while seen < 6 {
        let n = p.cq.poll_wc(&mut wcs, &mut memory).unwrap();
        for wc in &wcs[..n] {
            assert!(wc.is_success(), "{wc:?}");
            if wc.opcode() == WcOpcode::Recv {
                recv_ids.push((wc.wr_id(), wc.byte_len()));
            }
        }
        seen += n;
        assert!(std::time::Instant::now() < deadline, "lost completion");
    }
    assert_eq!(
        recv_ids,
        [(40, 8), (41, 16), (42, 24)],
        "in order, the callers' ids"
    );
    assert!(
        memory.iter().all(|(id, _)| *id >= 20),
        "prepared receives give no memory back: {memory:?}"
    );
    for i in 0..3usize {
        let len = 8 * (i + 1);
        let mut got = vec![0; len];
        recvs.read_at(i, 0, &mut got).unwrap();
        assert_eq!(got, pattern(len, i as u8), "slot {i}");
    }
    let e = recvs
        .read_at(2, 30, &mut [0; 4])
        .expect_err("past the slot");
    assert!(e.to_string().contains("slot 2"), "{e}");
    assert!(!recvs.in_flight());
    let mr = recvs.into_region().expect("nothing in flight");
    assert_eq!(mr.len(), 100);
    assert_eq!((p.a.in_flight(), p.b.in_flight()), ((0, 0), (0, 0)));
}

/// A prepared receive region dropped while a receive is in flight stays
/// registered: the message that arrives afterwards completes without error,
/// and the region goes with that completion.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn prepared_receive_region_dropped_in_flight_stays_registered() {
    let mut p = common::pair(QpType::Rc, AccessFlags::empty());
    let mut recvs =
        p.b.prepare_recv(p.pd.alloc_mr(64, LW).unwrap(), 64)
            .unwrap();
    p.b.post_prepared_recv(&mut recvs, 5, 0).unwrap();
    let recvs = recvs.into_region().expect_err("in flight: refused");
    drop(recvs);
    assert_eq!(p.b.in_flight(), (0, 1));
    let m = p.pd.reg_mr(vec![7u8; 64], AccessFlags::empty()).unwrap();
    p.a.post_send(SendWr::send(6, m)).unwrap();
    let mut done = wait(&p.cq, 2);
    let r = take(&mut done, 5);
    assert!(
        r.is_success(),
        "the dropped region was still registered: {r:?}"
    );
    assert_eq!(r.byte_len, 64);
    assert_eq!((p.a.in_flight(), p.b.in_flight()), ((0, 0), (0, 0)));
}

/// Prepared receives over iWARP (siw: the legacy post path): the slots of
/// one region take messages in order under the callers' ids, after the
/// ordinary receive posted before them, with no memory in their
/// completions; each message is read from its slot; a region the post
/// would refuse comes back; a region dropped with a receive in flight stays
/// registered until that receive completes.
#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_prepared_receives_lend_slots_and_outlive_a_drop_in_flight() {
    use common::iwarp::{iwarp_connection, listener};
    let ch = rdma::cm::EventChannel::new().unwrap();
    let listener = listener(&ch);
    // `b` has one ordinary receive posted (wr_id 1): the first SEND takes it.
    let (mut a, mut b) = iwarp_connection(&ch, &listener);
    let e =
        b.qp.prepare_recv(b.pd.alloc_mr(96, AccessFlags::empty()).unwrap(), 32)
            .expect_err("receive memory needs LOCAL_WRITE");
    assert!(e.error.to_string().contains("LOCAL_WRITE"), "{}", e.error);
    assert_eq!(e.returned.len(), 1, "the region comes back");
    let mut recvs =
        b.qp.prepare_recv(b.pd.alloc_mr(100, LW).unwrap(), 32)
            .unwrap();
    assert_eq!((recvs.slots(), recvs.slot_len()), (3, 32));
    for slot in 0..2 {
        b.qp.post_prepared_recv(&mut recvs, 40 + slot as u64, slot)
            .unwrap();
    }
    for i in 0..3u64 {
        let len = 8 * (i as usize + 1);
        let m =
            a.pd.reg_mr(pattern(len, 10 + i as u8), AccessFlags::empty())
                .unwrap();
        a.qp.post_send(SendWr::send(20 + i, m)).unwrap();
    }
    for c in wait(&a.cq, 3) {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
    }
    let mut got = wait(&b.cq, 3);
    let seen: Vec<_> = got
        .iter()
        .map(|c| (c.wr_id, c.status, c.byte_len))
        .collect();
    let ok = WcStatus::Success;
    assert_eq!(seen, [(1, ok, 8), (40, ok, 16), (41, ok, 24)], "in order");
    assert!(
        !matches!(got[0].take_buffers(), WrBuffers::None),
        "the ordinary receive gives its region back"
    );
    for c in &mut got[1..] {
        assert!(
            matches!(c.take_buffers(), WrBuffers::None),
            "a prepared receive gives no memory back"
        );
    }
    for (slot, seed) in [(0, 11), (1, 12)] {
        let len = 8 * (slot + 2);
        let mut bytes = vec![0; len];
        recvs.read_at(slot, 0, &mut bytes).unwrap();
        assert_eq!(bytes, pattern(len, seed), "slot {slot}");
    }
    assert!(!recvs.in_flight());

    b.qp.post_prepared_recv(&mut recvs, 42, 2).unwrap();
    let recvs = recvs.into_region().expect_err("in flight: refused");
    drop(recvs);
    assert_eq!(b.qp.in_flight(), (0, 1), "the receive is still posted");
    let m = a.pd.reg_mr(vec![7u8; 32], AccessFlags::empty()).unwrap();
    a.qp.post_send(SendWr::send(23, m)).unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    let r = wait(&b.cq, 1).pop().unwrap();
    assert_eq!(
        (r.wr_id, r.status, r.byte_len),
        (42, WcStatus::Success, 32),
        "the dropped region was still registered"
    );
    // `a` keeps the receive the connection posted.
    assert_eq!((a.qp.in_flight().0, b.qp.in_flight()), (0, (0, 0)));

    let fresh =
        b.qp.prepare_recv(b.pd.alloc_mr(64, LW).unwrap(), 64)
            .unwrap();
    let mr = fresh
        .into_region()
        .expect("never posted: nothing in flight");
    assert_eq!(mr.len(), 64, "the whole region comes back");
}
