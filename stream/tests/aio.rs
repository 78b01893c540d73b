//! The async stream on tokio: 64 clients at once on one listener whose
//! connections echo through split halves on rxe0, 16 on siw0.
//!
//! Device tests: `#[ignore]`d in a plain `cargo test`; the VM harness runs
//! them with `--ignored` and sets `RDMA_TEST_IP`/`RDMA_TEST_IWARP_IP`.
#![cfg(feature = "tokio")]

use std::net::SocketAddr;
use std::time::Duration;

use rdma::aio::tokio_rt::Tokio;
use rdma_stream::aio::{RdmaListener, RdmaStream};
use rdma_stream::{Options, Sizes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn ip(var: &str) -> std::net::IpAddr {
    std::env::var(var)
        .unwrap_or_else(|_| panic!("{var} is not set: run this test in the VM (ci/vm run)"))
        .parse()
        .expect("an IP address")
}

/// Small queues and buffers: 64 connections each way in one process; a
/// connect bound that covers 64 accepts one after the other in a TCG guest.
fn small() -> Options {
    Options {
        sizes: Sizes {
            send_queue: 32,
            recv_queue: 32,
            send_buffer: 64 * 1024,
            recv_buffer: 64 * 1024,
            inline: 64,
        },
        timeout: Duration::from_secs(30),
        ..Options::default()
    }
}

/// What client `i` sends: 40 KB + i of a pattern of its own.
fn message(i: usize) -> Vec<u8> {
    (0..40_000 + i).map(|k| (k * 7 + i * 13) as u8).collect()
}

async fn many_clients_echo(ip: std::net::IpAddr, clients: usize) {
    let mut listener = RdmaListener::bind(&Tokio, SocketAddr::new(ip, 0), small()).unwrap();
    let addr = listener.local_addr();
    let server = tokio::spawn(async move {
        let mut echoes = Vec::new();
        for _ in 0..clients {
            let (s, _) = listener.accept().await.expect("accept");
            echoes.push(tokio::spawn(async move {
                // Each direction in a task of its own.
                let (mut r, mut w) = s.into_split();
                let copied = tokio::io::copy(&mut r, &mut w).await?;
                w.shutdown().await?;
                std::io::Result::Ok(copied)
            }));
        }
        let mut total = 0;
        for e in echoes {
            total += e.await.unwrap().expect("an echo");
        }
        total
    });
    let mut tasks = Vec::new();
    for i in 0..clients {
        tasks.push(tokio::spawn(async move {
            let mut s = RdmaStream::connect(&Tokio, addr, &small())
                .await
                .expect("connect");
            let data = message(i);
            let (mut r, mut w) = s_split(&mut s);
            let send = async {
                w.write_all(&data).await?;
                w.shutdown().await
            };
            let mut back = Vec::new();
            let recv = r.read_to_end(&mut back);
            let (sent, got) = tokio::join!(send, recv);
            sent.expect("send");
            got.expect("receive");
            assert_eq!(back, data, "client {i} got its bytes back");
            data.len() as u64
        }));
    }
    let mut sent = 0;
    for t in tasks {
        sent += t.await.unwrap();
    }
    let echoed = tokio::time::timeout(Duration::from_secs(60), server)
        .await
        .expect("the server ends")
        .unwrap();
    assert_eq!(echoed, sent);
}

/// A stream's halves by reference, for one task that does both.
fn s_split(
    s: &mut RdmaStream,
) -> (
    tokio::io::ReadHalf<&mut RdmaStream>,
    tokio::io::WriteHalf<&mut RdmaStream>,
) {
    tokio::io::split(s)
}

#[test]
#[ignore = "needs an RDMA device"]
fn sixty_four_clients_echo_through_split_halves_rxe() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(many_clients_echo(ip("RDMA_TEST_IP"), 64));
}

// siw0 with 64: clients and server in one guest hold 128 connections on
// one soft-iWARP device, and ibv_create_cq failed without an errno for some
// (a device limit) while others' MPA exchanges timed out behind the
// one-at-a-time accept (2 of 2 runs; issue 41's note). 16 pass.
#[test]
#[ignore = "needs an RDMA device"]
fn sixteen_clients_echo_through_split_halves_iwarp() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(many_clients_echo(ip("RDMA_TEST_IWARP_IP"), 16));
}
