//! RDMAP messages put back together from DDP segments ([`Assembler`]).

use std::collections::{HashMap, VecDeque};

use serde::Serialize;

use super::{MpaUnit, Pdu, ReadRequest, StreamKey};
use crate::reasm::{reservation, FlowKey, Keep, Kind, Limits, Message, Payload};

/// An RDMAP message being put together.
#[derive(Debug)]
struct Open {
    kind: Kind,
    first_frame: u64,
    last_frame: u64,
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
    payload: Payload,
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

    /// Feeds one MPA unit with its DDP payload (as [`Decoder`](super::Decoder) hands them).
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
                let cap = reservation(read.map_or(0, |r| u64::from(r.size)), keep);
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
            payload: Payload::new(
                data,
                keep > 0 && !self.limits.hash_kept && kind != Kind::Send,
            ),
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
        let keep = Keep {
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
        self.kept -= o.payload.capacity();
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
        let (sha256, data) = o.payload.finish(incomplete.is_some());
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
            data,
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
/// messages' buffers, kept up to date.
fn absorb(o: &mut Open, d: &[u8], keep: Keep, kept: &mut usize, stats: &mut AssemblerStats) {
    if o.payload.absorb(d, keep, kept) {
        stats.data_dropped += 1;
    }
    o.length += d.len() as u64;
    o.next += d.len() as u64;
    o.segments += 1;
}
