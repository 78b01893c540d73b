//! The transport's task ([`Engine`]): the event loop over completions,
//! connection events, new calls and deadlines; credits and the queue;
//! receives reposted; a reply's invalidations posted and awaited;
//! timeouts, a lost connection and reconnection with retransmission.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rdma::cm::CmEventType;
use rdma::{Completion, SendWr, WcOpcode, WcStatus};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::conn::{Conn, RECV};
use super::deliver::{deliver, deliver_discarding, nomsg_reply, written, Ending, Outcome};
use super::send::{marshal, Pending, Plan};
use super::{Call, Error, Options, Payload, Request, Result, Stats};
use crate::chunks::Chunk;
use crate::rpcrdma::{Body, Header};

/// The task's state.
pub(super) struct Engine {
    addr: SocketAddr,
    opts: Options,
    conn: Option<Conn>,
    stats: Arc<Stats>,
    credits: u32,
    in_flight: u32,
    pending: HashMap<u32, Pending>,
    /// Calls whose reply came, waiting for invalidations, by xid.
    ending: HashMap<u32, Ending>,
    /// Invalidations posted: work request to xid.
    invalidating: HashMap<u64, u32>,
    queue: VecDeque<(u32, Request, u32)>,
    next_xid: u32,
    /// Why the last connection was lost (for the error of calls that a
    /// reconnection then fails).
    down: Option<String>,
    /// `LOCAL_INV` completions still to ignore ([`Options::lose_invalidations`]).
    lose_invalidations: u32,
}

impl Engine {
    /// The task's state for a connection just made.
    pub(super) fn new(addr: SocketAddr, opts: Options, conn: Conn, stats: Arc<Stats>) -> Engine {
        let lose_invalidations = opts.lose_invalidations;
        Engine {
            addr,
            opts,
            conn: Some(conn),
            stats,
            credits: 1,
            in_flight: 0,
            pending: HashMap::new(),
            ending: HashMap::new(),
            invalidating: HashMap::new(),
            queue: VecDeque::new(),
            // Distinct xids across runs of the process.
            next_xid: std::process::id().wrapping_mul(0x9e37_79b9),
            down: None,
            lose_invalidations,
        }
    }

    fn window(&self) -> u32 {
        self.credits.min(self.opts.credits)
    }

