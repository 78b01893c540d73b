//! The mechanics of deleting an RDMA device and adding it again that the
//! `device_removal` tests need whatever they run on it: waiting for sysfs,
//! `rdma link add` of rxe again with its port and GID, the descriptors this
//! process holds on the device's `uverbs` node, and the child process that
//! does the removal under a bound.
//!
//! `rdma/tests/device_removal.rs` has the same mechanics (and siw's): they
//! belong in one place both tests call (a script under `ci/lib/`), not in
//! each package's tests; this module is what `device_removal.rs` would hand
//! over to it, so that the test itself keeps only what is NFS's.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::{ok, required_env};

pub fn port_active(dev: &str) -> bool {
    std::fs::read_to_string(format!("/sys/class/infiniband/{dev}/ports/1/state"))
        .is_ok_and(|s| s.contains("ACTIVE"))
}

/// Polls `cond` every 20 ms for up to `bound`; false if it never held.
pub fn wait_for(bound: Duration, cond: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    while !cond() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// `rdma link add` of the rxe device again, then its port and IPv4 GID.
pub fn add_rxe_again(dev: &str) {
    let netdev = std::env::var("RDMA_TEST_NETDEV").unwrap_or_else(|_| "veth0".into());
    let out = Command::new("rdma")
        .args(["link", "add", dev, "type", "rxe", "netdev", &netdev])
        .output()
        .expect("rdma runs");
    ok(&out, "rdma link add");
    assert!(
        wait_for(Duration::from_secs(20), || port_active(dev)),
        "{dev}: port not ACTIVE within 20 s of rdma link add"
    );
    let gid = format!(
        "/sys/class/infiniband/{dev}/ports/1/gids/{}",
        std::env::var("RDMA_TEST_GID_INDEX").unwrap_or_else(|_| "1".into())
    );
    // The IPv4-mapped GID of the device's address, at the index the tests use.
    let ip: std::net::Ipv4Addr = required_env("RDMA_TEST_IP").parse().unwrap();
    let want = ip.to_ipv6_mapped();
    assert!(
        wait_for(Duration::from_secs(10), || {
            std::fs::read_to_string(&gid)
                .is_ok_and(|g| g.trim().parse::<std::net::Ipv6Addr>() == Ok(want))
        }),
        "{gid}: not {want} within 10 s"
    );
}

/// The `uverbs` node of `dev` (`uverbs0`), from sysfs.
pub fn uverbs_node(dev: &str) -> String {
    let dir = std::fs::read_dir("/sys/class/infiniband_verbs").expect("infiniband_verbs in sysfs");
    for e in dir.flatten() {
        let ibdev = std::fs::read_to_string(e.path().join("ibdev")).unwrap_or_default();
        if ibdev.trim() == dev {
            return e.file_name().to_string_lossy().into_owned();
        }
    }
    panic!("no uverbs node for {dev}");
}

/// This process's descriptors open on `/dev/infiniband/NODE` (the node
/// may be deleted already: `... (deleted)`).
pub fn fds_on(node: &str) -> usize {
    let want = format!("/dev/infiniband/{node}");
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|t| {
            let t = t.to_string_lossy();
            t == want || t.strip_prefix(want.as_str()) == Some(" (deleted)")
        })
        .count()
}

/// Runs this binary's `test` again as a child with `env` set (so that a
/// hang can be killed: the kernel waits for every context the child holds),
/// for up to `bound`; `None` when it had to be killed.
pub fn run_child(test: &str, env: &str, bound: Duration) -> Option<ExitStatus> {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            test,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(env, "1")
        .spawn()
        .expect("spawn the child");
    wait_child(&mut child, bound)
}

/// Waits for `child` up to `bound`; kills it after that.
fn wait_child(child: &mut Child, bound: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            return Some(st);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Puts the rxe device `dev` back for the tests after this one: waits up to
/// 30 s for a pending `rdma link delete` to finish (it does once the child
/// that held the device is gone), then adds `dev` again if it is missing.
/// False if the delete was still pending after 30 s (something outside the
/// test holds the device).
pub fn restore_rxe(dev: &str) -> bool {
    let present = |d: &str| {
        std::path::Path::new("/sys/class/infiniband")
            .join(d)
            .exists()
    };
    let settled = wait_for(Duration::from_secs(30), || {
        !present(dev)
            || Command::new("pgrep")
                .args(["-x", "rdma"])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| !s.success())
    });
    if !present(dev) {
        add_rxe_again(dev);
    }
    settled && present(dev)
}
