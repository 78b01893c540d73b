//! The Linux kernel's 9P client (`trans=rdma`) mounts `rdma-9p serve` and
//! does what a user would; the served directory, read directly, is the
//! oracle. Device tests: they need root, the `9pnet_rdma` module and an
//! RDMA device (`ci/vm run`); a requested device that is missing fails.

use std::io::{Read, Write};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use sha2::{Digest, Sha256};

mod common;
use common::{require_device, required_env, run, tmpdir, Server};

/// A kernel 9P mount, unmounted on drop (lazily when a test failed).
struct Mount {
    at: PathBuf,
    mounted: bool,
}

impl Mount {
    fn new(addr: &str, port: u16, at: &Path) -> Mount {
        std::fs::create_dir_all(at).unwrap();
        let opts = format!("trans=rdma,port={port},version=9p2000.L");
        // A hung connection must fail the test, not hang it.
        run(
            "timeout",
            &[
                "60",
                "mount",
                "-t",
                "9p",
                "-o",
                &opts,
                addr,
                at.to_str().unwrap(),
            ],
        );
        Mount {
            at: at.to_path_buf(),
            mounted: true,
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.at.join(rel)
    }

    fn unmount(mut self) {
        run("timeout", &["60", "umount", self.at.to_str().unwrap()]);
        self.mounted = false;
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg("-l").arg(&self.at).status();
        }
    }
}

fn sha(p: &Path) -> Vec<u8> {
    let mut f = std::fs::File::open(p).unwrap();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    h.finalize().to_vec()
}

fn kernel_client_uses_the_server(addr: &str, port: u16, tag: &str) {
    run("modprobe", &["9pnet_rdma"]);
    run("modprobe", &["9p"]);
    let export = tmpdir(&format!("export-{tag}"));
    let mnt = tmpdir(&format!("mnt-{tag}"));
    let mnt2 = tmpdir(&format!("mnt2-{tag}"));
    let outside = tmpdir(&format!("outside-{tag}"));
    std::fs::write(outside.join("secret"), b"s").unwrap();
    let mut server = Server::start(addr, port, &export);
    let m = Mount::new(addr, port, &mnt);

    eprintln!("kernel_mount: mounted");
    // Create, write, read back through the mount and in the export.
    std::fs::write(m.p("hello.txt"), b"hello over rdma\n").unwrap();
    assert_eq!(
        std::fs::read(m.p("hello.txt")).unwrap(),
        b"hello over rdma\n"
    );
    assert_eq!(
        std::fs::read(export.join("hello.txt")).unwrap(),
        b"hello over rdma\n"
    );
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(m.p("hello.txt"))
        .unwrap();
    f.write_all(b"more\n").unwrap();
    drop(f);
    assert_eq!(
        std::fs::read(export.join("hello.txt")).unwrap(),
        b"hello over rdma\nmore\n"
    );

    eprintln!("kernel_mount: create/write/read ok");
    // mkdir / rmdir.
    std::fs::create_dir_all(m.p("a/b/c")).unwrap();
    assert!(export.join("a/b/c").is_dir());
    std::fs::remove_dir(m.p("a/b/c")).unwrap();
    assert!(!export.join("a/b/c").exists());

    // rename, within and across directories.
    std::fs::rename(m.p("hello.txt"), m.p("a/renamed.txt")).unwrap();
    assert!(!export.join("hello.txt").exists());
    assert_eq!(
        std::fs::read(m.p("a/renamed.txt")).unwrap(),
        b"hello over rdma\nmore\n"
    );

    // symlink / readlink.
    symlink("renamed.txt", m.p("a/link")).unwrap();
    assert_eq!(
        std::fs::read_link(m.p("a/link")).unwrap(),
        Path::new("renamed.txt")
    );
    assert_eq!(
        std::fs::read_link(export.join("a/link")).unwrap(),
        Path::new("renamed.txt")
    );
    assert_eq!(std::fs::read(m.p("a/link")).unwrap().len(), 21);

    // Hard link, chmod, truncate.
    std::fs::hard_link(m.p("a/renamed.txt"), m.p("hard")).unwrap();
    assert_eq!(std::fs::metadata(export.join("hard")).unwrap().nlink(), 2);
    std::fs::set_permissions(m.p("hard"), std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        std::fs::metadata(export.join("a/renamed.txt"))
            .unwrap()
            .mode()
            & 0o777,
        0o600
    );
    std::fs::OpenOptions::new()
        .write(true)
        .open(m.p("hard"))
        .unwrap()
        .set_len(5)
        .unwrap();
    assert_eq!(
        std::fs::read(export.join("a/renamed.txt")).unwrap(),
        b"hello"
    );

    eprintln!("kernel_mount: names, links, modes ok");
    // ls -lR sees everything.
    let ls = run("ls", &["-lR", m.at.to_str().unwrap()]);
    for name in ["renamed.txt", "link -> renamed.txt", "hard", "b"] {
        assert!(ls.contains(name), "ls -lR lacks {name}:\n{ls}");
    }

    // Escapes through the mount: a rename across the root fails, and a
    // symlink planted in the export that points out is only ever resolved
    // by the client (the server never follows it: tests/session.rs).
    let e = std::fs::rename(m.p("hard"), outside.join("stolen")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EXDEV), "{e}");
    assert!(!outside.join("stolen").exists());
    let e = std::fs::hard_link(m.p("hard"), outside.join("stolen")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EXDEV), "{e}");

    eprintln!("kernel_mount: escapes refused");
    // A second client beside the first; when it leaves, the first is served on.
    let m2 = Mount::new(addr, port, &mnt2);
    assert_eq!(std::fs::read(m2.p("a/renamed.txt")).unwrap(), b"hello");
    m2.unmount();
    std::fs::remove_file(m.p("hard")).unwrap();
    std::fs::remove_file(m.p("a/link")).unwrap();
    std::fs::remove_file(m.p("a/renamed.txt")).unwrap();
    std::fs::remove_dir(m.p("a/b")).unwrap();
    std::fs::remove_dir(m.p("a")).unwrap();
    assert_eq!(std::fs::read_dir(&export).unwrap().count(), 0);

    eprintln!("kernel_mount: second client ok");
    // A clean unmount; the server outlives it.
    m.unmount();
    assert!(server.alive(), "rdma-9p exited with its client");
    let _ = std::fs::remove_dir_all(&export);
    let _ = std::fs::remove_dir_all(&outside);
}

