//! The `devinfo` and `asyncwatch` examples against rdma-core's own tools.

mod common;

use common::example;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn run(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd.output().expect("runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `key: value` lines, as both tools print them.
fn fields(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

fn first<'a>(f: &'a [(String, String)], key: &str) -> &'a str {
    f.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {key:?} in output"))
}

fn compare_with_ibv_devinfo(device: &str, extra: &[&str]) {
    let (ok, ours, err) = run(Command::new(example("devinfo"))
        .args(["-v", "-d", device])
        .args(extra));
    assert!(ok, "devinfo failed: {err}");
    let (ok, theirs, err) = run(Command::new("ibv_devinfo").args(["-v", "-d", device]));
    assert!(ok, "ibv_devinfo failed: {err}");
    let (ours, theirs) = (fields(&ours), fields(&theirs));
    for key in [
        "hca_id",
        "transport",
        "node_guid",
        "sys_image_guid",
        "vendor_id",
        "vendor_part_id",
        "phys_port_cnt",
        "max_mr_size",
        "page_size_cap",
        "max_qp",
        "max_qp_wr",
        "max_sge",
        "max_cq",
        "max_cqe",
        "max_mr",
        "max_pd",
        "max_srq",
        "max_pkeys",
        "state",
        "max_mtu",
        "active_mtu",
        "sm_lid",
        "port_lid",
        "link_layer",
        "max_msg_sz",
        "gid_tbl_len",
    ] {
        if extra.contains(&"--sysfs")
            && ![
                "hca_id",
                "transport",
                "node_guid",
                "sys_image_guid",
                "phys_port_cnt",
                "state",
                "link_layer",
                "sm_lid",
                "port_lid",
            ]
            .contains(&key)
        {
            continue; // sysfs has no device limits
        }
        assert_eq!(first(&ours, key), first(&theirs, key), "{key}");
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn devinfo_prints_what_ibv_devinfo_prints() {
    compare_with_ibv_devinfo(&common::device_name(), &[]);
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn devinfo_prints_what_ibv_devinfo_prints_for_iwarp() {
    compare_with_ibv_devinfo(&common::iwarp_device_name(), &[]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn devinfo_from_sysfs_alone() {
    compare_with_ibv_devinfo(&common::device_name(), &["--sysfs"]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn devinfo_bad_input() {
    let (ok, _, err) = run(Command::new(example("devinfo")).args(["-d", "nope9"]));
    assert!(!ok);
    assert!(err.contains("no RDMA device named \"nope9\""), "{err}");
    assert!(err.contains(&common::device_name()), "{err}");
    let (ok, _, err) =
        run(Command::new(example("devinfo")).args(["-d", &common::device_name(), "-i", "9"]));
    assert!(!ok);
    assert!(err.contains("port 9 does not exist"), "{err}");
    let (ok, _, err) = run(Command::new(example("devinfo")).arg("--bogus"));
    assert!(!ok);
    assert!(err.contains("unrecognized option '--bogus'"), "{err}");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn asyncwatch_reports_a_port_event() {
    let device = common::device_name();
    let netdev = common::netdev().expect("RDMA_TEST_NETDEV");
    let mut child = Command::new(example("asyncwatch"))
        .args(["-d", &device, "-n", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until it has opened the device: its first line.
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert!(line.contains("async event FD"), "{line}");
    let set = |state: &str| {
        assert!(Command::new("ip")
            .args(["link", "set", &netdev, state])
            .status()
            .unwrap()
            .success());
    };
    set("down");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            set("up");
            panic!("asyncwatch saw no event");
        }
        std::thread::yield_now();
    };
    set("up");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert!(status.success());
    assert!(
        rest.contains("got event port error (10) on port 1"),
        "{rest}"
    );
    // Leave the port active for the tests that follow.
    let ctx = common::open(&device);
    while ctx.query_port(1).unwrap().state != rdma::PortState::Active {
        assert!(
            Instant::now() < deadline + Duration::from_secs(20),
            "port did not come back"
        );
        std::thread::yield_now();
    }
}

#[test]
fn mckey_names_a_unicast_group_as_the_error() {
    // rdma-core's mckey answers a unicast -m with the join's timeout
    // (`RDMA_CM_EVENT_ADDR_ERROR, error: -110`); ours says what is wrong,
    // before it opens any device (so this runs without one).
    for group in ["10.8.0.1", "::1"] {
        let (ok, out, err) = run(Command::new(example("mckey")).args(["-m", group]));
        assert!(!ok, "mckey -m {group} succeeded: {out}");
        // Like the C tool, mckey reports on stdout.
        let text = format!("{out}{err}");
        assert!(
            text.contains(&format!("{group} is not a multicast address")),
            "mckey -m {group}: {text}"
        );
    }
}
