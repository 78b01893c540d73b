//! The sending side of [`Engine`]: messages and data posted to the peer's
//! receive buffer (WRITE WITH IMMEDIATE, or on iWARP a WRITE and a 4-byte
//! SEND), what may go now (credits, room in the send queue and the peer's
//! buffer), coalescing, and direct placement beside the stream (`iomap.rs`).

use std::io;

use rdma::{PreparedSend, QueuePair, RemoteMemory, SendFlags, SendOp, SendWr};

use super::{Engine, COALESCE_LIMIT, MSG_SEND};
use crate::wire::{self, Op, Sge};

/// The inline requests every message and small write goes out as, checked
/// once when the connection starts (`QueuePair::prepare_inline`): a post
/// sets the target and the message and hands the provider the bytes, which
/// it copies, so nothing is lent and the send queue keeps the `wr_id` alone.
#[derive(Debug)]
pub(super) struct Inline {
    /// RDMA WRITE WITH IMMEDIATE: data and its message (InfiniBand, RoCE).
    write_imm: PreparedSend,
    /// RDMA WRITE: data on iWARP, and direct placement's plain writes.
    write: PreparedSend,
    /// SEND: a message on iWARP (4 bytes).
    send: PreparedSend,
}

/// A post on a connection whose inline requests could not be prepared
/// (`Engine::new` failed the connection already; this is what a post says).
#[cold]
fn unprepared() -> rdma::Error {
    rdma::Error::InvalidArgument {
        verb: "ibv_post_send",
        reason: "the connection's inline requests could not be prepared".into(),
    }
}

impl Inline {
    pub(super) fn new(qp: &QueuePair) -> rdma::Result<Inline> {
        let nowhere = RemoteMemory {
            addr: 0,
            len: 0,
            rkey: 0,
        };
        Ok(Inline {
            write_imm: qp.prepare_inline(SendOp::WriteWithImm(nowhere, 0), SendFlags::SIGNALED)?,
            write: qp.prepare_inline(SendOp::Write(nowhere), SendFlags::SIGNALED)?,
            send: qp.prepare_inline(SendOp::Send, SendFlags::SIGNALED)?,
        })
    }
}

impl Engine {
    /// Posts a message alone: a zero-length WRITE WITH IMMEDIATE, or a
    /// 4-byte SEND on iWARP. `ctrl`: it takes a control slot.
    pub(super) fn post_msg(&mut self, msg: u32, ctrl: bool) -> Result<(), String> {
        let r = if self.iwarp {
            self.post_send(u64::from(msg), msg)
        } else {
            let to = RemoteMemory {
                addr: self.remote_sgl.addr,
                len: 0,
                rkey: self.remote_sgl.key,
            };
            self.post_write_imm(&[], to, msg)
        };
        r.map_err(|e| format!("posting a message: {e}"))?;
        if ctrl {
            self.ctrl_posted += 1;
        }
        Ok(())
    }

    /// Posts `data` (inline) written to `to` with `msg`: one WRITE WITH
    /// IMMEDIATE, or on iWARP a WRITE and the message's SEND.
    pub(super) fn post_write_msg(
        &mut self,
        data: &[u8],
        to: RemoteMemory,
        msg: u32,
        ctrl: bool,
    ) -> Result<(), String> {
        if self.iwarp {
            self.post_write(u64::from(msg), data, to)
                .map_err(|e| format!("posting an RDMA WRITE: {e}"))?;
            if ctrl {
                self.ctrl_posted += 1;
            }
            let m = wire::msg(wire::msg_op(msg), 0);
            self.post_send(MSG_SEND | u64::from(m), msg)
                .map_err(|e| format!("posting a message: {e}"))?;
        } else {
            self.post_write_imm(data, to, msg)
                .map_err(|e| format!("posting an RDMA WRITE WITH IMMEDIATE: {e}"))?;
        }
        if ctrl {
            self.ctrl_posted += 1;
        }
        Ok(())
    }

    /// Posts `data` inline to `to` with `msg` as the immediate data (and
    /// the `wr_id`).
    #[inline]
    fn post_write_imm(&mut self, data: &[u8], to: RemoteMemory, msg: u32) -> rdma::Result<()> {
        let Some(inline) = &mut self.inline else {
            return Err(unprepared());
        };
        let p = &mut inline.write_imm;
        p.set_remote(to)?;
        p.set_imm(msg)?;
        self.qp.post_prepared_inline(p, u64::from(msg), data)
    }

