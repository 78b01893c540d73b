//! The file server's operations and its confinement, driven through
//! `Session::handle` with encoded messages (no device needed).

use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;

mod common;

use common::session::{lerror, lopen_read, Client, TempDir, EINVAL, ENOENT, EROFS, EXDEV};
use rdma_9p::fs::Export;
use rdma_9p::proto::{
    setattr, DirEntry, Flock, Request, Rmsg, SetAttr, Tmsg, IOHDRSZ, NOFID, VERSION,
};
use rdma_9p::users::{Squash, Users};

/// An export whose clients act as the users they name, root included (the
/// tests attach as root and check the server's own behaviour; the trust
/// model has its own tests in `tests/users.rs`).
fn export(dir: &Path) -> Export {
    Export::new(dir, false, 64).unwrap().with_users(trusting())
}

fn trusting() -> Users {
    Users {
        squash: Squash::None,
        ..Users::default()
    }
}

#[test]
fn create_write_read_readdir_and_attributes() {
    let t = TempDir::new("basic");
    let ex = export(&t.0);
    let mut c = Client::new(&ex);
    c.ok(Tmsg::Mkdir {
        dfid: 0,
        name: b"d",
        mode: 0o755,
        gid: 0,
    });
    assert!(t.0.join("d").is_dir());
    c.ok(Tmsg::Walk {
        fid: 0,
        newfid: 1,
        names: vec![b"d"],
    });
    c.ok(Tmsg::Lcreate {
        fid: 1,
        name: b"f",
        flags: libc::O_RDWR as u32,
        mode: 0o640,
        gid: 0,
    });
    let w = c.ok(Tmsg::Write {
        fid: 1,
        offset: 3,
        data: b"hello",
    });
    assert_eq!(Rmsg::decode(&w).unwrap().1, Rmsg::Write { count: 5 });
    assert_eq!(std::fs::read(t.0.join("d/f")).unwrap(), b"\0\0\0hello");
    assert_eq!(
        std::fs::metadata(t.0.join("d/f"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o640
    );
    let r = c.ok(Tmsg::Read {
        fid: 1,
        offset: 2,
        count: 100,
    });
    assert_eq!(Rmsg::decode(&r).unwrap().1, Rmsg::Read { data: b"\0hello" });
    // A read larger than msize is cut to msize - 11.
    std::fs::write(t.0.join("big"), vec![7u8; 20000]).unwrap();
    c.ok(Tmsg::Walk {
        fid: 0,
        newfid: 2,
        names: vec![b"big"],
    });
    c.ok(Tmsg::Lopen { fid: 2, flags: 0 });
    let r = c.ok(Tmsg::Read {
        fid: 2,
        offset: 0,
        count: 20000,
    });
    let Rmsg::Read { data } = Rmsg::decode(&r).unwrap().1 else {
        panic!()
    };
    assert_eq!(data.len(), 8192 - 11);
    assert!(r.len() <= 8192);
    // Getattr against the file system's own answer.
    let g = c.ok(Tmsg::Getattr { fid: 1, mask: !0 });
    let Rmsg::Getattr(a) = Rmsg::decode(&g).unwrap().1 else {
        panic!()
    };
    let m = std::fs::metadata(t.0.join("d/f")).unwrap();
    assert_eq!((a.size, a.qid.path, a.mode), (8, m.ino(), m.mode()));
    // Setattr: truncate and chmod.
    c.ok(Tmsg::Setattr {
        fid: 1,
        attr: SetAttr {
            valid: setattr::SIZE | setattr::MODE,
            size: 2,
            mode: 0o600,
            ..SetAttr::default()
        },
    });
    let m = std::fs::metadata(t.0.join("d/f")).unwrap();
    assert_eq!((m.len(), m.mode() & 0o777), (2, 0o600));
    // Readdir of the directory lists ., .. and f, in pieces that resume.
    c.ok(Tmsg::Walk {
        fid: 0,
        newfid: 3,
        names: vec![b"d"],
    });
    c.ok(Tmsg::Lopen { fid: 3, flags: 0 });
    let mut names = Vec::new();
    let mut offset = 0;
    loop {
        let out = c.ok(Tmsg::Readdir {
            fid: 3,
            offset,
            count: 40,
        });
        let Rmsg::Readdir { data } = Rmsg::decode(&out).unwrap().1 else {
            panic!()
        };
        let entries = DirEntry::decode_all(data).unwrap();
        let Some(last) = entries.last() else { break };
        offset = last.offset;
        names.extend(entries.iter().map(|e| e.name.to_vec()));
    }
    names.sort();
    assert_eq!(names, vec![b".".to_vec(), b"..".to_vec(), b"f".to_vec()]);
    c.ok(Tmsg::Fsync {
        fid: 1,
        datasync: 0,
    });
    c.ok(Tmsg::Statfs { fid: 0 });
    let lock = Flock {
        ty: 1,
        flags: 0,
        start: 0,
        length: 0,
        proc_id: 1,
        client_id: b"c",
    };
    assert_eq!(
        Rmsg::decode(&c.ok(Tmsg::Lock { fid: 1, lock })).unwrap().1,
        Rmsg::Lock { status: 0 }
    );
    c.ok(Tmsg::Getlock { fid: 1, lock });
    for fid in [1, 2, 3] {
        c.ok(Tmsg::Clunk { fid });
    }
    assert_eq!(c.err(Tmsg::Clunk { fid: 1 }), libc::EBADF as u32);
    assert_eq!(c.s.fids(), 1);
}

#[test]
fn links_renames_and_removal() {
    let t = TempDir::new("names");
    let ex = export(&t.0);
    let mut c = Client::new(&ex);
    std::fs::write(t.0.join("a"), b"x").unwrap();
    c.ok(Tmsg::Symlink {
        fid: 0,
        name: b"l",
        target: b"a",
        gid: 0,
    });
    c.ok(Tmsg::Walk {
        fid: 0,
        newfid: 1,
        names: vec![b"l"],
    });
    let r = c.ok(Tmsg::Readlink { fid: 1 });
    assert_eq!(Rmsg::decode(&r).unwrap().1, Rmsg::Readlink { target: b"a" });
    c.ok(Tmsg::Walk {
        fid: 0,
        newfid: 2,
        names: vec![b"a"],
    });
    c.ok(Tmsg::Link {
        dfid: 0,
        fid: 2,
        name: b"h",
    });
    assert_eq!(std::fs::metadata(t.0.join("a")).unwrap().nlink(), 2);
    c.ok(Tmsg::Mkdir {
        dfid: 0,
        name: b"d",
        mode: 0o700,
        gid: 0,
    });
    c.ok(Tmsg::Walk {
        fid: 0,
        newfid: 3,
        names: vec![b"d"],
    });
    c.ok(Tmsg::Renameat {
        olddirfid: 0,
        oldname: b"h",
        newdirfid: 3,
        newname: b"h2",
    });
    assert!(t.0.join("d/h2").exists());
    // Trename moves the fid with the file.
    c.ok(Tmsg::Rename {
        fid: 2,
        dfid: 3,
        name: b"moved",
    });
    assert_eq!(std::fs::read(t.0.join("d/moved")).unwrap(), b"x");
    c.ok(Tmsg::Lopen { fid: 2, flags: 0 });
    c.ok(Tmsg::Mknod {
        dfid: 0,
        name: b"fifo",
        mode: libc::S_IFIFO | 0o600,
        major: 0,
        minor: 0,
        gid: 0,
    });
    c.ok(Tmsg::Unlinkat {
        dfid: 0,
        name: b"fifo",
        flags: 0,
    });
    assert_eq!(
        c.err(Tmsg::Unlinkat {
            dfid: 0,
            name: b"d",
            flags: 0
        }),
        libc::EISDIR as u32
    );
    c.ok(Tmsg::Unlinkat {
        dfid: 3,
        name: b"h2",
        flags: 0,
    });
    c.ok(Tmsg::Unlinkat {
        dfid: 3,
        name: b"moved",
        flags: 0,
    });
    c.ok(Tmsg::Unlinkat {
        dfid: 0,
        name: b"d",
        flags: libc::AT_REMOVEDIR as u32,
    });
    assert!(!t.0.join("d").exists());
    assert_eq!(
        c.err(Tmsg::Xattrwalk {
            fid: 0,
            newfid: 9,
            name: b"user.x"
        }),
        libc::EOPNOTSUPP as u32
    );
}

#[test]
fn nothing_resolves_outside_the_root() {
    let outer = TempDir::new("outer");
    std::fs::write(outer.0.join("secret"), b"s").unwrap();
    let root = outer.0.join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(root.join("sub")).unwrap();
    symlink("../secret", root.join("up")).unwrap();
    symlink(outer.0.join("secret"), root.join("abs")).unwrap();
    symlink("..", root.join("dotdot")).unwrap();
    symlink("sub", root.join("inside")).unwrap();
    let ex = export(&root);
    let mut c = Client::new(&ex);
    // `..` at the root stays at the root.
    let out = c.walk(0, 1, &[b"..", b"..", b"sub"]);
    assert_eq!(lerror(&out), None);
    let g = c.ok(Tmsg::Getattr { fid: 1, mask: !0 });
    let Rmsg::Getattr(a) = Rmsg::decode(&g).unwrap().1 else {
        panic!()
    };
    assert_eq!(
        a.qid.path,
        std::fs::metadata(root.join("sub")).unwrap().ino()
    );
    // ".." then the outer directory's file: not found beneath the root.
    // (a partial walk: one qid, and no new fid).
    let out = c.walk(0, 2, &[b"..", b"secret"]);
    let Rmsg::Walk { qids } = Rmsg::decode(&out).unwrap().1 else {
        panic!("{out:?}")
    };
    assert_eq!(qids.len(), 1);
    assert_eq!(c.err(Tmsg::Clunk { fid: 2 }), libc::EBADF as u32);
    assert_eq!(lerror(&c.walk(0, 2, &[b"secret"])), Some(ENOENT));
    // Names with a slash, empty names and "." are refused.
    assert_eq!(lerror(&c.walk(0, 2, &[b"../secret"])), Some(EINVAL));
    assert_eq!(lerror(&c.walk(0, 2, &[b"sub/../.."])), Some(EINVAL));
    assert_eq!(lerror(&c.walk(0, 2, &[b""])), Some(EINVAL));
    assert_eq!(lerror(&c.walk(0, 2, &[b"."])), Some(EINVAL));
    // A symlink may be walked to (the client reads it), but never through
    // or opened when it leads out.
    for link in [&b"up"[..], b"abs", b"dotdot"] {
        let out = c.walk(0, 2, &[link]);
        assert_eq!(lerror(&out), None, "{:?}", String::from_utf8_lossy(link));
        assert!(c.err(Tmsg::Lopen { fid: 2, flags: 0 }) != 0);
        c.ok(Tmsg::Clunk { fid: 2 });
    }
    // Through one: the walk stops at the link (one qid, no new fid), and
    // the link's target cannot be reached at all.
    for second in [&b"secret"[..], b"root"] {
        let out = c.walk(0, 2, &[b"dotdot", second]);
        let Rmsg::Walk { qids } = Rmsg::decode(&out).unwrap().1 else {
            panic!("{out:?}")
        };
        assert_eq!(qids.len(), 1);
        assert_eq!(c.err(Tmsg::Clunk { fid: 2 }), libc::EBADF as u32);
    }
    c.ok(Tmsg::Walk {
        fid: 0,
        newfid: 4,
        names: vec![b"dotdot"],
    });
    assert_eq!(lerror(&c.walk(4, 2, &[b"secret"])), Some(EXDEV));
    assert_eq!(c.err(Tmsg::Lopen { fid: 4, flags: 0 }), libc::ELOOP as u32);
    // A symlink that stays inside may be walked through.
    assert_eq!(lerror(&c.walk(0, 2, &[b"inside"])), None);
    c.ok(Tmsg::Clunk { fid: 2 });
    // Creating through a symlink to outside fails; a file named ".." too.
    c.ok(Tmsg::Walk {
        fid: 0,
        newfid: 3,
        names: vec![b"dotdot"],
    });
    assert_eq!(
        c.err(Tmsg::Mkdir {
            dfid: 3,
            name: b"evil",
            mode: 0o755,
            gid: 0
        }),
        EXDEV
    );
    assert_eq!(
        c.err(Tmsg::Lcreate {
            fid: 0,
            name: b"..",
            flags: 2,
            mode: 0o644,
            gid: 0
        }),
        EINVAL
    );
    // Renames cannot name a path.
    assert_eq!(
        c.err(Tmsg::Renameat {
            olddirfid: 0,
            oldname: b"sub",
            newdirfid: 0,
            newname: b"../sub"
        }),
        EINVAL
    );
    assert_eq!(
        c.err(Tmsg::Renameat {
            olddirfid: 3,
            oldname: b"secret",
            newdirfid: 0,
            newname: b"stolen"
        }),
        EXDEV
    );
    assert!(outer.0.join("secret").exists());
    assert!(!outer.0.join("evil").exists());
    assert!(!root.join("stolen").exists());
}

#[test]
fn read_only_refuses_every_change() {
    let t = TempDir::new("ro");
    std::fs::write(t.0.join("f"), b"data").unwrap();
    std::fs::create_dir(t.0.join("d")).unwrap();
    let ex = Export::new(&t.0, true, 64).unwrap().with_users(trusting());
    let mut c = Client::new(&ex);
    c.ok(Tmsg::Walk {
        fid: 0,
        newfid: 1,
        names: vec![b"f"],
    });
    assert_eq!(c.err(Tmsg::Lopen { fid: 1, flags: 2 }), EROFS);
    assert_eq!(
        c.err(Tmsg::Lopen {
            fid: 1,
            flags: libc::O_TRUNC as u32
        }),
        EROFS
    );
    c.ok(Tmsg::Lopen { fid: 1, flags: 0 });
    assert_eq!(
        c.err(Tmsg::Write {
            fid: 1,
            offset: 0,
            data: b"x"
        }),
        EROFS
    );
    let changes = [
        Tmsg::Lcreate {
            fid: 0,
            name: b"n",
            flags: 2,
            mode: 0o644,
            gid: 0,
        },
        Tmsg::Mkdir {
            dfid: 0,
            name: b"n",
            mode: 0o755,
            gid: 0,
        },
        Tmsg::Symlink {
            fid: 0,
            name: b"n",
            target: b"f",
            gid: 0,
        },
        Tmsg::Mknod {
            dfid: 0,
            name: b"n",
            mode: libc::S_IFIFO | 0o600,
            major: 0,
            minor: 0,
            gid: 0,
        },
        Tmsg::Link {
            dfid: 0,
            fid: 1,
            name: b"n",
        },
        Tmsg::Renameat {
            olddirfid: 0,
            oldname: b"f",
            newdirfid: 0,
            newname: b"n",
        },
        Tmsg::Rename {
            fid: 1,
            dfid: 0,
            name: b"n",
        },
        Tmsg::Unlinkat {
            dfid: 0,
            name: b"f",
            flags: 0,
        },
        Tmsg::Unlinkat {
            dfid: 0,
            name: b"d",
            flags: libc::AT_REMOVEDIR as u32,
        },
        Tmsg::Setattr {
            fid: 1,
            attr: SetAttr {
                valid: setattr::SIZE,
                ..SetAttr::default()
            },
        },
    ];
    for m in changes {
        assert_eq!(c.err(m), EROFS);
    }
    assert_eq!(std::fs::read(t.0.join("f")).unwrap(), b"data");
    assert!(t.0.join("d").is_dir());
    assert_eq!(std::fs::read_dir(&t.0).unwrap().count(), 2);
}

#[test]
fn fid_limit_and_bad_messages() {
    let t = TempDir::new("limits");
    let ex = Export::new(&t.0, false, 4).unwrap().with_users(trusting());
    let mut c = Client::new(&ex);
    for fid in 1..4 {
        c.ok(Tmsg::Walk {
            fid: 0,
            newfid: fid,
            names: vec![],
        });
    }
    assert_eq!(
        c.err(Tmsg::Walk {
            fid: 0,
            newfid: 9,
            names: vec![]
        }),
        libc::EMFILE as u32
    );
    // A fid in use cannot be reused.
    c.ok(Tmsg::Clunk { fid: 3 });
    c.ok(Tmsg::Walk {
        fid: 0,
        newfid: 3,
        names: vec![],
    });
    assert_eq!(
        c.err(Tmsg::Walk {
            fid: 0,
            newfid: 3,
            names: vec![]
        }),
        libc::EBADF as u32
    );
    // A body cut short gets Rlerror with its tag; a broken header closes.
    let mut buf = Vec::new();
    Request {
        tag: 77,
        msg: Tmsg::Mkdir {
            dfid: 0,
            name: b"x",
            mode: 0,
            gid: 0,
        },
    }
    .encode(&mut buf);
    buf.truncate(buf.len() - 2);
    let n = buf.len() as u32;
    buf[..4].copy_from_slice(&n.to_le_bytes());
    let mut out = Vec::new();
    c.s.handle(&buf, &mut out).unwrap();
    assert_eq!(
        Rmsg::decode(&out).unwrap(),
        (
            77,
            Rmsg::Lerror {
                ecode: libc::EPROTO as u32
            }
        )
    );
    out.clear();
    buf[..4].copy_from_slice(&(n + 5).to_le_bytes());
    assert!(c.s.handle(&buf, &mut out).is_err());
    assert!(out.is_empty());
    // A message larger than the agreed msize is refused.
    let big = vec![0u8; 9000];
    let mut buf = Vec::new();
    Request {
        tag: 5,
        msg: Tmsg::Write {
            fid: 1,
            offset: 0,
            data: &big,
        },
    }
    .encode(&mut buf);
    let mut out = Vec::new();
    c.s.handle(&buf, &mut out).unwrap();
    assert_eq!(
        Rmsg::decode(&out).unwrap(),
        (
            5,
            Rmsg::Lerror {
                ecode: libc::EMSGSIZE as u32
            }
        )
    );
    // Tversion resets the session's fids.
    c.ok(Tmsg::Version {
        msize: 8192,
        version: VERSION,
    });
    assert_eq!(c.s.fids(), 0);
    let out = c.rpc(Tmsg::Version {
        msize: 8192,
        version: b"9P2000",
    });
    assert_eq!(
        Rmsg::decode(&out).unwrap().1,
        Rmsg::Version {
            msize: 8192,
            version: b"unknown"
        }
    );
}

/// Requests of every kind, mutated at random (a deterministic generator),
/// through one session: every message gets a well-formed reply with its
/// tag, or is refused as a broken header; nothing panics, and nothing
/// appears outside the served directory.
#[test]
fn mutated_requests_never_panic_or_escape() {
    let outer = TempDir::new("fuzz");
    let root = outer.0.join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("f"), b"data").unwrap();
    std::fs::create_dir(root.join("d")).unwrap();
    symlink("..", root.join("up")).unwrap();
    let ex = export(&root);
    let mut c = Client::new(&ex);
    let names: [&[u8]; 5] = [b"f", b"d", b"up", b"..", b"n"];
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for i in 0..5000u32 {
        let fid = (next() % 6) as u32;
        let fid2 = (next() % 6) as u32;
        let name = names[(next() % 5) as usize];
        let msg = match next() % 12 {
            0 => Tmsg::Walk {
                fid,
                newfid: fid2,
                names: vec![name, names[(next() % 5) as usize]],
            },
            1 => Tmsg::Lopen {
                fid,
                flags: (next() % 3) as u32,
            },
            2 => Tmsg::Lcreate {
                fid,
                name,
                flags: 2,
                mode: 0o644,
                gid: 0,
            },
            3 => Tmsg::Read {
                fid,
                offset: next() % 16,
                count: (next() % 100_000) as u32,
            },
            4 => Tmsg::Write {
                fid,
                offset: next() % 16,
                data: b"xyz",
            },
            5 => Tmsg::Mkdir {
                dfid: fid,
                name,
                mode: 0o755,
                gid: 0,
            },
            6 => Tmsg::Renameat {
                olddirfid: fid,
                oldname: name,
                newdirfid: fid2,
                newname: names[(next() % 5) as usize],
            },
            7 => Tmsg::Unlinkat {
                dfid: fid,
                name,
                flags: (next() % 2) as u32 * libc::AT_REMOVEDIR as u32,
            },
            8 => Tmsg::Readdir {
                fid,
                offset: next() % 8,
                count: (next() % 4096) as u32,
            },
            9 => Tmsg::Symlink {
                fid,
                name,
                target: b"../../..",
                gid: 0,
            },
            10 => Tmsg::Clunk { fid },
            _ => Tmsg::Getattr { fid, mask: !0 },
        };
        let mut buf = Vec::new();
        Request { tag: i as u16, msg }.encode(&mut buf);
        // Mutate one message in two: a byte, and sometimes the length.
        if next() % 2 == 0 {
            let at = (next() as usize) % buf.len();
            buf[at] = next() as u8;
            if next() % 3 == 0 {
                buf.truncate((next() as usize) % buf.len());
            }
        }
        let mut out = Vec::new();
        let mut send = vec![0; c.s.msize() as usize];
        // One message in two through each of the server's two entry points.
        let written = if i % 2 == 0 {
            c.s.handle(&buf, &mut out).map(|()| out.len())
        } else {
            c.s.handle_into(&buf, &mut send).inspect(|&n| {
                out.extend_from_slice(&send[..n]);
            })
        };
        match written {
            Ok(n) => {
                assert_eq!(n, out.len());
                let (tag, _) = Rmsg::decode(&out).expect("a well-formed reply");
                assert_eq!(
                    usize::from(tag),
                    usize::from(u16::from_le_bytes([buf[5], buf[6]]))
                );
                assert!(out.len() <= c.s.msize() as usize);
            }
            Err(_) => assert!(out.is_empty()),
        }
        // Keep an attached fid 0 around.
        if c.s.fids() == 0 {
            c.ok(Tmsg::Attach {
                fid: 0,
                afid: NOFID,
                uname: b"root",
                aname: b"",
                n_uname: 0,
            });
        }
    }
    let mut outside: Vec<_> = std::fs::read_dir(&outer.0)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    outside.sort();
    assert_eq!(outside, vec![std::ffi::OsString::from("root")]);
}

/// Opens `name` (beneath the root) on `fid` with `flags`.
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

fn open_file(c: &mut Client<'_>, fid: u32, name: &[u8], flags: i32) {
    assert_eq!(lerror(&c.walk(0, fid, &[name])), None);
    c.ok(Tmsg::Lopen {
        fid,
        flags: flags as u32,
    });
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

/// Watches a directory for opens of its entries (`IN_OPEN`; descriptors
/// opened with `O_PATH` make none).
struct OpenWatch(std::os::fd::OwnedFd);

impl OpenWatch {
    fn new(dir: &Path) -> OpenWatch {
        use std::os::fd::FromRawFd;
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: no arguments but flags.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(
            fd >= 0,
            "inotify_init1: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: just returned by the kernel, owned by nothing else.
        let w = OpenWatch(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
        // SAFETY: a live inotify descriptor and a NUL-terminated path.
        let wd = unsafe {
            libc::inotify_add_watch(
                std::os::fd::AsRawFd::as_raw_fd(&w.0),
                path.as_ptr(),
                libc::IN_OPEN,
            )
        };
        assert!(
            wd >= 0,
            "inotify_add_watch: {}",
            std::io::Error::last_os_error()
        );
        w
    }

    /// The names opened since the last call.
    fn opened(&self) -> Vec<String> {
        let mut buf = [0u8; 4096];
        let mut names = Vec::new();
        loop {
            // SAFETY: `buf` has `buf.len()` writable bytes.
            let n = unsafe {
                libc::read(
                    std::os::fd::AsRawFd::as_raw_fd(&self.0),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            if n <= 0 {
                return names;
            }
            let mut at = 0;
            let head = std::mem::size_of::<libc::inotify_event>();
            while at + head <= n as usize {
                // Each event: wd, mask, cookie (u32 each), len (u32), name[len].
                let len = u32::from_ne_bytes(buf[at + 12..at + 16].try_into().unwrap()) as usize;
                let name = &buf[at + head..at + head + len];
                let end = name.iter().position(|&b| b == 0).unwrap_or(len);
                names.push(String::from_utf8_lossy(&name[..end]).into_owned());
                at += head + len;
            }
        }
    }
}

/// A device node in the export (made by a client with Tmknod, as root) is
/// never opened by the server, not even to find out what it is (opening a
/// device can act on it): its data would not be beneath the root.
#[test]
fn device_nodes_are_not_opened() {
    let t = TempDir::new("dev");
    let ex = export(&t.0);
    let watch = OpenWatch::new(&t.0);
    let mut c = Client::new(&ex);
    let out = c.rpc(Tmsg::Mknod {
        dfid: 0,
        name: b"null",
        mode: libc::S_IFCHR | 0o666,
        major: 1,
        minor: 3,
        gid: 0,
    });
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // Without root, mknod of a device is refused, which is checked instead.
        assert_eq!(lerror(&out), Some(libc::EPERM as u32));
        return;
    }
    assert_eq!(lerror(&out), None);
    assert_eq!(lerror(&c.walk(0, 1, &[b"null"])), None);
    for flags in [libc::O_RDONLY, libc::O_WRONLY] {
        assert_eq!(
            c.err(Tmsg::Lopen {
                fid: 1,
                flags: flags as u32
            }),
            libc::EPERM as u32
        );
    }
    assert_eq!(
        c.err(Tmsg::Lcreate {
            fid: 0,
            name: b"null",
            flags: libc::O_RDWR as u32,
            mode: 0o644,
            gid: 0,
        }),
        libc::EPERM as u32
    );
    assert_eq!(c.s.fids(), 2);
    assert!(
        !watch.opened().iter().any(|n| n == "null"),
        "the server opened the device node"
    );
    // The watch sees a plain file's open (the assertion above could fail).
    std::fs::write(t.0.join("plain"), b"x").unwrap();
    assert!(watch.opened().iter().any(|n| n == "plain"));
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
