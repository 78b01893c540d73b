//! Every message round-trips, and every cut, oversized or random input fails
//! cleanly.

use super::*;

fn round_t(msg: Tmsg<'_>) {
    let req = Request { tag: 7, msg };
    let mut buf = Vec::new();
    let n = req.encode(&mut buf);
    assert_eq!(n, buf.len());
    assert_eq!(Request::decode(&buf).unwrap(), req);
    // Every shorter prefix, with its size field fixed up, fails cleanly
    // (never a panic), and so does every prefix left as it was.
    for cut in 0..buf.len() {
        let mut b = buf[..cut].to_vec();
        assert!(Request::decode(&b).is_err(), "{cut} of {}", buf.len());
        if b.len() >= 4 {
            let len = (b.len() as u32).to_le_bytes();
            b[..4].copy_from_slice(&len);
            if cut >= HEADER {
                let e = Request::decode(&b).expect_err("a cut body");
                assert_eq!(e.tag, Some(7));
            }
        }
    }
    // A byte too many is refused (except Tfsync's optional field).
    let mut b = buf.clone();
    b.push(0);
    let len = (b.len() as u32).to_le_bytes();
    b[..4].copy_from_slice(&len);
    assert!(Request::decode(&b).is_err());
}

#[test]
fn every_request_round_trips_and_every_cut_fails() {
    let lock = Flock {
        ty: 1,
        flags: 1,
        start: 5,
        length: 10,
        proc_id: 42,
        client_id: b"host",
    };
    let msgs = vec![
        Tmsg::Version {
            msize: 131072,
            version: VERSION,
        },
        Tmsg::Auth {
            afid: 1,
            uname: b"root",
            aname: b"",
            n_uname: 0,
        },
        Tmsg::Attach {
            fid: 0,
            afid: NOFID,
            uname: b"root",
            aname: b"/x",
            n_uname: 0,
        },
        Tmsg::Flush { oldtag: 3 },
        Tmsg::Walk {
            fid: 0,
            newfid: 1,
            names: vec![b"a", b"bb"],
        },
        Tmsg::Walk {
            fid: 0,
            newfid: 1,
            names: vec![],
        },
        Tmsg::Read {
            fid: 1,
            offset: 1 << 40,
            count: 4096,
        },
        Tmsg::Write {
            fid: 1,
            offset: 9,
            data: b"hello",
        },
        Tmsg::Clunk { fid: 1 },
        Tmsg::Remove { fid: 1 },
        Tmsg::Statfs { fid: 1 },
        Tmsg::Lopen { fid: 1, flags: 2 },
        Tmsg::Lcreate {
            fid: 1,
            name: b"f",
            flags: 0o1101,
            mode: 0o644,
            gid: 0,
        },
        Tmsg::Symlink {
            fid: 1,
            name: b"l",
            target: b"../t",
            gid: 0,
        },
        Tmsg::Mknod {
            dfid: 1,
            name: b"p",
            mode: 0o10644,
            major: 0,
            minor: 0,
            gid: 0,
        },
        Tmsg::Rename {
            fid: 1,
            dfid: 2,
            name: b"n",
        },
        Tmsg::Readlink { fid: 1 },
        Tmsg::Getattr {
            fid: 1,
            mask: 0x3fff,
        },
        Tmsg::Setattr {
            fid: 1,
            attr: SetAttr {
                valid: setattr::SIZE | setattr::MODE,
                mode: 0o600,
                size: 77,
                ..SetAttr::default()
            },
        },
        Tmsg::Xattrwalk {
            fid: 1,
            newfid: 2,
            name: b"user.x",
        },
        Tmsg::Xattrcreate {
            fid: 1,
            name: b"user.x",
            size: 3,
            flags: 0,
        },
        Tmsg::Readdir {
            fid: 1,
            offset: 0,
            count: 8192,
        },
        Tmsg::Fsync {
            fid: 1,
            datasync: 1,
        },
        Tmsg::Lock { fid: 1, lock },
        Tmsg::Getlock {
            fid: 1,
            lock: Flock { flags: 0, ..lock },
        },
        Tmsg::Link {
            dfid: 1,
            fid: 2,
            name: b"h",
        },
        Tmsg::Mkdir {
            dfid: 1,
            name: b"d",
            mode: 0o755,
            gid: 0,
        },
        Tmsg::Renameat {
            olddirfid: 1,
            oldname: b"a",
            newdirfid: 2,
            newname: b"b",
        },
        Tmsg::Unlinkat {
            dfid: 1,
            name: b"d",
            flags: 0x200,
        },
    ];
    for m in msgs {
        if let Tmsg::Fsync { .. } = m {
            continue;
        }
        round_t(m);
    }
}

#[test]
fn fsync_with_and_without_datasync() {
    let mut buf = Vec::new();
    Request {
        tag: 1,
        msg: Tmsg::Fsync {
            fid: 4,
            datasync: 1,
        },
    }
    .encode(&mut buf);
    assert_eq!(
        Request::decode(&buf).unwrap().msg,
        Tmsg::Fsync {
            fid: 4,
            datasync: 1
        }
    );
    let mut short = Vec::new();
    Writer::new(&mut short, ty::TFSYNC, 1).u32(4).finish();
    assert_eq!(
        Request::decode(&short).unwrap().msg,
        Tmsg::Fsync {
            fid: 4,
            datasync: 0
        }
    );
}

