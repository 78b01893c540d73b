//! perftest's result tables, computed the way perftest computes them, from
//! the timestamps of `crate::clock` (TSC ticks on x86_64, as perftest's).

use crate::clock::{Rate, Stamps};
use std::time::Duration;

/// perftest computes the peak bandwidth only up to this many messages (the
/// search is quadratic).
const PEAK_LIMIT: usize = 20_000;
/// Latency samples dropped from the top before the statistics (perftest's
/// `LAT_MEASURE_TAIL`).
const LAT_TAIL: usize = 2;
const MIB: f64 = 1_048_576.0;

fn rule() -> String {
    "-".repeat(87)
}

/// The column header of the bandwidth table.
pub fn bw_header() {
    println!(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]");
}

/// The column header of the latency table.
pub fn lat_header() {
    println!(
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    \
         t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
    );
}

/// Closes a table.
pub fn footer() {
    println!("{}", rule());
}

/// The timestamps of a bandwidth run, in ticks of `crate::clock::now`,
/// whose worth `rate` measures over the run (perftest stamps with `rdtsc`; a
/// CLOCK_MONOTONIC read is an HPET access in the TCG guest).
///
/// For the peak (`every`): one per posted request, and one per polled
/// completion with the number of requests completed so far. Without it
/// (`-N`), as perftest with `-N`: only the start of the timed loop (the
/// first post's time) and its end (the last completion's), and nothing per
/// message: the average needs no more.
#[derive(Debug, Default)]
pub struct BwStamps {
    /// When each request was posted (in order, over all QPs); without
    /// `every`, the loop's start only.
    pub posted: Vec<u64>,
    /// `(requests completed so far, when)` at each completion; without
    /// `every`, the loop's end only.
    pub completed: Vec<(usize, u64)>,
    /// Whether every post and completion is stamped.
    every: bool,
    rate: Rate,
}

impl BwStamps {
    /// Empties both lists, keeping their memory, makes room for `n` when
    /// stamping `every` post and completion, and starts measuring the tick
    /// rate.
    pub fn reset(&mut self, n: usize, every: bool) {
        self.posted.clear();
        self.completed.clear();
        self.every = every;
        if every {
            self.posted.reserve(n);
            self.completed.reserve(n);
        }
        self.rate.start();
    }

    /// Right before the timed loop's first post: without `every`, the
    /// run's first stamp.
    pub fn loop_start(&mut self) {
        if !self.every {
            self.posted.push(crate::clock::now());
        }
    }

    /// Right after a post (with `every`).
    #[inline(always)]
    pub fn post(&mut self) {
        if self.every {
            self.posted.push(crate::clock::now());
        }
    }

    /// The time of a poll's completions: read only with `every`.
    #[inline(always)]
    pub fn poll_time(&self) -> u64 {
        if self.every {
            crate::clock::now()
        } else {
            0
        }
    }

    /// A completion that brings the requests completed to `done`, polled at
    /// `now` ([`BwStamps::poll_time`]), with `every`.
    #[inline(always)]
    pub fn complete(&mut self, done: usize, now: u64) {
        if self.every {
            self.completed.push((done, now));
        }
    }

    /// Right after the timed loop, `done` requests completed: without
    /// `every`, the run's last stamp.
    pub fn loop_end(&mut self, done: usize) {
        if !self.every {
            self.completed.push((done, crate::clock::now()));
        }
    }

    /// Ends the run's tick-rate measurement.
    pub fn finish(&mut self) {
        self.rate.finish();
    }
}

/// One row of the bandwidth table: MiB/s as perftest's "MB/sec".
///
/// Average: bytes of all messages over the time from the first post to the
/// last completion. Peak: the best rate over any window from a post to a
/// later completion (perftest's search), or 0 with `no_peak` or above 20000
/// messages.
pub fn bw_line(size: usize, stamps: &BwStamps, no_peak: bool) {
    match bw_figures(size, stamps, no_peak) {
        Some((total, peak, avg, rate)) => {
            println!(" {size:<10} {total:<16} {peak:<18.2} {avg:<20.2} {rate:.6}");
        }
        None => println!(" {size:<10} 0                (no completions)"),
    }
}

