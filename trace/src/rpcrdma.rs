//! RPC-over-RDMA version 1 transport headers (RFC 8166) and the ONC RPC message header inside
//! them (RFC 5531): transaction id, call or reply, program, version, procedure, reply status.
//!
//! Everything is XDR: big-endian 32-bit words. [`parse_header`] and [`parse_rpc`] never panic;
//! a header cut short is [`RpcRdmaError::Short`], and no list is allocated from a count the
//! packet states, only from the entries actually present.
//!
//! ```
//! use rdma_trace::rpcrdma::{build_header, parse_header, Proc, Segment};
//!
//! let seg = Segment { handle: 0x42, length: 8192, offset: 0x1000 };
//! let bytes = build_header(7, 32, Proc::Msg, &[], &[vec![seg]], None);
//! let h = parse_header(&bytes).unwrap();
//! assert_eq!((h.xid, h.credits, h.proc), (7, 32, Proc::Msg));
//! assert_eq!(h.writes, vec![vec![seg]]);
//! assert_eq!(h.header_len, bytes.len());
//! ```

use serde::Serialize;

use crate::bytes::{Reader, Short};

/// The RPC-over-RDMA version this module decodes.
pub const VERSION: u32 = 1;

/// A plain RDMA segment: a registered memory region's handle (rkey), its length and its address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Segment {
    /// The rkey (RFC 8166's handle).
    pub handle: u32,
    /// Length in bytes: offered by the requester, or (in a reply's write list) used.
    pub length: u32,
    /// The address (RFC 8166's offset).
    pub offset: u64,
}

/// A read segment: a segment and the position in the XDR stream where its data belongs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ReadSegment {
    /// XDR position (0: the whole RPC message is in the read chunk).
    pub position: u32,
    /// The segment.
    #[serde(flatten)]
    pub segment: Segment,
}

/// The procedure of an RPC-over-RDMA header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Proc {
    /// RDMA_MSG: an RPC message follows the header.
    Msg,
    /// RDMA_NOMSG: the RPC message is in a position-zero read chunk or in the reply chunk.
    NoMsg,
    /// RDMA_MSGP (2): reserved in version 1 (RFC 5666 padded a message after it).
    Msgp,
    /// RDMA_DONE (3): reserved in version 1.
    Done,
    /// RDMA_ERROR: the responder could not process the call.
    Error(ErrorBody),
    /// A procedure number version 1 does not define.
    Unknown(u32),
}

impl Proc {
    /// The specification's name.
    pub fn name(self) -> &'static str {
        match self {
            Proc::Msg => "RDMA_MSG",
            Proc::NoMsg => "RDMA_NOMSG",
            Proc::Msgp => "RDMA_MSGP",
            Proc::Done => "RDMA_DONE",
            Proc::Error(_) => "RDMA_ERROR",
            Proc::Unknown(_) => "UNKNOWN",
        }
    }

    fn number(self) -> u32 {
        match self {
            Proc::Msg => 0,
            Proc::NoMsg => 1,
            Proc::Msgp => 2,
            Proc::Done => 3,
            Proc::Error(_) => 4,
            Proc::Unknown(n) => n,
        }
    }
}

/// The body of RDMA_ERROR.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ErrorBody {
    /// ERR_VERS: the versions the responder supports.
    Vers {
        /// Lowest.
        low: u32,
        /// Highest.
        high: u32,
    },
    /// ERR_CHUNK: a chunk list was malformed or too small.
    Chunk,
    /// Another error code.
    Other(u32),
}

/// A decoded RPC-over-RDMA version 1 header.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Header {
    /// Transaction id (the RPC's XID).
    pub xid: u32,
    /// Protocol version (always [`VERSION`] here: other versions are an error).
    pub vers: u32,
    /// Credits requested (call) or granted (reply).
    pub credits: u32,
    /// The procedure.
    pub proc: Proc,
    /// The read list, as the header orders it (a read chunk is the segments sharing a position).
    pub reads: Vec<ReadSegment>,
    /// The write list: one list of segments per write chunk.
    pub writes: Vec<Vec<Segment>>,
    /// The reply chunk.
    pub reply: Option<Vec<Segment>>,
    /// Bytes of the header: the RPC message (RDMA_MSG) starts there.
    pub header_len: usize,
}

