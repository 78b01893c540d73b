//! Faults between two machines: a peer process killed mid-transfer, a link
//! cut mid-transfer. These tests run only under `ci/vm pair` (`ci/vm pair --
//! ci/device-tests BIN`): every test runs in both guests at once, guest `a` and
//! guest `b` (`RDMA_VM_ROLE`) playing their part; the two meet through
//! files in `RDMA_VM_SYNC_DIR`, never through sleeps, and every wait has a
//! bound it states. Each test ends by checking that nothing was lost: every
//! request accounted for by a completion, `rdma resource show` and the
//! process's open descriptors back to where they were before it,
//! `rdma::teardown_failures()` zero.

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

/// (pd, cq, qp, cm_id, mr) of this guest's devices in `rdma resource show`,
/// and this process's open descriptors.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct Baseline {
    resources: [u64; 5],
    fds: usize,
}

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

fn baseline() -> Baseline {
    warm_up();
    let resources = common::resource_counts();
    let fds = common::open_fds();
    Baseline { resources, fds }
}

fn assert_back_to(before: Baseline) {
    let now = baseline();
    assert_eq!(
        now, before,
        "(pd, cq, qp, cm_id, mr) and open fds are back to the baseline"
    );
    assert_eq!(rdma::teardown_failures(), 0, "no destroy failed in Drop");
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
    let ev = next_event(ch, BOUND);
    match (ev.event_type(), ev.status()) {
        (CmEventType::ConnectResponse, 0) => {
            drop(ev);
            id.establish_qp(&e.qp).unwrap();
        }
        (CmEventType::Established, 0) => {}
        _ => panic!("connecting to {dst}: {ev:?}"),
    }
    e
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
    let l = ch.create_id(PortSpace::Tcp).unwrap();
    l.bind_addr(SocketAddr::new(IpAddr::V4(common::ip()), 0))
        .unwrap();
    l.listen(8).unwrap();
    l
}

// ---------------------------------------------------------------------------
// A peer process SIGKILLed mid-transfer.

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

/// The victim process (guest b): the same test binary, run again with
/// `PAIR_VICTIM=GEN`.
fn spawn_victim(test: &str, gen: u32) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            test,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("PAIR_VICTIM", gen.to_string())
        .spawn()
        .expect("spawn the victim")
}

/// Sends `signal` (`STOP`, `CONT`) to `child`.
fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([format!("-{signal}"), child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {}: {status}", child.id());
}

/// Streams SENDs to the survivor, 16 in flight, checking and reposting
/// receives. In generation 1 it never stops (it is stopped, resumed, then
/// killed); in generation 2 it sends `CLEAN_COUNT` messages, waits for
/// every completion and disconnects. Fails after `BOUND` without progress.
fn victim(sync: &Sync, gen: u32) {
    const CLEAN_COUNT: u32 = 300;
    let port: u16 = sync.get("port", BOUND).trim().parse().unwrap();
    let ch = EventChannel::new().unwrap();
    let mut e = connect(
        &ch,
        SocketAddr::new(peer_ip(), port),
        false,
        None,
        &ConnParam::default(),
    );
    // The survivor posted its receives before it accepted.
    let mut flow = Flow::new(true);
    let mut free: Vec<MemoryRegion> = e.pd.alloc_mr(16 * MSG, LW).unwrap().chunks(MSG).unwrap();
    let (mut seq, mut done, mut received, mut announced) = (0u32, 0u32, 0u32, false);
    // Messages sent when the last data message went (generation 2).
    let mut sent_with_last = u32::MAX;
    let mut out = Vec::new();
    let mut deadline = Instant::now() + BOUND;
    loop {
        while let Some(m) = free.pop() {
            let want_data = !(gen == 2 && seq == CLEAN_COUNT);
            let Some(kind) = flow.next(want_data) else {
                free.push(m);
                break;
            };
            assert!(send_next(&mut e, &mut flow, kind, gen, seq, m, &mut free));
            if kind == Wr::Data {
                seq += 1;
                if gen == 2 && seq == CLEAN_COUNT {
                    sent_with_last = flow.sent;
                }
            }
        }
        e.cq.poll(&mut out, 32).expect("poll");
        for mut c in out.drain(..) {
            assert!(c.is_success(), "victim: {c:?}");
            deadline = Instant::now() + BOUND;
            let m = c.take_buffers().into_one().expect("one region");
            match wr_kind(c.wr_id) {
                Wr::Data => {
                    done += 1;
                    free.push(m);
                }
                Wr::Credit => free.push(m),
                Wr::Recv => {
                    let count = check_received(&m.to_vec(), 100 + gen, &mut received);
                    repost(&mut e, c.wr_id, m);
                    flow.took(count);
                }
            }
        }
        if gen == 1 && done >= 200 && !announced {
            sync.put("victim1.transferring", "");
            announced = true;
        }
        // Over iWARP a completion says only that TCP took the message, and
        // a disconnect resets the connection when this end still has
        // unread data (`tcp_close`), losing what TCP held (measured: 289 of
        // 300 arrived): it waits for the survivor's count to cover every
        // data message first.
        if gen == 2
            && done == CLEAN_COUNT
            && (!flow.on || flow.peer_consumed.is_some_and(|p| p >= sent_with_last))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "victim {gen}: no progress for {BOUND:?} ({done} sent, {received} received, {flow:?})"
        );
    }
    e.id.disconnect().unwrap();
    let ev = next_event(&ch, BOUND);
    assert_eq!(ev.event_type(), CmEventType::Disconnected, "{ev:?}");
}

/// What the survivor saw of one connection.
#[derive(Default, Debug)]
struct Seen {
    received: u32,
    sends_posted: u64,
    sends_ok: u64,
    sends_failed: Vec<WcStatus>,
    /// Sends taken back with `QueuePair::reset` (over iWARP; see
    /// `reclaim_iwarp_sends`).
    sends_reclaimed: u64,
    /// The send posted once the QP was in the error state, or whether
    /// that post was refused.
    after_error: Option<u64>,
    refused_in_error: bool,
    credits_posted: u64,
    credits_done: u64,
    disconnected: bool,
    /// Messages received when the survivor found itself blocked by the
    /// stopped victim (the stall of generation 1), and when it saw the
    /// stream resume.
    blocked_at: Option<u32>,
    resumed_at: Option<u32>,
    /// From `survivor1.resumed` (after which b kills the victim) to the
    /// `DISCONNECTED` event: the kill and its detection, plus b's wait on
    /// the sync file.
    resumed_to_disconnected: Option<Duration>,
}

/// Takes one of the survivor's completions: a receive is checked and
/// posted again, a send's buffer goes back to `free`. Returns false when
/// a send failed (no more posts then).
fn survivor_takes(
    e: &mut End,
    flow: &mut Flow,
    seen: &mut Seen,
    free: &mut Vec<MemoryRegion>,
    gen: u32,
    mut c: rdma::Completion,
) -> bool {
    let m = c.take_buffers().into_one().expect("one region");
    let kind = wr_kind(c.wr_id);
    if kind == Wr::Recv {
        // An SRQ receive: flushes do not reach an SRQ's receives.
        assert!(c.is_success(), "survivor receive: {c:?}");
        let count = check_received(&m.to_vec(), gen, &mut seen.received);
        repost(e, c.wr_id, m);
        flow.took(count);
        return true;
    }
    free.push(m);
    if kind == Wr::Data && c.is_success() {
        assert!(
            seen.after_error.is_none_or(|a| c.wr_id < a),
            "a send posted in the error state succeeded: {c:?}"
        );
    }
    match (kind, c.is_success()) {
        (Wr::Data, true) => seen.sends_ok += 1,
        (Wr::Data, false) => seen.sends_failed.push(c.status),
        _ => seen.credits_done += 1,
    }
    if c.is_success() {
        return true;
    }
    // RoCE: the retries ran out, or the QP went to the error state and
    // flushed the rest. iWARP (siw): the send that was on the wire when
    // TCP failed ends in LOC_QP_OP_ERR (siw's transmit error path), the
    // rest are flushed.
    assert!(
        matches!(c.status, WcStatus::WrFlushErr | WcStatus::RetryExcErr)
            || (over_iwarp() && c.status == WcStatus::LocQpOpErr),
        "survivor send: {c:?}"
    );
    false
}