    /// Posts `data` inline to `to` (an RDMA WRITE).
    #[inline]
    fn post_write(&mut self, wr_id: u64, data: &[u8], to: RemoteMemory) -> rdma::Result<()> {
        let Some(inline) = &mut self.inline else {
            return Err(unprepared());
        };
        let p = &mut inline.write;
        p.set_remote(to)?;
        self.qp.post_prepared_inline(p, wr_id, data)
    }

    /// Posts `msg` as a 4-byte SEND (iWARP's message).
    #[inline]
    fn post_send(&mut self, wr_id: u64, msg: u32) -> rdma::Result<()> {
        let Some(inline) = &mut self.inline else {
            return Err(unprepared());
        };
        self.qp
            .post_prepared_inline(&mut inline.send, wr_id, &msg.to_ne_bytes())
    }

    /// The current target segment, refreshed from the target SGL when the
    /// last one is used up: a non-zero length there is a new one (we zero
    /// each slot as we take it).
    #[inline]
    pub(super) fn segment(&mut self) -> u32 {
        if self.seg.length == 0 {
            self.next_segment();
        }
        self.seg.length
    }

    /// [`Engine::segment`] once the last one is used up.
    #[inline(never)]
    fn next_segment(&mut self) {
        let mut b = [0; wire::SGE_LEN];
        let at = self.target_slot * wire::SGE_LEN;
        if self.local.target.read_at(at, &mut b).is_ok() {
            let s = Sge::from_memory(&b);
            if s.length != 0 {
                self.seg = s;
                // Taken: the peer writes this slot again only after we
                // filled this space and it was read.
                let _ = self.local.target.write_at(at + 12, &[0; 4]);
            }
        }
    }

    pub(super) fn can_send(&mut self) -> bool {
        let sqes = if self.iwarp { 2 } else { 1 };
        self.may_send
            && self.sqe_avail >= sqes
            && self.sseq_no != self.sseq_comp
            && self.local.ring.largest() > 0
            && self.segment() != 0
    }

    /// Sends as much of `buf` as credits, the peer's space and our queue
    /// allow (with coalescing on, holds a short `buf` while data is in
    /// flight): `Ok(None)` when nothing could go (wait for completions).
    #[inline]
    pub(crate) fn try_write(&mut self, buf: &[u8]) -> io::Result<Option<usize>> {
        if let Some(sent) = self.write_small(buf) {
            return sent;
        }
        self.write_any(buf)
    }

    /// The common small write, whole as one inline message when nothing
    /// waits before it (coalescing off or nothing held) and it fits the
    /// credits and the peer's space; `None` leaves it to
    /// [`Engine::write_any`] (which also says why a write cannot go).
    #[inline]
    fn write_small(&mut self, buf: &[u8]) -> Option<io::Result<Option<usize>>> {
        let sqes = if self.iwarp { 2 } else { 1 };
        let len = buf.len();
        if !(len != 0
            && len <= self.max_inline
            && self.nodelay
            && self.pending.is_empty()
            && self.writable
            && self.connected
            && self.may_send
            && self.sqe_avail >= sqes
            && self.sseq_no != self.sseq_comp
            && self.segment() as usize >= len)
        {
            return None;
        }
        // A failed connection is not connected: nothing to check there.
        let to = RemoteMemory {
            addr: self.seg.addr,
            len: len as u64,
            rkey: self.seg.key,
        };
        let msg = wire::msg(Op::DATA, len as u32);
        let posted = if self.iwarp {
            self.post_write_msg(buf, to, msg, false)
        } else {
            self.post_write_imm(buf, to, msg)
                .map_err(|e| format!("posting an RDMA WRITE WITH IMMEDIATE: {e}"))
        };
        if let Err(why) = posted {
            return Some(Err(self.post_failed(why)));
        }
        self.sent(len, sqes);
        Some(Ok(Some(len)))
    }

    /// A transfer of `xfer` bytes (`sqes` requests) went: the credit, the
    /// queue entries and the peer's space it took.
    #[inline]
    fn sent(&mut self, xfer: usize, sqes: u32) {
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= sqes;
        self.seg.addr += xfer as u64;
        self.seg.length -= xfer as u32;
        if self.seg.length == 0 {
            self.target_slot = (self.target_slot + 1) % wire::SGL_ENTRIES;
        }
    }

