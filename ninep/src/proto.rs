//! 9P2000.L messages: decoding and encoding, with every length checked.
//!
//! A message is `size[4] type[1] tag[2] body`, little-endian, where `size`
//! counts the whole message. Strings are `len[2]` followed by that many
//! bytes (not necessarily UTF-8: file names are bytes). Decoding never
//! panics: a field that runs past the end, a `size` that disagrees with
//! the buffer, trailing bytes or too many walk names are a [`DecodeError`].

use std::fmt;

/// The bytes before a message's body: `size[4] type[1] tag[2]`.
pub const HEADER: usize = 7;
/// The tag of `Tversion` (no tag).
pub const NOTAG: u16 = 0xffff;
/// "No fid" (`Tattach`'s `afid` when there is no authentication).
pub const NOFID: u32 = 0xffff_ffff;
/// At most this many names in one `Twalk` (and qids in `Rwalk`).
pub const MAXWELEM: usize = 16;
/// The header of `Rread`/`Rreaddir` before the data: `size type tag count[4]`.
pub const IOHDRSZ: usize = HEADER + 4;
/// The header of `Twrite` before the data: `size type tag fid offset count`.
pub const TWRITE_HDR: usize = HEADER + 4 + 8 + 4;
/// The protocol version this crate speaks.
pub const VERSION: &[u8] = b"9P2000.L";

/// Message type numbers (9P2000 and its `.L` extension).
#[allow(missing_docs)]
pub mod ty {
    pub const TLERROR: u8 = 6;
    pub const RLERROR: u8 = 7;
    pub const TSTATFS: u8 = 8;
    pub const TLOPEN: u8 = 12;
    pub const TLCREATE: u8 = 14;
    pub const TSYMLINK: u8 = 16;
    pub const TMKNOD: u8 = 18;
    pub const TRENAME: u8 = 20;
    pub const TREADLINK: u8 = 22;
    pub const TGETATTR: u8 = 24;
    pub const TSETATTR: u8 = 26;
    pub const TXATTRWALK: u8 = 30;
    pub const TXATTRCREATE: u8 = 32;
    pub const TREADDIR: u8 = 40;
    pub const TFSYNC: u8 = 50;
    pub const TLOCK: u8 = 52;
    pub const TGETLOCK: u8 = 54;
    pub const TLINK: u8 = 70;
    pub const TMKDIR: u8 = 72;
    pub const TRENAMEAT: u8 = 74;
    pub const TUNLINKAT: u8 = 76;
    pub const TVERSION: u8 = 100;
    pub const TAUTH: u8 = 102;
    pub const TATTACH: u8 = 104;
    pub const TFLUSH: u8 = 108;
    pub const TWALK: u8 = 110;
    pub const TREAD: u8 = 116;
    pub const TWRITE: u8 = 118;
    pub const TCLUNK: u8 = 120;
    pub const TREMOVE: u8 = 122;
}

/// Why a buffer is not a valid message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Shorter than a header.
    Short,
    /// The `size` field disagrees with the bytes received.
    Size {
        /// What the header says.
        declared: u32,
        /// What arrived.
        actual: usize,
    },
    /// A field runs past the end of the message.
    Truncated,
    /// Bytes left after the last field.
    Trailing(usize),
    /// More than [`MAXWELEM`] names or qids.
    TooManyNames(u16),
    /// A type this side does not decode.
    UnknownType(u8),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Short => write!(f, "shorter than a 9P header"),
            DecodeError::Size { declared, actual } => {
                write!(f, "size field says {declared} bytes, {actual} arrived")
            }
            DecodeError::Truncated => write!(f, "a field runs past the end of the message"),
            DecodeError::Trailing(n) => write!(f, "{n} bytes after the last field"),
            DecodeError::TooManyNames(n) => write!(f, "{n} walk elements (at most {MAXWELEM})"),
            DecodeError::UnknownType(t) => write!(f, "unknown message type {t}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// A file's identity on the server: `type[1] version[4] path[8]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Qid {
    /// `QTDIR` (0x80), `QTSYMLINK` (0x02), or 0 for a file.
    pub ty: u8,
    /// Changes when the file does (0 here).
    pub version: u32,
    /// Unique per file (the inode number).
    pub path: u64,
}

/// `Qid::ty` of a directory.
pub const QTDIR: u8 = 0x80;
/// `Qid::ty` of a symbolic link.
pub const QTSYMLINK: u8 = 0x02;