/// Survivor (guest a): the next connection, on a QP with an SRQ; it
/// receives the victim's stream (checking each message) and streams SENDs
/// back, until the connection is gone and every one of its sends is
/// accounted for. With `stall` (generation 1) it also reports, once guest b
/// has stopped the victim (`stopped1`), when it can send no more
/// (`survivor1.blocked`: out of credits over iWARP; over RoCE, `DEPTH` of
/// its sends acknowledged beyond the victim's count, so the victim's
/// receive queue is full), and when `DEPTH` more messages have arrived
/// after that (`survivor1.resumed`). Fails after `BOUND` without progress.
fn survive(sync: &Sync, ch: &EventChannel, gen: u32, stall: bool) -> (End, Seen) {
    let mut e = accept(ch, true);
    // Over iWARP: nothing until the victim's first message shows its
    // receives are posted.
    let mut flow = Flow::new(false);
    let mut free: Vec<MemoryRegion> = e.pd.alloc_mr(16 * MSG, LW).unwrap().chunks(MSG).unwrap();
    let mut seen = Seen::default();
    let mut out = Vec::new();
    let mut deadline = Instant::now() + BOUND;
    let mut posting = true;
    let stopped = sync.path("stopped1");
    let mut resumed: Option<Instant> = None;
    while !(seen.disconnected
        && seen.sends_ok + seen.sends_failed.len() as u64 + seen.sends_reclaimed
            == seen.sends_posted
        && seen.credits_done == seen.credits_posted)
    {
        while posting {
            let Some(kind) = flow.next(true) else { break };
            let Some(m) = free.pop() else { break };
            posting = send_next(
                &mut e,
                &mut flow,
                kind,
                100 + gen,
                seen.sends_posted as u32,
                m,
                &mut free,
            );
            match (posting, kind) {
                (true, Wr::Data) => seen.sends_posted += 1,
                (true, _) => seen.credits_posted += 1,
                (false, _) => {}
            }
        }
        e.cq.poll(&mut out, 64).expect("poll");
        for c in out.drain(..) {
            deadline = Instant::now() + BOUND;
            posting &= survivor_takes(&mut e, &mut flow, &mut seen, &mut free, gen, c);
        }
        if stall && seen.blocked_at.is_none() {
            // Over RoCE: every receive the victim had posted by its last
            // count holds one of our messages.
            let full = if flow.on {
                flow.blocked()
            } else {
                flow.peer_consumed
                    .is_some_and(|p| seen.sends_ok >= u64::from(p + DEPTH))
            };
            if full && stopped.exists() {
                eprintln!("survivor: blocked by the stopped victim: {seen:?} {flow:?}");
                seen.blocked_at = Some(seen.received);
                sync.put("survivor1.blocked", "");
            }
        }
        if let (Some(b), None) = (seen.blocked_at, seen.resumed_at) {
            if seen.received >= b + DEPTH {
                seen.resumed_at = Some(seen.received);
                sync.put("survivor1.resumed", "");
                resumed = Some(Instant::now());
            }
        }
        if let Some(ev) = ch.try_get_event().expect("rdma_get_cm_event") {
            deadline = Instant::now() + BOUND;
            eprintln!("survivor: event {} status {}", ev.event_type(), ev.status());
            match ev.event_type() {
                CmEventType::Disconnected => {
                    drop(ev);
                    seen.disconnected = true;
                    seen.resumed_to_disconnected = resumed.map(|t| t.elapsed());
                    posting = false;
                    // Our half of the disconnect. It moves only a QP that
                    // librdmacm made to the error state; ours stays in RTS,
                    // and on rxe its sends to the dead peer would retry
                    // forever (a retry count of 7 is "forever" there): the
                    // error state flushes them.
                    let _ = e.id.disconnect();
                    e.qp.to_error().expect("QP to the error state");
                    // One send more, on the QP in the error state: it comes
                    // back flushed (over iWARP: reclaimed, below) or
                    // refused, never sent. So something is in flight at the
                    // death even when the last acknowledgements came with
                    // the DISCONNECTED event (seen once on rxe).
                    if let Some(m) = free.pop() {
                        let seq = seen.sends_posted;
                        if send_next(
                            &mut e,
                            &mut flow,
                            Wr::Data,
                            100 + gen,
                            seq as u32,
                            m,
                            &mut free,
                        ) {
                            seen.sends_posted += 1;
                            seen.after_error = Some(seq);
                        } else {
                            seen.refused_in_error = true;
                        }
                    }
                    if over_iwarp() {
                        reclaim_iwarp_sends(&mut e, &mut flow, &mut seen, &mut free, gen);
                    }
                }
                CmEventType::TimewaitExit => {}
                t => panic!("survivor: unexpected {t}"),
            }
        }
        assert!(
            Instant::now() < deadline,
            "survivor {gen}: no progress for {BOUND:?}: {seen:?} {flow:?}"
        );
    }
    assert_eq!(free.len(), 16, "every send buffer is back");
    (e, seen)
}

/// Over iWARP (siw), once the connection is gone and the QP is in the
/// error state: what the CQ holds now is taken, and the sends still
/// without a completion are taken back with `QueuePair::reset`. siw never
/// completes them: libsiw writes a send into the send queue it shares with
/// the kernel, and the kernel flushes that queue only at its own
/// transitions (the socket's close, RTS to ERROR); a send written after
/// the socket closed (the survivor learns it from the CM event, later)
/// stays there, and its doorbell, on a QP in ERROR, flushes nothing
/// (`siw_post_send` with no kernel request). Measured: 2 to 12 such sends
/// per connection, pending for the whole 60 s bound, before this.
fn reclaim_iwarp_sends(
    e: &mut End,
    flow: &mut Flow,
    seen: &mut Seen,
    free: &mut Vec<MemoryRegion>,
    gen: u32,
) {
    let mut out = Vec::new();
    loop {
        e.cq.poll(&mut out, 64).expect("poll");
        if out.is_empty() {
            break;
        }
        for c in out.drain(..) {
            survivor_takes(e, flow, seen, free, gen, c);
        }
    }
    for (wr_id, buffers) in e.qp.reset().expect("QP to RESET") {
        match wr_kind(wr_id) {
            Wr::Data => seen.sends_reclaimed += 1,
            Wr::Credit => seen.credits_done += 1,
            Wr::Recv => panic!("a receive of the QP's own: it has an SRQ"),
        }
        free.extend(buffers.into_one());
    }
}

