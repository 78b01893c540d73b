//! Helpers for device tests.
//!
//! Device tests are `#[ignore = "needs an RDMA device"]`: a plain `cargo test`
//! lists them as ignored. The harness (`ci/vm run`) runs them with
//! `--ignored` and sets `RDMA_TEST_DEVICE`; when a test runs, the device it
//! asks for must exist, or the test fails. Nothing here skips silently.
#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;

use rdma::Context;

pub mod iwarp;

fn required_env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: this test needs an RDMA device. Run it in the VM \
             (ci/vm run ...) or set {var} on a machine with RDMA."
        )
    })
}

/// The RoCE/InfiniBand device under test (`RDMA_TEST_DEVICE`).
pub fn device_name() -> String {
    required_env("RDMA_TEST_DEVICE")
}

/// The iWARP device under test (`RDMA_TEST_IWARP_DEVICE`).
pub fn iwarp_device_name() -> String {
    required_env("RDMA_TEST_IWARP_DEVICE")
}

/// Opens a device by name; failure to open a requested device fails the test.
pub fn open(name: &str) -> Context {
    Context::open(name).unwrap_or_else(|e| panic!("cannot open test device {name}: {e}"))
}

/// The IPv4-mapped RoCE v2 GID index (`RDMA_TEST_GID_INDEX`).
pub fn gid_index() -> u32 {
    required_env("RDMA_TEST_GID_INDEX")
        .parse()
        .expect("RDMA_TEST_GID_INDEX is a number")
}

/// The IPv4 address of the test device's netdev (`RDMA_TEST_IP`).
pub fn ip() -> Ipv4Addr {
    required_env("RDMA_TEST_IP")
        .parse()
        .expect("RDMA_TEST_IP is an IPv4 address")
}

/// The test device's address as the connection manager takes it
/// (`RDMA_TEST_IP`; librdmacm maps it to the RoCE device).
pub fn roce_ip() -> std::net::IpAddr {
    std::net::IpAddr::V4(ip())
}

/// The netdev the test device sits on (`RDMA_TEST_NETDEV`), if told.
pub fn netdev() -> Option<String> {
    std::env::var("RDMA_TEST_NETDEV").ok()
}

/// A sysfs attribute of a device, trimmed.
pub fn sysfs(device: &str, rel: &str) -> std::io::Result<String> {
    std::fs::read_to_string(format!("/sys/class/infiniband/{device}/{rel}"))
        .map(|s| s.trim().to_string())
}

/// `ibv_devinfo -v -d DEVICE` from rdma-core, as (key, value) lines: the C
/// tool is the oracle for what the safe API reports.
pub fn ibv_devinfo(device: &str) -> Vec<(String, String)> {
    ibv_devinfo_lines(device)
        .iter()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

/// `ibv_devinfo -v -d DEVICE`, as raw lines (the ODP section has values on
/// lines of their own, which [`ibv_devinfo`] does not keep).
pub fn ibv_devinfo_lines(device: &str) -> Vec<String> {
    let out = Command::new("ibv_devinfo")
        .args(["-v", "-d", device])
        .output()
        .expect("ibv_devinfo (ibverbs-utils) runs");
    assert!(out.status.success(), "ibv_devinfo failed: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// The first value of `key` in `ibv_devinfo` output.
pub fn field<'a>(info: &'a [(String, String)], key: &str) -> &'a str {
    info.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("ibv_devinfo printed no {key:?}"))
}

/// Parses a decimal or `0x` hexadecimal number as `ibv_devinfo` prints it.
pub fn num(s: &str) -> u64 {
    let s = s.split_whitespace().next().unwrap_or(s);
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .unwrap_or_else(|e| panic!("not a number: {s:?}: {e}"))
}

/// Protection domain, CQ and two QPs of `qp_type` connected to each other on
/// the test device (RC/UC: INIT → RTR → RTS against each other; UD: ready to
/// send, Q_Key 0x11111111). Path MTU is the port's active MTU.
pub struct Pair {
    pub ctx: Context,
    pub pd: rdma::ProtectionDomain,
    pub cq: rdma::CompletionQueue,
    pub a: rdma::QueuePair,
    pub b: rdma::QueuePair,
    pub gid_index: u8,
}

pub const QKEY: u32 = 0x1111_1111;

