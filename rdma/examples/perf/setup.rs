//! Device, queues and the connection of the RC QPs.

use std::hash::{BuildHasher, Hasher};

use rdma::{
    AccessFlags, AhAttr, CompletionChannel, CompletionQueue, Context, InitAttr, LinkLayer,
    MemoryRegion, Mtu, PortAttr, PostPath, ProtectionDomain, QpType, QueuePair, RemoteMemory,
    RtrAttr, RtsAttr, SlotConfig, SlotQueue,
};

use crate::oob::{Dest, Oob};
use anyhow::{anyhow, Context as _};

use crate::common::Res;
use crate::opts::{AtomicOp, Kind, Opts, Verb};

/// Memory one pool of buffers may take (per side, per kind of buffer): a
/// request the device writes (receive, READ, atomic) needs a region of its
/// own while in flight, so large messages get fewer slots (and a shallower
/// queue) instead of gigabytes of buffers.
pub const POOL_BUDGET: usize = 128 << 20;

/// Everything a test runs on. Field order is drop order: the QPs are
/// destroyed before any memory their work could still reach.
#[derive(Debug)]
pub struct Conn {
    /// `send_lat` and `write_lat` by default ([`Opts::slot_queue`]): the QP
    /// with its memory and CQ; `qps` is then empty.
    pub slots: Option<SlotQueue>,
    /// One RC QP per `-q` (none with `slots`).
    pub qps: Vec<QueuePair>,
    /// Regions the raw post path uses: registered here so they outlive the
    /// QPs (the raw contract), even when a test fails half-way.
    pub raw_keep: Vec<MemoryRegion>,
    /// The region peers write to, read from or run atomics on (the largest
    /// size of the run; 8 bytes per QP for atomics).
    pub target: MemoryRegion,
    /// The peer's target region, per QP.
    pub remote: Vec<RemoteMemory>,
    /// Completion queue of the sends.
    pub send_cq: CompletionQueue,
    /// Completion queue of the receives.
    pub recv_cq: CompletionQueue,
    /// `-e`: the channel of `send_cq`.
    pub send_ch: Option<CompletionChannel>,
    /// `-e`: the channel of `recv_cq`.
    pub recv_ch: Option<CompletionChannel>,
    /// The protection domain (it keeps the device open).
    pub pd: ProtectionDomain,
    /// The TCP connection to the peer.
    pub oob: Oob,
    /// Largest inline message the QPs accept (what `-I` asked for).
    pub inline: u32,
}

/// The slot queue of a latency test: for `write_lat` one slot, the
/// message; for `send_lat` the receives kept posted and, last, the send
/// (every send goes from the same bytes, as perftest's do). Slots are sized
/// for the largest message of the run.
fn slot_queue(pd: &ProtectionDomain, opts: &Opts) -> Res<SlotQueue> {
    let len = opts.sizes().into_iter().max().unwrap_or(opts.size);
    let slots = match opts.test.verb {
        Verb::Send => crate::lat::rx_slots(opts, len) + 1,
        _ => 1,
    };
    let mut config = SlotConfig::new(slots, len);
    config.max_send_wr = opts.tx_depth;
    config.max_recv_wr = if opts.test.verb == Verb::Send {
        opts.rx_depth
    } else {
        1
    };
    config.max_inline_data = opts.inline;
    config.post_path = opts.post;
    SlotQueue::new(pd, &config).context("Couldn't create the slot queue")
}

/// A random 24-bit PSN.
fn random_psn(salt: u32) -> u32 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u32(salt);
    (h.finish() as u32) & 0xff_ffff
}

/// Opens `-d` (or the first device) and checks `-i`.
fn open(opts: &Opts) -> Res<(Context, PortAttr)> {
    let ctx = match &opts.ib_dev {
        Some(name) => Context::open(name)?,
        None => {
            let devices = rdma::devices().context("Couldn't get the RDMA device list")?;
            let first = devices.first().context("No RDMA devices found")?;
            first
                .open()
                .with_context(|| format!("Couldn't open {}", first.name()))?
        }
    };
    let port = ctx
        .query_port(u32::from(opts.ib_port))
        .with_context(|| format!("Couldn't query port {} of {}", opts.ib_port, ctx.name()))?;
    if port.state != rdma::PortState::Active {
        return Err(anyhow!(
            "port {} of {} is {}, not ACTIVE",
            opts.ib_port,
            ctx.name(),
            port.state
        ));
    }
    Ok((ctx, port))
}

