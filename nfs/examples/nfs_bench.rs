//! Measurements for `ci/bench-nfs`, timing only the transfers (not process
//! start, MOUNT or the connection):
//!
//! - `nfs_bench null IP [CALLS] [IN-FLIGHT...]`: NFSv3 NULL calls per second
//!   with each number of calls in flight (default 1 8 32);
//! - `nfs_bench file IP EXPORT MIB`: WRITE then READ of a file of MIB MiB
//!   under EXPORT (1 MiB per call, the client's default window), MB/s each,
//!   and what each cost the process: CPU time per MiB (`getrusage`, user +
//!   system), and the chunk registrations and window binds it made.
//!   `NFS_BENCH_WINDOWS=0` lends chunks by a registration per chunk instead
//!   of memory windows over pooled regions; `NFS_BENCH_REMOTE_INV=0` does not
//!   offer the server remote invalidation (every window then takes a
//!   `LOCAL_INV`, or on rxe is deallocated and replaced). The READs'
//!   `LOCAL_INV`s, deallocated windows and the chunks the server
//!   invalidated are counted. The read takes each READ's data in place
//!   (`Client::read_each`: the write chunk's memory, lent; sampled against
//!   the file); `NFS_BENCH_READ=copy` reads it into one buffer instead
//!   (`Client::read_all`: one copy per byte, compared whole after timing).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{bail, Context};

use rdma_nfs::nfs3::{Client, Options};
use rdma_nfs::rpc::{encode_call, Auth};
use rdma_nfs::transport::{Call, Transport, DEFAULT_PORT};
use rdma_nfs::xdr::Writer;

const USAGE: &str =
    "usage: nfs_bench null IP [CALLS] [IN-FLIGHT...] | nfs_bench file IP EXPORT MIB";

fn num(s: &str, what: &str) -> anyhow::Result<usize> {
    s.parse().with_context(|| format!("{what} {s}"))
}

async fn null(ip: IpAddr, rest: &[String]) -> anyhow::Result<()> {
    let calls = rest.first().map_or(Ok(2000), |n| num(n, "CALLS"))?;
    let mut depths = rest
        .iter()
        .skip(1)
        .map(|d| num(d, "IN-FLIGHT"))
        .collect::<Result<Vec<_>, _>>()?;
    if depths.is_empty() {
        depths = vec![1, 8, 32];
    }
    let addr = SocketAddr::new(ip, DEFAULT_PORT);
    let t = Transport::connect(addr, Default::default()).await?;
    let mut w = Writer::new();
    encode_call(&mut w, 0, 100_003, 3, 0, &Auth::None);
    for depth in depths {
        let start = Instant::now();
        let workers: Vec<_> = (0..depth.max(1))
            .map(|i| {
                let t = t.clone();
                let msg = w.buf.clone();
                let n = calls / depth + usize::from(i < calls % depth);
                tokio::spawn(async move {
                    for _ in 0..n {
                        let c = Call {
                            msg: msg.clone(),
                            ..Call::default()
                        };
                        t.call(c).await?;
                    }
                    anyhow::Ok(())
                })
            })
            .collect();
        for h in workers {
            h.await??;
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "null in_flight={depth} calls={calls} per_s={:.0}",
            calls as f64 / secs
        );
    }
    t.close().await;
    Ok(())
}