/// Little-endian reads that fail instead of running past the end.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Reads from `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }
    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.buf.len() {
            return Err(DecodeError::Truncated);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }
    /// One byte.
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    /// A `u16`.
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    /// A `u32`.
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    /// A `u64`.
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// A string: `len[2]` and its bytes.
    pub fn str(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u16()?;
        self.bytes(usize::from(n))
    }
    /// A qid.
    pub fn qid(&mut self) -> Result<Qid, DecodeError> {
        Ok(Qid {
            ty: self.u8()?,
            version: self.u32()?,
            path: self.u64()?,
        })
    }
    /// What is left.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }
    /// Fails unless everything was read.
    pub fn finish(&self) -> Result<(), DecodeError> {
        match self.buf.len() {
            0 => Ok(()),
            n => Err(DecodeError::Trailing(n)),
        }
    }
}

/// Little-endian writes into a `Vec`; [`Writer::finish`] fills in `size`.
#[derive(Debug)]
pub struct Writer<'a> {
    out: &'a mut Vec<u8>,
    start: usize,
}

impl<'a> Writer<'a> {
    /// Starts a message of type `ty` with `tag` at the end of `out`.
    pub fn new(out: &'a mut Vec<u8>, ty: u8, tag: u16) -> Self {
        let start = out.len();
        out.extend_from_slice(&[0, 0, 0, 0, ty]);
        out.extend_from_slice(&tag.to_le_bytes());
        Writer { out, start }
    }
    /// One byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.out.push(v);
        self
    }
    /// A `u16`.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Raw bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.out.extend_from_slice(v);
        self
    }
    /// A string, cut at 65535 bytes (names are at most 255 on Linux).
    pub fn str(&mut self, v: &[u8]) -> &mut Self {
        let v = &v[..v.len().min(usize::from(u16::MAX))];
        self.u16(v.len() as u16).bytes(v)
    }
    /// A qid.
    pub fn qid(&mut self, q: &Qid) -> &mut Self {
        self.u8(q.ty).u32(q.version).u64(q.path)
    }
    /// Writes the size field; returns the message's length.
    pub fn finish(&mut self) -> usize {
        let len = self.out.len() - self.start;
        let size = u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes();
        self.out[self.start..self.start + 4].copy_from_slice(&size);
        len
    }
}

/// Splits a message into `(type, tag, body)` after checking its size field
/// against `buf`.
pub fn split(buf: &[u8]) -> Result<(u8, u16, &[u8]), DecodeError> {
    if buf.len() < HEADER {
        return Err(DecodeError::Short);
    }
    let mut r = Reader::new(buf);
    let size = r.u32()?;
    if usize::try_from(size).ok() != Some(buf.len()) {
        return Err(DecodeError::Size {
            declared: size,
            actual: buf.len(),
        });
    }
    let t = r.u8()?;
    let tag = r.u16()?;
    Ok((t, tag, &buf[HEADER..]))
}

/// `Tsetattr`'s fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetAttr {
    /// Which fields apply (`SETATTR_*`).
    pub valid: u32,
    /// New mode.
    pub mode: u32,
    /// New owner.
    pub uid: u32,
    /// New group.
    pub gid: u32,
    /// New size.
    pub size: u64,
    /// New access time.
    pub atime_sec: u64,
    /// Its nanoseconds.
    pub atime_nsec: u64,
    /// New modification time.
    pub mtime_sec: u64,
    /// Its nanoseconds.
    pub mtime_nsec: u64,
}

/// `Tsetattr` valid bits.
#[allow(missing_docs)]
pub mod setattr {
    pub const MODE: u32 = 0x1;
    pub const UID: u32 = 0x2;
    pub const GID: u32 = 0x4;
    pub const SIZE: u32 = 0x8;
    pub const ATIME: u32 = 0x10;
    pub const MTIME: u32 = 0x20;
    pub const CTIME: u32 = 0x40;
    pub const ATIME_SET: u32 = 0x80;
    pub const MTIME_SET: u32 = 0x100;
}

/// `Tlock`/`Tgetlock` values: lock types and `Rlock` statuses.
#[allow(missing_docs)]
pub mod lock {
    pub const RDLCK: u8 = 0;
    pub const WRLCK: u8 = 1;
    pub const UNLCK: u8 = 2;
    /// `Tlock` flags: the client waits (it asks again after `BLOCKED`).
    pub const FLAGS_BLOCK: u32 = 1;
    pub const FLAGS_RECLAIM: u32 = 2;
    pub const SUCCESS: u8 = 0;
    pub const BLOCKED: u8 = 1;
    pub const ERROR: u8 = 2;
    pub const GRACE: u8 = 3;
}

/// `Tlock`/`Tgetlock`'s lock description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flock<'a> {
    /// `F_RDLCK` 0, `F_WRLCK` 1, `F_UNLCK` 2.
    pub ty: u8,
    /// `Tlock` only: 1 blocking, 2 reclaim.
    pub flags: u32,
    /// First byte.
    pub start: u64,
    /// Length (0: to the end).
    pub length: u64,
    /// The client's process.
    pub proc_id: u32,
    /// The client's name.
    pub client_id: &'a [u8],
}

