//! The datagram port space: UDP-style datagrams and multicast join, send,
//! receive and leave.

use super::*;

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn udp_port_space_datagrams() {
    let ch = EventChannel::new().unwrap();
    let (_listener, addr) = listen(&ch, PortSpace::Udp, roce_ip());
    let client = ch.create_id(PortSpace::Udp).unwrap();
    assert_eq!(client.qp_type(), QpType::Ud);
    resolve(&ch, &client, addr);
    let mut c = side(&client, QpType::Ud);
    client.ready_ud_qp(&c.qp).unwrap();
    client
        .connect(&ConnParam {
            qp_num: c.qp.qp_num(),
            ..ConnParam::with_private_data(b"udp?")
        })
        .unwrap();
    let request = expect(&ch, CmEventType::ConnectRequest);
    let ud = request.ud_param().expect("UD parameters");
    assert!(ud.private_data.starts_with(b"udp?"));
    let server_id = request.id().clone();
    drop(request);
    let mut s = side(&server_id, QpType::Ud);
    server_id.accept_qp(&s.qp, &ConnParam::default()).unwrap();
    // The QP is ready (RTS) now; the client sends only after ESTABLISHED.
    s.qp.post_recv(1, s.pd.alloc_mr(40 + 256, LW).unwrap())
        .unwrap();
    let established = expect(&ch, CmEventType::Established);
    assert!(established.id().same_id(&client));
    let ud = established.ud_param().expect("UD parameters").clone();
    drop(established);
    assert_eq!(ud.qp_num, s.qp.qp_num());
    assert_eq!(ud.qkey, rdma::ffi::RDMA_UDP_QKEY);
    let ah = c.pd.create_ah(&ud.ah_attr).unwrap();
    let data = pattern(256, 9);
    c.qp.post_send(
        SendWr::send(2, c.pd.reg_mr(data.clone(), AccessFlags::empty()).unwrap())
            .ud(&ah, ud.qp_num, ud.qkey),
    )
    .unwrap();
    assert_eq!(wait(&c.cq, 1)[0].status, WcStatus::Success);
    let mut r = wait(&s.cq, 1).pop().unwrap();
    assert_eq!(r.status, WcStatus::Success, "{r:?}");
    assert_eq!(r.byte_len, 40 + 256);
    assert_eq!(
        &r.take_buffers().into_one().unwrap().to_vec()[40..],
        &data[..]
    );
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn multicast_join_send_receive_leave() {
    let group: SocketAddr = "239.1.2.3:0".parse().unwrap();
    let ch = EventChannel::new().unwrap();
    let mut ends = Vec::new();
    for flags in [McJoinFlags::FullMember, McJoinFlags::SendOnlyFullMember] {
        let id = ch.create_id(PortSpace::Udp).unwrap();
        id.bind_addr(SocketAddr::new(roce_ip(), 0)).unwrap();
        let pd = id.pd().unwrap();
        let cq = id.context().unwrap().create_cq(16, None, 0).unwrap();
        let qp = id
            .create_qp(pd.qp_builder(QpType::Ud, &cq, &cq).max_send_wr(4))
            .unwrap();
        assert_eq!(id.raw_qp(), qp.as_raw());
        if flags == McJoinFlags::FullMember {
            id.join_multicast(group).unwrap();
        } else {
            id.join_multicast_ex(group, flags).unwrap();
        }
        let joined = expect(&ch, CmEventType::MulticastJoin);
        let ud = joined.ud_param().expect("the group's address").clone();
        assert_eq!(ud.qp_num, 0xff_ffff);
        // Leaving while the join event is held would wait forever: refused.
        assert_eq!(
            id.leave_multicast(group).unwrap_err().errno(),
            Some(libc::EBUSY)
        );
        drop(joined);
        ends.push((id, pd, cq, qp, ud));
    }
    let (recv_id, rpd, rcq, mut rqp, _) = ends.remove(0);
    let (send_id, spd, scq, mut sqp, ud) = ends.remove(0);
    rqp.post_recv(1, rpd.alloc_mr(40 + 64, LW).unwrap())
        .unwrap();
    let ah = spd.create_ah(&ud.ah_attr).unwrap();
    sqp.post_send(
        SendWr::send(2, spd.reg_mr(pattern(64, 5), AccessFlags::empty()).unwrap())
            .ud(&ah, ud.qp_num, ud.qkey),
    )
    .unwrap();
    assert_eq!(wait(&scq, 1)[0].status, WcStatus::Success);
    let mut r = wait(&rcq, 1).pop().unwrap();
    assert_eq!(r.status, WcStatus::Success, "{r:?}");
    assert_eq!(
        &r.take_buffers().into_one().unwrap().to_vec()[40..],
        &pattern(64, 5)[..]
    );
    recv_id.leave_multicast(group).unwrap();
    send_id.leave_multicast(group).unwrap();
    assert_eq!(
        recv_id.leave_multicast(group).unwrap_err().errno(),
        Some(libc::EADDRNOTAVAIL)
    );
}
