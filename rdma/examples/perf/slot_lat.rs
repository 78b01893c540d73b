//! `send_lat` and `write_lat` on a [`SlotQueue`], perf's default for them:
//! the loops in perftest's shape, over memory registered once and lent to
//! the queue's slots, so a post is a checked slot and the provider call and
//! a completion is an index (CONVENTIONS, "Data path"). The statistics and
//! the loops of the other paths are in `lat.rs`.

use rdma::{SlotCompletion, SlotQueue, SlotSender, SlotWriter, WcStatus};

use crate::clock;
use crate::clock::Stamps;
use crate::lat::Arrivals;
use crate::oob::Watch;
use anyhow::{anyhow, Context as _};

use crate::common::Res;
use crate::opts::Opts;
use crate::setup::Conn;

/// A failed slot queue completion as an error (`c` by value: a loop's
/// completion then never needs an address).
#[cold]
fn slot_failed(what: &str, c: SlotCompletion) -> anyhow::Error {
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

/// The next completion of `q`, checked (a failed one is an error naming
/// `what` it finished); spins, with the peer watched, while the CQ is
/// empty.
#[inline(always)]
fn next_slot(q: &mut SlotQueue, watch: &Watch<'_>) -> Res<SlotCompletion> {
    loop {
        match q.poll() {
            Ok(Some(c)) if c.is_success() => return Ok(c),
            Ok(Some(c)) if c.is_recv() => return Err(slot_failed("receive", c)),
            Ok(Some(c)) => return Err(slot_failed("send", c)),
            Ok(None) => watch.idle()?,
            Err(e) => return Err(slot_poll_failed(e)),
        }
    }
}

/// `send_lat` on the slot queue (the default), in perftest's shape:
/// receives in slots `0..last`, every send from slot `last`. Each
/// iteration stamps, posts its SEND, posts again the receive whose message
/// came last (after the send, so that the post is not in the round trip),
/// and waits for its completions: the send's (when signaled) and the peer's
/// next message, in whichever order the one CQ gives them. The server
/// waits for the client's first message before its first send. Out of
/// line: the loop gets registers of its own, not the statistics' frame.
#[inline(never)]
pub fn send(conn: &mut Conn, opts: &Opts, size: usize, stamps: &mut Stamps) -> Res<()> {
    let iters = opts.iters;
    let q = conn.slots.as_mut().context("no slot queue")?;
    let last = q.slots() - 1;
    let posted = last.min(iters);
    for s in 0..posted {
        q.post_recv(s).context("Couldn't post receives")?;
    }
    // Every SEND is the same: checked once.
    let sender = q
        .sender(last, size as u32)
        .context("Couldn't prepare the send")?;
    conn.oob.barrier()?;
    let watch = conn.oob.watch();
    let sends = Sends {
        sender,
        watch: &watch,
        cq_mod: opts.cq_mod_for(size),
        // Receives still to post again: one per message beyond those
        // posted (perftest's `rcnt + rx_depth <= iters`).
        reposts: iters - posted,
    };
    if opts.is_server() {
        sends.run::<true>(iters, stamps)
    } else {
        sends.run::<false>(iters, stamps)
    }
}

/// What `send_lat`'s loop works on.
struct Sends<'a, 'w> {
    /// Every SEND, from the last slot; the queue behind it.
    sender: SlotSender<'a>,
    watch: &'a Watch<'w>,
    /// One send in `cq_mod` is signaled, and the last.
    cq_mod: u32,
    reposts: u32,
}

impl Sends<'_, '_> {
    /// `iters` iterations; `SERVER` first waits for the client's message,
    /// and its last iteration waits for no message.
    #[inline(always)]
    fn run<const SERVER: bool>(self, iters: u32, stamps: &mut Stamps) -> Res<()> {
        let Sends {
            mut sender,
            watch,
            cq_mod,
            mut reposts,
        } = self;
        // The slot of the message that came last, to post again.
        let mut arrived = None;
        if SERVER && iters > 0 {
            arrived = wait(sender.queue(), watch, false, true)?;
        }
        let mut stamp = stamps.slots(iters as usize);
        let mut to_signal = cq_mod;
        let mut n = 0;
        while n < iters {
            n += 1;
            if let Some(t) = stamp.next() {
                *t = clock::now();
            }
            to_signal -= 1;
            let signaled = to_signal == 0 || n == iters;
            if to_signal == 0 {
                to_signal = cq_mod;
            }
            sender.post(signaled).context("Couldn't post send")?;
            let q = sender.queue();
            if let Some(slot) = arrived {
                if reposts > 0 {
                    reposts -= 1;
                    q.post_recv(slot).context("Couldn't post a receive")?;
                }
            }
            arrived = wait(q, watch, signaled, !SERVER || n < iters)?;
        }
        Ok(())
    }
}

/// Waits for the completion of a signaled send (`send`) and a receive
/// (`recv`), in either order: the receive's slot.
#[inline(always)]
fn wait(q: &mut SlotQueue, watch: &Watch<'_>, mut send: bool, mut recv: bool) -> Res<Option<u32>> {
    let mut slot = None;
    while send || recv {
        let c = next_slot(q, watch)?;
        if !c.is_recv() {
            send = false;
        } else if recv {
            recv = false;
            slot = Some(c.slot());
        } else {
            // One message each way is in flight at a time.
            return Err(anyhow!(
                "a message came before this side's reply (slot {})",
                c.slot()
            ));
        }
    }
    Ok(slot)
}

/// `write_lat` on the slot queue (the default), in perftest's shape: the
/// client posts first; each side writes the iteration's number into its
/// message's last byte as it posts, waits for the completion, and waits
/// for the peer's write through a pointer found once ([`Arrivals`],
/// perftest's `poll_buf`).
#[inline(never)]
pub fn write(conn: &mut Conn, opts: &Opts, size: usize, stamps: &mut Stamps) -> Res<()> {
    let iters = opts.iters;
    conn.target
        .write_at(size - 1, &[0])
        .context("Couldn't clear the target buffer")?;
    let arrivals = Arrivals::new(&conn.target, size)?;
    let q = conn.slots.as_mut().context("no slot queue")?;
    let target = q.write_target(conn.remote[0]);
    let len = size as u32;
    // Every write is the same (slot 0, `len` bytes, the peer's buffer):
    // checked once.
    let writer = q
        .writer(&target, 0, len)
        .context("Couldn't prepare the write")?;
    conn.oob.barrier()?;
    let watch = conn.oob.watch();
    let w = Writes {
        writer,
        arrivals: &arrivals,
        watch: &watch,
        len,
    };
    if opts.is_server() {
        w.run::<true>(iters, stamps)
    } else {
        w.run::<false>(iters, stamps)
    }
}

/// What `write_lat`'s loop works on.
struct Writes<'a, 'w> {
    /// Every write, from slot 0; the queue behind it.
    writer: SlotWriter<'a>,
    arrivals: &'a Arrivals<'a>,
    watch: &'a Watch<'w>,
    len: u32,
}

impl Writes<'_, '_> {
    /// `iters` iterations, one counter: the `n`-th message is posted with
    /// `n` in its last byte, and the peer's `n`-th awaited after it
    /// (client) or before it (`SERVER`).
    #[inline(always)]
    fn run<const SERVER: bool>(self, iters: u32, stamps: &mut Stamps) -> Res<()> {
        let Writes {
            mut writer,
            arrivals,
            watch,
            len,
        } = self;
        let mut n = 0;
        while n < iters {
            n += 1;
            if SERVER {
                arrivals.wait(n, watch)?;
            }
            write_one(&mut writer, len, n, stamps, watch)?;
            if !SERVER {
                arrivals.wait(n, watch)?;
            }
        }
        Ok(())
    }
}

/// One `write_lat` message from slot 0, its last byte `n`: post, stamp,
/// wait for the completion.
#[inline(always)]
fn write_one(
    w: &mut SlotWriter<'_>,
    len: u32,
    n: u32,
    stamps: &mut Stamps,
    watch: &Watch<'_>,
) -> Res<()> {
    let last = len as usize - 1;
    if let Err(e) = w.post_with(true, |b| b[last] = n as u8) {
        return Err(anyhow!("Couldn't post send: {e}"));
    }
    stamps.push();
    loop {
        match w.queue().poll() {
            Ok(Some(c)) if c.is_success() => return Ok(()),
            Ok(Some(c)) => return Err(slot_failed("RDMA write", c)),
            Ok(None) => watch.idle()?,
            Err(e) => return Err(slot_poll_failed(e)),
        }
    }
}
