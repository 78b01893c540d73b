//! gRPC over the async stream: the `grpc_echo` example (tonic) as the server
//! and as the client, 200 verified unary calls and a server-streaming call
//! of 200 verified messages, on soft-RoCE (rxe0) and soft-iWARP (siw0); and
//! the same over TCP on loopback, which needs no device.
//!
//! Device tests: `#[ignore]`d in a plain `cargo test`; the VM harness
//! (`ci/vm run`, `ci/device-tests`) runs them with `--ignored` and sets
//! `RDMA_TEST_IP`/`RDMA_TEST_IWARP_IP`. A test that runs without them fails.
//! Over siw0 a connection to an `RdmaListener` fails now and then (the
//! module docs of `tests/hostile.rs`): the siw0 test fails then too, at
//! the client's connect.
#![cfg(feature = "tokio")]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::{example, finish, ip, timed};

const COUNT: &str = "200";

fn grpc_echo(extra: &[&str]) -> Command {
    let mut c = timed(example("grpc_echo"));
    c.args(extra);
    c
}

/// Starts `grpc_echo --listen IP:0 --once` (with `extra` flags), waits for
/// the line that says it listens, runs the client against the address it
/// names, and checks that both exit 0 and that the client verified all.
fn echo_pair(ip: &str, extra: &[&str]) {
    let listen = format!("{ip}:0");
    let mut server = grpc_echo(extra)
        .args(["--listen", &listen, "--once"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the server");
    let mut line = String::new();
    let got = BufReader::new(server.stdout.as_mut().unwrap()).read_line(&mut line);
    assert!(
        matches!(got, Ok(n) if n > 0),
        "the server ended before listening: {:?}",
        server.wait_with_output()
    );
    // "grpc_echo: listening on 10.8.0.1:41234 (rdma)"
    let addr = line
        .trim()
        .strip_prefix("grpc_echo: listening on ")
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("not the listening line: {line:?}"))
        .to_string();

    let client = grpc_echo(extra)
        .args(["--connect", &addr, "--count", COUNT])
        .output()
        .expect("run the client");
    let out = String::from_utf8_lossy(&client.stdout).into_owned();
    let err = String::from_utf8_lossy(&client.stderr).into_owned();
    assert!(
        client.status.success(),
        "the client failed ({}): stdout {out} stderr {err}",
        client.status
    );
    let kind = if extra.contains(&"--tcp") {
        "tcp"
    } else {
        "rdma"
    };
    let verified =
        format!("verified: {COUNT} unary calls and {COUNT} streamed messages over {kind}");
    assert!(out.contains(&verified), "no {verified:?} in {out}");
    // --once: the server exits 0 once its client left.
    finish(server, "the grpc_echo server");
    print!("{out}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn grpc_echo_over_rxe() {
    echo_pair(&ip("rxe"), &[]);
}

#[test]
#[ignore = "needs an RDMA device"]
fn grpc_echo_over_iwarp_siw() {
    echo_pair(&ip("siw"), &[]);
}

/// The `--tcp` path the measurements compare with, and `--once`.
#[test]
fn grpc_echo_over_tcp_loopback() {
    echo_pair("127.0.0.1", &["--tcp"]);
}
