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

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::bytes::{hex, Reader, Short};
use crate::reasm::{FlowKey, Kind, Limits, Message};
use crate::tcp::{Chunk, Half, TcpLimits};

/// The key of an MPA Request frame.
pub const REQUEST_KEY: &[u8; 16] = b"MPA ID Req Frame";
/// The key of an MPA Reply frame.
pub const REPLY_KEY: &[u8; 16] = b"MPA ID Rep Frame";
/// Bytes between MPA markers.
pub const MARKER_INTERVAL: u64 = 512;

/// CRC32c (Castagnoli, reflected polynomial 0x82f63b78), as MPA uses it.
pub fn crc32c(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0x82f6_3b78
                } else {
                    c >> 1
                };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    let mut c = !0u32;
    for &b in data {
        c = TABLE[usize::from((c as u8) ^ b)] ^ (c >> 8);
    }
    !c
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
    #[serde(serialize_with = "crate::ser_hex")]
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
    #[serde(serialize_with = "crate::ser_hex")]
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the Request or Reply frame.
    Start,
    /// FPDUs.
    Full,
    /// Not decoded any more.
    Lost,
}

/// One direction's MPA state.
#[derive(Debug)]
struct Direction {
    tcp: Half,
    phase: Phase,
    /// Bytes not yet framed, starting at stream offset `buf_offset`, with the frame of each
    /// piece (offset where it starts, frame).
    buf: Vec<u8>,
    buf_offset: u64,
    frames: VecDeque<(u64, u64)>,
    /// The frame this direction sent.
    frame: Option<MpaFrame>,
    /// Stream offset of the first FPDU (markers count from it).
    fpdu_start: u64,
    /// Whether this direction carries markers, and CRCs (known once both frames are seen).
    markers: bool,
    crcs: bool,
    /// Not an MPA stream: its first bytes were no MPA frame key.
    not_mpa: bool,
}

impl Direction {
    fn new() -> Self {
        Direction {
            tcp: Half::default(),
            phase: Phase::Start,
            buf: Vec::new(),
            buf_offset: 0,
            frames: VecDeque::new(),
            frame: None,
            fpdu_start: 0,
            markers: false,
            crcs: false,
            not_mpa: false,
        }
    }

    /// The frame that carried the byte at stream offset `off`.
    fn frame_at(&self, off: u64) -> u64 {
        self.frames
            .iter()
            .take_while(|&&(o, _)| o <= off)
            .last()
            .map_or(0, |&(_, f)| f)
    }
}

/// Counters of the iWARP decoder.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct IwarpStats {
    /// TCP connections that began with an MPA Request.
    pub connections: u64,
    /// FPDUs decoded.
    pub fpdus: u64,
    /// FPDUs whose CRC did not match.
    pub crc_errors: u64,
    /// TCP segments retransmitted (wholly before the next expected byte).
    pub retransmitted: u64,
    /// TCP segments that overlapped bytes already seen.
    pub overlapping: u64,
    /// TCP segments that arrived ahead of a gap.
    pub out_of_order: u64,
    /// Bytes the capture missed (gaps given up).
    pub lost_bytes: u64,
}

/// A TCP segment as [`Decoder::push`] takes it.
#[derive(Clone, Copy, Debug)]
pub struct Segment<'a> {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Sequence number.
    pub seq: u32,
    /// SYN flag.
    pub syn: bool,
    /// Payload.
    pub payload: &'a [u8],
}

/// Limits of the iWARP decoder.
#[derive(Clone, Copy, Debug)]
pub struct IwarpLimits {
    /// TCP reassembly.
    pub tcp: TcpLimits,
    /// Bytes of a stream kept while an FPDU is incomplete (an FPDU is at most 64 KiB plus
    /// markers, so more is a broken stream).
    pub max_frame: usize,
    /// TCP directions tracked; the least recently used is dropped beyond it.
    pub max_streams: usize,
}

impl Default for IwarpLimits {
    fn default() -> Self {
        IwarpLimits {
            tcp: TcpLimits::default(),
            max_frame: 80 << 10,
            max_streams: 4096,
        }
    }
}

/// A piece of a stream in order: offset, then data with its frame, or the length of a gap.
type Item = (u64, Option<(u64, Vec<u8>)>, u64);

/// Frames TCP segments into MPA units. Feed segments in capture order with
/// [`Decoder::push`]; [`Decoder::finish`] frames what the capture ended with. An
/// [`Assembler`] makes RDMAP messages of the units.
///
/// ```
/// use rdma_trace::iwarp::{build_fpdu, build_frame, build_untagged, Assembler, Decoder, Segment};
///
/// let (a, b) = ([10, 8, 0, 1].into(), [10, 8, 0, 2].into());
/// let seg = |from_a: bool, seq: u32, syn: bool, payload: &'static [u8]| Segment {
///     src: if from_a { a } else { b },
///     dst: if from_a { b } else { a },
///     src_port: if from_a { 40000 } else { 7174 },
///     dst_port: if from_a { 7174 } else { 40000 },
///     seq,
///     syn,
///     payload,
/// };
/// let req: &'static [u8] = build_frame(true, false, true, b"").leak();
/// let rep: &'static [u8] = build_frame(false, false, false, b"").leak();
/// // A Send of "hi" (queue 0, MSN 1, offset 0, last), with a CRC.
/// let send: &'static [u8] =
///     build_fpdu(&build_untagged(3, true, (0, 0, 1, 0), b"hi"), 0, false, true).leak();
/// let (mut dec, mut asm) = (Decoder::new(), Assembler::new());
/// let mut units = Vec::new();
/// for (n, s) in [
///     seg(true, 99, true, b""),
///     seg(false, 499, true, b""),
///     seg(true, 100, false, req),
///     seg(false, 500, false, rep),
///     seg(true, 100 + req.len() as u32, false, send),
/// ]
/// .iter()
/// .enumerate()
/// {
///     dec.push(n as u64 + 1, s, &mut |p, payload| {
///         units.push(p.clone());
///         asm.push(p, payload);
///     });
/// }
/// assert_eq!(units.len(), 3); // Request, Reply, FPDU
/// let msgs: Vec<_> = asm.drain().collect();
/// assert_eq!((msgs[0].length, msgs[0].tcp_ports), (2, Some((40000, 7174))));
/// ```
#[derive(Debug, Default)]
pub struct Decoder {
    dirs: HashMap<StreamKey, Direction>,
    /// Last use of each direction, for the bound on directions.
    used: HashMap<StreamKey, u64>,
    clock: u64,
    stats: IwarpStats,
    limits: IwarpLimits,
}

