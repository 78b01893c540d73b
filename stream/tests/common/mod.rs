//! What the device tests of rdma-stream share: the addresses of the
//! devices under test, the example binaries, and children run under a time
//! limit.
//!
//! The VM harness (`ci/vm run`, `ci/device-tests`) sets `RDMA_TEST_IP` and
//! `RDMA_TEST_IWARP_IP`; a test that runs without them fails, never skips.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

/// Every child runs under `timeout`: a hang fails the test, never the run.
pub const LIMIT: &str = "120";

/// An environment variable the harness sets.
pub fn env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: this test needs an RDMA device; run it in the VM (ci/vm run)")
    })
}

/// The address of the device under test: `rxe` (rxe0) or `siw` (siw0).
pub fn ip(dev: &str) -> String {
    match dev {
        "rxe" => env("RDMA_TEST_IP"),
        _ => env("RDMA_TEST_IWARP_IP"),
    }
}

/// The example binary built next to this test binary.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in target/<profile>/deps");
    let path = dir.join("examples").join(name);
    assert!(
        path.is_file(),
        "{} is missing: build the examples first",
        path.display()
    );
    path
}

/// `program` under `timeout`, its standard output line-buffered (`stdbuf`:
/// C's rstream prints its table header, which says it listens, through
/// stdio, which a pipe would otherwise hold until exit).
pub fn timed(program: impl Into<PathBuf>) -> Command {
    let mut c = Command::new("timeout");
    c.arg(LIMIT).args(["stdbuf", "-oL"]).arg(program.into());
    c
}

/// Starts a server and waits until it says it listens: its first line on
/// `stdout` (rstream's table header) or `stderr` (`rcat -v`, the Python
/// scripts).
pub fn start(mut cmd: Command, ready_on_stderr: bool) -> Child {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn the server");
    let mut line = String::new();
    let got = if ready_on_stderr {
        BufReader::new(child.stderr.as_mut().unwrap()).read_line(&mut line)
    } else {
        BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line)
    };
    assert!(
        matches!(got, Ok(n) if n > 0),
        "the server ended before listening: {:?}",
        child.wait_with_output()
    );
    child
}

/// Waits for a child and checks that it succeeded.
pub fn finish(child: Child, what: &str) -> Output {
    let out = child.wait_with_output().expect("wait for the child");
    assert!(
        out.status.success(),
        "{what} failed ({}): stdout {} stderr {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
