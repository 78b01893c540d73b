//! iWARP over TCP: MPA (RFC 5044, with the revision 2 of RFC 6581) framing, DDP (RFC 5041)
//! and RDMAP (RFC 5040) headers, written from the RFCs.
//!
//! A connection's two TCP directions are put back in order by [`crate::tcp`]. Each direction
//! starts with an MPA Request (initiator) or Reply (responder) frame: a 16-byte key, flags
//! (markers wanted, CRC wanted, rejected), revision and private data. What follows are FPDUs:
//! a 16-bit ULPDU length, the ULPDU (a DDP segment), 0-3 bytes of padding to a multiple of four,
//! and a CRC32c; MPA markers (a 16-bit reserved field and a 16-bit pointer back to the start of
//! the FPDU they fall in) sit at every 512th byte of the stream, from the first FPDU on, in a
//! direction whose receiver asked for them (its frame's M flag). CRCs are in use when either
//! frame asked for them; they cover the FPDU, markers included, up to the CRC. The CRC field is
//! there when CRCs are not in use, but says nothing.
//!
//! A DDP segment is tagged (placed by a steering tag and a tagged offset: RDMA Write and Read
//! Response) or untagged (queue number, message sequence number and message offset: Send
//! variants on queue 0, Read Request on queue 1, Terminate on queue 2); its L flag marks the
//! last segment of a message. The second byte of the DDP header is RDMAP's: version and opcode.
//!
//! Here: the wire formats (MPA frames, DDP and RDMAP headers, the CRC) and builders of them for
//! tests and fixtures. `decode.rs`: a connection's MPA framing, TCP segments to units
//! ([`Decoder`]). `assemble.rs`: units to RDMAP messages ([`Assembler`]).

use std::net::IpAddr;

use serde::Serialize;

use crate::bytes::{Reader, Short};

/// The key of an MPA Request frame.
pub const REQUEST_KEY: &[u8; 16] = b"MPA ID Req Frame";
/// The key of an MPA Reply frame.
pub const REPLY_KEY: &[u8; 16] = b"MPA ID Rep Frame";
/// Bytes between MPA markers.
pub const MARKER_INTERVAL: u64 = 512;

/// CRC32c (Castagnoli, reflected polynomial 0x82f63b78), as MPA uses it: the `crc32c` crate's,
/// which uses the CPU's CRC32 instruction where there is one (SSE 4.2, Armv8's CRC extension)
/// and a table otherwise.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// An MPA Request or Reply frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MpaFrame {
    /// `true` for a Request, `false` for a Reply.
    pub request: bool,
    /// M: the sender wants markers in what it receives.
    pub markers: bool,
    /// C: the sender wants CRCs.
    pub crc: bool,
    /// R: the responder rejects the connection (Reply only).
    pub reject: bool,
    /// The five reserved bits.
    pub res: u8,
    /// Revision (1, or 2 with RFC 6581's enhanced connection setup).
    pub rev: u8,
    /// Private data.
    #[serde(serialize_with = "crate::bytes::ser_hex")]
    pub private: Vec<u8>,
}

/// An RDMAP Read Request's payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ReadRequest {
    /// Data sink steering tag (the requester's buffer).
    pub sink_stag: u32,
    /// Data sink tagged offset.
    pub sink_to: u64,
    /// Bytes to read.
    pub size: u32,
    /// Data source steering tag (the responder's buffer).
    pub src_stag: u32,
    /// Data source tagged offset.
    pub src_to: u64,
}

/// An RDMAP Terminate message's fixed part.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Terminate {
    /// Layer: 0 RDMAP, 1 DDP, 2 LLP (MPA).
    pub layer: u8,
    /// Error type.
    pub etype: u8,
    /// Error code.
    pub code: u8,
    /// M: the DDP segment length field is valid.
    pub hdr_m: bool,
    /// D: the terminated DDP header follows.
    pub hdr_d: bool,
    /// R: the terminated RDMAP header follows.
    pub hdr_r: bool,
    /// What follows the fixed part (segment length and headers).
    #[serde(serialize_with = "crate::bytes::ser_hex")]
    pub rest: Vec<u8>,
}

/// RDMAP opcodes (RFC 5040 section 4.2; 8-11 are RFC 7306's extensions).
pub fn opcode_name(op: u8) -> &'static str {
    match op {
        0 => "RDMA_WRITE",
        1 => "RDMA_READ_REQUEST",
        2 => "RDMA_READ_RESPONSE",
        3 => "SEND",
        4 => "SEND_INVALIDATE",
        5 => "SEND_SE",
        6 => "SEND_SE_INVALIDATE",
        7 => "TERMINATE",
        8 => "IMMEDIATE_DATA",
        9 => "IMMEDIATE_DATA_SE",
        10 => "ATOMIC_REQUEST",
        11 => "ATOMIC_RESPONSE",
        _ => "UNKNOWN",
    }
}

