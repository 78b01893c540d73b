//! The async layer (`rdma::aio`) on a device: completions of many CQs on one
//! channel, posting that waits for room, the blocking wait with a timeout,
//! connection steps as futures (two-phase accept carrying an rkey), device
//! events, cancellation at each await point, misuse, a second runtime
//! (async-io), and 64 connections served on one thread.
//!
//! Every wait is bounded (10 s, 60 s for the 64 connections): a lost
//! wake-up fails the test instead of hanging it. Addresses as in `cm.rs`:
//! `RDMA_TEST_IP` reaches rxe0, `RDMA_TEST_IWARP_IP` siw0.
#![cfg(all(feature = "tokio", feature = "async-io"))]

mod common;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use rdma::aio::{self, async_io_rt::AsyncIo, tokio_rt::Tokio, AsyncCq, CmChannel, CqChannel};
use rdma::cm::{CmEventType, ConnParam, EventChannel, PortSpace};
use rdma::{
    AccessFlags, CompletionChannel, CompletionQueue, Error, ProtectionDomain, QpState, QpType,
    QueuePair, QueuePairBuilder, RemoteMemory, SendWr, WcOpcode, WcStatus,
};

const T: Duration = Duration::from_secs(5);
const LW: AccessFlags = AccessFlags::LOCAL_WRITE;

fn roce_ip() -> IpAddr {
    IpAddr::V4(common::ip())
}

fn iwarp_ip() -> IpAddr {
    std::env::var("RDMA_TEST_IWARP_IP")
        .expect("RDMA_TEST_IWARP_IP is not set: run in the VM (ci/vm run ...)")
        .parse()
        .expect("RDMA_TEST_IWARP_IP is an IP address")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Bounded on tokio: a lost wake-up fails instead of hanging.
async fn bounded<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .unwrap_or_else(|_| panic!("lost wake-up: {what} not within 10 s"))
}

struct Noop;
impl std::task::Wake for Noop {
    fn wake(self: std::sync::Arc<Self>) {}
}

/// Polls `f` once with a waker that does nothing.
fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    let waker = Waker::from(std::sync::Arc::new(Noop));
    f.poll(&mut Context::from_waker(&waker))
}

/// Waits (blocking, bounded) until `fd` is readable.
fn readable(fd: &impl AsRawFd) {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let rc = unsafe { libc::poll(&mut pfd, 1, 10_000) };
    assert_eq!(rc, 1, "the channel did not become readable within 10 s");
}

/// Two RC QPs connected to each other on the test device, each on a CQ of
/// its own, both CQs on one completion channel.
struct Loop {
    pd: ProtectionDomain,
    channel: CompletionChannel,
    cq_a: CompletionQueue,
    cq_b: CompletionQueue,
    a: QueuePair,
    b: QueuePair,
}

fn looped(tune: impl Fn(&mut QueuePairBuilder)) -> Loop {
    let ctx = common::open(&common::device_name());
    let pd = ctx.alloc_pd().unwrap();
    let channel = ctx.create_comp_channel().unwrap();
    let cq_a = ctx.create_cq(256, Some(&channel), 0).unwrap();
    let cq_b = ctx.create_cq(256, Some(&channel), 0).unwrap();
    let mut ba = pd.qp_builder(QpType::Rc, &cq_a, &cq_a);
    tune(&mut ba);
    let a = ba.build().unwrap();
    let mut bb = pd.qp_builder(QpType::Rc, &cq_b, &cq_b);
    tune(&mut bb);
    let b = bb.build().unwrap();
    let gid_index = u8::try_from(common::gid_index()).unwrap();
    common::connect(&ctx, &a, &b, gid_index);
    common::connect(&ctx, &b, &a, gid_index);
    Loop {
        pd,
        channel,
        cq_a,
        cq_b,
        a,
        b,
    }
}

fn msg(pd: &ProtectionDomain, i: u64) -> rdma::MemoryRegion {
    pd.reg_mr(i.to_be_bytes().to_vec(), AccessFlags::empty())
        .unwrap()
}

/// Posts a receive on `b` and a send of `i` on `a`.
fn ping(l: &mut Loop, i: u64) {
    l.b.post_recv(i, l.pd.alloc_mr(8, LW).unwrap()).unwrap();
    l.a.post_send(SendWr::send(i, msg(&l.pd, i))).unwrap();
}