impl Header {
    /// The read chunks: the read list's segments grouped by position, in the header's order.
    pub fn read_chunks(&self) -> Vec<(u32, Vec<Segment>)> {
        let mut out: Vec<(u32, Vec<Segment>)> = Vec::new();
        for r in &self.reads {
            match out.iter_mut().find(|(p, _)| *p == r.position) {
                Some((_, segs)) => segs.push(r.segment),
                None => out.push((r.position, vec![r.segment])),
            }
        }
        out
    }
}

/// Why bytes are not an RPC-over-RDMA version 1 header (or an RPC message).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RpcRdmaError {
    /// Cut short.
    Short(Short),
    /// A version other than 1.
    Version(u32),
    /// A list discriminator (or an XDR boolean) other than 0 or 1.
    Discriminator {
        /// Which list.
        what: &'static str,
        /// The value found.
        value: u32,
    },
    /// An RPC message type other than CALL (0) or REPLY (1).
    MsgType(u32),
    /// An RPC call whose RPC version is not 2.
    RpcVersion(u32),
    /// An authentication body longer than RFC 5531's 400 bytes.
    AuthTooLong(u32),
}

impl From<Short> for RpcRdmaError {
    fn from(s: Short) -> Self {
        RpcRdmaError::Short(s)
    }
}

impl std::fmt::Display for RpcRdmaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RpcRdmaError::Short(s) => {
                write!(f, "truncated {}: {} of {} bytes", s.what, s.have, s.need)
            }
            RpcRdmaError::Version(v) => write!(f, "RPC-over-RDMA version {v}, not 1"),
            RpcRdmaError::Discriminator { what, value } => {
                write!(f, "{what}: discriminator {value}, not 0 or 1")
            }
            RpcRdmaError::MsgType(t) => write!(f, "RPC message type {t}"),
            RpcRdmaError::RpcVersion(v) => write!(f, "RPC version {v}, not 2"),
            RpcRdmaError::AuthTooLong(n) => write!(f, "RPC authenticator of {n} bytes"),
        }
    }
}

impl std::error::Error for RpcRdmaError {}

fn present(r: &mut Reader<'_>, what: &'static str) -> Result<bool, RpcRdmaError> {
    match r.u32(what)? {
        0 => Ok(false),
        1 => Ok(true),
        value => Err(RpcRdmaError::Discriminator { what, value }),
    }
}

fn segment(r: &mut Reader<'_>) -> Result<Segment, RpcRdmaError> {
    Ok(Segment {
        handle: r.u32("RDMA segment handle")?,
        length: r.u32("RDMA segment length")?,
        offset: r.u64("RDMA segment offset")?,
    })
}

fn write_chunk(r: &mut Reader<'_>) -> Result<Vec<Segment>, RpcRdmaError> {
    let count = r.u32("write chunk segment count")?;
    let mut segs = Vec::new();
    for _ in 0..count {
        // Each segment needs 16 bytes: a count larger than the packet fails here, after at
        // most as many pushes as there are bytes for.
        segs.push(segment(r)?);
    }
    Ok(segs)
}

/// Decodes an RPC-over-RDMA version 1 header at the start of `b` (a SEND's payload).
pub fn parse_header(b: &[u8]) -> Result<Header, RpcRdmaError> {
    let mut r = Reader::new(b);
    let xid = r.u32("rpcrdma xid")?;
    let vers = r.u32("rpcrdma version")?;
    if vers != VERSION {
        return Err(RpcRdmaError::Version(vers));
    }
    let credits = r.u32("rpcrdma credits")?;
    let proc = match r.u32("rpcrdma procedure")? {
        0 => Proc::Msg,
        1 => Proc::NoMsg,
        2 => Proc::Msgp,
        3 => Proc::Done,
        4 => Proc::Error(match r.u32("rdma_err")? {
            1 => ErrorBody::Vers {
                low: r.u32("rdma_vers_low")?,
                high: r.u32("rdma_vers_high")?,
            },
            2 => ErrorBody::Chunk,
            n => ErrorBody::Other(n),
        }),
        n => Proc::Unknown(n),
    };
    let mut h = Header {
        xid,
        vers,
        credits,
        proc,
        reads: Vec::new(),
        writes: Vec::new(),
        reply: None,
        header_len: 0,
    };
    if matches!(proc, Proc::Msg | Proc::NoMsg) {
        while present(&mut r, "read list")? {
            let position = r.u32("read segment position")?;
            h.reads.push(ReadSegment {
                position,
                segment: segment(&mut r)?,
            });
        }
        while present(&mut r, "write list")? {
            h.writes.push(write_chunk(&mut r)?);
        }
        if present(&mut r, "reply chunk")? {
            h.reply = Some(write_chunk(&mut r)?);
        }
    }
    h.header_len = r.pos();
    Ok(h)
}

