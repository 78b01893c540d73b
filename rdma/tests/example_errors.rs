//! The examples given what a user gets wrong: a device that does not exist,
//! an address that is not one, a server that is not there, a number out of
//! range. Each must exit with a failure status, by itself (no signal, no
//! panic, within a bound), saying what was wrong: the message names the bad
//! value, or for a missing server the cause (rejected, refused, timed out,
//! unreachable). The CM tools print their errors on stdout, as rdma-core's
//! do, so both streams are read.

mod common;

use common::example;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How a run ended.
struct Outcome {
    code: Option<i32>,
    stderr: String,
    stdout: String,
    took: Duration,
}

/// Runs the example with a bound; kills it after that (then `code` is `None`).
fn run(name: &str, args: &[&str], bound: Duration) -> Outcome {
    let start = Instant::now();
    let mut child = Command::new(example(name))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the example");
    let mut stderr = child.stderr.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break Some(st);
        }
        if start.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Outcome {
        code: status.and_then(|s| s.code()),
        stderr: err.join().unwrap(),
        stdout: out.join().unwrap(),
        took: start.elapsed(),
    }
}

/// One run: what the output must contain (any one of, case-insensitive).
struct Case {
    example: &'static str,
    args: Vec<String>,
    names: &'static [&'static str],
    /// The tool exits 0 after reporting the failure, as its C original does
    /// (`cmtime` reports each connection's error and returns 0).
    exits_zero: bool,
}