    /// A post failed (`why`): the connection fails, and the error says so.
    #[cold]
    fn post_failed(&mut self, why: String) -> io::Error {
        self.fail(io::ErrorKind::ConnectionAborted, why);
        self.error().unwrap_or_else(|| io::ErrorKind::Other.into())
    }

    /// [`Engine::try_write`] of any write: coalescing, large writes in
    /// transfers, and why a write cannot go.
    #[inline(never)]
    fn write_any(&mut self, buf: &[u8]) -> io::Result<Option<usize>> {
        self.check_writable()?;
        if buf.is_empty() {
            return Ok(Some(0));
        }
        if !self.nodelay && buf.len() < COALESCE_LIMIT {
            // Nagle's rule: a short write waits while data is in flight;
            // what waits goes once it would reach the limit.
            if self.pending.len() + buf.len() > COALESCE_LIMIT && !self.send_pending()? {
                return Ok(None);
            }
            if !self.pending.is_empty() || self.data_in_flight() {
                self.pending.extend_from_slice(buf);
                return Ok(Some(buf.len()));
            }
        }
        if !self.send_pending()? {
            return Ok(None);
        }
        let sent = self.send_now(buf)?;
        Ok((sent > 0).then_some(sent))
    }

    pub(super) fn check_writable(&self) -> io::Result<()> {
        if let Some(e) = self.error() {
            return Err(e);
        }
        if !self.writable || !self.connected {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the stream is shut down for writing (or the peer closed it)",
            ));
        }
        Ok(())
    }

    /// Data writes posted and not completed.
    pub(super) fn data_in_flight(&self) -> bool {
        self.sqe_avail < self.local.sizes.send_queue - wire::CONTROL_SLOTS
    }

    /// Sends what coalescing held; whether all of it went.
    pub(super) fn send_pending(&mut self) -> io::Result<bool> {
        if self.pending.is_empty() {
            return Ok(true);
        }
        let pending = std::mem::take(&mut self.pending);
        let r = self.send_now(&pending);
        self.pending = pending;
        self.pending.drain(..*r.as_ref().unwrap_or(&0));
        r?;
        Ok(self.pending.is_empty())
    }

    /// Turns coalescing off (`true`, the default) or on; turned off, what
    /// was held is sent as soon as it can be.
    pub(crate) fn set_nodelay(&mut self, nodelay: bool) {
        self.nodelay = nodelay;
        if nodelay {
            // A failure is kept in `failed` for the next call.
            let _ = self.send_pending();
        }
    }

    pub(crate) fn nodelay(&self) -> bool {
        self.nodelay
    }

    /// Sends what coalescing held: `Ok(None)` while some of it cannot go
    /// yet (wait for completions).
    pub(crate) fn try_flush(&mut self) -> io::Result<Option<()>> {
        if let Some(e) = self.error() {
            return Err(e);
        }
        Ok(self.send_pending()?.then_some(()))
    }

    /// Posts as much of `buf` as credits, the peer's space and our queue
    /// allow; how many bytes went (0: wait for completions).
    ///
    /// A write on an idle connection starts with a transfer of
    /// [`wire::FIRST_TRANSFER`] bytes, each next one twice the last (up to
    /// [`wire::MAX_TRANSFER`]), so the receiver has the first bytes early,
    /// as rsocket's `rsend` starts every call. While earlier transfers are
    /// still in flight (or the last write had to wait for room) the
    /// receiver is busy with those anyway, and the sizes go on where they
    /// were: a stream of 64 KiB writes goes as one WRITE each, not as
    /// rsocket's six (2, 4, 8, 16, 32 and 2 KiB), each a post, a completion
    /// on both sides and a message credit.
    pub(super) fn send_now(&mut self, buf: &[u8]) -> io::Result<usize> {
        if !self.write_waited && !self.data_in_flight() {
            self.next_transfer = wire::FIRST_TRANSFER;
        }
        let mut sent = 0;
        while sent < buf.len() && self.can_send() {
            let left = buf.len() - sent;
            let mut xfer = left.min(self.next_transfer).min(self.seg.length as usize);
            if left > self.next_transfer && self.next_transfer < wire::MAX_TRANSFER {
                self.next_transfer *= 2;
            }
            let inline = xfer <= self.max_inline;
            if !inline {
                xfer = xfer.min(self.local.ring.largest());
            }
            let to = RemoteMemory {
                addr: self.seg.addr,
                len: xfer as u64,
                rkey: self.seg.key,
            };
            let msg = wire::msg(Op::DATA, xfer as u32);
            let data = &buf[sent..sent + xfer];
            let posted = if inline {
                self.post_write_msg(data, to, msg, false)
            } else {
                self.post_data(data, to, msg)
            };
            if let Err(why) = posted {
                return Err(self.post_failed(why));
            }
            self.sent(xfer, if self.iwarp { 2 } else { 1 });
            sent += xfer;
        }
        self.write_waited = sent < buf.len();
        Ok(sent)
    }

    /// Copies `data` into a piece of the send buffer and posts it as `op`.
    pub(super) fn post_piece(&mut self, data: &[u8], wr_id: u64, op: SendOp) -> Result<(), String> {
        let Some(piece) = self.local.ring.cut(data) else {
            return Err("no send buffer (checked before)".into());
        };
        debug_assert_eq!(piece.len(), data.len());
        if let Err(e) = self.qp.post_send(SendWr::new(wr_id, op, piece)) {
            for (_, b) in e.returned {
                if let Some(p) = b.into_one() {
                    self.local.ring.give_back(p);
                }
            }
            return Err(format!("posting an RDMA WRITE: {}", e.error));
        }
        Ok(())
    }

    /// Copies `data` into a piece of the send buffer and posts it (on
    /// iWARP with the message's SEND).
    pub(super) fn post_data(
        &mut self,
        data: &[u8],
        to: RemoteMemory,
        msg: u32,
    ) -> Result<(), String> {
        let op = if self.iwarp {
            SendOp::Write(to)
        } else {
            SendOp::WriteWithImm(to, msg)
        };
        self.post_piece(data, u64::from(msg), op)?;
        if self.iwarp {
            let m = wire::msg(Op::DATA, 0);
            self.post_send(MSG_SEND | u64::from(m), msg)
                .map_err(|e| format!("posting a message: {e}"))?;
        }
        Ok(())
    }

    /// Posts `data` to `to` beside the stream (`iomap.rs`): with `msg`
    /// (rsocket's IOMAP_SGL), as a message, which takes a credit; without,
    /// as a plain RDMA WRITE (`riowrite`), which takes none. How many bytes
    /// went (a message goes whole), `Ok(None)` when nothing could (wait
    /// for completions).
    pub(crate) fn try_post_direct(
        &mut self,
        data: &[u8],
        to: RemoteMemory,
        msg: Option<u32>,
    ) -> io::Result<Option<usize>> {
        self.check_writable()?;
        let sqes = if self.iwarp && msg.is_some() { 2 } else { 1 };
        let credit = msg.is_none() || self.sseq_no != self.sseq_comp;
        if !(self.may_send && credit && self.sqe_avail >= sqes) {
            return Ok(None);
        }
        let mut len = data.len().min(wire::MAX_TRANSFER);
        if len > self.max_inline {
            len = len.min(self.local.ring.largest());
        }
        if len == 0 || (msg.is_some() && len < data.len()) {
            return Ok(None);
        }
        let to = RemoteMemory {
            len: len as u64,
            ..to
        };
        let posted = match msg {
            Some(m) if len <= self.max_inline => self.post_write_msg(data, to, m, false),
            Some(m) => self.post_data(data, to, m),
            None => {
                let wr_id = u64::from(wire::msg(Op::WRITE, len as u32));
                if len <= self.max_inline {
                    self.post_write(wr_id, &data[..len], to)
                        .map_err(|e| format!("posting an RDMA WRITE: {e}"))
                } else {
                    self.post_piece(&data[..len], wr_id, SendOp::Write(to))
                }
            }
        };
        if let Err(why) = posted {
            self.fail(io::ErrorKind::ConnectionAborted, why);
            return Err(self.error().unwrap_or_else(|| io::ErrorKind::Other.into()));
        }
        if msg.is_some() {
            self.sseq_no = self.sseq_no.wrapping_add(1);
        }
        self.sqe_avail -= sqes;
        Ok(Some(len))
    }
}
