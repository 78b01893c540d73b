//! Memory windows, type 1 and 2: bind, remote access through the window,
//! invalidate (rdma-core's tests/test_mr.py memory-window cases).

mod common;

use rdma::{AccessFlags, MwType, PostPath, QpType, SendWr, WcOpcode, WcStatus};

const LW: AccessFlags = AccessFlags::LOCAL_WRITE;

fn pair(path: PostPath) -> common::Pair {
    let access = LW | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::MW_BIND;
    common::pair_with(QpType::Rc, access, |b| {
        b.post_path(path);
    })
}

fn window_traffic(mw_type: MwType, path: PostPath) {
    let mut p = pair(path);
    let mr = p.pd.alloc_mr(4096, LW | AccessFlags::MW_BIND).unwrap();
    let mut mw = p.pd.alloc_mw(mw_type).unwrap();
    assert_eq!(mw.mw_type(), mw_type);
    let access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let remote = p.b.bind_mw(7, &mut mw, &mr, 1024, 512, access).unwrap();
    assert_eq!(remote.addr, mr.addr() + 1024);
    assert_eq!(remote.len, 512);
    assert_eq!(remote.rkey, mw.rkey());
    let bind = common::wait(&p.cq, 1).pop().unwrap();
    assert_eq!(
        (bind.wr_id, bind.status, bind.opcode),
        (7, WcStatus::Success, WcOpcode::BindMw),
        "{bind:?}"
    );

    // RDMA WRITE through the window lands in the region.
    let src = p.pd.reg_mr(vec![0x5a; 512], AccessFlags::empty()).unwrap();
    p.a.post_send(SendWr::write(1, src, remote)).unwrap();
    common::wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    let mut got = vec![0; 512];
    mr.read_at(1024, &mut got).unwrap();
    assert_eq!(got, vec![0x5a; 512]);
    assert!(
        mr.as_slice().is_err(),
        "a window-bindable region has no safe view"
    );

    // (Accesses outside the window are the device's to refuse; rxe on Linux
    // 6.1 checks them against the region only. The crate never exposes a
    // window-bindable region as a safe slice, whatever the device enforces.)
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn type1_window_grants_exactly_its_range() {
    window_traffic(MwType::Type1, PostPath::Legacy);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn type2_window_grants_exactly_its_range_legacy() {
    window_traffic(MwType::Type2, PostPath::Legacy);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn type2_window_grants_exactly_its_range_extended() {
    window_traffic(MwType::Type2, PostPath::Extended);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn type2_window_local_invalidate() {
    let mut p = pair(PostPath::Auto);
    let mr = p.pd.alloc_mr(256, LW | AccessFlags::MW_BIND).unwrap();
    let mut mw = p.pd.alloc_mw(MwType::Type2).unwrap();
    let remote =
        p.b.bind_mw(1, &mut mw, &mr, 0, 256, AccessFlags::REMOTE_WRITE)
            .unwrap();
    common::wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    p.b.post_send(SendWr::local_invalidate(2, remote.rkey))
        .unwrap();
    let c = common::wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    assert_eq!(c.opcode, WcOpcode::LocalInv);
    let src = p.pd.reg_mr(vec![3; 16], AccessFlags::empty()).unwrap();
    p.a.post_send(SendWr::write(3, src, remote.slice(0, 16).unwrap()))
        .unwrap();
    let c = common::wait(&p.cq, 1).pop().unwrap();
    assert_eq!(
        c.status,
        WcStatus::RemAccessErr,
        "an invalidated window: {c:?}"
    );
    assert_eq!(mr.to_vec(), vec![0; 256]);
}

/// One type 2 window bound, invalidated and bound again, many times (as a
/// pool of windows is used): each binding reaches the region under a fresh
/// rkey, and the rkeys before it reach nothing.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn type2_window_bound_again_after_invalidate() {
    let mut p = pair(PostPath::Auto);
    let mr = p.pd.alloc_mr(256, LW | AccessFlags::MW_BIND).unwrap();
    let mut mw = p.pd.alloc_mw(MwType::Type2).unwrap();
    let mut old = Vec::new();
    for round in 0..4u8 {
        let remote =
            p.b.bind_mw(10, &mut mw, &mr, 0, 256, AccessFlags::REMOTE_WRITE)
                .unwrap_or_else(|e| panic!("bind {round}: {e}"));
        let c = common::wait(&p.cq, 1).pop().unwrap();
        assert_eq!(c.status, WcStatus::Success, "bind {round}: {c:?}");
        assert!(!old.contains(&remote.rkey), "a fresh rkey each binding");
        let src = p.pd.reg_mr(vec![round; 16], AccessFlags::empty()).unwrap();
        p.a.post_send(SendWr::write(11, src, remote.slice(0, 16).unwrap()))
            .unwrap();
        common::wait(&p.cq, 1).pop().unwrap().ok().unwrap();
        let mut got = [0; 16];
        mr.read_at(0, &mut got).unwrap();
        assert_eq!(got, [round; 16], "write through binding {round}");
        p.b.post_send(SendWr::local_invalidate(12, remote.rkey))
            .unwrap();
        let c = common::wait(&p.cq, 1).pop().unwrap();
        assert_eq!(
            (c.status, c.opcode),
            (WcStatus::Success, WcOpcode::LocalInv),
            "{c:?}"
        );
        old.push(remote.rkey);
    }
    // The last rkey, invalidated, reaches nothing.
    let last =
        p.b.bind_mw(13, &mut mw, &mr, 0, 256, AccessFlags::REMOTE_WRITE);
    let last = last.unwrap();
    common::wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    p.b.post_send(SendWr::local_invalidate(14, last.rkey))
        .unwrap();
    common::wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    let src = p.pd.reg_mr(vec![0xff; 16], AccessFlags::empty()).unwrap();
    p.a.post_send(SendWr::write(15, src, last.slice(0, 16).unwrap()))
        .unwrap();
    let c = common::wait(&p.cq, 1).pop().unwrap();
    assert_eq!(c.status, WcStatus::RemAccessErr, "{c:?}");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn bind_input_is_checked() {
    let mut p = pair(PostPath::Auto);
    let mut mw = p.pd.alloc_mw(MwType::Type1).unwrap();
    let plain = p.pd.alloc_mr(64, LW).unwrap();
    let err =
        p.b.bind_mw(1, &mut mw, &plain, 0, 64, AccessFlags::REMOTE_READ)
            .unwrap_err();
    assert!(err.to_string().contains("MW_BIND"), "{err}");
    let mr = p.pd.alloc_mr(64, LW | AccessFlags::MW_BIND).unwrap();
    let err =
        p.b.bind_mw(1, &mut mw, &mr, 32, 64, AccessFlags::REMOTE_READ)
            .unwrap_err();
    assert!(err.to_string().contains("outside the region"), "{err}");
    let other_pd = p.ctx.alloc_pd().unwrap();
    let foreign = other_pd.alloc_mr(64, LW | AccessFlags::MW_BIND).unwrap();
    let err =
        p.b.bind_mw(1, &mut mw, &foreign, 0, 64, AccessFlags::REMOTE_READ)
            .unwrap_err();
    assert!(
        err.to_string().contains("another protection domain"),
        "{err}"
    );
    assert_eq!(p.b.in_flight(), (0, 0));
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn a_bound_window_keeps_its_region_registered() {
    let mut p = pair(PostPath::Auto);
    let mr = p.pd.alloc_mr(128, LW | AccessFlags::MW_BIND).unwrap();
    let mut mw = p.pd.alloc_mw(MwType::Type1).unwrap();
    let remote =
        p.b.bind_mw(1, &mut mw, &mr, 0, 128, AccessFlags::REMOTE_WRITE)
            .unwrap();
    common::wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    drop(mr); // the window holds the registration and its memory
    let src = p.pd.reg_mr(vec![9; 128], AccessFlags::empty()).unwrap();
    p.a.post_send(SendWr::write(2, src, remote)).unwrap();
    common::wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    drop(mw);
}

/// Whether the window (or anything else) still holds `mr`'s registration:
/// `deregister` refuses with `EBUSY` then, and gives the region back.
fn still_held(mr: rdma::MemoryRegion) -> Result<rdma::MemoryRegion, ()> {
    match mr.deregister() {
        Ok(_) => Err(()),
        Err((Some(mr), e)) => {
            assert_eq!(e.errno(), Some(libc::EBUSY), "{e}");
            Ok(mr)
        }
        Err((None, e)) => panic!("ibv_dereg_mr failed: {e}"),
    }
}

/// A window moved to another region keeps the region it was bound to
/// registered until the rebind completes: the device executes the bind
/// later than it is posted, and until then a peer may still reach the old
/// region through the old binding. Then the old region is let go and the
/// new one held.
fn rebind_keeps_the_old_region_until_it_completes(mw_type: MwType) {
    let mut p = pair(PostPath::Auto);
    let old = p.pd.alloc_mr(128, LW | AccessFlags::MW_BIND).unwrap();
    let new = p.pd.alloc_mr(128, LW | AccessFlags::MW_BIND).unwrap();
    let mut mw = p.pd.alloc_mw(mw_type).unwrap();
    let w = AccessFlags::REMOTE_WRITE;
    let first = p.b.bind_mw(1, &mut mw, &old, 0, 128, w).unwrap();
    common::wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    if mw_type == MwType::Type2 {
        // A type 2 window is invalidated before it is bound again.
        p.b.post_send(SendWr::local_invalidate(2, first.rkey))
            .unwrap();
        common::wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    }
    p.b.bind_mw(3, &mut mw, &new, 0, 128, w).unwrap();
    // Posted, its completion not polled yet: the old region stays.
    let old = still_held(old).expect("the old region let go before the rebind completed");
    let c = common::wait(&p.cq, 1).pop().unwrap();
    assert_eq!((c.wr_id, c.status), (3, WcStatus::Success), "{c:?}");
    assert!(
        still_held(old).is_err(),
        "the old region kept after the rebind completed"
    );
    let new = still_held(new).expect("the window holds the region it is bound to");
    drop(mw);
    assert!(still_held(new).is_err(), "the window's drop lets it go");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn type1_rebind_keeps_the_old_region_until_it_completes() {
    rebind_keeps_the_old_region_until_it_completes(MwType::Type1);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn type2_rebind_keeps_the_old_region_until_it_completes() {
    rebind_keeps_the_old_region_until_it_completes(MwType::Type2);
}

/// A rebind that completes in error (flushed: its QP is in the error
/// state) never took effect: the window keeps the region it was bound to,
/// and lets go of the one it was not bound to.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn a_failed_rebind_leaves_the_window_as_it_was() {
    let mut p = pair(PostPath::Auto);
    let old = p.pd.alloc_mr(128, LW | AccessFlags::MW_BIND).unwrap();
    let new = p.pd.alloc_mr(128, LW | AccessFlags::MW_BIND).unwrap();
    let mut mw = p.pd.alloc_mw(MwType::Type1).unwrap();
    let w = AccessFlags::REMOTE_WRITE;
    p.b.bind_mw(1, &mut mw, &old, 0, 128, w).unwrap();
    common::wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    p.b.to_error().unwrap();
    match p.b.bind_mw(2, &mut mw, &new, 0, 128, w) {
        Ok(_) => {
            let c = common::wait(&p.cq, 1).pop().unwrap();
            assert_eq!(c.wr_id, 2);
            assert_ne!(
                c.status,
                WcStatus::Success,
                "a bind on a QP in error: {c:?}"
            );
        }
        // A provider may refuse the post itself: nothing changes either.
        Err(e) => assert!(e.errno().is_some(), "{e}"),
    }
    assert!(
        still_held(new).is_err(),
        "held for a bind that never happened"
    );
    let old = still_held(old).expect("the window is still bound to the old region");
    drop(mw);
    assert!(still_held(old).is_err());
}

/// A window's binds in flight are on one QP: another QP's bind could take
/// effect before them unseen, so it is refused until they complete.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn a_window_s_binds_in_flight_are_on_one_qp() {
    let mut p = pair(PostPath::Auto);
    let mr = p.pd.alloc_mr(128, LW | AccessFlags::MW_BIND).unwrap();
    let mut mw = p.pd.alloc_mw(MwType::Type1).unwrap();
    let w = AccessFlags::REMOTE_WRITE;
    p.b.bind_mw(1, &mut mw, &mr, 0, 64, w).unwrap();
    let err = p.a.bind_mw(2, &mut mw, &mr, 64, 64, w).unwrap_err();
    assert!(err.to_string().contains("in flight on another QP"), "{err}");
    assert_eq!(err.verb(), Some("ibv_bind_mw"), "{err}");
    assert_eq!(p.a.in_flight(), (0, 0));
    common::wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    p.a.bind_mw(3, &mut mw, &mr, 64, 64, w).unwrap();
    let c = common::wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    assert_eq!(c.wr_id, 3);
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_memory_windows_are_typed_unsupported() {
    let ctx = common::open(&common::iwarp_device_name());
    let pd = ctx.alloc_pd().unwrap();
    match pd.alloc_mw(MwType::Type1) {
        Err(rdma::Error::Unsupported { .. }) => {}
        Err(e) => panic!("expected Unsupported, got {e:?}"),
        Ok(_) => panic!("siw has no memory windows"),
    }
}