impl Decoder {
    /// A decoder with the default limits.
    pub fn new() -> Self {
        Self::default()
    }

    /// A decoder with the given limits.
    pub fn with_limits(limits: IwarpLimits) -> Self {
        Decoder {
            limits,
            ..Self::default()
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> IwarpStats {
        let mut s = self.stats;
        for d in self.dirs.values() {
            s.retransmitted += d.tcp.stats.retransmitted;
            s.overlapping += d.tcp.stats.overlapping;
            s.out_of_order += d.tcp.stats.out_of_order;
            s.lost_bytes += d.tcp.stats.lost;
        }
        s
    }

    /// Bytes held: streams' unframed bytes and TCP segments ahead of gaps.
    pub fn held(&self) -> usize {
        self.dirs.values().map(|d| d.buf.len() + d.tcp.kept()).sum()
    }

    /// Feeds one TCP segment of frame `frame`; calls `out` with each MPA unit it completes.
    pub fn push(&mut self, frame: u64, s: &Segment<'_>, out: &mut dyn FnMut(&Pdu, &[u8])) {
        let key = StreamKey {
            src: s.src,
            src_port: s.src_port,
            dst: s.dst,
            dst_port: s.dst_port,
        };
        self.clock += 1;
        if !self.dirs.contains_key(&key) {
            if !s.syn
                && !s.payload.starts_with(&REQUEST_KEY[..4])
                && !self.dirs.contains_key(&key.reverse())
            {
                // Not the start of an iWARP connection, and not the other side of one.
                return;
            }
            if self.dirs.len() >= self.limits.max_streams {
                self.evict();
            }
            self.dirs.insert(key, Direction::new());
        }
        self.used.insert(key, self.clock);
        let limits = self.limits;
        let Some(dir) = self.dirs.get_mut(&key) else {
            return;
        };
        if dir.not_mpa {
            return;
        }
        let mut chunks: Vec<(u64, u64, Vec<u8>)> = Vec::new();
        let mut gaps: Vec<(u64, u64)> = Vec::new();
        dir.tcp.push(
            frame,
            s.seq,
            s.syn,
            s.payload,
            &limits.tcp,
            &mut |c| match c {
                Chunk::Data {
                    offset,
                    frame,
                    data,
                } => chunks.push((offset, frame, data.to_vec())),
                Chunk::Gap { offset, len } => gaps.push((offset, len)),
            },
        );
        if chunks.is_empty() && gaps.is_empty() {
            return;
        }
        self.feed(key, chunks, gaps, out);
    }

    fn evict(&mut self) {
        if let Some((&k, _)) = self.used.iter().min_by_key(|(_, &t)| t) {
            self.used.remove(&k);
            self.dirs.remove(&k);
        }
    }

    fn feed(
        &mut self,
        key: StreamKey,
        chunks: Vec<(u64, u64, Vec<u8>)>,
        gaps: Vec<(u64, u64)>,
        out: &mut dyn FnMut(&Pdu, &[u8]),
    ) {
        // Chunks and gaps come in stream order; interleave them by offset.
        let mut items: Vec<Item> = chunks
            .into_iter()
            .map(|(o, f, d)| (o, Some((f, d)), 0))
            .chain(gaps.into_iter().map(|(o, l)| (o, None, l)))
            .collect();
        items.sort_by_key(|i| i.0);
        for (offset, data, gap) in items {
            let Some(dir) = self.dirs.get_mut(&key) else {
                return;
            };
            match data {
                Some((frame, d)) => {
                    if dir.phase == Phase::Lost {
                        continue;
                    }
                    if dir.buf.is_empty() {
                        dir.buf_offset = offset;
                        dir.frames.clear();
                    }
                    dir.frames.push_back((offset, frame));
                    dir.buf.extend_from_slice(&d);
                    self.frame_units(key, out);
                }
                None => {
                    if dir.phase != Phase::Lost {
                        let why = format!(
                            "{gap} bytes of the TCP stream are not in the capture (from offset {offset})"
                        );
                        let first = dir.frame_at(dir.buf_offset);
                        dir.phase = Phase::Lost;
                        dir.buf.clear();
                        let pdu = Pdu {
                            frame: first,
                            first_frame: first,
                            src: key.src,
                            dst: key.dst,
                            src_port: key.src_port,
                            dst_port: key.dst_port,
                            stream_offset: offset,
                            unit: MpaUnit::Lost { why },
                        };
                        out(&pdu, &[]);
                    }
                }
            }
        }
    }

    /// Frames every whole MPA unit at the start of the direction's buffer.
    fn frame_units(&mut self, key: StreamKey, out: &mut dyn FnMut(&Pdu, &[u8])) {
        let max_frame = self.limits.max_frame;
        loop {
            let peer = self.dirs.get(&key.reverse()).and_then(|d| d.frame.clone());
            let Some(dir) = self.dirs.get_mut(&key) else {
                return;
            };
            let framed = match dir.phase {
                Phase::Start => frame_request_reply(dir, peer.as_ref()),
                // Markers and CRCs depend on the peer's frame too: FPDUs wait for it (a
                // conforming initiator sends none before the Reply anyway).
                Phase::Full if peer.is_none() => Framed::NeedMore,
                Phase::Full => frame_fpdu(dir),
                Phase::Lost => {
                    dir.buf.clear();
                    return;
                }
            };
            match framed {
                Framed::NeedMore => {
                    if dir.buf.len() > max_frame {
                        let unit = MpaUnit::Lost {
                            why: format!(
                                "{} bytes without a whole MPA unit (a length out of sync)",
                                dir.buf.len()
                            ),
                        };
                        dir.phase = Phase::Lost;
                        let f = dir.frame_at(dir.buf_offset);
                        let pdu = pdu(key, f, f, dir.buf_offset, unit);
                        dir.buf.clear();
                        out(&pdu, &[]);
                    }
                    return;
                }
                Framed::NotMpa => {
                    dir.not_mpa = true;
                    dir.buf.clear();
                    return;
                }
                Framed::Unit { len, unit, payload } => {
                    let start = dir.buf_offset;
                    let first = dir.frame_at(start);
                    let last = dir.frame_at(start + len as u64 - 1);
                    if let MpaUnit::Frame(f) = &unit {
                        if f.request {
                            self.stats.connections += 1;
                        }
                    }
                    if let MpaUnit::Fpdu(f) = &unit {
                        self.stats.fpdus += 1;
                        if f.crc_ok == Some(false) {
                            self.stats.crc_errors += 1;
                        }
                    }
                    let p = pdu(key, first, last, start, unit);
                    let payload = payload
                        .as_ref()
                        .map_or(&[][..], |(a, b)| dir.buf.get(*a..*b).unwrap_or(&[]));
                    // A marker-stripped ULPDU was built apart.
                    out(&p, payload);
                    let Some(dir) = self.dirs.get_mut(&key) else {
                        return;
                    };
                    dir.buf.drain(..len.min(dir.buf.len()));
                    dir.buf_offset += len as u64;
                    while dir.frames.len() > 1
                        && dir.frames.get(1).is_some_and(|&(o, _)| o <= dir.buf_offset)
                    {
                        dir.frames.pop_front();
                    }
                    // The peer's markers and CRCs depend on this direction's frame too.
                    let own = dir.frame.clone();
                    let is_frame = matches!(p.unit, MpaUnit::Frame(_));
                    if let Some(reverse) = self.dirs.get_mut(&key.reverse()) {
                        negotiate(reverse, own.as_ref());
                        if is_frame && !reverse.buf.is_empty() {
                            self.frame_units(key.reverse(), out);
                        }
                    }
                }
            }
        }
    }

    /// Ends the capture: directions with bytes left unframed report them.
    pub fn finish(&mut self, out: &mut dyn FnMut(&Pdu, &[u8])) {
        let mut keys: Vec<StreamKey> = self.dirs.keys().copied().collect();
        keys.sort();
        for key in keys {
            let mut chunks = Vec::new();
            let mut gaps = Vec::new();
            if let Some(d) = self.dirs.get_mut(&key) {
                d.tcp.finish(&mut |c| match c {
                    Chunk::Data {
                        offset,
                        frame,
                        data,
                    } => chunks.push((offset, frame, data.to_vec())),
                    Chunk::Gap { offset, len } => gaps.push((offset, len)),
                });
            }
            self.feed(key, chunks, gaps, out);
            if let Some(d) = self.dirs.get_mut(&key) {
                if !d.buf.is_empty() && d.phase != Phase::Lost && !d.not_mpa {
                    let f = d.frame_at(d.buf_offset);
                    let unit = MpaUnit::Lost {
                        why: format!(
                            "the capture ended inside an MPA unit ({} bytes of it)",
                            d.buf.len()
                        ),
                    };
                    let p = pdu(key, f, f, d.buf_offset, unit);
                    d.buf.clear();
                    out(&p, &[]);
                }
            }
        }
    }
}

fn pdu(key: StreamKey, first: u64, last: u64, offset: u64, unit: MpaUnit) -> Pdu {
    Pdu {
        frame: last,
        first_frame: first,
        src: key.src,
        dst: key.dst,
        src_port: key.src_port,
        dst_port: key.dst_port,
        stream_offset: offset,
        unit,
    }
}

// Returned once per unit and consumed at once.
#[allow(clippy::large_enum_variant)]
enum Framed {
    NeedMore,
    NotMpa,
    Unit {
        /// Stream bytes it took.
        len: usize,
        unit: MpaUnit,
        /// Where its DDP payload lies in the buffer (no markers inside it), if anywhere.
        payload: Option<(usize, usize)>,
    },
}

fn frame_request_reply(dir: &mut Direction, peer: Option<&MpaFrame>) -> Framed {
    let b = &dir.buf;
    let Some(key) = b.get(..16) else {
        // Not enough to tell yet; a stream whose first bytes already differ is not MPA.
        let n = b.len();
        if REQUEST_KEY[..n] != b[..] && REPLY_KEY[..n] != b[..] {
            return Framed::NotMpa;
        }
        return Framed::NeedMore;
    };
    let request = key == REQUEST_KEY;
    if !request && key != REPLY_KEY {
        return Framed::NotMpa;
    }
    let Some(&[flags, rev, l0, l1]) = b.get(16..20).and_then(|s| <&[u8; 4]>::try_from(s).ok())
    else {
        return Framed::NeedMore;
    };
    let pd_len = usize::from(u16::from_be_bytes([l0, l1]));
    let Some(private) = b.get(20..20 + pd_len) else {
        return Framed::NeedMore;
    };
    let f = MpaFrame {
        request,
        markers: flags & 0x80 != 0,
        crc: flags & 0x40 != 0,
        reject: flags & 0x20 != 0,
        res: flags & 0x1f,
        rev,
        private: private.to_vec(),
    };
    dir.frame = Some(f.clone());
    dir.phase = Phase::Full;
    dir.fpdu_start = dir.buf_offset + 20 + pd_len as u64;
    negotiate(dir, peer);
    Framed::Unit {
        len: 20 + pd_len,
        unit: MpaUnit::Frame(f),
        payload: None,
    }
}

/// Markers and CRCs of a direction, from its own frame and its peer's.
fn negotiate(dir: &mut Direction, peer: Option<&MpaFrame>) {
    let own = dir.frame.as_ref();
    dir.crcs = own.is_some_and(|f| f.crc) || peer.is_some_and(|f| f.crc);
    // The receiver's frame asks for markers in what it receives.
    dir.markers = peer.is_some_and(|f| f.markers);
}

/// Bytes of the stream from `start` (an offset into the buffer) with markers taken out, until
/// `want` bytes are gathered: returns the bytes, the raw length they took and the markers'
/// pointers. `None` when the buffer ends first.
fn unmark(dir: &Direction, start: usize, want: usize) -> Option<(Vec<u8>, usize, Vec<u16>)> {
    let mut outb = Vec::with_capacity(want);
    let mut markers = Vec::new();
    let mut i = start;
    while outb.len() < want {
        let off = dir.buf_offset + i as u64;
        if dir.markers && off >= dir.fpdu_start && (off - dir.fpdu_start) % MARKER_INTERVAL == 0 {
            let m = dir.buf.get(i..i + 4)?;
            markers.push(u16::from_be_bytes([m[2], m[3]]));
            i += 4;
            continue;
        }
        // Copy up to the next marker.
        let to_marker = if dir.markers {
            let rel = off.saturating_sub(dir.fpdu_start);
            usize::try_from(MARKER_INTERVAL - rel % MARKER_INTERVAL).unwrap_or(usize::MAX)
        } else {
            usize::MAX
        };
        let n = (want - outb.len()).min(to_marker);
        let s = dir.buf.get(i..i + n)?;
        outb.extend_from_slice(s);
        i += n;
    }
    Some((outb, i - start, markers))
}

fn frame_fpdu(dir: &mut Direction) -> Framed {
    if dir.markers {
        return frame_fpdu_marked(dir);
    }
    let b = &dir.buf;
    let Some(&[l0, l1]) = b.get(..2).and_then(|s| <&[u8; 2]>::try_from(s).ok()) else {
        return Framed::NeedMore;
    };
    let ulpdu_len = u16::from_be_bytes([l0, l1]);
    let body = 2 + usize::from(ulpdu_len);
    let pad = (4 - body % 4) % 4;
    let total = body + pad + 4;
    let Some(whole) = b.get(..total) else {
        return Framed::NeedMore;
    };
    let crc_field = &whole[total - 4..];
    let crc = u32::from_be_bytes([crc_field[0], crc_field[1], crc_field[2], crc_field[3]]);
    let crc_ok = dir
        .crcs
        .then(|| crc32c(&whole[..total - 4]).swap_bytes() == crc);
    let ulpdu = &whole[2..body];
    let (ddp, ddp_error, payload) = match parse_ddp(ulpdu) {
        Ok((d, p)) => {
            let at = body - p.len();
            (Some(d), None, Some((at, body)))
        }
        Err(s) => (None, Some(short(s)), None),
    };
    Framed::Unit {
        len: total,
        unit: MpaUnit::Fpdu(Fpdu {
            ulpdu_len,
            pad: pad as u8,
            markers: Vec::new(),
            crc,
            crc_ok,
            ddp,
            ddp_error,
        }),
        payload,
    }
}

fn short(s: Short) -> String {
    format!("{} cut short: {} of {} bytes", s.what, s.have, s.need)
}

fn frame_fpdu_marked(dir: &mut Direction) -> Framed {
    let Some((len_bytes, _, _)) = unmark(dir, 0, 2) else {
        return Framed::NeedMore;
    };
    let ulpdu_len = u16::from_be_bytes([len_bytes[0], len_bytes[1]]);
    let body = 2 + usize::from(ulpdu_len);
    let pad = (4 - body % 4) % 4;
    let Some((clean, raw_len, markers)) = unmark(dir, 0, body + pad + 4) else {
        return Framed::NeedMore;
    };
    let Some(raw) = dir.buf.get(..raw_len) else {
        return Framed::NeedMore;
    };
    let n = clean.len();
    let crc = u32::from_be_bytes([clean[n - 4], clean[n - 3], clean[n - 2], clean[n - 1]]);
    // The CRC covers the FPDU as sent, markers included.
    let crc_ok = dir
        .crcs
        .then(|| crc32c(&raw[..raw_len - 4]).swap_bytes() == crc);
    let ulpdu = &clean[2..body];
    let (ddp, ddp_error) = match parse_ddp(ulpdu) {
        Ok((d, _)) => (Some(d), None),
        Err(s) => (None, Some(short(s))),
    };
    // The payload has markers taken out: hand it over in place of the buffer's bytes by
    // rewriting the buffer's front (it is dropped right after).
    let payload = ddp.as_ref().map(|d| {
        let at = body - d.payload_len;
        dir.buf.splice(
            ..raw_len,
            clean
                .iter()
                .copied()
                .chain(std::iter::repeat_n(0, raw_len - n)),
        );
        (at, body)
    });
    Framed::Unit {
        len: raw_len,
        unit: MpaUnit::Fpdu(Fpdu {
            ulpdu_len,
            pad: pad as u8,
            markers,
            crc,
            crc_ok,
            ddp,
            ddp_error,
        }),
        payload,
    }
}

/// An RDMAP message being put together.
#[derive(Debug)]
struct Open {
    kind: Kind,
    first_frame: u64,
    last_frame: u64,
    hasher: Sha256,
    /// Bytes hashed so far, in order.
    length: u64,
    segments: u32,
    /// Untagged: message offset of the next byte; tagged: its tagged offset.
    next: u64,
    /// Where the message ends, once its last segment was seen (same space as `next`).
    end: Option<u64>,
    /// Segments ahead of a gap, by offset: data and whether it is the last.
    pending: std::collections::BTreeMap<u64, Vec<u8>>,
    stag: Option<u32>,
    to: Option<u64>,
    read: Option<ReadRequest>,
    msn: Option<u32>,
    invalidate: Option<u32>,
    duplicates: u32,
    out_of_order: u32,
    data: Option<Vec<u8>>,
    deferred: bool,
    touched: u64,
    /// When it was opened (the assembler's clock): its place in [`Assembler::order`].
    opened: u64,
}

/// Whether an entry of an order queue (`Assembler::order`) is still an open message's.
fn is_live(&(at, k): &(u64, OpenKey), open: &HashMap<OpenKey, Open>) -> bool {
    open.get(&k).is_some_and(|o| o.opened == at)
}

/// Takes the oldest live entry off an order queue (skipping those of closed messages).
fn pop_live(q: &mut VecDeque<(u64, OpenKey)>, open: &HashMap<OpenKey, Open>) -> Option<OpenKey> {
    while let Some(e) = q.pop_front() {
        if is_live(&e, open) {
            return Some(e.1);
        }
    }
    None
}

/// Where an open message is kept: a direction and either an untagged queue's MSN or a
/// steering tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum OpenKey {
    Untagged(StreamKey, u32, u32),
    Tagged(StreamKey, u32),
}

impl OpenKey {
    /// The direction it goes.
    fn stream(self) -> StreamKey {
        match self {
            OpenKey::Untagged(s, ..) | OpenKey::Tagged(s, _) => s,
        }
    }
}

/// Counters of the iWARP message assembler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AssemblerStats {
    /// DDP segments fed in.
    pub segments: u64,
    /// Messages completed.
    pub complete: u64,
    /// Messages reported incomplete.
    pub incomplete: u64,
    /// Segments already seen (a message offset or tagged offset behind the message).
    pub duplicates: u64,
    /// Segments that arrived ahead of a gap.
    pub out_of_order: u64,
    /// RDMAP Terminate messages.
    pub terminates: u64,
    /// Messages whose kept payload was dropped to stay within [`Limits::max_kept`].
    pub data_dropped: u64,
    /// Messages given up to stay within [`Limits::max_pending_total`] or
    /// [`Limits::max_requests`] open messages.
    pub open_dropped: u64,
}

