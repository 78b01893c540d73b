//! Latency tests, timed as perftest times them: one timestamp per post, and
//! the statistics over the gaps between consecutive posts.
//!
//! The stamps are TSC reads where there is a TSC (`clock.rs`), as
//! perftest's. The slot queue's `send_lat` loop (`slot_lat.rs`, the
//! default) stamps right before the post, as perftest does; the other loops
//! right after it: the gaps, iteration to iteration, are the same either
//! way. Every loop posts a receive again after the
//! reply is sent, not before, so that the post is not in the round trip.
//!
//! - `send_lat`, `write_lat`: ping-pong. The client sends first; each side
//!   sends its next message once the peer's has arrived (a receive
//!   completion for SEND; for WRITE, the last byte of the target buffer
//!   changing, polled in memory). A gap is a round trip: halved.
//! - `read_lat`, `atomic_lat`: the client posts one request at a time and
//!   waits for its completion; a gap is one operation. The server waits.

use rdma::{
    ffi, AccessFlags, InlineSend, MemoryRegion, PreparedRecv, PreparedSend, SendFlags, SendOp,
    WorkCompletion, WrBuffers,
};

use std::marker::PhantomData;

use anyhow::{bail, Context as _};

use crate::clock::Stamps;
use crate::common::Res;
use crate::io::{self, RawRecv, RawSend};
use crate::oob::Watch;
use crate::opts::{Opts, Verb};
use crate::report;
use crate::setup::{self, Conn};
use crate::slot_lat;

/// Runs every size of the test on an established connection.
///
/// # Errors
/// Any failure of the run.
pub fn run(conn: &mut Conn, opts: &Opts) -> Res<()> {
    let server = opts.is_server();
    let verb = opts.test.verb;
    let pingpong = matches!(verb, Verb::Send | Verb::Write);
    if pingpong || !server {
        report::lat_header();
    }
    let mut stamps = Stamps::with_capacity(opts.iters as usize);
    let mut work = Vec::with_capacity(opts.iters as usize);
    let mut raw_stamp = Vec::new();
    for size in opts.sizes() {
        if !pingpong && server {
            conn.oob.barrier()?;
            conn.oob.barrier()?;
            continue;
        }
        stamps.clear();
        let cpu0 = report::cpu_times();
        match (verb, opts.raw) {
            (Verb::Send, _) if conn.slots.is_some() => {
                slot_lat::send(conn, opts, size, &mut stamps)?
            }
            (Verb::Write, _) if conn.slots.is_some() => {
                slot_lat::write(conn, opts, size, &mut stamps)?
            }
            #[cfg(feature = "tokio")]
            (Verb::Send, false) if opts.wait == crate::events::Wait::Async => {
                crate::aio::send_lat(conn, opts, size, &mut stamps)?
            }
            (Verb::Send, false) => send_safe(conn, opts, size, &mut stamps)?,
            (Verb::Send, true) => send_raw(conn, opts, size, &mut stamps)?,
            (Verb::Write, false) => match opts.interleave {
                Some(block) => {
                    write_interleaved(conn, opts, size, (block, &mut raw_stamp), &mut stamps)?
                }
                None => write_safe(conn, opts, size, &mut stamps)?,
            },
            (Verb::Write, true) => write_raw(conn, opts, size, &mut stamps)?,
            (_, false) => one_sided_safe(conn, opts, size, &mut stamps)?,
            (_, true) => one_sided_raw(conn, opts, size, &mut stamps)?,
        }
        stamps.finish();
        let cpu1 = report::cpu_times();
        conn.oob.barrier()?;
        let rtt_factor = if pingpong { 2.0 } else { 1.0 };
        if opts.report_unsorted || opts.report_histogram {
            report::samples(
                &stamps,
                rtt_factor,
                opts.report_unsorted,
                opts.report_histogram,
                &mut work,
            );
        }
        report::lat_line(size, &stamps, rtt_factor, &mut work);
        if opts.interleave.is_some() {
            report::interleaved(&stamps, &raw_stamp, rtt_factor);
        }
        if opts.cpu {
            report::cpu_line(cpu0, cpu1, stamps.len());
        }
    }
    report::footer();
    Ok(())
}

