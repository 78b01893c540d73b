//! Discovery from sysfs (`rdma::sysfs`) against fixture trees copied from what
//! Linux 6.1 prints: `tests/fixtures/sysfs/fabric` (an InfiniBand CA with two
//! ports, an InfiniBand switch, a RoCE NIC and an iWARP NIC) and
//! `tests/fixtures/sysfs/broken` (missing, truncated and malformed files).
//!
//! The kernel fails reads of `gid_attrs/{types,ndevs}/<i>` with `EINVAL` for an
//! entry without a type or netdev; a regular file cannot do that, so the
//! fixtures hold empty files there.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use rdma::sysfs::{self, EndPort, PhysPortState, RdmaDevice, Sysfs};
use rdma::{
    Error, Gid, GidType, Guid, LinkLayer, NodeType, PortCapFlags, PortState, TransportType,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sysfs")
        .join(name)
}

fn fabric() -> Sysfs {
    Sysfs::at(fixture("fabric"))
}

fn broken() -> Sysfs {
    Sysfs::at(fixture("broken"))
}

fn gid(s: &str) -> Gid {
    Gid::from(s.parse::<std::net::Ipv6Addr>().unwrap())
}

fn port(sysfs: &Sysfs, name: &str) -> EndPort {
    sysfs
        .find_port_name(name)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A writable copy of a fixture tree, removed on drop.
struct TempTree {
    root: PathBuf,
}

impl TempTree {
    fn copy_of(name: &str) -> TempTree {
        static N: AtomicUsize = AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "rdma-sysfs-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&root);
        copy_dir(&fixture(name), &root).expect("copy the fixture tree");
        TempTree { root }
    }

    fn sysfs(&self) -> Sysfs {
        Sysfs::at(&self.root)
    }

    fn write(&self, rel: &str, text: &str) {
        let path = self.root.join("class/infiniband").join(rel);
        std::fs::write(&path, format!("{text}\n")).unwrap();
    }

    fn remove(&self, rel: &str) {
        std::fs::remove_file(self.root.join("class/infiniband").join(rel)).unwrap();
    }
}

impl Drop for TempTree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn copy_dir(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let dest = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &dest)?;
        } else {
            std::fs::copy(entry.path(), &dest)?;
        }
    }
    Ok(())
}

/// The error's message, checked to name `file` (a path suffix).
fn names_file(err: &Error, file: &str) -> String {
    let text = err.to_string();
    match err {
        Error::Sysfs { path, .. } => {
            assert!(path.ends_with(file), "{path:?} is not {file}")
        }
        other => panic!("expected a sysfs error for {file}, got {other:?}"),
    }
    assert!(text.contains(file), "{text:?} does not name {file}");
    text
}

#[test]
fn lists_devices_by_name() {
    let sysfs = fabric();
    assert_eq!(
        sysfs.device_names().unwrap(),
        ["cxgb4_0", "ibsw0", "mlx4_0", "mlx5_0"]
    );
    let devices = sysfs.devices().unwrap();
    assert_eq!(devices.len(), 4);
    assert_eq!(devices[2].name(), "mlx4_0");
    assert_eq!(
        devices[2].path(),
        fixture("fabric").join("class/infiniband/mlx4_0")
    );
    assert_eq!(Sysfs::system().root(), Path::new("/sys"));
    assert_eq!(Sysfs::default(), Sysfs::system());
    assert_eq!(
        sysfs.class_path(),
        fixture("fabric").join("class/infiniband")
    );
}

#[test]
fn a_root_without_class_infiniband_is_an_error_naming_it() {
    let sysfs = Sysfs::at(fixture("no-such-tree"));
    let err = sysfs.devices().unwrap_err();
    names_file(&err, "no-such-tree/class/infiniband");
    assert_eq!(err.errno(), Some(libc::ENOENT));
    assert_eq!(io::Error::from(err).kind(), io::ErrorKind::NotFound);
}

