//! Timestamps: the TSC where there is one, as perftest reads it.
//!
//! A `clock_gettime` can be a system call (in the TCG guest of `ci/bench`
//! the clocksource is HPET, and a read costs more than a microsecond),
//! while perftest stamps its tests with `rdtsc`. So on x86_64 the stamps are
//! TSC ticks, converted to time with the rate measured against
//! CLOCK_MONOTONIC over the run itself (from its start to its end);
//! elsewhere they are CLOCK_MONOTONIC nanoseconds.

use std::time::Instant;

/// A series of timestamps and what they are worth in time.
pub struct Stamps {
    ticks: Vec<u64>,
    rate: Rate,
}

/// What a tick is worth over one run: CLOCK_MONOTONIC and the tick counter
/// read together at its start and at its end.
#[derive(Debug, Default, Clone, Copy)]
pub struct Rate {
    start: Option<(Instant, u64)>,
    end: Option<(Instant, u64)>,
}

impl Rate {
    /// Starts the measurement (again).
    pub fn start(&mut self) {
        self.start = Some((Instant::now(), ticks()));
        self.end = None;
    }

    /// Ends it.
    pub fn finish(&mut self) {
        self.end = Some((Instant::now(), ticks()));
    }

    /// Ticks per second (NaN before both ends are read, or if the clocks
    /// did not move).
    pub fn per_sec(&self) -> f64 {
        if !cfg!(target_arch = "x86_64") {
            return 1e9;
        }
        match (self.start, self.end) {
            (Some((i0, t0)), Some((i1, t1))) if i1 > i0 && t1 > t0 => {
                (t1 - t0) as f64 / (i1 - i0).as_secs_f64()
            }
            _ => f64::NAN,
        }
    }
}

/// The tick counter now.
#[inline(always)]
pub fn now() -> u64 {
    ticks()
}

/// The name of the clock, for the header.
pub const NAME: &str = if cfg!(target_arch = "x86_64") {
    "TSC (rdtsc), rate measured against CLOCK_MONOTONIC over each run"
} else {
    "CLOCK_MONOTONIC (std::time::Instant)"
};

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn ticks() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86_64; it reads a counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn ticks() -> u64 {
    use std::sync::OnceLock;
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

impl Stamps {
    /// Room for `n` stamps; the tick rate is measured from now.
    pub fn with_capacity(n: usize) -> Self {
        let mut rate = Rate::default();
        rate.start();
        Stamps {
            ticks: Vec::with_capacity(n),
            rate,
        }
    }

    /// Forgets the stamps (keeps the allocation) and measures the tick rate
    /// from now: a stamp is then only the counter's read and its store,
    /// as perftest's into its preallocated array.
    pub fn clear(&mut self) {
        self.ticks.clear();
        self.rate.start();
    }

    /// Takes one stamp.
    #[inline(always)]
    pub fn push(&mut self) {
        self.ticks.push(ticks());
    }

    /// Room for the next `n` stamps, written in place by a loop that takes
    /// exactly one per iteration (as perftest's `tposted[scnt]`): the
    /// stamps are then `n` long, whatever the loop wrote (a loop that fails
    /// half-way prints no statistics).
    pub fn slots(&mut self, n: usize) -> std::slice::IterMut<'_, u64> {
        self.ticks.clear();
        self.ticks.resize(n, 0);
        self.ticks.iter_mut()
    }

    /// Closes the series (reads CLOCK_MONOTONIC once more for the rate).
    pub fn finish(&mut self) {
        self.rate.finish();
    }

    pub fn len(&self) -> usize {
        self.ticks.len()
    }

    /// Ticks per microsecond, measured over the series.
    fn ticks_per_us(&self) -> f64 {
        self.rate.per_sec() / 1e6
    }

    /// The gaps between consecutive stamps, in microseconds.
    pub fn gaps_us(&self) -> impl Iterator<Item = f64> + '_ {
        let per_us = self.ticks_per_us();
        self.ticks
            .windows(2)
            .map(move |w| w[1].saturating_sub(w[0]) as f64 / per_us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each gap is the monotonic clock's between the same two points (read
    /// right after each stamp), whatever the host's load stretched it to.
    #[test]
    fn gaps_follow_the_monotonic_clock() {
        let mut s = Stamps::with_capacity(3);
        let mut at = Vec::new();
        for _ in 0..3 {
            s.push();
            at.push(Instant::now());
            let t = Instant::now();
            while t.elapsed().as_micros() < 2000 {}
        }
        s.finish();
        let gaps: Vec<f64> = s.gaps_us().collect();
        assert_eq!(gaps.len(), 2);
        for (g, w) in gaps.into_iter().zip(at.windows(2)) {
            let want = (w[1] - w[0]).as_secs_f64() * 1e6;
            assert!(want >= 2000.0, "the busy wait lasts 2 ms: {want} us");
            assert!(
                (g - want).abs() <= want * 0.1 + 100.0,
                "gap {g} us, CLOCK_MONOTONIC {want} us"
            );
        }
    }
}
