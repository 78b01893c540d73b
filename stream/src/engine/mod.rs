//! The protocol state of one connection: what may be sent (credits, the
//! peer's receive space, room in the send queue and buffer), what was
//! received and not read, and the control messages, driven by completions.
//!
//! The engine never waits: [`Engine::try_write`] and [`Engine::try_read`]
//! say `None` when they would block, and [`Engine::complete`] takes each
//! completion the caller polled (the blocking stream sleeps on the CQ's
//! channel, the async one on its reactor). Everything the peer sends is
//! checked before it is believed: a message beyond the credits granted,
//! data beyond the receive space granted, an unknown operation are
//! protocol errors that end the connection, never a write outside the
//! buffers (which the device's rkey checks bound anyway) nor a panic.

use std::collections::VecDeque;
use std::io;

use rdma::{
    CompletionQueue, MemoryRegion, QpState, QueuePair, RemoteMemory, WcStatus, WorkCompletion,
    WrBuffers,
};

use crate::local::{Local, RECV};
use crate::wire::{self, ConnData, Ctrl, Op, Sge};

mod send;

/// `wr_id` bit of the 4-byte SEND that carries a message on iWARP.
const MSG_SEND: u64 = 1 << 62;
/// With coalescing on, writes shorter than this wait while data is in
/// flight, and the bytes held stay under it: rsocket's first transfer of a
/// large write, this protocol's nearest thing to TCP's segment size.
pub(crate) const COALESCE_LIMIT: usize = wire::FIRST_TRANSFER;

/// Completions taken by one `ibv_poll_cq` of [`Engine::poll`].
const POLL_BATCH: usize = 32;

/// What [`Engine::poll`] and [`Engine::poll_with`] poll into, kept from
/// poll to poll (nothing in it outlives a poll): every completion the
/// engine takes comes through it, in the compact form.
pub(crate) struct Polled {
    wcs: [WorkCompletion; POLL_BATCH],
    /// The memory the completions gave back: the send ring's pieces.
    memory: Vec<(u64, WrBuffers)>,
}

impl Polled {
    /// Room for one compact poll: the completions, and the memory they
    /// give back (see [`Engine::take`]).
    pub(crate) fn batch(&mut self) -> (&mut [WorkCompletion], &mut Vec<(u64, WrBuffers)>) {
        (&mut self.wcs, &mut self.memory)
    }
}

impl Default for Polled {
    fn default() -> Self {
        Polled {
            wcs: [WorkCompletion::default(); POLL_BATCH],
            memory: Vec::with_capacity(POLL_BATCH),
        }
    }
}

