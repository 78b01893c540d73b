//! `-e --wait async`: `send_lat`'s loop and the bandwidth tests' safe
//! loops as futures on a tokio `current_thread` runtime, every completion
//! awaited through `rdma::aio::AsyncCq` (poll; when the CQ is empty arm it,
//! poll again and let the runtime's reactor sleep on the completion
//! channel's descriptor, events acknowledged in batches), as an async
//! service waits.
//!
//! The bandwidth loops are `bw.rs`'s own steps (`SafeClient`,
//! `SafeServer`) with `AsyncCq::batch_wc` as the wait (the client takes
//! what is already there with `AsyncCq::try_batch_wc` first). The latency loop is
//! `lat.rs`'s safe `send_lat` loop with its waits replaced:
//! the same posts (prepared, or inline), the same receive reposted after
//! the reply, the same stamps. Completions are polled into slots the loop
//! keeps (`AsyncCq::next_into`), as the blocking loop does.
//!
//! Built only with the `tokio` feature (`cargo build --release --example
//! perf --features tokio`); without it `--wait async` is refused when the
//! options are read.

use rdma::aio::tokio_rt as rt;
use std::future::Future;

use rdma::{InlineSend, WorkCompletion};

use anyhow::Context as _;

use crate::bw::{SafeClient, SafeServer};
use crate::clock::Stamps;
use crate::common::Res;
use crate::io::{self, POLL_BATCH};
use crate::opts::Opts;
use crate::report::BwStamps;
use crate::setup::Conn;

/// `send_lat` for one size with async waits; see the module documentation.
///
/// # Errors
/// Any failure of the run, or of building the runtime.
pub fn send_lat(conn: &mut Conn, opts: &Opts, size: usize, stamps: &mut Stamps) -> Res<()> {
    block_on(send_lat_async(conn, opts, size, stamps))
}

/// Runs `run` on a new tokio `current_thread` runtime with its I/O driver.
fn block_on<T>(run: impl Future<Output = Res<T>>) -> Res<T> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .context("Couldn't build a tokio runtime")?;
    runtime.block_on(run)
}

/// The bandwidth client (`send_bw`, `write_bw`, `read_bw`, `atomic_bw`) for
/// one size with async waits: `bw.rs`'s safe loop ([`SafeClient`]'s two
/// steps) run in ordinary code while completions are there
/// ([`run_ready`]), `AsyncCq::batch_wc` awaited when the CQ is empty; both
/// poll into the loop's array in the compact form, as the blocking loop
/// does. Returns the number of requests.
///
/// # Errors
/// Any failure of the run, or of building the runtime.
pub fn bw_client(conn: &mut Conn, opts: &Opts, size: usize, stamps: &mut BwStamps) -> Res<usize> {
    block_on(async {
        let mut client = SafeClient::new(conn, opts, size, stamps)?;
        let mut acq = rt::completions(&conn.send_cq).context("Couldn't await the send CQ")?;
        let mut wcs = [WorkCompletion::default(); POLL_BATCH];
        let mut memory = Vec::new();
        conn.oob.barrier()?;
        stamps.loop_start();
        loop {
            run_ready(&mut client, conn, &mut acq, &mut wcs, &mut memory, stamps)?;
            if client.finished() {
                break;
            }
            // The CQ was empty after the posts: poll, arm, poll again and
            // sleep until a completion comes.
            let n = acq
                .batch_wc(&mut wcs, &mut memory)
                .await
                .context("poll CQ failed")?;
            client.complete_wc(&wcs[..n], &mut memory, stamps)?;
        }
        stamps.loop_end(client.total);
        Ok(client.total)
    })
}

/// The client's steps while completions are already there: post, take
/// what the CQ holds without waiting (`AsyncCq::try_batch_wc`), handle it;
/// returns when the CQ is empty or the run is over. Not inlined into the
/// future: there the post loop's variables live in the future's state and
/// were reloaded around every provider call (callgrind: about 13
/// user-space instructions per message at `send_bw` 2 B); here it compiles
/// as the blocking loop does.
#[inline(never)]
fn run_ready(
    client: &mut SafeClient,
    conn: &mut Conn,
    acq: &mut rdma::aio::AsyncCq,
    wcs: &mut [WorkCompletion],
    memory: &mut Vec<(u64, rdma::WrBuffers)>,
    stamps: &mut BwStamps,
) -> Res<()> {
    while !client.finished() {
        client.post(&mut conn.qps, stamps)?;
        let n = acq.try_batch_wc(wcs, memory).context("poll CQ failed")?;
        if n == 0 {
            break;
        }
        client.complete_wc(&wcs[..n], memory, stamps)?;
    }
    Ok(())
}

