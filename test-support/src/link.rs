//! An RDMA device deleted and added again under a test (see the crate docs).
//!
//! Failures panic with what was expected: these are test helpers, and a
//! device that does not come back must fail the test that needed it.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Where the kernel lists RDMA devices.
const SYSFS: &str = "/sys/class/infiniband";

/// How often a wait here looks again: sysfs and `rdma link` state change
/// within milliseconds, and nothing notifies a waiter of either.
const POLL: Duration = Duration::from_millis(10);

/// Whether `dev` is listed in sysfs.
pub fn device_present(dev: &str) -> bool {
    Path::new(SYSFS).join(dev).exists()
}

/// Whether port 1 of `dev` is ACTIVE.
pub fn port_active(dev: &str) -> bool {
    std::fs::read_to_string(Path::new(SYSFS).join(dev).join("ports/1/state"))
        .is_ok_and(|s| s.contains("ACTIVE"))
}

/// Looks at `cond` until it holds, for up to `bound`; false if it never did.
pub fn wait_for(bound: Duration, cond: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    while !cond() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL);
    }
    true
}

/// The device to add again: what `rdma link add` needs, and on RoCE the
/// address whose IPv4-mapped GID the tests use, at `gid_index`.
#[derive(Debug, Clone)]
pub struct Link {
    /// The RDMA device's name (`rxe0`).
    pub dev: String,
    /// `rxe` or `siw`.
    pub kind: String,
    /// The netdev it sits on.
    pub netdev: String,
    /// RoCE only: the IPv4 address whose GID is waited for, and its index.
    pub gid: Option<(Ipv4Addr, u32)>,
}

impl Link {
    /// `rdma link add DEV type KIND netdev NETDEV`, then waits for the port
    /// (20 s) and, when [`Link::gid`] is set, for that GID (10 s).
    pub fn add(&self) {
        let out = Command::new("rdma")
            .args([
                "link",
                "add",
                &self.dev,
                "type",
                &self.kind,
                "netdev",
                &self.netdev,
            ])
            .output()
            .expect("the `rdma` tool runs");
        assert!(
            out.status.success(),
            "rdma link add {} type {} netdev {}: {out:?}",
            self.dev,
            self.kind,
            self.netdev
        );
        assert!(
            wait_for(Duration::from_secs(20), || port_active(&self.dev)),
            "{}: port not ACTIVE within 20 s of rdma link add",
            self.dev
        );
        if let Some((ip, index)) = self.gid {
            let path = Path::new(SYSFS)
                .join(&self.dev)
                .join(format!("ports/1/gids/{index}"));
            let want = ip.to_ipv6_mapped();
            assert!(
                wait_for(Duration::from_secs(10), || {
                    std::fs::read_to_string(&path)
                        .is_ok_and(|g| g.trim().parse::<Ipv6Addr>() == Ok(want))
                }),
                "{}: not {want} within 10 s",
                path.display()
            );
        }
    }

    /// Puts the device back for the tests after this one: waits up to 30 s
    /// for a pending `rdma link delete` to finish (it does once whatever held
    /// the device is gone), then adds it again if it is missing. False if
    /// the delete was still pending after 30 s (something outside the test
    /// holds the device).
    pub fn restore(&self) -> bool {
        let settled = wait_for(Duration::from_secs(30), || {
            !device_present(&self.dev) || !rdma_tool_running()
        });
        if !device_present(&self.dev) {
            self.add();
        }
        settled && device_present(&self.dev)
    }
}

/// Whether an `rdma` process (a `link delete` in progress) is running.
fn rdma_tool_running() -> bool {
    Command::new("pgrep")
        .args(["-x", "rdma"])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The netdev under `dev`, from `rdma link show DEV/1` (`... netdev NAME`).
pub fn netdev_of(dev: &str) -> String {
    let out = Command::new("rdma")
        .args(["link", "show", &format!("{dev}/1")])
        .output()
        .expect("the `rdma` tool runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace();
    while let Some(w) = words.next() {
        if w == "netdev" {
            if let Some(n) = words.next() {
                return n.to_string();
            }
        }
    }
    panic!("no netdev for {dev} in `rdma link show`: {out:?}");
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

/// How many of this process's descriptors are open on `/dev/infiniband/NODE`
/// (the node may be deleted already: `... (deleted)`).
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

/// Runs this test binary's `test` again as a child with `env` set to 1 (so
/// that a hang can be ended by killing it: the kernel waits for every
/// context the child holds), for up to `bound`; `None` when it had to be
/// killed.
pub fn run_child(test: &str, env: &str, bound: Duration) -> Option<ExitStatus> {
    let mut child = Command::new(std::env::current_exe().expect("the test binary's path"))
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

/// Waits for `child` up to `bound`; kills it after that (`None`).
pub fn wait_child(child: &mut Child, bound: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(st) = child.try_wait().expect("wait for the child") {
            return Some(st);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_for_says_whether_the_condition_came() {
        assert!(wait_for(Duration::from_millis(50), || true));
        assert!(!wait_for(Duration::from_millis(30), || false));
    }

    #[test]
    fn a_child_past_its_bound_is_killed() {
        let mut child = Command::new("sleep").arg("30").spawn().expect("sleep runs");
        let start = Instant::now();
        assert_eq!(wait_child(&mut child, Duration::from_millis(100)), None);
        assert!(start.elapsed() < Duration::from_secs(10));
        let mut quick = Command::new("true").spawn().expect("true runs");
        assert!(wait_child(&mut quick, Duration::from_secs(10)).is_some_and(|s| s.success()));
    }

    #[test]
    fn no_descriptor_is_open_on_a_node_that_does_not_exist() {
        assert_eq!(fds_on("uverbs-none"), 0);
    }
}