/// The access peers get to the target region and through the QPs.
fn remote_access(verb: Verb) -> AccessFlags {
    match verb {
        Verb::Send => AccessFlags::LOCAL_WRITE,
        Verb::Write => AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        Verb::Read => AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        Verb::Atomic => AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
    }
}

/// The parameters both sides must agree on.
pub fn params(opts: &Opts) -> String {
    let atomic = match opts.atomic {
        AtomicOp::FetchAdd => "fetch_add",
        AtomicOp::CmpSwap => "cmp_swap",
    };
    format!(
        "test={} size={} all={} iters={} qps={} atomic={atomic}",
        opts.test.name(),
        opts.size,
        u8::from(opts.all),
        opts.iters,
        opts.qps
    )
}

/// Creates the queues and QPs, meets the peer over TCP, and brings the QPs
/// to RTS. Prints perftest's header and the address lines on the way.
///
/// # Errors
/// Any failed verb or socket operation, said plainly.
pub fn connect(opts: &Opts) -> Res<Conn> {
    let (ctx, port) = open(opts)?;
    let dev = ctx.query_device().context("Couldn't query the device")?;
    let gid_index = match (opts.gid_index, port.link_layer) {
        (Some(i), _) => Some(i),
        (None, LinkLayer::Ethernet) => Some(0),
        (None, _) => None,
    };
    let gid = match gid_index {
        Some(i) => ctx
            .query_gid(u32::from(opts.ib_port), i)
            .with_context(|| format!("Couldn't read GID index {i}"))?,
        None => rdma::Gid::default(),
    };
    let sgid_index = gid_index
        .map(|i| u8::try_from(i).map_err(|_| anyhow!("GID index {i} does not fit an address")))
        .transpose()?;
    if port.link_layer == LinkLayer::Ethernet && gid.is_zero() {
        return Err(anyhow!(
            "GID index {} of {} port {} is empty: RoCE needs a GID (pass -x)",
            gid_index.unwrap_or(0),
            ctx.name(),
            opts.ib_port
        ));
    }
    let out_reads = {
        let max = dev.max_qp_rd_atom().clamp(1, 255);
        opts.out_reads.map_or(max, |n| n.min(max)) as u8
    };

    let nq = opts.qps as usize;
    let send_tests = opts.test.verb == Verb::Send;
    let max_cqe = dev.max_cqe();
    let cqe = |per_qp: u32| -> Res<u32> {
        let n = per_qp.saturating_mul(opts.qps).saturating_add(1);
        if n > max_cqe {
            return Err(anyhow!(
                "{n} completion queue entries needed (depth × QPs), but {} allows {max_cqe}",
                ctx.name()
            ));
        }
        Ok(n)
    };
    let (send_ch, recv_ch) = if opts.events {
        (
            Some(
                ctx.create_comp_channel()
                    .context("Couldn't create a completion channel")?,
            ),
            Some(
                ctx.create_comp_channel()
                    .context("Couldn't create a completion channel")?,
            ),
        )
    } else {
        (None, None)
    };
    let rx_depth = if send_tests { opts.rx_depth } else { 1 };
    let send_cq = ctx
        .create_cq(cqe(opts.tx_depth)?, send_ch.as_ref(), 0)
        .context("Couldn't create the send CQ")?;
    let recv_cq = ctx
        .create_cq(cqe(rx_depth)?, recv_ch.as_ref(), 0)
        .context("Couldn't create the receive CQ")?;
    let pd = ctx.alloc_pd().context("Couldn't allocate a PD")?;

    let access = remote_access(opts.test.verb);
    let target_len = match opts.test.verb {
        Verb::Atomic => 8 * nq,
        _ => opts.sizes().into_iter().max().unwrap_or(opts.size),
    };
    let target = pd
        .alloc_mr(target_len, access)
        .with_context(|| format!("Couldn't register the {target_len}-byte target buffer"))?;

    let slots = if opts.slot_queue() {
        Some(slot_queue(&pd, opts)?)
    } else {
        None
    };
    let mut qps = Vec::with_capacity(nq);
    for i in 0..if slots.is_some() { 0 } else { nq } {
        let qp = pd
            .qp_builder(QpType::Rc, &send_cq, &recv_cq)
            .max_send_wr(opts.tx_depth)
            .max_recv_wr(rx_depth)
            .max_inline_data(opts.inline)
            .post_path(opts.post)
            .build()
            .with_context(|| format!("Couldn't create QP {i}"))?;
        qps.push(qp);
    }
    // The QPs to connect, the slot queue's or `qps`.
    let all: Vec<&QueuePair> = slots.iter().map(SlotQueue::qp).chain(&qps).collect();
    for (i, qp) in all.iter().enumerate() {
        if qp.caps().max_inline_data < opts.inline {
            return Err(anyhow!(
                "-I {}: the device gives only {} bytes of inline data",
                opts.inline,
                qp.caps().max_inline_data
            ));
        }
        let mut init = InitAttr::new(opts.ib_port);
        init.access = access & !AccessFlags::LOCAL_WRITE;
        qp.to_init(&init)
            .with_context(|| format!("Couldn't move QP {i} to INIT"))?;
    }
    let path = all.first().map_or(opts.post, |qp| qp.post_path());

    let mine: Vec<Dest> = all
        .iter()
        .enumerate()
        .map(|(i, qp)| {
            let offset = if opts.test.verb == Verb::Atomic {
                8 * i
            } else {
                0
            };
            Dest {
                lid: port.lid,
                qpn: qp.qp_num(),
                psn: random_psn(i as u32),
                gid,
                rkey: target.rkey(),
                addr: target.addr() + offset as u64,
                len: if opts.test.verb == Verb::Atomic {
                    8
                } else {
                    target_len as u64
                },
            }
        })
        .collect();

    let mtu = opts.mtu.unwrap_or(port.active_mtu);
    if mtu.bytes() > port.active_mtu.bytes() {
        return Err(anyhow!(
            "-m {}: larger than the active MTU of port {} ({} bytes)",
            mtu.bytes().unwrap_or(0),
            opts.ib_port,
            port.active_mtu.bytes().unwrap_or(0)
        ));
    }
    print_header(opts, &ctx, &port, mtu, gid_index, path, out_reads);
    let server = opts.is_server();
    if server {
        println!("\n************************************");
        println!("* Waiting for client to connect... *");
        println!("************************************");
    }
    let mut oob = if server {
        Oob::server(opts.tcp_port)?
    } else {
        Oob::client(opts.host.as_deref().unwrap_or_default(), opts.tcp_port)?
    };
    oob.agree(server, &params(opts))?;
    let peer = oob.exchange(server, &mine)?;
    let rule = "-".repeat(87);
    println!("{rule}");
    let with_mem = opts.test.verb != Verb::Send;
    for (m, p) in mine.iter().zip(&peer) {
        m.print("local", with_mem);
        p.print("remote", with_mem);
    }
    println!("{rule}");

    for (i, (qp, (m, p))) in all.iter().zip(mine.iter().zip(&peer)).enumerate() {
        let mut ah = match sgid_index {
            Some(sgid) => AhAttr::global(opts.ib_port, p.gid, sgid),
            None => AhAttr::local(opts.ib_port, p.lid),
        };
        ah.sl = 0;
        let mut rtr = RtrAttr::new(ah, mtu, p.qpn, p.psn);
        rtr.max_dest_rd_atomic = out_reads;
        qp.to_rtr(Some(&rtr))
            .with_context(|| format!("Couldn't move QP {i} to RTR"))?;
        let mut rts = RtsAttr::new(m.psn);
        rts.max_rd_atomic = out_reads;
        rts.timeout = opts.qp_timeout;
        qp.to_rts(&rts)
            .with_context(|| format!("Couldn't move QP {i} to RTS"))?;
    }
    let remote = peer
        .iter()
        .map(|p| RemoteMemory {
            addr: p.addr,
            len: p.len,
            rkey: p.rkey,
        })
        .collect();
    drop(all);
    Ok(Conn {
        slots,
        qps,
        raw_keep: Vec::new(),
        target,
        remote,
        send_cq,
        recv_cq,
        send_ch,
        recv_ch,
        pd,
        oob,
        inline: opts.inline,
    })
}

