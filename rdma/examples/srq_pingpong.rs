//! Ping-pong over several reliable connected (RC) queue pairs that share one
//! receive queue (SRQ): a port of rdma-core's `ibv_srq_pingpong` that speaks
//! its handshake, so either side can be the C tool.
//!
//! ```text
//! srq_pingpong [-d DEV] [-g GID-INDEX] [-q QPS] [options]          # server
//! srq_pingpong [-d DEV] [-g GID-INDEX] [-q QPS] [options] HOST     # client
//! ```
//! Run with `--help` for the options. On RoCE (e.g. soft-RoCE `rxe0`) both
//! sides need `-g` with a GID index of the port; both need the same `-q`.
//!
//! # What the C tool does, and so this port
//! - `-q` RC QPs (default 16) take their receives from one SRQ of `-r`
//!   entries (default 500), which must be at least `-q`. All of them report
//!   to one CQ of `-r` + `-q` entries.
//! - The handshake is the one of the other pingpong tools, but with 256
//!   address messages each way: one per QP, then all-zero ones up to 256.
//!   This port insists that the peer's QP count equals `-q`.
//! - Each QP ping-pongs on its own: a QP sends again once its previous send
//!   has completed and a message has arrived on it; the client starts one
//!   send on every QP. `-n` counts sends and receives over *all* QPs (the C
//!   tool's help says "per QP", but its loop counts them together), and a
//!   side stops once it has completed `-n` of each.
//! - The SRQ is refilled to `-r` whenever no more than `-q` receives are left.
//! - Messages are `-s` zero bytes (the C tool's buffer). With `-c` this port
//!   checks every message received, on either side, against that; the C
//!   tool checks the first byte of each page of the last one, on the server.
//! - The path MTU defaults to 1024, as in the C tool.
//!
//! Unlike the C tool, whose sends and receives all share one buffer, every
//! receive here owns its buffer: the memory moves into the work request and
//! comes back with its completion (`rdma`'s safe post path), whichever QP
//! consumed it.

mod common;

use anyhow::{anyhow, Context as _};
use common::pingpong;
use std::time::{Duration, Instant};

use common::pingpong::{
    Dest, ExtraFlag, ExtraKind, ExtraValue, Opts, Res, Tool, RECV_WRID, SEND_WRID,
};
use rdma::ffi;
use rdma::{
    AccessFlags, Completion, CompletionChannel, CompletionQueue, InitAttr, InlineSend,
    MemoryRegion, Mtu, PostPath, ProtectionDomain, QpType, QueuePair, RtrAttr, RtsAttr, SendWr,
    SharedReceiveQueue, SrqAttr, WcStatus,
};

const TOOL: Tool = Tool {
    name: "srq_pingpong",
    twin: "ibv_srq_pingpong",
    default_size: 4096,
    // -m is an extra flag: its default is 1024, not the port's active MTU.
    has_mtu: false,
    rc_flags: false,
    unsupported: &[],
};

/// `-q` default, as the C tool.
const DEFAULT_NUM_QP: usize = 16;
/// Address messages each way, whatever `-q` is (the C tool's `MAX_QP`).
const WIRE_QPS: usize = 256;
/// `-m` default, as the C tool.
const DEFAULT_MTU: Mtu = Mtu::Mtu1024;

const EXTRA: &[ExtraFlag] = &[
    ExtraFlag {
        short: 'm',
        long: "mtu",
        kind: ExtraKind::Mtu,
        help: "path MTU: 256, 512, 1024, 2048 or 4096 (default 1024)",
    },
    ExtraFlag {
        short: 'q',
        long: "num-qp",
        // The C tool takes at most MAX_QP - 1 = 255.
        kind: ExtraKind::Number {
            min: 1,
            max: WIRE_QPS as u64 - 1,
        },
        help: "QPs sharing the SRQ, 1 to 255; at most -r (default 16)",
    },
    ExtraFlag {
        short: 'o',
        long: "odp",
        kind: ExtraKind::Switch,
        help: "register the buffers with on-demand paging",
    },
];

fn main() -> std::process::ExitCode {
    pingpong::main_with(&TOOL, EXTRA, run)
}

fn num_qp(opts: &Opts) -> usize {
    match opts.extra('q') {
        Some(ExtraValue::Number(n)) => usize::try_from(n).unwrap_or(usize::MAX),
        _ => DEFAULT_NUM_QP,
    }
}

/// An unused slot of the C tool's address table: all zero.
fn unused_slot() -> Dest {
    Dest {
        lid: 0,
        qpn: 0,
        psn: 0,
        gid: rdma::Gid::default(),
    }
}

