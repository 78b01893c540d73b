//! Misuse of the async layer is an error that says which, never a hang.

use super::*;

fn assert_async_error(e: &Error, errno: i32, says: &str) {
    assert!(matches!(e, Error::Async { .. }), "{e:?}");
    assert_eq!(e.errno(), Some(errno), "{e}");
    assert!(e.to_string().contains(says), "{e}");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn misuse_is_an_error_that_says_which_never_a_hang() {
    let ctx = common::open(&common::device_name());
    let channel = ctx.create_comp_channel().unwrap();
    let other_channel = ctx.create_comp_channel().unwrap();
    let bare = ctx.create_cq(16, None, 0).unwrap();
    let cq = ctx.create_cq(16, Some(&channel), 0).unwrap();
    let foreign = ctx.create_cq(16, Some(&other_channel), 0).unwrap();
    // Blocking wait on a CQ without a channel.
    let e = bare.wait(Some(Duration::from_millis(1))).unwrap_err();
    assert_async_error(&e, libc::EINVAL, "without a completion channel");
    // A channel of another context.
    let ctx2 = common::open(&common::device_name());
    let e = ctx2.create_cq(16, Some(&channel), 0).unwrap_err();
    assert!(e.to_string().contains("belongs to another context"), "{e}");
    runtime().block_on(async {
        let driver = CqChannel::new(&channel, &Tokio).unwrap();
        let e = AsyncCq::new(&driver, &bare).unwrap_err();
        assert_async_error(&e, libc::EINVAL, "without a completion channel");
        let e = AsyncCq::new(&driver, &foreign).unwrap_err();
        assert_async_error(&e, libc::EINVAL, "another completion channel");
        let e = aio::tokio_rt::completions(&bare).unwrap_err();
        assert_async_error(&e, libc::EINVAL, "without a completion channel");
        let first = AsyncCq::new(&driver, &cq).unwrap();
        let e = AsyncCq::new(&driver, &cq).unwrap_err();
        assert_async_error(&e, libc::EBUSY, "already has an AsyncCq");
        drop(first);
        // Mixing blocking and async waits on the channel.
        let e = cq.wait(Some(Duration::from_millis(1))).unwrap_err();
        assert_async_error(&e, libc::EBUSY, "driven by an rdma::aio::CqChannel");
        let e = channel.get_event().unwrap_err();
        assert_async_error(&e, libc::EBUSY, "driven by an rdma::aio::CqChannel");
        let e = CqChannel::new(&channel, &Tokio).unwrap_err();
        assert_async_error(&e, libc::EBUSY, "driven by an rdma::aio::CqChannel");
        drop(driver);
        // Released with the driver: the blocking wait works again.
        assert!(cq.wait(Some(Duration::from_millis(1))).unwrap().is_none());
        // The CM channel: one reader.
        let ev = EventChannel::new().unwrap();
        let cm = CmChannel::new(&ev, &Tokio).unwrap();
        let e = ev.try_get_event().unwrap_err();
        assert_async_error(&e, libc::EBUSY, "driven by an rdma::aio::CmChannel");
        let e = ev.get_event_timeout(Duration::from_millis(1)).unwrap_err();
        assert_async_error(&e, libc::EBUSY, "driven by an rdma::aio::CmChannel");
        let other = EventChannel::new().unwrap();
        let id = other.create_id(PortSpace::Tcp).unwrap();
        let e = cm.register(&id).unwrap_err();
        assert_async_error(&e, libc::EINVAL, "another event channel");
        drop(cm);
        assert!(ev.try_get_event().unwrap().is_none());
    });
    // The tokio adapter outside a runtime.
    let e = CqChannel::new(&channel, &Tokio).unwrap_err();
    assert_async_error(&e, libc::ENXIO, "outside a tokio runtime");
    let e = aio::tokio_rt::cm_channel().unwrap_err();
    assert_async_error(&e, libc::ENXIO, "outside a tokio runtime");
    // ... which released its claim: the blocking wait still works.
    assert!(cq.wait(Some(Duration::from_millis(1))).unwrap().is_none());
}
