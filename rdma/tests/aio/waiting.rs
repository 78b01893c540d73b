//! Waiting for room and for completions: a post that waits for room in a full
//! send queue (and posts nothing when dropped), the blocking wait with a timeout,
//! and the unbounded wait that sleeps in the channel's read.

use super::*;

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn posting_waits_for_room_in_a_full_send_queue() {
    const N: u64 = 64;
    let mut l = looped(|b| {
        b.max_send_wr(4).max_recv_wr(N as u32);
    });
    let depth = l.a.caps().max_send_wr as usize;
    assert!(
        depth < N as usize,
        "the provider gave a send queue of {depth}"
    );
    for i in 0..N {
        l.b.post_recv(i, l.pd.alloc_mr(8, LW).unwrap()).unwrap();
    }
    runtime().block_on(async {
        let driver = CqChannel::new(&l.channel, &Tokio).unwrap();
        let mut acq_a = AsyncCq::new(&driver, &l.cq_a).unwrap();
        let mut acq_b = AsyncCq::new(&driver, &l.cq_b).unwrap();
        let mut waited = 0;
        for i in 0..N {
            if l.a.in_flight().0 >= depth {
                waited += 1;
            }
            bounded(
                "room in the send queue",
                acq_a.post_send(&mut l.a, SendWr::send(i, msg(&l.pd, i))),
            )
            .await
            .map_err(rdma::PostError::drop_buffers)
            .unwrap();
            assert!(l.a.in_flight().0 <= depth);
        }
        assert!(
            waited > 0,
            "the queue never filled: the test proves nothing"
        );
        // The completions polled to make room wait in the AsyncCq, in order.
        for i in 0..N {
            let c = bounded("a send completion", acq_a.next()).await.unwrap();
            assert_eq!((c.wr_id, c.status), (i, WcStatus::Success));
        }
        for i in 0..N {
            check_recv(bounded("a receive", acq_b.next()).await.unwrap(), i);
        }
    });
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn blocking_wait_times_out_then_gets_the_completion() {
    let mut l = looped(|_| {});
    let t = Duration::from_millis(200);
    let start = Instant::now();
    assert!(l.cq_b.wait(Some(t)).unwrap().is_none());
    assert!(start.elapsed() >= t, "returned after {:?}", start.elapsed());
    ping(&mut l, 7);
    let c = l.cq_b.wait(Some(Duration::from_secs(10))).unwrap();
    check_recv(c.expect("the receive within 10 s"), 7);
    let s = l.cq_a.wait(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(s.expect("the send within 10 s").wr_id, 7);
    // Many waits, each with an event: acknowledged in batches and at the end.
    for i in 0..40 {
        ping(&mut l, i);
        check_recv(
            l.cq_b.wait(Some(Duration::from_secs(10))).unwrap().unwrap(),
            i,
        );
        assert_eq!(
            l.cq_a
                .wait(Some(Duration::from_secs(10)))
                .unwrap()
                .unwrap()
                .wr_id,
            i
        );
    }
    drop(l);
    assert_eq!(rdma::teardown_failures(), 0);
}

/// The state letter of thread `tid` of this process (`/proc`), `?` when
/// unreadable.
fn thread_state(tid: i64) -> char {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().and_then(|r| r.trim().chars().next()))
        .unwrap_or('?')
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn wait_until_without_a_bound_sleeps_in_the_channel_read_and_wakes_with_the_completion() {
    let mut l = looped(|_| {});
    let cq = l.cq_b.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let waiter = s.spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() } as i64).unwrap();
            let mut polls = 0;
            let mut slot = None;
            let got = cq
                .wait_until(None, || -> rdma::Result<Option<u64>> {
                    polls += 1;
                    Ok(cq.poll_one_into(&mut slot)?.map(|c| c.wr_id))
                })
                .unwrap();
            (got, polls, slot)
        });
        let tid = rx.recv().unwrap();
        // The waiter blocks in the channel's read (state S) before the ping.
        let start = Instant::now();
        while thread_state(tid) != 'S' {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the waiter never slept"
            );
            std::thread::yield_now();
        }
        ping(&mut l, 5);
        let (got, polls, slot) = waiter.join().unwrap();
        assert_eq!(got, Some(5));
        assert!(
            polls >= 3,
            "poll, arm, poll again, sleep, poll: {polls} polls"
        );
        check_recv(slot.unwrap(), 5);
    });
    drop(l);
    assert_eq!(rdma::teardown_failures(), 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn a_dropped_post_waiting_for_room_posts_nothing_and_frees_its_memory() {
    let mut l = looped(|b| {
        b.max_send_wr(2).max_recv_wr(16);
    });
    let depth = l.a.caps().max_send_wr as usize;
    runtime().block_on(async {
        let driver = CqChannel::new(&l.channel, &Tokio).unwrap();
        let mut acq_a = AsyncCq::new(&driver, &l.cq_a).unwrap();
        let mut acq_b = AsyncCq::new(&driver, &l.cq_b).unwrap();
        // No receive at b yet: the sends wait in RNR retries (rxe retries
        // forever with RNR retry 7), so the send queue stays full.
        for i in 0..depth as u64 {
            l.a.post_send(SendWr::send(i, msg(&l.pd, i))).unwrap();
        }
        assert_eq!(l.a.in_flight().0, depth);
        let shared = std::sync::Arc::new(l.pd.reg_mr(vec![9; 8], AccessFlags::empty()).unwrap());
        {
            let wr = SendWr::send(99, rdma::WrBuffers::Shared(std::sync::Arc::clone(&shared)));
            let mut f = pin!(acq_a.post_send(&mut l.a, wr));
            assert!(poll_once(f.as_mut()).is_pending(), "the send queue is full");
        }
        // Dropped while waiting for room: not posted, and the request's
        // reference to the memory went with the future.
        assert_eq!(l.a.in_flight().0, depth);
        assert_eq!(std::sync::Arc::strong_count(&shared), 1);
        // send_room owns nothing: dropped at its await point, nothing moves.
        {
            let mut f = pin!(acq_a.send_room(&l.a));
            assert!(poll_once(f.as_mut()).is_pending());
        }
        for i in 0..depth as u64 {
            l.b.post_recv(i, l.pd.alloc_mr(8, LW).unwrap()).unwrap();
        }
        for i in 0..depth as u64 {
            let c = bounded("a send after RNR", acq_a.next()).await.unwrap();
            assert_eq!((c.wr_id, c.status), (i, WcStatus::Success));
        }
        for i in 0..depth as u64 {
            check_recv(bounded("a receive", acq_b.next()).await.unwrap(), i);
        }
        // Room again: the same memory posts at once.
        l.b.post_recv(99, l.pd.alloc_mr(8, LW).unwrap()).unwrap();
        let wr = SendWr::send(99, rdma::WrBuffers::Shared(std::sync::Arc::clone(&shared)));
        bounded("a post with room", acq_a.post_send(&mut l.a, wr))
            .await
            .map_err(rdma::PostError::drop_buffers)
            .unwrap();
        let c = bounded("its completion", acq_a.next()).await.unwrap();
        assert_eq!(c.wr_id, 99);
        drop(c);
        assert_eq!(std::sync::Arc::strong_count(&shared), 1);
    });
    drop(l);
    assert_eq!(rdma::teardown_failures(), 0);
}