/// One connection's protocol state.
#[derive(Debug)]
pub(crate) struct Engine {
    local: Local,
    iwarp: bool,
    pub(crate) peer_big_endian: bool,
    max_inline: usize,
    // --- sending ---
    /// Send queue entries free for data.
    sqe_avail: u32,
    /// Control messages posted and completed (at most `CONTROL_SLOTS` apart).
    ctrl_posted: u32,
    ctrl_done: u32,
    /// Messages sent, and the limit the peer granted.
    sseq_no: u16,
    sseq_comp: u16,
    /// The peer's receive space being filled, and which target slot it came
    /// from.
    seg: Sge,
    target_slot: usize,
    /// The peer's target SGL (where our credits' new space goes), and the
    /// next slot of it.
    remote_sgl: Sge,
    remote_slot: usize,
    /// The next transfer of a large write (doubles to `MAX_TRANSFER`;
    /// back to the first size when a write finds nothing in flight).
    next_transfer: usize,
    /// The last write could not all go (it waits for room): the next one
    /// goes on with its transfer sizes.
    write_waited: bool,
    /// Every write is sent at once (the default, as rsocket's `rsend`);
    /// off, small writes wait in `pending` while data is in flight.
    nodelay: bool,
    /// Bytes written and not yet sent (coalescing, at most
    /// [`COALESCE_LIMIT`]): they go before anything written later.
    pending: Vec<u8>,
    // --- receiving ---
    /// Lengths of data messages received and not read, oldest first.
    unread: VecDeque<u32>,
    /// Where the next unread byte is in the receive buffer.
    read_offset: usize,
    /// Receive space read by the application and not yet granted again.
    rbuf_avail: usize,
    /// Where the next half to grant starts.
    rbuf_free_offset: usize,
    /// Data messages read, and the sequence at which to grant more.
    rseq_no: u16,
    rseq_comp: u16,
    /// Bytes granted to the peer and bytes it wrote, since the start.
    granted: u64,
    received: u64,
    /// Data messages received, and the limit last granted (rsocket's
    /// wrapping 16-bit sequence): a message at the limit is refused.
    recv_seq: u16,
    recv_limit: u16,
    /// Whether we may post: a passive iWARP side waits for the active
    /// side's first message (MPA's initiator speaks first; siw failed about
    /// 1 connection in 20 when the accepting side sent its credits at once).
    may_send: bool,
    // --- state ---
    /// The peer may still send (no SHUTDOWN or DISCONNECT seen).
    readable: bool,
    /// We may still send (no shutdown of our write side).
    writable: bool,
    /// The connection is up (not disconnected nor failed).
    connected: bool,
    /// Nothing more is awaited from the peer: its DISCONNECT was taken,
    /// the connection ended or failed, or a close stopped waiting. A closed
    /// stream waits for this before it lets its queue pair go
    /// (`linger.rs`).
    peer_closed: bool,
    /// Why the connection failed, for every later call.
    failed: Option<(io::ErrorKind, String)>,
    // --- direct placement (`iomap.rs` drives it) ---
    /// The peer's direct-placement table (`length`: its entries, 0 if none).
    pub(crate) peer_iomap: Sge,
    /// Our regions the peer may write, by their index in our table: kept
    /// here so they live as long as the queue pair, or until unmapped.
    pub(crate) mapped: Vec<Option<MemoryRegion>>,
    /// The inline requests (prepared with the QP; `None` only if that
    /// failed, and then the connection failed with it).
    inline: Option<send::Inline>,
    qp: QueuePair,
}

impl Engine {
    /// The state of a connection whose peer sent `peer`.
    /// `passive`: this side accepted the connection.
    pub(crate) fn new(
        qp: QueuePair,
        local: Local,
        peer: &ConnData,
        iwarp: bool,
        passive: bool,
    ) -> Engine {
        let sizes = local.sizes;
        let half = sizes.recv_buffer / 2;
        let max_inline = qp.caps().max_inline_data as usize;
        let inline = send::Inline::new(&qp);
        let mut e = Engine {
            iwarp,
            peer_big_endian: peer.big_endian(),
            max_inline,
            sqe_avail: sizes.send_queue - wire::CONTROL_SLOTS,
            ctrl_posted: 0,
            ctrl_done: 0,
            sseq_no: 0,
            sseq_comp: peer.credits,
            seg: peer.data_buf,
            target_slot: 0,
            remote_sgl: peer.target_sgl,
            remote_slot: 1,
            next_transfer: wire::FIRST_TRANSFER,
            write_waited: false,
            nodelay: true,
            pending: Vec::new(),
            unread: VecDeque::with_capacity(sizes.recv_queue as usize),
            read_offset: 0,
            rbuf_avail: half,
            rbuf_free_offset: half,
            rseq_no: 0,
            rseq_comp: (sizes.recv_queue / 2) as u16,
            granted: half as u64,
            received: 0,
            recv_seq: 0,
            recv_limit: sizes.recv_queue as u16,
            may_send: !(iwarp && passive),
            readable: true,
            writable: true,
            connected: true,
            peer_closed: false,
            failed: None,
            peer_iomap: Sge {
                addr: peer.target_sgl.addr + (wire::SGL_ENTRIES * wire::SGE_LEN) as u64,
                key: peer.target_sgl.key,
                length: if peer.flags & wire::FLAG_IOMAP != 0 {
                    wire::scale_to_value(peer.target_iomap_size)
                } else {
                    0
                },
            },
            mapped: Vec::new(),
            inline: None,
            local,
            qp,
        };
        match inline {
            Ok(i) => e.inline = Some(i),
            Err(err) => e.fail(
                io::ErrorKind::ConnectionAborted,
                format!("preparing the connection's inline sends: {err}"),
            ),
        }
        e
    }

