//! The async ports (`rdma::aio`, the `tokio` feature): async_rping against
//! rping, sixty-four clients at once, and async_echo.

use super::*;

/// The async port against rping: `async_rping` on the Rust side, rdma-core's
/// `rping` on the C side; the same lines and checks as [`rping::rping`].
fn async_rping(ip: &str, port: u16, server: Side, client: Side) {
    let tool = |s: Side| {
        if s == Side::Rust {
            "async_rping"
        } else {
            "rping"
        }
    };
    let p = port.to_string();
    let count = RPING_COUNT.to_string();
    let (s, c) = pair(
        (
            tool(server),
            server,
            args(&["-s", "-a", ip, "-p", &p, "-v"]),
        ),
        (
            tool(client),
            client,
            args(&["-c", "-a", ip, "-p", &p, "-C", &count, "-v", "-V"]),
        ),
        port,
        false,
    );
    assert_rping_exchanged(&s, &c);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn async_rping_server_c_client() {
    async_rping(&roce_ip(), 7401, Side::Rust, Side::C);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn c_rping_server_async_rping_client() {
    async_rping(&roce_ip(), 7402, Side::C, Side::Rust);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn async_rping_server_async_rping_client() {
    async_rping(&roce_ip(), 7403, Side::Rust, Side::Rust);
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_async_rping_server_c_client() {
    async_rping(&iwarp_ip(), 7404, Side::Rust, Side::C);
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_c_rping_server_async_rping_client() {
    async_rping(&iwarp_ip(), 7405, Side::C, Side::Rust);
}

/// `TOTAL` connections at once to one `async_rping -s` (one thread):
/// `C_CLIENTS` rdma-core `rping -c` processes and one `async_rping -c`
/// opening the rest at once, every ping validated.
fn many_clients(ip: &str, port: u16, total: usize, c_clients: usize) {
    #[allow(non_snake_case)]
    let (TOTAL, C_CLIENTS) = (total, c_clients);
    const PINGS: usize = 3;
    let p = port.to_string();
    let total = TOTAL.to_string();
    let server = start_server(
        "async_rping (Rust server)",
        command(
            "async_rping",
            Side::Rust,
            &["-s", "-a", ip, "-p", &p, "-v", "-N", &total],
        ),
        port,
    );
    let pings = PINGS.to_string();
    let c_args = ["-c", "-a", ip, "-p", &p, "-C", &pings, "-v", "-V"];
    let mut clients: Vec<Running> = (0..C_CLIENTS)
        .map(|i| {
            spawn(
                &format!("rping (C client {i})"),
                command("rping", Side::C, &c_args),
            )
        })
        .collect();
    let rest = (TOTAL - C_CLIENTS).to_string();
    let mut rust_args = c_args.to_vec();
    rust_args.extend(["-N", &rest]);
    clients.push(spawn(
        "async_rping (Rust client)",
        command("async_rping", Side::Rust, &rust_args),
    ));
    let end = Instant::now() + Duration::from_secs(100);
    let clients: Vec<Finished> = clients.into_iter().map(|c| c.finish(end)).collect();
    let server = server.finish(end);
    let all: String = clients.iter().map(|c| c.to_string()).collect();
    for c in &clients {
        assert!(c.success(), "a client failed\n{server}{all}");
        assert!(!c.stderr.contains("data mismatch"), "{c}");
    }
    assert!(server.success(), "server failed\n{server}{all}");
    let pinged: usize = clients
        .iter()
        .map(|c| c.lines_starting("ping data: ").len())
        .sum();
    assert_eq!(pinged, TOTAL * PINGS, "\n{server}{all}");
    assert_eq!(
        server.lines_starting("server ping data: ").len(),
        TOTAL * PINGS,
        "\n{server}"
    );
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn async_rping_serves_sixty_four_clients_at_once_c_clients_among_them() {
    many_clients(&roce_ip(), 7406, 64, 8);
}

/// 64 on siw too: siw (rdma-core 44) allows a process 144 pages of queue
/// mappings per device, which is 48 connections of a CQ, an SQ and an RQ
/// page each (CONVENTIONS.md, Tests). async_rping's connections share CQs
/// (up to 64 on one), so a connection costs 2 pages: the server's 64 and the
/// Rust client's 56 fit, with 8 C clients among them.
#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_async_rping_serves_sixty_four_clients_at_once_c_clients_among_them() {
    many_clients(&iwarp_ip(), 7407, 64, 8);
}

fn async_echo(ip: &str, port: u16, threads: bool) {
    let p = port.to_string();
    let mut server_args = args(&["-s", "-a", ip, "-p", &p, "-N", "8"]);
    if threads {
        server_args.push("-T".into());
    }
    let (s, c) = pair(
        ("async_echo", Side::Rust, server_args),
        (
            "async_echo",
            Side::Rust,
            args(&["-c", "-a", ip, "-p", &p, "-n", "8", "-m", "200", "-D", "4"]),
        ),
        port,
        false,
    );
    assert!(c.success(), "client failed\n{s}{c}");
    assert!(s.success(), "server failed\n{s}{c}");
    let line = c.lines_starting("8 connections x 200 messages of 64 bytes: ");
    assert_eq!(line.len(), 1, "\n{s}{c}");
    assert!(line[0].contains(": 1600 echoes in "), "{}", line[0]);
    assert!(line[0].ends_with(" messages/s"), "{}", line[0]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn async_echo_eight_connections() {
    async_echo(&roce_ip(), 7408, false);
}

/// The blocking, thread-per-connection server (`-T`), the async one's
/// baseline.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn async_echo_client_against_the_threaded_blocking_server() {
    async_echo(&roce_ip(), 7410, true);
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_async_echo_eight_connections() {
    async_echo(&iwarp_ip(), 7409, false);
}