#[test]
fn infiniband_ca_device() {
    let dev = fabric().device("mlx4_0").unwrap();
    assert_eq!(dev.name(), "mlx4_0");
    assert_eq!(dev.node_type().unwrap(), NodeType::Ca);
    assert_eq!(dev.transport_type().unwrap(), TransportType::InfiniBand);
    assert_eq!(dev.node_guid().unwrap(), Guid(0x0002_c903_0010_abc0));
    assert_eq!(dev.sys_image_guid().unwrap(), Guid(0x0002_c903_0010_abc3));
    assert_eq!(dev.node_desc().unwrap(), "host1 mlx4_0");
    assert_eq!(dev.fw_ver().unwrap().as_deref(), Some("2.42.5000"));
    assert_eq!(dev.hw_rev().unwrap().as_deref(), Some("1"));
    assert_eq!(dev.hca_type().unwrap().as_deref(), Some("MT4099"));
    assert_eq!(dev.board_id().unwrap().as_deref(), Some("MT_1090120019"));
    assert_eq!(dev.phys_port_count().unwrap(), 2);
    let ports = dev.end_ports().unwrap();
    let numbers: Vec<u32> = ports.iter().map(EndPort::port_num).collect();
    assert_eq!(numbers, [1, 2]);
    assert_eq!(ports[1].name(), "mlx4_0/2");
    assert_eq!(ports[1].to_string(), "mlx4_0/2");
    assert_eq!(ports[1].device().name(), "mlx4_0");
    assert_eq!(dev.first_end_port().unwrap().port_num(), 1);
    assert!(format!("{dev:?}").contains("mlx4_0"));
    assert!(format!("{:?}", ports[0]).contains("port: 1"));
}

#[test]
fn infiniband_ca_active_port() {
    let p = port(&fabric(), "mlx4_0/1");
    assert_eq!(p.port_num(), 1);
    assert_eq!(p.state().unwrap(), PortState::Active);
    assert_eq!(p.phys_state().unwrap(), PhysPortState::LinkUp);
    assert_eq!(p.phys_state().unwrap().to_string(), "LinkUp");
    assert_eq!(p.lid().unwrap(), Some(0x12));
    assert_eq!(p.lmc().unwrap(), Some(2));
    assert_eq!(p.sm_lid().unwrap(), Some(1));
    assert_eq!(p.sm_sl().unwrap(), Some(3));
    assert_eq!(p.subnet_timeout().unwrap(), Some(18));
    let rate = p.rate().unwrap();
    assert_eq!(rate.text, "56 Gb/sec (4X FDR)");
    assert_eq!(rate.to_string(), "56 Gb/sec (4X FDR)");
    assert_eq!(rate.gbps, 56.0);
    assert_eq!(rate.lanes, Some(4));
    assert_eq!(rate.speed.as_deref(), Some("FDR"));
    let cap = p.cap_mask().unwrap();
    assert_eq!(cap.bits(), 0x0251_4868);
    assert!(cap.contains(PortCapFlags::CM_SUP | PortCapFlags::SYS_IMAGE_GUID_SUP));
    assert_eq!(p.link_layer().unwrap(), LinkLayer::InfiniBand);
    assert_eq!(p.port_guid().unwrap(), Some(Guid(0x0002_c903_0010_abc1)));
    assert_eq!(
        p.default_gid().unwrap().to_string(),
        "fe80:0000:0000:0000:0002:c903:0010:abc1"
    );
    assert_eq!(p.gid_type(0).unwrap(), Some(GidType::Ib));
    assert_eq!(
        p.gid_netdev(0).unwrap(),
        None,
        "InfiniBand GIDs have no netdev"
    );
    assert_eq!(p.gid_type(1).unwrap(), None, "slot 1 is empty");
    assert!(p.path().ends_with("fabric/class/infiniband/mlx4_0/ports/1"));
}

#[test]
fn infiniband_ca_down_port_without_subnet_timeout_file() {
    let p = port(&fabric(), "mlx4_0/2");
    assert_eq!(p.state().unwrap(), PortState::Down);
    assert_eq!(p.phys_state().unwrap(), PhysPortState::Polling);
    assert_eq!(p.lid().unwrap(), Some(0));
    assert_eq!(p.subnet_timeout().unwrap(), None);
    let rate = p.rate().unwrap();
    assert_eq!((rate.gbps, rate.lanes), (2.5, Some(1)));
    assert_eq!(rate.speed.as_deref(), Some("SDR"));
    assert_eq!(p.port_guid().unwrap(), Some(Guid(0x0002_c903_0010_abc2)));
}

