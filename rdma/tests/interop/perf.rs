//! perf: the benchmark example against itself (its wire protocol is its own),
//! every test with few iterations, checking the table it prints.

use super::*;

/// Runs `perf TEST ARGS` as server and client on `port`; returns the client.
fn perf_pair(test: &str, args: &[&str], port: u16) -> Finished {
    let mut common_args: Vec<String> = vec![
        test.into(),
        "-d".into(),
        common::device_name(),
        "-x".into(),
        common::gid_index().to_string(),
        "-p".into(),
        port.to_string(),
    ];
    common_args.extend(args.iter().map(|a| a.to_string()));
    let server = Running::spawn(
        format!("perf {test} (server)"),
        Command::new(example("perf")).args(&common_args),
    );
    let server = wait_listening(server, port);
    let client = Running::spawn(
        format!("perf {test} (client)"),
        Command::new(example("perf"))
            .args(&common_args)
            .arg("127.0.0.1"),
    );
    let (server, client) = wait_both(server, client);
    assert!(server.success() && client.success(), "{server}{client}");
    client
}

/// The numbers row after the header that starts with ` #bytes`: every
/// field a finite number, `size` and `iters` first.
fn perf_row(out: &Finished, size: u64, iters: u64) -> Vec<f64> {
    let mut lines = out.stdout.lines().skip_while(|l| !l.starts_with(" #bytes"));
    assert!(lines.next().is_some(), "no table header:\n{out}");
    let row = lines
        .next()
        .unwrap_or_else(|| panic!("no numbers row:\n{out}"));
    let v: Vec<f64> = row
        .split_whitespace()
        .map(|f| {
            f.parse()
                .unwrap_or_else(|_| panic!("{f:?} in {row:?}:\n{out}"))
        })
        .collect();
    assert!(v.iter().all(|x| x.is_finite()), "{row:?}");
    assert_eq!((v[0] as u64, v[1] as u64), (size, iters), "{row:?}");
    v
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn perf_bandwidth_tests_report_a_positive_rate() {
    for (i, test) in ["send_bw", "write_bw", "read_bw"].into_iter().enumerate() {
        let out = perf_pair(test, &["-s", "4096", "-n", "200"], 18860 + i as u16);
        let v = perf_row(&out, 4096, 200);
        // BW peak, BW average, MsgRate; the average at most the peak.
        assert!(
            v.len() == 5 && v[3] > 0.0 && v[4] > 0.0 && v[3] <= v[2] * 1.0001,
            "{test}: {v:?}"
        );
    }
    let out = perf_pair("atomic_bw", &["-n", "200"], 18863);
    let v = perf_row(&out, 8, 200);
    assert!(v[3] > 0.0, "atomic_bw: {v:?}");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn perf_latency_tests_report_ordered_statistics() {
    for (i, test) in ["send_lat", "write_lat", "read_lat", "atomic_lat"]
        .into_iter()
        .enumerate()
    {
        let size = if test == "atomic_lat" { 8 } else { 2 };
        let out = perf_pair(test, &["-n", "200"], 18864 + i as u16);
        let v = perf_row(&out, size, 200);
        // t_min <= t_typical <= t_max, t_min > 0.
        let (min, max, typical) = (v[2], v[3], v[4]);
        assert!(
            0.0 < min && min <= typical && typical <= max,
            "{test}: {v:?}"
        );
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn perf_raw_paths_run_the_same_tests() {
    let out = perf_pair(
        "write_lat",
        &["-n", "200", "--raw", "--post", "legacy"],
        18868,
    );
    perf_row(&out, 2, 200);
    let out = perf_pair(
        "send_bw",
        // -u: a non-default ACK timeout on the way to RTS.
        &[
            "-s", "4096", "-n", "200", "--raw", "--post", "extended", "-u", "18",
        ],
        18869,
    );
    assert!(perf_row(&out, 4096, 200)[3] > 0.0);
}

/// `-N`: as perftest, no stamp per message, only the timed loop's start
/// and end; the row has no peak (0) and an average that agrees with the
/// message rate, on the safe path and on the raw one (`--post extended`).
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn perf_no_peak_times_the_loop_from_its_two_ends() {
    let runs: [(&str, &[&str], u16); 2] = [
        ("write_bw", &[], 18880),
        ("read_bw", &["--raw", "--post", "extended"], 18881),
    ];
    for (test, extra, port) in runs {
        let mut args = vec!["-s", "4096", "-n", "200", "-N"];
        args.extend_from_slice(extra);
        let out = perf_pair(test, &args, port);
        let v = perf_row(&out, 4096, 200);
        let (peak, avg, mpps) = (v[2], v[3], v[4]);
        // MiB/s from the message rate: 4096 bytes a message.
        let from_rate = mpps * 1e6 * 4096.0 / 1_048_576.0;
        assert!(
            peak == 0.0 && avg > 0.0 && avg < 1e6 && (avg / from_rate - 1.0).abs() < 0.01,
            "{test} {extra:?}: {v:?}"
        );
    }
}

/// `-e` (sleeping on completion events) with each way of waiting: the
/// bandwidth tests and `send_lat` run and report, and the header names the
/// wait. `--wait async` (the loops as futures on `rdma::aio`) needs perf
/// built with the `tokio` feature, as the tests are with it; the blocking
/// waits share the bandwidth loop, so one run each covers them.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn perf_event_mode_runs_with_every_wait() {
    // One send in 100 signaled at every size (as perftest -e: moderation
    // stays on above 8 KiB in event mode), and every one with `-Q 1`.
    let mut cases: Vec<(&str, &str, u64, &[&str])> = vec![
        ("channel", "send_bw", 2, &[]),
        ("cq", "send_bw", 65536, &["-Q", "1"]),
    ];
    if cfg!(feature = "tokio") {
        cases.extend([
            ("async", "send_bw", 2, &[][..]),
            ("async", "send_bw", 65536, &[]),
            ("async", "send_bw", 4096, &["-Q", "1"]),
            ("async", "write_bw", 2, &[]),
            ("async", "read_bw", 65536, &["-Q", "1"]),
            ("async", "send_lat", 2, &[]),
        ]);
    }
    for (i, (wait, test, size, extra)) in cases.into_iter().enumerate() {
        let s = size.to_string();
        let mut args = vec!["-e", "--wait", wait, "-s", &s, "-n", "200"];
        args.extend(extra);
        let out = perf_pair(test, &args, 18900 + i as u16);
        let v = perf_row(&out, size, 200);
        let named = match wait {
            "channel" => "channel (CompletionChannel::get_event)",
            "cq" => "cq (CompletionQueue::wait_until)",
            _ => "async (rdma::aio::AsyncCq on tokio)",
        };
        assert!(
            !out.lines_starting(&format!(" Events          : {named}"))
                .is_empty(),
            "{test} --wait {wait}: the header names the wait:\n{out}"
        );
        // Bandwidth rows: the message rate (2 B rounds to 0.00 MiB/s), and
        // the moderation in the header.
        if test != "send_lat" {
            assert!(v[4] > 0.0, "{test} -s {size} --wait {wait}: {v:?}");
            let cq_mod = if extra.is_empty() { 100 } else { 1 };
            assert!(
                !out.lines_starting(&format!(
                    " TX depth        : 128\t\tCQ Moderation   : {cq_mod}"
                ))
                .is_empty(),
                "{test} -s {size} --wait {wait} {extra:?}: one send in {cq_mod} signaled:\n{out}"
            );
        }
    }
}

/// The latency tests' safe path posts prepared requests
/// (`prepare_send`/`post_prepared`) by default and builds every request for
/// `post_send` with `--post-send`, on both post paths; the header says which.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn perf_latency_tests_post_prepared_or_built_requests() {
    let cases: [(&str, &[&str], u64); 6] = [
        ("write_lat", &["--post", "legacy"], 2),
        ("send_lat", &["--post", "extended", "-s", "64"], 64),
        ("read_lat", &["--post", "legacy", "--post-send"], 2),
        ("atomic_lat", &["--post", "extended"], 8),
        ("write_lat", &["--post", "legacy", "--interleave", "20"], 2),
        ("send_lat", &["--post", "legacy", "--post-send"], 2),
    ];
    for (i, (test, extra, size)) in cases.into_iter().enumerate() {
        let mut args = vec!["-n", "200"];
        args.extend(extra);
        let out = perf_pair(test, &args, 18890 + i as u16);
        perf_row(&out, size, 200);
        let post = if extra.contains(&"--post-send") {
            " Post            : safe (rdma crate)"
        } else {
            " Post            : safe, prepared requests (rdma crate)"
        };
        assert!(
            !out.lines_starting(post).is_empty(),
            "{test} {extra:?}: the header names the path:\n{out}"
        );
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn perf_interleave_times_both_paths_in_one_run() {
    for (port, extra) in [(18870, None), (18871, Some("-I16"))] {
        let mut args = vec!["-n", "400", "--interleave", "25"];
        args.extend(extra);
        let out = perf_pair("write_lat", &args, port);
        perf_row(&out, 2, 400);
        let line = out
            .lines_starting(" interleaved:")
            .first()
            .copied()
            .unwrap_or_else(|| panic!("no interleaved line:\n{out}"))
            .to_string();
        // "... safe t_typical X usec (N gaps), raw t_typical Y usec (M gaps), safe/raw R"
        let nums: Vec<f64> = line
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter_map(|f| f.parse().ok())
            .collect();
        assert_eq!(nums.len(), 5, "{line}");
        let (safe, safe_gaps, raw, raw_gaps, ratio) = (nums[0], nums[1], nums[2], nums[3], nums[4]);
        // 400 stamps in blocks of 25: 8 blocks a path, 24 gaps inside each.
        assert_eq!((safe_gaps, raw_gaps), (192.0, 192.0), "{line}");
        assert!(
            safe > 0.0 && raw > 0.0 && (ratio - safe / raw).abs() < 0.01,
            "{line}"
        );
    }
}

/// `-U` prints every sample in the order taken and `-H` sorted, as
/// perftest does (`#, usec` and `N, value` lines after the header, then the
/// rule and the header again before the row); the sorted list is the
/// unsorted one sorted, and the row's t_min and t_typical come from the
/// same samples.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn perf_sample_reports_print_every_sample() {
    let out = perf_pair("write_lat", &["-n", "200", "-U", "-H"], 18872);
    let mut lines = out
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with(" #bytes"))
        .skip(1);
    let mut blocks: Vec<Vec<f64>> = Vec::new();
    let after = loop {
        let l = lines
            .next()
            .unwrap_or_else(|| panic!("no row after the samples:\n{out}"));
        if l == "#, usec" {
            blocks.push(Vec::new());
        } else if let Some((n, v)) = l.split_once(", ") {
            let block = blocks
                .last_mut()
                .unwrap_or_else(|| panic!("{l:?} before '#, usec':\n{out}"));
            assert_eq!(n.parse::<usize>().ok(), Some(block.len() + 1), "{l:?}");
            block.push(v.parse().unwrap_or_else(|_| panic!("{l:?}:\n{out}")));
        } else {
            break l;
        }
    };
    assert!(
        after.starts_with("-----"),
        "{after:?} after the samples:\n{out}"
    );
    assert!(
        lines.next().is_some_and(|l| l.starts_with(" #bytes")),
        "no header after the samples:\n{out}"
    );
    assert_eq!(blocks.len(), 2, "unsorted then sorted:\n{out}");
    // 200 stamps, 199 gaps.
    assert!(
        blocks.iter().all(|b| b.len() == 199),
        "{:?}",
        blocks.iter().map(Vec::len).collect::<Vec<_>>()
    );
    let mut sorted = blocks[0].clone();
    sorted.sort_by(f64::total_cmp);
    assert_eq!(sorted, blocks[1]);
    assert!(sorted[0] > 0.0, "{sorted:?}");
    let row: Vec<f64> = lines
        .next()
        .unwrap_or_else(|| panic!("no row:\n{out}"))
        .split_whitespace()
        .map(|f| f.parse().unwrap())
        .collect();
    // t_min is the smallest sample, t_typical the median of all but the
    // two largest: 197 samples, the 99th (printed with two decimals).
    assert!(
        (row[2] - sorted[0]).abs() < 0.006,
        "{row:?} vs {}",
        sorted[0]
    );
    assert!(
        (row[4] - sorted[98]).abs() < 0.006,
        "{row:?} vs {}",
        sorted[98]
    );
}
