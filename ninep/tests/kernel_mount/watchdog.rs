//! The rxe tests' guard against issue 22 (`ninep/README.md`): the client's
//! I/O pinned to CPU 0 with timers kept on their CPU, and a watchdog that
//! fails a test within a second of a QP giving up, with what it measured.

use super::*;

/// Runs `body` on a thread and fails the test as soon as a QP of `dev`
/// gives up after transport retries (rxe's `retry_exceeded_err` counter
/// grows), instead of waiting for the per-test timeout; `mnts` are detached
/// first. Either way it prints what it measured: the hardware counters that
/// moved, and the longest a thread asking to wake every 10 ms waited
/// (the guest's scheduling stalls, host preemption of the vCPUs included).
///
/// Linux's 9P client connects with a transport retry count of 0 (its
/// `rdma_conn_param` is zeroed) and the server cannot raise it: a QP's count
/// comes from its own side's connect request (the server's CM attributes
/// show `retry_cnt 0`, ACK timeout 19, 2.1 s). rxe (6.1) arms a QP's
/// retransmit timer only when it is not already pending and pushes it back
/// only while packets are unacknowledged, so a deadline set for an earlier,
/// long-acknowledged request can expire while a new request waits for its
/// ACK; with a retry count of 0 that first expiry moves the client's QP to
/// the error state (`retry_exceeded_err`), and trans_rdma never fails the
/// request it was waiting on: the writer hangs until killed (issue 22,
/// `ninep/README.md`). This names that cause instead of timing out.
pub(crate) fn unless_a_qp_gives_up(
    dev: &str,
    mnts: &[&Path],
    body: impl FnOnce() + Send + 'static,
) {
    let counters = format!("/sys/class/infiniband/{dev}/ports/1/hw_counters");
    let before = hw_counters(&counters);
    let retries = |c: &[(String, u64)]| {
        c.iter()
            .find(|(n, _)| n == "retry_exceeded_err")
            .map(|(_, v)| *v)
    };
    let (tx, rx) = mpsc::channel();
    let _timers = std::env::var_os("RDMA_9P_TEST_UNPINNED")
        .is_none()
        .then(TimersStayPut::new);
    let worker = std::thread::spawn(move || {
        // The I/O thread and every process it starts (cp, fio, ...) run on
        // one CPU: the client's requests then run on the CPU its retransmit
        // timer is on, and a timer cannot expire in the middle of a request.
        // RDMA_9P_TEST_UNPINNED=1 leaves them on any CPU, as a user would
        // (ninep/bench/rxe-retry-trace.sh reproduces issue 22 with it).
        if std::env::var_os("RDMA_9P_TEST_UNPINNED").is_none() {
            on_cpu_0();
        }
        body();
        let _ = tx.send(());
    });
    let stalls = StallMeter::start();
    let t0 = std::time::Instant::now();
    loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        let now = hw_counters(&counters);
        if let (Some(b), Some(n)) = (retries(&before), retries(&now)) {
            if n != b {
                // The QPs' states, for the record: the kernel client's shows
                // `comm [rdma_cm]`, the server's `comm rdma-9p`.
                let qps = Command::new("rdma")
                    .args(["resource", "show", "qp"])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_else(|e| format!("rdma resource show qp: {e}"));
                for m in mnts {
                    let _ = Command::new("umount").arg("-l").arg(m).status();
                }
                panic!(
                    "a QP on {dev} gave up after an ACK timeout at {:?} (retry_exceeded_err \
                     {b} -> {n}): the kernel 9P client's QP (retry count 0) in ERR never \
                     completes its request (issue 22). {}; counters that moved: {}. QPs:\n{qps}",
                    t0.elapsed(),
                    stalls.report(),
                    moved(&before, &now)
                );
            }
        }
    }
    eprintln!(
        "kernel_mount: {} in {:?}; counters that moved: {}",
        stalls.report(),
        t0.elapsed(),
        moved(&before, &hw_counters(&counters))
    );
    if let Err(e) = worker.join() {
        std::panic::resume_unwind(e);
    }
}

