//! What one client may hold (a directory listing, open files, locks, a
//! FIFO's ends) and what it leaves the others.

use super::*;

/// A directory is listed from its descriptor a reply at a time (nothing
/// of it kept between requests): two fids on one large directory, read in
/// turns with small replies, each get every entry exactly once, and a fid
/// that starts again from offset 0 gets them all again.
#[test]
fn readdir_streams_from_the_offset_the_client_sends() {
    let t = TempDir::new("readdir");
    let names: std::collections::BTreeSet<Vec<u8>> = (0..3000)
        .map(|i| format!("entry-{i:05}").into_bytes())
        .collect();
    for n in &names {
        std::fs::write(t.0.join(std::str::from_utf8(n).unwrap()), b"").unwrap();
    }
    let ex = export(&t.0);
    let mut c = Client::new(&ex);
    for fid in [1, 2] {
        c.ok(Tmsg::Walk {
            fid: 0,
            newfid: fid,
            names: vec![],
        });
        c.ok(Tmsg::Lopen { fid, flags: 0 });
    }
    let mut got = [Vec::new(), Vec::new()];
    let mut offsets = [0u64, 0];
    let mut done = [false, false];
    while !done.iter().all(|&d| d) {
        for i in 0..2 {
            if done[i] {
                continue;
            }
            let out = c.ok(Tmsg::Readdir {
                fid: i as u32 + 1,
                offset: offsets[i],
                count: 200 + 100 * i as u32,
            });
            let Rmsg::Readdir { data } = Rmsg::decode(&out).unwrap().1 else {
                panic!()
            };
            let entries = DirEntry::decode_all(data).unwrap();
            match entries.last() {
                Some(last) => offsets[i] = last.offset,
                None => done[i] = true,
            }
            got[i].extend(entries.iter().map(|e| e.name.to_vec()));
        }
    }
    for g in &got {
        let mut want: Vec<Vec<u8>> = names.iter().cloned().collect();
        want.push(b".".to_vec());
        want.push(b"..".to_vec());
        want.sort();
        let mut g = g.clone();
        g.sort();
        assert_eq!(g.len(), 3002, "an entry listed twice or missed");
        assert_eq!(g, want);
    }
    // From 0 again: everything again.
    let out = c.ok(Tmsg::Readdir {
        fid: 1,
        offset: 0,
        count: 8000,
    });
    let Rmsg::Readdir { data } = Rmsg::decode(&out).unwrap().1 else {
        panic!()
    };
    assert!(DirEntry::decode_all(data).unwrap().len() > 100);
    // An offset the file system never gave: an error or nothing, not a
    // panic (and a u64 past i64::MAX is refused).
    assert_eq!(
        c.err(Tmsg::Readdir {
            fid: 1,
            offset: u64::MAX,
            count: 8000,
        }),
        EINVAL
    );
}

/// Each connection opens its share of files and what the shared pool has
/// left (`EMFILE` past it, for it alone): one client holding all it may
/// leaves another its share. Clunking, removing and the end of a connection
/// give back what came from the pool.
#[test]
fn open_files_are_limited_per_connection() {
    let t = TempDir::new("open-limit");
    for name in ["a", "b", "c", "d"] {
        std::fs::write(t.0.join(name), name).unwrap();
    }
    // One file of its own each, one in the pool.
    let budget = std::sync::Arc::new(rdma_9p::budget::OpenBudget::new(1, 1));
    let ex = Export::new(&t.0, false, 64)
        .unwrap()
        .with_users(trusting())
        .with_open_budget(std::sync::Arc::clone(&budget));
    let mut greedy = Client::new(&ex);
    open_file(&mut greedy, 1, b"a", libc::O_RDONLY);
    open_file(&mut greedy, 2, b"b", libc::O_RDONLY);
    assert_eq!(lerror(&greedy.walk(0, 3, &[b"c"])), None);
    assert_eq!(greedy.err(lopen_read(3)), libc::EMFILE as u32);
    assert_eq!(lerror(&greedy.walk(0, 4, &[])), None);
    assert_eq!(
        greedy.err(Tmsg::Lcreate {
            fid: 4,
            name: b"new",
            flags: libc::O_RDWR as u32,
            mode: 0o644,
            gid: 0,
        }),
        libc::EMFILE as u32
    );
    assert!(
        !t.0.join("new").exists(),
        "a refused Tlcreate created its file"
    );
    assert_eq!(greedy.s.open_fids(), 2);
    assert_eq!(
        budget.pool(),
        (1, 1),
        "the greedy one's second came from the pool"
    );
    // Another connection still has its own share, and nothing more.
    let mut other = Client::new(&ex);
    open_file(&mut other, 1, b"c", libc::O_RDONLY);
    assert_eq!(lerror(&other.walk(0, 2, &[b"d"])), None);
    assert_eq!(other.err(lopen_read(2)), libc::EMFILE as u32);
    // A clunk gives one back to the pool, which the other may then take.
    greedy.ok(Tmsg::Clunk { fid: 1 });
    assert_eq!(budget.pool(), (0, 1));
    other.ok(lopen_read(2));
    // A remove of an open fid gives back too; the end of a connection all it held.
    greedy.ok(Tmsg::Remove { fid: 2 });
    assert_eq!(greedy.s.open_fids(), 0);
    assert!(!t.0.join("b").exists());
    assert_eq!(budget.pool(), (1, 1));
    other.s.close_all();
    assert_eq!((other.s.open_fids(), budget.pool()), (0, (0, 1)));
}

