//! Faults inside one machine: a CQ overrun, a QP forced into the error state
//! under a posting thread, fork while memory is registered. Each accounts
//! for every request and ends with `rdma resource show` and the process's
//! open descriptors back to where they were before it, and
//! `rdma::teardown_failures()` zero.
//! (Events left unacknowledged at drop: `cm/events.rs`
//! `dropping_ids_with_events_unacked_does_not_hang` and `cq_events.rs`
//! `event_held_while_everything_else_is_dropped`, and their `iwarp_`
//! versions.)

mod common;

use common::{assert_back_to, baseline};

use std::time::{Duration, Instant};

use rdma::{AccessFlags, AsyncEventElement, AsyncEventType, QpType, SendWr, WcStatus};

const LW: AccessFlags = AccessFlags::LOCAL_WRITE;

/// Waits up to 10 s for an async event of `want` on `ctx`.
fn wait_async(ctx: &rdma::Context, want: AsyncEventType) -> rdma::AsyncEvent {
    ctx.set_async_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match ctx.get_async_event() {
            Ok(ev) if ev.event_type == want => return ev,
            Ok(ev) => eprintln!("other async event: {ev:?}"),
            Err(e) if e.errno() == Some(libc::EAGAIN) => {}
            Err(e) => panic!("ibv_get_async_event: {e}"),
        }
        assert!(Instant::now() < deadline, "no {want} event within 10 s");
        std::thread::yield_now();
    }
}

/// More completions than the CQ holds: the device reports the overrun as a
/// CQ_ERR async event naming that CQ, the CQ gives at most its size, and
/// everything still tears down.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn cq_overrun_is_an_async_event() {
    let before = baseline();
    let ctx = common::open(&common::device_name());
    let gid_index = common::gid_index() as u8;
    let pd = ctx.alloc_pd().unwrap();
    let small = ctx.create_cq(2, None, 0).unwrap();
    let big = ctx.create_cq(64, None, 0).unwrap();
    let size = small.cqe() as usize;
    let mut a = pd.qp_builder(QpType::Rc, &small, &big).build().unwrap();
    let mut b = pd.qp_builder(QpType::Rc, &big, &big).build().unwrap();
    common::connect(&ctx, &a, &b, gid_index);
    common::connect(&ctx, &b, &a, gid_index);
    let n = size + 6;
    let recvs = pd.alloc_mr(n * 16, LW).unwrap().chunks(16).unwrap();
    b.post_recv_batch(
        recvs
            .into_iter()
            .enumerate()
            .map(|(i, m)| (i as u64, m.into())),
    )
    .map_err(|p| p.drop_buffers())
    .unwrap();
    for i in 0..n {
        let msg = pd.reg_mr(vec![i as u8; 16], AccessFlags::empty()).unwrap();
        a.post_send(SendWr::send(i as u64, msg))
            .map_err(|p| p.drop_buffers())
            .unwrap();
    }
    // All n arrive at b (its CQ has room): the sends were all carried out.
    let got = common::wait(&big, n);
    assert!(got.iter().all(|c| c.is_success()), "{got:?}");
    let ev = wait_async(&ctx, AsyncEventType::CqErr);
    assert_eq!(
        ev.element,
        AsyncEventElement::Cq(small.as_raw() as usize),
        "{ev:?}"
    );
    // The CQ holds what fit: no more than its size, in order, successful.
    let mut out = Vec::new();
    let polled = small.poll(&mut out, n);
    eprintln!(
        "overrun CQ of {size}: poll gave {polled:?}, {} completions",
        out.len()
    );
    match polled {
        Ok(_) => {
            assert!(out.len() <= size, "{out:?}");
            for (i, c) in out.iter().enumerate() {
                assert_eq!((c.wr_id, c.status), (i as u64, WcStatus::Success), "{c:?}");
            }
        }
        // A provider that reports the overrun on the poll itself.
        Err(e) => assert!(e.to_string().contains("ibv_poll_cq"), "{e}"),
    }
    drop(out);
    // The sends whose completions were lost are still the QP's; the QP gives
    // them back when it is reset.
    let (sends_left, _) = a.in_flight();
    let back = a.reset().expect("reset gives the memory back");
    assert_eq!(back.len(), sends_left, "every lost send comes back");
    drop((back, got, ev, a, b, small, big, pd, ctx));
    assert_back_to(before);
}