/// Pins the calling thread (and what it starts later: threads, processes)
/// to CPU 0.
pub(crate) fn on_cpu_0() {
    // SAFETY: an all-zero cpu_set_t is the empty set (plain integers).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: 0 is below CPU_SETSIZE, and `set` is a valid cpu_set_t.
    unsafe { libc::CPU_SET(0, &mut set) };
    // SAFETY: `set` is valid for the size given; 0 names the calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    assert_eq!(
        rc,
        0,
        "sched_setaffinity(CPU 0): {}",
        std::io::Error::last_os_error()
    );
}

/// `kernel.timer_migration` set to 0 while it lives (restored on drop): a
/// timer armed on a CPU then always expires on that CPU. Without it the
/// kernel may queue a timer armed from an idle CPU (a softirq that ran on
/// the idle task) on another, busy CPU.
struct TimersStayPut {
    before: Option<String>,
}

pub(crate) const TIMER_MIGRATION: &str = "/proc/sys/kernel/timer_migration";

impl TimersStayPut {
    fn new() -> TimersStayPut {
        let before = std::fs::read_to_string(TIMER_MIGRATION).ok();
        if before.is_some() {
            std::fs::write(TIMER_MIGRATION, "0")
                .unwrap_or_else(|e| panic!("writing 0 to {TIMER_MIGRATION}: {e}"));
        }
        TimersStayPut { before }
    }
}

impl Drop for TimersStayPut {
    fn drop(&mut self) {
        if let Some(b) = &self.before {
            let _ = std::fs::write(TIMER_MIGRATION, b.trim());
        }
    }
}

/// Every counter in the `hw_counters` directory `dir`, by name.
pub(crate) fn hw_counters(dir: &str) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| {
                let e = e.ok()?;
                let v = std::fs::read_to_string(e.path()).ok()?;
                Some((
                    e.file_name().to_string_lossy().into_owned(),
                    v.trim().parse().ok()?,
                ))
            })
            .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// `name +delta` for each counter of `now` that differs from `before`.
pub(crate) fn moved(before: &[(String, u64)], now: &[(String, u64)]) -> String {
    let d: Vec<String> = now
        .iter()
        .filter_map(|(n, v)| {
            let b = before.iter().find(|(bn, _)| bn == n).map_or(0, |(_, b)| *b);
            (*v != b).then(|| format!("{n} +{}", v.wrapping_sub(b)))
        })
        .collect();
    if d.is_empty() {
        "none".into()
    } else {
        d.join(", ")
    }
}

/// A thread that asks to wake every 10 ms and records the longest it
/// waited beyond that: how long the guest (or the host, preempting a vCPU)
/// kept it from running. A measurement, not synchronisation.
struct StallMeter {
    worst: std::sync::Arc<std::sync::atomic::AtomicU64>,
    over_100ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl StallMeter {
    fn start() -> StallMeter {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::sync::Arc;
        let worst = Arc::new(AtomicU64::new(0));
        let over = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (w, o, s) = (Arc::clone(&worst), Arc::clone(&over), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let t = std::time::Instant::now();
                std::thread::sleep(Duration::from_millis(10));
                let late = t.elapsed().saturating_sub(Duration::from_millis(10));
                let us = u64::try_from(late.as_micros()).unwrap_or(u64::MAX);
                w.fetch_max(us, Ordering::Relaxed);
                if us > 100_000 {
                    o.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        StallMeter {
            worst,
            over_100ms: over,
            stop,
        }
    }

    fn report(&self) -> String {
        use std::sync::atomic::Ordering;
        format!(
            "longest wake-up delay of a 10 ms sleep {:.1} ms ({} over 100 ms)",
            self.worst.load(Ordering::Relaxed) as f64 / 1000.0,
            self.over_100ms.load(Ordering::Relaxed)
        )
    }
}

impl Drop for StallMeter {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}
