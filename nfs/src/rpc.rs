//! ONC RPC version 2 (RFC 5531): call headers with `AUTH_NONE` or
//! `AUTH_SYS` credentials, and replies decoded into their outcome.

use std::fmt;

use crate::xdr::{DResult, DecodeError, DecodeErrorKind, Reader, Writer};

/// `msg_type` CALL.
pub const CALL: u32 = 0;
/// `msg_type` REPLY.
pub const REPLY: u32 = 1;
/// The RPC protocol version.
pub const RPC_VERSION: u32 = 2;
/// `AUTH_NONE`.
pub const AUTH_NONE: u32 = 0;
/// `AUTH_SYS` (`AUTH_UNIX`).
pub const AUTH_SYS: u32 = 1;
/// The largest credential or verifier body (RFC 5531).
pub const MAX_AUTH_BYTES: usize = 400;
/// The largest `AUTH_SYS` machine name.
pub const MAX_MACHINE_NAME: usize = 255;
/// The most supplementary groups `AUTH_SYS` carries.
pub const MAX_GIDS: usize = 16;

/// A call's credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// `AUTH_NONE`.
    None,
    /// `AUTH_SYS`: who the caller says it is.
    Sys {
        /// Arbitrary id the caller chooses.
        stamp: u32,
        /// The caller's host name (at most 255 bytes; longer is cut).
        machine: String,
        /// Effective user id.
        uid: u32,
        /// Effective group id.
        gid: u32,
        /// Supplementary groups (at most 16 are sent).
        gids: Vec<u32>,
    },
}

impl Auth {
    /// `AUTH_SYS` for this process: its effective uid and gid, and the
    /// host name.
    pub fn sys_for_process() -> Auth {
        // SAFETY: geteuid/getegid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let machine = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "localhost".into());
        Auth::Sys {
            stamp: std::process::id(),
            machine,
            uid,
            gid,
            gids: Vec::new(),
        }
    }

    fn encode(&self, w: &mut Writer) {
        match self {
            Auth::None => {
                w.u32(AUTH_NONE).u32(0);
            }
            Auth::Sys {
                stamp,
                machine,
                uid,
                gid,
                gids,
            } => {
                let name = &machine.as_bytes()[..machine.len().min(MAX_MACHINE_NAME)];
                let gids = &gids[..gids.len().min(MAX_GIDS)];
                let mut body = Writer::new();
                body.u32(*stamp).opaque(name).u32(*uid).u32(*gid);
                body.u32(gids.len() as u32);
                for g in gids {
                    body.u32(*g);
                }
                w.u32(AUTH_SYS).opaque(&body.buf);
            }
        }
    }
}

/// Appends a call header: everything before the procedure's arguments.
pub fn encode_call(w: &mut Writer, xid: u32, prog: u32, vers: u32, proc_: u32, auth: &Auth) {
    w.u32(xid).u32(CALL).u32(RPC_VERSION);
    w.u32(prog).u32(vers).u32(proc_);
    auth.encode(w);
    // Verifier: AUTH_NONE.
    w.u32(AUTH_NONE).u32(0);
}

/// A reply that carries no results: what the server said instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyError {
    /// `PROG_UNAVAIL`.
    ProgUnavail,
    /// `PROG_MISMATCH`: the versions the server supports.
    ProgMismatch {
        /// Lowest.
        low: u32,
        /// Highest.
        high: u32,
    },
    /// `PROC_UNAVAIL`.
    ProcUnavail,
    /// `GARBAGE_ARGS`: the server could not decode the arguments.
    GarbageArgs,
    /// `SYSTEM_ERR`.
    SystemErr,
    /// Denied, `RPC_MISMATCH`: the RPC versions the server supports.
    RpcMismatch {
        /// Lowest.
        low: u32,
        /// Highest.
        high: u32,
    },
    /// Denied, `AUTH_ERROR` with its `auth_stat`.
    AuthError(u32),
    /// The reply could not be decoded.
    Decode(DecodeError),
}

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplyError::ProgUnavail => write!(f, "program unavailable (PROG_UNAVAIL)"),
            ReplyError::ProgMismatch { low, high } => {
                write!(f, "program version mismatch: server has {low}..={high}")
            }
            ReplyError::ProcUnavail => write!(f, "procedure unavailable (PROC_UNAVAIL)"),
            ReplyError::GarbageArgs => write!(f, "server could not decode the arguments"),
            ReplyError::SystemErr => write!(f, "server system error (SYSTEM_ERR)"),
            ReplyError::RpcMismatch { low, high } => {
                write!(f, "RPC version mismatch: server has {low}..={high}")
            }
            ReplyError::AuthError(s) => write!(f, "authentication refused (auth_stat {s})"),
            ReplyError::Decode(e) => write!(f, "malformed RPC reply: {e}"),
        }
    }
}

impl std::error::Error for ReplyError {}

impl From<DecodeError> for ReplyError {
    fn from(e: DecodeError) -> Self {
        ReplyError::Decode(e)
    }
}

