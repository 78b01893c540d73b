//! Discovery from the real `/sys/class/infiniband` (`rdma::sysfs`) checked
//! against what verbs report for the same device: soft-RoCE `rxe0`
//! (`RDMA_TEST_DEVICE`) and soft-iWARP `siw0` (`RDMA_TEST_IWARP_DEVICE`, the
//! tests with `iwarp` in their name).

mod common;

use rdma::sysfs::{self, EndPort, RdmaDevice, Sysfs};
use rdma::{Context, Error, Gid, Guid, LinkLayer, NodeType, PortAttr, TransportType};

fn sysfs_device(name: &str) -> RdmaDevice {
    Sysfs::system()
        .device(name)
        .unwrap_or_else(|e| panic!("{name} is not in sysfs: {e}"))
}

/// Device-level properties against `ibv_get_device_list` and
/// `ibv_query_device_ex`.
fn check_device(name: &str, expect_transport: TransportType) -> (RdmaDevice, Context) {
    let dev = sysfs_device(name);
    let verbs_dev = rdma::device_by_name(name).expect("the device is listed by verbs");
    let ctx = dev.open().expect("RdmaDevice::open");
    assert_eq!(ctx.name(), name);
    let attr = ctx.query_device().expect("query_device");

    assert_eq!(dev.node_type().unwrap(), verbs_dev.node_type());
    assert_eq!(dev.transport_type().unwrap(), verbs_dev.transport_type());
    assert_eq!(dev.transport_type().unwrap(), expect_transport);
    assert_eq!(dev.node_guid().unwrap(), verbs_dev.guid());
    assert_eq!(dev.node_guid().unwrap(), attr.node_guid());
    assert_eq!(dev.sys_image_guid().unwrap(), attr.sys_image_guid());
    match dev.fw_ver().unwrap() {
        Some(fw) => assert_eq!(fw, attr.fw_ver()),
        // The driver has no firmware string; verbs format the numeric
        // version, which is 0.
        None => assert!(
            attr.fw_ver().chars().all(|c| c == '0' || c == '.'),
            "{:?}",
            attr.fw_ver()
        ),
    }
    if let Some(hw) = dev.hw_rev().unwrap() {
        assert_eq!(
            u32::from_str_radix(&hw, 16).ok(),
            Some(attr.hw_ver()),
            "{hw}"
        );
    }
    assert_eq!(
        dev.phys_port_count().unwrap(),
        u32::from(attr.phys_port_cnt())
    );
    assert_eq!(dev.phys_port_count().unwrap(), u32::from(ctx.port_count()));
    let numbers: Vec<u32> = dev
        .end_ports()
        .unwrap()
        .iter()
        .map(EndPort::port_num)
        .collect();
    let expected: Vec<u32> = (1..=u32::from(ctx.port_count())).collect();
    assert_eq!(numbers, expected);
    // The independent reader of tests/common sees the same description.
    assert_eq!(
        dev.node_desc().unwrap(),
        common::sysfs(name, "node_desc").unwrap()
    );
    for (file, value) in [
        ("hca_type", dev.hca_type().unwrap()),
        ("board_id", dev.board_id().unwrap()),
    ] {
        assert_eq!(
            value,
            common::sysfs(name, file).ok().filter(|s| !s.is_empty()),
            "{file}"
        );
    }
    (dev, ctx)
}

