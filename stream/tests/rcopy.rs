//! The `rcopy` example against rdma-core's `rcopy`, both ways, on
//! soft-RoCE (rxe0) and soft-iWARP (siw0): files of 1 B, 64 KiB + 1 and
//! 16 MiB, the SHA-256 of each copy equal to its source's; an empty file
//! from the Rust client to both servers, and what rdma-core's client does
//! with one (it cannot map it: it exits 22 having sent nothing).
//!
//! Device tests: `#[ignore]`d in a plain `cargo test`; the VM harness
//! (`ci/vm run`, `ci/device-tests`) runs them with `--ignored` and sets
//! `RDMA_TEST_IP`/`RDMA_TEST_IWARP_IP`. A test that runs without them fails.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread::JoinHandle;

use common::{example, ip, timed};
use rdma_stream::{RdmaListener, RdmaStream};

/// Every child runs under `timeout`: a hang fails the test, never the run.
/// The large file: 16 MiB (a debug build under TCG).
const LARGE: usize = 16 << 20;

/// rdma-core's `rcopy` (`c`) or ours.
fn rcopy(c: bool) -> PathBuf {
    if c {
        "rcopy".into()
    } else {
        example("rcopy")
    }
}

/// An `rcopy` server, stopped (SIGTERM to `timeout`, which passes it on)
/// when dropped: both serve for ever.
struct Server {
    child: Child,
    out: Option<JoinHandle<Vec<u8>>>,
    what: String,
    c: bool,
    port: u16,
}