#[test]
fn bad_headers_are_refused_without_a_tag() {
    assert_eq!(Request::decode(&[]).unwrap_err().tag, None);
    assert_eq!(
        Request::decode(&[1, 2, 3]).unwrap_err().error,
        DecodeError::Short
    );
    let mut buf = Vec::new();
    Request {
        tag: 9,
        msg: Tmsg::Clunk { fid: 1 },
    }
    .encode(&mut buf);
    // A size field larger or smaller than what arrived.
    for size in [0u32, 6, buf.len() as u32 + 1, u32::MAX] {
        let mut b = buf.clone();
        b[..4].copy_from_slice(&size.to_le_bytes());
        let e = Request::decode(&b).unwrap_err();
        assert_eq!(e.tag, None);
        assert!(matches!(e.error, DecodeError::Size { .. }), "{e:?}");
    }
}

#[test]
fn oversized_fields_are_refused() {
    // A walk with 17 names.
    let mut b = Vec::new();
    let mut w = Writer::new(&mut b, ty::TWALK, 2);
    w.u32(0).u32(1).u16(17);
    for _ in 0..17 {
        w.str(b"a");
    }
    w.finish();
    assert_eq!(
        Request::decode(&b).unwrap_err().error,
        DecodeError::TooManyNames(17)
    );
    // A write whose count says more than the message holds.
    let mut b = Vec::new();
    Writer::new(&mut b, ty::TWRITE, 2)
        .u32(0)
        .u64(0)
        .u32(u32::MAX)
        .bytes(b"abc")
        .finish();
    assert_eq!(
        Request::decode(&b).unwrap_err().error,
        DecodeError::Truncated
    );
    // A string whose length runs past the end.
    let mut b = Vec::new();
    Writer::new(&mut b, ty::TMKDIR, 2)
        .u32(0)
        .u16(300)
        .bytes(b"x")
        .finish();
    assert_eq!(
        Request::decode(&b).unwrap_err().error,
        DecodeError::Truncated
    );
    // An unknown type keeps its tag (the server answers Rlerror).
    let mut b = Vec::new();
    Writer::new(&mut b, 250, 5).finish();
    let e = Request::decode(&b).unwrap_err();
    assert_eq!((e.tag, e.error), (Some(5), DecodeError::UnknownType(250)));
}

#[test]
fn every_reply_round_trips() {
    let qid = Qid {
        ty: QTDIR,
        version: 1,
        path: 99,
    };
    let mut dir = Vec::new();
    let entry = DirEntry {
        qid,
        offset: 1,
        ty: 4,
        name: b"sub",
    };
    entry.encode(&mut dir);
    assert_eq!(dir.len(), entry.len());
    assert_eq!(DirEntry::decode_all(&dir).unwrap(), vec![entry.clone()]);
    assert!(DirEntry::decode_all(&dir[..dir.len() - 1]).is_err());
    let replies = vec![
        Rmsg::Lerror { ecode: 2 },
        Rmsg::Version {
            msize: 8192,
            version: VERSION,
        },
        Rmsg::Attach { qid },
        Rmsg::Flush,
        Rmsg::Walk {
            qids: vec![qid, qid],
        },
        Rmsg::Read { data: b"abc" },
        Rmsg::Write { count: 3 },
        Rmsg::Clunk,
        Rmsg::Remove,
        Rmsg::Statfs(StatFs {
            bsize: 4096,
            namelen: 255,
            ..StatFs::default()
        }),
        Rmsg::Lopen { qid, iounit: 0 },
        Rmsg::Lcreate { qid, iounit: 7 },
        Rmsg::Symlink { qid },
        Rmsg::Mknod { qid },
        Rmsg::Rename,
        Rmsg::Readlink { target: b"t" },
        Rmsg::Getattr(Box::new(Attr {
            valid: GETATTR_BASIC,
            qid,
            size: 5,
            ..Attr::default()
        })),
        Rmsg::Setattr,
        Rmsg::Readdir { data: &dir },
        Rmsg::Fsync,
        Rmsg::Lock { status: 0 },
        Rmsg::Getlock {
            lock: Flock {
                ty: 2,
                flags: 0,
                start: 0,
                length: 0,
                proc_id: 0,
                client_id: b"",
            },
        },
        Rmsg::Link,
        Rmsg::Mkdir { qid },
        Rmsg::Renameat,
        Rmsg::Unlinkat,
    ];
    for r in replies {
        let mut buf = Vec::new();
        r.encode(3, &mut buf);
        assert_eq!(Rmsg::decode(&buf).unwrap(), (3, r.clone()));
        for cut in 0..buf.len() {
            let mut b = buf[..cut].to_vec();
            if b.len() >= 4 {
                let len = (b.len() as u32).to_le_bytes();
                b[..4].copy_from_slice(&len);
            }
            assert!(Rmsg::decode(&b).is_err(), "{r:?} cut at {cut}");
        }
    }
}

#[test]
fn random_bytes_never_panic() {
    // A small deterministic generator: no dependency, same bytes each run.
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for _ in 0..20_000 {
        let len = (next() % 64) as usize;
        let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if b.len() >= 7 {
            let l = (b.len() as u32).to_le_bytes();
            b[..4].copy_from_slice(&l);
            // Mostly known types, to reach the bodies.
            b[4] = [
                8, 12, 14, 16, 18, 20, 24, 26, 40, 52, 54, 72, 74, 76, 100, 104, 110, 118,
            ][(next() % 18) as usize];
        }
        let _ = Request::decode(&b);
        let _ = Rmsg::decode(&b);
        let _ = DirEntry::decode_all(&b);
    }
}