    fn fail(&mut self, kind: io::ErrorKind, why: String) {
        if self.failed.is_none() {
            log::debug!("rsocket stream failed: {why}");
            self.failed = Some((kind, why));
        }
        self.connected = false;
        self.readable = false;
        self.peer_closed = true;
    }

    fn error(&self) -> Option<io::Error> {
        self.failed
            .as_ref()
            .map(|(k, why)| io::Error::new(*k, why.clone()))
    }

    /// The peer disconnected at the connection manager (or its QP failed):
    /// data already received stays readable; a peer that closed without its
    /// DISCONNECT message reset the connection.
    pub(crate) fn peer_gone(&mut self) {
        self.lost("the peer disconnected without closing the stream");
    }

    /// The connection ended under us (`why`): a reset unless the peer had
    /// closed its side first; nothing is sent any more.
    fn lost(&mut self, why: &str) {
        if self.readable && self.connected {
            self.fail(io::ErrorKind::ConnectionReset, why.into());
        }
        self.connected = false;
        self.writable = false;
        self.peer_closed = true;
    }

    fn protocol_error(&mut self, why: String) {
        self.fail(
            io::ErrorKind::InvalidData,
            format!("rsocket protocol error: {why}"),
        );
    }

    /// Polls every completion `cq` (the connection's) holds into the
    /// engine, with the compact poll (`CompletionQueue::poll_wc`): the
    /// completions stay in `p`, and only the send ring's pieces move;
    /// whether any came. Then grants what the completions allow.
    ///
    /// # Errors
    /// The poll's (a CQ overrun).
    #[inline]
    pub(crate) fn poll(&mut self, cq: &CompletionQueue, p: &mut Polled) -> rdma::Result<bool> {
        self.poll_with(p, |wcs, memory| cq.poll_wc(wcs, memory))
    }

    /// [`Engine::poll`] with another compact poll of the connection's CQ
    /// (the async stream's, which takes what its `AsyncCq` buffered
    /// first): `poll` fills the completions and appends their memory, and
    /// says how many; it is called until it returns fewer than a batch.
    ///
    /// # Errors
    /// The poll's.
    #[inline]
    pub(crate) fn poll_with(
        &mut self,
        p: &mut Polled,
        mut poll: impl FnMut(&mut [WorkCompletion], &mut Vec<(u64, WrBuffers)>) -> rdma::Result<usize>,
    ) -> rdma::Result<bool> {
        let mut any = false;
        loop {
            let n = poll(&mut p.wcs, &mut p.memory)?;
            self.take(p, n);
            any |= n > 0;
            if n < p.wcs.len() {
                break;
            }
        }
        if any {
            self.update_credits();
        }
        Ok(any)
    }

    /// Takes the first `n` completions of `p` and the memory they gave
    /// back (no grant: the caller's poll makes it once). The async stream's
    /// wake-up path calls it after each `AsyncCq::poll_batch_wc` into
    /// [`Polled::batch`].
    #[inline]
    pub(crate) fn take(&mut self, p: &mut Polled, n: usize) {
        // The pieces first: a write that waited for room may go as the
        // completions are taken.
        if !p.memory.is_empty() {
            for (_, b) in p.memory.drain(..) {
                if let Some(piece) = b.into_one() {
                    self.local.ring.give_back(piece);
                }
            }
        }
        for wc in &p.wcs[..n] {
            self.complete_one(wc);
        }
    }

