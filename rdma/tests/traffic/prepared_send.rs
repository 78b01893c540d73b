//! Prepared send requests (`PreparedSend`): ranges lent from the region they own,
//! a request dropped in flight, UD sends that keep their address handle, inline
//! requests that carry each post's bytes (retargeted between posts), and the
//! same over iWARP.

use super::*;

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

both_paths!(
    prepared_requests_lend_ranges_of_their_region,
    prepared_request_dropped_in_flight_keeps_its_region,
    prepared_ud_sends_keep_their_address_handle
);

/// Asserts that `err` is an `InvalidArgument` whose text holds `says`, and
/// that `qp` posted nothing for it.
fn refused(qp: &rdma::QueuePair, before: (usize, usize), err: Error, says: &str) {
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains(says), "{err}");
    assert_eq!(qp.in_flight(), before, "nothing posted: {err}");
}

/// Inline prepared requests (`prepare_inline`, `post_prepared_inline`): one
/// RDMA WRITE WITH IMMEDIATE pointed at a new range with a new immediate
/// before each post, whose bytes and immediates the peer sees; an inline
/// SEND of bytes the caller reuses at once; and the posts and changes they
/// refuse, each with an error that says why.
fn prepared_inline_requests_carry_their_bytes(path: PostPath) {
    let access = LW | AccessFlags::REMOTE_WRITE;
    let mut p = common::pair_with(QpType::Rc, access, |b| {
        b.post_path(path).max_inline_data(64);
    });
    let limit = p.a.caps().max_inline_data as usize;
    assert!(limit >= 64, "the QP takes {limit} bytes inline");
    let target = p.pd.alloc_mr(4096, access).unwrap();
    let remote = target.remote();

    let mut write =
        p.a.prepare_inline(
            SendOp::WriteWithImm(remote.slice(0, 64).unwrap(), 0),
            SendFlags::SIGNALED,
        )
        .unwrap();
    assert!(write.is_inline());
    assert!(write.flags().contains(SendFlags::INLINE), "INLINE implied");
    for i in 0..4u8 {
        let at = u64::from(i) * 100;
        let len = 8 + 8 * usize::from(i);
        p.b.post_recv(50 + u64::from(i), Vec::new()).unwrap();
        write
            .set_remote(remote.slice(at, len as u64).unwrap())
            .unwrap();
        write.set_imm(0x1000 + u32::from(i)).unwrap();
        let mut data = pattern(len, i);
        p.a.post_prepared_inline(&mut write, 60 + u64::from(i), &data)
            .unwrap();
        data.fill(0xee); // the provider copied it during the post
        let mut done = wait(&p.cq, 2);
        let sent = take(&mut done, 60 + u64::from(i)).ok().unwrap();
        assert_eq!(sent.opcode, WcOpcode::RdmaWrite);
        let r = take(&mut done, 50 + u64::from(i)).ok().unwrap();
        assert_eq!(
            (r.opcode, r.imm(), r.byte_len as usize),
            (WcOpcode::RecvRdmaWithImm, Some(0x1000 + u32::from(i)), len)
        );
        let mut now = vec![0; 100];
        target.read_at(at as usize, &mut now).unwrap();
        assert_eq!(now[..len], pattern(len, i)[..], "post {i} landed at {at}");
        assert_eq!(now[len..], vec![0; 100 - len][..], "and no further");
    }
    assert_eq!(p.a.in_flight(), (0, 0), "nothing kept for inline posts");

    // SEND: the receives see each post's bytes.
    three_receives(&mut p, 64);
    let mut send =
        p.a.prepare_inline(SendOp::Send, SendFlags::SIGNALED)
            .unwrap();
    assert!(send.is_inline());
    let mut data = [0u8; 64];
    for i in 0..3u8 {
        data.fill(i + 1);
        let len = 16 * (usize::from(i) + 1);
        p.a.post_prepared_inline(&mut send, 70 + u64::from(i), &data[..len])
            .unwrap();
    }
    let mut done = wait(&p.cq, 6);
    for i in 0..3u8 {
        let s = take(&mut done, 70 + u64::from(i)).ok().unwrap();
        assert_eq!(s.opcode, WcOpcode::Send);
        let mut r = take(&mut done, 10 + u64::from(i)).ok().unwrap();
        let len = 16 * (usize::from(i) + 1);
        assert_eq!((r.opcode, r.byte_len as usize), (WcOpcode::Recv, len));
        assert_eq!(
            r.take_buffers().into_one().unwrap().to_vec()[..len],
            vec![i + 1; len][..]
        );
    }

    // Refusals: nothing is posted, and the error says why.
    let before = p.a.in_flight();
    let err = p.a.post_prepared(&mut write, 90, 0, 8).unwrap_err();
    refused(&p.a, before, err, "post it with post_prepared_inline");
    let err =
        p.a.post_prepared_inline(&mut send, 91, &vec![7; limit + 1])
            .unwrap_err();
    refused(
        &p.a,
        before,
        err,
        &format!("{} bytes of inline data", limit + 1),
    );
    // Longer than the WRITE's remote range (16 bytes), within the limit.
    write.set_remote(remote.slice(0, 16).unwrap()).unwrap();
    let err =
        p.a.post_prepared_inline(&mut write, 92, &[7; 17])
            .unwrap_err();
    refused(&p.a, before, err, "do not fit the remote range of 16 bytes");
    let err = send.set_remote(remote.slice(0, 16).unwrap()).unwrap_err();
    refused(&p.a, before, err, "not an inline RDMA WRITE");
    let err = send.set_imm(5).unwrap_err();
    refused(
        &p.a,
        before,
        err,
        "not an inline request with immediate data",
    );
    let mut lends =
        p.a.prepare_send(
            SendOp::Write(remote.slice(0, 64).unwrap()),
            SendFlags::SIGNALED,
            p.pd.alloc_mr(64, AccessFlags::empty()).unwrap(),
        )
        .unwrap();
    assert!(!lends.is_inline());
    let err =
        p.a.post_prepared_inline(&mut lends, 93, &[7; 8])
            .unwrap_err();
    refused(&p.a, before, err, "lends a region");
    let err = lends.set_remote(remote.slice(0, 8).unwrap()).unwrap_err();
    refused(&p.a, before, err, "a region's");
    // A READ cannot be inline.
    let err =
        p.a.prepare_inline(
            SendOp::Read(remote.slice(0, 8).unwrap()),
            SendFlags::SIGNALED,
        )
        .map(drop)
        .unwrap_err();
    refused(&p.a, before, err, "only SEND and RDMA WRITE can be inline");
    // The target was not touched by any refused post.
    let mut now = vec![0; 17];
    target.read_at(0, &mut now).unwrap();
    assert_eq!(now[..8], pattern(8, 0)[..]);
    assert_eq!(now[8..], [0; 9][..]);
}

