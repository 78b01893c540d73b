//! A perftest-style benchmark of the `rdma` crate over RC queue pairs.
//!
//! ```text
//! perf TEST [options]          # server
//! perf TEST [options] HOST     # client
//! TEST: send_bw write_bw read_bw atomic_bw send_lat write_lat read_lat atomic_lat
//! ```
//! perftest's flags (`-d -i -x -s -n -a -I -e -p -F -q`, and `-t -r -Q -m -N
//! -A -o`) with its defaults, plus `--post legacy|extended|auto` (the QPs'
//! [`rdma::PostPath`]), `--raw` (prebuilt C work requests through the `unsafe`
//! raw post calls, and `ibv_poll_cq`, instead of the safe API), `--cpu`
//! (CPU time per iteration) and `--wait channel|cq|async` (how `-e` sleeps:
//! `perf/events.rs`; `async` with the `tokio` feature). Run with `--help` for the list.
//!
//! Measured as perftest measures (bandwidth with `std::time::Instant`,
//! latency stamps from the TSC on x86_64, see `perf/clock.rs`):
//! - bandwidth: bytes × iterations over the time from the first post to the
//!   last completion; the peak is the best rate of any window from a post to
//!   a later completion. MB/sec is MiB/s, as in perftest.
//! - latency: a timestamp before every post; the statistics are over the
//!   gaps between consecutive posts, halved for ping-pong tests (SEND,
//!   WRITE), with the two largest gaps dropped.
//!
//! The safe path moves memory into every request and gets it back from the
//! completion: SEND and WRITE requests all share one region the device only
//! reads (`WrBuffers::Shared`), as perftest posts the same buffer again and
//! again; READ and atomic requests, and receives, need one buffer each in
//! flight. Buffers are registered before the timed loop and reused, and the
//! loop allocates nothing itself. The out-of-band exchange over TCP is perf's own and does
//! not interoperate with perftest.
#![warn(clippy::undocumented_unsafe_blocks)]

#[cfg(feature = "tokio")]
#[path = "perf/aio.rs"]
mod aio;
#[path = "perf/bw.rs"]
mod bw;
#[path = "perf/clock.rs"]
mod clock;
mod common;
#[path = "perf/events.rs"]
mod events;
#[path = "perf/io.rs"]
mod io;
#[path = "perf/lat.rs"]
mod lat;
#[path = "perf/oob.rs"]
mod oob;
#[path = "perf/opts.rs"]
mod opts;
#[path = "perf/report.rs"]
mod report;
#[path = "perf/setup.rs"]
mod setup;
#[path = "perf/slot_lat.rs"]
mod slot_lat;

use std::process::ExitCode;

use opts::Kind;

fn main() -> ExitCode {
    let opts = match opts::read() {
        Ok(o) => o,
        Err(code) => return code,
    };
    events::set(opts.wait);
    let result = setup::connect(&opts).and_then(|mut conn| match opts.test.kind {
        Kind::Bw => bw::run(&mut conn, &opts),
        Kind::Lat => lat::run(&mut conn, &opts),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("perf: {}", common::Report(&e));
            ExitCode::FAILURE
        }
    }
}
