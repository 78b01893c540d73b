//! Coalescing (`set_nodelay`), seen from the wire: the test peer counts the
//! DATA messages a run of small writes arrives in, and checks the bytes in
//! its receive buffer.
//!
//! The counts are exact: a write that can go returns without polling the
//! CQ (blocking and async alike), so the first write's completion is not
//! taken before the writes after it, whatever the device's timing, and
//! with coalescing on they wait behind it.

use tokio::io::AsyncWriteExt;
use tokio::sync::oneshot;

use super::aio::pair as aio_pair;
use super::*;

/// Small writes in a run, and their size.
const WRITES: usize = 50;
const EACH: usize = 8;

/// Takes DATA messages until `total` bytes came: their lengths, then the
/// bytes at the start of the peer's receive buffer (the stream's writes
/// fill its first segment from its start).
fn data_messages(peer: &mut Peer, total: usize) -> (Vec<u32>, Vec<u8>) {
    let mut lens = Vec::new();
    let mut got = 0;
    while got < total {
        let m = peer.next_message();
        match wire::msg_op(m) {
            Op::DATA => {
                lens.push(wire::msg_data(m));
                got += wire::msg_data(m) as usize;
            }
            Op::SGL => {}
            other => panic!("message {m:#x} (operation {}) in a run of writes", other.0),
        }
    }
    let mut bytes = vec![0; total];
    peer.rbuf
        .read_at(0, &mut bytes)
        .expect("the peer's receive buffer");
    (lens, bytes)
}

/// `WRITES` writes of `EACH` bytes on an async stream with `nodelay`, then
/// a flush: the lengths of the DATA messages the peer received.
fn async_run(dev: &str, nodelay: bool) -> Vec<u32> {
    let (done_tx, done_rx) = oneshot::channel::<()>();
    let (mut peer, rx, h) = aio_pair(dev, PEER_RQ as u16, move |mut s| async move {
        assert!(s.nodelay(), "nodelay is the default, as rsocket's");
        s.set_nodelay(nodelay);
        for i in 0..WRITES {
            s.write_all(&patterned(i * EACH, EACH)).await?;
        }
        s.flush().await?;
        // Held until the peer counted, so no DISCONNECT comes in between.
        let _ = done_rx.await;
        std::io::Result::Ok(())
    });
    peer.first_grant();
    let (lens, bytes) = data_messages(&mut peer, WRITES * EACH);
    let _ = done_tx.send(());
    outcome(&rx, h, "the writes").expect("the writes and the flush");
    assert!(bytes == patterned(0, WRITES * EACH), "the bytes, in order");
    println!("{dev} nodelay {nodelay}: DATA messages of {lens:?} bytes");
    lens
}

#[test]
#[ignore = "needs an RDMA device"]
fn each_write_is_a_message_by_default_rxe() {
    assert_eq!(async_run("rxe", true), vec![EACH as u32; WRITES]);
}

#[test]
#[ignore = "needs an RDMA device"]
fn each_write_is_a_message_by_default_iwarp() {
    assert_eq!(async_run("siw", true), vec![EACH as u32; WRITES]);
}

/// Coalescing on: the first write goes at once (nothing in flight), the
/// other 49 wait behind it and go as one message on `flush`.
#[test]
#[ignore = "needs an RDMA device"]
fn coalesced_writes_go_as_one_message_on_flush_rxe() {
    let rest = ((WRITES - 1) * EACH) as u32;
    assert_eq!(async_run("rxe", false), vec![EACH as u32, rest]);
}

#[test]
#[ignore = "needs an RDMA device"]
fn coalesced_writes_go_as_one_message_on_flush_iwarp() {
    let rest = ((WRITES - 1) * EACH) as u32;
    assert_eq!(async_run("siw", false), vec![EACH as u32, rest]);
}

/// Coalescing on, then off before the flush: turning it off sends what
/// was held, as `TCP_NODELAY` does.
#[test]
#[ignore = "needs an RDMA device"]
fn turning_coalescing_off_sends_what_was_held_rxe() {
    let (done_tx, done_rx) = oneshot::channel::<()>();
    let (mut peer, rx, h) = aio_pair("rxe", PEER_RQ as u16, move |mut s| async move {
        s.set_nodelay(false);
        for i in 0..WRITES {
            s.write_all(&patterned(i * EACH, EACH)).await?;
        }
        s.set_nodelay(true);
        let _ = done_rx.await;
        std::io::Result::Ok(())
    });
    peer.first_grant();
    let (lens, bytes) = data_messages(&mut peer, WRITES * EACH);
    let _ = done_tx.send(());
    outcome(&rx, h, "the writes").expect("the writes");
    assert!(bytes == patterned(0, WRITES * EACH), "the bytes, in order");
    assert_eq!(lens, vec![EACH as u32, ((WRITES - 1) * EACH) as u32]);
}

/// The blocking stream with coalescing on: as the async one (a write
/// with room takes no completion first), the first write goes alone and
/// the rest as one message on `flush`.
#[test]
#[ignore = "needs an RDMA device"]
fn blocking_coalesced_writes_go_as_one_message_on_flush_rxe() {
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let (mut peer, rx, h) = pair("rxe", PEER_RQ as u16, move |s| {
        assert!(s.nodelay().expect("nodelay"), "the default");
        s.set_nodelay(false).expect("set_nodelay");
        assert!(!s.nodelay().expect("nodelay"));
        for i in 0..WRITES {
            (&s).write_all(&patterned(i * EACH, EACH))?;
        }
        (&s).flush()?;
        let _ = done_rx.recv();
        io::Result::Ok(())
    });
    peer.first_grant();
    let (lens, bytes) = data_messages(&mut peer, WRITES * EACH);
    let _ = done_tx.send(());
    outcome(&rx, h, "the writes").expect("the writes and the flush");
    assert!(bytes == patterned(0, WRITES * EACH), "the bytes, in order");
    assert_eq!(lens, vec![EACH as u32, ((WRITES - 1) * EACH) as u32]);
}
