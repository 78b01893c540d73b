//! Running a test against the server: a runtime and a listener of its own
//! per test ([`with_server_at`]), a connected transport with the checks every
//! case ends with ([`with_server`]), and the calls and checks the tests share.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use rdma::aio::tokio_rt as rt;
use rdma_nfs::transport::{Call, Options, Transport};
use rdma_nfs::xdr::Writer;

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

pub(crate) fn check_reply(r: &rdma_nfs::transport::Reply) {
    let (_, mut rest) = rdma_nfs::rpc::decode_reply(&r.msg).expect("an accepted reply");
    assert_eq!(rest.u32("marker").unwrap(), 0xabcd);
}

/// Runs `body` with the address of a server with `fault` on a port of its own, in a
/// runtime of its own; what the server saw.
pub(crate) fn with_server_at<F, Fut>(
    iwarp: bool,
    port: u16,
    fault: Fault,
    body: F,
) -> Arc<Mutex<Seen>>
where
    F: FnOnce(SocketAddr) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let ip = server_ip(iwarp);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    rt.block_on(async {
        let cm = rt::cm_channel().unwrap();
        let addr = SocketAddr::new(ip, port);
        let listener = cm.listen(addr, 8).unwrap();
        let server = tokio::spawn(serve(listener, fault, Arc::clone(&seen)));
        body(addr).await;
        server.abort();
    });
    seen
}

/// Runs `body` against a server with `fault` on a port of its own (connected with `opts`),
/// then checks that no chunk was left registered and that the connection still serves a
/// correct call.
pub(crate) fn with_server<F, Fut>(
    iwarp: bool,
    port: u16,
    fault: Fault,
    opts: Options,
    body: F,
) -> Arc<Mutex<Seen>>
where
    F: FnOnce(Transport) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    with_server_at(iwarp, port, fault, |addr| async move {
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

/// A call with a write chunk of 64 KiB (and no reply chunk: its only rkey).
pub(crate) fn write_chunk_call() -> Call {
    let mut c = null_call();
    c.write_chunk = 65536;
    c
}

pub(crate) fn check_write_chunk(r: &rdma_nfs::transport::Reply) {
    check_reply(r);
    let data = r.data.as_ref().expect("the write chunk's data");
    assert_eq!(data.len(), 65536);
    assert!(data.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
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
