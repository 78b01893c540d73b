//! Several clients at once: two kernel mounts and the crate's own client,
//! one of whose requests waits in the server, then vanishes.

use super::*;

/// The QPs of process `pid` (`rdma resource show qp`).
pub(crate) fn qps_of(pid: u32) -> usize {
    let out = run("rdma", &["resource", "show", "qp"]);
    let pid = pid.to_string();
    out.lines()
        .filter(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            t.windows(2).any(|w| w[0] == "pid" && w[1] == pid)
        })
        .count()
}

/// The open descriptors of process `pid`.
pub(crate) fn fds_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Several clients at once: two kernel mounts doing I/O together, and a
/// third client (the crate's own) whose request waits in the server (a read
/// of a FIFO that has a writer but no data) while its other requests and
/// the mounts are served; then that client vanishes mid-request, and its QP
/// and files are freed while the mounts work on.
pub(crate) fn concurrent_clients(addr: &str, port: u16, tag: &str) {
    let (export, mnt1, mnt2) = concurrent_dirs(tag);
    let mut server = Server::start(addr, port, &export);
    concurrent_io(addr, port, tag, server.pid(), &export, &mnt1, &mnt2);
    assert!(server.alive(), "rdma-9p exited");
    let _ = std::fs::remove_dir_all(&export);
}

/// The concurrent test's export and two mount points (the modules loaded first).
pub(crate) fn concurrent_dirs(tag: &str) -> (PathBuf, PathBuf, PathBuf) {
    run("modprobe", &["9pnet_rdma"]);
    run("modprobe", &["9p"]);
    (
        tmpdir(&format!("conc-export-{tag}")),
        tmpdir(&format!("conc-mnt1-{tag}")),
        tmpdir(&format!("conc-mnt2-{tag}")),
    )
}

/// The concurrent test's traffic, against the server `pid` on `port`.
pub(crate) fn concurrent_io(
    addr: &str,
    port: u16,
    tag: &str,
    pid: u32,
    export: &Path,
    mnt1: &Path,
    mnt2: &Path,
) {
    let m1 = Mount::new(addr, port, mnt1);
    let m2 = Mount::new(addr, port, mnt2);

    // Two mounts writing and then reading 8 MiB each at the same time.
    let srcs: Vec<PathBuf> = (0..2)
        .map(|i| random_file(&format!("conc-src{i}-{tag}"), 8))
        .collect();
    let ios: Vec<_> = [&m1, &m2]
        .iter()
        .zip(&srcs)
        .enumerate()
        .map(|(i, (m, src))| {
            let (path, src) = (m.p(&format!("c{i}")), src.clone());
            std::thread::spawn(move || {
                run("cp", &[src.to_str().unwrap(), path.to_str().unwrap()]);
                std::fs::read(&path).unwrap().len()
            })
        })
        .collect();
    for (i, t) in ios.into_iter().enumerate() {
        assert_eq!(t.join().expect("a mount's I/O"), 8 << 20);
        same_digests(&[
            &srcs[i],
            &export.join(format!("c{i}")),
            &m2.p(&format!("c{i}")),
        ]);
    }
    eprintln!("kernel_mount: two mounts did I/O together");

    let fifo = export.join("p");
    run("mkfifo", &[fifo.to_str().unwrap()]);
    let (fds0, qps0) = (fds_of(pid), qps_of(pid));
    assert_eq!(qps0, 2, "one QP per mount");
    let c0 = std::fs::read(export.join("c0")).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    let writer = local.block_on(&runtime, async {
        let opts = Options::parse(&format!("port={port},sq=8,rq=8,timeout=20000")).unwrap();
        let sa: SocketAddr = format!("{addr}:{port}").parse().unwrap();
        let t = Transport::connect(sa, &opts, 131072)
            .await
            .expect("connects");
        let mut c = Client::new(t, 131072).await.expect("Tversion");
        c.attach(0).await.unwrap();
        for fid in 10..15 {
            c.walk(0, fid, &[b"c0"]).await.unwrap();
            c.open(fid, libc::O_RDONLY as u32).await.unwrap();
        }
        c.walk(0, 1, &[b"p"]).await.unwrap();
        c.open(1, libc::O_RDONLY as u32).await.unwrap();
        // A writer that writes nothing yet: a read of the FIFO is answered at once with
        // EAGAIN (the server keeps a FIFO non-blocking: nothing there waits on a client's
        // behalf, holding a thread, descriptors and buffers).
        let writer = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
        assert_eq!(qps_of(pid), qps0 + 1);
        assert!(fds_of(pid) >= fds0 + 6, "six files open for the client");
        c.set_wait(Duration::from_secs(30));
        let r = c.read(1, 0, 64).await;
        assert!(
            matches!(r, Err(ClientError::Lerror(e)) if e == libc::EAGAIN as u32),
            "a read of an empty FIFO: {r:?}"
        );
        // The same client's other requests are answered...
        assert_eq!(c.read(10, 100, 16).await.unwrap(), &c0[100..116]);
        // ...and so are the mounts.
        assert_eq!(std::fs::read(m2.p("c0")).unwrap(), c0);
        // The client vanishes (no clunk, no disconnect of its own: its QP and CM id are
        // destroyed).
        drop(c);
        writer
    });
    assert!(
        wait_for(30, || qps_of(pid) == qps0),
        "the vanished client's QP is still there: {} QPs",
        qps_of(pid)
    );
    // Its files are closed, the FIFO's too: no request of it is left holding one.
    assert!(
        wait_for(30, || fds_of(pid) == fds0),
        "the vanished client's files are still open: {} descriptors, {fds0} before",
        fds_of(pid)
    );
    drop(writer);
    // The mounts are served on.
    std::fs::write(m1.p("after"), b"still here").unwrap();
    assert_eq!(std::fs::read(m2.p("after")).unwrap(), b"still here");
    m1.unmount();
    m2.unmount();
}