#[test]
#[ignore = "needs two guests (ci/vm pair)"]
fn cm_rc_srq_peer_killed_mid_transfer() {
    const TEST: &str = "cm_rc_srq_peer_killed_mid_transfer";
    let sync = Sync::new(TEST);
    if let Ok(gen) = std::env::var("PAIR_VICTIM") {
        victim(&sync, gen.parse().unwrap());
        return;
    }
    if role() == "b" {
        let before = baseline();
        // Generation 1: stopped (SIGSTOP) once it is streaming, until the
        // survivor can send no more; resumed until the stream has moved
        // on; then killed.
        let mut child = spawn_victim(TEST, 1);
        sync.get("victim1.transferring", BOUND);
        signal(&child, "STOP");
        sync.put("stopped1", "");
        sync.get("survivor1.blocked", BOUND);
        signal(&child, "CONT");
        sync.get("survivor1.resumed", BOUND);
        child.kill().expect("SIGKILL the victim");
        let status = child.wait().unwrap();
        assert!(!status.success(), "{status:?}");
        sync.put("killed1", "");
        // Generation 2: the restarted peer, which ends cleanly.
        sync.get("survivor1.done", BOUND);
        let mut child = spawn_victim(TEST, 2);
        let status = child.wait().unwrap();
        assert!(status.success(), "the restarted victim failed: {status:?}");
        sync.get("survivor2.done", BOUND);
        sync.barrier("end");
        // The kernel cleaned up after the killed process.
        assert_back_to(before);
        return;
    }
    let before = baseline();
    {
        let ch = EventChannel::new().unwrap();
        let listener = listen(&ch);
        sync.put("port", &listener.src_port().to_string());

        let t = Instant::now();
        let (e1, seen1) = survive(&sync, &ch, 1, true);
        eprintln!("generation 1: {seen1:?} in {:?}", t.elapsed());
        sync.get("killed1", BOUND);
        // The stream went on after the stall, and the victim was killed
        // after that. Over RC on RoCE a send completes once the responder
        // acknowledged it, so the 200 sends the victim had completed
        // before the stall all arrived; over iWARP (siw) it completes once
        // TCP took the data, and what the dead process's socket still held
        // is lost with it.
        let resumed = seen1
            .resumed_at
            .expect("the stream resumed after the stall");
        assert!(seen1.received >= resumed, "{seen1:?}");
        if !over_iwarp() {
            assert!(seen1.received >= 200, "{seen1:?}");
        }
        // The survivor's stream ends in sends that did not go: flushed or
        // retries exceeded (RoCE), flushed or LOC_QP_OP_ERR or taken back
        // with `reset` (iWARP, whose send completions say only that TCP
        // took the data), or refused. There is always one: if nothing was
        // in flight when the death was seen, a send is posted on the QP in
        // the error state. Each failure's status is checked as it comes.
        assert!(
            !seen1.sends_failed.is_empty() || seen1.sends_reclaimed > 0 || seen1.refused_in_error,
            "the survivor's stream ended in sends that did not go: {seen1:?}"
        );
        let srq = e1.srq.as_ref().unwrap();
        assert_eq!(
            srq.in_flight(),
            DEPTH as usize,
            "every consumed receive was reposted"
        );
        // Teardown order 1: id, QP, SRQ, CQ, PD.
        let End {
            qp,
            srq,
            cq,
            pd,
            id,
        } = e1;
        drop(id);
        drop(qp);
        drop(srq);
        drop(cq);
        drop(pd);
        sync.put("survivor1.done", "");

        let t = Instant::now();
        let (e2, seen2) = survive(&sync, &ch, 2, false);
        eprintln!("generation 2: {seen2:?} in {:?}", t.elapsed());
        assert_eq!(seen2.received, 300, "{seen2:?}");
        // Teardown order 2: PD, CQ, SRQ, QP, id (children keep parents).
        let End {
            qp,
            srq,
            cq,
            pd,
            id,
        } = e2;
        drop(pd);
        drop(cq);
        drop(srq);
        drop(qp);
        drop(id);
        drop(listener);
        drop(ch);
        sync.put("survivor2.done", "");
    }
    sync.barrier("end");
    assert_back_to(before);
}

/// Whether this is the iWARP run of a test (`..._iwarp`).
fn over_iwarp() -> bool {
    std::env::var("PAIR_SYNC_TAG").is_ok_and(|t| t == "iwarp")
}

/// The same test over siw (the pair's second link, iWARP): this binary's
/// `cm_rc_srq_peer_killed_mid_transfer` run again in each guest with the
/// iWARP device and addresses in place of the RoCE ones, its rendezvous
/// keys in a folder of their own. Its victims inherit the same settings.
#[test]
#[ignore = "needs two guests (ci/vm pair) with siw"]
fn cm_rc_srq_peer_killed_mid_transfer_iwarp() {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| panic!("{name} is set under ci/vm pair with siw"))
    };
    let sync_dir = PathBuf::from(var("RDMA_VM_SYNC_DIR")).join("iwarp");
    std::fs::create_dir_all(&sync_dir).expect("the iWARP sync folder");
    let status = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "cm_rc_srq_peer_killed_mid_transfer",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("RDMA_TEST_DEVICE", var("RDMA_TEST_IWARP_DEVICE"))
        .env("RDMA_TEST_IP", var("RDMA_TEST_IWARP_IP"))
        .env("RDMA_TEST_PEER_IP", var("RDMA_TEST_IWARP_PEER_IP"))
        .env("PAIR_SYNC_TAG", "iwarp")
        .status()
        .expect("run the test over siw");
    assert!(status.success(), "over siw: {status}");
}

// ---------------------------------------------------------------------------
// The link down mid-transfer, shorter and longer than the retry budget.

/// What the sender saw across one cut.
#[derive(Debug)]
struct Cut {
    /// Completion statuses, in posting order (all of them).
    statuses: Vec<WcStatus>,
    /// SENDs still without a completion when the link was asked back up.
    pending_at_up: usize,
    /// From asking for the cut to asking for the link back.
    down_for: Duration,
}

/// The sender streams SENDs, 16 in flight, while the receiver's links go
/// down (`ci/lib/pair-link`, in a thread); once they are down it stops
/// posting, so the last window is caught by the cut. `short`: the link is
/// asked back at once; otherwise only after a completion failed (the
/// retries ran out). Then every request's completion is collected.
fn send_across_a_cut(e: &mut End, gen: u32, short: bool) -> Cut {
    let mut free: Vec<MemoryRegion> = e.pd.alloc_mr(16 * MSG, LW).unwrap().chunks(MSG).unwrap();
    let mut statuses = Vec::new();
    let mut out = Vec::new();
    let mut posted = 0u32;
    let _restore = RestoreLink;
    let asked = Instant::now();
    let mut down = Some(std::thread::spawn(|| link("down", "b")));
    let mut posting = true;
    let mut up: Option<(usize, Duration)> = None;
    let deadline = Instant::now() + BOUND;
    while posting || statuses.len() < posted as usize {
        if posting {
            while let Some(mut m) = free.pop() {
                fill(&mut m, gen, posted);
                e.qp.post_send(SendWr::send(u64::from(posted), m))
                    .map_err(|p| p.drop_buffers())
                    .expect("post send");
                posted += 1;
            }
        }
        if down.as_ref().is_some_and(|h| h.is_finished()) {
            down.take().unwrap().join().expect("pair-link down");
            posting = false;
            if short {
                up = Some((posted as usize - statuses.len(), asked.elapsed()));
                link("up", "b");
            }
        }
        e.cq.poll(&mut out, 64).expect("poll");
        for mut c in out.drain(..) {
            if c.wr_id >= 1_000_000 {
                // Our own receives: flushed once the QP is in error.
                assert_eq!(c.status, WcStatus::WrFlushErr, "{c:?}");
                continue;
            }
            assert_eq!(c.wr_id, statuses.len() as u64, "in order: {c:?}");
            if !c.is_success() && up.is_none() {
                // With a short retry budget the failure can come before
                // pair-link has returned (QEMU cut the link first).
                assert!(!short, "a send failed across a short cut: {c:?}");
                if let Some(h) = down.take() {
                    h.join().expect("pair-link down");
                    posting = false;
                }
                up = Some((posted as usize - statuses.len(), asked.elapsed()));
                link("up", "b");
            }
            statuses.push(c.status);
            free.extend(c.take_buffers().into_one());
        }
        assert!(
            Instant::now() < deadline,
            "{} of {posted} completions after {BOUND:?}",
            statuses.len()
        );
    }
    let (pending_at_up, down_for) = match up {
        Some(u) => u,
        None => {
            link("up", "b");
            (0, asked.elapsed())
        }
    };
    Cut {
        statuses,
        pending_at_up,
        down_for,
    }
}

