//! Device tests of `SlotQueue`: traffic between two queues on the test
//! device, what a slot may be used for while the device holds it, and the
//! ways a queue ends with requests in flight (drop, error-state flush,
//! reset, a queue the caller forgets).
//!
//! Each pair is connected one of two ways: by hand (`bring_up`: INIT, RTR,
//! RTS with the peer's QP number; the `_rxe` tests), or through the
//! connection manager (`two_cm`: the queue's QP handed to
//! `CmId::connect_qp` and `accept_qp`), the only way soft-iWARP connects a
//! QP (the `_iwarp` tests, on siw0), and one test on rxe0 too.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use common::iwarp::{await_established, iwarp_ip, next_event};
use rdma::cm::{CmEventType, ConnParam, EventChannel, PortSpace};
use rdma::{AccessFlags, Error, QpState, SlotCompletion, SlotConfig, SlotQueue, WcStatus};

/// Two slot queues on one PD, connected to each other.
struct Two {
    pd: rdma::ProtectionDomain,
    a: SlotQueue,
    b: SlotQueue,
    /// The connection manager's side of a pair `two_cm` connected.
    cm: Option<Cm>,
}

/// What keeps a connection made through the CM: the ids (active, passive),
/// the listener and their channel.
struct Cm {
    _ids: [rdma::cm::CmId; 2],
    _listener: rdma::cm::CmId,
    _ch: EventChannel,
}

fn two(slots: u32, slot_len: usize) -> Two {
    two_with(SlotConfig::new(slots, slot_len))
}

fn two_with(config: SlotConfig) -> Two {
    let ctx = common::open(&common::device_name());
    let pd = ctx.alloc_pd().expect("alloc_pd");
    let a = SlotQueue::new(&pd, &config).expect("slot queue a");
    let b = SlotQueue::new(&pd, &config).expect("slot queue b");
    let gid = u8::try_from(common::gid_index()).unwrap();
    bring_up(&ctx, &a, &b, gid);
    Two { pd, a, b, cm: None }
}

/// Connects `a` and `b` (INIT → RTR → RTS) with remote write allowed.
fn bring_up(ctx: &rdma::Context, a: &SlotQueue, b: &SlotQueue, gid_index: u8) {
    let gid = ctx.query_gid(1, u32::from(gid_index)).unwrap();
    let mtu = ctx.query_port(1).unwrap().active_mtu;
    let mut init = rdma::InitAttr::new(1);
    init.access = AccessFlags::REMOTE_WRITE;
    for (me, peer) in [(a, b), (b, a)] {
        let qp = me.qp();
        qp.to_init(&init).unwrap();
        let ah = rdma::AhAttr::global(1, gid, gid_index);
        qp.to_rtr(Some(&rdma::RtrAttr::new(ah, mtu, peer.qp().qp_num(), 0)))
            .unwrap();
        qp.to_rts(&rdma::RtsAttr::new(0)).unwrap();
    }
}

/// Two slot queues connected through the connection manager on the device
/// whose address is `ip`, each made on its id's context (librdmacm's, which
/// the listener's requests share) and its QP handed to the CM
/// (`CmId::connect_qp`, `accept_qp`, `establish_qp`).
fn two_cm(ip: IpAddr, config: &SlotConfig) -> Two {
    let ch = EventChannel::new().expect("event channel");
    let listener = ch.create_id(PortSpace::Tcp).unwrap();
    listener.bind_addr(SocketAddr::new(ip, 0)).unwrap();
    listener.listen(4).unwrap();
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    let dst = SocketAddr::new(ip, listener.src_port());
    id.resolve_addr(None, dst, Duration::from_secs(5)).unwrap();
    drop(next_event(&ch, CmEventType::AddrResolved));
    id.resolve_route(Duration::from_secs(5)).unwrap();
    drop(next_event(&ch, CmEventType::RouteResolved));
    let pd = id
        .context()
        .expect("the id has a device")
        .alloc_pd()
        .unwrap();
    let a = SlotQueue::new(&pd, config).expect("slot queue a");
    id.connect_qp(a.qp(), &ConnParam::default()).unwrap();
    let req = next_event(&ch, CmEventType::ConnectRequest);
    let server = req.id().clone();
    drop(req);
    let b = SlotQueue::new(&pd, config).expect("slot queue b");
    server.accept_qp(b.qp(), &ConnParam::default()).unwrap();
    await_established(&ch, &id, a.qp());
    // (No state check: siw's ibv_query_qp reports none, RESET; the tests'
    // traffic shows the connection.)
    Two {
        pd,
        a,
        b,
        cm: Some(Cm {
            _ids: [id, server],
            _listener: listener,
            _ch: ch,
        }),
    }
}