/// The peer must describe exactly as many QPs as this side has: its first
/// `n` messages name QPs (QPN 0 is never an RC QP), the rest are empty.
fn check_peer_count(peers: &[Dest], n: usize) -> Res<()> {
    let theirs = peers.iter().take_while(|d| d.qpn != 0).count();
    let extra = peers[theirs..].iter().any(|d| d.qpn != 0);
    if theirs != n || extra {
        let count = if extra {
            "a different number of".to_string()
        } else {
            theirs.to_string()
        };
        return Err(anyhow!(
            "the peer has {count} QPs and this side {n}: give both sides the same -q"
        ));
    }
    Ok(())
}

fn run(opts: &Opts) -> Res<()> {
    let num_qp = num_qp(opts);
    if num_qp > opts.rx_depth as usize {
        return Err(anyhow!(
            "rx_depth {} is too small for {num_qp} QPs -- must have at least one receive per QP",
            opts.rx_depth
        ));
    }
    let (ctx, port) = pingpong::open_device(opts)?;
    let access = if opts.extra('o').is_some() {
        pingpong::odp_access(&ctx, ffi::IBV_ODP_SUPPORT_SRQ_RECV, "SRQ receives")?
    } else {
        AccessFlags::empty()
    };
    let channel = pingpong::comp_channel(&ctx, opts.events)?;
    let pd = ctx.alloc_pd().context("Couldn't allocate PD")?;
    let cq_size = opts
        .rx_depth
        .checked_add(num_qp as u32)
        .context("-r plus -q is too large for a CQ")?;
    let cq = ctx
        .create_cq(cq_size, channel.as_ref(), 0)
        .context("Couldn't create CQ")?;
    let srq = pd
        .create_srq(SrqAttr {
            max_wr: opts.rx_depth,
            max_sge: 1,
            srq_limit: 0,
        })
        .context("Couldn't create SRQ")?;
    // One send in flight per QP; no receive queue of their own.
    let mut qps = Vec::with_capacity(num_qp);
    for i in 0..num_qp {
        let qp = pd
            .qp_builder(QpType::Rc, &cq, &cq)
            .srq(&srq)
            .max_send_wr(1)
            .max_recv_wr(0)
            .max_recv_sge(0)
            .post_path(PostPath::Legacy)
            .build()
            .with_context(|| format!("Couldn't create QP[{i}]"))?;
        qps.push(qp);
    }
    // As the C tool: inline when the provider's inline limit allows it.
    let inline = qps
        .iter()
        .all(|qp| qp.caps().max_inline_data as usize >= opts.size);
    for (i, qp) in qps.iter().enumerate() {
        // No remote access: the peer only SENDs.
        qp.to_init(&InitAttr::new(opts.ib_port))
            .with_context(|| format!("Failed to modify QP[{i}] to INIT"))?;
    }
    let mut traffic = Traffic::new(&pd, srq, qps, opts, access, inline)?;
    traffic.refill()?;
    if channel.is_some() {
        // Armed before the peer learns our addresses, so no completion is missed.
        cq.req_notify(false)
            .context("Couldn't request CQ notification")?;
    }

    let mut mine = Vec::with_capacity(WIRE_QPS);
    for qp in &traffic.qps {
        let me = pingpong::local_dest(&ctx, &port, opts, qp.qp_num(), true)?;
        me.print("local");
        mine.push(me);
    }
    mine.resize(WIRE_QPS, unused_slot());
    let mtu = match opts.extra('m') {
        Some(ExtraValue::Mtu(m)) => m,
        _ => DEFAULT_MTU,
    };
    let qps = &traffic.qps;
    let connect = |peers: &[Dest]| -> Res<()> {
        check_peer_count(peers, num_qp)?;
        for (i, (qp, peer)) in qps.iter().zip(peers).enumerate() {
            let ah = pingpong::peer_ah(opts, &port, peer)?;
            // Defaults of the C tool: 1 outstanding READ/atomic, RNR timer
            // 12; timeout 14, 7 retries, 7 RNR retries.
            qp.to_rtr(Some(&RtrAttr::new(ah, mtu, peer.qpn, peer.psn)))
                .with_context(|| format!("Failed to modify QP[{i}] to RTR"))?;
            qp.to_rts(&RtsAttr::new(mine[i].psn))
                .with_context(|| format!("Failed to modify QP[{i}] to RTS"))?;
        }
        Ok(())
    };
    let peers = pingpong::exchange_all(opts, &mine, connect)?;
    for peer in peers.iter().take(num_qp) {
        peer.print("remote");
    }

    let elapsed = traffic.run(&cq, channel.as_ref(), opts)?;
    traffic.report(opts, elapsed)
}

/// What was wrong with a received message (`-c`).
#[derive(Debug)]
struct BadMessage {
    index: u32,
    qp: usize,
    byte_len: u32,
    pages: Vec<usize>,
}

