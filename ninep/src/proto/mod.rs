//! 9P2000.L messages: decoding and encoding, with every length checked.
//!
//! A message is `size[4] type[1] tag[2] body`, little-endian, where `size`
//! counts the whole message. Strings are `len[2]` followed by that many
//! bytes (not necessarily UTF-8: file names are bytes). Decoding never
//! panics: a field that runs past the end, a `size` that disagrees with
//! the buffer, trailing bytes or too many walk names are a [`DecodeError`].
//!
//! - [`Reader`] and [`Writer`] (`wire.rs`): the little-endian fields, and
//!   [`split`], which checks a message's header against its buffer.
//! - The message table (`messages.rs`): [`Tmsg`] and [`Rmsg`], each message
//!   listed once with its fields and type number, their decoders and
//!   encoders generated from that list ([`Request`], [`Rmsg::decode`]), and
//!   `Rreaddir`'s [`DirEntry`]; `field.rs` says how each kind of field goes
//!   on the wire.
//! - Here: the constants, type numbers, [`DecodeError`] and the values
//!   messages carry ([`Qid`], [`Attr`], [`SetAttr`], [`Flock`], ...).

use std::fmt;

mod field;
mod messages;
#[cfg(test)]
mod tests;
mod wire;

pub use messages::{BadRequest, DirEntry, Request, Rmsg, Tmsg};
pub use wire::{split, Reader, Writer};

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