/// The receiver: takes the messages of one connection until it is
/// disconnected; checks they are the first ones of the sender, in order.
fn receive_until_disconnected(ch: &EventChannel, e: &mut End, gen: u32) -> u32 {
    let mut received = 0;
    let mut out = Vec::new();
    let deadline = Instant::now() + BOUND;
    loop {
        e.cq.poll(&mut out, 64).expect("poll");
        for mut c in out.drain(..) {
            let m = c.take_buffers().into_one().expect("one region");
            if c.status == WcStatus::WrFlushErr {
                continue; // our receives, flushed by our disconnect
            }
            assert!(c.is_success(), "receiver: {c:?}");
            assert_eq!(m.to_vec(), message(gen, received), "message {received}");
            received += 1;
            repost(e, c.wr_id, m);
        }
        if let Some(ev) = ch.try_get_event().expect("rdma_get_cm_event") {
            eprintln!("receiver: event {} status {}", ev.event_type(), ev.status());
            if ev.event_type() == CmEventType::Disconnected {
                drop(ev);
                let _ = e.id.disconnect();
                // Whatever arrived before the disconnect is in the CQ.
                e.cq.poll(&mut out, 256).expect("poll");
                for mut c in out.drain(..) {
                    let m = c.take_buffers().into_one().expect("one region");
                    if c.is_success() {
                        assert_eq!(m.to_vec(), message(gen, received), "message {received}");
                        received += 1;
                    }
                }
                return received;
            }
        }
        assert!(
            Instant::now() < deadline,
            "receiver {gen}: no disconnect after {BOUND:?}"
        );
    }
}

#[test]
#[ignore = "needs two guests (ci/vm pair)"]
fn cm_rc_link_down_shorter_and_longer_than_the_retry_timeout() {
    const TEST: &str = "cm_rc_link_down_shorter_and_longer_than_the_retry_timeout";
    const N: usize = 64;
    let sync = Sync::new(TEST);
    let before = baseline();
    // Phase 1: 6 retries of 4.096 µs * 2^19 (2.1 s) each, about 15 s in
    // all, against a cut of a second or two. Phase 2: 6 retries of
    // 4.096 µs * 2^12 (17 ms), about 0.12 s in all, against a cut held
    // until the sender saw the retries exhausted. Phase 3: the link back,
    // a new connection carries everything. Not 7 retries: rxe takes a
    // transport retry count of 7 as "retry forever" (as the RNR count's 7
    // is), so a cut would never end in an error (measured on 6.1: the
    // sends stayed pending for the whole 60 s bound).
    let phases = [(1u32, true, 19u8), (2, false, 12), (3, true, 14)];
    if role() == "b" {
        let ch = EventChannel::new().unwrap();
        let listener = listen(&ch);
        sync.put("port", &listener.src_port().to_string());
        for (gen, _, _) in phases {
            let mut e = accept(&ch, false);
            let got = receive_until_disconnected(&ch, &mut e, gen);
            sync.put(&format!("received{gen}"), &got.to_string());
            drop(e);
        }
        drop(listener);
        drop(ch);
        sync.barrier("end");
        assert_back_to(before);
        return;
    }
    let port: u16 = sync.get("port", BOUND).trim().parse().unwrap();
    let dst = SocketAddr::new(peer_ip(), port);
    let ch = EventChannel::new().unwrap();
    for (gen, short, timeout) in phases {
        let param = ConnParam {
            retry_count: 6,
            ..ConnParam::default()
        };
        let mut e = connect(&ch, dst, false, Some(timeout), &param);
        let cut = if gen == 3 {
            // No cut: the link is back and works.
            let bufs = e.pd.alloc_mr(N * MSG, LW).unwrap().chunks(MSG).unwrap();
            for (seq, mut m) in bufs.into_iter().enumerate() {
                fill(&mut m, gen, seq as u32);
                e.qp.post_send(SendWr::send(seq as u64, m))
                    .map_err(|p| p.drop_buffers())
                    .unwrap();
            }
            Cut {
                statuses: common_wait(&e.cq, N),
                pending_at_up: 0,
                down_for: Duration::ZERO,
            }
        } else {
            send_across_a_cut(&mut e, gen, short)
        };
        let posted = cut.statuses.len() as u32;
        let ok = cut
            .statuses
            .iter()
            .filter(|s| **s == WcStatus::Success)
            .count() as u32;
        eprintln!(
            "phase {gen}: link down for {:?}, {} pending then; {ok} of {posted} sent; failures {:?}",
            cut.down_for,
            cut.pending_at_up,
            cut.statuses.iter().filter(|s| **s != WcStatus::Success).collect::<Vec<_>>()
        );
        if short {
            assert_eq!(
                ok, posted,
                "a cut shorter than the retry budget loses nothing: {cut:?}"
            );
            if gen == 1 {
                assert!(
                    cut.pending_at_up > 0,
                    "the cut caught sends in flight: {cut:?}"
                );
            }
        } else {
            // The first failure is the exhausted retries, everything after it
            // is flushed; nothing is missing.
            let first = cut
                .statuses
                .iter()
                .position(|s| *s != WcStatus::Success)
                .unwrap();
            assert_eq!(cut.statuses[first], WcStatus::RetryExcErr, "{cut:?}");
            assert!(
                cut.statuses[first + 1..]
                    .iter()
                    .all(|s| *s == WcStatus::WrFlushErr),
                "{cut:?}"
            );
        }
        e.id.disconnect().unwrap();
        let ev = next_event(&ch, BOUND);
        assert_eq!(ev.event_type(), CmEventType::Disconnected, "{ev:?}");
        drop(ev);
        let got: u32 = sync
            .get(&format!("received{gen}"), BOUND)
            .trim()
            .parse()
            .unwrap();
        // Delivered but unacknowledged messages are possible, lost ones are not.
        assert!(
            got >= ok && got <= posted,
            "phase {gen}: receiver got {got}, sender {ok} of {posted} acked"
        );
        if short {
            assert_eq!(got, posted);
        }
        drop(e);
    }
    drop(ch);
    sync.barrier("end");
    assert_back_to(before);
}

fn common_wait(cq: &CompletionQueue, n: usize) -> Vec<WcStatus> {
    common::wait(cq, n).into_iter().map(|c| c.status).collect()
}

// ---------------------------------------------------------------------------
// UD: the peer process killed, then restarted under a new QP number.

const UD_QKEY: u32 = 0x5eed_0001;
const GRH: usize = 40;

/// A UD QP on the test device, ready to send, with `n` receives posted.
struct UdEnd {
    qp: QueuePair,
    ah: rdma::AddressHandle,
    cq: CompletionQueue,
    pd: ProtectionDomain,
    ctx: rdma::Context,
}

