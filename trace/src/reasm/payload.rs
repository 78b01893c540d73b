//! An open message and the packets waiting for it, and one packet's payload into its open
//! message: hashed, and kept within the bounds.

use sha2::{Digest, Sha256};

use super::{psn_add, Kind, Stats};
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
    pub(super) hasher: Sha256,
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
    pub(super) data: Option<Vec<u8>>,
    /// Hashing waits: the payload is kept in `data` and not hashed (`Limits::hash_kept`).
    pub(super) deferred: bool,
}

/// How much payload is kept: per message, and over all open messages (shared with the
/// iWARP assembler).
#[derive(Clone, Copy)]
pub(crate) struct Keep {
    pub per_message: u64,
    pub budget: usize,
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
    match &mut o.data {
        Some(d) if (d.len() + payload.len()) as u64 <= keep.per_message => {
            let before = d.capacity();
            if d.len() + payload.len() > before {
                // The growth it would take (`Vec` doubles), checked against the budget first.
                let grown = (d.len() + payload.len()).max(before * 2);
                if *kept - before + grown > keep.budget {
                    stats.data_dropped += 1;
                    drop_data(o, kept);
                    o.hasher.update(payload);
                    return finish_one(o, frag, payload, now);
                }
            }
            d.extend_from_slice(payload);
            *kept = *kept - before + d.capacity();
            if !o.deferred {
                o.hasher.update(payload);
            }
        }
        Some(_) => {
            // Too long to keep: what was kept unhashed is hashed now, the rest as it comes.
            drop_data(o, kept);
            o.hasher.update(payload);
        }
        None => o.hasher.update(payload),
    }
    finish_one(o, frag, payload, now)
}

/// Stops keeping `o`'s payload: what was kept unhashed is hashed now, the buffer goes.
fn drop_data(o: &mut Open, kept: &mut usize) {
    if let Some(d) = o.data.take() {
        if o.deferred {
            o.hasher.update(&d[..]);
            o.deferred = false;
        }
        *kept -= d.capacity();
    }
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
