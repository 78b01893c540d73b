//! Nothing resolves or is opened outside the served directory, a read-only
//! export refuses every change, and bad or mutated messages get a clean
//! answer or close the connection, never a panic.

use super::*;

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
