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

/// How each kind of field goes on the wire: `get` reads it, `put` writes it.
/// A message's fields name their codec in [`messages!`], so a message is
/// described once and its decoder, encoder and type follow from that.
mod field {
    use super::{Attr, DecodeError, Flock, Qid, Reader, SetAttr, StatFs, Writer, MAXWELEM};

    type D<T> = Result<T, DecodeError>;

    pub mod byte {
        use super::*;
        pub fn get(r: &mut Reader<'_>) -> D<u8> {
            r.u8()
        }
        pub fn put(v: &u8, w: &mut Writer<'_>) {
            w.u8(*v);
        }
    }
    pub mod short {
        use super::*;
        pub fn get(r: &mut Reader<'_>) -> D<u16> {
            r.u16()
        }
        pub fn put(v: &u16, w: &mut Writer<'_>) {
            w.u16(*v);
        }
    }
    pub mod int {
        use super::*;
        pub fn get(r: &mut Reader<'_>) -> D<u32> {
            r.u32()
        }
        pub fn put(v: &u32, w: &mut Writer<'_>) {
            w.u32(*v);
        }
    }
    pub mod long {
        use super::*;
        pub fn get(r: &mut Reader<'_>) -> D<u64> {
            r.u64()
        }
        pub fn put(v: &u64, w: &mut Writer<'_>) {
            w.u64(*v);
        }
    }
    /// A `u32` that older clients leave out at the end (`Tfsync`'s
    /// `datasync`): 0 when absent.
    pub mod opt_int {
        use super::*;
        pub fn get(r: &mut Reader<'_>) -> D<u32> {
            if r.remaining() == 0 {
                Ok(0)
            } else {
                r.u32()
            }
        }
        pub fn put(v: &u32, w: &mut Writer<'_>) {
            w.u32(*v);
        }
    }
    /// `len[2]` and that many bytes.
    pub mod string {
        use super::*;
        pub fn get<'a>(r: &mut Reader<'a>) -> D<&'a [u8]> {
            r.str()
        }
        pub fn put(v: &[u8], w: &mut Writer<'_>) {
            w.str(v);
        }
    }
    /// `count[4]` and that many bytes (`Twrite`'s data).
    pub mod data {
        use super::*;
        pub fn get<'a>(r: &mut Reader<'a>) -> D<&'a [u8]> {
            let n = r.u32()?;
            r.bytes(usize::try_from(n).map_err(|_| DecodeError::Truncated)?)
        }
        pub fn put(v: &[u8], w: &mut Writer<'_>) {
            w.u32(u32::try_from(v.len()).unwrap_or(u32::MAX)).bytes(v);
        }
    }
    /// `nwname[2]` and that many strings, at most [`MAXWELEM`].
    pub mod names {
        use super::*;
        pub fn get<'a>(r: &mut Reader<'a>) -> D<Vec<&'a [u8]>> {
            let n = r.u16()?;
            if usize::from(n) > MAXWELEM {
                return Err(DecodeError::TooManyNames(n));
            }
            (0..n).map(|_| r.str()).collect()
        }
        pub fn put(v: &[&[u8]], w: &mut Writer<'_>) {
            w.u16(v.len() as u16);
            for n in v {
                w.str(n);
            }
        }
    }
    pub mod qid {
        use super::*;
        pub fn get(r: &mut Reader<'_>) -> D<Qid> {
            r.qid()
        }
        pub fn put(v: &Qid, w: &mut Writer<'_>) {
            w.qid(v);
        }
    }
    /// `nwqid[2]` and that many qids, at most [`MAXWELEM`].
    pub mod qids {
        use super::*;
        pub fn get(r: &mut Reader<'_>) -> D<Vec<Qid>> {
            let n = r.u16()?;
            if usize::from(n) > MAXWELEM {
                return Err(DecodeError::TooManyNames(n));
            }
            (0..n).map(|_| r.qid()).collect()
        }
        pub fn put(v: &[Qid], w: &mut Writer<'_>) {
            w.u16(v.len() as u16);
            for q in v {
                w.qid(q);
            }
        }
    }
    pub mod statfs {
        use super::*;
        pub fn get(r: &mut Reader<'_>) -> D<StatFs> {
            Ok(StatFs {
                ty: r.u32()?,
                bsize: r.u32()?,
                blocks: r.u64()?,
                bfree: r.u64()?,
                bavail: r.u64()?,
                files: r.u64()?,
                ffree: r.u64()?,
                fsid: r.u64()?,
                namelen: r.u32()?,
            })
        }
        pub fn put(s: &StatFs, w: &mut Writer<'_>) {
            w.u32(s.ty).u32(s.bsize);
            w.u64(s.blocks).u64(s.bfree).u64(s.bavail);
            w.u64(s.files).u64(s.ffree).u64(s.fsid).u32(s.namelen);
        }
    }
    pub mod attr {
        use super::*;
        pub fn get(r: &mut Reader<'_>) -> D<Box<Attr>> {
            Ok(Box::new(Attr {
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
            }))
        }
        pub fn put(a: &Attr, w: &mut Writer<'_>) {
            w.u64(a.valid).qid(&a.qid).u32(a.mode).u32(a.uid).u32(a.gid);
            w.u64(a.nlink)
                .u64(a.rdev)
                .u64(a.size)
                .u64(a.blksize)
                .u64(a.blocks);
            w.u64(a.atime_sec).u64(a.atime_nsec);
            w.u64(a.mtime_sec).u64(a.mtime_nsec);
            w.u64(a.ctime_sec).u64(a.ctime_nsec);
            w.u64(a.btime_sec).u64(a.btime_nsec);
            w.u64(a.gen).u64(a.data_version);
        }
    }
    pub mod setattr {
        use super::*;
        pub fn get(r: &mut Reader<'_>) -> D<SetAttr> {
            Ok(SetAttr {
                valid: r.u32()?,
                mode: r.u32()?,
                uid: r.u32()?,
                gid: r.u32()?,
                size: r.u64()?,
                atime_sec: r.u64()?,
                atime_nsec: r.u64()?,
                mtime_sec: r.u64()?,
                mtime_nsec: r.u64()?,
            })
        }
        pub fn put(a: &SetAttr, w: &mut Writer<'_>) {
            w.u32(a.valid).u32(a.mode).u32(a.uid).u32(a.gid).u64(a.size);
            w.u64(a.atime_sec).u64(a.atime_nsec);
            w.u64(a.mtime_sec).u64(a.mtime_nsec);
        }
    }
    /// `Tlock`'s lock: with `flags`.
    pub mod lock {
        use super::*;
        pub fn get<'a>(r: &mut Reader<'a>) -> D<Flock<'a>> {
            super::super::flock(r, true)
        }
        pub fn put(v: &Flock<'_>, w: &mut Writer<'_>) {
            super::super::put_flock(w, v, true);
        }
    }
    /// `Tgetlock`'s and `Rgetlock`'s lock: without `flags`.
    pub mod getlock {
        use super::*;
        pub fn get<'a>(r: &mut Reader<'a>) -> D<Flock<'a>> {
            super::super::flock(r, false)
        }
        pub fn put(v: &Flock<'_>, w: &mut Writer<'_>) {
            super::super::put_flock(w, v, false);
        }
    }
}

