//! rdma-nfs against the Linux kernel's NFS server over RDMA (svcrdma) in the
//! VM, on rxe0 and on siw0 (the `_iwarp` tests). The exported tmpfs, read
//! directly in the guest, is the oracle. Device tests: they need root, the
//! `nfsd` and `rpcrdma` modules and an RDMA device (`ci/vm run`); a requested
//! device that is missing fails. `tests/nfsd.sh` brings the server up and
//! down around each test.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{content, mount, ok, rdma_nfs, runtime, server_ip, sha, Server};
use rdma_nfs::nfs3::Options;
use rdma_nfs::transport;

/// `put` then `cat` with the binary for each size, the file on the server
/// side compared by digest both ways; through the library, a WRITE of the
/// inline threshold goes inline and one byte more through a read chunk,
/// and READs beyond the inline size come back in a write chunk.
fn sizes(iwarp: bool) {
    let ip = server_ip(iwarp);
    let test = if iwarp { "sizes-iwarp" } else { "sizes" };
    let server = Server::up(test);
    let rt = runtime();
    let client = rt.block_on(mount(ip, test, Options::default()));
    let neg = client.transport().negotiated();
    assert!(
        neg.server_private,
        "the kernel server answers RFC 8797 private data"
    );
    // Offered where chunks are windows (rxe), not with a registration per
    // chunk (siw).
    assert_eq!(
        neg.remote_invalidation, !iwarp,
        "remote invalidation offered"
    );
    let t = client.max_inline_write(client.root());
    println!("negotiated {neg:?}, largest inline WRITE {t}");
    assert!(t > 0 && t < neg.inline_send);

    // The threshold itself, through the library's counters.
    let stats = client.transport().stats();
    for (len, chunk) in [(t, false), (t + 1, true)] {
        let name = format!("lib-{len}");
        let data = content(len, 7);
        let before = stats.read_chunk_calls.load(Ordering::Relaxed);
        rt.block_on(async {
            let f = client.create(client.root(), name.as_bytes(), 0o644).await?;
            client.write_all(&f, &data).await?;
            let back = client.read_all(&f).await?;
            assert_eq!(sha(&back), sha(&data), "{name} read back");
            Ok::<_, rdma_nfs::nfs3::NfsError>(())
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let used = stats.read_chunk_calls.load(Ordering::Relaxed) - before;
        assert_eq!(used, u64::from(chunk), "{len} bytes: read chunks used");
        let on_server = std::fs::read(server.dir.join(&name)).unwrap();
        assert_eq!(sha(&on_server), sha(&data), "{name} on the server");
    }

    // Every size through the library, one connection.
    let mut sizes = vec![0, 1, t - 1, t, t + 1, 1 << 20];
    rt.block_on(async {
        for &len in &sizes {
            let name = format!("f{len}");
            let data = content(len, len as u32);
            let f = client.create(client.root(), name.as_bytes(), 0o644).await?;
            client.write_all(&f, &data).await?;
            let on_server = std::fs::read(server.dir.join(&name)).unwrap();
            assert_eq!(on_server.len(), len);
            assert_eq!(sha(&on_server), sha(&data), "{name}: digest on the server");
            let back = client.read_all(&f).await?;
            assert_eq!(sha(&back), sha(&data), "{name}: digest read back");
        }
        Ok::<_, rdma_nfs::nfs3::NfsError>(())
    })
    .unwrap_or_else(|e| panic!("sizes: {e}"));
    let stats = client.transport().stats();
    assert!(stats.write_chunk_replies.load(Ordering::Relaxed) >= 1);
    assert_eq!(stats.chunks_registered.load(Ordering::Relaxed), 0);
    // rxe has type 2 memory windows: chunks come from regions registered
    // once and reused (siw has none: a registration per chunk).
    let windows = stats.memory_windows.load(Ordering::Relaxed);
    assert_eq!(windows, !iwarp, "memory windows on rxe, none on siw");
    let regs = stats.chunk_registrations.load(Ordering::Relaxed);
    let binds = stats.chunk_binds.load(Ordering::Relaxed);
    println!("chunk registrations {regs}, window binds {binds}");
    // `read_all` has the transport copy each write chunk's data straight
    // into the result; on rxe with a plain copy (the server invalidated the
    // window with its reply, or its LOCAL_INV completed first), on siw with
    // the atomic one (its registration counts as reachable until it is
    // deregistered).
    let placed = stats.data_placed.load(Ordering::Relaxed);
    let plain = stats.plain_chunk_reads.load(Ordering::Relaxed);
    println!("write chunk data placed {placed}, plain chunk reads {plain}");
    assert!(
        placed >= 1,
        "write chunk data copied into read_all's result"
    );
    if windows {
        assert!(plain >= placed, "{plain} plain reads for {placed} placed");
    } else {
        assert_eq!(plain, 0, "no plain read of a chunk still registered");
    }
    if windows {
        assert!(
            binds > regs,
            "{binds} binds over {regs} registrations: reused"
        );
        assert_eq!(binds, stats.chunk_invalidations.load(Ordering::Relaxed));
    }
    // A READ of 1 MiB: the kernel server invalidates its write chunk with
    // the reply (SEND_WITH_INV); on rxe the receive completion says so and
    // no READ posts a LOCAL_INV. siw (a registration per chunk) is not
    // offered it: each registration is deregistered when its call ends.
    let c = read_counted(&rt, &client, "f1048576", 1 << 20, 1048576);
    println!("remote invalidation advertised: {c:?}");
    assert!(c.replies >= 1, "the READs used write chunks");
    assert_eq!(c.local, 0, "no LOCAL_INV posted for a READ");
    assert_eq!(c.stray, 0);
    if windows {
        assert_eq!(
            c.remote, c.replies,
            "each READ's window invalidated by the server"
        );
        assert_eq!(c.plain, c.replies, "each READ's data copied plainly");
        assert_eq!(c.reused, 0, "windows: no registration per chunk");
    } else {
        assert_eq!(c.remote, 0, "not offered with a registration per chunk");
        assert_eq!(c.plain, 0);
        // The earlier reads left deregistered chunks of this size: each
        // READ's write chunk is registered on one of them, not on new
        // zeroed memory (the digest above proves the data right).
        assert_eq!(c.reused, c.replies, "every write chunk on kept memory");
    }
    // The same file piece by piece, each READ's data lent in place (the
    // write chunk's memory: on rxe after the server invalidated its window,
    // on siw once deregistered): no copy at all, and the memory back in
    // the pool after each piece (siw: the next chunks registered on it).
    let (c, pieces) = read_each_counted(&rt, &client, "f1048576", 1 << 20, 1048576);
    println!("read_each: {c:?}, {pieces} pieces");
    assert!(c.replies >= 1, "the READs used write chunks");
    assert_eq!(c.lent, c.replies, "every READ's data lent");
    assert_eq!(pieces, c.replies, "one piece per READ");
    assert_eq!(c.plain, 0, "no chunk copied");
    assert_eq!(c.placed, 0, "nothing copied into a destination");
    assert_eq!(c.local, 0, "no LOCAL_INV posted for a READ");
    if windows {
        assert_eq!(c.remote, c.replies, "each window invalidated by the server");
    } else {
        assert!(c.reused >= 1, "chunks registered on memory given back");
    }
    assert_eq!(
        client
            .transport()
            .stats()
            .chunks_registered
            .load(Ordering::Relaxed),
        0
    );
    rt.block_on(client.close());

    // Remote invalidation not advertised: the server sends a plain SEND,
    // and every window is put out of reach by the client: on rxe (the only
    // device here with windows) deallocated and replaced, no LOCAL_INV
    // (siw: the registration is read with the atomic copy, then
    // deregistered).
    let no_inv = Options {
        transport: transport::Options {
            remote_invalidation: false,
            ..Default::default()
        },
        ..Default::default()
    };
    let client = rt.block_on(mount(ip, test, no_inv));
    assert!(!client.transport().negotiated().remote_invalidation);
    let c = read_counted(&rt, &client, "f1048576", 1 << 20, 1048576);
    println!("remote invalidation not advertised: {c:?}");
    assert!(c.replies >= 1, "the READs used write chunks");
    assert_eq!(c.remote, 0, "no invalidation by the server");
    if windows {
        assert_eq!(c.fenced, c.replies, "each READ's window deallocated");
        assert_eq!(c.local, 0, "no LOCAL_INV on rxe");
        assert_eq!(c.plain, c.replies);
    } else {
        assert_eq!(c.local, 0, "no windows to invalidate");
        assert_eq!(c.plain, 0, "no plain read of a chunk still registered");
    }
    assert_eq!(
        client
            .transport()
            .stats()
            .chunks_registered
            .load(Ordering::Relaxed),
        0
    );
    rt.block_on(client.close());

    // The binary, both ways, on each side of the threshold.
    sizes.retain(|&l| l == 0 || l == t + 1);
    let local = std::env::temp_dir().join(format!("rdma-nfs-{test}"));
    for len in sizes {
        let data = content(len, 3 * len as u32);
        std::fs::write(&local, &data).unwrap();
        let remote = format!("{ip}:/export/{test}/b{len}");
        ok(
            &rdma_nfs(&["put", local.to_str().unwrap(), &remote]),
            &format!("put {len}"),
        );
        let on_server = std::fs::read(server.dir.join(format!("b{len}"))).unwrap();
        assert_eq!(
            sha(&on_server),
            sha(&data),
            "put {len}: digest on the server"
        );
        let out = rdma_nfs(&["cat", &remote]);
        ok(&out, &format!("cat {len}"));
        assert_eq!(sha(&out.stdout), sha(&data), "cat {len}: digest");
    }
    let _ = std::fs::remove_file(&local);
}

/// What the transport did for the READs of one `read_all` or `read_each`:
/// the difference of its counters over the reading.
#[derive(Debug)]
struct Counts {
    /// Replies that used a write chunk.
    replies: u64,
    /// Write chunks' data lent in place.
    lent: u64,
    /// Write chunks' data copied into a destination.
    placed: u64,
    /// `LOCAL_INV`s posted.
    local: u64,
    /// Windows deallocated and replaced instead (rxe).
    fenced: u64,
    /// Chunks the server invalidated with its reply.
    remote: u64,
    /// Invalidations of an rkey the call had not lent.
    stray: u64,
    /// Chunks read with a plain copy.
    plain: u64,
    /// Chunks registered on kept memory (no memory windows).
    reused: u64,
}

impl Counts {
    /// The client's counters now.
    fn of(c: &rdma_nfs::nfs3::Client) -> Counts {
        let s: &transport::Stats = c.transport().stats();
        let get = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
        Counts {
            replies: get(&s.write_chunk_replies),
            lent: get(&s.data_lent),
            placed: get(&s.data_placed),
            local: get(&s.local_invalidations),
            fenced: get(&s.fenced_windows),
            remote: get(&s.remote_invalidations),
            stray: get(&s.stray_invalidations),
            plain: get(&s.plain_chunk_reads),
            reused: get(&s.chunk_reuses),
        }
    }

    /// What was counted from `before` to `self`.
    fn since(self, before: &Counts) -> Counts {
        Counts {
            replies: self.replies - before.replies,
            lent: self.lent - before.lent,
            placed: self.placed - before.placed,
            local: self.local - before.local,
            fenced: self.fenced - before.fenced,
            remote: self.remote - before.remote,
            stray: self.stray - before.stray,
            plain: self.plain - before.plain,
            reused: self.reused - before.reused,
        }
    }
}

/// Reads `name` (`len` bytes, written by `sizes` with seed `seed`) with
/// `read_each`, checks its digest, and counts what its READs did and the
/// pieces the sink got.
fn read_each_counted(
    rt: &tokio::runtime::Runtime,
    client: &rdma_nfs::nfs3::Client,
    name: &str,
    len: usize,
    seed: u32,
) -> (Counts, u64) {
    let before = Counts::of(client);
    let mut back = Vec::new();
    let mut pieces = 0u64;
    let n = rt
        .block_on(async {
            let (f, _) = client.lookup(client.root(), name.as_bytes()).await?;
            client
                .read_each(&f, |p| {
                    pieces += 1;
                    back.extend_from_slice(p);
                    Ok::<(), ()>(())
                })
                .await
        })
        .unwrap_or_else(|e| panic!("reading {name}: {e}"))
        .unwrap_or_else(|()| panic!("reading {name}: the sink failed"));
    let counts = Counts::of(client).since(&before);
    assert_eq!(n, len as u64);
    assert_eq!(back.len(), len);
    assert_eq!(
        sha(&back),
        sha(&content(len, seed)),
        "{name}: digest read piece by piece"
    );
    (counts, pieces)
}

/// Reads `name` (`len` bytes, written by `sizes` with seed `seed`) whole,
/// checks its digest, and counts what its READs did.
fn read_counted(
    rt: &tokio::runtime::Runtime,
    client: &rdma_nfs::nfs3::Client,
    name: &str,
    len: usize,
    seed: u32,
) -> Counts {
    let before = Counts::of(client);
    let back = rt
        .block_on(async {
            let (f, _) = client.lookup(client.root(), name.as_bytes()).await?;
            client.read_all(&f).await
        })
        .unwrap_or_else(|e| panic!("reading {name}: {e}"));
    let counts = Counts::of(client).since(&before);
    assert_eq!(back.len(), len);
    assert_eq!(
        sha(&back),
        sha(&content(len, seed)),
        "{name}: digest read back"
    );
    counts
}

#[test]
#[ignore = "needs an RDMA device (rxe0), root and the kernel's nfsd: run in ci/vm"]
fn sizes_over_rxe() {
    sizes(false);
}

#[test]
#[ignore = "needs an iWARP device (siw0), root and the kernel's nfsd: run in ci/vm"]
fn sizes_over_iwarp() {
    sizes(true);
}

/// The digest `sha256sum` computes (native code: the tests are debug builds).
fn sha256sum(p: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(p)
        .output()
        .expect("sha256sum runs");
    ok(&out, "sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// A large file (4 MiB, which fits ci/device-tests' 120 s per test on a busy
/// host; `RDMA_NFS_TEST_LARGE_MIB=64` with a longer `RDMA_TEST_TIMEOUT` for
/// the 64 MiB)
/// written with `put` and read with `cat` (1 MiB per call, several in
/// flight), `sha256sum` equal on the local file, the server's file and what
/// `cat` printed.
fn large(iwarp: bool) {
    let ip = server_ip(iwarp);
    let test = if iwarp { "large-iwarp" } else { "large" };
    let server = Server::up(test);
    let mib: usize = std::env::var("RDMA_NFS_TEST_LARGE_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let local = std::env::temp_dir().join(format!("rdma-nfs-{test}"));
    let back = std::env::temp_dir().join(format!("rdma-nfs-{test}-back"));
    std::fs::write(&local, content(mib << 20, 64)).unwrap();
    let want = sha256sum(&local);
    let remote = format!("{ip}:/export/{test}/big");
    let t = Instant::now();
    ok(&rdma_nfs(&["put", local.to_str().unwrap(), &remote]), "put");
    let put = t.elapsed();
    let _ = std::fs::remove_file(&local);
    assert_eq!(
        sha256sum(&server.dir.join("big")),
        want,
        "digest on the server"
    );
    let t = Instant::now();
    let status = Command::new(env!("CARGO_BIN_EXE_rdma-nfs"))
        .args(["cat", &remote])
        .stdout(std::fs::File::create(&back).unwrap())
        .status()
        .unwrap();
    let cat = t.elapsed();
    assert!(status.success(), "cat: {status}");
    assert_eq!(std::fs::metadata(&back).unwrap().len(), (mib << 20) as u64);
    assert_eq!(sha256sum(&back), want, "digest read back");
    let _ = std::fs::remove_file(&back);
    println!("{mib} MiB: put {put:?}, cat {cat:?}");
}

#[test]
#[ignore = "needs an RDMA device (rxe0), root and the kernel's nfsd: run in ci/vm"]
fn large_file_over_rxe() {
    large(false);
}

#[test]
#[ignore = "needs an iWARP device (siw0), root and the kernel's nfsd: run in ci/vm"]
fn large_file_over_iwarp() {
    large(true);
}

/// READDIR and READDIRPLUS of 5,000 entries (replies through the reply
/// chunk) list exactly the names the directory holds; `ls` prints them.
fn readdir(iwarp: bool) {
    let ip = server_ip(iwarp);
    let test = if iwarp { "readdir-iwarp" } else { "readdir" };
    let server = Server::up(test);
    let mut want = BTreeSet::new();
    for i in 0..5000 {
        let name = format!("entry-{i:05}-{}", "x".repeat(i % 40));
        std::fs::write(server.dir.join(&name), b"").unwrap();
        want.insert(name.into_bytes());
    }
    let rt = runtime();
    let client = rt.block_on(mount(ip, test, Options::default()));
    for plus in [false, true] {
        let entries = rt
            .block_on(async {
                if plus {
                    client.readdirplus(client.root()).await
                } else {
                    client.readdir(client.root()).await
                }
            })
            .unwrap_or_else(|e| panic!("readdir (plus: {plus}): {e}"));
        let got: BTreeSet<Vec<u8>> = entries
            .iter()
            .map(|e| e.name.clone())
            .filter(|n| n != b"." && n != b"..")
            .collect();
        assert_eq!(got.len(), 5000, "plus: {plus}");
        assert_eq!(got, want, "plus: {plus}");
        if plus {
            assert!(entries
                .iter()
                .filter(|e| e.name != b"." && e.name != b"..")
                .all(|e| e.attr.is_some_and(|a| a.size == 0) && e.fh.is_some()));
        }
    }
    let stats = client.transport().stats();
    assert!(stats.reply_chunk_replies.load(Ordering::Relaxed) >= 2);
    assert_eq!(stats.chunks_registered.load(Ordering::Relaxed), 0);
    rt.block_on(client.close());
    let out = rdma_nfs(&["ls", &format!("{ip}:/export/{test}")]);
    ok(&out, "ls");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 5000);
}

#[test]
#[ignore = "needs an RDMA device (rxe0), root and the kernel's nfsd: run in ci/vm"]
fn readdir_5000_over_rxe() {
    readdir(false);
}

#[test]
#[ignore = "needs an iWARP device (siw0), root and the kernel's nfsd: run in ci/vm"]
fn readdir_5000_over_iwarp() {
    readdir(true);
}

/// 64 calls at once on a connection of 4 credits: every one completes with
/// the right answer, never more than 4 are in flight, no chunk is left
/// registered.
fn credits(iwarp: bool) {
    let ip = server_ip(iwarp);
    let test = if iwarp { "credits-iwarp" } else { "credits" };
    let server = Server::up(test);
    for i in 0..8 {
        std::fs::write(
            server.dir.join(format!("f{i}")),
            content(8192 + i, i as u32),
        )
        .unwrap();
    }
    let rt = runtime();
    let mut o = Options::default();
    o.transport.credits = 4;
    let client = rt.block_on(mount(ip, test, o));
    rt.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..64usize {
            let c = client.clone();
            tasks.push(tokio::spawn(async move {
                let name = format!("f{}", i % 8);
                let (f, _) = c.lookup(c.root(), name.as_bytes()).await?;
                if i % 2 == 0 {
                    // A READ whose data comes back in a write chunk.
                    let (data, eof) = c.read(&f, 0, 64 << 10).await?;
                    assert!(eof);
                    assert_eq!(data, content(8192 + i % 8, (i % 8) as u32));
                } else {
                    let a = c.getattr(&f).await?;
                    assert_eq!(a.size, 8192 + (i % 8) as u64);
                }
                Ok::<_, rdma_nfs::nfs3::NfsError>(())
            }));
        }
        for t in tasks {
            t.await.unwrap().unwrap();
        }
    });
    let stats = client.transport().stats();
    let max = stats.max_in_flight.load(Ordering::Relaxed);
    println!(
        "max in flight {max}, granted {}",
        stats.granted.load(Ordering::Relaxed)
    );
    assert!(max <= 4, "{max} calls in flight with 4 credits");
    assert!(
        max >= 2,
        "the client never had more than {max} call in flight"
    );
    assert_eq!(stats.chunks_registered.load(Ordering::Relaxed), 0);
    rt.block_on(client.close());
}

#[test]
#[ignore = "needs an RDMA device (rxe0), root and the kernel's nfsd: run in ci/vm"]
fn credits_64_calls_over_rxe() {
    credits(false);
}

#[test]
#[ignore = "needs an iWARP device (siw0), root and the kernel's nfsd: run in ci/vm"]
fn credits_64_calls_over_iwarp() {
    credits(true);
}

/// No listener on the port: a clear "not connected" within the timeout,
/// from the library and from the binary.
fn no_server(iwarp: bool) {
    let ip = server_ip(iwarp);
    let rt = runtime();
    let o = transport::Options {
        connect_timeout: Duration::from_secs(5),
        ..transport::Options::default()
    };
    let t = Instant::now();
    let e = rt
        .block_on(transport::Transport::connect(SocketAddr::new(ip, 20050), o))
        .unwrap_err();
    let took = t.elapsed();
    println!("{e} after {took:?}");
    assert!(matches!(e, transport::Error::NotConnected(_)), "{e:?}");
    assert!(e.to_string().contains("20050"), "{e}");
    assert!(took < Duration::from_secs(6), "{took:?}");
    let t = Instant::now();
    let out = rdma_nfs(&[
        "--timeout",
        "5",
        "--port",
        "20050",
        "ls",
        &format!("{ip}:/"),
    ]);
    let took = t.elapsed();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // Nothing serves MOUNT either: the binary says so first.
    assert!(err.starts_with("rdma-nfs: "), "{err}");
    assert!(took < Duration::from_secs(12), "{took:?}");
}

#[test]
#[ignore = "needs an RDMA device (rxe0): run in ci/vm"]
fn no_server_over_rxe() {
    no_server(false);
}

#[test]
#[ignore = "needs an iWARP device (siw0): run in ci/vm"]
fn no_server_over_iwarp() {
    no_server(true);
}

/// `rm` removes the file on the server; removing or reading a missing file
/// fails with the server's status by name.
#[test]
#[ignore = "needs an RDMA device (rxe0), root and the kernel's nfsd: run in ci/vm"]
fn rm_and_errors_over_rxe() {
    let ip = server_ip(false);
    let server = Server::up("rm");
    std::fs::write(server.dir.join("gone"), b"x").unwrap();
    let remote = format!("{ip}:/export/rm/gone");
    ok(&rdma_nfs(&["rm", &remote]), "rm");
    assert!(!server.dir.join("gone").exists());
    for args in [vec!["rm", remote.as_str()], vec!["cat", remote.as_str()]] {
        let out = rdma_nfs(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("NFS3ERR_NOENT"), "{args:?}: {err}");
    }
    let out = rdma_nfs(&["cat", &format!("{ip}:/export/rm")]);
    assert!(!out.status.success());
    let out = rdma_nfs(&["put", "/nonexistent/file", &remote]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/file"));
}

/// The kernel server stopped in the middle of a transfer (`rpc.nfsd 0`
/// closes its listeners and every connection; this kernel's portlist
/// cannot remove one listener) and started again: the client sees the
/// connection go, reconnects once the listener is back, sends every pending
/// WRITE again with its xid, and each completes once; the file is whole.
#[test]
#[ignore = "needs an RDMA device (rxe0), root and the kernel's nfsd: run in ci/vm"]
fn server_restart_mid_transfer_over_rxe() {
    let ip = server_ip(false);
    let test = "restart";
    let server = Server::up(test);
    let rt = runtime();
    let client = rt.block_on(mount(ip, test, Options::default()));
    let data = content(16 << 20, 16);
    let sh = |cmd: &str| {
        let out = Command::new("sh").arg("-c").arg(cmd).output().unwrap();
        ok(&out, cmd);
    };
    rt.block_on(async {
        let f = client.create(client.root(), b"f", 0o644).await.unwrap();
        let c = client.clone();
        let d = data.clone();
        let transfer = tokio::spawn(async move { c.write_all(&f, &d).await });
        // Some WRITEs are in flight before the server goes.
        while client.transport().stats().max_in_flight.load(Ordering::Relaxed) < 2 {
            tokio::task::yield_now().await;
        }
        sh("rpc.nfsd 0");
        let o = transport::Options {
            connect_timeout: Duration::from_secs(5),
            ..transport::Options::default()
        };
        let e = transport::Transport::connect(SocketAddr::new(ip, 20049), o.clone())
            .await
            .unwrap_err();
        assert!(matches!(e, transport::Error::NotConnected(_)), "{e:?}");
        sh("rpc.nfsd --grace-time 10 --lease-time 10 4 && echo 'rdma 20049' > /proc/fs/nfsd/portlist");
        transfer
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("the transfer across the restart: {e}"));
    });
    let stats = client.transport().stats();
    println!(
        "connects {}, retransmits {}, dropped replies {}",
        stats.connects.load(Ordering::Relaxed),
        stats.retransmits.load(Ordering::Relaxed),
        stats.dropped_replies.load(Ordering::Relaxed)
    );
    assert!(
        stats.connects.load(Ordering::Relaxed) >= 2,
        "the client reconnected"
    );
    assert!(
        stats.retransmits.load(Ordering::Relaxed) >= 1,
        "pending calls were sent again"
    );
    assert_eq!(stats.chunks_registered.load(Ordering::Relaxed), 0);
    rt.block_on(client.close());
    let on_server = std::fs::read(server.dir.join("f")).unwrap();
    assert!(on_server == data, "the file on the server differs");
}