/// What a SEND latency loop sends from: nothing when inline; else the
/// send checked once with its own buffer, or (`--post-send`) a pool of
/// `cq_mod` buffers, one per send between two completions.
pub fn send_buffers(
    qp: &rdma::QueuePair,
    opts: &Opts,
    inline: bool,
    size: usize,
    cq_mod: u32,
) -> Res<(Option<PreparedSend>, Vec<MemoryRegion>)> {
    if inline {
        return Ok((None, Vec::new()));
    }
    let none = AccessFlags::empty();
    match prepare(qp, opts, SendOp::Send, SendFlags::SIGNALED, size, none)? {
        Some(p) => Ok((Some(p), Vec::new())),
        None => Ok((None, setup::pool(qp.pd(), cq_mod, size, none)?)),
    }
}

/// `op` with `flags`, checked once for `qp`, owning a new region of `len`
/// bytes with `access` (`None` with `--post-send`).
pub fn prepare(
    qp: &rdma::QueuePair,
    opts: &Opts,
    op: SendOp,
    flags: SendFlags,
    len: usize,
    access: AccessFlags,
) -> Res<Option<PreparedSend>> {
    if !opts.prepared {
        return Ok(None);
    }
    let pd = qp.pd();
    let mr = pd
        .alloc_mr(len, access)
        .context("Couldn't register the request's buffer")?;
    qp.prepare_send(op, flags, mr)
        .map_err(|e| e.error)
        .context("Couldn't prepare the request")
        .map(Some)
}

/// The receives `send_lat` keeps posted, on both of its loops: slots of one
/// region prepared once (`prepare_recv`, the default: perftest posts its
/// receives from one buffer too), or with `--post-send` a region moved into
/// each receive and given back by its completion.
pub enum Receives {
    Prepared(PreparedRecv),
    Moved,
}

impl Receives {
    /// Posts the first `slots` receives on `qp`.
    ///
    /// # Errors
    /// Registration or post failures.
    pub fn post(qp: &mut rdma::QueuePair, opts: &Opts, size: usize) -> Res<(Receives, u32)> {
        let slots = rx_slots(opts, size);
        if opts.prepared {
            let mr = qp
                .pd()
                .alloc_mr(size * slots as usize, AccessFlags::LOCAL_WRITE)
                .context("Couldn't register the receive buffers")?;
            let mut r = qp
                .prepare_recv(mr, size)
                .map_err(|e| e.error)
                .context("Couldn't prepare the receives")?;
            for slot in 0..slots {
                qp.post_prepared_recv(&mut r, u64::from(slot), slot as usize)
                    .context("Couldn't post receives")?;
            }
            return Ok((Receives::Prepared(r), slots));
        }
        let bufs = setup::pool(qp.pd(), slots, size, AccessFlags::LOCAL_WRITE)?;
        qp.post_recv_batch(bufs.into_iter().map(|m| (0, WrBuffers::One(m))))
            .map_err(|e| e.error)
            .context("Couldn't post receives")?;
        Ok((Receives::Moved, slots))
    }

    /// Posts again the receive that completed as `wr_id`, with the memory
    /// its completion gave back (`--post-send`; a prepared slot has none,
    /// and `memory` is not called for it).
    ///
    /// # Errors
    /// A failed post, or moved memory missing.
    #[inline(always)]
    pub fn repost(
        &mut self,
        qp: &mut rdma::QueuePair,
        wr_id: u64,
        memory: impl FnOnce() -> Option<WrBuffers>,
    ) -> Res<()> {
        match self {
            Receives::Prepared(r) => qp
                .post_prepared_recv(r, wr_id, wr_id as usize)
                .context("Couldn't post a receive"),
            Receives::Moved => {
                let b = memory().context("a receive completion without its memory")?;
                qp.post_recv(wr_id, b)
                    .map_err(|e| e.error)
                    .context("Couldn't post a receive")
            }
        }
    }
}

/// Receives kept posted in `send_lat`.
pub fn rx_slots(opts: &Opts, size: usize) -> u32 {
    setup::slots(size, opts.rx_depth.min(opts.iters))
}

