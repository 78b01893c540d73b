//! `rdma link delete` of rxe0 under a mounted rdma-nfs client, then `rdma
//! link add` of it again: the transport closes on `DEVICE_REMOVAL`, the
//! delete finishes while the process lives, and the same client reconnects
//! and reads its file once the device is back.
//!
//! Deleting the device is the last thing the device tests do (`ci/test`
//! runs the `device_removal` binaries after every other one), and the test
//! first checks that nothing outside this process holds the device: Linux
//! 6.1's kernel users that do not let go on `DEVICE_REMOVAL` (a kernel 9P
//! mount over RDMA keeps its connection until it is unmounted), and other
//! processes' verbs contexts (rxe has no `disassociate_ucontext`, so the
//! kernel waits for every open context), make `rdma link delete` wait
//! without end, and rxe0, half removed, then fails every later test with
//! `ENODEV`. In the VM, a kernel 9P mount left on rxe0 keeps the delete
//! waiting in `cma_remove_one` until it is unmounted, and then it finishes.
//!
//! Device test: it needs root, the kernel's nfsd and rxe0 (`ci/vm run`).

mod common;

use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{content, mount, ok, required_env, runtime, server_ip, Server};
use rdma_nfs::nfs3::Options;
use rdma_nfs::transport;
use rdma_test_support::link::{fds_on, run_child, uverbs_node, Link};

/// The rxe device under test as `rdma link add` makes it again: on the
/// netdev the VM gave it, with the IPv4 GID the tests use.
fn rxe_link(dev: &str) -> Link {
    let ip = required_env("RDMA_TEST_IP")
        .parse()
        .expect("RDMA_TEST_IP is an IPv4 address");
    let gid_index = std::env::var("RDMA_TEST_GID_INDEX")
        .map_or(1, |i| i.parse().expect("RDMA_TEST_GID_INDEX is a number"));
    Link {
        dev: dev.to_string(),
        kind: "rxe".to_string(),
        netdev: std::env::var("RDMA_TEST_NETDEV").unwrap_or_else(|_| "veth0".into()),
        gid: Some((ip, gid_index)),
    }
}

/// Who else holds `dev`, from `rdma resource show`: verbs contexts of other
/// processes (a resource names the thread that made it), and CM ids of other processes or of kernel users other than
/// the NFS server's (`[rpcrdma]`, which closes its connections on
/// `DEVICE_REMOVAL`). Each is the line that names it.
fn other_holders(dev: &str) -> Vec<String> {
    let me = std::process::id().to_string();
    let mut held = Vec::new();
    for what in ["ctx", "cm_id"] {
        let out = Command::new("rdma")
            .args(["resource", "show", what])
            .output()
            .expect("rdma runs");
        ok(&out, &format!("rdma resource show {what}"));
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let on_dev = words.windows(2).any(|w| {
                (w[0] == "dev" && w[1] == dev)
                    || (w[0] == "link" && w[1].split('/').next() == Some(dev))
            });
            let after = |key: &str| {
                words
                    .windows(2)
                    .find(|w| w[0] == key)
                    .map(|w| w[1].to_string())
            };
            let other = match (after("pid"), after("comm")) {
                (Some(pid), _) => tgid(&pid).as_deref() != Some(me.as_str()),
                (None, comm) => comm.as_deref() != Some("[rpcrdma]"),
            };
            if on_dev && other {
                held.push(format!("{what}: {}", line.trim()));
            }
        }
    }
    held
}

/// The process of thread `tid` (`rdma resource` names the thread that
/// made a resource), from `/proc/TID/status`.
fn tgid(tid: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .map(|v| v.trim().to_string())
}

/// What holds a device being deleted: this process's descriptors on its
/// node, the RDMA devices sysfs lists, `rdma resource show`, and where the
/// kernel has the `rdma link delete` process (`pid`) waiting.
fn snapshot(node: &str, pid: Option<u32>) -> String {
    let devs: Vec<String> = std::fs::read_dir("/sys/class/infiniband")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let res = Command::new("rdma")
        .args(["resource", "show"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).replace('\n', "; "))
        .unwrap_or_default();
    let stack = pid
        .and_then(|p| std::fs::read_to_string(format!("/proc/{p}/stack")).ok())
        .map(|s| {
            s.lines()
                .take(8)
                .map(|l| l.split_whitespace().nth(1).unwrap_or(l).to_string())
                .collect::<Vec<_>>()
                .join(" < ")
        })
        .unwrap_or_default();
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!(
        "[{}.{:03}] fds on {node}: {}; devices {devs:?}; resources: {res}; delete waits in: {stack}",
        t.as_secs() % 1000,
        t.subsec_millis(),
        fds_on(node)
    )
}

