//! Creating, writing, reading, listing, linking, renaming and removing
//! files, and their attributes.

use super::*;

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
