//! The async layer (`rdma::aio`) on a device: completions of many CQs on one
//! channel, posting that waits for room, the blocking wait with a timeout,
//! connection steps as futures (two-phase accept carrying an rkey), device
//! events, cancellation at each await point, misuse, a second runtime
//! (async-io), and 64 connections served on one thread.
//!
//! Every wait is bounded (10 s, 60 s for the 64 connections): a lost
//! wake-up fails the test instead of hanging it. Addresses as in `cm/main.rs`:
//! `RDMA_TEST_IP` reaches rxe0, `RDMA_TEST_IWARP_IP` siw0.
//!
//! The tests live in the modules below, along what they test; each takes the
//! imports and helpers of this file with `use super::*`.
#![cfg(all(feature = "tokio", feature = "async-io"))]

#[path = "../common/mod.rs"]
mod common;

use common::iwarp::iwarp_ip;
use common::roce_ip;

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

mod completions;
mod connections;
mod device_events;
mod misuse;
mod waiting;
mod wakes;
