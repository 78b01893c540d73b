//! Helpers the device tests share (`kernel_nfsd.rs`, `device_removal.rs`;
//! `misbehaving/` takes the device and address under test): the kernel's
//! server brought up and down, the device and address under test, file
//! contents, the binary.
#![allow(dead_code)]

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rdma_nfs::nfs3::{Client, Options};
use sha2::{Digest, Sha256};

pub fn required_env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: this test needs an RDMA device. Run it in the VM (ci/vm run ...)."
        )
    })
}

/// The device must exist: its sysfs entry is checked, not assumed.
pub fn require_device(name: &str) {
    let p = format!("/sys/class/infiniband/{name}");
    assert!(
        Path::new(&p).exists(),
        "requested RDMA device {name} is missing"
    );
}

/// The server's address for the device under test.
pub fn server_ip(iwarp: bool) -> IpAddr {
    if iwarp {
        require_device(&required_env("RDMA_TEST_IWARP_DEVICE"));
        required_env("RDMA_TEST_IWARP_IP").parse().unwrap()
    } else {
        require_device(&required_env("RDMA_TEST_DEVICE"));
        required_env("RDMA_TEST_IP").parse().unwrap()
    }
}

pub fn nfsd(action: &str) -> Output {
    Command::new("sh")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/nfsd.sh"))
        .arg(action)
        .output()
        .expect("sh runs")
}

/// The kernel server, up while this lives, with a fresh directory of the
/// export for the test.
pub struct Server {
    pub dir: PathBuf,
}

impl Server {
    pub fn up(test: &str) -> Server {
        let out = nfsd("up");
        assert!(
            out.status.success(),
            "nfsd.sh up: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let dir = Path::new("/export").join(test);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Server { dir }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let out = nfsd("down");
        if !out.status.success() && !std::thread::panicking() {
            panic!("nfsd.sh down: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}

pub fn sha(data: &[u8]) -> Vec<u8> {
    Sha256::digest(data).to_vec()
}

/// Bytes that never repeat a 4-byte window position (an offset error shows).
pub fn content(len: usize, seed: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 4);
    let mut i = seed.wrapping_mul(2_654_435_761);
    while v.len() < len {
        v.extend_from_slice(&i.to_le_bytes());
        i = i.wrapping_add(1);
    }
    v.truncate(len);
    v
}

pub fn rdma_nfs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rdma-nfs"))
        .args(args)
        .output()
        .expect("rdma-nfs runs")
}

pub fn ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

pub async fn mount(ip: IpAddr, test: &str, o: Options) -> Client {
    Client::mount(ip, &format!("/export/{test}"), o)
        .await
        .unwrap_or_else(|e| panic!("mount {ip}:/export/{test}: {e}"))
}