#[test]
fn gid_table_is_an_ordered_list_that_skips_empty_slots() {
    let p = port(&fabric(), "mlx4_0/1");
    let gids = p.gids();
    assert_eq!(gids.len().unwrap(), 8);
    assert!(!gids.is_empty().unwrap());
    assert_eq!(&*gids.indices().unwrap(), &[0, 1, 2, 3, 4, 5, 6, 7]);
    assert!(gids.path().ends_with("ports/1/gids"));
    let alias = gid("fe80::2:c903:10:beef");
    let all: Vec<(u32, Gid)> = gids.iter().collect::<rdma::Result<_>>().unwrap();
    assert_eq!(all, [(0, p.default_gid().unwrap()), (3, alias)]);
    assert_eq!(gids.get(3).unwrap(), Some(alias));
    assert_eq!(gids.get(2).unwrap(), None);
    assert_eq!(gids.first().unwrap(), Some((0, p.default_gid().unwrap())));
    assert_eq!(gids.index_of(&alias).unwrap(), Some(3));
    assert_eq!(gids.index_of(&gid("fe80::dead")).unwrap(), None);
    assert_eq!(
        gids.index_of(&Gid::default()).unwrap(),
        None,
        "empty slots are not entries"
    );
    assert_eq!(p.gid_type(3).unwrap(), Some(GidType::Ib));

    let err = gids.get(8).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidGidIndex { index: 8, table_len: 8, port: 1, ref device } if device == "mlx4_0"
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("GID index 8 is out of range"),
        "{err}"
    );
    assert!(matches!(p.gid_type(99), Err(Error::InvalidGidIndex { .. })));
    assert!(matches!(
        p.gid_netdev(99),
        Err(Error::InvalidGidIndex { .. })
    ));
}

#[test]
fn pkey_table_is_an_ordered_list_that_skips_empty_slots() {
    let p = port(&fabric(), "mlx4_0/1");
    let pkeys = p.pkeys().unwrap().expect("an InfiniBand port has P_Keys");
    assert_eq!(pkeys.len().unwrap(), 8);
    let all: Vec<(u32, u16)> = pkeys.iter().collect::<rdma::Result<_>>().unwrap();
    assert_eq!(all, [(0, 0xffff), (2, 0x8001), (5, 0x7fff)]);
    assert_eq!(pkeys.get(0).unwrap(), Some(0xffff));
    assert_eq!(pkeys.get(1).unwrap(), None);
    assert_eq!(pkeys.index_of(&0x7fff).unwrap(), Some(5));
    assert_eq!(pkeys.index_of(&0x1234).unwrap(), None);
    let err = pkeys.get(8).unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "no P_Key index 8 on mlx4_0/1 (the table has 8 entries)"
    );
    assert_eq!(err.errno(), Some(libc::ENODEV));
}

#[test]
fn switch_has_only_port_zero() {
    let sysfs = fabric();
    let dev = sysfs.device("ibsw0").unwrap();
    assert_eq!(dev.node_type().unwrap(), NodeType::Switch);
    assert_eq!(dev.transport_type().unwrap(), TransportType::InfiniBand);
    assert_eq!(dev.node_desc().unwrap(), "MF0;switch-1:IS5030/U1");
    assert_eq!(dev.fw_ver().unwrap(), None, "no fw_ver file");
    assert_eq!(dev.board_id().unwrap(), None);
    assert_eq!(dev.phys_port_count().unwrap(), 0);
    let ports = dev.end_ports().unwrap();
    assert_eq!(ports.len(), 1);
    let p = &ports[0];
    assert_eq!(p.port_num(), 0);
    assert_eq!(p.state().unwrap(), PortState::Active);
    assert_eq!(p.lid().unwrap(), Some(1));
    assert_eq!(p.rate().unwrap().gbps, 40.0);
    assert!(p.cap_mask().unwrap().contains(PortCapFlags::SM));
    assert_eq!(p.port_guid().unwrap(), Some(Guid(0x0008_f105_0020_1000)));
    assert_eq!(port(&sysfs, "ibsw0").port_num(), 0);
    assert_eq!(port(&sysfs, "ibsw0/0").port_num(), 0);
    let err = sysfs.find_port_name("ibsw0/1").unwrap_err();
    assert_eq!(
        err.to_string(),
        "no port 1 on RDMA device ibsw0 (ports: ibsw0/0)"
    );
}

