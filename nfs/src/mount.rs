//! MOUNT version 3 (RFC 1813, appendix I) over TCP, for the root file
//! handle: rpcbind (port 111) gives mountd's port, `MNT` the handle.
//!
//! TCP carries RPC messages with record marking (RFC 5531 §11): each
//! fragment is preceded by a 4-byte word, its length with the top bit set
//! on the last one. Replies are read with a bound on their size.

use std::fmt;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use crate::rpc::{decode_reply, encode_call, Auth, ReplyError};
use crate::xdr::{DecodeError, Writer};

/// The rpcbind (portmapper) program.
pub const PMAP_PROG: u32 = 100_000;
/// The MOUNT program.
pub const MOUNT_PROG: u32 = 100_005;
/// The NFS program.
pub const NFS_PROG: u32 = 100_003;
/// The largest NFSv3 file handle.
pub const FHSIZE3: usize = 64;
/// The largest reply accepted over TCP.
const MAX_RECORD: usize = 1 << 20;

/// Why the root handle could not be had.
#[derive(Debug)]
pub enum MountError {
    /// Connecting, sending or receiving failed.
    Io(String, std::io::Error),
    /// The RPC reply was not a success.
    Rpc(&'static str, ReplyError),
    /// The results were malformed.
    Decode(&'static str, DecodeError),
    /// rpcbind does not know the program.
    NotRegistered(&'static str),
    /// mountd refused: its status (an NFS error number).
    Refused(String, u32),
    /// A reply record larger than allowed, or an xid that does not match.
    Protocol(String),
}

impl fmt::Display for MountError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MountError::Io(what, e) => write!(f, "{what}: {e}"),
            MountError::Rpc(what, e) => write!(f, "{what}: {e}"),
            MountError::Decode(what, e) => write!(f, "{what}: malformed reply: {e}"),
            MountError::NotRegistered(p) => {
                write!(f, "rpcbind: {p} is not registered (is the server running?)")
            }
            MountError::Refused(path, s) => write!(
                f,
                "mount {path}: refused by the server ({})",
                crate::nfs3::status_name(*s)
            ),
            MountError::Protocol(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for MountError {}

/// One RPC over a fresh TCP connection: returns the results' bytes.
#[allow(clippy::too_many_arguments)] // the RPC's own fields, each needed once
fn tcp_call(
    addr: SocketAddr,
    what: &'static str,
    prog: u32,
    vers: u32,
    proc_: u32,
    auth: &Auth,
    args: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>, MountError> {
    let io = |e| MountError::Io(format!("{what} at {addr}"), e);
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(io)?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    s.set_write_timeout(Some(timeout)).map_err(io)?;
    let xid = std::process::id() ^ 0x5a5a_0000 ^ proc_;
    let mut w = Writer::new();
    w.u32(0);
    encode_call(&mut w, xid, prog, vers, proc_, auth);
    w.buf.extend_from_slice(args);
    let len = (w.len() - 4) as u32 | 0x8000_0000;
    w.buf[..4].copy_from_slice(&len.to_be_bytes());
    s.write_all(&w.buf).map_err(io)?;
    let mut reply = Vec::new();
    loop {
        let mut mark = [0; 4];
        s.read_exact(&mut mark).map_err(io)?;
        let m = u32::from_be_bytes(mark);
        let n = (m & 0x7fff_ffff) as usize;
        if reply.len() + n > MAX_RECORD {
            return Err(MountError::Protocol(format!(
                "{what}: a reply record over {MAX_RECORD} bytes"
            )));
        }
        let start = reply.len();
        reply.resize(start + n, 0);
        s.read_exact(&mut reply[start..]).map_err(io)?;
        if m & 0x8000_0000 != 0 {
            break;
        }
    }
    let (got, r) = decode_reply(&reply).map_err(|e| MountError::Rpc(what, e))?;
    if got != xid {
        return Err(MountError::Protocol(format!(
            "{what}: reply xid {got:#x} for call {xid:#x}"
        )));
    }
    Ok(r.rest().to_vec())
}

/// Asks rpcbind at `server` for the TCP port of `prog` version `vers`.
///
/// # Errors
/// [`MountError`].
pub fn getport(
    server: IpAddr,
    prog: u32,
    vers: u32,
    name: &'static str,
    timeout: Duration,
) -> Result<u16, MountError> {
    let mut a = Writer::new();
    a.u32(prog).u32(vers).u32(6).u32(0);
    let res = tcp_call(
        SocketAddr::new(server, 111),
        "rpcbind GETPORT",
        PMAP_PROG,
        2,
        3,
        &Auth::None,
        &a.buf,
        timeout,
    )?;
    let mut r = crate::xdr::Reader::new(&res);
    let port = r
        .u32("port")
        .map_err(|e| MountError::Decode("rpcbind GETPORT", e))?;
    match u16::try_from(port) {
        Ok(0) => Err(MountError::NotRegistered(name)),
        Ok(p) => Ok(p),
        Err(_) => Err(MountError::Protocol(format!("rpcbind: port {port}"))),
    }
}

/// `MNT` of `path` at `server` (mountd found through rpcbind): the root
/// file handle.
///
/// # Errors
/// [`MountError`]: the server unreachable, mountd not registered, the
/// export refused.
pub fn mount(
    server: IpAddr,
    path: &str,
    auth: &Auth,
    timeout: Duration,
) -> Result<Vec<u8>, MountError> {
    let port = getport(server, MOUNT_PROG, 3, "mountd (MOUNT v3)", timeout)?;
    let mut a = Writer::new();
    a.opaque(path.as_bytes());
    let res = tcp_call(
        SocketAddr::new(server, port),
        "MOUNT MNT",
        MOUNT_PROG,
        3,
        1,
        auth,
        &a.buf,
        timeout,
    )?;
    let mut r = crate::xdr::Reader::new(&res);
    let dec = |e| MountError::Decode("MOUNT MNT", e);
    let status = r.u32("fhs_status").map_err(dec)?;
    if status != 0 {
        return Err(MountError::Refused(path.into(), status));
    }
    Ok(r.opaque("fhandle3", FHSIZE3).map_err(dec)?.to_vec())
}
