//! The connection manager examples against their rdma-core twins: `rping`,
//! `rdma_server`/`rdma_client`, `udaddy`, `mckey`, `ucmatose` and `cmtime`,
//! each pair run with the Rust example as the server and the C tool as the
//! client, the other way round, and Rust against Rust.
//!
//! Both processes run on this machine against the test device's address
//! (`RDMA_TEST_IP` on rxe0; the `iwarp` tests use `RDMA_TEST_IWARP_IP`, which
//! librdmacm maps to siw0). The C tools are the oracle: what the Rust side
//! prints and checks must be what the C tool prints and checks (rping's ping
//! lines, validated with `-V`; the tools' `return status 0` / `end 0`).
//!
//! A server is ready when its listening id shows in `rdma resource show
//! cm_id` (rdma_cm listeners are not sockets); a multicast receiver when it
//! prints that it joined. Every process runs under a deadline: on timeout
//! both are killed and the test fails with their output.
//!
//! The example binaries come from the same `cargo` build as this test
//! (`target/<profile>/examples`): `cargo build --examples` first.

mod common;

use common::example;

use std::io::{BufRead, BufReader, Read};

use common::Finished;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a server may take to start listening (device setup under TCG).
const READY_DEADLINE: Duration = Duration::from_secs(30);
/// How long a whole run may take; ci/device-tests kills a test at 120 s.
const RUN_DEADLINE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Rust,
    C,
}

fn roce_ip() -> String {
    common::ip().to_string()
}

fn iwarp_ip() -> String {
    std::env::var("RDMA_TEST_IWARP_IP")
        .expect("RDMA_TEST_IWARP_IP is not set: run in the VM (ci/vm run ...)")
}

/// The command for `tool` on `side`: the example, or the rdma-core tool of
/// the same name. The C tools run under `stdbuf -oL`: their stdout is a pipe
/// here, which C buffers fully, and readiness lines must arrive when printed.
fn command(tool: &str, side: Side, args: &[&str]) -> Command {
    let mut c = match side {
        Side::Rust => Command::new(example(tool)),
        Side::C => {
            let mut c = Command::new("stdbuf");
            c.args(["-oL", tool]);
            c
        }
    };
    c.args(args);
    c
}

// ---------------------------------------------------------------------------
// Processes

/// A child whose output is collected by two threads (stdout also line by
/// line, for readiness lines); killed if dropped while still running, so a
/// failed assertion never leaves a process behind.
struct Running {
    name: String,
    child: Child,
    lines: mpsc::Receiver<String>,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

fn spawn(name: &str, mut cmd: Command) -> Running {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
    eprintln!("started {name}: {cmd:?}");
    let (tx, lines) = mpsc::channel();
    let stdout = child.stdout.take().map(|p| {
        std::thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(p).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line.clone());
                all.push_str(&line);
                all.push('\n');
            }
            all
        })
    });
    let stderr = child.stderr.take().map(|mut p| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = p.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    });
    Running {
        name: name.to_string(),
        child,
        lines,
        stdout,
        stderr,
    }
}

impl Running {
    fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Waits for a stdout line containing `text`, at most `deadline`.
    fn wait_line(&mut self, text: &str, deadline: Duration) -> Result<(), String> {
        let end = Instant::now() + deadline;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(text) => return Ok(()),
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "{}: no line with {text:?} in {deadline:?}",
                        self.name
                    ))
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(format!("{}: exited before printing {text:?}", self.name))
                }
            }
        }
    }

    /// Waits for the process to exit, at most until `end`: whether it did.
    fn wait_until(&mut self, end: Instant) -> bool {
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => return true,
                Ok(None) if Instant::now() >= end => return false,
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => panic!("waiting for {}: {e}", self.name),
            }
        }
    }

    /// SIGKILL, then reaps it, waiting at most [`KILL_DEADLINE`]: a thread
    /// blocked in the kernel (state D) holds the process until it leaves
    /// the kernel. Then its threads are reported and it is left behind
    /// (false), instead of the test hanging until its harness kills it with
    /// everything it collected.
    fn kill_bounded(&mut self) -> bool {
        let _ = self.child.kill();
        if self.wait_until(Instant::now() + KILL_DEADLINE) {
            return true;
        }
        report(&format!(
            "{} has not exited {KILL_DEADLINE:?} after SIGKILL\n{}",
            self.name,
            common::threads_report(self.child.id())
        ));
        false
    }

    /// Waits for the process to exit by `end`; kills it past that.
    fn finish(mut self, end: Instant) -> Finished {
        if self.wait_until(end) {
            let status = self.child.try_wait().ok().flatten();
            return self.collect(status);
        }
        let reaped = self.kill_bounded();
        self.collect_killed(reaped)
    }

    /// Kills the process (a server that never exits by itself).
    fn kill(mut self) -> Finished {
        let reaped = self.kill_bounded();
        self.collect_killed(reaped)
    }

    /// The output of a killed process; if it could not be reaped, its pipes
    /// are still open and what it printed is not waited for.
    fn collect_killed(&mut self, reaped: bool) -> Finished {
        if !reaped {
            self.stdout = None;
            self.stderr = None;
        }
        self.collect(None)
    }

    fn collect(&mut self, status: Option<ExitStatus>) -> Finished {
        let stdout = self
            .stdout
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        let stderr = self
            .stderr
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        Finished {
            name: self.name.clone(),
            status,
            stdout,
            stderr,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill_bounded();
        }
    }
}