/// A thread streams RDMA WRITEs while another moves the QP to the error state
/// (the raw verb, as the kernel would on a fatal error): every post is
/// either refused with its memory returned or completed, in order, with
/// success before the switch and flushes after it.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn qp_moved_to_error_while_another_thread_posts() {
    let before = baseline();
    // RDMA WRITEs: they need no receives at the other end.
    let mut p = common::pair(QpType::Rc, LW | AccessFlags::REMOTE_WRITE);
    let target = p.pd.alloc_mr(64, LW | AccessFlags::REMOTE_WRITE).unwrap();
    let remote = target.remote();
    let Streamed {
        posted,
        refused,
        statuses,
        ..
    } = stream_writes_while_switched_to_error(&mut p.a, &p.cq, &p.pd, remote, 64, 0, false);
    let first_bad = statuses.iter().position(|s| *s != WcStatus::Success);
    eprintln!(
        "{posted} posted, {refused} refused, first flush at {first_bad:?}, {} completions",
        statuses.len()
    );
    assert!(posted >= 100);
    assert_eq!(statuses.len() as u64, posted, "every posted send completed");
    if let Some(i) = first_bad {
        assert!(
            statuses[i..].iter().all(|s| *s == WcStatus::WrFlushErr),
            "{statuses:?}"
        );
    }
    assert_eq!(p.a.in_flight().0, 0);
    drop((target, p));
    assert_back_to(before);
}

/// fork() while memory is registered: the child writes its copy of the
/// region; the parent's registration still reaches the parent's memory (an
/// RDMA WRITE lands where the parent reads it), and the child's writes are
/// not in it.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn fork_with_registered_memory() {
    let before = baseline();
    let access = LW | AccessFlags::REMOTE_WRITE;
    let mut p = common::pair(QpType::Rc, access);
    let target = p.pd.reg_mr(vec![1u8; 4096], access).unwrap();
    fork_then_write(&target, |remote| {
        let src = p.pd.reg_mr(vec![7u8; 4096], AccessFlags::empty()).unwrap();
        p.a.post_send(SendWr::write(1, src, remote)).unwrap();
        let c = common::wait(&p.cq, 1).pop().unwrap();
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
    });
    drop((target, p));
    assert_back_to(before);
}

/// The same over iWARP (siw0), on a connection in this process: the
/// region is the server end's, the WRITE the client's. siw completes a
/// WRITE once TCP took it, so a SEND after it (iWARP keeps their order)
/// says it landed.
#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_fork_with_registered_memory() {
    use common::iwarp::{iwarp_connection, send_one};
    use rdma::cm::EventChannel;
    let listen = common::iwarp::listener;
    // librdmacm's context on siw0 (kept for the life of the process).
    drop(listen(&EventChannel::new().unwrap()));
    let before = baseline();
    let ch = EventChannel::new().unwrap();
    let listener = listen(&ch);
    let (mut client, mut server) = iwarp_connection(&ch, &listener);
    let target = server
        .pd
        .reg_mr(vec![1u8; 4096], LW | AccessFlags::REMOTE_WRITE)
        .unwrap();
    fork_then_write(&target, |remote| {
        let src = client
            .pd
            .reg_mr(vec![7u8; 4096], AccessFlags::empty())
            .unwrap();
        client.qp.post_send(SendWr::write(1, src, remote)).unwrap();
        let c = common::wait(&client.cq, 1).pop().unwrap();
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        send_one(&mut client, &mut server, 9);
    });
    drop((target, client, server, listener, ch));
    assert_back_to(before);
}

/// Forks; the child fills its copy of `target` (4096 bytes of 1) with 0xcc
/// and exits; the parent's copy must still hold 1s. Then `write` must put
/// 4096 bytes of 7 at `target`'s remote address (and wait until they
/// landed): they must be in the parent's memory.
fn fork_then_write(target: &rdma::MemoryRegion, write: impl FnOnce(rdma::RemoteMemory)) {
    assert_eq!(target.to_vec(), vec![1u8; 4096]);
    let addr = target.addr() as usize;
    // SAFETY: fork in a test process; the child only writes memory and calls
    // _exit (async-signal-safe).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: the child's own copy of the region's pages.
        unsafe {
            std::ptr::write_bytes(addr as *mut u8, 0xcc, 4096);
            let ok = *(addr as *const u8).add(4095) == 0xcc;
            libc::_exit(if ok { 0 } else { 3 });
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status}"
    );
    assert_eq!(
        target.to_vec(),
        vec![1u8; 4096],
        "the child's writes stayed in the child"
    );
    write(target.remote());
    assert_eq!(
        target.to_vec(),
        vec![7u8; 4096],
        "the WRITE after fork reached the parent's memory"
    );
}

