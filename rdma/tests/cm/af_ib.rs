//! AF_IB addresses on RoCE, and the source-address hint of `getaddrinfo` that
//! `create_ep` binds.

use super::*;

/// The test device's GID at `RDMA_TEST_GID_INDEX`, as sysfs prints it and as
/// a [`Gid`] (sysfs is the oracle, not the crate's `query_gid`).
fn device_gid() -> (String, Gid) {
    let dev = common::device_name();
    let text = common::sysfs(&dev, &format!("ports/1/gids/{}", common::gid_index()))
        .expect("the GID in sysfs");
    let ip: Ipv6Addr = text.parse().expect("sysfs prints GIDs in IPv6 notation");
    (text, ip.into())
}

/// librdmacm builds the `sockaddr_ib` of a GID lookup; the crate reads it
/// back field by field. Binding it on soft-RoCE fails: the kernel takes
/// `AF_IB` addresses on InfiniBand ports only (`ENODEV`).
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn af_ib_getaddrinfo_reads_back_and_bind_on_roce_is_enodev() {
    let (text, gid) = device_gid();
    let hints = AddrInfoHints {
        flags: AddrInfoFlags::PASSIVE | AddrInfoFlags::NUMERICHOST | AddrInfoFlags::FAMILY,
        family: libc::AF_IB,
        port_space: Some(PortSpace::Tcp),
        ..Default::default()
    };
    let info = cm::getaddrinfo(Some(&text), Some("7471"), Some(&hints)).unwrap();
    let entry = info.first();
    eprintln!("{entry:?}");
    assert_eq!(entry.family(), libc::AF_IB);
    let src = entry.src_cm_addr().expect("a source address");
    assert_eq!(src.family(), libc::AF_IB);
    let ib = src.ib().expect("an AF_IB address");
    assert_eq!(ib.gid, gid);
    assert_eq!(ib.port(), 7471);
    // librdmacm's defaults: the default P_Key, the whole service id
    // significant.
    let expected = IbAddr {
        pkey: 0xffff,
        ..IbAddr::new(gid).with_service(PortSpace::Tcp, 7471)
    };
    assert_eq!(ib, expected);
    assert_eq!(ib.sid_mask, !0);
    assert_eq!(entry.src_addr(), None, "not an IP address");

    let ch = EventChannel::new().unwrap();
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    let e = id.bind_addr(src).unwrap_err();
    assert_eq!(e.verb(), Some("rdma_bind_addr"), "{e}");
    assert_eq!(e.errno(), Some(libc::ENODEV), "{e}");
    assert!(e.to_string().contains("AF_IB"), "{e}");
    assert_eq!(id.local_cm_addr(), None);
    // The same id still binds to its IP address.
    id.bind_addr(SocketAddr::new(roce_ip(), 0)).unwrap();
    assert_eq!(
        id.local_cm_addr().and_then(|a| a.ip()).map(|a| a.ip()),
        Some(roce_ip())
    );
}

/// Resolving a GID on soft-RoCE (measured): the address resolves, and the
/// id's local and peer addresses read back as `AF_IB`, but the route does
/// not (`ENODEV`). With P_Key 0, or with an `AF_IB` source to bind, the
/// resolution itself fails with `ENODEV`.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn af_ib_resolve_on_roce_resolves_the_address_not_the_route() {
    let (text, gid) = device_gid();
    let hints = AddrInfoHints {
        flags: AddrInfoFlags::NUMERICHOST | AddrInfoFlags::FAMILY,
        family: libc::AF_IB,
        port_space: Some(PortSpace::Tcp),
        ..Default::default()
    };
    let info = cm::getaddrinfo(Some(&text), Some("7471"), Some(&hints)).unwrap();
    let entry = info.first();
    eprintln!("{entry:?}");
    let dst = entry.dst_cm_addr().expect("a destination");
    let dst_ib = IbAddr {
        pkey: 0xffff,
        ..IbAddr::new(gid).with_service(PortSpace::Tcp, 7471)
    };
    assert_eq!(dst, CmAddr::Ib(dst_ib));
    assert_eq!(entry.src_cm_addr(), None);

    let ch = EventChannel::new().unwrap();
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    id.resolve_addr(None, dst, T).unwrap();
    drop(expect(&ch, CmEventType::AddrResolved));
    assert_eq!(id.peer_cm_addr(), Some(dst));
    assert_eq!(id.dst_port(), 7471);
    let local = id.local_cm_addr().and_then(|a| a.ib()).expect("AF_IB");
    assert_eq!(local.gid, gid);
    assert_eq!(local.pkey, 0xffff);
    assert_eq!(local.sid >> 16, u64::from(PortSpace::Tcp.to_raw()));
    assert_ne!(local.port(), 0, "an ephemeral port");
    assert_eq!(local.port(), id.src_port());
    assert_eq!((id.local_addr(), id.peer_addr()), (None, None), "not IP");
    assert_eq!(id.context().unwrap().name(), common::device_name());
    let e = id.resolve_route(T).unwrap_err();
    assert_eq!(e.verb(), Some("rdma_resolve_route"), "{e}");
    assert_eq!(e.errno(), Some(libc::ENODEV), "{e}");

    let pkey0 = IbAddr::new(gid).with_service(PortSpace::Tcp, 7471);
    for src in [None, Some(CmAddr::from(IbAddr::new(gid)))] {
        let dst = if src.is_some() { dst } else { pkey0.into() };
        let id = ch.create_id(PortSpace::Tcp).unwrap();
        let e = id.resolve_addr(src, dst, T).unwrap_err();
        assert_eq!(e.verb(), Some("rdma_resolve_addr"), "{e}");
        assert_eq!(e.errno(), Some(libc::ENODEV), "{e}");
        assert!(e.to_string().contains("AF_IB"), "{e}");
    }
    assert!(ch.try_get_event().unwrap().is_none());
}

