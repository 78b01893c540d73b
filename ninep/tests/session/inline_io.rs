//! The reads and writes answered where they are received (the file read
//! straight into the send buffer) answer as the general path, and the
//! benchmark-only null mode leaves files untouched.

use super::*;

/// The requests the server runs where it receives them (`is_file_io`):
/// reads and writes of fids open on regular files, and nothing else: not a
/// FIFO (its read waits for a writer), a directory, a fid not open or not
/// known, another message type or a message cut short.
#[test]
fn only_reads_and_writes_of_regular_files_run_inline() {
    let t = TempDir::new("inline");
    let fifo = t.0.join("p");
    let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    std::fs::create_dir(t.0.join("d")).unwrap();
    std::fs::write(t.0.join("f"), b"x").unwrap();
    let ex = export(&t.0);
    let mut c = Client::new(&ex);
    open_file(&mut c, 1, b"f", libc::O_RDWR);
    open_file(&mut c, 2, b"p", libc::O_RDONLY);
    open_file(&mut c, 3, b"d", libc::O_RDONLY | libc::O_DIRECTORY);
    assert_eq!(lerror(&c.walk(0, 4, &[])), None); // the root, created in
    c.ok(Tmsg::Lcreate {
        fid: 4,
        name: b"new",
        flags: libc::O_RDWR as u32,
        mode: 0o600,
        gid: 0,
    });
    let enc = |msg: Tmsg<'_>| {
        let mut buf = Vec::new();
        Request { tag: 7, msg }.encode(&mut buf);
        buf
    };
    let read = |fid| {
        enc(Tmsg::Read {
            fid,
            offset: 0,
            count: 64,
        })
    };
    let write = |fid| {
        enc(Tmsg::Write {
            fid,
            offset: 0,
            data: b"y",
        })
    };
    // A regular file, opened with Tlopen (fid 1) or Tlcreate (fid 4).
    for fid in [1, 4] {
        assert!(c.s.is_file_io(&read(fid)), "read of fid {fid}");
        assert!(c.s.is_file_io(&write(fid)), "write of fid {fid}");
    }
    // A FIFO, a directory, the root (not open), a fid nobody has.
    for fid in [2, 3, 0, 99] {
        assert!(!c.s.is_file_io(&read(fid)), "read of fid {fid}");
        assert!(!c.s.is_file_io(&write(fid)), "write of fid {fid}");
    }
    // Other requests on the regular file's fid.
    assert!(!c.s.is_file_io(&enc(Tmsg::Getattr {
        fid: 1,
        mask: 0x7ff
    })));
    assert!(!c.s.is_file_io(&enc(Tmsg::Fsync {
        fid: 1,
        datasync: 0
    })));
    // Cut short before the fid ends, and empty.
    let r = read(1);
    for n in 0..11 {
        assert!(!c.s.is_file_io(&r[..n]), "read cut to {n} bytes");
    }
    assert!(c.s.is_file_io(&r[..11]), "the fid is all it looks at");
    // Clunked: no longer.
    c.ok(Tmsg::Clunk { fid: 1 });
    assert!(!c.s.is_file_io(&read(1)));
}

/// The benchmark-only null mode (`RDMA_9P_BENCH_NULL`): a read of a
/// regular file is answered with the bytes asked for (at most what fits)
/// and a write with its length, the file untouched either way; anything
/// else (a FIFO's read, a getattr, a message larger than msize) is left to
/// the usual handler.
#[test]
fn null_io_answers_without_touching_the_file() {
    let t = TempDir::new("null");
    let fifo = t.0.join("p");
    let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    std::fs::write(t.0.join("f"), b"abc").unwrap();
    let ex = export(&t.0);
    let mut c = Client::new(&ex);
    open_file(&mut c, 1, b"f", libc::O_RDWR);
    open_file(&mut c, 2, b"p", libc::O_RDONLY);
    let enc = |msg: Tmsg<'_>| {
        let mut buf = Vec::new();
        Request { tag: 9, msg }.encode(&mut buf);
        buf
    };
    let mut out = vec![0x5a_u8; 8192];
    // A read past the file's end still gets every byte it asked for.
    let read = enc(Tmsg::Read {
        fid: 1,
        offset: 1000,
        count: 100,
    });
    let n =
        c.s.null_io_into(&read, &mut out)
            .expect("a read of a regular file");
    assert_eq!(
        Rmsg::decode(&out[..n]).unwrap(),
        (9, Rmsg::Read { data: &[0x5a; 100] })
    );
    // No more than fits in the reply buffer.
    let big = enc(Tmsg::Read {
        fid: 1,
        offset: 0,
        count: 1 << 20,
    });
    let mut small = vec![0; 64];
    let n = c.s.null_io_into(&big, &mut small).unwrap();
    assert_eq!(n, 64);
    assert!(
        matches!(Rmsg::decode(&small[..n]).unwrap(), (9, Rmsg::Read { data }) if data.len() == 53)
    );
    let write = enc(Tmsg::Write {
        fid: 1,
        offset: 0,
        data: b"XYZW",
    });
    let n =
        c.s.null_io_into(&write, &mut out)
            .expect("a write of a regular file");
    assert_eq!(
        Rmsg::decode(&out[..n]).unwrap(),
        (9, Rmsg::Write { count: 4 })
    );
    assert_eq!(
        std::fs::read(t.0.join("f")).unwrap(),
        b"abc",
        "the file was written"
    );
    // Not a regular file's read or write: left to the usual handler.
    let fifo_read = enc(Tmsg::Read {
        fid: 2,
        offset: 0,
        count: 10,
    });
    assert_eq!(c.s.null_io_into(&fifo_read, &mut out), None);
    let getattr = enc(Tmsg::Getattr {
        fid: 1,
        mask: 0x7ff,
    });
    assert_eq!(c.s.null_io_into(&getattr, &mut out), None);
    let mut huge = enc(Tmsg::Write {
        fid: 1,
        offset: 0,
        data: &vec![0; c.s.msize() as usize],
    });
    assert_eq!(c.s.null_io_into(&huge, &mut out), None, "larger than msize");
    huge.truncate(11);
    assert_eq!(c.s.null_io_into(&huge, &mut out), None, "cut short");
}