#[test]
#[ignore = "needs an RDMA device (rxe0), root and the 9pnet_rdma module: run in ci/vm"]
fn kernel_mount_over_rxe() {
    require_device(&required_env("RDMA_TEST_DEVICE"));
    let ip = required_env("RDMA_TEST_IP");
    kernel_client_uses_the_server(&ip, 5640, "rxe");
}

#[test]
#[ignore = "needs an iWARP device (siw0), root and the 9pnet_rdma module: run in ci/vm"]
fn kernel_mount_over_iwarp() {
    require_device(&required_env("RDMA_TEST_IWARP_DEVICE"));
    let ip = required_env("RDMA_TEST_IWARP_IP");
    kernel_client_uses_the_server(&ip, 5641, "iwarp");
}

/// Polls `cond` every 50 ms until it holds or `secs` pass.
fn wait_for(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::park_timeout(Duration::from_millis(50));
    }
    cond()
}

/// The server is killed while the kernel writes through the mount: the
/// writer can be killed, new requests on the old mount fail instead of
/// hanging, and a new server on the same port serves a new mount.
fn server_killed_during_writes(addr: &str, port: u16, tag: &str) {
    run("modprobe", &["9pnet_rdma"]);
    run("modprobe", &["9p"]);
    let export = tmpdir(&format!("kill-export-{tag}"));
    let mnt = tmpdir(&format!("kill-mnt-{tag}"));
    let mnt2 = tmpdir(&format!("kill-mnt2-{tag}"));
    let server = Server::start(addr, port, &export);
    let m = Mount::new(addr, port, &mnt);
    let mut dd = Command::new("dd")
        .args([
            "if=/dev/zero",
            &format!("of={}", m.p("stream").display()),
            "bs=1M",
            "count=512",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("dd runs");
    let target = export.join("stream");
    assert!(
        wait_for(60, || std::fs::metadata(&target)
            .is_ok_and(|md| md.len() >= 1 << 20)),
        "no data arrived in 60 s"
    );
    drop(server);
    eprintln!("kernel_mount: server killed during writes");
    // Linux's trans_rdma does not cancel requests in flight when the
    // connection goes (its CM handler only marks the client disconnected),
    // so a writer caught mid-request waits until it is killed: what is
    // checked is that it can be killed, and that nothing else hangs.
    let ended = wait_for(20, || matches!(dd.try_wait(), Ok(Some(_))));
    if !ended {
        let _ = dd.kill();
    }
    let gone = wait_for(30, || matches!(dd.try_wait(), Ok(Some(_))));
    let mut err = String::new();
    if let Some(mut e) = dd.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    eprintln!(
        "kernel_mount: the writer ended by itself: {ended}; gone: {gone} ({:?}) {}",
        dd.try_wait(),
        err.trim()
    );
    assert!(gone, "the writer could not be killed within 30 s");
    // The old mount reports errors, and does not hang.
    let (tx, rx) = mpsc::channel();
    let probe = m.p("stream");
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::metadata(probe).map(|_| ()));
    });
    let r = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("a stat on the dead mount returns within 60 s");
    assert!(r.is_err(), "a stat on the dead mount succeeded");
    drop(m);
    // A new server on the same port serves a new mount.
    let _server = Server::start(addr, port, &export);
    let m2 = Mount::new(addr, port, &mnt2);
    std::fs::write(m2.p("after"), b"restarted").unwrap();
    assert_eq!(std::fs::read(export.join("after")).unwrap(), b"restarted");
    m2.unmount();
    let _ = std::fs::remove_dir_all(&export);
}

