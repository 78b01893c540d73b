//! POSIX byte-range locks through two mounts of one export.

use super::*;

/// `fcntl(fd, cmd, {ty, start, len})` with a classic POSIX lock.
pub(crate) fn fcntl_lock(
    f: &std::fs::File,
    cmd: i32,
    ty: i32,
    start: i64,
    len: i64,
) -> std::io::Result<libc::flock> {
    // SAFETY: all-zero is a valid flock (plain integers).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ty as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start;
    fl.l_len = len;
    // SAFETY: the command reads (and for F_GETLK writes) the valid flock.
    let rc = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(f), cmd, &mut fl) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(fl)
    }
}

/// POSIX byte-range locks taken through two mounts of the same export
/// conflict as they would on one machine (the server holds them; each
/// mount's client only knows its own).
pub(crate) fn locks_between_mounts(addr: &str, port: u16, tag: &str) {
    run("modprobe", &["9pnet_rdma"]);
    run("modprobe", &["9p"]);
    let export = tmpdir(&format!("lock-export-{tag}"));
    let mnt1 = tmpdir(&format!("lock-mnt1-{tag}"));
    let mnt2 = tmpdir(&format!("lock-mnt2-{tag}"));
    let _server = Server::start(addr, port, &export);
    // locktimeout=1: a waiting lock is asked for again every second.
    let m1 = Mount::with(addr, port, &mnt1, ",locktimeout=1");
    let m2 = Mount::with(addr, port, &mnt2, ",locktimeout=1");
    std::fs::write(m1.p("f"), [0u8; 100]).unwrap();
    let rw = |p: PathBuf| {
        std::fs::File::options()
            .read(true)
            .write(true)
            .open(p)
            .unwrap()
    };
    let (a, b) = (rw(m1.p("f")), rw(m2.p("f")));
    let (wr, rd, un) = (libc::F_WRLCK, libc::F_RDLCK, libc::F_UNLCK);
    fcntl_lock(&a, libc::F_SETLK, wr, 0, 10).expect("the first lock");
    let e = fcntl_lock(&b, libc::F_SETLK, wr, 5, 1).expect_err("a conflicting lock");
    assert!(
        matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)),
        "{e}"
    );
    let e = fcntl_lock(&b, libc::F_SETLK, rd, 0, 0).expect_err("a conflicting read lock");
    assert!(
        matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)),
        "{e}"
    );
    let held = fcntl_lock(&b, libc::F_GETLK, wr, 0, 0).unwrap();
    assert_eq!(
        (i32::from(held.l_type), held.l_start, held.l_len),
        (wr, 0, 10)
    );
    // Beyond the range is free.
    fcntl_lock(&b, libc::F_SETLK, wr, 10, 10).expect("a lock beside it");
    // The served file itself carries the locks (a local process sees them).
    let local = rw(export.join("f"));
    // SAFETY: all-zero is a valid flock.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = wr as libc::c_short;
    fl.l_len = 0;
    // SAFETY: F_OFD_GETLK reads and writes the valid flock.
    let rc = unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&local),
            libc::F_OFD_GETLK,
            &mut fl,
        )
    };
    assert_eq!((rc, i32::from(fl.l_type)), (0, wr));
    // A waiting lock (F_SETLKW) is granted once the holder unlocks.
    let (tx, rx) = mpsc::channel();
    // The waiter gets the descriptor back through the channel: closing any
    // descriptor of the file would drop the process's POSIX locks on it.
    let b2 = b.try_clone().unwrap();
    let waiter = std::thread::spawn(move || {
        let r = fcntl_lock(&b2, libc::F_SETLKW, wr, 0, 10).map(|_| ());
        let _ = tx.send(r);
        b2
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(1500)).is_err(),
        "F_SETLKW returned while the range was locked"
    );
    fcntl_lock(&a, libc::F_SETLK, un, 0, 10).unwrap();
    rx.recv_timeout(Duration::from_secs(30))
        .expect("the waiting lock is granted within 30 s of the unlock")
        .expect("F_SETLKW");
    let b2 = waiter.join().unwrap();
    let e = fcntl_lock(&a, libc::F_SETLK, rd, 0, 1).expect_err("now b holds it");
    assert!(
        matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)),
        "{e}"
    );
    // Closing b's file drops its locks.
    drop(b2);
    drop(b);
    fcntl_lock(&a, libc::F_SETLK, wr, 0, 0).expect("the whole file, after b closed");
    drop(a);
    drop(local);
    m1.unmount();
    m2.unmount();
    let _ = std::fs::remove_dir_all(&export);
}
