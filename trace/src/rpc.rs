//! RPC-over-RDMA reassembly: reassembled RDMA messages (from [`crate::reasm`]) into RPC calls
//! and replies with their chunks.
//!
//! The model is nfstest's (`packet.transport.rdmainfo`): an RPC message is made of chunks, a
//! chunk of segments identified by their handle (rkey), and a segment may be moved by several
//! RDMA operations (sub-segments: each RDMA WRITE or READ request with the segment's handle and
//! a shorter length, at an address further into it).
//!
//! - A call's SEND (RDMA_MSG or RDMA_NOMSG) announces its chunks: read chunks (the read list's
//!   segments grouped by XDR position), write chunks and a reply chunk. Each segment's handle is
//!   remembered until the call completes.
//! - RDMA READ responses (server reading the client's memory: the call's read chunks) and RDMA
//!   WRITEs (server writing into it: write chunks and the reply chunk) are matched to the
//!   segment by the client's address and the rkey, and placed by their address inside it. Each
//!   chunk's data is hashed in segment order and address order as soon as it is contiguous;
//!   data ahead of a gap is kept until the gap fills.
//! - The reply (matched to its call by client, server and XID) says how much of each write
//!   chunk and of the reply chunk was used; the RPC is complete when its reply is in and every
//!   chunk holds the bytes the call (read chunks) or the reply (write and reply chunks) says.
//! - Read chunks' data belongs at their XDR position in the call: a call with one read chunk
//!   gets the digest of the whole message, the inline part with the chunk's data (XDR-padded)
//!   spliced in at its position, hashed as the chunk's data comes. A position-zero read chunk
//!   (RDMA_NOMSG) or the reply chunk holds the whole RPC message, whose header is decoded from
//!   it. A call's reassembled length is its inline part plus its read chunks, a reply's its
//!   inline part plus its write chunks (or its reply chunk); where a write chunk's data sits in
//!   the reply is the upper protocol's business (NFS), so such a reply has chunk digests only.
//! - What never completes (a call without its reply, a reply without its call, a chunk missing
//!   data) is reported as incomplete, with why.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::IpAddr;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::bytes::hex;
use crate::reasm::{Kind, Message};
use crate::rpcrdma::{
    parse_header, parse_rpc, Header, Proc, ReplyStatus, RpcBody, RpcMessage, Segment,
};

/// Bytes of a position-zero read chunk or a reply chunk kept to decode the RPC header in it.
const HEAD: usize = 512;

/// What kind of chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChunkKind {
    /// A read chunk: the client's data the server READs, at an XDR position of the call.
    Read,
    /// A write chunk: the server WRITEs a reply's bulk data into it.
    Write,
    /// The reply chunk: the server WRITEs the whole reply into it.
    Reply,
}

/// One segment of a chunk, as reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SegmentReport {
    /// rkey.
    pub handle: u32,
    /// Address.
    pub offset: u64,
    /// Length the call offered.
    pub offered: u32,
    /// Length the reply says was used (write and reply chunks).
    pub used: Option<u32>,
    /// Bytes seen moving into (or out of) it.
    pub received: u64,
}

/// A chunk of an RPC, as reported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChunkReport {
    /// Read, write or reply chunk.
    pub kind: ChunkKind,
    /// Read chunks: the XDR position.
    pub position: Option<u32>,
    /// Its segments in order.
    pub segments: Vec<SegmentReport>,
    /// Bytes of the chunk reassembled in order.
    pub length: u64,
    /// SHA-256 of the chunk's data (segments in order); `None` unless it is complete.
    pub sha256: Option<String>,
}

/// One side (call or reply) of an RPC as its SEND carried it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Side {
    /// Frame number of the SEND's first packet (the one with the transport header).
    pub frame: u64,
    /// Frame number of its last packet.
    pub last_frame: u64,
    /// RPC-over-RDMA procedure (`RDMA_MSG`, `RDMA_NOMSG`, `RDMA_ERROR`).
    pub proc: &'static str,
    /// Credits asked for (call) or granted (reply).
    pub credits: u32,
    /// Bytes of the RPC message carried in the SEND after the transport header.
    pub inline: u64,
    /// The RPC message: inline part plus its chunks' data.
    pub length: u64,
    /// SHA-256 of the SEND's payload (transport header included).
    pub send_sha256: Option<String>,
    /// SHA-256 of the reassembled RPC message: the inline part with its read chunk spliced in
    /// at its XDR position (padded to 4 bytes), the position-zero read chunk or the reply chunk
    /// that holds it, or the inline part alone. `None` when it cannot be formed here: a reply
    /// with write chunks (where their data sits is the upper protocol's business), several
    /// read chunks, or a chunk incomplete.
    pub sha256: Option<String>,
}

/// An RPC call and its reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rpc {
    /// Transaction id.
    pub xid: u32,
    /// The caller.
    pub client: IpAddr,
    /// The server.
    pub server: IpAddr,
    /// RPC program (100003 for NFS).
    pub program: Option<u32>,
    /// Program version.
    pub version: Option<u32>,
    /// Procedure.
    pub procedure: Option<u32>,
    /// The reply's status: `SUCCESS`, ..., or `RDMA_ERROR ...`.
    pub status: Option<String>,
    /// The call's SEND.
    pub call: Option<Side>,
    /// The reply's SEND.
    pub reply: Option<Side>,
    /// The chunks: read chunks, write chunks, then the reply chunk.
    pub chunks: Vec<ChunkReport>,
    /// Copies of the call seen again while it was outstanding.
    pub retransmissions: u32,
    /// NFSv4 COMPOUND (program 100003, version 4, procedure 1): the operations the call asks
    /// for, by name, and `+N` when `N` more followed one whose arguments are not decoded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nfs_ops: Option<Vec<String>>,
    /// NFS (program 100003): the status the reply's results start with (`nfsstat3`, or
    /// `nfsstat4` for a COMPOUND), when the reply is an accepted success sent inline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nfs_status: Option<u32>,
    /// `None` when complete, else why not.
    pub incomplete: Option<String>,
}

