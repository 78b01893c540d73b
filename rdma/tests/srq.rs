//! Shared receive queues (rdma-core's tests/test_srq.py): traffic from several
//! QPs into one SRQ, the limit event, resize, and bad input.

mod common;

use rdma::{AccessFlags, AsyncEventType, QpType, SendWr, SrqAttr};

const LW: AccessFlags = AccessFlags::LOCAL_WRITE;

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn several_qps_share_one_receive_pool() {
    let ctx = common::open(&common::device_name());
    let gid_index = common::gid_index() as u8;
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None, 0).unwrap();
    let srq = pd
        .create_srq(SrqAttr {
            max_wr: 64,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let attr = srq.query().unwrap();
    assert!(attr.max_wr >= 64, "{attr:?}");
    // Three receiving QPs on the SRQ, three senders.
    let receivers: Vec<_> = (0..3)
        .map(|_| {
            pd.qp_builder(QpType::Rc, &cq, &cq)
                .srq(&srq)
                .build()
                .unwrap()
        })
        .collect();
    let mut senders: Vec<_> = (0..3)
        .map(|_| pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap())
        .collect();
    for (r, s) in receivers.iter().zip(&senders) {
        common::connect(&ctx, r, s, gid_index);
        common::connect(&ctx, s, r, gid_index);
    }
    let bufs = pd.alloc_mr(12 * 128, LW).unwrap().chunks(128).unwrap();
    srq.post_recv_batch(
        bufs.into_iter()
            .enumerate()
            .map(|(i, m)| (1000 + i as u64, m.into())),
    )
    .unwrap();
    assert_eq!(srq.in_flight(), 12);
    for (i, s) in senders.iter_mut().enumerate() {
        for j in 0..4u8 {
            let msg = pd
                .reg_mr(vec![(i as u8) * 16 + j; 100], AccessFlags::empty())
                .unwrap();
            s.post_send(SendWr::send(u64::from(j), msg)).unwrap();
        }
    }
    let done = common::wait(&cq, 24);
    let recvs: Vec<_> = done.iter().filter(|c| c.wr_id >= 1000).collect();
    assert_eq!(recvs.len(), 12);
    let mut per_qp = std::collections::HashMap::new();
    for c in &recvs {
        assert!(c.is_success(), "{c:?}");
        assert_eq!(c.byte_len, 100);
        let data = match &c.buffers {
            rdma::WrBuffers::One(m) => m.to_vec(),
            other => panic!("{other:?}"),
        };
        let sender = receivers
            .iter()
            .position(|r| r.qp_num() == c.qp_num)
            .unwrap();
        assert_eq!(data[0] / 16, sender as u8, "data came through the right QP");
        assert!(data[..100].iter().all(|b| *b == data[0]));
        *per_qp.entry(c.qp_num).or_insert(0) += 1;
    }
    assert!(per_qp.values().all(|n| *n == 4), "{per_qp:?}");
    assert_eq!(srq.in_flight(), 0);
    // Receives cannot be posted to a QP that uses an SRQ.
    let mut r = receivers.into_iter().next().unwrap();
    let err = r.post_recv(1, pd.alloc_mr(8, LW).unwrap()).unwrap_err();
    assert!(err.error.to_string().contains("SRQ"), "{}", err.error);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn limit_reached_event() {
    let common::SrqPair {
        ctx,
        pd,
        cq,
        srq,
        r: _r,
        mut s,
    } = common::srq_pair();
    let bufs = pd.alloc_mr(8 * 64, LW).unwrap().chunks(64).unwrap();
    srq.post_recv_batch(
        bufs.into_iter()
            .enumerate()
            .map(|(i, m)| (i as u64, m.into())),
    )
    .unwrap();
    srq.arm_limit(6).unwrap();
    assert_eq!(srq.query().unwrap().srq_limit, 6);
    // Consume three receives: 5 left, below the limit of 6.
    for i in 0..3u64 {
        let msg = pd.reg_mr(vec![1u8; 8], AccessFlags::empty()).unwrap();
        s.post_send(SendWr::send(100 + i, msg)).unwrap();
    }
    common::wait(&cq, 6);
    let ev = ctx.get_async_event().expect("async event");
    assert_eq!(ev.event_type, AsyncEventType::SrqLimitReached, "{ev}");
    assert!(ev.is_srq(&srq), "{ev:?}");
    assert!(ev.to_string().contains("SRQ limit reached"), "{ev}");
    // The limit disarms itself once reached.
    assert_eq!(srq.query().unwrap().srq_limit, 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn resize_and_bad_sizes() {
    let ctx = common::open(&common::device_name());
    let dev = ctx.query_device().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let srq = pd
        .create_srq(SrqAttr {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    srq.resize(128).expect("rxe supports SRQ resize");
    assert!(srq.query().unwrap().max_wr >= 128);
    let err = pd
        .create_srq(SrqAttr {
            max_wr: dev.max_srq_wr() + 1,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap_err();
    assert!(err.to_string().contains("max_srq_wr"), "{err}");
    let err = pd
        .create_srq(SrqAttr {
            max_wr: 4,
            max_sge: dev.max_srq_sge() + 1,
            srq_limit: 0,
        })
        .unwrap_err();
    assert!(err.to_string().contains("max_srq_sge"), "{err}");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn dropping_the_srq_handle_first_is_safe() {
    let ctx = common::open(&common::device_name());
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None, 0).unwrap();
    let srq = pd
        .create_srq(SrqAttr {
            max_wr: 8,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let qp = pd
        .qp_builder(QpType::Rc, &cq, &cq)
        .srq(&srq)
        .build()
        .unwrap();
    srq.post_recv(1, pd.alloc_mr(64, LW).unwrap()).unwrap();
    drop(srq); // the QP keeps it
    assert_eq!(qp.srq().unwrap().in_flight(), 1);
    drop(cq);
    drop(pd);
    drop(qp);
}