/// The figures of [`bw_line`]: messages, peak and average MiB/s, Mpps.
fn bw_figures(size: usize, stamps: &BwStamps, no_peak: bool) -> Option<(usize, f64, f64, f64)> {
    let total = stamps.completed.last().map_or(0, |c| c.0);
    let (Some(first), Some(&(_, last))) = (stamps.posted.first(), stamps.completed.last()) else {
        return None;
    };
    let per_sec = stamps.rate.per_sec();
    let secs = (last.saturating_sub(*first) as f64 / per_sec).max(1e-9);
    let avg = size as f64 * total as f64 / secs / MIB;
    let rate = total as f64 / secs / 1e6;
    let peak = if no_peak || total > PEAK_LIMIT || stamps.posted.len() < total {
        0.0
    } else {
        let mut best = f64::INFINITY;
        for (i, t) in stamps.posted.iter().enumerate().take(total) {
            let from = stamps.completed.partition_point(|c| c.0 <= i);
            for &(n, tc) in &stamps.completed[from..] {
                let per = tc.saturating_sub(*t) as f64 / per_sec / (n - i) as f64;
                if per > 0.0 && per < best {
                    best = per;
                }
            }
        }
        if best.is_finite() {
            // The whole run is one of the windows: the peak is never under
            // the average, which the division in another order could make
            // it by an ulp.
            (size as f64 / best / MIB).max(avg)
        } else {
            0.0
        }
    };
    Some((total, peak, avg, rate))
}

/// One row of the latency table from the post timestamps of a ping-pong:
/// perftest's statistics over the gaps between consecutive posts, divided by
/// `rtt_factor` (2 when each gap is a round trip of two messages), with the
/// two largest samples dropped.
pub fn lat_line(size: usize, stamps: &Stamps, rtt_factor: f64, work: &mut Vec<f64>) {
    lat_line_of_gaps(size, stamps.len(), stamps.gaps_us(), rtt_factor, work);
}

/// `-U` / `-H`: every sample (gap over `rtt_factor`) as perftest prints
/// them: a `#, usec` line then `N, value` lines, in the order taken for
/// `unsorted`, sorted for `sorted` (both blocks when both are asked for),
/// then the rule and the column header again, so that the row follows a
/// header as without them.
pub fn samples(
    stamps: &Stamps,
    rtt_factor: f64,
    unsorted: bool,
    sorted: bool,
    work: &mut Vec<f64>,
) {
    use std::io::Write;
    work.clear();
    work.extend(stamps.gaps_us().map(|g| g / rtt_factor));
    fn block(out: &mut impl Write, v: &[f64]) -> std::io::Result<()> {
        writeln!(out, "#, usec")?;
        for (i, x) in v.iter().enumerate() {
            writeln!(out, "{}, {}", i + 1, Sig6(*x))?;
        }
        Ok(())
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let written = (|| {
        if unsorted {
            block(&mut out, work)?;
        }
        if sorted {
            work.sort_by(f64::total_cmp);
            block(&mut out, work)?;
        }
        out.flush()
    })();
    if let Err(e) = written {
        eprintln!("perf: writing the samples: {e}");
    }
    drop(out);
    println!("{}", rule());
    lat_header();
}

/// A number with six significant digits and no trailing zeros, like C's
/// `%g` from 1e-4 to below 1e6 (microsecond samples up to a second); larger
/// values keep all their integer digits where `%g` would switch to an
/// exponent.
struct Sig6(f64);

impl std::fmt::Display for Sig6 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let x = self.0;
        if !x.is_finite() || x == 0.0 {
            return write!(f, "{x}");
        }
        let digits = 5 - x.abs().log10().floor() as i32;
        let s = format!("{:.*}", digits.max(0) as usize, x);
        let s = if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.')
        } else {
            &s
        };
        f.write_str(s)
    }
}

/// `--interleave`: the typical latency (median gap, over `rtt_factor`) of
/// the gaps between two stamps of the same path, for the safe and the raw
/// path, and their ratio. Gaps across a switch are left out.
pub fn interleaved(stamps: &Stamps, raw_stamp: &[bool], rtt_factor: f64) {
    let (mut safe, mut raw) = (Vec::new(), Vec::new());
    for (i, g) in stamps.gaps_us().enumerate() {
        match (raw_stamp.get(i), raw_stamp.get(i + 1)) {
            (Some(false), Some(false)) => safe.push(g / rtt_factor),
            (Some(true), Some(true)) => raw.push(g / rtt_factor),
            _ => {}
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => f64::NAN,
            n if n % 2 == 0 => (v[n / 2 - 1] + v[n / 2]) / 2.0,
            n => v[n / 2],
        }
    };
    let (s, r) = (median(&mut safe), median(&mut raw));
    println!(
        " interleaved: safe t_typical {s:.2} usec ({} gaps), raw t_typical {r:.2} usec ({} gaps), safe/raw {:.4}",
        safe.len(),
        raw.len(),
        s / r
    );
}

