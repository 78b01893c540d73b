//! Reassembly of RoCEv2 packets into messages.
//!
//! A *flow* is one direction of traffic to one QP: source IP, destination IP, destination QP.
//! Its packets carry one PSN sequence, so a multi-packet message (SEND, RDMA WRITE, READ
//! response) is its FIRST packet and the packets at the following PSNs up to its LAST, whatever
//! order the capture holds them in. The payload is hashed as soon as it is in order; only
//! packets that arrive ahead of a gap are kept, so memory follows what is outstanding, not the
//! size of the capture.
//!
//! - WRITEs carry the rkey, address and DMA length of their RETH (first packet); the reassembled
//!   length is checked against it.
//! - A READ request (requester -> responder) is remembered by its PSN until the responder's
//!   READ response FIRST/ONLY with that PSN comes back on the reverse direction, which makes the
//!   response message a READ with the request's rkey, address and length. A READ that is
//!   retried from the middle (a new request at a later PSN, address advanced by what arrived) is
//!   continued, not started again. A responder may answer such a retry with MIDDLE/LAST
//!   packets from the retry's PSN (rxe does, resending what the requester already had): a
//!   response packet at the PSN of an outstanding request answers it.
//! - Atomics are paired with their ATOMIC ACK by PSN in the same way.
//! - A packet whose PSN lies in a message already completed or seen is a duplicate
//!   (a retransmission) and is counted, not hashed twice.
//! - At the end, or when a flow has moved far past them, open messages, packets without their
//!   FIRST, READs without responses and atomics without their ACK are reported as incomplete.
//!
//! Here: what comes out (messages, counters) and the limits. `assemble.rs`: the reassembler
//! ([`Assembler`]). `payload.rs`: an open message, the packets waiting for it, and one packet's
//! payload hashed into it and kept within the bounds.

use std::net::IpAddr;

use serde::Serialize;

use crate::ib::Op;

const PSN_MASK: u32 = 0x00ff_ffff;

fn psn_add(a: u32, b: u32) -> u32 {
    a.wrapping_add(b) & PSN_MASK
}

fn psn_sub(a: u32, b: u32) -> u32 {
    a.wrapping_sub(b) & PSN_MASK
}

/// Whether `p` lies in `first..=last` (PSNs wrap at 2^24).
fn psn_in(p: u32, first: u32, last: u32) -> bool {
    psn_sub(p, first) <= psn_sub(last, first)
}

/// One direction of traffic to one QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct FlowKey {
    /// Source IP address.
    pub src: IpAddr,
    /// Destination IP address.
    pub dst: IpAddr,
    /// Destination QP.
    pub qp: u32,
}

/// What a reassembled message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Kind {
    /// SEND (also with immediate or invalidate).
    Send,
    /// RDMA WRITE (also with immediate).
    Write,
    /// RDMA READ: the response data, with the request's rkey and address.
    Read,
    /// Compare and swap.
    #[serde(rename = "CMP_SWAP")]
    CompareSwap,
    /// Fetch and add.
    FetchAdd,
}

impl Kind {
    /// Upper-case name, as `messages` prints it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Send => "SEND",
            Kind::Write => "WRITE",
            Kind::Read => "READ",
            Kind::CompareSwap => "CMP_SWAP",
            Kind::FetchAdd => "FETCH_ADD",
        }
    }

    fn of(op: Op) -> Option<Kind> {
        use Op::*;
        Some(match op {
            SendFirst | SendMiddle | SendLast | SendLastImm | SendOnly | SendOnlyImm
            | SendLastInv | SendOnlyInv => Kind::Send,
            WriteFirst | WriteMiddle | WriteLast | WriteLastImm | WriteOnly | WriteOnlyImm => {
                Kind::Write
            }
            ReadResponseFirst | ReadResponseMiddle | ReadResponseLast | ReadResponseOnly => {
                Kind::Read
            }
            _ => return None,
        })
    }
}