/// Defines a message enum, its decoder, encoder and type numbers from one
/// list: each message's name, its fields in wire order (each with its codec,
/// a module of [`field`]; a reply may have one unnamed field, or none), and
/// its type number.
macro_rules! messages {
    (
        $(#[$doc:meta])*
        enum $enum:ident; decode $decode:ident; encode $encode:ident; ty $tyof:ident;
        $(
            $name:ident
            $( { $( $f:ident : $t:ty = $codec:ident ),* $(,)? } )?
            $( ( $tf:ident : $tt:ty = $tcodec:ident ) )?
            = $ty:expr;
        )*
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        #[allow(missing_docs)]
        pub enum $enum<'a> {
            $( $name $( { $( $f: $t ),* } )? $( ($tt) )?, )*
        }

        fn $tyof(m: &$enum<'_>) -> u8 {
            match m {
                $( $enum::$name { .. } => $ty, )*
            }
        }

        fn $decode(t: u8, body: &[u8]) -> Result<$enum<'_>, DecodeError> {
            let r = &mut Reader::new(body);
            let m = match t {
                $( x if x == $ty => $enum::$name
                    $( { $( $f: field::$codec::get(r)? ),* } )?
                    $( (field::$tcodec::get(r)?) )?, )*
                other => return Err(DecodeError::UnknownType(other)),
            };
            r.finish()?;
            Ok(m)
        }

        fn $encode(tag: u16, m: &$enum<'_>, out: &mut Vec<u8>) -> usize {
            let mut w = Writer::new(out, $tyof(m), tag);
            match m {
                $( $enum::$name $( { $( $f ),* } )? $( ($tf) )? => {
                    $( $( field::$codec::put($f, &mut w); )* )?
                    $( field::$tcodec::put($tf, &mut w); )?
                } )*
            }
            w.finish()
        }
    };
}