/// Encodes a header (for tests and examples): the inverse of [`parse_header`].
pub fn build_header(
    xid: u32,
    credits: u32,
    proc: Proc,
    reads: &[ReadSegment],
    writes: &[Vec<Segment>],
    reply: Option<&[Segment]>,
) -> Vec<u8> {
    let mut v = Vec::new();
    let mut w = |x: u32| v.extend_from_slice(&x.to_be_bytes());
    w(xid);
    w(VERSION);
    w(credits);
    w(proc.number());
    let seg = |v: &mut Vec<u8>, s: &Segment| {
        v.extend_from_slice(&s.handle.to_be_bytes());
        v.extend_from_slice(&s.length.to_be_bytes());
        v.extend_from_slice(&s.offset.to_be_bytes());
    };
    match proc {
        Proc::Error(e) => match e {
            ErrorBody::Vers { low, high } => {
                for x in [1, low, high] {
                    v.extend_from_slice(&x.to_be_bytes());
                }
            }
            ErrorBody::Chunk => v.extend_from_slice(&2u32.to_be_bytes()),
            ErrorBody::Other(n) => v.extend_from_slice(&n.to_be_bytes()),
        },
        Proc::Msg | Proc::NoMsg => {
            for r in reads {
                v.extend_from_slice(&1u32.to_be_bytes());
                v.extend_from_slice(&r.position.to_be_bytes());
                seg(&mut v, &r.segment);
            }
            v.extend_from_slice(&0u32.to_be_bytes());
            for c in writes {
                v.extend_from_slice(&1u32.to_be_bytes());
                v.extend_from_slice(&(c.len() as u32).to_be_bytes());
                for s in c {
                    seg(&mut v, s);
                }
            }
            v.extend_from_slice(&0u32.to_be_bytes());
            match reply {
                Some(c) => {
                    v.extend_from_slice(&1u32.to_be_bytes());
                    v.extend_from_slice(&(c.len() as u32).to_be_bytes());
                    for s in c {
                        seg(&mut v, s);
                    }
                }
                None => v.extend_from_slice(&0u32.to_be_bytes()),
            }
        }
        _ => {}
    }
    v
}

/// An ONC RPC message header (RFC 5531).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RpcMessage {
    /// Transaction id.
    pub xid: u32,
    /// Call or reply.
    pub body: RpcBody,
    /// Where the procedure's arguments (call) or results (accepted reply) start.
    pub body_at: usize,
}

/// A call's or a reply's header fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RpcBody {
    /// A call.
    Call {
        /// Program number (100003: NFS).
        program: u32,
        /// Program version.
        version: u32,
        /// Procedure number.
        procedure: u32,
        /// The credential's flavor (0 AUTH_NONE, 1 AUTH_SYS, 6 RPCSEC_GSS).
        cred_flavor: u32,
    },
    /// A reply.
    Reply(ReplyStatus),
}

/// The status of a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplyStatus {
    /// MSG_ACCEPTED with its accept_stat (0 SUCCESS, 1 PROG_UNAVAIL, 2 PROG_MISMATCH,
    /// 3 PROC_UNAVAIL, 4 GARBAGE_ARGS, 5 SYSTEM_ERR).
    Accepted(u32),
    /// MSG_DENIED with its reject_stat (0 RPC_MISMATCH, 1 AUTH_ERROR).
    Denied(u32),
    /// A reply_stat other than 0 or 1.
    Other(u32),
}

