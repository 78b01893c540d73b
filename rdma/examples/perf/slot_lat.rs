//! `send_lat` and `write_lat` on a [`SlotQueue`], perf's default for them:
//! the loops in perftest's shape, over memory registered once and lent to
//! the queue's slots, so a post is a checked slot and the provider call and
//! a completion is an index (CONVENTIONS, "Data path"). The statistics and
//! the loops of the other paths are in `lat.rs`.

use rdma::{SlotCompletion, SlotQueue, WcStatus};

use crate::clock::Stamps;
use crate::lat::await_write;
use crate::oob::Watch;
use anyhow::{anyhow, Context as _};

use crate::common::Res;
use crate::opts::Opts;
use crate::setup::Conn;

/// A failed slot queue completion as an error.
#[cold]
fn slot_failed(what: &str, c: &SlotCompletion) -> anyhow::Error {
    anyhow!(
        "{what} completion with error, slot {}: {} (status {}, vendor error {:#x})",
        c.slot(),
        c.status(),
        WcStatus::to_raw(c.status()),
        c.vendor_err()
    )
}

#[cold]
fn slot_poll_failed(e: rdma::Error) -> anyhow::Error {
    anyhow::Error::from(e).context("poll CQ failed")
}

/// The next completion of `q`, checked; spins (with the peer watched)
/// while the CQ is empty.
#[inline(always)]
fn next_slot(q: &mut SlotQueue, watch: &Watch<'_>, what: &str) -> Res<SlotCompletion> {
    loop {
        match q.poll() {
            Ok(Some(c)) if c.is_success() => return Ok(c),
            Ok(Some(c)) => return Err(slot_failed(what, &c)),
            Ok(None) => watch.idle()?,
            Err(e) => return Err(slot_poll_failed(e)),
        }
    }
}

/// `send_lat` on the slot queue (the default): receives in slots
/// `0..last`, every send from slot `last`. Sends and receives complete on
/// one CQ; in a ping-pong at most one receive completes early (while this
/// side waits for its signaled send), and it is kept for the next wait.
pub fn send(conn: &mut Conn, opts: &Opts, size: usize, stamps: &mut Stamps) -> Res<()> {
    let server = opts.is_server();
    let iters = opts.iters;
    let q = conn.slots.as_mut().context("no slot queue")?;
    let last = q.slots() - 1;
    let posted = last.min(iters);
    for s in 0..posted {
        q.post_recv(s).context("Couldn't post receives")?;
    }
    let mut rposted = posted;
    let cq_mod = opts.cq_mod_for(size);
    let len = size as u32;
    conn.oob.barrier()?;
    let watch = conn.oob.watch();
    let mut rcnt = 0;
    let mut early: Option<u32> = None;
    let mut unsignaled = cq_mod;
    for scnt in 0..iters {
        let arrived = server || scnt > 0;
        let mut slot = 0;
        if arrived {
            slot = match early.take() {
                Some(s) => s,
                None => recv_slot(q, &watch)?,
            };
            rcnt += 1;
        }
        let n = scnt + 1;
        unsignaled -= 1;
        let signaled = unsignaled == 0 || n == iters;
        if unsignaled == 0 {
            unsignaled = cq_mod;
        }
        q.post_send(last, len, signaled)
            .context("Couldn't post send")?;
        stamps.push();
        if arrived && rposted < iters {
            q.post_recv(slot).context("Couldn't post a receive")?;
            rposted += 1;
        }
        if signaled {
            loop {
                let c = next_slot(q, &watch, "send")?;
                if !c.is_recv() {
                    break;
                }
                if early.replace(c.slot()).is_some() {
                    return Err(anyhow!("two receives completed before the send"));
                }
            }
        }
    }
    while rcnt < iters {
        if early.take().is_none() {
            recv_slot(q, &watch)?;
        }
        rcnt += 1;
    }
    Ok(())
}

/// Waits for a receive's completion on `q`: its slot. A send's completion
/// met meanwhile (none in a ping-pong: each signaled one is waited for
/// right after its post) is only checked.
#[inline(always)]
fn recv_slot(q: &mut SlotQueue, watch: &Watch<'_>) -> Res<u32> {
    loop {
        let c = next_slot(q, watch, "receive")?;
        if c.is_recv() {
            return Ok(c.slot());
        }
    }
}

/// `write_lat` on the slot queue (the default), in perftest's shape: the
/// client posts first; then each side waits for the peer's write, writes
/// the iteration's number into its message's last byte as it posts, and
/// waits for the completion.
#[inline(never)]
pub fn write(conn: &mut Conn, opts: &Opts, size: usize, stamps: &mut Stamps) -> Res<()> {
    let iters = opts.iters;
    conn.target
        .write_at(size - 1, &[0])
        .context("Couldn't clear the target buffer")?;
    let q = conn.slots.as_mut().context("no slot queue")?;
    let target = q.write_target(conn.remote[0]);
    let len = size as u32;
    conn.oob.barrier()?;
    let watch = conn.oob.watch();
    let mut posted: u32 = 0;
    let mut rcnt: u32 = 0;
    if !opts.is_server() && iters > 0 {
        posted = 1;
        write_one(q, &target, len, posted, stamps, &watch)?;
    }
    while posted < iters {
        rcnt += 1;
        await_write(&conn.target, size, rcnt, &watch)?;
        posted += 1;
        write_one(q, &target, len, posted, stamps, &watch)?;
    }
    while rcnt < iters {
        rcnt += 1;
        await_write(&conn.target, size, rcnt, &watch)?;
    }
    Ok(())
}

/// One `write_lat` message from slot 0, its last byte `n`: post, stamp,
/// wait for the completion.
#[inline(always)]
fn write_one(
    q: &mut SlotQueue,
    target: &rdma::SlotTarget,
    len: u32,
    n: u32,
    stamps: &mut Stamps,
    watch: &Watch<'_>,
) -> Res<()> {
    let last = len as usize - 1;
    if let Err(e) = q.post_write_with(target, 0, len, true, |b| b[last] = n as u8) {
        return Err(anyhow!("Couldn't post send: {e}"));
    }
    stamps.push();
    loop {
        match q.poll() {
            Ok(Some(c)) if c.is_success() => return Ok(()),
            Ok(Some(c)) => return Err(slot_failed("RDMA write", &c)),
            Ok(None) => watch.idle()?,
            Err(e) => return Err(slot_poll_failed(e)),
        }
    }
}
