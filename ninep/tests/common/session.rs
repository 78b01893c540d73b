//! A 9P client driving `Session::handle` directly (no device): what the
//! host tests of the session layer share.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use rdma_9p::fs::{Export, Session};
use rdma_9p::proto::{Request, Rmsg, Tmsg, NOFID, VERSION};

/// A fresh directory under the system's temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(what: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "rdma-9p-{what}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub struct Client<'e> {
    pub s: Session,
    _ex: std::marker::PhantomData<&'e Export>,
    tag: u16,
}

pub const ENOENT: u32 = libc::ENOENT as u32;
pub const EXDEV: u32 = libc::EXDEV as u32;
pub const EINVAL: u32 = libc::EINVAL as u32;
pub const EROFS: u32 = libc::EROFS as u32;

impl<'e> Client<'e> {
    /// A client attached as root (`n_uname` 0).
    pub fn new(ex: &'e Export) -> Client<'e> {
        Client::attach_as(ex, b"root", 0)
    }

    /// A client attached (fid 0) as `uname`/`n_uname`.
    pub fn attach_as(ex: &'e Export, uname: &[u8], n_uname: u32) -> Client<'e> {
        let mut c = Client {
            s: Session::new(ex, 8192),
            _ex: std::marker::PhantomData,
            tag: 0,
        };
        let r = c.rpc(Tmsg::Version {
            msize: 131072,
            version: VERSION,
        });
        assert_eq!(
            r,
            Rmsg::Version {
                msize: 8192,
                version: VERSION
            }
            .to_owned_bytes()
        );
        c.ok(Tmsg::Attach {
            fid: 0,
            afid: NOFID,
            uname,
            aname: b"",
            n_uname,
        });
        c
    }

    /// Sends a request, returns the encoded reply (tag checked).
    pub fn rpc(&mut self, msg: Tmsg<'_>) -> Vec<u8> {
        self.tag = self.tag.wrapping_add(1);
        let mut buf = Vec::new();
        Request { tag: self.tag, msg }.encode(&mut buf);
        // The server's path: the reply written into a send buffer of msize.
        let mut out = vec![0; self.s.msize() as usize];
        let n = self.s.handle_into(&buf, &mut out).expect("a sound header");
        out.truncate(n);
        let (tag, _) = Rmsg::decode(&out).expect("a well-formed reply");
        assert_eq!(tag, self.tag);
        out
    }

    /// Expects a reply that is not an error.
    pub fn ok(&mut self, msg: Tmsg<'_>) -> Vec<u8> {
        let what = format!("{msg:?}");
        let out = self.rpc(msg);
        if let (_, Rmsg::Lerror { ecode }) = Rmsg::decode(&out).unwrap() {
            panic!("{what}: Rlerror {ecode}");
        }
        out
    }

    /// Expects Rlerror and returns its code.
    pub fn err(&mut self, msg: Tmsg<'_>) -> u32 {
        let what = format!("{msg:?}");
        let out = self.rpc(msg);
        match Rmsg::decode(&out).unwrap().1 {
            Rmsg::Lerror { ecode } => ecode,
            other => panic!("{what}: expected an error, got {other:?}"),
        }
    }

    pub fn walk(&mut self, fid: u32, newfid: u32, names: &[&[u8]]) -> Vec<u8> {
        self.rpc(Tmsg::Walk {
            fid,
            newfid,
            names: names.to_vec(),
        })
    }
}

pub trait Owned {
    fn to_owned_bytes(&self) -> Vec<u8>;
}

impl Owned for Rmsg<'_> {
    fn to_owned_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode(1, &mut v);
        v
    }
}

pub fn lerror(out: &[u8]) -> Option<u32> {
    match Rmsg::decode(out).unwrap().1 {
        Rmsg::Lerror { ecode } => Some(ecode),
        _ => None,
    }
}

/// `Tlcreate` of `name` in the directory fid `fid` (which it opens), read-write, `mode`.
pub fn lcreate(fid: u32, name: &[u8], mode: u32) -> Tmsg<'_> {
    Tmsg::Lcreate {
        fid,
        name,
        flags: libc::O_RDWR as u32,
        mode,
        gid: 0,
    }
}

/// `Tmkdir` of `name` in the directory fid `dfid`, mode 0755.
pub fn mkdir(dfid: u32, name: &[u8]) -> Tmsg<'_> {
    Tmsg::Mkdir {
        dfid,
        name,
        mode: 0o755,
        gid: 0,
    }
}

/// `Tsetattr` of `fid`'s mode, or (`valid` with `UID`) its owner.
pub fn setattr(fid: u32, valid: u32, mode: u32, uid: u32) -> Tmsg<'static> {
    Tmsg::Setattr {
        fid,
        attr: rdma_9p::proto::SetAttr {
            valid,
            mode,
            uid,
            ..rdma_9p::proto::SetAttr::default()
        },
    }
}

/// `Tlopen` of `fid` for reading.
pub fn lopen_read(fid: u32) -> Tmsg<'static> {
    Tmsg::Lopen {
        fid,
        flags: libc::O_RDONLY as u32,
    }
}

/// `Tmknod` of the character device 1:3 (`/dev/null`) named `name` in `dfid`.
pub fn mknod_null(dfid: u32, name: &[u8]) -> Tmsg<'_> {
    Tmsg::Mknod {
        dfid,
        name,
        mode: libc::S_IFCHR | 0o666,
        major: 1,
        minor: 3,
        gid: 0,
    }
}
