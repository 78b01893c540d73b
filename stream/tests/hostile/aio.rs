//! The async stream (`rdma_stream::aio`, on tokio) under the same peer:
//! it shares the blocking stream's protocol engine but not its waits, so
//! each violation must still wake a waiting task and end it, and a peer
//! killed mid-transfer must end a task that reads or writes.

use std::future::Future;

use rdma::aio::tokio_rt::Tokio;
use rdma_stream::aio::{RdmaListener as AioListener, RdmaStream as AioStream};
use rdma_stream::Options;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

use super::killed::{
    assert_reader_ended, assert_writer_failed, kill_after_a_megabyte, rcat_listening, rcat_sending,
    Tally,
};
use super::*;

pub(super) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// An async stream and a test peer granting `credits`, connected as
/// [`super::pair`] connects them; `job` runs on the stream in a runtime
/// on a thread of its own.
pub(super) fn pair<T: Send + 'static, F: Future<Output = T>>(
    dev: &str,
    credits: u16,
    job: impl FnOnce(AioStream) -> F + Send + 'static,
) -> (Peer, mpsc::Receiver<T>, thread::JoinHandle<()>) {
    pair_with(dev, credits, Options::default(), job)
}

/// [`pair`] with the stream made with `opts`.
pub(super) fn pair_with<T: Send + 'static, F: Future<Output = T>>(
    dev: &str,
    credits: u16,
    opts: Options,
    job: impl FnOnce(AioStream) -> F + Send + 'static,
) -> (Peer, mpsc::Receiver<T>, thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    if dev == "rxe" {
        let at = addr(dev, 0);
        let (addr_tx, addr_rx) = mpsc::channel();
        let h = thread::spawn(move || {
            runtime().block_on(async move {
                let mut l = AioListener::bind(&Tokio, at, opts).expect("bind");
                let _ = addr_tx.send(l.local_addr());
                let (s, _) = l.accept().await.expect("accept a valid rsocket peer");
                let _ = tx.send(job(s).await);
            })
        });
        let dst = addr_rx
            .recv_timeout(STEP)
            .expect("the async listener's address");
        return (Peer::connect(dst, false, credits), rx, h);
    }
    let (peer, h) = peer_accepting(dev, credits, |dst| {
        thread::spawn(move || {
            runtime().block_on(async move {
                let s = AioStream::connect(&Tokio, dst, &opts)
                    .await
                    .expect("connect to the test peer");
                let _ = tx.send(job(s).await);
            })
        })
    });
    (peer, rx, h)
}

async fn read_to_end(s: &mut AioStream) -> Seen {
    let mut bytes = Vec::new();
    let mut buf = vec![0; 64 * 1024];
    let end = loop {
        match End::of(s.read(&mut buf).await) {
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(end) => break end,
        }
    };
    Seen::now(bytes, end)
}

/// As [`super::violation`], on the async stream; `act` also gets the
/// receive space granted and not yet used.
fn violation(dev: &str, what: &str, reason: &str, act: impl FnOnce(&mut Peer, u64)) {
    let (go_tx, go_rx) = oneshot::channel::<()>();
    let (mut peer, rx, h) = pair(dev, PEER_RQ as u16, move |mut s| async move {
        go_rx.await.expect("the peer's go");
        read_to_end(&mut s).await
    });
    let granted = peer.first_grant();
    let before = patterned(0, 1000);
    peer.data(&before);
    act(&mut peer, granted - before.len() as u64);
    let sent = peer.wait_sends();
    let t0 = Instant::now();
    go_tx.send(()).expect("the stream task waits");
    let seen = outcome(&rx, h, what);
    println!(
        "{dev} async {what}: read {} bytes, then {:?} after {:?} (peer's sends: {sent:?})",
        seen.bytes.len(),
        seen.end,
        seen.at.saturating_duration_since(t0)
    );
    assert!(
        seen.bytes == before,
        "{what}: the async stream read {} bytes, not the {} sent before the violation",
        seen.bytes.len(),
        before.len()
    );
    match &seen.end {
        End::Err(io::ErrorKind::InvalidData, msg) if msg.contains(reason) => {}
        other => panic!("{what}: expected InvalidData naming {reason:?}, got {other:?}"),
    }
}