/// Port attributes against `ibv_query_port`.
fn check_port_attrs(port: &EndPort, attr: &PortAttr, ib_addressing: bool) {
    assert_eq!(port.state().unwrap(), attr.state, "{port}");
    assert_eq!(port.phys_state().unwrap().to_raw(), attr.phys_state);
    assert_eq!(port.cap_mask().unwrap(), attr.port_cap_flags);
    assert_eq!(port.link_layer().unwrap(), attr.link_layer);
    let rate = port.rate().unwrap();
    assert_eq!(Some(rate.gbps), attr.rate_gbps(), "{rate:?} {attr:?}");
    assert_eq!(rate.lanes, attr.width_lanes(), "{rate:?}");
    assert_eq!(
        rate.speed.as_deref(),
        attr.lane_speed().map(|(_, name)| name),
        "{rate:?}"
    );
    let rate_file = format!("ports/{}/rate", port.port_num());
    assert_eq!(
        rate.text,
        common::sysfs(port.device().name(), &rate_file).unwrap()
    );
    if ib_addressing {
        assert_eq!(port.lid().unwrap(), Some(attr.lid));
        assert_eq!(port.lmc().unwrap(), Some(attr.lmc));
        assert_eq!(port.sm_lid().unwrap(), Some(attr.sm_lid));
        assert_eq!(port.sm_sl().unwrap(), Some(attr.sm_sl));
        if let Some(t) = port.subnet_timeout().unwrap() {
            assert_eq!(t, attr.subnet_timeout);
        }
    } else {
        assert_eq!(port.lid().unwrap(), None);
        assert_eq!(port.lmc().unwrap(), None);
        assert_eq!(port.sm_lid().unwrap(), None);
        assert_eq!(port.sm_sl().unwrap(), None);
        assert_eq!(port.subnet_timeout().unwrap(), None);
        assert_eq!(port.port_guid().unwrap(), None);
    }
    assert_eq!(
        port.gids().len().unwrap(),
        usize::try_from(attr.gid_tbl_len).unwrap()
    );
    match port.pkeys().unwrap() {
        Some(pkeys) => assert_eq!(pkeys.len().unwrap(), usize::from(attr.pkey_tbl_len)),
        None => assert_eq!(attr.pkey_tbl_len, 0),
    }
}

/// Every GID slot against `ibv_query_gid`, every entry against
/// `ibv_query_gid_ex` and `ibv_query_gid_table`. Returns the entry count.
fn check_gids(ctx: &Context, port: &EndPort) -> usize {
    let p = port.port_num();
    let gids = port.gids();
    let len = u32::try_from(gids.len().unwrap()).unwrap();
    for index in 0..len {
        let verbs = ctx.query_gid(p, index).expect("query_gid");
        let ours = gids.get(index).unwrap();
        assert_eq!(ours.unwrap_or_default(), verbs, "{port} GID {index}");
    }
    let ours: Vec<(u32, Gid)> = gids.iter().collect::<rdma::Result<_>>().unwrap();
    let table: Vec<_> = ctx
        .query_gid_table()
        .expect("query_gid_table")
        .into_iter()
        .filter(|e| e.port == p)
        .collect();
    let verbs: Vec<(u32, Gid)> = table.iter().map(|e| (e.index, e.gid)).collect();
    assert_eq!(ours, verbs, "{port}");
    for entry in &table {
        let ex = ctx.query_gid_ex(p, entry.index).expect("query_gid_ex");
        assert_eq!(&ex, entry);
        assert_eq!(
            port.gid_type(entry.index).unwrap(),
            Some(entry.gid_type),
            "{port} GID {}",
            entry.index
        );
        assert_eq!(
            port.gid_netdev(entry.index).unwrap(),
            entry.netdev_name(),
            "{port} GID {}",
            entry.index
        );
        assert_eq!(
            gids.index_of(&entry.gid).unwrap().map(|i| i <= entry.index),
            Some(true)
        );
    }
    assert_eq!(port.default_gid().unwrap(), ctx.query_gid(p, 0).unwrap());
    ours.len()
}

