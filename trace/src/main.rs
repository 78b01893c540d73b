//! `rdma-trace`: RDMA traffic from a packet capture, packet by packet or as messages.
//!
//! This file opens the capture and reports how the run ended; the command line, the commands
//! and the printers are in [`cli`].

use std::fs::File;
use std::io::{BufWriter, Write};
use std::process::ExitCode;

use anyhow::Context;
use rdma_trace::CaptureError;

mod cli;

use cli::args::Args;
use cli::run::run;

fn main() -> ExitCode {
    let args = Args::parse();
    match run_file(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}`: each context, then its cause ("FILE: not a readable pcap/pcapng file: ...").
            eprintln!("rdma-trace: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the command on the capture (`-`: standard input), its output buffered.
fn run_file(args: &Args) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    let result = if args.file == "-" {
        run(args, std::io::stdin(), &mut out)
    } else {
        let f = File::open(&args.file).with_context(|| args.file.clone())?;
        run(args, f, &mut out)
    };
    if let Err(e) = out.flush() {
        // A reader that stopped early (`| head`) is not a failure.
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            return Err(e).context("writing");
        }
    }
    match result {
        Ok(()) => Ok(()),
        // A capture cut short (a capture still being written, a killed tcpdump): what was
        // there has been decoded; say so, but it is not a failure of the tool.
        Err(e @ CaptureError::Truncated { .. }) => {
            eprintln!("rdma-trace: warning: {e}");
            Ok(())
        }
        Err(e) => Err(e).with_context(|| args.file.clone()),
    }
}
