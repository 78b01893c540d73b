//! Direct placement (`RdmaStream::iomap`/`iowrite`/`iounmap`, rsocket's
//! `riomap`/`riowrite`/`riounmap`) on soft-RoCE (rxe0) and soft-iWARP
//! (siw0): `riostream`'s exchange between two Rust streams, and against
//! rdma-core's C `riostream` both ways with verified data; and a hostile
//! test peer (`hostile/peer.rs`) announcing mappings that cannot be right.
//!
//! The exchange is `riostream`'s: each side maps its buffer at offset 0
//! (`riomap(PROT_WRITE)`), they swap 16 bytes over the stream (which
//! carries the announcements before them), then the client writes the
//! buffer `count` times into the server's mapping, the last time with a
//! marker in its last byte, on which the server spins; then the server does
//! the same back. With `-T v` the last transfer's other bytes are C's
//! `format_buf` pattern, checked on arrival.
//!
//! Device tests: `#[ignore]`d in a plain `cargo test`; the VM harness
//! (`ci/vm run`, `ci/device-tests`) runs them with `--ignored` and sets
//! `RDMA_TEST_IP`/`RDMA_TEST_IWARP_IP`. Those over siw0 have `iwarp` in
//! their name. A test that runs without them fails.

#[path = "common/mod.rs"]
mod common;
#[path = "hostile/peer.rs"]
#[allow(dead_code)]
mod peer;

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{finish, ip, start, timed};
use rdma::cm::{CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use rdma::{
    AccessFlags, Completion, CompletionChannel, CompletionQueue, InlineSend, MemoryRegion,
    PostError, ProtectionDomain, QpState, QpType, QueuePair, RemoteMemory, SendOp, SendWr,
    WcStatus, WrBuffers,
};
use rdma_stream::wire::{self, ConnData, IoMapEntry, Op, Sge};
use rdma_stream::{IoMap, RdmaListener, RdmaStream};

use peer::*;

/// Bound of each step of the test peer (`hostile/peer.rs` reads it).
const STEP: Duration = Duration::from_secs(10);
/// How long a side spins for the peer's marker.
const MARKER_WAIT: Duration = Duration::from_secs(60);

fn addr(dev: &str, port: u16) -> SocketAddr {
    format!("{}:{port}", ip(dev))
        .parse()
        .expect("an IPv4 address")
}

/// C's `format_buf` and `verify_buf`: each keeps its own running byte.
#[derive(Default)]
struct Pattern {
    fill: u8,
    check: u8,
    checked: u64,
}

impl Pattern {
    fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.fill;
            self.fill = self.fill.wrapping_add(1);
        }
    }

    fn check(&mut self, buf: &[u8]) {
        for &b in buf {
            assert_eq!(
                b, self.check,
                "data verification failed byte {}",
                self.checked
            );
            self.check = self.check.wrapping_add(1);
            self.checked += 1;
        }
    }
}

/// Spins until the last byte of `map` is `marker` (RDMA WRITEs land in
/// order: every byte before it is there), then checks the rest.
fn wait_marker(s: &RdmaStream, map: &IoMap, marker: u8, verify: Option<&mut Pattern>) {
    let last = map.len() - 1;
    let deadline = Instant::now() + MARKER_WAIT;
    let mut b = [0];
    loop {
        s.iomap_read(map, last, &mut b).expect("iomap_read");
        if b[0] == marker {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "marker {marker} not written within {MARKER_WAIT:?}"
        );
        std::hint::spin_loop();
    }
    if let Some(p) = verify {
        let mut got = vec![0; last];
        s.iomap_read(map, 0, &mut got).expect("iomap_read");
        p.check(&got);
    }
}

fn write_all_at(s: &RdmaStream, buf: &[u8], offset: u64) {
    let mut done = 0;
    while done < buf.len() {
        let n = s
            .iowrite(&buf[done..], offset + done as u64)
            .expect("iowrite");
        assert!(n > 0, "iowrite wrote nothing");
        done += n;
    }
}

/// One side of `riostream`'s custom test on `s`: `size` bytes, `count`
/// transfers each way per iteration.
fn riostream_side(s: &RdmaStream, client: bool, size: usize, count: usize, iterations: usize) {
    let map = s.iomap(vec![0xFF; size], 0).expect("iomap");
    assert_eq!((map.offset(), map.len()), (0, size));
    let mut sync = [0; 16];
    if client {
        (&*s).write_all(&sync).expect("sync write");
        (&*s).read_exact(&mut sync).expect("sync read");
    } else {
        (&*s).read_exact(&mut sync).expect("sync read");
        (&*s).write_all(&sync).expect("sync write");
    }
    let mut out = vec![0xFF; size];
    let mut pattern = Pattern::default();
    let mut marker = 0u8;
    let send = |out: &mut Vec<u8>, marker: &mut u8, pattern: &mut Pattern| {
        for _ in 0..count - 1 {
            write_all_at(s, out, 0);
        }
        out[size - 1] = *marker;
        *marker = marker.wrapping_add(1);
        pattern.fill(&mut out[..size - 1]);
        write_all_at(s, out, 0);
    };
    for _ in 0..iterations {
        if client {
            send(&mut out, &mut marker, &mut pattern);
            wait_marker(s, &map, marker, Some(&mut pattern));
            marker = marker.wrapping_add(1);
        } else {
            wait_marker(s, &map, marker, Some(&mut pattern));
            marker = marker.wrapping_add(1);
            send(&mut out, &mut marker, &mut pattern);
        }
    }
    let back = s.iounmap(map).expect("iounmap");
    assert_eq!(back.len(), size);
    assert_eq!(
        back[size - 1],
        marker.wrapping_sub(if client { 1 } else { 2 })
    );
}