#[test]
fn roce_device_types_and_netdevs() {
    let sysfs = fabric();
    let dev = sysfs.device("mlx5_0").unwrap();
    assert_eq!(dev.node_type().unwrap(), NodeType::Ca);
    assert_eq!(dev.transport_type().unwrap(), TransportType::InfiniBand);
    assert_eq!(dev.fw_ver().unwrap().as_deref(), Some("16.35.1012"));
    let p = dev.end_port(1).unwrap();
    assert_eq!(p.link_layer().unwrap(), LinkLayer::Ethernet);
    assert_eq!(p.lid().unwrap(), Some(0), "RoCE reports LID 0, as verbs do");
    assert_eq!(p.sm_lid().unwrap(), Some(0));
    assert_eq!(p.rate().unwrap().gbps, 25.0);
    assert!(p.cap_mask().unwrap().contains(PortCapFlags::IP_BASED_GIDS));
    let ipv4 = Gid::from(std::net::Ipv4Addr::new(192, 168, 10, 5));
    let entries: Vec<(u32, Gid, Option<GidType>, Option<String>)> = p
        .gids()
        .iter()
        .map(|e| {
            let (i, g) = e.unwrap();
            (i, g, p.gid_type(i).unwrap(), p.gid_netdev(i).unwrap())
        })
        .collect();
    let link_local = gid("fe80::ba59:9fff:fed4:e5f0");
    let ens = Some("ens1f0".to_string());
    let vlan = Some("ens1f0.100".to_string());
    assert_eq!(
        entries,
        [
            (0, link_local, Some(GidType::RoceV1), ens.clone()),
            (1, link_local, Some(GidType::RoceV2), ens),
            (4, ipv4, Some(GidType::RoceV1), vlan.clone()),
            (5, ipv4, Some(GidType::RoceV2), vlan),
        ]
    );
    assert_eq!(p.gid_type(2).unwrap(), None);
    assert_eq!(p.gid_netdev(2).unwrap(), None);
    assert_eq!(p.port_guid().unwrap(), Some(Guid(0xba59_9fff_fed4_e5f0)));
    let pkeys = p.pkeys().unwrap().expect("RoCE has one P_Key");
    assert_eq!(pkeys.len().unwrap(), 1);
    assert_eq!(pkeys.get(0).unwrap(), Some(0xffff));
    let (found, index) = sysfs.find_port_gid(ipv4).unwrap();
    assert_eq!((found.name(), index), ("mlx5_0/1".to_string(), 4));
}

#[test]
fn iwarp_has_no_lids_pkeys_or_port_guid() {
    let dev = fabric().device("cxgb4_0").unwrap();
    assert_eq!(dev.node_type().unwrap(), NodeType::Rnic);
    assert_eq!(dev.transport_type().unwrap(), TransportType::Iwarp);
    assert_eq!(dev.fw_ver().unwrap(), None, "fw_ver is empty");
    assert_eq!(dev.hca_type().unwrap(), None, "hca_type is absent");
    let p = dev.first_end_port().unwrap();
    assert_eq!(p.port_num(), 1);
    assert_eq!(p.state().unwrap(), PortState::Active);
    assert_eq!(p.link_layer().unwrap(), LinkLayer::Ethernet);
    assert_eq!(p.lid().unwrap(), None);
    assert_eq!(p.lmc().unwrap(), None);
    assert_eq!(p.sm_lid().unwrap(), None);
    assert_eq!(p.sm_sl().unwrap(), None);
    assert_eq!(p.subnet_timeout().unwrap(), None);
    assert_eq!(p.port_guid().unwrap(), None);
    assert!(p.pkeys().unwrap().is_none());
    assert_eq!(p.cap_mask().unwrap().bits(), 0x0009_0000);
    let g = p.default_gid().unwrap();
    assert_eq!(g.to_string(), "0007:4305:e2f0:0000:0000:0000:0000:0000");
    assert_eq!(
        p.gid_type(0).unwrap(),
        Some(GidType::Ib),
        "as verbs report siw's GID"
    );
    assert_eq!(p.gid_netdev(0).unwrap(), None);
    assert_eq!(p.gids().len().unwrap(), 1);
}

