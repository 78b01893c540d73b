//! Traffic over the safe post path: every operation and QP type, data checked
//! byte for byte. Modelled on rdma-core's tests/test_qp.py, test_qpex.py and
//! test_atomic.py; two QPs on the test device talk to each other.

mod common;

use common::{take, wait};
use std::sync::Arc;

use rdma::{
    AccessFlags, AhAttr, Error, InlineSend, PostPath, QpType, SendFlags, SendOp, SendWr, WcOpcode,
    WcStatus, WrBuffers,
};

const LW: AccessFlags = AccessFlags::LOCAL_WRITE;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn rc_send_receive_returns_memory_with_the_data(path: PostPath) {
    let mut p = common::pair_with(QpType::Rc, AccessFlags::empty(), |b| {
        b.post_path(path);
    });
    let data = pattern(4096, 7);
    let recv = p.pd.alloc_mr(4096, LW).unwrap();
    let send = p.pd.reg_mr(data.clone(), AccessFlags::empty()).unwrap();
    p.b.post_recv(11, recv).unwrap();
    p.a.post_send(SendWr::send(22, send)).unwrap();
    assert_eq!(p.a.in_flight(), (1, 0));
    assert_eq!(p.b.in_flight(), (0, 1));
    let mut done = wait(&p.cq, 2);
    let mut r = take(&mut done, 11);
    let mut s = take(&mut done, 22);
    assert_eq!(r.status, WcStatus::Success, "{r:?}");
    assert_eq!(s.status, WcStatus::Success, "{s:?}");
    assert_eq!(r.opcode, WcOpcode::Recv);
    assert_eq!(s.opcode, WcOpcode::Send);
    assert_eq!(r.byte_len, 4096);
    assert_eq!(r.qp_num, p.b.qp_num());
    let got = r
        .take_buffers()
        .into_one()
        .expect("the receive buffer comes back");
    assert_eq!(got.as_slice().unwrap(), &data[..]);
    let sent = s
        .take_buffers()
        .into_one()
        .expect("the send buffer comes back");
    assert_eq!(sent.as_slice().unwrap(), &data[..]);
    assert_eq!(p.a.in_flight(), (0, 0));
    assert_eq!(p.b.in_flight(), (0, 0));
}

fn send_with_immediate_and_zero_length(path: PostPath) {
    let mut p = common::pair_with(QpType::Rc, AccessFlags::empty(), |b| {
        b.post_path(path);
    });
    p.b.post_recv(1, p.pd.alloc_mr(64, LW).unwrap()).unwrap();
    p.b.post_recv(2, p.pd.alloc_mr(64, LW).unwrap()).unwrap();
    let msg =
        p.pd.reg_mr(b"hello".to_vec(), AccessFlags::empty())
            .unwrap();
    p.a.post_send(SendWr::send(3, msg).with_imm(0xdead_beef))
        .unwrap();
    p.a.post_send(SendWr::send(4, Vec::new())).unwrap();
    let mut done = wait(&p.cq, 4);
    let r1 = take(&mut done, 1);
    assert_eq!(r1.imm(), Some(0xdead_beef));
    assert_eq!(r1.byte_len, 5);
    let r2 = take(&mut done, 2);
    assert_eq!(
        (r2.status, r2.byte_len, r2.imm()),
        (WcStatus::Success, 0, None)
    );
    assert!(done.iter().all(|c| c.is_success()), "{done:?}");
}

fn rdma_write_read_and_write_with_immediate(path: PostPath) {
    let remote_access =
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mut p = common::pair_with(QpType::Rc, remote_access, |b| {
        b.post_path(path);
    });
    let target = p.pd.alloc_mr(8192, remote_access).unwrap();
    let remote = target.remote();
    let data = pattern(8192, 3);
    let src = p.pd.reg_mr(data.clone(), AccessFlags::empty()).unwrap();
    p.a.post_send(SendWr::write(1, src, remote)).unwrap();
    let c = wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    assert_eq!(c.opcode, WcOpcode::RdmaWrite);
    // The target grants remote write: no safe slice, but a copy works.
    assert!(target.as_slice().is_err());
    assert_eq!(target.to_vec(), data);

    // READ it back into a fresh buffer.
    let dst = p.pd.alloc_mr(8192, LW).unwrap();
    p.a.post_send(SendWr::read(2, dst, remote)).unwrap();
    let mut c = wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    assert_eq!(c.opcode, WcOpcode::RdmaRead);
    assert_eq!(
        c.take_buffers().into_one().unwrap().as_slice().unwrap(),
        &data[..]
    );

    // WRITE_WITH_IMM consumes a receive at the target QP.
    p.b.post_recv(3, Vec::new()).unwrap();
    let small = p.pd.reg_mr(vec![0xab; 16], AccessFlags::empty()).unwrap();
    p.a.post_send(SendWr::write(4, small, remote.slice(100, 16).unwrap()).with_imm(77))
        .unwrap();
    let mut done = wait(&p.cq, 2);
    let r = take(&mut done, 3);
    assert_eq!(r.opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(r.imm(), Some(77));
    let mut now = vec![0; 16];
    target.read_at(100, &mut now).unwrap();
    assert_eq!(now, [0xab; 16]);
}

fn atomics_compare_swap_and_fetch_add(path: PostPath) {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC;
    let mut p = common::pair_with(QpType::Rc, access, |b| {
        b.post_path(path);
    });
    let mut word = p.pd.alloc_mr(8, access).unwrap();
    word.write_at(0, &5u64.to_ne_bytes()).unwrap();
    let remote = word.remote();
    let result = p.pd.alloc_mr(8, LW).unwrap();
    p.a.post_send(SendWr::fetch_add(1, result, remote, 10))
        .unwrap();
    let mut c = wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    assert_eq!(c.opcode, WcOpcode::FetchAdd);
    let result = c.take_buffers().into_one().unwrap();
    assert_eq!(result.as_slice().unwrap(), &5u64.to_ne_bytes());
    let mut now = [0; 8];
    word.read_at(0, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 15);

    p.a.post_send(SendWr::compare_swap(2, result, remote, 15, 99))
        .unwrap();
    let mut c = wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    assert_eq!(c.opcode, WcOpcode::CompSwap);
    let result = c.take_buffers().into_one().unwrap();
    assert_eq!(result.as_slice().unwrap(), &15u64.to_ne_bytes());
    word.read_at(0, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 99);
    // A compare that does not match leaves the word alone.
    p.a.post_send(SendWr::compare_swap(3, result, remote, 1, 2))
        .unwrap();
    let mut c = wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    assert_eq!(
        c.take_buffers().into_one().unwrap().as_slice().unwrap(),
        &99u64.to_ne_bytes()
    );
    word.read_at(0, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 99);
}

fn multi_sge_batch_and_unsignaled_sends(path: PostPath) {
    let mut p = common::pair_with(QpType::Rc, AccessFlags::empty(), |b| {
        b.post_path(path).max_send_sge(3).max_recv_sge(3);
    });
    // Three receive pieces cut from one registration, gathered into one WR.
    let recv = p.pd.alloc_mr(300, LW).unwrap().chunks(100).unwrap();
    p.b.post_recv(1, recv).unwrap();
    let parts: Vec<_> = [pattern(50, 1), pattern(120, 2), pattern(130, 3)]
        .into_iter()
        .map(|d| p.pd.reg_mr(d, AccessFlags::empty()).unwrap())
        .collect();
    let expected: Vec<u8> = parts.iter().flat_map(|m| m.to_vec()).collect();
    p.a.post_send(SendWr::send(2, parts)).unwrap();
    let mut done = wait(&p.cq, 2);
    let mut r = take(&mut done, 1);
    assert_eq!(r.byte_len, 300);
    let pieces = r.take_buffers().into_vec();
    assert_eq!(pieces.len(), 3);
    let got: Vec<u8> = pieces.iter().flat_map(|m| m.to_vec()).collect();
    assert_eq!(got, expected);

    // A batch of 8 sends with one doorbell, only the last one signaled.
    let recvs = p.pd.alloc_mr(8 * 64, LW).unwrap().chunks(64).unwrap();
    p.b.post_recv_batch(
        recvs
            .into_iter()
            .enumerate()
            .map(|(i, m)| (100 + i as u64, m.into())),
    )
    .unwrap();
    let sends: Vec<SendWr> = (0..8u64)
        .map(|i| {
            let m =
                p.pd.reg_mr(vec![i as u8; 64], AccessFlags::empty())
                    .unwrap();
            SendWr::send(200 + i, m).signaled(i == 7)
        })
        .collect();
    p.a.post_send_batch(sends).unwrap();
    let mut done = wait(&p.cq, 9);
    let last = take(&mut done, 207);
    let ids: Vec<u64> = last.unsignaled.iter().map(|(id, _)| *id).collect();
    assert_eq!(
        ids,
        (200..207).collect::<Vec<_>>(),
        "unsignaled memory comes back in order"
    );
    assert!(last.unsignaled.iter().all(|(_, b)| b.len() == 1));
    for i in 0..8u64 {
        let mut r = take(&mut done, 100 + i);
        assert_eq!(
            r.take_buffers().into_one().unwrap().as_slice().unwrap(),
            &[i as u8; 64][..]
        );
    }
    assert_eq!(p.a.in_flight(), (0, 0));
}

fn inline_send_copies_at_post_time(path: PostPath) {
    let mut p = common::pair_with(QpType::Rc, AccessFlags::empty(), |b| {
        b.post_path(path).max_inline_data(64);
    });
    assert!(p.a.caps().max_inline_data >= 64);
    p.b.post_recv(1, p.pd.alloc_mr(64, LW).unwrap()).unwrap();
    let mut data = pattern(48, 9);
    p.a.post_send_inline(InlineSend::send(2, &data)).unwrap();
    data.fill(0); // the provider already copied it
    let mut done = wait(&p.cq, 2);
    let mut r = take(&mut done, 1);
    assert_eq!(r.byte_len, 48);
    assert_eq!(
        &r.take_buffers().into_one().unwrap().as_slice().unwrap()[..48],
        &pattern(48, 9)[..]
    );
    let too_big = vec![0u8; p.a.caps().max_inline_data as usize + 1];
    let err =
        p.a.post_send_inline(InlineSend::send(3, &too_big))
            .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("inline"), "{err}");
}

