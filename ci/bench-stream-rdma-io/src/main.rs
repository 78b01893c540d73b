//! rdma-io 0.0.2's stream (`AsyncRdmaStream<SendRecvTransport>` with
//! `SendRecvConfig::stream()`, on tokio's current-thread runtime) in
//! rstream's custom test: a 16-byte handshake, then ITERS rounds of COUNT
//! transfers of SIZE bytes each way (the client sends first). It prints one
//! line with rstream's columns (name, bytes, count, iterations, total
//! bytes, seconds, Gb/s, µs per transfer), so that ci/bench-stream reads
//! it as it reads rstream's.
//!
//! Usage: bench-stream-rdma-io server|client ADDR PORT SIZE COUNT ITERS
use std::error::Error;
use std::net::SocketAddr;
use std::time::Instant;

use rdma_io::async_cm::AsyncCmListener;
use rdma_io::async_stream::AsyncRdmaStream;
use rdma_io::send_recv_transport::{SendRecvConfig, SendRecvTransport};

type Stream = AsyncRdmaStream<SendRecvTransport>;
type Res<T> = Result<T, Box<dyn Error>>;

const USAGE: &str = "usage: bench-stream-rdma-io server|client ADDR PORT SIZE COUNT ITERS";

async fn recv_exact(s: &mut Stream, buf: &mut [u8]) -> Res<()> {
    let mut off = 0;
    while off < buf.len() {
        let n = s
            .read(&mut buf[off..])
            .await
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err(format!(
                "the peer closed the stream after {off} of {} bytes",
                buf.len()
            )
            .into());
        }
        off += n;
    }
    Ok(())
}

async fn send(s: &mut Stream, buf: &[u8]) -> Res<()> {
    s.write_all(buf)
        .await
        .map_err(|e| format!("write: {e}").into())
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> Res<T> {
    let a = args.get(i).ok_or(USAGE)?;
    a.parse()
        .map_err(|_| format!("{what}: not a valid value: {a:?}\n{USAGE}").into())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let server = match args.get(1).map(String::as_str) {
        Some("server") => true,
        Some("client") => false,
        _ => return Err(USAGE.into()),
    };
    let addr: SocketAddr = format!(
        "{}:{}",
        args.get(2).ok_or(USAGE)?,
        args.get(3).ok_or(USAGE)?
    )
    .parse()
    .map_err(|e| format!("ADDR PORT: {e}"))?;
    let size: usize = arg(&args, 4, "SIZE")?;
    let count: usize = arg(&args, 5, "COUNT")?;
    let iters: usize = arg(&args, 6, "ITERS")?;
    let mut s = if server {
        let l = AsyncCmListener::bind(&addr).map_err(|e| format!("bind {addr}: {e}"))?;
        let t = SendRecvTransport::accept(&l, SendRecvConfig::stream())
            .await
            .map_err(|e| format!("accept: {e}"))?;
        AsyncRdmaStream::new(t)
    } else {
        let t = SendRecvTransport::connect(&addr, SendRecvConfig::stream())
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        AsyncRdmaStream::new(t)
    };
    let mut buf = vec![0x5au8; size.max(16)];
    let hello = [0x11u8; 16];
    if server {
        recv_exact(&mut s, &mut buf[..16]).await?;
        send(&mut s, &hello).await?;
    } else {
        send(&mut s, &hello).await?;
        recv_exact(&mut s, &mut buf[..16]).await?;
    }
    let out = vec![0xa5u8; size];
    let start = Instant::now();
    for _ in 0..iters {
        for _ in 0..count {
            if server {
                recv_exact(&mut s, &mut buf[..size]).await?;
            } else {
                send(&mut s, &out).await?;
            }
        }
        for _ in 0..count {
            if server {
                send(&mut s, &out).await?;
            } else {
                recv_exact(&mut s, &mut buf[..size]).await?;
            }
        }
    }
    let usec = start.elapsed().as_secs_f64() * 1e6;
    let bytes = (iters * count * size * 2) as f64;
    println!(
        "rdma-io    {:<8}{:<8}{:<8}{:<8}{:>8.2}s{:>10.2}{:>11.2}",
        size,
        count,
        iters,
        bytes as u64,
        usec / 1e6,
        bytes * 8.0 / (1000.0 * usec),
        (usec / iters as f64) / (count * 2) as f64
    );
    // The client closes; the server waits for that, so neither side tears
    // down while the peer still reads its last transfer.
    if server {
        let mut one = [0u8; 1];
        let _ = s.read(&mut one).await;
    } else {
        let _ = s.shutdown().await;
    }
    Ok(())
}