/// One QP and its ping-pong state.
#[derive(Debug)]
struct Lane {
    /// `RECV_WRID | SEND_WRID` bits still to complete before the next send.
    pending: u64,
    /// The send buffer (not inline): `None` while the send is in flight.
    send: Option<MemoryRegion>,
}

/// The QPs, the SRQ, their buffers and counters.
struct Traffic {
    qps: Vec<QueuePair>,
    lanes: Vec<Lane>,
    srq: SharedReceiveQueue,
    size: usize,
    rx_depth: u32,
    /// Receive buffers not posted: each receive completion gives its buffer
    /// back, and the refill posts them again.
    free: Vec<MemoryRegion>,
    /// Receives posted to the SRQ and not completed.
    routs: u32,
    /// With inline sends: the message, copied at post time.
    inline: Option<Vec<u8>>,
    /// With `-c`: the payload every message must carry.
    expect: Option<Vec<u8>>,
    page: usize,
    bad: Vec<BadMessage>,
}

impl Traffic {
    /// Registers `rx_depth` receive buffers (one registration cut into
    /// pieces) and, unless sends are inline, one send buffer per QP.
    fn new(
        pd: &ProtectionDomain,
        srq: SharedReceiveQueue,
        qps: Vec<QueuePair>,
        opts: &Opts,
        access: AccessFlags,
        inline: bool,
    ) -> Res<Traffic> {
        let message = pingpong::filled(opts.size, 0)?;
        let total = opts
            .size
            .checked_mul(opts.rx_depth as usize)
            .context("the receive buffers (size × rx-depth) do not fit in memory")?;
        // Not the message's bytes, so a receive that wrote nothing shows.
        let recv = pd
            .reg_mr(
                pingpong::filled(total, 0x7b)?,
                access | AccessFlags::LOCAL_WRITE,
            )
            .with_context(|| format!("Couldn't register {total} bytes of receive buffers"))?;
        let free = recv
            .chunks(opts.size)
            .context("Couldn't cut the receive buffers")?;
        let mut lanes = Vec::with_capacity(qps.len());
        for _ in &qps {
            let send = if inline {
                None
            } else {
                Some(
                    pd.reg_mr(message.clone(), access)
                        .context("Couldn't register a send buffer")?,
                )
            };
            lanes.push(Lane { pending: 0, send });
        }
        Ok(Traffic {
            qps,
            lanes,
            srq,
            size: opts.size,
            rx_depth: opts.rx_depth,
            free,
            routs: 0,
            inline: inline.then(|| message.clone()),
            expect: opts.chk.then_some(message),
            page: pingpong::page_size(),
            bad: Vec::new(),
        })
    }

    /// Posts receives to the SRQ until `rx_depth` are outstanding.
    fn refill(&mut self) -> Res<()> {
        let srq = &self.srq;
        pingpong::refill_from(&mut self.free, &mut self.routs, self.rx_depth, |batch| {
            srq.post_recv_batch(batch)
        })
    }

    fn post_send(&mut self, i: usize) -> Res<()> {
        let qp = &mut self.qps[i];
        if let Some(data) = &self.inline {
            return qp
                .post_send_inline(InlineSend::send(SEND_WRID, data))
                .with_context(|| format!("Couldn't post send on QP[{i}]"));
        }
        let slot = &mut self.lanes[i].send;
        let mr = slot.take().ok_or_else(|| {
            anyhow!("Couldn't post send on QP[{i}]: the previous send has not completed")
        })?;
        qp.post_send(SendWr::send(SEND_WRID, mr)).map_err(|e| {
            *slot = e
                .returned
                .into_iter()
                .next()
                .and_then(|(_, b)| b.into_one());
            anyhow::Error::new(e.error).context(format!("Couldn't post send on QP[{i}]"))
        })
    }

    fn check(&mut self, mr: &MemoryRegion, byte_len: u32, index: u32, qp: usize) -> Res<()> {
        let Some(expect) = &self.expect else {
            return Ok(());
        };
        let payload = mr.as_slice().context("Couldn't read a receive buffer")?;
        if byte_len as usize == self.size && payload == &expect[..] {
            return Ok(());
        }
        let pages = pingpong::bad_pages(payload, expect, self.page);
        self.bad.push(BadMessage {
            index,
            qp,
            byte_len,
            pages,
        });
        Ok(())
    }

    /// Polls up to `max` completions into `out`.
    fn poll(cq: &CompletionQueue, out: &mut Vec<Completion>, max: usize) -> Res<usize> {
        cq.poll(out, max).context("poll CQ failed")
    }

