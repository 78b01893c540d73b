//! Unit tests of the bookkeeping of requests in flight (`both.rs`: a
//! poll's pass over both queues of a QP whose CQ serves both).

mod both;

use super::*;
use crate::wc::Completion;

fn pending(t: &QpTracker, recv: bool, wr_id: u64) -> u64 {
    // SAFETY: tests post from one thread at a time.
    let mut p = unsafe { t.producer(recv, 1) };
    let id = p.wr_id(0);
    p.push(Pending::memory(wr_id, WrBuffers::None));
    id
}

/// A prepared request's send: its id is all it keeps.
fn quiet(t: &QpTracker, wr_id: u64) -> u64 {
    // SAFETY: tests post from one thread at a time.
    let mut p = unsafe { t.producer(false, 1) };
    let id = p.wr_id(0);
    p.push_quiet(wr_id);
    id
}

fn wc(id: u64) -> ffi::ibv_wc {
    ffi::ibv_wc {
        wr_id: id,
        ..Default::default()
    }
}

fn serial() -> Serial {
    Serial::allocate().expect("serials left")
}

fn qp(reg: &Registry) -> Arc<QpTracker> {
    QpTracker::new(serial(), reg, reg, (4, 4))
}

/// What a QP's teardown does after destroying the QP.
fn destroy(reg: &Registry, t: &QpTracker) -> usize {
    reg.unregister(t.serial());
    // SAFETY: unregistered, and the test posts and polls no more.
    unsafe { t.drain() }.len()
}

