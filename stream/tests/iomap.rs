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
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{example, finish, ip, start, timed};
use rdma::cm::{CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use rdma::{
    AccessFlags, Completion, CompletionChannel, CompletionQueue, InlineSend, MemoryRegion,
    PostError, ProtectionDomain, QpState, QpType, QueuePair, RemoteMemory, SendOp, SendWr,
    WcStatus, WrBuffers,
};
use rdma_stream::wire::{self, ConnData, IoMapEntry, Op, Sge};
use rdma_stream::{Options, RdmaListener, RdmaStream, Sizes};

use peer::*;

/// Bound of each step of the test peer (`hostile/peer.rs` reads it).
const STEP: Duration = Duration::from_secs(10);

fn addr(dev: &str, port: u16) -> SocketAddr {
    format!("{}:{port}", ip(dev))
        .parse()
        .expect("an IPv4 address")
}

/// Which `riostream` takes a role: rdma-core's or the example.
#[derive(Clone, Copy, Debug)]
enum Tool {
    C,
    Ours,
}

/// Runs `riostream` as the server (`server`) and the client (`client`),
/// a custom test of `count` transfers of `size` bytes each way, `iters`
/// times, with `-T v` (the bytes of each last transfer checked on
/// arrival) and, for ours, the `-T` options `ours_t` too; both must
/// succeed and print their result line.
fn riostream_pair(
    dev: &str,
    port: u16,
    (server, client): (Tool, Tool),
    (size, count, iters): (usize, usize, usize),
    ours_t: &str,
) {
    let ip = ip(dev);
    let prog = |t: Tool| -> PathBuf {
        match t {
            Tool::C => "riostream".into(),
            Tool::Ours => example("riostream"),
        }
    };
    let args = |role: [&str; 2], t: Tool| -> Vec<String> {
        let mut v: Vec<String> = role.iter().map(|s| s.to_string()).collect();
        let test = match t {
            // C's riostream takes one option per -T.
            Tool::C => "v".to_string(),
            Tool::Ours if ours_t.is_empty() => "v".to_string(),
            Tool::Ours => format!("{ours_t},v"),
        };
        let (size, count, iters, port) = (
            size.to_string(),
            count.to_string(),
            iters.to_string(),
            port.to_string(),
        );
        v.extend(
            [
                "-p", &port, "-S", &size, "-C", &count, "-I", &iters, "-T", &test,
            ]
            .map(String::from),
        );
        v
    };
    let mut s = timed(prog(server));
    s.args(args(["-b", &ip], server));
    let server_child = start(s, false);
    let out = timed(prog(client))
        .args(args(["-s", &ip], client))
        .output()
        .expect("run the riostream client");
    assert!(
        out.status.success(),
        "{client:?} riostream client failed ({}): {} {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let server_out = finish(server_child, &format!("the {server:?} riostream server"));
    for o in [&out.stdout, &server_out.stdout] {
        let text = String::from_utf8_lossy(o);
        assert!(text.contains("custom"), "no result line: {text}");
    }
}

/// Both roles, a small and a large transfer.
fn both_sizes(dev: &str, port: u16, roles: (Tool, Tool), ours_t: &str) {
    riostream_pair(dev, port, roles, (64, 100, 3), ours_t);
    riostream_pair(dev, port + 1, roles, (100_000, 10, 2), ours_t);
}

#[test]
#[ignore = "needs an RDMA device"]
fn rust_riostream_pair_rxe() {
    both_sizes("rxe", 7701, (Tool::Ours, Tool::Ours), "");
    riostream_pair("rxe", 7703, (Tool::Ours, Tool::Ours), (1, 50, 300), "b");
}

#[test]
#[ignore = "needs an RDMA device"]
fn rust_riostream_pair_iwarp() {
    both_sizes("siw", 7704, (Tool::Ours, Tool::Ours), "");
    riostream_pair("siw", 7706, (Tool::Ours, Tool::Ours), (1, 50, 300), "b");
}

#[test]
#[ignore = "needs an RDMA device"]
fn c_riostream_client_to_rust_rxe() {
    both_sizes("rxe", 7711, (Tool::Ours, Tool::C), "");
    riostream_pair("rxe", 7713, (Tool::Ours, Tool::C), (4096, 20, 5), "b");
}

#[test]
#[ignore = "needs an RDMA device"]
fn rust_to_c_riostream_server_rxe() {
    both_sizes("rxe", 7714, (Tool::C, Tool::Ours), "");
    riostream_pair("rxe", 7716, (Tool::C, Tool::Ours), (4096, 20, 5), "b");
}

#[test]
#[ignore = "needs an RDMA device"]
fn c_riostream_client_to_rust_iwarp() {
    both_sizes("siw", 7717, (Tool::Ours, Tool::C), "");
}

#[test]
#[ignore = "needs an RDMA device"]
fn rust_to_c_riostream_server_iwarp() {
    both_sizes("siw", 7719, (Tool::C, Tool::Ours), "");
}

/// `-T a`: ours on the async stream (`aio::RdmaStream`, tokio).
#[cfg(feature = "tokio")]
fn async_both_ways(dev: &str, port: u16) {
    both_sizes(dev, port, (Tool::Ours, Tool::C), "a");
    both_sizes(dev, port + 2, (Tool::C, Tool::Ours), "a");
}

#[test]
#[cfg(feature = "tokio")]
#[ignore = "needs an RDMA device"]
fn async_riostream_with_c_both_ways_rxe() {
    async_both_ways("rxe", 7751);
}

#[test]
#[cfg(feature = "tokio")]
#[ignore = "needs an RDMA device"]
fn async_riostream_with_c_both_ways_iwarp() {
    async_both_ways("siw", 7755);
}

/// A connected pair of Rust streams on `dev`.
fn rust_pair(dev: &str, port: u16) -> (RdmaStream, RdmaStream) {
    rust_pair_with(dev, port, Options::default())
}

/// A connected pair whose accepting side has `opts`.
fn rust_pair_with(dev: &str, port: u16, opts: Options) -> (RdmaStream, RdmaStream) {
    let at = addr(dev, port);
    let listener = RdmaListener::bind_with(at, opts).expect("bind");
    let server = thread::spawn(move || listener.accept().expect("accept").0);
    let c = RdmaStream::connect(at).expect("connect");
    (server.join().expect("the accepting side"), c)
}

/// The library's calls without the tool: the client writes a pattern in
/// three parts into the server's mapping, the last byte last; the server
/// waits for it and gets back exactly what was written.
fn write_wait_unmap(dev: &str, port: u16) {
    let (s, c) = rust_pair(dev, port);
    let size = 100_000;
    let map = s.iomap(vec![0xFF; size], 7000).expect("iomap");
    assert_eq!((map.offset(), map.len()), (7000, size));
    // The announcement goes before these bytes on the stream.
    (&s).write_all(b"go").expect("write");
    let mut go = [0; 2];
    (&c).read_exact(&mut go).expect("read");
    let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    let mut done = 0;
    for part in [1000, size - 1001, 1] {
        let mut n = 0;
        while n < part {
            n += c
                .iowrite(&data[done + n..done + part], 7000 + (done + n) as u64)
                .expect("iowrite");
        }
        done += part;
    }
    let last = data[size - 1];
    s.iomap_wait(&map, size - 1, last, Some(STEP))
        .expect("the last byte");
    let back = s.iounmap(map).expect("iounmap");
    assert!(back[..] == data[..], "the mapping holds what was written");
}

#[test]
#[ignore = "needs an RDMA device"]
fn iomap_write_wait_unmap_rxe() {
    write_wait_unmap("rxe", 7731);
}

#[test]
#[ignore = "needs an RDMA device"]
fn iomap_write_wait_unmap_iwarp() {
    write_wait_unmap("siw", 7732);
}

/// A wait for a marker that never comes ends: at its timeout, and when
/// the peer closes the stream (an error within a bound, never a hang).
fn wait_ends(dev: &str, port: u16) {
    let (s, c) = rust_pair(dev, port);
    let map = s.iomap(vec![0; 64], 0).expect("iomap");
    let t = Instant::now();
    let timed_out = s.iomap_wait(&map, 63, 1, Some(Duration::from_millis(50)));
    assert_eq!(
        timed_out.map_err(|e| e.kind()),
        Err(io::ErrorKind::TimedOut)
    );
    assert!(t.elapsed() < STEP, "the timeout bounds the wait");
    // Closed while the wait spins or before it starts: either way the
    // wait ends with the end of the stream.
    let closer = thread::spawn(move || drop(c));
    let t = Instant::now();
    let closed = s.iomap_wait(&map, 63, 1, None);
    let e = closed.expect_err("the peer closed");
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
    assert!(t.elapsed() < STEP, "the close ends the wait");
    closer.join().expect("the closing side");
}

#[test]
#[ignore = "needs an RDMA device"]
fn iomap_wait_ends_rxe() {
    wait_ends("rxe", 7733);
}

#[test]
#[ignore = "needs an RDMA device"]
fn iomap_wait_ends_iwarp() {
    wait_ends("siw", 7734);
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
    hostile_with(dev, port, Options::default(), job)
}

/// As [`hostile`], the stream with `opts`.
fn hostile_with<T: Send + 'static>(
    dev: &str,
    port: u16,
    opts: Options,
    job: impl FnOnce(RdmaStream) -> T + Send + 'static,
) -> (Peer, mpsc::Receiver<T>) {
    let at = addr(dev, port);
    let listener = RdmaListener::bind_with(at, opts).expect("bind");
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

/// Options whose direct-placement table has `entries` entries.
fn table_of(entries: u32) -> Options {
    let mut o = Options::default();
    o.sizes.iomap_entries = entries;
    o
}

#[test]
fn iomap_table_sizes_round_as_rsocket() {
    let offered = |n| {
        Sizes {
            iomap_entries: n,
            ..Sizes::default()
        }
        .iomap_table()
    };
    assert_eq!(Sizes::default().iomap_table(), 8);
    for n in [0, 1, 3, 20, 128] {
        assert_eq!(offered(n), n as usize);
    }
    assert_eq!(offered(129), 128);
    assert_eq!(offered(255), 128);
    assert_eq!(offered(300), 256);
    assert_eq!(offered(32_512), 32_512);
    assert_eq!(offered(40_000), 32_512, "the most the connection data says");
}

/// The connecting side maps into a table of `entries` (not 8): every slot
/// can be taken, one more is `OutOfMemory`, an unmapped slot is taken
/// again, and the last slot is written into.
fn table_size(dev: &str, port: u16, entries: usize) {
    let (s, c) = rust_pair_with(dev, port, table_of(entries as u32));
    let mut maps: Vec<_> = (0..entries)
        .map(|i| c.iomap(vec![0; 16], 16 * i as u64).expect("iomap"))
        .collect();
    let full = c
        .iomap(vec![0; 16], 1 << 20)
        .map(drop)
        .map_err(|e| e.kind());
    assert_eq!(
        full,
        Err(io::ErrorKind::OutOfMemory),
        "{entries} slots, all taken"
    );
    c.iounmap(maps.remove(0)).expect("iounmap");
    maps.push(
        c.iomap(vec![0; 16], 1 << 20)
            .expect("a freed slot taken again"),
    );
    // The announcements before these bytes: the accepting side has the
    // whole table when it reads them.
    (&c).write_all(b"go").expect("write");
    let mut go = [0; 2];
    (&s).read_exact(&mut go).expect("read");
    if entries > 1 {
        // The last slot of the first round.
        let at = 16 * (entries as u64 - 1);
        assert_eq!(s.iowrite(&[9; 16], at).expect("iowrite"), 16);
        let last = maps.iter().find(|m| m.offset() == at).expect("the last");
        c.iomap_wait(last, 15, 9, Some(STEP)).expect("the write");
    }
    assert_eq!(s.iowrite(&[5; 16], 1 << 20).expect("iowrite"), 16);
    let again = maps.last().expect("the slot taken again");
    c.iomap_wait(again, 15, 5, Some(STEP)).expect("the write");
    for m in maps {
        c.iounmap(m).expect("iounmap");
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn iomap_table_sizes_rxe() {
    table_size("rxe", 7741, 1);
    table_size("rxe", 7742, 20);
    // A table of none: the peer's iomap is refused.
    let (_s, c) = rust_pair_with("rxe", 7743, table_of(0));
    let none = c.iomap(vec![0; 16], 0).map(drop).map_err(|e| e.kind());
    assert_eq!(none, Err(io::ErrorKind::Unsupported));
}

#[test]
#[ignore = "needs an RDMA device"]
fn iomap_table_sizes_iwarp() {
    table_size("siw", 7744, 1);
    table_size("siw", 7745, 20);
}

/// A table of 4: an announcement of entry 4 is refused as one of 200 is
/// from a table of 8.
#[test]
#[ignore = "needs an RDMA device"]
fn hostile_iomap_index_past_a_small_table_rxe() {
    let (mut p, rx) = hostile_with("rxe", 7746, table_of(4), |s| {
        let mut buf = [0; 16];
        (&s).read(&mut buf).map_err(|e| (e.kind(), e.to_string()))
    });
    p.msg(wire::msg(Op::IOMAP_SGL, 4));
    let end = rx.recv_timeout(STEP).expect("the stream side");
    let (kind, why) = end.expect_err("the stream refuses the announcement");
    assert_eq!(kind, io::ErrorKind::InvalidData, "{why}");
    assert!(why.contains("mapping 4; this side's table has 4"), "{why}");
}

/// A table of 20: entry 19, past the default 8, is taken and written to.
#[test]
#[ignore = "needs an RDMA device"]
fn hostile_iomap_entry_in_a_large_table_rxe() {
    let (mut p, rx) = hostile_with("rxe", 7747, table_of(20), |s| {
        read_go(&s);
        let n = s.iowrite(&[3; 50], 2000).map_err(|e| e.kind());
        (&s).write_all(b"done").expect("write after the iowrite");
        n
    });
    let region =
        p.pd.alloc_mr(100, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .expect("the peer's mapped region");
    let entry = IoMapEntry {
        offset: 2000,
        sge: Sge {
            addr: region.addr(),
            key: region.rkey(),
            length: 100,
        },
    };
    announce(&mut p, 19, entry);
    assert_eq!(rx.recv_timeout(STEP).expect("the stream side"), Ok(50));
    let deadline = Instant::now() + STEP;
    while !p
        .messages
        .iter()
        .any(|&m| wire::msg_op(m) == Op::DATA && wire::msg_data(m) == 4)
    {
        assert!(p.poll(deadline), "the stream's data did not come");
    }
    let mut got = vec![0; 100];
    region.read_at(0, &mut got).expect("read the peer's region");
    assert_eq!(&got[..50], &[3; 50][..]);
    assert_eq!(&got[50..], &[0; 50][..]);
}