impl Server {
    /// Starts it and waits until it says `waiting for connection...` (both
    /// print it, flushed, once they listen; with no newline).
    fn start(c: bool, port: u16) -> Server {
        let what = format!(
            "{} server",
            if c { "rdma-core's rcopy" } else { "our rcopy" }
        );
        let mut child = timed(rcopy(c))
            .args(["-p", &port.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the server");
        let mut stdout = child.stdout.take().expect("piped");
        let mut seen = Vec::new();
        let mut byte = [0; 1];
        while !seen.ends_with(b"waiting for connection...") {
            match stdout.read(&mut byte) {
                Ok(1) => seen.push(byte[0]),
                _ => panic!(
                    "the {what} ended before listening: {} {:?}",
                    String::from_utf8_lossy(&seen),
                    child.wait_with_output()
                ),
            }
        }
        // Its output is read while it runs (a full pipe would stall it).
        let out = std::thread::spawn(move || {
            let _ = stdout.read_to_end(&mut seen);
            seen
        });
        Server {
            child,
            out: Some(out),
            what,
            c,
            port,
        }
    }

    /// Stops it and starts a new one of the same kind on the same port:
    /// the old one's output.
    fn restart(&mut self) -> (String, String) {
        let old = self.finish();
        *self = Server::start(self.c, self.port);
        old
    }

    /// Stops it: its standard output and error.
    fn stop(mut self) -> (String, String) {
        self.finish()
    }

    fn finish(&mut self) -> (String, String) {
        self.kill();
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        let out = self
            .out
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        (String::from_utf8_lossy(&out).into_owned(), err)
    }

    fn kill(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.out.is_some() {
            self.kill();
        }
    }
}

/// A fresh directory for one test (the guest's /tmp is its own).
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from("/tmp").join(format!("rcopy-test-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("src")).expect("make the source directory");
    std::fs::create_dir_all(dir.join("dst")).expect("make the destination directory");
    dir
}

/// A file of `len` bytes: a pattern of 1 000 003 bytes (prime: a chunk
/// misplaced by a power of two shows), repeated. Made once per length, the
/// pattern in one piece (a debug build under TCG computes it slowly).
fn make_file(dir: &Path, len: usize) -> PathBuf {
    const PERIOD: usize = 1_000_003;
    let path = dir.join("src").join(format!("f{len}"));
    let pattern: Vec<u8> = (0..len.min(PERIOD) as u64)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ (i / 251) as u8)
        .collect();
    let mut f = std::fs::File::create(&path).expect("create the source file");
    let mut left = len;
    while left > 0 {
        let n = left.min(pattern.len());
        f.write_all(&pattern[..n]).expect("write the source file");
        left -= n;
    }
    path
}

/// The file's SHA-256, from coreutils' `sha256sum` (sha2 in a debug build
/// under TCG took seconds per 16 MiB).
fn digest(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("run sha256sum");
    assert!(
        out.status.success(),
        "sha256sum {}: {}",
        path.display(),
        text(&out)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

fn text(o: &Output) -> String {
    format!(
        "({}) stdout {} stderr {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Whether `ip` is siw0's.
fn on_siw(ip: &str) -> bool {
    std::env::var("RDMA_TEST_IWARP_IP").ok().as_deref() == Some(ip)
}

/// Over siw0 a connection fails now and then at the initiator
/// (`CONNECT_ERROR`, status -22), rdma-core's rsockets as ours (seen here
/// with its `rcopy` client to its server, and known for `RdmaListener`:
/// tests/hostile.rs, issue 41): the accepting side sends its first credits
/// before MPA's initiator has read the MPA reply, and siw's initiator
/// refuses a reply followed by more bytes. Not what these tests are about,
/// so a connection that failed so is tried again, at most twice, and said
/// on stderr; nothing was sent on it. The accepting side may not have seen
/// the failure: rdma-core's server once sat in that connection while the
/// next try was flushed (a CI run), so the server is started afresh first.
const CONNECT_TRIES: usize = 3;

fn siw_connect_race(ip: &str, text: &str) -> bool {
    on_siw(ip)
        && (text.contains("RDMA_CM_EVENT_CONNECT_ERROR (status -22)")
            || (text.contains("rconnect failed") && text.contains("Invalid argument")))
}

/// Runs the client (`c`: rdma-core's) sending `src` to `ip:dst`, served
/// by `server` (restarted after siw0's connection race) or, with `None`,
/// by a server that takes the next connection when one carried nothing.
fn send(
    c: bool,
    src: &Path,
    ip: &str,
    dst: &Path,
    port: u16,
    mut server: Option<&mut Server>,
) -> Output {
    let mut attempt = 1;
    loop {
        let out = timed(rcopy(c))
            .arg(src)
            .arg(format!("{ip}:{}", dst.display()))
            .args(["-p", &port.to_string()])
            .output()
            .expect("run the client");
        if out.status.success() || attempt == CONNECT_TRIES || !siw_connect_race(ip, &text(&out)) {
            return out;
        }
        eprintln!(
            "siw0's connection race (attempt {attempt}), again: {}",
            text(&out)
        );
        if let Some(server) = server.as_deref_mut() {
            let (so, se) = server.restart();
            eprintln!("the {} restarted; it said: {so} {se}", server.what);
        }
        attempt += 1;
    }
}

/// `RdmaStream::connect`, tried again after siw0's connection race.
fn connect(ip: &str, port: u16) -> RdmaStream {
    let mut attempt = 1;
    loop {
        match RdmaStream::connect((ip, port)) {
            Ok(s) => return s,
            Err(e) if attempt < CONNECT_TRIES && siw_connect_race(ip, &e.to_string()) => {
                eprintln!("siw0's connection race (attempt {attempt}), again: {e}");
                attempt += 1;
            }
            Err(e) => panic!("connect to {ip}:{port}: {e}"),
        }
    }
}

/// Sends a file of each size with the client `c_client` to a server
/// `c_server`, and checks each copy's digest.
fn copies(dev: &str, port: u16, c_client: bool, c_server: bool, sizes: &[usize], name: &str) {
    let ip = ip(dev);
    let dir = scratch(name);
    let mut server = Server::start(c_server, port);
    for &len in sizes {
        let src = make_file(&dir, len);
        let dst = dir.join("dst").join(format!("f{len}"));
        let started = std::time::Instant::now();
        let out = send(c_client, &src, &ip, &dst, port, Some(&mut server));
        if !out.status.success() {
            let what = server.what.clone();
            let (so, se) = server.stop();
            panic!(
                "sending {len} bytes to the {what} failed: {}\nserver: {so} {se}",
                text(&out)
            );
        }
        eprintln!("{dev}: {len} bytes in {:?}", started.elapsed());
        assert_eq!(
            std::fs::metadata(&dst).map(|m| m.len()).ok(),
            Some(len as u64),
            "{}: {}",
            dst.display(),
            text(&out)
        );
        assert_eq!(digest(&src), digest(&dst), "{len} bytes: digests differ");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(&format!("{len} bytes in ")),
            "no result line: {}",
            text(&out)
        );
    }
    let (so, se) = server.stop();
    eprintln!("server: {so} {se}");
    let _ = std::fs::remove_dir_all(&dir);
}

const SIZES: &[usize] = &[1, 64 * 1024 + 1, LARGE];

#[test]
#[ignore = "needs an RDMA device"]
fn rust_client_to_c_server_rxe() {
    copies("rxe", 7621, false, true, SIZES, "rust-to-c-rxe");
}

#[test]
#[ignore = "needs an RDMA device"]
fn c_client_to_rust_server_rxe() {
    copies("rxe", 7622, true, false, SIZES, "c-to-rust-rxe");
}

#[test]
#[ignore = "needs an RDMA device"]
fn rust_client_to_c_server_iwarp() {
    copies("siw", 7623, false, true, SIZES, "rust-to-c-siw");
}

#[test]
#[ignore = "needs an RDMA device"]
fn c_client_to_rust_server_iwarp() {
    copies("siw", 7624, true, false, SIZES, "c-to-rust-siw");
}

#[test]
#[ignore = "needs an RDMA device"]
fn rust_to_rust_rxe() {
    copies(
        "rxe",
        7625,
        false,
        false,
        &[0, 1, 64 * 1024 + 1],
        "rust-rxe",
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn rust_to_rust_iwarp() {
    copies(
        "siw",
        7626,
        false,
        false,
        &[0, 1, 64 * 1024 + 1],
        "rust-siw",
    );
}

/// The Rust client sends an empty file as OPEN then CLOSE: rdma-core's
/// server creates it, and serves the next file (a WRITE of 0 bytes would
/// have failed its `mmap` and left it refusing every later OPEN).
fn empty_to_c_server(dev: &str, port: u16) {
    copies(
        dev,
        port,
        false,
        true,
        &[0, 1],
        &format!("empty-to-c-{dev}"),
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn rust_client_sends_an_empty_file_to_c_server_rxe() {
    empty_to_c_server("rxe", 7627);
}

#[test]
#[ignore = "needs an RDMA device"]
fn rust_client_sends_an_empty_file_to_c_server_iwarp() {
    empty_to_c_server("siw", 7628);
}

/// rdma-core's client cannot send an empty file: it exits 22 (`EINVAL`
/// from its `mmap` of 0 bytes) having connected and sent nothing; the
/// Rust server creates nothing and serves the next client.
fn c_client_empty(dev: &str, port: u16) {
    let ip = ip(dev);
    let dir = scratch(&format!("c-empty-{dev}"));
    let server = Server::start(false, port);
    let src = make_file(&dir, 0);
    let dst = dir.join("dst").join("empty");
    let out = send(true, &src, &ip, &dst, port, None);
    assert_eq!(out.status.code(), Some(22), "{}", text(&out));
    assert!(!dst.exists(), "{} was created", dst.display());
    let src = make_file(&dir, 1);
    let dst = dir.join("dst").join("one");
    let out = send(true, &src, &ip, &dst, port, None);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(digest(&src), digest(&dst));
    let (so, se) = server.stop();
    eprintln!("server: {so} {se}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn c_client_cannot_send_an_empty_file_rxe() {
    c_client_empty("rxe", 7629);
}

#[test]
#[ignore = "needs an RDMA device"]
fn c_client_cannot_send_an_empty_file_iwarp() {
    c_client_empty("siw", 7632);
}

/// A message header as rcopy writes it (host byte order).
fn header(version: u8, command: u8, len: u16, data: u32, id: u64) -> Vec<u8> {
    let mut b = vec![version, command];
    b.extend_from_slice(&len.to_ne_bytes());
    b.extend_from_slice(&data.to_ne_bytes());
    b.extend_from_slice(&id.to_ne_bytes());
    b
}

/// The server's answer: (command, status, id); `None` once it closed.
fn answer(s: &mut RdmaStream) -> Option<(u8, u32, u64)> {
    let mut b = [0; 16];
    s.read_exact(&mut b).ok()?;
    assert_eq!((b[0], u16::from_ne_bytes([b[2], b[3]])), (0, 16), "{b:?}");
    Some((
        b[1],
        u32::from_ne_bytes([b[4], b[5], b[6], b[7]]),
        u64::from_ne_bytes(b[8..16].try_into().unwrap()),
    ))
}

/// Reads until the server ends the connection.
fn ended(s: &mut RdmaStream) {
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "more after the end: {rest:?}");
}

/// Messages rdma-core's client never sends, to the Rust server: each step
/// that fails is answered with an errno (where rdma-core's server answers)
/// and ends the connection, nothing is reserved for a size the client
/// claims, and the server goes on serving (a client gone with a file open
/// leaves nothing behind, where rdma-core's would answer `EBUSY` from then
/// on).
fn hostile(dev: &str, port: u16) {
    let ip = ip(dev);
    let dir = scratch(&format!("hostile-{dev}"));
    let server = Server::start(false, port);
    let connect = || connect(&ip, port);
    let open = |path: &Path, id: u64| {
        let mut p = path.as_os_str().as_encoded_bytes().to_vec();
        p.resize((p.len() + 8) & !7, 0);
        let mut m = header(0, 1, 16 + p.len() as u16, 0o644, id);
        m.extend_from_slice(&p);
        m
    };

    // WRITE with no file open: EINVAL, then the end.
    let mut s = connect();
    s.write_all(&header(0, 3, 24, 0, 7)).unwrap();
    s.write_all(&5u64.to_ne_bytes()).unwrap();
    assert_eq!(answer(&mut s), Some((0x83, 22, 7)));
    ended(&mut s);

    // An unknown command: EINVAL with its id.
    let mut s = connect();
    s.write_all(&header(0, 9, 16, 0, 8)).unwrap();
    assert_eq!(answer(&mut s), Some((0x89, 22, 8)));
    ended(&mut s);

    // A version that is not 0, a length shorter than a header: no answer.
    for m in [header(1, 1, 16, 0, 1), header(0, 2, 15, 0, 1)] {
        let mut s = connect();
        s.write_all(&m).unwrap();
        assert_eq!(answer(&mut s), None);
    }

    // A second OPEN: EBUSY; a WRITE of the wrong length: EINVAL.
    let mut s = connect();
    s.write_all(&open(&dir.join("dst").join("a"), 1)).unwrap();
    assert_eq!(answer(&mut s), Some((0x81, 0, 1)));
    s.write_all(&open(&dir.join("dst").join("b"), 2)).unwrap();
    assert_eq!(answer(&mut s), Some((0x81, 16, 2)));
    ended(&mut s);
    let mut s = connect();
    s.write_all(&open(&dir.join("dst").join("c"), 1)).unwrap();
    assert_eq!(answer(&mut s), Some((0x81, 0, 1)));
    s.write_all(&header(0, 3, 32, 0, 2)).unwrap();
    assert_eq!(answer(&mut s), Some((0x83, 22, 2)));
    ended(&mut s);

    // A file that cannot be opened: its errno (ENOENT).
    let mut s = connect();
    s.write_all(&open(&dir.join("missing").join("x"), 3))
        .unwrap();
    assert_eq!(answer(&mut s), Some((0x81, 2, 3)));
    ended(&mut s);

    // WRITE claiming 2^64 - 1 bytes, a few sent, then the client goes
    // away with the file open.
    let mut s = connect();
    s.write_all(&open(&dir.join("dst").join("huge"), 1))
        .unwrap();
    assert_eq!(answer(&mut s), Some((0x81, 0, 1)));
    s.write_all(&header(0, 3, 24, 0, 2)).unwrap();
    s.write_all(&u64::MAX.to_ne_bytes()).unwrap();
    s.write_all(&[0x5a; 1000]).unwrap();
    drop(s);

    // The server still serves, with nothing left open.
    let src = make_file(&dir, 4097);
    let dst = dir.join("dst").join("after");
    let out = send(false, &src, &ip, &dst, port, None);
    let (so, se) = server.stop();
    assert!(out.status.success(), "{}\nserver: {so} {se}", text(&out));
    assert_eq!(digest(&src), digest(&dst));
    eprintln!("server: {so} {se}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn rust_server_answers_malformed_messages_rxe() {
    hostile("rxe", 7630);
}

#[test]
#[ignore = "needs an RDMA device"]
fn rust_server_answers_malformed_messages_iwarp() {
    hostile("siw", 7631);
}

/// Why the Rust client sends an empty file without a WRITE: rdma-core's
/// server answers a WRITE of 0 bytes with `EINVAL` (its `mmap` fails), ends
/// the connection, and from then on answers every OPEN with `EBUSY` (the
/// failed mapping stays recorded as its open file).
#[test]
#[ignore = "needs an RDMA device"]
fn c_server_cannot_take_a_write_of_0_bytes_rxe() {
    let ip = ip("rxe");
    let port = 7633;
    let dir = scratch("c-write-0");
    let server = Server::start(true, port);
    let connect = || connect(&ip, port);
    let open = |name: &str| {
        let mut p = dir
            .join("dst")
            .join(name)
            .into_os_string()
            .into_encoded_bytes();
        p.resize((p.len() + 8) & !7, 0);
        let mut m = header(0, 1, 16 + p.len() as u16, 0o644, 1);
        m.extend_from_slice(&p);
        m
    };
    let mut s = connect();
    s.write_all(&open("empty")).unwrap();
    assert_eq!(answer(&mut s), Some((0x81, 0, 1)));
    s.write_all(&header(0, 3, 24, 0, 2)).unwrap();
    s.write_all(&0u64.to_ne_bytes()).unwrap();
    assert_eq!(answer(&mut s), Some((0x83, 22, 2)));
    ended(&mut s);
    let mut s = connect();
    s.write_all(&open("next")).unwrap();
    let busy = answer(&mut s);
    drop(s);
    let (so, se) = server.stop();
    assert_eq!(busy, Some((0x81, 16, 1)), "server: {so} {se}");
    eprintln!("server: {so} {se}");
}

/// A fake server for the Rust client: accepts one connection, and
/// answers each request with what `reply` makes of its header (after
/// reading the request whole).
fn fake_server(
    ip: &str,
    port: u16,
    reply: impl Fn(u8, u64) -> Vec<u8> + Send + 'static,
) -> JoinHandle<()> {
    let listener = RdmaListener::bind((ip, port)).expect("listen");
    std::thread::spawn(move || loop {
        // A connection that siw0's race ended carries nothing: take the
        // next one.
        let (mut s, _) = listener.accept().expect("accept");
        let mut h = [0; 16];
        let mut served = false;
        while s.read_exact(&mut h).is_ok() {
            served = true;
            let len = u16::from_ne_bytes([h[2], h[3]]) as usize;
            let id = u64::from_ne_bytes(h[8..16].try_into().unwrap());
            let mut rest = vec![0; len.saturating_sub(16)];
            if s.read_exact(&mut rest).is_err() {
                return;
            }
            if h[1] == 3 {
                let size = u64::from_ne_bytes(rest[..8].try_into().unwrap());
                let mut data = Vec::new();
                if (&mut s).take(size).read_to_end(&mut data).is_err() {
                    return;
                }
            }
            if s.write_all(&reply(h[1], id)).is_err() {
                return;
            }
        }
        if served {
            return;
        }
    })
}

/// The Rust client against answers rdma-core's server never gives: a
/// refused WRITE makes the server's errno its exit status (as rdma-core's
/// client), an answer that is not one exits 1 saying what was wrong.
fn client_against_fake_server(dev: &str, port: u16) {
    let ip = ip(dev);
    let dir = scratch(&format!("fake-{dev}"));
    let src = make_file(&dir, 70_000);
    let dst = dir.join("dst").join("x");

    let server = fake_server(&ip, port, |cmd, id| {
        let status = if cmd == 3 { 28 } else { 0 };
        header(0, cmd | 0x80, 16, status, id)
    });
    let out = send(false, &src, &ip, &dst, port, None);
    server.join().expect("the fake server");
    assert_eq!(out.status.code(), Some(28), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("could not write") && err.contains("No space left on device"),
        "{err}"
    );

    let server = fake_server(&ip, port + 100, |cmd, id| {
        header(0, cmd | 0x80, 16, 0, id + 1)
    });
    let out = send(false, &src, &ip, &dst, port + 100, None);
    server.join().expect("the fake server");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("answer to OPEN is not one"), "{err}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn rust_client_reports_what_the_server_says_rxe() {
    client_against_fake_server("rxe", 7634);
}

#[test]
#[ignore = "needs an RDMA device"]
fn rust_client_reports_what_the_server_says_iwarp() {
    client_against_fake_server("siw", 7635);
}
