//! The stream under a hostile peer (issue 41): a test peer built directly
//! on the `rdma` crate and `rdma_stream::wire` connects to an
//! `RdmaListener` (or accepts an `RdmaStream::connect`) with valid
//! connection data, then breaks the protocol: data past the receive space
//! granted, messages past the credits granted, unknown operations and
//! control codes, data after SHUTDOWN, a write past the receive buffer,
//! private data that is not rsocket's; and a C-less peer process (our
//! `rcat`) SIGKILLed mid-transfer.
//!
//! The stream side runs in a thread and reports through a channel that
//! the test waits on with a bound: it must end with an `io::Error` of a
//! sensible kind (`InvalidData` for a protocol violation, `ConnectionReset`
//! for a vanished peer), never panic, never hang, and the bytes it read
//! must be exactly those legitimately sent before the violation.
//!
//! Device tests: `#[ignore]`d in a plain `cargo test`; run in the VM
//! (`ci/vm run`) with `--ignored`, which sets `RDMA_TEST_IP` and
//! `RDMA_TEST_IWARP_IP`. A test that runs without them fails. Those over
//! siw0 have `iwarp` in their name (`ci/device-tests` routes them so).
//!
//! Over siw0 the test peer is the passive side and the stream connects to
//! it (MPA's initiator speaks first, so the peer sends nothing before the
//! stream's first message); an accepted stream waits so for its client's
//! first message, which `tests/listener.rs` covers over siw0.
//!
//! Here: what the tests share (the bounds, the test pattern, a stream and a
//! test peer connected, the stream side's outcome). `peer` is the test
//! peer, `violations` its breaches against the blocking stream, `killed`
//! the SIGKILLed peer process, `aio` both against the async stream, and
//! `coalescing` the test peer counting the messages a run of small writes
//! arrives in (`set_nodelay`), `closing` a stream dropped while the peer
//! still reads and sends credits.

#[path = "../common/mod.rs"]
mod common;

#[cfg(feature = "tokio")]
mod aio;
mod closing;
#[cfg(feature = "tokio")]
mod coalescing;
mod killed;
mod peer;
mod violations;

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use common::{example, ip};
use rdma::cm::{CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use rdma::{
    AccessFlags, Completion, CompletionChannel, CompletionQueue, InlineSend, MemoryRegion,
    PostError, ProtectionDomain, QpState, QpType, QueuePair, RemoteMemory, SendOp, SendWr,
    WcStatus, WrBuffers,
};
use rdma_stream::wire::{self, ConnData, Ctrl, Op, Sge};
use rdma_stream::{Options, RdmaListener, RdmaStream};

use peer::*;

/// How long the stream side may take to end after a violation.
const BOUND: Duration = Duration::from_secs(10);
/// Bound of each step of the test peer (connecting, its completions).
const STEP: Duration = Duration::from_secs(10);

fn addr(dev: &str, port: u16) -> SocketAddr {
    format!("{}:{port}", ip(dev))
        .parse()
        .expect("an IPv4 address")
}

/// The test pattern: byte `i` of everything the peers send.
fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

fn patterned(from: usize, len: usize) -> Vec<u8> {
    (from..from + len).map(pattern).collect()
}

/// How the stream side ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    Eof,
    Err(io::ErrorKind, String),
}

impl End {
    /// A read's result: the bytes it read, or how the stream ended.
    fn of(read: io::Result<usize>) -> Result<usize, End> {
        match read {
            Ok(0) => Err(End::Eof),
            Ok(n) => Ok(n),
            Err(e) => Err(End::Err(e.kind(), e.to_string())),
        }
    }
}

/// What the stream side saw, and when it ended.
#[derive(Debug)]
struct Seen {
    bytes: Vec<u8>,
    end: End,
    at: Instant,
}

impl Seen {
    /// `bytes` read, then `end`, now.
    fn now(bytes: Vec<u8>, end: End) -> Seen {
        Seen {
            bytes,
            end,
            at: Instant::now(),
        }
    }
}

/// Reads until an error or the end of the stream.
fn read_to_end(s: &RdmaStream, mut bytes: Vec<u8>) -> Seen {
    let mut buf = vec![0; 64 * 1024];
    let end = loop {
        match End::of((&*s).read(&mut buf)) {
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(end) => break end,
        }
    };
    Seen::now(bytes, end)
}

/// Runs `job` on the next stream `listener` accepts, in a thread; its
/// result comes through the channel (a panic drops the sender).
fn serve<T: Send + 'static>(
    listener: &Arc<RdmaListener>,
    job: impl FnOnce(RdmaStream) -> T + Send + 'static,
) -> (mpsc::Receiver<T>, thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let l = Arc::clone(listener);
    let h = thread::spawn(move || {
        let (s, _) = l.accept().expect("accept a valid rsocket peer");
        let _ = tx.send(job(s));
    });
    (rx, h)
}

