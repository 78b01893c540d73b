//! How `-e` sleeps: `--wait channel` (the default) arms the CQ, polls once
//! more and reads one event with `CompletionChannel::get_event`
//! (`io::sleep_on`); `--wait cq` hands the whole cycle to the crate's
//! blocking wait, `CompletionQueue::wait_until` (poll, arm, poll, read the
//! channel, events acknowledged 16 at a time), with the loop's own poll;
//! `--wait async` (`send_lat` and the bandwidth tests, perf built with the
//! `tokio` feature) runs the loop as a future whose completions are awaited
//! through `rdma::aio` (`perf/aio.rs`).
//!
//! The choice is made once, before the loops run; `io::sleep_on` asks
//! [`through_cq`] on every sleep (one relaxed load).

use std::sync::atomic::{AtomicBool, Ordering};

use rdma::CompletionQueue;

use anyhow::Context as _;

use crate::common::Res;
use crate::opts::ArgError;

/// How `-e` sleeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Arm, poll, `CompletionChannel::get_event`, poll.
    Channel,
    /// `CompletionQueue::wait_until`.
    Cq,
    /// `rdma::aio::AsyncCq` on a tokio runtime (`perf/aio.rs`).
    Async,
}

/// Parses `--wait`'s value.
///
/// # Errors
/// Anything but `channel`, `cq` or `async`.
pub fn parse(flag: &str, v: &str) -> Result<Wait, ArgError> {
    match v {
        "channel" => Ok(Wait::Channel),
        "cq" => Ok(Wait::Cq),
        "async" => Ok(Wait::Async),
        _ => Err(ArgError::Bad(format!(
            "invalid value {v:?} for {flag}: expected channel, cq or async"
        ))),
    }
}

static THROUGH_CQ: AtomicBool = AtomicBool::new(false);

/// Chooses how `-e` sleeps, before the loops run.
pub fn set(wait: Wait) {
    THROUGH_CQ.store(wait == Wait::Cq, Ordering::Relaxed);
}

/// Whether `-e` sleeps through [`sleep`].
#[inline]
pub fn through_cq() -> bool {
    THROUGH_CQ.load(Ordering::Relaxed)
}

/// A failure of the wait itself, or of the loop's poll.
enum Failed {
    Wait(rdma::Error),
    Poll(anyhow::Error),
}

impl From<rdma::Error> for Failed {
    fn from(e: rdma::Error) -> Failed {
        Failed::Wait(e)
    }
}

/// Sleeps on `cq`'s channel (`CompletionQueue::wait_until`, no bound) until
/// `poll` finds completions; returns how many it found.
///
/// # Errors
/// The wait's failures, or `poll`'s.
pub fn sleep(cq: &CompletionQueue, mut poll: impl FnMut() -> Res<usize>) -> Res<usize> {
    let got = cq.wait_until(None, || match poll() {
        Ok(0) => Ok(None),
        Ok(n) => Ok(Some(n)),
        Err(e) => Err(Failed::Poll(e)),
    });
    match got {
        Ok(n) => Ok(n.unwrap_or(0)),
        Err(Failed::Wait(e)) => Err(e).context("Couldn't wait for a completion"),
        Err(Failed::Poll(e)) => Err(e),
    }
}
