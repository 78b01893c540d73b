//! SRQ: srq_pingpong against ibv_srq_pingpong. Several RC QPs share one SRQ;
//! the handshake carries one address per QP (256 messages each way, the
//! unused ones all zero), and every side prints one address line per QP.

use super::*;

const SRQ_EXAMPLE: &str = "srq_pingpong";
const SRQ_TOOL: &str = "ibv_srq_pingpong";
/// `-q` of both tools when not given.
const SRQ_DEFAULT_QPS: usize = 16;

fn srq_command(side: Side) -> Command {
    match side {
        Side::Rust => Command::new(example(SRQ_EXAMPLE)),
        Side::C => Command::new(SRQ_TOOL),
    }
}

fn srq_label(side: Side) -> &'static str {
    match side {
        Side::Rust => SRQ_EXAMPLE,
        Side::C => SRQ_TOOL,
    }
}

/// Every `which` line (`local address:` / `remote address:`), in order.
fn srq_addresses(out: &Finished, which: &str) -> Vec<Address> {
    out.stdout
        .lines()
        .filter(|l| l.trim_start().starts_with(which))
        .map(|line| parse_address(line, out))
        .collect()
}

/// One srq_pingpong run: `server` and `client` with the same flags.
struct SrqRun {
    server: Side,
    client: Side,
    tcp_port: u16,
    flags: &'static [&'static str],
    size: u64,
    qps: usize,
}

impl SrqRun {
    fn new(server: Side, client: Side, tcp_port: u16) -> SrqRun {
        SrqRun {
            server,
            client,
            tcp_port,
            flags: &[],
            size: 4096,
            qps: SRQ_DEFAULT_QPS,
        }
    }