fn violations(dev: &str) {
    violation(dev, "DATA past the grant", "receive space", |p, left| {
        p.data_claiming(&[], (left + 1) as u32);
    });
    violation(dev, "operation 3", "unknown operation 3", |p, _| {
        p.msg(wire::msg(Op(3), 7));
        p.data(&patterned(1000, 100));
    });
    violation(
        dev,
        "control code 3",
        "unknown control message 3",
        |p, _| {
            p.msg(wire::msg(Op::CTRL, 3));
            p.data(&patterned(1000, 100));
        },
    );
    violation(
        dev,
        "data after SHUTDOWN",
        "after the peer's shutdown",
        |p, _| {
            p.msg(wire::msg(Op::CTRL, Ctrl::SHUTDOWN.0));
            p.data(&patterned(1000, 100));
        },
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn async_stream_protocol_violations_are_invalid_data_rxe() {
    violations("rxe");
}

#[test]
#[ignore = "needs an RDMA device"]
fn async_stream_protocol_violations_are_invalid_data_iwarp() {
    violations("siw");
}

/// Message 385 with 384 credits while the async stream's task waits in
/// a write the peer gave no credit for (RoCE: see the blocking test).
#[test]
#[ignore = "needs an RDMA device"]
fn async_stream_messages_past_the_credits_are_invalid_data_rxe() {
    let (mut peer, rx, h) = pair("rxe", 1, |mut s| async move {
        let first = s.write(b"a").await;
        let blocked = s.write(b"b").await;
        let t = Instant::now();
        (first, blocked, t, read_to_end(&mut s).await)
    });
    let (credits, t0) = past_the_credits(&mut peer);
    let (first, blocked, t, seen) = outcome(&rx, h, "async: messages past the credits");
    println!(
        "rxe async message {} with {credits} credits: write {first:?}, blocked write \
         {blocked:?} after {:?}; then read {} bytes and {:?}",
        credits + 1,
        t.saturating_duration_since(t0),
        seen.bytes.len(),
        seen.end
    );
    assert_past_the_credits(first, blocked, &seen, credits);
}

/// `rcat` sends to an async listener's stream and is SIGKILLed once a
/// megabyte arrived; the reading task ends within `BOUND`.
fn killed_sender(dev: &str, port: u16) {
    let at = addr(dev, port);
    let (mid_tx, mid_rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        runtime().block_on(async move {
            let mut l = AioListener::bind(&Tokio, at, Options::default()).expect("bind");
            let _ = ready_tx.send(());
            let (mut s, _) = l.accept().await.expect("accept rcat");
            let mut buf = vec![0; 64 * 1024];
            let mut tally = Tally::new(mid_tx);
            let end = loop {
                match End::of(s.read(&mut buf).await) {
                    Ok(k) => tally.read(&buf[..k]),
                    Err(end) => break end,
                }
            };
            let _ = tx.send((tally.n, tally.wrong, end, Instant::now()));
        })
    });
    ready_rx.recv_timeout(STEP).expect("the async listener");
    let (mut child, feeder) = rcat_sending(dev, port);
    let t0 = kill_after_a_megabyte(
        &mut child,
        &mid_rx,
        "the async stream read a megabyte from rcat",
        "SIGKILL rcat",
    );
    let (n, wrong, end, at) = outcome(&rx, h, "async: rcat SIGKILLed while sending");
    let took = at.saturating_duration_since(t0);
    println!(
        "{dev} async: rcat SIGKILLed while sending: read {n} bytes, then {end:?} {took:?} \
         after the kill"
    );
    drop(child);
    let _ = feeder.join();
    assert_eq!(wrong, None, "byte {wrong:?} is not what rcat sent");
    assert!(took < BOUND);
    assert_reader_ended(&end);
}

#[test]
#[ignore = "needs an RDMA device"]
fn async_reader_ends_when_the_sender_is_sigkilled_rxe() {
    killed_sender("rxe", 7637);
}

#[test]
#[ignore = "needs an RDMA device"]
fn async_reader_ends_when_the_sender_is_sigkilled_iwarp() {
    killed_sender("siw", 7638);
}

/// An async stream writes to `rcat -l`, which is SIGKILLed once a
/// megabyte went; the writing task fails within `BOUND`.
fn killed_receiver(dev: &str, port: u16) {
    let (mut child, dst) = rcat_listening(dev, port);
    let (mid_tx, mid_rx) = mpsc::channel();
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        runtime().block_on(async move {
            let mut s = AioStream::connect(&Tokio, dst, &Options::default())
                .await
                .expect("connect to rcat -l");
            let mut tally = Tally::new(mid_tx);
            let err = loop {
                let chunk = patterned(tally.n, 64 * 1024);
                match s.write(&chunk).await {
                    Ok(k) => tally.wrote(k),
                    Err(e) => break e,
                }
            };
            let _ = tx.send((tally.n, err.kind(), err.to_string(), Instant::now()));
        })
    });
    let t0 = kill_after_a_megabyte(
        &mut child,
        &mid_rx,
        "the async stream wrote a megabyte to rcat -l",
        "SIGKILL rcat -l",
    );
    let (n, kind, msg, at) = outcome(&rx, h, "async: rcat -l SIGKILLed while receiving");
    let took = at.saturating_duration_since(t0);
    println!(
        "{dev} async: rcat -l SIGKILLed while receiving: wrote {n} bytes, then {kind:?} \
         ({msg}) {took:?} after the kill"
    );
    assert!(took < BOUND);
    assert_writer_failed(kind, &msg);
}

#[test]
#[ignore = "needs an RDMA device"]
fn async_writer_fails_when_the_receiver_is_sigkilled_rxe() {
    killed_receiver("rxe", 7639);
}

#[test]
#[ignore = "needs an RDMA device"]
fn async_writer_fails_when_the_receiver_is_sigkilled_iwarp() {
    killed_receiver("siw", 7640);
}