/// Puts DDP segments back together into RDMAP messages: untagged ones (Sends) by direction,
/// queue number, MSN and message offset; tagged ones (RDMA Writes, Read Responses) by
/// direction, steering tag and tagged offset; a Read Response is matched to the oldest
/// outstanding Read Request of the reverse direction with its data sink STag and offset, and
/// comes out as a READ with the request's data source STag, offset and size (as RoCE READs
/// carry their RETH). Messages are the same [`Message`] as RoCE's, with `tcp_ports` set.
#[derive(Debug, Default)]
pub struct Assembler {
    open: HashMap<OpenKey, Open>,
    /// Outstanding Read Requests by the direction they went (requester to responder).
    reads: HashMap<StreamKey, VecDeque<(u64, ReadRequest)>>,
    read_count: usize,
    out: Vec<Message>,
    stats: AssemblerStats,
    limits: Limits,
    clock: u64,
    /// Open messages in the order they were opened, with when: the oldest is found in
    /// amortised constant time (entries of messages since closed are skipped, and the queue
    /// compacted when they are most of it).
    order: VecDeque<(u64, OpenKey)>,
    /// Each direction's open messages: how many, and in the order they were opened (as
    /// `order`), for [`Limits::max_open`] per direction.
    per_stream: HashMap<StreamKey, (usize, VecDeque<(u64, OpenKey)>)>,
    /// Capacity of the open messages' payload buffers ([`Limits::max_kept`]).
    kept: usize,
    /// Segments ahead of a gap over all open messages ([`Limits::max_pending_total`]).
    pending_total: usize,
}

