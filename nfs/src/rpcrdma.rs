//! RPC-over-RDMA version 1 (RFC 8166) transport headers, and the
//! connection private data of RFC 8797.
//!
//! Every header a peer sends is hostile: [`Header::decode`] checks each
//! count against a limit and against the bytes that remain, and fails with
//! a typed [`DecodeError`] instead of panicking.

use std::fmt;

use crate::xdr::{DResult, DecodeError, DecodeErrorKind, Reader, Writer};

/// The protocol version this crate speaks.
pub const VERSION: u32 = 1;
/// `RDMA_MSG`: the RPC message follows the header inline.
pub const RDMA_MSG: u32 = 0;
/// `RDMA_NOMSG`: the RPC message is in a position-zero read chunk (call)
/// or the reply chunk (reply).
pub const RDMA_NOMSG: u32 = 1;
/// `RDMA_MSGP` (not used by version 1 peers).
pub const RDMA_MSGP: u32 = 2;
/// `RDMA_DONE` (not used by version 1 peers).
pub const RDMA_DONE: u32 = 3;
/// `RDMA_ERROR`.
pub const RDMA_ERROR: u32 = 4;
/// `ERR_VERS`: the peer does not speak this version.
pub const ERR_VERS: u32 = 1;
/// `ERR_CHUNK`: the peer could not handle the chunks.
pub const ERR_CHUNK: u32 = 2;
/// The default inline threshold of both directions (RFC 8166 §3.3.2).
pub const DEFAULT_INLINE: usize = 1024;
/// The bytes of a header with no chunks: xid, vers, credits, proc and
/// three empty lists.
pub const MIN_HEADER: usize = 28;
/// The most read segments, write chunks and segments per chunk a header
/// may carry (this client sends far fewer; a peer that sends more is
/// refused).
pub const MAX_SEGMENTS: usize = 64;

/// One RDMA segment: memory the peer may read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// The rkey.
    pub handle: u32,
    /// Its length in bytes (in a reply's write chunk: the bytes written).
    pub length: u32,
    /// Its address.
    pub offset: u64,
}

/// A read list entry: a segment and where its data belongs in the XDR
/// stream of the RPC message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadSegment {
    /// XDR stream position (0: the whole message).
    pub position: u32,
    /// The segment.
    pub segment: Segment,
}

/// A header's chunk lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chunks {
    /// The read list.
    pub read: Vec<ReadSegment>,
    /// The write list: each chunk a list of segments.
    pub write: Vec<Vec<Segment>>,
    /// The reply chunk.
    pub reply: Option<Vec<Segment>>,
}

/// What an `RDMA_ERROR` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdmaError {
    /// `ERR_VERS`: the versions the peer speaks.
    Vers {
        /// Lowest.
        low: u32,
        /// Highest.
        high: u32,
    },
    /// `ERR_CHUNK`.
    Chunk,
}

impl fmt::Display for RdmaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RdmaError::Vers { low, high } => write!(
                f,
                "RDMA_ERROR ERR_VERS: the server speaks RPC-over-RDMA versions {low}..={high}"
            ),
            RdmaError::Chunk => write!(
                f,
                "RDMA_ERROR ERR_CHUNK: the server could not process the chunks"
            ),
        }
    }
}

/// The body of a transport header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// `RDMA_MSG`: chunks, then the RPC message inline.
    Msg(Chunks),
    /// `RDMA_NOMSG`: chunks only.
    NoMsg(Chunks),
    /// `RDMA_ERROR`.
    Error(RdmaError),
}

/// An RPC-over-RDMA transport header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The RPC's xid.
    pub xid: u32,
    /// The protocol version (1).
    pub vers: u32,
    /// Credits requested (call) or granted (reply).
    pub credits: u32,
    /// What follows.
    pub body: Body,
}

fn encode_segment(w: &mut Writer, s: &Segment) {
    w.u32(s.handle).u32(s.length).u64(s.offset);
}

fn encode_write_chunk(w: &mut Writer, c: &[Segment]) {
    w.u32(c.len() as u32);
    for s in c {
        encode_segment(w, s);
    }
}

