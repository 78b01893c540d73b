//! udaddy (UD over the connection manager, SIDR) and mckey (multicast join,
//! send, leave), each way round.

use super::*;

fn udaddy(server: Side, client: Side, extra: &[&str]) {
    let ip = roce_ip();
    let mut sargs = args(&["-b", &ip]);
    let mut cargs = args(&["-s", &ip, "-b", &ip]);
    sargs.extend(extra.iter().map(|s| s.to_string()));
    cargs.extend(extra.iter().map(|s| s.to_string()));
    let (s, c) = pair(
        ("udaddy", server, sargs),
        ("udaddy", client, cargs),
        7174,
        false,
    );
    assert_transfers(&s, &c);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn udaddy_rust_server_c_client() {
    udaddy(Side::Rust, Side::C, &[]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn udaddy_c_server_rust_client() {
    udaddy(Side::C, Side::Rust, &[]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn udaddy_rust_server_rust_client_two_connections() {
    udaddy(Side::Rust, Side::Rust, &["-c", "2", "-C", "5", "-S", "200"]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn udaddy_c_server_rust_client_two_connections() {
    udaddy(Side::C, Side::Rust, &["-c", "2", "-C", "5", "-S", "200"]);
}

// ---------------------------------------------------------------------------
// mckey (multicast join, send, leave)

fn mckey(receiver: Side, sender: Side, extra_sender: &[&str]) {
    let ip = roce_ip();
    let mut recv = spawn(
        &format!("mckey ({receiver:?} receiver)"),
        command("mckey", receiver, &["-m", GROUP, "-b", &ip]),
    );
    if let Err(e) = recv.wait_line("mckey: joined dgid", READY_DEADLINE) {
        let f = recv.kill();
        panic!("{e}\n{f}");
    }
    let mut sargs = vec!["-m", GROUP, "-b", &ip, "-s"];
    sargs.extend_from_slice(extra_sender);
    let send = spawn(
        &format!("mckey ({sender:?} sender)"),
        command("mckey", sender, &sargs),
    );
    let end = Instant::now() + RUN_DEADLINE;
    let s = send.finish(end);
    let r = recv.finish(end);
    eprintln!("{r}{s}");
    assert_transfers(&r, &s);
    // Both joined the same group and print it the same way.
    let joined = |f: &Finished| -> String {
        f.lines_starting("mckey: joined dgid: ")
            .first()
            .map(|l| l.to_string())
            .unwrap_or_else(|| panic!("no join line\n{f}"))
    };
    assert_eq!(joined(&r), joined(&s), "\n{r}{s}");
    assert!(
        joined(&r).starts_with(&format!("mckey: joined dgid: ::ffff:{GROUP} ")),
        "{r}"
    );
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn mckey_rust_receiver_c_sender() {
    mckey(Side::Rust, Side::C, &[]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn mckey_c_receiver_rust_sender() {
    mckey(Side::C, Side::Rust, &[]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn mckey_rust_receiver_rust_sender() {
    mckey(Side::Rust, Side::Rust, &[]);
}

/// `-o`: the sender joins as a send-only full member.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn mckey_c_receiver_rust_send_only_sender() {
    mckey(Side::C, Side::Rust, &["-o"]);
}