#[test]
#[ignore = "needs an RDMA device (rxe0), root and the 9pnet_rdma module: run in ci/vm"]
fn kernel_mount_server_killed_over_rxe() {
    require_device(&required_env("RDMA_TEST_DEVICE"));
    let ip = required_env("RDMA_TEST_IP");
    server_killed_during_writes(&ip, 5642, "rxe");
}

#[test]
#[ignore = "needs an iWARP device (siw0), root and the 9pnet_rdma module: run in ci/vm"]
fn kernel_mount_server_killed_over_iwarp() {
    require_device(&required_env("RDMA_TEST_IWARP_DEVICE"));
    let ip = required_env("RDMA_TEST_IWARP_IP");
    server_killed_during_writes(&ip, 5643, "iwarp");
}

/// Bulk traffic through the kernel's mount: a multi-MiB file, several
/// writers at once, a source tree copied in.
fn bulk_transfers(addr: &str, port: u16, tag: &str) {
    run("modprobe", &["9pnet_rdma"]);
    run("modprobe", &["9p"]);
    let export = tmpdir(&format!("bulk-export-{tag}"));
    let mnt = tmpdir(&format!("bulk-mnt-{tag}"));
    let mut server = Server::start(addr, port, &export);
    let m = Mount::new(addr, port, &mnt);
    // A multi-MiB file, checked by digest on both sides.
    let big: Vec<u8> = (0..(8u32 << 20))
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(m.p("big.bin"), &big).unwrap();
    let want = Sha256::digest(&big).to_vec();
    assert_eq!(sha(&export.join("big.bin")), want);
    assert_eq!(sha(&m.p("big.bin")), want);

    // Several writers at once (requests in flight together on one QP).
    let writers: Vec<_> = (0..4u8)
        .map(|w| {
            let path = m.p(&format!("w{w}"));
            std::thread::spawn(move || {
                let data = vec![w + 1; 1 << 20];
                std::fs::write(&path, &data).unwrap();
                Sha256::digest(&data).to_vec()
            })
        })
        .collect();
    for (w, t) in writers.into_iter().enumerate() {
        let want = t.join().expect("a writer");
        assert_eq!(sha(&export.join(format!("w{w}"))), want);
        std::fs::remove_file(m.p(&format!("w{w}"))).unwrap();
    }

    // A source tree copied in, compared by diff -r.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    run(
        "cp",
        &["-r", src.to_str().unwrap(), m.p("src").to_str().unwrap()],
    );
    run(
        "diff",
        &["-r", src.to_str().unwrap(), m.p("src").to_str().unwrap()],
    );
    run(
        "diff",
        &[
            "-r",
            src.to_str().unwrap(),
            export.join("src").to_str().unwrap(),
        ],
    );
    run("rm", &["-r", m.p("src").to_str().unwrap()]);

    std::fs::remove_file(m.p("big.bin")).unwrap();
    assert_eq!(std::fs::read_dir(&export).unwrap().count(), 0);
    m.unmount();
    assert!(server.alive(), "rdma-9p exited with its client");
    let _ = std::fs::remove_dir_all(&export);
}

#[test]
#[ignore = "needs an RDMA device (rxe0), root and the 9pnet_rdma module: run in ci/vm"]
fn kernel_mount_bulk_over_rxe() {
    require_device(&required_env("RDMA_TEST_DEVICE"));
    let ip = required_env("RDMA_TEST_IP");
    bulk_transfers(&ip, 5644, "rxe");
}

#[test]
#[ignore = "needs an iWARP device (siw0), root and the 9pnet_rdma module: run in ci/vm"]
fn kernel_mount_bulk_over_iwarp() {
    require_device(&required_env("RDMA_TEST_IWARP_DEVICE"));
    let ip = required_env("RDMA_TEST_IWARP_IP");
    bulk_transfers(&ip, 5645, "iwarp");
}