impl ReplyStatus {
    /// A short name: `SUCCESS`, `GARBAGE_ARGS`, `DENIED_AUTH_ERROR`, ...
    pub fn name(self) -> String {
        match self {
            ReplyStatus::Accepted(s) => match s {
                0 => "SUCCESS".into(),
                1 => "PROG_UNAVAIL".into(),
                2 => "PROG_MISMATCH".into(),
                3 => "PROC_UNAVAIL".into(),
                4 => "GARBAGE_ARGS".into(),
                5 => "SYSTEM_ERR".into(),
                n => format!("ACCEPTED_{n}"),
            },
            ReplyStatus::Denied(0) => "DENIED_RPC_MISMATCH".into(),
            ReplyStatus::Denied(1) => "DENIED_AUTH_ERROR".into(),
            ReplyStatus::Denied(n) => format!("DENIED_{n}"),
            ReplyStatus::Other(n) => format!("REPLY_STAT_{n}"),
        }
    }
}

/// An opaque_auth: its flavor (the body is skipped, its length checked).
fn auth(r: &mut Reader<'_>, what: &'static str) -> Result<u32, RpcRdmaError> {
    let flavor = r.u32(what)?;
    let len = r.u32(what)?;
    if len > 400 {
        return Err(RpcRdmaError::AuthTooLong(len));
    }
    let padded = (len as usize).div_ceil(4) * 4;
    r.take(padded, what)?;
    Ok(flavor)
}

