//! The link down mid-transfer over iWARP (siw): TCP's retransmissions are the
//! retry budget.

use super::*;

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
    connected(ch, &id, &e.qp, dst);
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
    let sync = Sync::new(TEST);
    std::fs::create_dir_all(&sync.dir).expect("the sync folder");
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
    let receive = |ch: &EventChannel, gen| {
        let mut e = iw_accept(ch);
        let got = iw_receive(&sync, ch, &mut e, gen);
        eprintln!("[b] phase {gen}: received {got}");
        (e, got)
    };
    let send = |ch: &EventChannel, dst, gen, cut: Option<bool>| {
        let retries = (cut == Some(false)).then(|| TcpRetries2::set(iw_retries2()));
        let mut e = iw_connect(ch, dst);
        let seen = iw_send(ch, &mut e, gen, cut, local, peer, N);
        drop(retries);
        let posted = (seen.statuses.len() + seen.reclaimed) as u32;
        let ok = succeeded(&seen.statuses);
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
            disconnect(ch, &e);
        }
        let got = received(&sync, gen);
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
    };
    let listen = |ch: &EventChannel| listen_on(ch, local);
    link_cut(&sync, before, &phases, peer, listen, receive, send);
}