#[test]
fn lookups_across_devices() {
    let sysfs = fabric();
    let dev = sysfs.find_node_guid(Guid(0x0002_c903_0010_abc0)).unwrap();
    assert_eq!(dev.name(), "mlx4_0");
    let p = sysfs.find_port_guid(Guid(0x0002_c903_0010_abc2)).unwrap();
    assert_eq!(p.name(), "mlx4_0/2");
    let (p, index) = sysfs.find_port_gid(gid("fe80::2:c903:10:beef")).unwrap();
    assert_eq!((p.name(), index), ("mlx4_0/1".to_string(), 3));
    assert_eq!(sysfs.find_port_name("mlx4_0").unwrap().name(), "mlx4_0/1");
    assert_eq!(sysfs.find_port_name("mlx4_0/2").unwrap().name(), "mlx4_0/2");
    assert_eq!(sysfs.find_port_name("cxgb4_0").unwrap().name(), "cxgb4_0/1");

    // The same lookups over a list the caller keeps.
    let devices = sysfs.devices().unwrap();
    assert_eq!(
        sysfs::find_node_guid(&devices, Guid(0x0008_f105_0020_1000))
            .unwrap()
            .name(),
        "ibsw0"
    );
    assert_eq!(
        sysfs::find_port_guid(&devices, Guid(0xba59_9fff_fed4_e5f0))
            .unwrap()
            .name(),
        "mlx5_0/1"
    );
    let (p, index) = sysfs::find_port_gid(&devices, gid("fe80::2:c903:10:abc1")).unwrap();
    assert_eq!((p.name(), index), ("mlx4_0/1".to_string(), 0));
    assert_eq!(
        sysfs::find_port_name(&devices, "mlx5_0/1").unwrap().name(),
        "mlx5_0/1"
    );
}

#[test]
fn lookups_that_match_nothing_say_what_was_searched() {
    let sysfs = fabric();
    let all_ports = "ports: cxgb4_0/1, ibsw0/0, mlx4_0/1, mlx4_0/2, mlx5_0/1";

    let err = sysfs.find_node_guid(Guid(0x1234)).unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "no RDMA device with node GUID 0000:0000:0000:1234 \
         (devices: cxgb4_0, ibsw0, mlx4_0, mlx5_0)"
    );
    assert_eq!(err.errno(), Some(libc::ENODEV));
    assert_eq!(io::Error::from(err).kind(), io::ErrorKind::NotFound);

    let err = sysfs.find_port_guid(Guid(0x1234)).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("no RDMA port with port GUID 0000:0000:0000:1234 ({all_ports})")
    );

    let err = sysfs.find_port_gid(gid("fe80::1234")).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("no RDMA port with GID fe80:0000:0000:0000:0000:0000:0000:1234 ({all_ports})")
    );

    let err = sysfs.find_port_name("mlx9_0").unwrap_err();
    assert!(
        matches!(&err, Error::DeviceNotFound { name, .. } if name == "mlx9_0"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "no RDMA device named \"mlx9_0\" (devices present: cxgb4_0, ibsw0, mlx4_0, mlx5_0)"
    );
    let err = sysfs.find_port_name("mlx9_0/1").unwrap_err();
    assert!(matches!(err, Error::DeviceNotFound { .. }), "{err:?}");

    let err = sysfs.find_port_name("mlx4_0/3").unwrap_err();
    assert_eq!(
        err.to_string(),
        "no port 3 on RDMA device mlx4_0 (ports: mlx4_0/1, mlx4_0/2)"
    );
    let err = sysfs.find_port_name("mlx4_0/x").unwrap_err();
    assert_eq!(
        err.to_string(),
        "no RDMA port named \"mlx4_0/x\": \"x\" is not a port number \
         (ports: mlx4_0/1, mlx4_0/2)"
    );
    assert!(sysfs.find_port_name("mlx4_0/").is_err());
    assert!(sysfs.find_port_name("").is_err());

    for bad in ["nope", "", ".", "..", "../fabric", "mlx4_0/ports"] {
        let err = sysfs.device(bad).unwrap_err();
        assert!(
            matches!(&err, Error::DeviceNotFound { name, .. } if name == bad),
            "{bad:?}: {err:?}"
        );
        assert!(err.to_string().contains("cxgb4_0, ibsw0, mlx4_0, mlx5_0"));
    }

    let none: Vec<RdmaDevice> = Vec::new();
    let err = sysfs::find_node_guid(&none, Guid(1)).unwrap_err();
    assert!(err.to_string().ends_with("(devices: none)"), "{err}");
    let err = sysfs::find_port_gid(&none, gid("fe80::1")).unwrap_err();
    assert!(err.to_string().ends_with("(ports: none)"), "{err}");
}

