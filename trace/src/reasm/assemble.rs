//! The RoCE reassembler: packets in capture order to messages ([`Assembler`]).

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

use super::payload::{hash_one, reservation, Frag, Keep, Open, Payload};
use super::{
    psn_add, psn_in, psn_sub, AtomicValues, FlowKey, Kind, Limits, Message, Stats, PSN_MASK,
};
use crate::ib::{AtomicEth, Op, Position, Reth};
use crate::RocePacket;

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
pub(super) const SPARE_BYTES: usize = 8 << 20;

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
                            payload: Payload::new(
                                self.payload_buffer(reth),
                                self.limits.keep_data > 0
                                    && !self.limits.hash_kept
                                    && kind != Kind::Send,
                            ),
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
        self.kept -= o.payload.capacity();
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
        let (sha256, data) = o.payload.finish(incomplete.is_some());
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
            data,
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
        let cap = reservation(
            reth.map_or(0, |r| u64::from(r.dma_len)),
            self.limits.keep_data,
        );
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
            if let Some(flow) = self.flows.remove(&key) {
                let why = "given up: too many flows";
                self.give_up_flow(key, flow, why, why);
            }
        }
    }

    /// Reports everything a removed flow still held, in frame order: its open messages
    /// as incomplete (`why_open`) and its pending packets as orphans (`why_pending`).
    fn give_up_flow(&mut self, key: FlowKey, mut flow: Flow, why_open: &str, why_pending: &str) {
        flow.open.sort_by_key(|o| o.first_frame);
        for o in flow.open.drain(..) {
            self.give_up(key, o, why_open);
        }
        let mut pending: Vec<(u32, Frag)> = flow.pending.drain().collect();
        self.pending_total -= pending.len();
        pending.sort_by_key(|(_, f)| f.frame);
        for (psn, f) in pending {
            self.orphan(key, psn, f, why_pending);
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
        for (key, flow) in flows {
            self.give_up_flow(
                key,
                flow,
                "capture ended before its LAST",
                "packet whose FIRST is not in the capture",
            );
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
