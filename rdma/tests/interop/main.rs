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
//!
//! The tests live in the modules below, along what they test; each takes the
//! imports and helpers of this file with `use super::*`.

#[path = "../common/mod.rs"]
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

/// Starts `server` (a name and its command), waits until it listens on
/// `tcp_port`, starts `client`, given 127.0.0.1 as the server, and waits
/// for both; checks that both succeeded without a panic, each receiving
/// only the pattern the other sent. Both outputs, and the two together
/// (for messages).
fn run_both(
    tcp_port: u16,
    server: (String, &mut Command),
    client: (String, &mut Command),
) -> (Finished, Finished, String) {
    assert!(
        !listening(tcp_port),
        "TCP port {tcp_port} is already in use"
    );
    let server = Running::spawn(server.0, server.1);
    let server = wait_listening(server, tcp_port);
    let client = Running::spawn(client.0, client.1.arg("127.0.0.1"));
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
    (server, client, both)
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

/// A pingpong run's flags, the same on both sides: the device's, the TCP
/// port, `ITERS` iterations, then the run's own.
fn run_args(tcp_port: u16, flags: &[&str]) -> Vec<String> {
    let mut a = device_args();
    a.extend(["-p".into(), tcp_port.to_string()]);
    a.extend(["-n".into(), ITERS.to_string()]);
    a.extend(flags.iter().map(|s| s.to_string()));
    a
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

/// The same traffic on both sides, as their result lines say: `ITERS`
/// messages of `size` each way. Prints the rates of `example` run with
/// `flags`, each side with its output and the tool it was.
fn check_traffic(
    (server, server_tool): (&Finished, &str),
    (client, client_tool): (&Finished, &str),
    size: u64,
    both: &str,
    example: &str,
    flags: &[&str],
) {
    let (fs, fc) = (figures(server), figures(client));
    for f in [&fs, &fc] {
        assert_eq!(f.iters, ITERS, "{both}");
        assert_eq!(f.bytes, size * u64::from(ITERS) * 2, "{both}");
        assert!(f.mbit_per_sec > 0.0 && f.usec_per_iter > 0.0, "{both}");
    }
    eprintln!(
        "{example} {flags:?}: server {}: {:.2} Mbit/s, {:.2} usec/iter; client {}: {:.2} \
         Mbit/s, {:.2} usec/iter",
        server_tool,
        fs.mbit_per_sec,
        fs.usec_per_iter,
        client_tool,
        fc.mbit_per_sec,
        fc.usec_per_iter
    );
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
        run_args(self.tcp_port, self.flags)
    }

    /// Runs both sides and checks everything the C tools let us check.
    fn check(self) {
        let t = self.transport;
        let (server, client, both) = run_both(
            self.tcp_port,
            (
                format!("server {}", label(t, self.server)),
                command(t, self.server).args(self.args()),
            ),
            (
                format!("client {}", label(t, self.client)),
                command(t, self.client).args(self.args()),
            ),
        );

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

        check_traffic(
            (&server, &label(t, self.server)),
            (&client, &label(t, self.client)),
            self.size,
            &both,
            t.example(),
            self.flags,
        );
    }
}

use Side::{Rust, C};
use Transport::{Rc, Uc, Ud};

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

mod perf;
mod pingpong;
mod srq;
mod tool_errors;
