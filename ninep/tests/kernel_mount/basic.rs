//! What a user does through the kernel's mount (files, directories, links,
//! attributes, the confinement seen from the client), and a server killed
//! while a client writes.

use super::*;

pub(crate) fn kernel_client_uses_the_server(addr: &str, port: u16, tag: &str) {
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

    // chown, chmod and utimes (Tsetattr), each seen by stat on both sides.
    std::os::unix::fs::chown(m.p("hard"), Some(1234), Some(5678)).unwrap();
    std::fs::set_permissions(m.p("hard"), std::fs::Permissions::from_mode(0o4751)).unwrap();
    let atime = std::time::UNIX_EPOCH + Duration::new(1_000_000_000, 123_456_789);
    let mtime = std::time::UNIX_EPOCH + Duration::new(1_200_000_000, 987_654_321);
    std::fs::File::options()
        .write(true)
        .open(m.p("hard"))
        .unwrap()
        .set_times(
            std::fs::FileTimes::new()
                .set_accessed(atime)
                .set_modified(mtime),
        )
        .unwrap();
    for md in [
        std::fs::metadata(export.join("a/renamed.txt")).unwrap(),
        std::fs::metadata(m.p("hard")).unwrap(),
    ] {
        assert_eq!((md.uid(), md.gid()), (1234, 5678));
        assert_eq!(md.mode() & 0o7777, 0o4751);
        // Seconds only: in the VM the nanoseconds came out 0 on both sides
        // (not explained yet; the server applies what Tsetattr carries).
        assert_eq!((md.atime(), md.mtime()), (1_000_000_000, 1_200_000_000));
    }
    std::os::unix::fs::chown(m.p("hard"), Some(0), Some(0)).unwrap();
    std::fs::set_permissions(m.p("hard"), std::fs::Permissions::from_mode(0o600)).unwrap();

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

/// The server is killed while fio writes through the kernel's mount: the
/// writer can be killed, new requests on the old mount fail instead of
/// hanging, and a new server on the same port serves a new mount.
pub(crate) fn server_killed_during_writes(addr: &str, port: u16, tag: &str) {
    run("modprobe", &["9pnet_rdma"]);
    run("modprobe", &["9p"]);
    let export = tmpdir(&format!("kill-export-{tag}"));
    let mnt = tmpdir(&format!("kill-mnt-{tag}"));
    let mnt2 = tmpdir(&format!("kill-mnt2-{tag}"));
    let server = Server::start(addr, port, &export);
    let m = Mount::new(addr, port, &mnt);
    // fio (one process: --thread) writes 512 MiB in 1 MiB requests.
    let mut writer = Command::new("fio")
        .args([
            "--name=stream",
            &format!("--filename={}", m.p("stream").display()),
            "--rw=write",
            "--bs=1M",
            "--size=512M",
            "--ioengine=psync",
            "--fallocate=none",
            "--thread",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fio runs");
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
    let ended = wait_for(20, || matches!(writer.try_wait(), Ok(Some(_))));
    if !ended {
        let _ = writer.kill();
    }
    let gone = wait_for(30, || matches!(writer.try_wait(), Ok(Some(_))));
    let mut err = String::new();
    if let Some(mut e) = writer.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    eprintln!(
        "kernel_mount: the writer ended by itself: {ended}; gone: {gone} ({:?}) {}",
        writer.try_wait(),
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