fn uc_send_and_write(path: PostPath) {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mut p = common::pair_with(QpType::Uc, access, |b| {
        b.post_path(path);
    });
    p.b.post_recv(1, p.pd.alloc_mr(256, LW).unwrap()).unwrap();
    p.a.post_send(SendWr::send(
        2,
        p.pd.reg_mr(pattern(256, 4), AccessFlags::empty()).unwrap(),
    ))
    .unwrap();
    let mut done = wait(&p.cq, 2);
    let mut r = take(&mut done, 1).ok().unwrap();
    assert_eq!(
        r.take_buffers().into_one().unwrap().to_vec(),
        pattern(256, 4)
    );
    let target = p.pd.alloc_mr(256, access).unwrap();
    p.a.post_send(SendWr::write(
        3,
        p.pd.reg_mr(pattern(256, 5), AccessFlags::empty()).unwrap(),
        target.remote(),
    ))
    .unwrap();
    wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    assert_eq!(target.to_vec(), pattern(256, 5));
}

/// An address handle to the test port's own GID (the pair's QPs are on it).
fn local_ah(p: &common::Pair) -> rdma::AddressHandle {
    let gid = p.ctx.query_gid(1, u32::from(p.gid_index)).unwrap();
    p.pd.create_ah(&AhAttr::global(1, gid, p.gid_index))
        .unwrap()
}

fn ud_send_with_grh_and_reply_address(path: PostPath) {
    let mut p = common::pair_with(QpType::Ud, AccessFlags::empty(), |b| {
        b.post_path(path);
    });
    let ah = local_ah(&p);
    // UD receives get the 40-byte GRH first.
    p.b.post_recv(1, p.pd.alloc_mr(40 + 512, LW).unwrap())
        .unwrap();
    let msg = p.pd.reg_mr(pattern(512, 6), AccessFlags::empty()).unwrap();
    p.a.post_send(SendWr::send(2, msg).ud(&ah, p.b.qp_num(), common::QKEY))
        .unwrap();
    drop(ah); // the send in flight keeps the AH alive
    let mut done = wait(&p.cq, 2);
    let mut r = take(&mut done, 1).ok().unwrap();
    assert_eq!(r.byte_len, 40 + 512);
    assert_eq!(r.src_qp, p.a.qp_num());
    assert!(r.wc_flags.contains(rdma::WcFlags::GRH));
    let buf = r.take_buffers().into_one().unwrap();
    let bytes = buf.as_slice().unwrap();
    assert_eq!(&bytes[40..], &pattern(512, 6)[..]);
    // An AH built from the completion answers the sender.
    let grh: [u8; 40] = bytes[..40].try_into().unwrap();
    let back = p.pd.create_ah_from_wc(1, &r, &grh).unwrap();
    p.a.post_recv(3, p.pd.alloc_mr(40 + 8, LW).unwrap())
        .unwrap();
    let reply = p.pd.reg_mr(vec![1u8; 8], AccessFlags::empty()).unwrap();
    p.b.post_send(SendWr::send(4, reply).ud(&back, r.src_qp, common::QKEY))
        .unwrap();
    let mut done = wait(&p.cq, 2);
    assert_eq!(take(&mut done, 3).ok().unwrap().byte_len, 48);
}

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

/// Runs a traffic test over both send paths: `NAME::legacy` uses
/// `ibv_post_send`, `NAME::extended` the `ibv_wr_*` API.
macro_rules! both_paths {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                #[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
                fn legacy() {
                    super::$name(rdma::PostPath::Legacy);
                }

                #[test]
                #[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
                fn extended() {
                    super::$name(rdma::PostPath::Extended);
                }

                #[test]
                #[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
                fn auto() {
                    super::$name(rdma::PostPath::Auto);
                }
            }
        )*
    };
}

/// Like `both_paths!` for requests that rdma-core 44's rxe provider gets
/// wrong on the `ibv_wr_*` path (scatter lists, inline data): legacy and
/// auto (which routes them through `ibv_post_send`).
macro_rules! legacy_and_auto {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                #[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
                fn legacy() {
                    super::$name(rdma::PostPath::Legacy);
                }

                #[test]
                #[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
                fn auto() {
                    super::$name(rdma::PostPath::Auto);
                }
            }
        )*
    };
}

