//! SEND and RECV on an RC pair: memory handed back with the data, immediate data and
//! zero-length sends, scatter lists, batches, unsignaled sends, inline data, and which
//! post path `Auto` picks.

use super::*;

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

legacy_and_auto!(
    multi_sge_batch_and_unsignaled_sends,
    inline_send_copies_at_post_time
);

both_paths!(
    rc_send_receive_returns_memory_with_the_data,
    send_with_immediate_and_zero_length
);
