//! The transfers a run of writes becomes on the wire, seen by the test
//! peer of `hostile/` (`hostile/peer.rs`), which records every message the
//! stream sends.
//!
//! A write on an idle connection starts with rsocket's first transfer (2
//! KiB) and doubles; writes that find earlier transfers still in flight go
//! on with the sizes where they were (`engine/send.rs`, `send_now`). The
//! counts are exact: a write that can go returns without polling the CQ,
//! so no completion of the first write is taken before the writes after it
//! (as `hostile/coalescing.rs` relies on).

#[path = "common/mod.rs"]
mod common;
#[allow(dead_code)]
#[path = "hostile/peer.rs"]
mod peer;

use std::collections::VecDeque;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::ip;
use rdma::cm::{CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use rdma::{
    AccessFlags, Completion, CompletionChannel, CompletionQueue, InlineSend, MemoryRegion,
    PostError, ProtectionDomain, QpState, QpType, QueuePair, RemoteMemory, SendOp, SendWr,
    WcStatus, WrBuffers,
};
use rdma_stream::wire::{self, ConnData, Op, Sge};
use rdma_stream::{RdmaListener, RdmaStream};

use peer::*;

/// Bound of each step of the test peer.
const STEP: Duration = Duration::from_secs(10);

/// Writes in a run, and their size: three fill 24 KiB of the peer's first
/// 32 KiB segment, so no segment boundary cuts a transfer.
const WRITES: usize = 3;
const EACH: usize = 8 * 1024;

fn addr(dev: &str, port: u16) -> SocketAddr {
    format!("{}:{port}", ip(dev))
        .parse()
        .expect("an IPv4 address")
}

fn patterned(from: usize, len: usize) -> Vec<u8> {
    (from..from + len).map(|i| (i % 251) as u8).collect()
}

/// A blocking stream (on rxe it accepts the test peer; on siw it connects,
/// as MPA's initiator speaks first) that writes `WRITES` writes of `EACH`
/// bytes, then waits for the test to finish; the peer granted its first
/// segment. The lengths of the DATA messages the peer received, after
/// checking the bytes in its receive buffer.
fn run(dev: &str) -> Vec<u32> {
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let job = move |s: RdmaStream| {
        for i in 0..WRITES {
            (&s).write_all(&patterned(i * EACH, EACH))
                .expect("a write within the first segment");
        }
        // Held until the peer counted, so no DISCONNECT comes in between.
        let _ = done_rx.recv_timeout(STEP);
    };
    let (mut peer, h) = if dev == "rxe" {
        let l = RdmaListener::bind(addr(dev, 0)).expect("RdmaListener::bind");
        let dst = l.local_addr().expect("bound");
        let h = thread::spawn(move || {
            let (s, _) = l.accept().expect("accept the test peer");
            job(s);
        });
        (Peer::connect(dst, false, PEER_RQ as u16), h)
    } else {
        let events = EventChannel::new().expect("rdma_create_event_channel");
        let lid = events.create_id(PortSpace::Tcp).expect("rdma_create_id");
        lid.bind_addr(addr(dev, 0)).expect("rdma_bind_addr");
        lid.listen(4).expect("rdma_listen");
        let dst = addr(dev, lid.src_port());
        let h = thread::spawn(move || {
            job(RdmaStream::connect(dst).expect("connect to the test peer"));
        });
        (Peer::accept(&events, true, PEER_RQ as u16), h)
    };
    peer.first_grant();
    let mut lens = Vec::new();
    let mut got = 0;
    while got < WRITES * EACH {
        let m = peer.next_message();
        match wire::msg_op(m) {
            Op::DATA => {
                lens.push(wire::msg_data(m));
                got += wire::msg_data(m) as usize;
            }
            Op::SGL => {}
            other => panic!("message {m:#x} (operation {}) in a run of writes", other.0),
        }
    }
    let mut bytes = vec![0; WRITES * EACH];
    peer.rbuf
        .read_at(0, &mut bytes)
        .expect("the peer's receive buffer");
    let _ = done_tx.send(());
    h.join().expect("the stream's thread");
    assert!(bytes == patterned(0, WRITES * EACH), "the bytes, in order");
    println!("{dev}: DATA messages of {lens:?} bytes");
    lens
}

/// The first write, on an idle connection, goes as 2, 4 and 2 KiB; the two
/// after it, with those in flight, as one 8 KiB transfer each.
const EXPECTED: [u32; 5] = [2048, 4096, 2048, 8192, 8192];

#[test]
#[ignore = "needs an RDMA device"]
fn writes_behind_writes_in_flight_go_whole_rxe() {
    assert_eq!(run("rxe"), EXPECTED);
}

#[test]
#[ignore = "needs an RDMA device"]
fn writes_behind_writes_in_flight_go_whole_iwarp() {
    assert_eq!(run("siw"), EXPECTED);
}