#[test]
fn missing_and_malformed_device_files_name_the_file() {
    let dev = broken().device("bad0").unwrap();
    let err = dev.node_type().unwrap_err();
    let text = names_file(&err, "bad0/node_type");
    assert!(text.contains("cannot read"), "{text}");
    assert_eq!(err.errno(), Some(libc::ENOENT));
    assert_eq!(io::Error::from(err).kind(), io::ErrorKind::NotFound);

    let err = dev.node_guid().unwrap_err();
    let text = names_file(&err, "bad0/node_guid");
    assert!(text.contains("malformed value \"0002:c903:00\""), "{text}");
    assert!(text.contains("expected a GUID"), "{text}");
    assert_eq!(err.errno(), Some(libc::EINVAL));
    assert_eq!(io::Error::from(err).kind(), io::ErrorKind::InvalidData);

    // Working files of the same device still read.
    assert_eq!(dev.sys_image_guid().unwrap(), Guid(0x0002_c903_0010_bad0));
    names_file(&dev.end_ports().unwrap_err(), "bad0/ports");
    // A ports/ entry that is not a number.
    let bad2 = broken().device("bad2").unwrap();
    names_file(&bad2.end_ports().unwrap_err(), "bad2/ports/one");
}

#[test]
fn missing_and_malformed_port_files_name_the_file() {
    let sysfs = broken();
    let p = sysfs.device("bad1").unwrap().end_port(1).unwrap();
    let text = names_file(&p.state().unwrap_err(), "bad1/ports/1/state");
    assert!(text.contains("malformed value \"ACTIVE\""), "{text}");
    assert_eq!(p.phys_state().unwrap(), PhysPortState::LinkUp);
    let text = names_file(&p.lid().unwrap_err(), "ports/1/lid");
    assert!(text.contains("\"0xzz\""), "{text}");
    assert_eq!(p.lmc().unwrap(), Some(0));
    let err = p.sm_lid().unwrap_err();
    names_file(&err, "ports/1/sm_lid");
    assert_eq!(err.errno(), Some(libc::ENOENT));
    names_file(&p.rate().unwrap_err(), "ports/1/rate");
    let text = names_file(&p.cap_mask().unwrap_err(), "ports/1/cap_mask");
    assert!(text.contains("malformed value \"\""), "{text}");
    names_file(&p.subnet_timeout().unwrap_err(), "ports/1/subnet_timeout");
    let text = names_file(&p.gids().get(0).unwrap_err(), "ports/1/gids/0");
    assert!(text.contains("\"fe80:0000:0000\""), "{text}");
    names_file(&p.default_gid().unwrap_err(), "ports/1/gids/0");
    names_file(&p.port_guid().unwrap_err(), "ports/1/gids/0");
    // Entries are independent: the good one reads, iteration reports the bad
    // one in its place and goes on.
    let good = gid("fe80::2:c903:10:bad1");
    assert_eq!(p.gids().get(1).unwrap(), Some(good));
    let items: Vec<_> = p.gids().iter().collect();
    assert_eq!(items.len(), 2);
    assert!(items[0].is_err());
    assert_eq!(items[1].as_ref().unwrap(), &(1, good));
    assert!(
        p.gids().index_of(&good).is_err(),
        "the bad entry comes first"
    );
    // The gid_attrs directory is missing altogether.
    names_file(&p.gid_type(1).unwrap_err(), "ports/1/gid_attrs/types/1");
    names_file(&p.gid_netdev(1).unwrap_err(), "ports/1/gid_attrs/ndevs/1");
    let pkeys = p.pkeys().unwrap().unwrap();
    assert_eq!(pkeys.get(0).unwrap(), Some(0xffff));
    let text = names_file(&pkeys.get(1).unwrap_err(), "ports/1/pkeys/1");
    assert!(text.contains("expected a P_Key"), "{text}");
    // A device without node_type: transport-dependent properties say so.
    let err = sysfs.device("bad0").unwrap().transport_type().unwrap_err();
    names_file(&err, "bad0/node_type");
}

