//! The faults one by one ([`faults`], one server per fault, each on a port
//! of its own) and a directory listing that never ends ([`endless_dir`]).

use std::sync::atomic::Ordering;
use std::time::Duration;

use rdma_nfs::rpcrdma::RdmaError;
use rdma_nfs::transport::Error;

use crate::harness::*;
use crate::server::Fault;

pub(crate) fn faults(iwarp: bool) {
    let base = if iwarp { 20160 } else { 20060 };
    // The server of each fault on a port of its own, `base + at`.
    let server = |at: u16, fault| {
        TestServer::new(iwarp, base + at, fault).call_timeout(Duration::from_secs(3))
    };

    // Credits of zero: one call at a time, all complete.
    server(0, Fault::ZeroCredits).run(|t| async move {
        for r in calls_at_once(&t, 16, null_call).await {
            check_reply(&r);
        }
        assert_eq!(t.stats().max_in_flight.load(Ordering::Relaxed), 1);
        assert_eq!(t.stats().granted.load(Ordering::Relaxed), 0);
    });

    // Credits far beyond what the server posted: capped at the client's
    // own receives.
    server(1, Fault::HugeCredits).run(|t| async move {
        for r in calls_at_once(&t, 48, null_call).await {
            check_reply(&r);
        }
        let max = t.stats().max_in_flight.load(Ordering::Relaxed);
        assert!(max <= 8, "{max} in flight with 8 receives posted");
    });

    for (i, (fault, want)) in [
        (
            Fault::ErrVers,
            Error::Rdma(RdmaError::Vers { low: 1, high: 1 }),
        ),
        (Fault::ErrChunk, Error::Rdma(RdmaError::Chunk)),
    ]
    .into_iter()
    .enumerate()
    {
        server(2 + i as u16, fault).run(|t| async move {
            assert_eq!(t.call(null_call()).await.unwrap_err(), want);
        });
    }

    for (i, fault) in [Fault::BadProc, Fault::Truncated].into_iter().enumerate() {
        server(4 + i as u16, fault).run(|t| async move {
            let e = t.call(null_call()).await.unwrap_err();
            assert!(matches!(e, Error::Malformed(_)), "{fault:?}: {e:?}");
            println!("{fault:?}: {e}");
        });
    }

    // A write chunk returned shorter than offered: exactly its bytes.
    server(6, Fault::ShortWrite).run(|t| async move {
        let mut c = null_call();
        c.write_chunk = 65536;
        let r = t.call(c).await.unwrap();
        check_reply(&r);
        let data = r.data.expect("the write chunk's data");
        assert_eq!(data.len(), 1000);
        assert!(data.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    });

    // The same, lent in place (`lend_data`): exactly the bytes the server
    // says it wrote (rxe: the window, after its LOCAL_INV; siw: the
    // registration's memory, deregistered). The server shortens the first
    // call only; the second, full, is lent while the first is held.
    server(11, Fault::ShortWrite).run(|t| async move {
        let mut held = Vec::new();
        for (n, len) in [(1, 1000), (2, 65536)] {
            let mut c = null_call();
            c.write_chunk = 65536;
            c.lend_data = true;
            let r = t.call(c).await.unwrap();
            check_reply(&r);
            assert_eq!(r.data, None, "lent, not copied");
            let lent = r.lent.expect("the write chunk's data, lent");
            assert_eq!(lent.len(), len);
            assert!(lent.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
            assert_eq!(t.stats().data_lent.load(Ordering::Relaxed), n);
            held.push(lent);
        }
        assert_eq!(
            t.stats().chunks_registered.load(Ordering::Relaxed),
            0,
            "lent data is no chunk lent to the server"
        );
        drop(held);
    });

    // One that claims more than offered: refused.
    server(7, Fault::LongWrite).run(|t| async move {
        let mut c = null_call();
        c.write_chunk = 8192;
        let e = t.call(c).await.unwrap_err();
        assert!(matches!(e, Error::Malformed(_)), "{e:?}");
    });

    // The reply through the reply chunk, then one that overruns it.
    server(8, Fault::ReplyChunk).run(|t| async move {
        let mut c = null_call();
        c.max_reply = 16384;
        check_reply(&t.call(c).await.unwrap());
        assert_eq!(t.stats().reply_chunk_replies.load(Ordering::Relaxed), 1);
    });
    server(9, Fault::ReplyChunkOverrun).run(|t| async move {
        let mut c = null_call();
        c.max_reply = 16384;
        let e = t.call(c).await.unwrap_err();
        assert!(matches!(e, Error::Malformed(_)), "{e:?}");
    });

    // An RPC reply whose own xid is not the call's, inline and through the
    // reply chunk: a typed error, not another call's reply delivered.
    for (i, (fault, max_reply)) in [(Fault::WrongXid, 1024), (Fault::WrongXidReplyChunk, 16384)]
        .into_iter()
        .enumerate()
    {
        server(12 + i as u16, fault).run(|t| async move {
            let mut c = null_call();
            c.max_reply = max_reply;
            let e = t.call(c).await.unwrap_err();
            assert!(
                matches!(e, Error::XidMismatch { call, reply } if reply == call ^ 1),
                "{fault:?}: {e:?}"
            );
        });
    }

    // A server that says it wrote more of a write chunk than it did: the
    // bytes it did not write read as zeros, never as the earlier call's
    // (0xaa) left in the same memory (rxe: the pooled region; siw: the kept
    // buffer), copied or lent.
    for (i, lend) in [false, true].into_iter().enumerate() {
        let seen = server(16 + i as u16, Fault::Overclaim).run(|t| async move {
            for call in 1..=2 {
                let mut c = null_call();
                c.write_chunk = 4096;
                c.lend_data = lend;
                let r = t.call(c).await.unwrap();
                let data = match (r.data, r.lent) {
                    (Some(d), None) => d.to_vec(),
                    (None, Some(l)) => l.to_vec(),
                    other => panic!("no data: {other:?}"),
                };
                assert_eq!(data.len(), 4096);
                if call == 1 {
                    assert!(data.iter().all(|&b| b == 0xaa));
                    continue;
                }
                let pattern = (0..100).map(|i| (i % 251) as u8);
                assert!(data[..100].iter().copied().eq(pattern));
                let stale = data[100..].iter().filter(|&&b| b != 0).count();
                assert_eq!(
                    stale, 0,
                    "bytes of the earlier call returned (lent: {lend})"
                );
            }
            if iwarp {
                let reuses = t.stats().chunk_reuses.load(Ordering::Relaxed);
                assert!(reuses >= 1, "no buffer kept: nothing was checked");
            }
        });
        if !iwarp {
            let s = seen.lock().unwrap();
            let (a, b) = (s.write_segments[0], s.write_segments[1]);
            assert_eq!(
                a.offset, b.offset,
                "not the same region: nothing was checked"
            );
        }
    }

    // A directory listing that never ends: the cookie does not move, or it
    // moves without end; each an error, not a loop whose memory grows.
    for (i, advance) in [false, true].into_iter().enumerate() {
        endless_dir(
            server(14 + i as u16, Fault::EndlessDir { advance }),
            advance,
        );
    }

    // No reply: the client times out, reconnects and sends the call again
    // with its xid; the call completes once.
    let seen = server(10, Fault::Drop).run(|t| async move {
        let mut c = null_call();
        c.write_chunk = 4096;
        let r = t.call(c).await.unwrap();
        check_reply(&r);
        assert_eq!(r.data.map(|d| d.len()), Some(4096));
        assert_eq!(t.stats().connects.load(Ordering::Relaxed), 2);
        assert_eq!(t.stats().retransmits.load(Ordering::Relaxed), 1);
    });
    let s = seen.lock().unwrap();
    assert_eq!(s.connections, 2);
    assert_eq!(s.xids[0], s.xids[1], "the call was sent again with its xid");
}

/// `readdir` against `server`, whose listing never ends (`advance`: with a
/// new cookie every round): an error naming why, within a bounded number of
/// rounds.
pub(crate) fn endless_dir(server: TestServer, advance: bool) {
    let seen = server.run_at(|addr, opts| async move {
        let o = rdma_nfs::nfs3::Options {
            transport: opts,
            max_dir_entries: 100,
            ..rdma_nfs::nfs3::Options::default()
        };
        let client = rdma_nfs::nfs3::Client::connect(addr, rdma_nfs::nfs3::Fh(vec![1; 8]), o)
            .await
            .unwrap_or_else(|e| panic!("connect to the test server: {e}"));
        let root = client.root().clone();
        let e = tokio::time::timeout(Duration::from_secs(60), client.readdir(&root))
            .await
            .expect("readdir ended")
            .unwrap_err();
        let want = if advance {
            "more than 100 entries"
        } else {
            "cookie did not advance"
        };
        assert!(e.to_string().contains(want), "{e}");
        client.close().await;
    });
    let calls = seen.lock().unwrap().xids.len();
    assert!(calls <= 102, "{calls} calls for a bound of 100 entries");
}