/// A stream and a test peer granting `credits`, connected, with `job`
/// running on the stream in a thread.
///
/// On rxe the peer connects to an `RdmaListener`; on siw the stream
/// connects to the peer (see the module's documentation).
fn pair<T: Send + 'static>(
    dev: &str,
    credits: u16,
    job: impl FnOnce(RdmaStream) -> T + Send + 'static,
) -> (Peer, mpsc::Receiver<T>, thread::JoinHandle<()>) {
    pair_with(dev, credits, Options::default(), job)
}

/// [`pair`] with the stream made with `opts`.
fn pair_with<T: Send + 'static>(
    dev: &str,
    credits: u16,
    opts: Options,
    job: impl FnOnce(RdmaStream) -> T + Send + 'static,
) -> (Peer, mpsc::Receiver<T>, thread::JoinHandle<()>) {
    if dev == "rxe" {
        let l = Arc::new(RdmaListener::bind_with(addr(dev, 0), opts).expect("RdmaListener::bind"));
        let (rx, h) = serve(&l, job);
        let peer = Peer::connect(l.local_addr().expect("bound"), false, credits);
        return (peer, rx, h);
    }
    let (tx, rx) = mpsc::channel();
    let (peer, h) = peer_accepting(dev, credits, |dst| {
        thread::spawn(move || {
            let s = RdmaStream::connect_with(dst, &opts).expect("connect to the test peer");
            let _ = tx.send(job(s));
        })
    });
    (peer, rx, h)
}

/// The test peer's listening id on `dev` and `port` (0: any): its event
/// channel, the id (listening while it lives) and the address to connect to.
fn peer_listening(dev: &str, port: u16) -> (EventChannel, CmId, SocketAddr) {
    let events = EventChannel::new().expect("rdma_create_event_channel");
    let lid = events.create_id(PortSpace::Tcp).expect("rdma_create_id");
    lid.bind_addr(addr(dev, port)).expect("rdma_bind_addr");
    lid.listen(4).expect("rdma_listen");
    let dst = addr(dev, lid.src_port());
    (events, lid, dst)
}

/// The siw way of [`pair`] (and of `aio::pair`): the test peer listens,
/// `connect` starts the stream side connecting to the address it is given
/// (in a thread of its own), and the peer accepts it granting `credits`.
fn peer_accepting(
    dev: &str,
    credits: u16,
    connect: impl FnOnce(SocketAddr) -> thread::JoinHandle<()>,
) -> (Peer, thread::JoinHandle<()>) {
    let (events, _listening, dst) = peer_listening(dev, 0);
    let h = connect(dst);
    (Peer::accept(&events, true, credits), h)
}

/// The peer's part of a message past the credits: it grants the stream its
/// first space, sends the stream's credits' worth of one-byte DATA (and
/// waits for their completions), then one message more. The stream's
/// credits, and when the message past them went.
fn past_the_credits(peer: &mut Peer) -> (usize, Instant) {
    let credits = peer.theirs.credits as usize;
    peer.first_grant();
    for i in 0..credits {
        peer.data(&[pattern(i)]);
    }
    peer.wait_sends().expect("the credited messages");
    let t0 = Instant::now();
    peer.data(&[pattern(credits)]);
    (credits, t0)
}

/// What the stream side must have seen of [`past_the_credits`], granted one
/// message: its `first` write went, then [`assert_blocked_write_failed`],
/// and its reads ended with `InvalidData`. The write's error.
fn assert_past_the_credits(
    first: io::Result<usize>,
    blocked: io::Result<usize>,
    seen: &Seen,
    credits: usize,
) -> io::Error {
    assert_eq!(first.expect("the credited write"), 1);
    let e = assert_blocked_write_failed(blocked, seen, credits);
    assert!(
        matches!(&seen.end, End::Err(io::ErrorKind::InvalidData, _)),
        "{:?}",
        seen.end
    );
    e
}

/// A message past the `credits` granted, while the stream side waited in a
/// write for credits: that write failed with `InvalidData` (returned), and
/// the stream read the credited messages' bytes, no more.
fn assert_blocked_write_failed(
    blocked: io::Result<usize>,
    seen: &Seen,
    credits: usize,
) -> io::Error {
    let e = blocked.expect_err("the write waiting for credits ends with the violation");
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    assert!(
        seen.bytes == patterned(0, credits),
        "{} bytes",
        seen.bytes.len()
    );
    e
}

/// The stream side's result within `BOUND`, or a failure that says whether
/// it hung or panicked.
fn outcome<T>(rx: &mpsc::Receiver<T>, h: thread::JoinHandle<()>, what: &str) -> T {
    match rx.recv_timeout(BOUND) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: the stream side neither failed nor ended within {BOUND:?}")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            let why = h.join().err().map(|p| {
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            });
            panic!("{what}: the stream side panicked: {why:?}")
        }
    }
}

fn listener(dev: &str) -> Arc<RdmaListener> {
    Arc::new(RdmaListener::bind(addr(dev, 0)).expect("RdmaListener::bind"))
}