fn ud_end(n: usize) -> UdEnd {
    let ctx = common::open(&common::device_name());
    let gid_index = common::gid_index() as u8;
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None, 0).unwrap();
    let mut qp = pd
        .qp_builder(QpType::Ud, &cq, &cq)
        .max_send_wr(32)
        .max_recv_wr(n as u32)
        .build()
        .unwrap();
    let mut init = rdma::InitAttr::new(1);
    init.qkey = UD_QKEY;
    qp.to_init(&init).unwrap();
    qp.to_rtr(None).unwrap();
    qp.to_rts(&rdma::RtsAttr::new(0)).unwrap();
    let peer = match peer_ip() {
        IpAddr::V4(v4) => rdma::Gid::from(v4),
        IpAddr::V6(v6) => rdma::Gid::from(v6),
    };
    let ah = pd
        .create_ah(&rdma::AhAttr::global(1, peer, gid_index))
        .unwrap();
    let bufs = pd
        .alloc_mr(n * (MSG + GRH), LW)
        .unwrap()
        .chunks(MSG + GRH)
        .unwrap();
    qp.post_recv_batch(
        bufs.into_iter()
            .enumerate()
            .map(|(i, m)| (1_000_000 + i as u64, m.into())),
    )
    .map_err(|p| p.drop_buffers())
    .unwrap();
    UdEnd {
        qp,
        ah,
        cq,
        pd,
        ctx,
    }
}

/// What one UD end saw: datagrams received per generation (checked whole
/// and in increasing order), sends posted and completed.
#[derive(Default, Debug)]
struct UdSeen {
    received: u32,
    last_seq: Option<u32>,
    posted: u64,
    completed: u64,
}

/// One round of a UD stream: keeps `window` sends in flight to `qpn`,
/// takes every completion (sends must succeed: UD has no acknowledgements),
/// checks each datagram (its generation `want_gen`, increasing sequence),
/// reposts receives. Returns when `done(seen)` or fails after BOUND.
fn ud_round(
    e: &mut UdEnd,
    qpn: u32,
    send_gen: u32,
    want_gen: Option<u32>,
    seen: &mut UdSeen,
    free: &mut Vec<MemoryRegion>,
    done: &dyn Fn(&UdSeen) -> bool,
) {
    let mut out = Vec::new();
    let deadline = Instant::now() + BOUND;
    while !done(seen) {
        if let Some(mut m) = free.pop() {
            fill(&mut m, send_gen, seen.posted as u32);
            e.qp.post_send(SendWr::send(seen.posted, m).ud(&e.ah, qpn, UD_QKEY))
                .map_err(|p| p.drop_buffers())
                .expect("post UD send");
            seen.posted += 1;
        }
        e.cq.poll(&mut out, 32).expect("poll");
        for mut c in out.drain(..) {
            assert!(c.is_success(), "UD completions succeed, peer or not: {c:?}");
            let m = c.take_buffers().into_one().expect("one region");
            if c.wr_id < 1_000_000 {
                seen.completed += 1;
                free.push(m);
                continue;
            }
            let data = m.to_vec();
            let gen = u32::from_le_bytes(data[GRH..GRH + 4].try_into().unwrap());
            let seq = u32::from_le_bytes(data[GRH + 4..GRH + 8].try_into().unwrap());
            assert_eq!(
                &data[GRH..],
                &message(gen, seq)[..],
                "datagram {gen}/{seq} whole"
            );
            if let Some(w) = want_gen {
                assert_eq!(gen, w, "datagram of generation {w}");
            }
            assert!(
                seen.last_seq.is_none_or(|l| seq > l),
                "increasing: {seq} after {:?}",
                seen.last_seq
            );
            seen.last_seq = Some(seq);
            seen.received += 1;
            e.qp.post_recv(c.wr_id, m)
                .map_err(|p| p.drop_buffers())
                .expect("repost receive");
        }
        assert!(
            Instant::now() < deadline,
            "UD round not done after {BOUND:?}: {seen:?}"
        );
    }
}

fn ud_victim(sync: &Sync, gen: u32) {
    let mut e = ud_end(64);
    sync.put(&format!("victim{gen}.qpn"), &e.qp.qp_num().to_string());
    let survivor: u32 = sync.get("survivor.qpn", BOUND).trim().parse().unwrap();
    if gen == 2 {
        // Not while the survivor still streams to the dead generation 1 and
        // takes only its datagrams (seen once: a generation-2 datagram
        // arrived in that round).
        sync.get("survivor.ready2", BOUND);
    }
    let mut free = e.pd.alloc_mr(16 * MSG, LW).unwrap().chunks(MSG).unwrap();
    let mut seen = UdSeen::default();
    // Until 100 datagrams went each way; generation 1 then goes on until
    // killed, generation 2 stops. Datagrams can be dropped (UD), and the
    // two ends' streams do not keep pace: each generation goes on until the
    // survivor says it has its 100. (Generation 1 used to say it was
    // transferring, and so get killed, once it alone had its 100: the
    // survivor, with 89, then waited for more from a dead peer.)
    let got = sync.path(&format!("survivor.got{gen}"));
    ud_round(
        &mut e,
        survivor,
        10 + gen,
        Some(100 + gen),
        &mut seen,
        &mut free,
        &|s| s.received >= 100 && s.completed >= 100 && got.exists(),
    );
    if gen == 1 {
        sync.put("victim1.transferring", "");
        ud_round(
            &mut e,
            survivor,
            11,
            Some(101),
            &mut seen,
            &mut free,
            &|_| false,
        );
    }
    sync.put("victim2.finished", "");
}

#[test]
#[ignore = "needs two guests (ci/vm pair)"]
fn ud_peer_killed_and_restarted() {
    const TEST: &str = "ud_peer_killed_and_restarted";
    let sync = Sync::new(TEST);
    if let Ok(gen) = std::env::var("PAIR_VICTIM") {
        ud_victim(&sync, gen.parse().unwrap());
        return;
    }
    let before = baseline();
    if role() == "b" {
        let mut child = spawn_victim(TEST, 1);
        sync.get("victim1.transferring", BOUND);
        child.kill().expect("SIGKILL the victim");
        assert!(!child.wait().unwrap().success());
        sync.put("killed1", "");
        let mut child = spawn_victim(TEST, 2);
        let status = child.wait().unwrap();
        assert!(status.success(), "the restarted victim failed: {status:?}");
        sync.barrier("end");
        assert_back_to(before);
        return;
    }
    {
        let mut e = ud_end(64);
        sync.put("survivor.qpn", &e.qp.qp_num().to_string());
        let mut free = e.pd.alloc_mr(16 * MSG, LW).unwrap().chunks(MSG).unwrap();
        let v1: u32 = sync.get("victim1.qpn", BOUND).trim().parse().unwrap();
        let mut seen = UdSeen::default();
        // Stream to the victim until it has our 100 and we its 100 (only
        // then does it say it is transferring, and b kill it), then until b
        // says it is dead.
        ud_round(&mut e, v1, 101, Some(11), &mut seen, &mut free, &|s| {
            s.received >= 100
        });
        sync.put("survivor.got1", "");
        let killed = sync.path("killed1");
        ud_round(&mut e, v1, 101, Some(11), &mut seen, &mut free, &|_| {
            killed.exists()
        });
        // Sending to the dead QP number goes on succeeding: nothing answers,
        // nothing fails.
        let at_kill = seen.completed;
        ud_round(&mut e, v1, 101, Some(11), &mut seen, &mut free, &|s| {
            s.completed >= at_kill + 100
        });
        eprintln!("generation 1 (killed): {seen:?}");
        sync.put("survivor.ready2", "");
        // The restarted peer: a new QP number, a fresh stream both ways.
        let v2: u32 = sync.get("victim2.qpn", BOUND).trim().parse().unwrap();
        assert_ne!(v1, v2);
        let mut seen2 = UdSeen::default();
        let finished = sync.path("victim2.finished");
        ud_round(&mut e, v2, 102, Some(12), &mut seen2, &mut free, &|s| {
            s.received >= 100
        });
        sync.put("survivor.got2", "");
        ud_round(&mut e, v2, 102, Some(12), &mut seen2, &mut free, &|_| {
            finished.exists()
        });
        // Every send has its completion.
        ud_round(&mut e, v2, 102, None, &mut seen2, &mut free, &|s| {
            s.completed == s.posted
        });
        eprintln!("generation 2 (restarted): {seen2:?}");
        assert_eq!(seen.completed, seen.posted);
        assert_eq!(e.qp.in_flight(), (0, 64), "every receive is posted again");
        // Teardown in an order that puts parents first.
        let UdEnd {
            qp,
            ah,
            cq,
            pd,
            ctx,
        } = e;
        drop(ctx);
        drop(pd);
        drop(ah);
        drop(cq);
        drop(free);
        drop(qp);
    }
    sync.barrier("end");
    assert_back_to(before);
}

