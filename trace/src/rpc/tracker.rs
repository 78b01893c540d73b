//! The RPC reassembler: calls, replies and the RDMA operations that moved their chunks
//! ([`Tracker`]).

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

use sha2::{Digest, Sha256};

use super::chunk::{Ahead, Chunk};
use super::{ChunkKind, Rpc, RpcLimits, RpcStats, Side};
use crate::bytes::hex;
use crate::reasm::{Kind, Message};
use crate::rpcrdma::{
    parse_header, parse_rpc, Header, Proc, ReplyStatus, RpcBody, RpcMessage, Segment,
};

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
