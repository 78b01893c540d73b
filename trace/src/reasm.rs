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

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::bytes::hex;
use crate::ib::{AtomicEth, Op, Position, Reth};
use crate::RocePacket;

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

#[derive(Debug)]
struct Frag {
    frame: u64,
    op: Op,
    data: Vec<u8>,
    complete: bool,
    imm: Option<u32>,
    ieth: Option<u32>,
    seen_at: u64,
}

#[derive(Debug)]
struct Open {
    kind: Kind,
    first_psn: u32,
    next_psn: u32,
    first_frame: u64,
    last_frame: u64,
    hasher: Sha256,
    length: u64,
    packets: u32,
    reth: Option<Reth>,
    src_qp: Option<u32>,
    imm: Option<u32>,
    invalidate: Option<u32>,
    truncated: bool,
    duplicates: u32,
    out_of_order: u32,
    progress_at: u64,
    data: Option<Vec<u8>>,
    /// Hashing waits: the payload is kept in `data` and not hashed (`Limits::hash_kept`).
    deferred: bool,
}

#[derive(Debug, Default)]
struct Flow {
    open: Vec<Open>,
    pending: HashMap<u32, Frag>,
    /// `pending`'s PSNs in the order they came, with when (`Frag::seen_at`): the oldest is
    /// found in amortised constant time. Entries of packets since taken are skipped (and the
    /// queue compacted when they are most of it).
    pending_order: VecDeque<(u64, u32)>,
    done: VecDeque<(u32, u32)>,
    packets: u64,
    /// The assembler's packet count when this flow last had a packet.
    seen_at: u64,
}

#[derive(Debug, Clone, Copy)]
struct Request {
    frame: u64,
    op: Op,
    reth: Option<Reth>,
    atomic: Option<AtomicEth>,
    responder_flow: FlowKey,
}

/// Key of an outstanding request: requester, responder, PSN.
type ReqKey = (IpAddr, IpAddr, u32);

/// The reassembler. Feed it packets in capture order with [`Assembler::push`]; completed
/// messages come out of [`Assembler::drain`]; [`Assembler::finish`] reports what is left.
#[derive(Debug, Default)]
pub struct Assembler {
    flows: HashMap<FlowKey, Flow>,
    /// The flow of the last data packet, kept out of `flows`: a message's packets come one
    /// after another on one flow, and taking its flow out of the map and putting it back
    /// hashed the key twice per packet (SipHash and the map's work: 8% of `rpc`'s perf
    /// samples). Whatever else reads `flows` puts it back first ([`Assembler::uncache`]).
    last: Option<(FlowKey, Flow)>,
    requests: HashMap<ReqKey, Request>,
    request_order: VecDeque<ReqKey>,
    out: Vec<Message>,
    stats: Stats,
    limits: Limits,
    /// Payload buffers given back ([`Assembler::recycle`]), and their capacity in bytes.
    spare: Vec<Vec<u8>>,
    spare_bytes: usize,
    /// Capacity of the payload buffers of open messages ([`Limits::max_kept`]).
    kept: usize,
    /// Packets ahead of a gap over all flows ([`Limits::max_pending_total`]).
    pending_total: usize,
}

/// The most a message's payload buffer is given before its payload comes (the rest grows as
/// it does): never more than that from a length the wire claims.
pub const RESERVE: usize = 256 << 10;

/// Capacity of the spare payload buffers an [`Assembler`] keeps.
const SPARE_BYTES: usize = 8 << 20;

impl Assembler {
    /// A reassembler with the default limits.
    pub fn new() -> Self {
        Self::default()
    }

