//! The Rust stream against rdma-core's C rsocket programs, both ways, on
//! soft-RoCE (rxe0) and soft-iWARP (siw0): `rstream` with verified data,
//! and Python's `socket` module under `librspreload.so` with `rcat`.
//!
//! Device tests: `#[ignore]`d in a plain `cargo test`; the VM harness
//! (`ci/vm run`, `ci/device-tests`) runs them with `--ignored` and sets
//! `RDMA_TEST_IP`/`RDMA_TEST_IWARP_IP`. A test that runs without them fails.

mod common;

use std::path::PathBuf;
use std::process::Stdio;

use common::{example, finish, ip, start, timed};

use sha2::{Digest, Sha256};

const PRELOAD: &str = "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so";
/// Runs `rstream` as the server (`c_server`: rdma-core's, else ours) and
/// the other as the client, with `-T v` (verified data) on both sides.
fn rstream_pair(dev: &str, port: u16, c_server: bool, size: usize, count: usize) {
    rstream_pair_with(dev, port, c_server, size, count, "v");
}

/// As [`rstream_pair`], with our side's `-T` options (`a,v`: the async
/// stream on tokio).
fn rstream_pair_with(
    dev: &str,
    port: u16,
    c_server: bool,
    size: usize,
    count: usize,
    ours_t: &str,
) {
    let ip = ip(dev);
    let ours = example("rstream");
    let (server_prog, client_prog): (PathBuf, PathBuf) = if c_server {
        ("rstream".into(), ours)
    } else {
        (ours, "rstream".into())
    };
    let (server_t, client_t) = if c_server {
        ("v", ours_t)
    } else {
        (ours_t, "v")
    };
    let args = |role: &[&str], t: &str| -> Vec<String> {
        let mut v: Vec<String> = role.iter().map(|s| s.to_string()).collect();
        v.extend(
            [
                "-p",
                &port.to_string(),
                "-S",
                &size.to_string(),
                "-C",
                &count.to_string(),
                "-T",
                t,
            ]
            .map(String::from),
        );
        v
    };
    let mut s = timed(&server_prog);
    s.args(args(&["-b", &ip], server_t));
    let server = start(s, false);
    let client = timed(&client_prog)
        .args(args(&["-s", &ip], client_t))
        .output()
        .expect("run the client");
    assert!(
        client.status.success(),
        "{} client failed: {} {}",
        client_prog.display(),
        String::from_utf8_lossy(&client.stdout),
        String::from_utf8_lossy(&client.stderr)
    );
    let out = finish(server, "the rstream server");
    for o in [&client.stdout, &out.stdout] {
        let text = String::from_utf8_lossy(o);
        assert!(text.contains("custom"), "no result line: {text}");
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn c_rstream_client_to_rust_server_rxe() {
    rstream_pair("rxe", 7601, false, 70000, 30);
    rstream_pair("rxe", 7602, false, 1, 200);
}

#[test]
#[ignore = "needs an RDMA device"]
fn rust_rstream_client_to_c_server_rxe() {
    rstream_pair("rxe", 7603, true, 1 << 20, 6);
    rstream_pair("rxe", 7604, true, 100, 200);
}

#[test]
#[ignore = "needs an RDMA device"]
fn c_rstream_client_to_rust_server_iwarp() {
    rstream_pair("siw", 7605, false, 65536, 30);
    rstream_pair("siw", 7606, false, 1, 200);
}

#[test]
#[ignore = "needs an RDMA device"]
fn rust_rstream_client_to_c_server_iwarp() {
    rstream_pair("siw", 7607, true, 1 << 20, 6);
    rstream_pair("siw", 7608, true, 100, 200);
}

#[test]
#[ignore = "needs an RDMA device"]
fn async_rstream_with_c_rstream_both_ways_rxe() {
    rstream_pair_with("rxe", 7621, false, 70000, 30, "a,v");
    rstream_pair_with("rxe", 7622, true, 1 << 20, 6, "a,v");
    rstream_pair_with("rxe", 7623, true, 1, 200, "a,v");
}

#[test]
#[ignore = "needs an RDMA device"]
fn async_rstream_with_c_rstream_both_ways_iwarp() {
    rstream_pair_with("siw", 7624, false, 70000, 30, "a,v");
    rstream_pair_with("siw", 7625, true, 1 << 20, 6, "a,v");
    rstream_pair_with("siw", 7626, true, 1, 200, "a,v");
}

/// 3 MB and a byte, of a fixed pattern, as the file both sides compare.
fn payload() -> Vec<u8> {
    (0..3_000_001u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

const PY_SEND: &str = "
import ctypes, socket, sys
# Python's socket() adds SOCK_CLOEXEC, which librspreload does not take:
# the descriptor comes from libc's socket(), which it does.
fd = ctypes.CDLL(None, use_errno=True).socket(socket.AF_INET, socket.SOCK_STREAM, 0)
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fileno=fd)
s.connect((sys.argv[1], int(sys.argv[2])))
s.sendall(sys.stdin.buffer.read())
s.close()
";

const PY_RECV: &str = "
import ctypes, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0)
l = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fileno=fd)
l.bind((sys.argv[1], int(sys.argv[2])))
l.listen(1)
print('listening', file=sys.stderr, flush=True)
# accept4(SOCK_CLOEXEC) is not taken either: accept() through libc.
c = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fileno=libc.accept(l.fileno(), None, None))
while True:
    b = c.recv(65536)
    if not b:
        break
    sys.stdout.buffer.write(b)
