//! NFS version 3 (RFC 1813) on the RPC-over-RDMA transport: NULL, GETATTR,
//! LOOKUP, READ, WRITE, CREATE, REMOVE, READDIR, READDIRPLUS and FSINFO,
//! and whole-file reads and writes with several calls in flight.
//!
//! READ offers a write chunk for its data when the reply would not fit
//! inline; READDIR and READDIRPLUS offer a reply chunk; WRITE's data is the
//! call's payload, which goes through a read chunk when the call does not
//! fit inline.
//!
//! Here: the protocol's numbers, the errors, the types of its results and
//! their decoders (also reached by the fuzz target), the client's
//! options. [`Client`] and its procedures are in `client.rs`; the order in
//! which [`Client::read_each`] sends READs ahead is `read_ahead.rs`.

mod client;
mod read_ahead;

use std::fmt;

use crate::mount::{MountError, FHSIZE3};
use crate::rpc::{Auth, ReplyError};
pub use crate::status::status_name;
use crate::transport::{self, LentData};
use crate::xdr::{DResult, DecodeError, Reader};

pub use client::Client;

/// NFS version 3.
pub const NFS_V3: u32 = 3;
/// The longest name LOOKUP, CREATE and REMOVE take (Linux's NAME_MAX).
pub const MAX_NAME: usize = 255;

/// Procedure numbers.
pub mod proc_ {
    /// NULL.
    pub const NULL: u32 = 0;
    /// GETATTR.
    pub const GETATTR: u32 = 1;
    /// LOOKUP.
    pub const LOOKUP: u32 = 3;
    /// READ.
    pub const READ: u32 = 6;
    /// WRITE.
    pub const WRITE: u32 = 7;
    /// CREATE.
    pub const CREATE: u32 = 8;
    /// REMOVE.
    pub const REMOVE: u32 = 12;
    /// READDIR.
    pub const READDIR: u32 = 16;
    /// READDIRPLUS.
    pub const READDIRPLUS: u32 = 17;
    /// FSINFO.
    pub const FSINFO: u32 = 19;
}

/// `NF3REG`.
pub const NF3REG: u32 = 1;
/// `NF3DIR`.
pub const NF3DIR: u32 = 2;

