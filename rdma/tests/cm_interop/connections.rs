//! Connection setup at scale and under faults: ucmatose (many simultaneous
//! connections), cmtime (per-step timing, the same table as the C tool), and a
//! connect to a peer process that was killed.

use super::*;

// ---------------------------------------------------------------------------
// ucmatose (many simultaneous connections)

fn ucmatose(ip: &str, port: u16, server: Side, client: Side, extra: &[&str]) {
    let p = port.to_string();
    let mut sargs = args(&["-b", ip, "-p", &p, "-c", "8"]);
    let mut cargs = args(&["-s", ip, "-p", &p, "-c", "8"]);
    sargs.extend(extra.iter().map(|s| s.to_string()));
    cargs.extend(extra.iter().map(|s| s.to_string()));
    let (s, c) = pair(
        ("ucmatose", server, sargs),
        ("ucmatose", client, cargs),
        port,
        false,
    );
    assert_transfers(&s, &c);
    assert!(s.stdout.lines().any(|l| l == "disconnected"), "{s}");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn ucmatose_rust_server_c_client() {
    ucmatose(&roce_ip(), 7321, Side::Rust, Side::C, &[]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn ucmatose_c_server_rust_client() {
    ucmatose(&roce_ip(), 7322, Side::C, Side::Rust, &[]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn ucmatose_rust_server_rust_client_migrate() {
    ucmatose(&roce_ip(), 7323, Side::Rust, Side::Rust, &["-m"]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn iwarp_ucmatose_c_server_rust_client() {
    ucmatose(&iwarp_ip(), 7324, Side::C, Side::Rust, &[]);
}

// ---------------------------------------------------------------------------
// cmtime (per-step timing of connection setup)

const CMTIME_CONNS: &str = "16";

/// The step names of a cmtime table, checking each row's shape: the name
/// padded to 13, a colon, four numbers of 11 columns with 2 decimals.
fn cmtime_steps(f: &Finished) -> Vec<String> {
    let mut lines = f.stdout.lines();
    assert!(
        lines
            .by_ref()
            .any(|l| l == "step              total ms     max ms     min us  us / conn"),
        "no cmtime table\n{f}"
    );
    lines
        .map(|l| {
            let (name, nums) = l.split_at(13);
            assert!(
                nums.starts_with(": ") && nums.len() == 2 + 44,
                "row {l:?}\n{f}"
            );
            for col in nums.as_bytes()[2..].chunks(11) {
                let col = std::str::from_utf8(col).unwrap().trim();
                let v: f64 = col.parse().unwrap_or_else(|_| panic!("row {l:?}\n{f}"));
                assert!(v >= 0.0, "row {l:?}\n{f}");
                assert_eq!(col.split('.').nth(1).map(str::len), Some(2), "row {l:?}");
            }
            name.trim_end().to_string()
        })
        .collect()
}

fn cmtime(server: Side, client: Side, port: u16) -> Finished {
    let ip = roce_ip();
    let p = port.to_string();
    let (s, c) = pair(
        ("cmtime", server, args(&["-b", &ip, "-p", &p])),
        (
            "cmtime",
            client,
            args(&["-s", &ip, "-b", &ip, "-p", &p, "-c", CMTIME_CONNS]),
        ),
        port,
        true,
    );
    assert!(c.success(), "client failed\n{s}{c}");
    assert!(!c.stdout.contains("error"), "{c}");
    assert!(s.stdout.is_empty() || !s.stdout.contains("fail"), "{s}");
    c
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn cmtime_rust_server_c_client() {
    let c = cmtime(Side::Rust, Side::C, 7331);
    assert!(cmtime_steps(&c).contains(&"connect".to_string()), "{c}");
}

/// Against the same server, the Rust client prints the table the C client
/// prints: the same steps, in the same order, in the same columns.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn cmtime_c_server_rust_and_c_clients_print_the_same_table() {
    let ip = roce_ip();
    let port = 7332u16;
    let p = port.to_string();
    let server = start_server(
        "cmtime (C server)",
        command("cmtime", Side::C, &["-b", &ip, "-p", &p]),
        port,
    );
    let mut tables = Vec::new();
    for side in [Side::C, Side::Rust] {
        let c = spawn(
            &format!("cmtime ({side:?} client)"),
            command(
                "cmtime",
                side,
                &["-s", &ip, "-b", &ip, "-p", &p, "-c", CMTIME_CONNS],
            ),
        )
        .finish(Instant::now() + RUN_DEADLINE);
        eprintln!("{c}");
        assert!(c.success(), "{c}");
        assert!(!c.stdout.contains("error"), "{c}");
        tables.push(cmtime_steps(&c));
    }
    let s = server.kill();
    eprintln!("{s}");
    assert_eq!(tables[0], tables[1]);
    assert_eq!(
        tables[1],
        [
            "create id",
            "bind addr",
            "resolve addr",
            "resolve route",
            "create qp",
            "connect",
            "disconnect",
            "destroy"
        ]
    );
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn cmtime_rust_server_rust_client() {
    let c = cmtime(Side::Rust, Side::Rust, 7333);
    assert_eq!(cmtime_steps(&c).len(), 8, "{c}");
}

// ---------------------------------------------------------------------------
// Faults

/// Connecting to a server process that was killed: rejected or unreachable
/// within the timeout, never a hang.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn connect_after_the_peer_process_is_killed() {
    let ip = roce_ip();
    let port = 7599;
    let server = start_server(
        "rping server",
        command(
            "rping",
            Side::C,
            &["-s", "-a", &ip, "-p", &port.to_string()],
        ),
        port,
    );
    drop(server.kill()); // SIGKILL: librdmacm gets no chance to clean up
    let dst = std::net::SocketAddr::new(ip.parse().unwrap(), port);
    let opts = rdma::cm::blocking::ConnectOptions {
        timeout: Duration::from_secs(10),
        ..Default::default()
    };
    let started = Instant::now();
    let err = match rdma::cm::blocking::Connection::connect(dst, &opts) {
        Ok(_) => panic!("connected to a killed server"),
        Err(e) => e,
    };
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    match &err {
        rdma::Error::CmEvent { event, .. } => assert!(
            matches!(
                event,
                rdma::cm::CmEventType::Rejected | rdma::cm::CmEventType::Unreachable
            ),
            "{err}"
        ),
        e => assert_eq!(e.errno(), Some(libc::ETIMEDOUT), "{e}"),
    }
}