    /// Takes one completion whose memory was given back already.
    #[inline]
    fn complete_one(&mut self, c: &WorkCompletion) {
        let wr_id = c.wr_id();
        if wr_id & RECV != 0 {
            let slot = (wr_id & !RECV) as usize;
            if !c.is_success() {
                // Flushed: the QP left RTS (a disconnect); nothing to repost.
                let status = c.status();
                if status != WcStatus::WrFlushErr {
                    self.fail(
                        io::ErrorKind::ConnectionReset,
                        format!("a receive completed with {status}"),
                    );
                }
                self.lost("the connection was flushed (the peer went away)");
                return;
            }
            self.may_send = true;
            let msg = match c.imm() {
                Some(imm) => imm,
                None if self.iwarp && c.byte_len() as usize == wire::MSG_LEN => {
                    let mut b = [0; wire::MSG_LEN];
                    // The receive's own 4-byte slot, which the peer's SEND
                    // filled (local write access only: no peer writes it
                    // but through a receive, and this one is done).
                    if self.local.recvs.read_at(slot, 0, &mut b).is_err() {
                        return self.protocol_error(format!("a receive of slot {slot}, not ours"));
                    }
                    u32::from_ne_bytes(b)
                }
                None => {
                    return self.protocol_error(format!(
                        "a receive without a message ({} bytes, {:?})",
                        c.byte_len(),
                        c.opcode()
                    ))
                }
            };
            self.message(msg);
            self.repost(slot);
        } else {
            self.send_done(c);
        }
        // Nagle's rule: what waited goes once nothing is in flight (or
        // coalescing was turned off while it waited).
        if !self.pending.is_empty() && (self.nodelay || !self.data_in_flight()) {
            // A failure is kept in `failed` for the next call.
            let _ = self.send_pending();
        }
    }

    /// Lends `slot` to a receive again (its message was taken).
    fn repost(&mut self, slot: usize) {
        if !self.connected {
            return;
        }
        let r = self
            .qp
            .post_prepared_recv(&mut self.local.recvs, RECV | slot as u64, slot);
        if let Err(e) = r {
            self.post_refused(format!("reposting a receive: {e}"));
        }
    }

    /// A post of the engine's own (a grant, a receive) that the provider
    /// refused (`why`). When the QP has left RTS the connection is ending
    /// under us (siw refuses with ENOTCONN once the peer's TCP connection
    /// closed): nothing more is posted, and the flushed receives and the
    /// CM's DISCONNECTED decide between the end of the stream (the peer
    /// shut down first) and a reset; a read of data already received is
    /// not failed by a grant the peer no longer needs. Otherwise the
    /// failure is ours and ends the connection.
    #[cold]
    fn post_refused(&mut self, why: String) {
        match self.qp.state() {
            Ok(state) if state != QpState::Rts => {
                log::debug!("{why}: the QP is {state:?}, the connection is ending");
                self.may_send = false;
            }
            _ => self.fail(io::ErrorKind::ConnectionAborted, why),
        }
    }

    /// A message from the peer.
    fn message(&mut self, msg: u32) {
        let data = wire::msg_data(msg);
        match wire::msg_op(msg) {
            Op::DATA => {
                let len = u64::from(data);
                if self.recv_seq.wrapping_sub(self.recv_limit) as i16 >= 0 {
                    return self.protocol_error(format!(
                        "the peer sent past the messages it was granted (its limit is \
                         message {}, {} read)",
                        self.recv_limit, self.rseq_no
                    ));
                }
                if self.received + len > self.granted {
                    return self.protocol_error(format!(
                        "the peer wrote {len} bytes with {} of the receive space granted left",
                        self.granted - self.received
                    ));
                }
                if !self.readable {
                    return self.protocol_error("data after the peer's shutdown".into());
                }
                self.received += len;
                self.recv_seq = self.recv_seq.wrapping_add(1);
                self.unread.push_back(data);
            }
            Op::SGL => self.sseq_comp = data as u16,
            Op::IOMAP_SGL => {
                // The peer wrote entry `data` of our table (read and checked
                // by `iomap.rs` when a write looks for it); it took a credit.
                let entries = self.local.sizes.iomap_table();
                if data as usize >= entries {
                    return self.protocol_error(format!(
                        "the peer announced mapping {data}; this side's table has {entries}"
                    ));
                }
                if self.recv_seq.wrapping_sub(self.recv_limit) as i16 >= 0 {
                    return self.protocol_error("a mapping announced past the credits".into());
                }
                self.recv_seq = self.recv_seq.wrapping_add(1);
            }
            Op::CTRL => match Ctrl(data) {
                Ctrl::DISCONNECT => {
                    self.readable = false;
                    self.writable = false;
                    self.connected = false;
                    self.peer_closed = true;
                }
                Ctrl::SHUTDOWN => {
                    if self.writable {
                        self.readable = false;
                    } else {
                        self.readable = false;
                        self.connected = false;
                    }
                }
                Ctrl::KEEPALIVE => {}
                other => self.protocol_error(format!("unknown control message {}", other.0)),
            },
            other => self.protocol_error(format!("unknown operation {}", other.0)),
        }
    }

