//! Completions shared: posts and polls on different threads, and many QPs on one
//! pair of CQs, each completion returning its own QP's memory.

use super::*;

/// Posting and polling on different threads: one thread posts receives on
/// `b`, another posts sends on `a` (every fourth signaled), and the main
/// thread polls the shared CQ and hands the memory back to its poster. A
/// completion can be polled before the post that caused it has returned;
/// every one must still come back with its request's memory, in order, and
/// the receives with the data sent.
fn posts_and_polls_on_different_threads(path: PostPath) {
    use std::sync::mpsc;
    use std::time::{Duration, Instant};
    const N: u64 = 3000;
    const POOL: usize = 24;
    const SIZE: usize = 64;
    let mut p = common::pair_with(QpType::Rc, AccessFlags::empty(), |b| {
        b.post_path(path).max_send_wr(64).max_recv_wr(64);
    });
    let (pd, cq, a, b) = (&p.pd, &p.cq, &mut p.a, &mut p.b);
    let deadline = Instant::now() + Duration::from_secs(60);
    let (credit_tx, credit_rx) = mpsc::channel::<()>();
    let (send_back, send_pool) = mpsc::channel::<rdma::MemoryRegion>();
    let (recv_back, recv_pool) = mpsc::channel::<rdma::MemoryRegion>();
    for _ in 0..POOL {
        send_back
            .send(pd.alloc_mr(SIZE, AccessFlags::empty()).unwrap())
            .unwrap();
        recv_back.send(pd.alloc_mr(SIZE, LW).unwrap()).unwrap();
    }
    std::thread::scope(|s| {
        s.spawn(move || {
            for i in 0..N {
                let m = recv_pool
                    .recv_timeout(Duration::from_secs(30))
                    .expect("receive buffer back");
                b.post_recv(i, m).unwrap();
                credit_tx.send(()).unwrap();
            }
        });
        s.spawn(move || {
            for i in 0..N {
                credit_rx
                    .recv_timeout(Duration::from_secs(30))
                    .expect("a receive posted");
                let mut m = send_pool
                    .recv_timeout(Duration::from_secs(30))
                    .expect("send buffer back");
                m.as_mut_slice().unwrap().fill(i as u8);
                m.as_mut_slice().unwrap()[..8].copy_from_slice(&i.to_le_bytes());
                let signaled = i % 4 == 3 || i == N - 1;
                a.post_send(SendWr::send(1_000_000 + i, m).signaled(signaled))
                    .unwrap();
            }
        });
        let (mut sent, mut received) = (0u64, 0u64);
        while sent < N || received < N {
            let Some(mut c) = cq.poll_one().unwrap() else {
                assert!(
                    Instant::now() < deadline,
                    "lost completion: {sent} sent, {received} received"
                );
                std::thread::yield_now();
                continue;
            };
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            if c.opcode == WcOpcode::Recv {
                assert_eq!(c.wr_id, received, "receives complete in order");
                assert_eq!(c.byte_len as usize, SIZE);
                let m = c.take_buffers().into_one().expect("the receive's memory");
                let data = m.to_vec();
                assert_eq!(
                    data[..8],
                    received.to_le_bytes(),
                    "the data of send {received}"
                );
                assert!(data[8..].iter().all(|&x| x == received as u8));
                received += 1;
                // The poster may be done; a closed channel is fine then.
                let _ = recv_back.send(m);
            } else {
                let unsignaled: Vec<(u64, rdma::WrBuffers)> = std::mem::take(&mut c.unsignaled);
                for (id, bufs) in unsignaled.into_iter().chain([(c.wr_id, c.take_buffers())]) {
                    assert_eq!(id, 1_000_000 + sent, "sends complete in order");
                    let _ = send_back.send(bufs.into_one().expect("the send's memory"));
                    sent += 1;
                }
            }
        }
    });
    assert_eq!((p.a.in_flight(), p.b.in_flight()), ((0, 0), (0, 0)));
    assert!(
        p.cq.poll_one().unwrap().is_none(),
        "no completion left over"
    );
}