fn decode_segment(r: &mut Reader<'_>) -> DResult<Segment> {
    Ok(Segment {
        handle: r.u32("segment handle")?,
        length: r.u32("segment length")?,
        offset: r.u64("segment offset")?,
    })
}

fn decode_write_chunk(r: &mut Reader<'_>, what: &'static str) -> DResult<Vec<Segment>> {
    let n = r.count(what, MAX_SEGMENTS, 16)?;
    (0..n).map(|_| decode_segment(r)).collect()
}

/// A list's "another item follows" flag, with the list's length limit.
fn more(r: &mut Reader<'_>, what: &'static str, seen: usize) -> DResult<bool> {
    let at = r.pos();
    let m = r.bool(what)?;
    if m && seen >= MAX_SEGMENTS {
        return Err(DecodeError {
            what,
            at,
            kind: DecodeErrorKind::TooLong {
                len: seen as u64 + 1,
                max: MAX_SEGMENTS as u64,
            },
        });
    }
    Ok(m)
}

impl Chunks {
    fn encode(&self, w: &mut Writer) {
        for s in &self.read {
            w.bool(true).u32(s.position);
            encode_segment(w, &s.segment);
        }
        w.bool(false);
        for c in &self.write {
            w.bool(true);
            encode_write_chunk(w, c);
        }
        w.bool(false);
        match &self.reply {
            Some(c) => {
                w.bool(true);
                encode_write_chunk(w, c);
            }
            None => {
                w.bool(false);
            }
        }
    }

    fn decode(r: &mut Reader<'_>) -> DResult<Chunks> {
        let mut c = Chunks::default();
        while more(r, "read list", c.read.len())? {
            let position = r.u32("read segment position")?;
            let segment = decode_segment(r)?;
            c.read.push(ReadSegment { position, segment });
        }
        while more(r, "write list", c.write.len())? {
            c.write.push(decode_write_chunk(r, "write chunk")?);
        }
        if r.bool("reply chunk")? {
            c.reply = Some(decode_write_chunk(r, "reply chunk")?);
        }
        Ok(c)
    }
}

impl Header {
    /// Appends the header (the RPC message of an `RDMA_MSG` follows it).
    pub fn encode(&self, w: &mut Writer) {
        w.u32(self.xid).u32(self.vers).u32(self.credits);
        match &self.body {
            Body::Msg(c) => {
                w.u32(RDMA_MSG);
                c.encode(w);
            }
            Body::NoMsg(c) => {
                w.u32(RDMA_NOMSG);
                c.encode(w);
            }
            Body::Error(e) => {
                w.u32(RDMA_ERROR);
                match e {
                    RdmaError::Vers { low, high } => {
                        w.u32(ERR_VERS).u32(*low).u32(*high);
                    }
                    RdmaError::Chunk => {
                        w.u32(ERR_CHUNK);
                    }
                }
            }
        }
    }

