//! Ping-pong over a reliable connected (RC) queue pair: a port of rdma-core's
//! `ibv_rc_pingpong` that speaks its handshake, so either side can be the C
//! tool.
//!
//! ```text
//! rc_pingpong [-d DEV] [-g GID-INDEX] [options]          # server
//! rc_pingpong [-d DEV] [-g GID-INDEX] [options] HOST     # client
//! ```
//! Run with `--help` for the options. On RoCE (e.g. soft-RoCE `rxe0`) both
//! sides need `-g` with a GID index of the port.
//!
//! Unlike the C tool, whose receives all land in one buffer, every receive
//! here owns its buffer: the memory moves into the work request and comes
//! back with its completion (`rdma`'s safe post path).
//!
//! `-P` (with `-o`) prefetches the on-demand regions with `ibv_advise_mr`
//! before the run, and a failed prefetch is reported, not fatal, as in the C
//! tool. `-j` puts the message buffer in the device's own memory, as the C
//! tool does: `size` bytes (`ibv_alloc_dm`, after checking `max_dm_size` from
//! `ibv_query_device_ex`), one zero-based region over them that every send
//! and receive use (`rdma::DeviceSlice`, each request holding a reference to
//! the region until its completion), filled with `ibv_memcpy_to_dm` and read
//! back with `ibv_memcpy_from_dm` for `-c`. A device without device memory
//! (`max_dm_size` 0: soft-RoCE and soft-iWARP) or with less than `-s` bytes
//! of it is refused with the C tool's message and the numbers. `-O`
//! (implicit on-demand paging) is refused with its reason.

mod common;

use anyhow::{anyhow, Context as _};
use common::pingpong;
use std::process::ExitCode;

use common::pingpong::{ExtraFlag, ExtraKind, Opts, Res, Tool, Traffic, Unsupported};
use rdma::ffi;
use rdma::{AccessFlags, DeviceMemory, PostPath, QpType};

const TOOL: Tool = Tool {
    name: "rc_pingpong",
    twin: "ibv_rc_pingpong",
    default_size: 4096,
    has_mtu: true,
    rc_flags: true,
    unsupported: &[Unsupported {
        short: 'O',
        long: "iodp",
        why: "implicit ODP registers the whole address space (ibv_reg_mr(NULL, SIZE_MAX)), \
                  which the safe API cannot express",
    }],
};

/// `-j/--dm`: the message buffer in the device's own memory (`ibv_alloc_dm`).
const DM: ExtraFlag = ExtraFlag {
    short: 'j',
    long: "dm",
    kind: ExtraKind::Switch,
    help: "use device memory (ibv_alloc_dm); soft-RoCE and soft-iWARP have none",
};

fn main() -> ExitCode {
    pingpong::main_with(&TOOL, &[DM], run)
}

/// `-j`: `size` bytes of device memory, checked and allocated as the C tool
/// does, with its messages (and the numbers behind them): the device must
/// report device memory (`max_dm_size` of `ibv_query_device_ex`), at least
/// `size` bytes of it.
fn device_memory(ctx: &rdma::Context, size: usize) -> Res<DeviceMemory> {
    let max = ctx
        .query_device()
        .context("Couldn't query device for its features")?
        .max_dm_size();
    if max == 0 {
        return Err(anyhow!(
            "Device doesn't support dm allocation: {} reports max_dm_size 0 \
             (soft-RoCE and soft-iWARP have no device memory)",
            ctx.name()
        ));
    }
    if max < size as u64 {
        return Err(anyhow!(
            "Device memory is insufficient: -s {size} bytes, {} has {max} (max_dm_size)",
            ctx.name()
        ));
    }
    ctx.alloc_dm(size).context("Dev mem allocation failed")
}

fn run(opts: &Opts) -> Res<()> {
    if opts.prefetch && !opts.odp {
        return Err(anyhow!(
            "prefetch is valid only with on-demand memory region (-o)"
        ));
    }
    let use_dm = opts.extra('j').is_some();
    if use_dm && opts.odp {
        return Err(anyhow!("DM memory region can't be on demand (-j with -o)"));
    }
    let (ctx, port) = pingpong::open_device(opts)?;
    let access = if opts.odp {
        pingpong::odp_access(&ctx, ffi::IBV_ODP_SUPPORT_RECV, "receives")?
    } else {
        AccessFlags::empty()
    };
    let channel = pingpong::comp_channel(&ctx, opts.events)?;
    let ts_mask = if opts.ts {
        let mask = ctx
            .query_device()
            .context("Couldn't query device for its features")?
            .completion_timestamp_mask();
        if mask == 0 {
            return Err(anyhow!(
                "{} isn't completion timestamp capable (-t)",
                ctx.name()
            ));
        }
        Some(mask)
    } else {
        None
    };
    let pd = ctx.alloc_pd().context("Couldn't allocate PD")?;
    let dm = if use_dm {
        Some(device_memory(&ctx, opts.size)?)
    } else {
        None
    };
    let cq = if opts.ts {
        ctx.create_cq_ex(opts.rx_depth + 1, channel.as_ref(), 0, true)
    } else {
        ctx.create_cq(opts.rx_depth + 1, channel.as_ref(), 0)
    }
    .context("Couldn't create CQ")?;
    // One send in flight at a time; rx_depth receives. The send path is the
    // C tool's: ibv_post_send, or the ibv_wr_* API with -N.
    let mut qp = pd
        .qp_builder(QpType::Rc, &cq, &cq)
        .max_send_wr(1)
        .max_recv_wr(opts.rx_depth)
        .post_path(if opts.new_send {
            PostPath::Extended
        } else {
            PostPath::Legacy
        })
        .build()
        .context("Couldn't create QP")?;
    // As the C tool: inline when the provider's inline limit allows it and
    // the data is in host memory (not with -j). With -N the C tool hands the
    // buffer over with ibv_wr_set_sge; so does this port
    // (ibv_wr_set_inline_data miscounts on rdma-core 44's rxe).
    let inline = !opts.new_send && qp.caps().max_inline_data as usize >= opts.size;
    let mut traffic = match dm {
        Some(dm) => Traffic::in_device_memory(&pd, opts, dm)?,
        None => Traffic::new(&pd, opts, 0, access, inline)?,
    };
    if let Some(mask) = ts_mask {
        traffic.with_timestamps(mask);
    }
    traffic.run_connected(&ctx, &port, opts, &mut qp, &cq, channel.as_ref())
}