/// The CQ overrun over iWARP (siw), on a connection in this process (siw
/// has no connected QP without RDMA CM): the sender's send CQ holds 2 or so
/// entries, 8 more signaled SENDs than that are carried out (the receiver,
/// whose CQ has room, gets them all, in order); the overrun is reported as
/// a CQ_ERR async event naming that CQ; the CQ gives at most its size; the
/// sends whose completions were lost come back from `reset`, one each.
#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_cq_overrun_is_an_async_event() {
    use common::iwarp::{iwarp_ip, next_event};
    use rdma::cm::{CmEventType, ConnParam, EventChannel, PortSpace};
    use std::net::SocketAddr;
    let listen = common::iwarp::listener;
    // librdmacm's context on siw0 (kept for the life of the process).
    drop(listen(&EventChannel::new().unwrap()));
    let before = baseline();
    let ch = EventChannel::new().unwrap();
    let listener = listen(&ch);
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    id.resolve_addr(
        None,
        SocketAddr::new(iwarp_ip(), listener.src_port()),
        Duration::from_secs(5),
    )
    .unwrap();
    drop(next_event(&ch, CmEventType::AddrResolved));
    id.resolve_route(Duration::from_secs(5)).unwrap();
    drop(next_event(&ch, CmEventType::RouteResolved));
    let ctx = id.context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let small = ctx.create_cq(2, None, 0).unwrap();
    let big = ctx.create_cq(64, None, 0).unwrap();
    let size = small.cqe() as usize;
    let n = size + 8;
    let mut a = pd.qp_builder(QpType::Rc, &small, &big).build().unwrap();
    id.connect_qp(&a, &ConnParam::default()).unwrap();
    let req = next_event(&ch, CmEventType::ConnectRequest);
    let sid = req.id().clone();
    drop(req);
    let spd = sid.context().unwrap().alloc_pd().unwrap();
    let scq = sid.context().unwrap().create_cq(64, None, 0).unwrap();
    let mut b = spd.qp_builder(QpType::Rc, &scq, &scq).build().unwrap();
    sid.modify_qp(&b, rdma::QpState::Init).unwrap();
    let recvs = spd.alloc_mr(n * 16, LW).unwrap().chunks(16).unwrap();
    b.post_recv_batch(
        recvs
            .into_iter()
            .enumerate()
            .map(|(i, m)| (i as u64, m.into())),
    )
    .map_err(|p| p.drop_buffers())
    .unwrap();
    sid.accept_qp(&b, &ConnParam::default()).unwrap();
    for _ in 0..2 {
        let e = ch
            .get_event_timeout(Duration::from_secs(10))
            .unwrap()
            .expect("established within 10 s");
        match (e.event_type(), e.status()) {
            (CmEventType::ConnectResponse, 0) => {
                drop(e);
                id.establish_qp(&a).unwrap();
            }
            (CmEventType::Established, 0) => {}
            _ => panic!("connecting: {e:?}"),
        }
    }
    for i in 0..n {
        let msg = pd.reg_mr(vec![i as u8; 16], AccessFlags::empty()).unwrap();
        a.post_send(SendWr::send(i as u64, msg))
            .map_err(|p| p.drop_buffers())
            .unwrap();
    }
    let ev = wait_async(&ctx, AsyncEventType::CqErr);
    assert_eq!(
        ev.element,
        AsyncEventElement::Cq(small.as_raw() as usize),
        "{ev:?}"
    );
    // What arrived at b: in order, whole, successful.
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    while got.len() < n && Instant::now() < deadline {
        scq.poll(&mut out, 64).expect("poll b");
        got.append(&mut out);
    }
    for (i, c) in got.iter_mut().enumerate() {
        assert_eq!((c.wr_id, c.status), (i as u64, WcStatus::Success), "{c:?}");
        assert_eq!(
            c.take_buffers().into_one().unwrap().to_vec(),
            vec![i as u8; 16]
        );
    }
    let mut out = Vec::new();
    let polled = small.poll(&mut out, n);
    eprintln!(
        "iWARP overrun CQ of {size}: b received {} of {n}; poll gave {polled:?}, {} completions: {:?}",
        got.len(),
        out.len(),
        out.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>()
    );
    let polled_n = out.len();
    assert!(polled_n <= size, "{out:?}");
    drop(out);
    let (sends_left, _) = a.in_flight();
    let back = a.reset().expect("reset gives the memory back");
    eprintln!(
        "{sends_left} sends in flight, {} back from reset",
        back.len()
    );
    assert_eq!(back.len(), sends_left, "every lost send comes back");
    assert_eq!(polled_n + back.len(), n, "every send accounted for");
    drop((back, got, ev, a, b, small, big, pd, scq, spd, ctx));
    drop((sid, id, listener, ch));
    drop(EventChannel::new().map(|c| listen(&c)));
    assert_back_to(before);
}