/// A request (T-message) body.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Tmsg<'a> {
    Version {
        msize: u32,
        version: &'a [u8],
    },
    Auth {
        afid: u32,
        uname: &'a [u8],
        aname: &'a [u8],
        n_uname: u32,
    },
    Attach {
        fid: u32,
        afid: u32,
        uname: &'a [u8],
        aname: &'a [u8],
        n_uname: u32,
    },
    Flush {
        oldtag: u16,
    },
    Walk {
        fid: u32,
        newfid: u32,
        names: Vec<&'a [u8]>,
    },
    Read {
        fid: u32,
        offset: u64,
        count: u32,
    },
    Write {
        fid: u32,
        offset: u64,
        data: &'a [u8],
    },
    Clunk {
        fid: u32,
    },
    Remove {
        fid: u32,
    },
    Statfs {
        fid: u32,
    },
    Lopen {
        fid: u32,
        flags: u32,
    },
    Lcreate {
        fid: u32,
        name: &'a [u8],
        flags: u32,
        mode: u32,
        gid: u32,
    },
    Symlink {
        fid: u32,
        name: &'a [u8],
        target: &'a [u8],
        gid: u32,
    },
    Mknod {
        dfid: u32,
        name: &'a [u8],
        mode: u32,
        major: u32,
        minor: u32,
        gid: u32,
    },
    Rename {
        fid: u32,
        dfid: u32,
        name: &'a [u8],
    },
    Readlink {
        fid: u32,
    },
    Getattr {
        fid: u32,
        mask: u64,
    },
    Setattr {
        fid: u32,
        attr: SetAttr,
    },
    Xattrwalk {
        fid: u32,
        newfid: u32,
        name: &'a [u8],
    },
    Xattrcreate {
        fid: u32,
        name: &'a [u8],
        size: u64,
        flags: u32,
    },
    Readdir {
        fid: u32,
        offset: u64,
        count: u32,
    },
    Fsync {
        fid: u32,
        datasync: u32,
    },
    Lock {
        fid: u32,
        lock: Flock<'a>,
    },
    Getlock {
        fid: u32,
        lock: Flock<'a>,
    },
    Link {
        dfid: u32,
        fid: u32,
        name: &'a [u8],
    },
    Mkdir {
        dfid: u32,
        name: &'a [u8],
        mode: u32,
        gid: u32,
    },
    Renameat {
        olddirfid: u32,
        oldname: &'a [u8],
        newdirfid: u32,
        newname: &'a [u8],
    },
    Unlinkat {
        dfid: u32,
        name: &'a [u8],
        flags: u32,
    },
}

/// A decoded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    /// Its tag, echoed by the reply.
    pub tag: u16,
    /// What it asks.
    pub msg: Tmsg<'a>,
}

/// Why a request could not be decoded, with its tag when the header was
/// sound (then the server answers `Rlerror`; otherwise it closes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRequest {
    /// The tag, when the header was sound.
    pub tag: Option<u16>,
    /// What was wrong.
    pub error: DecodeError,
}

impl<'a> Request<'a> {
    /// Decodes one whole message.
    ///
    /// # Errors
    /// [`BadRequest`] for anything that is not a well-formed request.
    pub fn decode(buf: &'a [u8]) -> Result<Request<'a>, BadRequest> {
        let (t, tag, body) = split(buf).map_err(|error| BadRequest { tag: None, error })?;
        let msg = decode_t(t, body).map_err(|error| BadRequest {
            tag: Some(tag),
            error,
        })?;
        Ok(Request { tag, msg })
    }

    /// Encodes the request at the end of `out`; returns its length.
    pub fn encode(&self, out: &mut Vec<u8>) -> usize {
        encode_t(self.tag, &self.msg, out)
    }
}

fn flock<'a>(r: &mut Reader<'a>, with_flags: bool) -> Result<Flock<'a>, DecodeError> {
    Ok(Flock {
        ty: r.u8()?,
        flags: if with_flags { r.u32()? } else { 0 },
        start: r.u64()?,
        length: r.u64()?,
        proc_id: r.u32()?,
        client_id: r.str()?,
    })
}

