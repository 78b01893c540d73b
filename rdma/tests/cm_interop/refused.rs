//! What soft-RoCE refuses: AF_IB addresses (`-f gid`, `mckey -M`) and QP create
//! flags (`mckey -l`). The C tool fails first; the Rust port must fail at the same
//! step with the same error.

use super::*;

/// How long a tool that fails at setup may take.
const FAIL_DEADLINE: Duration = Duration::from_secs(30);

/// Runs `tool` on each side alone; both must fail, with a line starting
/// with `step` that contains `error` (on stdout or, `perror` for the C
/// tools, stderr).
fn fails_like_the_c_tool(tool: &str, a: &[&str], step: &str, error: &str) {
    for side in [Side::C, Side::Rust] {
        let f = spawn(&format!("{tool} ({side:?})"), command(tool, side, a))
            .finish(Instant::now() + FAIL_DEADLINE);
        eprintln!("{f}");
        assert!(f.status.is_some(), "{tool} did not exit by itself\n{f}");
        assert!(!f.success(), "{tool} succeeded\n{f}");
        assert!(
            f.stdout
                .lines()
                .chain(f.stderr.lines())
                .any(|l| l.starts_with(step) && l.contains(error)),
            "no {step:?} line with {error:?}\n{f}"
        );
        assert_eq!(
            f.stdout
                .lines()
                .last()
                .map(|l| l.starts_with("return status ")),
            Some(true),
            "{f}"
        );
    }
}

/// The test device's GID at `RDMA_TEST_GID_INDEX`, as sysfs prints it.
fn device_gid() -> String {
    let dev = common::device_name();
    common::sysfs(&dev, &format!("ports/1/gids/{}", common::gid_index())).expect("the GID")
}

/// `-l`: rxe creates no QP with `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn mckey_block_loopback_fails_on_rxe_like_the_c_tool() {
    let ip = roce_ip();
    fails_like_the_c_tool(
        "mckey",
        &["-m", GROUP, "-b", &ip, "-l", "-s", "-C", "1"],
        "mckey: unable to create QP: ",
        "Operation not supported",
    );
}

/// `-M`: joining an `AF_IB` group fails on RoCE (the kernel's `ENOTSUPP`).
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn mckey_unmapped_group_fails_on_rxe_like_the_c_tool() {
    let ip = roce_ip();
    fails_like_the_c_tool(
        "mckey",
        &["-M", "ff12:401b:ffff::1", "-b", &ip, "-C", "1"],
        "mckey: failure joining: ",
        "error 524",
    );
}

/// `-f gid` servers: binding the device's GID fails on RoCE (`ENODEV`).
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn udaddy_and_ucmatose_gid_servers_fail_on_rxe_like_the_c_tools() {
    let gid = device_gid();
    fails_like_the_c_tool(
        "udaddy",
        &["-f", "gid", "-b", &gid],
        "udaddy: bind address failed: ",
        "No such device",
    );
    fails_like_the_c_tool(
        "ucmatose",
        &["-f", "gid", "-b", &gid],
        "cmatose: bind address failed: ",
        "No such device",
    );
}

/// `-f gid` clients: the address resolves, the route does not (`ENODEV`).
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn udaddy_and_ucmatose_gid_clients_fail_on_rxe_like_the_c_tools() {
    let gid = device_gid();
    fails_like_the_c_tool(
        "udaddy",
        &["-f", "gid", "-s", &gid],
        "udaddy: resolve route failed: ",
        "No such device",
    );
    fails_like_the_c_tool(
        "ucmatose",
        &["-f", "gid", "-s", &gid],
        "cmatose: resolve route failed: ",
        "No such device",
    );
}