async fn file(ip: IpAddr, rest: &[String]) -> anyhow::Result<()> {
    let [export, mib] = rest else {
        bail!(USAGE);
    };
    let len = num(mib, "MIB")? << 20;
    let data: std::sync::Arc<Vec<u8>> =
        std::sync::Arc::new((0..len).map(|i| (i % 253) as u8).collect());
    let mut o = Options::default();
    o.transport.memory_windows = std::env::var("NFS_BENCH_WINDOWS").map_or(true, |v| v != "0");
    o.transport.remote_invalidation =
        std::env::var("NFS_BENCH_REMOTE_INV").map_or(true, |v| v != "0");
    let c = Client::mount(ip, export, o).await?;
    let stats = c.transport().stats();
    let counts = || {
        (
            stats.chunk_registrations.load(Ordering::Relaxed),
            stats.chunk_binds.load(Ordering::Relaxed),
            stats.local_invalidations.load(Ordering::Relaxed),
            stats.remote_invalidations.load(Ordering::Relaxed),
            stats.fenced_windows.load(Ordering::Relaxed),
        )
    };
    let f = c.create(c.root(), b"nfs-bench", 0o644).await?;
    let (n0, cpu0) = (counts(), cpu());
    let start = Instant::now();
    c.write_all_shared(&f, std::sync::Arc::clone(&data)).await?;
    let w = start.elapsed().as_secs_f64();
    let (n1, cpu1) = (counts(), cpu());
    let copy = std::env::var("NFS_BENCH_READ").is_ok_and(|v| v == "copy");
    let start = Instant::now();
    let r = if copy {
        let back = c.read_all(&f).await?;
        let r = start.elapsed().as_secs_f64();
        if back != *data {
            bail!("the file read back differs from the one written");
        }
        r
    } else {
        // Each READ's data where it landed (lent write chunk memory), as
        // `dd iflag=direct` gets it in its buffer: checked at 64 places per
        // piece (a full comparison would be a pass over every byte that
        // the kernel client's run does not make).
        let mut at = 0;
        let got = c
            .read_each(&f, |piece| sampled_equal(piece, &data, &mut at))
            .await?;
        let r = start.elapsed().as_secs_f64();
        let n = got?;
        if n != len as u64 {
            bail!("read back {n} bytes of {len}");
        }
        r
    };
    let (n2, cpu2) = (counts(), cpu());
    let mib = (len >> 20).max(1) as f64;
    println!(
        "ours write_MBps={:.2} read_MBps={:.2} write_cpu_ms_per_MiB={:.2} \
         read_cpu_ms_per_MiB={:.2} write_regs={} write_binds={} read_regs={} read_binds={} \
         read_local_inv={} read_remote_inv={} windows={} read_fenced={}",
        len as f64 / w / 1e6,
        len as f64 / r / 1e6,
        (cpu1 - cpu0) * 1e3 / mib,
        (cpu2 - cpu1) * 1e3 / mib,
        n1.0 - n0.0,
        n1.1 - n0.1,
        n2.0 - n1.0,
        n2.1 - n1.1,
        n2.2 - n1.2,
        n2.3 - n1.3,
        stats.memory_windows.load(Ordering::Relaxed),
        n2.4 - n1.4
    );
    c.remove(c.root(), b"nfs-bench").await?;
    c.close().await;
    Ok(())
}

/// Whether `piece` is `data` from `*at` on, at 64 places spread over it (and
/// its last byte); `*at` moves past it.
fn sampled_equal(piece: &[u8], data: &[u8], at: &mut usize) -> anyhow::Result<()> {
    let want = data.get(*at..*at + piece.len()).with_context(|| {
        format!(
            "{} bytes read at {} of a {}-byte file",
            piece.len(),
            *at,
            data.len()
        )
    })?;
    let stride = (piece.len() / 64).max(1);
    let last = piece.len().checked_sub(1);
    let same = (0..piece.len())
        .step_by(stride)
        .chain(last)
        .all(|i| piece[i] == want[i]);
    if !same {
        bail!("the data read at {} differs from the file's", *at);
    }
    *at += piece.len();
    Ok(())
}

/// The process's CPU time so far (user + system), in seconds.
fn cpu() -> f64 {
    // SAFETY: an all-zero rusage is a valid value; getrusage fills it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer for RUSAGE_SELF.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
    t(u.ru_utime) + t(u.ru_stime)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(mode), Some(ip)) = (args.first(), args.get(1)) else {
        bail!(USAGE);
    };
    let ip: IpAddr = ip.parse().with_context(|| ip.clone())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    match mode.as_str() {
        "null" => rt.block_on(null(ip, &args[2..])),
        "file" => rt.block_on(file(ip, &args[2..])),
        _ => bail!(USAGE),
    }
}
