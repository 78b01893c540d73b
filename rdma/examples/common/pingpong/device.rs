//! Opening the device and port, the completion channel, on-demand paging.

use super::*;
use anyhow::{anyhow, Context as _};

use rdma::{AccessFlags, CompletionChannel, Context, MemoryRegion, PortAttr, WrBuffers};

/// Posts receives of `free` buffers with `post` (a QP's or an SRQ's
/// `post_recv_batch`) until `rx_depth` are outstanding (`routs`); buffers
/// the post gives back go back to `free`.
///
/// # Errors
/// `Couldn't post receive (N)` when fewer than `rx_depth` are posted.
pub fn refill_from(
    free: &mut Vec<MemoryRegion>,
    routs: &mut u32,
    rx_depth: u32,
    post: impl FnOnce(Vec<(u64, WrBuffers)>) -> Result<(), rdma::PostError>,
) -> Res<()> {
    let want = (rx_depth - *routs) as usize;
    let n = want.min(free.len());
    let batch = free
        .split_off(free.len() - n)
        .into_iter()
        .map(|m| (RECV_WRID, WrBuffers::from(m)))
        .collect();
    let mut error = None;
    let mut posted = n as u32;
    if let Err(e) = post(batch) {
        posted -= e.returned.len() as u32;
        for (_, b) in e.returned {
            free.extend(b.into_vec());
        }
        error = Some(e.error);
    }
    *routs += posted;
    if *routs < rx_depth {
        return Err(match error {
            Some(e) => anyhow::Error::new(e).context(format!("Couldn't post receive ({routs})")),
            None => anyhow!("Couldn't post receive ({routs}): only {n} buffers are free"),
        });
    }
    Ok(())
}

/// `-e`: a completion channel for the CQs, or none (busy polling).
///
/// # Errors
/// `Couldn't create completion channel`.
pub fn comp_channel(ctx: &Context, events: bool) -> Res<Option<CompletionChannel>> {
    if !events {
        return Ok(None);
    }
    ctx.create_comp_channel()
        .map(Some)
        .context("Couldn't create completion channel")
}

/// `-o`: [`AccessFlags::ON_DEMAND`] if the device pages RC sends and the
/// receives `recv` names (`IBV_ODP_SUPPORT_RECV` or `_SRQ_RECV`, described
/// by `recvs`) on demand.
///
/// # Errors
/// The device lacks on-demand paging of them.
pub fn odp_access(ctx: &Context, recv: u32, recvs: &str) -> Res<AccessFlags> {
    let attr = ctx
        .query_device()
        .context("Couldn't query device for its features")?;
    let rc = attr.as_raw().odp_caps.per_transport_caps.rc_odp_caps;
    let need = rdma::ffi::IBV_ODP_SUPPORT_SEND | recv;
    if attr.odp_general_caps() & u64::from(rdma::ffi::IBV_ODP_SUPPORT) == 0 || rc & need != need {
        return Err(anyhow!(
            "{} does not support on-demand paging of RC sends and {recvs}",
            ctx.name()
        ));
    }
    Ok(AccessFlags::ON_DEMAND)
}

/// Opens `-d` (or the first device) and queries `-i`.
///
/// # Errors
/// No such device, no device at all, or no such port, said plainly.
pub fn open_device(opts: &Opts) -> Res<(Context, PortAttr)> {
    let ctx = match &opts.ib_dev {
        Some(name) => Context::open(name)?,
        None => {
            let devices = rdma::devices().context("Failed to get the RDMA device list")?;
            let first = devices.first().context("No RDMA devices found")?;
            first
                .open()
                .with_context(|| format!("Couldn't open {}", first.name()))?
        }
    };
    let port = ctx
        .query_port(u32::from(opts.ib_port))
        .context("Couldn't get port info")?;
    Ok((ctx, port))
}

/// The page size, which the `-c` pattern is laid out on.
pub fn page_size() -> usize {
    // The safe crate has no page-size query (its own is private).
    // SAFETY: sysconf has no preconditions and touches no memory of ours.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}