/// An end of an iWARP connection on `id`'s context whose QP takes 64 bytes
/// inline (`common::iwarp`'s ends take none).
fn inline_end(id: &rdma::cm::CmId) -> common::iwarp::End {
    let ctx = id.context().expect("the id has a device");
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None, 0).unwrap();
    let qp = pd
        .qp_builder(QpType::Rc, &cq, &cq)
        .max_inline_data(64)
        .build()
        .unwrap();
    common::iwarp::End {
        qp,
        cq,
        pd,
        id: id.clone(),
    }
}

/// Inline prepared requests over iWARP (siw has no WRITE WITH IMMEDIATE):
/// a WRITE pointed at a new range before each post, and SENDs.
#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_prepared_inline_writes_and_sends() {
    use common::iwarp::{await_established, iwarp_ip, listener, next_event};
    use rdma::cm::{CmEventType, ConnParam, PortSpace};
    use std::time::Duration;
    let ch = rdma::cm::EventChannel::new().unwrap();
    let listener = listener(&ch);
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    let dst = std::net::SocketAddr::new(iwarp_ip(), listener.src_port());
    id.resolve_addr(None, dst, Duration::from_secs(5)).unwrap();
    drop(next_event(&ch, CmEventType::AddrResolved));
    id.resolve_route(Duration::from_secs(5)).unwrap();
    drop(next_event(&ch, CmEventType::RouteResolved));
    let mut a = inline_end(&id);
    id.connect_qp(&a.qp, &ConnParam::default()).unwrap();
    let req = next_event(&ch, CmEventType::ConnectRequest);
    let mut b = inline_end(req.id());
    drop(req);
    // iWARP has no RNR: the receives of the SENDs below before accepting.
    for id in [1, 21, 22] {
        b.qp.post_recv(id, b.pd.alloc_mr(64, LW).unwrap()).unwrap();
    }
    b.id.accept_qp(&b.qp, &ConnParam::default()).unwrap();
    await_established(&ch, &id, &a.qp);

    let limit = a.qp.caps().max_inline_data as usize;
    assert!(limit >= 32, "the QP takes {limit} bytes inline");
    let access = LW | AccessFlags::REMOTE_WRITE;
    let target = b.pd.alloc_mr(4096, access).unwrap();
    let remote = target.remote();
    let mut write =
        a.qp.prepare_inline(
            SendOp::Write(remote.slice(0, 8).unwrap()),
            SendFlags::SIGNALED,
        )
        .unwrap();
    for i in 0..4u8 {
        let at = u64::from(i) * 100;
        let len = 8 * (usize::from(i) + 1);
        write
            .set_remote(remote.slice(at, len as u64).unwrap())
            .unwrap();
        a.qp.post_prepared_inline(&mut write, 60 + u64::from(i), &pattern(len, i))
            .unwrap();
        let c = wait(&a.cq, 1).pop().unwrap().ok().unwrap();
        assert_eq!(
            (c.wr_id, c.opcode),
            (60 + u64::from(i), WcOpcode::RdmaWrite)
        );
    }
    // The WRITEs' completions mean TCP took them; a SEND after them on the
    // same connection arrives after their bytes.
    let mut send =
        a.qp.prepare_inline(SendOp::Send, SendFlags::SIGNALED)
            .unwrap();
    for (i, recv) in [(0u8, 1u64), (1, 21), (2, 22)] {
        let data = vec![i + 1; 8 + usize::from(i)];
        a.qp.post_prepared_inline(&mut send, 70 + u64::from(i), &data)
            .unwrap();
        let s = wait(&a.cq, 1).pop().unwrap().ok().unwrap();
        assert_eq!((s.wr_id, s.opcode), (70 + u64::from(i), WcOpcode::Send));
        let mut r = wait(&b.cq, 1).pop().unwrap().ok().unwrap();
        assert_eq!((r.wr_id, r.byte_len as usize), (recv, data.len()));
        assert_eq!(
            r.take_buffers().into_one().unwrap().to_vec()[..data.len()],
            data[..]
        );
    }
    for i in 0..4u8 {
        let len = 8 * (usize::from(i) + 1);
        let mut now = vec![0; 100];
        target.read_at(usize::from(i) * 100, &mut now).unwrap();
        assert_eq!(now[..len], pattern(len, i)[..], "write {i} landed");
        assert_eq!(now[len..], vec![0; 100 - len][..], "and no further");
    }
    let before = a.qp.in_flight();
    let err =
        a.qp.post_prepared_inline(&mut send, 91, &vec![7; limit + 1])
            .unwrap_err();
    refused(
        &a.qp,
        before,
        err,
        &format!("{} bytes of inline data", limit + 1),
    );
    let err = send.set_remote(remote.slice(0, 8).unwrap()).unwrap_err();
    refused(&a.qp, before, err, "not an inline RDMA WRITE");
}

legacy_and_auto!(prepared_inline_requests_carry_their_bytes);