fn decode_t(t: u8, body: &[u8]) -> Result<Tmsg<'_>, DecodeError> {
    let r = &mut Reader::new(body);
    let m = match t {
        ty::TVERSION => Tmsg::Version {
            msize: r.u32()?,
            version: r.str()?,
        },
        ty::TAUTH => Tmsg::Auth {
            afid: r.u32()?,
            uname: r.str()?,
            aname: r.str()?,
            n_uname: r.u32()?,
        },
        ty::TATTACH => Tmsg::Attach {
            fid: r.u32()?,
            afid: r.u32()?,
            uname: r.str()?,
            aname: r.str()?,
            n_uname: r.u32()?,
        },
        ty::TFLUSH => Tmsg::Flush { oldtag: r.u16()? },
        ty::TWALK => {
            let fid = r.u32()?;
            let newfid = r.u32()?;
            let n = r.u16()?;
            if usize::from(n) > MAXWELEM {
                return Err(DecodeError::TooManyNames(n));
            }
            let mut names = Vec::with_capacity(usize::from(n));
            for _ in 0..n {
                names.push(r.str()?);
            }
            Tmsg::Walk { fid, newfid, names }
        }
        ty::TREAD => Tmsg::Read {
            fid: r.u32()?,
            offset: r.u64()?,
            count: r.u32()?,
        },
        ty::TWRITE => {
            let fid = r.u32()?;
            let offset = r.u64()?;
            let count = r.u32()?;
            let data = r.bytes(usize::try_from(count).map_err(|_| DecodeError::Truncated)?)?;
            Tmsg::Write { fid, offset, data }
        }
        ty::TCLUNK => Tmsg::Clunk { fid: r.u32()? },
        ty::TREMOVE => Tmsg::Remove { fid: r.u32()? },
        ty::TSTATFS => Tmsg::Statfs { fid: r.u32()? },
        ty::TLOPEN => Tmsg::Lopen {
            fid: r.u32()?,
            flags: r.u32()?,
        },
        ty::TLCREATE => Tmsg::Lcreate {
            fid: r.u32()?,
            name: r.str()?,
            flags: r.u32()?,
            mode: r.u32()?,
            gid: r.u32()?,
        },
        ty::TSYMLINK => Tmsg::Symlink {
            fid: r.u32()?,
            name: r.str()?,
            target: r.str()?,
            gid: r.u32()?,
        },
        ty::TMKNOD => Tmsg::Mknod {
            dfid: r.u32()?,
            name: r.str()?,
            mode: r.u32()?,
            major: r.u32()?,
            minor: r.u32()?,
            gid: r.u32()?,
        },
        ty::TRENAME => Tmsg::Rename {
            fid: r.u32()?,
            dfid: r.u32()?,
            name: r.str()?,
        },
        ty::TREADLINK => Tmsg::Readlink { fid: r.u32()? },
        ty::TGETATTR => Tmsg::Getattr {
            fid: r.u32()?,
            mask: r.u64()?,
        },
        ty::TSETATTR => Tmsg::Setattr {
            fid: r.u32()?,
            attr: SetAttr {
                valid: r.u32()?,
                mode: r.u32()?,
                uid: r.u32()?,
                gid: r.u32()?,
                size: r.u64()?,
                atime_sec: r.u64()?,
                atime_nsec: r.u64()?,
                mtime_sec: r.u64()?,
                mtime_nsec: r.u64()?,
            },
        },
        ty::TXATTRWALK => Tmsg::Xattrwalk {
            fid: r.u32()?,
            newfid: r.u32()?,
            name: r.str()?,
        },
        ty::TXATTRCREATE => Tmsg::Xattrcreate {
            fid: r.u32()?,
            name: r.str()?,
            size: r.u64()?,
            flags: r.u32()?,
        },
        ty::TREADDIR => Tmsg::Readdir {
            fid: r.u32()?,
            offset: r.u64()?,
            count: r.u32()?,
        },
        ty::TFSYNC => {
            let fid = r.u32()?;
            // Older clients send the fid alone.
            let datasync = if r.remaining() == 0 { 0 } else { r.u32()? };
            Tmsg::Fsync { fid, datasync }
        }
        ty::TLOCK => Tmsg::Lock {
            fid: r.u32()?,
            lock: flock(r, true)?,
        },
        ty::TGETLOCK => Tmsg::Getlock {
            fid: r.u32()?,
            lock: flock(r, false)?,
        },
        ty::TLINK => Tmsg::Link {
            dfid: r.u32()?,
            fid: r.u32()?,
            name: r.str()?,
        },
        ty::TMKDIR => Tmsg::Mkdir {
            dfid: r.u32()?,
            name: r.str()?,
            mode: r.u32()?,
            gid: r.u32()?,
        },
        ty::TRENAMEAT => Tmsg::Renameat {
            olddirfid: r.u32()?,
            oldname: r.str()?,
            newdirfid: r.u32()?,
            newname: r.str()?,
        },
        ty::TUNLINKAT => Tmsg::Unlinkat {
            dfid: r.u32()?,
            name: r.str()?,
            flags: r.u32()?,
        },
        other => return Err(DecodeError::UnknownType(other)),
    };
    r.finish()?;
    Ok(m)
}

