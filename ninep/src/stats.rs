//! Where a connection's requests spend their time on the server, logged
//! at debug level under the target `rdma_9p::stats` after each burst of
//! reads and writes and when the connection ends (`ninep/bench/profile.sh`
//! reads them); the server's loop fills them in only when they are logged.

use std::time::Duration;

/// The log target of the per-connection timings (`RUST_LOG=rdma_9p::stats=debug`).
pub(crate) const STATS: &str = "rdma_9p::stats";

/// Whether the timings are logged: read once, as the clock reads they
/// need cost time on every request.
pub(crate) fn on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| log::log_enabled!(target: STATS, log::Level::Debug))
}

/// Where a connection's requests spent their time (logged at debug level
/// under the target [`STATS`] after each burst and when it ends): sums over
/// `n` requests.
#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) n: u32,
    /// Receive completion polled -> handed to the blocking pool.
    pub(crate) queued: Duration,
    /// Handed over -> the handler began on its thread.
    pub(crate) handoff: Duration,
    /// The handler itself (decode, file I/O, reply).
    pub(crate) handle: Duration,
    /// Handler ended -> reply posted.
    pub(crate) back: Duration,
    /// Reply posted -> the next receive completion polled, with nothing
    /// running: the client's and the transport's share.
    pub(crate) idle: Duration,
    pub(crate) idle_n: u32,
}

impl Stats {
    pub(crate) fn print(&self) {
        if self.n == 0 {
            return;
        }
        let us = |d: Duration, n: u32| d.as_secs_f64() * 1e6 / f64::from(n.max(1));
        log::debug!(
            target: STATS,
            "{} requests, mean us: queued {:.1} handoff {:.1} handle {:.1} back {:.1}; idle between requests {:.1} ({} gaps)",
            self.n,
            us(self.queued, self.n),
            us(self.handoff, self.n),
            us(self.handle, self.n),
            us(self.back, self.n),
            us(self.idle, self.idle_n),
            self.idle_n
        );
    }
}
