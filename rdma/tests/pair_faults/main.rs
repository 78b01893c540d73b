//! Faults between two machines: a peer process killed mid-transfer, a link
//! cut mid-transfer. These tests run only under `ci/vm pair` (`ci/vm pair --
//! ci/device-tests BIN`): every test runs in both guests at once, guest `a` and
//! guest `b` (`RDMA_VM_ROLE`) playing their part; the two meet through
//! files in `RDMA_VM_SYNC_DIR`, never through sleeps, and every wait has a
//! bound it states. Each test ends by checking that nothing was lost: every
//! request accounted for by a completion, `rdma resource show` and the
//! process's open descriptors back to where they were before it,
//! `rdma::teardown_failures()` zero.
//!
//! The tests live in the modules below, along what they test; each takes the
//! imports and helpers of this file with `use super::*`.

#[path = "../common/mod.rs"]
mod common;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use rdma::cm::{CmEvent, CmEventType, CmId, CmOption, ConnParam, EventChannel, PortSpace};
use rdma::{
    AccessFlags, CompletionQueue, MemoryRegion, ProtectionDomain, QpType, QueuePair, SendWr,
    SharedReceiveQueue, SrqAttr, WcStatus,
};

/// The longest any one wait in these tests may take: the peer reaching a
/// rendezvous, a CM event, the completions of a transfer.
const BOUND: Duration = Duration::from_secs(60);
const MSG: usize = 1024;
const LW: AccessFlags = AccessFlags::LOCAL_WRITE;

// ---------------------------------------------------------------------------
// Rendezvous through the shared directory.

/// One test's rendezvous: a key is a file `TEST.KEY` in `RDMA_VM_SYNC_DIR`,
/// written whole (renamed into place) by whichever process owns the key.
struct Sync {
    dir: PathBuf,
    test: &'static str,
}

fn role() -> String {
    std::env::var("RDMA_VM_ROLE").unwrap_or_else(|_| {
        panic!("RDMA_VM_ROLE is not set: this test needs two machines; run it with `ci/vm pair -- ci/device-tests BIN`")
    })
}

impl Sync {
    fn new(test: &'static str) -> Sync {
        let dir = std::env::var("RDMA_VM_SYNC_DIR")
            .unwrap_or_else(|_| panic!("RDMA_VM_SYNC_DIR is not set: run under `ci/vm pair`"));
        // The iWARP run of a test (`..._iwarp`) keeps its keys apart.
        let tag = std::env::var("PAIR_SYNC_TAG").unwrap_or_default();
        Sync {
            dir: PathBuf::from(dir).join(tag),
            test,
        }
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{}.{key}", self.test))
    }

    fn put(&self, key: &str, value: &str) {
        let tmp = self
            .dir
            .join(format!("{}.{key}.tmp.{}", self.test, std::process::id()));
        std::fs::write(&tmp, value).expect("write to the sync directory");
        std::fs::rename(&tmp, self.path(key)).expect("rename in the sync directory");
    }

