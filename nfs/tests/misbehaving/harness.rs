//! Running a test against the server: a server with its fault and the
//! client's options built up ([`TestServer`]), run with a runtime and a
//! listener of its own per test, a connected transport and the checks every
//! case ends with; and the calls and checks the tests share.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdma::aio::tokio_rt as rt;
use rdma_nfs::transport::{Call, Error, Options, Reply, Transport};
use rdma_nfs::xdr::Writer;
use tokio::task::JoinHandle;

use crate::common::server_ip;
use crate::server::{serve, Fault, Seen};

pub(crate) fn null_call() -> Call {
    let mut w = Writer::new();
    rdma_nfs::rpc::encode_call(&mut w, 0, 100_003, 3, 0, &rdma_nfs::rpc::Auth::None);
    Call {
        msg: w.buf,
        ..Call::default()
    }
}

pub(crate) fn check_reply(r: &Reply) {
    let (_, mut rest) = rdma_nfs::rpc::decode_reply(&r.msg).expect("an accepted reply");
    assert_eq!(rest.u32("marker").unwrap(), 0xabcd);
}

/// A server with one fault on a port of its own, and the options the client
/// connects to it with (8 credits and a call timeout of 10 s unless told
/// otherwise): what every test here starts from.
pub(crate) struct TestServer {
    iwarp: bool,
    port: u16,
    fault: Fault,
    opts: Options,
}

impl TestServer {
    /// `fault` on `port` of the test address (siw0's when `iwarp`).
    pub(crate) fn new(iwarp: bool, port: u16, fault: Fault) -> TestServer {
        TestServer {
            iwarp,
            port,
            fault,
            opts: Options {
                credits: 8,
                call_timeout: Duration::from_secs(10),
                ..Options::default()
            },
        }
    }

    pub(crate) fn call_timeout(mut self, timeout: Duration) -> TestServer {
        self.opts.call_timeout = timeout;
        self
    }

    /// Changes the client's options further.
    pub(crate) fn options(mut self, change: impl FnOnce(&mut Options)) -> TestServer {
        change(&mut self.opts);
        self
    }

    /// Runs `body` with the server's address and the client's options, in a
    /// runtime of its own; what the server saw.
    pub(crate) fn run_at<F, Fut>(self, body: F) -> Arc<Mutex<Seen>>
    where
        F: FnOnce(SocketAddr, Options) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let ip = server_ip(self.iwarp);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        rt.block_on(async {
            let cm = rt::cm_channel().unwrap();
            let addr = SocketAddr::new(ip, self.port);
            let listener = cm.listen(addr, 8).unwrap();
            let server = tokio::spawn(serve(listener, self.fault, Arc::clone(&seen)));
            body(addr, self.opts).await;
            server.abort();
        });
        seen
    }

    /// Runs `body` with a transport connected to the server, then checks
    /// that no chunk was left registered and that the connection still
    /// serves a correct call; what the server saw.
    pub(crate) fn run<F, Fut>(self, body: F) -> Arc<Mutex<Seen>>
    where
        F: FnOnce(Transport) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        self.run_at(|addr, opts| async move {
            let t = Transport::connect(addr, opts)
                .await
                .unwrap_or_else(|e| panic!("connect to the test server: {e}"));
            assert_eq!(
                t.negotiated().inline_send,
                2048,
                "the server's RFC 8797 receive size"
            );
            body(t.clone()).await;
            assert_eq!(
                t.stats().chunks_registered.load(Ordering::Relaxed),
                0,
                "a chunk left registered"
            );
            // And the connection still serves a correct call.
            check_reply(&t.call(null_call()).await.unwrap());
            t.close().await;
        })
    }
}

/// `call` on `t` in a task of its own.
pub(crate) fn spawn_call(t: &Transport, call: Call) -> JoinHandle<Result<Reply, Error>> {
    let t = t.clone();
    tokio::spawn(async move { t.call(call).await })
}

/// `n` calls made by `call`, all sent at once: their replies, in order.
pub(crate) async fn calls_at_once(t: &Transport, n: u64, call: impl Fn() -> Call) -> Vec<Reply> {
    let tasks: Vec<_> = (0..n).map(|_| spawn_call(t, call())).collect();
    let mut replies = Vec::new();
    for h in tasks {
        replies.push(h.await.unwrap().unwrap());
    }
    replies
}

/// A call with a write chunk of 64 KiB (and no reply chunk: its only rkey).
pub(crate) fn write_chunk_call() -> Call {
    let mut c = null_call();
    c.write_chunk = 65536;
    c
}

pub(crate) fn check_write_chunk(r: &Reply) {
    check_reply(r);
    let data = r.data.as_ref().expect("the write chunk's data");
    assert_eq!(data.len(), 65536);
    assert!(data.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
}

/// A first call, which gets the server's grant of 8, then two calls with a
/// write chunk each, which go out together; every reply checked.
pub(crate) async fn two_write_chunk_calls_together(t: &Transport) {
    check_reply(&t.call(null_call()).await.unwrap());
    let a = spawn_call(t, write_chunk_call());
    let b = spawn_call(t, write_chunk_call());
    check_write_chunk(&a.await.unwrap().unwrap());
    check_write_chunk(&b.await.unwrap().unwrap());
}

/// [local_invalidations, remote_invalidations, stray_invalidations,
/// plain_chunk_reads].
pub(crate) fn inv_counts(t: &Transport) -> [u64; 4] {
    let s = t.stats();
    [
        s.local_invalidations.load(Ordering::Relaxed),
        s.remote_invalidations.load(Ordering::Relaxed),
        s.stray_invalidations.load(Ordering::Relaxed),
        s.plain_chunk_reads.load(Ordering::Relaxed),
    ]
}

/// [fenced_windows, late_invalidations, connects].
pub(crate) fn fenced_late_connects(t: &Transport) -> [u64; 3] {
    let s = t.stats();
    [
        s.fenced_windows.load(Ordering::Relaxed),
        s.late_invalidations.load(Ordering::Relaxed),
        s.connects.load(Ordering::Relaxed),
    ]
}