/// Posts three `len`-byte receives on `p.b` (ids 10..13), pieces of one
/// registration.
fn three_receives(p: &mut common::Pair, len: usize) {
    let recvs = p.pd.alloc_mr(3 * len, LW).unwrap().chunks(len).unwrap();
    p.b.post_recv_batch(
        recvs
            .into_iter()
            .enumerate()
            .map(|(i, m)| (10 + i as u64, m.into())),
    )
    .unwrap();
}

/// Posts three 32-byte receives on `p.b` (ids 10..13) and three sends of
/// bytes 1, 2, 3 on `p.a` (ids 20..23), signaled where `signaled(i)`.
fn three_receives_and_sends(p: &mut common::Pair, signaled: impl Fn(u64) -> bool) {
    three_receives(p, 32);
    for i in 0..3u64 {
        let m =
            p.pd.reg_mr(vec![i as u8 + 1; 32], AccessFlags::empty())
                .unwrap();
        p.a.post_send(SendWr::send(20 + i, m).signaled(signaled(i)))
            .unwrap();
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn poll_one_returns_memory_of_signaled_and_unsignaled_requests() {
    let mut p = common::pair(QpType::Rc, AccessFlags::empty());
    assert!(p.cq.poll_one().unwrap().is_none(), "a new CQ is empty");
    three_receives_and_sends(&mut p, |i| i == 2);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut done = Vec::new();
    while done.len() < 4 {
        match p.cq.poll_one().unwrap() {
            Some(c) => done.push(c.ok().unwrap()),
            None => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "lost completion: {done:?}"
                );
                std::thread::yield_now();
            }
        }
    }
    assert!(
        p.cq.poll_one().unwrap().is_none(),
        "four completions, no more"
    );
    let mut send = take(&mut done, 22);
    let ids: Vec<u64> = send.unsignaled.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, [20, 21]);
    assert_eq!(
        send.take_buffers().into_one().unwrap().to_vec(),
        vec![3u8; 32]
    );
    for i in 0..3u64 {
        let mut r = take(&mut done, 10 + i);
        assert_eq!(r.byte_len, 32);
        assert_eq!(
            r.take_buffers().into_one().unwrap().to_vec(),
            vec![i as u8 + 1; 32]
        );
    }
    assert_eq!((p.a.in_flight(), p.b.in_flight()), ((0, 0), (0, 0)));
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn poll_one_into_reuses_one_slot() {
    let mut p = common::pair(QpType::Rc, AccessFlags::empty());
    let mut slot = None;
    assert!(p.cq.poll_one_into(&mut slot).unwrap().is_none());
    assert!(slot.is_none(), "an empty CQ leaves the slot alone");
    three_receives_and_sends(&mut p, |i| i != 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // (wr_id, unsignaled ids, data of the request's memory)
    let mut seen: Vec<(u64, Vec<u64>, Vec<u8>)> = Vec::new();
    while seen.len() < 5 {
        match p.cq.poll_one_into(&mut slot).unwrap() {
            Some(c) => {
                assert!(c.is_success(), "{c:?}");
                let unsignaled = c.unsignaled.iter().map(|(id, _)| *id).collect();
                let data = c.take_buffers().into_one().unwrap().to_vec();
                seen.push((c.wr_id, unsignaled, data));
            }
            None => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "lost completion: {seen:?}"
                );
                std::thread::yield_now();
            }
        }
    }
    let last = slot.as_ref().map(|c| c.wr_id);
    assert!(p.cq.poll_one_into(&mut slot).unwrap().is_none());
    assert_eq!(
        slot.as_ref().map(|c| c.wr_id),
        last,
        "an empty CQ keeps the last completion in the slot"
    );
    seen.sort_by_key(|(id, _, _)| *id);
    let expect: Vec<(u64, Vec<u64>, Vec<u8>)> = vec![
        (10, vec![], vec![1; 32]),
        (11, vec![], vec![2; 32]),
        (12, vec![], vec![3; 32]),
        // The first send was unsignaled: its memory comes with the second's
        // completion, and the slot's list of it is cleared for the third.
        (21, vec![20], vec![2; 32]),
        (22, vec![], vec![3; 32]),
    ];
    assert_eq!(seen, expect);
    assert_eq!((p.a.in_flight(), p.b.in_flight()), ((0, 0), (0, 0)));
}

/// The compact poll: each completion's id is the caller's, resolved where
/// the provider wrote it, and the memory of the requests it finishes comes
/// back beside it, in posting order per queue (an unsignaled send's before
/// the signaled one's); a prepared request's sends add nothing.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn poll_wc_resolves_in_place_and_returns_memory_beside() {
    let mut p = common::pair(QpType::Rc, AccessFlags::REMOTE_WRITE);
    let mut wcs = [rdma::WorkCompletion::default(); 2];
    let mut memory = Vec::new();
    assert_eq!(
        p.cq.poll_wc(&mut wcs, &mut memory).unwrap(),
        0,
        "a new CQ is empty"
    );
    assert_eq!(
        p.cq.poll_wc(&mut [], &mut memory).unwrap(),
        0,
        "no room, no poll"
    );
    three_receives_and_sends(&mut p, |i| i != 0);
    let target = p.pd.alloc_mr(8, LW | AccessFlags::REMOTE_WRITE).unwrap();
    let mut write =
        p.a.prepare_send(
            SendOp::Write(target.remote()),
            SendFlags::SIGNALED,
            p.pd.reg_mr(vec![9u8; 8], AccessFlags::empty()).unwrap(),
        )
        .unwrap();
    p.a.post_prepared(&mut write, 30, 0, 8).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut seen = Vec::new();
    // At most two per poll: the batches end in the middle of the six.
    while seen.len() < 6 {
        let n = p.cq.poll_wc(&mut wcs, &mut memory).unwrap();
        for wc in &wcs[..n] {
            assert!(wc.ok().is_ok(), "{wc:?}");
            seen.push((wc.wr_id(), wc.opcode(), wc.byte_len()));
        }
        if n == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "lost completion: {seen:?}"
            );
            std::thread::yield_now();
        }
    }
    assert_eq!(
        p.cq.poll_wc(&mut wcs, &mut memory).unwrap(),
        0,
        "six, no more"
    );
    seen.sort_by_key(|s| s.0);
    let ids: Vec<u64> = seen.iter().map(|s| s.0).collect();
    assert_eq!(ids, [10, 11, 12, 21, 22, 30], "the callers' ids");
    assert!(seen[..3].iter().all(|s| s.1 == WcOpcode::Recv && s.2 == 32));
    assert_eq!(seen[5].1, WcOpcode::RdmaWrite);
    let back: Vec<(u64, Vec<u8>)> = memory
        .drain(..)
        .map(|(id, b)| (id, b.into_one().unwrap().to_vec()))
        .collect();
    let sends: Vec<_> = back.iter().filter(|(id, _)| *id >= 20).cloned().collect();
    assert_eq!(
        sends,
        [(20, vec![1; 32]), (21, vec![2; 32]), (22, vec![3; 32])],
        "each send's memory, the unsignaled one first; none for the prepared WRITE"
    );
    let mut recvs: Vec<_> = back.into_iter().filter(|(id, _)| *id < 20).collect();
    recvs.sort_by_key(|r| r.0);
    assert_eq!(
        recvs,
        [(10, vec![1; 32]), (11, vec![2; 32]), (12, vec![3; 32])]
    );
    let mut now = [0u8; 8];
    target.read_at(0, &mut now).unwrap();
    assert_eq!(now, [9; 8], "the prepared WRITE landed");
    assert_eq!((p.a.in_flight(), p.b.in_flight()), ((0, 0), (0, 0)));
}