    pub(super) async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Request>) {
        let mut open = true;
        loop {
            self.start_queued();
            if !open && self.pending.is_empty() && self.queue.is_empty() && self.ending.is_empty() {
                break;
            }
            let deadline = self
                .pending
                .values()
                .map(|p| p.deadline)
                .chain(self.ending.values().map(|e| e.deadline))
                .min();
            let Some(conn) = self.conn.as_mut() else {
                // Not connected (the connection broke, or a reconnection
                // gave up): reconnect for the calls that wait, or for the
                // next one to come.
                if self.pending.is_empty() && self.queue.is_empty() {
                    match rx.recv().await {
                        Some(r) => {
                            let xid = self.xid();
                            self.queue.push_back((xid, r, 0));
                        }
                        None => break,
                    }
                }
                self.reconnect().await;
                continue;
            };
            tokio::select! {
                biased;
                c = conn.acq.next() => match c {
                    Ok(c) => self.completion(c),
                    Err(e) => self.broken(format!("polling the CQ: {e}")).await,
                },
                ev = conn.id.next_event() => {
                    let why = match ev {
                        Ok(ev) if ev.event_type() == CmEventType::DeviceRemoval => {
                            // The crate has had librdmacm forget the device
                            // (`rdma_get_devices` as the event was read), so
                            // its context closes with this connection's id.
                            self.stats.device_removals.fetch_add(1, Ordering::Relaxed);
                            "the RDMA device was removed".to_string()
                        }
                        Ok(ev) => format!("the connection manager reported {:?}", ev.event_type()),
                        Err(e) => format!("the connection manager failed: {e}"),
                    };
                    self.broken(why).await;
                }
                r = rx.recv(), if open => match r {
                    Some(r) => {
                        let xid = self.xid();
                        self.queue.push_back((xid, r, 0));
                    }
                    None => open = false,
                },
                _ = sleep_until(deadline) => self.timed_out().await,
            }
        }
        if let Some(mut c) = self.conn.take() {
            let _ = tokio::time::timeout(self.opts.connect_timeout, c.id.disconnect()).await;
            let _ = c.qp.to_error();
        }
    }

    fn xid(&mut self) -> u32 {
        self.next_xid = self.next_xid.wrapping_add(1);
        self.next_xid
    }

    fn start_queued(&mut self) {
        while self.in_flight < self.window() {
            let Some(conn) = self.conn.as_ref() else {
                return;
            };
            if conn.send_pool.available() == 0 {
                return;
            }
            let Some((_, req, _)) = self.queue.front() else {
                return;
            };
            // The call waits (in order) while its chunks are lent to others.
            let plan = Plan::new(&req.call, &conn.negotiated);
            if !conn.chunks.can_take(&plan.sizes(&req.call)) {
                return;
            }
            let Some((xid, req, sent)) = self.queue.pop_front() else {
                return;
            };
            match self.send(xid, req.call, sent, plan) {
                Ok(p) => {
                    let p = Pending {
                        reply: req.reply,
                        ..p
                    };
                    self.pending.insert(xid, p);
                    self.in_flight += 1;
                    self.stats
                        .max_in_flight
                        .fetch_max(u64::from(self.in_flight), Ordering::Relaxed);
                }
                Err(e) => {
                    let _ = req.reply.send(Err(e));
                }
            }
        }
    }

    /// Marshals and posts one call; the result's `reply` is a placeholder.
    /// A failure releases what was taken.
    fn send(&mut self, xid: u32, call: Call, sent: u32, plan: Plan) -> Result<Pending> {
        let conn = self
            .conn
            .as_mut()
            .ok_or_else(|| Error::NotConnected("no connection".into()))?;
        let mut p = Pending {
            call,
            reply: oneshot::channel().0,
            deadline: Instant::now() + self.opts.call_timeout,
            sent: sent + 1,
            payload_in_chunk: false,
            chunks: Vec::new(),
            write: None,
            reply_chunk: None,
            remote: Vec::new(),
            last_bind: 0,
        };
        let r = marshal(conn, &self.stats, self.opts.credits, xid, &mut p, &plan);
        match r {
            Ok(()) => Ok(p),
            Err(e) => {
                for l in p.lent() {
                    if let Some(c) = l.chunk.take() {
                        conn.chunks.discard(c);
                    }
                }
                Err(e)
            }
        }
    }

    fn completion(&mut self, mut c: Completion) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        if c.status != WcStatus::Success {
            let why = format!(
                "work request {:#x} completed with {} (vendor error {:#x})",
                c.wr_id, c.status, c.vendor_err
            );
            // The connection is gone; the next turn of the loop reconnects.
            self.lost(why);
            return;
        }
        if c.opcode != WcOpcode::Recv {
            conn.sq_done = conn.sq_done.max(c.wr_id);
        }
        match c.opcode {
            WcOpcode::BindMw => return,
            WcOpcode::LocalInv => {
                if self.lose_invalidations > 0 {
                    self.lose_invalidations -= 1;
                    return;
                }
                self.invalidated(c.wr_id);
                return;
            }
            _ => {}
        }
        let Some(buf) = c.take_buffers().into_one() else {
            self.lost("a completion without its buffer".into());
            return;
        };
        if c.opcode != WcOpcode::Recv {
            let mut buf = buf;
            if let Some(t) = conn.tails.remove(&c.wr_id) {
                let _ = buf.unsplit(t);
            }
            let _ = conn.send_pool.put(buf);
            return;
        }
        let len = (c.byte_len as usize).min(buf.len());
        // A `SEND_WITH_INV`: the rkey the server invalidated, before this
        // completion was made.
        let inv = c.wc_flags.intersects(conn.inv_flags).then_some(c.imm_data);
        // The receive buffer is local-only memory: read in place, and only
        // the RPC message is copied out (once).
        match buf.as_slice() {
            Ok(b) => self.reply(&b[..len], inv),
            Err(_) => {
                let mut bytes = vec![0; len];
                if buf.read_at(0, &mut bytes).is_ok() {
                    self.reply(&bytes, inv);
                }
            }
        }
        // Repost at once: a receive waits for every call in flight.
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let wr = RECV | conn.next_id();
        if let Err(e) = conn.qp.post_recv(wr, buf) {
            self.lost(format!("ibv_post_recv: {e}"));
        }
    }

    fn reply(&mut self, bytes: &[u8], inv: Option<u32>) {
        let (h, hlen) = match Header::decode(bytes) {
            Ok(h) => h,
            Err(e) => {
                // Fail the call it names, if it names one.
                if let Some(xid) = bytes
                    .get(..4)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                {
                    self.finish(
                        xid,
                        Outcome::Failed(Error::Malformed(format!("transport header: {e}"))),
                        inv,
                    );
                }
                return;
            }
        };
        self.credits = h.credits.clamp(1, self.opts.credits);
        self.stats
            .granted
            .store(u64::from(h.credits), Ordering::Relaxed);
        let Some(p) = self.pending.get(&h.xid) else {
            self.stats.dropped_replies.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let r = match &h.body {
            Body::Error(e) => Err(Error::Rdma(*e)),
            Body::Msg(c) => written(p, c).map(|written| Outcome::Msg {
                msg: bytes[hlen..].to_vec(),
                written,
            }),
            Body::NoMsg(c) => nomsg_reply(p, c).and_then(|len| {
                self.stats
                    .reply_chunk_replies
                    .fetch_add(1, Ordering::Relaxed);
                written(p, c).map(|written| Outcome::NoMsg { len, written })
            }),
        };
        let outcome = r.unwrap_or_else(Outcome::Failed);
        if let Outcome::Msg {
            written: Some(_), ..
        }
        | Outcome::NoMsg {
            written: Some(_), ..
        } = &outcome
        {
            self.stats
                .write_chunk_replies
                .fetch_add(1, Ordering::Relaxed);
        }
        self.finish(h.xid, outcome, inv);
    }

    /// A call's reply came: its windows are invalidated, and the reply is
    /// delivered once they all are (at once for registrations of its own,
    /// which go when it does). `inv`: the rkey the reply's receive
    /// completion says the server invalidated (`SEND_WITH_INV`); when it is
    /// one this call lent, that chunk is already unreachable and takes no
    /// `LOCAL_INV`.
    fn finish(&mut self, xid: u32, outcome: Outcome, inv: Option<u32>) {
        let Some(mut p) = self.pending.remove(&xid) else {
            // A late duplicate: its invalidation (if any) named a chunk
            // that call already released.
            self.stats.dropped_replies.fetch_add(1, Ordering::Relaxed);
            return;
        };
        self.in_flight -= 1;
        if let Some(k) = inv {
            let owner = if p.lends(k) {
                Some(&mut p)
            } else {
                // Not this call's: another call in flight may have lent it
                // (a server that invalidates the wrong rkey). Either way
                // that rkey is invalid now, and this call's own chunks' access
                // is ended as usual.
                self.stats
                    .stray_invalidations
                    .fetch_add(1, Ordering::Relaxed);
                self.pending.values_mut().find(|q| q.lends(k))
            };
            match owner {
                Some(owner) => {
                    owner.remote.push(k);
                    self.stats
                        .remote_invalidations
                        .fetch_add(1, Ordering::Relaxed);
                }
                // No call in flight lends it: a window whose call ended
                // (deallocated, or its `LOCAL_INV` posted), or a key never
                // lent. Its window, if any, reaches nothing either way.
                None => {
                    self.stats
                        .late_invalidations
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let remote = std::mem::take(&mut p.remote);
        let last_bind = p.last_bind;
        let mut waiting = 0;
        let mut broken = None;
        let mut windows = 0;
        if let Some(conn) = self.conn.as_mut() {
            for l in p.lent() {
                let Some(rkey) = l.chunk.as_ref().and_then(Chunk::window_rkey) else {
                    continue;
                };
                windows += 1;
                if broken.is_some() || remote.contains(&rkey) {
                    continue;
                }
                if conn.dealloc {
                    // No `LOCAL_INV` that a server's stray invalidation of the
                    // same window could overtake: the window is deallocated
                    // now (its bind's completion, which holds it, was
                    // resolved: the send queue completed past it) and its
                    // region gets a new one.
                    if conn.sq_done < last_bind {
                        broken = Some(
                            "a reply came before its call's window binds completed: \
                             the windows cannot be deallocated now"
                                .to_string(),
                        );
                        continue;
                    }
                    let Some(chunk) = l.chunk.as_mut() else {
                        continue;
                    };
                    match conn.chunks.fence(chunk) {
                        Ok(()) => {
                            self.stats.fenced_windows.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => broken = Some(e.to_string()),
                    }
                    continue;
                }
                let wr = conn.next_id();
                match conn.qp.post_send(SendWr::local_invalidate(wr, rkey)) {
                    Ok(()) => {
                        self.invalidating.insert(wr, xid);
                        self.stats
                            .local_invalidations
                            .fetch_add(1, Ordering::Relaxed);
                        waiting += 1;
                    }
                    Err(e) => broken = Some(format!("ibv_post_send(LOCAL_INV): {}", e.error)),
                }
            }
        }
        let now = waiting == 0 && broken.is_none();
        // The deadline matters only while the call waits in `ending`: a call
        // delivered now reads no clock (`clock_gettime` is a system call in
        // the VM's guest, and on rxe, where the server invalidates every
        // READ's window, nearly every READ is delivered at once).
        let deadline = if now {
            p.deadline
        } else {
            Instant::now() + self.opts.invalidate_timeout
        };
        let e = Ending {
            pending: p,
            outcome,
            remote,
            waiting,
            deadline,
        };
        if now {
            // No window was lent (or there is no connection to have bound
            // one on), or each was invalidated by the server before a
            // reply's completion said so: nothing to wait for.
            deliver(e, self.conn.as_mut().map(|c| &mut c.chunks), windows > 0);
        } else {
            self.ending.insert(xid, e);
        }
        if let Some(why) = broken {
            self.lost(why);
        }
    }

    /// An invalidation completed: the call's reply goes once it was the
    /// last.
    fn invalidated(&mut self, wr: u64) {
        let Some(xid) = self.invalidating.remove(&wr) else {
            return;
        };
        let Some(e) = self.ending.get_mut(&xid) else {
            return;
        };
        e.waiting = e.waiting.saturating_sub(1);
        if e.waiting == 0 {
            if let Some(e) = self.ending.remove(&xid) {
                // Every window this call was lent had its `LOCAL_INV`
                // posted in `finish` (a failed post drops the connection,
                // which delivers the call without this), and each has now
                // completed successfully (a failed completion drops the
                // connection too), but the one the server invalidated with
                // its reply, if any (`finish` skipped it).
                deliver(e, self.conn.as_mut().map(|c| &mut c.chunks), true);
            }
        }
    }

    fn fail_all(&mut self, e: Error) {
        for (_, p) in self.pending.drain() {
            let Pending { reply, .. } = p;
            let _ = reply.send(Err(e.clone()));
        }
        self.in_flight = 0;
        for (_, r, _) in self.queue.drain(..) {
            let _ = r.reply.send(Err(e.clone()));
        }
    }

    /// The connection broke: drop it (its QP first, so nothing can touch
    /// the chunks any more), keep the calls to send again. Calls whose
    /// reply came and whose invalidations cannot complete now are
    /// delivered, their windows deallocated.
    fn lost(&mut self, why: String) {
        log::warn!("connection to {} lost: {why}", self.addr);
        if let Some(mut c) = self.conn.take() {
            let _ = c.qp.to_error();
            // RESET gives back what the queues held, binds in flight
            // included: each holds its window until it ends, and a window
            // must be deallocated before its QP goes (below).
            drop(c.qp.reset());
            self.invalidating.clear();
            for (_, e) in self.ending.drain() {
                deliver_discarding(e, &mut c.chunks);
            }
            // The calls to send again: their windows are deallocated before
            // the QP goes (`ChunkPool::unbind_for_loss`).
            for p in self.pending.values_mut() {
                for l in p.lent() {
                    if let Some(chunk) = l.chunk.take() {
                        l.chunk = Some(c.chunks.unbind_for_loss(chunk));
                    }
                }
            }
        }
        self.down = Some(why);
    }

    async fn broken(&mut self, why: String) {
        self.lost(why);
        self.reconnect().await;
    }

    /// Reconnects and puts every pending call back at the head of the
    /// queue, with its xid, to be sent again (a call sent more than
    /// `retries` times fails with [`Error::TimedOut`]). While the server
    /// refuses, it tries again with a growing pause, for up to one call
    /// timeout; then every waiting call fails with the last error.
    async fn reconnect(&mut self) {
        if let Some(mut c) = self.conn.take() {
            let _ = tokio::time::timeout(self.opts.connect_timeout, c.id.disconnect()).await;
            let _ = c.qp.to_error();
        }
        let mut pending: Vec<(u32, Pending)> = self.pending.drain().collect();
        pending.sort_by_key(|(_, p)| p.deadline);
        self.in_flight = 0;
        self.credits = 1;
        for (xid, p) in pending.into_iter().rev() {
            if p.sent > self.opts.retries {
                let _ = p.reply.send(Err(Error::TimedOut { xid, sent: p.sent }));
                continue;
            }
            self.stats.retransmits.fetch_add(1, Ordering::Relaxed);
            let mut call = p.call;
            if p.payload_in_chunk {
                call.payload = p
                    .chunks
                    .first()
                    .and_then(|l| l.chunk.as_ref())
                    .map(|c| Payload::from(c.to_vec()))
                    .unwrap_or_default();
            }
            let req = Request {
                call,
                reply: p.reply,
            };
            self.queue.push_front((xid, req, p.sent));
        }
        // The server may be restarting: try again, backing off, for up to
        // one call timeout.
        let give_up = Instant::now() + self.opts.call_timeout;
        let mut backoff = Duration::from_millis(100);
        loop {
            match Conn::connect(self.addr, &self.opts, &self.stats).await {
                Ok(c) => {
                    log::info!("reconnected to {}", self.addr);
                    self.stats.connects.fetch_add(1, Ordering::Relaxed);
                    self.conn = Some(c);
                    self.down = None;
                    return;
                }
                Err(e) if Instant::now() + backoff < give_up => {
                    log::info!("reconnecting to {}: {e}", self.addr);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    let e = match (self.down.take(), e) {
                        (Some(why), Error::NotConnected(m)) => {
                            Error::NotConnected(format!("{why}; reconnecting: {m}"))
                        }
                        (_, e) => e,
                    };
                    self.fail_all(e);
                    return;
                }
            }
        }
    }

    async fn timed_out(&mut self) {
        let now = Instant::now();
        // An invalidation that never completed: the window may still be
        // valid, and only the QP's end makes it unreachable (`lost`).
        let stuck: Vec<u32> = self
            .ending
            .iter()
            .filter(|(_, e)| e.deadline <= now)
            .map(|(x, _)| *x)
            .collect();
        if let Some(xid) = stuck.first() {
            self.stats
                .lost_invalidations
                .fetch_add(stuck.len() as u64, Ordering::Relaxed);
            self.lost(format!(
                "the invalidation (LOCAL_INV) of call {xid:#x}'s chunks did not complete within \
                 {:?}{}",
                self.opts.invalidate_timeout,
                if stuck.len() > 1 {
                    format!(" ({} calls)", stuck.len())
                } else {
                    String::new()
                }
            ));
            self.reconnect().await;
            return;
        }
        let expired: Vec<u32> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(x, _)| *x)
            .collect();
        if expired.is_empty() {
            return;
        }
        self.lost(format!("{} call(s) timed out", expired.len()));
        self.reconnect().await;
    }
}

async fn sleep_until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}