/// Decodes the header of the RPC message at the start of `b`.
pub fn parse_rpc(b: &[u8]) -> Result<RpcMessage, RpcRdmaError> {
    let mut r = Reader::new(b);
    let xid = r.u32("RPC xid")?;
    let body = match r.u32("RPC message type")? {
        0 => {
            let rpcvers = r.u32("RPC version")?;
            if rpcvers != 2 {
                return Err(RpcRdmaError::RpcVersion(rpcvers));
            }
            let program = r.u32("RPC program")?;
            let version = r.u32("RPC program version")?;
            let procedure = r.u32("RPC procedure")?;
            let cred_flavor = auth(&mut r, "RPC credential")?;
            auth(&mut r, "RPC verifier")?;
            RpcBody::Call {
                program,
                version,
                procedure,
                cred_flavor,
            }
        }
        1 => RpcBody::Reply(match r.u32("RPC reply status")? {
            0 => {
                auth(&mut r, "RPC verifier")?;
                ReplyStatus::Accepted(r.u32("RPC accept status")?)
            }
            1 => ReplyStatus::Denied(r.u32("RPC reject status")?),
            n => ReplyStatus::Other(n),
        }),
        t => return Err(RpcRdmaError::MsgType(t)),
    };
    Ok(RpcMessage {
        xid,
        body,
        body_at: r.pos(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(ws: &[u32]) -> Vec<u8> {
        ws.iter().flat_map(|w| w.to_be_bytes()).collect()
    }

    fn seg(handle: u32, length: u32, offset: u64) -> Segment {
        Segment {
            handle,
            length,
            offset,
        }
    }

    #[test]
    fn a_call_with_every_list_round_trips_and_groups_read_chunks() {
        let reads = [
            ReadSegment {
                position: 0,
                segment: seg(1, 100, 0x10),
            },
            ReadSegment {
                position: 132,
                segment: seg(2, 4096, 0x2000),
            },
            ReadSegment {
                position: 132,
                segment: seg(3, 904, 0x9000),
            },
        ];
        let writes = vec![vec![seg(4, 8192, 0x4000)], vec![seg(5, 1, 2), seg(6, 3, 4)]];
        let reply = [seg(7, 1024, 0x7000)];
        let mut b = build_header(0xdead_beef, 128, Proc::NoMsg, &reads, &writes, Some(&reply));
        let len = b.len();
        b.extend_from_slice(b"rpc message");
        let h = parse_header(&b).unwrap();
        assert_eq!(
            (h.xid, h.vers, h.credits, h.proc),
            (0xdead_beef, 1, 128, Proc::NoMsg)
        );
        assert_eq!(h.reads, reads);
        assert_eq!(h.writes, writes);
        assert_eq!(h.reply.as_deref(), Some(&reply[..]));
        assert_eq!(h.header_len, len);
        // 16 fixed bytes, 3 read entries of 4+4+16, end, 2 write chunks, end, reply chunk.
        assert_eq!(len, 16 + 3 * 24 + 4 + (8 + 16) + (8 + 32) + 4 + (8 + 16));
        assert_eq!(
            h.read_chunks(),
            vec![
                (0, vec![seg(1, 100, 0x10)]),
                (132, vec![seg(2, 4096, 0x2000), seg(3, 904, 0x9000)])
            ]
        );
    }

    #[test]
    fn hand_written_bytes_decode_field_by_field() {
        // RDMA_MSG, empty read list, one write chunk of one segment, no reply chunk.
        let b = words(&[9, 1, 32, 0, 0, 1, 1, 0xabcd, 512, 0, 0x1000, 0, 0]);
        let h = parse_header(&b).unwrap();
        assert_eq!(h.writes, vec![vec![seg(0xabcd, 512, 0x1000)]]);
        assert_eq!(h.header_len, b.len());
        // RDMA_ERROR ERR_VERS 1..1, and ERR_CHUNK.
        let e = parse_header(&words(&[9, 1, 0, 4, 1, 1, 1])).unwrap();
        assert_eq!(e.proc, Proc::Error(ErrorBody::Vers { low: 1, high: 1 }));
        let e = parse_header(&words(&[9, 1, 0, 4, 2])).unwrap();
        assert_eq!((e.proc, e.header_len), (Proc::Error(ErrorBody::Chunk), 20));
        assert_eq!(
            parse_header(&words(&[9, 1, 0, 3])).unwrap().proc,
            Proc::Done
        );
    }

    #[test]
    fn every_cut_and_bad_value_is_an_error() {
        let full = build_header(
            1,
            2,
            Proc::Msg,
            &[ReadSegment {
                position: 8,
                segment: seg(1, 2, 3),
            }],
            &[vec![seg(4, 5, 6)]],
            Some(&[seg(7, 8, 9)]),
        );
        for n in 0..full.len() {
            assert!(
                matches!(parse_header(&full[..n]), Err(RpcRdmaError::Short(_))),
                "cut at {n}"
            );
        }
        assert_eq!(
            parse_header(&words(&[1, 2, 0, 0])),
            Err(RpcRdmaError::Version(2))
        );
        assert_eq!(
            parse_header(&words(&[1, 1, 0, 0, 7])),
            Err(RpcRdmaError::Discriminator {
                what: "read list",
                value: 7
            })
        );
        // A write chunk claiming 4 billion segments fails on the bytes, not on an allocation.
        assert!(matches!(
            parse_header(&words(&[1, 1, 0, 0, 0, 1, u32::MAX, 1, 2, 3, 4])),
            Err(RpcRdmaError::Short(_))
        ));
        assert_eq!(
            parse_header(&words(&[1, 1, 0, 9])).unwrap().proc,
            Proc::Unknown(9)
        );
    }

    #[test]
    fn rpc_call_and_replies() {
        // NFSv3 WRITE with AUTH_SYS (a 24-byte body) and AUTH_NONE verifier.
        let mut call = words(&[0x1234, 0, 2, 100_003, 3, 7, 1, 21]);
        call.extend_from_slice(&[0xaa; 24]); // 21 bytes padded to 24
        call.extend_from_slice(&words(&[0, 0, 0xfeed]));
        assert_eq!(
            parse_rpc(&call),
            Ok(RpcMessage {
                xid: 0x1234,
                body: RpcBody::Call {
                    program: 100_003,
                    version: 3,
                    procedure: 7,
                    cred_flavor: 1
                },
                // The arguments start after the verifier: the 0xfeed word.
                body_at: call.len() - 4,
            })
        );
        for n in 0..call.len() - 4 {
            assert!(parse_rpc(&call[..n]).is_err(), "cut at {n}");
        }
        let ok = words(&[0x1234, 1, 0, 0, 0, 0]);
        let m = parse_rpc(&ok).unwrap();
        assert_eq!(m.body, RpcBody::Reply(ReplyStatus::Accepted(0)));
        assert_eq!(ReplyStatus::Accepted(0).name(), "SUCCESS");
        let denied = parse_rpc(&words(&[5, 1, 1, 1, 5])).unwrap();
        assert_eq!(denied.body, RpcBody::Reply(ReplyStatus::Denied(1)));
        assert_eq!(parse_rpc(&words(&[5, 2])), Err(RpcRdmaError::MsgType(2)));
        assert_eq!(
            parse_rpc(&words(&[5, 0, 3])),
            Err(RpcRdmaError::RpcVersion(3))
        );
        assert_eq!(
            parse_rpc(&words(&[5, 0, 2, 1, 1, 1, 1, 401])),
            Err(RpcRdmaError::AuthTooLong(401))
        );
    }
}
