//! A chunk of an RPC: its segments, the data they received put in order and hashed, and what
//! waits ahead of a gap.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use super::{ChunkKind, ChunkReport, RpcLimits, SegmentReport, HEAD};
use crate::bytes::hex;
use crate::rpcrdma::Segment;

#[derive(Debug)]
pub(super) struct Seg {
    pub(super) handle: u32,
    pub(super) offset: u64,
    pub(super) offered: u32,
    pub(super) used: Option<u32>,
    pub(super) received: u64,
    /// Data ahead of the next expected address, by address.
    pub(super) ahead: BTreeMap<u64, Vec<u8>>,
}

impl Seg {
    pub(super) fn new(s: &Segment) -> Seg {
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
    pub(super) fn target(&self, kind: ChunkKind) -> Option<u64> {
        match kind {
            ChunkKind::Read => Some(u64::from(self.offered)),
            _ => self.used.map(u64::from),
        }
    }
}

/// Chunk data kept ahead of a gap: how many bytes over all calls, the bound, and how many
/// chunks gave up to stay within it.
pub(super) struct Ahead {
    pub(super) held: usize,
    pub(super) max: usize,
    pub(super) dropped: u64,
}

/// A chunk's data in order: its digest, length and first bytes.
#[derive(Debug)]
pub(super) struct Acc {
    pub(super) hasher: Sha256,
    pub(super) length: u64,
    pub(super) head: Vec<u8>,
    /// The whole call's digest, for the read chunk spliced into it: the inline part before
    /// the chunk's position is already in it.
    pub(super) splice: Option<Sha256>,
}

impl Acc {
    pub(super) fn hash(&mut self, d: &[u8]) {
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
pub(super) struct Chunk {
    pub(super) kind: ChunkKind,
    pub(super) position: Option<u32>,
    pub(super) segs: Vec<Seg>,
    pub(super) cur: usize,
    pub(super) acc: Acc,
    pub(super) lost: u32,
    /// Its data ahead of a gap was dropped ([`RpcLimits::max_ahead`]).
    pub(super) ahead_dropped: bool,
}

impl Chunk {
    pub(super) fn new(kind: ChunkKind, position: Option<u32>, segs: &[Segment]) -> Chunk {
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
    pub(super) fn place(&mut self, si: usize, va: u64, d: &[u8], ahead: &mut Ahead) {
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
    pub(super) fn drop_ahead(&mut self) -> usize {
        let mut n = 0;
        for seg in &mut self.segs {
            n += seg.ahead.values().map(Vec::len).sum::<usize>();
            seg.ahead.clear();
        }
        n
    }

    /// Hashes what is contiguous, segment after segment; returns how many bytes it took out
    /// of what was kept ahead.
    pub(super) fn advance(&mut self) -> usize {
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

    pub(super) fn complete(&self) -> bool {
        self.cur >= self.segs.len() && self.lost == 0
    }

    pub(super) fn report(&self) -> ChunkReport {
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
    pub(super) fn missing(&self, i: usize) -> String {
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