    fn flags(mut self, flags: &'static [&'static str]) -> SrqRun {
        self.flags = flags;
        let value = |flag: &str| {
            flags
                .iter()
                .position(|&f| f == flag)
                .map(|i| flags[i + 1].parse::<u64>().expect("a number"))
        };
        self.size = value("-s").unwrap_or(self.size);
        self.qps = value("-q").map_or(self.qps, |q| q as usize);
        self
    }

    fn args(&self) -> Vec<String> {
        run_args(self.tcp_port, self.flags)
    }

    fn check(self) {
        let (server, client, both) = run_both(
            self.tcp_port,
            (
                format!("server {}", srq_label(self.server)),
                srq_command(self.server).args(self.args()),
            ),
            (
                format!("client {}", srq_label(self.client)),
                srq_command(self.client).args(self.args()),
            ),
        );

        // The handshake: one address per QP each way, in order, and what
        // each side decoded is what the other encoded.
        let server_local = srq_addresses(&server, "local address:");
        let server_remote = srq_addresses(&server, "remote address:");
        let client_local = srq_addresses(&client, "local address:");
        let client_remote = srq_addresses(&client, "remote address:");
        for list in [&server_local, &server_remote, &client_local, &client_remote] {
            assert_eq!(list.len(), self.qps, "one address line per QP:\n{both}");
        }
        assert_eq!(server_remote, client_local, "{both}");
        assert_eq!(client_remote, server_local, "{both}");
        let gid = format!("::ffff:{}", common::ip());
        for a in server_local.iter().chain(&client_local) {
            assert_eq!(a.gid, gid, "{both}");
            assert!(a.qpn != 0 && a.psn <= 0xff_ffff, "{a:?}:\n{both}");
        }
        let mut qpns: Vec<u32> = server_local
            .iter()
            .chain(&client_local)
            .map(|a| a.qpn)
            .collect();
        qpns.sort_unstable();
        qpns.dedup();
        assert_eq!(qpns.len(), 2 * self.qps, "every QP is its own:\n{both}");

        // ITERS messages of `size` each way, over all QPs together.
        check_traffic(
            (&server, srq_label(self.server)),
            (&client, srq_label(self.client)),
            self.size,
            &both,
            SRQ_EXAMPLE,
            self.flags,
        );
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn srq_rust_server_c_client() {
    SrqRun::new(Rust, C, 18731).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn srq_c_server_rust_client() {
    SrqRun::new(C, Rust, 18732).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn srq_rust_server_rust_client() {
    SrqRun::new(Rust, Rust, 18733).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn srq_chk_rust_server_c_client() {
    SrqRun::new(Rust, C, 18734)
        .flags(&["-c", "-q", "3", "-m", "512"])
        .check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn srq_events_chk_c_server_rust_client() {
    SrqRun::new(C, Rust, 18735)
        .flags(&["-e", "-c", "-q", "5", "-s", "3000"])
        .check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn srq_events_rust_server_c_client() {
    SrqRun::new(Rust, C, 18736)
        .flags(&["-e", "-q", "2"])
        .check();
}

/// Fewer receives than QPs keeps refilling the SRQ (it is refilled when no
/// more than -q receives are left): -r 4 with 4 QPs refills on every receive.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn srq_events_chk_small_rx_depth_rust_server_rust_client() {
    SrqRun::new(Rust, Rust, 18737)
        .flags(&["-e", "-c", "-q", "4", "-r", "4", "-s", "100"])
        .check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn srq_bad_flags_fail_cleanly_like_the_c_tool() {
    for bad in [
        &["--bogus"][..],
        &["-x"],
        &["-q"],
        &["-q", "0"],
        &["-q", "256"],
        &["-m", "1000"],
        &["-t"],
        &["a", "b"],
    ] {
        let err = fails(SRQ_EXAMPLE, Command::new(example(SRQ_EXAMPLE)).args(bad));
        assert!(err.contains("Usage:"), "{bad:?}: {err}");
    }
    // Fewer receives than QPs: both tools refuse, saying so.
    let args = ["-q", "20", "-r", "10"];
    let err = fails(SRQ_EXAMPLE, Command::new(example(SRQ_EXAMPLE)).args(args));
    assert!(err.contains("rx_depth 10 is too small for 20 QPs"), "{err}");
    let out = Command::new(SRQ_TOOL)
        .args(args)
        .output()
        .expect("ibv_srq_pingpong runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("rx_depth 10 is too small for 20 QPs"),
        "{out:?}"
    );
    let out = Command::new(SRQ_TOOL)
        .arg("--bogus")
        .output()
        .expect("ibv_srq_pingpong runs");
    assert_eq!(out.status.code(), Some(1));
    // A device or port that does not exist.
    let err = fails(
        SRQ_EXAMPLE,
        Command::new(example(SRQ_EXAMPLE)).args(["-d", "no_such_dev0"]),
    );
    assert!(err.contains("no_such_dev0"), "{err}");
    let err = fails(
        SRQ_EXAMPLE,
        Command::new(example(SRQ_EXAMPLE)).args(["-d", &common::device_name(), "-i", "7"]),
    );
    assert!(err.contains("port 7"), "{err}");
}

/// Both sides must use the same -q. The Rust side notices a peer with a
/// different number of QPs in the handshake and says so.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn srq_num_qp_mismatch_is_refused_clearly() {
    let dev = common::device_name();
    let gid = common::gid_index().to_string();
    // A side with `-q qps` on TCP port `port`.
    let side = |mut cmd: Command, qps: &str, port: u16| {
        cmd.args(["-d", &dev, "-g", &gid, "-q", qps, "-p", &port.to_string()]);
        cmd
    };
    let rust = |qps, port| side(Command::new(example(SRQ_EXAMPLE)), qps, port);
    // Rust server -q 2, Rust client -q 3: the server refuses the client's
    // addresses and hangs up; the client says the peer closed the connection.
    let port = 18738;
    let server = Running::spawn("server srq_pingpong".into(), &mut rust("2", port));
    let server = wait_listening(server, port);
    let client = Running::spawn(
        "client srq_pingpong".into(),
        rust("3", port).arg("127.0.0.1"),
    );
    let (server, client) = wait_both(server, client);
    assert_eq!(server.status.and_then(|s| s.code()), Some(1), "{server}");
    assert!(
        server
            .stderr
            .contains("the peer has 3 QPs and this side 2: give both sides the same -q"),
        "{server}"
    );
    assert_eq!(client.status.and_then(|s| s.code()), Some(1), "{client}");
    assert!(
        client.stderr.contains("the peer closed the connection"),
        "{client}"
    );
    for side in [&server, &client] {
        assert!(!side.stderr.contains("panicked"), "{side}");
    }

    // C server -q 2, Rust client -q 3: the client refuses the server's
    // addresses. (The C server then waits for traffic that never comes, and
    // is killed.)
    let port = 18739;
    let server = Running::spawn(
        "server ibv_srq_pingpong".into(),
        &mut side(Command::new(SRQ_TOOL), "2", port),
    );
    let server = wait_listening(server, port);
    let client = fails("client srq_pingpong", rust("3", port).arg("127.0.0.1"));
    drop(server.finish());
    assert!(
        client.contains("the peer has 2 QPs and this side 3: give both sides the same -q"),
        "{client}"
    );
}

/// `-o` (on-demand paging) depends on the device: the Rust example must
/// refuse it exactly when the C tool does. Both run as clients of a port
/// nobody listens on, so a capable device fails at the handshake instead.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn srq_odp_follows_the_device_like_the_c_tool() {
    let port = 18740;
    assert!(!listening(port), "TCP port {port} is in use");
    let mut args = device_args();
    args.extend([
        "-o".into(),
        "-p".into(),
        port.to_string(),
        "127.0.0.1".into(),
    ]);
    let c = Command::new(SRQ_TOOL)
        .args(&args)
        .output()
        .expect("ibv_srq_pingpong runs");
    assert!(!c.status.success());
    let c_refused = String::from_utf8_lossy(&c.stderr).contains("ODP");
    let err = fails(SRQ_EXAMPLE, Command::new(example(SRQ_EXAMPLE)).args(&args));
    assert_eq!(
        err.contains("on-demand paging"),
        c_refused,
        "ibv_srq_pingpong said {:?}, srq_pingpong said {err:?}",
        String::from_utf8_lossy(&c.stderr)
    );
    eprintln!(
        "-o: {}",
        if c_refused {
            "the device lacks it; both refuse"
        } else {
            "supported"
        }
    );
}
