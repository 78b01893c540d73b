//! Protocol violations by the test peer against the blocking stream: data
//! past the receive space or the credits granted, unknown operations and
//! control codes, data after SHUTDOWN, a write past the receive buffer, a
//! short message SEND, private data that is not rsocket's.

use super::*;

/// A stream that reads only once let go ([`Reading::release`]), and a test
/// peer granting `PEER_RQ` credits that took its first grant (`granted`) and
/// sent `before`, the pattern's first 1000 bytes, legitimately: where a
/// violation starts.
struct Held<T> {
    peer: Peer,
    granted: u64,
    before: Vec<u8>,
    reading: Reading<T>,
}

/// The stream side of [`Held`], waiting for its go.
struct Reading<T> {
    go: mpsc::Sender<()>,
    rx: mpsc::Receiver<T>,
    h: thread::JoinHandle<()>,
}

/// [`Held`], whose stream side runs `read` once let go.
fn held<T: Send + 'static>(
    dev: &str,
    read: impl FnOnce(&RdmaStream) -> T + Send + 'static,
) -> Held<T> {
    let (go, go_rx) = mpsc::channel::<()>();
    let (mut peer, rx, h) = pair(dev, PEER_RQ as u16, move |s| {
        go_rx.recv().expect("the peer's go");
        read(&s)
    });
    let granted = peer.first_grant();
    let before = patterned(0, 1000);
    peer.data(&before);
    Held {
        peer,
        granted,
        before,
        reading: Reading { go, rx, h },
    }
}

impl<T> Reading<T> {
    /// Lets the stream side read: what it returned (within `BOUND`, else
    /// a failure naming `what`), and when it was let go.
    fn release(self, what: &str) -> (T, Instant) {
        let t0 = Instant::now();
        self.go.send(()).expect("the stream thread waits");
        (outcome(&self.rx, self.h, what), t0)
    }
}

/// A violation by `act` after `before` was sent legitimately: the stream
/// reads exactly `before`, then fails with `InvalidData` naming `reason`.
/// The stream starts reading only once the peer's sends completed, so on
/// RoCE everything is in its completion queue when it looks.
fn violation(dev: &str, what: &str, reason: &str, act: impl FnOnce(&mut Peer)) {
    let Held {
        mut peer,
        before,
        reading,
        ..
    } = held(dev, |s| {
        // An end of stream may come first (a SHUTDOWN whose data after it
        // is still on its way, over iWARP): read on (spinning on the end)
        // for a while, to see whether the violation is reported.
        let mut seen = read_to_end(s, Vec::new());
        let mut eofs = 0;
        let until = Instant::now() + Duration::from_secs(2);
        while seen.end == End::Eof && Instant::now() < until {
            eofs += 1;
            seen = read_to_end(s, seen.bytes);
        }
        (seen, eofs)
    });
    act(&mut peer);
    let sent = peer.wait_sends();
    let ((seen, eofs), t0) = reading.release(what);
    let took = seen.at.saturating_duration_since(t0);
    println!(
        "{dev} {what}: read {} bytes, then {:?} after {took:?} ({eofs} ends of stream first; \
         peer's sends: {sent:?})",
        seen.bytes.len(),
        seen.end
    );
    assert!(
        seen.bytes == before,
        "{what}: the stream read {} bytes, not the {} sent before the violation (then {:?}); \
         past them: {:?}",
        seen.bytes.len(),
        before.len(),
        seen.end,
        seen.bytes
            .get(before.len()..)
            .map(|b| (b.len(), b.iter().filter(|&&x| x == 0).count()))
    );
    match &seen.end {
        End::Err(io::ErrorKind::InvalidData, msg) if msg.contains(reason) => {}
        other => panic!("{what}: expected InvalidData naming {reason:?}, got {other:?}"),
    }
    drop(peer);
}