sys.stdout.flush()
c.close()
";

fn python_to_rcat(dev: &str, port: u16) {
    let ip = ip(dev);
    let data = payload();
    let mut r = timed(example("rcat"));
    r.args(["-v", "-l", &ip, &port.to_string()]);
    // Its output is read while the client runs (a full pipe would stall it).
    let server = start(r, true);
    let server = std::thread::spawn(move || finish(server, "rcat -l"));
    let mut py = timed("python3")
        .env("LD_PRELOAD", PRELOAD)
        .args(["-c", PY_SEND, &ip, &port.to_string()])
        .stdin(Stdio::piped())
        .spawn()
        .expect("python3");
    std::io::Write::write_all(&mut py.stdin.take().unwrap(), &data).unwrap();
    finish(py, "python under librspreload");
    let out = server.join().expect("the server thread");
    assert_eq!(out.stdout.len(), data.len());
    assert_eq!(Sha256::digest(&out.stdout), Sha256::digest(&data));
}

fn rcat_to_python(dev: &str, port: u16) {
    let ip = ip(dev);
    let data = payload();
    let mut py = timed("python3");
    py.env("LD_PRELOAD", PRELOAD)
        .args(["-c", PY_RECV, &ip, &port.to_string()]);
    let server = start(py, true);
    let server = std::thread::spawn(move || finish(server, "python under librspreload"));
    let mut cat = timed(example("rcat"))
        .args([&ip, &port.to_string()])
        .stdin(Stdio::piped())
        .spawn()
        .expect("rcat");
    std::io::Write::write_all(&mut cat.stdin.take().unwrap(), &data).unwrap();
    finish(cat, "rcat");
    let out = server.join().expect("the server thread");
    assert_eq!(out.stdout.len(), data.len());
    assert_eq!(Sha256::digest(&out.stdout), Sha256::digest(&data));
}

#[test]
#[ignore = "needs an RDMA device"]
fn python_under_librspreload_sends_to_rcat_rxe() {
    python_to_rcat("rxe", 7611);
}

#[test]
#[ignore = "needs an RDMA device"]
fn rcat_sends_to_python_under_librspreload_rxe() {
    rcat_to_python("rxe", 7612);
}

#[test]
#[ignore = "needs an RDMA device"]
fn python_under_librspreload_sends_to_rcat_iwarp() {
    python_to_rcat("siw", 7613);
}

#[test]
#[ignore = "needs an RDMA device"]
fn rcat_sends_to_python_under_librspreload_iwarp() {
    rcat_to_python("siw", 7614);
}
