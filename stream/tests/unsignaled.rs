//! Small writes that ask for no completion of their own (`engine/send.rs`,
//! `write_small`): the next signaled request finishes them. What could go
//! wrong, and these tests would see: a send queue that fills with
//! unsignaled writes and waits for a completion that never comes (a hang,
//! caught by the bound), a count that gives back more entries than were
//! used (the provider refuses a post: a write fails), a shutdown that waits
//! for them forever, and coalescing turned on after them that holds a
//! write for a completion that never comes.
//!
//! Each runs on a small send queue (12 entries: 8 for data, so at most 4
//! unsignaled in a row), so a run passes its limit many times.

#[path = "common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::ip;
use rdma_stream::{Options, RdmaListener, RdmaStream, Sizes};

/// How long a whole test may take.
const BOUND: Duration = Duration::from_secs(60);

/// Small writes per run: many times the send queue.
const WRITES: usize = 3000;

fn small_queue() -> Options {
    Options {
        sizes: Sizes {
            send_queue: 12,
            ..Sizes::default()
        },
        ..Options::default()
    }
}

/// A connected pair on `dev`, both sides with a small send queue: (the
/// accepting side, the connecting side).
fn pair(dev: &str) -> (RdmaStream, RdmaStream) {
    let at: SocketAddr = format!("{}:0", ip(dev)).parse().expect("an address");
    let listener = RdmaListener::bind_with(at, small_queue()).expect("bind");
    let at = listener.local_addr().expect("bound");
    let server = thread::spawn(move || listener.accept().expect("accept").0);
    let c = RdmaStream::connect_with(at, &small_queue()).expect("connect");
    (server.join().expect("the accepting side"), c)
}

/// Runs `test` on a thread of its own: fails when it panics or takes
/// longer than `BOUND`.
fn bounded(test: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        test();
        let _ = tx.send(());
    });
    match rx.recv_timeout(BOUND) {
        Ok(()) => h.join().expect("the test's thread"),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            std::panic::resume_unwind(h.join().expect_err("the test's thread panicked"))
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("not done within {BOUND:?}: a hang"),
    }
}

/// The bytes of write `i`: 1 to 64 of them (inline), a pattern of `i`.
fn piece(i: usize) -> Vec<u8> {
    (0..1 + i % 64).map(|k| (i * 7 + k) as u8).collect()
}

/// `WRITES` small writes one way while the reader reads them all, then
/// the writer shuts down its side, which must finish (its SHUTDOWN is the
/// signaled request that ends the unsignaled ones before it), and the
/// reader sees every byte in order, then the end of the stream.
fn run_then_shutdown(dev: &str) {
    let (server, client) = pair(dev);
    let reader = thread::spawn(move || {
        let mut got = Vec::new();
        (&server).read_to_end(&mut got).expect("read to the end");
        got
    });
    let mut sent = Vec::new();
    for i in 0..WRITES {
        let p = piece(i);
        (&client).write_all(&p).expect("a small write");
        sent.extend_from_slice(&p);
    }
    client
        .shutdown(Shutdown::Write)
        .expect("shutdown(Write) after unsignaled writes");
    let got = reader.join().expect("the reader");
    assert_eq!(got.len(), sent.len(), "bytes received");
    assert!(got == sent, "the bytes, in order");
}

/// Ping-pong of small writes (each side's writes stay unsignaled in runs
/// of four), then the client turns coalescing on: its next small write
/// must still go at once, as nothing it waits for is signaled, and the
/// echo must come.
fn ping_pong_then_coalescing(dev: &str) {
    let (server, client) = pair(dev);
    let echo = thread::spawn(move || {
        let mut b = [0; 64];
        loop {
            let n = (&server).read(&mut b).expect("the echo's read");
            if n == 0 {
                return;
            }
            (&server).write_all(&b[..n]).expect("the echo's write");
        }
    });
    let mut back = [0; 64];
    for i in 0..WRITES {
        let p = piece(i);
        (&client).write_all(&p).expect("a ping");
        (&client)
            .read_exact(&mut back[..p.len()])
            .expect("its pong");
        assert!(back[..p.len()] == p[..], "pong {i} echoes its ping");
    }
    client.set_nodelay(false).expect("set_nodelay(false)");
    for i in 0..8 {
        (&client).write_all(b"x").expect("a small write, coalescing on");
        (&client)
            .read_exact(&mut back[..1])
            .unwrap_or_else(|e| panic!("the echo of write {i} with coalescing on: {e}"));
        assert_eq!(back[0], b'x');
    }
    client
        .shutdown(Shutdown::Write)
        .expect("shutdown(Write) after the ping-pong");
    echo.join().expect("the echo");
}

#[test]
#[ignore = "needs an RDMA device"]
fn small_writes_past_the_send_queue_then_shutdown_rxe() {
    bounded(|| run_then_shutdown("rxe"));
}

#[test]
#[ignore = "needs an RDMA device"]
fn small_writes_past_the_send_queue_then_shutdown_iwarp() {
    bounded(|| run_then_shutdown("siw"));
}

#[test]
#[ignore = "needs an RDMA device"]
fn ping_pong_of_small_writes_then_coalescing_rxe() {
    bounded(|| ping_pong_then_coalescing("rxe"));
}

#[test]
#[ignore = "needs an RDMA device"]
fn ping_pong_of_small_writes_then_coalescing_iwarp() {
    bounded(|| ping_pong_then_coalescing("siw"));
}