/// Outstanding Read Requests kept per direction: an RDMA connection allows a few dozen (its
/// ORD), and a Read Response is matched by a scan of its direction's.
const MAX_READS_PER_STREAM: usize = 1024;

impl Assembler {
    /// An assembler with the default limits.
    pub fn new() -> Self {
        Self::default()
    }

    /// An assembler with the given limits (`keep_data` and `hash_kept` as for RoCE;
    /// `max_requests` bounds open messages and outstanding Read Requests, `max_pending` the
    /// segments a message keeps ahead of a gap).
    pub fn with_limits(limits: Limits) -> Self {
        Assembler {
            limits,
            ..Self::default()
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> AssemblerStats {
        self.stats
    }

    /// Messages completed (or given up) since the last call.
    pub fn drain(&mut self) -> std::vec::Drain<'_, Message> {
        self.out.drain(..)
    }

    /// Open messages and outstanding Read Requests.
    pub fn outstanding(&self) -> usize {
        self.open.len() + self.read_count
    }

    /// Feeds one MPA unit with its DDP payload (as [`Decoder`] hands them).
    pub fn push(&mut self, p: &Pdu, payload: &[u8]) {
        let MpaUnit::Fpdu(f) = &p.unit else {
            return;
        };
        let Some(d) = &f.ddp else {
            return;
        };
        self.stats.segments += 1;
        self.clock += 1;
        let key = StreamKey {
            src: p.src,
            src_port: p.src_port,
            dst: p.dst,
            dst_port: p.dst_port,
        };
        match (d.tagged, d.qn, d.opcode) {
            (false, Some(1), _) => {
                if let Some(r) = d.read {
                    let q = self.reads.entry(key).or_default();
                    q.push_back((p.frame, r));
                    self.read_count += 1;
                    if q.len() > MAX_READS_PER_STREAM {
                        if let Some((f, r)) = q.pop_front() {
                            self.read_count -= 1;
                            self.unanswered(key, f, r);
                        }
                    }
                    if self.read_count > self.limits.max_requests {
                        self.drop_oldest_read();
                    }
                }
            }
            (false, Some(2), _) => self.stats.terminates += 1,
            (false, Some(qn), _) => {
                let msn = d.msn.unwrap_or(0);
                let ok = OpenKey::Untagged(key, qn, msn);
                if !self.open.contains_key(&ok) {
                    let o = self.new_open(Kind::Send, p.first_frame, None, None, None);
                    self.insert_open(ok, o);
                }
                let inval = matches!(d.opcode, 4 | 6).then_some(d.rsvd_ulp).flatten();
                if let Some(o) = self.open.get_mut(&ok) {
                    o.msn = Some(msn);
                    if d.last {
                        o.invalidate = inval;
                    }
                }
                self.segment(ok, u64::from(d.mo.unwrap_or(0)), d.last, p.frame, payload);
            }
            (true, _, op) => {
                let stag = d.stag.unwrap_or(0);
                let to = d.to.unwrap_or(0);
                let ok = OpenKey::Tagged(key, stag);
                let kind = if op == 2 { Kind::Read } else { Kind::Write };
                let continues = self
                    .open
                    .get(&ok)
                    .is_some_and(|o| o.kind == kind && o.next == to);
                if !continues {
                    if let Some(o) = self.open.remove(&ok) {
                        self.emit(
                            o,
                            ok,
                            Some("a new message began before its last segment".into()),
                        );
                    }
                    let (first, read) = if kind == Kind::Read {
                        match self.take_read(key.reverse(), stag, to) {
                            Some((f, r)) => (f, Some(r)),
                            None => (p.first_frame, None),
                        }
                    } else {
                        (p.first_frame, None)
                    };
                    let o = self.new_open(kind, first, Some(stag), Some(to), read);
                    self.insert_open(ok, o);
                }
                self.segment(ok, to, d.last, p.frame, payload);
            }
            _ => {}
        }
    }

    fn new_open(
        &mut self,
        kind: Kind,
        first_frame: u64,
        stag: Option<u32>,
        to: Option<u64>,
        read: Option<ReadRequest>,
    ) -> Open {
        let keep = self.limits.keep_data;
        let data = (keep > 0)
            .then(|| {
                // Never more than `reasm::RESERVE` from the size a Read Request claims.
                let want = read.map_or(0, |r| u64::from(r.size)).min(keep);
                let cap = usize::try_from(want)
                    .unwrap_or(usize::MAX)
                    .min(crate::reasm::RESERVE);
                if self.kept + cap > self.limits.max_kept {
                    self.stats.data_dropped += 1;
                    return None;
                }
                self.kept += cap;
                Some(Vec::with_capacity(cap))
            })
            .flatten();
        Open {
            kind,
            first_frame,
            last_frame: first_frame,
            hasher: Sha256::new(),
            length: 0,
            segments: 0,
            next: to.unwrap_or(0),
            end: None,
            pending: Default::default(),
            stag,
            to,
            read,
            msn: None,
            invalidate: None,
            duplicates: 0,
            out_of_order: 0,
            data,
            deferred: keep > 0 && !self.limits.hash_kept && kind != Kind::Send,
            touched: self.clock,
            opened: self.clock,
        }
    }

    /// Opens a message. Past [`Limits::max_open`] in its direction (a direction carries one
    /// message at a time, and a Read Response beside it), or [`Limits::max_requests`] over
    /// all, the one opened first there is given up.
    fn insert_open(&mut self, k: OpenKey, o: Open) {
        let stream = k.stream();
        let entry = (o.opened, k);
        self.order.push_back(entry);
        self.open.insert(k, o);
        let (n, q) = self.per_stream.entry(stream).or_default();
        *n += 1;
        q.push_back(entry);
        let crowded = *n > self.limits.max_open;
        if crowded {
            let oldest = pop_live(q, &self.open);
            if let Some(k) = oldest {
                self.give_up_open(k, "given up: too many messages open in its direction");
            }
        }
        if self.open.len() > self.limits.max_requests {
            if let Some(k) = pop_live(&mut self.order, &self.open) {
                self.give_up_open(k, "given up: too many messages open");
            }
        }
        let open = &self.open;
        if self.order.len() > 2 * open.len() + 64 {
            self.order.retain(|e| is_live(e, open));
        }
        if let Some((n, q)) = self.per_stream.get_mut(&stream) {
            if q.len() > 2 * *n + 64 {
                q.retain(|e| is_live(e, open));
            }
        }
    }

    fn give_up_open(&mut self, k: OpenKey, why: &str) {
        if let Some(o) = self.open.remove(&k) {
            self.stats.open_dropped += 1;
            self.emit(o, k, Some(why.into()));
        }
    }

    fn take_read(
        &mut self,
        requester: StreamKey,
        stag: u32,
        to: u64,
    ) -> Option<(u64, ReadRequest)> {
        let q = self.reads.get_mut(&requester)?;
        let i = q
            .iter()
            .position(|(_, r)| r.sink_stag == stag && r.sink_to == to)?;
        let r = q.remove(i)?;
        self.read_count -= 1;
        Some(r)
    }

    fn drop_oldest_read(&mut self) {
        let oldest = self
            .reads
            .iter()
            .filter_map(|(k, q)| q.front().map(|(f, _)| (*f, *k)))
            .min();
        if let Some((_, k)) = oldest {
            if let Some((f, r)) = self.reads.get_mut(&k).and_then(VecDeque::pop_front) {
                self.read_count -= 1;
                self.unanswered(k, f, r);
            }
        }
    }

    fn unanswered(&mut self, requester: StreamKey, frame: u64, r: ReadRequest) {
        self.stats.incomplete += 1;
        let resp = requester.reverse();
        self.out.push(Message {
            kind: Kind::Read,
            flow: FlowKey {
                src: resp.src,
                dst: resp.dst,
                qp: 0,
            },
            src_qp: None,
            first_psn: 0,
            last_psn: 0,
            packets: 0,
            first_frame: frame,
            last_frame: frame,
            length: 0,
            sha256: None,
            rkey: Some(r.src_stag),
            va: Some(r.src_to),
            dma_len: Some(r.size),
            imm: None,
            invalidate: None,
            atomic: None,
            duplicates: 0,
            out_of_order: 0,
            incomplete: Some("READ request without a response".into()),
            data: None,
            tcp_ports: Some((resp.src_port, resp.dst_port)),
        });
    }

    /// Places one segment of an open message at `at` (message or tagged offset).
    fn segment(&mut self, k: OpenKey, at: u64, last: bool, frame: u64, payload: &[u8]) {
        let keep = crate::reasm::Keep {
            per_message: self.limits.keep_data,
            budget: self.limits.max_kept,
        };
        let max_pending = self.limits.max_pending;
        let clock = self.clock;
        let Some(o) = self.open.get_mut(&k) else {
            return;
        };
        let kept = &mut self.kept;
        let stats = &mut self.stats;
        o.touched = clock;
        o.last_frame = frame;
        let end = at.saturating_add(payload.len() as u64);
        if last {
            o.end = Some(end);
        }
        if end <= o.next && !(payload.is_empty() && at == o.next) {
            o.duplicates += 1;
            self.stats.duplicates += 1;
        } else if at > o.next {
            o.out_of_order += 1;
            stats.out_of_order += 1;
            if o.pending.insert(at, payload.to_vec()).is_none() {
                self.pending_total += 1;
            }
            if o.pending.len() > max_pending || self.pending_total > self.limits.max_pending_total {
                if let Some(o) = self.open.remove(&k) {
                    self.stats.open_dropped += 1;
                    self.emit(o, k, Some("too many segments ahead of a gap".into()));
                }
                return;
            }
        } else {
            let skip = usize::try_from(o.next - at).unwrap_or(usize::MAX);
            absorb(o, payload.get(skip..).unwrap_or(&[]), keep, kept, stats);
            while let Some(e) = o.pending.first_entry() {
                if *e.key() > o.next {
                    break;
                }
                let (at, d) = e.remove_entry();
                self.pending_total -= 1;
                let skip = usize::try_from(o.next - at).unwrap_or(usize::MAX);
                if let Some(rest) = d.get(skip..) {
                    absorb(o, rest, keep, kept, stats);
                }
            }
        }
        if o.end.is_some_and(|e| o.next >= e) && o.pending.is_empty() {
            if let Some(o) = self.open.remove(&k) {
                self.emit(o, k, None);
            }
        }
    }

    fn emit(&mut self, o: Open, k: OpenKey, why: Option<String>) {
        // What it held leaves the open messages (its data with the message, to its consumer).
        self.kept -= o.data.as_ref().map_or(0, Vec::capacity);
        self.pending_total -= o.pending.len();
        if let std::collections::hash_map::Entry::Occupied(mut e) =
            self.per_stream.entry(k.stream())
        {
            e.get_mut().0 -= 1;
            if e.get().0 == 0 {
                e.remove();
            }
        }
        let stream = k.stream();
        let incomplete = why.or_else(|| {
            if o.kind == Kind::Read && o.read.is_none() {
                Some("READ response without its request in the capture".into())
            } else {
                match o.read {
                    Some(r) if u64::from(r.size) != o.length => Some(format!(
                        "{} bytes where the Read Request asked for {}",
                        o.length, r.size
                    )),
                    _ => None,
                }
            }
        });
        if incomplete.is_some() {
            self.stats.incomplete += 1;
        } else {
            self.stats.complete += 1;
        }
        let sha256 = (incomplete.is_none() && !o.deferred).then(|| hex(&o.hasher.finalize()));
        let (rkey, va, dma_len) = match (o.kind, o.read) {
            (Kind::Read, Some(r)) => (Some(r.src_stag), Some(r.src_to), Some(r.size)),
            _ => (o.stag, o.to, None),
        };
        let msn = o.msn.unwrap_or(0);
        self.out.push(Message {
            kind: o.kind,
            flow: FlowKey {
                src: stream.src,
                dst: stream.dst,
                qp: 0,
            },
            src_qp: None,
            first_psn: msn,
            last_psn: msn,
            packets: o.segments,
            first_frame: o.first_frame,
            last_frame: o.last_frame,
            length: o.length,
            sha256,
            rkey,
            va,
            dma_len,
            imm: None,
            invalidate: o.invalidate,
            atomic: None,
            duplicates: o.duplicates,
            out_of_order: o.out_of_order,
            incomplete,
            data: o.data,
            tcp_ports: Some((stream.src_port, stream.dst_port)),
        });
    }

    /// Ends the capture: open messages and unanswered Read Requests are reported incomplete.
    pub fn finish(&mut self) {
        let mut open: Vec<(OpenKey, Open)> = self.open.drain().collect();
        open.sort_by_key(|(_, o)| o.first_frame);
        for (k, o) in open {
            self.emit(o, k, Some("capture ended before its last segment".into()));
        }
        let mut reads: Vec<(u64, StreamKey, ReadRequest)> = self
            .reads
            .drain()
            .flat_map(|(k, q)| q.into_iter().map(move |(f, r)| (f, k, r)))
            .collect();
        reads.sort_by_key(|r| r.0);
        self.read_count = 0;
        for (f, k, r) in reads {
            self.unanswered(k, f, r);
        }
    }
}

/// Hashes (and keeps, within `keep`) `d` into `o`; `kept` is the capacity of the open
/// messages' buffers, kept up to date (as `reasm`'s `hash_one`).
fn absorb(
    o: &mut Open,
    d: &[u8],
    keep: crate::reasm::Keep,
    kept: &mut usize,
    stats: &mut AssemblerStats,
) {
    let keeps = match &o.data {
        Some(v) if (v.len() + d.len()) as u64 <= keep.per_message => {
            let fits = v.len() + d.len() <= v.capacity();
            let grown = (v.len() + d.len()).max(v.capacity() * 2);
            fits || *kept - v.capacity() + grown <= keep.budget || {
                stats.data_dropped += 1;
                false
            }
        }
        _ => false,
    };
    match &mut o.data {
        Some(v) if keeps => {
            let before = v.capacity();
            v.extend_from_slice(d);
            *kept = *kept - before + v.capacity();
            if !o.deferred {
                o.hasher.update(d);
            }
        }
        Some(_) => {
            // Too long to keep, or past the budget: what was kept unhashed is hashed now,
            // the rest as it comes.
            if let Some(v) = o.data.take() {
                if o.deferred {
                    o.hasher.update(&v[..]);
                    o.deferred = false;
                }
                *kept -= v.capacity();
            }
            o.hasher.update(d);
        }
        None => o.hasher.update(d),
    }
    o.length += d.len() as u64;
    o.next += d.len() as u64;
    o.segments += 1;
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

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 4] = [10, 8, 0, 1];
    const B: [u8; 4] = [10, 8, 0, 2];