fn check_recv(mut c: rdma::Completion, i: u64) {
    assert_eq!(c.status, WcStatus::Success, "{c:?}");
    assert_eq!(c.opcode, WcOpcode::Recv, "{c:?}");
    assert_eq!(c.wr_id, i);
    let buf = c.take_buffers().into_one().unwrap();
    assert_eq!(buf.to_vec(), i.to_be_bytes());
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn two_cqs_on_one_channel_each_get_their_own_completions_past_the_ack_batch() {
    let mut l = looped(|_| {});
    runtime().block_on(async {
        let driver = CqChannel::new(&l.channel, &Tokio).unwrap();
        let mut acq_a = AsyncCq::new(&driver, &l.cq_a).unwrap();
        let mut acq_b = AsyncCq::new(&driver, &l.cq_b).unwrap();
        // 150 round trips, each waited for: more events per CQ than one
        // acknowledgement batch (64).
        for i in 0..150u64 {
            ping(&mut l, i);
            let (r, s) = bounded("a completion", async {
                tokio::join!(acq_b.next(), acq_a.next())
            })
            .await;
            check_recv(r.unwrap(), i);
            let s = s.unwrap();
            assert_eq!(
                (s.wr_id, s.opcode, s.status),
                (i, WcOpcode::Send, WcStatus::Success)
            );
        }
    });
    // Everything dropped: the CQs were destroyed with every event
    // acknowledged (or ibv_destroy_cq would have hung until the timeout).
    drop(l);
    assert_eq!(rdma::teardown_failures(), 0);
}

/// Counts its wake-ups.
struct Wakes(std::sync::atomic::AtomicUsize);
impl std::task::Wake for Wakes {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

fn counting() -> (std::sync::Arc<Wakes>, Waker) {
    let c = std::sync::Arc::new(Wakes(std::sync::atomic::AtomicUsize::new(0)));
    (std::sync::Arc::clone(&c), Waker::from(c))
}

fn wakes(c: &Wakes) -> usize {
    c.0.load(std::sync::atomic::Ordering::SeqCst)
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn an_event_wakes_only_the_waiter_of_its_cq() {
    let mut l = looped(|_| {});
    let idle = l.pd.context().create_cq(16, Some(&l.channel), 0).unwrap();
    runtime().block_on(async {
        let driver = CqChannel::new(&l.channel, &Tokio).unwrap();
        let mut acq_a = AsyncCq::new(&driver, &l.cq_a).unwrap();
        let mut acq_b = AsyncCq::new(&driver, &l.cq_b).unwrap();
        let mut acq_idle = AsyncCq::new(&driver, &idle).unwrap();
        // A third CQ on the channel waits (armed) and never gets anything.
        let (count, waker) = counting();
        let mut idle_wait = pin!(acq_idle.next());
        let mut idle_cx = Context::from_waker(&waker);
        assert!(idle_wait.as_mut().poll(&mut idle_cx).is_pending());
        for i in 0..20u64 {
            // Both wait on the channel (armed, the task pending) before the
            // ping: their events come through the reactor.
            let mut both = pin!(async { tokio::join!(acq_b.next(), acq_a.next()) });
            assert!(futures_lite::future::poll_once(both.as_mut())
                .await
                .is_none());
            ping(&mut l, i);
            // Let the reactor see the channel: the task yields once the
            // events are there, so the runtime polls its I/O driver (had
            // the task found its completions at once, the driver would
            // never run and no waker would be woken at all).
            readable(&l.channel);
            tokio::task::yield_now().await;
            let (r, s) = bounded("a completion", both).await;
            check_recv(r.unwrap(), i);
            assert_eq!(s.unwrap().wr_id, i);
            // As an executor would: a woken waiter polls again.
            if wakes(&count) > 0 {
                assert!(idle_wait.as_mut().poll(&mut idle_cx).is_pending());
            }
        }
        assert_eq!(
            wakes(&count),
            0,
            "the idle CQ's waiter was woken by 40 events of the other CQs"
        );
    });
    drop(l);
    assert_eq!(rdma::teardown_failures(), 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn a_cm_event_wakes_only_the_waiter_of_its_id() {
    runtime().block_on(async {
        let cm = CmChannel::new(&EventChannel::new().unwrap(), &Tokio).unwrap();
        let mut listener = cm.listen(SocketAddr::new(roce_ip(), 0), 4).unwrap();
        let addr = SocketAddr::new(roce_ip(), listener.id().src_port());
        // The listener waits for a request that never comes.
        let (count, waker) = counting();
        let mut idle_wait = pin!(listener.next_event());
        let mut idle_cx = Context::from_waker(&waker);
        assert!(idle_wait.as_mut().poll(&mut idle_cx).is_pending());
        for _ in 0..5 {
            // Two events each (ADDR_RESOLVED, ROUTE_RESOLVED), of other ids.
            let mut id = cm.create_id(PortSpace::Tcp).unwrap();
            bounded("ADDR_RESOLVED", id.resolve_addr(None, addr, T))
                .await
                .unwrap();
            bounded("ROUTE_RESOLVED", id.resolve_route(T))
                .await
                .unwrap();
            if wakes(&count) > 0 {
                assert!(idle_wait.as_mut().poll(&mut idle_cx).is_pending());
            }
        }
        assert_eq!(
            wakes(&count),
            0,
            "the idle listener was woken by 10 events of other ids"
        );
    });
    assert_eq!(rdma::teardown_failures(), 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn a_dropped_wait_loses_no_completion() {
    let mut l = looped(|_| {});
    runtime().block_on(async {
        let driver = CqChannel::new(&l.channel, &Tokio).unwrap();
        let mut acq_b = AsyncCq::new(&driver, &l.cq_b).unwrap();
        // Await point 1: waiting, CQ armed, nothing posted. Dropped there.
        {
            let mut f = pin!(acq_b.next());
            assert!(poll_once(f.as_mut()).is_pending());
        }
        ping(&mut l, 1);
        // The event arrives while no future exists.
        readable(&l.channel);
        let c = bounded("the completion after a dropped wait", acq_b.next()).await;
        check_recv(c.unwrap(), 1);
        // Await point 2: a future that read the event (the channel drained)
        // but is dropped before it polled the CQ again: the event is noted
        // in the AsyncCq's entry, so the next wait does not sleep forever.
        {
            let mut f = pin!(acq_b.next());
            assert!(poll_once(f.as_mut()).is_pending());
            ping(&mut l, 2);
            readable(&l.channel);
        }
        let c = bounded("the completion of the second ping", acq_b.next()).await;
        check_recv(c.unwrap(), 2);
    });
    // The sends' completions were never awaited; they go with their CQ.
    drop(l);
    assert_eq!(rdma::teardown_failures(), 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn next_into_fills_the_callers_slot_and_a_dropped_wait_loses_nothing() {
    let mut l = looped(|_| {});
    runtime().block_on(async {
        let driver = CqChannel::new(&l.channel, &Tokio).unwrap();
        let mut acq_a = AsyncCq::new(&driver, &l.cq_a).unwrap();
        let mut acq_b = AsyncCq::new(&driver, &l.cq_b).unwrap();
        let (mut rslot, mut sslot) = (None, None);
        // Dropped while waiting (CQ armed, nothing posted): the slot is
        // left alone and the completion comes with the next wait.
        {
            let mut f = pin!(acq_b.next_into(&mut rslot));
            assert!(poll_once(f.as_mut()).is_pending());
        }
        assert!(rslot.is_none());
        for i in 0..40u64 {
            ping(&mut l, i);
            let c = bounded("a receive", acq_b.next_into(&mut rslot))
                .await
                .unwrap();
            assert_eq!((c.wr_id, c.opcode), (i, WcOpcode::Recv));
            let buf = c.take_buffers().into_one().unwrap();
            assert_eq!(buf.to_vec(), i.to_be_bytes());
            let s = bounded("a send", acq_a.next_into(&mut sslot))
                .await
                .unwrap();
            assert_eq!((s.wr_id, s.status), (i, WcStatus::Success));
            // The send's region stays in the slot until the next completion
            // replaces it.
            assert!(!s.buffers.is_empty());
        }
    });
    drop(l);
    assert_eq!(rdma::teardown_failures(), 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn batch_appends_at_most_max_in_order_and_a_dropped_wait_loses_nothing() {
    let mut l = looped(|_| {});
    runtime().block_on(async {
        let driver = CqChannel::new(&l.channel, &Tokio).unwrap();
        let mut acq_b = AsyncCq::new(&driver, &l.cq_b).unwrap();
        // What `out` holds already stays in front of what a batch appends.
        let mut out = Vec::new();
        assert_eq!(
            bounded("an empty batch", acq_b.batch(&mut out, 0))
                .await
                .unwrap(),
            0
        );
        // Dropped while waiting (CQ armed, nothing posted): `out` is left
        // alone and the completions come with the next waits.
        {
            let mut f = pin!(acq_b.batch(&mut out, 4));
            assert!(poll_once(f.as_mut()).is_pending());
        }
        assert!(out.is_empty());
        const N: u64 = 40;
        for i in 0..N {
            ping(&mut l, i);
        }
        let mut batches = 0;
        while (out.len() as u64) < N {
            let before = out.len();
            let n = bounded("a batch", acq_b.batch(&mut out, 3)).await.unwrap();
            assert!((1..=3).contains(&n), "{n}");
            assert_eq!(out.len(), before + n);
            batches += 1;
        }
        assert!(batches >= N / 3, "{batches} batches of at most 3");
        for (i, c) in out.into_iter().enumerate() {
            check_recv(c, i as u64);
        }
        assert_eq!(acq_b.buffered(), 0);
    });
    drop(l);
    assert_eq!(rdma::teardown_failures(), 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn batch_wc_fills_the_callers_array_and_a_dropped_wait_loses_nothing() {
    let mut l = looped(|_| {});
    runtime().block_on(async {
        let driver = CqChannel::new(&l.channel, &Tokio).unwrap();
        let mut acq_b = AsyncCq::new(&driver, &l.cq_b).unwrap();
        let mut wcs = [rdma::WorkCompletion::default(); 3];
        let mut memory = Vec::new();
        assert_eq!(
            bounded("an empty batch", acq_b.batch_wc(&mut [], &mut memory))
                .await
                .unwrap(),
            0
        );
        // Dropped while waiting (CQ armed, nothing posted): both are left
        // alone and the completions come with the next waits.
        {
            let mut f = pin!(acq_b.batch_wc(&mut wcs, &mut memory));
            assert!(poll_once(f.as_mut()).is_pending());
        }
        assert!(memory.is_empty());
        const N: u64 = 40;
        for i in 0..N {
            ping(&mut l, i);
        }
        let mut ids = Vec::new();
        while (ids.len() as u64) < N {
            let n = bounded("a batch", acq_b.batch_wc(&mut wcs, &mut memory))
                .await
                .unwrap();
            assert!((1..=3).contains(&n), "{n}");
            for wc in &wcs[..n] {
                assert!(wc.is_success(), "{wc:?}");
                assert_eq!(wc.opcode(), WcOpcode::Recv);
                ids.push(wc.wr_id());
            }
            assert_eq!(memory.len(), ids.len(), "one region per receive");
        }
        assert_eq!(ids, (0..N).collect::<Vec<_>>());
        for (i, (id, b)) in memory.into_iter().enumerate() {
            assert_eq!(id, i as u64);
            assert_eq!(b.into_one().unwrap().to_vec(), id.to_be_bytes());
        }
        assert_eq!(acq_b.buffered(), 0);
    });
    drop(l);
    assert_eq!(rdma::teardown_failures(), 0);
}

/// `try_batch_wc` takes what is there without waiting: 0 from an empty
/// CQ (armed or not), the completion once it came; the arm it leaves alone
/// does not keep the next waits from getting theirs.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn try_batch_wc_takes_what_is_there_and_leaves_the_wait_working() {
    let mut l = looped(|_| {});
    runtime().block_on(async {
        let driver = CqChannel::new(&l.channel, &Tokio).unwrap();
        let mut acq_b = AsyncCq::new(&driver, &l.cq_b).unwrap();
        let mut wcs = [rdma::WorkCompletion::default(); 4];
        let mut memory = Vec::new();
        assert_eq!(acq_b.try_batch_wc(&mut wcs, &mut memory).unwrap(), 0);
        // A wait dropped at its await point: the CQ is armed.
        {
            let mut f = pin!(acq_b.batch_wc(&mut wcs, &mut memory));
            assert!(poll_once(f.as_mut()).is_pending());
        }
        assert_eq!(acq_b.try_batch_wc(&mut wcs, &mut memory).unwrap(), 0);
        ping(&mut l, 0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let n = loop {
            let n = acq_b.try_batch_wc(&mut wcs, &mut memory).unwrap();
            if n > 0 {
                break n;
            }
            assert!(std::time::Instant::now() < deadline, "lost completion");
            tokio::task::yield_now().await;
        };
        assert_eq!(n, 1);
        assert!(wcs[0].is_success(), "{:?}", wcs[0]);
        assert_eq!((wcs[0].wr_id(), wcs[0].opcode()), (0, WcOpcode::Recv));
        assert_eq!(memory.len(), 1, "the receive's region");
        // The event of that completion (the CQ was armed) is noted; the
        // next wait polls, arms again and gets the next completion.
        ping(&mut l, 1);
        let n = bounded(
            "a wait after try_batch_wc",
            acq_b.batch_wc(&mut wcs, &mut memory),
        )
        .await
        .unwrap();
        assert_eq!((n, wcs[0].wr_id()), (1, 1));
        ping(&mut l, 2);
        let n = bounded("a wait that sleeps", acq_b.batch_wc(&mut wcs, &mut memory))
            .await
            .unwrap();
        assert_eq!((n, wcs[0].wr_id()), (1, 2));
        assert_eq!(memory.len(), 3);
        assert_eq!(acq_b.buffered(), 0);
    });
    drop(l);
    assert_eq!(rdma::teardown_failures(), 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn eight_connections_on_one_channel_from_eight_tasks() {
    const N: usize = 8;
    const MSGS: u64 = 20;
    let rt = runtime();
    let ctx = common::open(&common::device_name());
    let channel = ctx.create_comp_channel().unwrap();
    let gid_index = u8::try_from(common::gid_index()).unwrap();
    rt.block_on(async {
        let driver = CqChannel::new(&channel, &Tokio).unwrap();
        let mut tasks = tokio::task::JoinSet::new();
        for n in 0..N {
            let pd = ctx.alloc_pd().unwrap();
            let cq_a = ctx.create_cq(64, Some(&channel), 0).unwrap();
            let cq_b = ctx.create_cq(64, Some(&channel), 0).unwrap();
            let mut a = pd.qp_builder(QpType::Rc, &cq_a, &cq_a).build().unwrap();
            let mut b = pd.qp_builder(QpType::Rc, &cq_b, &cq_b).build().unwrap();
            common::connect(&ctx, &a, &b, gid_index);
            common::connect(&ctx, &b, &a, gid_index);
            let mut acq_a = AsyncCq::new(&driver, &cq_a).unwrap();
            let mut acq_b = AsyncCq::new(&driver, &cq_b).unwrap();
            tasks.spawn(async move {
                for i in 0..MSGS {
                    let tag = (n as u64) << 32 | i;
                    b.post_recv(tag, pd.alloc_mr(8, LW).unwrap()).unwrap();
                    a.post_send(SendWr::send(tag, msg(&pd, tag))).unwrap();
                    check_recv(acq_b.next().await.unwrap(), tag);
                    assert_eq!(acq_a.next().await.unwrap().wr_id, tag);
                }
                n
            });
        }
        let mut done = Vec::new();
        bounded("eight connections", async {
            while let Some(n) = tasks.join_next().await {
                done.push(n.unwrap());
            }
        })
        .await;
        done.sort_unstable();
        assert_eq!(done, (0..N).collect::<Vec<_>>());
    });
    assert_eq!(rdma::teardown_failures(), 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn posting_waits_for_room_in_a_full_send_queue() {
    const N: u64 = 64;
    let mut l = looped(|b| {
        b.max_send_wr(4).max_recv_wr(N as u32);
    });
    let depth = l.a.caps().max_send_wr as usize;
    assert!(
        depth < N as usize,
        "the provider gave a send queue of {depth}"
    );
    for i in 0..N {
        l.b.post_recv(i, l.pd.alloc_mr(8, LW).unwrap()).unwrap();
    }
    runtime().block_on(async {
        let driver = CqChannel::new(&l.channel, &Tokio).unwrap();
        let mut acq_a = AsyncCq::new(&driver, &l.cq_a).unwrap();
        let mut acq_b = AsyncCq::new(&driver, &l.cq_b).unwrap();
        let mut waited = 0;
        for i in 0..N {
            if l.a.in_flight().0 >= depth {
                waited += 1;
            }
            bounded(
                "room in the send queue",
                acq_a.post_send(&mut l.a, SendWr::send(i, msg(&l.pd, i))),
            )
            .await
            .map_err(rdma::PostError::drop_buffers)
            .unwrap();
            assert!(l.a.in_flight().0 <= depth);
        }
        assert!(
            waited > 0,
            "the queue never filled: the test proves nothing"
        );
        // The completions polled to make room wait in the AsyncCq, in order.
        for i in 0..N {
            let c = bounded("a send completion", acq_a.next()).await.unwrap();
            assert_eq!((c.wr_id, c.status), (i, WcStatus::Success));
        }
        for i in 0..N {
            check_recv(bounded("a receive", acq_b.next()).await.unwrap(), i);
        }
    });
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn blocking_wait_times_out_then_gets_the_completion() {
    let mut l = looped(|_| {});
    let t = Duration::from_millis(200);
    let start = Instant::now();
    assert!(l.cq_b.wait(Some(t)).unwrap().is_none());
    assert!(start.elapsed() >= t, "returned after {:?}", start.elapsed());
    ping(&mut l, 7);
    let c = l.cq_b.wait(Some(Duration::from_secs(10))).unwrap();
    check_recv(c.expect("the receive within 10 s"), 7);
    let s = l.cq_a.wait(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(s.expect("the send within 10 s").wr_id, 7);
    // Many waits, each with an event: acknowledged in batches and at the end.
    for i in 0..40 {
        ping(&mut l, i);
        check_recv(
            l.cq_b.wait(Some(Duration::from_secs(10))).unwrap().unwrap(),
            i,
        );
        assert_eq!(
            l.cq_a
                .wait(Some(Duration::from_secs(10)))
                .unwrap()
                .unwrap()
                .wr_id,
            i
        );
    }
    drop(l);
    assert_eq!(rdma::teardown_failures(), 0);
}

/// The state letter of thread `tid` of this process (`/proc`), `?` when
/// unreadable.
fn thread_state(tid: i64) -> char {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().and_then(|r| r.trim().chars().next()))
        .unwrap_or('?')
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn wait_until_without_a_bound_sleeps_in_the_channel_read_and_wakes_with_the_completion() {
    let mut l = looped(|_| {});
    let cq = l.cq_b.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let waiter = s.spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() } as i64).unwrap();
            let mut polls = 0;
            let mut slot = None;
            let got = cq
                .wait_until(None, || -> rdma::Result<Option<u64>> {
                    polls += 1;
                    Ok(cq.poll_one_into(&mut slot)?.map(|c| c.wr_id))
                })
                .unwrap();
            (got, polls, slot)
        });
        let tid = rx.recv().unwrap();
        // The waiter blocks in the channel's read (state S) before the ping.
        let start = Instant::now();
        while thread_state(tid) != 'S' {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the waiter never slept"
            );
            std::thread::yield_now();
        }
        ping(&mut l, 5);
        let (got, polls, slot) = waiter.join().unwrap();
        assert_eq!(got, Some(5));
        assert!(
            polls >= 3,
            "poll, arm, poll again, sleep, poll: {polls} polls"
        );
        check_recv(slot.unwrap(), 5);
    });
    drop(l);
    assert_eq!(rdma::teardown_failures(), 0);
}

fn assert_async_error(e: &Error, errno: i32, says: &str) {
    assert!(matches!(e, Error::Async { .. }), "{e:?}");
    assert_eq!(e.errno(), Some(errno), "{e}");
    assert!(e.to_string().contains(says), "{e}");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn misuse_is_an_error_that_says_which_never_a_hang() {
    let ctx = common::open(&common::device_name());
    let channel = ctx.create_comp_channel().unwrap();
    let other_channel = ctx.create_comp_channel().unwrap();
    let bare = ctx.create_cq(16, None, 0).unwrap();
    let cq = ctx.create_cq(16, Some(&channel), 0).unwrap();
    let foreign = ctx.create_cq(16, Some(&other_channel), 0).unwrap();
    // Blocking wait on a CQ without a channel.
    let e = bare.wait(Some(Duration::from_millis(1))).unwrap_err();
    assert_async_error(&e, libc::EINVAL, "without a completion channel");
    // A channel of another context.
    let ctx2 = common::open(&common::device_name());
    let e = ctx2.create_cq(16, Some(&channel), 0).unwrap_err();
    assert!(e.to_string().contains("belongs to another context"), "{e}");
    runtime().block_on(async {
        let driver = CqChannel::new(&channel, &Tokio).unwrap();
        let e = AsyncCq::new(&driver, &bare).unwrap_err();
        assert_async_error(&e, libc::EINVAL, "without a completion channel");
        let e = AsyncCq::new(&driver, &foreign).unwrap_err();
        assert_async_error(&e, libc::EINVAL, "another completion channel");
        let e = aio::tokio_rt::completions(&bare).unwrap_err();
        assert_async_error(&e, libc::EINVAL, "without a completion channel");
        let first = AsyncCq::new(&driver, &cq).unwrap();
        let e = AsyncCq::new(&driver, &cq).unwrap_err();
        assert_async_error(&e, libc::EBUSY, "already has an AsyncCq");
        drop(first);
        // Mixing blocking and async waits on the channel.
        let e = cq.wait(Some(Duration::from_millis(1))).unwrap_err();
        assert_async_error(&e, libc::EBUSY, "driven by an rdma::aio::CqChannel");
        let e = channel.get_event().unwrap_err();
        assert_async_error(&e, libc::EBUSY, "driven by an rdma::aio::CqChannel");
        let e = CqChannel::new(&channel, &Tokio).unwrap_err();
        assert_async_error(&e, libc::EBUSY, "driven by an rdma::aio::CqChannel");
        drop(driver);
        // Released with the driver: the blocking wait works again.
        assert!(cq.wait(Some(Duration::from_millis(1))).unwrap().is_none());
        // The CM channel: one reader.
        let ev = EventChannel::new().unwrap();
        let cm = CmChannel::new(&ev, &Tokio).unwrap();
        let e = ev.try_get_event().unwrap_err();
        assert_async_error(&e, libc::EBUSY, "driven by an rdma::aio::CmChannel");
        let e = ev.get_event_timeout(Duration::from_millis(1)).unwrap_err();
        assert_async_error(&e, libc::EBUSY, "driven by an rdma::aio::CmChannel");
        let other = EventChannel::new().unwrap();
        let id = other.create_id(PortSpace::Tcp).unwrap();
        let e = cm.register(&id).unwrap_err();
        assert_async_error(&e, libc::EINVAL, "another event channel");
        drop(cm);
        assert!(ev.try_get_event().unwrap().is_none());
    });
    // The tokio adapter outside a runtime.
    let e = CqChannel::new(&channel, &Tokio).unwrap_err();
    assert_async_error(&e, libc::ENXIO, "outside a tokio runtime");
    let e = aio::tokio_rt::cm_channel().unwrap_err();
    assert_async_error(&e, libc::ENXIO, "outside a tokio runtime");
    // ... which released its claim: the blocking wait still works.
    assert!(cq.wait(Some(Duration::from_millis(1))).unwrap().is_none());
}

/// What a connection needs on its side of the test.
struct End {
    qp: QueuePair,
    acq: AsyncCq,
    pd: ProtectionDomain,
}

fn end(ctx: &rdma::Context, reactor: &dyn aio::Reactor) -> End {
    let pd = ctx.alloc_pd().unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq(64, Some(&ch), 0).unwrap();
    let qp = pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
    let driver = CqChannel::new(&ch, reactor).unwrap();
    let acq = AsyncCq::new(&driver, &cq).unwrap();
    End { qp, acq, pd }
}

/// Client and server on `reactor`: the server accepts in two phases, its
/// private data carrying the rkey of a region registered on the new
/// connection's PD; the client RDMA WRITEs into it and SENDs a note; both
/// disconnect.
async fn two_phase(ip: IpAddr, reactor: &dyn aio::Reactor) {
    let cm = CmChannel::new(&EventChannel::new().unwrap(), reactor).unwrap();
    let mut listener = cm.listen(SocketAddr::new(ip, 0), 16).unwrap();
    let addr = SocketAddr::new(ip, listener.id().src_port());
    let pattern: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(7)).collect();
    let server = async {
        let incoming = listener.get_request().await.unwrap();
        // RoCE pads a REQ's private data to its fixed size; iWARP does not.
        assert!(
            incoming.private_data().starts_with(b"hello"),
            "{incoming:?}"
        );
        // Phase two: the connection's own PD, memory and QP.
        let ctx = incoming.context().unwrap();
        let mut s = end(&ctx, reactor);
        let target = s.pd.alloc_mr(64, LW | AccessFlags::REMOTE_WRITE).unwrap();
        // iWARP has no RNR retry: the receive goes in before the accept
        // (in INIT: providers refuse receives in RESET).
        incoming.id().modify_qp(&s.qp, QpState::Init).unwrap();
        s.qp.post_recv(1, s.pd.alloc_mr(8, LW).unwrap()).unwrap();
        let param = ConnParam::with_private_data(&target.remote().to_bytes());
        let mut conn = incoming.accept(&s.qp, &param).await.unwrap();
        let c = s.acq.next().await.unwrap();
        assert_eq!((c.wr_id, c.status), (1, WcStatus::Success), "{c:?}");
        let mut seen = vec![0u8; 64];
        target.read_at(0, &mut seen).unwrap();
        conn.disconnected().await.unwrap();
        (seen, s)
    };
    let client = async {
        let mut id = cm.create_id(PortSpace::Tcp).unwrap();
        id.resolve_addr(None, addr, T).await.unwrap();
        id.resolve_route(T).await.unwrap();
        let ctx = id.id().context().unwrap();
        let mut c = end(&ctx, reactor);
        let peer = id
            .connect(&c.qp, &ConnParam::with_private_data(b"hello"))
            .await
            .unwrap();
        let remote = RemoteMemory::from_bytes(&peer.private_data).unwrap();
        assert_eq!(remote.len, 64);
        let src = c.pd.reg_mr(pattern.clone(), AccessFlags::empty()).unwrap();
        c.qp.post_send(SendWr::write(10, src, remote)).unwrap();
        c.qp.post_send(SendWr::send(11, msg(&c.pd, 11))).unwrap();
        for want in [10, 11] {
            let done = c.acq.next().await.unwrap();
            assert_eq!((done.wr_id, done.status), (want, WcStatus::Success));
        }
        id.disconnect().await.unwrap();
        c
    };
    let ((seen, _s), _c) = futures_lite::future::zip(server, client).await;
    assert_eq!(
        seen, pattern,
        "the RDMA WRITE landed in the region the accept advertised"
    );
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn tokio_two_phase_accept_carries_an_rkey_of_the_new_connection() {
    runtime().block_on(async { bounded("the connection", two_phase(roce_ip(), &Tokio)).await });
    assert_eq!(rdma::teardown_failures(), 0);
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_tokio_two_phase_accept_carries_an_rkey_of_the_new_connection() {
    runtime().block_on(async { bounded("the connection", two_phase(iwarp_ip(), &Tokio)).await });
    assert_eq!(rdma::teardown_failures(), 0);
}

/// The same on async-io: the core is not tied to tokio.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn async_io_two_phase_accept_carries_an_rkey_of_the_new_connection() {
    async_io::block_on(async {
        let timeout = async {
            async_io::Timer::after(Duration::from_secs(10)).await;
            panic!("lost wake-up: the connection not within 10 s on async-io");
        };
        futures_lite::future::or(two_phase(roce_ip(), &AsyncIo), timeout).await
    });
    assert_eq!(rdma::teardown_failures(), 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn dropped_connection_steps_lose_no_event_and_block_no_destroy() {
    let ip = roce_ip();
    runtime().block_on(async {
        let cm = aio::tokio_rt::cm_channel().unwrap();
        let mut listener = cm.listen(SocketAddr::new(ip, 0), 16).unwrap();
        let addr = SocketAddr::new(ip, listener.id().src_port());
        // A wait for a request, dropped before any came.
        {
            let mut f = pin!(listener.get_request());
            assert!(poll_once(f.as_mut()).is_pending());
        }
        let mut id = cm.create_id(PortSpace::Tcp).unwrap();
        // resolve_addr dropped after its call, before its event: the event
        // stays in the id's mailbox.
        {
            let mut f = pin!(id.resolve_addr(None, addr, T));
            assert!(poll_once(f.as_mut()).is_pending());
        }
        let e = bounded("ADDR_RESOLVED", id.next_event()).await.unwrap();
        assert_eq!(e.event_type(), CmEventType::AddrResolved);
        drop(e);
        bounded("the route", id.resolve_route(T)).await.unwrap();
        let ctx = id.id().context().unwrap();
        let c = end(&ctx, &Tokio);
        // connect dropped after the request went out.
        let param = ConnParam::default();
        {
            let mut f = pin!(id.connect(&c.qp, &param));
            assert!(poll_once(f.as_mut()).is_pending());
        }
        // The request the dropped get_request did not take arrives.
        let incoming = bounded("the connect request", listener.get_request())
            .await
            .unwrap();
        // The server abandons it (its id is destroyed: a reject); the client
        // id's answer waits in its mailbox.
        drop(incoming);
        let e = bounded("the answer to the abandoned request", id.next_event())
            .await
            .unwrap();
        assert_eq!(e.event_type(), CmEventType::Rejected, "{e:?}");
        // Drop everything while the event is held: the ids go after it.
        drop((c, listener, cm));
        drop(id);
        drop(e);
    });
    assert_eq!(rdma::teardown_failures(), 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn device_events_report_the_srq_limit() {
    let ctx = common::open(&common::device_name());
    let gid_index = u8::try_from(common::gid_index()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None, 0).unwrap();
    let srq = pd
        .create_srq(rdma::SrqAttr {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let r = pd
        .qp_builder(QpType::Rc, &cq, &cq)
        .srq(&srq)
        .build()
        .unwrap();
    let mut s = pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
    common::connect(&ctx, &r, &s, gid_index);
    common::connect(&ctx, &s, &r, gid_index);
    for i in 0..8u64 {
        srq.post_recv(i, pd.alloc_mr(8, LW).unwrap()).unwrap();
    }
    srq.arm_limit(6).unwrap();
    runtime().block_on(async {
        let mut events = aio::tokio_rt::device_events(&ctx).unwrap();
        // Waiting before the limit is reached, dropped: nothing lost.
        {
            let mut f = pin!(events.srq_limit(&srq));
            assert!(poll_once(f.as_mut()).is_pending());
        }
        for i in 0..3u64 {
            s.post_send(SendWr::send(100 + i, msg(&pd, i))).unwrap();
        }
        bounded("SRQ_LIMIT_REACHED", events.srq_limit(&srq))
            .await
            .unwrap();
    });
    common::wait(&cq, 6);
    // The descriptor is blocking again: nothing pending, so a non-blocking
    // check says EAGAIN only because we ask for it.
    ctx.set_async_nonblocking(true).unwrap();
    let e = ctx.get_async_event().unwrap_err();
    assert_eq!(e.errno(), Some(libc::EAGAIN), "{e}");
}

/// 64 clients and their 64 server connections, all on one thread: the
/// server serves them at once.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn sixty_four_connections_on_one_thread() {
    sixty_four(roce_ip());
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_sixty_four_connections_on_one_thread() {
    sixty_four(iwarp_ip());
}

fn sixty_four(ip: IpAddr) {
    const N: u64 = 64;
    let rt = runtime();
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async {
        let cm = aio::tokio_rt::cm_channel().unwrap();
        let mut listener = cm.listen(SocketAddr::new(ip, 0), 128).unwrap();
        let addr = SocketAddr::new(ip, listener.id().src_port());
        let server = tokio::task::spawn_local(async move {
            let mut served = tokio::task::JoinSet::new();
            for _ in 0..N {
                let incoming = listener.get_request().await.unwrap();
                served.spawn_local(async move {
                    let n = u64::from_be_bytes(incoming.private_data()[..8].try_into().unwrap());
                    let ctx = incoming.context().unwrap();
                    let mut s = end(&ctx, &Tokio);
                    incoming.id().modify_qp(&s.qp, QpState::Init).unwrap();
                    s.qp.post_recv(n, s.pd.alloc_mr(8, LW).unwrap()).unwrap();
                    let mut conn = incoming.accept(&s.qp, &ConnParam::default()).await.unwrap();
                    let mut r = s.acq.next().await.unwrap();
                    assert_eq!(r.status, WcStatus::Success, "{r:?}");
                    let got = r.take_buffers().into_one().unwrap().to_vec();
                    // The answer: the number plus one.
                    let v = u64::from_be_bytes(got.try_into().unwrap()) + 1;
                    s.qp.post_send(SendWr::send(v, msg(&s.pd, v))).unwrap();
                    assert_eq!(s.acq.next().await.unwrap().status, WcStatus::Success);
                    conn.disconnected().await.unwrap();
                    n
                });
            }
            let mut done = Vec::new();
            while let Some(n) = served.join_next().await {
                done.push(n.unwrap());
            }
            done
        });
        let mut clients = tokio::task::JoinSet::new();
        for n in 0..N {
            let cm = cm.clone();
            clients.spawn_local(async move {
                let mut id = cm.create_id(PortSpace::Tcp).unwrap();
                id.resolve_addr(None, addr, T).await.unwrap();
                id.resolve_route(T).await.unwrap();
                let ctx = id.id().context().unwrap();
                let mut c = end(&ctx, &Tokio);
                id.id().modify_qp(&c.qp, QpState::Init).unwrap();
                c.qp.post_recv(n, c.pd.alloc_mr(8, LW).unwrap()).unwrap();
                id.connect(&c.qp, &ConnParam::with_private_data(&n.to_be_bytes()))
                    .await
                    .unwrap();
                c.qp.post_send(SendWr::send(n, msg(&c.pd, n))).unwrap();
                let mut got = None;
                for _ in 0..2 {
                    let mut done = c.acq.next().await.unwrap();
                    assert_eq!(done.status, WcStatus::Success, "{done:?}");
                    if done.opcode == WcOpcode::Recv {
                        got = Some(done.take_buffers().into_one().unwrap().to_vec());
                    }
                }
                assert_eq!(got.unwrap(), (n + 1).to_be_bytes(), "connection {n}");
                id.disconnect().await.unwrap();
                n
            });
        }
        let all = tokio::time::timeout(Duration::from_secs(90), async {
            let mut done = Vec::new();
            while let Some(n) = clients.join_next().await {
                done.push(n.unwrap());
            }
            done.sort_unstable();
            let mut served = server.await.unwrap();
            served.sort_unstable();
            (done, served)
        })
        .await
        .expect("64 connections within 90 s");
        assert_eq!(all.0, (0..N).collect::<Vec<_>>());
        assert_eq!(all.1, (0..N).collect::<Vec<_>>());
    });
    assert_eq!(rdma::teardown_failures(), 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn a_dropped_post_waiting_for_room_posts_nothing_and_frees_its_memory() {
    let mut l = looped(|b| {
        b.max_send_wr(2).max_recv_wr(16);
    });
    let depth = l.a.caps().max_send_wr as usize;
    runtime().block_on(async {
        let driver = CqChannel::new(&l.channel, &Tokio).unwrap();
        let mut acq_a = AsyncCq::new(&driver, &l.cq_a).unwrap();
        let mut acq_b = AsyncCq::new(&driver, &l.cq_b).unwrap();
        // No receive at b yet: the sends wait in RNR retries (rxe retries
        // forever with RNR retry 7), so the send queue stays full.
        for i in 0..depth as u64 {
            l.a.post_send(SendWr::send(i, msg(&l.pd, i))).unwrap();
        }
        assert_eq!(l.a.in_flight().0, depth);
        let shared = std::sync::Arc::new(l.pd.reg_mr(vec![9; 8], AccessFlags::empty()).unwrap());
        {
            let wr = SendWr::send(99, rdma::WrBuffers::Shared(std::sync::Arc::clone(&shared)));
            let mut f = pin!(acq_a.post_send(&mut l.a, wr));
            assert!(poll_once(f.as_mut()).is_pending(), "the send queue is full");
        }
        // Dropped while waiting for room: not posted, and the request's
        // reference to the memory went with the future.
        assert_eq!(l.a.in_flight().0, depth);
        assert_eq!(std::sync::Arc::strong_count(&shared), 1);
        // send_room owns nothing: dropped at its await point, nothing moves.
        {
            let mut f = pin!(acq_a.send_room(&l.a));
            assert!(poll_once(f.as_mut()).is_pending());
        }
        for i in 0..depth as u64 {
            l.b.post_recv(i, l.pd.alloc_mr(8, LW).unwrap()).unwrap();
        }
        for i in 0..depth as u64 {
            let c = bounded("a send after RNR", acq_a.next()).await.unwrap();
            assert_eq!((c.wr_id, c.status), (i, WcStatus::Success));
        }
        for i in 0..depth as u64 {
            check_recv(bounded("a receive", acq_b.next()).await.unwrap(), i);
        }
        // Room again: the same memory posts at once.
        l.b.post_recv(99, l.pd.alloc_mr(8, LW).unwrap()).unwrap();
        let wr = SendWr::send(99, rdma::WrBuffers::Shared(std::sync::Arc::clone(&shared)));
        bounded("a post with room", acq_a.post_send(&mut l.a, wr))
            .await
            .map_err(rdma::PostError::drop_buffers)
            .unwrap();
        let c = bounded("its completion", acq_a.next()).await.unwrap();
        assert_eq!(c.wr_id, 99);
        drop(c);
        assert_eq!(std::sync::Arc::strong_count(&shared), 1);
    });
    drop(l);
    assert_eq!(rdma::teardown_failures(), 0);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn dropped_batch_accept_and_disconnect_futures_leave_nothing_behind() {
    let ip = roce_ip();
    runtime().block_on(async {
        let cm = aio::tokio_rt::cm_channel().unwrap();
        let mut listener = cm.listen(SocketAddr::new(ip, 0), 16).unwrap();
        let addr = SocketAddr::new(ip, listener.id().src_port());
        let mut id = cm.create_id(PortSpace::Tcp).unwrap();
        bounded("the address", id.resolve_addr(None, addr, T))
            .await
            .unwrap();
        bounded("the route", id.resolve_route(T)).await.unwrap();
        let ctx = id.id().context().unwrap();
        let mut c = end(&ctx, &Tokio);
        // batch() dropped while waiting: no completion is lost (none yet).
        {
            let mut out = Vec::new();
            let mut f = pin!(c.acq.batch(&mut out, 4));
            assert!(poll_once(f.as_mut()).is_pending());
        }
        let param = ConnParam::default();
        let mut connect = Box::pin(id.connect(&c.qp, &param));
        assert!(poll_once(connect.as_mut()).is_pending());
        let incoming = bounded("the request", listener.get_request())
            .await
            .unwrap();
        let ctx = incoming.context().unwrap();
        let s = end(&ctx, &Tokio);
        // The accept is sent, then its future dropped before ESTABLISHED:
        // the connection is abandoned and the server's id destroyed.
        let accept_param = ConnParam::default();
        {
            let mut accept = pin!(incoming.accept(&s.qp, &accept_param));
            assert!(poll_once(accept.as_mut()).is_pending());
        }
        drop(s);
        // The client hears about it one way or another, in bounded time.
        let connected = bounded("the client's connect", connect.as_mut()).await;
        drop(connect);
        match connected {
            Ok(_) => {
                // Connected before the server's id went (its REP was out). A
                // disconnect dropped after its call: its DISCONNECTED (which
                // waits for the CM's DREQ timeout, the peer being gone) would
                // go to the mailbox; dropping the id with the event pending
                // or held must not hang.
                {
                    let mut f = pin!(id.disconnect());
                    let _ = poll_once(f.as_mut());
                }
                drop(c);
                drop(id);
            }
            Err(e) => assert!(matches!(e, Error::CmEvent { .. }), "{e}"),
        }
    });
    assert_eq!(rdma::teardown_failures(), 0);
}
