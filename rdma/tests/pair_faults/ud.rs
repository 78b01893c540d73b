//! UD: the peer process killed, then restarted under a new QP number.

use super::*;

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
        let mut child = spawn_victim(module_path!(), TEST, 1);
        sync.get("victim1.transferring", BOUND);
        child.kill().expect("SIGKILL the victim");
        assert!(!child.wait().unwrap().success());
        sync.put("killed1", "");
        let mut child = spawn_victim(module_path!(), TEST, 2);
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