/// The QP moved to the error state while another thread posts, over iWARP
/// (siw), on a connection in this process: RDMA WRITEs streamed by one
/// thread while another moves the QP to ERR (raw verb). Every post is
/// refused with its memory returned, or completes (in order: successes,
/// then at most one `LOC_QP_OP_ERR`, the WRITE siw was transmitting, then
/// flushes), or, posted after the switch and never completed by siw,
/// is taken back by `reset`. siw writes the flushes of what it had into
/// the CQ before `ibv_modify_qp` returns, so once the switch is done and
/// the poster has stopped, an empty poll means nothing more will come.
#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_qp_moved_to_error_while_another_thread_posts() {
    use common::iwarp::iwarp_connection;
    use rdma::cm::EventChannel;
    const BASE: u64 = 1000;
    // 64 KiB each, so that siw still holds some (not yet given to TCP)
    // when the switch comes.
    const LEN: usize = 64 << 10;
    let listen = common::iwarp::listener;
    // librdmacm's context on siw0 (kept for the life of the process).
    drop(listen(&EventChannel::new().unwrap()));
    let before = baseline();
    let ch = EventChannel::new().unwrap();
    let listener = listen(&ch);
    let (mut a, b) = iwarp_connection(&ch, &listener);
    let target = b.pd.alloc_mr(LEN, LW | AccessFlags::REMOTE_WRITE).unwrap();
    let remote = target.remote();
    let Streamed {
        posted,
        refused,
        statuses,
        reclaimed,
    } = stream_writes_while_switched_to_error(&mut a.qp, &a.cq, &a.pd, remote, LEN, BASE, true);
    let first_bad = statuses.iter().position(|s| *s != WcStatus::Success);
    eprintln!(
        "iWARP: {posted} posted, {refused} refused, first flush at {first_bad:?}, {} completions, {reclaimed} taken back by reset",
        statuses.len()
    );
    assert!(posted >= 100);
    assert_eq!(
        statuses.len() as u64 + reclaimed,
        posted,
        "every posted WRITE completed or was taken back"
    );
    // The WRITE siw was transmitting when the switch came ends in
    // LOC_QP_OP_ERR (its transmit error path), the rest are flushed.
    if let Some(i) = first_bad {
        assert!(
            statuses[i..]
                .iter()
                .enumerate()
                .all(|(k, s)| *s == WcStatus::WrFlushErr || (k == 0 && *s == WcStatus::LocQpOpErr)),
            "{statuses:?}"
        );
    }
    assert_eq!(a.qp.in_flight().0, 0);
    drop((target, a, b, listener, ch));
    drop(listen(&EventChannel::new().unwrap()));
    assert_back_to(before);
}

/// What `stream_writes_while_switched_to_error` saw.
struct Streamed {
    posted: u64,
    refused: u64,
    /// The WRITEs' completions, in posting order.
    statuses: Vec<WcStatus>,
    /// WRITEs without a completion, taken back by `reset` at the end.
    reclaimed: u64,
}