fn two_iwarp(slots: u32, slot_len: usize) -> Two {
    two_cm(iwarp_ip(), &SlotConfig::new(slots, slot_len))
}

/// Polls `q` until a completion comes; fails after 10 s.
fn next(q: &mut SlotQueue) -> SlotCompletion {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(c) = q.poll().expect("poll") {
            return c;
        }
        assert!(Instant::now() < deadline, "no completion in 10 s");
        std::thread::yield_now();
    }
}

fn is_invalid(r: rdma::Result<impl std::fmt::Debug>, says: &str) {
    match r {
        Err(Error::InvalidArgument { reason, .. }) => {
            assert!(reason.contains(says), "{reason:?} does not say {says:?}")
        }
        other => panic!("expected InvalidArgument ({says}), got {other:?}"),
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn send_lands_in_the_posted_slot_readable_after_its_completion_rxe() {
    send_lands(two(4, 64));
}

#[test]
#[ignore = "needs an RDMA device"]
fn send_lands_in_the_posted_slot_readable_after_its_completion_iwarp() {
    send_lands(two_iwarp(4, 64));
}

#[test]
#[ignore = "needs an RDMA device"]
fn send_lands_in_the_posted_slot_over_the_cm_rxe() {
    send_lands(two_cm(common::roce_ip(), &SlotConfig::new(4, 64)));
}

fn send_lands(t: Two) {
    let failures = rdma::teardown_failures();
    let Two { mut a, mut b, .. } = t;
    b.post_recv(2).unwrap();
    // The device may write slot 2 now: no reading, writing or sending it.
    is_invalid(b.slot(2), "receive posted");
    is_invalid(b.slot_mut(2), "receive posted");
    is_invalid(b.post_send(2, 1, true), "receive posted");
    is_invalid(b.post_recv(2), "receive posted");
    a.slot_mut(1).unwrap()[..5].copy_from_slice(b"hello");
    a.post_send(1, 5, true).unwrap();
    // Read by the device until its completion is polled: readable, not
    // writable, and no receive into it.
    assert_eq!(&a.slot(1).unwrap()[..5], b"hello");
    is_invalid(a.slot_mut(1), "not been polled");
    is_invalid(a.post_recv(1), "not been polled");
    assert_eq!(a.in_flight(), (1, 0));
    let c = next(&mut a);
    assert!(c.is_success(), "{c:?}");
    assert!(!c.is_recv());
    assert_eq!(c.slot(), 1);
    a.slot_mut(1).unwrap()[0] = b'j';
    let c = next(&mut b);
    assert!(c.is_success() && c.is_recv(), "{c:?}");
    assert_eq!((c.slot(), c.byte_len()), (2, 5));
    assert_eq!(&b.slot(2).unwrap()[..5], b"hello");
    assert_eq!(b.in_flight(), (0, 0));
    drop((a, b));
    assert_eq!(rdma::teardown_failures(), failures);
}

#[test]
#[ignore = "needs an RDMA device"]
fn an_inline_send_leaves_its_slot_to_the_caller_at_once_rxe() {
    let mut config = SlotConfig::new(2, 256);
    config.max_inline_data = 64;
    let Two { mut a, mut b, .. } = two_with(config);
    b.post_recv(0).unwrap();
    a.slot_mut(1).unwrap()[..3].copy_from_slice(b"abc");
    a.post_send(1, 3, true).unwrap();
    // Copied during the post: the slot is the caller's again, while the
    // send's completion is still to come.
    a.slot_mut(1).unwrap()[..3].copy_from_slice(b"xyz");
    assert_eq!(a.in_flight(), (1, 0));
    let c = next(&mut a);
    assert!(c.is_success() && !c.is_recv(), "{c:?}");
    assert_eq!(a.in_flight(), (0, 0));
    let c = next(&mut b);
    assert!(c.is_success() && c.is_recv(), "{c:?}");
    assert_eq!(&b.slot(0).unwrap()[..3], b"abc");
    // Above the inline size the slot stays lent.
    b.post_recv(0).unwrap();
    a.post_send(1, 65, true).unwrap();
    is_invalid(a.slot_mut(1), "not been polled");
    assert!(next(&mut a).is_success());
    assert!(next(&mut b).is_success());
}

#[test]
#[ignore = "needs an RDMA device"]
fn unsignaled_sends_finish_with_the_next_signaled_one_rxe() {
    let Two { mut a, mut b, .. } = two(4, 32);
    for s in 0..3 {
        b.post_recv(s).unwrap();
    }
    for s in 0..3u32 {
        a.slot_mut(s).unwrap()[0] = 10 + s as u8;
    }
    a.post_send(0, 1, false).unwrap();
    a.post_send(1, 1, false).unwrap();
    a.post_send(2, 1, true).unwrap();
    // Whatever the device has done, the unsignaled sends' slots are lent
    // until a completion says they are done.
    is_invalid(a.slot_mut(0), "not been polled");
    is_invalid(a.slot_mut(1), "not been polled");
    let c = next(&mut a);
    assert_eq!((c.slot(), c.is_success()), (2, true));
    for s in 0..3 {
        a.slot_mut(s)
            .expect("every send before the signaled one is done");
    }
    let mut got = Vec::new();
    for _ in 0..3 {
        let c = next(&mut b);
        assert!(c.is_success() && c.is_recv(), "{c:?}");
        got.push(b.slot(c.slot()).unwrap()[0]);
    }
    assert_eq!(got, [10, 11, 12]);
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_write_reaches_its_target_from_any_queue_rxe() {
    write_reaches_its_target(two(2, 4096));
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_write_reaches_its_target_from_any_queue_iwarp() {
    write_reaches_its_target(two_iwarp(2, 4096));
}

fn write_reaches_its_target(t: Two) {
    let Two { pd, mut a, b, .. } = t;
    let target = pd
        .alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let t = a.write_target(target.remote());
    a.slot_mut(1).unwrap()[..4096].fill(0x5a);
    a.post_write(&t, 1, 4096, true).unwrap();
    // Not written again while the device may read it.
    let mut called = false;
    is_invalid(
        a.post_write_with(&t, 1, 4096, true, |_| called = true),
        "not been polled",
    );
    assert!(!called);
    let c = next(&mut a);
    assert!(c.is_success(), "{c:?}");
    assert_eq!(c.slot(), 1);
    assert!(target.to_vec().iter().all(|&x| x == 0x5a));
    // Written and posted with one look at the slot.
    a.post_write_with(&t, 1, 4096, true, |b| b[4095] = 0xa5)
        .unwrap();
    assert!(next(&mut a).is_success());
    assert_eq!(target.to_vec()[4095], 0xa5);
    // A target is only data: another queue's writes reach it too.
    let mut b = b;
    b.slot_mut(0).unwrap()[..2].copy_from_slice(&[7, 8]);
    b.post_write(&t, 0, 2, true).unwrap();
    assert!(next(&mut b).is_success());
    assert_eq!(target.to_vec()[..2], [7, 8]);
    // Bad posts change nothing.
    is_invalid(a.post_write(&t, 0, 4097, true), "4097 bytes");
    is_invalid(a.post_write(&t, 2, 1, true), "out of range");
    is_invalid(a.slot(2), "out of range");
    assert_eq!(a.in_flight(), (0, 0));
    assert_eq!(b.in_flight(), (0, 0));
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_write_past_its_remote_range_is_refused_and_the_qp_stays_up_rxe() {
    write_past_remote_range(two(2, 4096));
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_write_past_its_remote_range_is_refused_and_the_qp_stays_up_iwarp() {
    write_past_remote_range(two_iwarp(2, 4096));
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_write_past_its_remote_range_is_refused_on_the_legacy_path_rxe() {
    // The prebuilt request's path: the check comes before the path choice.
    let mut config = SlotConfig::new(2, 4096);
    config.post_path = rdma::PostPath::Legacy;
    write_past_remote_range(two_with(config));
}

/// Writes longer than their target's remote range (a region's last 64
/// bytes) are refused before the provider sees them, by both write posts;
/// the QP stays up (the peer would have refused them with a remote access
/// error and moved the QP to the error state), so a write that fits lands.
fn write_past_remote_range(t: Two) {
    let Two { pd, mut a, b, .. } = t;
    let region = pd
        .alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let tail = region.remote().slice(4032, 64).unwrap();
    let t = a.write_target(tail);
    a.slot_mut(0).unwrap()[..65].fill(0x3c);
    let range = format!("remote range of 64 bytes at {:#x}", tail.addr);
    is_invalid(a.post_write(&t, 0, 65, true), &range);
    is_invalid(a.post_write(&t, 0, 4096, false), "RDMA WRITE of 4096 bytes");
    let mut called = false;
    is_invalid(
        a.post_write_with(&t, 0, 65, true, |_| called = true),
        "RDMA WRITE of 65 bytes from slot 0",
    );
    assert!(!called, "fill ran for a refused write");
    assert_eq!(a.in_flight(), (0, 0));
    assert!(a.poll().unwrap().is_none(), "a refused write completed");
    // The whole range, to its last byte: posted, and it lands.
    a.post_write(&t, 0, 64, true).unwrap();
    let c = next(&mut a);
    assert!(c.is_success(), "{c:?}");
    let bytes = region.to_vec();
    assert!(bytes[4032..].iter().all(|&x| x == 0x3c));
    assert!(bytes[..4032].iter().all(|&x| x == 0));
    // An empty range takes an empty write only.
    let none = a.write_target(region.remote().slice(4096, 0).unwrap());
    is_invalid(a.post_write(&none, 0, 1, true), "remote range of 0 bytes");
    a.post_write_with(&none, 1, 0, true, |s| s[0] = 1).unwrap();
    assert!(next(&mut a).is_success());
    assert_eq!(a.in_flight(), (0, 0));
    drop(b);
}

#[test]
#[ignore = "needs an RDMA device"]
fn prepared_writes_and_sends_are_checked_once_and_each_post_again_rxe() {
    prepared_posts(two(4, 64), 64);
}

#[test]
#[ignore = "needs an RDMA device"]
fn prepared_writes_and_sends_are_checked_once_and_each_post_again_iwarp() {
    prepared_posts(two_iwarp(4, 64), 64);
}

#[test]
#[ignore = "needs an RDMA device"]
fn prepared_writes_and_sends_on_the_legacy_path_rxe() {
    let mut config = SlotConfig::new(4, 64);
    config.post_path = rdma::PostPath::Legacy;
    prepared_posts(two_with(config), 64);
}

#[test]
#[ignore = "needs an RDMA device"]
fn prepared_writes_and_sends_inline_rxe() {
    // At or under the inline size a prepared post takes the prebuilt
    // request, inline: the slot is the caller's again at once.
    let mut config = SlotConfig::new(4, 64);
    config.max_inline_data = 16;
    prepared_posts(two_with(config), 16);
}

/// A queue swapped in under a prepared handle (through its `queue()`,
/// which lends the queue mutably) is refused by the handle's posts: the
/// handle's calls, slot address and key are those of the queue it was made
/// for, which may be gone by then. Swapped back, the handle posts again.
#[test]
#[ignore = "needs an RDMA device"]
fn a_prepared_post_refuses_a_queue_swapped_in_under_it_rxe() {
    let Two {
        pd, mut a, mut b, ..
    } = two(4, 64);
    let mut other = SlotQueue::new(&pd, &SlotConfig::new(4, 64)).expect("a third queue");
    let region = pd
        .alloc_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let t = a.write_target(region.remote());
    b.post_recv(0).unwrap();
    {
        let mut s = a.sender(1, 4).unwrap();
        std::mem::swap(s.queue(), &mut other);
        is_invalid(s.post(true), "the queue was replaced");
        std::mem::swap(s.queue(), &mut other);
        s.post(true).unwrap();
        let c = next(s.queue());
        assert!(c.is_success() && !c.is_recv(), "{c:?}");
    }
    let c = next(&mut b);
    assert!(c.is_success() && c.is_recv(), "{c:?}");
    let mut w = a.writer(&t, 2, 8).unwrap();
    std::mem::swap(w.queue(), &mut other);
    is_invalid(w.post(true), "the queue was replaced");
    let mut called = false;
    is_invalid(
        w.post_with(true, |_| called = true),
        "the queue was replaced",
    );
    assert!(!called, "fill ran for a refused write");
    std::mem::swap(w.queue(), &mut other);
    w.post_with(true, |s| s[..8].fill(7)).unwrap();
    assert!(next(w.queue()).is_success());
    assert_eq!(&region.to_vec()[..8], &[7; 8]);
}

/// `SlotQueue::writer` and `sender`: what they check when made (the slot's
/// range, the length, the remote range), and what each post through them
/// still checks (the slot free for a write that fills it, no receive in a
/// send's slot); their requests land like the queue's own. The writes are
/// `len` bytes, to the end of a region.
fn prepared_posts(t: Two, len: u32) {
    let failures = rdma::teardown_failures();
    let Two {
        pd, mut a, mut b, ..
    } = t;
    let region = pd
        .alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let at = 4096 - len as usize;
    let tail = region.remote().slice(at as u64, u64::from(len)).unwrap();
    let t = a.write_target(tail);
    let short = a.write_target(region.remote().slice(0, 8).unwrap());
    // Checked once, when made.
    is_invalid(a.writer(&t, 4, 1), "slot 4 is out of range");
    is_invalid(a.writer(&t, 0, 65), "65 bytes from slot 0");
    is_invalid(a.writer(&short, 0, 9), "remote range of 8 bytes");
    is_invalid(a.sender(9, 1), "slot 9 is out of range");
    is_invalid(a.sender(0, 65), "65 bytes from slot 0");
    let inline = len <= a.qp().caps().max_inline_data.min(16);
    {
        let mut w = a.writer(&t, 1, len).unwrap();
        w.post_with(true, |s| s.fill(0x42)).unwrap();
        if inline {
            // Copied during the post: the slot is the caller's at once.
            w.queue().slot_mut(1).unwrap().fill(0);
        } else {
            // The slot is lent until the completion: not filled again.
            let mut called = false;
            is_invalid(w.post_with(true, |_| called = true), "not been polled");
            assert!(!called, "fill ran for a refused write");
        }
        let c = next(w.queue());
        assert!(c.is_success() && !c.is_recv(), "{c:?}");
        assert_eq!(c.slot(), 1);
        assert!(region.to_vec()[at..].iter().all(|&x| x == 0x42));
        // Again, as many times as wanted: posts that do not write the slot
        // need no completion between them (only the last one signaled).
        w.queue().slot_mut(1).unwrap()[len as usize - 1] = 2;
        for n in 0..3 {
            w.post(n == 2).unwrap();
        }
        let c = next(w.queue());
        assert!(c.is_success(), "{c:?}");
        assert_eq!(region.to_vec()[4095], 2);
        w.post_with(true, |s| s[len as usize - 1] = 3).unwrap();
        assert!(next(w.queue()).is_success());
        assert_eq!(region.to_vec()[4095], 3);
        assert_eq!(w.queue().in_flight(), (0, 0));
    }
    // A send's slot with a receive posted is refused per post.
    let mut s = a.sender(2, 5).unwrap();
    s.queue().post_recv(2).unwrap();
    is_invalid(s.post(true), "receive posted");
    // Flushed back only by a reset: the receive stays posted meanwhile.
    assert_eq!(s.queue().in_flight(), (0, 1));
    let mut s = a.sender(3, 5).unwrap();
    s.queue().slot_mut(3).unwrap()[..5].copy_from_slice(b"hello");
    for slot in 0..2 {
        b.post_recv(slot).unwrap();
    }
    s.post(false).unwrap();
    s.post(true).unwrap();
    let c = next(s.queue());
    assert!(c.is_success() && !c.is_recv(), "{c:?}");
    assert_eq!(c.slot(), 3);
    for _ in 0..2 {
        let c = next(&mut b);
        assert!(c.is_success() && c.is_recv(), "{c:?}");
        assert_eq!(c.byte_len(), 5);
        assert_eq!(&b.slot(c.slot()).unwrap()[..5], b"hello");
    }
    assert_eq!(a.in_flight(), (0, 1));
    assert_eq!(b.in_flight(), (0, 0));
    drop((a, b));
    assert_eq!(rdma::teardown_failures(), failures);
}

#[test]
#[ignore = "needs an RDMA device"]
fn the_legacy_path_reuses_its_prebuilt_requests_rxe() {
    // `ibv_post_send` over the queue's one prebuilt send request and one
    // receive request, rewritten per post: each post's fields (opcode,
    // remote, slot, length, id) must be its own, none left from the last.
    let mut config = SlotConfig::new(4, 64);
    config.post_path = rdma::PostPath::Legacy;
    let Two {
        pd, mut a, mut b, ..
    } = two_with(config);
    assert_eq!(a.qp().post_path(), rdma::PostPath::Legacy);
    let flags = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let (t1, t2) = (
        pd.alloc_mr(64, flags).unwrap(),
        pd.alloc_mr(64, flags).unwrap(),
    );
    let (w1, w2) = (a.write_target(t1.remote()), a.write_target(t2.remote()));
    for round in 0..3u8 {
        b.post_recv(2).unwrap();
        b.post_recv(3).unwrap();
        a.post_write_with(&w1, 0, 3, false, |s| s[..3].fill(round))
            .unwrap();
        a.slot_mut(1).unwrap()[..5].fill(0x40 + round);
        a.post_send(1, 5, false).unwrap();
        a.post_write(&w2, 1, 2, false).unwrap();
        a.post_send(1, 1, true).unwrap();
        let c = next(&mut a);
        assert!(c.is_success() && !c.is_recv() && c.slot() == 1, "{c:?}");
        assert_eq!(a.in_flight(), (0, 0));
        let mut lens = Vec::new();
        for _ in 0..2 {
            let c = next(&mut b);
            assert!(c.is_success() && c.is_recv(), "{c:?}");
            assert_eq!(b.slot(c.slot()).unwrap()[0], 0x40 + round);
            lens.push((c.slot(), c.byte_len()));
        }
        lens.sort_unstable();
        assert_eq!(lens, [(2, 5), (3, 1)]);
        assert_eq!(t1.to_vec()[..4], [round, round, round, 0]);
        assert_eq!(t2.to_vec()[..3], [0x40 + round, 0x40 + round, 0]);
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn dropping_a_queue_with_requests_in_flight_is_clean_rxe() {
    drop_with_requests_in_flight(two(8, 256));
}

#[test]
#[ignore = "needs an RDMA device"]
fn dropping_a_queue_with_requests_in_flight_is_clean_iwarp() {
    drop_with_requests_in_flight(two_iwarp(8, 256));
}

fn drop_with_requests_in_flight(t: Two) {
    let failures = rdma::teardown_failures();
    let Two {
        mut a, mut b, cm, ..
    } = t;
    for s in 0..8 {
        a.post_recv(s).unwrap();
        b.post_recv(s).unwrap();
    }
    // Receives never filled; a slot with one is no send's.
    is_invalid(a.post_send(0, 1, false), "receive posted");
    // And a queue never connected (receives may be posted from INIT on).
    let mut c = SlotQueue::new(a.qp().pd(), &SlotConfig::new(1, 8)).unwrap();
    c.qp().to_init(&rdma::InitAttr::new(1)).unwrap();
    c.post_recv(0).unwrap();
    assert_eq!(a.in_flight(), (0, 8));
    // The ids first (on iWARP that moves the QPs to the error state), the
    // peer, then the queue: any order.
    drop(cm);
    drop(b);
    drop(a);
    drop(c);
    assert_eq!(rdma::teardown_failures(), failures);
}

#[test]
#[ignore = "needs an RDMA device"]
fn dropping_a_queue_with_sends_in_flight_is_clean_rxe() {
    drop_with_sends_in_flight(two(4, 1 << 16));
}

#[test]
#[ignore = "needs an RDMA device"]
fn dropping_a_queue_with_sends_in_flight_is_clean_iwarp() {
    drop_with_sends_in_flight(two_iwarp(4, 1 << 16));
}

fn drop_with_sends_in_flight(t: Two) {
    let failures = rdma::teardown_failures();
    let Two { mut a, b, .. } = t;
    // No receive is posted at b: the SENDs wait for receiver-not-ready
    // retries (RoCE) or break the connection (iWARP has no RNR) while the
    // queue is dropped. On iWARP the break may come before the last posts,
    // which siw then refuses (ENOTCONN): the first is always in flight.
    let mut posted = 0;
    for s in 0..4 {
        match a.post_send(s, 1 << 16, s == 3) {
            Ok(()) => posted += 1,
            Err(e) if s > 0 && e.errno() == Some(libc::ENOTCONN) => break,
            Err(e) => panic!("post {s}: {e:?}"),
        }
    }
    assert_eq!(a.in_flight().0, posted);
    drop(a);
    drop(b);
    assert_eq!(rdma::teardown_failures(), failures);
}

#[test]
#[ignore = "needs an RDMA device"]
fn the_error_state_flushes_every_slot_back_rxe() {
    error_state_flushes(two(6, 128), true);
}

#[test]
#[ignore = "needs an RDMA device"]
fn the_error_state_flushes_every_slot_back_iwarp() {
    // siw's ibv_query_qp reports no state: the flush shows it.
    error_state_flushes(two_iwarp(6, 128), false);
}

fn error_state_flushes(t: Two, query_state: bool) {
    let Two { mut a, b, .. } = t;
    for s in 0..6 {
        a.post_recv(s).unwrap();
    }
    a.qp().to_error().unwrap();
    if query_state {
        assert_eq!(a.qp().state().unwrap(), QpState::Err);
    }
    let mut slots = Vec::new();
    for _ in 0..6 {
        let c = next(&mut a);
        assert!(c.is_recv());
        assert_eq!(c.status(), WcStatus::WrFlushErr, "{c:?}");
        slots.push(c.slot());
    }
    slots.sort_unstable();
    assert_eq!(slots, [0, 1, 2, 3, 4, 5]);
    assert_eq!(a.in_flight(), (0, 0));
    for s in 0..6 {
        a.slot_mut(s).expect("flushed: the caller's again")[0] = 1;
    }
    assert!(a.poll().unwrap().is_none());
    drop(b);
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_reset_gives_every_slot_back_and_the_queue_works_again_rxe() {
    let ctx = common::open(&common::device_name());
    let gid = u8::try_from(common::gid_index()).unwrap();
    let Two { mut a, mut b, .. } = two(4, 64);
    for s in 0..4 {
        a.post_recv(s).unwrap();
    }
    b.slot_mut(0).unwrap()[0] = 7;
    b.post_send(0, 1, true).unwrap();
    // Wait until the receive has completed at the device, but poll
    // nothing: its completion is left in the CQ across the reset.
    let c = next(&mut b);
    assert!(c.is_success(), "{c:?}");
    a.reset().unwrap();
    assert_eq!(a.qp().state().unwrap(), QpState::Reset);
    assert_eq!(a.in_flight(), (0, 0));
    for s in 0..4 {
        a.slot_mut(s).expect("reset: the caller's again")[0] = 0;
    }
    // Up again against b, whose QP is reset and brought up too.
    b.reset().unwrap();
    bring_up(&ctx, &a, &b, gid);
    a.post_recv(0).unwrap();
    b.slot_mut(1).unwrap()[0] = 9;
    b.post_send(1, 1, true).unwrap();
    assert!(next(&mut b).is_success());
    // The completion from before the reset is skipped: the one polled is
    // the new receive's.
    let c = next(&mut a);
    assert!(c.is_success() && c.is_recv(), "{c:?}");
    assert_eq!(c.slot(), 0);
    assert_eq!(a.slot(0).unwrap()[0], 9);
    assert!(a.poll().unwrap().is_none());
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_forgotten_queue_leaks_and_frees_nothing_rxe() {
    forgotten_queue(two(2, 64));
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_forgotten_queue_leaks_and_frees_nothing_iwarp() {
    forgotten_queue(two_iwarp(2, 64));
}

fn forgotten_queue(t: Two) {
    let failures = rdma::teardown_failures();
    let Two { mut a, b, .. } = t;
    a.post_recv(0).unwrap();
    a.post_recv(1).unwrap();
    // Never destroyed, never freed: the device may still write the slots.
    std::mem::forget(a);
    drop(b);
    assert_eq!(rdma::teardown_failures(), failures);
}

#[test]
#[ignore = "needs an RDMA device"]
fn bad_configurations_are_refused_rxe() {
    let ctx = common::open(&common::device_name());
    let pd = ctx.alloc_pd().unwrap();
    is_invalid(SlotQueue::new(&pd, &SlotConfig::new(0, 64)), "0 slots");
    is_invalid(SlotQueue::new(&pd, &SlotConfig::new(1, 0)), "slot length 0");
    let mut ud = SlotConfig::new(1, 64);
    ud.qp_type = rdma::QpType::Ud;
    is_invalid(SlotQueue::new(&pd, &ud), "RC or UC");
}
