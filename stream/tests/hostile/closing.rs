//! A stream dropped while its peer still reads: a reader grants credits
//! for what it read, so they follow the closing side's last data and its
//! DISCONNECT. Over siw, credits that reach a queue pair already gone stay
//! unread in its TCP socket, whose release then resets the connection and
//! can throw away the end of the stream before the reader took it. So a
//! dropped stream keeps taking its peer's messages until the peer
//! disconnects too, and disconnects by itself only once
//! `Options::linger` passed; `close` waits for that in the caller. Both
//! the blocking and the async stream.

#[cfg(feature = "tokio")]
use tokio::io::AsyncWriteExt;

use super::*;

/// What the stream side writes before it is dropped.
const BYE: &[u8] = b"bye";
/// How long the peer watches for a disconnection that must not come while
/// it is connected (the stream lingers 5 s by default; one that does not
/// linger disconnects at once).
const QUIET: Duration = Duration::from_secs(1);
/// The linger of the tests whose peer never closes.
const SHORT: Duration = Duration::from_millis(500);

/// Takes the stream's messages up to its DISCONNECT; the data bytes they
/// announced.
fn until_disconnect(peer: &mut Peer) -> u32 {
    let mut data = 0;
    loop {
        let m = peer.next_message();
        match wire::msg_op(m) {
            Op::DATA => data += wire::msg_data(m),
            Op::SGL => {}
            Op::CTRL if Ctrl(wire::msg_data(m)) == Ctrl::DISCONNECT => return data,
            other => panic!("an unexpected message {m:#x} ({other:?}) before the DISCONNECT"),
        }
    }
}

/// The peer's part once the stream wrote [`BYE`] and was dropped: it takes
/// everything up to the DISCONNECT, then grants credits for what it read
/// (as a reader does, after the stream closed), which a queue pair still
/// up takes, and sees no disconnection while it is connected; then it
/// disconnects, and the closed stream with it.
fn credits_after_the_close(peer: &mut Peer) {
    assert_eq!(until_disconnect(peer), BYE.len() as u32);
    peer.msg(wire::msg(Op::SGL, PEER_RQ));
    assert_eq!(
        peer.wait_sends(),
        Ok(()),
        "the dropped stream's queue pair took the peer's credits"
    );
    let event = peer
        .cm_events
        .get_event_timeout(QUIET)
        .expect("rdma_get_cm_event");
    assert!(
        event.is_none(),
        "the dropped stream disconnected while its peer was connected and sending: {:?}",
        event.map(|e| e.event_type())
    );
    peer.cm_id.disconnect().expect("rdma_disconnect");
    drop(
        peer.cm_events
            .wait_for(
                &peer.cm_id,
                &[CmEventType::Disconnected],
                "rdma_disconnect",
                STEP,
            )
            .expect("the peer's own disconnection"),
    );
}

/// The peer's part when it never closes: the stream disconnects once its
/// linger ([`SHORT`]) passed.
fn disconnected_after_the_linger(peer: &mut Peer) {
    assert_eq!(until_disconnect(peer), BYE.len() as u32);
    assert_disconnected_after_the_linger(peer);
}

/// The stream disconnects once its linger ([`SHORT`]) passed.
fn assert_disconnected_after_the_linger(peer: &Peer) {
    drop(
        peer.cm_events
            .wait_for(
                &peer.cm_id,
                &[CmEventType::Disconnected],
                "the dropped stream's disconnection",
                SHORT + BOUND,
            )
            .expect("the dropped stream disconnects once its linger passed"),
    );
}

/// The peer's part while the stream side writes [`BYE`] and calls
/// `close`, whose result comes through `closed`: the close has not
/// returned while the peer, having taken everything, stays connected; it
/// returns, `Ok`, once the peer disconnects.
fn close_waits_for_the_peer(peer: &mut Peer, closed: &mpsc::Receiver<io::Result<()>>) {
    assert_eq!(until_disconnect(peer), BYE.len() as u32);
    match closed.recv_timeout(QUIET) {
        Err(mpsc::RecvTimeoutError::Timeout) => {}
        other => panic!("close returned while its peer was connected: {other:?}"),
    }
    peer.cm_id.disconnect().expect("rdma_disconnect");
    closed
        .recv_timeout(BOUND)
        .expect("close returns once the peer disconnected")
        .expect("close");
}

#[test]
#[ignore = "needs an RDMA device"]
fn close_waits_until_the_peer_disconnects_rxe() {
    close_blocking("rxe");
}

#[test]
#[ignore = "needs an RDMA device"]
fn close_waits_until_the_peer_disconnects_iwarp() {
    close_blocking("siw");
}

fn close_blocking(dev: &str) {
    let (mut peer, rx, _h) = pair(dev, PEER_RQ as u16, |s| {
        (&s).write_all(BYE)?;
        s.close()
    });
    close_waits_for_the_peer(&mut peer, &rx);
}

#[cfg(feature = "tokio")]
#[test]
#[ignore = "needs an RDMA device"]
fn async_close_waits_until_the_peer_disconnects_rxe() {
    close_on_tokio("rxe");
}

