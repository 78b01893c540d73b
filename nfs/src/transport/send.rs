//! Sending a call: what a call in flight holds ([`Pending`], the chunks
//! lent to it), how its message goes ([`Plan`]: inline, its payload in a
//! read chunk, or the whole message as `RDMA_NOMSG`), and [`marshal`],
//! which takes its chunks, writes the transport header and the message
//! into a send buffer and posts it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rdma::{AccessFlags, MemoryRegion, SendWr};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::conn::{next_id, Conn};
use super::{Call, Error, Negotiated, Reply, Result, Stats};
use crate::chunks::{Chunk, Fill, MAX_REGION};
use crate::rpcrdma::{Body, Chunks, Header, ReadSegment, Segment, VERSION};
use crate::xdr::{pad, Writer};

/// A call in flight: what to send again after a reconnection, the chunks
/// its reply may use (released when it ends), where its reply goes.
pub(super) struct Pending {
    pub(super) call: Call,
    pub(super) reply: oneshot::Sender<Result<Reply>>,
    pub(super) deadline: Instant,
    pub(super) sent: u32,
    /// The call's payload is the first read chunk's memory, not in `call`.
    pub(super) payload_in_chunk: bool,
    pub(super) chunks: Vec<Lent>,
    pub(super) write: Option<Lent>,
    pub(super) reply_chunk: Option<Lent>,
    /// Rkeys of its chunks that the server invalidated with the reply to
    /// another call (a receive completion named them): invalid already, so
    /// they take no `LOCAL_INV` (on Linux 6.1's rxe a `LOCAL_INV` of a
    /// window already invalidated crashes the kernel).
    pub(super) remote: Vec<u32>,
    /// The work request of its last window's bind (all of them precede
    /// its SEND on the send queue).
    pub(super) last_bind: u64,
}

impl Pending {
    /// Whether the call lent a chunk under `rkey`.
    pub(super) fn lends(&self, rkey: u32) -> bool {
        self.chunks
            .iter()
            .chain(self.write.as_ref())
            .chain(self.reply_chunk.as_ref())
            .any(|l| l.chunk.as_ref().is_some_and(|c| c.segment().handle == rkey))
    }

    pub(super) fn lent(&mut self) -> impl Iterator<Item = &mut Lent> {
        self.chunks
            .iter_mut()
            .chain(self.write.as_mut())
            .chain(self.reply_chunk.as_mut())
    }
}

/// A chunk lent to a call, counted in [`Stats::chunks_registered`] while it
/// is; dropping it deregisters the memory or deallocates the window (its
/// rkey is then invalid).
pub(super) struct Lent {
    pub(super) chunk: Option<Chunk>,
    pub(super) stats: Arc<Stats>,
}

impl Lent {
    fn new(chunk: Chunk, stats: &Arc<Stats>) -> Lent {
        stats.chunks_registered.fetch_add(1, Ordering::Relaxed);
        Lent {
            chunk: Some(chunk),
            stats: Arc::clone(stats),
        }
    }

    fn segment(&self) -> Segment {
        self.chunk.as_ref().map(Chunk::segment).unwrap_or(Segment {
            handle: 0,
            length: 0,
            offset: 0,
        })
    }

    pub(super) fn len(&self) -> usize {
        self.chunk.as_ref().map_or(0, Chunk::len)
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.stats.chunks_registered.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How a call's message goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Carry {
    /// Inline, payload and all.
    Inline,
    /// The payload in a data-bearing read chunk.
    Payload,
    /// The whole message as a position-zero read chunk (`RDMA_NOMSG`).
    Whole,
}

/// A call's chunks, decided before any is taken.
pub(super) struct Plan {
    write: usize,
    reply: usize,
    carry: Carry,
}

impl Plan {
    pub(super) fn new(call: &Call, n: &Negotiated) -> Plan {
        let write = call.write_chunk;
        let reply = if call.max_reply > n.inline_recv {
            call.max_reply
        } else {
            0
        };
        let none = Segment {
            handle: 0,
            length: 0,
            offset: 0,
        };
        let mut chunks = Chunks::default();
        if write > 0 {
            chunks.write.push(vec![none]);
        }
        if reply > 0 {
            chunks.reply = Some(vec![none]);
        }
        let header_len = |c: &Chunks| {
            let mut w = Writer::new();
            Header {
                xid: 0,
                vers: VERSION,
                credits: 0,
                body: Body::Msg(c.clone()),
            }
            .encode(&mut w);
            w.len()
        };
        let payload_len = call.payload.len() + pad(call.payload.len());
        let read_seg_len = 4 + 4 + 16;
        let limit = n.inline_send;
        let carry = if header_len(&chunks) + call.msg.len() + payload_len <= limit {
            Carry::Inline
        } else if !call.payload.is_empty()
            && header_len(&chunks) + read_seg_len + call.msg.len() <= limit
        {
            Carry::Payload
        } else {
            Carry::Whole
        };
        Plan {
            write,
            reply,
            carry,
        }
    }

