//! Bad input and faults: each gives a clear error (or an error completion),
//! never a panic, a hang or lost memory. Modelled on the bad-flow cases of
//! rdma-core's tests/test_qp.py, test_qpex.py, test_mr.py and test_atomic.py.

mod common;

use common::{pair, take, wait};
use rdma::{AccessFlags, Error, QpState, QpType, RtsAttr, SendWr, WcStatus};

const LW: AccessFlags = AccessFlags::LOCAL_WRITE;

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn qp_caps_past_the_device_limits_are_rejected() {
    let ctx = common::open(&common::device_name());
    let attr = ctx.query_device().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None, 0).unwrap();
    let mut b = pd.qp_builder(QpType::Rc, &cq, &cq);
    b.max_send_wr(attr.max_qp_wr() + 1);
    let err = b.build().unwrap_err();
    assert!(
        err.to_string().contains("max_send_wr") && err.to_string().contains("max_qp_wr"),
        "{err}"
    );
    let mut b = pd.qp_builder(QpType::Rc, &cq, &cq);
    b.max_recv_sge(attr.max_sge() + 1);
    let err = b.build().unwrap_err();
    assert!(err.to_string().contains("max_recv_sge"), "{err}");
    // Inline data past what the provider allows: the verb itself refuses.
    let mut b = pd.qp_builder(QpType::Rc, &cq, &cq);
    b.max_inline_data(1 << 20);
    let err = b.build().unwrap_err();
    assert!(
        matches!(err.verb(), Some("ibv_create_qp" | "ibv_create_qp_ex")),
        "{err}"
    );
    assert_eq!(err.errno(), Some(libc::EINVAL), "{err}");
}

/// A QP that pads the device's writes to the cache line cannot take its
/// receives from a shared receive queue: those receives are posted without
/// knowing which QP pads them. Refused before the provider is asked (rxe
/// and siw refuse every create flag themselves).
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn end_padding_with_a_shared_receive_queue_is_refused() {
    let ctx = common::open(&common::device_name());
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None, 0).unwrap();
    let srq = pd
        .create_srq(rdma::SrqAttr {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let mut b = pd.qp_builder(QpType::Rc, &cq, &cq);
    b.srq(&srq)
        .create_flags(rdma::QpCreateFlags::PCI_WRITE_END_PADDING);
    let err = b.build().unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { .. })
            && err
                .to_string()
                .contains("PCI_WRITE_END_PADDING with a shared receive queue"),
        "{err}"
    );
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn zero_and_oversized_cq_sizes_are_rejected() {
    let ctx = common::open(&common::device_name());
    let max = ctx.query_device().unwrap().max_cqe();
    for bad in [0, max + 1] {
        let err = ctx.create_cq(bad, None, 0).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
        assert!(err.to_string().contains("max_cqe"), "{err}");
    }
    let err = ctx.alloc_pd().unwrap().alloc_mr(0, LW).unwrap_err();
    assert!(err.to_string().contains("cannot be empty"), "{err}");
}