/// The `send_bw` server for one size with async waits: `bw.rs`'s safe loop
/// ([`SafeServer`]'s step), each poll's batch awaited as in [`bw_client`].
/// Returns the number of messages.
///
/// # Errors
/// Any failure of the run, or of building the runtime.
pub fn bw_server(conn: &mut Conn, opts: &Opts, size: usize, stamps: &mut BwStamps) -> Res<usize> {
    block_on(async {
        let mut server = SafeServer::new(conn, opts, size, stamps)?;
        let mut acq = rt::completions(&conn.recv_cq).context("Couldn't await the receive CQ")?;
        let mut wcs = [WorkCompletion::default(); POLL_BATCH];
        let mut memory = Vec::with_capacity(POLL_BATCH);
        conn.oob.barrier()?;
        while !server.finished() {
            let n = acq
                .batch_wc(&mut wcs, &mut memory)
                .await
                .context("poll CQ failed")?;
            server.complete_wc(&mut conn.qps, &wcs[..n], &mut memory)?;
        }
        Ok(server.end(stamps))
    })
}

async fn send_lat_async(conn: &mut Conn, opts: &Opts, size: usize, stamps: &mut Stamps) -> Res<()> {
    let server = opts.is_server();
    let iters = opts.iters;
    // Field by field: the QP is posted to while the CQs are awaited.
    let Conn {
        qps,
        send_cq,
        recv_cq,
        oob,
        inline: max_inline,
        ..
    } = conn;
    let qp = &mut qps[0];
    // As the blocking loop.
    let (mut receives, mut rposted) = crate::lat::Receives::post(qp, opts, size)?;
    let cq_mod = opts.cq_mod_for(size);
    let inline = size <= *max_inline as usize;
    // As the blocking loop.
    let (mut prepared, mut sbufs) = crate::lat::send_buffers(qp, opts, inline, size, cq_mod)?;
    let data = vec![0u8; size];
    let mut recv_acq = rt::completions(recv_cq).context("Couldn't await the receive CQ")?;
    let mut send_acq = rt::completions(send_cq).context("Couldn't await the send CQ")?;
    let (mut rslot, mut sslot) = (None, None);
    oob.barrier()?;
    let mut rcnt = 0;
    for scnt in 0..iters {
        // The message that just arrived: its buffer is posted again once
        // the reply is on its way.
        let arrived = server || scnt > 0;
        if arrived {
            let c = recv_acq
                .next_into(&mut rslot)
                .await
                .context("poll CQ failed")?;
            io::check(c, "receive")?;
            rcnt += 1;
        }
        let n = scnt + 1;
        let signaled = n % cq_mod == 0 || n == iters;
        if inline {
            qp.post_send_inline(InlineSend::send(u64::from(n), &data).signaled(signaled))
                .context("Couldn't post send")?;
        } else if let Some(p) = &mut prepared {
            p.set_signaled(signaled);
            qp.post_prepared(p, u64::from(n), 0, size)
                .context("Couldn't post send")?;
        } else {
            let mr = sbufs.pop().context("no free send buffer")?;
            qp.post_send(rdma::SendWr::send(u64::from(n), mr).signaled(signaled))
                .map_err(|e| e.error)
                .context("Couldn't post send")?;
        }
        stamps.push();
        if let (true, Some(c)) = (arrived, rslot.as_mut()) {
            if rposted < iters {
                receives.repost(qp, c.wr_id, || Some(c.take_buffers()))?;
                rposted += 1;
            }
        }
        if signaled {
            let c = send_acq
                .next_into(&mut sslot)
                .await
                .context("poll CQ failed")?;
            io::check(c, "send")?;
            for (_, b) in c.unsignaled.drain(..) {
                sbufs.extend(b.into_one());
            }
            sbufs.extend(c.take_buffers().into_one());
        }
    }
    while rcnt < iters {
        let c = recv_acq
            .next_into(&mut rslot)
            .await
            .context("poll CQ failed")?;
        io::check(c, "receive")?;
        rcnt += 1;
    }
    Ok(())
}
