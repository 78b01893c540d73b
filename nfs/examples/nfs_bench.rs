//! Measurements for `ci/bench-nfs`, timing only the transfers (not process
//! start, MOUNT or the connection):
//!
//! - `nfs_bench null IP [CALLS] [IN-FLIGHT...]`: NFSv3 NULL calls per second
//!   with each number of calls in flight (default 1 8 32);
//! - `nfs_bench file IP EXPORT MIB`: WRITE then READ of a file of MIB MiB
//!   under EXPORT (1 MiB per call, the client's default window), MB/s each.

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use rdma_nfs::nfs3::{Client, Options};
use rdma_nfs::rpc::{encode_call, Auth};
use rdma_nfs::transport::{Call, Transport, DEFAULT_PORT};
use rdma_nfs::xdr::Writer;

const USAGE: &str =
    "usage: nfs_bench null IP [CALLS] [IN-FLIGHT...] | nfs_bench file IP EXPORT MIB";

fn num(s: &str, what: &str) -> Result<usize, String> {
    s.parse().map_err(|e| format!("{what} {s}: {e}"))
}

async fn null(ip: IpAddr, rest: &[String]) -> Result<(), String> {
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
    let t = Transport::connect(addr, Default::default())
        .await
        .map_err(|e| e.to_string())?;
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
                        t.call(c).await.map_err(|e| e.to_string())?;
                    }
                    Ok::<_, String>(())
                })
            })
            .collect();
        for h in workers {
            h.await.map_err(|e| e.to_string())??;
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

async fn file(ip: IpAddr, rest: &[String]) -> Result<(), String> {
    let [export, mib] = rest else {
        return Err(USAGE.into());
    };
    let len = num(mib, "MIB")? << 20;
    let data: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
    let c = Client::mount(ip, export, Options::default())
        .await
        .map_err(|e| e.to_string())?;
    let f = c
        .create(c.root(), b"nfs-bench", 0o644)
        .await
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    c.write_all(&f, &data).await.map_err(|e| e.to_string())?;
    let w = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let back = c.read_all(&f).await.map_err(|e| e.to_string())?;
    let r = start.elapsed().as_secs_f64();
    if back != data {
        return Err("the file read back differs from the one written".into());
    }
    println!(
        "ours write_MBps={:.2} read_MBps={:.2}",
        len as f64 / w / 1e6,
        len as f64 / r / 1e6
    );
    c.remove(c.root(), b"nfs-bench")
        .await
        .map_err(|e| e.to_string())?;
    c.close().await;
    Ok(())
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(mode), Some(ip)) = (args.first(), args.get(1)) else {
        return Err(USAGE.into());
    };
    let ip: IpAddr = ip.parse().map_err(|e| format!("{ip}: {e}"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    match mode.as_str() {
        "null" => rt.block_on(null(ip, &args[2..])),
        "file" => rt.block_on(file(ip, &args[2..])),
        _ => Err(USAGE.into()),
    }
}
