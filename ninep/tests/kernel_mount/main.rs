//! The Linux kernel's 9P client (`trans=rdma`) mounts `rdma-9p serve` and
//! does what a user would; the served directory, read directly, is the
//! oracle. Device tests: they need root, the `9pnet_rdma` module and an
//! RDMA device (`ci/vm run`); a requested device that is missing fails.
//! The tests are here, under the names ci/ knows; what they do is in the
//! modules: `basic`, `bulk`, `concurrent`, `locks`, and `watchdog` (the rxe
//! tests' guard against issue 22).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use rdma_9p::client::{Client, ClientError, Options, Transport};

#[path = "../common/mod.rs"]
mod common;

mod basic;
mod bulk;
mod concurrent;
mod locks;
mod watchdog;

use basic::*;
use bulk::*;
use concurrent::*;
use locks::*;
use watchdog::*;

use common::{require_device, required_env, run, tmpdir, Mount, Server};

fn sha(p: &Path) -> Vec<u8> {
    let mut f = std::fs::File::open(p).unwrap();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    h.finalize().to_vec()
}

#[test]
#[ignore = "needs an RDMA device (rxe0), root and the 9pnet_rdma module: run in ci/vm"]
fn kernel_mount_over_rxe() {
    require_device(&required_env("RDMA_TEST_DEVICE"));
    let ip = required_env("RDMA_TEST_IP");
    kernel_client_uses_the_server(&ip, 5640, "rxe");
}

#[test]
#[ignore = "needs an iWARP device (siw0), root and the 9pnet_rdma module: run in ci/vm"]
fn kernel_mount_over_iwarp() {
    require_device(&required_env("RDMA_TEST_IWARP_DEVICE"));
    let ip = required_env("RDMA_TEST_IWARP_IP");
    kernel_client_uses_the_server(&ip, 5641, "iwarp");
}

/// Polls `cond` every 50 ms until it holds or `secs` pass.
fn wait_for(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::park_timeout(Duration::from_millis(50));
    }
    cond()
}

#[test]
#[ignore = "needs an RDMA device (rxe0), root and the 9pnet_rdma module: run in ci/vm"]
fn kernel_mount_server_killed_over_rxe() {
    require_device(&required_env("RDMA_TEST_DEVICE"));
    let ip = required_env("RDMA_TEST_IP");
    server_killed_during_writes(&ip, 5642, "rxe");
}

#[test]
#[ignore = "needs an iWARP device (siw0), root and the 9pnet_rdma module: run in ci/vm"]
fn kernel_mount_server_killed_over_iwarp() {
    require_device(&required_env("RDMA_TEST_IWARP_DEVICE"));
    let ip = required_env("RDMA_TEST_IWARP_IP");
    server_killed_during_writes(&ip, 5643, "iwarp");
}

#[test]
#[ignore = "needs an RDMA device (rxe0), root and the 9pnet_rdma module: run in ci/vm"]
fn kernel_mount_bulk_over_rxe() {
    let dev = required_env("RDMA_TEST_DEVICE");
    require_device(&dev);
    let ip = required_env("RDMA_TEST_IP");
    // The server and the mount point belong to this thread, so a QP that
    // gives up (the I/O thread then waits forever) still kills the server
    // and detaches the mount.
    let (export, mnt) = bulk_dirs("rxe");
    let mut server = Server::start(&ip, 5644, &export);
    let (e, m) = (export.clone(), mnt.clone());
    unless_a_qp_gives_up(&dev, &[&mnt], move || {
        bulk_io(&ip, 5644, "rxe", large_mib(16), &e, &m);
    });
    assert!(server.alive(), "rdma-9p exited with its client");
    let _ = std::fs::remove_dir_all(&export);
}

#[test]
#[ignore = "needs an iWARP device (siw0), root and the 9pnet_rdma module: run in ci/vm"]
fn kernel_mount_bulk_over_iwarp() {
    require_device(&required_env("RDMA_TEST_IWARP_DEVICE"));
    let ip = required_env("RDMA_TEST_IWARP_IP");
    bulk_transfers(&ip, 5645, "iwarp", large_mib(16));
}

#[test]
#[ignore = "needs an RDMA device (rxe0), root and the 9pnet_rdma module: run in ci/vm"]
fn kernel_mount_concurrent_clients_over_rxe() {
    let dev = required_env("RDMA_TEST_DEVICE");
    require_device(&dev);
    let ip = required_env("RDMA_TEST_IP");
    // As in the bulk test: the server and the mount points belong to this
    // thread, so a client QP that gives up still ends both.
    let (export, mnt1, mnt2) = concurrent_dirs("rxe");
    let mut server = Server::start(&ip, 5646, &export);
    let pid = server.pid();
    let (e, m1, m2) = (export.clone(), mnt1.clone(), mnt2.clone());
    unless_a_qp_gives_up(&dev, &[&mnt1, &mnt2], move || {
        concurrent_io(&ip, 5646, "rxe", pid, &e, &m1, &m2);
    });
    assert!(server.alive(), "rdma-9p exited");
    let _ = std::fs::remove_dir_all(&export);
}

#[test]
#[ignore = "needs an iWARP device (siw0), root and the 9pnet_rdma module: run in ci/vm"]
fn kernel_mount_concurrent_clients_over_iwarp() {
    require_device(&required_env("RDMA_TEST_IWARP_DEVICE"));
    let ip = required_env("RDMA_TEST_IWARP_IP");
    concurrent_clients(&ip, 5647, "iwarp");
}

#[test]
#[ignore = "needs an RDMA device (rxe0), root and the 9pnet_rdma module: run in ci/vm"]
fn kernel_mount_locks_over_rxe() {
    require_device(&required_env("RDMA_TEST_DEVICE"));
    let ip = required_env("RDMA_TEST_IP");
    locks_between_mounts(&ip, 5648, "rxe");
}

#[test]
#[ignore = "needs an iWARP device (siw0), root and the 9pnet_rdma module: run in ci/vm"]
fn kernel_mount_locks_over_iwarp() {
    require_device(&required_env("RDMA_TEST_IWARP_DEVICE"));
    let ip = required_env("RDMA_TEST_IWARP_IP");
    locks_between_mounts(&ip, 5649, "iwarp");
}