/// siw (rdma-core 44) refuses a CQ or QP whose queue the kernel mapped at
/// key `0x90000`, the 145th page of a context's queue mappings, and returns
/// NULL without setting errno (CONVENTIONS.md, Tests). Before each
/// `ibv_create_cq` the test leaves `EOPNOTSUPP` in errno with
/// `ibv_create_cq_ex`, which siw lacks: the refusal must come back as
/// `Error::NoReason`, not as that stale errno. Freeing one CQ makes room
/// again: a limit, not a broken device.
#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_a_cq_siw_refuses_without_errno_is_no_reason_not_a_stale_errno() {
    let ctx = common::open(&common::iwarp_device_name());
    let mut cqs = Vec::new();
    let err = loop {
        let stale = ctx.create_cq_ex(16, None, 0, false).unwrap_err();
        assert_eq!(stale.errno(), Some(libc::EOPNOTSUPP), "{stale}");
        match ctx.create_cq(16, None, 0) {
            Ok(cq) => cqs.push(cq),
            Err(e) => break e,
        }
        assert!(
            cqs.len() <= 1024,
            "siw took 1024 one-page CQs: its 144-page limit is gone"
        );
    };
    assert!(
        matches!(
            err,
            Error::NoReason {
                verb: "ibv_create_cq",
                ..
            }
        ),
        "CQ {} refused with {err:?}",
        cqs.len() + 1
    );
    assert_eq!(err.errno(), None, "{err}");
    assert!(err.to_string().contains("without setting errno"), "{err}");
    // Keys 0..0x8f000 (144 pages) are taken; 0x90000 is the refused one.
    assert_eq!(cqs.len(), 144, "{err}");
    cqs.pop();
    cqs.push(ctx.create_cq(16, None, 0).expect("a CQ in the freed page"));
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn bad_state_transitions_fail_with_the_mask_named() {
    let ctx = common::open(&common::device_name());
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None, 0).unwrap();
    let qp = pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Reset);
    // RESET -> RTS skips INIT and RTR.
    let err = qp.to_rts(&RtsAttr::new(0)).unwrap_err();
    assert_eq!(err.verb(), Some("ibv_modify_qp"));
    assert_eq!(err.errno(), Some(libc::EINVAL));
    assert!(
        err.to_string().contains("Rts") && err.to_string().contains("mask"),
        "{err}"
    );
    assert_eq!(qp.state().unwrap(), QpState::Reset);
    // RC needs the peer's address for RTR.
    qp.to_init(&rdma::InitAttr::new(1)).unwrap();
    let err = qp.to_rtr(None).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    // A port that does not exist.
    let qp2 = pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
    let err = qp2.to_init(&rdma::InitAttr::new(7)).unwrap_err();
    assert_eq!(err.errno(), Some(libc::EINVAL), "{err}");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn posting_in_reset_gives_the_memory_back() {
    let ctx = common::open(&common::device_name());
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None, 0).unwrap();
    let mut qp = pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
    let buf = pd.reg_mr(vec![7u8; 32], AccessFlags::empty()).unwrap();
    let err = qp.post_send(SendWr::send(5, buf)).unwrap_err();
    assert_eq!(err.error.verb(), Some("ibv_post_send"), "{}", err.error);
    assert!(err.error.errno().is_some());
    let (id, back) = err.returned.into_iter().next().expect("memory returned");
    assert_eq!(id, 5);
    assert_eq!(back.into_one().unwrap().as_slice().unwrap(), &[7u8; 32]);
    assert_eq!(qp.in_flight(), (0, 0));
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn request_shape_errors_are_caught_before_posting() {
    let access = LW | AccessFlags::REMOTE_ATOMIC;
    let mut p = pair(QpType::Rc, access);
    // Too many SGEs for the QP (built with 1).
    let two = p.pd.alloc_mr(64, LW).unwrap().chunks(32).unwrap();
    let err = p.a.post_send(SendWr::send(1, two)).unwrap_err();
    assert!(
        err.error.to_string().contains("scatter/gather entries"),
        "{}",
        err.error
    );
    assert_eq!(err.returned[0].1.len(), 2);
    // A receive into memory the device may not write.
    let ro = p.pd.alloc_mr(64, AccessFlags::empty()).unwrap();
    let err = p.b.post_recv(2, ro).unwrap_err();
    assert!(
        err.error.to_string().contains("LOCAL_WRITE"),
        "{}",
        err.error
    );
    // Memory of another protection domain.
    let other = p.ctx.alloc_pd().unwrap().alloc_mr(64, LW).unwrap();
    let err = p.b.post_recv(3, other).unwrap_err();
    assert!(
        err.error.to_string().contains("another protection domain"),
        "{}",
        err.error
    );
    // Misaligned and wrongly sized atomics.
    let word = p.pd.alloc_mr(16, access).unwrap();
    let misaligned = word.remote().slice(4, 8).unwrap();
    let result = p.pd.alloc_mr(8, LW).unwrap();
    let err =
        p.a.post_send(SendWr::fetch_add(4, result, misaligned, 1))
            .unwrap_err();
    assert!(
        err.error.to_string().contains("not 8-byte aligned"),
        "{}",
        err.error
    );
    let result16 = p.pd.alloc_mr(16, LW).unwrap();
    let err =
        p.a.post_send(SendWr::fetch_add(5, result16, word.remote(), 1))
            .unwrap_err();
    assert!(
        err.error.to_string().contains("8-byte local buffer"),
        "{}",
        err.error
    );
    // More bytes than the remote range.
    let big = p.pd.alloc_mr(64, LW).unwrap();
    let err =
        p.a.post_send(SendWr::write(6, big, word.remote()))
            .unwrap_err();
    assert!(
        err.error.to_string().contains("do not fit"),
        "{}",
        err.error
    );
    // UD destination on an RC QP.
    assert_eq!(p.a.in_flight(), (0, 0));
    assert_eq!(p.b.in_flight(), (0, 0));
}