    fn send_done(&mut self, c: &WorkCompletion) {
        let msg = c.wr_id() as u32;
        match wire::msg_op(msg) {
            Op::SGL => self.ctrl_done += 1,
            Op::CTRL => {
                self.ctrl_done += 1;
                if Ctrl(wire::msg_data(msg)) == Ctrl::DISCONNECT {
                    self.connected = false;
                }
            }
            _ => self.sqe_avail += 1,
        }
        if !c.is_success() && self.connected {
            self.fail(
                io::ErrorKind::ConnectionReset,
                format!("a send completed with {}", c.status()),
            );
        }
    }

    fn ctrl_room(&self, needed: u32) -> bool {
        self.ctrl_posted.wrapping_sub(self.ctrl_done) + needed <= wire::CONTROL_SLOTS
    }

    /// Grants the peer more messages (and a new half of the receive buffer
    /// once one is free again), as rsocket does: when half the receive
    /// queue's messages were read or half the buffer is free.
    ///
    /// Called after every read, write and poll; in line only the test of
    /// whether a grant is due (rarely: once per half a queue of messages).
    #[inline]
    pub(crate) fn update_credits(&mut self) {
        let half = self.local.sizes.recv_buffer / 2;
        if self.rbuf_avail >= half || (self.rseq_no.wrapping_sub(self.rseq_comp) as i16) >= 0 {
            self.grant();
        }
    }

    /// [`Engine::update_credits`] once a grant is due: posts it if a
    /// control slot is free and the connection may send.
    #[inline(never)]
    fn grant(&mut self) {
        let half = self.local.sizes.recv_buffer / 2;
        let needed = if self.iwarp { 2 } else { 1 };
        if !(self.ctrl_room(needed) && self.connected && self.may_send) {
            return;
        }
        let rq = self.local.sizes.recv_queue as u16;
        self.rseq_comp = self.rseq_no.wrapping_add(rq / 2);
        let limit = self.rseq_no.wrapping_add(rq);
        let credit = wire::msg(Op::SGL, u32::from(limit));
        let r = if self.rbuf_avail >= half {
            let sge = Sge {
                addr: self.local.rbuf.addr() + self.rbuf_free_offset as u64,
                key: self.local.rbuf.rkey(),
                length: half as u32,
            }
            .to_memory(self.peer_big_endian);
            let slot = RemoteMemory {
                addr: self.remote_sgl.addr + (self.remote_slot * wire::SGE_LEN) as u64,
                len: wire::SGE_LEN as u64,
                rkey: self.remote_sgl.key,
            };
            let r = self.post_write_msg(&sge, slot, credit, true);
            if r.is_ok() {
                self.rbuf_avail -= half;
                self.granted += half as u64;
                self.rbuf_free_offset =
                    (self.rbuf_free_offset + half) % self.local.sizes.recv_buffer;
                self.remote_slot = (self.remote_slot + 1) % wire::SGL_ENTRIES;
            }
            r
        } else {
            self.post_msg(credit, true)
        };
        match r {
            Ok(()) => self.recv_limit = limit,
            Err(e) => self.post_refused(e),
        }
    }