/// `prepare_recv`: receives lend slots of one region, each completion
/// carries the caller's id and no memory, each message is read from its
/// slot; bad slots, other QPs and regions the post would refuse are
/// refused up front.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn prepared_receives_lend_slots_of_their_region() {
    let mut p = common::pair(QpType::Rc, AccessFlags::empty());
    let e =
        p.b.prepare_recv(p.pd.alloc_mr(96, AccessFlags::empty()).unwrap(), 32)
            .expect_err("receive memory needs LOCAL_WRITE");
    assert!(e.error.to_string().contains("LOCAL_WRITE"), "{}", e.error);
    assert_eq!(e.returned.len(), 1, "the region comes back");
    let e =
        p.b.prepare_recv(p.pd.alloc_mr(96, LW).unwrap(), 0)
            .expect_err("empty slots");
    assert!(
        e.error.to_string().contains("slots of 0 bytes"),
        "{}",
        e.error
    );
    let mut recvs =
        p.b.prepare_recv(p.pd.alloc_mr(100, LW).unwrap(), 32)
            .unwrap();
    assert_eq!(
        (recvs.slots(), recvs.slot_len()),
        (3, 32),
        "the tail is unused"
    );
    let e =
        p.b.post_prepared_recv(&mut recvs, 7, 3)
            .expect_err("slot 3 of 3");
    assert!(e.to_string().contains("slot 3"), "{e}");
    let e =
        p.a.post_prepared_recv(&mut recvs, 7, 0)
            .expect_err("prepared by b");
    assert!(e.to_string().contains("another QP"), "{e}");
    assert!(!recvs.in_flight());
    for slot in 0..3 {
        p.b.post_prepared_recv(&mut recvs, 40 + slot as u64, slot)
            .unwrap();
    }
    assert!(recvs.in_flight());
    for i in 0..3u64 {
        let len = 8 * (i as usize + 1);
        let m =
            p.pd.reg_mr(pattern(len, i as u8), AccessFlags::empty())
                .unwrap();
        p.a.post_send(SendWr::send(20 + i, m)).unwrap();
    }
    let mut wcs = [rdma::WorkCompletion::default(); 8];
    let mut memory = Vec::new();
    let mut recv_ids = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut seen = 0;
    while seen < 6 {
        let n = p.cq.poll_wc(&mut wcs, &mut memory).unwrap();
        for wc in &wcs[..n] {
            assert!(wc.is_success(), "{wc:?}");
            if wc.opcode() == WcOpcode::Recv {
                recv_ids.push((wc.wr_id(), wc.byte_len()));
            }
        }
        seen += n;
        assert!(std::time::Instant::now() < deadline, "lost completion");
    }
    assert_eq!(
        recv_ids,
        [(40, 8), (41, 16), (42, 24)],
        "in order, the callers' ids"
    );
    assert!(
        memory.iter().all(|(id, _)| *id >= 20),
        "prepared receives give no memory back: {memory:?}"
    );
    for i in 0..3usize {
        let len = 8 * (i + 1);
        let mut got = vec![0; len];
        recvs.read_at(i, 0, &mut got).unwrap();
        assert_eq!(got, pattern(len, i as u8), "slot {i}");
    }
    let e = recvs
        .read_at(2, 30, &mut [0; 4])
        .expect_err("past the slot");
    assert!(e.to_string().contains("slot 2"), "{e}");
    assert!(!recvs.in_flight());
    let mr = recvs.into_region().expect("nothing in flight");
    assert_eq!(mr.len(), 100);
    assert_eq!((p.a.in_flight(), p.b.in_flight()), ((0, 0), (0, 0)));
}

/// A prepared receive region dropped while a receive is in flight stays
/// registered: the message that arrives afterwards completes without error,
/// and the region goes with that completion.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn prepared_receive_region_dropped_in_flight_stays_registered() {
    let mut p = common::pair(QpType::Rc, AccessFlags::empty());
    let mut recvs =
        p.b.prepare_recv(p.pd.alloc_mr(64, LW).unwrap(), 64)
            .unwrap();
    p.b.post_prepared_recv(&mut recvs, 5, 0).unwrap();
    let recvs = recvs.into_region().expect_err("in flight: refused");
    drop(recvs);
    assert_eq!(p.b.in_flight(), (0, 1));
    let m = p.pd.reg_mr(vec![7u8; 64], AccessFlags::empty()).unwrap();
    p.a.post_send(SendWr::send(6, m)).unwrap();
    let mut done = wait(&p.cq, 2);
    let r = take(&mut done, 5);
    assert!(
        r.is_success(),
        "the dropped region was still registered: {r:?}"
    );
    assert_eq!(r.byte_len, 64);
    assert_eq!((p.a.in_flight(), p.b.in_flight()), ((0, 0), (0, 0)));
}

/// Posting and polling on different threads: one thread posts receives on
/// `b`, another posts sends on `a` (every fourth signaled), and the main
/// thread polls the shared CQ and hands the memory back to its poster. A
/// completion can be polled before the post that caused it has returned;
/// every one must still come back with its request's memory, in order, and
/// the receives with the data sent.
fn posts_and_polls_on_different_threads(path: PostPath) {
    use std::sync::mpsc;
    use std::time::{Duration, Instant};
    const N: u64 = 3000;
    const POOL: usize = 24;
    const SIZE: usize = 64;
    let mut p = common::pair_with(QpType::Rc, AccessFlags::empty(), |b| {
        b.post_path(path).max_send_wr(64).max_recv_wr(64);
    });
    let (pd, cq, a, b) = (&p.pd, &p.cq, &mut p.a, &mut p.b);
    let deadline = Instant::now() + Duration::from_secs(60);
    let (credit_tx, credit_rx) = mpsc::channel::<()>();
    let (send_back, send_pool) = mpsc::channel::<rdma::MemoryRegion>();
    let (recv_back, recv_pool) = mpsc::channel::<rdma::MemoryRegion>();
    for _ in 0..POOL {
        send_back
            .send(pd.alloc_mr(SIZE, AccessFlags::empty()).unwrap())
            .unwrap();
        recv_back.send(pd.alloc_mr(SIZE, LW).unwrap()).unwrap();
    }
    std::thread::scope(|s| {
        s.spawn(move || {
            for i in 0..N {
                let m = recv_pool
                    .recv_timeout(Duration::from_secs(30))
                    .expect("receive buffer back");
                b.post_recv(i, m).unwrap();
                credit_tx.send(()).unwrap();
            }
        });
        s.spawn(move || {
            for i in 0..N {
                credit_rx
                    .recv_timeout(Duration::from_secs(30))
                    .expect("a receive posted");
                let mut m = send_pool
                    .recv_timeout(Duration::from_secs(30))
                    .expect("send buffer back");
                m.as_mut_slice().unwrap().fill(i as u8);
                m.as_mut_slice().unwrap()[..8].copy_from_slice(&i.to_le_bytes());
                let signaled = i % 4 == 3 || i == N - 1;
                a.post_send(SendWr::send(1_000_000 + i, m).signaled(signaled))
                    .unwrap();
            }
        });
        let (mut sent, mut received) = (0u64, 0u64);
        while sent < N || received < N {
            let Some(mut c) = cq.poll_one().unwrap() else {
                assert!(
                    Instant::now() < deadline,
                    "lost completion: {sent} sent, {received} received"
                );
                std::thread::yield_now();
                continue;
            };
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            if c.opcode == WcOpcode::Recv {
                assert_eq!(c.wr_id, received, "receives complete in order");
                assert_eq!(c.byte_len as usize, SIZE);
                let m = c.take_buffers().into_one().expect("the receive's memory");
                let data = m.to_vec();
                assert_eq!(
                    data[..8],
                    received.to_le_bytes(),
                    "the data of send {received}"
                );
                assert!(data[8..].iter().all(|&x| x == received as u8));
                received += 1;
                // The poster may be done; a closed channel is fine then.
                let _ = recv_back.send(m);
            } else {
                let unsignaled: Vec<(u64, rdma::WrBuffers)> = std::mem::take(&mut c.unsignaled);
                for (id, bufs) in unsignaled.into_iter().chain([(c.wr_id, c.take_buffers())]) {
                    assert_eq!(id, 1_000_000 + sent, "sends complete in order");
                    let _ = send_back.send(bufs.into_one().expect("the send's memory"));
                    sent += 1;
                }
            }
        }
    });
    assert_eq!((p.a.in_flight(), p.b.in_flight()), ((0, 0), (0, 0)));
    assert!(
        p.cq.poll_one().unwrap().is_none(),
        "no completion left over"
    );
}

