//! The async layer's runtime adapters on a plain pipe (no RDMA device): the
//! readiness contract every driver relies on, on tokio and on async-io, and
//! the errors for a runtime that cannot serve.
#![cfg(all(feature = "tokio", feature = "async-io"))]

use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Wake, Waker};

use rdma::aio::{async_io_rt::AsyncIo, tokio_rt::Tokio, Reactor, Readiness};

fn pair() -> (UnixStream, UnixStream) {
    let (a, b) = UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    (a, b)
}

/// Reads everything pending (until WouldBlock) into `got`.
fn drain(r: &UnixStream, got: &mut Vec<u8>) -> io::Result<()> {
    let mut buf = [0u8; 64];
    loop {
        match (&*r).read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => return Err(e),
        }
    }
}

struct Count(AtomicUsize);
impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn tokio_readiness_drains_and_does_not_lose_a_later_write() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (r, w) = pair();
        let readiness = Tokio.register(r.as_fd()).unwrap();
        check(readiness, &r, &w).await;
    });
}

#[test]
fn async_io_readiness_drains_and_does_not_lose_a_later_write() {
    async_io::block_on(async {
        let (r, w) = pair();
        let readiness = AsyncIo.register(r.as_fd()).unwrap();
        check(readiness, &r, &w).await;
    });
}

/// Waits (with the reactor) until `attempt` stops returning WouldBlock.
async fn wait_read(
    readiness: &dyn Readiness,
    attempt: &mut dyn FnMut() -> io::Result<()>,
) -> io::Result<()> {
    std::future::poll_fn(|cx| readiness.poll_read(cx, attempt)).await
}

/// The contract every driver relies on: Pending while nothing is readable;
/// after a write, the attempt runs and sees the bytes; once an attempt has
/// drained the descriptor (WouldBlock), Pending again; a write after that is
/// seen by the next wait, whatever the reactor's triggering.
async fn check(readiness: Box<dyn Readiness>, r: &UnixStream, mut w: &UnixStream) {
    let wakes = Arc::new(Count(AtomicUsize::new(0)));
    let waker = Waker::from(Arc::clone(&wakes));
    let mut cx = Context::from_waker(&waker);
    let mut got = Vec::new();
    let p = readiness.poll_read(&mut cx, &mut || drain(r, &mut got));
    assert!(p.is_pending(), "nothing written: {p:?}");
    assert!(got.is_empty());
    for round in 0..4u8 {
        w.write_all(&[round; 5]).unwrap();
        let mut got = Vec::new();
        // Ready once the drain read something; WouldBlock before that.
        wait_read(&*readiness, &mut || match drain(r, &mut got) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && !got.is_empty() => Ok(()),
            other => other,
        })
        .await
        .unwrap();
        assert_eq!(
            got,
            vec![round; 5],
            "round {round}: nothing lost, nothing doubled"
        );
        // Drained: a poll now is Pending again.
        let mut more = Vec::new();
        let p = readiness.poll_read(&mut cx, &mut || drain(r, &mut more));
        assert!(p.is_pending(), "round {round}: drained, yet {p:?}");
        assert!(more.is_empty());
    }
}

#[test]
fn tokio_outside_a_runtime_is_an_error_not_a_panic() {
    let (r, _w) = pair();
    let e = Tokio
        .register(r.as_fd())
        .err()
        .expect("no runtime: an error");
    assert_eq!(e.errno(), Some(libc::ENXIO), "{e}");
    assert!(e.to_string().contains("outside a tokio runtime"), "{e}");
}

#[test]
fn tokio_runtime_without_io_is_an_error_not_a_panic() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let (r, _w) = pair();
    let e = rt
        .block_on(async { Tokio.register(r.as_fd()).err() })
        .expect("no I/O driver: an error");
    assert_eq!(e.errno(), Some(libc::ENXIO), "{e}");
    assert!(e.to_string().contains("no I/O driver"), "{e}");
}