fn put_flock(w: &mut Writer<'_>, l: &Flock<'_>, with_flags: bool) {
    w.u8(l.ty);
    if with_flags {
        w.u32(l.flags);
    }
    w.u64(l.start).u64(l.length).u32(l.proc_id).str(l.client_id);
}

fn encode_t(tag: u16, m: &Tmsg<'_>, out: &mut Vec<u8>) -> usize {
    let t = match m {
        Tmsg::Version { .. } => ty::TVERSION,
        Tmsg::Auth { .. } => ty::TAUTH,
        Tmsg::Attach { .. } => ty::TATTACH,
        Tmsg::Flush { .. } => ty::TFLUSH,
        Tmsg::Walk { .. } => ty::TWALK,
        Tmsg::Read { .. } => ty::TREAD,
        Tmsg::Write { .. } => ty::TWRITE,
        Tmsg::Clunk { .. } => ty::TCLUNK,
        Tmsg::Remove { .. } => ty::TREMOVE,
        Tmsg::Statfs { .. } => ty::TSTATFS,
        Tmsg::Lopen { .. } => ty::TLOPEN,
        Tmsg::Lcreate { .. } => ty::TLCREATE,
        Tmsg::Symlink { .. } => ty::TSYMLINK,
        Tmsg::Mknod { .. } => ty::TMKNOD,
        Tmsg::Rename { .. } => ty::TRENAME,
        Tmsg::Readlink { .. } => ty::TREADLINK,
        Tmsg::Getattr { .. } => ty::TGETATTR,
        Tmsg::Setattr { .. } => ty::TSETATTR,
        Tmsg::Xattrwalk { .. } => ty::TXATTRWALK,
        Tmsg::Xattrcreate { .. } => ty::TXATTRCREATE,
        Tmsg::Readdir { .. } => ty::TREADDIR,
        Tmsg::Fsync { .. } => ty::TFSYNC,
        Tmsg::Lock { .. } => ty::TLOCK,
        Tmsg::Getlock { .. } => ty::TGETLOCK,
        Tmsg::Link { .. } => ty::TLINK,
        Tmsg::Mkdir { .. } => ty::TMKDIR,
        Tmsg::Renameat { .. } => ty::TRENAMEAT,
        Tmsg::Unlinkat { .. } => ty::TUNLINKAT,
    };
    let mut w = Writer::new(out, t, tag);
    match m {
        Tmsg::Version { msize, version } => {
            w.u32(*msize).str(version);
        }
        Tmsg::Auth {
            afid,
            uname,
            aname,
            n_uname,
        } => {
            w.u32(*afid).str(uname).str(aname).u32(*n_uname);
        }
        Tmsg::Attach {
            fid,
            afid,
            uname,
            aname,
            n_uname,
        } => {
            w.u32(*fid).u32(*afid).str(uname).str(aname).u32(*n_uname);
        }
        Tmsg::Flush { oldtag } => {
            w.u16(*oldtag);
        }
        Tmsg::Walk { fid, newfid, names } => {
            w.u32(*fid).u32(*newfid).u16(names.len() as u16);
            for n in names {
                w.str(n);
            }
        }
        Tmsg::Read { fid, offset, count } | Tmsg::Readdir { fid, offset, count } => {
            w.u32(*fid).u64(*offset).u32(*count);
        }
        Tmsg::Write { fid, offset, data } => {
            w.u32(*fid).u64(*offset).u32(data.len() as u32).bytes(data);
        }
        Tmsg::Clunk { fid }
        | Tmsg::Remove { fid }
        | Tmsg::Statfs { fid }
        | Tmsg::Readlink { fid } => {
            w.u32(*fid);
        }
        Tmsg::Lopen { fid, flags } => {
            w.u32(*fid).u32(*flags);
        }
        Tmsg::Lcreate {
            fid,
            name,
            flags,
            mode,
            gid,
        } => {
            w.u32(*fid).str(name).u32(*flags).u32(*mode).u32(*gid);
        }
        Tmsg::Symlink {
            fid,
            name,
            target,
            gid,
        } => {
            w.u32(*fid).str(name).str(target).u32(*gid);
        }
        Tmsg::Mknod {
            dfid,
            name,
            mode,
            major,
            minor,
            gid,
        } => {
            w.u32(*dfid)
                .str(name)
                .u32(*mode)
                .u32(*major)
                .u32(*minor)
                .u32(*gid);
        }
        Tmsg::Rename { fid, dfid, name } => {
            w.u32(*fid).u32(*dfid).str(name);
        }
        Tmsg::Getattr { fid, mask } => {
            w.u32(*fid).u64(*mask);
        }
        Tmsg::Setattr { fid, attr: a } => {
            w.u32(*fid)
                .u32(a.valid)
                .u32(a.mode)
                .u32(a.uid)
                .u32(a.gid)
                .u64(a.size)
                .u64(a.atime_sec)
                .u64(a.atime_nsec)
                .u64(a.mtime_sec)
                .u64(a.mtime_nsec);
        }
        Tmsg::Xattrwalk { fid, newfid, name } => {
            w.u32(*fid).u32(*newfid).str(name);
        }
        Tmsg::Xattrcreate {
            fid,
            name,
            size,
            flags,
        } => {
            w.u32(*fid).str(name).u64(*size).u32(*flags);
        }
        Tmsg::Fsync { fid, datasync } => {
            w.u32(*fid).u32(*datasync);
        }
        Tmsg::Lock { fid, lock } => {
            w.u32(*fid);
            put_flock(&mut w, lock, true);
        }
        Tmsg::Getlock { fid, lock } => {
            w.u32(*fid);
            put_flock(&mut w, lock, false);
        }
        Tmsg::Link { dfid, fid, name } => {
            w.u32(*dfid).u32(*fid).str(name);
        }
        Tmsg::Mkdir {
            dfid,
            name,
            mode,
            gid,
        } => {
            w.u32(*dfid).str(name).u32(*mode).u32(*gid);
        }
        Tmsg::Renameat {
            olddirfid,
            oldname,
            newdirfid,
            newname,
        } => {
            w.u32(*olddirfid).str(oldname).u32(*newdirfid).str(newname);
        }
        Tmsg::Unlinkat { dfid, name, flags } => {
            w.u32(*dfid).str(name).u32(*flags);
        }
    }
    w.finish()
}