/// An `AF_IB` multicast group on soft-RoCE: the join is refused with the
/// kernel's `ENOTSUPP` (524), as rdma-core's `mckey -M` reports.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn af_ib_multicast_join_on_roce_is_refused() {
    let group: Ipv6Addr = "ff12:401b:ffff::1".parse().unwrap();
    let group = IbAddr::new(group.into());
    let ch = EventChannel::new().unwrap();
    let id = ch.create_id(PortSpace::Udp).unwrap();
    id.bind_addr(SocketAddr::new(roce_ip(), 0)).unwrap();
    let pd = id.pd().unwrap();
    let cq = id.context().unwrap().create_cq(4, None, 0).unwrap();
    let _qp = id.create_qp(&pd.qp_builder(QpType::Ud, &cq, &cq)).unwrap();
    for e in [
        id.join_multicast(group).unwrap_err(),
        id.join_multicast_ex(group, McJoinFlags::FullMember)
            .unwrap_err(),
    ] {
        eprintln!("{e}");
        assert!(e.verb().unwrap().starts_with("rdma_join_multicast"), "{e}");
        assert_eq!(e.errno(), Some(524), "{e}");
        assert!(e.to_string().contains("AF_IB"), "{e}");
    }
    assert!(ch.try_get_event().unwrap().is_none(), "no join event");
}

/// `ai_src_addr` in the hints: an active lookup carries it as the entry's
/// source, and `rdma_create_ep` binds the endpoint to it.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn getaddrinfo_source_hint_comes_back_and_create_ep_binds_it() {
    let ch = EventChannel::new().unwrap();
    let (_listener, addr) = listen(&ch, PortSpace::Tcp, roce_ip());
    let ip = roce_ip().to_string();
    let port = addr.port().to_string();
    let mut hints = AddrInfoHints {
        flags: AddrInfoFlags::NUMERICHOST,
        port_space: Some(PortSpace::Tcp),
        ..Default::default()
    };
    let without = cm::getaddrinfo(Some(&ip), Some(&port), Some(&hints)).unwrap();
    eprintln!("without a source hint: {without:?}");
    // A source port nobody uses, so that it can only come from the hint.
    let src = SocketAddr::new(roce_ip(), 47_123);
    hints.src_addr = Some(src.into());
    let info = cm::getaddrinfo(Some(&ip), Some(&port), Some(&hints)).unwrap();
    let entry = info.first();
    eprintln!("with {src}: {entry:?}");
    assert_eq!(entry.src_addr(), Some(src));
    assert_eq!(entry.src_cm_addr(), Some(CmAddr::Ip(src)));
    assert_eq!(entry.dst_addr(), Some(addr));
    let (ep, _) = cm::create_ep(&entry, None).unwrap();
    assert_eq!(ep.local_addr(), Some(src));
    assert_eq!(ep.src_port(), src.port());
    assert_eq!(ep.peer_addr(), Some(addr));
    assert_eq!(ep.context().unwrap().name(), common::device_name());
}
