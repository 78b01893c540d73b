//! Hostile captures (`rdma_trace::synth`): what a few MB crafted to exhaust the tool cost it.
//! Its promise is streaming with bounded memory, so on each of them `rdma-trace messages` and
//! `rdma-trace rpc` end with exit 0, a peak RSS under 64 MiB, CPU time within a small factor
//! of a well-formed capture of the same size, and a line saying what was dropped to stay in
//! bounds (each dropped message is reported incomplete).

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rdma_trace::synth;

/// A run's exit status, peak RSS in bytes, CPU seconds and standard error.
struct Run {
    status: std::process::ExitStatus,
    max_rss: u64,
    cpu: f64,
    stderr: String,
}

/// Runs `rdma-trace COMMAND FILE`, measured with wait4(2).
// The child is reaped by wait4 (which `Child::wait` cannot give the rusage of).
#[allow(clippy::zombie_processes)]
fn run(command: &str, file: &Path) -> Run {
    let err_file = file.with_extension(format!("{command}.err"));
    let child = Command::new(env!("CARGO_BIN_EXE_rdma-trace"))
        .args([command, file.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_file).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: plain data, filled in by wait4.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a child of this process, not yet reaped; valid pointers.
    let got = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(got, pid, "wait4: {}", std::io::Error::last_os_error());
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Run {
        status: std::process::ExitStatus::from_raw(status),
        max_rss: usage.ru_maxrss as u64 * 1024,
        cpu: secs(usage.ru_utime) + secs(usage.ru_stime),
        stderr: std::fs::read_to_string(&err_file).unwrap(),
    }
}

fn write(dir: &Path, name: &str, make: impl FnOnce(std::io::BufWriter<std::fs::File>)) -> PathBuf {
    let p = dir.join(name);
    make(std::io::BufWriter::new(std::fs::File::create(&p).unwrap()));
    p
}

#[test]
fn hostile_captures_cost_bounded_memory_and_linear_time() {
    let dir = std::env::temp_dir().join(format!("rdma-trace-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // About 22-80 MB each (the last holds 80 MB past its gaps), and a well-formed capture.
    let normal = write(&dir, "normal.pcap", |w| {
        drop(synth::nfs3_rpcs(w, 240).unwrap())
    });
    let hostile = [
        write(&dir, "writes.pcap", |w| {
            drop(synth::unfinished_writes(w, 20_000).unwrap())
        }),
        write(&dir, "iwarp.pcap", |w| {
            drop(synth::iwarp_unfinished_writes(w, 30_000).unwrap())
        }),
        write(&dir, "gap.pcap", |w| {
            drop(synth::data_past_a_gap(w, 40, 2000).unwrap())
        }),
    ];
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    for command in ["messages", "rpc"] {
        let base = run(command, &normal);
        assert!(base.status.success(), "{command} normal: {}", base.stderr);
        for file in &hostile {
            let r = run(command, file);
            let what = format!("{command} {}", file.file_name().unwrap().to_string_lossy());
            assert!(r.status.success(), "{what}: {:?} {}", r.status, r.stderr);
            assert!(
                r.max_rss < 64 << 20,
                "{what}: peak RSS {} MiB",
                r.max_rss >> 20
            );
            // Per byte of capture, within a small factor of the well-formed one's (and a
            // floor for the noise of short runs).
            let per_byte = |r: &Run, p: &Path| r.cpu / size(p) as f64;
            let allowed = 4.0 * per_byte(&base, &normal) * size(file) as f64 + 0.5;
            assert!(
                r.cpu <= allowed,
                "{what}: {:.2} s of CPU, {:.2} s allowed (the normal capture: {:.2} s)",
                r.cpu,
                allowed,
                base.cpu
            );
            let gap_messages = command == "messages" && file.ends_with("gap.pcap");
            if !gap_messages {
                assert!(
                    r.stderr.contains("to stay within its memory bounds"),
                    "{what}: nothing said about what was dropped: {}",
                    r.stderr
                );
            }
            println!(
                "{what}: {:.2} s CPU, {} MiB peak (normal: {:.2} s, {} MiB)",
                r.cpu,
                r.max_rss >> 20,
                base.cpu,
                base.max_rss >> 20
            );
        }
    }
    let _ = std::io::stdout().flush();
    std::fs::remove_dir_all(&dir).unwrap();
}
