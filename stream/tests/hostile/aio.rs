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

use super::killed::{Killed, BEFORE_KILL};
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
    let (tx, rx) = mpsc::channel();
    if dev == "rxe" {
        let at = addr(dev, 0);
        let (addr_tx, addr_rx) = mpsc::channel();
        let h = thread::spawn(move || {
            runtime().block_on(async move {
                let mut l = AioListener::bind(&Tokio, at, Options::default()).expect("bind");
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
    let events = EventChannel::new().expect("rdma_create_event_channel");
    let lid = events.create_id(PortSpace::Tcp).expect("rdma_create_id");
    lid.bind_addr(addr(dev, 0)).expect("rdma_bind_addr");
    lid.listen(4).expect("rdma_listen");
    let dst = addr(dev, lid.src_port());
    let h = thread::spawn(move || {
        runtime().block_on(async move {
            let s = AioStream::connect(&Tokio, dst, &Options::default())
                .await
                .expect("connect to the test peer");
            let _ = tx.send(job(s).await);
        })
    });
    let peer = Peer::accept(&events, true, credits);
    (peer, rx, h)
}

async fn read_to_end(s: &mut AioStream) -> Seen {
    let mut bytes = Vec::new();
    let mut buf = vec![0; 64 * 1024];
    let end = loop {
        match s.read(&mut buf).await {
            Ok(0) => break End::Eof,
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e) => break End::Err(e.kind(), e.to_string()),
        }
    };
    Seen {
        bytes,
        end,
        at: Instant::now(),
    }
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
    let credits = peer.theirs.credits as usize;
    peer.first_grant();
    for i in 0..credits {
        peer.data(&[pattern(i)]);
    }
    peer.wait_sends().expect("the credited messages");
    let t0 = Instant::now();
    peer.data(&[pattern(credits)]);
    let (first, blocked, t, seen) = outcome(&rx, h, "async: messages past the credits");
    println!(
        "rxe async message {} with {credits} credits: write {first:?}, blocked write \
         {blocked:?} after {:?}; then read {} bytes and {:?}",
        credits + 1,
        t.saturating_duration_since(t0),
        seen.bytes.len(),
        seen.end
    );
    assert_eq!(first.expect("the credited write"), 1);
    let e = blocked.expect_err("the write waiting for credits ends with the violation");
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    assert!(
        seen.bytes == patterned(0, credits),
        "{} bytes",
        seen.bytes.len()
    );
    assert!(
        matches!(&seen.end, End::Err(io::ErrorKind::InvalidData, _)),
        "{:?}",
        seen.end
    );
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
            let (mut n, mut wrong, mut told) = (0usize, None, false);
            let end = loop {
                match s.read(&mut buf).await {
                    Ok(0) => break End::Eof,
                    Ok(k) => {
                        if wrong.is_none() {
                            wrong = (0..k).find(|&i| buf[i] != pattern(n + i)).map(|i| n + i);
                        }
                        n += k;
                        if n >= BEFORE_KILL && !told {
                            told = true;
                            let _ = mid_tx.send(());
                        }
                    }
                    Err(e) => break End::Err(e.kind(), e.to_string()),
                }
            };
            let _ = tx.send((n, wrong, end, Instant::now()));
        })
    });
    ready_rx.recv_timeout(STEP).expect("the async listener");
    let mut child = Command::new(example("rcat"))
        .args([&ip(dev), &port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn rcat");
    let mut stdin = child.stdin.take().unwrap();
    let mut child = Killed(child);
    let feeder = thread::spawn(move || {
        let mut at = 0usize;
        loop {
            let chunk = patterned(at, 64 * 1024);
            if stdin.write_all(&chunk).is_err() {
                break;
            }
            at += chunk.len();
        }
    });
    mid_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the async stream read a megabyte from rcat");
    child.0.kill().expect("SIGKILL rcat");
    let t0 = Instant::now();
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
    assert!(
        matches!(
            &end,
            End::Eof
                | End::Err(
                    io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted,
                    _
                )
        ),
        "{end:?}"
    );
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
    let mut child = Command::new(example("rcat"))
        .args(["-v", "-l", &ip(dev), &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rcat -l");
    let mut line = String::new();
    let got = BufReader::new(child.stderr.as_mut().unwrap()).read_line(&mut line);
    let mut child = Killed(child);
    assert!(matches!(got, Ok(n) if n > 0), "rcat -l did not listen");
    let dst = addr(dev, port);
    let (mid_tx, mid_rx) = mpsc::channel();
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        runtime().block_on(async move {
            let mut s = AioStream::connect(&Tokio, dst, &Options::default())
                .await
                .expect("connect to rcat -l");
            let (mut n, mut told) = (0usize, false);
            let err = loop {
                let chunk = patterned(n, 64 * 1024);
                match s.write(&chunk).await {
                    Ok(k) => n += k,
                    Err(e) => break e,
                }
                if n >= BEFORE_KILL && !told {
                    told = true;
                    let _ = mid_tx.send(());
                }
            };
            let _ = tx.send((n, err.kind(), err.to_string(), Instant::now()));
        })
    });
    mid_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the async stream wrote a megabyte to rcat -l");
    child.0.kill().expect("SIGKILL rcat -l");
    let t0 = Instant::now();
    let (n, kind, msg, at) = outcome(&rx, h, "async: rcat -l SIGKILLed while receiving");
    let took = at.saturating_duration_since(t0);
    println!(
        "{dev} async: rcat -l SIGKILLed while receiving: wrote {n} bytes, then {kind:?} \
         ({msg}) {took:?} after the kill"
    );
    assert!(took < BOUND);
    assert!(
        matches!(
            kind,
            io::ErrorKind::ConnectionReset
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::ConnectionAborted
        ),
        "{kind:?}: {msg}"
    );
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
