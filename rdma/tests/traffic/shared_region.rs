//! One registration in many requests at once: the region stays registered until
//! the last request that holds it completes, over RC and fanned out over UD.

use super::*;

/// One region in many requests at once (`WrBuffers::Shared`): SENDs on both
/// QPs of the pair and RDMA WRITEs, all in flight together from the same
/// bytes; every request holds a reference until its completion, and the
/// region is the caller's alone again once all are polled. Requests that
/// make the device write local memory refuse it, posting nothing.
fn shared_region_in_many_requests_at_once(path: PostPath) {
    let remote_access = LW | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mut p = common::pair_with(QpType::Rc, remote_access, |b| {
        b.post_path(path);
    });
    let data = pattern(4096, 9);
    let shared = Arc::new(p.pd.reg_mr(data.clone(), AccessFlags::empty()).unwrap());
    let mut target = p.pd.alloc_mr(2 * 4096, remote_access).unwrap();
    three_receives(&mut p, 4096);
    let back = p.pd.alloc_mr(2 * 4096, LW).unwrap().chunks(4096).unwrap();
    p.a.post_recv_batch(
        back.into_iter()
            .enumerate()
            .map(|(i, m)| (40 + i as u64, m.into())),
    )
    .unwrap();
    for i in 0..3u64 {
        p.a.post_send(SendWr::send(20 + i, WrBuffers::Shared(Arc::clone(&shared))))
            .unwrap();
    }
    for i in 0..2u64 {
        p.b.post_send(SendWr::send(50 + i, Arc::clone(&shared)))
            .unwrap();
        let at = target.remote().slice(i * 4096, 4096).unwrap();
        p.a.post_send(SendWr::write(30 + i, Arc::clone(&shared), at))
            .unwrap();
    }
    // Seven requests, each with its reference (or done, and its reference
    // waiting in the CQ's completion for the poll).
    assert_eq!(Arc::strong_count(&shared), 8);
    let mut done = wait(&p.cq, 12);
    for id in [10, 11, 12, 40, 41] {
        let mut r = take(&mut done, id);
        assert_eq!(r.status, WcStatus::Success, "{r:?}");
        assert_eq!(r.byte_len, 4096);
        let got = r.take_buffers().into_one().unwrap();
        assert_eq!(got.as_slice().unwrap(), &data[..], "receive {id}");
    }
    for id in [20, 21, 22, 30, 31, 50, 51] {
        let mut s = take(&mut done, id);
        assert_eq!(s.status, WcStatus::Success, "{s:?}");
        let b = s.take_buffers();
        assert!(b.is_shared(), "request {id} gives back {b:?}");
        let a = b.into_shared().unwrap();
        assert!(Arc::ptr_eq(&a, &shared));
    }
    assert_eq!(target.to_vec(), [&data[..], &data[..]].concat());
    assert_eq!(p.a.in_flight(), (0, 0));
    assert_eq!(p.b.in_flight(), (0, 0));

    // Requests whose device writes local memory refuse it, posting nothing.
    let refusals = [
        (
            "RDMA READ",
            p.a.post_send(SendWr::read(
                60,
                Arc::clone(&shared),
                target.remote().slice(0, 4096).unwrap(),
            )),
        ),
        (
            "fetch-and-add",
            p.a.post_send(SendWr::new(
                61,
                SendOp::FetchAdd {
                    remote: target.remote().slice(0, 8).unwrap(),
                    add: 1,
                },
                Arc::clone(&shared),
            )),
        ),
        ("receive", p.b.post_recv(62, Arc::clone(&shared))),
        (
            "receive batch",
            p.b.post_recv_batch([(63, WrBuffers::Shared(Arc::clone(&shared)))]),
        ),
        (
            "SRQ receive",
            p.pd.create_srq(rdma::SrqAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
            })
            .unwrap()
            .post_recv(64, Arc::clone(&shared)),
        ),
    ];
    for (what, r) in refusals {
        let e = r.expect_err(what);
        match &e.error {
            Error::InvalidArgument { verb, reason } => {
                assert!(verb.starts_with("ibv_post_"), "{what}: {verb}");
                assert!(reason.contains("shared region"), "{what}: {reason}");
            }
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(e.returned.len(), 1, "{what}");
        assert!(e.returned[0].1.is_shared(), "{what}");
    }
    assert_eq!(p.a.in_flight(), (0, 0));
    assert_eq!(p.b.in_flight(), (0, 0));

    // A prepared WRITE that shares the region, posted three times at once
    // (each post lends all of it), and a prepared READ that refuses it.
    let second = target.remote().slice(4096, 4096).unwrap();
    let mut write =
        p.a.prepare_send(
            SendOp::Write(second),
            SendFlags::SIGNALED,
            Arc::clone(&shared),
        )
        .unwrap();
    assert_eq!(write.len(), 4096);
    target.write_at(4096, &[0u8; 4096]).unwrap();
    for i in 0..3u64 {
        p.a.post_prepared(&mut write, 70 + i, 0, 4096).unwrap();
    }
    assert_eq!(Arc::strong_count(&shared), 2, "posts take no reference");
    let mut done = wait(&p.cq, 3);
    for i in 0..3u64 {
        let mut c = take(&mut done, 70 + i);
        assert_eq!(c.opcode, WcOpcode::RdmaWrite, "{c:?}");
        assert!(matches!(c.take_buffers(), WrBuffers::None), "{c:?}");
    }
    let mut now = vec![0; 4096];
    target.read_at(4096, &mut now).unwrap();
    assert_eq!(now, data);
    let e = write
        .write_at(0, &[1])
        .expect_err("a shared region is not written through the request");
    assert!(e.to_string().contains("shared"), "{e}");
    let back = write.into_region().expect("nothing in flight");
    assert!(back.is_shared());
    drop(back);
    let e =
        p.a.prepare_send(
            SendOp::Read(second),
            SendFlags::SIGNALED,
            Arc::clone(&shared),
        )
        .expect_err("a READ writes its region");
    assert!(
        matches!(&e.error, Error::InvalidArgument { reason, .. } if reason.contains("shared region")),
        "{e:?}"
    );
    assert!(e.returned[0].1.is_shared());
    drop(e);
    assert_eq!(p.a.in_flight(), (0, 0));
    // Every reference came back: the region is the caller's alone again.
    assert_eq!(Arc::strong_count(&shared), 1);
    let mut mine = Arc::into_inner(shared).unwrap();
    mine.as_mut_slice().unwrap().fill(0);
}