#[test]
fn spin_lock_excludes() {
    // Miri explores interleavings and is slow: fewer rounds there.
    const ROUNDS: u64 = if cfg!(miri) { 200 } else { 20_000 };
    let n = Arc::new(Spin::new(0u64));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let n = Arc::clone(&n);
            std::thread::spawn(move || {
                for _ in 0..ROUNDS {
                    // A read-modify-write that loses updates unless the
                    // lock excludes the other threads.
                    let mut g = n.lock();
                    let v = *g;
                    std::hint::black_box(&v);
                    *g = v + 1;
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(*n.lock(), 4 * ROUNDS);
}

#[test]
fn ids_round_trip() {
    let id = encode(0x2abc_def1, true, 0xffff_fffe);
    assert_eq!(decode(id), Some((0x2abc_def1, true, 0xffff_fffe)));
    assert_eq!(decode(encode(5, false, 0)), Some((5, false, 0)));
    assert_eq!(decode(42), None);
}

#[test]
fn send_completion_releases_earlier_unsignaled_requests() {
    let reg = Registry::default();
    let t = qp(&reg);
    pending(&t, false, 10);
    pending(&t, false, 11);
    let c = pending(&t, false, 12);
    let mut done = Vec::new();
    reg.extend(&[wc(c)], &mut done);
    assert_eq!(done[0].wr_id, 12);
    let ids: Vec<u64> = done[0].unsignaled.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, [10, 11]);
    assert_eq!(t.in_flight(), (0, 0));
}

#[test]
fn a_receive_whose_completion_was_lost_comes_back_with_the_next() {
    // A QP's receive queue completes in order: a completion for the second
    // receive means the first is done too, its completion lost (a provider
    // that cleaned it out of the CQ).
    let reg = Registry::default();
    let t = qp(&reg);
    let _lost = pending(&t, true, 1);
    let second = pending(&t, true, 2);
    let third = pending(&t, true, 3);
    let c = reg.completion(&wc(second));
    assert_eq!(c.wr_id, 2);
    let back: Vec<u64> = c.unsignaled.iter().map(|(id, _)| *id).collect();
    assert_eq!(back, [1], "the lost receive's memory comes back with it");
    assert_eq!(t.in_flight(), (0, 1));
    // The same completion again finds nothing: bare, nothing released.
    let again = reg.completion(&wc(second));
    assert!(decode(again.wr_id).is_some(), "left with our id");
    assert_eq!(reg.completion(&wc(third)).wr_id, 3);
    assert_eq!(t.in_flight(), (0, 0));
}

#[test]
fn one_lost_completion_leaves_nothing_behind() {
    // One completion that never comes must not leave every later one on a
    // slow path with a hole each (issue 20, item 4): each completion after
    // it finds its entry at the head.
    const N: u64 = if cfg!(miri) { 100 } else { 100_000 };
    let reg = Registry::default();
    let t = qp(&reg);
    pending(&t, true, u64::MAX);
    for i in 0..N {
        let id = pending(&t, true, i);
        let c = reg.completion(&wc(id));
        assert_eq!(c.wr_id, i);
        assert_eq!(t.in_flight(), (0, 0));
    }
}

#[test]
fn completions_of_a_dropped_qp_pass_through_bare() {
    let reg = Registry::default();
    let t = qp(&reg);
    let id = pending(&t, false, 7);
    assert_eq!(destroy(&reg, &t), 1);
    let done = [reg.completion(&wc(id))];
    assert!(done[0].buffers.is_empty());
    assert_eq!(decode(done[0].wr_id), None);
}

#[test]
fn serials_of_live_trackers_are_never_reused_across_the_wrap() {
    // Serials are 30 bits and wrap (issue 20, item 1): the 2^30-th QP made
    // after a long-lived one must not get its serial, or it would resolve its
    // completions against the old QP's queue and unregister it on drop.
    let reg = Registry::default();
    let old = qp(&reg);
    let old_id = pending(&old, true, 1);
    // As if 2^30 - 1 QPs had been made since: the counter is back at `old`.
    serial::force_next(old.serial());
    let new = qp(&reg);
    assert_ne!(new.serial(), old.serial(), "a live serial was given again");
    let new_id = pending(&new, true, 2);
    assert_eq!(reg.completion(&wc(old_id)).wr_id, 1);
    assert_eq!(reg.completion(&wc(new_id)).wr_id, 2);
    // Dropping the new one leaves the old one registered.
    let old_again = pending(&old, true, 3);
    destroy(&reg, &new);
    assert_eq!(reg.completion(&wc(old_again)).wr_id, 3);
    assert_eq!(old.in_flight(), (0, 0));
}

#[test]
fn a_destroyed_queue_keeps_its_serial_until_its_cq_is_seen_empty() {
    // A completion of a destroyed QP can wait in the CQ: its serial must not
    // come back to a new QP on that CQ until the CQ was polled empty.
    let reg = Registry::default();
    let gone = qp(&reg);
    let stale = pending(&gone, false, 5);
    let s = gone.serial();
    destroy(&reg, &gone);
    drop(gone);
    assert_eq!(reg.retired(), 1);
    serial::force_next(s);
    let other = qp(&reg);
    assert_ne!(
        other.serial(),
        s,
        "the serial is held while the CQ may hold its completions"
    );
    // The stale completion passes bare, then the CQ is found empty.
    let mut r = reg.resolver();
    let mut c = Completion::from_raw(&wc(stale));
    r.attach(&mut c);
    assert_eq!(decode(c.wr_id), None);
    assert!(c.buffers.is_empty());
    assert!(serial::is_live(s));
    r.cq_empty();
    drop(r);
    assert_eq!(reg.retired(), 0);
    assert!(!serial::is_live(s), "free again once the CQ was seen empty");
}

#[test]
fn a_cq_shared_by_many_queues_resolves_each_completion() {
    // Many QPs on one CQ (a server's connections): completions arrive
    // interleaved, each finds its own queue; queues come and go.
    const N: usize = if cfg!(miri) { 40 } else { 2000 };
    let reg = Registry::default();
    let qps: Vec<Arc<QpTracker>> = (0..N).map(|_| qp(&reg)).collect();
    assert_eq!(reg.len(), N);
    // Registering again (an SRQ's tracker, once per QP) keeps one entry.
    reg.register(Tracked::Qp(Arc::clone(&qps[0])));
    assert_eq!(reg.len(), N);
    let ids: Vec<u64> = qps
        .iter()
        .enumerate()
        .map(|(i, t)| pending(t, false, i as u64))
        .collect();
    // Every other queue goes away first.
    let mut qps: Vec<Option<Arc<QpTracker>>> = qps.into_iter().map(Some).collect();
    for slot in qps.iter_mut().skip(1).step_by(2) {
        let t = slot.take().expect("registered above");
        assert_eq!(destroy(&reg, &t), 1);
    }
    assert_eq!(reg.len(), N.div_ceil(2));
    // Completions in an order that defeats a most-recently-used list: from
    // the last queue to the first, the same queue never twice in a row.
    let wcs: Vec<ffi::ibv_wc> = ids.iter().rev().map(|&id| wc(id)).collect();
    let mut done = Vec::new();
    reg.extend(&wcs, &mut done);
    for (c, i) in done.iter().zip((0..N).rev()) {
        if i % 2 == 0 {
            assert_eq!(c.wr_id, i as u64, "queue {i} kept its request");
        } else {
            assert_eq!(decode(c.wr_id), None, "queue {i} is gone");
            assert!(c.buffers.is_empty());
        }
    }
    for t in qps.iter().flatten() {
        assert_eq!(t.in_flight(), (0, 0));
    }
    // The queue resolved last can go too; its completions then pass.
    let last = qps[0].take().expect("kept");
    destroy(&reg, &last);
    assert_eq!(decode(reg.completion(&wc(ids[0])).wr_id), None);
    reg.resolver().cq_empty();
    assert_eq!(Arc::strong_count(&last), 1, "the registry let go of it");
}

#[test]
fn a_queue_is_consumed_only_through_its_own_cq() {
    let (send, recv, other) = (
        Registry::default(),
        Registry::default(),
        Registry::default(),
    );
    let t = QpTracker::new(serial(), &send, &recv, (4, 4));
    other.register(Tracked::Qp(Arc::clone(&t)));
    let s = pending(&t, false, 1);
    let r = pending(&t, true, 2);
    // A send completion polled from the receive CQ (or any other) is left
    // bare and the request stays in flight.
    let wrong = recv.completion(&wc(s));
    assert_eq!(decode(wrong.wr_id), None);
    let wrong = other.completion(&wc(r));
    assert_eq!(decode(wrong.wr_id), None);
    assert_eq!(t.in_flight(), (1, 1));
    // Nor can another registry reclaim it.
    assert!(other.reclaim(&t, true).is_empty());
    assert_eq!(send.completion(&wc(s)).wr_id, 1);
    assert_eq!(recv.completion(&wc(r)).wr_id, 2);
    assert_eq!(t.in_flight(), (0, 0));
}

#[test]
fn reclaim_takes_everything_in_flight_and_later_completions_pass() {
    // What a RESET does: the queue is emptied without completions.
    let reg = Registry::default();
    let t = qp(&reg);
    let first = pending(&t, true, 1);
    pending(&t, true, 2);
    pending(&t, false, 3);
    let back: Vec<u64> = reg.reclaim(&t, true).iter().map(|p| p.wr_id).collect();
    assert_eq!(back, [1, 2]);
    assert_eq!(t.in_flight(), (1, 0));
    // A completion that was already in the CQ finds nothing.
    assert!(reg.completion(&wc(first)).buffers.is_empty());
    // New receives after the RESET complete as usual.
    let next = pending(&t, true, 4);
    assert_eq!(reg.completion(&wc(next)).wr_id, 4);
    assert_eq!(t.in_flight(), (1, 0));
}

#[test]
fn queue_wraps_its_ring_and_grows_with_entries_in_flight() {
    let reg = Registry::default();
    let t = qp(&reg);
    let mut ids = std::collections::VecDeque::new();
    // Many times the first ring's 4 slots deep (it doubles with entries in
    // flight that have wrapped), drained and refilled, wrapping many times.
    for round in 0..5u64 {
        for i in 0..(32 * 3 + 5) {
            ids.push_back((pending(&t, false, round * 1000 + i), round * 1000 + i));
        }
        while ids.len() > 7 {
            let (id, wr_id) = ids.pop_front().unwrap();
            assert_eq!(reg.completion(&wc(id)).wr_id, wr_id);
        }
        assert_eq!(t.in_flight(), (7, 0));
    }
    // One completion for the newest releases the rest as unsignaled.
    let (last, last_id) = ids.pop_back().unwrap();
    let c = reg.completion(&wc(last));
    assert_eq!(c.wr_id, last_id);
    let got: Vec<u64> = c.unsignaled.iter().map(|(id, _)| *id).collect();
    assert_eq!(got, ids.iter().map(|(_, id)| *id).collect::<Vec<_>>());
    assert_eq!(t.in_flight(), (0, 0));
}

#[test]
fn runs_of_unsignaled_requests_are_released_across_the_ring_s_wrap() {
    // A signaled completion every `period` requests, the run starting at
    // every offset of the ring: each completion gives back exactly the
    // requests since the previous one, in order, wherever they wrap.
    let reg = Registry::default();
    let t = qp(&reg);
    let mut next = 0u64;
    for period in [1u64, 2, 31, 32, 33, 64, 65, 100] {
        for _ in 0..3 {
            let first = next;
            let mut last = 0;
            for _ in 0..period {
                last = pending(&t, false, next);
                next += 1;
            }
            let c = reg.completion(&wc(last));
            assert_eq!(c.wr_id, next - 1);
            let got: Vec<u64> = c.unsignaled.iter().map(|(id, _)| *id).collect();
            assert_eq!(
                got,
                (first..next - 1).collect::<Vec<_>>(),
                "period {period}"
            );
            assert_eq!(t.in_flight(), (0, 0));
        }
    }
}

#[test]
fn a_queue_that_never_had_an_entry_leaves_completions_bare() {
    let reg = Registry::default();
    let t = qp(&reg);
    let stray = reg.completion(&wc(encode(t.serial(), true, 0)));
    assert_eq!(stray.wr_id, encode(t.serial(), true, 0));
    let id = pending(&t, true, 42);
    assert_eq!(reg.completion(&wc(id)).wr_id, 42);
    assert_eq!(t.in_flight(), (0, 0));
}

/// Posts `n` receives to an SRQ tracker with a verb that accepts them all;
/// returns their ids.
fn srq_post(t: &SrqTracker, wr_ids: std::ops::Range<u64>) -> Vec<u64> {
    let mut ids = Vec::new();
    let wrs = wr_ids.map(|i| (i, WrBuffers::None)).collect();
    let (rc, back) = t.post(wrs, |mut wr, _bad| {
        while !wr.is_null() {
            // SAFETY: the chain the tracker built, alive during the call.
            unsafe {
                ids.push((*wr).wr_id);
                wr = (*wr).next;
            }
        }
        0
    });
    assert_eq!((rc, back.len()), (0, 0));
    ids
}

#[test]
fn srq_receives_complete_in_any_order_in_constant_time() {
    // One receive whose completion never comes must not pin the SRQ's
    // queue (issue 20, item 4): no later completion takes a slow path or
    // leaves a hole, and `in_flight` goes back to zero.
    const N: u64 = if cfg!(miri) { 50 } else { 100_000 };
    let reg = Registry::default();
    let t = SrqTracker::new(serial());
    reg.register(Tracked::Srq(Arc::clone(&t)));
    let lost = srq_post(&t, 0..1);
    assert_eq!(t.in_flight(), 1);
    for i in 1..=N {
        let id = srq_post(&t, i..i + 1)[0];
        assert_eq!(reg.completion(&wc(id)).wr_id, i);
        assert_eq!(t.in_flight(), 1, "only the lost one stays");
    }
    // Out of order too.
    let ids = srq_post(&t, 100..110);
    for (k, &id) in ids.iter().enumerate().rev() {
        assert_eq!(reg.completion(&wc(id)).wr_id, 100 + k as u64);
    }
    assert_eq!(reg.completion(&wc(lost[0])).wr_id, 0);
    assert_eq!(t.in_flight(), 0);
}

/// The registry keeps the last QP or SRQ by its serial without the receive
/// bit: an id with an SRQ's serial and no receive bit (no request of ours
/// has one) is left bare, cached SRQ or not, and takes no receive.
#[test]
fn a_send_id_with_an_srq_s_serial_resolves_nothing() {
    let reg = Registry::default();
    let t = SrqTracker::new(serial());
    reg.register(Tracked::Srq(Arc::clone(&t)));
    let ids = srq_post(&t, 0..2);
    let forged = ids[1] & !RECV;
    // Before the SRQ is the last resolved, and after.
    assert_eq!(decode(reg.completion(&wc(forged)).wr_id), None);
    assert_eq!(reg.completion(&wc(ids[0])).wr_id, 0);
    assert_eq!(decode(reg.completion(&wc(forged)).wr_id), None);
    assert_eq!(t.in_flight(), 1);
    assert_eq!(reg.completion(&wc(ids[1])).wr_id, 1);
    assert_eq!(t.in_flight(), 0);
}

#[test]
fn srq_takes_back_what_the_verb_did_not_post() {
    let t = SrqTracker::new(serial());
    let wrs = (0..5).map(|i| (i, WrBuffers::None)).collect();
    // The verb posts two and refuses the third.
    let (rc, back) = t.post(wrs, |wr, bad| {
        // SAFETY: the chain the tracker built, alive during the call.
        unsafe { *bad = (*(*wr).next).next };
        libc::ENOMEM
    });
    assert_eq!(rc, libc::ENOMEM);
    assert_eq!(
        back.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        [2, 3, 4]
    );
    assert_eq!(t.in_flight(), 2);
    assert_eq!(t.drain().len(), 2);
}

#[test]
fn a_shared_queue_takes_posts_and_polls_from_many_threads() {
    const N: u64 = if cfg!(miri) { 40 } else { 4_000 };
    let regs: Arc<[Registry; 2]> = Arc::new([Registry::default(), Registry::default()]);
    let t = SrqTracker::new(serial());
    regs[0].register(Tracked::Srq(Arc::clone(&t)));
    regs[1].register(Tracked::Srq(Arc::clone(&t)));
    let (tx, rx) = std::sync::mpsc::channel::<u64>();
    let posters: Vec<_> = (0..2u64)
        .map(|k| {
            let (t, tx) = (Arc::clone(&t), tx.clone());
            std::thread::spawn(move || {
                for i in 0..N {
                    let id = srq_post(&t, k * N + i..k * N + i + 1)[0];
                    tx.send(id).unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    let ids: Vec<u64> = rx.iter().collect();
    for p in posters {
        p.join().unwrap();
    }
    // Two pollers, each on its own CQ, complete everything.
    let halves: Vec<Vec<u64>> = ids.chunks(ids.len() / 2).map(<[u64]>::to_vec).collect();
    let pollers: Vec<_> = halves
        .into_iter()
        .enumerate()
        .map(|(k, half)| {
            let regs = Arc::clone(&regs);
            std::thread::spawn(move || {
                half.iter()
                    .map(|&id| regs[k].completion(&wc(id)).wr_id)
                    .collect::<Vec<u64>>()
            })
        })
        .collect();
    let mut got: Vec<u64> = pollers
        .into_iter()
        .flat_map(|p| p.join().unwrap())
        .collect();
    got.sort_unstable();
    assert_eq!(got, (0..2 * N).collect::<Vec<_>>());
    assert_eq!(t.in_flight(), 0);
}

#[test]
fn a_qp_queue_between_a_producer_and_a_consumer_thread() {
    // The producer publishes after "posting" (as the QP does after the
    // provider call); the consumer polls completions it may see first.
    const N: u32 = if cfg!(miri) { 100 } else { 20_000 };
    let reg = Arc::new(Registry::default());
    let t = qp(&reg);
    let (tx, rx) = std::sync::mpsc::sync_channel::<u64>(64);
    let producer = {
        let t = Arc::clone(&t);
        std::thread::spawn(move || {
            for i in 0..N {
                // SAFETY: the only producer of this queue.
                let mut p = unsafe { t.producer(false, 1) };
                // The "completion" is visible before the push.
                tx.send(p.wr_id(0)).unwrap();
                p.push(Pending::memory(u64::from(i), WrBuffers::None));
            }
        })
    };
    for (i, id) in rx.iter().enumerate() {
        assert_eq!(reg.completion(&wc(id)).wr_id, i as u64);
    }
    producer.join().unwrap();
    assert_eq!(t.in_flight(), (0, 0));
}

#[test]
fn runs_released_by_one_thread_make_room_for_another_thread_s_posts() {
    // A signaled request every 70: each completion releases a run that
    // wraps the ring, while the producer keeps posting into the slots it
    // frees, and grows the ring (under the consumer's lock) when a run is
    // not polled yet.
    const N: u32 = if cfg!(miri) { 350 } else { 35_000 };
    const PERIOD: u32 = 70;
    let reg = Arc::new(Registry::default());
    let t = qp(&reg);
    let (tx, rx) = std::sync::mpsc::sync_channel::<(u64, u32)>(4);
    let producer = {
        let t = Arc::clone(&t);
        std::thread::spawn(move || {
            for i in 0..N {
                // SAFETY: the only producer of this queue.
                let mut p = unsafe { t.producer(false, 1) };
                let id = p.wr_id(0);
                p.push(Pending::memory(u64::from(i), WrBuffers::None));
                drop(p);
                if (i + 1) % PERIOD == 0 {
                    tx.send((id, i)).unwrap();
                }
            }
        })
    };
    let mut next = 0u64;
    for (id, i) in rx.iter() {
        let c = reg.completion(&wc(id));
        assert_eq!(c.wr_id, u64::from(i));
        let got: Vec<u64> = c.unsignaled.iter().map(|(id, _)| *id).collect();
        assert_eq!(got, (next..u64::from(i)).collect::<Vec<_>>());
        next = u64::from(i) + 1;
    }
    producer.join().unwrap();
    assert_eq!(next, u64::from(N));
    assert_eq!(t.in_flight(), (0, 0));
}

#[test]
fn two_pollers_of_one_cq_resolve_in_the_cq_s_order() {
    // A poll takes completions off the CQ under the registry's lock (issue
    // 20, item 5): outside it, another poller could resolve a later send
    // completion first and release the earlier (signaled) request as
    // unsignaled. The CQ here is a queue popped under the resolver, as
    // `CompletionQueue::poll` does.
    const N: u64 = if cfg!(miri) { 60 } else { 20_000 };
    let reg = Arc::new(Registry::default());
    let t = qp(&reg);
    let cq = Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
    for i in 0..N {
        let id = pending(&t, false, i);
        // Every request signaled: each has its own completion.
        cq.lock().unwrap().push_back(id);
    }
    let pollers: Vec<_> = (0..2)
        .map(|_| {
            let (reg, cq) = (Arc::clone(&reg), Arc::clone(&cq));
            std::thread::spawn(move || {
                let mut got = Vec::new();
                loop {
                    let mut r = reg.resolver();
                    let Some(id) = cq.lock().unwrap().pop_front() else {
                        break;
                    };
                    let mut c = Completion::from_raw(&wc(id));
                    r.attach(&mut c);
                    drop(r);
                    assert!(c.unsignaled.is_empty(), "a signaled request released early");
                    got.push(c.wr_id);
                }
                got
            })
        })
        .collect();
    let mut got: Vec<u64> = pollers
        .into_iter()
        .flat_map(|p| p.join().unwrap())
        .collect();
    got.sort_unstable();
    assert_eq!(got, (0..N).collect::<Vec<_>>());
    assert_eq!(t.in_flight(), (0, 0));
}

/// A prepared request dropped while its sends are in flight hands its
/// memory to the tracker (`adopt`): kept until a completion passes its last
/// send, then released by that poll; released at once when already done;
/// dropped with the QP's drain otherwise.
#[test]
fn orphaned_memory_lives_until_its_last_send_is_done() {
    let reg = Registry::default();
    let t = qp(&reg);
    let first = pending(&t, false, 1);
    let last = pending(&t, false, 2);
    let after = pending(&t, false, 3);
    let seq = |id: u64| decode(id).map(|(_, _, s)| s).expect("our id");
    assert!(t.send_in_flight(seq(last)));
    let memory = Arc::new(());
    t.adopt(Orphan {
        recv: false,
        seq: seq(last),
        keep: Box::new(Arc::clone(&memory)),
    });
    let alive = Arc::downgrade(&memory);
    drop(memory);
    // The completion of an earlier send does not pass it.
    assert_eq!(reg.completion(&wc(first)).wr_id, 1);
    assert!(
        alive.upgrade().is_some(),
        "released before its send was done"
    );
    // A later one does (the queue completes in order).
    assert_eq!(reg.completion(&wc(after)).wr_id, 3);
    assert!(!t.send_in_flight(seq(last)));
    assert!(alive.upgrade().is_none(), "kept after its send was done");

    // Adopted after its send is done: released at once.
    let done = pending(&t, false, 4);
    assert_eq!(reg.completion(&wc(done)).wr_id, 4);
    let memory = Arc::new(());
    let alive = Arc::downgrade(&memory);
    t.adopt(Orphan {
        recv: false,
        seq: seq(done),
        keep: Box::new(memory),
    });
    assert!(alive.upgrade().is_none(), "a done send's memory was kept");

    // Still in flight when the QP goes: dropped by its drain.
    let stuck = pending(&t, false, 5);
    let memory = Arc::new(());
    let alive = Arc::downgrade(&memory);
    t.adopt(Orphan {
        recv: false,
        seq: seq(stuck),
        keep: Box::new(memory),
    });
    assert!(alive.upgrade().is_some());
    assert_eq!(destroy(&reg, &t), 1, "the send in flight");
    assert!(alive.upgrade().is_none(), "the drain kept it");
}

/// A prepared receive region dropped while its receives are in flight is
/// kept until the receive queue passes its last receive: a send completion
/// does not release it, the receive's does.
#[test]
fn orphaned_receive_memory_waits_for_the_receive_queue() {
    let reg = Registry::default();
    let t = qp(&reg);
    let recv = pending(&t, true, 1);
    let send = pending(&t, false, 2);
    let seq = |id: u64| decode(id).map(|(_, _, s)| s).expect("our id");
    assert!(t.request_in_flight(true, seq(recv)));
    let memory = Arc::new(());
    let alive = Arc::downgrade(&memory);
    t.adopt(Orphan {
        recv: true,
        seq: seq(recv),
        keep: Box::new(memory),
    });
    assert_eq!(reg.completion(&wc(send)).wr_id, 2);
    assert!(
        alive.upgrade().is_some(),
        "released by a send completion while its receive was in flight"
    );
    assert_eq!(reg.completion(&wc(recv)).wr_id, 1);
    assert!(!t.request_in_flight(true, seq(recv)));
    assert!(alive.upgrade().is_none(), "kept after its receive was done");
    assert_eq!(destroy(&reg, &t), 0);
}

/// A prepared request's sends hold nothing and are not listed as
/// unsignaled; other requests finished by the same completion are.
#[test]
fn quiet_sends_are_not_listed_as_unsignaled() {
    let reg = Registry::default();
    let t = qp(&reg);
    quiet(&t, 1);
    pending(&t, false, 2);
    quiet(&t, 3);
    let c = quiet(&t, 4);
    let done = reg.completion(&wc(c));
    assert_eq!(done.wr_id, 4);
    let ids: Vec<u64> = done.unsignaled.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, [2]);
    assert_eq!(t.in_flight(), (0, 0));
    // The oldest in flight, on its own: its id comes back, nothing else.
    for id in 5..40 {
        let c = quiet(&t, id);
        let done = reg.completion(&wc(c));
        assert_eq!(done.wr_id, id);
        assert!(done.unsignaled.is_empty() && matches!(done.buffers, WrBuffers::None));
    }
    assert_eq!(t.in_flight(), (0, 0));
}

#[test]
fn a_cq_alternating_between_a_qp_s_two_queues_resolves_each() {
    // The registry keeps the queue resolved last; a CQ that both queues of
    // a QP complete on switches between them at every completion.
    let reg = Registry::default();
    let t = qp(&reg);
    for i in 0..10u64 {
        let s = pending(&t, false, 2 * i);
        let r = pending(&t, true, 2 * i + 1);
        assert_eq!(reg.completion(&wc(r)).wr_id, 2 * i + 1);
        assert_eq!(t.in_flight(), (1, 0));
        assert_eq!(reg.completion(&wc(s)).wr_id, 2 * i);
        assert_eq!(t.in_flight(), (0, 0));
    }
    assert_eq!(destroy(&reg, &t), 0);
    // Gone: its ids no longer resolve, even right after being the last.
    let stray = reg.completion(&wc(encode(t.serial(), false, 20)));
    assert_eq!(decode(stray.wr_id), None);
}

/// A poll's batch resolves runs of one queue's completions as one, and
/// whatever breaks a run (another queue, a caller's own id, a completion
/// that also finishes earlier requests, one not in flight) resolves as on
/// its own.
#[test]
fn a_poll_s_runs_and_what_breaks_them_resolve_in_the_cq_s_order() {
    let reg = Registry::default();
    let t = qp(&reg);
    let other = qp(&reg);
    let s1 = quiet(&t, 1);
    let s2 = pending(&t, false, 2);
    let s3 = quiet(&t, 3);
    let r4 = pending(&t, true, 4);
    let o5 = pending(&other, false, 5);
    let _unsignaled6 = quiet(&t, 6);
    let s7 = pending(&t, false, 7);
    let s8 = quiet(&t, 8);
    // Not ours: left as it is.
    let mine = 99;
    let batch = [s1, s2, s3, r4, o5, mine, s7, s8, s8];
    let mut done = Vec::new();
    reg.extend(&batch.map(wc), &mut done);
    let ids: Vec<u64> = done.iter().map(|c| c.wr_id).collect();
    // The second `s8` is not in flight any more: left bare.
    assert_eq!(ids[..8], [1, 2, 3, 4, 5, 99, 7, 8]);
    assert_eq!(ids[8], s8);
    // The unsignaled send before `s7` came back with it, alone.
    let unsignaled: Vec<Vec<u64>> = done
        .iter()
        .map(|c| c.unsignaled.iter().map(|(id, _)| *id).collect())
        .collect();
    assert_eq!(unsignaled[6], Vec::<u64>::new());
    assert!(unsignaled.iter().all(Vec::is_empty));
    assert_eq!(t.in_flight(), (0, 0));
    assert_eq!(other.in_flight(), (0, 0));
    assert_eq!(destroy(&reg, &t), 0);
    assert_eq!(destroy(&reg, &other), 0);
}

/// A prepared request dropped while another thread resolves its send's
/// completion: whichever side goes first, the memory is released by the
/// time both are done, not kept until some later completion. The adopter
/// publishes the orphan and then looks at the queue; the poll moves the
/// queue and then looks for orphans. Each side's fence orders its store
/// before its load (the store-buffering pattern): with a fence on one side
/// only, both could read the other's old value and the memory would wait
/// for the queue's next completion, or the QP's end.
#[test]
fn an_orphan_adopted_while_its_send_completes_is_released_by_one_side() {
    let rounds = if cfg!(miri) { 40 } else { 2000 };
    for round in 0..rounds {
        let reg = Registry::default();
        let t = qp(&reg);
        let id = pending(&t, false, 1);
        let seq = decode(id).map(|(_, _, s)| s).expect("our id");
        let memory = Arc::new(());
        let alive = Arc::downgrade(&memory);
        std::thread::scope(|s| {
            s.spawn(|| assert_eq!(reg.completion(&wc(id)).wr_id, 1));
            t.adopt(Orphan {
                recv: false,
                seq,
                keep: Box::new(memory),
            });
        });
        assert!(
            alive.upgrade().is_none(),
            "round {round}: an orphan whose send was done kept its memory"
        );
        assert_eq!(destroy(&reg, &t), 0);
    }
}