/// Counters over the whole capture.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RpcStats {
    /// Calls seen.
    pub calls: u64,
    /// Replies seen.
    pub replies: u64,
    /// RPCs complete (call, reply, every chunk).
    pub complete: u64,
    /// RPCs reported incomplete.
    pub incomplete: u64,
    /// SENDs that are not RPC-over-RDMA version 1 (or not kept whole).
    pub other_sends: u64,
    /// RDMA WRITEs and READs that belong to no outstanding chunk.
    pub unmatched_rdma: u64,
    /// Chunks whose data ahead of a gap was dropped to stay within
    /// [`RpcLimits::max_ahead`] (their RPCs are reported incomplete, saying so).
    pub ahead_dropped: u64,
}

/// Limits that bound memory.
#[derive(Clone, Copy, Debug)]
pub struct RpcLimits {
    /// Outstanding calls kept; the oldest is reported incomplete beyond it.
    pub max_calls: usize,
    /// Bytes of chunk data kept ahead of a gap (waiting for the data before it) over all
    /// outstanding calls: a chunk whose data would take more gives up its gap, drops what it
    /// kept and is reported incomplete ([`RpcStats::ahead_dropped`]).
    pub max_ahead: usize,
}

impl Default for RpcLimits {
    fn default() -> Self {
        RpcLimits {
            max_calls: 1 << 14,
            max_ahead: 16 << 20,
        }
    }
}

#[derive(Debug)]
struct Seg {
    handle: u32,
    offset: u64,
    offered: u32,
    used: Option<u32>,
    received: u64,
    /// Data ahead of the next expected address, by address.
    ahead: BTreeMap<u64, Vec<u8>>,
}

impl Seg {
    fn new(s: &Segment) -> Seg {
        Seg {
            handle: s.handle,
            offset: s.offset,
            offered: s.length,
            used: None,
            received: 0,
            ahead: BTreeMap::new(),
        }
    }

    /// Bytes the segment should end up with, when known.
    fn target(&self, kind: ChunkKind) -> Option<u64> {
        match kind {
            ChunkKind::Read => Some(u64::from(self.offered)),
            _ => self.used.map(u64::from),
        }
    }
}

/// Chunk data kept ahead of a gap: how many bytes over all calls, the bound, and how many
/// chunks gave up to stay within it.
struct Ahead {
    held: usize,
    max: usize,
    dropped: u64,
}

/// A chunk's data in order: its digest, length and first bytes.
#[derive(Debug)]
struct Acc {
    hasher: Sha256,
    length: u64,
    head: Vec<u8>,
    /// The whole call's digest, for the read chunk spliced into it: the inline part before
    /// the chunk's position is already in it.
    splice: Option<Sha256>,
}

impl Acc {
    fn hash(&mut self, d: &[u8]) {
        self.hasher.update(d);
        if let Some(m) = &mut self.splice {
            m.update(d);
        }
        self.length += d.len() as u64;
        if self.head.len() < HEAD {
            let n = (HEAD - self.head.len()).min(d.len());
            self.head.extend_from_slice(d.get(..n).unwrap_or(&[]));
        }
    }
}

#[derive(Debug)]
struct Chunk {
    kind: ChunkKind,
    position: Option<u32>,
    segs: Vec<Seg>,
    cur: usize,
    acc: Acc,
    lost: u32,
    /// Its data ahead of a gap was dropped ([`RpcLimits::max_ahead`]).
    ahead_dropped: bool,
}

impl Chunk {
    fn new(kind: ChunkKind, position: Option<u32>, segs: &[Segment]) -> Chunk {
        Chunk {
            kind,
            position,
            segs: segs.iter().map(Seg::new).collect(),
            cur: 0,
            acc: Acc {
                hasher: Sha256::new(),
                length: 0,
                head: Vec::new(),
                splice: None,
            },
            lost: 0,
            ahead_dropped: false,
        }
    }

    /// Places the data an RDMA operation moved at `va` of segment `si`: hashed at once when it
    /// is the next the chunk needs (the common case: no copy), else kept until it is, within
    /// `ahead` (the bytes kept ahead over all chunks, and their bound): past it, the chunk
    /// drops what it kept and gives the gap up.
    fn place(&mut self, si: usize, va: u64, d: &[u8], ahead: &mut Ahead) {
        if self.ahead_dropped {
            return;
        }
        let Some(seg) = self.segs.get_mut(si) else {
            return;
        };
        if si == self.cur && va == seg.offset.wrapping_add(seg.received) {
            seg.received += d.len() as u64;
            self.acc.hash(d);
        } else if ahead.held + d.len() > ahead.max {
            ahead.held -= self.drop_ahead();
            self.ahead_dropped = true;
            self.lost += 1;
            ahead.dropped += 1;
            return;
        } else {
            ahead.held += d.len();
            if let Some(old) = seg.ahead.insert(va, d.to_vec()) {
                ahead.held -= old.len();
            }
        }
        ahead.held -= self.advance();
    }