/// Every P_Key slot against `ibv_query_pkey`, and `index_of` against
/// `ibv_get_pkey_index`. Returns the entry count.
fn check_pkeys(ctx: &Context, port: &EndPort) -> usize {
    let Some(pkeys) = port.pkeys().unwrap() else {
        return 0;
    };
    let p = u8::try_from(port.port_num()).unwrap();
    let mut count = 0;
    for index in 0..u32::try_from(pkeys.len().unwrap()).unwrap() {
        let mut be: u16 = 0;
        let idx = i32::try_from(index).unwrap();
        // SAFETY: a live context, a port and index inside its table, and a
        // writable out-value.
        let rc = unsafe { rdma::ffi::ibv_query_pkey(ctx.as_raw(), p, idx, &mut be) };
        assert_eq!(rc, 0, "ibv_query_pkey({port}, {index})");
        let verbs = u16::from_be(be);
        let ours = pkeys.get(index).unwrap();
        assert_eq!(ours.unwrap_or(0), verbs, "{port} P_Key {index}");
        if let Some(pkey) = ours {
            count += 1;
            // SAFETY: a live context and a valid port.
            let verbs_index =
                unsafe { rdma::ffi::ibv_get_pkey_index(ctx.as_raw(), p, pkey.to_be()) };
            assert_eq!(
                pkeys.index_of(&pkey).unwrap(),
                u32::try_from(verbs_index).ok(),
                "{port} P_Key {pkey:#x}"
            );
        }
    }
    count
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn sysfs_device_matches_query_device() {
    let name = common::device_name();
    let (dev, _ctx) = check_device(&name, TransportType::InfiniBand);
    assert_eq!(dev.node_type().unwrap(), NodeType::Ca);
    assert!(Sysfs::system().device_names().unwrap().contains(&name));
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn sysfs_ports_match_query_port() {
    let name = common::device_name();
    let (dev, ctx) = check_device(&name, TransportType::InfiniBand);
    for port in dev.end_ports().unwrap() {
        let attr = ctx.query_port(port.port_num()).expect("query_port");
        check_port_attrs(&port, &attr, true);
        assert_eq!(
            port.port_guid().unwrap(),
            Some(Guid(
                ctx.query_gid(port.port_num(), 0).unwrap().interface_id()
            ))
        );
    }
    let port = dev.end_port(1).unwrap();
    assert_eq!(port.link_layer().unwrap(), LinkLayer::Ethernet, "soft-RoCE");
    // What ibv_devinfo prints for the port.
    let info = common::ibv_devinfo(&name);
    let f = |k| common::field(&info, k);
    assert_eq!(
        format!(
            "{} ({})",
            port.state().unwrap(),
            port.state().unwrap().to_raw()
        ),
        f("state")
    );
    assert_eq!(
        u64::from(port.lid().unwrap().unwrap()),
        common::num(f("port_lid"))
    );
    assert_eq!(
        u64::from(port.sm_lid().unwrap().unwrap()),
        common::num(f("sm_lid"))
    );
    assert_eq!(
        u64::from(port.cap_mask().unwrap().bits()),
        common::num(f("port_cap_flags"))
    );
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn sysfs_gids_and_pkeys_match_verbs() {
    let name = common::device_name();
    let (dev, ctx) = check_device(&name, TransportType::InfiniBand);
    let port = dev.end_port(1).unwrap();
    let gid_entries = check_gids(&ctx, &port);
    assert!(gid_entries >= 2, "rxe has a link-local and an IPv4 GID");
    assert_eq!(
        check_pkeys(&ctx, &port),
        1,
        "RoCE has the default P_Key only"
    );
    assert_eq!(port.pkeys().unwrap().unwrap().get(0).unwrap(), Some(0xffff));

    // The test GID: RoCE v2 on the test netdev.
    let index = common::gid_index();
    let gid = port.gids().get(index).unwrap().expect("the test GID");
    assert_eq!(gid.to_ipv4_mapped(), Some(common::ip()));
    assert_eq!(port.gid_type(index).unwrap(), Some(rdma::GidType::RoceV2));
    if let Some(netdev) = common::netdev() {
        assert_eq!(port.gid_netdev(index).unwrap(), Some(netdev));
    }
    // Empty slots: zero in verbs, skipped by iteration, typeless.
    let len = u32::try_from(port.gids().len().unwrap()).unwrap();
    let empty = (0..len)
        .find(|&i| port.gids().get(i).unwrap().is_none())
        .expect("rxe has more GID slots than addresses");
    assert!(ctx.query_gid(1, empty).unwrap().is_zero());
    assert!(matches!(
        ctx.query_gid_ex(1, empty),
        Err(Error::EmptyGid { .. })
    ));
    assert_eq!(port.gid_type(empty).unwrap(), None);
    assert_eq!(port.gid_netdev(empty).unwrap(), None);
    assert!(matches!(
        port.gids().get(len),
        Err(Error::InvalidGidIndex { index, table_len, .. }) if index == len && table_len == len
    ));
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn sysfs_lookups_find_the_test_device() {
    let name = common::device_name();
    let sysfs = Sysfs::system();
    let ctx = common::open(&name);
    let port1 = format!("{name}/1");

    let guid = ctx.node_guid().unwrap();
    // Devices may share a node GUID (rxe and siw on one netdev do): the
    // first of them in name order, as verbs list them.
    let mut same_guid: Vec<String> = rdma::devices()
        .unwrap()
        .iter()
        .filter(|d| d.guid() == guid)
        .map(|d| d.name().to_string())
        .collect();
    same_guid.sort();
    assert_eq!(sysfs.find_node_guid(guid).unwrap().name(), same_guid[0]);

    let index = common::gid_index();
    let gid = ctx.query_gid(1, index).unwrap();
    let (port, found) = sysfs.find_port_gid(gid).unwrap();
    assert_eq!((port.name(), found), (port1.clone(), index));

    let port_guid = Guid(ctx.query_gid(1, 0).unwrap().interface_id());
    assert_eq!(sysfs.find_port_guid(port_guid).unwrap().name(), port1);
    assert_eq!(sysfs.find_port_name(&name).unwrap().name(), port1);
    assert_eq!(sysfs.find_port_name(&port1).unwrap().name(), port1);

    let devices = sysfs.devices().unwrap();
    let err = sysfs::find_port_name(&devices, &format!("{name}/2")).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("no port 2 on RDMA device {name} (ports: {port1})")
    );
    let err = sysfs.find_port_name("no_such_rdma_dev9").unwrap_err();
    assert!(err.to_string().contains(&name), "{err}");
    let err = sysfs
        .find_port_gid(Gid::from(std::net::Ipv4Addr::new(192, 0, 2, 77)))
        .unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
    assert!(err.to_string().contains(&port1), "{err}");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn sysfs_refresh_rereads_the_same_values() {
    let name = common::device_name();
    let dev = sysfs_device(&name);
    let port = dev.end_port(1).unwrap();
    let before = (
        port.state().unwrap(),
        port.gids()
            .iter()
            .collect::<rdma::Result<Vec<_>>>()
            .unwrap(),
        dev.node_guid().unwrap(),
    );
    dev.invalidate_port(1);
    dev.refresh();
    let after = (
        port.state().unwrap(),
        port.gids()
            .iter()
            .collect::<rdma::Result<Vec<_>>>()
            .unwrap(),
        dev.node_guid().unwrap(),
    );
    assert_eq!(before, after);
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_sysfs_device_and_ports_match_verbs() {
    let name = common::iwarp_device_name();
    let (dev, ctx) = check_device(&name, TransportType::Iwarp);
    assert_eq!(dev.node_type().unwrap(), NodeType::Rnic);
    for port in dev.end_ports().unwrap() {
        let attr = ctx.query_port(port.port_num()).expect("query_port");
        check_port_attrs(&port, &attr, false);
        assert!(port.pkeys().unwrap().is_none(), "iWARP has no P_Key table");
        assert_eq!(port.link_layer().unwrap(), LinkLayer::Ethernet);
    }
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_sysfs_gids_match_verbs() {
    let name = common::iwarp_device_name();
    let (dev, ctx) = check_device(&name, TransportType::Iwarp);
    let port = dev.first_end_port().unwrap();
    assert_eq!(check_gids(&ctx, &port), 1, "siw has one GID");
    assert_eq!(check_pkeys(&ctx, &port), 0);
    let gid = port.default_gid().unwrap();
    let (found, index) = Sysfs::system().find_port_gid(gid).unwrap();
    assert_eq!((found.name(), index), (format!("{name}/1"), 0));
}