/// A reassembled (or incomplete) message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Message {
    /// SEND, WRITE, READ or an atomic.
    pub kind: Kind,
    /// The direction the data went: for a READ, responder to requester.
    pub flow: FlowKey,
    /// UD: the sender's QP (DETH).
    pub src_qp: Option<u32>,
    /// PSN of the first packet (iWARP: the MSN of an untagged message, 0 for a tagged one).
    pub first_psn: u32,
    /// PSN of the last packet (iWARP: as `first_psn`).
    pub last_psn: u32,
    /// Packets hashed into the message (duplicates excluded; iWARP: DDP segments).
    pub packets: u32,
    /// Frame number of the first packet (for a READ, of the request).
    pub first_frame: u64,
    /// Frame number of the packet that completed (or last touched) the message.
    pub last_frame: u64,
    /// Payload bytes.
    pub length: u64,
    /// SHA-256 of the payload, lower-case hex; `None` when incomplete.
    pub sha256: Option<String>,
    /// WRITE/READ: the RETH of the request; atomics: address and rkey.
    pub rkey: Option<u32>,
    /// Remote address.
    pub va: Option<u64>,
    /// WRITE/READ: the DMA length the RETH announced.
    pub dma_len: Option<u32>,
    /// Immediate data.
    pub imm: Option<u32>,
    /// SEND with invalidate: the rkey invalidated.
    pub invalidate: Option<u32>,
    /// Atomics: swap (or add) data, compare data, and the original value the ACK returned.
    pub atomic: Option<AtomicValues>,
    /// Retransmitted packets seen for this message.
    pub duplicates: u32,
    /// Packets that arrived ahead of a gap.
    pub out_of_order: u32,
    /// `None` when complete, else why not.
    pub incomplete: Option<String>,
    /// The payload itself, when [`Limits::keep_data`] allows it (the RPC layer needs the
    /// headers SENDs carry, and chunk data spanning several messages).
    #[serde(skip)]
    pub data: Option<Vec<u8>>,
    /// iWARP: the TCP source and destination ports of the direction the data went (`flow.qp`
    /// is then 0: iWARP has no QP number on the wire).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_ports: Option<(u16, u16)>,
}

/// The operands and result of an atomic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct AtomicValues {
    /// Swap (compare and swap) or add (fetch and add) operand.
    pub swap_add: u64,
    /// Compare operand.
    pub compare: u64,
    /// The value before the operation, from the ATOMIC ACK.
    pub original: Option<u64>,
}

/// Counters over the whole capture.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// RoCEv2 packets fed in.
    pub packets: u64,
    /// ACKs (positive).
    pub acks: u64,
    /// NAKs and RNR NAKs.
    pub naks: u64,
    /// Retransmitted data packets.
    pub duplicates: u64,
    /// Data packets that arrived ahead of a gap.
    pub out_of_order: u64,
    /// Messages completed.
    pub complete: u64,
    /// Messages reported incomplete.
    pub incomplete: u64,
    /// Packets whose payload the capture cut off.
    pub truncated: u64,
    /// Messages whose kept payload ([`Message::data`]) was dropped to stay within
    /// [`Limits::max_kept`] (they come out without it, hashed all the same).
    pub data_dropped: u64,
    /// Packets ahead of a gap dropped to stay within [`Limits::max_pending`] or
    /// [`Limits::max_pending_total`] (reported as incomplete messages).
    pub pending_dropped: u64,
    /// Open messages given up to stay within [`Limits::max_open`].
    pub open_dropped: u64,
}

/// Limits that bound memory.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Packets a flow may carry past an open message or a waiting packet before it is given up
    /// as incomplete.
    pub max_age: u64,
    /// Packets ahead of a gap kept per flow; the oldest is dropped (reported) beyond it.
    pub max_pending: usize,
    /// Packets ahead of a gap kept over all flows: past it, the flow that gets one more drops
    /// its oldest (reported), so that their memory is bounded whatever the number of flows.
    pub max_pending_total: usize,
    /// Messages open at once in one flow; past it the one that made progress least recently
    /// is given up (reported incomplete). An RC flow interleaves few messages (a READ's
    /// responses with the peer's own requests); a capture that opens thousands without
    /// ending them would otherwise make every packet scan them all.
    pub max_open: usize,
    /// Payload bytes kept ([`Limits::keep_data`]) over all open messages: a message whose
    /// payload would take more comes out without its data ([`Stats::data_dropped`]). What is
    /// reserved for a message is never taken from the length its headers claim beyond
    /// [`RESERVE`]: a buffer grows as the payload comes.
    pub max_kept: usize,
    /// Outstanding READ requests and atomics kept; the oldest is dropped (reported) beyond it.
    pub max_requests: usize,
    /// Flows (direction and QP) tracked; beyond it the one least recently seen is given up
    /// (what it held is reported incomplete). Without it, packets to ever new QPs (a capture
    /// of many connections, or garbage) would each keep an open message.
    pub max_flows: usize,
    /// Payload bytes of a message kept for [`Message::data`] (0: none; a longer message
    /// comes out without its data). Memory then follows the open messages times this.
    pub keep_data: u64,
    /// Whether a WRITE or READ whose payload is kept in [`Message::data`] is also hashed into
    /// [`Message::sha256`] (SENDs always are). A consumer that hashes the data itself (the RPC
    /// layer hashes whole chunks) turns it off: SHA-256 is most of the cost, and its
    /// messages then come out complete with `sha256: None`.
    pub hash_kept: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_age: 1 << 16,
            max_pending: 4096,
            max_pending_total: 4096,
            max_open: 64,
            max_kept: 24 << 20,
            max_requests: 1 << 16,
            max_flows: 1 << 14,
            keep_data: 0,
            hash_kept: true,
        }
    }
}

mod assemble;
mod payload;
#[cfg(test)]
mod tests;

pub use assemble::{Assembler, RESERVE};
pub(crate) use payload::{reservation, Keep, Payload};
