//! Completions through the async CQ: many CQs on one channel, and each way of
//! taking them (`next`, `next_into`, `batch`, `batch_wc`, `try_batch_wc`) with a
//! wait dropped half-way that loses nothing.

use super::*;

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn two_cqs_on_one_channel_each_get_their_own_completions_past_the_ack_batch() {
    let mut l = looped(|_| {});
    runtime().block_on(async {
        let driver = CqChannel::new(&l.channel, &Tokio).unwrap();
        let mut acq_a = AsyncCq::new(&driver, &l.cq_a).unwrap();
        let mut acq_b = AsyncCq::new(&driver, &l.cq_b).unwrap();
        // 150 round trips, each waited for: more events per CQ than one
        // acknowledgement batch (64).
        for i in 0..150u64 {
            ping(&mut l, i);
            let (r, s) = bounded("a completion", async {
                tokio::join!(acq_b.next(), acq_a.next())
            })
            .await;
            check_recv(r.unwrap(), i);
            let s = s.unwrap();
            assert_eq!(
                (s.wr_id, s.opcode, s.status),
                (i, WcOpcode::Send, WcStatus::Success)
            );
        }
    });
    // Everything dropped: the CQs were destroyed with every event
    // acknowledged (or ibv_destroy_cq would have hung until the timeout).
    drop(l);
    assert_eq!(rdma::teardown_failures(), 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn a_dropped_wait_loses_no_completion() {
    let mut l = looped(|_| {});
    runtime().block_on(async {
        let driver = CqChannel::new(&l.channel, &Tokio).unwrap();
        let mut acq_b = AsyncCq::new(&driver, &l.cq_b).unwrap();
        // Await point 1: waiting, CQ armed, nothing posted. Dropped there.
        {
            let mut f = pin!(acq_b.next());
            assert!(poll_once(f.as_mut()).is_pending());
        }
        ping(&mut l, 1);
        // The event arrives while no future exists.
        readable(&l.channel);
        let c = bounded("the completion after a dropped wait", acq_b.next()).await;
        check_recv(c.unwrap(), 1);
        // Await point 2: a future that read the event (the channel drained)
        // but is dropped before it polled the CQ again: the event is noted
        // in the AsyncCq's entry, so the next wait does not sleep forever.
        {
            let mut f = pin!(acq_b.next());
            assert!(poll_once(f.as_mut()).is_pending());
            ping(&mut l, 2);
            readable(&l.channel);
        }
        let c = bounded("the completion of the second ping", acq_b.next()).await;
        check_recv(c.unwrap(), 2);
    });
    // The sends' completions were never awaited; they go with their CQ.
    drop(l);
    assert_eq!(rdma::teardown_failures(), 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn next_into_fills_the_callers_slot_and_a_dropped_wait_loses_nothing() {
    let mut l = looped(|_| {});
    runtime().block_on(async {
        let driver = CqChannel::new(&l.channel, &Tokio).unwrap();
        let mut acq_a = AsyncCq::new(&driver, &l.cq_a).unwrap();
        let mut acq_b = AsyncCq::new(&driver, &l.cq_b).unwrap();
        let (mut rslot, mut sslot) = (None, None);
        // Dropped while waiting (CQ armed, nothing posted): the slot is
        // left alone and the completion comes with the next wait.
        {
            let mut f = pin!(acq_b.next_into(&mut rslot));
            assert!(poll_once(f.as_mut()).is_pending());
        }
        assert!(rslot.is_none());
        for i in 0..40u64 {
            ping(&mut l, i);
            let c = bounded("a receive", acq_b.next_into(&mut rslot))
                .await
                .unwrap();
            assert_eq!((c.wr_id, c.opcode), (i, WcOpcode::Recv));
            let buf = c.take_buffers().into_one().unwrap();
            assert_eq!(buf.to_vec(), i.to_be_bytes());
            let s = bounded("a send", acq_a.next_into(&mut sslot))
                .await
                .unwrap();
            assert_eq!((s.wr_id, s.status), (i, WcStatus::Success));
            // The send's region stays in the slot until the next completion
            // replaces it.
            assert!(!s.buffers.is_empty());
        }
    });
    drop(l);
    assert_eq!(rdma::teardown_failures(), 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn batch_appends_at_most_max_in_order_and_a_dropped_wait_loses_nothing() {
    let mut l = looped(|_| {});
    runtime().block_on(async {
        let driver = CqChannel::new(&l.channel, &Tokio).unwrap();
        let mut acq_b = AsyncCq::new(&driver, &l.cq_b).unwrap();
        // What `out` holds already stays in front of what a batch appends.
        let mut out = Vec::new();
        assert_eq!(
            bounded("an empty batch", acq_b.batch(&mut out, 0))
                .await
                .unwrap(),
            0
        );
        // Dropped while waiting (CQ armed, nothing posted): `out` is left
        // alone and the completions come with the next waits.
        {
            let mut f = pin!(acq_b.batch(&mut out, 4));
            assert!(poll_once(f.as_mut()).is_pending());
        }
        assert!(out.is_empty());
        const N: u64 = 40;
        for i in 0..N {
            ping(&mut l, i);
        }
        let mut batches = 0;
        while (out.len() as u64) < N {
            let before = out.len();
            let n = bounded("a batch", acq_b.batch(&mut out, 3)).await.unwrap();
            assert!((1..=3).contains(&n), "{n}");
            assert_eq!(out.len(), before + n);
            batches += 1;
        }
        assert!(batches >= N / 3, "{batches} batches of at most 3");
        for (i, c) in out.into_iter().enumerate() {
            check_recv(c, i as u64);
        }
        assert_eq!(acq_b.buffered(), 0);
    });
    drop(l);
    assert_eq!(rdma::teardown_failures(), 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn batch_wc_fills_the_callers_array_and_a_dropped_wait_loses_nothing() {
    let mut l = looped(|_| {});
    runtime().block_on(async {
        let driver = CqChannel::new(&l.channel, &Tokio).unwrap();
        let mut acq_b = AsyncCq::new(&driver, &l.cq_b).unwrap();
        let mut wcs = [rdma::WorkCompletion::default(); 3];
        let mut memory = Vec::new();
        assert_eq!(
            bounded("an empty batch", acq_b.batch_wc(&mut [], &mut memory))
                .await
                .unwrap(),
            0
        );
        // Dropped while waiting (CQ armed, nothing posted): both are left
        // alone and the completions come with the next waits.
        {
            let mut f = pin!(acq_b.batch_wc(&mut wcs, &mut memory));
            assert!(poll_once(f.as_mut()).is_pending());
        }
        assert!(memory.is_empty());
        const N: u64 = 40;
        for i in 0..N {
            ping(&mut l, i);
        }
        let mut ids = Vec::new();
        while (ids.len() as u64) < N {
            let n = bounded("a batch", acq_b.batch_wc(&mut wcs, &mut memory))
                .await
                .unwrap();
            assert!((1..=3).contains(&n), "{n}");
            for wc in &wcs[..n] {
                assert!(wc.is_success(), "{wc:?}");
                assert_eq!(wc.opcode(), WcOpcode::Recv);
                ids.push(wc.wr_id());
            }
            assert_eq!(memory.len(), ids.len(), "one region per receive");
        }
        assert_eq!(ids, (0..N).collect::<Vec<_>>());
        for (i, (id, b)) in memory.into_iter().enumerate() {
            assert_eq!(id, i as u64);
            assert_eq!(b.into_one().unwrap().to_vec(), id.to_be_bytes());
        }
        assert_eq!(acq_b.buffered(), 0);
    });
    drop(l);
    assert_eq!(rdma::teardown_failures(), 0);
}

/// `try_batch_wc` takes what is there without waiting: 0 from an empty
/// CQ (armed or not), the completion once it came; the arm it leaves alone
/// does not keep the next waits from getting theirs.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn try_batch_wc_takes_what_is_there_and_leaves_the_wait_working() {
    let mut l = looped(|_| {});
    runtime().block_on(async {
        let driver = CqChannel::new(&l.channel, &Tokio).unwrap();
        let mut acq_b = AsyncCq::new(&driver, &l.cq_b).unwrap();
        let mut wcs = [rdma::WorkCompletion::default(); 4];
        let mut memory = Vec::new();
        assert_eq!(acq_b.try_batch_wc(&mut wcs, &mut memory).unwrap(), 0);
        // A wait dropped at its await point: the CQ is armed.
        {
            let mut f = pin!(acq_b.batch_wc(&mut wcs, &mut memory));
            assert!(poll_once(f.as_mut()).is_pending());
        }
        assert_eq!(acq_b.try_batch_wc(&mut wcs, &mut memory).unwrap(), 0);
        ping(&mut l, 0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let n = loop {
            let n = acq_b.try_batch_wc(&mut wcs, &mut memory).unwrap();
            if n > 0 {
                break n;
            }
            assert!(std::time::Instant::now() < deadline, "lost completion");
            tokio::task::yield_now().await;
        };
        assert_eq!(n, 1);
        assert!(wcs[0].is_success(), "{:?}", wcs[0]);
        assert_eq!((wcs[0].wr_id(), wcs[0].opcode()), (0, WcOpcode::Recv));
        assert_eq!(memory.len(), 1, "the receive's region");
        // The event of that completion (the CQ was armed) is noted; the
        // next wait polls, arms again and gets the next completion.
        ping(&mut l, 1);
        let n = bounded(
            "a wait after try_batch_wc",
            acq_b.batch_wc(&mut wcs, &mut memory),
        )
        .await
        .unwrap();
        assert_eq!((n, wcs[0].wr_id()), (1, 1));
        ping(&mut l, 2);
        let n = bounded("a wait that sleeps", acq_b.batch_wc(&mut wcs, &mut memory))
            .await
            .unwrap();
        assert_eq!((n, wcs[0].wr_id()), (1, 2));
        assert_eq!(memory.len(), 3);
        assert_eq!(acq_b.buffered(), 0);
    });
    drop(l);
    assert_eq!(rdma::teardown_failures(), 0);
}
