//! Device tests: real RoCEv2 traffic captured with tcpdump, decoded by `rdma-trace` and checked
//! against tshark (every packet's header fields) and against what the applications sent
//! (message counts, lengths, digests).
//!
//! rxe hands packets between its own QPs straight back to itself, so nothing would be on a wire
//! to capture. The tests add a second rxe (rxe1) on veth1 and route 10.8.0.1 <-> 10.8.0.2
//! across the veth pair (`../shared/kernel-peers.md` §3 of the project's notes), capture on
//! veth0, and undo all of it when they end. They need root, `RDMA_TEST_DEVICE=rxe0` on veth0
//! (10.8.0.1) and veth1 (10.8.0.2) as `ci/vm` sets up, tcpdump and tshark.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "../common/mod.rs"]
mod common;
mod iwarp;
use common::{check_nfs_rpcs, compare_with_tshark, messages, nfs_content, of_kind, sha};

const IP0: &str = "10.8.0.1";
const IP1: &str = "10.8.0.2";

fn sh(cmd: &str) -> (bool, String) {
    let out = Command::new("bash")
        .arg("-c")
        .arg(cmd)
        .output()
        .expect("bash runs");
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), s)
}

fn must(cmd: &str) -> String {
    let (ok, out) = sh(cmd);
    assert!(ok, "`{cmd}` failed:\n{out}");
    out
}

/// Polls `cond` every 50 ms until it holds or `secs` pass.
fn wait_for(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn gid_index(dev: &str, ip: &str) -> String {
    let hex: Vec<String> = ip
        .split('.')
        .map(|o| format!("{:02x}", o.parse::<u8>().unwrap()))
        .collect();
    let suffix = format!("ffff:{}{}:{}{}", hex[0], hex[1], hex[2], hex[3]);
    let dir = format!("/sys/class/infiniband/{dev}/ports/1/gids");
    for i in 0..16 {
        if let Ok(g) = fs::read_to_string(format!("{dir}/{i}")) {
            if g.trim().ends_with(&suffix) {
                return i.to_string();
            }
        }
    }
    panic!("{dev} has no RoCE v2 GID for {ip}");
}

fn sent_pkts(dev: &str) -> u64 {
    fs::read_to_string(format!(
        "/sys/class/infiniband/{dev}/ports/1/hw_counters/sent_pkts"
    ))
    .ok()
    .and_then(|s| s.trim().parse().ok())
    .unwrap_or_else(|| panic!("no sent_pkts counter for {dev}"))
}

// `ip rule add` does not refuse a duplicate: adding the local rule back when it is there would
// leave a second copy after `up` deletes one, local delivery would win, and the traffic would
// never cross the veth pair (the NFS test then went over siw0 on lo, capturing nothing).
const UNDO: &str = "rdma link del rxe1 2>/dev/null; \
    ip rule show pref 0 | grep -q 'lookup local' || ip rule add pref 0 lookup local; \
    ip rule del pref 20 2>/dev/null; ip rule del pref 10 2>/dev/null; ip rule del pref 11 2>/dev/null; \
    ip route flush table 100 2>/dev/null; ip route flush table 101 2>/dev/null; true";

/// The capture path: rxe1 on veth1 and policy routing across the veth pair. Dropping it
/// restores the guest's network as it was.
struct WirePath {
    sysctls: Vec<(String, String)>,
    gid0: String,
    gid1: String,
}

impl WirePath {
    fn up() -> WirePath {
        let dev = std::env::var("RDMA_TEST_DEVICE")
            .expect("RDMA_TEST_DEVICE must name the device under test (rxe0)");
        assert!(
            Path::new(&format!("/sys/class/infiniband/{dev}")).exists(),
            "RDMA_TEST_DEVICE={dev} does not exist"
        );
        assert_eq!(
            dev, "rxe0",
            "the capture path is built for ci/vm's rxe0 on veth0"
        );
        for tool in [
            "tcpdump",
            "tshark",
            "ibv_rc_pingpong",
            "ib_write_bw",
            "rping",
        ] {
            assert!(
                sh(&format!("command -v {tool}")).0,
                "{tool} is not installed (ci/setup)"
            );
        }
        // Leftovers of a run that was killed.
        sh(UNDO);
        let mut sysctls = Vec::new();
        for k in ["all", "default", "veth0", "veth1"] {
            for s in ["accept_local", "rp_filter"] {
                let key = format!("net.ipv4.conf.{k}.{s}");
                let old = must(&format!("sysctl -n {key}")).trim().to_string();
                sysctls.push((key, old));
            }
        }
        let mut path = WirePath {
            sysctls,
            gid0: String::new(),
            gid1: String::new(),
        };
        must("rdma link add rxe1 type rxe netdev veth1");
        must(
            "ip -batch - <<EOF
route add 10.8.0.0/24 dev veth0 table 100
route add 10.8.0.0/24 dev veth1 table 101
rule add pref 10 iif lo to 10.8.0.2 lookup 100
rule add pref 11 iif lo to 10.8.0.1 lookup 101
rule add pref 20 lookup local
rule del pref 0
EOF",
        );
        for k in ["all", "default", "veth0", "veth1"] {
            must(&format!(
                "sysctl -qw net.ipv4.conf.{k}.accept_local=1 net.ipv4.conf.{k}.rp_filter=0"
            ));
        }
        let route = must("ip route get 10.8.0.2");
        assert!(
            route.contains("dev veth0"),
            "10.8.0.2 is not routed across the veth pair:\n{route}{}",
            must("ip rule")
        );
        let mut gid1 = String::new();
        wait_for(10, "rxe1's RoCE v2 GID", || {
            gid1 = std::panic::catch_unwind(|| gid_index("rxe1", IP1)).unwrap_or_default();
            !gid1.is_empty()
        });
        path.gid0 = gid_index("rxe0", IP0);
        path.gid1 = gid1;
        path
    }
}

impl Drop for WirePath {
    fn drop(&mut self) {
        sh(UNDO);
        for (k, v) in &self.sysctls {
            sh(&format!("sysctl -qw {k}={v}"));
        }
    }
}

/// tcpdump on veth0, RoCEv2 only.
struct Tcpdump {
    child: Child,
    file: PathBuf,
    err: PathBuf,
    sent_before: u64,
}

fn count_frames(file: &Path) -> u64 {
    let Ok(f) = fs::File::open(file) else {
        return 0;
    };
    let mut n = 0;
    let _ = rdma_trace::for_each_frame(f, |_| n += 1);
    n
}

/// Starts tcpdump on `iface` with `filter`, writing `NAME.pcap` (its messages to
/// `NAME.tcpdump.err`) in this process's scratch directory, and waits until it listens: the
/// child, the capture file and the message file.
fn start_tcpdump(name: &str, iface: &str, filter: &[&str]) -> (Child, PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("rdma-trace-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{name}.pcap"));
    let err = dir.join(format!("{name}.tcpdump.err"));
    let _ = fs::remove_file(&file);
    let child = Command::new("tcpdump")
        .args(["-Z", "root", "-U", "-i", iface, "-w"])
        .arg(&file)
        .args(filter)
        .stdout(Stdio::null())
        .stderr(fs::File::create(&err).unwrap())
        .spawn()
        .expect("tcpdump starts");
    wait_for(20, "tcpdump to listen", || {
        fs::read_to_string(&err).is_ok_and(|s| s.contains("listening on"))
    });
    (child, file, err)
}