    /// Drops the data kept ahead of a gap; returns how many bytes.
    fn drop_ahead(&mut self) -> usize {
        let mut n = 0;
        for seg in &mut self.segs {
            n += seg.ahead.values().map(Vec::len).sum::<usize>();
            seg.ahead.clear();
        }
        n
    }

    /// Hashes what is contiguous, segment after segment; returns how many bytes it took out
    /// of what was kept ahead.
    fn advance(&mut self) -> usize {
        let mut taken = 0;
        let kind = self.kind;
        while let Some(seg) = self.segs.get_mut(self.cur) {
            loop {
                let next = seg.offset.wrapping_add(seg.received);
                let Some((&va, _)) = seg.ahead.range(..=next).next_back() else {
                    break;
                };
                let Some(d) = seg.ahead.remove(&va) else {
                    break;
                };
                taken += d.len();
                let skip = usize::try_from(next - va).unwrap_or(usize::MAX);
                if let Some(rest) = d.get(skip..).filter(|r| !r.is_empty()) {
                    seg.received += rest.len() as u64;
                    self.acc.hash(rest);
                }
            }
            let done = seg.received >= seg.target(kind).unwrap_or(u64::from(seg.offered));
            if done {
                self.cur += 1;
            } else {
                break;
            }
        }
        taken
    }

    fn complete(&self) -> bool {
        self.cur >= self.segs.len() && self.lost == 0
    }

    fn report(&self) -> ChunkReport {
        ChunkReport {
            kind: self.kind,
            position: self.position,
            segments: self
                .segs
                .iter()
                .map(|s| SegmentReport {
                    handle: s.handle,
                    offset: s.offset,
                    offered: s.offered,
                    used: s.used,
                    received: s.received,
                })
                .collect(),
            length: self.acc.length,
            sha256: self
                .complete()
                .then(|| hex(&self.acc.hasher.clone().finalize())),
        }
    }

    /// Why it is not complete.
    fn missing(&self, i: usize) -> String {
        let name = match self.kind {
            ChunkKind::Read => "read",
            ChunkKind::Write => "write",
            ChunkKind::Reply => "reply",
        };
        if self.ahead_dropped {
            return format!(
                "{name} chunk {i}: data ahead of a gap dropped (more than the {} MiB kept \
                 ahead over all calls)",
                RpcLimits::default().max_ahead >> 20
            );
        }
        if self.lost > 0 {
            return format!(
                "{name} chunk {i}: {} RDMA operation(s) for it incomplete",
                self.lost
            );
        }
        let want: u64 = self
            .segs
            .iter()
            .map(|s| s.target(self.kind).unwrap_or(u64::from(s.offered)))
            .sum();
        format!("{name} chunk {i}: {} of {want} bytes", self.acc.length)
    }
}

#[derive(Debug)]
struct ReplyInfo {
    side: Side,
    /// The inline RPC message's digest (RDMA_MSG).
    inline_sha256: Option<String>,
    status: Option<String>,
    rpc_from_chunk: bool,
    /// The first word of the results (an NFS status), when inline.
    first_word: Option<u32>,
}

#[derive(Debug)]
struct Call {
    seq: u64,
    /// The inline part after the spliced read chunk's position.
    splice_rest: Option<Vec<u8>>,
    /// The inline RPC message's digest, when there are no chunks to splice.
    inline_sha256: Option<String>,
    side: Option<Side>,
    rpc: Option<(u32, u32, u32)>,
    rpc_from_chunk: bool,
    /// NFSv4 COMPOUND: its operations.
    nfs: Option<crate::nfs4::Compound>,
    reply: Option<ReplyInfo>,
    chunks: Vec<Chunk>,
    retransmissions: u32,
}

/// client, server, xid.
type CallKey = (IpAddr, IpAddr, u32);

/// The RPC reassembler. Feed it the messages of an [`crate::reasm::Assembler`] whose
/// [`crate::reasm::Limits::keep_data`] lets SENDs and chunk data through, in the order they
/// come out; complete RPCs come out of [`Tracker::drain`]; [`Tracker::finish`] reports the rest.
#[derive(Debug, Default)]
pub struct Tracker {
    calls: HashMap<CallKey, Call>,
    order: VecDeque<(u64, CallKey)>,
    handles: HashMap<(IpAddr, u32), (CallKey, usize, usize)>,
    out: Vec<Rpc>,
    stats: RpcStats,
    limits: RpcLimits,
    /// Chunk data kept ahead of a gap over all calls.
    ahead: usize,
    seq: u64,
    /// Whether a call's read chunk is hashed a second time for the whole call's digest.
    no_spliced_digest: bool,
}

impl Tracker {
    /// A tracker with the default limits.
    pub fn new() -> Self {
        Self::default()
    }

    /// A tracker with the given limits.
    pub fn with_limits(limits: RpcLimits) -> Self {
        Tracker {
            limits,
            ..Self::default()
        }
    }

    /// Whether to form the digest of a call whose read chunk is spliced into its inline part
    /// ([`Side::sha256`]; on by default). That digest hashes the chunk's data a second time
    /// (SHA-256 cannot be resumed from the chunk's own digest), so a consumer that does not
    /// show it turns it off: such calls then have `sha256: None`. Every other digest is
    /// unchanged.
    pub fn spliced_digests(mut self, on: bool) -> Self {
        self.no_spliced_digest = !on;
        self
    }

    /// Counters so far.
    pub fn stats(&self) -> RpcStats {
        self.stats
    }