/// DATA claiming one byte more than the receive space the stream granted
/// (the first segment and the one its first credits wrote).
fn data_past_the_grant(dev: &str) {
    let mut held = held(dev, |s| read_to_end(s, Vec::new()));
    let (granted, before) = (held.granted, &held.before);
    let claim = granted - before.len() as u64 + 1;
    held.peer.data_claiming(&[], claim as u32);
    held.peer.wait_sends().expect("the peer's sends");
    let (seen, t0) = held.reading.release("data past the grant");
    println!(
        "{dev} DATA of {claim} bytes with {} granted left: read {} bytes, then {:?} after {:?}",
        granted - before.len() as u64,
        seen.bytes.len(),
        seen.end,
        seen.at.saturating_duration_since(t0)
    );
    assert!(seen.bytes == *before, "read {} bytes", seen.bytes.len());
    assert!(
        matches!(&seen.end, End::Err(io::ErrorKind::InvalidData, m) if m.contains("receive space")),
        "{:?}",
        seen.end
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn data_past_the_receive_space_granted_is_invalid_data_rxe() {
    data_past_the_grant("rxe");
}

#[test]
#[ignore = "needs an RDMA device"]
fn data_past_the_receive_space_granted_is_invalid_data_iwarp() {
    data_past_the_grant("siw");
}

/// Unknown operations (1, 2: `RS_OP_WRITE`, never on the wire, 3, 5) and
/// unknown control codes, each on a fresh connection, with legitimate data
/// after it that must not be read.
fn unknown_messages(dev: &str) {
    for op in [1, 2, 3, 5] {
        violation(
            dev,
            &format!("operation {op}"),
            &format!("unknown operation {op}"),
            |p| {
                p.msg(wire::msg(Op(op), 7));
                p.data(&patterned(1000, 100));
            },
        );
    }
    for code in [3, 0x1FFF_FFFF] {
        violation(
            dev,
            &format!("control code {code}"),
            &format!("unknown control message {code}"),
            |p| {
                p.msg(wire::msg(Op::CTRL, code));
                p.data(&patterned(1000, 100));
            },
        );
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn unknown_operations_and_control_codes_are_invalid_data_rxe() {
    unknown_messages("rxe");
}

#[test]
#[ignore = "needs an RDMA device"]
fn unknown_operations_and_control_codes_are_invalid_data_iwarp() {
    unknown_messages("siw");
}

/// Data after the peer's SHUTDOWN.
fn data_after_shutdown(dev: &str) {
    violation(
        dev,
        "data after SHUTDOWN",
        "after the peer's shutdown",
        |p| {
            p.msg(wire::msg(Op::CTRL, Ctrl::SHUTDOWN.0));
            p.data(&patterned(1000, 100));
        },
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn data_after_shutdown_is_invalid_data_rxe() {
    data_after_shutdown("rxe");
}

#[test]
#[ignore = "needs an RDMA device"]
fn data_after_shutdown_is_invalid_data_iwarp() {
    data_after_shutdown("siw");
}

/// Messages past the credits granted: the peer grants the stream one
/// message, so the stream's second write waits (polling completions
/// without reading), while the peer sends the stream's credits' worth of
/// one-byte DATA and one more. RoCE only: over iWARP the extra SEND finds
/// no receive unless the stream reposted in time, and siw then ends the
/// connection (a TERMINATE) instead of delivering it: which one the stream
/// sees is a race.
#[test]
#[ignore = "needs an RDMA device"]
fn messages_past_the_credits_granted_are_invalid_data_rxe() {
    let (mut peer, rx, h) = pair("rxe", 1, |s| {
        let first = (&s).write(b"a");
        let blocked = (&s).write(b"b");
        let t = Instant::now();
        (first, blocked, t, read_to_end(&s, Vec::new()))
    });
    let (credits, t0) = past_the_credits(&mut peer);
    let (first, blocked, t, seen) = outcome(&rx, h, "messages past the credits");
    println!(
        "rxe message {} with {credits} credits: write {first:?}, blocked write {blocked:?} \
         after {:?}; then read {} bytes and {:?}",
        credits + 1,
        t.saturating_duration_since(t0),
        seen.bytes.len(),
        seen.end
    );
    let e = assert_past_the_credits(first, blocked, &seen, credits);
    assert!(e.to_string().contains("messages it was granted"), "{e}");
}

/// An RDMA WRITE that runs 8 bytes past the end of the stream's receive
/// buffer: the device refuses it (the rkey covers the buffer only); the
/// stream ends with an error, the legitimate bytes read and nothing else.
fn write_past_the_buffer(dev: &str) {
    let mut held = held(dev, |s| read_to_end(s, Vec::new()));
    let peer = &mut held.peer;
    peer.wait_sends().expect("the legitimate data");
    // The whole buffer is granted (two halves), so it ends at data_buf.addr
    // + granted.
    let to = RemoteMemory {
        addr: peer.theirs.data_buf.addr + held.granted - 8,
        len: 16,
        rkey: peer.theirs.data_buf.key,
    };
    peer.write_msg(&[0xEE; 16], to, wire::msg(Op::DATA, 16));
    // Over iWARP a WRITE completes once TCP took it, and the message SEND
    // behind it may never complete (the TERMINATE ends the connection):
    // the stream's side is what tells.
    let sent = if dev == "rxe" {
        peer.wait_sends()
    } else {
        Ok(())
    };
    let (seen, t0) = held.reading.release("a write past the buffer");
    println!(
        "{dev} WRITE 8 bytes past the receive buffer: peer's completion {sent:?}; the stream \
         read {} bytes, then {:?} after {:?}",
        seen.bytes.len(),
        seen.end,
        seen.at.saturating_duration_since(t0)
    );
    if dev == "rxe" {
        // Over iWARP a send's completion says only that TCP took it.
        assert_eq!(
            sent,
            Err(WcStatus::RemAccessErr),
            "the write past the buffer"
        );
    }
    assert!(seen.bytes == held.before, "{} bytes", seen.bytes.len());
    assert!(
        matches!(
            &seen.end,
            End::Err(
                io::ErrorKind::ConnectionReset | io::ErrorKind::InvalidData,
                _
            )
        ),
        "{:?}",
        seen.end
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_write_past_the_receive_buffer_fails_the_connection_rxe() {
    write_past_the_buffer("rxe");
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_write_past_the_receive_buffer_fails_the_connection_iwarp() {
    write_past_the_buffer("siw");
}

/// Private data that is not rsocket's (too short; version 2): the listener
/// rejects each request and keeps serving; a good client then connects.
fn foreign_private_data(dev: &str) {
    let l = listener(dev);
    let dst = l.local_addr().unwrap();
    let iwarp = dev == "siw";
    let (rx, h) = serve(&l, |s| {
        let mut b = [0; 5];
        let r = (&s).read_exact(&mut b).map(|()| b);
        drop(s);
        r.map_err(|e| e.to_string())
    });
    let t0 = Instant::now();
    for (what, mangle) in [
        (
            "20 bytes",
            Box::new(|d: &ConnData| d.encode()[..20].to_vec()) as Box<dyn FnOnce(&ConnData) -> _>,
        ),
        (
            "version 2",
            Box::new(|d: &ConnData| {
                let mut v = d.encode().to_vec();
                v[0] = 2;
                v
            }),
        ),
        ("no private data", Box::new(|_: &ConnData| Vec::new())),
    ] {
        match Peer::dial(dst, iwarp, PEER_RQ as u16, mangle) {
            Dialed::Refused(e, _) => {
                println!("{dev} connect request with {what}: {e:?}");
                assert_eq!(e, CmEventType::Rejected, "{what}");
            }
            Dialed::Up(_) => panic!("the listener accepted a request with {what}"),
        }
    }
    let mut good = RdmaStream::connect(dst).expect("a good client after the rejected ones");
    good.write_all(b"hello").expect("write");
    let got = outcome(&rx, h, "the good client after rejected ones");
    println!(
        "{dev} three foreign requests rejected, then a good client served: {got:?} in {:?}",
        t0.elapsed()
    );
    assert_eq!(got.as_ref().map(|b| &b[..]), Ok(&b"hello"[..]));
}

#[test]
#[ignore = "needs an RDMA device"]
fn foreign_private_data_is_rejected_and_the_listener_serves_on_rxe() {
    foreign_private_data("rxe");
}

#[test]
#[ignore = "needs an RDMA device"]
fn foreign_private_data_is_rejected_and_the_listener_serves_on_iwarp() {
    foreign_private_data("siw");
}

/// A server that accepts with version-2 connection data: the connecting
/// stream fails with `InvalidData`, in bounded time.
fn foreign_accept(dev: &str, port: u16) {
    let iwarp = dev == "siw";
    let (events, _listening, dst) = peer_listening(dev, port);
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        let t = Instant::now();
        let r = RdmaStream::connect(dst).map(drop);
        let _ = tx.send((r, t.elapsed()));
    });
    let event = events
        .get_event_timeout(STEP)
        .expect("rdma_get_cm_event")
        .expect("a connect request");
    assert_eq!(event.event_type(), CmEventType::ConnectRequest);
    let id = event.id().clone();
    drop(event);
    let m = make(&id, iwarp, PEER_RQ as u16);
    let mut v2 = m.ours.encode().to_vec();
    v2[0] = 2;
    id.accept_qp(&m.qp, &param(v2, iwarp)).expect("rdma_accept");
    let (r, took) = outcome(&rx, h, "connecting to a version-2 server");
    println!("{dev} connect to a server answering version 2: {r:?} in {took:?}");
    let e = r.expect_err("connected to a server that is not rsocket's version 1");
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    assert!(e.to_string().contains("version 2"), "{e}");
    drop(m);
    drop(id);
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_server_answering_version_2_fails_the_connect_rxe() {
    foreign_accept("rxe", 7631);
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_server_answering_version_2_fails_the_connect_iwarp() {
    foreign_accept("siw", 7632);
}

/// As above, but the stream reads a few messages first (fewer than half
/// its credits, so it grants nothing new): the limit the peer was given is
/// still the first one, and the message past it must still be refused.
#[test]
#[ignore = "needs an RDMA device"]
fn messages_past_the_credits_after_some_reads_are_invalid_data_rxe() {
    let (read_tx, read_rx) = mpsc::channel();
    let (mut peer, rx, h) = pair("rxe", 1, move |s| {
        let first = (&s).write(b"a");
        let mut got = Vec::new();
        let mut buf = [0; 16];
        while got.len() < 10 {
            match (&s).read(&mut buf[..10 - got.len()]) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(_) => break,
            }
        }
        let _ = read_tx.send(got.clone());
        let blocked = (&s).write(b"b");
        let t = Instant::now();
        (first, blocked, t, read_to_end(&s, got))
    });
    let credits = peer.theirs.credits as usize;
    peer.first_grant();
    for i in 0..10 {
        peer.data(&[pattern(i)]);
    }
    peer.wait_sends().expect("the first ten");
    let got = read_rx
        .recv_timeout(BOUND)
        .expect("the stream reads ten bytes");
    assert_eq!(got, patterned(0, 10));
    for i in 10..credits {
        peer.data(&[pattern(i)]);
    }
    peer.wait_sends().expect("the credited messages");
    let t0 = Instant::now();
    peer.data(&[pattern(credits)]);
    let (first, blocked, t, seen) = match rx.recv_timeout(BOUND) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            // Evidence: close the peer, which ends the waiting write, and
            // show what the stream took.
            drop(peer);
            let (first, blocked, _, seen) = outcome(&rx, h, "after the peer closed");
            panic!(
                "message {} with {credits} credits granted and 10 read: no error within \
                 {BOUND:?}; once the peer closed: write {first:?}, blocked write \
                 {blocked:?}, then read {} bytes (the pattern's first {}: {}) and {:?}",
                credits + 1,
                seen.bytes.len(),
                credits + 1,
                seen.bytes == patterned(0, credits + 1),
                seen.end
            )
        }
        Err(e) => panic!("the stream side panicked: {e:?}, {:?}", h.join()),
    };
    println!(
        "rxe message {} with {credits} credits, 10 read: write {first:?}, blocked write \
         {blocked:?} after {:?}; then read {} bytes and {:?}",
        credits + 1,
        t.saturating_duration_since(t0),
        seen.bytes.len(),
        seen.end
    );
    assert_blocked_write_failed(blocked, &seen, credits);
}

/// iWARP: a message SEND of 2 bytes instead of 4. The stream's slot keeps
/// whatever its other two bytes held: the message must be refused, not
/// read with stale bytes.
#[test]
#[ignore = "needs an RDMA device"]
fn a_short_message_send_is_invalid_data_iwarp() {
    violation("siw", "a 2-byte message SEND", "", |p| {
        let id = p.id();
        // DATA of 255 bytes if read with two zero bytes.
        p.send_inline(InlineSend::send(id, &[0xFF, 0x00]));
        // Ends the stream if the short message was taken.
        p.msg(wire::msg(Op::CTRL, Ctrl::SHUTDOWN.0));
    });
}
