//! Unit tests of the CQ registry's pass over both queues of a QP whose
//! CQ serves both (`QpTracker::complete_both`).

use super::*;

/// A CQ that serves one QP's two queues resolves a poll's completions of
/// both in one pass, in whatever order they interleave; whatever is not
/// either queue's next request (a caller's own id, a stale completion of a
/// request released already, one that also finishes earlier requests)
/// ends the pass and resolves on its own, and the pass goes on after it.
#[test]
fn a_cq_of_one_qp_resolves_both_queues_in_one_pass() {
    let reg = Registry::default();
    let t = qp(&reg);
    // The registry learns the QP from its first completion.
    let first = pending(&t, false, 100);
    assert_eq!(reg.completion(&wc(first)).wr_id, 100);
    let s1 = quiet(&t, 1);
    let r2 = pending(&t, true, 2);
    let s3 = pending(&t, false, 3);
    let r4 = pending(&t, true, 5);
    let _unsignaled = quiet(&t, 6);
    let s7 = pending(&t, false, 7);
    let r8 = pending(&t, true, 8);
    // `s1` again after it was resolved: a stale completion (as after a
    // RESET), which must not take the entry now at the head (`s3`'s).
    let batch = [s1, r2, s1, 99, s3, r4, s7, r8];
    let mut done = Vec::new();
    reg.extend(&batch.map(wc), &mut done);
    let ids: Vec<u64> = done.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids[..2], [1, 2]);
    assert_eq!(
        decode(ids[2]).map(|(_, recv, _)| recv),
        Some(false),
        "left bare"
    );
    assert_eq!(ids[3..], [99, 3, 5, 7, 8]);
    // The unsignaled send came back with `s7`, which ended the pass.
    assert_eq!(
        done[6]
            .unsignaled
            .iter()
            .map(|(id, _)| *id)
            .collect::<Vec<_>>(),
        Vec::<u64>::new(),
        "a quiet request is not listed"
    );
    assert_eq!(t.in_flight(), (0, 0));
    assert_eq!(destroy(&reg, &t), 0);
}

/// The pass never takes an entry a poster has not published: a
/// completion of a request still being posted ends the pass, and the
/// single resolution waits for the post to publish it.
#[test]
fn a_pass_over_both_queues_stops_at_what_is_not_published() {
    let reg = Registry::default();
    let t = qp(&reg);
    let s0 = pending(&t, false, 10);
    assert_eq!(reg.completion(&wc(s0)).wr_id, 10);
    let r1 = pending(&t, true, 11);
    // A send written but not published: its producer is still open.
    // SAFETY: the test posts from one thread at a time.
    let mut p = unsafe { t.producer(false, 1) };
    let s2 = p.wr_id(0);
    p.push(Pending::memory(12, WrBuffers::None));
    std::thread::scope(|scope| {
        let poll = scope.spawn(|| {
            let mut done = Vec::new();
            reg.extend(&[wc(r1), wc(s2)], &mut done);
            done.iter().map(|c| c.wr_id).collect::<Vec<_>>()
        });
        // The poll resolves `r1`, then waits for `s2` to be published.
        while t.in_flight().1 != 0 {
            std::thread::yield_now();
        }
        drop(p);
        assert_eq!(poll.join().unwrap(), [11, 12]);
    });
    assert_eq!(t.in_flight(), (0, 0));
    assert_eq!(destroy(&reg, &t), 0);
}

/// A QP whose queues complete on two CQs is no CQ of one QP: each
/// registry resolves its own queue and leaves the other's ids bare.
#[test]
fn a_qp_on_two_cqs_is_resolved_queue_by_queue() {
    let (send, recv) = (Registry::default(), Registry::default());
    let t = QpTracker::new(serial(), &send, &recv, (4, 4));
    let s0 = pending(&t, false, 1);
    let r0 = pending(&t, true, 2);
    let s1 = pending(&t, false, 3);
    let mut done = Vec::new();
    send.extend(&[wc(s0), wc(r0), wc(s1)], &mut done);
    let ids: Vec<u64> = done.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids[0], 1);
    assert_eq!(
        ids[1],
        r0 & !(TAG | RECV),
        "not this CQ's queue: nothing of ours"
    );
    assert_eq!(ids[2], 3);
    assert_eq!(t.in_flight(), (0, 1));
    assert_eq!(recv.completion(&wc(r0)).wr_id, 2);
    assert_eq!(t.in_flight(), (0, 0));
    send.unregister(t.serial());
    assert_eq!(destroy(&recv, &t), 0);
}

/// An orphan (a dropped prepared request's memory) is released by a pass
/// over both queues that passes its last request.
#[test]
fn a_pass_over_both_queues_releases_the_orphans_it_passes() {
    let reg = Registry::default();
    let t = qp(&reg);
    let r0 = pending(&t, true, 1);
    assert_eq!(reg.completion(&wc(r0)).wr_id, 1);
    let s0 = quiet(&t, 2);
    let r1 = pending(&t, true, 3);
    let seq = decode(s0).map(|(_, _, s)| s).expect("our id");
    let memory = Arc::new(());
    let alive = Arc::downgrade(&memory);
    t.adopt(Orphan {
        recv: false,
        seq,
        keep: Box::new(memory),
    });
    assert!(alive.upgrade().is_some(), "its send is in flight");
    let mut done = Vec::new();
    reg.extend(&[wc(r1), wc(s0)], &mut done);
    assert_eq!(done.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [3, 2]);
    assert!(alive.upgrade().is_none(), "released once its send was done");
    assert_eq!(destroy(&reg, &t), 0);
}