/// [`lat_line`] over the gaps (in microseconds) of `iters` stamps.
fn lat_line_of_gaps(
    size: usize,
    iters: usize,
    gaps: impl Iterator<Item = f64>,
    rtt_factor: f64,
    work: &mut Vec<f64>,
) {
    work.clear();
    work.extend(gaps.map(|g| g / rtt_factor));
    if work.len() < LAT_TAIL + 2 {
        println!(" {size:<7} {iters:<10} (too few samples)");
        return;
    }
    work.sort_by(f64::total_cmp);
    let n = work.len() - LAT_TAIL;
    let d = &work[..];
    let median = if n % 2 == 0 {
        (d[n / 2] + d[n / 2 - 1]) / 2.0
    } else {
        d[n / 2]
    };
    let avg = d[..n].iter().sum::<f64>() / n as f64;
    let var = d[..n].iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64;
    let pct = |p: f64| d[((n as f64 * p).ceil() as usize).min(d.len() - 1)];
    println!(
        " {size:<7} {iters:<10}     {:<14.2} {:<12.2} {:<18.2} {:<14.2} {:<15.2} {:<22.2} {:.2}",
        d[0],
        d[n],
        median,
        avg,
        var.sqrt(),
        pct(0.99),
        pct(0.999)
    );
}

/// User and system CPU time of this process so far.
pub fn cpu_times() -> (Duration, Duration) {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: RUSAGE_SELF with a writable, zero-initialised rusage.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    if rc != 0 {
        return (Duration::ZERO, Duration::ZERO);
    }
    // SAFETY: getrusage succeeded and filled the struct.
    let ru = unsafe { ru.assume_init() };
    let d = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    (d(ru.ru_utime), d(ru.ru_stime))
}

/// `--cpu`: the CPU time spent per iteration between two `cpu_times`.
pub fn cpu_line(before: (Duration, Duration), after: (Duration, Duration), iters: usize) {
    let per =
        |a: Duration, b: Duration| a.saturating_sub(b).as_secs_f64() * 1e6 / iters.max(1) as f64;
    println!(
        " CPU per iteration: user {:.2} usec, system {:.2} usec ({iters} iterations)",
        per(after.0, before.0),
        per(after.1, before.1)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_print_like_percent_g() {
        let s = |x: f64| Sig6(x).to_string();
        assert_eq!(s(11.2345678), "11.2346");
        assert_eq!(s(5.5), "5.5");
        assert_eq!(s(123456.7), "123457");
        assert_eq!(s(0.0123456789), "0.0123457");
        assert_eq!(s(20.0), "20");
    }

    #[test]
    fn bandwidth_follows_the_monotonic_clock() {
        // Ten 1 MiB messages: all posted at once, one completing every ~2 ms.
        let mut stamps = BwStamps::default();
        stamps.reset(10, true);
        let start = std::time::Instant::now();
        let t0 = crate::clock::now();
        stamps.posted.extend(std::iter::repeat(t0).take(10));
        let mut elapsed = std::time::Duration::ZERO;
        for n in 1..=10 {
            let wait = std::time::Instant::now();
            while wait.elapsed().as_micros() < 2000 {}
            stamps.completed.push((n, crate::clock::now()));
            elapsed = start.elapsed();
        }
        stamps.finish();
        let (total, peak, avg, rate) = bw_figures(1 << 20, &stamps, false).unwrap();
        assert_eq!(total, 10);
        // 10 MiB over the time the loop really took (at least 20 ms, more
        // on a loaded host): the figure follows the clock, not the nominal
        // 2 ms per message.
        let expected = 10.0 / elapsed.as_secs_f64();
        assert!(
            (0.8..=1.25).contains(&(avg / expected)),
            "average {avg} MiB/s, {expected} MiB/s by the monotonic clock"
        );
        assert!(peak >= avg, "peak {peak} below average {avg}");
        // 1 MiB messages: messages per second equal MiB per second.
        assert!((rate - avg / 1e6).abs() < 1e-9, "{rate} Mpps, {avg} MiB/s");
        assert!(bw_figures(1 << 20, &BwStamps::default(), false).is_none());
    }

    #[test]
    fn latency_statistics_drop_the_tail() {
        // Gaps of 10 us, except two huge ones, which are dropped.
        let mut gaps = vec![10.0; 98];
        gaps.extend([5000.0, 9000.0]);
        let mut work = Vec::new();
        lat_line_of_gaps(2, 101, gaps.into_iter(), 2.0, &mut work);
        assert_eq!(work.len(), 100);
        assert!((work[50] - 5.0).abs() < 1e-9);
    }
}