#[test]
fn lookups_in_a_broken_tree_find_good_devices_and_report_read_errors() {
    let sysfs = broken();
    // bad0 and bad1 come first and fail to read; ok0 still matches.
    let dev = sysfs.find_node_guid(Guid(0x0002_c903_0010_0c00)).unwrap();
    assert_eq!(dev.name(), "ok0");
    let (p, index) = sysfs.find_port_gid(gid("fe80::2:c903:10:c01")).unwrap();
    assert_eq!((p.name(), index), ("ok0/1".to_string(), 0));
    assert_eq!(
        sysfs
            .find_port_guid(Guid(0x0002_c903_0010_0c01))
            .unwrap()
            .name(),
        "ok0/1"
    );
    // When nothing matches, the read error is reported: the match may have
    // been in the file that could not be read.
    names_file(
        &sysfs.find_node_guid(Guid(0x42)).unwrap_err(),
        "bad0/node_guid",
    );
    names_file(
        &sysfs.find_port_gid(gid("fe80::42")).unwrap_err(),
        "bad0/ports",
    );
}

#[test]
fn values_are_read_on_first_use_and_cached_until_refresh() {
    let tree = TempTree::copy_of("fabric");
    let dev = tree.sysfs().device("mlx4_0").unwrap();
    let p = dev.end_port(1).unwrap();

    // Nothing was read yet: files changed now are what the first use sees.
    tree.write("mlx4_0/node_desc", "renamed before first use");
    tree.write("mlx4_0/ports/1/state", "2: INIT");
    assert_eq!(dev.node_desc().unwrap(), "renamed before first use");
    assert_eq!(p.state().unwrap(), PortState::Init);

    // Read once: later changes stay hidden until refresh.
    tree.write("mlx4_0/node_desc", "renamed again");
    tree.write("mlx4_0/ports/1/state", "4: ACTIVE");
    tree.remove("mlx4_0/ports/1/lid");
    assert_eq!(dev.node_desc().unwrap(), "renamed before first use");
    assert_eq!(p.state().unwrap(), PortState::Init);
    // lid was never read, so its removal shows at once.
    names_file(&p.lid().unwrap_err(), "ports/1/lid");

    p.refresh();
    assert_eq!(p.state().unwrap(), PortState::Active);
    assert_eq!(
        dev.node_desc().unwrap(),
        "renamed before first use",
        "the port's refresh keeps the device's cache"
    );
    dev.refresh();
    assert_eq!(dev.node_desc().unwrap(), "renamed again");
}

