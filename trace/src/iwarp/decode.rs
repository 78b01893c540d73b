//! The MPA framing of a connection's two TCP directions: their Request and Reply frames,
//! then FPDUs, markers taken out and CRCs checked ([`Decoder`]).

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

use serde::Serialize;

use super::{
    crc32c, parse_ddp, Fpdu, MpaFrame, MpaUnit, Pdu, StreamKey, MARKER_INTERVAL, REPLY_KEY,
    REQUEST_KEY,
};
use crate::bytes::Short;
use crate::tcp::{Chunk, Half, TcpLimits};

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
/// [`Assembler`](super::Assembler) makes RDMAP messages of the units.
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