fn case(example: &'static str, args: &[&str], names: &'static [&'static str]) -> Case {
    Case {
        example,
        args: args.iter().map(|s| s.to_string()).collect(),
        names,
        exits_zero: false,
    }
}

/// The causes a connection to nobody may be reported with.
const NOBODY: &[&str] = &[
    "reject",
    "refused",
    "timed out",
    "unreachable",
    "no server",
    "ETIMEDOUT",
    "ECONNREFUSED",
];

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE) and the examples built"]
fn examples_name_what_was_wrong_and_exit_cleanly() {
    let dev = common::device_name();
    let ip = common::ip().to_string();
    // A port nobody listens on (RDMA CM and TCP alike).
    let port = "1";
    const BAD_IP: &str = "300.1.2.3";
    let bad_ip = BAD_IP;
    let cases = vec![
        // A device that does not exist.
        case("devinfo", &["-d", "nosuchdev0"], &["nosuchdev0"]),
        case("asyncwatch", &["-d", "nosuchdev0"], &["nosuchdev0"]),
        case("rc_pingpong", &["-d", "nosuchdev0"], &["nosuchdev0"]),
        case("uc_pingpong", &["-d", "nosuchdev0"], &["nosuchdev0"]),
        case("ud_pingpong", &["-d", "nosuchdev0"], &["nosuchdev0"]),
        case("srq_pingpong", &["-d", "nosuchdev0"], &["nosuchdev0"]),
        // A port the device does not have; a GID index past its table.
        case("rc_pingpong", &["-d", &dev, "-i", "9"], &["port 9", "9"]),
        case("rc_pingpong", &["-d", &dev, "-g", "5000"], &["5000"]),
        // An address that is not one.
        case("rping", &["-c", "-a", bad_ip], &[BAD_IP]),
        case("ucmatose", &["-s", bad_ip], &[BAD_IP]),
        case("udaddy", &["-s", bad_ip], &[BAD_IP]),
        case("cmtime", &["-s", bad_ip], &[BAD_IP]),
        case("rdma_client", &["-s", bad_ip], &[BAD_IP]),
        case("mckey", &["-m", bad_ip], &[BAD_IP]),
        case("rc_pingpong", &["-d", &dev, "-g", "1", bad_ip], &[BAD_IP]),
        // A unicast address where a multicast one is needed.
        case("mckey", &["-m", &ip], &["multicast"]),
        // Numbers out of range.
        case("rping", &["-c", "-a", &ip, "-p", "70000"], &["70000"]),
        case("rc_pingpong", &["-d", &dev, "-s", "-5"], &["-5"]),
        // Nobody there.
        case("rping", &["-c", "-a", &ip, "-p", port, "-C", "1"], NOBODY),
        case("ucmatose", &["-s", &ip, "-p", port], NOBODY),
        // udaddy's -p is the port space: its default port, with no server.
        case("udaddy", &["-s", &ip], NOBODY),
        Case {
            exits_zero: true,
            ..case("cmtime", &["-s", &ip, "-p", port, "-c", "1"], NOBODY)
        },
        case("rdma_client", &["-s", &ip, "-p", port], NOBODY),
        case(
            "rc_pingpong",
            &["-d", &dev, "-g", "1", "-p", port, &ip],
            NOBODY,
        ),
    ];
    let bound = Duration::from_secs(30);
    let mut bad = Vec::new();
    for c in &cases {
        let args: Vec<&str> = c.args.iter().map(String::as_str).collect();
        let o = run(c.example, &args, bound);
        let shown = format!("{} {}", c.example, c.args.join(" "));
        eprintln!(
            "{shown}: exit {:?} in {:.1?}\n  stderr: {}\n  stdout: {}",
            o.code,
            o.took,
            o.stderr.trim().replace('\n', "\n          "),
            o.stdout.trim().replace('\n', "\n          ")
        );
        let all = format!("{}\n{}", o.stderr, o.stdout).to_lowercase();
        let problem = if o.code.is_none() {
            Some(format!("killed after {bound:?} (or ended by a signal)"))
        } else if o.code == Some(0) && !c.exits_zero {
            Some("exit status 0".to_string())
        } else if o.code == Some(101) || all.contains("panicked") {
            Some("panicked".to_string())
        } else if all.trim().is_empty() {
            Some("nothing printed".to_string())
        } else if !c.names.iter().any(|n| all.contains(&n.to_lowercase())) {
            Some(format!("the message names none of {:?}", c.names))
        } else {
            None
        };
        if let Some(p) = problem {
            bad.push(format!(
                "{shown}: {p}\n  stderr: {}\n  stdout: {}",
                o.stderr.trim(),
                o.stdout.trim()
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} cases:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n")
    );
}

/// `rc_pingpong -j` (device memory) on a device without any (`max_dm_size`
/// 0: soft-RoCE, soft-iWARP) refuses while setting up, with
/// `ibv_rc_pingpong`'s message and the cause: the device and its
/// `max_dm_size`. It runs as a server, so a port that went on would print
/// its address and wait for a client until killed; it must print no
/// address and exit with a failure by itself. `-j` with `-o` is refused
/// before the device is opened, as the C tool refuses it.
fn dm_is_refused_naming_the_cause(dev: &str) {
    let ctx = common::open(dev);
    assert_eq!(
        ctx.query_device().unwrap().max_dm_size(),
        0,
        "{dev} has device memory: this test is for a device without"
    );
    drop(ctx);
    let bound = Duration::from_secs(30);
    for (args, says) in [
        (
            &["-d", dev, "-j", "-p", "18796"][..],
            &["Device doesn't support dm allocation", "max_dm_size 0", dev][..],
        ),
        (
            &["-d", dev, "-j", "-o", "-p", "18796"],
            &["DM memory region can't be on demand"],
        ),
    ] {
        let o = run("rc_pingpong", args, bound);
        let shown = format!("rc_pingpong {}", args.join(" "));
        assert!(o.code.is_some(), "{shown}: killed after {bound:?}");
        assert!(
            o.code != Some(0) && o.code != Some(101) && !o.stderr.contains("panicked"),
            "{shown}: exit {:?}, stderr {:?}",
            o.code,
            o.stderr
        );
        for s in says {
            assert!(o.stderr.contains(s), "{shown}: {s:?} not in {:?}", o.stderr);
        }
        assert!(
            !o.stdout.contains("local address"),
            "{shown}: got as far as the handshake: {:?}",
            o.stdout
        );
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE) and the examples built"]
fn rc_pingpong_dm_is_refused_naming_the_cause() {
    dm_is_refused_naming_the_cause(&common::device_name());
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE) and the examples built"]
fn iwarp_rc_pingpong_dm_is_refused_naming_the_cause() {
    dm_is_refused_naming_the_cause(&common::iwarp_device_name());
}