fn rust_pair(dev: &str, port: u16, size: usize, count: usize, iterations: usize) {
    let at = addr(dev, port);
    let listener = RdmaListener::bind(at).expect("bind");
    let server = thread::spawn(move || {
        let (s, _) = listener.accept().expect("accept");
        riostream_side(&s, false, size, count, iterations);
        s
    });
    let c = RdmaStream::connect(at).expect("connect");
    riostream_side(&c, true, size, count, iterations);
    let s = server.join().expect("the server side");
    drop(c);
    drop(s);
}

#[test]
#[ignore = "needs an RDMA device"]
fn rust_riostream_pair_rxe() {
    rust_pair("rxe", 7701, 64, 100, 3);
    rust_pair("rxe", 7702, 100_000, 10, 2);
}

#[test]
#[ignore = "needs an RDMA device"]
fn rust_riostream_pair_iwarp() {
    rust_pair("siw", 7703, 64, 100, 3);
    rust_pair("siw", 7704, 100_000, 10, 2);
}

/// The C `riostream` arguments of a custom test with verified data.
fn c_args(size: usize, count: usize, iterations: usize, port: u16) -> Vec<String> {
    [
        "-p",
        &port.to_string(),
        "-S",
        &size.to_string(),
        "-C",
        &count.to_string(),
        "-I",
        &iterations.to_string(),
        "-T",
        "v",
    ]
    .map(String::from)
    .to_vec()
}

/// Rust serves, C's `riostream` connects.
fn c_client(dev: &str, port: u16, size: usize, count: usize, iterations: usize) {
    let at = addr(dev, port);
    let listener = RdmaListener::bind(at).expect("bind");
    let (tx, rx) = mpsc::channel();
    let server = thread::spawn(move || {
        let (s, _) = listener.accept().expect("accept the C riostream");
        riostream_side(&s, false, size, count, iterations);
        let _ = tx.send(());
        // C closes first (rshutdown, rclose): read to its end.
        let mut rest = Vec::new();
        let _ = (&s).read_to_end(&mut rest);
    });
    let out = timed("riostream")
        .args(["-s", &ip(dev)])
        .args(c_args(size, count, iterations, port))
        .output()
        .expect("run riostream");
    assert!(
        out.status.success(),
        "C riostream client failed: {} {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("custom"), "no result line: {text}");
    rx.recv_timeout(STEP).expect("the Rust side finished");
    server.join().expect("the Rust server");
}

/// C's `riostream` serves, Rust connects.
fn c_server(dev: &str, port: u16, size: usize, count: usize, iterations: usize) {
    let ip = ip(dev);
    let mut cmd = timed("riostream");
    cmd.args(["-b", &ip])
        .args(c_args(size, count, iterations, port));
    let server = start(cmd, false);
    let s = RdmaStream::connect(addr(dev, port)).expect("connect to the C riostream");
    riostream_side(&s, true, size, count, iterations);
    drop(s);
    let out = finish(server, "the C riostream server");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("custom"), "no result line: {text}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn c_riostream_client_to_rust_rxe() {
    c_client("rxe", 7711, 64, 100, 3);
    c_client("rxe", 7712, 100_000, 10, 2);
}

#[test]
#[ignore = "needs an RDMA device"]
fn rust_to_c_riostream_server_rxe() {
    c_server("rxe", 7713, 64, 100, 3);
    c_server("rxe", 7714, 100_000, 10, 2);
}

#[test]
#[ignore = "needs an RDMA device"]
fn c_riostream_client_to_rust_iwarp() {
    c_client("siw", 7715, 64, 100, 3);
    c_client("siw", 7716, 100_000, 10, 2);
}

#[test]
#[ignore = "needs an RDMA device"]
fn rust_to_c_riostream_server_iwarp() {
    c_server("siw", 7717, 64, 100, 3);
    c_server("siw", 7718, 100_000, 10, 2);
}

/// A stream accepted from `listener` in a thread, running `job`, and the
/// test peer connected to it. On rxe only: an accepted stream on siw0 sends
/// nothing before the initiator's first message (MPA), and the checks are
/// the engine's, the same on both.
fn hostile<T: Send + 'static>(
    dev: &str,
    port: u16,
    job: impl FnOnce(RdmaStream) -> T + Send + 'static,
) -> (Peer, mpsc::Receiver<T>) {
    let at = addr(dev, port);
    let listener = RdmaListener::bind(at).expect("bind");
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let (s, _) = listener.accept().expect("accept the test peer");
        let _ = tx.send(job(s));
    });
    let mut p = Peer::connect(at, dev == "siw", 64);
    p.first_grant();
    (p, rx)
}

