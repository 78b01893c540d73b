//! The pingpong examples against their rdma-core twins (`ibv_rc_pingpong`,
//! `ibv_uc_pingpong`, `ibv_ud_pingpong`): each Rust example as the server
//! with the C tool as the client, the other way round, and against itself.
//!
//! Both processes run on this machine: the server listens on a TCP port of
//! its own per test, the client connects to 127.0.0.1, and the RDMA traffic
//! goes over the test device (`RDMA_TEST_DEVICE`, GID `RDMA_TEST_GID_INDEX`).
//! The C tools are the oracle: the handshake each side decodes must be what
//! the other side printed as its own address, both must finish the same
//! number of iterations and print the same result lines, and with `-c` the
//! data each received must be the pattern the other sent.
//!
//! The example binaries come from the same `cargo` build as this test
//! (`target/<profile>/examples`): `cargo build --examples` first.

mod common;

use common::example;

use std::io::Read;

use common::Finished;
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a server may take to start listening (device setup under TCG).
const LISTEN_DEADLINE: Duration = Duration::from_secs(30);
/// How long a whole run may take; ci/device-tests kills a test at 120 s.
const RUN_DEADLINE: Duration = Duration::from_secs(60);
/// Iterations per run: a few seconds under emulation.
const ITERS: u32 = 50;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Rust,
    C,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Rc,
    Uc,
    Ud,
}

impl Transport {
    fn example(self) -> &'static str {
        match self {
            Transport::Rc => "rc_pingpong",
            Transport::Uc => "uc_pingpong",
            Transport::Ud => "ud_pingpong",
        }
    }

    fn c_tool(self) -> &'static str {
        match self {
            Transport::Rc => "ibv_rc_pingpong",
            Transport::Uc => "ibv_uc_pingpong",
            Transport::Ud => "ibv_ud_pingpong",
        }
    }

    /// The message size both implementations default to.
    fn default_size(self) -> u64 {
        match self {
            Transport::Rc | Transport::Uc => 4096,
            Transport::Ud => 1024,
        }
    }
}

fn command(t: Transport, side: Side) -> Command {
    match side {
        Side::Rust => Command::new(example(t.example())),
        Side::C => Command::new(t.c_tool()),
    }
}

fn label(t: Transport, side: Side) -> String {
    match side {
        Side::Rust => t.example().to_string(),
        Side::C => t.c_tool().to_string(),
    }
}

// ---------------------------------------------------------------------------
// Processes

/// A child whose output is collected by two threads; killed if dropped
/// while still running (a failed assertion never leaves a process behind).
struct Running {
    name: String,
    child: Child,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

fn collect(pipe: Option<impl Read + Send + 'static>) -> Option<JoinHandle<String>> {
    pipe.map(|mut p| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = p.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    })
}

impl Running {
    fn spawn(name: String, cmd: &mut Command) -> Running {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start {name} ({cmd:?}): {e} (is ibverbs-utils installed?)")
            });
        let stdout = collect(child.stdout.take());
        let stderr = collect(child.stderr.take());
        Running {
            name,
            child,
            stdout,
            stderr,
        }
    }

    fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Kills the process if it still runs, then gathers its output.
    fn finish(mut self) -> Finished {
        let status = match self.child.try_wait() {
            Ok(Some(s)) => Some(s),
            _ => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                None
            }
        };
        let join = |h: Option<JoinHandle<String>>| {
            h.map(|h| h.join().unwrap_or_default()).unwrap_or_default()
        };
        Finished {
            name: self.name.clone(),
            status,
            stdout: join(self.stdout.take()),
            stderr: join(self.stderr.take()),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Whether something listens on TCP `port` (IPv4 or IPv6), from
/// `/proc/net/tcp{,6}`: state `0A` is LISTEN.
fn listening(port: u16) -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|file| {
        std::fs::read_to_string(file).is_ok_and(|table| {
            table.lines().skip(1).any(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                f.len() > 3
                    && f[3] == "0A"
                    && f[1]
                        .rsplit(':')
                        .next()
                        .and_then(|p| u16::from_str_radix(p, 16).ok())
                        == Some(port)
            })
        })
    })
}

