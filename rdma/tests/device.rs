//! Device, port and GID queries against a real device (soft-RoCE `rxe0` and
//! soft-iWARP `siw0` in the VM). Modelled on rdma-core's `tests/test_device.py`.

mod common;

use rdma::{Context, Error, GidType, LinkLayer, NodeType, PortState, TransportType};

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn device_list_has_the_test_device() {
    let name = common::device_name();
    let devices = rdma::devices().expect("ibv_get_device_list");
    let dev = devices
        .iter()
        .find(|d| d.name() == name)
        .unwrap_or_else(|| panic!("{name} not in {devices:?}"));
    assert_eq!(dev.node_type(), NodeType::Ca);
    assert_eq!(dev.transport_type(), TransportType::InfiniBand);
    let sysfs_guid = common::sysfs(&name, "node_guid").unwrap();
    assert_eq!(dev.guid().to_string(), sysfs_guid);
    assert!(format!("{dev:?}").contains(&name));
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn unknown_device_name_is_a_clear_error() {
    let name = common::device_name();
    let err = Context::open("no_such_rdma_dev9").unwrap_err();
    assert!(matches!(err, Error::DeviceNotFound { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("no_such_rdma_dev9"), "{text}");
    assert!(text.contains(&name), "the message lists {name}: {text}");
    assert_eq!(err.errno(), Some(libc::ENODEV));
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn query_device_matches_ibv_devinfo() {
    let name = common::device_name();
    let ctx = common::open(&name);
    let attr = ctx.query_device().expect("query_device");
    let info = common::ibv_devinfo(&name);
    let f = |k| common::field(&info, k);
    assert_eq!(attr.fw_ver(), f("fw_ver"));
    assert_eq!(attr.node_guid().to_string(), f("node_guid"));
    assert_eq!(attr.sys_image_guid().to_string(), f("sys_image_guid"));
    assert_eq!(u64::from(attr.vendor_id()), common::num(f("vendor_id")));
    assert_eq!(
        u64::from(attr.vendor_part_id()),
        common::num(f("vendor_part_id"))
    );
    assert_eq!(u64::from(attr.hw_ver()), common::num(f("hw_ver")));
    assert_eq!(attr.max_mr_size(), common::num(f("max_mr_size")));
    assert_eq!(attr.page_size_cap(), common::num(f("page_size_cap")));
    for (ours, key) in [
        (attr.max_qp(), "max_qp"),
        (attr.max_qp_wr(), "max_qp_wr"),
        (attr.max_sge(), "max_sge"),
        (attr.max_sge_rd(), "max_sge_rd"),
        (attr.max_cq(), "max_cq"),
        (attr.max_cqe(), "max_cqe"),
        (attr.max_mr(), "max_mr"),
        (attr.max_pd(), "max_pd"),
        (attr.max_qp_rd_atom(), "max_qp_rd_atom"),
        (attr.max_qp_init_rd_atom(), "max_qp_init_rd_atom"),
        (attr.max_mw(), "max_mw"),
        (attr.max_ah(), "max_ah"),
        (attr.max_srq(), "max_srq"),
        (attr.max_srq_wr(), "max_srq_wr"),
        (attr.max_srq_sge(), "max_srq_sge"),
        (attr.max_mcast_grp(), "max_mcast_grp"),
    ] {
        assert_eq!(u64::from(ours), common::num(f(key)), "{key}");
    }
    assert_eq!(
        u64::from(attr.phys_port_cnt()),
        common::num(f("phys_port_cnt"))
    );
    assert_eq!(u32::from(attr.phys_port_cnt()), u32::from(ctx.port_count()));
    // "atomic_cap: ATOMIC_HCA (1)"
    let atomic: u32 = f("atomic_cap")
        .rsplit_once('(')
        .and_then(|(_, v)| v.trim_end_matches(')').parse().ok())
        .expect("atomic_cap value");
    assert_eq!(attr.atomic_cap().to_raw(), atomic);
    assert!(attr.max_qp() > 0 && attr.max_cqe() > 0 && attr.max_sge() > 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn query_port_reports_an_active_roce_port() {
    let name = common::device_name();
    let ctx = common::open(&name);
    let port = ctx.query_port(1).expect("query_port");
    let info = common::ibv_devinfo(&name);
    let f = |k| common::field(&info, k);
    assert_eq!(port.state, PortState::Active);
    assert_eq!(f("state"), "PORT_ACTIVE (4)");
    // link_layer is an extended field: the compat ibv_query_port leaves it 0.
    assert_eq!(port.link_layer, LinkLayer::Ethernet);
    assert_eq!(f("link_layer"), "Ethernet");
    assert_eq!(
        port.max_mtu.bytes().unwrap().to_string(),
        f("max_mtu").split(' ').next().unwrap()
    );
    assert_eq!(
        port.active_mtu.bytes().unwrap().to_string(),
        f("active_mtu").split(' ').next().unwrap()
    );
    assert!(port.active_mtu.bytes() <= port.max_mtu.bytes());
    assert_eq!(u64::from(port.gid_tbl_len), common::num(f("gid_tbl_len")));
    assert_eq!(u64::from(port.max_msg_sz), common::num(f("max_msg_sz")));
    assert_eq!(
        u64::from(port.port_cap_flags.bits()),
        common::num(f("port_cap_flags"))
    );
    assert_eq!(u64::from(port.pkey_tbl_len), common::num(f("pkey_tbl_len")));
    assert_eq!(
        u64::from(port.port_cap_flags2),
        common::num(f("port_cap_flags2"))
    );
    assert!(port.gid_tbl_len > common::gid_index());
    // The rate the kernel derives from width x speed.
    let rate = common::sysfs(&name, "ports/1/rate").unwrap();
    let gbps: f64 = rate.split_whitespace().next().unwrap().parse().unwrap();
    assert_eq!(
        port.rate_gbps(),
        Some(gbps),
        "sysfs rate {rate:?}, {port:?}"
    );
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn port_numbers_outside_the_device_are_rejected() {
    let name = common::device_name();
    let ctx = common::open(&name);
    for bad in [0u32, 2, 99, 256, u32::MAX] {
        let err = ctx.query_port(bad).unwrap_err();
        match &err {
            Error::InvalidPort {
                port, port_count, ..
            } => {
                assert_eq!(*port, bad);
                assert_eq!(*port_count, 1);
            }
            other => panic!("port {bad}: {other:?}"),
        }
        assert!(err
            .to_string()
            .contains(&format!("port {bad} does not exist on {name}")));
        assert!(matches!(
            ctx.query_gid(bad, 0),
            Err(Error::InvalidPort { .. })
        ));
        assert!(matches!(
            ctx.query_gid_ex(bad, 0),
            Err(Error::InvalidPort { .. })
        ));
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn gid_at_the_test_index_is_the_ipv4_mapped_roce_v2_gid() {
    let name = common::device_name();
    let ctx = common::open(&name);
    let index = common::gid_index();
    let ip = common::ip();
    let gid = ctx.query_gid(1, index).expect("query_gid");
    assert_eq!(gid.to_ipv4_mapped(), Some(ip), "{gid}");
    assert_eq!(gid.to_ipv6().to_string(), format!("::ffff:{ip}"));
    assert_eq!(
        gid.to_string(),
        common::sysfs(&name, &format!("ports/1/gids/{index}")).unwrap()
    );
    let entry = ctx.query_gid_ex(1, index).expect("query_gid_ex");
    assert_eq!(entry.gid, gid);
    assert_eq!(entry.index, index);
    assert_eq!(entry.port, 1);
    assert_eq!(entry.gid_type, GidType::RoceV2);
    assert_eq!(
        entry.gid_type.to_string(),
        common::sysfs(&name, &format!("ports/1/gid_attrs/types/{index}")).unwrap()
    );
    let ndev = entry.netdev_name().expect("a RoCE GID has a netdev");
    assert_eq!(
        ndev,
        common::sysfs(&name, &format!("ports/1/gid_attrs/ndevs/{index}")).unwrap()
    );
    if let Some(expected) = common::netdev() {
        assert_eq!(ndev, expected);
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn gid_index_past_the_table_is_rejected() {
    let name = common::device_name();
    let ctx = common::open(&name);
    let len = ctx.query_port(1).unwrap().gid_tbl_len;
    for bad in [len, len + 1, u32::MAX] {
        for err in [
            ctx.query_gid(1, bad).unwrap_err(),
            ctx.query_gid_ex(1, bad).unwrap_err(),
        ] {
            match &err {
                Error::InvalidGidIndex {
                    index, table_len, ..
                } => {
                    assert_eq!((*index, *table_len), (bad, len));
                }
                other => panic!("index {bad}: {other:?}"),
            }
            assert!(err
                .to_string()
                .contains(&format!("GID index {bad} is out of range")));
        }
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn empty_gid_entries_read_as_empty() {
    let name = common::device_name();
    let ctx = common::open(&name);
    let len = ctx.query_port(1).unwrap().gid_tbl_len;
    let zero = "0000:0000:0000:0000:0000:0000:0000:0000";
    let empty = (0..len)
        .find(|i| common::sysfs(&name, &format!("ports/1/gids/{i}")).unwrap() == zero)
        .expect("rxe has far more GID slots than addresses");
    assert!(ctx.query_gid(1, empty).unwrap().is_zero());
    let err = ctx.query_gid_ex(1, empty).unwrap_err();
    assert!(
        matches!(err, Error::EmptyGid { index, .. } if index == empty),
        "{err:?}"
    );
    assert_eq!(err.errno(), Some(libc::ENODATA));
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn gid_table_matches_sysfs() {
    let name = common::device_name();
    let ctx = common::open(&name);
    let table = ctx.query_gid_table().expect("query_gid_table");
    assert!(table.iter().any(|e| e.index == common::gid_index()));
    for e in &table {
        assert_eq!(e.port, 1);
        assert_eq!(
            e.gid.to_string(),
            common::sysfs(&name, &format!("ports/1/gids/{}", e.index)).unwrap()
        );
        assert_eq!(
            e.gid_type.to_string(),
            common::sysfs(&name, &format!("ports/1/gid_attrs/types/{}", e.index)).unwrap()
        );
        assert_eq!(&ctx.query_gid_ex(1, e.index).unwrap(), e);
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn context_is_shared_across_threads_and_outlives_the_device_list() {
    let name = common::device_name();
    let ctx = {
        let devices = rdma::devices().unwrap();
        let dev = devices.into_iter().find(|d| d.name() == name).unwrap();
        dev.open().unwrap()
        // the list and the Device are dropped here; the context keeps them.
    };
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let ctx = ctx.clone();
            std::thread::spawn(move || ctx.query_port(1).map(|p| p.state))
        })
        .collect();
    drop(ctx);
    for t in threads {
        assert_eq!(t.join().unwrap().unwrap(), PortState::Active);
    }
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_device_identity_and_port() {
    let name = common::iwarp_device_name();
    let dev = rdma::device_by_name(&name).expect("the iWARP device is listed");
    assert_eq!(dev.transport_type(), TransportType::Iwarp);
    assert_eq!(dev.node_type(), NodeType::Rnic);
    let ctx = dev.open().expect("open siw");
    let attr = ctx.query_device().expect("query_device");
    let info = common::ibv_devinfo(&name);
    assert_eq!(common::field(&info, "transport"), "iWARP (1)");
    assert_eq!(
        u64::from(attr.max_qp()),
        common::num(common::field(&info, "max_qp"))
    );
    assert_eq!(
        attr.node_guid().to_string(),
        common::field(&info, "node_guid")
    );
    let port = ctx.query_port(1).expect("query_port");
    assert_eq!(port.state, PortState::Active);
    assert_eq!(port.state.to_string(), "PORT_ACTIVE");
    assert_eq!(port.link_layer, LinkLayer::Ethernet);
    assert_eq!(
        port.active_mtu.bytes().unwrap().to_string(),
        common::field(&info, "active_mtu")
            .split(' ')
            .next()
            .unwrap()
    );
    let gid = ctx.query_gid(1, 0).expect("query_gid");
    assert_eq!(
        gid.to_string(),
        common::sysfs(&name, "ports/1/gids/0").unwrap()
    );
    assert!(!gid.is_zero());
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_bad_input_is_rejected() {
    let name = common::iwarp_device_name();
    let ctx = common::open(&name);
    assert!(matches!(ctx.query_port(0), Err(Error::InvalidPort { .. })));
    assert!(matches!(ctx.query_port(99), Err(Error::InvalidPort { .. })));
    let len = ctx.query_port(1).unwrap().gid_tbl_len;
    assert!(matches!(
        ctx.query_gid(1, len),
        Err(Error::InvalidGidIndex { .. })
    ));
}