/// The posting loop both devices' tests share: a thread streams RDMA WRITEs
/// of `len` bytes (work request ids from `base`) to `remote`, 16 in flight,
/// while this one moves the QP to the error state with the raw verb once
/// 100 were posted. A refused post returns its memory and stops the posting;
/// completions must come in order, and the first that is not a success
/// stops it too. Completions below `base` are the connection's posted
/// receive, which must be flushed. The loop ends when every posted WRITE
/// has completed, or, with `empty_poll_ends` (siw: it writes its flushes
/// before `ibv_modify_qp` returns), at an empty poll after the switch;
/// then `reset` takes back what never completed. Every wait: 30 s.
fn stream_writes_while_switched_to_error(
    qp: &mut rdma::QueuePair,
    cq: &rdma::CompletionQueue,
    pd: &rdma::ProtectionDomain,
    remote: rdma::RemoteMemory,
    len: usize,
    base: u64,
    empty_poll_ends: bool,
) -> Streamed {
    let raw = qp.as_raw() as usize;
    let (at_100, reached) = std::sync::mpsc::channel::<()>();
    let switched = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let switched = &switched;
        let poster = s.spawn(move || {
            let mut posted = 0u64;
            let mut refused = 0u64;
            let mut statuses = Vec::new();
            let mut out = Vec::new();
            let mut free: Vec<_> = pd.alloc_mr(16 * len, LW).unwrap().chunks(len).unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut stopped = false;
            loop {
                if !stopped {
                    if let Some(m) = free.pop() {
                        match qp.post_send(SendWr::write(base + posted, m, remote)) {
                            Ok(()) => posted += 1,
                            Err(e) => {
                                refused += 1;
                                assert_eq!(e.returned.len(), 1, "{}", e.error);
                                free.extend(
                                    e.returned.into_iter().filter_map(|(_, b)| b.into_one()),
                                );
                                stopped = true;
                            }
                        }
                    }
                    if posted == 100 {
                        at_100.send(()).unwrap();
                    }
                }
                // Read the switch before polling: an empty poll after it
                // has nothing more to wait for (siw).
                let done_switching = switched.load(std::sync::atomic::Ordering::Acquire);
                cq.poll(&mut out, 16).unwrap();
                let empty = out.is_empty();
                for mut c in out.drain(..) {
                    if c.wr_id < base {
                        // The receive the connection left posted: flushed.
                        assert_eq!(c.status, WcStatus::WrFlushErr, "{c:?}");
                        continue;
                    }
                    assert_eq!(c.wr_id, base + statuses.len() as u64, "in order: {c:?}");
                    if c.status != WcStatus::Success {
                        stopped = true;
                    }
                    statuses.push(c.status);
                    free.extend(c.take_buffers().into_one());
                }
                let all_done = statuses.len() as u64 == posted;
                if stopped && (all_done || (empty_poll_ends && done_switching && empty)) {
                    break;
                }
                if empty_poll_ends && done_switching && posted >= 100 && !stopped {
                    // The switch is done; what was posted after it is
                    // either refused or never completed: stop here.
                    stopped = true;
                }
                assert!(
                    Instant::now() < deadline,
                    "{posted} posted, {} completed",
                    statuses.len()
                );
            }
            let back = qp.reset().expect("reset after the error state");
            let reclaimed = back.iter().filter(|(id, _)| *id >= base).count() as u64;
            Streamed {
                posted,
                refused,
                statuses,
                reclaimed,
            }
        });
        reached
            .recv_timeout(Duration::from_secs(30))
            .expect("the poster reached 100 posts");
        to_error_beside_the_poster(raw);
        switched.store(true, std::sync::atomic::Ordering::Release);
        poster.join().unwrap()
    })
}

/// Moves the QP at `raw` to the error state with the raw verb, from a thread
/// other than the one posting to it (the QP's safe methods need `&mut`).
fn to_error_beside_the_poster(raw: usize) {
    // SAFETY: ibv_qp_attr is plain C data; all zeroes is a valid value.
    let mut attr: rdma::ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
    attr.qp_state = rdma::ffi::IBV_QPS_ERR;
    // SAFETY: the callers keep the QP alive (the poster holds it until their
    // scope ends); ibv_modify_qp may run beside ibv_post_send on the same QP.
    let rc = unsafe {
        rdma::ffi::ibv_modify_qp(
            raw as *mut rdma::ffi::ibv_qp,
            &mut attr,
            rdma::ffi::IBV_QP_STATE as i32,
        )
    };
    assert_eq!(rc, 0, "ibv_modify_qp to ERR");
}
