//! Who is woken: a completion wakes only the waiter of its CQ, a CM event only
//! the waiter of its id.

use super::*;

/// Counts its wake-ups.
struct Wakes(std::sync::atomic::AtomicUsize);
impl std::task::Wake for Wakes {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

fn counting() -> (std::sync::Arc<Wakes>, Waker) {
    let c = std::sync::Arc::new(Wakes(std::sync::atomic::AtomicUsize::new(0)));
    (std::sync::Arc::clone(&c), Waker::from(c))
}

fn wakes(c: &Wakes) -> usize {
    c.0.load(std::sync::atomic::Ordering::SeqCst)
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn an_event_wakes_only_the_waiter_of_its_cq() {
    let mut l = looped(|_| {});
    let idle = l.pd.context().create_cq(16, Some(&l.channel), 0).unwrap();
    runtime().block_on(async {
        let driver = CqChannel::new(&l.channel, &Tokio).unwrap();
        let mut acq_a = AsyncCq::new(&driver, &l.cq_a).unwrap();
        let mut acq_b = AsyncCq::new(&driver, &l.cq_b).unwrap();
        let mut acq_idle = AsyncCq::new(&driver, &idle).unwrap();
        // A third CQ on the channel waits (armed) and never gets anything.
        let (count, waker) = counting();
        let mut idle_wait = pin!(acq_idle.next());
        let mut idle_cx = Context::from_waker(&waker);
        assert!(idle_wait.as_mut().poll(&mut idle_cx).is_pending());
        for i in 0..20u64 {
            // Both wait on the channel (armed, the task pending) before the
            // ping: their events come through the reactor.
            let mut both = pin!(async { tokio::join!(acq_b.next(), acq_a.next()) });
            assert!(futures_lite::future::poll_once(both.as_mut())
                .await
                .is_none());
            ping(&mut l, i);
            // Let the reactor see the channel: the task yields once the
            // events are there, so the runtime polls its I/O driver (had
            // the task found its completions at once, the driver would
            // never run and no waker would be woken at all).
            readable(&l.channel);
            tokio::task::yield_now().await;
            let (r, s) = bounded("a completion", both).await;
            check_recv(r.unwrap(), i);
            assert_eq!(s.unwrap().wr_id, i);
            // As an executor would: a woken waiter polls again.
            if wakes(&count) > 0 {
                assert!(idle_wait.as_mut().poll(&mut idle_cx).is_pending());
            }
        }
        assert_eq!(
            wakes(&count),
            0,
            "the idle CQ's waiter was woken by 40 events of the other CQs"
        );
    });
    drop(l);
    assert_eq!(rdma::teardown_failures(), 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn a_cm_event_wakes_only_the_waiter_of_its_id() {
    runtime().block_on(async {
        let cm = CmChannel::new(&EventChannel::new().unwrap(), &Tokio).unwrap();
        let mut listener = cm.listen(SocketAddr::new(roce_ip(), 0), 4).unwrap();
        let addr = SocketAddr::new(roce_ip(), listener.id().src_port());
        // The listener waits for a request that never comes.
        let (count, waker) = counting();
        let mut idle_wait = pin!(listener.next_event());
        let mut idle_cx = Context::from_waker(&waker);
        assert!(idle_wait.as_mut().poll(&mut idle_cx).is_pending());
        for _ in 0..5 {
            // Two events each (ADDR_RESOLVED, ROUTE_RESOLVED), of other ids.
            let mut id = cm.create_id(PortSpace::Tcp).unwrap();
            bounded("ADDR_RESOLVED", id.resolve_addr(None, addr, T))
                .await
                .unwrap();
            bounded("ROUTE_RESOLVED", id.resolve_route(T))
                .await
                .unwrap();
            if wakes(&count) > 0 {
                assert!(idle_wait.as_mut().poll(&mut idle_cx).is_pending());
            }
        }
        assert_eq!(
            wakes(&count),
            0,
            "the idle listener was woken by 10 events of other ids"
        );
    });
    assert_eq!(rdma::teardown_failures(), 0);
}