/// An atomic's result is 8 bytes written at one place: its local memory is
/// one 8-byte scatter entry, whatever the entries add up to. Two pieces of
/// one registration (2 and 6 bytes, 8 in all) are refused by every entry
/// point, before the provider sees them (mlx5 writes 8 bytes at the first
/// piece's address whatever its length, into the piece after it), and come
/// back untouched; the remote word is left alone.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn an_atomic_takes_exactly_one_8_byte_buffer() {
    use rdma::{SendFlags, SendOp, WrBuffers};
    let access = LW | AccessFlags::REMOTE_ATOMIC;
    let mut p = common::pair_with(QpType::Rc, access, |b| {
        b.max_send_sge(2);
    });
    let mut word = p.pd.alloc_mr(8, access).unwrap();
    word.write_at(0, &5u64.to_ne_bytes()).unwrap();
    let remote = word.remote();
    let pieces = || {
        let mut first = p.pd.alloc_mr(8, LW).unwrap();
        first.write_at(0, &[0xee; 8]).unwrap();
        let second = first.split_off(2).unwrap();
        WrBuffers::Many(vec![first, second])
    };
    let ops = [
        SendOp::FetchAdd { remote, add: 1 },
        SendOp::CompareSwap {
            remote,
            compare: 5,
            swap: 6,
        },
    ];
    let rule =
        "exactly one 8-byte local buffer (one scatter/gather entry); got 2 entries of 8 bytes";
    for op in ops {
        let err = p.a.post_send(SendWr::new(1, op, pieces())).unwrap_err();
        assert!(
            err.error.to_string().contains(rule),
            "{op:?}: {}",
            err.error
        );
        assert_eq!(err.error.verb(), Some("ibv_post_send"), "{}", err.error);
        let (_, back) = err.returned.into_iter().next().unwrap();
        let back = back.into_vec();
        assert_eq!(back.len(), 2, "both pieces come back");
        for m in back {
            assert!(m.to_vec().iter().all(|&b| b == 0xee), "untouched");
        }

        let err =
            p.a.post_send_batch([SendWr::new(2, op, pieces())])
                .unwrap_err();
        assert!(
            err.error.to_string().contains(rule),
            "{op:?}: {}",
            err.error
        );
        assert_eq!(err.returned.len(), 1);

        let err =
            p.a.prepare_send(op, SendFlags::SIGNALED, pieces())
                .unwrap_err();
        assert!(
            err.error.to_string().contains("owns one region"),
            "{op:?}: {}",
            err.error
        );
        // One 8-byte piece of a split region is one entry: taken.
        let mut whole = p.pd.alloc_mr(16, LW).unwrap();
        let _rest = whole.split_off(8).unwrap();
        p.a.post_send(SendWr::new(3, op, whole)).unwrap();
        let c = wait(&p.cq, 1).pop().unwrap().ok().unwrap();
        assert_eq!(c.wr_id, 3);
    }
    assert_eq!(p.a.in_flight(), (0, 0));
    // Only the two one-entry atomics reached the word: 5 + 1, then a compare
    // with 5 that failed.
    let mut now = [0; 8];
    word.read_at(0, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 6);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn wrong_rkey_is_an_error_completion_not_a_hang() {
    let access = LW | AccessFlags::REMOTE_WRITE;
    let mut p = pair(QpType::Rc, access);
    let target = p.pd.alloc_mr(64, access).unwrap();
    let mut remote = target.remote();
    remote.rkey ^= 0x5a5a;
    let src = p.pd.reg_mr(vec![1u8; 64], AccessFlags::empty()).unwrap();
    p.a.post_send(SendWr::write(1, src, remote)).unwrap();
    let mut c = wait(&p.cq, 1).pop().unwrap();
    assert_eq!(c.wr_id, 1);
    assert_eq!(c.status, WcStatus::RemAccessErr, "{c:?}");
    assert!(
        c.take_buffers().into_one().is_some(),
        "memory comes back on error too"
    );
    let err = c.ok().unwrap_err();
    assert!(err.to_string().contains("remote access error"), "{err}");
    // The QP is now in error: further work is flushed.
    assert_eq!(p.a.state().unwrap(), QpState::Err);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn remote_access_without_the_access_flag_fails() {
    // The responder QP grants no remote write; the region does.
    let mut p = pair(QpType::Rc, AccessFlags::empty());
    let access = LW | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let target = p.pd.alloc_mr(64, access).unwrap();
    let src = p.pd.reg_mr(vec![1u8; 64], AccessFlags::empty()).unwrap();
    p.a.post_send(SendWr::write(1, src, target.remote()))
        .unwrap();
    let c = wait(&p.cq, 1).pop().unwrap();
    // The responder rejects the request: rxe NAKs it as an invalid request,
    // other providers as an access error.
    assert!(
        matches!(c.status, WcStatus::RemAccessErr | WcStatus::RemInvReqErr),
        "{c:?}"
    );
    assert_eq!(target.to_vec(), vec![0u8; 64], "nothing was written");

    // The QP grants it, the region does not.
    let mut p = pair(QpType::Rc, access);
    let target = p.pd.alloc_mr(64, LW).unwrap();
    let dst = p.pd.alloc_mr(64, LW).unwrap();
    p.a.post_send(SendWr::read(2, dst, target.remote()))
        .unwrap();
    let c = wait(&p.cq, 1).pop().unwrap();
    assert_eq!(c.status, WcStatus::RemAccessErr, "{c:?}");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn receive_buffer_too_small_is_a_length_error() {
    let mut p = pair(QpType::Rc, AccessFlags::empty());
    p.b.post_recv(1, p.pd.alloc_mr(16, LW).unwrap()).unwrap();
    let msg = p.pd.reg_mr(vec![3u8; 64], AccessFlags::empty()).unwrap();
    p.a.post_send(SendWr::send(2, msg)).unwrap();
    let mut done = wait(&p.cq, 2);
    let r = take(&mut done, 1);
    // mlx5 reports a local length error; rxe a local QP operation error.
    assert!(
        matches!(r.status, WcStatus::LocLenErr | WcStatus::LocQpOpErr),
        "{r:?}"
    );
    assert!(!r.buffers.is_empty(), "the receive memory comes back");
    let s = take(&mut done, 2);
    assert!(!s.is_success(), "the sender learns of it: {s:?}");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn flushed_receives_come_back_when_the_qp_errors() {
    let mut p = pair(QpType::Rc, AccessFlags::empty());
    let bufs = p.pd.alloc_mr(4 * 64, LW).unwrap().chunks(64).unwrap();
    p.b.post_recv_batch(
        bufs.into_iter()
            .enumerate()
            .map(|(i, m)| (i as u64, m.into())),
    )
    .unwrap();
    p.b.to_error().unwrap();
    let done = wait(&p.cq, 4);
    for c in &done {
        assert_eq!(c.status, WcStatus::WrFlushErr, "{c:?}");
        assert_eq!(c.buffers.len(), 1);
    }
    let mut ids: Vec<u64> = done.iter().map(|c| c.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [0, 1, 2, 3]);
    assert_eq!(p.b.in_flight(), (0, 0));
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn full_receive_queue_returns_the_rest() {
    let mut p = common::pair_with(QpType::Rc, AccessFlags::empty(), |b| {
        b.max_recv_wr(4);
    });
    // Providers may round the queue up; post far more than it can hold.
    let total = 4 * p.b.caps().max_recv_wr as usize + 64;
    let bufs = p.pd.alloc_mr(total * 8, LW).unwrap().chunks(8).unwrap();
    let err =
        p.b.post_recv_batch(
            bufs.into_iter()
                .enumerate()
                .map(|(i, m)| (i as u64, m.into())),
        )
        .unwrap_err();
    assert_eq!(err.error.errno(), Some(libc::ENOMEM), "{}", err.error);
    let (_, posted) = p.b.in_flight();
    assert!(posted >= p.b.caps().max_recv_wr as usize, "{posted}");
    assert_eq!(posted + err.returned.len(), total, "nothing is lost");
    assert_eq!(
        err.returned[0].0, posted as u64,
        "the rest comes back in order"
    );
    assert!(err.returned.iter().all(|(_, b)| b.len() == 1));
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn posting_sends_in_init_is_refused() {
    let ctx = common::open(&common::device_name());
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None, 0).unwrap();
    let mut qp = pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
    qp.to_init(&rdma::InitAttr::new(1)).unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Init);
    let buf = pd.reg_mr(vec![1u8; 8], AccessFlags::empty()).unwrap();
    let err = qp.post_send(SendWr::send(1, buf)).unwrap_err();
    assert!(err.error.errno().is_some(), "{}", err.error);
    assert_eq!(err.returned.len(), 1, "the memory comes back");
    // Receives may be posted from INIT on.
    qp.post_recv(2, pd.alloc_mr(8, LW).unwrap()).unwrap();
    assert_eq!(qp.in_flight(), (0, 1));
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn message_longer_than_the_port_allows_is_refused() {
    let mut p = pair(QpType::Rc, LW | AccessFlags::REMOTE_WRITE);
    let max = p.ctx.query_port(1).unwrap().max_msg_sz as usize;
    let target =
        p.pd.alloc_mr(max + 4096, LW | AccessFlags::REMOTE_WRITE)
            .unwrap();
    let src = p.pd.alloc_mr(max + 1, AccessFlags::empty()).unwrap();
    let err =
        p.a.post_send(SendWr::write(1, src, target.remote()))
            .unwrap_err();
    assert!(
        err.error.to_string().contains("max_msg_sz"),
        "{}",
        err.error
    );
    assert_eq!(err.returned.len(), 1, "the memory comes back");
    // UD: a message must fit the path MTU.
    let mut u = pair(QpType::Ud, AccessFlags::empty());
    let mtu = u.ctx.query_port(1).unwrap().active_mtu.bytes().unwrap() as usize;
    let gid = u.ctx.query_gid(1, u32::from(u.gid_index)).unwrap();
    let ah =
        u.pd.create_ah(&rdma::AhAttr::global(1, gid, u.gid_index))
            .unwrap();
    let big = u.pd.alloc_mr(mtu + 1, AccessFlags::empty()).unwrap();
    let err =
        u.a.post_send(SendWr::send(2, big).ud(&ah, u.b.qp_num(), common::QKEY))
            .unwrap_err();
    assert!(err.error.to_string().contains("path MTU"), "{}", err.error);
}