    /// Runs the ping-pong on every QP until this side has completed `iters`
    /// sends and `iters` receives in all; the client starts a send on every
    /// QP. Returns the time from the first sends on.
    fn run(
        &mut self,
        cq: &CompletionQueue,
        channel: Option<&CompletionChannel>,
        opts: &Opts,
    ) -> Res<Duration> {
        let iters = opts.iters;
        let num_qp = self.qps.len() as u32;
        if opts.host.is_some() {
            for i in 0..self.qps.len() {
                self.post_send(i)?;
                self.lanes[i].pending = SEND_WRID | RECV_WRID;
            }
        } else {
            for lane in &mut self.lanes {
                lane.pending = RECV_WRID;
            }
        }
        let start = Instant::now();
        let (mut rcnt, mut scnt) = (0u32, 0u32);
        let batch = (self.rx_depth + num_qp) as usize;
        let mut wcs = Vec::with_capacity(batch);
        while rcnt < iters || scnt < iters {
            match channel {
                Some(ch) => {
                    let event = ch.get_event().context("Failed to get cq_event")?;
                    if event.cq().as_raw() != cq.as_raw() {
                        return Err(anyhow!("CQ event for unknown CQ"));
                    }
                    drop(event); // acknowledges it
                    cq.req_notify(false)
                        .context("Couldn't request CQ notification")?;
                    while Self::poll(cq, &mut wcs, batch)? > 0 {}
                }
                None => {
                    while wcs.is_empty() {
                        Self::poll(cq, &mut wcs, batch)?;
                    }
                }
            }
            for mut wc in std::mem::take(&mut wcs) {
                if wc.status != WcStatus::Success {
                    return Err(anyhow!(
                        "Failed status {} ({}) for wr_id {}",
                        wc.status,
                        wc.status.to_raw(),
                        wc.wr_id
                    ));
                }
                let i = self
                    .qps
                    .iter()
                    .position(|qp| qp.qp_num() == wc.qp_num)
                    .with_context(|| format!("Couldn't find QPN {:06x}", wc.qp_num))?;
                match wc.wr_id {
                    SEND_WRID => {
                        scnt += 1;
                        if self.inline.is_none() {
                            self.lanes[i].send = Some(wc.take_buffers().into_one().context(
                                "the send buffer did not come back with its completion",
                            )?);
                        }
                    }
                    RECV_WRID => {
                        let mr = wc
                            .take_buffers()
                            .into_one()
                            .context("a receive buffer did not come back with its completion")?;
                        self.check(&mr, wc.byte_len, rcnt, i)?;
                        self.free.push(mr);
                        self.routs -= 1;
                        if self.routs <= num_qp {
                            self.refill()?;
                        }
                        rcnt += 1;
                    }
                    other => return Err(anyhow!("Completion for unknown wr_id {other}")),
                }
                let lane = &mut self.lanes[i];
                lane.pending &= !wc.wr_id;
                if scnt < iters && lane.pending == 0 {
                    self.post_send(i)?;
                    self.lanes[i].pending = RECV_WRID | SEND_WRID;
                }
            }
        }
        Ok(start.elapsed())
    }

    /// Prints the C tool's two result lines and, with `-c`, what was wrong.
    fn report(&self, opts: &Opts, elapsed: Duration) -> Res<()> {
        pingpong::print_results(opts, elapsed);
        let Some(first) = self.bad.first() else {
            return Ok(());
        };
        for page in &first.pages {
            println!("invalid data in page {page}");
        }
        Err(anyhow!(
            "{} of the messages received had invalid data (the first: message {} on QP[{}], \
             {} bytes received, {} expected, all zero)",
            self.bad.len(),
            first.index,
            first.qp,
            first.byte_len,
            self.size
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest(qpn: u32) -> Dest {
        Dest {
            lid: 0,
            qpn,
            psn: 1,
            gid: rdma::Gid::default(),
        }
    }

    #[test]
    fn the_peer_must_have_as_many_qps() {
        let mut peers: Vec<Dest> = (1..=3).map(dest).collect();
        peers.resize(WIRE_QPS, unused_slot());
        assert!(check_peer_count(&peers, 3).is_ok());
        let err = check_peer_count(&peers, 4).unwrap_err();
        assert!(
            err.to_string()
                .contains("the peer has 3 QPs and this side 4"),
            "{err}"
        );
        assert!(check_peer_count(&peers, 2).is_err());
        // A gap in the table is not a count.
        peers[1] = unused_slot();
        assert!(check_peer_count(&peers, 3).is_err());
    }

    #[test]
    fn unused_slots_go_on_the_wire_as_zeros() {
        assert_eq!(
            &unused_slot().to_wire()[..],
            &b"0000:000000:000000:00000000000000000000000000000000\0"[..]
        );
    }
}