    /// RPCs completed (or given up) since the last call.
    pub fn drain(&mut self) -> std::vec::Drain<'_, Rpc> {
        self.out.drain(..)
    }

    /// Calls outstanding.
    pub fn outstanding(&self) -> usize {
        self.calls.len()
    }

    /// Feeds one reassembled message.
    pub fn push(&mut self, m: &Message) {
        match m.kind {
            Kind::Send => self.send(m),
            // WRITE: server to client memory; READ response: client memory to server.
            Kind::Write => self.rdma(m, m.flow.dst),
            Kind::Read => self.rdma(m, m.flow.src),
            _ => {}
        }
    }

    fn send(&mut self, m: &Message) {
        let (Some(data), None) = (&m.data, &m.incomplete) else {
            self.stats.other_sends += 1;
            return;
        };
        let Ok(h) = parse_header(data) else {
            self.stats.other_sends += 1;
            return;
        };
        let (src, dst) = (m.flow.src, m.flow.dst);
        let as_reply = (dst, src, h.xid);
        let inline = data.get(h.header_len..).unwrap_or(&[]);
        let side = Side {
            frame: m.first_frame,
            last_frame: m.last_frame,
            proc: h.proc.name(),
            credits: h.credits,
            inline: match h.proc {
                Proc::Msg => inline.len() as u64,
                _ => 0,
            },
            length: 0,
            send_sha256: m.sha256.clone(),
            sha256: None,
        };
        let is_reply = match h.proc {
            Proc::Msg => match parse_rpc(inline).map(|r| r.body) {
                Ok(RpcBody::Reply(_)) => true,
                Ok(RpcBody::Call { .. }) => false,
                Err(_) => self.calls.contains_key(&as_reply),
            },
            Proc::NoMsg => self.calls.contains_key(&as_reply),
            Proc::Error(_) => true,
            Proc::Msgp | Proc::Done | Proc::Unknown(_) => {
                self.stats.other_sends += 1;
                return;
            }
        };
        if is_reply {
            self.reply(as_reply, &h, inline, side);
        } else {
            self.call((src, dst, h.xid), &h, inline, side);
        }
    }

    fn call(&mut self, key: CallKey, h: &Header, inline: &[u8], side: Side) {
        self.stats.calls += 1;
        if let Some(c) = self.calls.get_mut(&key) {
            c.retransmissions += 1;
            return;
        }
        let mut chunks = Vec::new();
        for (pos, segs) in h.read_chunks() {
            chunks.push(Chunk::new(ChunkKind::Read, Some(pos), &segs));
        }
        for w in &h.writes {
            chunks.push(Chunk::new(ChunkKind::Write, None, w));
        }
        if let Some(r) = &h.reply {
            chunks.push(Chunk::new(ChunkKind::Reply, None, r));
        }
        for (ci, c) in chunks.iter().enumerate() {
            for (si, s) in c.segs.iter().enumerate() {
                self.handles.insert((key.0, s.handle), (key, ci, si));
            }
        }
        // The whole call's digest: the inline part alone, or with its one read chunk spliced
        // in at its position (the inline part before it hashed now, the chunk as it comes).
        let (mut splice_rest, mut inline_sha256) = (None, None);
        if h.proc == Proc::Msg {
            let positions: Vec<u32> = chunks
                .iter()
                .filter(|c| c.kind == ChunkKind::Read)
                .filter_map(|c| c.position)
                .collect();
            match positions.as_slice() {
                [] => inline_sha256 = Some(hex(&Sha256::digest(inline))),
                &[pos] if pos > 0 && !self.no_spliced_digest => {
                    let at = usize::try_from(pos).unwrap_or(usize::MAX);
                    if let (Some(before), Some(after), Some(c)) =
                        (inline.get(..at), inline.get(at..), chunks.first_mut())
                    {
                        let mut m = Sha256::new();
                        m.update(before);
                        c.acc.splice = Some(m);
                        splice_rest = Some(after.to_vec());
                    }
                }
                _ => {}
            }
        }
        let rpc = match h.proc {
            Proc::Msg => call_fields(inline),
            _ => None,
        };
        let nfs = match (rpc, parse_rpc(inline)) {
            (Some((100_003, 4, 1)), Ok(m)) => {
                let positions: Vec<u32> = chunks.iter().filter_map(|c| c.position).collect();
                crate::nfs4::compound(inline, m.body_at, &positions).ok()
            }
            _ => None,
        };
        self.seq += 1;
        self.calls.insert(
            key,
            Call {
                seq: self.seq,
                splice_rest,
                inline_sha256,
                side: Some(side),
                rpc,
                rpc_from_chunk: h.proc == Proc::NoMsg,
                nfs,
                reply: None,
                chunks,
                retransmissions: 0,
            },
        );
        self.order.push_back((self.seq, key));
        while self.calls.len() > self.limits.max_calls {
            let Some((seq, k)) = self.order.pop_front() else {
                break;
            };
            if self.calls.get(&k).is_some_and(|c| c.seq == seq) {
                self.emit(k, Some("too many calls outstanding"));
            }
        }
        if self.order.len() > 2 * self.limits.max_calls.max(16) {
            let calls = &self.calls;
            self.order
                .retain(|(s, k)| calls.get(k).is_some_and(|c| c.seq == *s));
        }
        // Read chunk data may already be here only if the capture reordered a whole message;
        // nothing to do until RDMA operations arrive.
    }

    fn reply(&mut self, key: CallKey, h: &Header, inline: &[u8], mut side: Side) {
        self.stats.replies += 1;
        let status = match h.proc {
            Proc::Error(e) => Some(format!("RDMA_ERROR {e:?}")),
            Proc::Msg => match parse_rpc(inline).map(|r| r.body) {
                Ok(RpcBody::Reply(s)) => Some(s.name()),
                _ => None,
            },
            _ => None,
        };
        let Some(call) = self.calls.get_mut(&key) else {
            side.length = side.inline;
            self.stats.incomplete += 1;
            self.out.push(Rpc {
                xid: key.2,
                client: key.0,
                server: key.1,
                program: None,
                version: None,
                procedure: None,
                status,
                call: None,
                reply: Some(side),
                chunks: Vec::new(),
                retransmissions: 0,
                nfs_ops: None,
                nfs_status: None,
                incomplete: Some("reply without its call in the capture".into()),
            });
            return;
        };
        if call.reply.is_some() {
            return;
        }
        // The reply's write list says how much of each write chunk was used, its reply chunk
        // how much of the reply chunk.
        let mut writes = h.writes.iter();
        for c in call.chunks.iter_mut() {
            let used: Option<&Vec<Segment>> = match c.kind {
                ChunkKind::Read => continue,
                ChunkKind::Write => writes.next(),
                ChunkKind::Reply => h.reply.as_ref(),
            };
            for (i, s) in c.segs.iter_mut().enumerate() {
                let u = used.and_then(|u| u.get(i)).map_or(0, |u| u.length);
                s.used = Some(u.min(s.offered));
            }
            c.advance();
        }
        call.reply = Some(ReplyInfo {
            side,
            inline_sha256: (h.proc == Proc::Msg).then(|| hex(&Sha256::digest(inline))),
            status,
            rpc_from_chunk: h.proc == Proc::NoMsg,
            first_word: match (h.proc, parse_rpc(inline)) {
                (
                    Proc::Msg,
                    Ok(RpcMessage {
                        body: RpcBody::Reply(ReplyStatus::Accepted(0)),
                        body_at,
                        ..
                    }),
                ) => inline
                    .get(body_at..body_at + 4)
                    .and_then(|w| <[u8; 4]>::try_from(w).ok())
                    .map(u32::from_be_bytes),
                _ => None,
            },
        });
        self.try_complete(key);
    }

    fn rdma(&mut self, m: &Message, owner: IpAddr) {
        let (Some(rkey), Some(va)) = (m.rkey, m.va) else {
            self.stats.unmatched_rdma += 1;
            return;
        };
        let Some(&(key, ci, si)) = self.handles.get(&(owner, rkey)) else {
            self.stats.unmatched_rdma += 1;
            return;
        };
        let Some(chunk) = self.calls.get_mut(&key).and_then(|c| c.chunks.get_mut(ci)) else {
            self.stats.unmatched_rdma += 1;
            return;
        };
        match (&m.data, &m.incomplete) {
            (Some(d), None) => {
                if let Some(seg) = chunk.segs.get_mut(si) {
                    let end = seg.offset.saturating_add(u64::from(seg.offered));
                    if va < seg.offset || va >= end {
                        self.stats.unmatched_rdma += 1;
                        return;
                    }
                    let room = usize::try_from(end - va).unwrap_or(usize::MAX);
                    let d = d.get(..room.min(d.len())).unwrap_or(&[]);
                    let mut ahead = Ahead {
                        held: self.ahead,
                        max: self.limits.max_ahead,
                        dropped: 0,
                    };
                    chunk.place(si, va, d, &mut ahead);
                    self.ahead = ahead.held;
                    self.stats.ahead_dropped += ahead.dropped;
                }
            }
            _ => chunk.lost += 1,
        }
        self.try_complete(key);
    }

    fn try_complete(&mut self, key: CallKey) {
        let done = self
            .calls
            .get(&key)
            .is_some_and(|c| c.reply.is_some() && c.chunks.iter().all(Chunk::complete));
        if done {
            self.emit(key, None);
        }
    }

    fn emit(&mut self, key: CallKey, why: Option<&str>) {
        let Some(mut c) = self.calls.remove(&key) else {
            return;
        };
        for ch in &mut c.chunks {
            self.ahead -= ch.drop_ahead();
        }
        for ch in &c.chunks {
            for s in &ch.segs {
                if self.handles.get(&(key.0, s.handle)).map(|h| h.0) == Some(key) {
                    self.handles.remove(&(key.0, s.handle));
                }
            }
        }
        // The RPC headers carried in chunks.
        if c.rpc_from_chunk {
            if let Some(ch) = c
                .chunks
                .iter()
                .find(|ch| ch.kind == ChunkKind::Read && ch.position == Some(0))
            {
                c.rpc = call_fields(&ch.acc.head);
            }
        }
        let mut status = c.reply.as_ref().and_then(|r| r.status.clone());
        let nfs_status = c
            .reply
            .as_ref()
            .and_then(|r| r.first_word)
            .filter(|_| c.rpc.is_some_and(|r| r.0 == 100_003));
        let nfs_ops = c.nfs.as_ref().map(crate::nfs4::Compound::names);
        if c.reply.as_ref().is_some_and(|r| r.rpc_from_chunk) {
            if let Some(ch) = c.chunks.iter().find(|ch| ch.kind == ChunkKind::Reply) {
                if let Ok(RpcBody::Reply(s)) = parse_rpc(&ch.acc.head).map(|r| r.body) {
                    status = Some(s.name());
                }
            }
        }
        let mut incomplete = why.map(str::to_string);
        if c.reply.is_none() && incomplete.is_none() {
            incomplete = Some("call without its reply in the capture".into());
        }
        if incomplete.is_none() {
            if let Some((i, ch)) = c.chunks.iter().enumerate().find(|(_, ch)| !ch.complete()) {
                incomplete = Some(ch.missing(i));
            }
        }
        let sum = |k: ChunkKind| -> u64 {
            c.chunks
                .iter()
                .filter(|ch| ch.kind == k)
                .map(|ch| ch.acc.length)
                .sum()
        };
        let (reads, writes, reply_chunk) = (
            sum(ChunkKind::Read),
            sum(ChunkKind::Write),
            sum(ChunkKind::Reply),
        );
        let all_complete = c.chunks.iter().all(Chunk::complete);
        let chunk_digest = |k: ChunkKind, pos: Option<u32>| -> Option<String> {
            let mut of_kind = c.chunks.iter().filter(|ch| ch.kind == k);
            match (of_kind.next(), of_kind.next()) {
                (Some(ch), None) if ch.complete() && (pos.is_none() || ch.position == pos) => {
                    Some(hex(&ch.acc.hasher.clone().finalize()))
                }
                _ => None,
            }
        };
        let call_sha256 = if let Some(h) = &c.inline_sha256 {
            Some(h.clone())
        } else if c.rpc_from_chunk {
            chunk_digest(ChunkKind::Read, Some(0))
        } else {
            match (&c.splice_rest, c.chunks.first()) {
                (Some(rest), Some(ch)) if ch.complete() => ch.acc.splice.clone().map(|mut m| {
                    // XDR pads the chunk's data item to a multiple of 4 bytes.
                    let pad = (4 - ch.acc.length % 4) % 4;
                    let zeros = [0u8; 3];
                    m.update(
                        zeros
                            .get(..usize::try_from(pad).unwrap_or(0))
                            .unwrap_or(&[]),
                    );
                    m.update(rest);
                    hex(&m.finalize())
                }),
                _ => None,
            }
        };
        let reply_from_chunk = c.reply.as_ref().is_some_and(|r| r.rpc_from_chunk);
        let reply_sha256 = if reply_from_chunk {
            chunk_digest(ChunkKind::Reply, None)
        } else if writes == 0 && all_complete {
            c.reply.as_ref().and_then(|r| r.inline_sha256.clone())
        } else {
            None
        };
        let call = c.side.map(|mut s| {
            s.length = s.inline + reads;
            s.sha256 = call_sha256;
            s
        });
        let reply = c.reply.map(|r| {
            let mut s = r.side;
            s.length = s.inline + writes + reply_chunk;
            s.sha256 = reply_sha256;
            s
        });
        if incomplete.is_some() {
            self.stats.incomplete += 1;
        } else {
            self.stats.complete += 1;
        }
        self.out.push(Rpc {
            xid: key.2,
            client: key.0,
            server: key.1,
            program: c.rpc.map(|r| r.0),
            version: c.rpc.map(|r| r.1),
            procedure: c.rpc.map(|r| r.2),
            status,
            call,
            reply,
            chunks: c.chunks.iter().map(Chunk::report).collect(),
            retransmissions: c.retransmissions,
            nfs_ops,
            nfs_status,
            incomplete,
        });
    }

    /// Ends the capture: every outstanding call is reported incomplete, oldest first.
    pub fn finish(&mut self) {
        let mut left: Vec<(u64, CallKey)> = self.calls.iter().map(|(k, c)| (c.seq, *k)).collect();
        left.sort();
        for (_, k) in left {
            self.emit(k, None);
        }
        self.order.clear();
        self.handles.clear();
    }
}

