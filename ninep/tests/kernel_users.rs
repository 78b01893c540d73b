//! Who may do what, and how much, through the Linux kernel's 9P client: a
//! server with the default policy (root squashed) mounted by root in the
//! guest, where what root does through the mount is what the anonymous user
//! may do in the served directory (read directly as the oracle); and a
//! server whose descriptors are few, where one mount holding every file it
//! may leaves another mount's opens alone. Device tests: root, the
//! `9pnet_rdma` module and an RDMA device (`ci/vm run`).

use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};

mod common;
use common::{require_device, required_env, run, tmpdir, Mount, Server};

fn root_file(dir: &std::path::Path, name: &str, mode: u32) {
    let p = dir.join(name);
    std::fs::write(&p, b"root's").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// What `cmd` exits with and says (it may fail: that is the point).
fn attempt(cmd: &str, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(cmd).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn root_is_squashed(addr: &str, port: u16, tag: &str) {
    run("modprobe", &["9pnet_rdma"]);
    run("modprobe", &["9p"]);
    let export = tmpdir(&format!("users-export-{tag}"));
    let mnt = tmpdir(&format!("users-mnt-{tag}"));
    std::fs::set_permissions(&export, std::fs::Permissions::from_mode(0o1777)).unwrap();
    root_file(&export, "tool", 0o755);
    root_file(&export, "shared", 0o644);
    let _server = Server::start_with(addr, port, &export, &[]);
    let m = Mount::new(addr, port, &mnt);

    // A device node: refused (the anonymous user has no CAP_MKNOD).
    let (made, said) = attempt("mknod", &[m.p("null").to_str().unwrap(), "c", "1", "3"]);
    assert!(!made, "mknod of a device node through the mount succeeded");
    assert!(!export.join("null").exists(), "mknod said {said:?}");
    // A set-uid bit on root's program, and root's program given away.
    let (done, said) = attempt("chmod", &["4755", m.p("tool").to_str().unwrap()]);
    assert!(!done, "chmod 4755 of root's file succeeded");
    let md = std::fs::metadata(export.join("tool")).unwrap();
    assert_eq!(md.mode() & 0o7777, 0o755, "chmod said {said:?}");
    // open(O_CREAT) of an existing root file: refused (not writable by the
    // anonymous user), and its owner stays.
    let opened = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(m.p("shared"));
    assert_eq!(
        opened.map(|_| ()).map_err(|e| e.kind()),
        Err(ErrorKind::PermissionDenied)
    );
    let md = std::fs::metadata(export.join("shared")).unwrap();
    assert_eq!((md.uid(), md.mode() & 0o7777), (0, 0o644));
    // What root creates is the anonymous user's.
    std::fs::write(m.p("new"), b"x").unwrap();
    let md = std::fs::metadata(export.join("new")).unwrap();
    assert_eq!((md.uid(), md.gid()), (65534, 65534));
    let (given, _) = attempt("chown", &["0", m.p("new").to_str().unwrap()]);
    assert!(!given, "chown to root through the mount succeeded");
    assert_eq!(std::fs::metadata(export.join("new")).unwrap().uid(), 65534);
    m.unmount();
}

/// A server limited to 400 descriptors and 2 connections: one mount opens
/// files until it is refused (`EMFILE`: its share and the shared pool used
/// up), the other mount still mounts and opens its share, and a third
/// connection is rejected.
fn shares_of_descriptors_and_connections(addr: &str, port: u16, tag: &str) {
    run("modprobe", &["9pnet_rdma"]);
    run("modprobe", &["9p"]);
    let export = tmpdir(&format!("share-export-{tag}"));
    let (mnt_a, mnt_b, mnt_c) = (
        tmpdir(&format!("share-a-{tag}")),
        tmpdir(&format!("share-b-{tag}")),
        tmpdir(&format!("share-c-{tag}")),
    );
    for i in 0..200 {
        std::fs::write(export.join(format!("f{i}")), b"x").unwrap();
    }
    let _server = Server::start_under(
        &["prlimit", "--nofile=400:400", "--"],
        addr,
        port,
        &export,
        &["--squash", "none", "--max-connections", "2"],
    );
    let a = Mount::new(addr, port, &mnt_a);
    let mut held = Vec::new();
    let mut refused = None;
    for i in 0..200 {
        match std::fs::File::open(a.p(&format!("f{i}"))) {
            Ok(f) => held.push(f),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let refused = refused.expect("200 files open on one mount: no share was enforced");
    assert_eq!(refused.raw_os_error(), Some(libc::EMFILE), "{refused}");
    // 400 - 64 - 3 x 64 - 2 x 2 = 140 for open files: 16 for each of the two
    // connections, 108 in the pool. The kernel's client holds one or two itself.
    assert!(
        (110..=124).contains(&held.len()),
        "{} files open before EMFILE",
        held.len()
    );
    // The other mount: its own share, while the first holds all it could.
    let b = Mount::new(addr, port, &mnt_b);
    assert_eq!(std::fs::read(b.p("f0")).unwrap(), b"x");
    let opened: Vec<_> = (0..12)
        .map(|i| std::fs::File::open(b.p(&format!("f{i}"))).unwrap())
        .collect();
    // A third connection: rejected, the mount fails (within its timeout).
    if let Ok(c) = Mount::try_with(addr, port, &mnt_c, "") {
        c.unmount();
        panic!("a third connection was served (--max-connections 2)");
    }
    drop(opened);
    drop(held);
    b.unmount();
    a.unmount();
}

#[test]
#[ignore = "needs an RDMA device (rxe0), root and the 9pnet_rdma module: run in ci/vm"]
fn kernel_mount_descriptor_and_connection_shares_over_rxe() {
    require_device(&required_env("RDMA_TEST_DEVICE"));
    let ip = required_env("RDMA_TEST_IP");
    shares_of_descriptors_and_connections(&ip, 5652, "rxe");
}

#[test]
#[ignore = "needs an RDMA device (rxe0), root and the 9pnet_rdma module: run in ci/vm"]
fn kernel_mount_root_is_squashed_over_rxe() {
    require_device(&required_env("RDMA_TEST_DEVICE"));
    let ip = required_env("RDMA_TEST_IP");
    root_is_squashed(&ip, 5650, "rxe");
}

#[test]
#[ignore = "needs an iWARP device (siw0), root and the 9pnet_rdma module: run in ci/vm"]
fn kernel_mount_root_is_squashed_over_iwarp() {
    require_device(&required_env("RDMA_TEST_IWARP_DEVICE"));
    let ip = required_env("RDMA_TEST_IWARP_IP");
    root_is_squashed(&ip, 5651, "iwarp");
}