/// Writes `entry` into slot `index` of the stream's table and announces
/// it, then sends `go` as data so the stream knows it is there.
fn announce(p: &mut Peer, index: u32, entry: IoMapEntry) {
    let table = p.theirs.target_sgl.addr + (wire::SGL_ENTRIES * wire::SGE_LEN) as u64;
    let to = RemoteMemory {
        addr: table + u64::from(index) * wire::IOMAP_ENTRY_LEN as u64,
        len: wire::IOMAP_ENTRY_LEN as u64,
        rkey: p.theirs.target_sgl.key,
    };
    let bytes = entry.to_memory(p.theirs.big_endian());
    p.write_msg(&bytes, to, wire::msg(Op::IOMAP_SGL, index));
    p.data(b"go");
    p.wait_sends().expect("the test peer's writes");
}

fn read_go(s: &RdmaStream) {
    let mut go = [0; 2];
    (&*s).read_exact(&mut go).expect("the peer's go");
    assert_eq!(&go, b"go");
}

fn hostile_entries(dev: &str, port: u16) {
    // A mapping of 100 bytes at offset 1000 in a region of 200 of the
    // peer's: writes stop at its end, never past it.
    let (mut p, rx) = hostile(dev, port, |s| {
        read_go(&s);
        let first = s.iowrite(&[7; 300], 1000).map_err(|e| e.kind());
        let outside = s.iowrite(&[7; 10], 1100).map_err(|e| e.kind());
        let before = s.iowrite(&[7; 10], 999).map_err(|e| e.kind());
        // The test peer's completions of our writes: a credit round trip
        // after them (our send queue is in order).
        (&s).write_all(b"done").expect("write after the iowrites");
        read_go(&s);
        let wraps = s.iowrite(&[7; 10], 5).map_err(|e| e.kind());
        (first, outside, before, wraps)
    });
    let region =
        p.pd.alloc_mr(200, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .expect("the peer's mapped region");
    let entry = IoMapEntry {
        offset: 1000,
        sge: Sge {
            addr: region.addr(),
            key: region.rkey(),
            length: 100,
        },
    };
    announce(&mut p, 0, entry);
    // The stream's "done" arrives after its RDMA WRITEs (one queue pair).
    let deadline = Instant::now() + STEP;
    while !p
        .messages
        .iter()
        .any(|&m| wire::msg_op(m) == Op::DATA && wire::msg_data(m) == 4)
    {
        assert!(p.poll(deadline), "the stream's data did not come");
    }
    let mut got = vec![0; 200];
    region.read_at(0, &mut got).expect("read the peer's region");
    assert_eq!(&got[..100], &[7; 100][..], "the mapped part is written");
    assert_eq!(&got[100..], &[0; 100][..], "nothing past the mapping");
    // Slot 1: offsets that wrap around.
    let wrapping = IoMapEntry {
        offset: u64::MAX - 10,
        sge: Sge {
            addr: region.addr(),
            key: region.rkey(),
            length: 100,
        },
    };
    announce(&mut p, 1, wrapping);
    let (first, outside, before, wraps) = rx.recv_timeout(STEP).expect("the stream side");
    assert_eq!(first, Ok(100), "a write stops at the mapping's end");
    assert_eq!(outside, Err(io::ErrorKind::InvalidInput));
    assert_eq!(before, Err(io::ErrorKind::InvalidInput));
    assert_eq!(wraps, Err(io::ErrorKind::InvalidData));
}

fn hostile_index(dev: &str, port: u16) {
    let (mut p, rx) = hostile(dev, port, |s| {
        let mut buf = [0; 16];
        (&s).read(&mut buf).map_err(|e| (e.kind(), e.to_string()))
    });
    // An announcement of slot 200 of a table of 8.
    p.msg(wire::msg(Op::IOMAP_SGL, 200));
    let end = rx.recv_timeout(STEP).expect("the stream side");
    let (kind, why) = end.expect_err("the stream refuses the announcement");
    assert_eq!(kind, io::ErrorKind::InvalidData, "{why}");
    assert!(why.contains("mapping 200"), "{why}");
}

#[test]
#[ignore = "needs an RDMA device"]
fn hostile_iomap_entries_rxe() {
    hostile_entries("rxe", 7721);
}

#[test]
#[ignore = "needs an RDMA device"]
fn hostile_iomap_index_rxe() {
    hostile_index("rxe", 7722);
}

#[test]
#[ignore = "needs an RDMA device"]
fn iomap_refused_by_a_peer_without_a_table_rxe() {
    // The test peer offers no table (target_iomap_size 0).
    let (mut p, rx) = hostile("rxe", 7724, |s| {
        s.iomap(vec![0; 64], 0).map(drop).map_err(|e| e.kind())
    });
    assert_eq!(
        rx.recv_timeout(STEP).expect("the stream side"),
        Err(io::ErrorKind::Unsupported)
    );
    p.wait_sends().expect("the test peer's sends");
}