/// The child of `device_removed_and_added_again_over_rxe`: a mounted
/// client, its device deleted (`DEVICE_REMOVAL`), the delete allowed to
/// finish, the device added again, and the same client reads the file
/// again over a new connection.
fn removal_child(ip: IpAddr, dev: &str) {
    let test = "removal";
    let rt = runtime();
    let o = Options {
        transport: transport::Options {
            call_timeout: Duration::from_secs(20),
            // The first connection of a process under TCG on a loaded host
            // took more than 5 s.
            connect_timeout: Duration::from_secs(15),
            ..transport::Options::default()
        },
        ..Options::default()
    };
    let client = rt.block_on(mount(ip, test, o));
    let data = content(256 << 10, 25);
    let f = rt
        .block_on(async {
            let f = client.create(client.root(), b"f", 0o644).await?;
            client.write_all(&f, &data).await?;
            Ok::<_, rdma_nfs::nfs3::NfsError>(f)
        })
        .unwrap_or_else(|e| panic!("write before the removal: {e}"));
    let stats = client.transport().stats();
    let node = uverbs_node(dev);
    // Only this process and the NFS server may hold the device.
    let others = other_holders(dev);
    assert!(
        others.is_empty(),
        "{dev} is held outside this test, so rdma link delete would wait for it without \
         end (and leave {dev} half removed for every later test): {others:?}"
    );
    println!("before the delete: {}", snapshot(&node, None));
    let start = Instant::now();
    let mut delete = Command::new("rdma")
        .args(["link", "delete", dev])
        .spawn()
        .expect("rdma link delete");
    // The transport's task sees DEVICE_REMOVAL, drops the connection and
    // everything on the device, and has librdmacm look again.
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(20);
        while stats.device_removals.load(Ordering::Relaxed) == 0 {
            assert!(
                Instant::now() < deadline,
                "no DEVICE_REMOVAL within 20 s of rdma link delete"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    println!("DEVICE_REMOVAL after {:?}", start.elapsed());
    println!("at DEVICE_REMOVAL: {}", snapshot(&node, Some(delete.id())));
    // Drive the runtime while the delete runs (the task's reconnection
    // attempts let librdmacm re-read its device list).
    let deleted = rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = Instant::now();
        loop {
            if let Some(st) = delete.try_wait().expect("wait") {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            if last.elapsed() >= Duration::from_secs(1) {
                last = Instant::now();
                println!(
                    "{:?}: delete pending: {}",
                    start.elapsed(),
                    snapshot(&node, Some(delete.id()))
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let Some(st) = deleted else {
        let held = snapshot(&node, Some(delete.id()));
        let _ = delete.kill();
        panic!(
            "rdma link delete still waited 30 s after DEVICE_REMOVAL while the process lived \
             (the client had dropped the connection): {held}"
        );
    };
    assert!(st.success(), "rdma link delete: {st}");
    println!("device deleted after {:?}", start.elapsed());
    assert_eq!(stats.chunks_registered.load(Ordering::Relaxed), 0);
    rxe_link(dev).add();
    println!("device back after {:?}", start.elapsed());
    let back = rt
        .block_on(client.read_all(&f))
        .unwrap_or_else(|e| panic!("read after the device came back: {e}"));
    assert!(
        back == data,
        "the file read after the device came back differs"
    );
    println!(
        "read again after {:?}; connects {}, removals {}",
        start.elapsed(),
        stats.connects.load(Ordering::Relaxed),
        stats.device_removals.load(Ordering::Relaxed)
    );
    assert!(stats.connects.load(Ordering::Relaxed) >= 2, "reconnected");
    assert_eq!(stats.device_removals.load(Ordering::Relaxed), 1);
    rt.block_on(client.close());
}

/// `rdma link delete` of rxe0 under a mounted client, then `rdma link add`:
/// the transport closes on `DEVICE_REMOVAL` (the delete finishes while the
/// process lives) and reconnects once the device is back. Runs in a child
/// process (this binary again) so that a hang is killed, and the device is
/// put back whatever happens, for the tests after it.
#[test]
#[ignore = "needs an RDMA device (rxe0) it may delete and add again, root and the kernel's nfsd: run in ci/vm"]
fn device_removed_and_added_again_over_rxe() {
    let ip = server_ip(false);
    let dev = required_env("RDMA_TEST_DEVICE");
    if std::env::var_os("RDMA_NFS_REMOVAL_CHILD").is_some() {
        removal_child(ip, &dev);
        return;
    }
    let server = Server::up("removal");
    let status = run_child(
        "device_removed_and_added_again_over_rxe",
        "RDMA_NFS_REMOVAL_CHILD",
        Duration::from_secs(100),
    );
    // Put the device back for the tests after this one: a pending delete
    // finishes once the child is gone.
    let settled = rxe_link(&dev).restore();
    // The device is usable again by a new process's connection (what every
    // later test needs): this one has not touched RDMA yet.
    let usable = settled.then(|| {
        let rt = runtime();
        let o = transport::Options {
            connect_timeout: Duration::from_secs(20),
            ..transport::Options::default()
        };
        rt.block_on(async {
            let t = transport::Transport::connect(SocketAddr::new(ip, 20049), o).await?;
            t.close().await;
            Ok::<_, transport::Error>(())
        })
    });
    drop(server);
    let status = status.expect("the child finished within 100 s");
    assert!(
        settled,
        "rdma link delete of {dev} was still pending 30 s after the child exited: \
         something outside this test holds the device"
    );
    assert!(status.success(), "the child failed: {status}");
    match usable {
        Some(Ok(())) => {}
        Some(Err(e)) => panic!("{dev} added again, but a new connection fails: {e}"),
        None => panic!("{dev} is missing after the test"),
    }
}
