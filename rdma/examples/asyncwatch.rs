//! Prints the asynchronous events of a device, like rdma-core's `ibv_asyncwatch`.
//!
//! ```text
//! asyncwatch [-d DEVICE] [-n COUNT]
//!   -d, --ib-dev=DEVICE   the device (default: the first one)
//!   -n, --count=COUNT     exit after COUNT events (default: run until killed)
//! ```

mod common;

use std::process::ExitCode;

use common::args::{ArgError, Cli, Flag, Parsed};

#[derive(Debug, Clone, Copy)]
enum Key {
    Device,
    Count,
}

const CLI: Cli<'static, Key> = Cli {
    name: "asyncwatch",
    usage: "  asyncwatch [-d DEVICE] [-n COUNT]",
    flags: &[
        Flag::value(
            Key::Device,
            'd',
            "ib-dev",
            "DEVICE",
            "the device (default: the first one)",
        ),
        Flag::value(
            Key::Count,
            'n',
            "count",
            "COUNT",
            "exit after COUNT events (default: run until killed)",
        ),
    ],
    bad_exit: 1,
};

/// The device and the number of events to wait for.
fn parse(parsed: Parsed<Key>) -> Result<(Option<String>, Option<u64>), ArgError> {
    parsed.no_operands()?;
    let (mut device, mut count) = (None, None);
    for f in parsed.flags {
        match f.key {
            Key::Device => device = Some(f.value),
            Key::Count => count = Some(f.number("a count")?),
        }
    }
    Ok((device, count))
}

fn run(device: Option<String>, count: Option<u64>) -> common::Res<()> {
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
    }?;
    let ctx = dev.open()?;
    let fd = ctx.async_fd()?;
    println!(
        "{}: async event FD {}",
        dev.name(),
        std::os::fd::AsRawFd::as_raw_fd(&fd)
    );
    let mut seen = 0u64;
    while count.is_none_or(|n| seen < n) {
        let ev = ctx.get_async_event()?;
        println!("got event {ev}");
        seen += 1;
    }
    Ok(())
}

fn main() -> ExitCode {
    let (device, count) = match CLI.read(parse) {
        Ok(o) => o,
        Err(code) => return code,
    };
    match run(device, count) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("asyncwatch: {}", common::Report(&e));
            ExitCode::FAILURE
        }
    }
}