fn send_safe(conn: &mut Conn, opts: &Opts, size: usize, stamps: &mut Stamps) -> Res<()> {
    let server = opts.is_server();
    let iters = opts.iters;
    let qp = &mut conn.qps[0];
    let (mut receives, mut rposted) = Receives::post(qp, opts, size)?;
    // Unsignaled sends keep their buffer until the next signaled completion:
    // one buffer per send between two completions (none when inline).
    let cq_mod = opts.cq_mod_for(size);
    let inline = size <= conn.inline as usize;
    let (mut prepared, mut sbufs) = send_buffers(qp, opts, inline, size, cq_mod)?;
    let data = vec![0u8; size];
    // The last receive and send completion, polled in place, and the
    // memory they gave back.
    let (mut rwc, mut swc) = ([WorkCompletion::default()], [WorkCompletion::default()]);
    let (mut rmem, mut smem) = (Vec::with_capacity(1), Vec::new());
    let (send_cq, recv_cq) = (&conn.send_cq, &conn.recv_cq);
    let (send_ch, recv_ch) = (conn.send_ch.as_ref(), conn.recv_ch.as_ref());
    conn.oob.barrier()?;
    let watch = conn.oob.watch();
    let mut rcnt = 0;
    // Sends left until the next signaled one (a countdown: a division per
    // iteration costs more).
    let mut unsignaled = cq_mod;
    for scnt in 0..iters {
        // The buffer of the message that just arrived, posted again once
        // the reply is on its way.
        let arrived = server || scnt > 0;
        if arrived {
            io::wait_one_safe(recv_cq, recv_ch, &mut rwc, &mut rmem, &watch, "receive")?;
            rcnt += 1;
        }
        let n = scnt + 1;
        unsignaled -= 1;
        let signaled = unsignaled == 0 || n == iters;
        if unsignaled == 0 {
            unsignaled = cq_mod;
        }
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
        if arrived && rposted < iters {
            receives.repost(qp, rwc[0].wr_id(), || rmem.pop().map(|(_, b)| b))?;
            rposted += 1;
        }
        if signaled {
            io::wait_one_safe(send_cq, send_ch, &mut swc, &mut smem, &watch, "send")?;
            // Memory comes back only with `--post-send`.
            if !smem.is_empty() {
                for (_, b) in smem.drain(..) {
                    sbufs.extend(b.into_one());
                }
            }
        }
    }
    while rcnt < iters {
        io::wait_one_safe(recv_cq, recv_ch, &mut rwc, &mut rmem, &watch, "receive")?;
        rcnt += 1;
    }
    Ok(())
}

fn send_raw(conn: &mut Conn, opts: &Opts, size: usize, stamps: &mut Stamps) -> Res<()> {
    let server = opts.is_server();
    let iters = opts.iters;
    let slots = rx_slots(opts, size);
    let rmr = conn
        .pd
        .alloc_mr(size * slots as usize, AccessFlags::LOCAL_WRITE)
        .context("Couldn't register the receive buffers")?;
    let mut recvs = RawRecv::new(rmr.addr(), rmr.lkey(), size);
    conn.raw_keep.push(rmr);
    let inline = size <= conn.inline as usize;
    let smr = conn
        .pd
        .alloc_mr(size, AccessFlags::empty())
        .context("Couldn't register the send buffer")?;
    let saddr = smr.addr();
    let mut send = RawSend::new(
        &conn.qps[0],
        Verb::Send,
        opts.atomic,
        smr.lkey(),
        size,
        conn.remote[0],
        inline,
    );
    conn.raw_keep.push(smr);
    let qp = &mut conn.qps[0];
    for s in 0..slots {
        // SAFETY: slot `s` of the registration kept in `conn.raw_keep`,
        // posted once, never referenced from Rust.
        unsafe { recvs.post(qp, s, u64::from(s)) }?;
    }
    let mut rposted = slots;
    let cq_mod = opts.cq_mod_for(size);
    let mut wc = [ffi::ibv_wc::default(); 1];
    conn.oob.barrier()?;
    let watch = conn.oob.watch();
    let mut rcnt = 0;
    for scnt in 0..iters {
        let mut arrived = None;
        if server || scnt > 0 {
            arrived = Some(io::wait_one_raw(
                &conn.recv_cq,
                conn.recv_ch.as_ref(),
                &mut wc,
                &watch,
                "receive",
            )?);
            rcnt += 1;
        }
        let n = scnt + 1;
        let signaled = n % cq_mod == 0 || n == iters;
        // SAFETY: the send buffer is kept in `conn.raw_keep` and only read
        // by the device; every send uses the same bytes (as perftest).
        unsafe { send.post(qp, saddr, u64::from(n), signaled) }?;
        stamps.push();
        if let Some(id) = arrived {
            if rposted < iters {
                // SAFETY: the slot's receive completed; kept memory.
                unsafe { recvs.post(qp, id as u32, id) }?;
                rposted += 1;
            }
        }
        if signaled {
            io::wait_one_raw(
                &conn.send_cq,
                conn.send_ch.as_ref(),
                &mut wc,
                &watch,
                "send",
            )?;
        }
    }
    while rcnt < iters {
        io::wait_one_raw(
            &conn.recv_cq,
            conn.recv_ch.as_ref(),
            &mut wc,
            &watch,
            "receive",
        )?;
        rcnt += 1;
    }
    Ok(())
}