fn call_fields(b: &[u8]) -> Option<(u32, u32, u32)> {
    match parse_rpc(b).ok()?.body {
        RpcBody::Call {
            program,
            version,
            procedure,
            ..
        } => Some((program, version, procedure)),
        RpcBody::Reply(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reasm::FlowKey;
    use crate::rpcrdma::{build_header, ReadSegment};

    const C: [u8; 4] = [10, 8, 0, 1];
    const S: [u8; 4] = [10, 8, 0, 2];

    fn words(ws: &[u32]) -> Vec<u8> {
        ws.iter().flat_map(|w| w.to_be_bytes()).collect()
    }

    fn msg(kind: Kind, from: [u8; 4], to: [u8; 4], data: Vec<u8>) -> Message {
        Message {
            kind,
            flow: FlowKey {
                src: IpAddr::from(from),
                dst: IpAddr::from(to),
                qp: 0x11,
            },
            src_qp: None,
            first_psn: 0,
            last_psn: 0,
            packets: 1,
            first_frame: 1,
            last_frame: 1,
            length: data.len() as u64,
            sha256: Some(hex(&Sha256::digest(&data))),
            rkey: None,
            va: None,
            dma_len: None,
            imm: None,
            invalidate: None,
            atomic: None,
            duplicates: 0,
            out_of_order: 0,
            incomplete: None,
            data: Some(data),
            tcp_ports: None,
        }
    }

    fn rdma(kind: Kind, rkey: u32, va: u64, data: Vec<u8>) -> Message {
        // WRITEs go server -> client; READ responses client -> server.
        let (from, to) = if kind == Kind::Write { (S, C) } else { (C, S) };
        let mut m = msg(kind, from, to, data);
        m.rkey = Some(rkey);
        m.va = Some(va);
        m
    }

    fn seg(handle: u32, length: u32, offset: u64) -> Segment {
        Segment {
            handle,
            length,
            offset,
        }
    }

    /// An NFSv3 call header (AUTH_NONE) and its arguments.
    fn nfs_call(xid: u32, proc_: u32, args: &[u8]) -> Vec<u8> {
        let mut v = words(&[xid, 0, 2, 100_003, 3, proc_, 0, 0, 0, 0]);
        v.extend_from_slice(args);
        v
    }

    fn success(xid: u32, results: &[u8]) -> Vec<u8> {
        let mut v = words(&[xid, 1, 0, 0, 0, 0]);
        v.extend_from_slice(results);
        v
    }

    fn run(msgs: &[Message]) -> (Vec<Rpc>, RpcStats) {
        run_with(Tracker::new(), msgs)
    }

    fn run_with(mut t: Tracker, msgs: &[Message]) -> (Vec<Rpc>, RpcStats) {
        let mut out = Vec::new();
        for m in msgs {
            t.push(m);
            out.extend(t.drain());
        }
        t.finish();
        out.extend(t.drain());
        (out, t.stats())
    }

    fn sha(b: &[u8]) -> Option<String> {
        Some(hex(&Sha256::digest(b)))
    }

    #[test]
    fn a_read_reply_in_a_write_chunk_written_in_two_pieces_out_of_order() {
        let file: Vec<u8> = (0..10_000u32).map(|i| (i % 253) as u8).collect();
        let mut call = build_header(
            5,
            32,
            Proc::Msg,
            &[],
            &[vec![seg(0x77, 16384, 0x8000)]],
            None,
        );
        call.extend_from_slice(&nfs_call(5, 6, &[0; 20]));
        let mut reply = build_header(
            5,
            32,
            Proc::Msg,
            &[],
            &[vec![seg(0x77, 10_000, 0x8000)]],
            None,
        );
        reply.extend_from_slice(&success(5, &[0; 100]));
        let (rpcs, stats) = run(&[
            msg(Kind::Send, C, S, call),
            rdma(Kind::Write, 0x77, 0x8000 + 4096, file[4096..].to_vec()),
            rdma(Kind::Write, 0x77, 0x8000, file[..4096].to_vec()),
            msg(Kind::Send, S, C, reply.clone()),
        ]);
        assert_eq!(rpcs.len(), 1, "{rpcs:#?}");
        let r = &rpcs[0];
        assert_eq!(r.incomplete, None);
        assert_eq!(
            (r.xid, r.program, r.version, r.procedure),
            (5, Some(100_003), Some(3), Some(6))
        );
        assert_eq!(r.status.as_deref(), Some("SUCCESS"));
        assert_eq!(r.chunks.len(), 1);
        let w = &r.chunks[0];
        assert_eq!((w.kind, w.length), (ChunkKind::Write, 10_000));
        assert_eq!(w.sha256, sha(&file));
        assert_eq!(w.segments[0].used, Some(10_000));
        let reply_side = r.reply.as_ref().unwrap();
        let inline = (reply.len() - (16 + 4 + 4 + 4 + 16 + 4 + 4)) as u64;
        assert_eq!(reply_side.inline, inline);
        assert_eq!(reply_side.length, inline + 10_000);
        assert_eq!((stats.calls, stats.replies, stats.complete), (1, 1, 1));
    }

    #[test]
    fn a_write_call_with_a_read_chunk_in_two_segments_read_in_sub_segments() {
        let data: Vec<u8> = (0..9000u32).map(|i| (i * 31 % 256) as u8).collect();
        let reads = [
            ReadSegment {
                position: 100,
                segment: seg(0x10, 6000, 0x1000),
            },
            ReadSegment {
                position: 100,
                segment: seg(0x11, 3000, 0x9000),
            },
        ];
        let mut call = build_header(9, 32, Proc::Msg, &reads, &[], None);
        let args = [0u8; 60];
        call.extend_from_slice(&nfs_call(9, 7, &args));
        let mut reply = build_header(9, 32, Proc::Msg, &[], &[], None);
        reply.extend_from_slice(&success(9, &[0; 40]));
        // The second segment read first, the first one in two READs (sub-segments).
        let (rpcs, _) = run(&[
            msg(Kind::Send, C, S, call),
            rdma(Kind::Read, 0x11, 0x9000, data[6000..].to_vec()),
            rdma(Kind::Read, 0x10, 0x1000, data[..2000].to_vec()),
            rdma(Kind::Read, 0x10, 0x1000 + 2000, data[2000..6000].to_vec()),
            msg(Kind::Send, S, C, reply),
        ]);
        assert_eq!(rpcs.len(), 1);
        let r = &rpcs[0];
        assert_eq!(r.incomplete, None, "{r:#?}");
        assert_eq!(r.procedure, Some(7));
        let c = &r.chunks[0];
        assert_eq!(
            (c.kind, c.position, c.length),
            (ChunkKind::Read, Some(100), 9000)
        );
        assert_eq!(c.sha256, sha(&data));
        let call = r.call.as_ref().unwrap();
        assert_eq!(call.length, call.inline + 9000);
        assert_eq!(call.inline, 40 + 60);
    }

    #[test]
    fn nomsg_call_and_reply_chunk_carry_the_rpc_headers() {
        let body = nfs_call(0x44, 16, &[7; 3000]);
        let reads = [ReadSegment {
            position: 0,
            segment: seg(0x20, body.len() as u32, 0x100),
        }];
        let call = build_header(
            0x44,
            8,
            Proc::NoMsg,
            &reads,
            &[],
            Some(&[seg(0x21, 65536, 0x5000)]),
        );
        let rep = success(0x44, &[1; 5000]);
        let reply = build_header(
            0x44,
            8,
            Proc::NoMsg,
            &[],
            &[],
            Some(&[seg(0x21, rep.len() as u32, 0x5000)]),
        );
        let (rpcs, _) = run(&[
            msg(Kind::Send, C, S, call),
            rdma(Kind::Read, 0x20, 0x100, body.clone()),
            rdma(Kind::Write, 0x21, 0x5000, rep.clone()),
            msg(Kind::Send, S, C, reply),
        ]);
        assert_eq!(rpcs.len(), 1);
        let r = &rpcs[0];
        assert_eq!(r.incomplete, None, "{r:#?}");
        assert_eq!((r.program, r.procedure), (Some(100_003), Some(16)));
        assert_eq!(r.status.as_deref(), Some("SUCCESS"));
        // The chunks hold the whole messages.
        assert_eq!(r.call.as_ref().unwrap().sha256, sha(&body));
        assert_eq!(r.reply.as_ref().unwrap().sha256, sha(&rep));
        assert_eq!(r.call.as_ref().unwrap().length, body.len() as u64);
        assert_eq!(r.reply.as_ref().unwrap().length, rep.len() as u64);
        assert_eq!(r.chunks[1].sha256, sha(&rep));
    }

    #[test]
    fn a_read_chunk_is_spliced_into_the_call_at_its_position_with_its_xdr_padding() {
        // An RPC whose opaque argument (5 bytes) went in a read chunk at position 48: the
        // call's digest is the inline part up to 48, the data, 3 zeros, the rest.
        let mut inline = nfs_call(0x61, 7, &[0xcc; 8]);
        inline.extend_from_slice(&words(&[0xdead]));
        let data = b"12345".to_vec();
        let reads = [ReadSegment {
            position: 48,
            segment: seg(0x40, 5, 0x100),
        }];
        let mut call = build_header(0x61, 1, Proc::Msg, &reads, &[], None);
        call.extend_from_slice(&inline);
        let mut reply = build_header(0x61, 1, Proc::Msg, &[], &[], None);
        let reply_inline = success(0x61, &[9; 12]);
        reply.extend_from_slice(&reply_inline);
        let (call_again, reply_again) = (call.clone(), reply.clone());
        let (rpcs, _) = run(&[
            msg(Kind::Send, C, S, call),
            rdma(Kind::Read, 0x40, 0x100, data.clone()),
            msg(Kind::Send, S, C, reply),
        ]);
        let mut whole = inline[..48].to_vec();
        whole.extend_from_slice(&data);
        whole.extend_from_slice(&[0, 0, 0]);
        whole.extend_from_slice(&inline[48..]);
        let r = &rpcs[0];
        assert_eq!(r.incomplete, None);
        assert_eq!(r.call.as_ref().unwrap().sha256, sha(&whole));
        // A reply without chunks: its inline part.
        assert_eq!(r.reply.as_ref().unwrap().sha256, sha(&reply_inline));
        assert_eq!(r.chunks[0].sha256, sha(&data));

        // Without spliced digests, that digest alone is gone.
        let (quick, _) = run_with(
            Tracker::new().spliced_digests(false),
            &[
                msg(Kind::Send, C, S, call_again),
                rdma(Kind::Read, 0x40, 0x100, data.clone()),
                msg(Kind::Send, S, C, reply_again),
            ],
        );
        let mut expected = r.clone();
        expected.call.as_mut().unwrap().sha256 = None;
        assert_eq!(quick, [expected]);
    }

    #[test]
    fn missing_pieces_are_reported() {
        let mut call = build_header(1, 1, Proc::Msg, &[], &[vec![seg(0x30, 8192, 0)]], None);
        call.extend_from_slice(&nfs_call(1, 6, &[]));
        let mut reply = build_header(1, 1, Proc::Msg, &[], &[vec![seg(0x30, 8192, 0)]], None);
        reply.extend_from_slice(&success(1, &[]));
        let mut lonely = build_header(2, 1, Proc::Msg, &[], &[], None);
        lonely.extend_from_slice(&success(2, &[]));
        let mut unanswered = build_header(3, 1, Proc::Msg, &[], &[], None);
        unanswered.extend_from_slice(&nfs_call(3, 1, &[]));
        let (rpcs, stats) = run(&[
            msg(Kind::Send, C, S, call),
            rdma(Kind::Write, 0x30, 4096, vec![0; 4096]), // the first 4096 bytes never come
            msg(Kind::Send, S, C, reply),
            msg(Kind::Send, S, C, lonely),
            msg(Kind::Send, C, S, unanswered),
            msg(Kind::Send, C, S, b"not rpc-over-rdma".to_vec()),
        ]);
        assert_eq!(rpcs.len(), 3, "{rpcs:#?}");
        let why: Vec<&str> = rpcs
            .iter()
            .map(|r| r.incomplete.as_deref().unwrap())
            .collect();
        assert_eq!(why[0], "reply without its call in the capture");
        assert_eq!(why[1], "write chunk 0: 0 of 8192 bytes");
        assert_eq!(why[2], "call without its reply in the capture");
        assert_eq!(rpcs[1].chunks[0].sha256, None);
        assert_eq!((stats.incomplete, stats.other_sends), (3, 1));
    }
}
