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

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Every child runs under `timeout`: a hang fails the test, never the run.
const LIMIT: &str = "120";
const COUNT: &str = "200";

fn env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: this test needs an RDMA device; run it in the VM (ci/vm run)")
    })
}

fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in target/<profile>/deps");
    let path = dir.join("examples").join("grpc_echo");
    assert!(
        path.is_file(),
        "{} is missing: build the examples first (--features tokio)",
        path.display()
    );
    path
}

fn timed(extra: &[&str]) -> Command {
    let mut c = Command::new("timeout");
    c.arg(LIMIT).arg(example()).args(extra);
    c
}

/// Starts `grpc_echo --listen IP:0 --once` (with `extra` flags), waits for
/// the line that says it listens, runs the client against the address it
/// names, and checks that both exit 0 and that the client verified all.
fn echo_pair(ip: &str, extra: &[&str]) {
    let listen = format!("{ip}:0");
    let mut server = timed(extra)
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

    let client = timed(extra)
        .args(["--connect", &addr, "--count", COUNT])
        .output()
        .expect("run the client");
    let out = String::from_utf8_lossy(&client.stdout).into_owned();
    let err = String::from_utf8_lossy(&client.stderr).into_owned();
    let served = server.wait_with_output().expect("wait for the server");
    assert!(
        client.status.success(),
        "the client failed ({}): stdout {out} stderr {err}; the server's stderr {}",
        client.status,
        String::from_utf8_lossy(&served.stderr)
    );
    let kind = if extra.contains(&"--tcp") {
        "tcp"
    } else {
        "rdma"
    };
    let verified =
        format!("verified: {COUNT} unary calls and {COUNT} streamed messages over {kind}");
    assert!(out.contains(&verified), "no {verified:?} in {out}");
    assert!(
        served.status.success(),
        "the server ({}) did not exit 0 after its client left: stderr {}",
        served.status,
        String::from_utf8_lossy(&served.stderr)
    );
    print!("{out}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn grpc_echo_over_rxe() {
    echo_pair(&env("RDMA_TEST_IP"), &[]);
}

#[test]
#[ignore = "needs an RDMA device"]
fn grpc_echo_over_iwarp_siw() {
    echo_pair(&env("RDMA_TEST_IWARP_IP"), &[]);
}

/// The `--tcp` path the measurements compare with, and `--once`.
#[test]
fn grpc_echo_over_tcp_loopback() {
    echo_pair("127.0.0.1", &["--tcp"]);
}
