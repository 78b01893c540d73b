//! Ping-pong over an unreliable connected (UC) queue pair: a port of
//! rdma-core's `ibv_uc_pingpong` that speaks its handshake, so either side can
//! be the C tool.
//!
//! ```text
//! uc_pingpong [-d DEV] [-g GID-INDEX] [options]          # server
//! uc_pingpong [-d DEV] [-g GID-INDEX] [options] HOST     # client
//! ```
//! Run with `--help` for the options. UC has no acknowledgements and no
//! retries: a lost message stalls the run, as with the C tool.

mod common;

use anyhow::Context as _;
use common::pingpong;
use std::process::ExitCode;

use common::pingpong::{Opts, Res, Tool, Traffic};
use rdma::{AccessFlags, QpType};

const TOOL: Tool = Tool {
    name: "uc_pingpong",
    twin: "ibv_uc_pingpong",
    default_size: 4096,
    has_mtu: true,
    rc_flags: false,
    unsupported: &[],
};

fn main() -> ExitCode {
    pingpong::main(&TOOL, run)
}

fn run(opts: &Opts) -> Res<()> {
    let (ctx, port) = pingpong::open_device(opts)?;
    let channel = pingpong::comp_channel(&ctx, opts.events)?;
    let pd = ctx.alloc_pd().context("Couldn't allocate PD")?;
    let cq = ctx
        .create_cq(opts.rx_depth + 1, channel.as_ref(), 0)
        .context("Couldn't create CQ")?;
    let mut qp = pd
        .qp_builder(QpType::Uc, &cq, &cq)
        .max_send_wr(1)
        .max_recv_wr(opts.rx_depth)
        .build()
        .context("Couldn't create QP")?;
    let inline = qp.caps().max_inline_data as usize >= opts.size;
    let traffic = Traffic::new(&pd, opts, 0, AccessFlags::empty(), inline)?;
    traffic.run_connected(&ctx, &port, opts, &mut qp, &cq, channel.as_ref())
}