impl Tcpdump {
    fn start(name: &str) -> Tcpdump {
        let (child, file, err) = start_tcpdump(name, "veth0", &["udp", "port", "4791"]);
        Tcpdump {
            child,
            file,
            err,
            sent_before: sent_pkts("rxe0") + sent_pkts("rxe1"),
        }
    }

    /// Waits until the file holds every packet rxe0 and rxe1 sent since the start, then stops.
    fn stop(mut self) -> PathBuf {
        let mut want = 0;
        let mut have = 0;
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end {
            want = sent_pkts("rxe0") + sent_pkts("rxe1") - self.sent_before;
            have = count_frames(&self.file);
            if have >= want {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        sh(&format!("kill -INT {}", self.child.id()));
        let _ = self.child.wait();
        assert_eq!(
            have,
            want,
            "tcpdump captured {have} of the {want} packets rxe0 and rxe1 sent: {}",
            fs::read_to_string(&self.err).unwrap_or_default()
        );
        kept(&self.file)
    }
}

/// The capture `file`, also copied to `$RDMA_TEST_TRACE_KEEP` when that names a directory (how
/// tests/data's fixtures were made).
fn kept(file: &Path) -> PathBuf {
    if let Ok(dir) = std::env::var("RDMA_TEST_TRACE_KEEP") {
        fs::copy(file, Path::new(&dir).join(file.file_name().unwrap())).unwrap();
    }
    file.to_path_buf()
}

/// rping's default port (`-p`), on which its server's rdma_cm id listens.
const RPING_PORT: u16 = 7174;

/// Where a test's server listens before its client may start.
#[derive(Clone, Copy)]
enum Listens {
    /// A TCP port (the tools that exchange their QP numbers over a socket).
    Tcp(u16),
    /// An rdma_cm port: one of the server's own ids, not any id that
    /// listens (the kernel's NFS server, say, may have one up in the guest).
    Cm(u16),
}

/// Runs `server` in the background and `client` in the foreground, both under a timeout, the
/// client once the server listens where `at` says.
fn pair(server: &str, client: &str, at: Listens) -> (String, String) {
    try_pair(server, client, at).unwrap_or_else(|why| panic!("{why}"))
}

/// [`pair`], with a failure as its report. A client that fails stops its server (SIGTERM,
/// which `timeout` passes on) instead of leaving it to wait out its time.
fn try_pair(server: &str, client: &str, at: Listens) -> Result<(String, String), String> {
    let srv = Command::new("bash")
        .arg("-c")
        .arg(format!("exec timeout 90 {server}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("server starts");
    match at {
        Listens::Tcp(port) => wait_for(30, "the server to listen", || {
            sh(&format!("ss -Hltn 'sport = :{port}'"))
                .1
                .contains("LISTEN")
        }),
        Listens::Cm(port) => wait_for(30, "the server's rdma_cm id to listen", || {
            let (_, ids) = sh("rdma resource show cm_id");
            let at = format!(":{port}");
            ids.lines().any(|l| {
                l.contains("state LISTEN")
                    && l.split_whitespace()
                        .skip_while(|w| *w != "src-addr")
                        .nth(1)
                        .is_some_and(|a| a.ends_with(&at))
            })
        }),
    }
    let (ok, cout) = sh(&format!("timeout 90 {client}"));
    if !ok {
        sh(&format!("kill -TERM {}", srv.id()));
    }
    let out = srv.wait_with_output().unwrap();
    let sout = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !ok {
        return Err(format!(
            "client `{client}` failed:\n{cout}\nserver:\n{sout}"
        ));
    }
    if !out.status.success() {
        return Err(format!(
            "server `{server}` failed:\n{sout}\nclient:\n{cout}"
        ));
    }
    Ok((sout, cout))
}

/// Runs rdma-core's `ibv_{kind}_pingpong` with `args` from rxe0 to rxe1 under a capture: its
/// SEND messages (each side sends `-n` of `-s` bytes, its buffer filled with 0x7b), checked for
/// that length and content.
fn pingpong_sends(kind: &str, args: &str, size: usize) -> Vec<Value> {
    let path = WirePath::up();
    let tool = format!("ibv_{kind}_pingpong");
    let cap = Tcpdump::start(&format!("{kind}_pingpong"));
    pair(
        &format!("{tool} -d rxe1 -g {} {args}", path.gid1),
        &format!("{tool} -d rxe0 -g {} {args} 127.0.0.1", path.gid0),
        Listens::Tcp(18515),
    );
    let file = cap.stop();
    let (pkts, payloads) = compare_with_tshark(&file);
    let msgs = messages(&file, &payloads, &pkts);
    let sends: Vec<Value> = of_kind(&msgs, "SEND").into_iter().cloned().collect();
    assert_eq!(sends.len(), 6, "{msgs:?}");
    for m in &sends {
        assert_eq!(m["length"], size as u64);
        assert_eq!(m["sha256"].as_str().unwrap(), sha(&vec![0x7b; size]));
    }
    sends
}

#[test]
#[ignore = "needs an RDMA device (rxe0 on veth0 in ci/vm), root, tcpdump and tshark"]
fn capture_rc_pingpong_sends() {
    pingpong_sends("rc", "-s 3000 -n 3 -m 1024", 3000);
}

#[test]
#[ignore = "needs an RDMA device (rxe0 on veth0 in ci/vm), root, tcpdump and tshark"]
fn capture_ud_pingpong_datagrams() {
    for m in pingpong_sends("ud", "-s 500 -n 3", 500) {
        assert!(m["src_qp"].is_u64(), "{m}");
    }
}

/// rping's server READs the client's ping buffer and WRITEs it back: `size` bytes, the text it
/// prints (`-v`) and a NUL. Checks that each of the `count` READs and WRITEs carried what the
/// server printed.
fn check_rping_data(sout: &str, msgs: &[Value], count: usize, size: usize) {
    let printed: Vec<String> = sout
        .lines()
        .filter_map(|l| l.strip_prefix("server ping data: "))
        .map(|s| {
            let mut b = s.as_bytes().to_vec();
            b.resize(size, 0);
            sha(&b)
        })
        .collect();
    assert_eq!(printed.len(), count, "server output:\n{sout}");
    for kind in ["READ", "WRITE"] {
        let ms = of_kind(msgs, kind);
        let digests: Vec<String> = ms
            .iter()
            .map(|m| m["sha256"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(digests, printed, "{kind} messages: {ms:?}");
    }
}

/// Runs perftest's `tool` from rxe0 to rxe1 with `args` under a capture named
/// `name`, checks every packet's fields against tshark, and returns the
/// reassembled messages.
fn perftest_messages(path: &WirePath, tool: &str, name: &str, args: &str) -> Vec<Value> {
    let cap = Tcpdump::start(name);
    pair(
        &format!("{tool} -d rxe1 -x {} {args}", path.gid1),
        &format!("{tool} -d rxe0 -x {} {args} 127.0.0.1", path.gid0),
        Listens::Tcp(18515),
    );
    let file = cap.stop();
    let (pkts, payloads) = compare_with_tshark(&file);
    messages(&file, &payloads, &pkts)
}

/// perftest fills its buffers with random bytes: the digests are checked against tshark's
/// payloads, the counts and lengths against the arguments.
fn perftest(tool: &str, kind: &str, extra: &str) {
    let path = WirePath::up();
    let (size, iters) = (5000u64, 8u64);
    let msgs = perftest_messages(
        &path,
        tool,
        tool,
        &format!("-s {size} -n {iters} -F {extra}"),
    );
    for m in messages_of(&msgs, kind, iters, size) {
        if kind != "SEND" {
            assert_eq!(m["dma_len"].as_u64(), Some(size), "{m}");
        }
    }
}

/// The `kind` messages of `msgs`, checked to be at least `iters` and each `len` bytes long.
fn messages_of<'a>(msgs: &'a [Value], kind: &str, iters: u64, len: u64) -> Vec<&'a Value> {
    let ms = of_kind(msgs, kind);
    assert!(
        ms.len() as u64 >= iters,
        "{} {kind} messages: {msgs:?}",
        ms.len()
    );
    for m in &ms {
        assert_eq!(m["length"].as_u64(), Some(len), "{m}");
    }
    ms
}

#[test]
#[ignore = "needs an RDMA device (rxe0 on veth0 in ci/vm), root, tcpdump and tshark"]
fn capture_perftest_write() {
    perftest("ib_write_bw", "WRITE", "");
}

#[test]
#[ignore = "needs an RDMA device (rxe0 on veth0 in ci/vm), root, tcpdump and tshark"]
fn capture_perftest_read() {
    perftest("ib_read_bw", "READ", "");
}

#[test]
#[ignore = "needs an RDMA device (rxe0 on veth0 in ci/vm), root, tcpdump and tshark"]
fn capture_perftest_send() {
    perftest("ib_send_bw", "SEND", "");
}

/// Atomics, both kinds: every packet's fields (the AtomicETH's operands, the
/// AtomicAckETH's original value) equal tshark's, and every atomic is paired
/// with its ACK.
#[test]
#[ignore = "needs an RDMA device (rxe0 on veth0 in ci/vm), root, tcpdump and tshark"]
fn capture_perftest_atomics() {
    let path = WirePath::up();
    let iters = 8u64;
    for (ty, kind) in [("FETCH_AND_ADD", "FETCH_ADD"), ("CMP_AND_SWAP", "CMP_SWAP")] {
        let msgs = perftest_messages(
            &path,
            "ib_atomic_bw",
            &format!("ib_atomic_bw_{kind}"),
            &format!("-n {iters} -F -A {ty}"),
        );
        for m in messages_of(&msgs, kind, iters, 8) {
            assert!(
                m["atomic"]["original"].is_u64(),
                "an atomic without its ACK: {m}"
            );
        }
    }
}

#[test]
#[ignore = "needs an RDMA device (rxe0 on veth0 in ci/vm), root, tcpdump and tshark"]
fn capture_rping_cm_read_write() {
    let _path = WirePath::up();
    let cap = Tcpdump::start("rping");
    let (count, size) = (3, 100);
    // The server listens on every device (0.0.0.0): ci/vm puts siw0 on veth1 beside rxe1, and
    // a listener bound to 10.8.0.2 would go to whichever device rdma_cm finds first for it.
    let (sout, _) = pair(
        &format!("rping -s -a 0.0.0.0 -C {count} -S {size} -v"),
        &format!("rping -c -a {IP1} -I {IP0} -C {count} -S {size} -v"),
        Listens::Cm(RPING_PORT),
    );
    let file = cap.stop();
    let (pkts, payloads) = compare_with_tshark(&file);
    let msgs = messages(&file, &payloads, &pkts);
    check_rping_data(&sout, &msgs, count, size);
    // The connection was set up and torn down through the CM on QP1.
    let cm: Vec<&str> = pkts
        .values()
        .filter_map(|p| p.pointer("/cm/message/msg").and_then(Value::as_str))
        .collect();
    for m in ["REQ", "REP", "RTU", "DREQ", "DREP"] {
        assert!(cm.contains(&m), "no CM {m} in the capture: {cm:?}");
    }
}

/// The kernel's NFS server exporting a tmpfs over RDMA (port 20049), as in
/// `../shared/kernel-peers.md` §1 of the project's notes. Dropping it stops what it started
/// (by process id) and unmounts what it mounted.
struct NfsServer {
    pids: Vec<String>,
}

impl NfsServer {
    fn up() -> NfsServer {
        for tool in ["rpc.nfsd", "exportfs", "rpc.mountd", "rpcbind", "mount.nfs"] {
            assert!(
                sh(&format!("command -v {tool}")).0,
                "{tool} is not installed (ci/setup: nfs-kernel-server)"
            );
        }
        let mut server = NfsServer { pids: Vec::new() };
        must("modprobe nfsd && modprobe rpcrdma");
        must("mountpoint -q /proc/fs/nfsd || mount -t nfsd nfsd /proc/fs/nfsd");
        must("mkdir -p /export /run/rpcbind /mnt/nfs /var/lib/nfs");
        must("mountpoint -q /export || mount -t tmpfs -o size=64m tmpfs /export");
        fs::write(
            "/etc/exports",
            "/export 10.8.0.0/24(rw,no_root_squash,insecure,fsid=0,no_subtree_check)\n",
        )
        .expect("/etc/exports is writable (ci/vm's overlay)");
        for (daemon, start) in [("rpcbind", "rpcbind -w"), ("rpc.mountd", "rpc.mountd")] {
            if !sh(&format!("pidof {daemon}")).0 {
                must(start);
                server
                    .pids
                    .push(must(&format!("pidof {daemon}")).trim().to_string());
            }
        }
        must("exportfs -ra");
        must("rpc.nfsd --grace-time 10 --lease-time 10 4");
        must("echo 'rdma 20049' > /proc/fs/nfsd/portlist");
        server
    }
}

impl Drop for NfsServer {
    fn drop(&mut self) {
        sh("umount /mnt/nfs 2>/dev/null; rpc.nfsd 0; exportfs -ua; umount /export");
        for pid in &self.pids {
            sh(&format!("kill {pid}"));
        }
    }
}

const NFS_MOUNT: &str =
    "timeout 60 mount -t nfs -o vers=3,nolock,proto=rdma,port=20049 10.8.0.2:/export /mnt/nfs";

/// NFSv3 over RDMA, the kernel's client (rxe0, 10.8.0.1) and server (rxe1, 10.8.0.2), across
/// the captured veth pair: a file of known content is written through the mount, the mount is
/// dropped (so nothing is cached) and the file read back. The capture's packets are checked
/// against tshark, its messages for completeness, and its RPCs: every call paired with its
/// reply, the WRITE calls' read chunks and the READ replies' write chunks each holding the
/// whole file (lengths and digests), transport and RPC headers equal to tshark's.
#[test]
#[ignore = "needs an RDMA device (rxe0 on veth0 in ci/vm), root, tcpdump, tshark and nfs-kernel-server"]
fn capture_nfs3_over_rdma_write_and_read_a_file() {
    let _path = WirePath::up();
    let _server = NfsServer::up();
    // One full 128 KiB RPC (the mount's rsize and wsize) and a tail that is not a whole page.
    let content = nfs_content(150_000);
    let cap = Tcpdump::start("nfs3");
    must(NFS_MOUNT);
    fs::write("/mnt/nfs/file", &content).unwrap();
    must("sync /mnt/nfs/file && umount /mnt/nfs");
    must(NFS_MOUNT);
    let back = fs::read("/mnt/nfs/file").unwrap();
    must("umount /mnt/nfs");
    assert!(back == content, "the file read back differs");
    let file = cap.stop();
    let (pkts, payloads) = compare_with_tshark(&file);
    messages(&file, &payloads, &pkts);
    let rpcs = check_nfs_rpcs(&file, &content);
    let procs: Vec<u64> = rpcs
        .iter()
        .filter(|r| r["program"] == 100_003)
        .filter_map(|r| r["procedure"].as_u64())
        .collect();
    // NFSv3 WRITE (7), COMMIT (21) and READ (6) all went over RDMA.
    for p in [6, 7, 21] {
        assert!(procs.contains(&p), "no NFSv3 procedure {p}: {procs:?}");
    }
}