    /// A reassembler with the given limits.
    pub fn with_limits(limits: Limits) -> Self {
        Assembler {
            limits,
            ..Self::default()
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Messages completed (or given up) since the last call, in that order.
    pub fn drain(&mut self) -> std::vec::Drain<'_, Message> {
        self.out.drain(..)
    }

    /// Gives back a message's [`Message::data`] once its consumer is done with it: the next
    /// message whose payload is kept reuses the buffer instead of allocating one. (A fresh
    /// 128 KiB buffer is a fresh mapping whose pages the kernel faults in and zeroes: that
    /// was a tenth of `rdma-trace rpc`'s time.) Up to 8 MiB of buffers are kept, the rest
    /// dropped.
    pub fn recycle(&mut self, mut buf: Vec<u8>) {
        if self.spare_bytes + buf.capacity() <= SPARE_BYTES {
            buf.clear();
            self.spare_bytes += buf.capacity();
            self.spare.push(buf);
        }
    }

    /// Open messages and packets waiting for a gap to fill, over all flows.
    pub fn outstanding(&self) -> usize {
        self.flows
            .values()
            .chain(self.last.as_ref().map(|(_, f)| f))
            .map(|f| f.open.len() + f.pending.len())
            .sum::<usize>()
            + self.requests.len()
    }

    /// Feeds one packet (frame number `frame`).
    pub fn push(&mut self, frame: u64, p: &RocePacket<'_>) {
        self.stats.packets += 1;
        let ib = &p.ib;
        let key = FlowKey {
            src: p.src,
            dst: p.dst,
            qp: ib.bth.dest_qp,
        };
        match ib.op {
            Op::ReadRequest | Op::CompareSwap | Op::FetchAdd => {
                self.request(frame, key, p);
                return;
            }
            Op::Acknowledge => {
                self.ack(p);
                return;
            }
            Op::AtomicAcknowledge => {
                self.ack(p);
                self.atomic_ack(frame, key, p);
                return;
            }
            Op::Cnp => return,
            _ => {}
        }
        if ib.aeth.is_some() {
            self.ack(p);
        }
        let (Some(kind), Some(pos)) = (Kind::of(ib.op), ib.op.position()) else {
            return;
        };
        if !p.complete {
            self.stats.truncated += 1;
        }
        let frag = Frag {
            frame,
            op: ib.op,
            data: Vec::new(),
            complete: p.complete,
            imm: ib.imm,
            ieth: ib.ieth,
            seen_at: 0,
        };
        let psn = ib.bth.psn;
        let read_req = if matches!(pos, Position::First | Position::Only) && kind == Kind::Read {
            self.take_request((p.dst, p.src, psn))
        } else {
            None
        };
        // (Only a retried READ's request answers a MIDDLE or LAST; with no request outstanding
        // at all, the lookup is skipped.)
        if kind == Kind::Read
            && matches!(pos, Position::Middle | Position::Last)
            && !self.requests.is_empty()
        {
            let rk = (p.dst, p.src, psn);
            if self
                .requests
                .get(&rk)
                .is_some_and(|r| r.op == Op::ReadRequest)
            {
                self.requests.remove(&rk);
            }
        }
        let mut flow = match self.last.take() {
            Some((k, f)) if k == key => f,
            other => {
                if let Some((k, f)) = other {
                    self.flows.insert(k, f);
                }
                match self.flows.remove(&key) {
                    Some(f) => f,
                    None => {
                        if self.flows.len() >= self.limits.max_flows {
                            self.evict_flows();
                        }
                        Flow::default()
                    }
                }
            }
        };
        flow.seen_at = self.stats.packets;
        flow.packets += 1;
        let now = flow.packets;
        // The common case, the PSN an open message waits for, is not a duplicate: the scan
        // of the last 256 completed ranges is skipped (it was a seventh of `rpc`'s time).
        let expected = flow.open.iter().any(|o| o.next_psn == psn);
        let dup = (!expected && flow.done.iter().any(|&(a, b)| psn_in(psn, a, b)))
            || flow.pending.contains_key(&psn)
            || flow
                .open
                .iter()
                .any(|o| psn_in(psn, o.first_psn, psn_add(o.next_psn, PSN_MASK)));
        if dup {
            self.stats.duplicates += 1;
            if let Some(o) = flow
                .open
                .iter_mut()
                .find(|o| psn_in(psn, o.first_psn, o.next_psn))
            {
                o.duplicates += 1;
            }
        } else {
            match pos {
                Position::First | Position::Only => {
                    // A READ retried from the middle: its response starts with FIRST at the
                    // PSN the earlier responses stopped at, for the rest of the same buffer.
                    let continued = read_req.and_then(|rq| {
                        let r = rq.reth?;
                        flow.open.iter().position(|o| {
                            o.kind == Kind::Read
                                && o.next_psn == psn
                                && o.reth.is_some_and(|or| {
                                    or.rkey == r.rkey && or.va.wrapping_add(o.length) == r.va
                                })
                        })
                    });
                    if let Some(i) = continued {
                        self.absorb(key, &mut flow, i, frag, p.ib.payload, now);
                    } else {
                        // An open message expecting this PSN never got its LAST.
                        if let Some(i) = flow.open.iter().position(|o| o.next_psn == psn) {
                            let o = flow.open.swap_remove(i);
                            self.give_up(key, o, "a new message began before its LAST");
                        }
                        let reth = if kind == Kind::Read {
                            read_req.and_then(|r| r.reth)
                        } else {
                            ib.reth
                        };
                        let o = Open {
                            kind,
                            first_psn: psn,
                            next_psn: psn,
                            first_frame: read_req.map_or(frame, |r| r.frame),
                            last_frame: frame,
                            hasher: Sha256::new(),
                            length: 0,
                            packets: 0,
                            reth,
                            src_qp: ib.deth.map(|d| d.src_qp),
                            imm: None,
                            invalidate: None,
                            truncated: false,
                            duplicates: 0,
                            out_of_order: 0,
                            progress_at: now,
                            // Sized once from the RETH: growing a 128 KiB
                            // buffer by doubling cost more than the rest of `rpc`.
                            data: self.payload_buffer(reth),
                            deferred: self.limits.keep_data > 0
                                && !self.limits.hash_kept
                                && kind != Kind::Send,
                        };
                        // Room first: giving one up moves the last (`swap_remove`).
                        if flow.open.len() >= self.limits.max_open {
                            self.drop_stalest_open(key, &mut flow);
                        }
                        flow.open.push(o);
                        let i = flow.open.len() - 1;
                        self.absorb(key, &mut flow, i, frag, p.ib.payload, now);
                    }
                }
                Position::Middle | Position::Last => {
                    if let Some(i) = flow
                        .open
                        .iter()
                        .position(|o| o.next_psn == psn && o.kind == kind)
                    {
                        self.absorb(key, &mut flow, i, frag, p.ib.payload, now);
                    } else {
                        self.stats.out_of_order += 1;
                        let mut frag = frag;
                        frag.data = p.ib.payload.to_vec();
                        frag.seen_at = now;
                        self.put_pending(&mut flow, psn, frag);
                        while flow.pending.len() > self.limits.max_pending
                            || self.pending_total > self.limits.max_pending_total
                        {
                            if !self.drop_oldest_pending(key, &mut flow) {
                                break;
                            }
                        }
                    }
                }
            }
        }
        if now % 1024 == 0 {
            self.sweep(key, &mut flow, now);
        }
        self.last = Some((key, flow));
    }

    /// Puts the cached flow back into `flows`.
    fn uncache(&mut self) {
        if let Some((k, f)) = self.last.take() {
            self.flows.insert(k, f);
        }
    }

    /// Hashes `payload` into open message `i` at its next PSN, then every waiting packet that
    /// follows; completes the message at its LAST.
    fn absorb(
        &mut self,
        key: FlowKey,
        flow: &mut Flow,
        i: usize,
        frag: Frag,
        payload: &[u8],
        now: u64,
    ) {
        let Some(o) = flow.open.get_mut(i) else {
            return;
        };
        let keep = Keep {
            per_message: self.limits.keep_data,
            budget: self.limits.max_kept,
        };
        let mut last = hash_one(
            o,
            &frag,
            payload,
            now,
            keep,
            &mut self.kept,
            &mut self.stats,
        );
        while !last {
            let next_psn = o.next_psn;
            let continues = flow.pending.get(&next_psn).is_some_and(|next| {
                Kind::of(next.op) == Some(o.kind)
                    && !matches!(next.op.position(), Some(Position::First | Position::Only))
            });
            if !continues {
                break;
            }
            let Some(next) = flow.pending.remove(&next_psn) else {
                break;
            };
            self.pending_total -= 1;
            o.out_of_order += 1;
            last = hash_one(
                o,
                &next,
                &next.data,
                now,
                keep,
                &mut self.kept,
                &mut self.stats,
            );
        }
        if last {
            let o = flow.open.swap_remove(i);
            flow.done.push_back((o.first_psn, psn_sub(o.next_psn, 1)));
            if flow.done.len() > 256 {
                flow.done.pop_front();
            }
            self.emit(key, o, None);
        }
    }

    fn emit(&mut self, flow: FlowKey, o: Open, incomplete: Option<String>) {
        // Its buffer leaves the open messages (with the message, to its consumer).
        self.kept -= o.data.as_ref().map_or(0, Vec::capacity);
        let incomplete = incomplete.or_else(|| {
            if o.truncated {
                Some("the capture cut off some of its payload".into())
            } else if o.kind == Kind::Read && o.reth.is_none() {
                Some("READ response without its request in the capture".into())
            } else {
                match o.reth {
                    Some(r) if o.kind != Kind::Send && u64::from(r.dma_len) != o.length => Some(
                        format!("{} bytes where the RETH announced {}", o.length, r.dma_len),
                    ),
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
        self.out.push(Message {
            kind: o.kind,
            flow,
            src_qp: o.src_qp,
            first_psn: o.first_psn,
            last_psn: psn_sub(o.next_psn, 1),
            packets: o.packets,
            first_frame: o.first_frame,
            last_frame: o.last_frame,
            length: o.length,
            sha256,
            rkey: o.reth.map(|r| r.rkey),
            va: o.reth.map(|r| r.va),
            dma_len: o.reth.map(|r| r.dma_len),
            imm: o.imm,
            invalidate: o.invalidate,
            atomic: None,
            duplicates: o.duplicates,
            out_of_order: o.out_of_order,
            incomplete,
            data: o.data,
            tcp_ports: None,
        });
    }

    fn give_up(&mut self, key: FlowKey, o: Open, why: &str) {
        let why = format!("{why} (next PSN {} missing)", o.next_psn);
        self.emit(key, o, Some(why));
    }

    fn ack(&mut self, p: &RocePacket<'_>) {
        match p.ib.aeth.map(|a| a.syndrome >> 5) {
            Some(0) => self.stats.acks += 1,
            Some(_) => self.stats.naks += 1,
            None => {}
        }
    }

    fn request(&mut self, frame: u64, key: FlowKey, p: &RocePacket<'_>) {
        let rk = (p.src, p.dst, p.ib.bth.psn);
        if self.requests.contains_key(&rk) {
            self.stats.duplicates += 1;
            return;
        }
        self.requests.insert(
            rk,
            Request {
                frame,
                op: p.ib.op,
                reth: p.ib.reth,
                atomic: p.ib.atomic,
                responder_flow: key,
            },
        );
        self.request_order.push_back(rk);
        while self.requests.len() > self.limits.max_requests {
            let Some(old) = self.request_order.pop_front() else {
                break;
            };
            if let Some(r) = self.requests.remove(&old) {
                self.unanswered(old, r);
            }
        }
        if self.request_order.len() > 2 * self.limits.max_requests.max(16) {
            let requests = &self.requests;
            self.request_order.retain(|k| requests.contains_key(k));
        }
    }

    fn take_request(&mut self, rk: ReqKey) -> Option<Request> {
        self.requests.remove(&rk)
    }

    fn atomic_ack(&mut self, frame: u64, key: FlowKey, p: &RocePacket<'_>) {
        let Some(r) = self.take_request((p.dst, p.src, p.ib.bth.psn)) else {
            return;
        };
        let kind = if r.op == Op::FetchAdd {
            Kind::FetchAdd
        } else {
            Kind::CompareSwap
        };
        self.stats.complete += 1;
        self.out.push(atomic_message(
            kind,
            key,
            p.ib.bth.psn,
            r,
            frame,
            p.ib.atomic_ack,
            None,
        ));
    }

    fn unanswered(&mut self, (_, _, psn): ReqKey, r: Request) {
        self.stats.incomplete += 1;
        let (kind, why) = match r.op {
            Op::ReadRequest => (Kind::Read, "READ request without a response"),
            Op::FetchAdd => (Kind::FetchAdd, "atomic without its ACK"),
            _ => (Kind::CompareSwap, "atomic without its ACK"),
        };
        if kind == Kind::Read {
            self.out.push(Message {
                kind,
                flow: r.responder_flow,
                src_qp: None,
                first_psn: psn,
                last_psn: psn,
                packets: 0,
                first_frame: r.frame,
                last_frame: r.frame,
                length: 0,
                sha256: None,
                rkey: r.reth.map(|x| x.rkey),
                va: r.reth.map(|x| x.va),
                dma_len: r.reth.map(|x| x.dma_len),
                imm: None,
                invalidate: None,
                atomic: None,
                duplicates: 0,
                out_of_order: 0,
                incomplete: Some(why.into()),
                data: None,
                tcp_ports: None,
            });
        } else {
            let flow = r.responder_flow;
            self.out.push(atomic_message(
                kind,
                flow,
                psn,
                r,
                r.frame,
                None,
                Some(why.into()),
            ));
        }
    }

    /// Drops the flow's packet that has waited longest for its gap (reported); `false` when
    /// the flow has none.
    fn drop_oldest_pending(&mut self, key: FlowKey, flow: &mut Flow) -> bool {
        while let Some((seen_at, psn)) = flow.pending_order.pop_front() {
            // Skipped: packets since taken, or a PSN whose packet is a later one.
            if flow.pending.get(&psn).is_none_or(|f| f.seen_at != seen_at) {
                continue;
            }
            if let Some(f) = flow.pending.remove(&psn) {
                self.pending_total -= 1;
                self.stats.pending_dropped += 1;
                self.orphan(
                    key,
                    psn,
                    f,
                    "packet whose FIRST never came (too many waiting)",
                );
                return true;
            }
        }
        false
    }

    /// Keeps a packet ahead of a gap.
    fn put_pending(&mut self, flow: &mut Flow, psn: u32, frag: Frag) {
        flow.pending_order.push_back((frag.seen_at, psn));
        if flow.pending.insert(psn, frag).is_none() {
            self.pending_total += 1;
        }
        if flow.pending_order.len() > 2 * flow.pending.len() + 64 {
            let pending = &flow.pending;
            flow.pending_order
                .retain(|(at, psn)| pending.get(psn).is_some_and(|f| f.seen_at == *at));
        }
    }

    /// Gives up the open message of the flow that made progress least recently
    /// ([`Limits::max_open`]).
    fn drop_stalest_open(&mut self, key: FlowKey, flow: &mut Flow) {
        let stalest = flow
            .open
            .iter()
            .enumerate()
            .min_by_key(|(_, o)| o.progress_at)
            .map(|(i, _)| i);
        if let Some(i) = stalest {
            let o = flow.open.swap_remove(i);
            self.stats.open_dropped += 1;
            let why = format!(
                "given up: more than {} messages open in its flow",
                self.limits.max_open
            );
            self.give_up(key, o, &why);
        }
    }

    /// A new message's payload buffer (when payloads are kept): a spare one, or a new one of
    /// at most [`RESERVE`] bytes (the length `reth` claims bounds it, never enlarges it past
    /// that); none when the open messages' buffers already take [`Limits::max_kept`].
    fn payload_buffer(&mut self, reth: Option<Reth>) -> Option<Vec<u8>> {
        if self.limits.keep_data == 0 {
            return None;
        }
        let want = reth
            .map_or(0, |r| u64::from(r.dma_len))
            .min(self.limits.keep_data);
        let cap = usize::try_from(want).unwrap_or(usize::MAX).min(RESERVE);
        let b = match self.spare.pop() {
            Some(mut b) => {
                self.spare_bytes = self.spare_bytes.saturating_sub(b.capacity());
                b.reserve_exact(cap);
                b
            }
            None => Vec::with_capacity(cap),
        };
        if self.kept + b.capacity() > self.limits.max_kept {
            self.stats.data_dropped += 1;
            return None;
        }
        self.kept += b.capacity();
        Some(b)
    }

    fn orphan(&mut self, key: FlowKey, psn: u32, f: Frag, why: &str) {
        self.stats.incomplete += 1;
        self.out.push(Message {
            kind: Kind::of(f.op).unwrap_or(Kind::Send),
            flow: key,
            src_qp: None,
            first_psn: psn,
            last_psn: psn,
            packets: 1,
            first_frame: f.frame,
            last_frame: f.frame,
            length: f.data.len() as u64,
            sha256: None,
            rkey: None,
            va: None,
            dma_len: None,
            imm: f.imm,
            invalidate: f.ieth,
            atomic: None,
            duplicates: 0,
            out_of_order: 0,
            incomplete: Some(why.into()),
            data: None,
            tcp_ports: None,
        });
    }

    /// Gives up the eighth of the flows least recently seen (at least one), reporting what
    /// they held: amortised, a new flow beyond the limit costs a scan per eighth.
    fn evict_flows(&mut self) {
        self.uncache();
        let mut ages: Vec<(u64, FlowKey)> =
            self.flows.iter().map(|(k, f)| (f.seen_at, *k)).collect();
        ages.sort_unstable_by_key(|a| a.0);
        let n = (ages.len() / 8).max(1);
        for (_, key) in ages.into_iter().take(n) {
            if let Some(mut flow) = self.flows.remove(&key) {
                flow.open.sort_by_key(|o| o.first_frame);
                for o in flow.open.drain(..) {
                    self.give_up(key, o, "given up: too many flows");
                }
                let mut pending: Vec<(u32, Frag)> = flow.pending.drain().collect();
                self.pending_total -= pending.len();
                pending.sort_by_key(|(_, f)| f.frame);
                for (psn, f) in pending {
                    self.orphan(key, psn, f, "given up: too many flows");
                }
            }
        }
    }

    /// Gives up on what a flow has moved far past.
    fn sweep(&mut self, key: FlowKey, flow: &mut Flow, now: u64) {
        let max_age = self.limits.max_age;
        let mut i = 0;
        while i < flow.open.len() {
            if now.saturating_sub(flow.open[i].progress_at) > max_age {
                let o = flow.open.swap_remove(i);
                self.give_up(key, o, "no progress");
            } else {
                i += 1;
            }
        }
        let stale: Vec<u32> = flow
            .pending
            .iter()
            .filter(|(_, f)| now.saturating_sub(f.seen_at) > max_age)
            .map(|(&p, _)| p)
            .collect();
        for psn in stale {
            if let Some(f) = flow.pending.remove(&psn) {
                self.pending_total -= 1;
                self.orphan(key, psn, f, "packet whose FIRST never came");
            }
        }
    }

    /// Ends the capture: everything still open is reported incomplete, in flow order.
    pub fn finish(&mut self) {
        self.uncache();
        let mut flows: Vec<(FlowKey, Flow)> = self.flows.drain().collect();
        flows.sort_by_key(|(k, _)| (k.src, k.dst, k.qp));
        for (key, mut flow) in flows {
            flow.open.sort_by_key(|o| o.first_frame);
            for o in flow.open.drain(..) {
                self.give_up(key, o, "capture ended before its LAST");
            }
            let mut pending: Vec<(u32, Frag)> = flow.pending.drain().collect();
            self.pending_total -= pending.len();
            pending.sort_by_key(|(_, f)| f.frame);
            for (psn, f) in pending {
                self.orphan(key, psn, f, "packet whose FIRST is not in the capture");
            }
        }
        let order: Vec<ReqKey> = self.request_order.drain(..).collect();
        for k in order {
            if let Some(r) = self.requests.remove(&k) {
                self.unanswered(k, r);
            }
        }
    }
}

fn atomic_message(
    kind: Kind,
    flow: FlowKey,
    psn: u32,
    r: Request,
    last_frame: u64,
    original: Option<u64>,
    incomplete: Option<String>,
) -> Message {
    Message {
        kind,
        flow,
        src_qp: None,
        first_psn: psn,
        last_psn: psn,
        packets: 1,
        first_frame: r.frame,
        last_frame,
        length: 8,
        sha256: None,
        rkey: r.atomic.map(|a| a.rkey),
        va: r.atomic.map(|a| a.va),
        dma_len: None,
        imm: None,
        invalidate: None,
        atomic: r.atomic.map(|a| AtomicValues {
            swap_add: a.swap_add,
            compare: a.compare,
            original,
        }),
        duplicates: 0,
        out_of_order: 0,
        incomplete,
        data: None,
        tcp_ports: None,
    }
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
fn hash_one(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ib;

    const A: [u8; 4] = [10, 8, 0, 1];
    const B: [u8; 4] = [10, 8, 0, 2];

    fn reth(va: u64, rkey: u32, len: u32) -> Vec<u8> {
        let mut v = va.to_be_bytes().to_vec();
        v.extend_from_slice(&rkey.to_be_bytes());
        v.extend_from_slice(&len.to_be_bytes());
        v
    }

    /// Feeds `(from, opcode, qp, psn, ext, payload)` packets, numbered from 1, and finishes.
    /// From, opcode, destination QP, PSN, extended headers, payload.
    type Pkt = ([u8; 4], u8, u32, u32, Vec<u8>, Vec<u8>);

    fn run(pkts: &[Pkt]) -> (Vec<Message>, Stats) {
        run_with(Limits::default(), pkts)
    }

    fn run_with(limits: Limits, pkts: &[Pkt]) -> (Vec<Message>, Stats) {
        run_recycling(limits, pkts, &mut |_| {})
    }

    /// [`run_with`], handing the assembler the spare buffers `spares` adds before each packet.
    fn run_recycling(
        limits: Limits,
        pkts: &[Pkt],
        spares: &mut dyn FnMut(&mut Assembler),
    ) -> (Vec<Message>, Stats) {
        let mut asm = Assembler::with_limits(limits);
        let mut out = Vec::new();
        for (n, (from, op, qp, psn, ext, payload)) in pkts.iter().enumerate() {
            let to = if *from == A { B } else { A };
            let bytes = ib::build(*op, *qp, *psn, ext, payload);
            let p = RocePacket {
                src: IpAddr::from(*from),
                dst: IpAddr::from(to),
                src_port: 49152,
                ib: ib::parse(&bytes, true).unwrap(),
                complete: true,
                icrc_ok: None,
                cm: None,
            };
            spares(&mut asm);
            asm.push(n as u64 + 1, &p);
            out.extend(asm.drain());
        }
        asm.finish();
        out.extend(asm.drain());
        (out, asm.stats())
    }

    fn sha(b: &[u8]) -> Option<String> {
        Some(hex(&Sha256::digest(b)))
    }

    #[test]
    fn send_in_three_packets_out_of_order_with_a_retransmission() {
        let data: Vec<u8> = (0..2500u32).map(|i| (i % 251) as u8).collect();
        let (f, m, l) = (&data[..1024], &data[1024..2048], &data[2048..]);
        let (msgs, stats) = run(&[
            (A, 0x00, 0x11, 100, vec![], f.to_vec()),
            (A, 0x02, 0x11, 102, vec![], l.to_vec()), // ahead of the gap
            (A, 0x01, 0x11, 101, vec![], m.to_vec()),
            (A, 0x02, 0x11, 102, vec![], l.to_vec()), // retransmitted
            (A, 0x04, 0x11, 103, vec![], b"next".to_vec()),
        ]);
        assert_eq!(msgs.len(), 2, "{msgs:#?}");
        let m0 = &msgs[0];
        assert_eq!((m0.kind, m0.length, m0.packets), (Kind::Send, 2500, 3));
        assert_eq!((m0.first_psn, m0.last_psn, m0.out_of_order), (100, 102, 1));
        assert_eq!(m0.sha256, sha(&data));
        assert_eq!(m0.incomplete, None);
        assert_eq!(msgs[1].sha256, sha(b"next"));
        assert_eq!(
            (stats.duplicates, stats.complete, stats.incomplete),
            (1, 2, 0)
        );
    }

    #[test]
    fn write_checks_the_reth_length_and_carries_the_immediate() {
        let mut last_ext = vec![];
        last_ext.extend_from_slice(&0xfeedu32.to_be_bytes());
        let (msgs, _) = run(&[
            (
                A,
                0x06,
                0x11,
                0xff_fffe,
                reth(0x1000, 0x42, 1030),
                vec![1; 1024],
            ),
            (A, 0x09, 0x11, 0xff_ffff, last_ext, vec![2; 6]),
            (A, 0x0a, 0x11, 0, reth(0x2000, 0x42, 10), vec![3; 4]),
        ]);
        assert_eq!(msgs.len(), 2);
        let w = &msgs[0];
        assert_eq!(
            (w.kind, w.rkey, w.va, w.dma_len),
            (Kind::Write, Some(0x42), Some(0x1000), Some(1030))
        );
        assert_eq!(
            (w.imm, w.length, w.incomplete.as_deref()),
            (Some(0xfeed), 1030, None)
        );
        // PSNs wrap at 2^24.
        assert_eq!((w.first_psn, w.last_psn), (0xff_fffe, 0xff_ffff));
        assert!(msgs[1]
            .incomplete
            .as_deref()
            .unwrap()
            .contains("RETH announced 10"));
        assert_eq!(msgs[1].sha256, None);
    }

    #[test]
    fn read_response_is_matched_to_its_request_and_a_retry_from_the_middle_continues_it() {
        let aeth = vec![0x1f, 0, 0, 1];
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
        let (msgs, stats) = run(&[
            (A, 0x0c, 0x22, 500, reth(0x9000, 0x77, 3000), vec![]),
            (B, 0x0d, 0x11, 500, aeth.clone(), data[..1024].to_vec()),
            // the middle response is lost; A asks again for the rest
            (
                A,
                0x0c,
                0x22,
                501,
                reth(0x9000 + 1024, 0x77, 3000 - 1024),
                vec![],
            ),
            (B, 0x0d, 0x11, 501, aeth.clone(), data[1024..2048].to_vec()),
            (B, 0x0f, 0x11, 502, aeth.clone(), data[2048..].to_vec()),
            // a request nobody answers
            (A, 0x0c, 0x22, 503, reth(0xa000, 0x78, 8), vec![]),
        ]);
        assert_eq!(msgs.len(), 2, "{msgs:#?}");
        let r = &msgs[0];
        assert_eq!(
            (r.kind, r.rkey, r.va, r.dma_len),
            (Kind::Read, Some(0x77), Some(0x9000), Some(3000))
        );
        assert_eq!(
            (r.length, r.first_frame, r.sha256.clone()),
            (3000, 1, sha(&data))
        );
        assert_eq!(r.flow.src, IpAddr::from(B));
        assert_eq!(
            msgs[1].incomplete.as_deref(),
            Some("READ request without a response")
        );
        assert_eq!(msgs[1].rkey, Some(0x78));
        assert_eq!(stats.naks, 0);
        assert_eq!(stats.acks, 3);
    }

    #[test]
    fn a_read_retried_from_the_middle_and_answered_with_middle_packets_is_answered() {
        // As rxe did in an NFS capture: the whole response arrives, the requester asks again
        // from PSN 11 (address advanced by 1024) and the responder resends MIDDLE and LAST.
        let aeth = vec![0x1f, 0, 0, 1];
        let data: Vec<u8> = (0..3072u32).map(|i| (i * 3) as u8).collect();
        let (msgs, stats) = run(&[
            (A, 0x0c, 0x22, 10, reth(0x9000, 0x77, 3072), vec![]),
            (B, 0x0d, 0x11, 10, aeth.clone(), data[..1024].to_vec()),
            (B, 0x0e, 0x11, 11, vec![], data[1024..2048].to_vec()),
            (B, 0x0f, 0x11, 12, aeth.clone(), data[2048..].to_vec()),
            (A, 0x0c, 0x22, 11, reth(0x9400, 0x77, 2048), vec![]),
            (B, 0x0e, 0x11, 11, vec![], data[1024..2048].to_vec()),
            (B, 0x0f, 0x11, 12, aeth.clone(), data[2048..].to_vec()),
        ]);
        assert_eq!(msgs.len(), 1, "{msgs:#?}");
        assert_eq!((msgs[0].length, msgs[0].incomplete.clone()), (3072, None));
        assert_eq!(msgs[0].sha256, sha(&data));
        assert_eq!((stats.duplicates, stats.incomplete), (2, 0));
    }

    #[test]
    fn kept_payloads_come_out_whole_and_hashing_them_can_be_left_to_the_consumer() {
        let limits = Limits {
            keep_data: 1500,
            hash_kept: false,
            ..Limits::default()
        };
        let w: Vec<u8> = (0..1400u32).map(|i| (i % 199) as u8).collect();
        let big: Vec<u8> = (0..2048u32).map(|i| (i % 197) as u8).collect();
        let (msgs, _) = run_with(
            limits,
            &[
                (A, 0x06, 0x11, 1, reth(0x10, 1, 1400), w[..1024].to_vec()),
                (A, 0x08, 0x11, 2, vec![], w[1024..].to_vec()),
                (A, 0x04, 0x11, 3, vec![], b"call".to_vec()),
                (A, 0x06, 0x11, 4, reth(0x10, 1, 2048), big[..1024].to_vec()),
                (A, 0x08, 0x11, 5, vec![], big[1024..].to_vec()),
            ],
        );
        assert_eq!(msgs.len(), 3);
        // Kept, not hashed, complete.
        assert_eq!(
            (
                msgs[0].data.as_deref(),
                msgs[0].sha256.clone(),
                msgs[0].incomplete.clone()
            ),
            (Some(&w[..]), None, None)
        );
        // SENDs are always hashed.
        assert_eq!(msgs[1].sha256, sha(b"call"));
        assert_eq!(msgs[1].data.as_deref(), Some(&b"call"[..]));
        // Too long to keep: hashed after all, the kept part first.
        assert_eq!(
            (msgs[2].data.clone(), msgs[2].sha256.clone()),
            (None, sha(&big))
        );

        // Given buffers to reuse (too small, holding old bytes, too many to keep): the same.
        let pkts: Vec<Pkt> = (0..40u32)
            .flat_map(|i| {
                let psn = 10 + 2 * i;
                [
                    (A, 0x06, 0x11, psn, reth(0x10, 1, 1400), w[..1024].to_vec()),
                    (A, 0x08, 0x11, psn + 1, vec![], w[1024..].to_vec()),
                ]
            })
            .collect();
        let mut given = 0;
        let (reused, _) = run_recycling(limits, &pkts, &mut |asm| {
            given += 1;
            asm.recycle(vec![0xee; 7 * given]);
            asm.recycle(Vec::with_capacity(SPARE_BYTES / 3));
        });
        let (fresh, _) = run_with(limits, &pkts);
        assert_eq!(reused.len(), 40);
        assert!(reused.iter().all(|m| m.data.as_deref() == Some(&w[..])));
        assert_eq!(format!("{reused:?}"), format!("{fresh:?}"));
    }

    #[test]
    fn atomics_pair_with_their_ack_and_ud_keeps_the_source_qp() {
        let mut ateth = 0x3000u64.to_be_bytes().to_vec();
        ateth.extend_from_slice(&0x55u32.to_be_bytes());
        ateth.extend_from_slice(&5u64.to_be_bytes());
        ateth.extend_from_slice(&0u64.to_be_bytes());
        let mut ack = vec![0, 0, 0, 1];
        ack.extend_from_slice(&40u64.to_be_bytes());
        let mut deth = 0x1111_1111u32.to_be_bytes().to_vec();
        deth.extend_from_slice(&0x33u32.to_be_bytes());
        let (msgs, _) = run(&[
            (A, 0x14, 0x22, 7, ateth, vec![]),
            (B, 0x12, 0x11, 7, ack, vec![]),
            (A, 0x64, 0x99, 1, deth, b"datagram".to_vec()),
        ]);
        assert_eq!(msgs.len(), 2);
        assert_eq!(msgs[0].kind, Kind::FetchAdd);
        assert_eq!(
            msgs[0].atomic,
            Some(AtomicValues {
                swap_add: 5,
                compare: 0,
                original: Some(40)
            })
        );
        assert_eq!(
            (msgs[1].src_qp, msgs[1].sha256.clone()),
            (Some(0x33), sha(b"datagram"))
        );
    }

    #[test]
    fn what_never_completes_is_reported_at_the_end() {
        let (msgs, stats) = run(&[
            (A, 0x00, 0x11, 10, vec![], vec![1; 1024]),
            (A, 0x01, 0x11, 11, vec![], vec![1; 1024]),
            (A, 0x02, 0x11, 40, vec![], vec![1; 8]), // its FIRST is not in the capture
        ]);
        assert_eq!(msgs.len(), 2);
        assert!(msgs[0]
            .incomplete
            .as_deref()
            .unwrap()
            .starts_with("capture ended"));
        assert_eq!((msgs[0].length, msgs[0].packets), (2048, 2));
        assert!(msgs[1].incomplete.as_deref().unwrap().contains("FIRST"));
        assert_eq!(stats.incomplete, 2);
    }

    #[test]
    fn sends_on_two_flows_interleaved_packet_by_packet_both_complete() {
        // Each packet switches flows, so the flow kept out of the map (the last one) goes
        // back and forth; `outstanding` counts the open message in it too.
        let a: Vec<u8> = (0..3000u32).map(|i| (i % 253) as u8).collect();
        let b: Vec<u8> = (0..3000u32).map(|i| (i % 241) as u8).collect();
        let mut asm = Assembler::new();
        let mut out = Vec::new();
        let ops = [0x00u8, 0x01, 0x02];
        for (n, (op, i)) in ops.iter().zip(0u32..).enumerate() {
            let r = (i as usize) * 1000..(i as usize + 1) * 1000;
            for (from, qp, data) in [(A, 0x11, &a), (B, 0x22, &b)] {
                let to = if from == A { B } else { A };
                let bytes = ib::build(*op, qp, 500 + i, &[], &data[r.clone()]);
                let p = RocePacket {
                    src: IpAddr::from(from),
                    dst: IpAddr::from(to),
                    src_port: 1,
                    ib: ib::parse(&bytes, true).unwrap(),
                    complete: true,
                    icrc_ok: None,
                    cm: None,
                };
                asm.push(n as u64 * 2 + 1 + u64::from(from == B), &p);
                out.extend(asm.drain());
            }
            if n < 2 {
                assert_eq!(asm.outstanding(), 2, "after packet {n} of each");
            }
        }
        asm.finish();
        out.extend(asm.drain());
        assert_eq!(asm.outstanding(), 0);
        let got: Vec<_> = out
            .iter()
            .map(|m| (m.flow.qp, m.length, m.packets, m.sha256.clone()))
            .collect();
        assert_eq!(got, [(0x11, 3000, 3, sha(&a)), (0x22, 3000, 3, sha(&b))]);
    }

    #[test]
    fn memory_stays_bounded_when_first_packets_never_come() {
        let mut asm = Assembler::with_limits(Limits {
            max_age: 100,
            max_pending: 50,
            max_requests: 10,
            max_flows: 8,
            keep_data: 0,
            hash_kept: true,
            ..Limits::default()
        });
        let mut reported = 0;
        for i in 0..10_000u32 {
            let bytes = ib::build(0x01, 0x11, i * 2, &[], &[0; 64]);
            let p = RocePacket {
                src: IpAddr::from(A),
                dst: IpAddr::from(B),
                src_port: 1,
                ib: ib::parse(&bytes, true).unwrap(),
                complete: true,
                icrc_ok: None,
                cm: None,
            };
            asm.push(u64::from(i), &p);
            reported += asm.drain().count();
            assert!(asm.outstanding() <= 50, "{}", asm.outstanding());
        }
        assert!(reported >= 9_950);
    }
}