pub fn pair_with(
    qp_type: rdma::QpType,
    access: rdma::AccessFlags,
    tune: impl Fn(&mut rdma::QueuePairBuilder),
) -> Pair {
    let ctx = open(&device_name());
    let pd = ctx.alloc_pd().expect("alloc_pd");
    let cq = ctx.create_cq(256, None, 0).expect("create_cq");
    let mut builder = pd.qp_builder(qp_type, &cq, &cq);
    tune(&mut builder);
    let a = builder.build().expect("create QP a");
    let b = builder.build().expect("create QP b");
    let gid_index = u8::try_from(gid_index()).unwrap();
    let port = ctx.query_port(1).unwrap();
    let gid = ctx.query_gid(1, u32::from(gid_index)).unwrap();
    let mut init = rdma::InitAttr::new(1);
    init.access = access;
    init.qkey = QKEY;
    for (me, peer) in [(&a, &b), (&b, &a)] {
        me.to_init(&init).expect("to_init");
        if qp_type == rdma::QpType::Ud {
            me.to_rtr(None).expect("to_rtr");
        } else {
            let ah = rdma::AhAttr::global(1, gid, gid_index);
            let rtr = rdma::RtrAttr::new(ah, port.active_mtu, peer.qp_num(), 0);
            me.to_rtr(Some(&rtr)).expect("to_rtr");
        }
        me.to_rts(&rdma::RtsAttr::new(0)).expect("to_rts");
    }
    Pair {
        ctx,
        pd,
        cq,
        a,
        b,
        gid_index,
    }
}

/// Connects RC/UC `me` to `peer` on port 1 of `ctx` (INIT → RTR → RTS),
/// path MTU from the port's active MTU.
pub fn connect(ctx: &Context, me: &rdma::QueuePair, peer: &rdma::QueuePair, gid_index: u8) {
    let gid = ctx.query_gid(1, u32::from(gid_index)).unwrap();
    let mtu = ctx.query_port(1).unwrap().active_mtu;
    me.to_init(&rdma::InitAttr::new(1)).unwrap();
    let ah = rdma::AhAttr::global(1, gid, gid_index);
    me.to_rtr(Some(&rdma::RtrAttr::new(ah, mtu, peer.qp_num(), 0)))
        .unwrap();
    me.to_rts(&rdma::RtsAttr::new(0)).unwrap();
}

pub fn pair(qp_type: rdma::QpType, access: rdma::AccessFlags) -> Pair {
    pair_with(qp_type, access, |_| {})
}

/// An RC pair on the test device whose receiver takes its receives from a
/// shared receive queue: `r` on `srq` (16 requests of one SGE, no limit
/// armed), `s` without, connected to each other, both on `cq` (64 entries).
/// Nothing is posted.
pub struct SrqPair {
    pub ctx: Context,
    pub pd: rdma::ProtectionDomain,
    pub cq: rdma::CompletionQueue,
    pub srq: rdma::SharedReceiveQueue,
    pub r: rdma::QueuePair,
    pub s: rdma::QueuePair,
}

pub fn srq_pair() -> SrqPair {
    let ctx = open(&device_name());
    let gid_index = u8::try_from(gid_index()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None, 0).unwrap();
    let srq = pd
        .create_srq(rdma::SrqAttr {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let r = pd
        .qp_builder(rdma::QpType::Rc, &cq, &cq)
        .srq(&srq)
        .build()
        .unwrap();
    let s = pd.qp_builder(rdma::QpType::Rc, &cq, &cq).build().unwrap();
    connect(&ctx, &r, &s, gid_index);
    connect(&ctx, &s, &r, gid_index);
    SrqPair {
        ctx,
        pd,
        cq,
        srq,
        r,
        s,
    }
}

/// Polls until `n` completions arrived; a lost completion fails after 10 s
/// instead of hanging.
pub fn wait(cq: &rdma::CompletionQueue, n: usize) -> Vec<rdma::Completion> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut out = Vec::new();
    while out.len() < n {
        let want = n - out.len();
        cq.poll(&mut out, want).expect("poll_cq");
        if out.len() < n {
            assert!(
                std::time::Instant::now() < deadline,
                "lost completion: got {} of {n}: {out:?}",
                out.len()
            );
            std::thread::yield_now();
        }
    }
    out
}

/// Takes the completion with `wr_id` out of `v`.
pub fn take(v: &mut Vec<rdma::Completion>, wr_id: u64) -> rdma::Completion {
    let i = v
        .iter()
        .position(|c| c.wr_id == wr_id)
        .unwrap_or_else(|| panic!("no completion {wr_id} in {v:?}"));
    v.remove(i)
}

/// Asserts that `err` is the typed `Unsupported` error of `ctx`'s device, its
/// text naming `what_has`, carrying `errno` from the verb.
pub fn assert_unsupported(
    err: &rdma::Error,
    ctx: &rdma::Context,
    what_has: &str,
    errno: Option<i32>,
) {
    match err {
        rdma::Error::Unsupported {
            what,
            device,
            source,
        } => {
            assert!(what.contains(what_has), "{err}");
            assert_eq!(device, ctx.name(), "{err}");
            assert_eq!(
                source.as_ref().and_then(std::io::Error::raw_os_error),
                errno,
                "{err}"
            );
        }
        other => panic!("expected Unsupported({what_has}), got {other:?}"),
    }
    assert!(err.to_string().contains(ctx.name()), "{err}");
}

/// A finished child process of an interop test and what it printed.
pub struct Finished {
    pub name: String,
    /// `None` when it was killed.
    pub status: Option<std::process::ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

impl std::fmt::Display for Finished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = match self.status {
            Some(s) => s.to_string(),
            None => "killed".to_string(),
        };
        writeln!(f, "--- {} ({status}) stdout:", self.name)?;
        for l in self.stdout.lines() {
            writeln!(f, "    {l}")?;
        }
        writeln!(f, "--- {} stderr:", self.name)?;
        for l in self.stderr.lines() {
            writeln!(f, "    {l}")?;
        }
        Ok(())
    }
}