/// A reply's xid, read without decoding the rest (to match it to its call).
pub fn reply_xid(buf: &[u8]) -> DResult<u32> {
    Reader::new(buf).u32("rpc xid")
}

/// Decodes a reply header; on success returns a reader at the results.
///
/// # Errors
/// [`ReplyError`]: what the server said instead of results, or why the
/// reply is malformed (not a REPLY, an unknown status, cut short).
pub fn decode_reply(buf: &[u8]) -> Result<(u32, Reader<'_>), ReplyError> {
    let mut r = Reader::new(buf);
    let xid = r.u32("rpc xid")?;
    let at = r.pos();
    let mtype = r.u32("rpc msg_type")?;
    if mtype != REPLY {
        return Err(DecodeError {
            what: "rpc msg_type",
            at,
            kind: DecodeErrorKind::BadValue(mtype.into()),
        }
        .into());
    }
    let at = r.pos();
    match r.u32("rpc reply_stat")? {
        0 => {
            let _flavor = r.u32("rpc verifier flavor")?;
            r.opaque("rpc verifier", MAX_AUTH_BYTES)?;
            let at = r.pos();
            match r.u32("rpc accept_stat")? {
                0 => Ok((xid, r)),
                1 => Err(ReplyError::ProgUnavail),
                2 => Err(ReplyError::ProgMismatch {
                    low: r.u32("rpc mismatch low")?,
                    high: r.u32("rpc mismatch high")?,
                }),
                3 => Err(ReplyError::ProcUnavail),
                4 => Err(ReplyError::GarbageArgs),
                5 => Err(ReplyError::SystemErr),
                v => Err(DecodeError {
                    what: "rpc accept_stat",
                    at,
                    kind: DecodeErrorKind::BadValue(v.into()),
                }
                .into()),
            }
        }
        1 => {
            let at = r.pos();
            match r.u32("rpc reject_stat")? {
                0 => Err(ReplyError::RpcMismatch {
                    low: r.u32("rpc mismatch low")?,
                    high: r.u32("rpc mismatch high")?,
                }),
                1 => Err(ReplyError::AuthError(r.u32("rpc auth_stat")?)),
                v => Err(DecodeError {
                    what: "rpc reject_stat",
                    at,
                    kind: DecodeErrorKind::BadValue(v.into()),
                }
                .into()),
            }
        }
        v => Err(DecodeError {
            what: "rpc reply_stat",
            at,
            kind: DecodeErrorKind::BadValue(v.into()),
        }
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepted(xid: u32, stat: u32, extra: &[u32]) -> Vec<u8> {
        let mut w = Writer::new();
        w.u32(xid).u32(REPLY).u32(0).u32(AUTH_NONE).u32(0).u32(stat);
        for &x in extra {
            w.u32(x);
        }
        w.buf
    }

    #[test]
    fn call_header_layout() {
        let mut w = Writer::new();
        let auth = Auth::Sys {
            stamp: 1,
            machine: "abc".into(),
            uid: 0,
            gid: 0,
            gids: vec![5],
        };
        encode_call(&mut w, 9, 100003, 3, 1, &auth);
        let mut r = Reader::new(&w.buf);
        for want in [9, CALL, 2, 100003, 3, 1, AUTH_SYS] {
            assert_eq!(r.u32("x").unwrap(), want);
        }
        let body = r.opaque("cred", MAX_AUTH_BYTES).unwrap();
        assert_eq!(body.len(), 4 + 8 + 4 + 4 + 4 + 4);
        assert_eq!(r.u32("verf").unwrap(), AUTH_NONE);
        assert_eq!(r.u32("verf len").unwrap(), 0);
        r.finish("end").unwrap();
    }

    #[test]
    fn replies_decode_to_their_outcome() {
        let ok = accepted(5, 0, &[42]);
        let (xid, mut r) = decode_reply(&ok).unwrap();
        assert_eq!((xid, r.u32("res").unwrap()), (5, 42));
        assert_eq!(
            decode_reply(&accepted(5, 2, &[2, 3])).unwrap_err(),
            ReplyError::ProgMismatch { low: 2, high: 3 }
        );
        assert_eq!(
            decode_reply(&accepted(5, 4, &[])).unwrap_err(),
            ReplyError::GarbageArgs
        );
        let mut denied = Writer::new();
        denied.u32(1).u32(REPLY).u32(1).u32(1).u32(5);
        assert_eq!(
            decode_reply(&denied.buf).unwrap_err(),
            ReplyError::AuthError(5)
        );
        // An unknown accept_stat, a CALL, and every truncation.
        assert!(matches!(
            decode_reply(&accepted(5, 99, &[])),
            Err(ReplyError::Decode(_))
        ));
        let mut call = Writer::new();
        encode_call(&mut call, 1, 1, 1, 1, &Auth::None);
        assert!(matches!(
            decode_reply(&call.buf),
            Err(ReplyError::Decode(_))
        ));
        for cut in 0..ok.len() - 4 {
            assert!(decode_reply(&ok[..cut]).is_err(), "cut at {cut}");
        }
    }
}
