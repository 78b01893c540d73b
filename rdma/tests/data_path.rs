//! Regressions of the safe data path (issue 20): completions resolved
//! against the right request whoever polls, extended CQs polled from several
//! threads, receives whose completions never come (a CQ dropped unpolled, a
//! RESET), each checked on the device.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use rdma::{AccessFlags, QpType, SendWr, SrqAttr, WrBuffers};

const LW: AccessFlags = AccessFlags::LOCAL_WRITE;

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn two_threads_polling_one_cq_each_get_their_own_requests() {
    // 20,000 signaled WRITEs, their completions polled by two threads at
    // once: each completion must carry its own wr_id and region, none our
    // internal id, none another request's memory.
    const N: u64 = 20_000;
    const DEPTH: u64 = 64;
    let p = common::pair_with(QpType::Rc, AccessFlags::REMOTE_WRITE | LW, |b| {
        b.max_send_wr(DEPTH as u32);
    });
    let target = p.pd.alloc_mr(64, AccessFlags::REMOTE_WRITE | LW).unwrap();
    let remote = target.remote();
    let mut a = p.a;
    let done = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let pollers: Vec<_> = (0..2)
        .map(|_| {
            let (cq, done, stop) = (p.cq.clone(), Arc::clone(&done), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut got = Vec::new();
                let mut out = Vec::new();
                while !stop.load(Ordering::Acquire) {
                    out.clear();
                    let n = cq.poll(&mut out, 4).expect("poll");
                    for c in out.drain(..) {
                        assert!(c.is_success(), "{c:?}");
                        assert!(
                            c.unsignaled.is_empty(),
                            "a signaled request came back early: {c:?}"
                        );
                        let mr = c.buffers.into_one().expect("its own region");
                        // The region is the one posted with this wr_id.
                        assert_eq!(
                            mr.to_vec()[..8],
                            c.wr_id.to_le_bytes(),
                            "wr_id {:#x}",
                            c.wr_id
                        );
                        got.push(c.wr_id);
                    }
                    done.fetch_add(n, Ordering::AcqRel);
                    if n == 0 {
                        std::thread::yield_now();
                    }
                }
                got
            })
        })
        .collect();
    let mut posted = 0u64;
    while posted < N {
        // At most DEPTH in flight: wait for the pollers to catch up.
        while posted - done.load(Ordering::Acquire) as u64 >= DEPTH {
            std::thread::yield_now();
        }
        let mut mr = p.pd.alloc_mr(8, LW).unwrap();
        mr.as_mut_slice()
            .unwrap()
            .copy_from_slice(&posted.to_le_bytes());
        a.post_send(SendWr::write(posted, mr, remote))
            .map_err(rdma::PostError::drop_buffers)
            .unwrap();
        posted += 1;
    }
    while (done.load(Ordering::Acquire) as u64) < N {
        std::thread::yield_now();
    }
    stop.store(true, Ordering::Release);
    let mut seen = HashSet::new();
    for t in pollers {
        for id in t.join().expect("poller") {
            assert!(id < N, "not one of ours: {id:#x}");
            assert!(seen.insert(id), "wr_id {id} twice");
        }
    }
    assert_eq!(seen.len() as u64, N);
    assert_eq!(a.in_flight(), (0, 0));
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn an_extended_cq_is_polled_by_two_threads_without_spurious_errors() {
    let ctx = common::open(&common::device_name());
    let cq = ctx.create_cq_ex(16, None, 0, false).unwrap();
    // Two threads poll the idle CQ: each poll waits its turn, none fails.
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let cq = cq.clone();
            std::thread::spawn(move || {
                let mut out = Vec::new();
                for _ in 0..20_000 {
                    cq.poll(&mut out, 4).expect("poll of an idle extended CQ");
                    cq.poll_one().expect("poll_one of an idle extended CQ");
                }
                out.len()
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), 0);
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn a_poll_from_the_thread_holding_a_cursor_is_refused_not_deadlocked() {
    let ctx = common::open(&common::device_name());
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq_ex(16, None, 0, false).unwrap();
    let mut qp = pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
    let gid_index = common::gid_index() as u8;
    let mut peer = pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
    common::connect(&ctx, &qp, &peer, gid_index);
    common::connect(&ctx, &peer, &qp, gid_index);
    peer.post_recv(9, pd.alloc_mr(16, LW).unwrap()).unwrap();
    qp.post_send(SendWr::send(1, pd.alloc_mr(16, LW).unwrap()))
        .unwrap();
    let cursor = loop {
        if let Some(c) = cq.start_poll().unwrap() {
            break c;
        }
        std::thread::yield_now();
    };
    let err = cq
        .poll(&mut Vec::new(), 1)
        .expect_err("the same thread's cursor is open");
    assert_eq!(err.errno(), Some(libc::EBUSY), "{err}");
    let err = cq.start_poll().expect_err("one cursor at a time");
    assert_eq!(err.errno(), Some(libc::EBUSY), "{err}");
    let first = cursor.completion().wr_id;
    drop(cursor);
    let rest = common::wait(&cq, 1);
    let mut ids = [first, rest[0].wr_id];
    ids.sort_unstable();
    assert_eq!(ids, [1, 9]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn an_srq_receive_completed_into_a_cq_dropped_unpolled_comes_back() {
    // One receive of the SRQ completes into a CQ that is dropped without
    // being polled: its memory must not stay in flight for ever, and the
    // SRQ keeps serving other QPs at the same pace.
    let ctx = common::open(&common::device_name());
    let gid_index = common::gid_index() as u8;
    let pd = ctx.alloc_pd().unwrap();
    let srq = pd
        .create_srq(SrqAttr {
            max_wr: 64,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let send_cq = ctx.create_cq(64, None, 0).unwrap();
    let lost_cq = ctx.create_cq(64, None, 0).unwrap();
    let (r1, mut s1) = srq_receiver_and_sender(&ctx, &srq, &lost_cq, &send_cq, gid_index);
    srq.post_recv(1, pd.alloc_mr(64, LW).unwrap()).unwrap();
    s1.post_send(SendWr::send(7, pd.alloc_mr(8, LW).unwrap()))
        .unwrap();
    let sent = common::wait(&send_cq, 1);
    assert!(sent[0].is_success(), "{sent:?}");
    assert_eq!(srq.in_flight(), 1);
    // The receive's completion sits in `lost_cq`, which goes unpolled.
    drop((r1, s1));
    drop(lost_cq);
    assert_eq!(
        srq.in_flight(),
        0,
        "the receive completed: its memory is back"
    );
    // Another QP keeps receiving from the SRQ.
    let recv_cq = ctx.create_cq(64, None, 0).unwrap();
    let (_receiver, mut s2) = srq_receiver_and_sender(&ctx, &srq, &recv_cq, &send_cq, gid_index);
    for i in 0..200u64 {
        srq.post_recv(1000 + i, pd.alloc_mr(64, LW).unwrap())
            .unwrap();
        s2.post_send(SendWr::send(i, pd.alloc_mr(8, LW).unwrap()))
            .unwrap();
        let got = common::wait(&recv_cq, 1);
        assert_eq!(got[0].wr_id, 1000 + i);
        assert!(matches!(got[0].buffers, WrBuffers::One(_)));
        common::wait(&send_cq, 1);
        assert_eq!(srq.in_flight(), 0);
    }
}

/// An RC QP receiving from `srq` on `recv_cq`, and a sender on `send_cq`,
/// connected to each other.
fn srq_receiver_and_sender(
    ctx: &rdma::Context,
    srq: &rdma::SharedReceiveQueue,
    recv_cq: &rdma::CompletionQueue,
    send_cq: &rdma::CompletionQueue,
    gid_index: u8,
) -> (rdma::QueuePair, rdma::QueuePair) {
    let pd = srq.pd();
    let r = pd
        .qp_builder(QpType::Rc, recv_cq, recv_cq)
        .srq(srq)
        .build()
        .unwrap();
    let s = pd.qp_builder(QpType::Rc, send_cq, send_cq).build().unwrap();
    common::connect(ctx, &r, &s, gid_index);
    common::connect(ctx, &s, &r, gid_index);
    (r, s)
}

/// Posts `n` receives of 64 bytes on `qp`, wr_ids from `first`.
fn post_receives(qp: &mut rdma::QueuePair, pd: &rdma::ProtectionDomain, first: u64, n: u64) {
    for i in first..first + n {
        qp.post_recv(i, pd.alloc_mr(64, LW).unwrap()).unwrap();
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn reset_gives_back_the_requests_it_discards() {
    let common::Pair {
        ctx,
        pd,
        cq,
        mut a,
        mut b,
        gid_index,
    } = common::pair(QpType::Rc, LW);
    post_receives(&mut a, &pd, 1, 3);
    assert_eq!(a.in_flight(), (0, 3));
    let back = a.reset().unwrap();
    assert_eq!(
        back.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert!(back.iter().all(|(_, m)| matches!(m, WrBuffers::One(_))));
    assert_eq!(a.in_flight(), (0, 0));
    // Up again: new receives complete with their own ids.
    common::connect(&ctx, &a, &b, gid_index);
    post_receives(&mut a, &pd, 10, 2);
    for i in 0..2 {
        b.post_send(SendWr::send(i, pd.alloc_mr(8, LW).unwrap()))
            .unwrap();
    }
    let mut done = common::wait(&cq, 4);
    for id in [10, 11] {
        let c = common::take(&mut done, id);
        assert!(c.is_success(), "{c:?}");
        assert!(c.unsignaled.is_empty());
    }
    assert_eq!(a.in_flight(), (0, 0));
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn modify_to_reset_releases_what_was_in_flight() {
    // Regression (issue 20, item 4): receives discarded by a RESET stayed in
    // flight for ever, and every later completion took the slow path.
    let common::Pair {
        ctx,
        pd,
        cq,
        mut a,
        mut b,
        gid_index,
    } = common::pair(QpType::Rc, LW);
    post_receives(&mut a, &pd, 1, 3);
    a.modify(rdma::QpAttr::new().state(rdma::QpState::Reset))
        .unwrap();
    assert_eq!(a.in_flight(), (0, 0));
    common::connect(&ctx, &a, &b, gid_index);
    post_receives(&mut a, &pd, 10, 1);
    b.post_send(SendWr::send(0, pd.alloc_mr(8, LW).unwrap()))
        .unwrap();
    let mut done = common::wait(&cq, 2);
    let c = common::take(&mut done, 10);
    assert!(c.unsignaled.is_empty(), "nothing older was left: {c:?}");
    assert_eq!(a.in_flight(), (0, 0));
}