impl Finished {
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// The stdout lines that start with `prefix`.
    pub fn lines_starting(&self, prefix: &str) -> Vec<&str> {
        self.stdout
            .lines()
            .filter(|l| l.starts_with(prefix))
            .collect()
    }
}

/// What every thread of process `pid` is doing, for a test that found it
/// hung past its deadline: per thread its name, state (`R`, `S`, `D`...) and
/// kernel wait channel, and its kernel stack (readable by root only; the VM
/// runs the tests as root). [`gdb_backtraces`] gives the user-space side.
/// Best effort: what cannot be read says why.
pub fn threads_report(pid: u32) -> String {
    let mut out = format!("=== threads of process {pid}\n");
    let dir = format!("/proc/{pid}/task");
    let mut tids: Vec<String> = match std::fs::read_dir(&dir) {
        Ok(d) => d
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(e) => {
            out.push_str(&format!("cannot read {dir}: {e}\n"));
            return out;
        }
    };
    tids.sort_by_key(|t| t.parse::<u64>().unwrap_or(u64::MAX));
    for tid in tids {
        let read = |f: &str| {
            std::fs::read_to_string(format!("{dir}/{tid}/{f}"))
                .unwrap_or_else(|e| format!("({f}: {e})"))
        };
        let stat = read("stat");
        // The state is the first field after the command's closing parenthesis.
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or("?")
            .to_string();
        out.push_str(&format!(
            "--- thread {tid} ({}) state {state} wchan {}\n",
            read("comm").trim(),
            read("wchan").trim()
        ));
        for l in read("stack").lines() {
            out.push_str(&format!("    {l}\n"));
        }
    }
    out
}

/// Every thread's user-space backtrace in process `pid`, from gdb if it is
/// installed, bounded at 30 s (attaching to a thread blocked in the kernel
/// waits for it to leave).
pub fn gdb_backtraces(pid: u32) -> String {
    let gdb = Command::new("timeout")
        .args(["30", "gdb", "-batch", "-nx", "-p", &pid.to_string()])
        .args([
            "-iex",
            "set debuginfod enabled off",
            "-ex",
            "thread apply all bt",
        ])
        .output();
    match gdb {
        Ok(o) => format!(
            "=== gdb -p {pid}: thread apply all bt ({})\n{}{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => format!("=== gdb -p {pid} not run: {e}\n"),
    }
}

/// The kinds of object [`resource_counts`] counts, in its order.
pub const RESOURCES: [&str; 5] = ["pd", "cq", "qp", "cm_id", "mr"];

/// `rdma resource show` (iproute2): how many of each of [`RESOURCES`] exist,
/// summed over every device.
pub fn resource_counts() -> [u64; 5] {
    let out = Command::new("rdma")
        .args(["resource", "show"])
        .output()
        .expect("rdma (iproute2) runs");
    assert!(out.status.success(), "rdma resource show: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut counts = [0u64; 5];
    for line in text.lines() {
        let mut words = line.split_whitespace();
        while let Some(w) = words.next() {
            let slot = RESOURCES.iter().position(|k| *k == w);
            if let (Some(i), Some(Ok(n))) = (slot, words.clone().next().map(str::parse::<u64>)) {
                counts[i] += n;
            }
        }
    }
    counts
}

/// How many descriptors this process has open.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// What a test that must leave nothing behind is measured against:
/// [`resource_counts`] (summed over every device) and [`open_fds`].
pub type Baseline = ([u64; 5], usize);

/// The counts now (see [`Baseline`]).
pub fn baseline() -> Baseline {
    (resource_counts(), open_fds())
}

/// Fails unless (pd, cq, qp, cm_id, mr) and the open descriptors are back to
/// `before` and no destroy failed in a `Drop` (`rdma::teardown_failures()`).
pub fn assert_back_to(before: Baseline) {
    assert_eq!(
        baseline(),
        before,
        "(pd, cq, qp, cm_id, mr) and open fds are back to the baseline"
    );
    assert_eq!(rdma::teardown_failures(), 0, "no destroy failed in Drop");
}

/// The example binary built next to this test binary
/// (`target/<profile>/deps/NAME-HASH` → `target/<profile>/examples/NAME`).
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in target/<profile>/deps");
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.is_file(),
        "example binary {} is missing: run `cargo build --examples` (same profile and \
         CARGO_TARGET_DIR as the tests) first",
        path.display()
    );
    path
}
