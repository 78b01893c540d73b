//! Fork support (`ibv_fork_init`, `ibv_is_fork_initialized`).
//!
//! The library's fork state is per process, so this binary holds a single
//! test (`ci/device-tests` also runs each test in a process of its own):
//! the order of the calls is the test's own.

mod common;

use std::process::Command;

use rdma::ForkStatus;

/// Whether the kernel reports copy-on-fork, from iproute2's `rdma system
/// show` (the netlink attribute libibverbs itself reads).
fn kernel_copy_on_fork() -> bool {
    let out = Command::new("rdma")
        .args(["system", "show"])
        .output()
        .expect("rdma (iproute2) runs");
    assert!(out.status.success(), "rdma system show failed: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains("copy-on-fork on") {
        true
    } else if text.contains("copy-on-fork off") {
        false
    } else {
        panic!("rdma system show printed no copy-on-fork state: {text:?}")
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn fork_status_before_and_after_fork_init() {
    let cow = kernel_copy_on_fork();
    // Before any verb: Unneeded on a copy-on-fork kernel, else off.
    let expected_before = if cow {
        ForkStatus::Unneeded
    } else {
        ForkStatus::Disabled
    };
    assert_eq!(rdma::is_fork_initialized(), expected_before);
    rdma::fork_init().unwrap();
    let expected_after = if cow {
        ForkStatus::Unneeded
    } else {
        ForkStatus::Enabled
    };
    assert_eq!(rdma::is_fork_initialized(), expected_after);
    // Idempotent, and the state survives opening a device and using it.
    rdma::fork_init().unwrap();
    let ctx = common::open(&common::device_name());
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd
        .reg_mr(vec![5u8; 4096], rdma::AccessFlags::LOCAL_WRITE)
        .unwrap();
    assert_eq!(rdma::is_fork_initialized(), expected_after);
    drop(mr);
}