/// Why an NFS operation failed.
#[derive(Debug)]
pub enum NfsError {
    /// The transport failed.
    Transport(transport::Error),
    /// The RPC was not accepted.
    Rpc(ReplyError),
    /// The results were malformed.
    Decode(&'static str, DecodeError),
    /// The server answered with an error status.
    Status {
        /// The procedure.
        op: &'static str,
        /// The status.
        status: u32,
    },
    /// Getting the root handle failed.
    Mount(MountError),
    /// Bad input (a name too long, an empty path component).
    Invalid(String),
}

impl NfsError {
    /// The NFS status, when the server answered with one.
    pub fn status(&self) -> Option<u32> {
        match self {
            NfsError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

impl fmt::Display for NfsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NfsError::Transport(e) => write!(f, "{e}"),
            NfsError::Rpc(e) => write!(f, "{e}"),
            NfsError::Decode(op, e) => write!(f, "{op}: malformed reply: {e}"),
            NfsError::Status { op, status } => write!(f, "{op}: {}", status_name(*status)),
            NfsError::Mount(e) => write!(f, "{e}"),
            NfsError::Invalid(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for NfsError {}

impl From<transport::Error> for NfsError {
    fn from(e: transport::Error) -> Self {
        NfsError::Transport(e)
    }
}

/// The result of an NFS operation.
pub type Result<T> = std::result::Result<T, NfsError>;

/// A file handle.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fh(pub Vec<u8>);

/// File attributes (`fattr3`), the fields this client uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fattr {
    /// `NF3REG`, `NF3DIR`, ...
    pub ftype: u32,
    /// Permission bits.
    pub mode: u32,
    /// Links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// File id (inode number).
    pub fileid: u64,
    /// Modification time, seconds.
    pub mtime: u32,
}

/// A directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// File id.
    pub fileid: u64,
    /// Name (bytes as the server has them).
    pub name: Vec<u8>,
    /// Attributes (READDIRPLUS, when the server sent them).
    pub attr: Option<Fattr>,
    /// Handle (READDIRPLUS, when the server sent it).
    pub fh: Option<Fh>,
}

pub(crate) fn fattr(r: &mut Reader<'_>) -> DResult<Fattr> {
    let ftype = r.u32("fattr3.type")?;
    let mode = r.u32("fattr3.mode")?;
    let nlink = r.u32("fattr3.nlink")?;
    let uid = r.u32("fattr3.uid")?;
    let gid = r.u32("fattr3.gid")?;
    let size = r.u64("fattr3.size")?;
    let _used = r.u64("fattr3.used")?;
    let _rdev = r.u64("fattr3.rdev")?;
    let _fsid = r.u64("fattr3.fsid")?;
    let fileid = r.u64("fattr3.fileid")?;
    let _atime = r.u64("fattr3.atime")?;
    let mtime = r.u32("fattr3.mtime")?;
    let _mtime_ns = r.u32("fattr3.mtime")?;
    let _ctime = r.u64("fattr3.ctime")?;
    Ok(Fattr {
        ftype,
        mode,
        nlink,
        uid,
        gid,
        size,
        fileid,
        mtime,
    })
}

pub(crate) fn post_op_attr(r: &mut Reader<'_>) -> DResult<Option<Fattr>> {
    if r.bool("post_op_attr")? {
        Ok(Some(fattr(r)?))
    } else {
        Ok(None)
    }
}

pub(crate) fn wcc_data(r: &mut Reader<'_>) -> DResult<()> {
    if r.bool("pre_op_attr")? {
        r.bytes("wcc_attr", 24)?;
    }
    post_op_attr(r)?;
    Ok(())
}

pub(crate) fn fh(r: &mut Reader<'_>) -> DResult<Fh> {
    Ok(Fh(r.opaque("nfs_fh3", FHSIZE3)?.to_vec()))
}

/// The client's settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// The RDMA port (20049).
    pub port: u16,
    /// The transport's settings.
    pub transport: transport::Options,
    /// The credential (`AUTH_SYS` of this process when `None`).
    pub auth: Option<Auth>,
    /// Largest READ and WRITE (the server's maximum caps it).
    pub io_size: u32,
    /// Calls in flight for whole-file reads and writes.
    pub window: usize,
    /// The most entries [`Client::readdir`] and [`Client::readdirplus`]
    /// take from one directory: a server that never says the listing ended
    /// gets an error here, not a client whose memory grows without end.
    pub max_dir_entries: usize,
    /// The most bytes [`Client::read_all`] reads: a file that never ends
    /// (a server that never says EOF, or one growing as it is read) gets an
    /// error past it.
    pub max_read_all: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            port: transport::DEFAULT_PORT,
            transport: transport::Options::default(),
            auth: None,
            io_size: 1 << 20,
            window: 8,
            max_dir_entries: 1 << 20,
            max_read_all: 4 << 30,
        }
    }
}

/// A READ's data: bytes of its own (inline in the reply, or copied out of
/// the write chunk), or the write chunk's memory itself, lent
/// ([`LentData`]: no copy). Dropping it gives lent memory back to the
/// connection.
#[derive(Debug, PartialEq, Eq)]
pub struct ReadData(ReadRepr);

#[derive(Debug, PartialEq, Eq)]
enum ReadRepr {
    Owned(Vec<u8>),
    Lent(LentData),
}

impl ReadData {
    /// Whether the bytes are the write chunk's memory, lent.
    pub fn is_lent(&self) -> bool {
        matches!(self.0, ReadRepr::Lent(_))
    }

    /// The bytes as a `Vec` of their own: moved when they are, copied out
    /// of lent memory (which then goes back).
    pub fn into_vec(self) -> Vec<u8> {
        match self.0 {
            ReadRepr::Owned(v) => v,
            ReadRepr::Lent(d) => d.to_vec(),
        }
    }
}

impl std::ops::Deref for ReadData {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.0 {
            ReadRepr::Owned(v) => v,
            ReadRepr::Lent(d) => d,
        }
    }
}
