//! An open message and the packets waiting for it, and one packet's payload into its open
//! message: hashed, and kept within the bounds.

use sha2::{Digest, Sha256};

use super::{psn_add, Kind, Stats};
use crate::bytes::hex;
use crate::ib::{Op, Position, Reth};

/// A data packet kept until its message's earlier packets come.
#[derive(Debug)]
pub(super) struct Frag {
    pub(super) frame: u64,
    pub(super) op: Op,
    pub(super) data: Vec<u8>,
    pub(super) complete: bool,
    pub(super) imm: Option<u32>,
    pub(super) ieth: Option<u32>,
    pub(super) seen_at: u64,
}

/// A message being put together.
#[derive(Debug)]
pub(super) struct Open {
    pub(super) kind: Kind,
    pub(super) first_psn: u32,
    pub(super) next_psn: u32,
    pub(super) first_frame: u64,
    pub(super) last_frame: u64,
    pub(super) length: u64,
    pub(super) packets: u32,
    pub(super) reth: Option<Reth>,
    pub(super) src_qp: Option<u32>,
    pub(super) imm: Option<u32>,
    pub(super) invalidate: Option<u32>,
    pub(super) truncated: bool,
    pub(super) duplicates: u32,
    pub(super) out_of_order: u32,
    pub(super) progress_at: u64,
    pub(super) payload: Payload,
}

/// How much payload is kept: per message, and over all open messages (shared with the
/// iWARP assembler).
#[derive(Clone, Copy)]
pub(crate) struct Keep {
    pub per_message: u64,
    pub budget: usize,
}

/// Where a new message's payload buffer starts: what its headers claim, never more than
/// it keeps (`keep_data`) nor than [`RESERVE`](super::RESERVE) (a claim is not a reason to
/// reserve; the buffer grows as the payload comes).
pub(crate) fn reservation(claimed: u64, keep_data: u64) -> usize {
    usize::try_from(claimed.min(keep_data))
        .unwrap_or(usize::MAX)
        .min(super::RESERVE)
}

/// A message's payload as it comes: hashed, and kept while within [`Keep`] (shared with
/// the iWARP assembler).
#[derive(Debug)]
pub(crate) struct Payload {
    hasher: Sha256,
    data: Option<Vec<u8>>,
    /// Hashing waits: the payload is kept in `data` and not hashed (`Limits::hash_kept`).
    deferred: bool,
}

impl Payload {
    /// A payload kept in `data` (none: only hashed), its hashing `deferred` or not (only
    /// while it is kept: one refused a buffer is hashed as it comes, like one whose buffer
    /// is dropped later).
    pub(crate) fn new(data: Option<Vec<u8>>, deferred: bool) -> Self {
        Payload {
            hasher: Sha256::new(),
            deferred: deferred && data.is_some(),
            data,
        }
    }

    /// The capacity of its buffer: what it counts in the assembler's kept bytes.
    pub(crate) fn capacity(&self) -> usize {
        self.data.as_ref().map_or(0, Vec::capacity)
    }

    /// Hashes (and keeps, within `keep`) `d`; `kept` is the capacity of the open messages'
    /// buffers, kept up to date. Returns whether the kept payload was dropped to stay within
    /// `keep.budget` (a message too long to keep drops it without counting).
    pub(crate) fn absorb(&mut self, d: &[u8], keep: Keep, kept: &mut usize) -> bool {
        let mut over_budget = false;
        if let Some(v) = &mut self.data {
            let len = v.len() + d.len();
            if len as u64 <= keep.per_message {
                let before = v.capacity();
                // The growth it would take (`Vec` doubles), checked against the budget first.
                let grown = len.max(before * 2);
                if len <= before || *kept - before + grown <= keep.budget {
                    v.extend_from_slice(d);
                    *kept = *kept - before + v.capacity();
                    if !self.deferred {
                        self.hasher.update(d);
                    }
                    return false;
                }
                over_budget = true;
            }
            // Too long to keep, or past the budget: what was kept unhashed is hashed now,
            // the rest as it comes.
            self.drop_data(kept);
        }
        self.hasher.update(d);
        over_budget
    }

    /// Stops keeping the payload: what was kept unhashed is hashed now, the buffer goes.
    fn drop_data(&mut self, kept: &mut usize) {
        if let Some(d) = self.data.take() {
            if self.deferred {
                self.hasher.update(&d[..]);
                self.deferred = false;
            }
            *kept -= d.capacity();
        }
    }

    /// The message's SHA-256 in hex (none when it is `incomplete` or its hashing was
    /// deferred) and the payload kept.
    pub(crate) fn finish(self, incomplete: bool) -> (Option<String>, Option<Vec<u8>>) {
        let sha256 = (!incomplete && !self.deferred).then(|| hex(&self.hasher.finalize()));
        (sha256, self.data)
    }
}

/// Hashes (and keeps, within `keep`) one packet's payload into `o`; `kept` is the capacity
/// of the open messages' buffers, kept up to date. Returns whether it was the message's last.
pub(super) fn hash_one(
    o: &mut Open,
    frag: &Frag,
    payload: &[u8],
    now: u64,
    keep: Keep,
    kept: &mut usize,
    stats: &mut Stats,
) -> bool {
    if o.payload.absorb(payload, keep, kept) {
        stats.data_dropped += 1;
    }
    finish_one(o, frag, payload, now)
}

/// The rest of [`hash_one`]: the message's counters and its end.
fn finish_one(o: &mut Open, frag: &Frag, payload: &[u8], now: u64) -> bool {
    o.length += payload.len() as u64;
    o.packets += 1;
    o.next_psn = psn_add(o.next_psn, 1);
    o.last_frame = frag.frame;
    o.progress_at = now;
    if !frag.complete {
        o.truncated = true;
    }
    let last = matches!(frag.op.position(), Some(Position::Last | Position::Only));
    if last {
        o.imm = frag.imm;
        o.invalidate = frag.ieth;
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEEP: Keep = Keep {
        per_message: 1 << 20,
        budget: 1 << 20,
    };

    #[test]
    fn a_message_refused_a_buffer_is_still_hashed_when_hashing_waits() {
        let mut kept = 0;
        let mut p = Payload::new(None, true);
        assert!(!p.absorb(b"abc", KEEP, &mut kept));
        let (sha, data) = p.finish(false);
        assert_eq!(data, None);
        assert_eq!(sha.as_deref(), Some(hex(&Sha256::digest(b"abc")).as_str()));
    }

    #[test]
    fn a_deferred_payload_dropped_for_the_budget_is_hashed_whole() {
        let mut kept = 4;
        let keep = Keep {
            per_message: 1 << 20,
            budget: 6,
        };
        let mut p = Payload::new(Some(Vec::with_capacity(4)), true);
        assert!(!p.absorb(b"ab", keep, &mut kept));
        assert_eq!(kept, 4);
        assert!(p.absorb(b"cdef", keep, &mut kept), "growth past the budget");
        assert_eq!(kept, 0);
        let (sha, data) = p.finish(false);
        assert_eq!(data, None);
        assert_eq!(
            sha.as_deref(),
            Some(hex(&Sha256::digest(b"abcdef")).as_str())
        );
    }
}