/// A DDP segment with its RDMAP header.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Ddp {
    /// T: tagged buffer model.
    pub tagged: bool,
    /// L: last segment of its message.
    pub last: bool,
    /// The four reserved bits of the DDP control byte.
    pub rsvd: u8,
    /// DDP version (1).
    pub dv: u8,
    /// RDMAP version (1).
    pub rv: u8,
    /// The two reserved bits of the RDMAP control byte.
    pub rdmap_rsvd: u8,
    /// RDMAP opcode.
    pub opcode: u8,
    /// Tagged: steering tag.
    pub stag: Option<u32>,
    /// Tagged: tagged offset.
    pub to: Option<u64>,
    /// Untagged: the 32 bits reserved for the ULP (the STag a Send with Invalidate invalidates).
    pub rsvd_ulp: Option<u32>,
    /// Untagged: queue number (0 Sends, 1 Read Requests, 2 Terminates).
    pub qn: Option<u32>,
    /// Untagged: message sequence number.
    pub msn: Option<u32>,
    /// Untagged: message offset.
    pub mo: Option<u32>,
    /// A Read Request's payload.
    pub read: Option<ReadRequest>,
    /// A Terminate's payload.
    pub terminate: Option<Terminate>,
    /// Payload bytes (after the headers).
    pub payload_len: usize,
}

impl Ddp {
    /// The RDMAP opcode's name.
    pub fn op_name(&self) -> &'static str {
        opcode_name(self.opcode)
    }
}

/// Parses a DDP segment (an FPDU's ULPDU); returns it and its payload.
pub fn parse_ddp(b: &[u8]) -> Result<(Ddp, &[u8]), Short> {
    let mut r = Reader::new(b);
    let ctl = r.u8("DDP control")?;
    let rctl = r.u8("RDMAP control")?;
    let tagged = ctl & 0x80 != 0;
    let mut d = Ddp {
        tagged,
        last: ctl & 0x40 != 0,
        rsvd: (ctl >> 2) & 0x0f,
        dv: ctl & 0x03,
        rv: rctl >> 6,
        rdmap_rsvd: (rctl >> 4) & 0x03,
        opcode: rctl & 0x0f,
        stag: None,
        to: None,
        rsvd_ulp: None,
        qn: None,
        msn: None,
        mo: None,
        read: None,
        terminate: None,
        payload_len: 0,
    };
    if tagged {
        d.stag = Some(r.u32("DDP tagged header")?);
        d.to = Some(r.u64("DDP tagged header")?);
    } else {
        d.rsvd_ulp = Some(r.u32("DDP untagged header")?);
        d.qn = Some(r.u32("DDP untagged header")?);
        d.msn = Some(r.u32("DDP untagged header")?);
        d.mo = Some(r.u32("DDP untagged header")?);
        if d.opcode == 1 {
            d.read = Some(ReadRequest {
                sink_stag: r.u32("RDMA Read Request")?,
                sink_to: r.u64("RDMA Read Request")?,
                size: r.u32("RDMA Read Request")?,
                src_stag: r.u32("RDMA Read Request")?,
                src_to: r.u64("RDMA Read Request")?,
            });
        } else if d.opcode == 7 {
            let t = r.u32("RDMAP Terminate")?;
            d.terminate = Some(Terminate {
                layer: (t >> 28) as u8,
                etype: ((t >> 24) & 0x0f) as u8,
                code: ((t >> 16) & 0xff) as u8,
                hdr_m: t & 0x8000 != 0,
                hdr_d: t & 0x4000 != 0,
                hdr_r: t & 0x2000 != 0,
                rest: r.rest().to_vec(),
            });
            r.take(r.rest().len(), "RDMAP Terminate")?;
        }
    }
    let payload = r.rest();
    d.payload_len = payload.len();
    Ok((d, payload))
}

/// An FPDU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Fpdu {
    /// ULPDU length.
    pub ulpdu_len: u16,
    /// Padding bytes.
    pub pad: u8,
    /// Markers inside it: each one's FPDU pointer.
    pub markers: Vec<u16>,
    /// The CRC field.
    pub crc: u32,
    /// The CRC check: `None` when CRCs are not in use on the connection.
    pub crc_ok: Option<bool>,
    /// The DDP segment.
    pub ddp: Option<Ddp>,
    /// Why the DDP segment did not decode.
    pub ddp_error: Option<String>,
}