    /// Decodes a header; returns it and its length (where an `RDMA_MSG`'s
    /// RPC message starts).
    ///
    /// A version other than 1 decodes only as far as the version: the
    /// caller answers it (RFC 8166 §4.4), so the body is
    /// `Body::Error(RdmaError::Vers)` then only if the peer sent that.
    ///
    /// # Errors
    /// [`DecodeError`]: a header cut short, an unknown procedure, a list
    /// longer than [`MAX_SEGMENTS`] or than the bytes that remain, a
    /// boolean that is neither 0 nor 1.
    pub fn decode(buf: &[u8]) -> DResult<(Header, usize)> {
        let mut r = Reader::new(buf);
        let xid = r.u32("rpcrdma xid")?;
        let vers = r.u32("rpcrdma vers")?;
        let credits = r.u32("rpcrdma credits")?;
        let at = r.pos();
        let proc_ = r.u32("rpcrdma proc")?;
        if vers != VERSION && proc_ != RDMA_ERROR {
            return Err(DecodeError {
                what: "rpcrdma vers",
                at: 4,
                kind: DecodeErrorKind::BadValue(vers.into()),
            });
        }
        let body = match proc_ {
            RDMA_MSG => Body::Msg(Chunks::decode(&mut r)?),
            RDMA_NOMSG => Body::NoMsg(Chunks::decode(&mut r)?),
            RDMA_ERROR => {
                let at = r.pos();
                match r.u32("rdma_error code")? {
                    ERR_VERS => Body::Error(RdmaError::Vers {
                        low: r.u32("rdma_error vers low")?,
                        high: r.u32("rdma_error vers high")?,
                    }),
                    ERR_CHUNK => Body::Error(RdmaError::Chunk),
                    v => {
                        return Err(DecodeError {
                            what: "rdma_error code",
                            at,
                            kind: DecodeErrorKind::BadValue(v.into()),
                        })
                    }
                }
            }
            v => {
                return Err(DecodeError {
                    what: "rpcrdma proc",
                    at,
                    kind: DecodeErrorKind::BadValue(v.into()),
                })
            }
        };
        let len = r.pos();
        Ok((
            Header {
                xid,
                vers,
                credits,
                body,
            },
            len,
        ))
    }
}

/// RFC 8797's connection private data: magic.
pub const CP_MAGIC: u32 = 0xf6ab_0e18;
/// RFC 8797: the peer may send with invalidate.
pub const CP_FLAG_REMOTE_INVALIDATE: u8 = 1;

/// RFC 8797 private data: each side's inline sizes, in the connect
/// request and the accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectPrivate {
    /// The version (1).
    pub version: u8,
    /// `CP_FLAG_*`.
    pub flags: u8,
    /// The largest message the sender of this data sends inline.
    pub send_size: usize,
    /// The largest message it receives inline.
    pub recv_size: usize,
}

/// An inline size as the 8-bit field encodes it: KiB minus one, so 1 KiB
/// to 256 KiB; sizes are rounded down to a KiB.
fn size_code(bytes: usize) -> u8 {
    u8::try_from((bytes >> 10).clamp(1, 256) - 1).unwrap_or(u8::MAX)
}

impl ConnectPrivate {
    /// The 8 bytes on the wire.
    pub fn encode(&self) -> [u8; 8] {
        let m = CP_MAGIC.to_be_bytes();
        [
            m[0],
            m[1],
            m[2],
            m[3],
            self.version,
            self.flags,
            size_code(self.send_size),
            size_code(self.recv_size),
        ]
    }