    /// The value of `key`, once its owner has put it; fails after `bound`.
    fn get(&self, key: &str, bound: Duration) -> String {
        let deadline = Instant::now() + bound;
        let path = self.path(key);
        loop {
            match std::fs::read_to_string(&path) {
                Ok(v) => return v,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => panic!("reading {}: {e}", path.display()),
            }
            assert!(
                Instant::now() < deadline,
                "the peer did not reach {key:?} within {bound:?}"
            );
            // A file poll on 9p; the condition, not the pause, is the sync.
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Both guests reach `key` (each puts `KEY.ROLE` and waits for the other).
    fn barrier(&self, key: &str) {
        let me = role();
        let other = if me == "a" { "b" } else { "a" };
        self.put(&format!("{key}.{me}"), "");
        self.get(&format!("{key}.{other}"), BOUND);
    }
}

/// Takes a guest's links down or up through the host (`ci/lib/pair-link`);
/// returns once it is done.
fn link(state: &str, guest: &str) {
    let tool = std::env::var("RDMA_VM_LINK").expect("RDMA_VM_LINK is set under ci/vm pair");
    let out = Command::new(&tool)
        .args([state, guest])
        .output()
        .expect("ci/lib/pair-link runs");
    assert!(
        out.status.success(),
        "pair-link {state} {guest}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Brings guest b's links back up when dropped, also when a test fails
/// with them down (the next test needs them).
struct RestoreLink;

impl Drop for RestoreLink {
    fn drop(&mut self) {
        if let Some(tool) = std::env::var_os("RDMA_VM_LINK") {
            let _ = Command::new(tool).args(["up", "b"]).status();
        }
    }
}

fn peer_ip() -> IpAddr {
    std::env::var("RDMA_TEST_PEER_IP")
        .expect("RDMA_TEST_PEER_IP is set under ci/vm pair")
        .parse()
        .expect("RDMA_TEST_PEER_IP is an IP address")
}

// ---------------------------------------------------------------------------
// What "nothing lost" is measured against.

/// librdmacm opens a device's context the first time an id reaches it and
/// keeps it for the life of the process: do that before the baseline, so
/// the baseline counts it.
fn warm_up() {
    let ch = EventChannel::new().unwrap();
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    id.bind_addr(SocketAddr::new(IpAddr::V4(common::ip()), 0))
        .unwrap();
    drop(id.context().expect("the bound id has a device"));
}

/// (pd, cq, qp, cm_id, mr) of this guest's devices in `rdma resource show`,
/// and this process's open descriptors, once librdmacm's contexts are open.
fn baseline() -> common::Baseline {
    warm_up();
    common::baseline()
}

/// Back to `before`, librdmacm's contexts counted as in [`baseline`].
fn assert_back_to(before: common::Baseline) {
    warm_up();
    common::assert_back_to(before);
}

// ---------------------------------------------------------------------------
// Connections.

fn next_event(ch: &EventChannel, bound: Duration) -> CmEvent {
    let e = ch
        .get_event_timeout(bound)
        .expect("rdma_get_cm_event")
        .unwrap_or_else(|| panic!("no CM event within {bound:?}"));
    eprintln!(
        "[{}] event {} status {}",
        role(),
        e.event_type(),
        e.status()
    );
    e
}

fn expect_event(ch: &EventChannel, want: CmEventType) -> CmEvent {
    let e = next_event(ch, BOUND);
    assert_eq!((e.event_type(), e.status()), (want, 0), "{e:?}");
    e
}

/// One end's verbs objects. Field order is only the default drop order;
/// the tests also drop them explicitly in other orders.
struct End {
    qp: QueuePair,
    srq: Option<SharedReceiveQueue>,
    cq: CompletionQueue,
    pd: ProtectionDomain,
    id: CmId,
}

fn end_for(id: &CmId, with_srq: bool) -> End {
    let ctx = id.context().expect("the id has a device");
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(512, None, 0).unwrap();
    let srq = with_srq.then(|| {
        pd.create_srq(SrqAttr {
            max_wr: 128,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap()
    });
    let mut b = pd.qp_builder(QpType::Rc, &cq, &cq);
    b.max_send_wr(64).max_recv_wr(128);
    if let Some(s) = &srq {
        b.srq(s);
    }
    let qp = b.build().unwrap();
    End {
        qp,
        srq,
        cq,
        pd,
        id: id.clone(),
    }
}

/// Posts `n` receives of `MSG` bytes (to the SRQ if there is one).
fn post_receives(e: &mut End, n: usize) {
    let bufs = e.pd.alloc_mr(n * MSG, LW).unwrap().chunks(MSG).unwrap();
    for (i, m) in bufs.into_iter().enumerate() {
        repost(e, 1_000_000 + i as u64, m);
    }
}

fn repost(e: &mut End, wr_id: u64, m: MemoryRegion) {
    match &e.srq {
        Some(s) => s.post_recv(wr_id, m).map_err(|p| p.drop_buffers()),
        None => e.qp.post_recv(wr_id, m).map_err(|p| p.drop_buffers()),
    }
    .expect("post receive");
}

/// The message `seq` of generation `gen`: both numbers, then a pattern.
fn message(gen: u32, seq: u32) -> Vec<u8> {
    let mut m = vec![0u8; MSG];
    m[..4].copy_from_slice(&gen.to_le_bytes());
    m[4..8].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in m[8..].iter_mut().enumerate() {
        *b = (i as u32).wrapping_mul(7).wrapping_add(seq) as u8;
    }
    m
}

fn fill(m: &mut MemoryRegion, gen: u32, seq: u32) {
    m.as_mut_slice()
        .expect("local memory")
        .copy_from_slice(&message(gen, seq));
}

/// Client side: resolve, connect with `param`, establish. `ack_timeout`
/// (the exponent of 4.096 µs) sets the QP's transport timeout.
fn connect(
    ch: &EventChannel,
    dst: SocketAddr,
    with_srq: bool,
    ack_timeout: Option<u8>,
    param: &ConnParam,
) -> End {
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    if let Some(t) = ack_timeout {
        id.set_option(CmOption::AckTimeout(t)).unwrap();
    }
    id.resolve_addr(None, dst, Duration::from_secs(5)).unwrap();
    drop(expect_event(ch, CmEventType::AddrResolved));
    id.resolve_route(Duration::from_secs(5)).unwrap();
    drop(expect_event(ch, CmEventType::RouteResolved));
    let mut e = end_for(&id, with_srq);
    id.connect_qp(&e.qp, param).unwrap();
    // rxe refuses receives before INIT, where connecting put the QP; the
    // peer's first SEND waits for them through RNR retries.
    post_receives(&mut e, 64);
    connected(ch, &id, &e.qp, dst);
    e
}

/// Client side, once `id` connected `qp` to `dst`: the connection is
/// established, by the provider (`ESTABLISHED`) or, on a `CONNECT_RESPONSE`,
/// by `establish_qp`.
fn connected(ch: &EventChannel, id: &CmId, qp: &QueuePair, dst: SocketAddr) {
    let ev = next_event(ch, BOUND);
    match (ev.event_type(), ev.status()) {
        (CmEventType::ConnectResponse, 0) => {
            drop(ev);
            id.establish_qp(qp).unwrap();
        }
        (CmEventType::Established, 0) => {}
        _ => panic!("connecting to {dst}: {ev:?}"),
    }
}

/// Server side: the next connection request on `ch`, accepted.
fn accept(ch: &EventChannel, with_srq: bool) -> End {
    let req = expect_event(ch, CmEventType::ConnectRequest);
    let id = req.id().clone();
    drop(req);
    let mut e = end_for(&id, with_srq);
    if with_srq {
        post_receives(&mut e, 64);
    }
    id.accept_qp(&e.qp, &ConnParam::default()).unwrap();
    if !with_srq {
        post_receives(&mut e, 64);
    }
    drop(expect_event(ch, CmEventType::Established));
    e
}

fn listen(ch: &EventChannel) -> CmId {
    listen_on(ch, IpAddr::V4(common::ip()))
}

/// Listens on `ip`, on a port of the system's choice.
fn listen_on(ch: &EventChannel, ip: IpAddr) -> CmId {
    let l = ch.create_id(PortSpace::Tcp).unwrap();
    l.bind_addr(SocketAddr::new(ip, 0)).unwrap();
    l.listen(8).unwrap();
    l
}

/// The port guest b listens on (it puts it as `port`).
fn peer_port(sync: &Sync) -> u16 {
    sync.get("port", BOUND).trim().parse().unwrap()
}

/// Disconnects `e` and takes its `DISCONNECTED`.
fn disconnect(ch: &EventChannel, e: &End) {
    e.id.disconnect().unwrap();
    let ev = next_event(ch, BOUND);
    assert_eq!(ev.event_type(), CmEventType::Disconnected, "{ev:?}");
}

// ---------------------------------------------------------------------------
// The link cut (RoCE in `link_cut`, iWARP in `iwarp_link_cut`).

/// The two guests' parts of a link-cut test, a connection per phase (its
/// generation `gen` and what the test makes of it, `P`). Guest b listens
/// (`listen`), takes each phase's connection (`receive`: the connection,
/// and how many messages came) and puts that count as `received{gen}`;
/// guest a runs each phase (`send`, given the address to connect to; it
/// reads b's count with [`received`]). Both then meet, and each checks that
/// nothing is left over against `before`.
fn link_cut<P: Copy>(
    sync: &Sync,
    before: common::Baseline,
    phases: &[(u32, P)],
    peer: IpAddr,
    listen: impl FnOnce(&EventChannel) -> CmId,
    mut receive: impl FnMut(&EventChannel, u32) -> (End, u32),
    mut send: impl FnMut(&EventChannel, SocketAddr, u32, P),
) {
    let ch = EventChannel::new().unwrap();
    if role() == "b" {
        let listener = listen(&ch);
        sync.put("port", &listener.src_port().to_string());
        for &(gen, _) in phases {
            let (e, got) = receive(&ch, gen);
            sync.put(&format!("received{gen}"), &got.to_string());
            drop(e);
        }
        drop(listener);
    } else {
        let dst = SocketAddr::new(peer, peer_port(sync));
        for &(gen, phase) in phases {
            send(&ch, dst, gen, phase);
        }
    }
    drop(ch);
    sync.barrier("end");
    assert_back_to(before);
}

/// How many of a phase's sends succeeded.
fn succeeded(statuses: &[WcStatus]) -> u32 {
    statuses.iter().filter(|s| **s == WcStatus::Success).count() as u32
}

/// How many messages of phase `gen` of a link-cut test guest b received.
fn received(sync: &Sync, gen: u32) -> u32 {
    sync.get(&format!("received{gen}"), BOUND)
        .trim()
        .parse()
        .unwrap()
}

/// The name the test harness knows test `test` of the module at `module`
/// (its `module_path!()`) by, as `--exact` wants it: the path without the
/// crate's name.
fn exact_name(module: &str, test: &str) -> String {
    match module.split_once("::") {
        Some((_crate, path)) => format!("{path}::{test}"),
        None => test.to_string(),
    }
}

/// The victim process of the kill tests (guest b): the same test binary, run
/// again with `PAIR_VICTIM=GEN`, test `test` of the module at `module`.
fn spawn_victim(module: &str, test: &str, gen: u32) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &exact_name(module, test),
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("PAIR_VICTIM", gen.to_string())
        .spawn()
        .expect("spawn the victim")
}

// ---------------------------------------------------------------------------
// The numbered message flow of the kill tests (RoCE and iWARP) and the iWARP
// link test.

/// Receives each end of the kill test keeps posted (the victim's receive
/// queue, the survivor's SRQ).
const DEPTH: u32 = 64;
/// `wr_id`s: data SENDs count from 0, receives from `RECV_BASE`, credit
/// messages from `CREDIT_BASE`.
const RECV_BASE: u64 = 1_000_000;
const CREDIT_BASE: u64 = 1 << 32;
/// The sequence number of a credit message (it carries no data).
const NO_SEQ: u32 = u32::MAX;

/// What a completion of the kill test is, by its `wr_id` (a flushed
/// completion's opcode means nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wr {
    Data,
    Credit,
    Recv,
}

fn wr_kind(wr_id: u64) -> Wr {
    if wr_id >= CREDIT_BASE {
        Wr::Credit
    } else if wr_id >= RECV_BASE {
        Wr::Recv
    } else {
        Wr::Data
    }
}

/// Flow control for the kill test's two streams. Every message carries,
/// in bytes 8..12, how many of the peer's messages its sender has consumed
/// and posted a receive again for.
///
/// Over iWARP a sender must not send more than the receiver has receives
/// for: iWARP has no RNR, so a SEND that finds no receive makes siw
/// terminate the connection (`siw_proc_send`: DDP error "no buffer"), and a
/// send's completion only says TCP took the data, so completions cannot
/// pace the sender. A peer whose process stalls (its kernel still places
/// data into the receives it has) is then enough to break the connection.
/// So over iWARP (`on`) a data message goes only while fewer than
/// `DEPTH - 1` of ours are unconsumed by the peer's last count, and the
/// last slot takes a credit message (no data) when we have consumed
/// something since our last count: when both ends are out of data credits,
/// the credit messages move the counts on (neither end can wait for the
/// other). Over RoCE the transport does this (RNR NAKs, retried forever
/// with an RNR count of 7), so the counts are kept but not enforced.
#[derive(Debug)]
struct Flow {
    on: bool,
    /// Messages sent on this connection (data and credit).
    sent: u32,
    /// The peer's last count of our messages; `None` until its first
    /// message when we cannot know it has posted its receives (the passive
    /// side: the active side posts them as it connects).
    peer_consumed: Option<u32>,
    /// The peer's messages we consumed and posted a receive again for.
    consumed: u32,
    /// `consumed` as our last message carried it.
    advertised: u32,
}

impl Flow {
    fn new(peer_ready: bool) -> Flow {
        // RDMA_TEST_PAIR_NO_CREDITS=1 turns them off, to show what they
        // prevent (RELIABILITY.md: the siw connection then breaks).
        let on = over_iwarp() && std::env::var_os("RDMA_TEST_PAIR_NO_CREDITS").is_none();
        Flow {
            on,
            sent: 0,
            peer_consumed: (peer_ready || !on).then_some(0),
            consumed: 0,
            advertised: 0,
        }
    }

    /// Unconsumed messages of ours the peer may still hold, by its count.
    fn outstanding(&self) -> Option<u32> {
        self.peer_consumed.map(|p| self.sent - p)
    }

    /// What may go next: a data message (if `want_data`), a credit message,
    /// or nothing.
    fn next(&self, want_data: bool) -> Option<Wr> {
        if !self.on {
            return want_data.then_some(Wr::Data);
        }
        let out = self.outstanding()?;
        if want_data && out < DEPTH - 1 {
            Some(Wr::Data)
        } else if out < DEPTH && self.consumed > self.advertised {
            Some(Wr::Credit)
        } else {
            None
        }
    }

    /// Out of data credits (over iWARP only).
    fn blocked(&self) -> bool {
        self.on && self.next(true) != Some(Wr::Data)
    }

    /// A message of the peer's, consumed: its receive is posted again.
    fn took(&mut self, peer_count: u32) {
        self.consumed += 1;
        let p = self.peer_consumed.get_or_insert(0);
        *p = (*p).max(peer_count);
    }
}

/// Fills `m` with message `seq` of `gen` (`NO_SEQ`: a credit message),
/// with the flow's count, and posts it; returns whether the post was taken.
fn send_next(
    e: &mut End,
    flow: &mut Flow,
    kind: Wr,
    gen: u32,
    seq: u32,
    mut m: MemoryRegion,
    free: &mut Vec<MemoryRegion>,
) -> bool {
    let (seq, wr_id) = match kind {
        Wr::Data => (seq, u64::from(seq)),
        _ => (NO_SEQ, CREDIT_BASE + u64::from(flow.sent)),
    };
    fill(&mut m, gen, seq);
    m.as_mut_slice().expect("local memory")[8..12].copy_from_slice(&flow.consumed.to_le_bytes());
    match e.qp.post_send(SendWr::send(wr_id, m)) {
        Ok(()) => {
            flow.sent += 1;
            flow.advertised = flow.consumed;
            true
        }
        // The QP already went to the error state: no more posts.
        Err(p) => {
            eprintln!("[{}] post refused: {}", role(), p.error);
            free.extend(p.returned.into_iter().filter_map(|(_, b)| b.into_one()));
            false
        }
    }
}

/// Checks a received message: generation `gen`, the next data message
/// (`*next`) or a credit message; returns the peer's count it carries.
fn check_received(data: &[u8], gen: u32, next: &mut u32) -> u32 {
    assert_eq!(data.len(), MSG);
    let word = |at: usize| u32::from_le_bytes(data[at..at + 4].try_into().unwrap());
    let seq = if word(4) == NO_SEQ { NO_SEQ } else { *next };
    let want = message(gen, seq);
    assert!(
        data[..8] == want[..8] && data[12..] == want[12..],
        "[{}] message {seq} of generation {gen}: got generation {} message {}",
        role(),
        word(0),
        word(4)
    );
    if seq != NO_SEQ {
        *next += 1;
    }
    word(8)
}

/// Whether this is the iWARP run of a test (`..._iwarp`).
fn over_iwarp() -> bool {
    std::env::var("PAIR_SYNC_TAG").is_ok_and(|t| t == "iwarp")
}

mod iwarp_link_cut;
mod kill;
mod link_cut;
mod ud;
