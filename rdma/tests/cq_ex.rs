//! Extended completion queues and the lending poll cursor (rdma-core's
//! tests/test_cqex.py).

mod common;

use rdma::{AccessFlags, Error, QpType, SendWr, WcOpcode, WcStatus};

const LW: AccessFlags = AccessFlags::LOCAL_WRITE;

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn cursor_lends_completions_and_returns_memory() {
    let ctx = common::open(&common::device_name());
    let cq = ctx
        .create_cq_ex(64, None, 0, false)
        .expect("ibv_create_cq_ex");
    assert!(cq.is_extended());
    let pd = ctx.alloc_pd().unwrap();
    let mut a = pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
    let mut b = pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
    let g = common::gid_index() as u8;
    common::connect(&ctx, &a, &b, g);
    common::connect(&ctx, &b, &a, g);
    assert!(cq.start_poll().unwrap().is_none(), "empty CQ");
    for i in 0..4u64 {
        b.post_recv(i, pd.alloc_mr(32, LW).unwrap()).unwrap();
        let msg = pd.reg_mr(vec![i as u8; 32], AccessFlags::empty()).unwrap();
        a.post_send(SendWr::send(100 + i, msg).with_imm(i as u32))
            .unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut seen = Vec::new();
    while seen.len() < 8 {
        assert!(
            std::time::Instant::now() < deadline,
            "lost completion: {seen:?}"
        );
        let Some(mut cursor) = cq.start_poll().unwrap() else {
            std::thread::yield_now();
            continue;
        };
        // A second cursor, or a legacy poll, is refused while this one is open.
        assert_eq!(cq.start_poll().unwrap_err().errno(), Some(libc::EBUSY));
        assert_eq!(
            cq.poll(&mut Vec::new(), 1).unwrap_err().errno(),
            Some(libc::EBUSY)
        );
        loop {
            let c = cursor.completion();
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            if c.wr_id < 100 {
                assert_eq!(c.opcode, WcOpcode::Recv);
                assert_eq!(c.imm(), Some(c.wr_id as u32));
                assert_eq!(c.qp_num, b.qp_num());
                let mut c = cursor.take().unwrap();
                assert!(cursor.take().is_none());
                let m = c.take_buffers().into_one().unwrap();
                assert_eq!(m.as_slice().unwrap(), &[c.wr_id as u8; 32][..]);
                seen.push(c.wr_id);
            } else {
                assert_eq!(c.opcode, WcOpcode::Send);
                seen.push(c.wr_id);
            }
            if !cursor.next().unwrap() {
                break;
            }
        }
    }
    seen.sort_unstable();
    assert_eq!(seen, [0, 1, 2, 3, 100, 101, 102, 103]);
    assert_eq!(a.in_flight(), (0, 0));
    assert_eq!(b.in_flight(), (0, 0));
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn legacy_cq_has_no_cursor() {
    let ctx = common::open(&common::device_name());
    let cq = ctx.create_cq(8, None, 0).unwrap();
    assert!(!cq.is_extended());
    assert!(matches!(cq.start_poll(), Err(Error::Unsupported { .. })));
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_has_no_extended_cq() {
    let ctx = common::open(&common::iwarp_device_name());
    let err = ctx.create_cq_ex(8, None, 0, false).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err:?}");
    assert!(
        err.to_string().contains("extended completion queues"),
        "{err}"
    );
    // The legacy CQ works.
    ctx.create_cq(8, None, 0).unwrap();
}
