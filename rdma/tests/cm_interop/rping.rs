//! rping (RC over the connection manager, with the hang report it relies on) and
//! rdma_server / rdma_client (the synchronous endpoints), each way round.

use super::*;

fn rping(ip: &str, port: u16, server: Side, client: Side, extra_client: &[&str]) {
    let p = port.to_string();
    let count = RPING_COUNT.to_string();
    let mut cargs = args(&["-c", "-a", ip, "-p", &p, "-C", &count, "-v", "-V"]);
    cargs.extend(extra_client.iter().map(|s| s.to_string()));
    let (s, c) = pair(
        ("rping", server, args(&["-s", "-a", ip, "-p", &p, "-v"])),
        ("rping", client, cargs),
        port,
        false,
    );
    assert_rping_exchanged(&s, &c);
    assert!(!c.stderr.contains("data mismatch"), "{c}");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rping_rust_server_c_client() {
    rping(&roce_ip(), 7301, Side::Rust, Side::C, &[]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rping_c_server_rust_client() {
    rping(&roce_ip(), 7302, Side::C, Side::Rust, &[]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rping_rust_server_rust_client() {
    rping(&roce_ip(), 7303, Side::Rust, Side::Rust, &[]);
}

/// `-q`: the QP is made by the example and moved by `rdma_init_qp_attr`.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rping_c_server_rust_client_self_made_qp() {
    rping(&roce_ip(), 7304, Side::C, Side::Rust, &["-q"]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn iwarp_rping_rust_server_c_client() {
    rping(&iwarp_ip(), 7305, Side::Rust, Side::C, &[]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn iwarp_rping_c_server_rust_client() {
    rping(&iwarp_ip(), 7306, Side::C, Side::Rust, &[]);
}

/// The hang report names every thread of a process with its state and wait
/// channel: a `sleep` child has one thread, asleep (state `S`), and the
/// report of a process that is gone says it cannot be read.
#[test]
fn a_hang_report_names_each_thread_its_state_and_wait_channel() {
    let mut child = Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("start sleep");
    let pid = child.id();
    // Until `sleep` sleeps, its thread may still be running its start-up.
    let end = Instant::now() + Duration::from_secs(10);
    let report = loop {
        let report = common::threads_report(pid);
        if report.contains(" state S ") || Instant::now() >= end {
            break report;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        report.starts_with(&format!("=== threads of process {pid}\n")),
        "{report}"
    );
    let thread = format!("--- thread {pid} (sleep) state S wchan ");
    assert_eq!(report.matches("--- thread ").count(), 1, "{report}");
    assert!(report.contains(&thread), "{report}");
    let gone = common::threads_report(pid);
    assert!(
        gone.contains(&format!("cannot read /proc/{pid}/task")),
        "{gone}"
    );
}

#[test]
fn rping_text_is_what_rping_prints() {
    // Measured from rdma-core 44's rping -v -C 3 in the VM.
    assert_eq!(
        rping_text(0, 64),
        "rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr"
    );
    assert_eq!(
        rping_text(2, 64),
        "rdma-ping-2: CDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrst"
    );
}

// ---------------------------------------------------------------------------
// rdma_server / rdma_client (synchronous endpoints)

fn endpoints(ip: &str, port: u16, server: Side, client: Side) {
    let p = port.to_string();
    let (s, c) = pair(
        ("rdma_server", server, args(&["-s", ip, "-p", &p])),
        ("rdma_client", client, args(&["-s", ip, "-p", &p])),
        port,
        false,
    );
    assert!(c.success(), "client failed\n{s}{c}");
    assert!(s.success(), "server failed\n{s}{c}");
    for (f, name) in [(&s, "rdma_server"), (&c, "rdma_client")] {
        assert_eq!(
            f.stdout.lines().next(),
            Some(format!("{name}: start").as_str()),
            "{f}"
        );
        assert_eq!(
            f.stdout.lines().last(),
            Some(format!("{name}: end 0").as_str()),
            "{f}"
        );
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn endpoints_rust_server_c_client() {
    endpoints(&roce_ip(), 7311, Side::Rust, Side::C);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn endpoints_c_server_rust_client() {
    endpoints(&roce_ip(), 7312, Side::C, Side::Rust);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn endpoints_rust_server_rust_client() {
    endpoints(&roce_ip(), 7313, Side::Rust, Side::Rust);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn iwarp_endpoints_rust_server_c_client() {
    endpoints(&iwarp_ip(), 7314, Side::Rust, Side::C);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn iwarp_endpoints_c_server_rust_client() {
    endpoints(&iwarp_ip(), 7315, Side::C, Side::Rust);
}