/// One MPA unit of a stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "mpa", rename_all = "snake_case")]
pub enum MpaUnit {
    /// A Request or Reply frame.
    Frame(MpaFrame),
    /// An FPDU.
    Fpdu(Fpdu),
    /// Bytes that could not be framed: a stream not seen from its start, a gap in the capture,
    /// a frame key that does not match; the direction is not decoded after them.
    Lost {
        /// Why.
        why: String,
    },
}

/// An MPA unit with where it was found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Pdu {
    /// Frame holding its last byte.
    pub frame: u64,
    /// Frame holding its first byte.
    pub first_frame: u64,
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// TCP source port.
    pub src_port: u16,
    /// TCP destination port.
    pub dst_port: u16,
    /// Offset of its first byte in the TCP stream.
    pub stream_offset: u64,
    /// What it is.
    #[serde(flatten)]
    pub unit: MpaUnit,
}

/// A TCP endpoint pair, one direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamKey {
    /// Source address.
    pub src: IpAddr,
    /// Source port.
    pub src_port: u16,
    /// Destination address.
    pub dst: IpAddr,
    /// Destination port.
    pub dst_port: u16,
}

impl StreamKey {
    fn reverse(self) -> StreamKey {
        StreamKey {
            src: self.dst,
            src_port: self.dst_port,
            dst: self.src,
            dst_port: self.src_port,
        }
    }
}

/// Builds an MPA Request or Reply frame (tests and fixtures).
pub fn build_frame(request: bool, markers: bool, crc: bool, private: &[u8]) -> Vec<u8> {
    let mut v = if request { REQUEST_KEY } else { REPLY_KEY }.to_vec();
    v.push(u8::from(markers) << 7 | u8::from(crc) << 6);
    v.push(1);
    v.extend_from_slice(&u16::try_from(private.len()).unwrap_or(0).to_be_bytes());
    v.extend_from_slice(private);
    v
}

/// Builds an untagged DDP segment with its RDMAP header (tests and fixtures).
pub fn build_untagged(
    opcode: u8,
    last: bool,
    (rsvd_ulp, qn, msn, mo): (u32, u32, u32, u32),
    payload: &[u8],
) -> Vec<u8> {
    let mut v = vec![u8::from(last) << 6 | 1, 0x40 | (opcode & 0x0f)];
    for x in [rsvd_ulp, qn, msn, mo] {
        v.extend_from_slice(&x.to_be_bytes());
    }
    v.extend_from_slice(payload);
    v
}

/// Builds a tagged DDP segment with its RDMAP header (tests and fixtures).
pub fn build_tagged(opcode: u8, last: bool, stag: u32, to: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0x80 | u8::from(last) << 6 | 1, 0x40 | (opcode & 0x0f)];
    v.extend_from_slice(&stag.to_be_bytes());
    v.extend_from_slice(&to.to_be_bytes());
    v.extend_from_slice(payload);
    v
}

/// Builds the FPDU of `ulpdu` as it goes on the wire at `offset` bytes after the first FPDU of
/// its direction: with markers at every 512th byte from there when `markers`, and a CRC32c
/// when `crc` (else a zero CRC field). Tests and fixtures.
pub fn build_fpdu(ulpdu: &[u8], offset: u64, markers: bool, crc: bool) -> Vec<u8> {
    let mut clean = u16::try_from(ulpdu.len())
        .unwrap_or(0)
        .to_be_bytes()
        .to_vec();
    clean.extend_from_slice(ulpdu);
    while clean.len() % 4 != 0 {
        clean.push(0);
    }
    let mut raw = Vec::new();
    let marker = |raw: &mut Vec<u8>| {
        let at = offset + raw.len() as u64;
        if markers && at % MARKER_INTERVAL == 0 {
            let ptr = u16::try_from(raw.len()).unwrap_or(0);
            raw.extend_from_slice(&[0, 0]);
            raw.extend_from_slice(&ptr.to_be_bytes());
        }
    };
    for &b in &clean {
        marker(&mut raw);
        raw.push(b);
    }
    marker(&mut raw);
    let c = if crc { crc32c(&raw).swap_bytes() } else { 0 };
    raw.extend_from_slice(&c.to_be_bytes());
    raw
}

mod assemble;
mod decode;
#[cfg(test)]
mod tests;

pub use assemble::{Assembler, AssemblerStats};
pub use decode::{Decoder, IwarpLimits, IwarpStats, Segment};