    pub(super) fn sizes(&self, call: &Call) -> Vec<usize> {
        let mut v = Vec::with_capacity(3);
        if self.write > 0 {
            v.push(self.write);
        }
        if self.reply > 0 {
            v.push(self.reply);
        }
        match self.carry {
            Carry::Inline => {}
            Carry::Payload => v.push(call.payload.len()),
            Carry::Whole => v.push(call.msg.len() + call.payload.len() + pad(call.payload.len())),
        }
        v
    }
}

/// Marshals the call `p` as `plan` says and posts it on `conn`: its chunks
/// taken from the connection's pool, the transport header, the message
/// copied into a send buffer. A failure leaves the chunks taken in `p`.
pub(super) fn marshal(
    conn: &mut Conn,
    stats: &Arc<Stats>,
    credits: u32,
    xid: u32,
    p: &mut Pending,
    plan: &Plan,
) -> Result<()> {
    let call = &mut p.call;
    call.msg[..4].copy_from_slice(&xid.to_be_bytes());
    let limit = conn.negotiated.inline_send;
    let mut chunks = Chunks::default();
    let Conn {
        qp,
        chunks: pool,
        next_wr,
        ..
    } = conn;
    let remote_write = AccessFlags::REMOTE_WRITE;
    if plan.write > 0 {
        let c = pool.take(qp, next_id(next_wr), plan.write, Fill::Zero, remote_write)?;
        let l = Lent::new(c, stats);
        chunks.write.push(vec![l.segment()]);
        p.write = Some(l);
    }
    if plan.reply > 0 {
        let c = pool.take(qp, next_id(next_wr), plan.reply, Fill::Zero, remote_write)?;
        let l = Lent::new(c, stats);
        chunks.reply = Some(vec![l.segment()]);
        p.reply_chunk = Some(l);
    }
    let pad_bytes = [0u8; 4];
    let pad_len = pad(call.payload.len());
    match plan.carry {
        Carry::Inline => {
            stats.inline_calls.fetch_add(1, Ordering::Relaxed);
        }
        Carry::Payload => {
            // Per-call registration moves the payload into the chunk (no
            // copy; a retransmission takes it back out); a pooled region
            // gets a copy and the call keeps it.
            let len = call.payload.len();
            let one: [&[u8]; 1];
            let fill = if pool.windows() && len <= MAX_REGION {
                one = [call.payload.as_slice()];
                Fill::Pieces(&one)
            } else {
                p.payload_in_chunk = true;
                Fill::Move(std::mem::take(&mut call.payload).into_vec())
            };
            let c = pool.take(qp, next_id(next_wr), len, fill, AccessFlags::REMOTE_READ)?;
            let l = Lent::new(c, stats);
            chunks.read.push(ReadSegment {
                position: u32::try_from(call.msg.len()).unwrap_or(u32::MAX),
                segment: l.segment(),
            });
            p.chunks.push(l);
            stats.read_chunk_calls.fetch_add(1, Ordering::Relaxed);
        }
        Carry::Whole => {
            // msg, payload and its XDR pad, copied once into the chunk.
            let len = call.msg.len() + call.payload.len() + pad_len;
            let pieces: [&[u8]; 3] = [&call.msg, call.payload.as_slice(), &pad_bytes[..pad_len]];
            let c = pool.take(
                qp,
                next_id(next_wr),
                len,
                Fill::Pieces(&pieces),
                AccessFlags::REMOTE_READ,
            )?;
            let l = Lent::new(c, stats);
            chunks.read.push(ReadSegment {
                position: 0,
                segment: l.segment(),
            });
            p.chunks.push(l);
            stats.nomsg_calls.fetch_add(1, Ordering::Relaxed);
        }
    }
    // Every bind of the call was posted with an id up to here.
    p.last_bind = *next_wr;
    let body = if plan.carry == Carry::Whole {
        Body::NoMsg(chunks)
    } else {
        Body::Msg(chunks)
    };
    let mut out = Writer::new();
    Header {
        xid,
        vers: VERSION,
        credits,
        body,
    }
    .encode(&mut out);
    if plan.carry == Carry::Whole && out.len() > limit {
        return Err(Error::Permanent(format!(
            "the call's transport header alone exceeds the inline threshold {limit}"
        )));
    }
    let Some(mut slot) = conn.send_pool.take() else {
        return Err(Error::NoBuffers("no send buffer".into()));
    };
    // The header, then the message (and an inline payload) copied
    // straight into the registered send buffer.
    let mut at = 0;
    let mut put = |slot: &mut MemoryRegion, b: &[u8]| {
        let r = slot.write_at(at, b);
        at += b.len();
        r
    };
    let mut w = put(&mut slot, &out.buf);
    if plan.carry != Carry::Whole {
        w = w.and_then(|()| put(&mut slot, &call.msg));
        if plan.carry == Carry::Inline {
            w = w
                .and_then(|()| put(&mut slot, call.payload.as_slice()))
                .and_then(|()| put(&mut slot, &pad_bytes[..pad_len]));
        }
    }
    if let Err(e) = w {
        let _ = conn.send_pool.put(slot);
        return Err(Error::Permanent(format!("send buffer: {e}")));
    }
    let tail = if at < slot.len() {
        slot.split_off(at).ok()
    } else {
        None
    };
    let wr = conn.next_id();
    if let Err(e) = conn.qp.post_send(SendWr::send(wr, slot)) {
        let why = format!("ibv_post_send: {}", e.error);
        if let Some(mut buf) = e
            .returned
            .into_iter()
            .next()
            .and_then(|(_, b)| b.into_one())
        {
            if let Some(t) = tail {
                let _ = buf.unsplit(t);
            }
            let _ = conn.send_pool.put(buf);
        }
        return Err(Error::NotConnected(why));
    }
    if let Some(t) = tail {
        conn.tails.insert(wr, t);
    }
    Ok(())
}