/// perftest's description block (its wording where it is a format; ours
/// where perf differs).
fn print_header(
    opts: &Opts,
    ctx: &Context,
    port: &PortAttr,
    mtu: Mtu,
    gid_index: Option<u32>,
    path: PostPath,
    out_reads: u8,
) {
    let rule = "-".repeat(87);
    let verb = opts.test.verb;
    let api = match path {
        PostPath::Extended => "ibv_wr_* (extended)",
        _ => "ibv_post_send (legacy)",
    };
    let post = if opts.raw {
        "raw (prebuilt C work requests)"
    } else if opts.prepared {
        "safe, prepared requests (rdma crate)"
    } else {
        "safe (rdma crate)"
    };
    println!("{rule}");
    println!("                    {}", opts.test.title());
    println!(" Device          : {}", ctx.name());
    println!(" Number of qps   : {}\t\tConnection type : RC", opts.qps);
    println!(" Post            : {post}, {api}");
    match opts.test.kind {
        Kind::Bw => println!(
            " TX depth        : {}\t\tCQ Moderation   : {}",
            opts.tx_depth,
            opts.cq_mod_for(opts.sizes()[0])
        ),
        Kind::Lat => println!(" TX depth        : {}", opts.tx_depth),
    }
    if verb == Verb::Send {
        println!(" RX depth        : {}", opts.rx_depth);
    }
    if opts.events {
        let wait = match opts.wait {
            crate::events::Wait::Channel => "channel (CompletionChannel::get_event)",
            crate::events::Wait::Cq => "cq (CompletionQueue::wait_until)",
            crate::events::Wait::Async => "async (rdma::aio::AsyncCq on tokio)",
        };
        println!(" Events          : {wait}");
    }
    if opts.test.kind == Kind::Bw && !opts.is_server() {
        let bufs = match (crate::io::shares_buffer(verb), opts.raw) {
            (true, false) => "one region shared by every request (WrBuffers::Shared)",
            (true, true) => "one buffer for every request",
            (false, _) => "one per request in flight",
        };
        println!(" Local buffers   : {bufs}");
    }
    if matches!(verb, Verb::Read | Verb::Atomic) {
        println!(" Outstand reads  : {out_reads}");
    }
    if verb == Verb::Atomic {
        let op = match opts.atomic {
            AtomicOp::FetchAdd => "FETCH_AND_ADD",
            AtomicOp::CmpSwap => "CMP_AND_SWAP",
        };
        println!(" Atomic type     : {op}");
    }
    println!(" Mtu             : {}[B]", mtu.bytes().unwrap_or(0));
    println!(" Link type       : {}", port.link_layer);
    match gid_index {
        Some(i) => println!(" GID index       : {i}"),
        None => println!(" GID index       : none"),
    }
    println!(" Max inline data : {}[B]", opts.inline);
    println!(
        " Completions     : {}",
        if opts.events {
            "events"
        } else {
            "busy polling"
        }
    );
    println!(" Clock           : {}", crate::clock::NAME);
    println!("{rule}");
}

/// How many buffers of `size` bytes fit the pool budget: at least one, at
/// most `want`.
pub fn slots(size: usize, want: u32) -> u32 {
    let fit = (POOL_BUDGET / size.max(1)).max(1);
    want.min(u32::try_from(fit).unwrap_or(u32::MAX)).max(1)
}

/// Registers `n` buffers of `size` bytes as pieces of one registration.
///
/// # Errors
/// Registration failures.
pub fn pool(
    pd: &ProtectionDomain,
    n: u32,
    size: usize,
    access: AccessFlags,
) -> Res<Vec<MemoryRegion>> {
    let total = size
        .checked_mul(n as usize)
        .context("the buffers do not fit in memory")?;
    let mr = pd
        .alloc_mr(total, access)
        .with_context(|| format!("Couldn't register {n} buffers of {size} bytes"))?;
    mr.chunks(size).context("Couldn't cut the buffers")
}
