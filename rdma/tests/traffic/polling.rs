//! The polls: `poll_one`, `poll_one_into` and `poll_wc` hand back the memory of
//! signaled and unsignaled requests.

use super::*;

/// Posts three 32-byte receives on `p.b` (ids 10..13) and three sends of
/// bytes 1, 2, 3 on `p.a` (ids 20..23), signaled where `signaled(i)`.
fn three_receives_and_sends(p: &mut common::Pair, signaled: impl Fn(u64) -> bool) {
    three_receives(p, 32);
    for i in 0..3u64 {
        let m =
            p.pd.reg_mr(vec![i as u8 + 1; 32], AccessFlags::empty())
                .unwrap();
        p.a.post_send(SendWr::send(20 + i, m).signaled(signaled(i)))
            .unwrap();
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn poll_one_returns_memory_of_signaled_and_unsignaled_requests() {
    let mut p = common::pair(QpType::Rc, AccessFlags::empty());
    assert!(p.cq.poll_one().unwrap().is_none(), "a new CQ is empty");
    three_receives_and_sends(&mut p, |i| i == 2);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut done = Vec::new();
    while done.len() < 4 {
        match p.cq.poll_one().unwrap() {
            Some(c) => done.push(c.ok().unwrap()),
            None => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "lost completion: {done:?}"
                );
                std::thread::yield_now();
            }
        }
    }
    assert!(
        p.cq.poll_one().unwrap().is_none(),
        "four completions, no more"
    );
    let mut send = take(&mut done, 22);
    let ids: Vec<u64> = send.unsignaled.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, [20, 21]);
    assert_eq!(
        send.take_buffers().into_one().unwrap().to_vec(),
        vec![3u8; 32]
    );
    for i in 0..3u64 {
        let mut r = take(&mut done, 10 + i);
        assert_eq!(r.byte_len, 32);
        assert_eq!(
            r.take_buffers().into_one().unwrap().to_vec(),
            vec![i as u8 + 1; 32]
        );
    }
    assert_eq!((p.a.in_flight(), p.b.in_flight()), ((0, 0), (0, 0)));
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn poll_one_into_reuses_one_slot() {
    let mut p = common::pair(QpType::Rc, AccessFlags::empty());
    let mut slot = None;
    assert!(p.cq.poll_one_into(&mut slot).unwrap().is_none());
    assert!(slot.is_none(), "an empty CQ leaves the slot alone");
    three_receives_and_sends(&mut p, |i| i != 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // (wr_id, unsignaled ids, data of the request's memory)
    let mut seen: Vec<(u64, Vec<u64>, Vec<u8>)> = Vec::new();
    while seen.len() < 5 {
        match p.cq.poll_one_into(&mut slot).unwrap() {
            Some(c) => {
                assert!(c.is_success(), "{c:?}");
                let unsignaled = c.unsignaled.iter().map(|(id, _)| *id).collect();
                let data = c.take_buffers().into_one().unwrap().to_vec();
                seen.push((c.wr_id, unsignaled, data));
            }
            None => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "lost completion: {seen:?}"
                );
                std::thread::yield_now();
            }
        }
    }
    let last = slot.as_ref().map(|c| c.wr_id);
    assert!(p.cq.poll_one_into(&mut slot).unwrap().is_none());
    assert_eq!(
        slot.as_ref().map(|c| c.wr_id),
        last,
        "an empty CQ keeps the last completion in the slot"
    );
    seen.sort_by_key(|(id, _, _)| *id);
    let expect: Vec<(u64, Vec<u64>, Vec<u8>)> = vec![
        (10, vec![], vec![1; 32]),
        (11, vec![], vec![2; 32]),
        (12, vec![], vec![3; 32]),
        // The first send was unsignaled: its memory comes with the second's
        // completion, and the slot's list of it is cleared for the third.
        (21, vec![20], vec![2; 32]),
        (22, vec![], vec![3; 32]),
    ];
    assert_eq!(seen, expect);
    assert_eq!((p.a.in_flight(), p.b.in_flight()), ((0, 0), (0, 0)));
}

/// The compact poll: each completion's id is the caller's, resolved where
/// the provider wrote it, and the memory of the requests it finishes comes
/// back beside it, in posting order per queue (an unsignaled send's before
/// the signaled one's); a prepared request's sends add nothing.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn poll_wc_resolves_in_place_and_returns_memory_beside() {
    let mut p = common::pair(QpType::Rc, AccessFlags::REMOTE_WRITE);
    let mut wcs = [rdma::WorkCompletion::default(); 2];
    let mut memory = Vec::new();
    assert_eq!(
        p.cq.poll_wc(&mut wcs, &mut memory).unwrap(),
        0,
        "a new CQ is empty"
    );
    assert_eq!(
        p.cq.poll_wc(&mut [], &mut memory).unwrap(),
        0,
        "no room, no poll"
    );
    three_receives_and_sends(&mut p, |i| i != 0);
    let target = p.pd.alloc_mr(8, LW | AccessFlags::REMOTE_WRITE).unwrap();
    let mut write =
        p.a.prepare_send(
            SendOp::Write(target.remote()),
            SendFlags::SIGNALED,
            p.pd.reg_mr(vec![9u8; 8], AccessFlags::empty()).unwrap(),
        )
        .unwrap();
    p.a.post_prepared(&mut write, 30, 0, 8).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut seen = Vec::new();
    // At most two per poll: the batches end in the middle of the six.
    while seen.len() < 6 {
        let n = p.cq.poll_wc(&mut wcs, &mut memory).unwrap();
        for wc in &wcs[..n] {
            assert!(wc.ok().is_ok(), "{wc:?}");
            seen.push((wc.wr_id(), wc.opcode(), wc.byte_len()));
        }
        if n == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "lost completion: {seen:?}"
            );
            std::thread::yield_now();
        }
    }
    assert_eq!(
        p.cq.poll_wc(&mut wcs, &mut memory).unwrap(),
        0,
        "six, no more"
    );
    seen.sort_by_key(|s| s.0);
    let ids: Vec<u64> = seen.iter().map(|s| s.0).collect();
    assert_eq!(ids, [10, 11, 12, 21, 22, 30], "the callers' ids");
    assert!(seen[..3].iter().all(|s| s.1 == WcOpcode::Recv && s.2 == 32));
    assert_eq!(seen[5].1, WcOpcode::RdmaWrite);
    let back: Vec<(u64, Vec<u8>)> = memory
        .drain(..)
        .map(|(id, b)| (id, b.into_one().unwrap().to_vec()))
        .collect();
    let sends: Vec<_> = back.iter().filter(|(id, _)| *id >= 20).cloned().collect();
    assert_eq!(
        sends,
        [(20, vec![1; 32]), (21, vec![2; 32]), (22, vec![3; 32])],
        "each send's memory, the unsignaled one first; none for the prepared WRITE"
    );
    let mut recvs: Vec<_> = back.into_iter().filter(|(id, _)| *id < 20).collect();
    recvs.sort_by_key(|r| r.0);
    assert_eq!(
        recvs,
        [(10, vec![1; 32]), (11, vec![2; 32]), (12, vec![3; 32])]
    );
    let mut now = [0u8; 8];
    target.read_at(0, &mut now).unwrap();
    assert_eq!(now, [9; 8], "the prepared WRITE landed");
    assert_eq!((p.a.in_flight(), p.b.in_flight()), ((0, 0), (0, 0)));
}