/// Asserts that `qp` refuses to post `foreign`, a request another QP
/// prepared (with a region of at least 8 bytes).
fn refuses_a_foreign_template(qp: &mut rdma::QueuePair, foreign: &mut rdma::PreparedSend) {
    let (before, _) = qp.in_flight();
    let err = qp.post_prepared(foreign, 99, 0, 8).unwrap_err();
    assert!(err.to_string().contains("prepared by another QP"), "{err}");
    assert_eq!(qp.in_flight().0, before, "nothing posted");
}

/// Prepared requests: `prepare_send` once with a region the request owns,
/// `post_prepared` lending a range of it each time; the completions carry
/// the caller's ids and no memory, the region stays with the request.
fn prepared_requests_lend_ranges_of_their_region(path: PostPath) {
    let access =
        LW | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let mut p = common::pair_with(QpType::Rc, access, |b| {
        b.post_path(path);
    });
    let mut target = p.pd.alloc_mr(4096, access).unwrap();
    let remote = target.remote();

    // One prepared WRITE, posted three times with new bytes, then from an
    // offset into its region.
    let window = remote.slice(0, 256).unwrap();
    let mut write =
        p.a.prepare_send(
            SendOp::Write(window),
            SendFlags::SIGNALED,
            p.pd.alloc_mr(256, AccessFlags::empty()).unwrap(),
        )
        .unwrap();
    assert_eq!(
        (write.op(), write.flags(), write.len()),
        (SendOp::Write(window), SendFlags::SIGNALED, 256)
    );
    for i in 0..3u8 {
        let data = pattern(200 + usize::from(i), i);
        write.write_at(0, &data).unwrap();
        p.a.post_prepared(&mut write, 100 + u64::from(i), 0, data.len())
            .unwrap();
        assert!(write.in_flight(), "posted, not polled yet");
        let mut c = wait(&p.cq, 1).pop().unwrap().ok().unwrap();
        assert_eq!(
            (c.wr_id, c.opcode),
            (100 + u64::from(i), WcOpcode::RdmaWrite)
        );
        assert!(matches!(c.take_buffers(), WrBuffers::None), "nothing moved");
        assert!(!write.in_flight(), "its completion was polled");
        let mut now = vec![0; data.len()];
        target.read_at(0, &mut now).unwrap();
        assert_eq!(now, data, "write {i} landed");
    }
    write.write_at(0, &pattern(256, 7)).unwrap();
    p.a.post_prepared(&mut write, 103, 56, 200).unwrap();
    wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    let mut now = vec![0; 200];
    target.read_at(0, &mut now).unwrap();
    assert_eq!(
        now,
        pattern(256, 7)[56..],
        "the range at offset 56 was sent"
    );

    // READ back into the request's region, which the device writes.
    let mut read =
        p.a.prepare_send(
            SendOp::Read(remote.slice(0, 202).unwrap()),
            SendFlags::SIGNALED,
            p.pd.alloc_mr(202, LW).unwrap(),
        )
        .unwrap();
    p.a.post_prepared(&mut read, 7, 0, 202).unwrap();
    let c = wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    assert_eq!(
        (c.wr_id, c.opcode, c.byte_len),
        (7, WcOpcode::RdmaRead, 202)
    );
    let mut got = vec![0; 202];
    read.read_at(0, &mut got).unwrap();
    let mut expected = pattern(256, 7)[56..].to_vec();
    expected.extend_from_slice(&pattern(202, 2)[200..]);
    assert_eq!(got, expected);
    // FETCH_ADD twice, into the two words of its region.
    target.write_at(1024, &41u64.to_ne_bytes()).unwrap();
    let word = remote.slice(1024, 8).unwrap();
    let mut add =
        p.a.prepare_send(
            SendOp::FetchAdd {
                remote: word,
                add: 1,
            },
            SendFlags::SIGNALED,
            p.pd.alloc_mr(16, LW).unwrap(),
        )
        .unwrap();
    for (at, old) in [(0usize, 41u64), (8, 42)] {
        p.a.post_prepared(&mut add, old, at, 8).unwrap();
        let c = wait(&p.cq, 1).pop().unwrap().ok().unwrap();
        let mut got = [0u8; 8];
        add.read_at(at, &mut got).unwrap();
        assert_eq!(
            (c.wr_id, c.opcode, got),
            (old, WcOpcode::FetchAdd, old.to_ne_bytes())
        );
    }

    // SEND: unsignaled posts are done with the next signaled one, and are
    // not listed (they hold nothing).
    three_receives(&mut p, 8);
    let mut region = p.pd.alloc_mr(24, AccessFlags::empty()).unwrap();
    for id in 0..3u8 {
        region.write_at(usize::from(id) * 8, &[id + 1; 8]).unwrap();
    }
    let mut send =
        p.a.prepare_send(SendOp::Send, SendFlags::empty(), region)
            .unwrap();
    for id in 1..=3u8 {
        send.set_signaled(id == 3);
        p.a.post_prepared(&mut send, u64::from(id), usize::from(id - 1) * 8, 8)
            .unwrap();
    }
    let mut done = wait(&p.cq, 4);
    let sent = take(&mut done, 3).ok().unwrap();
    assert!(sent.unsignaled.is_empty(), "{sent:?}");
    for i in 0..3u8 {
        let mut r = take(&mut done, 10 + u64::from(i)).ok().unwrap();
        assert_eq!(
            r.take_buffers().into_one().unwrap().to_vec(),
            vec![i + 1; 8]
        );
    }
    assert_eq!((p.a.in_flight(), p.b.in_flight()), ((0, 0), (0, 0)));
    let region = send.into_region().expect("nothing in flight");
    assert_eq!(region.into_one().unwrap().to_vec()[16..], [3; 8]);

    // Bad input: refused before posting.
    let err = p.a.post_prepared(&mut write, 50, 0, 300).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidArgument {
                verb: "ibv_post_send",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("outside the prepared request's region of 256 bytes"),
        "{err}"
    );
    let err = p.a.post_prepared(&mut write, 50, 250, 7).unwrap_err();
    assert!(err.to_string().contains("outside"), "{err}");
    let err =
        p.a.post_prepared(&mut write, 50, usize::MAX, 2)
            .unwrap_err();
    assert!(err.to_string().contains("outside"), "{err}");
    let mut wide =
        p.a.prepare_send(
            SendOp::Write(window),
            SendFlags::SIGNALED,
            p.pd.alloc_mr(512, AccessFlags::empty()).unwrap(),
        )
        .unwrap();
    let err = p.a.post_prepared(&mut wide, 50, 0, 300).unwrap_err();
    assert!(
        err.to_string()
            .contains("300 bytes do not fit the remote range of 256 bytes"),
        "{err}"
    );
    let err = p.a.post_prepared(&mut add, 52, 0, 16).unwrap_err();
    assert!(
        err.to_string().contains(
            "exactly one 8-byte local buffer (one scatter/gather entry); got 1 entries of 16 bytes"
        ),
        "{err}"
    );
    let err =
        p.a.prepare_send(
            SendOp::Read(window),
            SendFlags::SIGNALED,
            p.pd.alloc_mr(8, AccessFlags::empty()).unwrap(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("without LOCAL_WRITE"), "{err}");
    assert_eq!(err.returned.len(), 1, "the region comes back");
    let other_pd = p.ctx.alloc_pd().unwrap();
    let err =
        p.a.prepare_send(
            SendOp::Write(window),
            SendFlags::SIGNALED,
            other_pd.alloc_mr(8, AccessFlags::empty()).unwrap(),
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("another protection domain"),
        "{err}"
    );
    let err =
        p.a.prepare_send(
            SendOp::Write(window),
            SendFlags::SIGNALED,
            vec![
                p.pd.alloc_mr(8, AccessFlags::empty()).unwrap(),
                p.pd.alloc_mr(8, AccessFlags::empty()).unwrap(),
            ],
        )
        .unwrap_err();
    assert!(err.to_string().contains("owns one region"), "{err}");
    let mut b_write =
        p.b.prepare_send(
            SendOp::Write(remote),
            SendFlags::SIGNALED,
            p.pd.alloc_mr(8, AccessFlags::empty()).unwrap(),
        )
        .unwrap();
    refuses_a_foreign_template(&mut p.a, &mut b_write);
    for (op, flags, why) in [
        (
            SendOp::Send,
            SendFlags::INLINE,
            "inline data goes through post_send_inline",
        ),
        (
            SendOp::LocalInvalidate(1),
            SendFlags::SIGNALED,
            "takes no memory",
        ),
        (
            SendOp::FetchAdd {
                remote: remote.slice(3, 8).unwrap(),
                add: 1,
            },
            SendFlags::SIGNALED,
            "not 8-byte aligned",
        ),
        (
            SendOp::FetchAdd {
                remote: word,
                add: 1,
            },
            SendFlags::SIGNALED,
            "lends 8 bytes",
        ),
    ] {
        let len = if why == "lends 8 bytes" { 4 } else { 8 };
        let err =
            p.a.prepare_send(op, flags, p.pd.alloc_mr(len, LW).unwrap())
                .unwrap_err();
        assert!(err.to_string().contains(why), "{op:?}: {err}");
    }
    let ud = common::pair(QpType::Ud, AccessFlags::empty());
    let err =
        ud.a.prepare_send(
            SendOp::Send,
            SendFlags::SIGNALED,
            ud.pd.alloc_mr(8, AccessFlags::empty()).unwrap(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("needs an RC or UC QP"), "{err}");
    assert_eq!(p.a.in_flight(), (0, 0), "nothing refused was posted");
    assert!(p.cq.poll_one().unwrap().is_none(), "and nothing completed");
}

/// A prepared request dropped while its sends are in flight: its region
/// stays alive (the QP's tracker holds it) until a completion shows the
/// device is done with it, then goes; `into_region` refuses while in
/// flight; a QP destroyed with such a region in flight releases it.
fn prepared_request_dropped_in_flight_keeps_its_region(path: PostPath) {
    let access = LW | AccessFlags::REMOTE_WRITE;
    let mut p = common::pair_with(QpType::Rc, access, |b| {
        b.post_path(path);
    });
    let target = p.pd.alloc_mr(64 * 1024, access).unwrap();
    let data = pattern(64 * 1024, 5);
    let shared = Arc::new(p.pd.reg_mr(data.clone(), AccessFlags::empty()).unwrap());
    let alive = Arc::downgrade(&shared);
    let mut write =
        p.a.prepare_send(SendOp::Write(target.remote()), SendFlags::empty(), shared)
            .unwrap();
    for i in 0..8u64 {
        write.set_signaled(i == 7);
        p.a.post_prepared(&mut write, i, 0, 64 * 1024).unwrap();
    }
    // Not polled yet: in flight whatever the device did.
    assert!(write.in_flight());
    let write = write.into_region().expect_err("in flight: refused");
    drop(write);
    assert!(
        alive.upgrade().is_some(),
        "the region went while its sends were in flight"
    );
    let c = wait(&p.cq, 1).pop().unwrap().ok().unwrap();
    assert_eq!(c.wr_id, 7);
    assert!(
        alive.upgrade().is_none(),
        "the poll that passed its last send released it"
    );
    let mut now = vec![0; data.len()];
    target.read_at(0, &mut now).unwrap();
    assert_eq!(now, data);

    // The same with a region of its own, dropped with the QP.
    let own = Arc::new(p.pd.reg_mr(data.clone(), AccessFlags::empty()).unwrap());
    let alive = Arc::downgrade(&own);
    let mut write =
        p.a.prepare_send(SendOp::Write(target.remote()), SendFlags::SIGNALED, own)
            .unwrap();
    p.a.post_prepared(&mut write, 9, 0, 4096).unwrap();
    drop(write);
    assert!(alive.upgrade().is_some(), "in flight, not polled");
    drop(p);
    assert!(alive.upgrade().is_none(), "the QP's teardown released it");
}

/// `prepare_send_ud`: a UD SEND checked once with its destination and its
/// region, posted with a range of it each time; the request keeps the
/// address handle alive, and the QP kinds never mix.
fn prepared_ud_sends_keep_their_address_handle(path: PostPath) {
    let mut p = common::pair_with(QpType::Ud, AccessFlags::empty(), |b| {
        b.post_path(path);
    });
    let ah = local_ah(&p);
    let mtu = p.ctx.query_port(1).unwrap().active_mtu.bytes().unwrap();
    let mut send =
        p.a.prepare_send_ud(
            SendOp::SendWithImm(9),
            SendFlags::SIGNALED,
            &ah,
            p.b.qp_num(),
            common::QKEY,
            p.pd.alloc_mr(mtu as usize + 1, AccessFlags::empty())
                .unwrap(),
        )
        .unwrap();
    drop(ah); // the prepared request keeps it alive
    for i in 0..3u8 {
        // UD receives get the 40-byte GRH first.
        p.b.post_recv(10 + u64::from(i), p.pd.alloc_mr(40 + 256, LW).unwrap())
            .unwrap();
        let data = pattern(100 + usize::from(i), i);
        send.write_at(0, &data).unwrap();
        p.a.post_prepared(&mut send, u64::from(i), 0, data.len())
            .unwrap();
        let mut done = wait(&p.cq, 2);
        take(&mut done, u64::from(i)).ok().unwrap();
        let mut r = take(&mut done, 10 + u64::from(i)).ok().unwrap();
        assert_eq!(
            (r.byte_len as usize, r.imm(), r.src_qp),
            (40 + data.len(), Some(9), p.a.qp_num())
        );
        assert_eq!(
            &r.take_buffers().into_one().unwrap().to_vec()[40..40 + data.len()],
            &data[..]
        );
    }
    // Refused: a message past the path MTU, a UD template on an RC QP and
    // an RC one on this QP, RDMA on UD, prepare_send_ud on RC.
    let err =
        p.a.post_prepared(&mut send, 20, 0, mtu as usize + 1)
            .unwrap_err();
    assert!(err.to_string().contains("must fit the path MTU"), "{err}");
    let mut rc = common::pair(QpType::Rc, AccessFlags::empty());
    let mut rc_send =
        rc.a.prepare_send(
            SendOp::Send,
            SendFlags::SIGNALED,
            rc.pd.alloc_mr(8, AccessFlags::empty()).unwrap(),
        )
        .unwrap();
    refuses_a_foreign_template(&mut p.a, &mut rc_send);
    refuses_a_foreign_template(&mut rc.a, &mut send);
    let rc_ah = local_ah(&rc);
    let err =
        rc.a.prepare_send_ud(
            SendOp::Send,
            SendFlags::SIGNALED,
            &rc_ah,
            1,
            1,
            rc.pd.alloc_mr(8, AccessFlags::empty()).unwrap(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("needs a UD QP"), "{err}");
    let target =
        p.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    let ah = local_ah(&p);
    let err =
        p.a.prepare_send_ud(
            SendOp::Write(target.remote()),
            SendFlags::SIGNALED,
            &ah,
            1,
            1,
            p.pd.alloc_mr(8, AccessFlags::empty()).unwrap(),
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("UD QPs only support SEND"),
        "{err}"
    );
    assert_eq!(p.a.in_flight(), (0, 0));
}

legacy_and_auto!(
    multi_sge_batch_and_unsignaled_sends,
    inline_send_copies_at_post_time
);

both_paths!(
    shared_region_in_many_requests_at_once,
    shared_region_fans_out_over_ud,
    prepared_requests_lend_ranges_of_their_region,
    prepared_request_dropped_in_flight_keeps_its_region,
    prepared_ud_sends_keep_their_address_handle,
    posts_and_polls_on_different_threads,
    rc_send_receive_returns_memory_with_the_data,
    send_with_immediate_and_zero_length,
    rdma_write_read_and_write_with_immediate,
    atomics_compare_swap_and_fetch_add,
    uc_send_and_write,
    ud_send_with_grh_and_reply_address
);

/// One round of SEND traffic over every live pair: a 64-byte receive on
/// each receiver (id 1000 + i), then a send from each sender (id i, bytes
/// `pattern(64, seed + i)`) in an order that interleaves the QPs; every
/// completion must come back on the shared CQs with its own QP's memory.
fn send_round(
    pd: &rdma::ProtectionDomain,
    cqs: (&rdma::CompletionQueue, &rdma::CompletionQueue),
    pairs: &mut [Option<(rdma::QueuePair, rdma::QueuePair)>],
    seed: u8,
) {
    let live: Vec<usize> = (0..pairs.len()).filter(|&i| pairs[i].is_some()).collect();
    for &i in &live {
        let (_, b) = pairs[i].as_mut().unwrap();
        b.post_recv(1000 + i as u64, pd.alloc_mr(64, LW).unwrap())
            .unwrap();
    }
    // 7 is prime to the pair count: every pair once, neighbours apart.
    for k in 0..pairs.len() {
        let i = (k * 7) % pairs.len();
        if let Some((a, _)) = pairs[i].as_mut() {
            let m = pd
                .reg_mr(
                    pattern(64, seed.wrapping_add(i as u8)),
                    AccessFlags::empty(),
                )
                .unwrap();
            a.post_send(SendWr::send(i as u64, m)).unwrap();
        }
    }
    let check = |c: &mut rdma::Completion, qp: &rdma::QueuePair, i: usize| {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        assert_eq!(
            c.qp_num,
            qp.qp_num(),
            "{:?} {i} reports its own QP",
            c.opcode
        );
        let m = c.take_buffers().into_one().expect("the buffer comes back");
        assert_eq!(
            m.as_slice().unwrap(),
            &pattern(64, seed.wrapping_add(i as u8))[..]
        );
    };
    for mut c in wait(cqs.0, live.len()) {
        let i = c.wr_id as usize;
        check(&mut c, &pairs[i].as_ref().expect("a live sender").0, i);
    }
    for mut c in wait(cqs.1, live.len()) {
        let i = (c.wr_id - 1000) as usize;
        assert_eq!(c.byte_len, 64, "receive {i}");
        check(&mut c, &pairs[i].as_ref().expect("a live receiver").1, i);
    }
    for (a, b) in pairs.iter().flatten() {
        assert_eq!((a.in_flight(), b.in_flight()), ((0, 0), (0, 0)));
    }
}

/// Many connections on one send CQ and one receive CQ, as a server keeps
/// them: completions of all QPs interleave and each returns its own QP's
/// memory; QPs dropped between rounds leave the others' completions intact.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn many_qps_share_one_cq_and_each_completion_returns_its_memory() {
    const PAIRS: usize = 48;
    let ctx = common::open(&common::device_name());
    let pd = ctx.alloc_pd().unwrap();
    let send_cq = ctx.create_cq(256, None, 0).unwrap();
    let recv_cq = ctx.create_cq(256, None, 0).unwrap();
    let gid_index = u8::try_from(common::gid_index()).unwrap();
    let builder = pd.qp_builder(QpType::Rc, &send_cq, &recv_cq);
    let mut pairs: Vec<Option<(rdma::QueuePair, rdma::QueuePair)>> = (0..PAIRS)
        .map(|_| {
            let (a, b) = (builder.build().unwrap(), builder.build().unwrap());
            common::connect(&ctx, &a, &b, gid_index);
            common::connect(&ctx, &b, &a, gid_index);
            Some((a, b))
        })
        .collect();
    send_round(&pd, (&send_cq, &recv_cq), &mut pairs, 1);
    // Every third connection goes away; the rest carry on.
    for slot in pairs.iter_mut().step_by(3) {
        *slot = None;
    }
    send_round(&pd, (&send_cq, &recv_cq), &mut pairs, 101);
    assert_eq!(pairs.iter().flatten().count(), PAIRS - PAIRS.div_ceil(3));
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn auto_path_picks_the_extended_api_on_rxe() {
    let p = common::pair(QpType::Rc, AccessFlags::empty());
    assert_eq!(p.a.post_path(), PostPath::Extended);
    let p = common::pair_with(QpType::Rc, AccessFlags::empty(), |b| {
        b.post_path(PostPath::Legacy);
    });
    assert_eq!(p.a.post_path(), PostPath::Legacy);
}

/// Prepared requests over iWARP (siw: the legacy post path): a WRITE and a
/// READ lend ranges of the regions they own; a WRITE dropped with its sends
/// in flight keeps its region alive until the completion of the last one
/// is polled, then releases it.
#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_prepared_requests_lend_their_region_and_outlive_a_drop_in_flight() {
    use common::iwarp::{iwarp_connection, listener};
    let ch = rdma::cm::EventChannel::new().unwrap();
    let listener = listener(&ch);
    let (mut a, b) = iwarp_connection(&ch, &listener);
    let access = LW | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let target = b.pd.alloc_mr(8192, access).unwrap();
    let first = target.remote().slice(0, 4096).unwrap();
    let mut write =
        a.qp.prepare_send(
            SendOp::Write(first),
            SendFlags::SIGNALED,
            a.pd.alloc_mr(4096, AccessFlags::empty()).unwrap(),
        )
        .unwrap();
    let data = pattern(4096, 3);
    write.write_at(0, &data).unwrap();
    a.qp.post_prepared(&mut write, 1, 0, 4096).unwrap();
    let c = wait(&a.cq, 1).pop().unwrap().ok().unwrap();
    assert_eq!((c.wr_id, c.opcode), (1, WcOpcode::RdmaWrite));
    // A WRITE's completion on iWARP means TCP took it: the READ after it on
    // the same connection reads what it wrote, into the second half of
    // the READ's region.
    let mut read =
        a.qp.prepare_send(
            SendOp::Read(first),
            SendFlags::SIGNALED,
            a.pd.alloc_mr(8192, LW).unwrap(),
        )
        .unwrap();
    a.qp.post_prepared(&mut read, 2, 4096, 4096).unwrap();
    let c = wait(&a.cq, 1).pop().unwrap().ok().unwrap();
    assert_eq!(
        (c.wr_id, c.opcode, c.byte_len),
        (2, WcOpcode::RdmaRead, 4096)
    );
    let mut got = vec![0; 4096];
    read.read_at(4096, &mut got).unwrap();
    assert_eq!(got, data);
    read.read_at(0, &mut got).unwrap();
    assert_eq!(got, vec![0; 4096], "the first half was not lent");

    let shared = Arc::new(a.pd.reg_mr(pattern(4096, 4), AccessFlags::empty()).unwrap());
    let alive = Arc::downgrade(&shared);
    let mut quiet =
        a.qp.prepare_send(
            SendOp::Write(target.remote().slice(4096, 4096).unwrap()),
            SendFlags::empty(),
            shared,
        )
        .unwrap();
    for i in 0..4u64 {
        quiet.set_signaled(i == 3);
        a.qp.post_prepared(&mut quiet, 10 + i, 0, 4096).unwrap();
    }
    drop(quiet);
    assert!(
        alive.upgrade().is_some(),
        "the region went while its sends were in flight"
    );
    let c = wait(&a.cq, 1).pop().unwrap().ok().unwrap();
    assert_eq!(c.wr_id, 13);
    assert!(c.unsignaled.is_empty(), "{c:?}");
    assert!(
        alive.upgrade().is_none(),
        "the poll that passed the last send released it"
    );
    assert_eq!(a.qp.in_flight().0, 0);
}

/// Prepared receives over iWARP (siw: the legacy post path): the slots of
/// one region take messages in order under the callers' ids, after the
/// ordinary receive posted before them, with no memory in their
/// completions; each message is read from its slot; a region the post
/// would refuse comes back; a region dropped with a receive in flight stays
/// registered until that receive completes.
#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_prepared_receives_lend_slots_and_outlive_a_drop_in_flight() {
    use common::iwarp::{iwarp_connection, listener};
    let ch = rdma::cm::EventChannel::new().unwrap();
    let listener = listener(&ch);
    // `b` has one ordinary receive posted (wr_id 1): the first SEND takes it.
    let (mut a, mut b) = iwarp_connection(&ch, &listener);
    let e =
        b.qp.prepare_recv(b.pd.alloc_mr(96, AccessFlags::empty()).unwrap(), 32)
            .expect_err("receive memory needs LOCAL_WRITE");
    assert!(e.error.to_string().contains("LOCAL_WRITE"), "{}", e.error);
    assert_eq!(e.returned.len(), 1, "the region comes back");
    let mut recvs =
        b.qp.prepare_recv(b.pd.alloc_mr(100, LW).unwrap(), 32)
            .unwrap();
    assert_eq!((recvs.slots(), recvs.slot_len()), (3, 32));
    for slot in 0..2 {
        b.qp.post_prepared_recv(&mut recvs, 40 + slot as u64, slot)
            .unwrap();
    }
    for i in 0..3u64 {
        let len = 8 * (i as usize + 1);
        let m =
            a.pd.reg_mr(pattern(len, 10 + i as u8), AccessFlags::empty())
                .unwrap();
        a.qp.post_send(SendWr::send(20 + i, m)).unwrap();
    }
    for c in wait(&a.cq, 3) {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
    }
    let mut got = wait(&b.cq, 3);
    let seen: Vec<_> = got
        .iter()
        .map(|c| (c.wr_id, c.status, c.byte_len))
        .collect();
    let ok = WcStatus::Success;
    assert_eq!(seen, [(1, ok, 8), (40, ok, 16), (41, ok, 24)], "in order");
    assert!(
        !matches!(got[0].take_buffers(), WrBuffers::None),
        "the ordinary receive gives its region back"
    );
    for c in &mut got[1..] {
        assert!(
            matches!(c.take_buffers(), WrBuffers::None),
            "a prepared receive gives no memory back"
        );
    }
    for (slot, seed) in [(0, 11), (1, 12)] {
        let len = 8 * (slot + 2);
        let mut bytes = vec![0; len];
        recvs.read_at(slot, 0, &mut bytes).unwrap();
        assert_eq!(bytes, pattern(len, seed), "slot {slot}");
    }
    assert!(!recvs.in_flight());

    b.qp.post_prepared_recv(&mut recvs, 42, 2).unwrap();
    let recvs = recvs.into_region().expect_err("in flight: refused");
    drop(recvs);
    assert_eq!(b.qp.in_flight(), (0, 1), "the receive is still posted");
    let m = a.pd.reg_mr(vec![7u8; 32], AccessFlags::empty()).unwrap();
    a.qp.post_send(SendWr::send(23, m)).unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    let r = wait(&b.cq, 1).pop().unwrap();
    assert_eq!(
        (r.wr_id, r.status, r.byte_len),
        (42, WcStatus::Success, 32),
        "the dropped region was still registered"
    );
    // `a` keeps the receive the connection posted.
    assert_eq!((a.qp.in_flight().0, b.qp.in_flight()), (0, (0, 0)));

    let fresh =
        b.qp.prepare_recv(b.pd.alloc_mr(64, LW).unwrap(), 64)
            .unwrap();
    let mr = fresh
        .into_region()
        .expect("never posted: nothing in flight");
    assert_eq!(mr.len(), 64, "the whole region comes back");
}
