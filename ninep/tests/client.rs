//! The crate's own client transport against `rdma-9p serve` over RDMA:
//! the operations, escape attempts on the wire (which the kernel's client
//! never sends, since it resolves symlinks and `..` itself), malformed
//! messages, and a connection closed for one while another is served on.
//! Device tests: run them in `ci/vm`.

use std::net::SocketAddr;
use std::os::unix::fs::symlink;
use std::os::unix::io::AsRawFd;
use std::time::Duration;

use rdma_9p::client::{Client, ClientError, Options, Transport};
use rdma_9p::proto::{setattr, Request, Rmsg, SetAttr, Tmsg, QTDIR, QTSYMLINK};

mod common;
use common::{require_device, required_env, tmpdir, Server};

const MSIZE: u32 = 131072;

async fn connect(ip: &str, port: u16) -> Client {
    let opts = Options::parse(&format!("trans=rdma,port={port},sq=8,rq=8,timeout=20000"))
        .expect("options");
    let addr: SocketAddr = format!("{ip}:{port}").parse().unwrap();
    let t = Transport::connect(addr, &opts, MSIZE as usize)
        .await
        .expect("connects");
    Client::new(t, MSIZE).await.expect("Tversion")
}

async fn checks(ip: &str, port: u16, tag: &str) {
    let export = tmpdir(&format!("client-export-{tag}"));
    let outside = tmpdir(&format!("client-outside-{tag}"));
    std::fs::write(outside.join("secret"), b"s").unwrap();
    symlink(&outside, export.join("out")).unwrap();
    let _server = Server::start(ip, port, &export);

    let mut c = connect(ip, port).await;
    assert_eq!(c.msize(), MSIZE);
    let root = c.attach(0).await.unwrap();
    assert_eq!(root.ty, QTDIR);
    assert!(c.walk(0, 1, &[]).await.unwrap().is_empty());
    c.create(1, b"f", libc::O_RDWR as u32, 0o644).await.unwrap();
    // Writes of the largest size msize allows, then reads, compared with
    // the file itself.
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let chunk = MSIZE as usize - 23;
    let mut off = 0;
    while off < data.len() {
        let end = (off + chunk).min(data.len());
        let n = c.write(1, off as u64, &data[off..end]).await.unwrap();
        assert_eq!(n as usize, end - off);
        off = end;
    }
    assert_eq!(std::fs::read(export.join("f")).unwrap(), data);
    let mut back = Vec::new();
    loop {
        let got = c.read(1, back.len() as u64, MSIZE).await.unwrap();
        assert!(got.len() <= MSIZE as usize - 11);
        if got.is_empty() {
            break;
        }
        back.extend_from_slice(&got);
    }
    assert_eq!(back, data);
    c.clunk(1).await.unwrap();
    // Readdir of the root.
    c.walk(0, 2, &[]).await.unwrap();
    c.open(2, 0).await.unwrap();
    let mut names = c.readdir(2).await.unwrap();
    names.sort();
    assert_eq!(
        names,
        vec![
            b".".to_vec(),
            b"..".to_vec(),
            b"f".to_vec(),
            b"out".to_vec()
        ]
    );
    c.clunk(2).await.unwrap();

    // Escapes: `..` stops at the root; a symlink out can be walked to but
    // not through or opened.
    let q = c.walk(0, 3, &[b"..", b".."]).await.unwrap();
    assert_eq!(q, vec![root, root]);
    c.clunk(3).await.unwrap();
    let q = c.walk(0, 4, &[b"out", b"secret"]).await.unwrap();
    assert_eq!(q.len(), 1, "the walk stops at the link");
    assert_eq!(q[0].ty, QTSYMLINK);
    c.walk(0, 4, &[b"out"]).await.unwrap();
    match c.walk(4, 5, &[b"secret"]).await {
        Err(ClientError::Lerror(e)) => assert_eq!(e, libc::EXDEV as u32),
        other => panic!("walked out of the root: {other:?}"),
    }
    match c.open(4, 0).await {
        Err(ClientError::Lerror(e)) => assert_eq!(e, libc::ELOOP as u32),
        other => panic!("opened a link out of the root: {other:?}"),
    }
    match c.walk(0, 6, &[b"../x"]).await {
        Err(ClientError::Lerror(e)) => assert_eq!(e, libc::EINVAL as u32),
        other => panic!("a name with a slash: {other:?}"),
    }

    // A body cut short gets Rlerror with its tag; the connection goes on.
    let mut m = Vec::new();
    Request {
        tag: 9,
        msg: Tmsg::Mkdir {
            dfid: 0,
            name: b"d",
            mode: 0o755,
            gid: 0,
        },
    }
    .encode(&mut m);
    m.truncate(m.len() - 3);
    let n = m.len() as u32;
    m[..4].copy_from_slice(&n.to_le_bytes());
    let r = c.send_raw(&m).await.unwrap();
    assert_eq!(
        Rmsg::decode(&r).unwrap(),
        (
            9,
            Rmsg::Lerror {
                ecode: libc::EPROTO as u32
            }
        )
    );

    // A second client sends a message whose size field lies: the server
    // closes that connection (no reply), and the first is served on.
    let mut bad = connect(ip, port).await;
    bad.set_wait(Duration::from_secs(5));
    let mut lie = m.clone();
    lie[..4].copy_from_slice(&(n + 100).to_le_bytes());
    let r = bad.send_raw(&lie).await;
    assert!(r.is_err(), "a reply to a message whose size lies: {r:?}");
    drop(bad);
    assert!(export.join("f").exists());
    c.walk(0, 7, &[b"f"]).await.unwrap();
    c.open(7, 0).await.unwrap();
    assert_eq!(c.read(7, 0, 4).await.unwrap(), &data[..4]);
    c.clunk(7).await.unwrap();
    c.close().await.unwrap();
    let _ = std::fs::remove_dir_all(&export);
    let _ = std::fs::remove_dir_all(&outside);
}

