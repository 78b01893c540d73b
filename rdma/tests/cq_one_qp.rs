//! A CQ that serves one QP's send and receive queue (a stream's, a
//! ping-pong's): a poll resolves both queues' completions in one pass. Each
//! completion is still checked against what was posted: a stale one (its
//! request reclaimed at a RESET) releases nothing, and dropping the QP with
//! completions in its CQ or requests in flight is clean.

mod common;

use common::iwarp::{iwarp_connection, listener, End};
use rdma::cm::EventChannel;
use rdma::{AccessFlags, Completion, CompletionQueue, QpType, QueuePair, SendWr, WcStatus};

const LW: AccessFlags = AccessFlags::LOCAL_WRITE;

/// Two RC QPs on the test device, each on a CQ of its own, connected.
struct Two {
    ctx: rdma::Context,
    pd: rdma::ProtectionDomain,
    a: QueuePair,
    cq_a: CompletionQueue,
    b: QueuePair,
    cq_b: CompletionQueue,
    gid: u8,
}

fn two() -> Two {
    let ctx = common::open(&common::device_name());
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (
        ctx.create_cq(64, None, 0).unwrap(),
        ctx.create_cq(64, None, 0).unwrap(),
    );
    let a = pd.qp_builder(QpType::Rc, &cq_a, &cq_a).build().unwrap();
    let b = pd.qp_builder(QpType::Rc, &cq_b, &cq_b).build().unwrap();
    let gid = u8::try_from(common::gid_index()).unwrap();
    common::connect(&ctx, &a, &b, gid);
    common::connect(&ctx, &b, &a, gid);
    Two {
        ctx,
        pd,
        a,
        cq_a,
        b,
        cq_b,
        gid,
    }
}

/// Posts a receive of 64 bytes with `wr_id`.
fn recv(qp: &mut QueuePair, pd: &rdma::ProtectionDomain, wr_id: u64) {
    qp.post_recv(wr_id, pd.alloc_mr(64, LW).unwrap()).unwrap();
}

/// Posts a SEND of 64 bytes of `byte` with `wr_id`.
fn send(qp: &mut QueuePair, pd: &rdma::ProtectionDomain, wr_id: u64, byte: u8) {
    let m = pd.reg_mr(vec![byte; 64], AccessFlags::empty()).unwrap();
    qp.post_send(SendWr::send(wr_id, m)).unwrap();
}

/// Polls `cq` in polls of up to 16 until `n` completions came (10 s bound).
fn batches(cq: &CompletionQueue, n: usize) -> Vec<Completion> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut out = Vec::new();
    while out.len() < n {
        cq.poll(&mut out, 16).expect("poll");
        assert!(
            std::time::Instant::now() < deadline,
            "got {} of {n} completions in 10 s: {out:?}",
            out.len()
        );
        if out.len() < n {
            std::thread::yield_now();
        }
    }
    assert_eq!(out.len(), n, "more completions than expected: {out:?}");
    out
}

/// The receive `wr_id` among `done`, successful, holding 64 bytes of `byte`.
fn received(done: &mut Vec<Completion>, wr_id: u64, byte: u8) {
    let mut c = common::take(done, wr_id);
    assert!(c.is_success(), "{c:?}");
    let m = c.take_buffers().into_one().expect("its own region");
    assert_eq!(m.to_vec(), vec![byte; 64], "receive {wr_id}");
}

