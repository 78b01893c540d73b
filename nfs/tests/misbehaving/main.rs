//! The transport against a server in Rust that misbehaves on purpose:
//! credits of zero and beyond what it posted, `RDMA_ERROR`, malformed
//! headers, a write chunk returned shorter (and longer) than offered, a reply
//! chunk overrun, a reply never sent (the client times out, reconnects and
//! sends the call again with its xid), a reply that invalidates the call's
//! write chunk (`SEND_WITH_INV`) or another call's. Each case: a typed error or the right
//! data, no panic, no chunk left registered, and the connection still works
//! for the next call. Device tests (rxe0; siw0 for `_iwarp`), run in ci/vm.
//!
//! Here: the tests, by what they check. `server.rs`: the server and its
//! faults; `harness.rs`: a server per test and the calls and checks the tests
//! share; `faults.rs`: the table of faults and the endless directory.

#[path = "../common/mod.rs"]
mod common;
mod faults;
mod harness;
mod server;

use std::sync::atomic::Ordering;
use std::time::Duration;

use rdma::WcStatus;
use rdma_nfs::transport::EndAccess;

use harness::*;
use server::{ended_call_delivered, Fault};

/// After a call ends, the server cannot reach its chunk: a late RDMA WRITE
/// to it fails (rxe: the window was invalidated before the reply was
/// delivered, and the next call's binding of the same region has another
/// rkey; siw: the registration was dropped). The client reconnects and the
/// second call completes with the right data.
fn late_access(iwarp: bool) {
    let port = if iwarp { 20180 } else { 20080 };
    let server =
        TestServer::new(iwarp, port, Fault::LateWrite).call_timeout(Duration::from_secs(5));
    let seen = server.run(|t| async move {
        for _ in 0..2 {
            let mut c = null_call();
            c.write_chunk = 4096;
            let r = t.call(c).await.unwrap();
            check_reply(&r);
            let data = r.data.expect("the write chunk's data");
            assert!(data.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        }
        assert_eq!(t.stats().connects.load(Ordering::Relaxed), 2);
    });
    let s = seen.lock().unwrap();
    let late = s.late.expect("the server tried the late write");
    println!("late RDMA WRITE to an ended call's chunk: {late}");
    if iwarp {
        // iWARP completes a WRITE at its sender once it is sent, not once
        // it is placed: the refusal comes back as a TERMINATE, which broke
        // the connection (the client made a second one).
        assert_eq!(s.connections, 2, "the late write broke the connection");
    } else {
        assert_eq!(
            late,
            WcStatus::RemAccessErr,
            "an ended call's chunk was reachable"
        );
    }
    let (a, b) = (s.write_segments[0], s.write_segments[1]);
    assert_ne!(a.handle, b.handle, "every use has a fresh rkey");
    if !iwarp {
        assert_eq!(a.offset, b.offset, "the pooled region was reused");
    }
}

#[test]
#[ignore = "needs an RDMA device (rxe0): run in ci/vm"]
fn late_access_to_an_ended_calls_chunk_fails_over_rxe() {
    late_access(false);
}

#[test]
#[ignore = "needs an iWARP device (siw0): run in ci/vm"]
fn late_access_to_an_ended_calls_chunk_fails_over_iwarp() {
    late_access(true);
}

/// A lost invalidation (rxe: windows): the first `LOCAL_INV` completion
/// is ignored (`Options::lose_invalidations`), as if it never came. The
/// call's reply still comes, once `invalidate_timeout` has passed and the
/// connection was dropped (its QP in error, its windows deallocated: the
/// server can reach nothing); the loss is counted, nothing stays lent, and
/// the next call goes over a new connection.
#[test]
#[ignore = "needs an RDMA device (rxe0): run in ci/vm"]
fn lost_invalidation_is_bounded_over_rxe() {
    let server = TestServer::new(false, 20082, Fault::None)
        .call_timeout(Duration::from_secs(30))
        .options(|o| {
            o.invalidate_timeout = Duration::from_secs(1);
            o.lose_invalidations = 1;
            // The path under test; on rxe the default deallocates instead.
            o.end_access = EndAccess::LocalInvalidate;
        });
    server.run(|t| async move {
        let mut c = null_call();
        c.write_chunk = 4096;
        let start = tokio::time::Instant::now();
        let r = t.call(c).await.unwrap();
        let took = start.elapsed();
        check_reply(&r);
        let data = r.data.expect("the write chunk's data");
        assert!(data.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        let s = t.stats();
        println!(
            "reply after {took:?}; lost invalidations {}, connects {}",
            s.lost_invalidations.load(Ordering::Relaxed),
            s.connects.load(Ordering::Relaxed)
        );
        assert!(
            took >= Duration::from_secs(1),
            "{took:?}: waited for the bound"
        );
        assert!(took < Duration::from_secs(30), "{took:?}: bounded");
        assert_eq!(s.lost_invalidations.load(Ordering::Relaxed), 1);
        assert_eq!(s.chunks_registered.load(Ordering::Relaxed), 0);
        // The next call reconnects (`TestServer::run` checks it answers).
        let r = t.call(null_call()).await.unwrap();
        check_reply(&r);
        assert_eq!(s.connects.load(Ordering::Relaxed), 2, "a new connection");
    });
}

/// Many calls with a write and a reply chunk each: on rxe the chunks come
/// from a few regions registered once (their number stays bounded by the
/// pool, whatever the number of calls), each use bound and invalidated; on
/// siw (no memory windows) each chunk is registered for its call.
fn reuse(iwarp: bool) {
    let port = if iwarp { 20181 } else { 20081 };
    const CALLS: u64 = 200;
    let server = TestServer::new(iwarp, port, Fault::None).options(|o| o.chunk_regions = 6);
    server.run(|t| async move {
        let call = || {
            let mut c = null_call();
            c.write_chunk = 65536;
            c.max_reply = 16384;
            c
        };
        for r in calls_at_once(&t, CALLS, call).await {
            check_reply(&r);
            let data = r.data.expect("the write chunk's data");
            assert_eq!(data.len(), 65536);
            assert!(data.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        }
        let s = t.stats();
        let regs = s.chunk_registrations.load(Ordering::Relaxed);
        let binds = s.chunk_binds.load(Ordering::Relaxed);
        let invs = s.chunk_invalidations.load(Ordering::Relaxed);
        println!(
            "{CALLS} calls: {regs} registrations, {binds} binds, {invs} invalidations, \
             {} regions, {} in flight at most",
            s.chunk_regions.load(Ordering::Relaxed),
            s.max_in_flight.load(Ordering::Relaxed)
        );
        assert_eq!(s.connects.load(Ordering::Relaxed), 1);
        if iwarp {
            assert!(!s.memory_windows.load(Ordering::Relaxed));
            assert_eq!(regs, 2 * CALLS, "a registration per chunk");
        } else {
            assert!(s.memory_windows.load(Ordering::Relaxed));
            assert!(regs <= 6, "{regs} registrations for {CALLS} calls");
            assert!(s.chunk_regions.load(Ordering::Relaxed) <= 6);
            assert_eq!(binds, 2 * CALLS, "a window bound per chunk");
            assert_eq!(invs, binds, "every binding invalidated");
        }
    });
}

/// A server that invalidates each call's write chunk with its reply: the
/// client sees it and posts no `LOCAL_INV`, reading the window plainly and
/// putting its region back (reused by the next calls). rxe only: over siw
/// the client offers no remote invalidation (no memory windows), and
/// libsiw reports no invalidation on a receive (`copy_cqe`: no flags, no
/// key). (This Rust server's `SEND_WITH_INV` itself works over siw because
/// the rdma crate fills `wr.rdma.rkey`, where libsiw reads the key, as well
/// as `invalidate_rkey`: `rdma/tests/access.rs`,
/// `iwarp_send_with_invalidate_invalidates_the_named_region`.) The kernel
/// server's replies over siw are checked in `kernel_nfsd::sizes_over_iwarp`.
#[test]
#[ignore = "needs an RDMA device (rxe0): run in ci/vm"]
fn remote_invalidation_skips_local_inv_over_rxe() {
    const CALLS: u64 = 20;
    let server = TestServer::new(false, 20090, Fault::Invalidate).options(|o| o.chunk_regions = 3);
    server.run(|t| async move {
        for _ in 0..CALLS {
            check_write_chunk(&t.call(write_chunk_call()).await.unwrap());
        }
        let [local, remote, stray, plain] = inv_counts(&t);
        println!("{CALLS} calls: local {local}, remote {remote}, stray {stray}, plain {plain}");
        assert_eq!(local, 0, "no LOCAL_INV");
        assert_eq!(stray, 0);
        assert_eq!(remote, CALLS, "each window invalidated by the server");
        assert_eq!(plain, CALLS);
        let s = t.stats();
        assert!(s.chunk_registrations.load(Ordering::Relaxed) <= 3);
        assert_eq!(s.chunk_binds.load(Ordering::Relaxed), CALLS);
        // A chunk beyond the pool's largest region (4 MiB) is a window too,
        // over a region of its own: the server's invalidation finds it.
        let mut big = null_call();
        big.write_chunk = 5 << 20;
        let r = t.call(big).await.unwrap();
        check_reply(&r);
        let data = r.data.expect("the write chunk's data");
        assert_eq!(data.len(), 5 << 20);
        assert!(data.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        let [local, remote, _, plain] = inv_counts(&t);
        assert_eq!((local, remote, plain), (0, CALLS + 1, CALLS + 1));
        assert_eq!(s.chunk_binds.load(Ordering::Relaxed), CALLS + 1);
        assert!(s.chunk_regions.load(Ordering::Relaxed) <= 3, "not pooled");
    });
}

/// A server that invalidates another call's rkey: the replied call's own
/// window is put out of reach as usual (on rxe deallocated and replaced, no
/// `LOCAL_INV`), and the other call, whose window the completion named,
/// takes nothing for it (on Linux 6.1's rxe a `LOCAL_INV` of an invalidated
/// window crashes the kernel) and gets its data.
#[test]
#[ignore = "needs an RDMA device (rxe0): run in ci/vm"]
fn stray_invalidation_falls_back_over_rxe() {
    TestServer::new(false, 20091, Fault::StrayInvalidate).run(|t| async move {
        two_write_chunk_calls_together(&t).await;
        let [local, remote, stray, plain] = inv_counts(&t);
        println!("local {local}, remote {remote}, stray {stray}, plain {plain}");
        let s = t.stats();
        let fenced = s.fenced_windows.load(Ordering::Relaxed);
        println!("fenced {fenced}");
        assert_eq!(stray, 1, "one reply named another call's rkey");
        assert_eq!(remote, 1, "that call's window counted invalid");
        assert_eq!(local, 0, "no LOCAL_INV on rxe");
        assert_eq!(fenced, 1, "the replied call's own window deallocated");
        assert_eq!(s.late_invalidations.load(Ordering::Relaxed), 0);
        assert_eq!(plain, 2);
        assert_eq!(s.connects.load(Ordering::Relaxed), 1);
    });
}

/// A server that answers one call without invalidating its window and,
/// right behind that reply, answers another call with a `SEND_WITH_INV` of
/// the first call's rkey: the client has ended the first call (it cannot
/// know what comes next), and on rxe its device may execute that
/// invalidation before or after whatever the client does to the window. A
/// `LOCAL_INV` posted for it could then hit an invalidated window, where
/// Linux 6.1's rxe dereferences NULL and the kernel crashes: so the client
/// posts none there. Deallocating the window is safe in either order: if the
/// server's invalidation came first, the reply names a key no call in
/// flight lends (`late_invalidations`), and both calls get their data on
/// one connection; if the deallocation came first, the invalidation names
/// nothing, rxe fails that receive and the connection, and the second call
/// is sent again on a new one.
#[test]
#[ignore = "needs an RDMA device (rxe0): run in ci/vm"]
fn invalidation_of_an_ended_calls_window_over_rxe() {
    TestServer::new(false, 20092, Fault::InvalidateEnded).run(|t| async move {
        two_write_chunk_calls_together(&t).await;
        let [local, remote, stray, plain] = inv_counts(&t);
        let [fenced, late, connects] = fenced_late_connects(&t);
        println!(
            "local {local}, remote {remote}, stray {stray}, late {late}, fenced {fenced}, \
             plain {plain}, connects {connects}"
        );
        assert_eq!(local, 0, "no LOCAL_INV on rxe");
        assert_eq!(remote, 0, "no call's own window named while in flight");
        match connects {
            // The server's invalidation came first: named late, both windows
            // deallocated.
            1 => assert_eq!((stray, late, fenced), (1, 1, 2)),
            // The deallocation came first: rxe failed the receive and the
            // connection; the second call went again.
            2 => assert!(fenced >= 1, "fenced {fenced}"),
            n => panic!("{n} connections"),
        }
    });
}

/// The other order, made certain: the server sends the second call's
/// `SEND_WITH_INV` of the first call's rkey only once the first call's
/// reply was delivered, so its window was deallocated before. The rkey
/// reaches nothing: rxe fails that receive (and the connection), and the
/// second call is sent again on a new connection; both calls' data right,
/// no `LOCAL_INV`, nothing named late.
#[test]
#[ignore = "needs an RDMA device (rxe0): run in ci/vm"]
fn invalidation_after_an_ended_calls_window_went_over_rxe() {
    TestServer::new(false, 20093, Fault::InvalidateEndedAfter).run(|t| async move {
        check_reply(&t.call(null_call()).await.unwrap());
        let mut a = spawn_call(&t, write_chunk_call());
        let mut b = spawn_call(&t, write_chunk_call());
        // The held call is answered first (the other's reply waits for
        // this): tell the server, then wait for the other.
        let (first, other) = tokio::select! {
            r = &mut a => (r, b),
            r = &mut b => (r, a),
        };
        check_write_chunk(&first.unwrap().unwrap());
        ended_call_delivered().notify_one();
        check_write_chunk(&other.await.unwrap().unwrap());
        let [local, remote, stray, plain] = inv_counts(&t);
        let [fenced, late, connects] = fenced_late_connects(&t);
        println!(
            "local {local}, remote {remote}, stray {stray}, late {late}, fenced {fenced}, \
             plain {plain}, connects {connects}, retransmits {}",
            t.stats().retransmits.load(Ordering::Relaxed)
        );
        assert_eq!(local, 0, "no LOCAL_INV on rxe");
        assert_eq!(
            (remote, stray, late),
            (0, 0, 0),
            "no invalidation succeeded"
        );
        assert_eq!(connects, 2, "rxe failed the receive and the connection");
        assert!(fenced >= 1, "the held call's window deallocated");
    });
}

#[test]
#[ignore = "needs an RDMA device (rxe0): run in ci/vm"]
fn chunk_regions_are_reused_over_rxe() {
    reuse(false);
}

#[test]
#[ignore = "needs an iWARP device (siw0): run in ci/vm"]
fn chunk_registration_per_call_over_iwarp() {
    reuse(true);
}

#[test]
#[ignore = "needs an RDMA device (rxe0): run in ci/vm"]
fn misbehaving_server_over_rxe() {
    faults::faults(false);
}

#[test]
#[ignore = "needs an iWARP device (siw0): run in ci/vm"]
fn misbehaving_server_over_iwarp() {
    faults::faults(true);
}