/// Polls until the server listens on `port`; fails with its output if it
/// exits first or takes longer than [`LISTEN_DEADLINE`].
fn wait_listening(server: Running, port: u16) -> Running {
    let deadline = Instant::now() + LISTEN_DEADLINE;
    let mut server = server;
    loop {
        if listening(port) {
            return server;
        }
        if server.exited() {
            panic!(
                "the server exited before listening on port {port}:\n{}",
                server.finish()
            );
        }
        if Instant::now() > deadline {
            panic!(
                "the server did not listen on port {port} within {LISTEN_DEADLINE:?}:\n{}",
                server.finish()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for both processes, killing both when [`RUN_DEADLINE`] passes.
fn wait_both(mut a: Running, mut b: Running) -> (Finished, Finished) {
    let deadline = Instant::now() + RUN_DEADLINE;
    while !(a.exited() && b.exited()) {
        if Instant::now() > deadline {
            let (a, b) = (a.finish(), b.finish());
            panic!("no result within {RUN_DEADLINE:?}; both killed:\n{a}{b}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    (a.finish(), b.finish())
}

fn device_args() -> Vec<String> {
    vec![
        "-d".into(),
        common::device_name(),
        "-g".into(),
        common::gid_index().to_string(),
    ]
}

// ---------------------------------------------------------------------------
// Output

/// The figures of the two result lines.
#[derive(Debug)]
struct Figures {
    bytes: u64,
    iters: u32,
    mbit_per_sec: f64,
    usec_per_iter: f64,
}

/// `"%.2f"`: digits, a point, exactly two digits.
fn two_decimals(s: &str) -> Option<f64> {
    let (whole, frac) = s.split_once('.')?;
    (!whole.is_empty() && frac.len() == 2 && s.bytes().all(|b| b.is_ascii_digit() || b == b'.'))
        .then(|| s.parse().ok())
        .flatten()
}

/// Parses `N bytes in S seconds = M Mbit/sec` and `N iters in S seconds = U
/// usec/iter`, in the C tools' exact shape.
fn figures(out: &Finished) -> Figures {
    let line = |unit: &str, rate: &str| -> (u64, f64) {
        let words = out
            .stdout
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|w| w.len() == 8 && w[1] == unit)
            .unwrap_or_else(|| panic!("no \"N {unit} in ...\" line:\n{out}"));
        let n = words[0].parse().ok();
        let secs = two_decimals(words[3]);
        let value = two_decimals(words[6]);
        match (n, secs, value) {
            (Some(n), Some(_), Some(v))
                if words[2] == "in"
                    && words[4] == "seconds"
                    && words[5] == "="
                    && words[7] == rate =>
            {
                (n, v)
            }
            _ => panic!("malformed result line {words:?}:\n{out}"),
        }
    };
    let (bytes, mbit_per_sec) = line("bytes", "Mbit/sec");
    let (iters, usec_per_iter) = line("iters", "usec/iter");
    Figures {
        bytes,
        iters: u32::try_from(iters).expect("iteration count fits u32"),
        mbit_per_sec,
        usec_per_iter,
    }
}

/// One `local address:` / `remote address:` line.
#[derive(Debug, PartialEq, Eq)]
struct Address {
    lid: u32,
    qpn: u32,
    psn: u32,
    gid: String,
}

fn address(out: &Finished, which: &str) -> Address {
    let line = out
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with(which))
        .unwrap_or_else(|| panic!("no {which:?} line:\n{out}"));
    parse_address(line, out)
}

/// The LID, QPN, PSN and GID of one address line of `out`.
fn parse_address(line: &str, out: &Finished) -> Address {
    let hex = |key: &str| -> u32 {
        line.split_once(key)
            .and_then(|(_, rest)| {
                let digits: String = rest.chars().take_while(char::is_ascii_hexdigit).collect();
                u32::from_str_radix(&digits, 16).ok()
            })
            .unwrap_or_else(|| panic!("no {key:?} in {line:?}:\n{out}"))
    };
    Address {
        lid: hex("LID 0x"),
        qpn: hex("QPN 0x"),
        psn: hex("PSN 0x"),
        gid: line
            .split_once("GID ")
            .map(|(_, g)| g.trim().to_string())
            .unwrap_or_else(|| panic!("no GID in {line:?}:\n{out}")),
    }
}

// ---------------------------------------------------------------------------
// Runs

/// One ping-pong run: `server` and `client` with the same flags.
struct Run {
    transport: Transport,
    server: Side,
    client: Side,
    tcp_port: u16,
    /// Flags both sides get besides device, GID, port and iterations.
    flags: &'static [&'static str],
    /// The `-s` in `flags`, or the default.
    size: u64,
}

impl Run {
    fn new(transport: Transport, server: Side, client: Side, tcp_port: u16) -> Run {
        Run {
            transport,
            server,
            client,
            tcp_port,
            flags: &[],
            size: transport.default_size(),
        }
    }

    fn flags(mut self, flags: &'static [&'static str]) -> Run {
        self.flags = flags;
        if let Some(i) = flags.iter().position(|&f| f == "-s") {
            self.size = flags[i + 1].parse().expect("-s takes a number");
        }
        self
    }

    fn args(&self) -> Vec<String> {
        let mut a = device_args();
        a.extend(["-p".into(), self.tcp_port.to_string()]);
        a.extend(["-n".into(), ITERS.to_string()]);
        a.extend(self.flags.iter().map(|s| s.to_string()));
        a
    }

    /// Runs both sides and checks everything the C tools let us check.
    fn check(self) {
        let t = self.transport;
        assert!(
            !listening(self.tcp_port),
            "TCP port {} is already in use",
            self.tcp_port
        );
        let server = Running::spawn(
            format!("server {}", label(t, self.server)),
            command(t, self.server).args(self.args()),
        );
        let server = wait_listening(server, self.tcp_port);
        let client = Running::spawn(
            format!("client {}", label(t, self.client)),
            command(t, self.client).args(self.args()).arg("127.0.0.1"),
        );
        let (server, client) = wait_both(server, client);
        let both = format!("{server}{client}");

        for side in [&server, &client] {
            assert!(side.success(), "{} failed:\n{both}", side.name);
            assert!(!side.stderr.contains("panicked"), "{both}");
            assert!(
                !side.stdout.contains("invalid data"),
                "{} received data other than the pattern sent:\n{both}",
                side.name
            );
        }

        // The handshake: what each side decoded is what the other encoded.
        let (server_local, server_remote) = (
            address(&server, "local address:"),
            address(&server, "remote address:"),
        );
        let (client_local, client_remote) = (
            address(&client, "local address:"),
            address(&client, "remote address:"),
        );
        assert_eq!(server_remote, client_local, "{both}");
        assert_eq!(client_remote, server_local, "{both}");
        // Both sides use the IPv4-mapped RoCE v2 GID of the test IP.
        let gid = format!("::ffff:{}", common::ip());
        assert_eq!(server_local.gid, gid, "{both}");
        assert_eq!(client_local.gid, gid, "{both}");
        assert_ne!(server_local.qpn, client_local.qpn, "{both}");

        // The same traffic on both sides: ITERS messages of `size` each way.
        let (fs, fc) = (figures(&server), figures(&client));
        for f in [&fs, &fc] {
            assert_eq!(f.iters, ITERS, "{both}");
            assert_eq!(f.bytes, self.size * u64::from(ITERS) * 2, "{both}");
            assert!(f.mbit_per_sec > 0.0 && f.usec_per_iter > 0.0, "{both}");
        }
        eprintln!(
            "{} {:?}: server {}: {:.2} Mbit/s, {:.2} usec/iter; client {}: {:.2} Mbit/s, \
             {:.2} usec/iter",
            t.example(),
            self.flags,
            label(t, self.server),
            fs.mbit_per_sec,
            fs.usec_per_iter,
            label(t, self.client),
            fc.mbit_per_sec,
            fc.usec_per_iter
        );
    }
}

use Side::{Rust, C};
use Transport::{Rc, Uc, Ud};

// RC

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rc_rust_server_c_client() {
    Run::new(Rc, Rust, C, 18701).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rc_c_server_rust_client() {
    Run::new(Rc, C, Rust, 18702).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rc_rust_server_rust_client() {
    Run::new(Rc, Rust, Rust, 18703).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rc_chk_rust_server_c_client() {
    Run::new(Rc, Rust, C, 18704).flags(&["-c"]).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rc_chk_c_server_rust_client() {
    Run::new(Rc, C, Rust, 18705).flags(&["-c"]).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rc_events_rust_server_c_client() {
    Run::new(Rc, Rust, C, 18706).flags(&["-e"]).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rc_events_c_server_rust_client() {
    Run::new(Rc, C, Rust, 18707).flags(&["-e"]).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rc_events_chk_rust_server_rust_client() {
    Run::new(Rc, Rust, Rust, 18708)
        .flags(&["-e", "-c", "-s", "3000", "-r", "8"])
        .check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rc_new_send_rust_server_c_client() {
    Run::new(Rc, Rust, C, 18709).flags(&["-N", "-c"]).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rc_new_send_c_server_rust_client() {
    Run::new(Rc, C, Rust, 18710).flags(&["-N", "-c"]).check();
}

// UC

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn uc_rust_server_c_client() {
    Run::new(Uc, Rust, C, 18711).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn uc_c_server_rust_client() {
    Run::new(Uc, C, Rust, 18712).flags(&["-c"]).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn uc_rust_server_rust_client() {
    Run::new(Uc, Rust, Rust, 18713).flags(&["-e", "-c"]).check();
}

// UD: one message is one packet, so the size must fit the active MTU.

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn ud_rust_server_c_client() {
    Run::new(Ud, Rust, C, 18721)
        .flags(&["-s", "1024", "-c"])
        .check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn ud_c_server_rust_client() {
    Run::new(Ud, C, Rust, 18722)
        .flags(&["-s", "1024", "-c"])
        .check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn ud_rust_server_rust_client() {
    Run::new(Ud, Rust, Rust, 18723)
        .flags(&["-s", "1024", "-e", "-c"])
        .check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn ud_c_server_rust_client_default_size() {
    Run::new(Ud, C, Rust, 18724).check();
}

// Failures: a clear message and exit status 1, never a panic.

/// Runs a command that must fail, returning its stderr.
fn fails(name: &str, cmd: &mut Command) -> String {
    let out = Running::spawn(name.to_string(), cmd);
    let deadline = Instant::now() + RUN_DEADLINE;
    let mut out = out;
    while !out.exited() {
        assert!(Instant::now() < deadline, "{name} hangs:\n{}", out.finish());
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = out.finish();
    assert_eq!(
        out.status.and_then(|s| s.code()),
        Some(1),
        "{name} must exit 1:\n{out}"
    );
    assert!(!out.stderr.contains("panicked"), "{out}");
    out.stderr
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn bad_flags_print_usage_and_exit_1() {
    for t in [Rc, Uc, Ud] {
        for bad in [
            &["--bogus"][..],
            &["-x"],
            &["-n"],
            &["-m", "1000"],
            &["a", "b"],
        ] {
            if t == Ud && bad[0] == "-m" {
                continue; // UD has no -m: covered by "-x"
            }
            let err = fails(t.example(), Command::new(example(t.example())).args(bad));
            assert!(err.contains("Usage:"), "{bad:?}: {err}");
        }
        // The C tool rejects the same flags.
        let out = Command::new(t.c_tool())
            .arg("--bogus")
            .output()
            .expect("the C tool runs");
        assert_eq!(out.status.code(), Some(1), "{} --bogus", t.c_tool());
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn bad_device_or_port_fails_cleanly() {
    for t in [Rc, Uc, Ud] {
        let err = fails(
            t.example(),
            Command::new(example(t.example())).args(["-d", "no_such_dev0"]),
        );
        assert!(err.contains("no_such_dev0"), "{err}");
        let err = fails(
            t.example(),
            Command::new(example(t.example())).args(["-d", &common::device_name(), "-i", "7"]),
        );
        assert!(err.contains("port 7"), "{err}");
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn unreachable_server_fails_cleanly() {
    let port = 18790;
    assert!(!listening(port), "TCP port {port} is in use");
    for t in [Rc, Uc, Ud] {
        let mut args = device_args();
        args.extend(["-p".into(), port.to_string(), "127.0.0.1".into()]);
        let err = fails(t.example(), Command::new(example(t.example())).args(&args));
        assert!(err.contains("Couldn't connect to 127.0.0.1:18790"), "{err}");
        // The C tool gives up the same way.
        let out = Command::new(t.c_tool())
            .args(&args)
            .output()
            .expect("the C tool runs");
        assert!(!out.status.success(), "{} reached nobody", t.c_tool());
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn ud_size_above_the_mtu_is_refused_like_the_c_tool() {
    let mut args = device_args();
    args.extend(["-s".into(), "8192".into(), "-p".into(), "18791".into()]);
    let err = fails(
        "ud_pingpong",
        Command::new(example("ud_pingpong")).args(&args),
    );
    assert!(err.contains("larger than port MTU"), "{err}");
    let out = Command::new("ibv_ud_pingpong")
        .args(&args)
        .output()
        .expect("ibv_ud_pingpong runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("larger than port MTU"));
}

/// `-t` (timestamps), `-o` (on-demand paging) and `-j` (device memory)
/// depend on the device: the Rust example must refuse them exactly when the
/// C tool does (soft-RoCE and soft-iWARP have no device memory, so `-j` is
/// refused there, with the C tool's message). All run as clients of a port
/// nobody listens on, so a capable device fails at the handshake instead.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rc_ts_odp_and_dm_follow_the_device_like_the_c_tool() {
    let port = 18792;
    assert!(!listening(port), "TCP port {port} is in use");
    for (flag, c_says, rust_says) in [
        ("-t", "timestamp", "timestamp"),
        ("-o", "ODP", "on-demand paging"),
        (
            "-j",
            "dm allocation",
            "Device doesn't support dm allocation",
        ),
    ] {
        let mut args = device_args();
        args.extend([
            flag.into(),
            "-p".into(),
            port.to_string(),
            "127.0.0.1".into(),
        ]);
        let c = Command::new("ibv_rc_pingpong")
            .args(&args)
            .output()
            .expect("ibv_rc_pingpong runs");
        assert!(!c.status.success());
        let c_refused = String::from_utf8_lossy(&c.stderr).contains(c_says);
        let err = fails(
            "rc_pingpong",
            Command::new(example("rc_pingpong")).args(&args),
        );
        assert_eq!(
            err.contains(rust_says),
            c_refused,
            "{flag}: ibv_rc_pingpong said {:?}, rc_pingpong said {err:?}",
            String::from_utf8_lossy(&c.stderr)
        );
        eprintln!(
            "{flag}: {}",
            if c_refused {
                "the device lacks it; both refuse"
            } else {
                "supported"
            }
        );
    }
}

/// On RoCE every address is a GID: a side given `-g` facing a peer without
/// one must say so, whichever side the Rust example is.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn roce_peer_without_gid_is_refused_clearly() {
    let dev = common::device_name();
    let gid = common::gid_index().to_string();
    // Rust server with -g, C client without: the server refuses the address.
    let port = "18793";
    let server = Running::spawn(
        "server rc_pingpong".into(),
        Command::new(example("rc_pingpong")).args(["-d", &dev, "-g", &gid, "-p", port]),
    );
    let server = wait_listening(server, 18793);
    let client = Running::spawn(
        "client ibv_rc_pingpong".into(),
        Command::new("ibv_rc_pingpong").args(["-d", &dev, "-p", port, "127.0.0.1"]),
    );
    let (server, client) = wait_both(server, client);
    assert_eq!(server.status.and_then(|s| s.code()), Some(1), "{server}");
    assert!(server.stderr.contains("run both sides with -g"), "{server}");
    assert!(!client.success(), "{client}");

    // C server with -g, Rust client without: the C server cannot reach a
    // GID-less address on RoCE and hangs up; the client says what happened.
    let port = "18794";
    let server = Running::spawn(
        "server ibv_rc_pingpong".into(),
        Command::new("ibv_rc_pingpong").args(["-d", &dev, "-g", &gid, "-p", port]),
    );
    let server = wait_listening(server, 18794);
    let client = Running::spawn(
        "client rc_pingpong".into(),
        Command::new(example("rc_pingpong")).args(["-d", &dev, "-p", port, "127.0.0.1"]),
    );
    let (server, client) = wait_both(server, client);
    assert!(!server.success(), "{server}");
    assert_eq!(client.status.and_then(|s| s.code()), Some(1), "{client}");
    assert!(
        client.stderr.contains("the peer closed the connection"),
        "{client}"
    );
    assert!(!client.stderr.contains("panicked"), "{client}");
}

// ---------------------------------------------------------------------------
// SRQ: srq_pingpong against ibv_srq_pingpong. Several RC QPs share one SRQ;
// the handshake carries one address per QP (256 messages each way, the
// unused ones all zero), and every side prints one address line per QP.

const SRQ_EXAMPLE: &str = "srq_pingpong";
const SRQ_TOOL: &str = "ibv_srq_pingpong";
/// `-q` of both tools when not given.
const SRQ_DEFAULT_QPS: usize = 16;

fn srq_command(side: Side) -> Command {
    match side {
        Side::Rust => Command::new(example(SRQ_EXAMPLE)),
        Side::C => Command::new(SRQ_TOOL),
    }
}

fn srq_label(side: Side) -> &'static str {
    match side {
        Side::Rust => SRQ_EXAMPLE,
        Side::C => SRQ_TOOL,
    }
}

/// Every `which` line (`local address:` / `remote address:`), in order.
fn srq_addresses(out: &Finished, which: &str) -> Vec<Address> {
    out.stdout
        .lines()
        .filter(|l| l.trim_start().starts_with(which))
        .map(|line| parse_address(line, out))
        .collect()
}

/// One srq_pingpong run: `server` and `client` with the same flags.
struct SrqRun {
    server: Side,
    client: Side,
    tcp_port: u16,
    flags: &'static [&'static str],
    size: u64,
    qps: usize,
}

impl SrqRun {
    fn new(server: Side, client: Side, tcp_port: u16) -> SrqRun {
        SrqRun {
            server,
            client,
            tcp_port,
            flags: &[],
            size: 4096,
            qps: SRQ_DEFAULT_QPS,
        }
    }

    fn flags(mut self, flags: &'static [&'static str]) -> SrqRun {
        self.flags = flags;
        let value = |flag: &str| {
            flags
                .iter()
                .position(|&f| f == flag)
                .map(|i| flags[i + 1].parse::<u64>().expect("a number"))
        };
        self.size = value("-s").unwrap_or(self.size);
        self.qps = value("-q").map_or(self.qps, |q| q as usize);
        self
    }

    fn args(&self) -> Vec<String> {
        let mut a = device_args();
        a.extend(["-p".into(), self.tcp_port.to_string()]);
        a.extend(["-n".into(), ITERS.to_string()]);
        a.extend(self.flags.iter().map(|s| s.to_string()));
        a
    }

    fn check(self) {
        assert!(
            !listening(self.tcp_port),
            "TCP port {} is already in use",
            self.tcp_port
        );
        let server = Running::spawn(
            format!("server {}", srq_label(self.server)),
            srq_command(self.server).args(self.args()),
        );
        let server = wait_listening(server, self.tcp_port);
        let client = Running::spawn(
            format!("client {}", srq_label(self.client)),
            srq_command(self.client).args(self.args()).arg("127.0.0.1"),
        );
        let (server, client) = wait_both(server, client);
        let both = format!("{server}{client}");

        for side in [&server, &client] {
            assert!(side.success(), "{} failed:\n{both}", side.name);
            assert!(!side.stderr.contains("panicked"), "{both}");
            assert!(
                !side.stdout.contains("invalid data"),
                "{} received data other than the pattern sent:\n{both}",
                side.name
            );
        }

        // The handshake: one address per QP each way, in order, and what
        // each side decoded is what the other encoded.
        let server_local = srq_addresses(&server, "local address:");
        let server_remote = srq_addresses(&server, "remote address:");
        let client_local = srq_addresses(&client, "local address:");
        let client_remote = srq_addresses(&client, "remote address:");
        for list in [&server_local, &server_remote, &client_local, &client_remote] {
            assert_eq!(list.len(), self.qps, "one address line per QP:\n{both}");
        }
        assert_eq!(server_remote, client_local, "{both}");
        assert_eq!(client_remote, server_local, "{both}");
        let gid = format!("::ffff:{}", common::ip());
        for a in server_local.iter().chain(&client_local) {
            assert_eq!(a.gid, gid, "{both}");
            assert!(a.qpn != 0 && a.psn <= 0xff_ffff, "{a:?}:\n{both}");
        }
        let mut qpns: Vec<u32> = server_local
            .iter()
            .chain(&client_local)
            .map(|a| a.qpn)
            .collect();
        qpns.sort_unstable();
        qpns.dedup();
        assert_eq!(qpns.len(), 2 * self.qps, "every QP is its own:\n{both}");

        // ITERS messages of `size` each way, over all QPs together.
        let (fs, fc) = (figures(&server), figures(&client));
        for f in [&fs, &fc] {
            assert_eq!(f.iters, ITERS, "{both}");
            assert_eq!(f.bytes, self.size * u64::from(ITERS) * 2, "{both}");
            assert!(f.mbit_per_sec > 0.0 && f.usec_per_iter > 0.0, "{both}");
        }
        eprintln!(
            "srq_pingpong {:?}: server {}: {:.2} Mbit/s, {:.2} usec/iter; client {}: {:.2} \
             Mbit/s, {:.2} usec/iter",
            self.flags,
            srq_label(self.server),
            fs.mbit_per_sec,
            fs.usec_per_iter,
            srq_label(self.client),
            fc.mbit_per_sec,
            fc.usec_per_iter
        );
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn srq_rust_server_c_client() {
    SrqRun::new(Rust, C, 18731).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn srq_c_server_rust_client() {
    SrqRun::new(C, Rust, 18732).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn srq_rust_server_rust_client() {
    SrqRun::new(Rust, Rust, 18733).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn srq_chk_rust_server_c_client() {
    SrqRun::new(Rust, C, 18734)
        .flags(&["-c", "-q", "3", "-m", "512"])
        .check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn srq_events_chk_c_server_rust_client() {
    SrqRun::new(C, Rust, 18735)
        .flags(&["-e", "-c", "-q", "5", "-s", "3000"])
        .check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn srq_events_rust_server_c_client() {
    SrqRun::new(Rust, C, 18736)
        .flags(&["-e", "-q", "2"])
        .check();
}

/// Fewer receives than QPs keeps refilling the SRQ (it is refilled when no
/// more than -q receives are left): -r 4 with 4 QPs refills on every receive.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn srq_events_chk_small_rx_depth_rust_server_rust_client() {
    SrqRun::new(Rust, Rust, 18737)
        .flags(&["-e", "-c", "-q", "4", "-r", "4", "-s", "100"])
        .check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn srq_bad_flags_fail_cleanly_like_the_c_tool() {
    for bad in [
        &["--bogus"][..],
        &["-x"],
        &["-q"],
        &["-q", "0"],
        &["-q", "256"],
        &["-m", "1000"],
        &["-t"],
        &["a", "b"],
    ] {
        let err = fails(SRQ_EXAMPLE, Command::new(example(SRQ_EXAMPLE)).args(bad));
        assert!(err.contains("Usage:"), "{bad:?}: {err}");
    }
    // Fewer receives than QPs: both tools refuse, saying so.
    let args = ["-q", "20", "-r", "10"];
    let err = fails(SRQ_EXAMPLE, Command::new(example(SRQ_EXAMPLE)).args(args));
    assert!(err.contains("rx_depth 10 is too small for 20 QPs"), "{err}");
    let out = Command::new(SRQ_TOOL)
        .args(args)
        .output()
        .expect("ibv_srq_pingpong runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("rx_depth 10 is too small for 20 QPs"),
        "{out:?}"
    );
    let out = Command::new(SRQ_TOOL)
        .arg("--bogus")
        .output()
        .expect("ibv_srq_pingpong runs");
    assert_eq!(out.status.code(), Some(1));
    // A device or port that does not exist.
    let err = fails(
        SRQ_EXAMPLE,
        Command::new(example(SRQ_EXAMPLE)).args(["-d", "no_such_dev0"]),
    );
    assert!(err.contains("no_such_dev0"), "{err}");
    let err = fails(
        SRQ_EXAMPLE,
        Command::new(example(SRQ_EXAMPLE)).args(["-d", &common::device_name(), "-i", "7"]),
    );
    assert!(err.contains("port 7"), "{err}");
}

/// Both sides must use the same -q. The Rust side notices a peer with a
/// different number of QPs in the handshake and says so.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn srq_num_qp_mismatch_is_refused_clearly() {
    let dev = common::device_name();
    let gid = common::gid_index().to_string();
    // Rust server -q 2, Rust client -q 3: the server refuses the client's
    // addresses and hangs up; the client says the peer closed the connection.
    let port = 18738;
    let server = Running::spawn(
        "server srq_pingpong".into(),
        Command::new(example(SRQ_EXAMPLE)).args([
            "-d",
            &dev,
            "-g",
            &gid,
            "-q",
            "2",
            "-p",
            &port.to_string(),
        ]),
    );
    let server = wait_listening(server, port);
    let client = Running::spawn(
        "client srq_pingpong".into(),
        Command::new(example(SRQ_EXAMPLE)).args([
            "-d",
            &dev,
            "-g",
            &gid,
            "-q",
            "3",
            "-p",
            &port.to_string(),
            "127.0.0.1",
        ]),
    );
    let (server, client) = wait_both(server, client);
    assert_eq!(server.status.and_then(|s| s.code()), Some(1), "{server}");
    assert!(
        server
            .stderr
            .contains("the peer has 3 QPs and this side 2: give both sides the same -q"),
        "{server}"
    );
    assert_eq!(client.status.and_then(|s| s.code()), Some(1), "{client}");
    assert!(
        client.stderr.contains("the peer closed the connection"),
        "{client}"
    );
    for side in [&server, &client] {
        assert!(!side.stderr.contains("panicked"), "{side}");
    }

    // C server -q 2, Rust client -q 3: the client refuses the server's
    // addresses. (The C server then waits for traffic that never comes, and
    // is killed.)
    let port = 18739;
    let server = Running::spawn(
        "server ibv_srq_pingpong".into(),
        Command::new(SRQ_TOOL).args(["-d", &dev, "-g", &gid, "-q", "2", "-p", &port.to_string()]),
    );
    let server = wait_listening(server, port);
    let client = fails(
        "client srq_pingpong",
        Command::new(example(SRQ_EXAMPLE)).args([
            "-d",
            &dev,
            "-g",
            &gid,
            "-q",
            "3",
            "-p",
            &port.to_string(),
            "127.0.0.1",
        ]),
    );
    drop(server.finish());
    assert!(
        client.contains("the peer has 2 QPs and this side 3: give both sides the same -q"),
        "{client}"
    );
}

/// `-o` (on-demand paging) depends on the device: the Rust example must
/// refuse it exactly when the C tool does. Both run as clients of a port
/// nobody listens on, so a capable device fails at the handshake instead.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn srq_odp_follows_the_device_like_the_c_tool() {
    let port = 18740;
    assert!(!listening(port), "TCP port {port} is in use");
    let mut args = device_args();
    args.extend([
        "-o".into(),
        "-p".into(),
        port.to_string(),
        "127.0.0.1".into(),
    ]);
    let c = Command::new(SRQ_TOOL)
        .args(&args)
        .output()
        .expect("ibv_srq_pingpong runs");
    assert!(!c.status.success());
    let c_refused = String::from_utf8_lossy(&c.stderr).contains("ODP");
    let err = fails(SRQ_EXAMPLE, Command::new(example(SRQ_EXAMPLE)).args(&args));
    assert_eq!(
        err.contains("on-demand paging"),
        c_refused,
        "ibv_srq_pingpong said {:?}, srq_pingpong said {err:?}",
        String::from_utf8_lossy(&c.stderr)
    );
    eprintln!(
        "-o: {}",
        if c_refused {
            "the device lacks it; both refuse"
        } else {
            "supported"
        }
    );
}

// ---------------------------------------------------------------------------
// perf: the benchmark example against itself (its wire protocol is its own),
// every test with few iterations, checking the table it prints.

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