/// `Rstatfs`'s fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct StatFs {
    pub ty: u32,
    pub bsize: u32,
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub fsid: u64,
    pub namelen: u32,
}

/// `Rgetattr`'s fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct Attr {
    pub valid: u64,
    pub qid: Qid,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u64,
    pub rdev: u64,
    pub size: u64,
    pub blksize: u64,
    pub blocks: u64,
    pub atime_sec: u64,
    pub atime_nsec: u64,
    pub mtime_sec: u64,
    pub mtime_nsec: u64,
    pub ctime_sec: u64,
    pub ctime_nsec: u64,
    pub btime_sec: u64,
    pub btime_nsec: u64,
    pub gen: u64,
    pub data_version: u64,
}

/// `Rgetattr`'s `valid` for the basic fields (mode to blocks).
pub const GETATTR_BASIC: u64 = 0x7ff;

/// A reply (R-message) body. `Read` and `Readdir` carry their data, which
/// `Readdir` holds already encoded (see [`DirEntry::encode`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Rmsg<'a> {
    Lerror { ecode: u32 },
    Version { msize: u32, version: &'a [u8] },
    Attach { qid: Qid },
    Flush,
    Walk { qids: Vec<Qid> },
    Read { data: &'a [u8] },
    Write { count: u32 },
    Clunk,
    Remove,
    Statfs(StatFs),
    Lopen { qid: Qid, iounit: u32 },
    Lcreate { qid: Qid, iounit: u32 },
    Symlink { qid: Qid },
    Mknod { qid: Qid },
    Rename,
    Readlink { target: &'a [u8] },
    Getattr(Box<Attr>),
    Setattr,
    Readdir { data: &'a [u8] },
    Fsync,
    Lock { status: u8 },
    Getlock { lock: Flock<'a> },
    Link,
    Mkdir { qid: Qid },
    Renameat,
    Unlinkat,
}

impl Rmsg<'_> {
    /// The message type.
    pub fn ty(&self) -> u8 {
        match self {
            Rmsg::Lerror { .. } => ty::RLERROR,
            Rmsg::Version { .. } => ty::TVERSION + 1,
            Rmsg::Attach { .. } => ty::TATTACH + 1,
            Rmsg::Flush => ty::TFLUSH + 1,
            Rmsg::Walk { .. } => ty::TWALK + 1,
            Rmsg::Read { .. } => ty::TREAD + 1,
            Rmsg::Write { .. } => ty::TWRITE + 1,
            Rmsg::Clunk => ty::TCLUNK + 1,
            Rmsg::Remove => ty::TREMOVE + 1,
            Rmsg::Statfs(_) => ty::TSTATFS + 1,
            Rmsg::Lopen { .. } => ty::TLOPEN + 1,
            Rmsg::Lcreate { .. } => ty::TLCREATE + 1,
            Rmsg::Symlink { .. } => ty::TSYMLINK + 1,
            Rmsg::Mknod { .. } => ty::TMKNOD + 1,
            Rmsg::Rename => ty::TRENAME + 1,
            Rmsg::Readlink { .. } => ty::TREADLINK + 1,
            Rmsg::Getattr(_) => ty::TGETATTR + 1,
            Rmsg::Setattr => ty::TSETATTR + 1,
            Rmsg::Readdir { .. } => ty::TREADDIR + 1,
            Rmsg::Fsync => ty::TFSYNC + 1,
            Rmsg::Lock { .. } => ty::TLOCK + 1,
            Rmsg::Getlock { .. } => ty::TGETLOCK + 1,
            Rmsg::Link => ty::TLINK + 1,
            Rmsg::Mkdir { .. } => ty::TMKDIR + 1,
            Rmsg::Renameat => ty::TRENAMEAT + 1,
            Rmsg::Unlinkat => ty::TUNLINKAT + 1,
        }
    }

    /// Encodes the reply with `tag` at the end of `out`; returns its length.
    pub fn encode(&self, tag: u16, out: &mut Vec<u8>) -> usize {
        let mut w = Writer::new(out, self.ty(), tag);
        match self {
            Rmsg::Lerror { ecode } => {
                w.u32(*ecode);
            }
            Rmsg::Version { msize, version } => {
                w.u32(*msize).str(version);
            }
            Rmsg::Attach { qid }
            | Rmsg::Symlink { qid }
            | Rmsg::Mknod { qid }
            | Rmsg::Mkdir { qid } => {
                w.qid(qid);
            }
            Rmsg::Walk { qids } => {
                w.u16(qids.len() as u16);
                for q in qids {
                    w.qid(q);
                }
            }
            Rmsg::Read { data } | Rmsg::Readdir { data } => {
                w.u32(data.len() as u32).bytes(data);
            }
            Rmsg::Write { count } => {
                w.u32(*count);
            }
            Rmsg::Statfs(s) => {
                w.u32(s.ty)
                    .u32(s.bsize)
                    .u64(s.blocks)
                    .u64(s.bfree)
                    .u64(s.bavail)
                    .u64(s.files)
                    .u64(s.ffree)
                    .u64(s.fsid)
                    .u32(s.namelen);
            }
            Rmsg::Lopen { qid, iounit } | Rmsg::Lcreate { qid, iounit } => {
                w.qid(qid).u32(*iounit);
            }
            Rmsg::Readlink { target } => {
                w.str(target);
            }
            Rmsg::Getattr(a) => {
                w.u64(a.valid)
                    .qid(&a.qid)
                    .u32(a.mode)
                    .u32(a.uid)
                    .u32(a.gid)
                    .u64(a.nlink)
                    .u64(a.rdev)
                    .u64(a.size)
                    .u64(a.blksize)
                    .u64(a.blocks)
                    .u64(a.atime_sec)
                    .u64(a.atime_nsec)
                    .u64(a.mtime_sec)
                    .u64(a.mtime_nsec)
                    .u64(a.ctime_sec)
                    .u64(a.ctime_nsec)
                    .u64(a.btime_sec)
                    .u64(a.btime_nsec)
                    .u64(a.gen)
                    .u64(a.data_version);
            }
            Rmsg::Lock { status } => {
                w.u8(*status);
            }
            Rmsg::Getlock { lock } => put_flock(&mut w, lock, false),
            Rmsg::Flush
            | Rmsg::Clunk
            | Rmsg::Remove
            | Rmsg::Rename
            | Rmsg::Setattr
            | Rmsg::Fsync
            | Rmsg::Link
            | Rmsg::Renameat
            | Rmsg::Unlinkat => {}
        }
        w.finish()
    }

    /// Decodes a reply; returns its tag too.
    ///
    /// # Errors
    /// [`DecodeError`] for anything that is not a well-formed reply.
    pub fn decode(buf: &[u8]) -> Result<(u16, Rmsg<'_>), DecodeError> {
        let (t, tag, body) = split(buf)?;
        let r = &mut Reader::new(body);
        let m = match t {
            ty::RLERROR => Rmsg::Lerror { ecode: r.u32()? },
            x if x == ty::TVERSION + 1 => Rmsg::Version {
                msize: r.u32()?,
                version: r.str()?,
            },
            x if x == ty::TATTACH + 1 => Rmsg::Attach { qid: r.qid()? },
            x if x == ty::TFLUSH + 1 => Rmsg::Flush,
            x if x == ty::TWALK + 1 => {
                let n = r.u16()?;
                if usize::from(n) > MAXWELEM {
                    return Err(DecodeError::TooManyNames(n));
                }
                let qids = (0..n).map(|_| r.qid()).collect::<Result<_, _>>()?;
                Rmsg::Walk { qids }
            }
            x if x == ty::TREAD + 1 || x == ty::TREADDIR + 1 => {
                let n = r.u32()?;
                let data = r.bytes(usize::try_from(n).map_err(|_| DecodeError::Truncated)?)?;
                if x == ty::TREAD + 1 {
                    Rmsg::Read { data }
                } else {
                    Rmsg::Readdir { data }
                }
            }
            x if x == ty::TWRITE + 1 => Rmsg::Write { count: r.u32()? },
            x if x == ty::TCLUNK + 1 => Rmsg::Clunk,
            x if x == ty::TREMOVE + 1 => Rmsg::Remove,
            x if x == ty::TSTATFS + 1 => Rmsg::Statfs(StatFs {
                ty: r.u32()?,
                bsize: r.u32()?,
                blocks: r.u64()?,
                bfree: r.u64()?,
                bavail: r.u64()?,
                files: r.u64()?,
                ffree: r.u64()?,
                fsid: r.u64()?,
                namelen: r.u32()?,
            }),
            x if x == ty::TLOPEN + 1 => Rmsg::Lopen {
                qid: r.qid()?,
                iounit: r.u32()?,
            },
            x if x == ty::TLCREATE + 1 => Rmsg::Lcreate {
                qid: r.qid()?,
                iounit: r.u32()?,
            },
            x if x == ty::TSYMLINK + 1 => Rmsg::Symlink { qid: r.qid()? },
            x if x == ty::TMKNOD + 1 => Rmsg::Mknod { qid: r.qid()? },
            x if x == ty::TRENAME + 1 => Rmsg::Rename,
            x if x == ty::TREADLINK + 1 => Rmsg::Readlink { target: r.str()? },
            x if x == ty::TGETATTR + 1 => Rmsg::Getattr(Box::new(Attr {
                valid: r.u64()?,
                qid: r.qid()?,
                mode: r.u32()?,
                uid: r.u32()?,
                gid: r.u32()?,
                nlink: r.u64()?,
                rdev: r.u64()?,
                size: r.u64()?,
                blksize: r.u64()?,
                blocks: r.u64()?,
                atime_sec: r.u64()?,
                atime_nsec: r.u64()?,
                mtime_sec: r.u64()?,
                mtime_nsec: r.u64()?,
                ctime_sec: r.u64()?,
                ctime_nsec: r.u64()?,
                btime_sec: r.u64()?,
                btime_nsec: r.u64()?,
                gen: r.u64()?,
                data_version: r.u64()?,
            })),
            x if x == ty::TSETATTR + 1 => Rmsg::Setattr,
            x if x == ty::TFSYNC + 1 => Rmsg::Fsync,
            x if x == ty::TLOCK + 1 => Rmsg::Lock { status: r.u8()? },
            x if x == ty::TGETLOCK + 1 => Rmsg::Getlock {
                lock: flock(r, false)?,
            },
            x if x == ty::TLINK + 1 => Rmsg::Link,
            x if x == ty::TMKDIR + 1 => Rmsg::Mkdir { qid: r.qid()? },
            x if x == ty::TRENAMEAT + 1 => Rmsg::Renameat,
            x if x == ty::TUNLINKAT + 1 => Rmsg::Unlinkat,
            other => return Err(DecodeError::UnknownType(other)),
        };
        r.finish()?;
        Ok((tag, m))
    }
}

/// One entry of `Rreaddir`'s data: `qid[13] offset[8] type[1] name[s]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry<'a> {
    /// The entry's qid.
    pub qid: Qid,
    /// The offset to resume after this entry.
    pub offset: u64,
    /// `d_type` (`DT_DIR` ...).
    pub ty: u8,
    /// Its name.
    pub name: &'a [u8],
}

impl<'a> DirEntry<'a> {
    /// Its encoded length.
    pub fn len(&self) -> usize {
        13 + 8 + 1 + 2 + self.name.len()
    }
    /// Never empty (kept for clippy's `len` rule).
    pub fn is_empty(&self) -> bool {
        false
    }
    /// Appends the entry to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let q = &self.qid;
        out.push(q.ty);
        out.extend_from_slice(&q.version.to_le_bytes());
        out.extend_from_slice(&q.path.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.push(self.ty);
        let name = &self.name[..self.name.len().min(usize::from(u16::MAX))];
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name);
    }
    /// Decodes every entry of `Rreaddir`'s data.
    ///
    /// # Errors
    /// [`DecodeError::Truncated`] when an entry runs past the end.
    pub fn decode_all(data: &'a [u8]) -> Result<Vec<DirEntry<'a>>, DecodeError> {
        let r = &mut Reader::new(data);
        let mut v = Vec::new();
        while r.remaining() > 0 {
            v.push(DirEntry {
                qid: r.qid()?,
                offset: r.u64()?,
                ty: r.u8()?,
                name: r.str()?,
            });
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
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
}