/// The same shared region sent to two UD destinations at once (a fan-out:
/// the pair's other QP and the sender itself), with a prepared UD send as
/// the third request.
fn shared_region_fans_out_over_ud(path: PostPath) {
    let mut p = common::pair_with(QpType::Ud, AccessFlags::empty(), |b| {
        b.post_path(path);
    });
    let ah = local_ah(&p);
    let data = pattern(256, 4);
    let shared = Arc::new(p.pd.reg_mr(data.clone(), AccessFlags::empty()).unwrap());
    p.b.post_recv(1, p.pd.alloc_mr(40 + 256, LW).unwrap())
        .unwrap();
    p.b.post_recv(2, p.pd.alloc_mr(40 + 256, LW).unwrap())
        .unwrap();
    p.a.post_recv(3, p.pd.alloc_mr(40 + 256, LW).unwrap())
        .unwrap();
    p.a.post_send(SendWr::send(10, Arc::clone(&shared)).ud(&ah, p.b.qp_num(), common::QKEY))
        .unwrap();
    p.a.post_send(SendWr::send(11, Arc::clone(&shared)).ud(&ah, p.a.qp_num(), common::QKEY))
        .unwrap();
    let mut prepared =
        p.a.prepare_send_ud(
            SendOp::Send,
            SendFlags::SIGNALED,
            &ah,
            p.b.qp_num(),
            common::QKEY,
            Arc::clone(&shared),
        )
        .unwrap();
    p.a.post_prepared(&mut prepared, 12, 0, 256).unwrap();
    assert_eq!(Arc::strong_count(&shared), 4);
    let mut done = wait(&p.cq, 6);
    for (id, from) in [(1, p.a.qp_num()), (2, p.a.qp_num()), (3, p.a.qp_num())] {
        let mut r = take(&mut done, id).ok().unwrap();
        assert_eq!((r.byte_len, r.src_qp), (40 + 256, from), "receive {id}");
        let buf = r.take_buffers().into_one().unwrap();
        assert_eq!(&buf.as_slice().unwrap()[40..], &data[..], "receive {id}");
    }
    for id in [10, 11] {
        let mut s = take(&mut done, id).ok().unwrap();
        assert!(s.take_buffers().is_shared(), "send {id}");
    }
    let mut s = take(&mut done, 12).ok().unwrap();
    assert!(
        matches!(s.take_buffers(), WrBuffers::None),
        "the prepared send"
    );
    assert_eq!(Arc::strong_count(&shared), 2, "the prepared request's");
    drop(prepared);
    assert_eq!(Arc::strong_count(&shared), 1);
}

both_paths!(
    shared_region_in_many_requests_at_once,
    shared_region_fans_out_over_ud
);