#[cfg(feature = "tokio")]
#[test]
#[ignore = "needs an RDMA device"]
fn async_close_waits_until_the_peer_disconnects_iwarp() {
    close_on_tokio("siw");
}

#[cfg(feature = "tokio")]
fn close_on_tokio(dev: &str) {
    let (mut peer, rx, _h) = super::aio::pair(dev, PEER_RQ as u16, |mut s| async move {
        s.write_all(BYE).await?;
        s.close().await
    });
    close_waits_for_the_peer(&mut peer, &rx);
}

/// A blocking stream with `opts` writes [`BYE`] and is dropped; then the
/// peer plays `peer_part`.
fn blocking(dev: &str, opts: Options, peer_part: fn(&mut Peer)) {
    let (mut peer, rx, h) = pair_with(dev, PEER_RQ as u16, opts, |s| {
        (&s).write_all(BYE)?;
        drop(s);
        Ok::<_, io::Error>(())
    });
    outcome(&rx, h, "write and drop").expect("the stream's write");
    peer_part(&mut peer);
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_dropped_stream_takes_its_readers_credits_until_the_reader_disconnects_rxe() {
    blocking("rxe", Options::default(), credits_after_the_close);
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_dropped_stream_takes_its_readers_credits_until_the_reader_disconnects_iwarp() {
    blocking("siw", Options::default(), credits_after_the_close);
}

fn short_linger() -> Options {
    Options {
        linger: SHORT,
        ..Options::default()
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_dropped_stream_disconnects_once_its_linger_passed_rxe() {
    blocking("rxe", short_linger(), disconnected_after_the_linger);
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_dropped_stream_disconnects_once_its_linger_passed_iwarp() {
    blocking("siw", short_linger(), disconnected_after_the_linger);
}

/// [`blocking`] with the async stream (tokio). Its lingering is woken
/// through the runtime, which stays up until the peer is done.
#[cfg(feature = "tokio")]
fn on_tokio(dev: &str, opts: Options, peer_part: fn(&mut Peer)) {
    let (dropped_tx, dropped_rx) = mpsc::channel();
    let (hold_tx, hold_rx) = tokio::sync::oneshot::channel::<()>();
    let (mut peer, rx, h) = super::aio::pair_with(dev, PEER_RQ as u16, opts, |mut s| async move {
        let wrote = s.write_all(BYE).await;
        drop(s);
        let _ = dropped_tx.send(wrote);
        let _ = hold_rx.await;
    });
    dropped_rx
        .recv_timeout(BOUND)
        .expect("the async stream written and dropped within the bound")
        .expect("the async stream's write");
    peer_part(&mut peer);
    let _ = hold_tx.send(());
    outcome(&rx, h, "the runtime");
}

#[cfg(feature = "tokio")]
#[test]
#[ignore = "needs an RDMA device"]
fn a_dropped_async_stream_takes_its_readers_credits_until_the_reader_disconnects_rxe() {
    on_tokio("rxe", Options::default(), credits_after_the_close);
}

#[cfg(feature = "tokio")]
#[test]
#[ignore = "needs an RDMA device"]
fn a_dropped_async_stream_takes_its_readers_credits_until_the_reader_disconnects_iwarp() {
    on_tokio("siw", Options::default(), credits_after_the_close);
}

#[cfg(feature = "tokio")]
#[test]
#[ignore = "needs an RDMA device"]
fn a_dropped_async_stream_disconnects_once_its_linger_passed_rxe() {
    on_tokio("rxe", short_linger(), disconnected_after_the_linger);
}

#[cfg(feature = "tokio")]
#[test]
#[ignore = "needs an RDMA device"]
fn a_dropped_async_stream_disconnects_once_its_linger_passed_iwarp() {
    on_tokio("siw", short_linger(), disconnected_after_the_linger);
}

/// A dropped async stream holds nothing of its executor's thread while its
/// DISCONNECT is not acknowledged: the test peer's QP is in the error
/// state, so RoCE retries the DISCONNECT until its retries run out. The
/// drop returns at once, and the stream disconnects once its linger
/// passed.
#[cfg(feature = "tokio")]
#[test]
#[ignore = "needs an RDMA device"]
fn dropping_an_async_stream_whose_peer_is_unreachable_returns_at_once_rxe() {
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let (dropped_tx, dropped_rx) = mpsc::channel();
    let (hold_tx, hold_rx) = tokio::sync::oneshot::channel::<()>();
    let (mut peer, rx, h) =
        super::aio::pair_with("rxe", PEER_RQ as u16, short_linger(), |s| async move {
            let _ = go_rx.await;
            let t0 = Instant::now();
            drop(s);
            let _ = dropped_tx.send(t0.elapsed());
            let _ = hold_rx.await;
        });
    peer.first_grant();
    peer.qp
        .to_error()
        .expect("the test peer's QP to the error state");
    let _ = go_tx.send(());
    let took = dropped_rx
        .recv_timeout(BOUND)
        .expect("the async stream dropped within the bound");
    assert!(
        took < Duration::from_millis(200),
        "dropping the async stream took {took:?}"
    );
    assert_disconnected_after_the_linger(&peer);
    let _ = hold_tx.send(());
    outcome(&rx, h, "the runtime");
}