// ---------------------------------------------------------------------------
// The link down mid-transfer over iWARP (siw): TCP's retransmissions are
// the retry budget.

/// Receives the iWARP receiver keeps posted: the sender keeps fewer than
/// this many of its messages unconsumed by the receiver's last count.
const IW_DEPTH: u32 = 120;
/// The receiver sends its count after this many messages.
const IW_CREDIT_EVERY: u32 = 16;
/// `net.ipv4.tcp_retries2` in the sender's guest for the long cut
/// (`RDMA_TEST_PAIR_TCP_RETRIES2` overrides it, for measuring): TCP gives
/// up after about (2^(N+1) - 1) × 200 ms of retransmissions (N = 4: about
/// 6.2 s; Linux's default of 15 gives about 924.6 s, `ip-sysctl`), which
/// must stay within `BOUND` (N up to 7).
fn iw_retries2() -> u32 {
    std::env::var("RDMA_TEST_PAIR_TCP_RETRIES2")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
}

/// Sets `net.ipv4.tcp_retries2` for this guest while alive; puts the old
/// value back when dropped.
struct TcpRetries2(String);

impl TcpRetries2 {
    const PATH: &'static str = "/proc/sys/net/ipv4/tcp_retries2";

    fn set(n: u32) -> TcpRetries2 {
        let old = std::fs::read_to_string(Self::PATH).expect("read tcp_retries2");
        std::fs::write(Self::PATH, n.to_string()).expect("write tcp_retries2 (root in the guest)");
        TcpRetries2(old.trim().to_string())
    }
}

impl Drop for TcpRetries2 {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::PATH, &self.0);
    }
}

/// Bytes TCP holds unacknowledged towards `peer` (`ss`'s Send-Q summed over
/// the connections to it; siw's sockets are the kernel's own).
fn tcp_unacked_to(local: IpAddr, peer: IpAddr) -> Option<u64> {
    let out = Command::new("ss")
        .args(["-tnH", "dst", &peer.to_string()])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut sum = None;
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        let at = w.iter().position(|t| t.starts_with(&format!("{local}:")))?;
        if at >= 1 {
            *sum.get_or_insert(0) += w[at - 1].parse::<u64>().ok()?;
        }
    }
    sum
}

/// A credit message of the iWARP receiver: `message(gen, NO_SEQ)` with its
/// count in bytes 8..12.
fn iw_credit(m: &mut MemoryRegion, gen: u32, count: u32) {
    fill(m, gen, NO_SEQ);
    m.as_mut_slice().expect("local memory")[8..12].copy_from_slice(&count.to_le_bytes());
}

/// What the iWARP sender saw on one connection.
#[derive(Debug, Default)]
struct IwCut {
    /// Send completions in posting order.
    statuses: Vec<WcStatus>,
    /// Sends without a completion, taken back with `QueuePair::reset`.
    reclaimed: usize,
    /// From asking for the cut to asking for the link back.
    down_for: Duration,
    /// From the cut in place to the first sign of failure (a failed
    /// completion or a CM event): TCP giving up.
    failed_after: Option<Duration>,
    /// TCP's unacknowledged bytes to the peer once the links were down.
    unacked_at_down: Option<u64>,
    /// Whether the sender was then waiting for the receiver's count (it had
    /// `IW_DEPTH - 1` unconsumed): the cut held the count instead.
    blocked_at_down: bool,
    /// Credit messages received; the receiver's last count.
    credits: u32,
    peer_consumed: Option<u32>,
}

/// The sender (guest a) of one connection. It streams SENDs, 16 in
/// flight and fewer than `IW_DEPTH` unconsumed by the receiver's last
/// count; each carries in bytes 8..12 how many credit messages it has
/// consumed (and reposted a receive for). `cut`: `None`, `count` messages
/// and no cut; `Some(true)`, b's links are cut while it streams and asked
/// back as soon as they are down; `Some(false)`, they stay down until the
/// connection failed (TCP gave up). It stops posting once the links are
/// down. Ends, for no cut or a short one, when the receiver's count covers
/// every message; for a long one, when every send has its completion or
/// was taken back with `reset` after DISCONNECTED.
fn iw_send(
    ch: &EventChannel,
    e: &mut End,
    gen: u32,
    cut: Option<bool>,
    local: IpAddr,
    peer: IpAddr,
    count: u32,
) -> IwCut {
    // The receiver's receives are posted before it accepts (`iw_accept`).
    let mut seen = IwCut {
        peer_consumed: Some(0),
        ..IwCut::default()
    };
    let mut free: Vec<MemoryRegion> = e.pd.alloc_mr(16 * MSG, LW).unwrap().chunks(MSG).unwrap();
    let mut out = Vec::new();
    let mut posted = 0u32;
    let _restore = RestoreLink;
    let asked = Instant::now();
    let mut down = cut.map(|_| std::thread::spawn(|| link("down", "b")));
    let mut down_at: Option<Instant> = None;
    let mut posting = true;
    let mut up = cut.is_none();
    let mut failed = false;
    let mut disconnected = false;
    let mut deadline = Instant::now() + BOUND;
    loop {
        if posting && !failed {
            while let Some(p) = seen.peer_consumed {
                if posted - p >= IW_DEPTH - 1 || (cut.is_none() && posted == count) {
                    break;
                }
                let Some(mut m) = free.pop() else { break };
                fill(&mut m, gen, posted);
                m.as_mut_slice().expect("local memory")[8..12]
                    .copy_from_slice(&seen.credits.to_le_bytes());
                if let Err(p) = e.qp.post_send(SendWr::send(u64::from(posted), m)) {
                    eprintln!("[a] post refused: {}", p.error);
                    free.extend(p.returned.into_iter().filter_map(|(_, b)| b.into_one()));
                    failed = true;
                    break;
                }
                posted += 1;
            }
        }
        if down.as_ref().is_some_and(|h| h.is_finished()) {
            down.take().unwrap().join().expect("pair-link down");
            down_at = Some(Instant::now());
            posting = false;
            seen.unacked_at_down = tcp_unacked_to(local, peer);
            seen.blocked_at_down = seen
                .peer_consumed
                .is_some_and(|p| posted - p >= IW_DEPTH - 1);
            if cut == Some(true) {
                seen.down_for = asked.elapsed();
                link("up", "b");
                up = true;
            }
        }
        e.cq.poll(&mut out, 64).expect("poll");
        for mut c in out.drain(..) {
            if wr_kind(c.wr_id) == Wr::Recv {
                let m = c.take_buffers().into_one().expect("one region");
                if c.status == WcStatus::WrFlushErr {
                    failed = true;
                    continue;
                }
                assert!(c.is_success(), "[a] credit receive: {c:?}");
                let mut none = 0;
                let n = check_received(&m.to_vec(), gen, &mut none);
                assert_eq!(none, 0, "the receiver sends only credit messages");
                seen.credits += 1;
                let p = seen.peer_consumed.get_or_insert(0);
                *p = (*p).max(n);
                if !failed {
                    repost(e, c.wr_id, m);
                }
                continue;
            }
            assert_eq!(c.wr_id, seen.statuses.len() as u64, "in order: {c:?}");
            if !c.is_success() {
                assert_eq!(cut, Some(false), "a send failed: {c:?}");
                failed = true;
            }
            seen.statuses.push(c.status);
            free.extend(c.take_buffers().into_one());
        }
        if !disconnected {
            if let Some(ev) = ch.try_get_event().expect("rdma_get_cm_event") {
                eprintln!("[a] event {} status {}", ev.event_type(), ev.status());
                assert_eq!(
                    cut,
                    Some(false),
                    "a CM event during the transfer: {ev:?}; {seen:?}; kernel log:\n{}",
                    kernel_log()
                );
                assert_eq!(ev.event_type(), CmEventType::Disconnected, "{ev:?}");
                disconnected = true;
                failed = true;
            }
        }
        if failed && !up {
            if let Some(h) = down.take() {
                h.join().expect("pair-link down");
                down_at.get_or_insert_with(Instant::now);
            }
            seen.failed_after = down_at.map(|t| t.elapsed());
            seen.down_for = asked.elapsed();
            link("up", "b");
            up = true;
            // TCP's retransmissions took part of the bound already.
            deadline = Instant::now() + BOUND;
        }
        let all_done = seen.statuses.len() == posted as usize;
        if cut != Some(false)
            && up
            && all_done
            && (!posting || posted == count)
            && seen.peer_consumed == Some(posted)
        {
            break;
        }
        if cut == Some(false) && up && failed && disconnected {
            // siw moved the QP to the error state before it reported the
            // close: what it flushed is in the CQ, taken above; drain once
            // more, then take back what siw never completes.
            e.cq.poll(&mut out, 256).expect("poll");
            for mut c in out.drain(..) {
                if wr_kind(c.wr_id) == Wr::Recv {
                    assert_eq!(c.status, WcStatus::WrFlushErr, "{c:?}");
                    continue;
                }
                assert_eq!(c.wr_id, seen.statuses.len() as u64, "in order: {c:?}");
                seen.statuses.push(c.status);
                drop(c.take_buffers());
            }
            let back = e.qp.reset().expect("reset");
            seen.reclaimed = back
                .iter()
                .filter(|(id, _)| wr_kind(*id) == Wr::Data)
                .count();
            break;
        }
        assert!(
            Instant::now() < deadline,
            "[a] gen {gen}: {} of {posted} completions, the receiver's count {:?}, failed {failed}, after {BOUND:?}",
            seen.statuses.len(),
            seen.peer_consumed
        );
    }
    assert_eq!(
        seen.statuses.len() + seen.reclaimed,
        posted as usize,
        "every send has its completion or was taken back: {seen:?}"
    );
    seen
}