#[test]
fn table_entries_are_read_only_when_asked_for() {
    let tree = TempTree::copy_of("fabric");
    let p = tree.sysfs().find_port_name("mlx4_0/1").unwrap();
    let first = p.gids().get(0).unwrap().unwrap();

    // Entry 0 is cached; entries 1 and 3 were never read, so the files
    // changed now are what they return.
    let new0 = gid("fe80::aaaa");
    let new1 = gid("fe80::1111");
    let new3 = gid("fe80::3333");
    tree.write("mlx4_0/ports/1/gids/0", &new0.to_string());
    tree.write("mlx4_0/ports/1/gids/1", &new1.to_string());
    tree.write("mlx4_0/ports/1/gids/3", &new3.to_string());
    assert_eq!(p.gids().get(0).unwrap(), Some(first));
    assert_eq!(p.gids().get(1).unwrap(), Some(new1));
    assert_eq!(p.gids().get(3).unwrap(), Some(new3));
    // Removing a cached entry's file changes nothing either; a file never
    // read does not stop the others from being read.
    tree.remove("mlx4_0/ports/1/gids/1");
    tree.remove("mlx4_0/ports/1/gids/7");
    assert_eq!(p.gids().get(1).unwrap(), Some(new1));
    assert_eq!(p.default_gid().unwrap(), first);
    assert_eq!(p.port_guid().unwrap(), Some(Guid(first.interface_id())));

    // Iteration reads the rest, and fails at the file that is gone.
    let items: Vec<_> = p.gids().iter().collect();
    assert_eq!(items.len(), 4, "{items:?}");
    assert_eq!(items[0].as_ref().unwrap(), &(0, first));
    assert_eq!(items[1].as_ref().unwrap(), &(1, new1));
    assert_eq!(items[2].as_ref().unwrap(), &(3, new3));
    names_file(items[3].as_ref().unwrap_err(), "ports/1/gids/7");

    // The table's refresh drops its entries and its index list.
    p.gids().refresh();
    assert_eq!(p.gids().get(0).unwrap(), Some(new0));
    assert_eq!(p.gids().len().unwrap(), 6, "gids/1 and gids/7 are gone");
    let err = p.gids().get(1).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidGidIndex {
                index: 1,
                table_len: 6,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(p.gids().index_of(&new3).unwrap(), Some(3));

    // P_Keys work the same way.
    let pkeys = p.pkeys().unwrap().unwrap();
    assert_eq!(pkeys.get(0).unwrap(), Some(0xffff));
    tree.write("mlx4_0/ports/1/pkeys/0", "0x7fff");
    tree.write("mlx4_0/ports/1/pkeys/1", "0x8002");
    assert_eq!(pkeys.get(0).unwrap(), Some(0xffff));
    assert_eq!(pkeys.get(1).unwrap(), Some(0x8002));
    p.refresh();
    assert_eq!(pkeys.get(0).unwrap(), Some(0x7fff));
}

#[test]
fn invalidate_port_reaches_every_handle_of_that_port_only() {
    let tree = TempTree::copy_of("fabric");
    let dev = tree.sysfs().device("mlx4_0").unwrap();
    let p1 = dev.end_port(1).unwrap();
    let p1_again = dev.end_ports().unwrap().remove(0);
    let p2 = dev.end_port(2).unwrap();
    let p1_clone = p1.clone();
    assert_eq!(p1.lid().unwrap(), Some(0x12));
    assert_eq!(p2.lid().unwrap(), Some(0));
    assert_eq!(p1.pkeys().unwrap().unwrap().get(2).unwrap(), Some(0x8001));

    // An SM moves the port to another LID and changes a P_Key.
    tree.write("mlx4_0/ports/1/lid", "0x99");
    tree.write("mlx4_0/ports/2/lid", "0x98");
    tree.write("mlx4_0/ports/1/pkeys/2", "0x8003");
    assert_eq!(
        p1_again.lid().unwrap(),
        Some(0x12),
        "the handles share one cache"
    );

    // What the async-event code does on IBV_EVENT_LID_CHANGE for port 1.
    dev.invalidate_port(1);
    for p in [&p1, &p1_again, &p1_clone] {
        assert_eq!(p.lid().unwrap(), Some(0x99));
        assert_eq!(p.pkeys().unwrap().unwrap().get(2).unwrap(), Some(0x8003));
    }
    assert_eq!(p2.lid().unwrap(), Some(0), "port 2 keeps its cache");
    dev.invalidate_port(7); // no such port: nothing happens
    dev.refresh();
    assert_eq!(p2.lid().unwrap(), Some(0x98));
}

#[test]
fn handles_are_shared_across_threads() {
    fn send_sync<T: Send + Sync + Clone>() {}
    send_sync::<RdmaDevice>();
    send_sync::<EndPort>();
    send_sync::<Sysfs>();

    let p = port(&fabric(), "mlx4_0/1");
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let p = p.clone();
            std::thread::spawn(move || {
                if i % 2 == 0 {
                    p.refresh();
                }
                let gids: Vec<_> = p.gids().iter().collect::<rdma::Result<_>>().unwrap();
                (
                    p.state().unwrap(),
                    gids.len(),
                    p.pkeys().unwrap().unwrap().index_of(&0x8001).unwrap(),
                )
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), (PortState::Active, 2, Some(2)));
    }
}
