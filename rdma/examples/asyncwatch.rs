//! Prints the asynchronous events of a device, like rdma-core's `ibv_asyncwatch`.
//!
//! ```text
//! asyncwatch [-d DEVICE] [-n COUNT]
//!   -d, --ib-dev=DEVICE   the device (default: the first one)
//!   -n, --count=COUNT     exit after COUNT events (default: run until killed)
//! ```

mod common;

use std::process::ExitCode;

use common::args::{self, Flag};

fn run() -> Result<(), String> {
    const FLAGS: [Flag; 3] = [
        Flag::new('d', "ib-dev", true),
        Flag::new('n', "count", true),
        Flag::new('h', "help", false),
    ];
    let parsed = args::parse(std::env::args().skip(1), &FLAGS)?;
    if let Some(op) = parsed.operands.first() {
        return Err(format!("unexpected argument '{op}'"));
    }
    let mut device = None;
    let mut count: Option<u64> = None;
    for f in parsed.flags {
        match f.index {
            0 => device = Some(f.value),
            1 => count = Some(args::number('n', &f.value)?),
            _ => {
                println!("usage: asyncwatch [-d DEVICE] [-n COUNT]");
                return Ok(());
            }
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
