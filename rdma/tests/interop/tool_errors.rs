//! Failures: a clear message and exit status 1, never a panic (bad flags, a bad
//! device or port, an unreachable server, a UD size above the MTU, a RoCE peer
//! without a GID), and the device-dependent flags (`-t`, ODP, DM) followed as the
//! C tool follows them.

use super::*;

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn bad_flags_print_usage_and_exit_1() {
    for t in [Rc, Uc, Ud] {
        for bad in [
            &["--bogus"][..],
            &["-x"],
            &["-n"],
            &["-m", "1000"],
            &["a", "b"],
        ] {
            if t == Ud && bad[0] == "-m" {
                continue; // UD has no -m: covered by "-x"
            }
            let err = fails(t.example(), Command::new(example(t.example())).args(bad));
            assert!(err.contains("Usage:"), "{bad:?}: {err}");
        }
        // The C tool rejects the same flags.
        let out = Command::new(t.c_tool())
            .arg("--bogus")
            .output()
            .expect("the C tool runs");
        assert_eq!(out.status.code(), Some(1), "{} --bogus", t.c_tool());
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn bad_device_or_port_fails_cleanly() {
    for t in [Rc, Uc, Ud] {
        let err = fails(
            t.example(),
            Command::new(example(t.example())).args(["-d", "no_such_dev0"]),
        );
        assert!(err.contains("no_such_dev0"), "{err}");
        let err = fails(
            t.example(),
            Command::new(example(t.example())).args(["-d", &common::device_name(), "-i", "7"]),
        );
        assert!(err.contains("port 7"), "{err}");
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn unreachable_server_fails_cleanly() {
    let port = 18790;
    assert!(!listening(port), "TCP port {port} is in use");
    for t in [Rc, Uc, Ud] {
        let mut args = device_args();
        args.extend(["-p".into(), port.to_string(), "127.0.0.1".into()]);
        let err = fails(t.example(), Command::new(example(t.example())).args(&args));
        assert!(err.contains("Couldn't connect to 127.0.0.1:18790"), "{err}");
        // The C tool gives up the same way.
        let out = Command::new(t.c_tool())
            .args(&args)
            .output()
            .expect("the C tool runs");
        assert!(!out.status.success(), "{} reached nobody", t.c_tool());
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn ud_size_above_the_mtu_is_refused_like_the_c_tool() {
    let mut args = device_args();
    args.extend(["-s".into(), "8192".into(), "-p".into(), "18791".into()]);
    let err = fails(
        "ud_pingpong",
        Command::new(example("ud_pingpong")).args(&args),
    );
    assert!(err.contains("larger than port MTU"), "{err}");
    let out = Command::new("ibv_ud_pingpong")
        .args(&args)
        .output()
        .expect("ibv_ud_pingpong runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("larger than port MTU"));
}

/// `-t` (timestamps), `-o` (on-demand paging) and `-j` (device memory)
/// depend on the device: the Rust example must refuse them exactly when the
/// C tool does (soft-RoCE and soft-iWARP have no device memory, so `-j` is
/// refused there, with the C tool's message). All run as clients of a port
/// nobody listens on, so a capable device fails at the handshake instead.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rc_ts_odp_and_dm_follow_the_device_like_the_c_tool() {
    let port = 18792;
    assert!(!listening(port), "TCP port {port} is in use");
    for (flag, c_says, rust_says) in [
        ("-t", "timestamp", "timestamp"),
        ("-o", "ODP", "on-demand paging"),
        (
            "-j",
            "dm allocation",
            "Device doesn't support dm allocation",
        ),
    ] {
        let mut args = device_args();
        args.extend([
            flag.into(),
            "-p".into(),
            port.to_string(),
            "127.0.0.1".into(),
        ]);
        let c = Command::new("ibv_rc_pingpong")
            .args(&args)
            .output()
            .expect("ibv_rc_pingpong runs");
        assert!(!c.status.success());
        let c_refused = String::from_utf8_lossy(&c.stderr).contains(c_says);
        let err = fails(
            "rc_pingpong",
            Command::new(example("rc_pingpong")).args(&args),
        );
        assert_eq!(
            err.contains(rust_says),
            c_refused,
            "{flag}: ibv_rc_pingpong said {:?}, rc_pingpong said {err:?}",
            String::from_utf8_lossy(&c.stderr)
        );
        eprintln!(
            "{flag}: {}",
            if c_refused {
                "the device lacks it; both refuse"
            } else {
                "supported"
            }
        );
    }
}

/// On RoCE every address is a GID: a side given `-g` facing a peer without
/// one must say so, whichever side the Rust example is.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn roce_peer_without_gid_is_refused_clearly() {
    let dev = common::device_name();
    let gid = common::gid_index().to_string();
    // Rust server with -g, C client without: the server refuses the address.
    let port = "18793";
    let server = Running::spawn(
        "server rc_pingpong".into(),
        Command::new(example("rc_pingpong")).args(["-d", &dev, "-g", &gid, "-p", port]),
    );
    let server = wait_listening(server, 18793);
    let client = Running::spawn(
        "client ibv_rc_pingpong".into(),
        Command::new("ibv_rc_pingpong").args(["-d", &dev, "-p", port, "127.0.0.1"]),
    );
    let (server, client) = wait_both(server, client);
    assert_eq!(server.status.and_then(|s| s.code()), Some(1), "{server}");
    assert!(server.stderr.contains("run both sides with -g"), "{server}");
    assert!(!client.success(), "{client}");

    // C server with -g, Rust client without: the C server cannot reach a
    // GID-less address on RoCE and hangs up; the client says what happened.
    let port = "18794";
    let server = Running::spawn(
        "server ibv_rc_pingpong".into(),
        Command::new("ibv_rc_pingpong").args(["-d", &dev, "-g", &gid, "-p", port]),
    );
    let server = wait_listening(server, 18794);
    let client = Running::spawn(
        "client rc_pingpong".into(),
        Command::new(example("rc_pingpong")).args(["-d", &dev, "-p", port, "127.0.0.1"]),
    );
    let (server, client) = wait_both(server, client);
    assert!(!server.success(), "{server}");
    assert_eq!(client.status.and_then(|s| s.code()), Some(1), "{client}");
    assert!(
        client.stderr.contains("the peer closed the connection"),
        "{client}"
    );
    assert!(!client.stderr.contains("panicked"), "{client}");
}