/// The receiver (guest b) of one connection (accepted by `iw_accept`):
/// takes messages (each checked: generation, the next sequence number, the
/// pattern), reposting each receive and
/// sending its count every `IW_CREDIT_EVERY` messages or when idle, never
/// with more than 63 of its credit messages unconsumed by the sender's
/// count. Ends on DISCONNECTED (the sender's), or, when the sender's
/// guest says its connection failed (`failed{gen}`), after disconnecting
/// itself. Returns the messages received.
fn iw_receive(sync: &Sync, ch: &EventChannel, e: &mut End, gen: u32) -> u32 {
    let mut credit_bufs: Vec<MemoryRegion> =
        e.pd.alloc_mr(4 * MSG, LW).unwrap().chunks(MSG).unwrap();
    let mut received = 0u32;
    // Nothing before the sender's first message (`iw_accept`).
    let mut advertised = 0u32;
    let mut credits_sent = 0u32;
    let mut sender_took = 0u32;
    let mut out = Vec::new();
    let mut deadline = Instant::now() + BOUND;
    let mut next_file_check = Instant::now();
    let failed_key = format!("failed{gen}");
    loop {
        e.cq.poll(&mut out, 64).expect("poll");
        let idle = out.is_empty();
        for mut c in out.drain(..) {
            let m = c.take_buffers().into_one().expect("one region");
            if wr_kind(c.wr_id) == Wr::Credit {
                // The sender's QP may be gone already.
                assert!(
                    c.is_success() || c.status == WcStatus::WrFlushErr,
                    "[b] credit send: {c:?}"
                );
                credit_bufs.push(m);
                continue;
            }
            if c.status == WcStatus::WrFlushErr {
                continue; // ours, flushed after the close
            }
            assert!(c.is_success(), "[b] receive: {c:?}");
            let mut next = received;
            let took = check_received(&m.to_vec(), gen, &mut next);
            assert_eq!(
                next,
                received + 1,
                "[b] only data messages come to the receiver"
            );
            received = next;
            sender_took = sender_took.max(took);
            repost(e, c.wr_id, m);
            deadline = Instant::now() + BOUND;
        }
        let due = received - advertised >= IW_CREDIT_EVERY || (idle && received > advertised);
        if due && credits_sent - sender_took < DEPTH - 1 {
            if let Some(mut m) = credit_bufs.pop() {
                iw_credit(&mut m, gen, received);
                match e
                    .qp
                    .post_send(SendWr::send(CREDIT_BASE + u64::from(credits_sent), m))
                {
                    Ok(()) => {
                        credits_sent += 1;
                        advertised = received;
                    }
                    Err(p) => {
                        credit_bufs
                            .extend(p.returned.into_iter().filter_map(|(_, b)| b.into_one()));
                    }
                }
            }
        }
        if let Some(ev) = ch.try_get_event().expect("rdma_get_cm_event") {
            eprintln!(
                "[b] event {} status {} ({received} received); kernel log:\n{}",
                ev.event_type(),
                ev.status(),
                kernel_log()
            );
            assert_eq!(ev.event_type(), CmEventType::Disconnected, "{ev:?}");
            drop(ev);
            let _ = e.id.disconnect();
            e.cq.poll(&mut out, 256).expect("poll");
            for mut c in out.drain(..) {
                let m = c.take_buffers().into_one().expect("one region");
                if c.is_success() && wr_kind(c.wr_id) == Wr::Recv {
                    let mut next = received;
                    check_received(&m.to_vec(), gen, &mut next);
                    received = next;
                }
            }
            // Credit sends siw never completed.
            let _ = e.qp.reset();
            return received;
        }
        if idle && Instant::now() >= next_file_check {
            next_file_check = Instant::now() + Duration::from_millis(100);
            if sync.path(&failed_key).exists() {
                // The sender's socket is gone; ours learns it from the
                // sender's kernel (a reset) once we send.
                eprintln!("[b] the sender's connection failed: disconnecting");
                e.id.disconnect().expect("rdma_disconnect");
            }
        }
        assert!(
            Instant::now() < deadline,
            "[b] gen {gen}: {received} received, no progress or DISCONNECTED within {BOUND:?}"
        );
    }
}

/// The iWARP sender's side of a connection: like `connect`, but its 64
/// receives (for the receiver's credit messages) are posted before it
/// connects, so none of those can find no receive (siw answers a SEND
/// without a receive by terminating the connection).
fn iw_connect(ch: &EventChannel, dst: SocketAddr) -> End {
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    id.resolve_addr(None, dst, Duration::from_secs(5)).unwrap();
    drop(expect_event(ch, CmEventType::AddrResolved));
    id.resolve_route(Duration::from_secs(5)).unwrap();
    drop(expect_event(ch, CmEventType::RouteResolved));
    let mut e = end_for(&id, false);
    id.modify_qp(&e.qp, rdma::QpState::Init).unwrap();
    post_receives(&mut e, 64);
    id.connect_qp(&e.qp, &ConnParam::default()).unwrap();
    let ev = next_event(ch, BOUND);
    match (ev.event_type(), ev.status()) {
        (CmEventType::ConnectResponse, 0) => {
            drop(ev);
            id.establish_qp(&e.qp).unwrap();
        }
        (CmEventType::Established, 0) => {}
        _ => panic!("connecting to {dst}: {ev:?}"),
    }
    e
}

