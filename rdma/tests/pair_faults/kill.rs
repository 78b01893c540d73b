//! A peer process SIGKILLed mid-transfer (RC, the survivor's receives on an
//! SRQ): the victim is stopped, resumed, then killed, and a second generation
//! ends cleanly; on RoCE, and as `..._iwarp` on siw.

use super::*;

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
    let port = peer_port(sync);
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
    disconnect(&ch, &e);
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
        let mut child = spawn_victim(module_path!(), TEST, 1);
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
        let mut child = spawn_victim(module_path!(), TEST, 2);
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
            &exact_name(module_path!(), "cm_rc_srq_peer_killed_mid_transfer"),
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