/// Where the peer's RDMA WRITEs land: the last byte of the message in this
/// side's target region, found once and read in place on every spin (as
/// perftest's `poll_buf`), without a reference to device-written memory.
pub struct Arrivals<'a> {
    at: *const u8,
    /// The region the byte lies in, which lives while this is used.
    _target: PhantomData<&'a MemoryRegion>,
}

impl<'a> Arrivals<'a> {
    /// The last byte of a `size`-byte message at the start of `target`.
    ///
    /// # Errors
    /// `size` is 0 or larger than the region.
    pub fn new(target: &'a MemoryRegion, size: usize) -> Res<Arrivals<'a>> {
        if size == 0 || size > target.len() {
            bail!(
                "{size}-byte messages do not fit the {}-byte target buffer",
                target.len()
            );
        }
        Ok(Arrivals {
            at: (target.addr() + size as u64 - 1) as usize as *const u8,
            _target: PhantomData,
        })
    }

    /// Spins until the peer's `n`-th RDMA WRITE has landed (its last byte
    /// reads `n`, modulo 256).
    ///
    /// # Errors
    /// The peer is gone ([`Watch::idle`]).
    #[inline(always)]
    pub fn wait(&self, n: u32, watch: &Watch<'_>) -> Res<()> {
        // SAFETY: `at` lies in the registration `_target` borrows (checked
        // in `new`), whose address was exposed by `addr()`. The peer writes
        // it by DMA: a volatile byte read is how C observes an RDMA WRITE
        // too, and no Rust reference to the region's bytes exists.
        while unsafe { std::ptr::read_volatile(self.at) } != n as u8 {
            watch.idle()?;
        }
        Ok(())
    }
}

/// The safe `write_lat` loop alone (a function of its own, which the
/// instruction counts name): [`write_loop`] with no interleave, where the
/// raw branches fold away.
#[inline(never)]
fn write_safe(conn: &mut Conn, opts: &Opts, size: usize, stamps: &mut Stamps) -> Res<()> {
    write_loop(conn, opts, size, None, stamps)
}

/// [`write_loop`] with `--interleave BLOCK`.
#[inline(never)]
fn write_interleaved(
    conn: &mut Conn,
    opts: &Opts,
    size: usize,
    interleave: (u32, &mut Vec<bool>),
    stamps: &mut Stamps,
) -> Res<()> {
    write_loop(conn, opts, size, Some(interleave), stamps)
}

/// The safe `write_lat` loop. With `interleave` (`--interleave BLOCK`), also
/// [`write_raw`]'s: the paths alternate every `BLOCK` iterations (both sides
/// switch at the same iteration, so a round trip inside a block is all one
/// path), and the vector is filled with whether each stamp followed a raw
/// post. Inline sizes post inline on both paths. Inlined into both callers.
#[inline(always)]
fn write_loop(
    conn: &mut Conn,
    opts: &Opts,
    size: usize,
    mut interleave: Option<(u32, &mut Vec<bool>)>,
    stamps: &mut Stamps,
) -> Res<()> {
    let server = opts.is_server();
    let iters = opts.iters;
    let remote = conn.remote[0];
    let inline = size <= conn.inline as usize;
    let mut data = vec![0u8; size];
    // The raw path needs the buffer for its address even when inline.
    let mut smr = if inline && interleave.is_none() {
        None
    } else {
        Some(
            conn.pd
                .alloc_mr(size, AccessFlags::empty())
                .context("Couldn't register the send buffer")?,
        )
    };
    let (addr, lkey) = smr
        .as_ref()
        .map(|m| (m.addr(), m.lkey()))
        .unwrap_or_default();
    let mut send = RawSend::new(
        &conn.qps[0],
        Verb::Write,
        opts.atomic,
        lkey,
        size,
        remote,
        inline,
    );
    conn.target
        .write_at(size - 1, &[0])
        .context("Couldn't clear the target buffer")?;
    let arrivals = Arrivals::new(&conn.target, size)?;
    // The safe path's WRITE, with a buffer of its own (the raw path's is
    // `smr`); none when inline.
    let mut prepared = if inline {
        None
    } else {
        prepare(
            &conn.qps[0],
            opts,
            SendOp::Write(remote),
            SendFlags::SIGNALED,
            size,
            AccessFlags::empty(),
        )?
    };
    let (mut swc, mut memory) = ([WorkCompletion::default()], Vec::new());
    let mut wc = [ffi::ibv_wc::default(); 1];
    if let Some((_, raw_stamp)) = interleave.as_mut() {
        raw_stamp.clear();
    }
    conn.oob.barrier()?;
    let watch = conn.oob.watch();
    let qp = &mut conn.qps[0];
    let mut rcnt: u32 = 0;
    for scnt in 0..iters {
        if server || scnt > 0 {
            rcnt += 1;
            arrivals.wait(rcnt, &watch)?;
        }
        let n = scnt + 1;
        let raw = match interleave.as_mut() {
            Some((block, raw_stamp)) => {
                let raw = (scnt / *block) % 2 == 1;
                raw_stamp.push(raw);
                raw
            }
            None => false,
        };
        if raw && inline {
            data[size - 1] = n as u8;
            // SAFETY: inline data is copied during the post; `data` outlives it.
            unsafe { send.post(qp, data.as_ptr() as u64, u64::from(n), true) }?;
        } else if raw {
            let mr = smr.as_mut().context("the send buffer is still in flight")?;
            mr.as_mut_slice().context("send buffer")?[size - 1] = n as u8;
            // SAFETY: the registration is held in `smr` (not in flight: the
            // safe path's completions gave it back) until after the
            // completion polled right after, and nothing writes it meanwhile.
            unsafe { send.post(qp, addr, u64::from(n), true) }?;
        } else if inline {
            data[size - 1] = n as u8;
            qp.post_send_inline(InlineSend::write(u64::from(n), &data, remote))
                .context("Couldn't post send")?;
        } else if let Some(write) = &mut prepared {
            write
                .write_at(size - 1, &[n as u8])
                .context("send buffer")?;
            qp.post_prepared(write, u64::from(n), 0, size)
                .context("Couldn't post send")?;
        } else {
            let mut mr = smr.take().context("the send buffer is still in flight")?;
            mr.as_mut_slice().context("send buffer")?[size - 1] = n as u8;
            qp.post_send(rdma::SendWr::write(u64::from(n), mr, remote))
                .map_err(|e| e.error)
                .context("Couldn't post send")?;
        }
        stamps.push();
        // One wait per path: the raw poll, or the safe one, whose completion
        // gives back the memory a `--post-send` write moved (none else).
        if raw {
            io::wait_one_raw(&conn.send_cq, None, &mut wc, &watch, "RDMA write")?;
        } else {
            io::wait_one_safe(
                &conn.send_cq,
                None,
                &mut swc,
                &mut memory,
                &watch,
                "RDMA write",
            )?;
            if let Some((_, b)) = memory.pop() {
                smr = b.into_one();
            }
        }
    }
    while rcnt < iters {
        rcnt += 1;
        arrivals.wait(rcnt, &watch)?;
    }
    Ok(())
}

fn write_raw(conn: &mut Conn, opts: &Opts, size: usize, stamps: &mut Stamps) -> Res<()> {
    let server = opts.is_server();
    let iters = opts.iters;
    let inline = size <= conn.inline as usize;
    let mut smr = conn
        .pd
        .alloc_mr(size, AccessFlags::empty())
        .context("Couldn't register the send buffer")?;
    let saddr = smr.addr();
    let last = smr.as_mut_slice().context("send buffer")?[size - 1..].as_mut_ptr();
    let mut send = RawSend::new(
        &conn.qps[0],
        Verb::Write,
        opts.atomic,
        smr.lkey(),
        size,
        conn.remote[0],
        inline,
    );
    conn.raw_keep.push(smr);
    conn.target
        .write_at(size - 1, &[0])
        .context("Couldn't clear the target buffer")?;
    let arrivals = Arrivals::new(&conn.target, size)?;
    let mut wc = [ffi::ibv_wc::default(); 1];
    conn.oob.barrier()?;
    let watch = conn.oob.watch();
    let qp = &mut conn.qps[0];
    let mut rcnt: u32 = 0;
    for scnt in 0..iters {
        if server || scnt > 0 {
            rcnt += 1;
            arrivals.wait(rcnt, &watch)?;
        }
        let n = scnt + 1;
        // SAFETY: `last` points at the last byte of the send buffer, kept
        // alive in `conn.raw_keep`; the previous write from it has completed
        // (polled below), so the device is not reading it now.
        unsafe { last.write(n as u8) };
        // SAFETY: the buffer is kept in `conn.raw_keep`; the device reads it
        // until the completion polled right after.
        unsafe { send.post(qp, saddr, u64::from(n), true) }?;
        stamps.push();
        io::wait_one_raw(&conn.send_cq, None, &mut wc, &watch, "RDMA write")?;
    }
    while rcnt < iters {
        rcnt += 1;
        arrivals.wait(rcnt, &watch)?;
    }
    Ok(())
}

fn one_sided_safe(conn: &mut Conn, opts: &Opts, size: usize, stamps: &mut Stamps) -> Res<()> {
    let verb = opts.test.verb;
    let len = if verb == Verb::Atomic { 8 } else { size };
    let remote = conn.remote[0];
    let what = if verb == Verb::Atomic {
        "atomic"
    } else {
        "RDMA read"
    };
    let (mut wc, mut memory) = ([WorkCompletion::default()], Vec::with_capacity(1));
    let qp = &mut conn.qps[0];
    let op = io::safe_op(verb, opts.atomic, remote);
    // The request and its buffer (with `--post-send`, the buffer moves
    // into each request and comes back with its completion).
    let access = io::local_access(verb);
    let mut prepared = prepare(qp, opts, op, SendFlags::SIGNALED, len, access)?;
    let mut mr = match prepared {
        Some(_) => None,
        None => Some(
            conn.pd
                .alloc_mr(len, access)
                .context("Couldn't register the local buffer")?,
        ),
    };
    conn.oob.barrier()?;
    let watch = conn.oob.watch();
    for i in 1..=opts.iters {
        match &mut prepared {
            Some(request) => qp
                .post_prepared(request, u64::from(i), 0, len)
                .context("Couldn't post send")?,
            None => {
                let m = mr.take().context("the local buffer is still in flight")?;
                qp.post_send(io::safe_wr(verb, opts.atomic, u64::from(i), m, remote))
                    .map_err(|e| e.error)
                    .context("Couldn't post send")?;
            }
        }
        stamps.push();
        io::wait_one_safe(
            &conn.send_cq,
            conn.send_ch.as_ref(),
            &mut wc,
            &mut memory,
            &watch,
            what,
        )?;
        mr = memory.pop().and_then(|(_, b)| b.into_one());
    }
    Ok(())
}

fn one_sided_raw(conn: &mut Conn, opts: &Opts, size: usize, stamps: &mut Stamps) -> Res<()> {
    let verb = opts.test.verb;
    let len = if verb == Verb::Atomic { 8 } else { size };
    let mr = conn
        .pd
        .alloc_mr(len, io::local_access(verb))
        .context("Couldn't register the local buffer")?;
    let addr = mr.addr();
    let mut req = RawSend::new(
        &conn.qps[0],
        verb,
        opts.atomic,
        mr.lkey(),
        len,
        conn.remote[0],
        false,
    );
    conn.raw_keep.push(mr);
    let what = if verb == Verb::Atomic {
        "atomic"
    } else {
        "RDMA read"
    };
    let mut wc = [ffi::ibv_wc::default(); 1];
    conn.oob.barrier()?;
    let watch = conn.oob.watch();
    let qp = &mut conn.qps[0];
    for i in 1..=opts.iters {
        // SAFETY: the buffer is kept in `conn.raw_keep`, never referenced
        // from Rust; one request at a time (completion polled below).
        unsafe { req.post(qp, addr, u64::from(i), true) }?;
        stamps.push();
        io::wait_one_raw(&conn.send_cq, conn.send_ch.as_ref(), &mut wc, &watch, what)?;
    }
    Ok(())
}