fn lock_req(ty: u8, start: u64, length: u64) -> Flock<'static> {
    Flock {
        ty,
        flags: 0,
        start,
        length,
        proc_id: 7,
        client_id: b"test",
    }
}

fn lock_status(c: &mut Client<'_>, fid: u32, l: Flock<'_>) -> u8 {
    match Rmsg::decode(&c.ok(Tmsg::Lock { fid, lock: l })).unwrap().1 {
        Rmsg::Lock { status } => status,
        other => panic!("expected Rlock, got {other:?}"),
    }
}

fn getlock(c: &mut Client<'_>, fid: u32, l: Flock<'_>) -> (u8, u64, u64) {
    match Rmsg::decode(&c.ok(Tmsg::Getlock { fid, lock: l }))
        .unwrap()
        .1
    {
        Rmsg::Getlock { lock } => (lock.ty, lock.start, lock.length),
        other => panic!("expected Rgetlock, got {other:?}"),
    }
}

#[test]
fn posix_locks_conflict_between_clients() {
    use rdma_9p::proto::lock::{BLOCKED, RDLCK, SUCCESS, UNLCK, WRLCK};
    let t = TempDir::new("locks");
    std::fs::write(t.0.join("f"), b"0123456789").unwrap();
    let ex = export(&t.0);
    let (mut a, mut b) = (Client::new(&ex), Client::new(&ex));
    open_file(&mut a, 1, b"f", libc::O_RDWR);
    open_file(&mut b, 1, b"f", libc::O_RDWR);
    // A write lock on bytes 0..10 by one client blocks the other's.
    assert_eq!(lock_status(&mut a, 1, lock_req(WRLCK, 0, 10)), SUCCESS);
    assert_eq!(lock_status(&mut b, 1, lock_req(WRLCK, 5, 1)), BLOCKED);
    assert_eq!(lock_status(&mut b, 1, lock_req(RDLCK, 0, 0)), BLOCKED);
    assert_eq!(getlock(&mut b, 1, lock_req(WRLCK, 0, 0)), (WRLCK, 0, 10));
    // Linux's client asks with F_UNLCK: any lock held is reported.
    assert_eq!(getlock(&mut b, 1, lock_req(UNLCK, 0, 0)), (WRLCK, 0, 10));
    // Byte ranges: beyond the lock is free.
    assert_eq!(lock_status(&mut b, 1, lock_req(WRLCK, 10, 5)), SUCCESS);
    assert_eq!(getlock(&mut a, 1, lock_req(RDLCK, 12, 1)), (WRLCK, 10, 5));
    // The holder asking sees no conflict with itself.
    assert_eq!(getlock(&mut a, 1, lock_req(WRLCK, 0, 10)).0, UNLCK);
    // A local process sees the server's lock on the file itself.
    let local = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(t.0.join("f"))
        .unwrap();
    // SAFETY: all-zero is a valid flock.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 3;
    fl.l_len = 1;
    // SAFETY: F_OFD_GETLK reads and writes the valid flock.
    let rc = unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&local),
            libc::F_OFD_GETLK,
            &mut fl,
        )
    };
    assert_eq!(rc, 0);
    assert_eq!(fl.l_type, libc::F_WRLCK as libc::c_short);
    // Unlocked, the other client gets it; read locks share.
    assert_eq!(lock_status(&mut a, 1, lock_req(UNLCK, 0, 10)), SUCCESS);
    assert_eq!(lock_status(&mut b, 1, lock_req(RDLCK, 0, 10)), SUCCESS);
    assert_eq!(lock_status(&mut a, 1, lock_req(RDLCK, 0, 10)), SUCCESS);
    assert_eq!(lock_status(&mut a, 1, lock_req(WRLCK, 0, 1)), BLOCKED);
    // A clunk closes the file and so drops its locks.
    b.ok(Tmsg::Clunk { fid: 1 });
    assert_eq!(lock_status(&mut a, 1, lock_req(WRLCK, 0, 0)), SUCCESS);
    // Bad requests: a fid not open, an unknown type, a range past off_t.
    assert_eq!(lerror(&b.walk(0, 2, &[b"f"])), None);
    assert_eq!(
        b.err(Tmsg::Lock {
            fid: 2,
            lock: lock_req(WRLCK, 0, 0)
        }),
        libc::EBADF as u32
    );
    assert_eq!(
        a.err(Tmsg::Lock {
            fid: 1,
            lock: lock_req(9, 0, 0)
        }),
        EINVAL
    );
    assert_eq!(
        a.err(Tmsg::Getlock {
            fid: 1,
            lock: lock_req(WRLCK, u64::MAX, 1)
        }),
        EINVAL
    );
    assert_eq!(
        a.err(Tmsg::Lock {
            fid: 1,
            lock: lock_req(WRLCK, i64::MAX as u64, 10)
        }),
        libc::EOVERFLOW as u32
    );
}

