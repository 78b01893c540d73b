//! Helpers for device tests.
//!
//! Device tests are `#[ignore = "needs an RDMA device"]`: a plain `cargo test`
//! lists them as ignored. The harness (`ci/vm run`) runs them with
//! `--ignored` and sets `RDMA_TEST_DEVICE`; when a test runs, the device it
//! asks for must exist, or the test fails. Nothing here skips silently.
#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::process::Command;

use rdma::Context;

fn required_env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: this test needs an RDMA device. Run it in the VM \
             (ci/vm run ...) or set {var} on a machine with RDMA."
        )
    })
}

/// The RoCE/InfiniBand device under test (`RDMA_TEST_DEVICE`).
pub fn device_name() -> String {
    required_env("RDMA_TEST_DEVICE")
}

/// The iWARP device under test (`RDMA_TEST_IWARP_DEVICE`).
pub fn iwarp_device_name() -> String {
    required_env("RDMA_TEST_IWARP_DEVICE")
}

/// Opens a device by name; failure to open a requested device fails the test.
pub fn open(name: &str) -> Context {
    Context::open(name).unwrap_or_else(|e| panic!("cannot open test device {name}: {e}"))
}

/// The IPv4-mapped RoCE v2 GID index (`RDMA_TEST_GID_INDEX`).
pub fn gid_index() -> u32 {
    required_env("RDMA_TEST_GID_INDEX")
        .parse()
        .expect("RDMA_TEST_GID_INDEX is a number")
}

/// The IPv4 address of the test device's netdev (`RDMA_TEST_IP`).
pub fn ip() -> Ipv4Addr {
    required_env("RDMA_TEST_IP")
        .parse()
        .expect("RDMA_TEST_IP is an IPv4 address")
}

/// The netdev the test device sits on (`RDMA_TEST_NETDEV`), if told.
pub fn netdev() -> Option<String> {
    std::env::var("RDMA_TEST_NETDEV").ok()
}

/// A sysfs attribute of a device, trimmed.
pub fn sysfs(device: &str, rel: &str) -> std::io::Result<String> {
    std::fs::read_to_string(format!("/sys/class/infiniband/{device}/{rel}"))
        .map(|s| s.trim().to_string())
}

/// `ibv_devinfo -v -d DEVICE` from rdma-core, as (key, value) lines: the C
/// tool is the oracle for what the safe API reports.
pub fn ibv_devinfo(device: &str) -> Vec<(String, String)> {
    let out = Command::new("ibv_devinfo")
        .args(["-v", "-d", device])
        .output()
        .expect("ibv_devinfo (ibverbs-utils) runs");
    assert!(out.status.success(), "ibv_devinfo failed: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

/// The first value of `key` in `ibv_devinfo` output.
pub fn field<'a>(info: &'a [(String, String)], key: &str) -> &'a str {
    info.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("ibv_devinfo printed no {key:?}"))
}

/// Parses a decimal or `0x` hexadecimal number as `ibv_devinfo` prints it.
pub fn num(s: &str) -> u64 {
    let s = s.split_whitespace().next().unwrap_or(s);
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .unwrap_or_else(|e| panic!("not a number: {s:?}: {e}"))
}
