//! Options on ids and QPs: `set_option` (TOS, reuse address, AF-only, ACK
//! timeout), notify and ECE on a connection, and QP create flags the providers
//! refuse.

use super::*;

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn set_option_tos_reuseaddr_afonly_ack_timeout() {
    let ch = EventChannel::new().unwrap();
    let a = ch.create_id(PortSpace::Tcp).unwrap();
    a.set_option(CmOption::Tos(32)).unwrap();
    a.set_option(CmOption::ReuseAddr(true)).unwrap();
    a.set_option(CmOption::AckTimeout(14)).unwrap();
    a.bind_addr(SocketAddr::new(roce_ip(), 0)).unwrap();
    let port = a.src_port();
    // Without REUSEADDR the port is taken; with it on both, it can be shared.
    let b = ch.create_id(PortSpace::Tcp).unwrap();
    let err = b.bind_addr(SocketAddr::new(roce_ip(), port)).unwrap_err();
    assert_eq!(err.errno(), Some(libc::EADDRINUSE), "{err}");
    let c = ch.create_id(PortSpace::Tcp).unwrap();
    c.set_option(CmOption::ReuseAddr(true)).unwrap();
    c.bind_addr(SocketAddr::new(roce_ip(), port)).unwrap();
    // AFONLY applies before binding, to IPv6 ids; after binding it is refused.
    let v6 = ch.create_id(PortSpace::Tcp).unwrap();
    v6.set_option(CmOption::AfOnly(true)).unwrap();
    v6.bind_addr("[::]:0".parse::<SocketAddr>().unwrap())
        .unwrap();
    // The options reach the connection: ACK timeout and TOS on a live one.
    let dev = common::device_name();
    let (_ch, _l, cl, _s) = connect_pair(roce_ip(), &dev, b"");
    let attr = cl.qp.query().unwrap();
    assert!(attr.as_raw().timeout > 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn notify_and_ece_on_a_connection() {
    let dev = common::device_name();
    let (_ch, _l, c, s) = connect_pair(roce_ip(), &dev, b"");
    // The connection is established already: the CM says so.
    if let Err(e) = s.id.notify(rdma::AsyncEventType::CommEst) {
        assert_eq!(e.errno(), Some(libc::EISCONN), "{e}");
    }
    // rxe has no ECE: either it works or it says so, never a crash.
    match c.id.set_local_ece(cm::Ece {
        vendor_id: 0,
        options: 0,
    }) {
        Ok(()) => {}
        Err(e) => assert!(e.errno().is_some(), "{e}"),
    }
    let _ = s.id.remote_ece();
}

/// `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB` on soft-RoCE: the rxe provider takes
/// no create flags, through the connection manager (`rdma_create_qp_ex`) and
/// through plain verbs (`ibv_create_qp_ex`) alike; the same builder without
/// the flag works.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn create_flags_block_self_mcast_lb_is_unsupported_on_rxe() {
    let ch = EventChannel::new().unwrap();
    let id = ch.create_id(PortSpace::Udp).unwrap();
    id.bind_addr(SocketAddr::new(roce_ip(), 0)).unwrap();
    let pd = id.pd().unwrap();
    let cq = id.context().unwrap().create_cq(4, None, 0).unwrap();
    let mut b = pd.qp_builder(QpType::Ud, &cq, &cq);
    b.create_flags(QpCreateFlags::BLOCK_SELF_MCAST_LB);
    let check = |e: Error, verb: &str| {
        eprintln!("{e}");
        assert_eq!(e.errno(), Some(libc::EOPNOTSUPP), "{e}");
        let text = e.to_string();
        assert!(text.contains(verb), "{text}");
        assert!(text.contains("BLOCK_SELF_MCAST_LB"), "{text}");
        assert!(text.contains(&common::device_name()), "{text}");
    };
    check(id.create_qp(&b).unwrap_err(), "rdma_create_qp_ex");
    check(id.create_qp_ex(&b).unwrap_err(), "rdma_create_qp_ex");
    assert!(id.raw_qp().is_null());
    check(b.build().unwrap_err(), "ibv_create_qp_ex");
    b.post_path(rdma::PostPath::Legacy);
    check(b.build().unwrap_err(), "ibv_create_qp_ex");
    // Unknown bits travel to the provider too (and are refused the same way).
    b.create_flags(QpCreateFlags::from_bits_retain(1 << 30));
    assert_eq!(b.build().unwrap_err().errno(), Some(libc::EOPNOTSUPP));
    b.create_flags(QpCreateFlags::empty());
    let qp = id.create_qp(&b).unwrap();
    assert_eq!(id.raw_qp(), qp.as_raw());
}

/// siw has no extended QP creation at all: any create flag is refused.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn iwarp_create_flags_are_unsupported_on_siw() {
    let ctx = common::open(&common::iwarp_device_name());
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4, None, 0).unwrap();
    let mut b = pd.qp_builder(QpType::Rc, &cq, &cq);
    b.create_flags(QpCreateFlags::BLOCK_SELF_MCAST_LB);
    let e = b.build().unwrap_err();
    eprintln!("{e}");
    assert_eq!(e.errno(), Some(libc::EOPNOTSUPP), "{e}");
    assert!(e.to_string().contains("ibv_create_qp_ex"), "{e}");
    b.create_flags(QpCreateFlags::empty());
    b.build().unwrap();
}
