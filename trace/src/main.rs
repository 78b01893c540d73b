//! `rdma-trace`: RDMA traffic from a packet capture, packet by packet or as messages.
//!
//! This file opens the capture and reports how the run ended; the command line, the commands
//! and the printers are in [`cli`].

use std::fs::File;
use std::io::{BufWriter, Write};
use std::process::ExitCode;

use rdma_trace::CaptureError;

mod cli;

use cli::args::Args;
use cli::run::run;

fn main() -> ExitCode {
    let args = Args::parse();
    let stdout = std::io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    let result = if args.file == "-" {
        run(&args, std::io::stdin(), &mut out)
    } else {
        match File::open(&args.file) {
            Ok(f) => run(&args, f, &mut out),
            Err(e) => {
                eprintln!("rdma-trace: {}: {e}", args.file);
                return ExitCode::FAILURE;
            }
        }
    };
    if let Err(e) = out.flush() {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("rdma-trace: writing: {e}");
            return ExitCode::FAILURE;
        }
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A capture cut short (a capture still being written, a killed tcpdump): what was
        // there has been decoded; say so, but it is not a failure of the tool.
        Err(e @ CaptureError::Truncated { .. }) => {
            eprintln!("rdma-trace: warning: {e}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rdma-trace: {}: {e}", args.file);
            ExitCode::FAILURE
        }
    }
}
