//! MOUNT version 3 (RFC 1813, appendix I) over TCP, for the root file
//! handle: rpcbind (port 111) gives mountd's port, `MNT` the handle.
//!
//! TCP carries RPC messages with record marking (RFC 5531 §11): each
//! fragment is preceded by a 4-byte word, its length with the top bit set
//! on the last one. Replies are read with a bound on their size.
//!
//! The calls are async (tokio's TCP): a slow or silent server never blocks
//! the runtime's thread, and each exchange (connect, send, reply) has one
//! deadline, past which it fails with [`MountError::TimedOut`].

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::TcpStream;

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
    /// The exchange did not finish in time.
    TimedOut {
        /// The call and the address (`rpcbind GETPORT at 10.8.0.1:111`).
        what: String,
        /// The bound it missed.
        after: Duration,
    },
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
                crate::status::status_name(*s)
            ),
            MountError::Protocol(why) => write!(f, "{why}"),
            MountError::TimedOut { what, after } => write!(
                f,
                "{what}: no complete reply within {after:?} (is the server's rpcbind/mountd \
                 reachable over TCP?)"
            ),
        }
    }
}

impl std::error::Error for MountError {}

/// One RPC over a fresh TCP connection, all of it within `timeout`:
/// returns the results' bytes.
#[allow(clippy::too_many_arguments)] // the RPC's own fields, each needed once
async fn tcp_call(
    addr: SocketAddr,
    what: &'static str,
    prog: u32,
    vers: u32,
    proc_: u32,
    auth: &Auth,
    args: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>, MountError> {
    let call = exchange(addr, what, prog, vers, proc_, auth, args);
    match tokio::time::timeout(timeout, call).await {
        Ok(r) => r,
        Err(_) => Err(MountError::TimedOut {
            what: format!("{what} at {addr}"),
            after: timeout,
        }),
    }
}

#[allow(clippy::too_many_arguments)] // as tcp_call
async fn exchange(
    addr: SocketAddr,
    what: &'static str,
    prog: u32,
    vers: u32,
    proc_: u32,
    auth: &Auth,
    args: &[u8],
) -> Result<Vec<u8>, MountError> {
    let io = |e| MountError::Io(format!("{what} at {addr}"), e);
    let s = TcpStream::connect(addr).await.map_err(io)?;
    let xid = std::process::id() ^ 0x5a5a_0000 ^ proc_;
    let mut w = Writer::new();
    w.u32(0);
    encode_call(&mut w, xid, prog, vers, proc_, auth);
    w.buf.extend_from_slice(args);
    let len = (w.len() - 4) as u32 | 0x8000_0000;
    w.buf[..4].copy_from_slice(&len.to_be_bytes());
    write_all(&s, &w.buf).await.map_err(io)?;
    let mut reply = Vec::new();
    loop {
        let mut mark = [0; 4];
        read_exact(&s, &mut mark).await.map_err(io)?;
        let m = u32::from_be_bytes(mark);
        let n = (m & 0x7fff_ffff) as usize;
        if reply.len() + n > MAX_RECORD {
            return Err(MountError::Protocol(format!(
                "{what}: a reply record over {MAX_RECORD} bytes"
            )));
        }
        let start = reply.len();
        reply.resize(start + n, 0);
        read_exact(&s, &mut reply[start..]).await.map_err(io)?;
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

/// Writes all of `buf` (tokio's `net` alone: no `io-util`).
async fn write_all(s: &TcpStream, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        s.writable().await?;
        match s.try_write(buf) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Fills `buf`; the connection closing first is `UnexpectedEof`.
async fn read_exact(s: &TcpStream, mut buf: &mut [u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        s.readable().await?;
        match s.try_read(buf) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Asks rpcbind at `server` for the TCP port of `prog` version `vers`.
///
/// # Errors
/// [`MountError`]; [`MountError::TimedOut`] past `timeout`.
pub async fn getport(
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
    )
    .await?;
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
/// export refused; [`MountError::TimedOut`] when rpcbind's or mountd's
/// exchange takes longer than `timeout` (each has its own).
pub async fn mount(
    server: IpAddr,
    path: &str,
    auth: &Auth,
    timeout: Duration,
) -> Result<Vec<u8>, MountError> {
    let port = getport(server, MOUNT_PROG, 3, "mountd (MOUNT v3)", timeout).await?;
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
    )
    .await?;
    let mut r = crate::xdr::Reader::new(&res);
    let dec = |e| MountError::Decode("MOUNT MNT", e);
    let status = r.u32("fhs_status").map_err(dec)?;
    if status != 0 {
        return Err(MountError::Refused(path.into(), status));
    }
    Ok(r.opaque("fhandle3", FHSIZE3).map_err(dec)?.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A server that accepts and never answers: the call fails with
    /// `TimedOut` naming the step and the address, and the runtime's one
    /// thread keeps running other tasks meanwhile (nothing blocks it).
    #[test]
    fn a_silent_server_times_out_without_blocking_the_runtime() {
        runtime().block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let server = tokio::spawn(async move {
                let (s, _) = l.accept().await.unwrap();
                std::future::pending::<()>().await;
                drop(s);
            });
            let ticks = Arc::new(AtomicU32::new(0));
            let t = Arc::clone(&ticks);
            let ticker = tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    t.fetch_add(1, Ordering::Relaxed);
                }
            });
            let timeout = Duration::from_millis(300);
            let start = tokio::time::Instant::now();
            let e = tcp_call(
                addr,
                "MOUNT MNT",
                MOUNT_PROG,
                3,
                1,
                &Auth::None,
                &[],
                timeout,
            )
            .await
            .unwrap_err();
            let took = start.elapsed();
            assert!(
                matches!(&e, MountError::TimedOut { after, .. } if *after == timeout),
                "{e:?}"
            );
            let msg = e.to_string();
            assert!(msg.contains("MOUNT MNT at 127.0.0.1"), "{msg}");
            assert!(took >= timeout && took < timeout * 10, "{took:?}");
            assert!(
                ticks.load(Ordering::Relaxed) >= 5,
                "other tasks ran while the call waited"
            );
            ticker.abort();
            server.abort();
        });
    }

    /// Nothing listening: an `Io` error at once, naming the step.
    #[test]
    fn no_listener_is_an_io_error_naming_the_step() {
        runtime().block_on(async {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            drop(l);
            let e = tcp_call(
                addr,
                "rpcbind GETPORT",
                PMAP_PROG,
                2,
                3,
                &Auth::None,
                &[],
                Duration::from_secs(5),
            )
            .await
            .unwrap_err();
            assert!(matches!(e, MountError::Io(..)), "{e:?}");
            assert!(
                e.to_string().starts_with("rpcbind GETPORT at 127.0.0.1"),
                "{e}"
            );
        });
    }

    /// A reply record past the bound is refused, a good one decoded.
    #[test]
    fn replies_are_read_with_record_marking() {
        runtime().block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let server = tokio::spawn(async move {
                let (s, _) = l.accept().await.unwrap();
                let mut mark = [0; 4];
                read_exact(&s, &mut mark).await.unwrap();
                let n = (u32::from_be_bytes(mark) & 0x7fff_ffff) as usize;
                let mut call = vec![0; n];
                read_exact(&s, &mut call).await.unwrap();
                // An accepted, successful reply with one result word, in
                // two fragments.
                let mut w = Writer::new();
                w.u32(u32::from_be_bytes([call[0], call[1], call[2], call[3]]));
                w.u32(1).u32(0).u32(0).u32(0).u32(0).u32(2049);
                let (a, b) = w.buf.split_at(8);
                for (frag, last) in [(a, false), (b, true)] {
                    let m = frag.len() as u32 | if last { 0x8000_0000 } else { 0 };
                    write_all(&s, &m.to_be_bytes()).await.unwrap();
                    write_all(&s, frag).await.unwrap();
                }
            });
            let res = tcp_call(
                addr,
                "rpcbind GETPORT",
                PMAP_PROG,
                2,
                3,
                &Auth::None,
                &[],
                Duration::from_secs(5),
            )
            .await
            .unwrap();
            assert_eq!(res, 2049u32.to_be_bytes());
            server.await.unwrap();
        });
    }
}