/// siw's and the iWARP CM's lines in the kernel log (the last 20), for a
/// failure's message.
fn kernel_log() -> String {
    let out = Command::new("dmesg")
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&out);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("siw") || l.contains("iw_cm") || l.contains("TERMINATE"))
        .collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// The iWARP receiver's side: the next connection request, its `IW_DEPTH`
/// receives posted before it accepts (so the sender may start at once) and
/// nothing sent before the sender's first message: in MPA (RFC 5044) the
/// initiator sends the first FPDU. A count sent right after ESTABLISHED
/// made siw's initiator fail the connection now and then (`CONNECT_ERROR`,
/// status -22, in 2 of 8 runs; its peer saw ESTABLISHED, then
/// DISCONNECTED).
fn iw_accept(ch: &EventChannel) -> End {
    let req = expect_event(ch, CmEventType::ConnectRequest);
    let id = req.id().clone();
    drop(req);
    let mut e = end_for(&id, false);
    id.modify_qp(&e.qp, rdma::QpState::Init).unwrap();
    post_receives(&mut e, IW_DEPTH as usize);
    id.accept_qp(&e.qp, &ConnParam::default()).unwrap();
    drop(expect_event(ch, CmEventType::Established));
    e
}

/// Listens on `ip` (an iWARP address).
fn listen_on(ch: &EventChannel, ip: IpAddr) -> CmId {
    let l = ch.create_id(PortSpace::Tcp).unwrap();
    l.bind_addr(SocketAddr::new(ip, 0)).unwrap();
    l.listen(8).unwrap();
    l
}

#[test]
#[ignore = "needs two guests (ci/vm pair) with siw"]
fn cm_rc_link_down_shorter_and_longer_than_the_retry_timeout_iwarp() {
    const TEST: &str = "cm_rc_link_down_iwarp";
    const N: u32 = 64;
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| panic!("{name} is set under ci/vm pair with siw"))
    };
    let ip_var = |name: &str| -> IpAddr { var(name).parse().expect("an IP address") };
    let (local, peer) = (
        ip_var("RDMA_TEST_IWARP_IP"),
        ip_var("RDMA_TEST_IWARP_PEER_IP"),
    );
    // PAIR_SYNC_TAG keeps the keys of repeated runs in one boot apart.
    let dir = PathBuf::from(var("RDMA_VM_SYNC_DIR"))
        .join(std::env::var("PAIR_SYNC_TAG").unwrap_or_default());
    std::fs::create_dir_all(&dir).expect("the sync folder");
    let sync = Sync { dir, test: TEST };
    // librdmacm opens siw0's context on first use: before the baseline.
    {
        let ch = EventChannel::new().unwrap();
        let id = ch.create_id(PortSpace::Tcp).unwrap();
        id.bind_addr(SocketAddr::new(local, 0)).unwrap();
        drop(id.context().expect("the bound id has a device"));
    }
    let before = baseline();
    // Phase 1: the cut as short as the link request's round trip; TCP
    // retransmits until it is back (its budget, tcp_retries2 = 15, is
    // about 15 minutes). Phase 2: tcp_retries2 lowered in a's guest, the
    // cut held until the connection failed. Phase 3: the link back, a new
    // connection carries N messages.
    let phases = [(1u32, Some(true)), (2, Some(false)), (3, None)];
    if role() == "b" {
        let ch = EventChannel::new().unwrap();
        let listener = listen_on(&ch, local);
        sync.put("port", &listener.src_port().to_string());
        for (gen, _) in phases {
            let mut e = iw_accept(&ch);
            let got = iw_receive(&sync, &ch, &mut e, gen);
            eprintln!("[b] phase {gen}: received {got}");
            sync.put(&format!("received{gen}"), &got.to_string());
            drop(e);
        }
        drop(listener);
        drop(ch);
        sync.barrier("end");
        assert_back_to(before);
        return;
    }
    let port: u16 = sync.get("port", BOUND).trim().parse().unwrap();
    let dst = SocketAddr::new(peer, port);
    let ch = EventChannel::new().unwrap();
    for (gen, cut) in phases {
        let retries = (cut == Some(false)).then(|| TcpRetries2::set(iw_retries2()));
        let mut e = iw_connect(&ch, dst);
        let seen = iw_send(&ch, &mut e, gen, cut, local, peer, N);
        drop(retries);
        let posted = (seen.statuses.len() + seen.reclaimed) as u32;
        let ok = seen
            .statuses
            .iter()
            .filter(|s| **s == WcStatus::Success)
            .count() as u32;
        eprintln!(
            "phase {gen}: link down for {:?}, failed after {:?}, TCP unacked once down {:?} bytes (waiting for a count: {}); {ok} of {posted} sent, {} taken back; credits {}, receiver's count {:?}; failures {:?}",
            seen.down_for,
            seen.failed_after,
            seen.unacked_at_down,
            seen.blocked_at_down,
            seen.reclaimed,
            seen.credits,
            seen.peer_consumed,
            seen.statuses.iter().filter(|s| **s != WcStatus::Success).collect::<Vec<_>>()
        );
        if cut == Some(false) {
            // Successes, then at most one send failed on the wire, then
            // flushes.
            let first = seen
                .statuses
                .iter()
                .position(|s| *s != WcStatus::Success)
                .unwrap_or(seen.statuses.len());
            let rest = &seen.statuses[first..];
            assert!(
                rest.iter()
                    .enumerate()
                    .all(|(i, s)| *s == WcStatus::WrFlushErr
                        || (i == 0 && *s == WcStatus::LocQpOpErr)),
                "{seen:?}"
            );
            assert!(seen.failed_after.is_some(), "{seen:?}");
            sync.put(&format!("failed{gen}"), &posted.to_string());
            // b disconnects (its side learns of the reset) and counts.
        } else {
            assert_eq!(ok, posted, "nothing failed: {seen:?}");
            assert_eq!(seen.peer_consumed, Some(posted), "{seen:?}");
            e.id.disconnect().unwrap();
            let ev = next_event(&ch, BOUND);
            assert_eq!(ev.event_type(), CmEventType::Disconnected, "{ev:?}");
            drop(ev);
        }
        let got: u32 = sync
            .get(&format!("received{gen}"), BOUND)
            .trim()
            .parse()
            .unwrap();
        // In order and none twice (checked by the receiver); none lost when
        // the connection survived. When it failed, a send's success says
        // only that TCP took it: the receiver has at least what its count
        // said, at most what was posted.
        if cut == Some(false) {
            assert!(
                got >= seen.peer_consumed.unwrap_or(0) && got <= posted,
                "phase {gen}: receiver got {got}, sender posted {posted}: {seen:?}"
            );
            // What TCP held when it gave up is lost, though siw completed
            // those sends with success when TCP took them.
            if seen.unacked_at_down.is_some_and(|b| b > 0) {
                assert!(
                    got < posted,
                    "phase {gen}: TCP held data at the cut, yet all {posted} arrived: {seen:?}"
                );
            }
        } else {
            assert_eq!(got, posted, "phase {gen}");
        }
        if cut == Some(true) {
            // The cut caught the stream: data in flight (TCP's Send-Q), or
            // the sender waiting for a count the cut held.
            assert!(
                seen.unacked_at_down.is_some_and(|b| b > 0) || seen.blocked_at_down,
                "the short cut caught the stream: {seen:?}"
            );
        }
        drop(e);
    }
    drop(ch);
    sync.barrier("end");
    assert_back_to(before);
}