/// The server's `Tread` path (the file read straight into the send buffer)
/// answers exactly as the general one, whatever `count` and offset, and
/// never writes past msize or the buffer it is given.
#[test]
fn reads_into_the_send_buffer_answer_as_the_general_path() {
    let dir = TempDir::new("read-into");
    let content: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    std::fs::write(dir.0.join("f"), &content).unwrap();
    let ex = export(&dir.0);
    let mut c = Client::new(&ex);
    c.walk(0, 1, &[b"f"]);
    c.ok(Tmsg::Lopen {
        fid: 1,
        flags: libc::O_RDONLY as u32,
    });
    let msize = c.s.msize() as usize;
    for (offset, count) in [
        (0u64, 0u32),
        (0, 1),
        (3, 100),
        (0, (msize - IOHDRSZ) as u32),
        (0, (msize - IOHDRSZ + 1) as u32),
        (5, u32::MAX),
        (19_990, 100),
        (20_000, 10),
        (u64::MAX, 10),
    ] {
        for (fid, room) in [(1, msize), (1, msize + 64), (1, IOHDRSZ + 10), (9, msize)] {
            let mut buf = Vec::new();
            Request {
                tag: 77,
                msg: Tmsg::Read { fid, offset, count },
            }
            .encode(&mut buf);
            let mut general = Vec::new();
            c.s.handle(&buf, &mut general).unwrap();
            let mut send = vec![0xa5; room + 16];
            let n = c.s.handle_into(&buf, &mut send[..room]).unwrap();
            assert!(
                send[room..].iter().all(|&b| b == 0xa5),
                "wrote past the buffer"
            );
            let what = format!("offset {offset} count {count} fid {fid} room {room}");
            if room >= msize {
                assert_eq!(&send[..n], &general[..], "{what}");
            } else {
                // A smaller buffer bounds the read instead.
                let (tag, r) = Rmsg::decode(&send[..n]).expect(&what);
                assert_eq!(tag, 77);
                let (_, g) = Rmsg::decode(&general).unwrap();
                match (r, g) {
                    (Rmsg::Read { data }, Rmsg::Read { data: all }) => {
                        assert_eq!(data, &all[..all.len().min(room - IOHDRSZ)], "{what}")
                    }
                    (r, g) => assert_eq!(r, g, "{what}"),
                }
            }
            if fid == 9 {
                assert_eq!(lerror(&send[..n]), Some(libc::EBADF as u32), "{what}");
            }
        }
    }
}

#[test]
fn writes_answered_in_place_answer_as_the_general_path() {
    let dir = TempDir::new("write-into");
    std::fs::write(dir.0.join("f"), b"").unwrap();
    std::fs::create_dir(dir.0.join("d")).unwrap();
    let ex = export(&dir.0);
    let mut c = Client::new(&ex);
    open_file(&mut c, 1, b"f", libc::O_RDWR);
    open_file(&mut c, 2, b"f", libc::O_RDONLY);
    open_file(&mut c, 3, b"d", libc::O_RDONLY);
    assert_eq!(lerror(&c.walk(0, 4, &[b"f"])), None); // walked, not open
    let data: Vec<u8> = (0..3000u32).map(|i| (i % 253) as u8).collect();
    // (fid, offset, expected errno): each request once through each path.
    for (fid, offset, errno) in [
        (1, 0u64, None),
        (1, 3000, None),
        (2, 0, Some(libc::EBADF)),
        (3, 0, Some(libc::EBADF)),
        (4, 0, Some(libc::EBADF)),
        (9, 0, Some(libc::EBADF)),
        (1, u64::MAX, Some(libc::EINVAL)),
    ] {
        let mut buf = Vec::new();
        Request {
            tag: 78,
            msg: Tmsg::Write {
                fid,
                offset,
                data: &data,
            },
        }
        .encode(&mut buf);
        let mut general = Vec::new();
        c.s.handle(&buf, &mut general).unwrap();
        let mut send = vec![0xa5; c.s.msize() as usize];
        let n = c.s.handle_into(&buf, &mut send).unwrap();
        let what = format!("fid {fid} offset {offset}");
        assert_eq!(&send[..n], &general[..], "{what}");
        assert_eq!(lerror(&general), errno.map(|e| e as u32), "{what}");
        if errno.is_none() {
            assert_eq!(
                Rmsg::decode(&general).unwrap(),
                (78, Rmsg::Write { count: 3000 })
            );
        }
    }
    // Written twice at each offset (once per path), nothing else.
    let mut want = data.clone();
    want.extend_from_slice(&data);
    assert_eq!(std::fs::read(dir.0.join("f")).unwrap(), want);
}
