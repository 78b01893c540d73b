//! Connections through the event loop: connect, accept and traffic on the crate's QPs,
//! rejects with private data, sixty-four connections at once, disconnects from
//! either side, and ids that migrate or outlive their listener.

use super::*;

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn async_connect_accept_traffic_with_crate_qps() {
    let dev = common::device_name();
    let (ch, _listener, mut c, mut s) = connect_pair(roce_ip(), &dev, b"hello");
    assert_eq!(s.pd.context().name(), dev);
    // Addresses and ports agree on both ends.
    assert_eq!(c.id.dst_port(), s.id.src_port());
    assert_eq!(c.id.src_port(), s.id.dst_port());
    assert_eq!(c.id.peer_addr().unwrap().ip(), roce_ip());
    assert_eq!(s.id.local_addr().unwrap().ip(), roce_ip());
    assert_eq!(c.id.port_num(), 1);
    traffic(&mut c, &mut s);
    disconnect_both(&ch, &c.id, &s.id);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn iwarp_async_connect_accept_send_write_read() {
    let dev = common::iwarp_device_name();
    let (ch, _listener, mut c, mut s) = connect_pair(iwarp_ip(), &dev, b"hello");
    assert_eq!(s.pd.context().name(), dev);
    traffic(&mut c, &mut s);
    disconnect_both(&ch, &c.id, &s.id);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn iwarp_reject_with_private_data() {
    reject_with_private_data(iwarp_ip());
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn reject_carries_private_data() {
    reject_with_private_data(roce_ip());
}

fn reject_with_private_data(ip: IpAddr) {
    let ch = EventChannel::new().unwrap();
    let (_listener, addr) = listen(&ch, PortSpace::Tcp, ip);
    let client = ch.create_id(PortSpace::Tcp).unwrap();
    resolve(&ch, &client, addr);
    let c = side(&client, QpType::Rc);
    client.connect_qp(&c.qp, &ConnParam::default()).unwrap();
    let request = expect(&ch, CmEventType::ConnectRequest);
    request.id().reject(b"go away").unwrap();
    drop(request);
    let e = next(&ch);
    assert_eq!(e.event_type(), CmEventType::Rejected, "{e:?}");
    assert!(e.id().same_id(&client));
    let iwarp = e.status() < 0;
    if iwarp {
        // iWARP (siw): an MPA reject, reported as -ECONNRESET; the private
        // data may not make it back.
        assert_eq!(e.status(), -libc::ECONNRESET, "{e:?}");
        eprintln!("iWARP reject private data: {:?}", e.private_data());
    } else {
        assert!(
            e.private_data().starts_with(b"go away"),
            "{:?}",
            e.private_data()
        );
    }
    let err = e.into_error("rdma_connect");
    let want = if iwarp {
        libc::ECONNRESET
    } else {
        libc::ECONNREFUSED
    };
    assert_eq!(err.errno(), Some(want), "{err}");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn sixty_four_simultaneous_connections() {
    const N: usize = 64;
    let ch = EventChannel::new().unwrap();
    let (_listener, addr) = listen(&ch, PortSpace::Tcp, roce_ip());
    let mut clients: Vec<(CmId, Option<Side>)> = (0..N)
        .map(|_| {
            let id = ch.create_id(PortSpace::Tcp).unwrap();
            id.resolve_addr(None, addr, T).unwrap();
            (id, None)
        })
        .collect();
    let mut servers: Vec<Side> = Vec::new();
    let (mut client_up, mut server_up) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while client_up < N || server_up < N {
        assert!(
            Instant::now() < deadline,
            "{client_up} clients, {server_up} servers up"
        );
        let e = next(&ch);
        assert_eq!(e.status(), 0, "{e:?}");
        let who = clients.iter().position(|(id, _)| id.same_id(e.id()));
        match (e.event_type(), who) {
            (CmEventType::AddrResolved, Some(i)) => clients[i].0.resolve_route(T).unwrap(),
            (CmEventType::RouteResolved, Some(i)) => {
                let s = side(&clients[i].0, QpType::Rc);
                clients[i]
                    .0
                    .connect_qp(&s.qp, &ConnParam::with_private_data(&[i as u8]))
                    .unwrap();
                clients[i].1 = Some(s);
            }
            (CmEventType::ConnectResponse, Some(i)) => {
                let id = clients[i].0.clone();
                drop(e);
                id.establish_qp(&clients[i].1.as_ref().unwrap().qp).unwrap();
                client_up += 1;
            }
            (CmEventType::ConnectRequest, None) => {
                let id = e.id().clone();
                let mut s = side(&id, QpType::Rc);
                let i = u64::from(e.private_data()[0]);
                drop(e);
                id.accept_qp(&s.qp, &ConnParam::default()).unwrap();
                // Ready now; the client retries on RNR until this is posted.
                s.qp.post_recv(i, s.pd.alloc_mr(8, LW).unwrap()).unwrap();
                servers.push(s);
            }
            (CmEventType::Established, None) => server_up += 1,
            (t, w) => panic!("unexpected {t} for client {w:?}"),
        }
    }
    for (i, (_, s)) in clients.iter_mut().enumerate() {
        let s = s.as_mut().unwrap();
        s.qp.post_send(SendWr::send(
            i as u64,
            s.pd.reg_mr(vec![i as u8; 8], AccessFlags::empty()).unwrap(),
        ))
        .unwrap();
        assert_eq!(wait(&s.cq, 1)[0].status, WcStatus::Success);
    }
    for s in &mut servers {
        let mut r = wait(&s.cq, 1).pop().unwrap();
        assert_eq!(r.status, WcStatus::Success);
        // Each server QP got the byte of the client that asked for it.
        assert_eq!(
            r.take_buffers().into_one().unwrap().to_vec(),
            vec![r.wr_id as u8; 8]
        );
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn disconnect_from_either_side() {
    let dev = common::device_name();
    let (ch, _l, c, s) = connect_pair(roce_ip(), &dev, b"");
    disconnect_both(&ch, &c.id, &s.id);
    let (ch, _l, c, s) = connect_pair(roce_ip(), &dev, b"");
    disconnect_both(&ch, &s.id, &c.id);
    // Disconnecting twice is harmless or an error, never a hang.
    let _ = s.id.disconnect();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn iwarp_disconnect_from_the_passive_side() {
    let dev = common::iwarp_device_name();
    let (ch, _l, c, s) = connect_pair(iwarp_ip(), &dev, b"");
    disconnect_both(&ch, &s.id, &c.id);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn migrate_id_and_accepted_ids_outlive_the_listener() {
    let dev = common::device_name();
    let (ch, listener, mut c, mut s) = connect_pair(roce_ip(), &dev, b"");
    // The accepted id reports to the listener's channel, which it keeps alive.
    assert!(s.id.channel().unwrap().as_raw() == ch.as_raw());
    let own = EventChannel::new().unwrap();
    s.id.migrate_id(Some(&own)).unwrap();
    assert!(s.id.channel().unwrap().as_raw() == own.as_raw());
    drop(listener);
    // The client's channel is the old one; keep a clone of it only.
    let client_ch = c.id.channel().unwrap();
    drop(ch);
    traffic(&mut c, &mut s);
    c.id.disconnect().unwrap();
    let e = expect(&own, CmEventType::Disconnected);
    assert!(e.id().same_id(&s.id));
    drop(e);
    s.id.disconnect().unwrap();
    let e = expect(&client_ch, CmEventType::Disconnected);
    assert!(e.id().same_id(&c.id));
    drop(e);
    // Synchronous and back.
    s.id.migrate_id(None).unwrap();
    assert!(s.id.is_sync());
    assert_eq!(
        s.id.migrate_id(None).unwrap_err().errno(),
        Some(libc::EINVAL)
    );
    s.id.migrate_id(Some(&own)).unwrap();
    assert!(!s.id.is_sync());
}