/// A completion of no request of the caller's (a stale one, or one of a
/// destroyed QP): none of the caller's ids `ours`, no memory.
fn assert_bare(c: &Completion, ours: &[u64]) {
    assert!(
        !ours.contains(&c.wr_id),
        "resolved as a caller's request: {c:?}"
    );
    assert!(c.buffers.is_empty() && c.unsignaled.is_empty(), "{c:?}");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn a_stale_completion_after_a_reset_frees_no_request_in_flight_rxe() {
    let Two {
        ctx,
        pd,
        mut a,
        cq_a,
        mut b,
        cq_b,
        gid,
    } = two();
    recv(&mut a, &pd, 1);
    recv(&mut a, &pd, 2);
    send(&mut b, &pd, 100, 0x11);
    // b's SEND completes once a acknowledged it, after a's receive made its
    // completion: that completion now waits in a's CQ, unpolled.
    assert!(common::wait(&cq_b, 1)[0].is_success());
    let back = a.reset().unwrap();
    assert_eq!(back.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(a.in_flight(), (0, 0));
    b.reset().unwrap();
    common::connect(&ctx, &a, &b, gid);
    common::connect(&ctx, &b, &a, gid);
    // New requests on both of a's queues: the queues' sequence numbers go
    // on, so the stale receive completion is no new request's.
    recv(&mut a, &pd, 10);
    recv(&mut a, &pd, 11);
    recv(&mut b, &pd, 30);
    send(&mut a, &pd, 20, 0x22);
    send(&mut b, &pd, 40, 0x44);
    let mut at_b = common::wait(&cq_b, 2);
    received(&mut at_b, 30, 0x22);
    assert!(common::take(&mut at_b, 40).is_success());
    // a's CQ: the stale receive, a's SEND, the receive 10, polled in
    // batches (the send and the receive usually in one).
    let mut done = batches(&cq_a, 3);
    received(&mut done, 10, 0x44);
    let s = common::take(&mut done, 20);
    assert!(s.is_success() && s.buffers.len() == 1, "{s:?}");
    // The stale one is no request's: not 1 (reclaimed at the RESET), nor
    // 11 (in flight), nor any other.
    assert_bare(&done.pop().unwrap(), &[1, 2, 10, 11, 20]);
    // The receive 11 is still in flight, its memory held, and completes
    // as itself.
    assert_eq!(a.in_flight(), (0, 1));
    send(&mut b, &pd, 41, 0x45);
    assert!(common::wait(&cq_b, 1)[0].is_success());
    let mut done = batches(&cq_a, 1);
    received(&mut done, 11, 0x45);
    assert_eq!(a.in_flight(), (0, 0));
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn both_queues_in_one_poll_and_their_flush_come_back_whole_rxe() {
    let Two {
        pd,
        mut a,
        cq_a,
        mut b,
        cq_b,
        ..
    } = two();
    both_queues_then_flush(&pd, &mut a, &cq_a, &mut b, &cq_b, 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_IWARP_DEVICE)"]
fn both_queues_in_one_poll_and_their_flush_come_back_whole_iwarp() {
    let ch = EventChannel::new().unwrap();
    let l = listener(&ch);
    // Each end has one receive posted (wr_id 1) and its own CQ.
    let (mut c, mut s) = iwarp_connection(&ch, &l);
    both_queues_then_flush(&c.pd, &mut c.qp, &c.cq, &mut s.qp, &s.cq, 1);
    drop((c, s));
}

/// Rounds of sends both ways between `a` and `b`, a's completions of
/// both queues polled in batches; then receives left posted on `a` are
/// flushed by the error state and come back with their memory. `posted`
/// receives (wr_id 1) are on each end already.
fn both_queues_then_flush(
    pd: &rdma::ProtectionDomain,
    a: &mut QueuePair,
    cq_a: &CompletionQueue,
    b: &mut QueuePair,
    cq_b: &CompletionQueue,
    posted: usize,
) {
    let pd_b = b.pd().clone();
    let mut first = posted == 1;
    for round in 0..20u64 {
        let id = 1000 + 10 * round;
        if !first {
            recv(a, pd, 1);
            recv(b, &pd_b, 1);
        }
        first = false;
        send(b, &pd_b, id, round as u8);
        send(a, pd, id + 1, round as u8 ^ 0xff);
        let mut at_b = batches(cq_b, 2);
        received(&mut at_b, 1, round as u8 ^ 0xff);
        assert!(common::take(&mut at_b, id).is_success());
        let mut at_a = batches(cq_a, 2);
        received(&mut at_a, 1, round as u8);
        let s = common::take(&mut at_a, id + 1);
        assert!(s.is_success() && s.buffers.len() == 1, "{s:?}");
        assert_eq!(a.in_flight(), (0, 0));
    }
    for i in 0..4 {
        recv(a, pd, 50 + i);
    }
    assert_eq!(a.in_flight(), (0, 4));
    a.to_error().unwrap();
    let done = batches(cq_a, 4);
    let mut ids: Vec<u64> = done.iter().map(|c| c.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [50, 51, 52, 53]);
    for c in &done {
        assert_eq!(c.status, WcStatus::WrFlushErr, "{c:?}");
        assert_eq!(c.buffers.len(), 1, "{c:?}");
    }
    assert_eq!(a.in_flight(), (0, 0));
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn a_qp_dropped_with_completions_in_its_cq_leaves_them_bare_rxe() {
    let failures = rdma::teardown_failures();
    let Two {
        ctx,
        pd,
        mut a,
        cq_a,
        mut b,
        cq_b,
        gid,
    } = two();
    recv(&mut a, &pd, 1001);
    recv(&mut a, &pd, 1002);
    send(&mut b, &pd, 100, 1);
    send(&mut a, &pd, 1003, 2);
    // Wait until a's receive 1001 made its completion (b's SEND is
    // acknowledged after it), poll nothing of a's.
    let mut at_b = common::wait(&cq_b, 1);
    assert!(common::take(&mut at_b, 100).is_success());
    drop(a);
    // The completions of the destroyed QP come back bare: no memory, no
    // id of the caller's (its memory went when the QP was destroyed).
    let mut out = Vec::new();
    while cq_a.poll(&mut out, 16).unwrap() != 0 {}
    assert!(
        !out.is_empty(),
        "the receive 1001 completed before the drop"
    );
    for c in &out {
        assert_bare(c, &[1001, 1002, 1003, 7, 9]);
    }
    // A new QP on the same CQ: its requests are its own, whatever the
    // old one left.
    let mut n = pd.qp_builder(QpType::Rc, &cq_a, &cq_a).build().unwrap();
    b.reset().unwrap();
    common::connect(&ctx, &n, &b, gid);
    common::connect(&ctx, &b, &n, gid);
    recv(&mut n, &pd, 7);
    recv(&mut b, &pd, 8);
    send(&mut b, &pd, 101, 3);
    send(&mut n, &pd, 9, 4);
    // Until both came; anything else (a flush of the old QP's that came
    // late) must be bare.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut done = Vec::new();
    while !(done.iter().any(|c: &Completion| c.wr_id == 7) && done.iter().any(|c| c.wr_id == 9)) {
        assert!(std::time::Instant::now() < deadline, "{done:?}");
        cq_a.poll(&mut done, 16).unwrap();
    }
    received(&mut done, 7, 3);
    assert!(common::take(&mut done, 9).is_success());
    for c in &done {
        assert_bare(c, &[1001, 1002, 1003, 7, 9]);
    }
    assert_eq!(n.in_flight(), (0, 0));
    drop((n, b, cq_a, cq_b));
    assert_eq!(rdma::teardown_failures(), failures);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_IWARP_DEVICE)"]
fn a_qp_dropped_with_requests_in_flight_is_clean_in_any_order_iwarp() {
    let failures = rdma::teardown_failures();
    let ch = EventChannel::new().unwrap();
    let l = listener(&ch);
    let (mut c, s) = iwarp_connection(&ch, &l);
    for i in 0..4 {
        recv(&mut c.qp, &c.pd, 10 + i);
    }
    send(&mut c.qp, &c.pd, 20, 1);
    // The CQ handle first, then the QP (which holds the CQ), its id, the
    // peer: the QP's end takes its requests back, whatever is in the CQ.
    let End { qp, cq, pd, id } = c;
    drop(cq);
    drop(qp);
    drop(id);
    drop(s);
    drop(pd);
    assert_eq!(rdma::teardown_failures(), failures);
}
