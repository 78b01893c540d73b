//! Memory regions (rdma-core's tests/test_mr.py): every access-flag
//! combination, pieces, copies, bounds, re-registration, and XRC domains.

mod common;

use rdma::{AccessFlags, Error};

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn every_access_flag_combination() {
    let ctx = common::open(&common::device_name());
    let pd = ctx.alloc_pd().unwrap();
    let flags = [
        AccessFlags::LOCAL_WRITE,
        AccessFlags::REMOTE_WRITE,
        AccessFlags::REMOTE_READ,
        AccessFlags::REMOTE_ATOMIC,
        AccessFlags::MW_BIND,
    ];
    for bits in 0u32..(1 << flags.len()) {
        let access = flags
            .iter()
            .enumerate()
            .filter(|(i, _)| bits & (1 << i) != 0)
            .fold(AccessFlags::empty(), |a, (_, f)| a | *f);
        // The IB spec: remote write or atomic access needs local write.
        let valid = access.contains(AccessFlags::LOCAL_WRITE)
            || !access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC);
        match pd.alloc_mr(4096, access) {
            Ok(mut mr) => {
                assert!(valid, "{access:?} registered but is invalid");
                assert_eq!(mr.access(), access);
                assert_ne!(mr.lkey(), 0);
                // A safe view exists exactly when no peer can write.
                assert_eq!(
                    mr.as_slice().is_ok(),
                    !access.remotely_writable(),
                    "{access:?}"
                );
                assert_eq!(mr.as_mut_slice().is_ok(), !access.remotely_writable());
                mr.write_at(10, b"abc").unwrap();
                let mut out = [0; 3];
                mr.read_at(10, &mut out).unwrap();
                assert_eq!(&out, b"abc");
            }
            Err(e) => {
                assert!(!valid, "{access:?} should register: {e}");
                assert_eq!(e.errno(), Some(libc::EINVAL), "{e}");
                assert_eq!(e.verb(), Some("ibv_reg_mr"));
            }
        }
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn pieces_copies_and_bounds() {
    let ctx = common::open(&common::device_name());
    let pd = ctx.alloc_pd().unwrap();
    let mut mr = pd
        .reg_mr((0..=255u8).collect::<Vec<_>>(), AccessFlags::LOCAL_WRITE)
        .unwrap();
    let lkey = mr.lkey();
    let base = mr.addr();
    let tail = mr.split_off(100).unwrap();
    assert_eq!((mr.len(), tail.len()), (100, 156));
    assert_eq!(tail.addr(), base + 100);
    assert_eq!(tail.lkey(), lkey, "pieces share the registration");
    assert_eq!(tail.as_slice().unwrap()[0], 100);
    assert!(mr.split_off(0).is_err());
    assert!(mr.split_off(100).is_err());
    let err = mr.write_at(98, b"xyz").unwrap_err();
    assert!(err.to_string().contains("outside the region"), "{err}");
    assert!(mr.read_at(usize::MAX, &mut [0; 2]).is_err());
    let chunks = tail.chunks(50).unwrap();
    assert_eq!(
        chunks.iter().map(|c| c.len()).collect::<Vec<_>>(),
        [50, 50, 50, 6]
    );
    let mut it = chunks.into_iter();
    let mut first = it.next().unwrap();
    let second = it.next().unwrap();
    let fourth_back = {
        let third = it.next().unwrap();
        let fourth = it.next().unwrap();
        // Not adjacent to `first`: given back.
        let fourth = first.unsplit(fourth).unwrap_err();
        drop(third);
        fourth
    };
    first.unsplit(second).unwrap();
    assert_eq!(first.len(), 100);
    assert_eq!(first.as_slice().unwrap()[99], 199);
    assert_eq!(fourth_back.to_vec(), (250..=255u8).collect::<Vec<_>>());
    assert!(pd
        .alloc_mr(8, AccessFlags::empty())
        .unwrap()
        .chunks(0)
        .is_err());
    let remote = first.remote();
    assert!(remote.slice(90, 10).is_some());
    assert!(remote.slice(90, 11).is_none());
}

/// `read_at`/`write_at`/`to_vec` at every start alignment, on remotely
/// writable registrations (per-element atomic copies) and local ones (plain
/// copies), of a caller's buffer and of an allocated one, against a `Vec`
/// kept alongside.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn copies_at_every_alignment() {
    let ctx = common::open(&common::device_name());
    let pd = ctx.alloc_pd().unwrap();
    for access in [
        AccessFlags::LOCAL_WRITE,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    ] {
        let boxed: Vec<u8> = (0..300u32).map(|i| (i % 251) as u8).collect();
        let regions = [
            pd.reg_mr(boxed, access).unwrap(),
            pd.alloc_mr(300, access).unwrap(),
        ];
        for mut mr in regions {
            let mut model = mr.to_vec();
            assert_eq!(model.len(), 300);
            for offset in 0..17 {
                for len in [0, 1, 7, 8, 9, 31, 32, 33, 63, 64, 65, 250] {
                    let data: Vec<u8> = (0..len).map(|i| (i * 3 + offset + len) as u8).collect();
                    mr.write_at(offset, &data).unwrap();
                    model[offset..offset + len].copy_from_slice(&data);
                    let mut out = vec![0xee; len + 2];
                    mr.read_at(offset, &mut out[1..=len]).unwrap();
                    assert_eq!(
                        out[1..=len],
                        data[..],
                        "{access:?} at {offset}, {len} bytes"
                    );
                    assert_eq!((out[0], out[len + 1]), (0xee, 0xee), "wrote outside `out`");
                }
            }
            assert_eq!(mr.to_vec(), model, "{access:?}");
            let tail = mr.split_off(123).unwrap();
            assert_eq!(tail.to_vec(), model[123..], "{access:?}");
            assert_eq!(mr.to_vec(), model[..123], "{access:?}");
        }
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn foreign_memory_registration() {
    let ctx = common::open(&common::device_name());
    let pd = ctx.alloc_pd().unwrap();
    let mut backing = vec![7u8; 64];
    // SAFETY: `backing` outlives the region and is not touched while it lives.
    let mr = unsafe {
        pd.reg_mr_raw(
            backing.as_mut_ptr(),
            backing.len(),
            AccessFlags::LOCAL_WRITE,
        )
    }
    .unwrap();
    assert_eq!(mr.to_vec(), vec![7u8; 64]);
    drop(mr);
    assert_eq!(backing[0], 7);
    // SAFETY: a null pointer is rejected before anything is registered.
    let err = unsafe { pd.reg_mr_raw(std::ptr::null_mut(), 8, AccessFlags::empty()) }.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rereg_and_xrc_are_typed_unsupported_on_rxe() {
    let ctx = common::open(&common::device_name());
    let pd = ctx.alloc_pd().unwrap();
    let mut mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    match mr.rereg_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ) {
        Err(Error::Unsupported { what, .. }) => assert_eq!(what, "ibv_rereg_mr"),
        other => panic!("rxe has no rereg_mr: {other:?}"),
    }
    assert_eq!(
        mr.access(),
        AccessFlags::LOCAL_WRITE,
        "unchanged on failure"
    );
    let _tail = mr.split_off(32).unwrap();
    let err = mr.rereg_access(AccessFlags::LOCAL_WRITE).unwrap_err();
    assert_eq!(err.errno(), Some(libc::EBUSY), "{err}");
    match ctx.open_xrcd() {
        Err(Error::Unsupported { what, .. }) => assert_eq!(what, "XRC domains"),
        other => panic!("rxe has no XRC: {other:?}"),
    }
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_registers_memory_and_has_no_xrc() {
    let ctx = common::open(&common::iwarp_device_name());
    let pd = ctx.alloc_pd().unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mut mr = pd.alloc_mr(4096, access).unwrap();
    assert_ne!(mr.rkey(), 0);
    assert!(matches!(ctx.open_xrcd(), Err(Error::Unsupported { .. })));
    // Deregistered and registered again without zeroing, as rdma-nfs
    // reuses its chunks on siw.
    mr.write_at(100, b"kept").unwrap();
    let buf = mr.deregister().map_err(|(_, e)| e).expect("ibv_dereg_mr");
    assert_eq!(&buf[100..104], b"kept");
    let again = pd.reg_buffer(buf, access).expect("ibv_reg_mr");
    let mut out = [0; 4];
    again.read_at(100, &mut out).unwrap();
    assert_eq!(&out, b"kept");
    assert_ne!(again.rkey(), 0);
}

/// `deregister` gives the memory back as it was left, only once no key
/// reaches it: a peer's WRITE with the old rkey is refused and the bytes
/// stay; `reg_buffer` registers the same bytes again (not zeroed). Refused,
/// with the region given back still registered: a piece whose sibling
/// lives, and memory the caller owns.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn deregister_gives_the_bytes_back_and_reg_buffer_keeps_them() {
    use common::{pair, wait};
    use rdma::{SendWr, WcStatus};
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mut p = pair(rdma::QpType::Rc, access);
    let mut mr = p.pd.alloc_mr(4096, access).unwrap();
    let old = mr.remote();
    let written: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 1) as u8).collect();
    let src = p.pd.reg_mr(written.clone(), AccessFlags::empty()).unwrap();
    p.a.post_send(SendWr::write(1, src, old)).unwrap();
    let c = wait(&p.cq, 1).pop().unwrap();
    assert_eq!(c.status, WcStatus::Success, "{c:?}");

    // A piece with a live sibling: refused, nothing deregistered.
    let tail = mr.split_off(1024).unwrap();
    let (back, err) = mr.deregister().unwrap_err();
    assert_eq!(err.errno(), Some(libc::EBUSY), "{err}");
    let mut mr = back.expect("the region comes back");
    mr.unsplit(tail).expect("rejoined");

    let buf = mr.deregister().map_err(|(_, e)| e).expect("ibv_dereg_mr");
    assert_eq!(buf.len(), 4096);
    assert_eq!(*buf, written[..], "the peer's bytes, intact");
    // The old rkey reaches nothing now: refused, and the buffer unchanged.
    let src = p.pd.reg_mr(vec![0xee; 4096], AccessFlags::empty()).unwrap();
    p.a.post_send(SendWr::write(2, src, old)).unwrap();
    let c = wait(&p.cq, 1).pop().unwrap();
    assert!(
        matches!(c.status, WcStatus::RemAccessErr | WcStatus::RemInvReqErr),
        "a WRITE with a deregistered region's rkey: {c:?}"
    );
    assert_eq!(*buf, written[..], "unchanged after the refused WRITE");

    let again = p.pd.reg_buffer(buf, access).expect("ibv_reg_mr");
    assert_eq!(again.len(), 4096);
    assert_eq!(again.to_vec(), written, "registered again, not zeroed");
    assert_eq!(again.access(), access);

    // Memory the caller owns is not the crate's to hand back.
    let mut backing = vec![3u8; 64];
    // SAFETY: `backing` outlives the region and is not touched while it lives.
    let raw = unsafe {
        p.pd.reg_mr_raw(backing.as_mut_ptr(), 64, AccessFlags::LOCAL_WRITE)
    }
    .unwrap();
    let (raw, err) = raw.deregister().unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let raw = raw.expect("given back, still registered");
    assert_eq!(raw.to_vec(), vec![3u8; 64]);
    raw.destroy().map_err(|(_, e)| e).expect("ibv_dereg_mr");
    assert_eq!(backing, vec![3u8; 64]);
}
