//! Prints the asynchronous events of a device, like rdma-core's `ibv_asyncwatch`.
//!
//! ```text
//! asyncwatch [-d DEVICE] [-n COUNT]
//!   -d, --ib-dev=DEVICE   the device (default: the first one)
//!   -n, --count=COUNT     exit after COUNT events (default: run until killed)
//! ```

use std::process::ExitCode;

fn run() -> Result<(), String> {
    let mut device = None;
    let mut count: Option<u64> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (a.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or(format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "-d" | "--ib-dev" => device = Some(value()?),
            "-n" | "--count" => {
                let v = value()?;
                count = Some(v.parse().map_err(|_| format!("bad count {v:?}"))?);
            }
            "-h" | "--help" => {
                println!("usage: asyncwatch [-d DEVICE] [-n COUNT]");
                return Ok(());
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    let dev = match device {
        Some(name) => rdma::device_by_name(&name),
        None => rdma::devices().and_then(|d| {
            d.into_iter()
                .next()
                .ok_or_else(|| rdma::Error::DeviceNotFound {
                    name: "(any)".into(),
                    available: "none".into(),
                })
        }),
    }
    .map_err(|e| e.to_string())?;
    let ctx = dev.open().map_err(|e| e.to_string())?;
    let fd = ctx.async_fd().map_err(|e| e.to_string())?;
    println!(
        "{}: async event FD {}",
        dev.name(),
        std::os::fd::AsRawFd::as_raw_fd(&fd)
    );
    let mut seen = 0u64;
    while count.is_none_or(|n| seen < n) {
        let ev = ctx.get_async_event().map_err(|e| e.to_string())?;
        println!("got event {ev}");
        seen += 1;
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("asyncwatch: {e}");
            ExitCode::FAILURE
        }
    }
}