    fn sha(b: &[u8]) -> Option<String> {
        Some(hex(&Sha256::digest(b)))
    }

    #[test]
    fn crc32c_check_value() {
        // The CRC-32C check value (the CRC of "123456789").
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    /// A TCP stream's segments: (from A?, sequence number, payload).
    type Seg = (bool, u32, Vec<u8>);

    fn run(segs: &[Seg]) -> (Vec<Pdu>, Vec<Message>, IwarpStats, AssemblerStats) {
        let mut dec = Decoder::new();
        let mut asm = Assembler::new();
        let mut pdus = Vec::new();
        let mut push = |p: &Pdu, payload: &[u8]| {
            pdus.push(p.clone());
            asm.push(p, payload);
        };
        for (i, (from_a, seq, payload)) in segs.iter().enumerate() {
            let (src, dst, sp, dp) = if *from_a {
                (A, B, 40000, 5000)
            } else {
                (B, A, 5000, 40000)
            };
            let s = Segment {
                src: src.into(),
                dst: dst.into(),
                src_port: sp,
                dst_port: dp,
                seq: *seq,
                syn: payload.is_empty(),
                payload,
            };
            dec.push(i as u64 + 1, &s, &mut push);
        }
        dec.finish(&mut push);
        asm.finish();
        let msgs = asm.drain().collect();
        (pdus, msgs, dec.stats(), asm.stats())
    }

    #[test]
    fn a_connection_with_crcs_markers_reordered_segments_and_every_message_kind() {
        // A asks for markers in what it receives and for CRCs; B for neither: CRCs both ways,
        // markers from B to A only.
        let req = build_frame(true, true, true, b"hello");
        let rep = build_frame(false, false, false, b"");
        let data: Vec<u8> = (0..3000u32).map(|i| (i % 253) as u8).collect();
        let mut a = req.clone();
        let a_start = a.len();
        let push_a = |a: &mut Vec<u8>, ulpdu: Vec<u8>| {
            let f = build_fpdu(&ulpdu, (a.len() - a_start) as u64, false, true);
            a.extend_from_slice(&f);
        };
        // A Send in two DDP segments, a Read Request, a Send with Invalidate.
        push_a(
            &mut a,
            build_untagged(3, false, (0, 0, 1, 0), &data[..1500]),
        );
        push_a(
            &mut a,
            build_untagged(3, true, (0, 0, 1, 1500), &data[1500..]),
        );
        let rr = [
            0x11u32.to_be_bytes().as_slice(),
            &0x1000u64.to_be_bytes(),
            &1000u32.to_be_bytes(),
            &0x22u32.to_be_bytes(),
            &0x9000u64.to_be_bytes(),
        ]
        .concat();
        push_a(&mut a, build_untagged(1, true, (0, 1, 1, 0), &rr));
        push_a(&mut a, build_untagged(4, true, (0x77, 0, 2, 0), b"bye"));
        // B: the Read Response (1000 bytes: markers fall inside it) and a Terminate.
        let mut b = rep.clone();
        let b_start = b.len();
        let read: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let f = build_fpdu(&build_tagged(2, true, 0x11, 0x1000, &read), 0, true, true);
        b.extend_from_slice(&f);
        let term = build_untagged(7, true, (0, 2, 1, 0), &[0x01, 0x02, 0x00, 0x00]);
        let f2 = build_fpdu(&term, (b.len() - b_start) as u64, true, true);
        b.extend_from_slice(&f2);
        // A's stream cut into 700-byte segments, the second sent after the third and again.
        let isn_a = 0xffff_ff00u32; // wraps inside the stream
        let isn_b = 77u32;
        let mut segs: Vec<Seg> = vec![(true, isn_a, vec![]), (false, isn_b, vec![])];
        let pieces: Vec<(u32, Vec<u8>)> = a
            .chunks(700)
            .enumerate()
            .map(|(i, c)| (isn_a.wrapping_add(1 + 700 * i as u32), c.to_vec()))
            .collect();
        segs.push((true, pieces[0].0, pieces[0].1.clone()));
        segs.push((false, isn_b + 1, b[..b_start].to_vec()));
        segs.push((true, pieces[2].0, pieces[2].1.clone()));
        segs.push((true, pieces[1].0, pieces[1].1.clone()));
        segs.push((true, pieces[1].0, pieces[1].1.clone()));
        for p in &pieces[3..] {
            segs.push((true, p.0, p.1.clone()));
        }
        segs.push((false, isn_b + 1 + b_start as u32, b[b_start..].to_vec()));
        let (pdus, msgs, stats, astats) = run(&segs);
        let names: Vec<String> = pdus
            .iter()
            .map(|p| match &p.unit {
                MpaUnit::Frame(f) => format!("frame {}", f.request),
                MpaUnit::Fpdu(f) => {
                    assert_eq!(f.crc_ok, Some(true), "{p:?}");
                    f.ddp.as_ref().unwrap().op_name().to_string()
                }
                MpaUnit::Lost { why } => why.clone(),
            })
            .collect();
        assert_eq!(
            names,
            [
                "frame true",
                "frame false",
                "SEND",
                "SEND",
                "RDMA_READ_REQUEST",
                "SEND_INVALIDATE",
                "RDMA_READ_RESPONSE",
                "TERMINATE"
            ]
        );
        let MpaUnit::Frame(f) = &pdus[0].unit else {
            panic!()
        };
        assert_eq!(
            (f.markers, f.crc, &f.private[..]),
            (true, true, &b"hello"[..])
        );
        // The Read Response holds three markers (0, 512, and 1024 just before its CRC: the CRC
        // covers it), each pointing back to the FPDU's start; the Terminate after it none.
        let marks: Vec<Vec<u16>> = pdus[6..]
            .iter()
            .map(|p| match &p.unit {
                MpaUnit::Fpdu(f) => f.markers.clone(),
                _ => vec![],
            })
            .collect();
        assert_eq!(marks.iter().map(Vec::len).collect::<Vec<_>>(), [3, 0]);
        assert_eq!(marks[0], [0, 512, 1024]);
        assert_eq!(stats.fpdus, 6);
        assert_eq!((stats.retransmitted, stats.out_of_order), (1, 1));
        assert_eq!(msgs.len(), 3, "{msgs:#?}");
        assert_eq!(
            (msgs[0].kind, msgs[0].length, msgs[0].packets),
            (Kind::Send, 3000, 2)
        );
        assert_eq!(msgs[0].sha256, sha(&data));
        assert_eq!(msgs[0].first_psn, 1);
        assert_eq!(msgs[0].tcp_ports, Some((40000, 5000)));
        assert_eq!(msgs[1].kind, Kind::Send);
        assert_eq!(
            (msgs[1].invalidate, msgs[1].sha256.clone()),
            (Some(0x77), sha(b"bye"))
        );
        let r = &msgs[2];
        assert_eq!(
            (r.kind, r.length, r.sha256.clone()),
            (Kind::Read, 1000, sha(&read))
        );
        assert_eq!(
            (r.rkey, r.va, r.dma_len),
            (Some(0x22), Some(0x9000), Some(1000))
        );
        assert_eq!(r.flow.src, IpAddr::from(B));
        assert_eq!(astats.terminates, 1);
    }

    #[test]
    fn a_bad_crc_a_gap_and_a_stream_cut_short_are_reported() {
        let mut a = build_frame(true, false, true, b"");
        let start = a.len();
        let mut f = build_fpdu(&build_tagged(0, true, 5, 0, b"abcd"), 0, false, true);
        let n = f.len();
        f[n - 6] ^= 1; // a payload byte
        a.extend_from_slice(&f);
        let good = build_fpdu(&build_tagged(0, true, 5, 4, b"efgh"), 0, false, true);
        a.extend_from_slice(&good);
        let cut = a.len();
        a.extend_from_slice(&good[..10]);
        // A's FPDUs come before B's Reply: they wait for it (markers and CRCs depend on it).
        let rep = build_frame(false, false, false, b"");
        let segs: Vec<Seg> = vec![
            (true, 9, vec![]),
            (false, 499, vec![]),
            (true, 10, a[..cut].to_vec()),
            (false, 500, rep),
            (true, 10 + cut as u32, a[cut..].to_vec()),
        ];
        let (pdus, msgs, stats, _) = run(&segs);
        assert_eq!(stats.crc_errors, 1);
        let MpaUnit::Fpdu(f) = &pdus[2].unit else {
            panic!("{pdus:?}")
        };
        assert_eq!(f.crc_ok, Some(false));
        assert_eq!(pdus[2].frame, 3);
        assert!(matches!(&pdus[4].unit, MpaUnit::Lost { why } if why.contains("ended")));
        assert_eq!(pdus.len(), 5);
        // Two one-segment WRITEs (the first altered: its digest is of what was captured).
        assert_eq!(msgs.len(), 2);
        assert!(msgs.iter().all(|m| m.incomplete.is_none()));
        let _ = start;

        // A gap the TCP reassembly gives up on: the direction is not decoded after it.
        let mut dec = Decoder::with_limits(IwarpLimits {
            tcp: TcpLimits { max_ahead: 100 },
            ..IwarpLimits::default()
        });
        let mut lost = Vec::new();
        fn mk(seq: u32, syn: bool, payload: &[u8]) -> Segment<'_> {
            Segment {
                src: A.into(),
                dst: B.into(),
                src_port: 1,
                dst_port: 2,
                seq,
                syn,
                payload,
            }
        }
        let req = build_frame(true, false, false, b"");
        dec.push(1, &mk(0, true, b""), &mut |_, _| {});
        dec.push(2, &mk(1, false, &req), &mut |_, _| {});
        dec.push(3, &mk(500, false, &[0; 150]), &mut |p, _| {
            lost.push(p.clone())
        });
        assert_eq!(lost.len(), 1);
        assert!(
            matches!(&lost[0].unit, MpaUnit::Lost { why } if why.contains("not in the capture"))
        );
        assert_eq!(dec.held(), 0);
        assert_eq!(dec.stats().lost_bytes, 500 - 1 - req.len() as u64);
    }

    #[test]
    fn tcp_that_is_not_mpa_is_left_alone() {
        let (pdus, msgs, stats, _) = run(&[
            (true, 1, vec![]),
            (true, 2, b"GET / HTTP/1.1\r\n\r\n".to_vec()),
        ]);
        assert!(pdus.is_empty() && msgs.is_empty());
        assert_eq!(stats.connections, 0);
    }
}