/// One round of SEND traffic over every live pair: a 64-byte receive on
/// each receiver (id 1000 + i), then a send from each sender (id i, bytes
/// `pattern(64, seed + i)`) in an order that interleaves the QPs; every
/// completion must come back on the shared CQs with its own QP's memory.
fn send_round(
    pd: &rdma::ProtectionDomain,
    cqs: (&rdma::CompletionQueue, &rdma::CompletionQueue),
    pairs: &mut [Option<(rdma::QueuePair, rdma::QueuePair)>],
    seed: u8,
) {
    let live: Vec<usize> = (0..pairs.len()).filter(|&i| pairs[i].is_some()).collect();
    for &i in &live {
        let (_, b) = pairs[i].as_mut().unwrap();
        b.post_recv(1000 + i as u64, pd.alloc_mr(64, LW).unwrap())
            .unwrap();
    }
    // 7 is prime to the pair count: every pair once, neighbours apart.
    for k in 0..pairs.len() {
        let i = (k * 7) % pairs.len();
        if let Some((a, _)) = pairs[i].as_mut() {
            let m = pd
                .reg_mr(
                    pattern(64, seed.wrapping_add(i as u8)),
                    AccessFlags::empty(),
                )
                .unwrap();
            a.post_send(SendWr::send(i as u64, m)).unwrap();
        }
    }
    let check = |c: &mut rdma::Completion, qp: &rdma::QueuePair, i: usize| {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        assert_eq!(
            c.qp_num,
            qp.qp_num(),
            "{:?} {i} reports its own QP",
            c.opcode
        );
        let m = c.take_buffers().into_one().expect("the buffer comes back");
        assert_eq!(
            m.as_slice().unwrap(),
            &pattern(64, seed.wrapping_add(i as u8))[..]
        );
    };
    for mut c in wait(cqs.0, live.len()) {
        let i = c.wr_id as usize;
        check(&mut c, &pairs[i].as_ref().expect("a live sender").0, i);
    }
    for mut c in wait(cqs.1, live.len()) {
        let i = (c.wr_id - 1000) as usize;
        assert_eq!(c.byte_len, 64, "receive {i}");
        check(&mut c, &pairs[i].as_ref().expect("a live receiver").1, i);
    }
    for (a, b) in pairs.iter().flatten() {
        assert_eq!((a.in_flight(), b.in_flight()), ((0, 0), (0, 0)));
    }
}

/// Many connections on one send CQ and one receive CQ, as a server keeps
/// them: completions of all QPs interleave and each returns its own QP's
/// memory; QPs dropped between rounds leave the others' completions intact.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn many_qps_share_one_cq_and_each_completion_returns_its_memory() {
    const PAIRS: usize = 48;
    let ctx = common::open(&common::device_name());
    let pd = ctx.alloc_pd().unwrap();
    let send_cq = ctx.create_cq(256, None, 0).unwrap();
    let recv_cq = ctx.create_cq(256, None, 0).unwrap();
    let gid_index = u8::try_from(common::gid_index()).unwrap();
    let builder = pd.qp_builder(QpType::Rc, &send_cq, &recv_cq);
    let mut pairs: Vec<Option<(rdma::QueuePair, rdma::QueuePair)>> = (0..PAIRS)
        .map(|_| {
            let (a, b) = (builder.build().unwrap(), builder.build().unwrap());
            common::connect(&ctx, &a, &b, gid_index);
            common::connect(&ctx, &b, &a, gid_index);
            Some((a, b))
        })
        .collect();
    send_round(&pd, (&send_cq, &recv_cq), &mut pairs, 1);
    // Every third connection goes away; the rest carry on.
    for slot in pairs.iter_mut().step_by(3) {
        *slot = None;
    }
    send_round(&pd, (&send_cq, &recv_cq), &mut pairs, 101);
    assert_eq!(pairs.iter().flatten().count(), PAIRS - PAIRS.div_ceil(3));
}

both_paths!(posts_and_polls_on_different_threads);