    /// Reads a peer's private data: `None` when it is not RFC 8797's (too
    /// short, another magic, another version): the peer then has the
    /// default inline sizes.
    pub fn decode(b: &[u8]) -> Option<ConnectPrivate> {
        let b = b.get(..8)?;
        if u32::from_be_bytes([b[0], b[1], b[2], b[3]]) != CP_MAGIC || b[4] != 1 {
            return None;
        }
        Some(ConnectPrivate {
            version: b[4],
            flags: b[5],
            send_size: (usize::from(b[6]) + 1) << 10,
            recv_size: (usize::from(b[7]) + 1) << 10,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(h: u32) -> Segment {
        Segment {
            handle: h,
            length: h * 10,
            offset: u64::from(h) << 32,
        }
    }

    fn headers() -> Vec<Header> {
        vec![
            Header {
                xid: 1,
                vers: 1,
                credits: 32,
                body: Body::Msg(Chunks::default()),
            },
            Header {
                xid: 2,
                vers: 1,
                credits: 8,
                body: Body::Msg(Chunks {
                    read: vec![ReadSegment {
                        position: 124,
                        segment: seg(3),
                    }],
                    write: vec![vec![seg(4), seg(5)]],
                    reply: Some(vec![seg(6)]),
                }),
            },
            Header {
                xid: 3,
                vers: 1,
                credits: 1,
                body: Body::NoMsg(Chunks {
                    read: vec![
                        ReadSegment {
                            position: 0,
                            segment: seg(7),
                        },
                        ReadSegment {
                            position: 0,
                            segment: seg(8),
                        },
                    ],
                    write: vec![],
                    reply: None,
                }),
            },
            Header {
                xid: 4,
                vers: 1,
                credits: 0,
                body: Body::Error(RdmaError::Vers { low: 1, high: 1 }),
            },
            Header {
                xid: 5,
                vers: 1,
                credits: 0,
                body: Body::Error(RdmaError::Chunk),
            },
        ]
    }

    #[test]
    fn every_header_round_trips_and_every_cut_fails() {
        for h in headers() {
            let mut w = Writer::new();
            h.encode(&mut w);
            let (back, len) = Header::decode(&w.buf).unwrap();
            assert_eq!(back, h);
            assert_eq!(len, w.len());
            for cut in 0..w.len() {
                assert!(Header::decode(&w.buf[..cut]).is_err(), "{h:?} cut at {cut}");
            }
        }
        let mut w = Writer::new();
        headers()[0].encode(&mut w);
        assert_eq!(w.len(), MIN_HEADER);
    }

    #[test]
    fn malformed_headers_are_typed_errors() {
        let base = |proc_: u32| {
            let mut w = Writer::new();
            w.u32(1).u32(1).u32(1).u32(proc_);
            w
        };
        // Unknown procedures, and MSGP/DONE, which version 1 does not use.
        for p in [RDMA_MSGP, RDMA_DONE, 5, u32::MAX] {
            let mut w = base(p);
            w.u32(0).u32(0).u32(0);
            let e = Header::decode(&w.buf).unwrap_err();
            assert_eq!(e.what, "rpcrdma proc");
        }
        // Version 2 with a message.
        let mut w = Writer::new();
        w.u32(1).u32(2).u32(1).u32(RDMA_MSG).u32(0).u32(0).u32(0);
        assert_eq!(Header::decode(&w.buf).unwrap_err().what, "rpcrdma vers");
        // A list flag of 2.
        let mut w = base(RDMA_MSG);
        w.u32(2);
        assert!(matches!(
            Header::decode(&w.buf).unwrap_err().kind,
            DecodeErrorKind::BadValue(2)
        ));
        // A write chunk claiming 2^32-1 segments.
        let mut w = base(RDMA_MSG);
        w.u32(0).u32(1).u32(u32::MAX);
        assert!(matches!(
            Header::decode(&w.buf).unwrap_err().kind,
            DecodeErrorKind::TooLong { .. }
        ));
        // A read list of more than MAX_SEGMENTS entries.
        let mut w = base(RDMA_MSG);
        for _ in 0..=MAX_SEGMENTS {
            w.u32(1).u32(0);
            encode_segment(&mut w, &seg(1));
        }
        w.u32(0).u32(0).u32(0);
        assert!(matches!(
            Header::decode(&w.buf).unwrap_err().kind,
            DecodeErrorKind::TooLong { .. }
        ));
        // An unknown RDMA_ERROR code.
        let mut w = base(RDMA_ERROR);
        w.u32(9);
        assert_eq!(Header::decode(&w.buf).unwrap_err().what, "rdma_error code");
    }

    #[test]
    fn private_data_sizes() {
        let p = ConnectPrivate {
            version: 1,
            flags: 0,
            send_size: 4096,
            recv_size: 1 << 20,
        };
        let b = p.encode();
        assert_eq!(&b[..4], &[0xf6, 0xab, 0x0e, 0x18]);
        assert_eq!(b[6], 3);
        // 1 MiB does not fit: the largest size, 256 KiB.
        assert_eq!(b[7], 255);
        let back = ConnectPrivate::decode(&b).unwrap();
        assert_eq!((back.send_size, back.recv_size), (4096, 256 << 10));
        assert_eq!(ConnectPrivate::decode(&b[..7]), None);
        let mut other = b;
        other[0] = 0;
        assert_eq!(ConnectPrivate::decode(&other), None);
        other = b;
        other[4] = 2;
        assert_eq!(ConnectPrivate::decode(&other), None);
    }
}
