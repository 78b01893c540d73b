//! The synchronous API (`rdma_verbs.h`): librdmacm's QPs with the crate's
//! helpers, endpoints from `getaddrinfo`, blocking connect and accept on
//! threads, and the device list's borrowed contexts.

use super::*;

/// QPs made by librdmacm (`rdma_create_qp`): it drives their states; they use
/// the safe post path, and the `rdma_verbs.h` helpers work on them.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn librdmacm_qps_and_rdma_verbs_helpers() {
    let ch = EventChannel::new().unwrap();
    let (_listener, addr) = listen(&ch, PortSpace::Tcp, roce_ip());
    let client = ch.create_id(PortSpace::Tcp).unwrap();
    resolve(&ch, &client, addr);
    let cpd = client.pd().unwrap();
    let ccq = client.context().unwrap().create_cq(16, None, 0).unwrap();
    let mut cqp = client
        .create_qp_ex(&cpd.qp_builder(QpType::Rc, &ccq, &ccq))
        .unwrap();
    assert!(client
        .create_qp(&cpd.qp_builder(QpType::Rc, &ccq, &ccq))
        .is_err());
    client.connect(&ConnParam::default()).unwrap();
    let request = expect(&ch, CmEventType::ConnectRequest);
    let server = request.id().clone();
    drop(request);
    let spd = server.pd().unwrap();
    let scq = server.context().unwrap().create_cq(16, None, 0).unwrap();
    let mut sqp = server
        .create_qp(&spd.qp_builder(QpType::Rc, &scq, &scq))
        .unwrap();
    // A PD of another context is refused with a clear error.
    let foreign = common::open(&common::device_name()).alloc_pd().unwrap();
    let fcq = foreign.context().create_cq(4, None, 0).unwrap();
    let err = server
        .create_qp(&foreign.qp_builder(QpType::Rc, &fcq, &fcq))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    sqp.post_recv(1, server.reg_msgs(vec![0u8; 64]).unwrap())
        .unwrap();
    server.accept(&ConnParam::default()).unwrap();
    // librdmacm answered the response itself: both sides see ESTABLISHED.
    drop(expect(&ch, CmEventType::Established));
    drop(expect(&ch, CmEventType::Established));
    // Safe path on librdmacm's QPs.
    cqp.post_send(SendWr::send(
        2,
        cpd.reg_mr(b"safe".to_vec(), AccessFlags::empty()).unwrap(),
    ))
    .unwrap();
    let mut got = server.get_recv_comp(&sqp).unwrap();
    assert_eq!(
        got.take_buffers().into_one().unwrap().to_vec()[..4],
        *b"safe"
    );
    assert_eq!(
        client.get_send_comp(&cqp).unwrap().status,
        WcStatus::Success
    );
    // The rdma_post_* helpers (raw ids come back unchanged).
    let rbuf = server.reg_msgs(vec![0u8; 64]).unwrap();
    let sbuf = client.reg_msgs(b"raw helper".to_vec()).unwrap();
    let target = server.reg_write(vec![0u8; 16]).unwrap();
    let wbuf = client.reg_msgs(pattern(16, 6)).unwrap();
    let source = server.reg_read(pattern(16, 4)).unwrap();
    let readback = client.reg_msgs(vec![0u8; 16]).unwrap();
    // SAFETY: every region stays alive and untouched until its completion
    // is polled below.
    unsafe {
        server.post_recv_raw(10, &rbuf).unwrap();
        client
            .post_send_raw(11, &sbuf, SendFlags::SIGNALED)
            .unwrap();
        client
            .post_write_raw(12, &wbuf, SendFlags::SIGNALED, target.remote())
            .unwrap();
        client
            .post_read_raw(13, &readback, SendFlags::SIGNALED, source.remote())
            .unwrap();
    }
    let r = server.get_recv_comp(&sqp).unwrap();
    assert_eq!((r.wr_id, r.status), (10, WcStatus::Success));
    assert_eq!(&rbuf.to_vec()[..10], b"raw helper");
    let mut ids = Vec::new();
    while ids.len() < 3 {
        let c = client.get_send_comp(&cqp).unwrap();
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        ids.push(c.wr_id);
    }
    ids.sort();
    assert_eq!(ids, [11, 12, 13]);
    assert_eq!(target.to_vec(), pattern(16, 6));
    assert_eq!(readback.to_vec(), pattern(16, 4));
    // A context with bit 63 is reserved for the safe path.
    // SAFETY: refused before posting.
    let err = unsafe { client.post_send_raw(1 << 63, &sbuf, SendFlags::SIGNALED) }.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }));
    drop(_listener);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn sync_endpoints_getaddrinfo_create_ep_traffic() {
    let ip = roce_ip().to_string();
    let dev = common::device_name();
    let hints = AddrInfoHints {
        flags: AddrInfoFlags::PASSIVE,
        port_space: Some(PortSpace::Tcp),
        ..Default::default()
    };
    let info = cm::getaddrinfo(Some(&ip), Some("0"), Some(&hints)).unwrap();
    let entry = info.first();
    assert!(entry.flags().contains(AddrInfoFlags::PASSIVE));
    assert_eq!(entry.src_addr().unwrap().ip(), roce_ip());
    // A passive endpoint with a QP template on librdmacm's context.
    let ctx = cm::get_devices()
        .unwrap()
        .into_iter()
        .find(|c| c.name() == dev)
        .expect("librdmacm knows the test device");
    let pd = ctx.alloc_pd().unwrap();
    let scq = ctx.create_cq(16, None, 0).unwrap();
    let template = pd.qp_builder(QpType::Rc, &scq, &scq);
    let (listener, none) = cm::create_ep(&entry, Some(&template)).unwrap();
    assert!(none.is_none());
    assert!(listener.is_sync());
    listener.listen(4).unwrap();
    let port = listener.src_port();
    drop(info);
    let (tx, rx) = mpsc::channel();
    let server = std::thread::spawn(move || {
        let (id, qp) = listener.get_request().unwrap();
        let mut qp = qp.expect("the template made a QP");
        qp.post_recv(1, pd.alloc_mr(64, LW).unwrap()).unwrap();
        id.accept(&ConnParam::default()).unwrap();
        let mut r = wait(&scq, 1).pop().unwrap();
        tx.send(r.take_buffers().into_one().unwrap().to_vec())
            .unwrap();
        id.disconnect().unwrap();
        drop((qp, id, listener));
    });
    let info = cm::getaddrinfo(Some(&ip), Some(&port.to_string()), None).unwrap();
    let entry = info.first();
    assert_eq!(entry.dst_addr(), Some(SocketAddr::new(roce_ip(), port)));
    assert_eq!(entry.port_space(), PortSpace::Tcp);
    assert_eq!(entry.qp_type(), QpType::Rc);
    let (client, none) = cm::create_ep(&entry, None).unwrap();
    assert!(none.is_none());
    let cpd = client.pd().unwrap();
    let ccq = client.context().unwrap().create_cq(16, None, 0).unwrap();
    let mut cqp = client
        .create_qp(&cpd.qp_builder(QpType::Rc, &ccq, &ccq))
        .unwrap();
    client.connect(&ConnParam::default()).unwrap();
    cqp.post_send(SendWr::send(
        2,
        client.reg_msgs(b"over create_ep".to_vec()).unwrap(),
    ))
    .unwrap();
    assert_eq!(wait(&ccq, 1)[0].status, WcStatus::Success);
    let got = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("server got it");
    assert_eq!(&got[..14], b"over create_ep");
    // A synchronous disconnect waits for DISCONNECTED, which on
    // InfiniBand/RoCE needs the other side to disconnect too: both do.
    client.disconnect().unwrap();
    bounded("server thread", move || server.join().unwrap());
    drop((cqp, client));
    // A name that does not resolve is an error, not a panic.
    assert!(cm::getaddrinfo(Some("no-such-host.invalid"), Some("1"), None).is_err());
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn get_devices_contexts_are_borrowed() {
    let devs = cm::get_devices().unwrap();
    let names: Vec<String> = devs.iter().map(|c| c.name().to_string()).collect();
    assert!(names.contains(&common::device_name()), "{names:?}");
    let mut verbs_names: Vec<String> = rdma::devices()
        .unwrap()
        .iter()
        .map(|d| d.name().to_string())
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    verbs_names.sort();
    assert_eq!(sorted, verbs_names);
    let keep = devs.into_iter().next().unwrap();
    assert!(keep.is_borrowed());
    // The list is gone but the context it lent is still usable.
    keep.query_device().unwrap();
    keep.alloc_pd().unwrap();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn blocking_connect_accept_traffic() {
    blocking_traffic(roce_ip());
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn iwarp_blocking_connect_accept_traffic() {
    blocking_traffic(iwarp_ip());
}

fn blocking_traffic(ip: IpAddr) {
    let listener = blocking::Listener::bind(SocketAddr::new(ip, 0), 4).unwrap();
    let addr = listener.local_addr().unwrap();
    assert_ne!(addr.port(), 0);
    let server = std::thread::spawn(move || {
        let opts = blocking::ConnectOptions {
            conn_param: ConnParam::with_private_data(b"srv"),
            ..Default::default()
        };
        // The receive is posted before accepting: on iWARP a send that finds
        // none breaks the connection (no RNR retry).
        let conn = listener.accept_with(&opts, |qp, pd| {
            qp.post_recv(1, pd.alloc_mr(64, LW)?)
                .map_err(rdma::PostError::drop_buffers)?;
            Ok(())
        });
        let conn = conn.unwrap();
        drop(listener); // the connection outlives it
        assert!(conn.peer_private_data().starts_with(b"cli"));
        let mut r = wait(conn.cq(), 1).pop().unwrap();
        let data = r.take_buffers().into_one().unwrap().to_vec();
        conn.wait_disconnected().unwrap();
        data
    });
    let opts = blocking::ConnectOptions {
        conn_param: ConnParam::with_private_data(b"cli"),
        ..Default::default()
    };
    let mut conn = blocking::Connection::connect(addr, &opts).unwrap();
    assert!(conn.peer_private_data().starts_with(b"srv"));
    let mr = conn
        .pd()
        .reg_mr(b"blocking".to_vec(), AccessFlags::empty())
        .unwrap();
    conn.qp().post_send(SendWr::send(1, mr)).unwrap();
    let mut done = wait(conn.cq(), 1);
    let c = take(&mut done, 1);
    assert_eq!(c.status, WcStatus::Success, "{c:?}");
    conn.disconnect().unwrap();
    let got = bounded("server", move || server.join().unwrap());
    assert_eq!(&got[..8], b"blocking");
}