    /// Copies received bytes into `out`: `Ok(Some(0))` at the end of the
    /// stream, `Ok(None)` when nothing is there yet.
    ///
    /// In line only the test for nothing unread on a live connection: a
    /// blocking read tries before and after it polls, and the first try
    /// mostly finds nothing.
    #[inline]
    pub(crate) fn try_read(&mut self, out: &mut [u8]) -> io::Result<Option<usize>> {
        if self.unread.is_empty() && self.readable {
            // A failed connection is not readable.
            return Ok(None);
        }
        self.read_unread(out)
    }

    /// [`Engine::try_read`] with something to say: data, the end of the
    /// stream or an error.
    #[inline(never)]
    fn read_unread(&mut self, out: &mut [u8]) -> io::Result<Option<usize>> {
        if self.unread.is_empty() {
            if let Some(e) = self.error() {
                return Err(e);
            }
            return Ok(Some(0));
        }
        let size = self.local.sizes.recv_buffer;
        let mut done = 0;
        while done < out.len() {
            let Some(head) = self.unread.front_mut() else {
                break;
            };
            let n = (*head as usize).min(out.len() - done);
            let mut copied = 0;
            while copied < n {
                let run = (n - copied).min(size - self.read_offset);
                let dst = &mut out[done + copied..done + copied + run];
                // Remotely writable memory: read with the crate's atomic
                // copy (a peer writing where it should not gets torn bytes,
                // never undefined behaviour).
                self.local
                    .rbuf
                    .read_at(self.read_offset, dst)
                    .map_err(crate::io_error)?;
                copied += run;
                // `run` ends at the buffer's end at the furthest.
                self.read_offset += run;
                if self.read_offset == size {
                    self.read_offset = 0;
                }
            }
            *head -= n as u32;
            if *head == 0 {
                self.unread.pop_front();
                self.rseq_no = self.rseq_no.wrapping_add(1);
            }
            self.rbuf_avail += n;
            done += n;
        }
        Ok(Some(done))
    }

    /// Shuts our write side: SHUTDOWN (or DISCONNECT when the read side is
    /// shut too). `Ok(false)` when no control slot is free yet.
    pub(crate) fn try_shutdown(&mut self, read_too: bool) -> io::Result<bool> {
        if !self.connected {
            self.writable = false;
            return Ok(true);
        }
        let ctrl = if read_too || !self.readable {
            Ctrl::DISCONNECT
        } else {
            Ctrl::SHUTDOWN
        };
        if !self.writable && ctrl == Ctrl::SHUTDOWN {
            return Ok(true);
        }
        // What coalescing held goes before the shutdown.
        if self.writable && !self.send_pending()? {
            return Ok(false);
        }
        if !self.ctrl_room(1) || !self.may_send {
            return Ok(false);
        }
        self.writable = false;
        if read_too {
            self.readable = false;
        }
        self.post_msg(wire::msg(Op::CTRL, ctrl.0), true)
            .map_err(|why| io::Error::new(io::ErrorKind::ConnectionAborted, why))?;
        Ok(true)
    }

    /// Every request we posted has completed.
    pub(crate) fn sends_done(&self) -> bool {
        !self.connected
            || (self.pending.is_empty()
                && self.ctrl_posted == self.ctrl_done
                && self.sqe_avail == self.local.sizes.send_queue - wire::CONTROL_SLOTS)
    }

    /// Whether the connection is still up.
    pub(crate) fn connected(&self) -> bool {
        self.connected
    }

    /// Whether the peer closed its side (its DISCONNECT was taken) or the
    /// connection ended: nothing more will come from it.
    pub(crate) fn peer_closed(&self) -> bool {
        self.peer_closed
    }

    /// A close that waited for the peer as long as it may: nothing more is
    /// awaited from it (the stream disconnects when dropped).
    pub(crate) fn stop_waiting_for_peer(&mut self) {
        self.peer_closed = true;
    }
    /// Our target registration: the SGL, then our direct-placement table.
    pub(crate) fn target(&self) -> &MemoryRegion {
        &self.local.target
    }
}