/// `session`'s reply to `msg`, handled on a thread of its own: a request that
/// waits more than 10 s fails the test instead of hanging it.
fn within_10_s(session: &rdma_9p::fs::Session, msg: Tmsg<'_>) -> Vec<u8> {
    let mut buf = Vec::new();
    Request { tag: 100, msg }.encode(&mut buf);
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        s.spawn(move || {
            let mut out = Vec::new();
            session.handle(&buf, &mut out).unwrap();
            let _ = tx.send(out);
        });
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("a request on a FIFO waited")
    })
}

/// Nothing on a FIFO waits for its other end: opening it, reading it with
/// no data, writing it full. Each is answered at once (`EAGAIN`, or a short
/// count for a write), so a client cannot hold a server thread, descriptors
/// and its connection's buffers for as long as it likes, nor leave them held
/// after it is gone. Each request runs on a thread of its own here, bounded
/// by a timeout: a wait fails the test instead of hanging it.
#[test]
fn a_fifo_never_holds_a_thread() {
    let t = TempDir::new("fifo");
    let fifo = t.0.join("p");
    let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let ex = export(&t.0);
    let mut c = Client::new(&ex);
    // Opening for reading with no writer returns at once (in the test's
    // own thread: it never waits either).
    open_file(&mut c, 1, b"p", libc::O_RDONLY);
    let session = &c.s;
    let bounded = |msg: Tmsg<'_>| within_10_s(session, msg);
    let read = |fid| Tmsg::Read {
        fid,
        offset: 0,
        count: 64,
    };
    // A writer that has written nothing: no data yet, at once.
    let mut writer = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    let out = bounded(read(1));
    assert_eq!(
        Rmsg::decode(&out).unwrap(),
        (
            100,
            Rmsg::Lerror {
                ecode: libc::EAGAIN as u32
            }
        )
    );
    std::io::Write::write_all(&mut writer, b"data").unwrap();
    let out = bounded(read(1));
    assert_eq!(
        Rmsg::decode(&out).unwrap(),
        (100, Rmsg::Read { data: b"data" })
    );
    drop(writer);
    // Written full (nobody reads what fid 1 has): a short count, then
    // EAGAIN, never a wait.
    let mut c2 = Client::new(&ex);
    open_file(&mut c2, 2, b"p", libc::O_WRONLY);
    let big = vec![7u8; 4096];
    let mut written = 0usize;
    let mut refused = false;
    for _ in 0..64 {
        let write = Tmsg::Write {
            fid: 2,
            offset: 0,
            data: &big,
        };
        let out = within_10_s(&c2.s, write);
        match Rmsg::decode(&out).unwrap().1 {
            Rmsg::Write { count } => written += count as usize,
            Rmsg::Lerror { ecode } => {
                assert_eq!(ecode, libc::EAGAIN as u32);
                refused = true;
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(refused, "64 writes of 4 KiB into a pipe nobody read");
    assert!(written >= 4096, "{written} bytes went into the pipe");
}
