//! Device events through the async layer: the SRQ limit event.

use super::*;

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn device_events_report_the_srq_limit() {
    let common::SrqPair {
        ctx,
        pd,
        cq,
        srq,
        r: _r,
        mut s,
    } = common::srq_pair();
    for i in 0..8u64 {
        srq.post_recv(i, pd.alloc_mr(8, LW).unwrap()).unwrap();
    }
    srq.arm_limit(6).unwrap();
    runtime().block_on(async {
        let mut events = aio::tokio_rt::device_events(&ctx).unwrap();
        // Waiting before the limit is reached, dropped: nothing lost.
        {
            let mut f = pin!(events.srq_limit(&srq));
            assert!(poll_once(f.as_mut()).is_pending());
        }
        for i in 0..3u64 {
            s.post_send(SendWr::send(100 + i, msg(&pd, i))).unwrap();
        }
        bounded("SRQ_LIMIT_REACHED", events.srq_limit(&srq))
            .await
            .unwrap();
    });
    common::wait(&cq, 6);
    // The descriptor is blocking again: nothing pending, so a non-blocking
    // check says EAGAIN only because we ask for it.
    ctx.set_async_nonblocking(true).unwrap();
    let e = ctx.get_async_event().unwrap_err();
    assert_eq!(e.errno(), Some(libc::EAGAIN), "{e}");
}