messages! {
    /// A request (T-message) body.
    enum Tmsg; decode decode_t; encode encode_t; ty type_t;
    Version { msize: u32 = int, version: &'a [u8] = string } = ty::TVERSION;
    Auth {
        afid: u32 = int, uname: &'a [u8] = string, aname: &'a [u8] = string, n_uname: u32 = int
    } = ty::TAUTH;
    Attach {
        fid: u32 = int, afid: u32 = int, uname: &'a [u8] = string, aname: &'a [u8] = string,
        n_uname: u32 = int,
    } = ty::TATTACH;
    Flush { oldtag: u16 = short } = ty::TFLUSH;
    Walk { fid: u32 = int, newfid: u32 = int, names: Vec<&'a [u8]> = names } = ty::TWALK;
    Read { fid: u32 = int, offset: u64 = long, count: u32 = int } = ty::TREAD;
    Write { fid: u32 = int, offset: u64 = long, data: &'a [u8] = data } = ty::TWRITE;
    Clunk { fid: u32 = int } = ty::TCLUNK;
    Remove { fid: u32 = int } = ty::TREMOVE;
    Statfs { fid: u32 = int } = ty::TSTATFS;
    Lopen { fid: u32 = int, flags: u32 = int } = ty::TLOPEN;
    Lcreate {
        fid: u32 = int, name: &'a [u8] = string, flags: u32 = int, mode: u32 = int, gid: u32 = int
    } = ty::TLCREATE;
    Symlink {
        fid: u32 = int, name: &'a [u8] = string, target: &'a [u8] = string, gid: u32 = int
    } = ty::TSYMLINK;
    Mknod {
        dfid: u32 = int, name: &'a [u8] = string, mode: u32 = int, major: u32 = int,
        minor: u32 = int, gid: u32 = int,
    } = ty::TMKNOD;
    Rename { fid: u32 = int, dfid: u32 = int, name: &'a [u8] = string } = ty::TRENAME;
    Readlink { fid: u32 = int } = ty::TREADLINK;
    Getattr { fid: u32 = int, mask: u64 = long } = ty::TGETATTR;
    Setattr { fid: u32 = int, attr: SetAttr = setattr } = ty::TSETATTR;
    Xattrwalk { fid: u32 = int, newfid: u32 = int, name: &'a [u8] = string } = ty::TXATTRWALK;
    Xattrcreate {
        fid: u32 = int, name: &'a [u8] = string, size: u64 = long, flags: u32 = int
    } = ty::TXATTRCREATE;
    Readdir { fid: u32 = int, offset: u64 = long, count: u32 = int } = ty::TREADDIR;
    Fsync { fid: u32 = int, datasync: u32 = opt_int } = ty::TFSYNC;
    Lock { fid: u32 = int, lock: Flock<'a> = lock } = ty::TLOCK;
    Getlock { fid: u32 = int, lock: Flock<'a> = getlock } = ty::TGETLOCK;
    Link { dfid: u32 = int, fid: u32 = int, name: &'a [u8] = string } = ty::TLINK;
    Mkdir { dfid: u32 = int, name: &'a [u8] = string, mode: u32 = int, gid: u32 = int } = ty::TMKDIR;
    Renameat {
        olddirfid: u32 = int, oldname: &'a [u8] = string, newdirfid: u32 = int,
        newname: &'a [u8] = string,
    } = ty::TRENAMEAT;
    Unlinkat { dfid: u32 = int, name: &'a [u8] = string, flags: u32 = int } = ty::TUNLINKAT;
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

fn put_flock(w: &mut Writer<'_>, l: &Flock<'_>, with_flags: bool) {
    w.u8(l.ty);
    if with_flags {
        w.u32(l.flags);
    }
    w.u64(l.start).u64(l.length).u32(l.proc_id).str(l.client_id);
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

messages! {
    /// A reply (R-message) body. `Read` and `Readdir` carry their data, which
    /// `Readdir` holds already encoded (see [`DirEntry::encode`]).
    enum Rmsg; decode decode_r; encode encode_r; ty type_r;
    Lerror { ecode: u32 = int } = ty::RLERROR;
    Version { msize: u32 = int, version: &'a [u8] = string } = ty::TVERSION + 1;
    Attach { qid: Qid = qid } = ty::TATTACH + 1;
    Flush = ty::TFLUSH + 1;
    Walk { qids: Vec<Qid> = qids } = ty::TWALK + 1;
    Read { data: &'a [u8] = data } = ty::TREAD + 1;
    Write { count: u32 = int } = ty::TWRITE + 1;
    Clunk = ty::TCLUNK + 1;
    Remove = ty::TREMOVE + 1;
    Statfs(s: StatFs = statfs) = ty::TSTATFS + 1;
    Lopen { qid: Qid = qid, iounit: u32 = int } = ty::TLOPEN + 1;
    Lcreate { qid: Qid = qid, iounit: u32 = int } = ty::TLCREATE + 1;
    Symlink { qid: Qid = qid } = ty::TSYMLINK + 1;
    Mknod { qid: Qid = qid } = ty::TMKNOD + 1;
    Rename = ty::TRENAME + 1;
    Readlink { target: &'a [u8] = string } = ty::TREADLINK + 1;
    Getattr(a: Box<Attr> = attr) = ty::TGETATTR + 1;
    Setattr = ty::TSETATTR + 1;
    Readdir { data: &'a [u8] = data } = ty::TREADDIR + 1;
    Fsync = ty::TFSYNC + 1;
    Lock { status: u8 = byte } = ty::TLOCK + 1;
    Getlock { lock: Flock<'a> = getlock } = ty::TGETLOCK + 1;
    Link = ty::TLINK + 1;
    Mkdir { qid: Qid = qid } = ty::TMKDIR + 1;
    Renameat = ty::TRENAMEAT + 1;
    Unlinkat = ty::TUNLINKAT + 1;
}

impl Rmsg<'_> {
    /// The message type.
    pub fn ty(&self) -> u8 {
        type_r(self)
    }

    /// Encodes the reply with `tag` at the end of `out`; returns its length.
    pub fn encode(&self, tag: u16, out: &mut Vec<u8>) -> usize {
        encode_r(tag, self, out)
    }

    /// Decodes a reply; returns its tag too.
    ///
    /// # Errors
    /// [`DecodeError`] for anything that is not a well-formed reply.
    pub fn decode(buf: &[u8]) -> Result<(u16, Rmsg<'_>), DecodeError> {
        let (t, tag, body) = split(buf)?;
        Ok((tag, decode_r(t, body)?))
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
