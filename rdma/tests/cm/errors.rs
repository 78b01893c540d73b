//! What a failed connection reports: a refused connect, an address nobody has,
//! private data longer than the port space allows, accept on the wrong id.

use super::*;

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn connect_to_a_port_without_listener_is_refused() {
    // Find a free port: bind, read it, release it.
    let ch = EventChannel::new().unwrap();
    let (listener, addr) = listen(&ch, PortSpace::Tcp, roce_ip());
    drop(listener);
    let client = ch.create_id(PortSpace::Tcp).unwrap();
    resolve(&ch, &client, addr);
    let c = side(&client, QpType::Rc);
    client.connect_qp(&c.qp, &ConnParam::default()).unwrap();
    let e = next(&ch);
    assert!(
        matches!(
            e.event_type(),
            CmEventType::Rejected | CmEventType::Unreachable
        ),
        "{e:?}"
    );
    // The blocking layer turns it into an error naming the event.
    let err = blocking::Connection::connect(addr, &blocking::ConnectOptions::default())
        .expect_err("nobody listens");
    assert!(matches!(err, Error::CmEvent { .. }), "{err}");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn resolving_an_address_nobody_has_reports_addr_error() {
    let ch = EventChannel::new().unwrap();
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    let start = Instant::now();
    id.resolve_addr(
        Some(SocketAddr::new(roce_ip(), 0).into()),
        "10.8.0.77:7471".parse::<SocketAddr>().unwrap(),
        Duration::from_millis(1000),
    )
    .unwrap();
    let e = ch
        .get_event_timeout(Duration::from_secs(10))
        .unwrap()
        .expect("an ADDR_ERROR within the timeout");
    assert_eq!(e.event_type(), CmEventType::AddrError, "{e:?}");
    assert!(e.status() < 0, "{e:?}");
    assert!(start.elapsed() < Duration::from_secs(10));
    let err = e.into_error("rdma_resolve_addr");
    assert!(
        err.to_string().contains("RDMA_CM_EVENT_ADDR_ERROR"),
        "{err}"
    );
    // Resolving the route of an unresolved id is refused, not a crash.
    let fresh = ch.create_id(PortSpace::Tcp).unwrap();
    assert_eq!(
        fresh.resolve_route(T).unwrap_err().errno(),
        Some(libc::EINVAL)
    );
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn private_data_longer_than_the_port_space_allows_is_refused() {
    let ch = EventChannel::new().unwrap();
    let (_listener, addr) = listen(&ch, PortSpace::Tcp, roce_ip());
    let client = ch.create_id(PortSpace::Tcp).unwrap();
    resolve(&ch, &client, addr);
    let c = side(&client, QpType::Rc);
    let err = client
        .connect_qp(&c.qp, &ConnParam::with_private_data(&[7; 57]))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("at most 56"), "{err}");
    let err = client
        .connect(&ConnParam::with_private_data(&[7; 300]))
        .unwrap_err();
    assert!(err.to_string().contains("at most 255"), "{err}");
    // 56 bytes fit, and arrive.
    client
        .connect_qp(&c.qp, &ConnParam::with_private_data(&[7; 56]))
        .unwrap();
    let request = expect(&ch, CmEventType::ConnectRequest);
    assert_eq!(&request.private_data()[..56], &[7; 56]);
    let err = request.id().reject(&[1; 149]).unwrap_err();
    assert!(err.to_string().contains("at most 148"), "{err}");
    let err = request
        .id()
        .accept(&ConnParam::with_private_data(&[1; 197]))
        .unwrap_err();
    assert!(err.to_string().contains("at most 196"), "{err}");
    request.id().reject(&[1; 148]).unwrap();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn accept_on_an_id_that_is_not_a_connection_request_fails() {
    let ch = EventChannel::new().unwrap();
    let fresh = ch.create_id(PortSpace::Tcp).unwrap();
    let err = fresh.accept(&ConnParam::default()).unwrap_err();
    assert_eq!(err.errno(), Some(libc::EINVAL), "{err}");
    let err = fresh.connect(&ConnParam::default()).unwrap_err();
    assert_eq!(err.errno(), Some(libc::EINVAL), "{err}");
    let (listener, addr) = listen(&ch, PortSpace::Tcp, roce_ip());
    assert!(listener.accept(&ConnParam::default()).is_err());
    let client = ch.create_id(PortSpace::Tcp).unwrap();
    resolve(&ch, &client, addr);
    assert!(client.accept(&ConnParam::default()).is_err());
    assert!(client.establish().is_err());
    assert!(client.disconnect().is_err());
    // A synchronous call on an asynchronous listener is refused.
    assert_eq!(
        listener.get_request().unwrap_err().errno(),
        Some(libc::EINVAL)
    );
}