fn run_checks(ip: &str, port: u16, tag: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        tokio::time::timeout(Duration::from_secs(240), checks(ip, port, tag))
            .await
            .expect("the client checks finish within 240 s")
    });
}

#[test]
#[ignore = "needs an RDMA device (rxe0): run in ci/vm"]
fn client_against_server_over_rxe() {
    require_device(&required_env("RDMA_TEST_DEVICE"));
    run_checks(&required_env("RDMA_TEST_IP"), 5650, "rxe");
}

#[test]
#[ignore = "needs an iWARP device (siw0): run in ci/vm"]
fn client_against_server_over_iwarp() {
    require_device(&required_env("RDMA_TEST_IWARP_DEVICE"));
    run_checks(&required_env("RDMA_TEST_IWARP_IP"), 5651, "iwarp");
}

/// Threads of process `pid` waiting for a lease to be broken (`__break_lease`).
fn threads_waiting_for_a_lease(pid: u32) -> usize {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter(|t| {
            std::fs::read_to_string(t.path().join("wchan"))
                .is_ok_and(|w| w.trim() == "__break_lease")
        })
        .count()
}

/// One client's requests that wait do not occupy every worker: a server
/// with 4 worker threads runs at most one request of a connection at once
/// (a quarter), so while connection A's six `Tsetattr`s (truncations of a
/// file whose read lease this test holds: each reopens it for writing and
/// waits in the kernel until the lease is given up) wait, connection B's
/// request is answered at once. A's first truncation waits on a worker and
/// the other five in A's queue, in order. A `Tflush` of the last one, still
/// queued, is answered at once and that truncation never runs nor is
/// answered; the other five are answered in order once the lease goes.
/// Before the bound, A's requests took all four workers and B's waited
/// behind them (tokio's blocking pool queues what it cannot run).
async fn workers_bounded(ip: &str, port: u16) {
    // The kernel breaks a lease by force after this many seconds: longer
    // than the test.
    let break_time = "/proc/sys/fs/lease-break-time";
    let old_break_time = std::fs::read_to_string(break_time).ok();
    let _ = std::fs::write(break_time, "600");
    // SAFETY: ignoring a signal installs no handler; the lease holder gets
    // SIGIO when a break starts, whose default action would end the test.
    unsafe { libc::signal(libc::SIGIO, libc::SIG_IGN) };

    let export = tmpdir("client-workers");
    std::fs::write(export.join("leased"), b"some bytes").unwrap();
    let server = Server::start_with(ip, port, &export, &["--squash", "none", "--workers", "4"]);
    let held = std::fs::File::open(export.join("leased")).unwrap();
    // SAFETY: a valid descriptor, integer arguments.
    let rc = unsafe { libc::fcntl(held.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) };
    assert_eq!(rc, 0, "F_SETLEASE: {}", std::io::Error::last_os_error());

    let mut a = connect(ip, port).await;
    a.attach(0).await.unwrap();
    a.walk(0, 1, &[b"leased"]).await.unwrap();
    let msgs: Vec<Vec<u8>> = (0..6u16)
        .map(|i| {
            let mut m = Vec::new();
            Request {
                tag: 100 + i,
                msg: Tmsg::Setattr {
                    fid: 1,
                    attr: SetAttr {
                        valid: setattr::SIZE,
                        size: u64::from(i),
                        ..SetAttr::default()
                    },
                },
            }
            .encode(&mut m);
            m
        })
        .collect();
    a.transport().send_all(&msgs).await.unwrap();
    // A's first truncation waits for the lease on a worker thread.
    let pid = server.pid();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while threads_waiting_for_a_lease(pid) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no request of the server waits for the lease after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Another connection is served meanwhile (its Tversion goes to the
    // workers too).
    let opts = Options::parse(&format!("trans=rdma,port={port},sq=8,rq=8,timeout=20000"))
        .expect("options");
    let addr: SocketAddr = format!("{ip}:{port}").parse().unwrap();
    let t = Transport::connect(addr, &opts, MSIZE as usize)
        .await
        .expect("connects");
    let mut b = Client::new(t, MSIZE)
        .await
        .expect("another connection's Tversion answered while A's requests wait");
    b.set_wait(Duration::from_secs(30));
    b.attach(0).await.unwrap();
    let r = b
        .call(Tmsg::Getattr { fid: 0, mask: !0 })
        .await
        .expect("another connection's request answered while A's wait");
    assert!(matches!(Rmsg::decode(&r).unwrap().1, Rmsg::Getattr(_)));
    // A's other requests wait in its queue, not on workers.
    assert_eq!(
        threads_waiting_for_a_lease(pid),
        1,
        "A's requests on workers at once (a quarter of 4)"
    );
    // A flushes its last truncation, still in its queue: discarded, and the
    // flush answered at once, while the lease is held.
    let flush = |tag: u16, oldtag: u16| {
        let mut m = Vec::new();
        Request {
            tag,
            msg: Tmsg::Flush { oldtag },
        }
        .encode(&mut m);
        m
    };
    let t = a.transport();
    t.send_all(&[flush(200, 105)]).await.unwrap();
    let r = t
        .next_replies(1, Duration::from_secs(30))
        .await
        .expect("the flush of a queued request answered while A's first waits");
    assert_eq!(Rmsg::decode(&r[0]).unwrap(), (200, Rmsg::Flush));
    assert_eq!(threads_waiting_for_a_lease(pid), 1);
    // SAFETY: as above.
    let rc = unsafe { libc::fcntl(held.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
    assert_eq!(
        rc,
        0,
        "F_SETLEASE(F_UNLCK): {}",
        std::io::Error::last_os_error()
    );
    // The other five, in order (one at a time).
    let replies = t
        .next_replies(5, Duration::from_secs(120))
        .await
        .expect("A's five truncations answered once the lease goes");
    for (i, r) in replies.iter().enumerate() {
        assert_eq!(
            Rmsg::decode(r).unwrap(),
            (100 + i as u16, Rmsg::Setattr),
            "A's truncation {i}"
        );
    }
    // The flushed one never ran, and is never answered: the next reply is
    // a later request's (it would have run first, in order).
    t.send_all(&[{
        let mut m = Vec::new();
        Request {
            tag: 201,
            msg: Tmsg::Getattr { fid: 0, mask: !0 },
        }
        .encode(&mut m);
        m
    }])
    .await
    .unwrap();
    let r = t.next_replies(1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        Rmsg::decode(&r[0]).unwrap().0,
        201,
        "a reply to the flushed tag"
    );
    assert_eq!(
        export.join("leased").metadata().unwrap().len(),
        4,
        "the last truncation ran"
    );
    drop(held);
    let _ = a.close().await;
    let _ = b.close().await;
    drop(server);
    if let Some(t) = old_break_time {
        let _ = std::fs::write(break_time, t.trim());
    }
    let _ = std::fs::remove_dir_all(&export);
}

#[test]
#[ignore = "needs an RDMA device (rxe0): run in ci/vm"]
fn one_connection_cannot_occupy_every_worker_over_rxe() {
    require_device(&required_env("RDMA_TEST_DEVICE"));
    let ip = required_env("RDMA_TEST_IP");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        tokio::time::timeout(Duration::from_secs(240), workers_bounded(&ip, 5652))
            .await
            .expect("the workers test finishes within 240 s")
    });
}

/// A `Tsetattr` of fid 1 truncating to `size`, tagged `tag`.
fn truncation(tag: u16, size: u64) -> Vec<u8> {
    let mut m = Vec::new();
    Request {
        tag,
        msg: Tmsg::Setattr {
            fid: 1,
            attr: SetAttr {
                valid: setattr::SIZE,
                size,
                ..SetAttr::default()
            },
        },
    }
    .encode(&mut m);
    m
}

/// Several clients' waiting requests leave the reserve to a newcomer: with
/// 8 workers (2 per connection, 2 kept for connections with nothing on
/// them), four connections that each send two truncations of a leased file
/// hold six or seven threads (the second request of the last ones finds the
/// reserve reached and waits in its connection's queue), and a fifth
/// connection is served. With the per-connection bound alone the four took
/// all eight and the fifth waited.
async fn reserve_kept(ip: &str, port: u16) {
    let break_time = "/proc/sys/fs/lease-break-time";
    let old_break_time = std::fs::read_to_string(break_time).ok();
    let _ = std::fs::write(break_time, "600");
    // SAFETY: as in `workers_bounded`.
    unsafe { libc::signal(libc::SIGIO, libc::SIG_IGN) };
    let export = tmpdir("client-reserve");
    std::fs::write(export.join("leased"), b"some bytes").unwrap();
    let server = Server::start_with(ip, port, &export, &["--squash", "none", "--workers", "8"]);
    let held = std::fs::File::open(export.join("leased")).unwrap();
    // SAFETY: a valid descriptor, integer arguments.
    let rc = unsafe { libc::fcntl(held.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) };
    assert_eq!(rc, 0, "F_SETLEASE: {}", std::io::Error::last_os_error());

    let mut hostile = Vec::new();
    for i in 0..4u16 {
        let mut c = connect(ip, port).await;
        c.attach(0).await.unwrap();
        c.walk(0, 1, &[b"leased"]).await.unwrap();
        let msgs = [truncation(100 + 2 * i, 1), truncation(101 + 2 * i, 2)];
        c.transport().send_all(&msgs).await.unwrap();
        hostile.push(c);
    }
    let pid = server.pid();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while threads_waiting_for_a_lease(pid) < 6 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} requests wait for the lease after 60 s, not 6",
            threads_waiting_for_a_lease(pid)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let opts = Options::parse(&format!("trans=rdma,port={port},sq=8,rq=8,timeout=20000"))
        .expect("options");
    let addr: SocketAddr = format!("{ip}:{port}").parse().unwrap();
    let t = Transport::connect(addr, &opts, MSIZE as usize)
        .await
        .expect("connects");
    let mut b = Client::new(t, MSIZE)
        .await
        .expect("a fifth connection's Tversion answered while four clients' requests wait");
    b.attach(0).await.unwrap();
    let waiting = threads_waiting_for_a_lease(pid);
    println!("requests waiting on threads: {waiting} of 8");
    assert!((6..=7).contains(&waiting), "{waiting} threads held");
    // SAFETY: as above.
    let rc = unsafe { libc::fcntl(held.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
    assert_eq!(
        rc,
        0,
        "F_SETLEASE(F_UNLCK): {}",
        std::io::Error::last_os_error()
    );
    for (i, c) in hostile.iter_mut().enumerate() {
        let r = c
            .transport()
            .next_replies(2, Duration::from_secs(120))
            .await
            .expect("both truncations answered once the lease goes");
        // Both may have run at once: in either order.
        let mut got: Vec<_> = r.iter().map(|r| Rmsg::decode(r).unwrap()).collect();
        got.sort_by_key(|(tag, _)| *tag);
        let first = 100 + 2 * i as u16;
        assert_eq!(got, [(first, Rmsg::Setattr), (first + 1, Rmsg::Setattr)]);
    }
    drop(held);
    for c in hostile {
        let _ = c.close().await;
    }
    let _ = b.close().await;
    drop(server);
    if let Some(t) = old_break_time {
        let _ = std::fs::write(break_time, t.trim());
    }
    let _ = std::fs::remove_dir_all(&export);
}

#[test]
#[ignore = "needs an RDMA device (rxe0): run in ci/vm"]
fn a_handful_of_connections_leave_the_reserve_over_rxe() {
    require_device(&required_env("RDMA_TEST_DEVICE"));
    let ip = required_env("RDMA_TEST_IP");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        tokio::time::timeout(Duration::from_secs(240), reserve_kept(&ip, 5653))
            .await
            .expect("the reserve test finishes within 240 s")
    });
}
