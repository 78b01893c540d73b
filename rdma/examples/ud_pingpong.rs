//! Ping-pong over an unreliable datagram (UD) queue pair: a port of
//! rdma-core's `ibv_ud_pingpong` that speaks its handshake, so either side can
//! be the C tool.
//!
//! ```text
//! ud_pingpong [-d DEV] [-g GID-INDEX] [options]          # server
//! ud_pingpong [-d DEV] [-g GID-INDEX] [options] HOST     # client
//! ```
//! Run with `--help` for the options. A datagram is one packet, so `-s` must
//! not exceed the port's active MTU; every receive buffer has 40 bytes more
//! in front for the Global Routing Header.

mod common;

use anyhow::{anyhow, Context as _};
use common::pingpong;
use std::process::ExitCode;

use common::pingpong::{Dest, Opts, Res, Tool, Traffic, GRH_LEN, UD_QKEY};
use rdma::{AccessFlags, InitAttr, QpType, RtsAttr, UdDest};

const TOOL: Tool = Tool {
    name: "ud_pingpong",
    twin: "ibv_ud_pingpong",
    default_size: 1024,
    has_mtu: false,
    rc_flags: false,
    unsupported: &[],
};

fn main() -> ExitCode {
    pingpong::main(&TOOL, run)
}

fn run(opts: &Opts) -> Res<()> {
    let (ctx, port) = pingpong::open_device(opts)?;
    let mtu = port
        .active_mtu
        .bytes()
        .with_context(|| format!("port {} reports an unknown MTU", opts.ib_port))?;
    if opts.size > mtu as usize {
        return Err(anyhow!(
            "Requested size larger than port MTU ({mtu}): pass -s {mtu} or less"
        ));
    }
    let channel = pingpong::comp_channel(&ctx, opts.events)?;
    let pd = ctx.alloc_pd().context("Couldn't allocate PD")?;
    let cq = ctx
        .create_cq(opts.rx_depth + 1, channel.as_ref(), 0)
        .context("Couldn't create CQ")?;
    let mut qp = pd
        .qp_builder(QpType::Ud, &cq, &cq)
        .max_send_wr(1)
        .max_recv_wr(opts.rx_depth)
        .build()
        .context("Couldn't create QP")?;
    let inline = qp.caps().max_inline_data as usize >= opts.size;
    let mut traffic = Traffic::new(&pd, opts, GRH_LEN, AccessFlags::empty(), inline)?;
    let mut init = InitAttr::new(opts.ib_port);
    init.qkey = UD_QKEY;
    qp.to_init(&init).context("Failed to modify QP to INIT")?;
    traffic.refill(&mut qp)?;
    if channel.is_some() {
        cq.req_notify(false)
            .context("Couldn't request CQ notification")?;
    }

    // The C tool does not insist on a LID here.
    let me = pingpong::local_dest(&ctx, &port, opts, qp.qp_num(), false)?;
    me.print("local");
    let mut ah = None;
    let connect = |peer: &Dest| -> Res<()> {
        // A UD QP is not tied to a peer: RTR needs nothing, RTS our PSN. The
        // peer's address goes into an address handle used by every send.
        qp.to_rtr(None).context("Failed to modify QP to RTR")?;
        qp.to_rts(&RtsAttr::new(me.psn))
            .context("Failed to modify QP to RTS")?;
        let attr = pingpong::peer_ah(opts, &port, peer)?;
        ah = Some(pd.create_ah(&attr).context("Failed to create AH")?);
        Ok(())
    };
    let peer = pingpong::exchange(opts, &me, connect)?;
    peer.print("remote");
    let dest = UdDest {
        ah: ah.context("no address handle after the handshake")?,
        remote_qpn: peer.qpn,
        remote_qkey: UD_QKEY,
    };

    let elapsed = traffic.run(&mut qp, &cq, channel.as_ref(), Some(&dest), opts)?;
    traffic.report(opts, elapsed)
}