/// How long a killed process may take to exit.
const KILL_DEADLINE: Duration = Duration::from_secs(30);

/// Writes a diagnosis to this process's stderr at once, not through the
/// test harness's capture: a test killed at its timeout loses what it
/// captured.
fn report(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{text}");
}

/// Reports what every thread of each process still running is doing: called
/// when a run passed its deadline, before anything is killed (killing one
/// end changes what the other waits for).
fn report_hang(running: &mut [&mut Running]) {
    for r in running.iter_mut() {
        if r.exited() {
            continue;
        }
        report(&format!(
            "{} still running after {RUN_DEADLINE:?}:\n{}",
            r.name,
            common::threads_report(r.child.id())
        ));
    }
    // gdb after every kernel-side report: it takes seconds per process.
    for r in running.iter_mut() {
        if !r.exited() {
            report(&common::gdb_backtraces(r.child.id()));
        }
    }
}

/// Waits until a listening rdma_cm id on `port` shows in `rdma resource show
/// cm_id` (iproute2); an error when `server` exits or the deadline passes.
fn wait_listening(server: &mut Running, port: u16) -> Result<(), String> {
    let end = Instant::now() + READY_DEADLINE;
    let want = format!(":{port} ");
    loop {
        let out = Command::new("rdma")
            .args(["resource", "show", "cm_id"])
            .output()
            .expect("`rdma` (iproute2) runs");
        let text = String::from_utf8_lossy(&out.stdout);
        if text
            .lines()
            .any(|l| l.contains("state LISTEN") && format!("{l} ").contains(&want))
        {
            return Ok(());
        }
        if server.exited() {
            return Err(format!(
                "{} exited before listening on port {port}",
                server.name
            ));
        }
        if Instant::now() >= end {
            return Err(format!(
                "{} is not listening on port {port} after {READY_DEADLINE:?}:\n{text}",
                server.name
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts a server and waits until it listens on `port`; on failure it is
/// killed and the test fails with its output.
fn start_server(name: &str, cmd: Command, port: u16) -> Running {
    let mut server = spawn(name, cmd);
    if let Err(e) = wait_listening(&mut server, port) {
        let f = server.kill();
        panic!("{e}\n{f}");
    }
    server
}

/// Runs a server (until it listens on `port`) and then a client; waits for
/// both. With `kill_server`, the server is killed once the client is done
/// (tools that serve forever).
fn pair(
    tool_server: (&str, Side, Vec<String>),
    tool_client: (&str, Side, Vec<String>),
    port: u16,
    kill_server: bool,
) -> (Finished, Finished) {
    let name = |t: &str, s: Side, role: &str| format!("{t} ({s:?} {role})");
    let sargs: Vec<&str> = tool_server.2.iter().map(String::as_str).collect();
    let cargs: Vec<&str> = tool_client.2.iter().map(String::as_str).collect();
    let server = start_server(
        &name(tool_server.0, tool_server.1, "server"),
        command(tool_server.0, tool_server.1, &sargs),
        port,
    );
    let started = Instant::now();
    let client = spawn(
        &name(tool_client.0, tool_client.1, "client"),
        command(tool_client.0, tool_client.1, &cargs),
    );
    let end = Instant::now() + RUN_DEADLINE;
    let mut client = client;
    let mut server = server;
    let client_exited = client.wait_until(end);
    let client_done = started.elapsed();
    if !client_exited {
        report_hang(&mut [&mut client, &mut server]);
    } else if !kill_server && !server.wait_until(end) {
        report_hang(&mut [&mut server]);
    }
    let client = client.finish(end);
    let server = if kill_server {
        server.kill()
    } else {
        server.finish(end)
    };
    eprintln!(
        "client done after {client_done:?}, server after {:?}\n{server}{client}",
        started.elapsed()
    );
    (server, client)
}

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

// ---------------------------------------------------------------------------
// rping

const RPING_COUNT: usize = 10;

/// What rping prints for ping `n` of 64 bytes (`rping_test_client`): the
/// text `rdma-ping-N: ` and a run of letters `A`..`z` starting one further
/// each ping.
fn rping_text(n: usize, size: usize) -> String {
    let mut s = format!("rdma-ping-{n}: ");
    let mut c = b'A' + (n % 58) as u8;
    while s.len() < size - 1 {
        s.push(c as char);
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    s
}

/// Whether an rping side ended well: exit status 0, or, for rdma-core's C
/// `rping` only, its own teardown race. In rdma-core 44 the CM thread,
/// woken by the DISCONNECTED event, asks for the next event after the main
/// thread has destroyed the event channel, and exits 255 after printing
/// `rdma_get_cm_event: Bad file descriptor` (seen once in CI, 27 Nov 2026,
/// after a complete run; later rdma-core stops that thread first). The
/// caller still checks that every ping was printed on both sides.
fn rping_ended_well(f: &Finished) -> bool {
    f.success()
        || (f.name.contains("(C ")
            && f.status.and_then(|st| st.code()) == Some(255)
            && f.stderr.contains("DISCONNECT EVENT")
            && f.stderr
                .trim_end()
                .ends_with("rdma_get_cm_event: Bad file descriptor"))
}

/// Both rping sides succeeded, and each printed every ping of the run.
fn assert_rping_exchanged(s: &Finished, c: &Finished) {
    assert!(rping_ended_well(c), "client failed\n{s}{c}");
    assert!(rping_ended_well(s), "server failed\n{s}{c}");
    let want: Vec<String> = (0..RPING_COUNT)
        .map(|n| format!("ping data: {}", rping_text(n, 64)))
        .collect();
    assert_eq!(c.lines_starting("ping data: "), want, "\n{s}{c}");
    let want_server: Vec<String> = want.iter().map(|l| format!("server {l}")).collect();
    assert_eq!(
        s.lines_starting("server ping data: "),
        want_server,
        "\n{s}{c}"
    );
}

fn rping(ip: &str, port: u16, server: Side, client: Side, extra_client: &[&str]) {
    let p = port.to_string();
    let count = RPING_COUNT.to_string();
    let mut cargs = args(&["-c", "-a", ip, "-p", &p, "-C", &count, "-v", "-V"]);
    cargs.extend(extra_client.iter().map(|s| s.to_string()));
    let (s, c) = pair(
        ("rping", server, args(&["-s", "-a", ip, "-p", &p, "-v"])),
        ("rping", client, cargs),
        port,
        false,
    );
    assert_rping_exchanged(&s, &c);
    assert!(!c.stderr.contains("data mismatch"), "{c}");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rping_rust_server_c_client() {
    rping(&roce_ip(), 7301, Side::Rust, Side::C, &[]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rping_c_server_rust_client() {
    rping(&roce_ip(), 7302, Side::C, Side::Rust, &[]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rping_rust_server_rust_client() {
    rping(&roce_ip(), 7303, Side::Rust, Side::Rust, &[]);
}

/// `-q`: the QP is made by the example and moved by `rdma_init_qp_attr`.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rping_c_server_rust_client_self_made_qp() {
    rping(&roce_ip(), 7304, Side::C, Side::Rust, &["-q"]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn iwarp_rping_rust_server_c_client() {
    rping(&iwarp_ip(), 7305, Side::Rust, Side::C, &[]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn iwarp_rping_c_server_rust_client() {
    rping(&iwarp_ip(), 7306, Side::C, Side::Rust, &[]);
}

/// The hang report names every thread of a process with its state and wait
/// channel: a `sleep` child has one thread, asleep (state `S`), and the
/// report of a process that is gone says it cannot be read.
#[test]
fn a_hang_report_names_each_thread_its_state_and_wait_channel() {
    let mut child = Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("start sleep");
    let pid = child.id();
    // Until `sleep` sleeps, its thread may still be running its start-up.
    let end = Instant::now() + Duration::from_secs(10);
    let report = loop {
        let report = common::threads_report(pid);
        if report.contains(" state S ") || Instant::now() >= end {
            break report;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        report.starts_with(&format!("=== threads of process {pid}\n")),
        "{report}"
    );
    let thread = format!("--- thread {pid} (sleep) state S wchan ");
    assert_eq!(report.matches("--- thread ").count(), 1, "{report}");
    assert!(report.contains(&thread), "{report}");
    let gone = common::threads_report(pid);
    assert!(
        gone.contains(&format!("cannot read /proc/{pid}/task")),
        "{gone}"
    );
}

#[test]
fn rping_text_is_what_rping_prints() {
    // Measured from rdma-core 44's rping -v -C 3 in the VM.
    assert_eq!(
        rping_text(0, 64),
        "rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr"
    );
    assert_eq!(
        rping_text(2, 64),
        "rdma-ping-2: CDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrst"
    );
}

// ---------------------------------------------------------------------------
// rdma_server / rdma_client (synchronous endpoints)

fn endpoints(ip: &str, port: u16, server: Side, client: Side) {
    let p = port.to_string();
    let (s, c) = pair(
        ("rdma_server", server, args(&["-s", ip, "-p", &p])),
        ("rdma_client", client, args(&["-s", ip, "-p", &p])),
        port,
        false,
    );
    assert!(c.success(), "client failed\n{s}{c}");
    assert!(s.success(), "server failed\n{s}{c}");
    for (f, name) in [(&s, "rdma_server"), (&c, "rdma_client")] {
        assert_eq!(
            f.stdout.lines().next(),
            Some(format!("{name}: start").as_str()),
            "{f}"
        );
        assert_eq!(
            f.stdout.lines().last(),
            Some(format!("{name}: end 0").as_str()),
            "{f}"
        );
    }
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn endpoints_rust_server_c_client() {
    endpoints(&roce_ip(), 7311, Side::Rust, Side::C);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn endpoints_c_server_rust_client() {
    endpoints(&roce_ip(), 7312, Side::C, Side::Rust);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn endpoints_rust_server_rust_client() {
    endpoints(&roce_ip(), 7313, Side::Rust, Side::Rust);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn iwarp_endpoints_rust_server_c_client() {
    endpoints(&iwarp_ip(), 7314, Side::Rust, Side::C);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn iwarp_endpoints_c_server_rust_client() {
    endpoints(&iwarp_ip(), 7315, Side::C, Side::Rust);
}

// ---------------------------------------------------------------------------
// udaddy (UD over the connection manager, SIDR)

/// Both sides finished their transfers and said `return status 0`.
fn assert_transfers(s: &Finished, c: &Finished) {
    assert!(c.success(), "client failed\n{s}{c}");
    assert!(s.success(), "server failed\n{s}{c}");
    for f in [s, c] {
        assert!(
            f.stdout.lines().any(|l| l == "data transfers complete"),
            "{f}"
        );
        assert_eq!(f.stdout.lines().last(), Some("return status 0"), "{f}");
    }
}

fn udaddy(server: Side, client: Side, extra: &[&str]) {
    let ip = roce_ip();
    let mut sargs = args(&["-b", &ip]);
    let mut cargs = args(&["-s", &ip, "-b", &ip]);
    sargs.extend(extra.iter().map(|s| s.to_string()));
    cargs.extend(extra.iter().map(|s| s.to_string()));
    let (s, c) = pair(
        ("udaddy", server, sargs),
        ("udaddy", client, cargs),
        7174,
        false,
    );
    assert_transfers(&s, &c);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn udaddy_rust_server_c_client() {
    udaddy(Side::Rust, Side::C, &[]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn udaddy_c_server_rust_client() {
    udaddy(Side::C, Side::Rust, &[]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn udaddy_rust_server_rust_client_two_connections() {
    udaddy(Side::Rust, Side::Rust, &["-c", "2", "-C", "5", "-S", "200"]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn udaddy_c_server_rust_client_two_connections() {
    udaddy(Side::C, Side::Rust, &["-c", "2", "-C", "5", "-S", "200"]);
}

// ---------------------------------------------------------------------------
// mckey (multicast join, send, leave)

const GROUP: &str = "239.1.2.3";

fn mckey(receiver: Side, sender: Side, extra_sender: &[&str]) {
    let ip = roce_ip();
    let mut recv = spawn(
        &format!("mckey ({receiver:?} receiver)"),
        command("mckey", receiver, &["-m", GROUP, "-b", &ip]),
    );
    if let Err(e) = recv.wait_line("mckey: joined dgid", READY_DEADLINE) {
        let f = recv.kill();
        panic!("{e}\n{f}");
    }
    let mut sargs = vec!["-m", GROUP, "-b", &ip, "-s"];
    sargs.extend_from_slice(extra_sender);
    let send = spawn(
        &format!("mckey ({sender:?} sender)"),
        command("mckey", sender, &sargs),
    );
    let end = Instant::now() + RUN_DEADLINE;
    let s = send.finish(end);
    let r = recv.finish(end);
    eprintln!("{r}{s}");
    assert_transfers(&r, &s);
    // Both joined the same group and print it the same way.
    let joined = |f: &Finished| -> String {
        f.lines_starting("mckey: joined dgid: ")
            .first()
            .map(|l| l.to_string())
            .unwrap_or_else(|| panic!("no join line\n{f}"))
    };
    assert_eq!(joined(&r), joined(&s), "\n{r}{s}");
    assert!(
        joined(&r).starts_with(&format!("mckey: joined dgid: ::ffff:{GROUP} ")),
        "{r}"
    );
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn mckey_rust_receiver_c_sender() {
    mckey(Side::Rust, Side::C, &[]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn mckey_c_receiver_rust_sender() {
    mckey(Side::C, Side::Rust, &[]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn mckey_rust_receiver_rust_sender() {
    mckey(Side::Rust, Side::Rust, &[]);
}

/// `-o`: the sender joins as a send-only full member.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn mckey_c_receiver_rust_send_only_sender() {
    mckey(Side::C, Side::Rust, &["-o"]);
}

// ---------------------------------------------------------------------------
// What soft-RoCE refuses: AF_IB addresses (`-f gid`, `mckey -M`) and QP
// create flags (`mckey -l`). The C tool fails first; the Rust port must fail
// at the same step with the same error.

/// How long a tool that fails at setup may take.
const FAIL_DEADLINE: Duration = Duration::from_secs(30);

/// Runs `tool` on each side alone; both must fail, with a line starting
/// with `step` that contains `error` (on stdout or, `perror` for the C
/// tools, stderr).
fn fails_like_the_c_tool(tool: &str, a: &[&str], step: &str, error: &str) {
    for side in [Side::C, Side::Rust] {
        let f = spawn(&format!("{tool} ({side:?})"), command(tool, side, a))
            .finish(Instant::now() + FAIL_DEADLINE);
        eprintln!("{f}");
        assert!(f.status.is_some(), "{tool} did not exit by itself\n{f}");
        assert!(!f.success(), "{tool} succeeded\n{f}");
        assert!(
            f.stdout
                .lines()
                .chain(f.stderr.lines())
                .any(|l| l.starts_with(step) && l.contains(error)),
            "no {step:?} line with {error:?}\n{f}"
        );
        assert_eq!(
            f.stdout
                .lines()
                .last()
                .map(|l| l.starts_with("return status ")),
            Some(true),
            "{f}"
        );
    }
}

/// The test device's GID at `RDMA_TEST_GID_INDEX`, as sysfs prints it.
fn device_gid() -> String {
    let dev = common::device_name();
    common::sysfs(&dev, &format!("ports/1/gids/{}", common::gid_index())).expect("the GID")
}

/// `-l`: rxe creates no QP with `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn mckey_block_loopback_fails_on_rxe_like_the_c_tool() {
    let ip = roce_ip();
    fails_like_the_c_tool(
        "mckey",
        &["-m", GROUP, "-b", &ip, "-l", "-s", "-C", "1"],
        "mckey: unable to create QP: ",
        "Operation not supported",
    );
}

/// `-M`: joining an `AF_IB` group fails on RoCE (the kernel's `ENOTSUPP`).
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn mckey_unmapped_group_fails_on_rxe_like_the_c_tool() {
    let ip = roce_ip();
    fails_like_the_c_tool(
        "mckey",
        &["-M", "ff12:401b:ffff::1", "-b", &ip, "-C", "1"],
        "mckey: failure joining: ",
        "error 524",
    );
}

/// `-f gid` servers: binding the device's GID fails on RoCE (`ENODEV`).
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn udaddy_and_ucmatose_gid_servers_fail_on_rxe_like_the_c_tools() {
    let gid = device_gid();
    fails_like_the_c_tool(
        "udaddy",
        &["-f", "gid", "-b", &gid],
        "udaddy: bind address failed: ",
        "No such device",
    );
    fails_like_the_c_tool(
        "ucmatose",
        &["-f", "gid", "-b", &gid],
        "cmatose: bind address failed: ",
        "No such device",
    );
}

/// `-f gid` clients: the address resolves, the route does not (`ENODEV`).
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn udaddy_and_ucmatose_gid_clients_fail_on_rxe_like_the_c_tools() {
    let gid = device_gid();
    fails_like_the_c_tool(
        "udaddy",
        &["-f", "gid", "-s", &gid],
        "udaddy: resolve route failed: ",
        "No such device",
    );
    fails_like_the_c_tool(
        "ucmatose",
        &["-f", "gid", "-s", &gid],
        "cmatose: resolve route failed: ",
        "No such device",
    );
}

// ---------------------------------------------------------------------------
// ucmatose (many simultaneous connections)

fn ucmatose(ip: &str, port: u16, server: Side, client: Side, extra: &[&str]) {
    let p = port.to_string();
    let mut sargs = args(&["-b", ip, "-p", &p, "-c", "8"]);
    let mut cargs = args(&["-s", ip, "-p", &p, "-c", "8"]);
    sargs.extend(extra.iter().map(|s| s.to_string()));
    cargs.extend(extra.iter().map(|s| s.to_string()));
    let (s, c) = pair(
        ("ucmatose", server, sargs),
        ("ucmatose", client, cargs),
        port,
        false,
    );
    assert_transfers(&s, &c);
    assert!(s.stdout.lines().any(|l| l == "disconnected"), "{s}");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn ucmatose_rust_server_c_client() {
    ucmatose(&roce_ip(), 7321, Side::Rust, Side::C, &[]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn ucmatose_c_server_rust_client() {
    ucmatose(&roce_ip(), 7322, Side::C, Side::Rust, &[]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn ucmatose_rust_server_rust_client_migrate() {
    ucmatose(&roce_ip(), 7323, Side::Rust, Side::Rust, &["-m"]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn iwarp_ucmatose_c_server_rust_client() {
    ucmatose(&iwarp_ip(), 7324, Side::C, Side::Rust, &[]);
}

// ---------------------------------------------------------------------------
// cmtime (per-step timing of connection setup)

const CMTIME_CONNS: &str = "16";

/// The step names of a cmtime table, checking each row's shape: the name
/// padded to 13, a colon, four numbers of 11 columns with 2 decimals.
fn cmtime_steps(f: &Finished) -> Vec<String> {
    let mut lines = f.stdout.lines();
    assert!(
        lines
            .by_ref()
            .any(|l| l == "step              total ms     max ms     min us  us / conn"),
        "no cmtime table\n{f}"
    );
    lines
        .map(|l| {
            let (name, nums) = l.split_at(13);
            assert!(
                nums.starts_with(": ") && nums.len() == 2 + 44,
                "row {l:?}\n{f}"
            );
            for col in nums.as_bytes()[2..].chunks(11) {
                let col = std::str::from_utf8(col).unwrap().trim();
                let v: f64 = col.parse().unwrap_or_else(|_| panic!("row {l:?}\n{f}"));
                assert!(v >= 0.0, "row {l:?}\n{f}");
                assert_eq!(col.split('.').nth(1).map(str::len), Some(2), "row {l:?}");
            }
            name.trim_end().to_string()
        })
        .collect()
}

fn cmtime(server: Side, client: Side, port: u16) -> Finished {
    let ip = roce_ip();
    let p = port.to_string();
    let (s, c) = pair(
        ("cmtime", server, args(&["-b", &ip, "-p", &p])),
        (
            "cmtime",
            client,
            args(&["-s", &ip, "-b", &ip, "-p", &p, "-c", CMTIME_CONNS]),
        ),
        port,
        true,
    );
    assert!(c.success(), "client failed\n{s}{c}");
    assert!(!c.stdout.contains("error"), "{c}");
    assert!(s.stdout.is_empty() || !s.stdout.contains("fail"), "{s}");
    c
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn cmtime_rust_server_c_client() {
    let c = cmtime(Side::Rust, Side::C, 7331);
    assert!(cmtime_steps(&c).contains(&"connect".to_string()), "{c}");
}

/// Against the same server, the Rust client prints the table the C client
/// prints: the same steps, in the same order, in the same columns.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn cmtime_c_server_rust_and_c_clients_print_the_same_table() {
    let ip = roce_ip();
    let port = 7332u16;
    let p = port.to_string();
    let server = start_server(
        "cmtime (C server)",
        command("cmtime", Side::C, &["-b", &ip, "-p", &p]),
        port,
    );
    let mut tables = Vec::new();
    for side in [Side::C, Side::Rust] {
        let c = spawn(
            &format!("cmtime ({side:?} client)"),
            command(
                "cmtime",
                side,
                &["-s", &ip, "-b", &ip, "-p", &p, "-c", CMTIME_CONNS],
            ),
        )
        .finish(Instant::now() + RUN_DEADLINE);
        eprintln!("{c}");
        assert!(c.success(), "{c}");
        assert!(!c.stdout.contains("error"), "{c}");
        tables.push(cmtime_steps(&c));
    }
    let s = server.kill();
    eprintln!("{s}");
    assert_eq!(tables[0], tables[1]);
    assert_eq!(
        tables[1],
        [
            "create id",
            "bind addr",
            "resolve addr",
            "resolve route",
            "create qp",
            "connect",
            "disconnect",
            "destroy"
        ]
    );
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn cmtime_rust_server_rust_client() {
    let c = cmtime(Side::Rust, Side::Rust, 7333);
    assert_eq!(cmtime_steps(&c).len(), 8, "{c}");
}

// ---------------------------------------------------------------------------
// Faults

/// Connecting to a server process that was killed: rejected or unreachable
/// within the timeout, never a hang.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn connect_after_the_peer_process_is_killed() {
    let ip = roce_ip();
    let port = 7599;
    let server = start_server(
        "rping server",
        command(
            "rping",
            Side::C,
            &["-s", "-a", &ip, "-p", &port.to_string()],
        ),
        port,
    );
    drop(server.kill()); // SIGKILL: librdmacm gets no chance to clean up
    let dst = std::net::SocketAddr::new(ip.parse().unwrap(), port);
    let opts = rdma::cm::blocking::ConnectOptions {
        timeout: Duration::from_secs(10),
        ..Default::default()
    };
    let started = Instant::now();
    let err = match rdma::cm::blocking::Connection::connect(dst, &opts) {
        Ok(_) => panic!("connected to a killed server"),
        Err(e) => e,
    };
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    match &err {
        rdma::Error::CmEvent { event, .. } => assert!(
            matches!(
                event,
                rdma::cm::CmEventType::Rejected | rdma::cm::CmEventType::Unreachable
            ),
            "{err}"
        ),
        e => assert_eq!(e.errno(), Some(libc::ETIMEDOUT), "{e}"),
    }
}

// ---------------------------------------------------------------------------
// async_rping and async_echo (the async layer, `rdma::aio`; built with the
// `tokio` feature)

/// The async port against rping: `async_rping` on the Rust side, rdma-core's
/// `rping` on the C side; the same lines and checks as [`rping`].
fn async_rping(ip: &str, port: u16, server: Side, client: Side) {
    let tool = |s: Side| {
        if s == Side::Rust {
            "async_rping"
        } else {
            "rping"
        }
    };
    let p = port.to_string();
    let count = RPING_COUNT.to_string();
    let (s, c) = pair(
        (
            tool(server),
            server,
            args(&["-s", "-a", ip, "-p", &p, "-v"]),
        ),
        (
            tool(client),
            client,
            args(&["-c", "-a", ip, "-p", &p, "-C", &count, "-v", "-V"]),
        ),
        port,
        false,
    );
    assert_rping_exchanged(&s, &c);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn async_rping_server_c_client() {
    async_rping(&roce_ip(), 7401, Side::Rust, Side::C);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn c_rping_server_async_rping_client() {
    async_rping(&roce_ip(), 7402, Side::C, Side::Rust);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn async_rping_server_async_rping_client() {
    async_rping(&roce_ip(), 7403, Side::Rust, Side::Rust);
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_async_rping_server_c_client() {
    async_rping(&iwarp_ip(), 7404, Side::Rust, Side::C);
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_c_rping_server_async_rping_client() {
    async_rping(&iwarp_ip(), 7405, Side::C, Side::Rust);
}

/// `TOTAL` connections at once to one `async_rping -s` (one thread):
/// `C_CLIENTS` rdma-core `rping -c` processes and one `async_rping -c`
/// opening the rest at once, every ping validated.
fn many_clients(ip: &str, port: u16, total: usize, c_clients: usize) {
    #[allow(non_snake_case)]
    let (TOTAL, C_CLIENTS) = (total, c_clients);
    const PINGS: usize = 3;
    let p = port.to_string();
    let total = TOTAL.to_string();
    let server = start_server(
        "async_rping (Rust server)",
        command(
            "async_rping",
            Side::Rust,
            &["-s", "-a", ip, "-p", &p, "-v", "-N", &total],
        ),
        port,
    );
    let pings = PINGS.to_string();
    let c_args = ["-c", "-a", ip, "-p", &p, "-C", &pings, "-v", "-V"];
    let mut clients: Vec<Running> = (0..C_CLIENTS)
        .map(|i| {
            spawn(
                &format!("rping (C client {i})"),
                command("rping", Side::C, &c_args),
            )
        })
        .collect();
    let rest = (TOTAL - C_CLIENTS).to_string();
    let mut rust_args = c_args.to_vec();
    rust_args.extend(["-N", &rest]);
    clients.push(spawn(
        "async_rping (Rust client)",
        command("async_rping", Side::Rust, &rust_args),
    ));
    let end = Instant::now() + Duration::from_secs(100);
    let clients: Vec<Finished> = clients.into_iter().map(|c| c.finish(end)).collect();
    let server = server.finish(end);
    let all: String = clients.iter().map(|c| c.to_string()).collect();
    for c in &clients {
        assert!(c.success(), "a client failed\n{server}{all}");
        assert!(!c.stderr.contains("data mismatch"), "{c}");
    }
    assert!(server.success(), "server failed\n{server}{all}");
    let pinged: usize = clients
        .iter()
        .map(|c| c.lines_starting("ping data: ").len())
        .sum();
    assert_eq!(pinged, TOTAL * PINGS, "\n{server}{all}");
    assert_eq!(
        server.lines_starting("server ping data: ").len(),
        TOTAL * PINGS,
        "\n{server}"
    );
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn async_rping_serves_sixty_four_clients_at_once_c_clients_among_them() {
    many_clients(&roce_ip(), 7406, 64, 8);
}

/// 64 on siw too: siw (rdma-core 44) allows a process 144 pages of queue
/// mappings per device, which is 48 connections of a CQ, an SQ and an RQ
/// page each (CONVENTIONS.md, Tests). async_rping's connections share CQs
/// (up to 64 on one), so a connection costs 2 pages: the server's 64 and the
/// Rust client's 56 fit, with 8 C clients among them.
#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_async_rping_serves_sixty_four_clients_at_once_c_clients_among_them() {
    many_clients(&iwarp_ip(), 7407, 64, 8);
}

fn async_echo(ip: &str, port: u16, threads: bool) {
    let p = port.to_string();
    let mut server_args = args(&["-s", "-a", ip, "-p", &p, "-N", "8"]);
    if threads {
        server_args.push("-T".into());
    }
    let (s, c) = pair(
        ("async_echo", Side::Rust, server_args),
        (
            "async_echo",
            Side::Rust,
            args(&["-c", "-a", ip, "-p", &p, "-n", "8", "-m", "200", "-D", "4"]),
        ),
        port,
        false,
    );
    assert!(c.success(), "client failed\n{s}{c}");
    assert!(s.success(), "server failed\n{s}{c}");
    let line = c.lines_starting("8 connections x 200 messages of 64 bytes: ");
    assert_eq!(line.len(), 1, "\n{s}{c}");
    assert!(line[0].contains(": 1600 echoes in "), "{}", line[0]);
    assert!(line[0].ends_with(" messages/s"), "{}", line[0]);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn async_echo_eight_connections() {
    async_echo(&roce_ip(), 7408, false);
}

/// The blocking, thread-per-connection server (`-T`), the async one's
/// baseline.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn async_echo_client_against_the_threaded_blocking_server() {
    async_echo(&roce_ip(), 7410, true);
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_async_echo_eight_connections() {
    async_echo(&iwarp_ip(), 7409, false);
}
