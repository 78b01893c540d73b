//! Bandwidth tests: the client keeps `-t` requests in flight on every QP
//! and times each post and each completion; the server of `send_bw` keeps
//! receives posted and times the first and last arrival. The servers of the
//! other tests only wait at the barriers.

use std::sync::Arc;

use rdma::{
    ffi, MemoryRegion, PreparedSend, QueuePair, RemoteMemory, SendFlags, WorkCompletion, WrBuffers,
};

use anyhow::Context as _;

use crate::clock;
use crate::common::Res;
use crate::io::{self, RawRecv, RawSend, POLL_BATCH};
use crate::opts::{AtomicOp, Opts, Verb};
use crate::report::{self, BwStamps};
use crate::setup::{self, Conn};

/// Runs every size of the test on an established connection.
///
/// # Errors
/// Any failure of the run.
pub fn run(conn: &mut Conn, opts: &Opts) -> Res<()> {
    let server = opts.is_server();
    let measures = !server || opts.test.verb == Verb::Send;
    if measures {
        report::bw_header();
    }
    let mut stamps = BwStamps::default();
    for size in opts.sizes() {
        let cpu0 = report::cpu_times();
        let n = match (server, opts.test.verb, opts.raw) {
            #[cfg(feature = "tokio")]
            (true, Verb::Send, false) if opts.wait == crate::events::Wait::Async => {
                crate::aio::bw_server(conn, opts, size, &mut stamps)?
            }
            (true, Verb::Send, false) => server_send_safe(conn, opts, size, &mut stamps)?,
            (true, Verb::Send, true) => server_send_raw(conn, opts, size, &mut stamps)?,
            (true, _, _) => {
                // The client does all the work; the barriers frame it.
                conn.oob.barrier()?;
                conn.oob.barrier()?;
                continue;
            }
            #[cfg(feature = "tokio")]
            (false, _, false) if opts.wait == crate::events::Wait::Async => {
                crate::aio::bw_client(conn, opts, size, &mut stamps)?
            }
            (false, _, false) => client_safe(conn, opts, size, &mut stamps)?,
            (false, _, true) => client_raw(conn, opts, size, &mut stamps)?,
        };
        let cpu1 = report::cpu_times();
        stamps.finish();
        conn.oob.barrier()?;
        report::bw_line(size, &stamps, opts.no_peak || server);
        if opts.cpu {
            report::cpu_line(cpu0, cpu1, n);
        }
    }
    report::footer();
    Ok(())
}

/// Requests in flight per QP and completion moderation for `size`: the
/// depth is `-t`, as perftest's, for RDMA WRITEs (which share one buffer);
/// READ and atomic requests need a buffer each, and SENDs a receive buffer
/// each at the server: fewer when the buffer budget allows fewer (huge
/// messages). A completion is requested at least once per depth.
fn depth_and_mod(opts: &Opts, size: usize) -> (u32, u32) {
    let depth = if opts.test.verb == Verb::Write {
        opts.tx_depth.max(1)
    } else {
        setup::slots(size.saturating_mul(opts.qps as usize), opts.tx_depth)
    };
    (depth, opts.cq_mod_for(size).min(depth))
}

fn buf_len(opts: &Opts, size: usize) -> usize {
    if opts.test.verb == Verb::Atomic {
        8
    } else {
        size
    }
}

/// Safe client: each QP's request is prepared once and owns its region,
/// as perftest posts from buffers registered once: SEND and WRITE requests
/// all lend one region shared by the QPs (which the device only reads);
/// READ and atomic requests land in one message-sized region of their QP's,
/// every one at its start, as perftest's do (the data is never looked at;
/// the raw client's layout). With `--post-send`, READ and atomic
/// requests move a region of a pool into the queue, which the completion
/// (or, for unsignaled requests, the next signaled one) gives back.
/// Returns the number of requests.
///
/// The loop is [`SafeClient`]'s; `-e --wait async` runs the same loop with
/// its completions awaited (`aio::bw_client`).
fn client_safe(conn: &mut Conn, opts: &Opts, size: usize, stamps: &mut BwStamps) -> Res<usize> {
    let mut client = SafeClient::new(conn, opts, size, stamps)?;
    let mut wcs = [WorkCompletion::default(); POLL_BATCH];
    let mut memory = Vec::new();
    conn.oob.barrier()?;
    let watch = conn.oob.watch();
    stamps.loop_start();
    while !client.finished() {
        client.post(&mut conn.qps, stamps)?;
        let n = io::poll_safe(&conn.send_cq, conn.send_ch.as_ref(), &mut wcs, &mut memory)?;
        if n == 0 {
            watch.idle()?;
            continue;
        }
        client.complete_wc(&wcs[..n], &mut memory, stamps)?;
    }
    stamps.loop_end(client.total);
    Ok(client.total)
}

/// The safe client's state for one size, and the two steps of its loop:
/// post on every QP while it has room ([`SafeClient::post`]), then handle
/// a poll's completions ([`SafeClient::complete`]). The blocking loop
/// ([`client_safe`]) and the async one (`aio::bw_client`) differ only in
/// how they wait for the completions in between.
pub struct SafeClient {
    depth: u32,
    cq_mod: u32,
    verb: Verb,
    atomic: AtomicOp,
    /// Bytes per request.
    len: usize,
    /// The region every SEND and WRITE request shares.
    shared: Option<Arc<MemoryRegion>>,
    /// Per QP (in the QPs' order): one bounds check per QP visited, none
    /// per request.
    sides: Vec<QpSide>,
    iters: u32,
    /// Requests over all QPs.
    pub total: usize,
    /// Requests completed over all QPs.
    done: usize,
}

/// One QP's part of [`SafeClient`].
struct QpSide {
    /// Requests posted and completed.
    scnt: u32,
    ccnt: u32,
    /// Posts until the next signaled one (a countdown from the moderation,
    /// instead of a division per post).
    to_signal: u32,
    /// With --post-send: the regions of READ and atomic requests not in
    /// flight.
    free: Vec<MemoryRegion>,
    /// The request checked once and posted again and again (perftest builds
    /// its requests once too), unless --post-send. It owns its region: the
    /// shared one (SEND, WRITE), or one of its own (READ, atomics).
    prepared: Option<PreparedSend>,
    remote: RemoteMemory,
}

impl SafeClient {
    /// Registers the buffers and prepares the requests of one size; resets
    /// `stamps` for it.
    ///
    /// # Errors
    /// Registration or preparation failures.
    pub fn new(conn: &Conn, opts: &Opts, size: usize, stamps: &mut BwStamps) -> Res<SafeClient> {
        let nq = conn.qps.len();
        let (depth, cq_mod) = depth_and_mod(opts, size);
        let len = buf_len(opts, size);
        let verb = opts.test.verb;
        let shared = if io::shares_buffer(verb) {
            let mr = conn
                .pd
                .alloc_mr(len, io::local_access(verb))
                .context("Couldn't register the send buffer")?;
            Some(Arc::new(mr))
        } else {
            None
        };
        let sides = conn
            .qps
            .iter()
            .zip(&conn.remote)
            .map(|(qp, &remote)| {
                let (free, prepared) = if opts.prepared {
                    let op = io::safe_op(verb, opts.atomic, remote);
                    let region: WrBuffers = match &shared {
                        Some(s) => Arc::clone(s).into(),
                        None => conn
                            .pd
                            .alloc_mr(len, io::local_access(verb))
                            .context("Couldn't register the local buffers")?
                            .into(),
                    };
                    let p = qp
                        .prepare_send(op, SendFlags::SIGNALED, region)
                        .map_err(|e| e.error)
                        .context("Couldn't prepare the request")?;
                    (Vec::new(), Some(p))
                } else if shared.is_some() {
                    (Vec::new(), None)
                } else {
                    let free = setup::pool(&conn.pd, depth, len, io::local_access(verb))?;
                    (free, None)
                };
                Ok(QpSide {
                    scnt: 0,
                    ccnt: 0,
                    to_signal: cq_mod,
                    free,
                    prepared,
                    remote,
                })
            })
            .collect::<Res<_>>()?;
        let total = opts.iters as usize * nq;
        stamps.reset(total, !opts.no_peak);
        Ok(SafeClient {
            depth,
            cq_mod,
            verb,
            atomic: opts.atomic,
            len,
            shared,
            sides,
            iters: opts.iters,
            total,
            done: 0,
        })
    }

    /// Whether every request has completed.
    #[inline(always)]
    pub fn finished(&self) -> bool {
        self.done >= self.total
    }

    /// Posts on every QP while it has fewer than the depth in flight (and
    /// a free region, for READ and atomic requests) and more are due. Which
    /// kind of post is chosen once per QP visited, not per request.
    ///
    /// # Errors
    /// A failed post.
    #[inline(always)]
    pub fn post(&mut self, qps: &mut [QueuePair], stamps: &mut BwStamps) -> Res<()> {
        let (iters, depth, cq_mod, len) = (self.iters, self.depth, self.cq_mod, self.len);
        let failed = |q: usize, n: u32, e: rdma::PostError| {
            anyhow::Error::from(e.error)
                .context(format!("Couldn't post send on QP {q} (request {n})"))
        };
        let failed_prepared = |q: usize, n: u32, e: rdma::Error| {
            anyhow::Error::from(e).context(format!("Couldn't post send on QP {q} (request {n})"))
        };
        for (q, (qp, side)) in qps.iter_mut().zip(&mut self.sides).enumerate() {
            let QpSide {
                scnt,
                ccnt,
                to_signal,
                free,
                prepared,
                remote,
            } = side;
            // Whether the QP has room and more are due.
            macro_rules! room {
                () => {
                    *scnt < iters && *scnt - *ccnt < depth
                };
            }
            // The next request's number, whether it is signaled (every
            // `cq_mod`-th, and the last) and its id; stamps the post.
            macro_rules! next {
                () => {{
                    let n = *scnt + 1;
                    *to_signal -= 1;
                    let signaled = *to_signal == 0 || n == iters;
                    if *to_signal == 0 {
                        *to_signal = cq_mod;
                    }
                    stamps.post();
                    (n, signaled, io::wr_id(q, n))
                }};
            }
            match (prepared, &self.shared) {
                // The whole region each time.
                (Some(p), _) => {
                    while room!() {
                        let (n, signaled, id) = next!();
                        p.set_signaled(signaled);
                        qp.post_prepared(p, id, 0, len)
                            .map_err(|e| failed_prepared(q, n, e))?;
                        *scnt = n;
                    }
                }
                // --post-send: a request built per post.
                (None, s) => {
                    while room!() {
                        let buffers = match s {
                            Some(s) => WrBuffers::Shared(Arc::clone(s)),
                            None => match free.pop() {
                                Some(mr) => WrBuffers::One(mr),
                                None => break,
                            },
                        };
                        let (n, signaled, id) = next!();
                        let wr = io::safe_wr(self.verb, self.atomic, id, buffers, *remote);
                        qp.post_send(wr.signaled(signaled))
                            .map_err(|e| failed(q, n, e))?;
                        *scnt = n;
                    }
                }
            }
        }
        Ok(())
    }

    /// Handles a poll's completions in the compact form: each one's count,
    /// then the memory they gave back (`--post-send`'s READ and atomic
    /// regions) to the free lists.
    ///
    /// # Errors
    /// A failed completion, or one of an unknown QP.
    #[inline(always)]
    pub fn complete_wc(
        &mut self,
        wcs: &[WorkCompletion],
        memory: &mut Vec<(u64, WrBuffers)>,
        stamps: &mut BwStamps,
    ) -> Res<()> {
        let now = stamps.poll_time();
        for wc in wcs {
            io::check_wc(wc, "send")?;
            self.completed(wc.wr_id(), now, stamps)?;
        }
        if !memory.is_empty() {
            for (id, b) in memory.drain(..) {
                self.give_back(id, b);
            }
        }
        Ok(())
    }

    /// Counts the requests of `id`'s QP up to `id` as done (unsignaled ones
    /// before it included).
    #[inline(always)]
    fn completed(&mut self, id: u64, now: u64, stamps: &mut BwStamps) -> Res<()> {
        let (q, n) = io::split_id(id);
        let side = self
            .sides
            .get_mut(q)
            .context("completion for an unknown QP")?;
        self.done += (n - side.ccnt) as usize;
        side.ccnt = n;
        stamps.complete(self.done, now);
        Ok(())
    }

    /// A finished request's memory: a READ or atomic region back to its
    /// QP's free list; a reference to the shared region just dropped
    /// (`shared` holds another one).
    fn give_back(&mut self, id: u64, b: WrBuffers) {
        if self.shared.is_none() {
            if let Some(side) = self.sides.get_mut(io::split_id(id).0) {
                side.free.extend(b.into_one());
            }
        }
    }
}

/// Raw client: prebuilt requests over one message-sized registration per
/// QP, every request at its start, as perftest's.
fn client_raw(conn: &mut Conn, opts: &Opts, size: usize, stamps: &mut BwStamps) -> Res<usize> {
    let nq = conn.qps.len();
    let (depth, cq_mod) = depth_and_mod(opts, size);
    let len = buf_len(opts, size);
    let verb = opts.test.verb;
    let mut reqs = Vec::with_capacity(nq);
    let mut bases = Vec::with_capacity(nq);
    for q in 0..nq {
        let mr = conn
            .pd
            .alloc_mr(len, io::local_access(verb))
            .with_context(|| format!("Couldn't register a buffer of {len} bytes"))?;
        bases.push(mr.addr());
        reqs.push(RawSend::new(
            &conn.qps[q],
            verb,
            opts.atomic,
            mr.lkey(),
            len,
            conn.remote[q],
            false,
        ));
        // Kept until after the QPs are destroyed (the raw contract).
        conn.raw_keep.push(mr);
    }
    let iters = opts.iters;
    let total = iters as usize * nq;
    let mut scnt = vec![0u32; nq];
    let mut ccnt = vec![0u32; nq];
    // Per QP: posts until the next signaled one.
    let mut to_signal = vec![cq_mod; nq];
    let mut done = 0usize;
    let mut wc = [ffi::ibv_wc::default(); POLL_BATCH];
    stamps.reset(total, !opts.no_peak);
    conn.oob.barrier()?;
    let watch = conn.oob.watch();
    stamps.loop_start();
    while done < total {
        for (q, qp) in conn.qps.iter_mut().enumerate() {
            let (scnt, ccnt) = (&mut scnt[q], ccnt[q]);
            let (to_signal, base, req) = (&mut to_signal[q], bases[q], &mut reqs[q]);
            while *scnt < iters && *scnt - ccnt < depth {
                let n = *scnt + 1;
                *to_signal -= 1;
                let signaled = *to_signal == 0 || n == iters;
                if *to_signal == 0 {
                    *to_signal = cq_mod;
                }
                stamps.post();
                // SAFETY: the registration kept in `conn.raw_keep`, to which
                // no Rust reference exists: the device reads it (SEND,
                // WRITE) or writes it (READ, atomics) for any number of
                // requests at once, and nothing else touches it.
                unsafe { req.post(qp, base, io::wr_id(q, n), signaled) }
                    .with_context(|| format!("QP {q}, request {n}"))?;
                *scnt = n;
            }
        }
        let got = io::poll_raw(&conn.send_cq, conn.send_ch.as_ref(), &mut wc, "send")?;
        if got == 0 {
            watch.idle()?;
            continue;
        }
        let now = stamps.poll_time();
        for w in &wc[..got] {
            let (q, n) = io::split_id(w.wr_id);
            let c = ccnt.get_mut(q).context("completion for an unknown QP")?;
            done += (n - *c) as usize;
            *c = n;
            stamps.complete(done, now);
        }
    }
    stamps.loop_end(total);
    Ok(total)
}

/// Receives per QP the server keeps posted.
fn rx_slots(opts: &Opts, size: usize) -> u32 {
    setup::slots(
        size.saturating_mul(opts.qps as usize),
        opts.rx_depth.min(opts.iters),
    )
}

/// Safe `send_bw` server: every receive owns its buffer; a completion gives
/// it back and it is posted again while more messages are due.
///
/// The loop is [`SafeServer`]'s; `-e --wait async` runs the same loop with
/// its completions awaited (`aio::bw_server`).
fn server_send_safe(
    conn: &mut Conn,
    opts: &Opts,
    size: usize,
    stamps: &mut BwStamps,
) -> Res<usize> {
    let mut server = SafeServer::new(conn, opts, size, stamps)?;
    let mut wcs = [WorkCompletion::default(); POLL_BATCH];
    let mut memory = Vec::with_capacity(POLL_BATCH);
    conn.oob.barrier()?;
    let watch = conn.oob.watch();
    while !server.finished() {
        let n = io::poll_safe(&conn.recv_cq, conn.recv_ch.as_ref(), &mut wcs, &mut memory)?;
        if n == 0 {
            watch.idle()?;
            continue;
        }
        server.complete_wc(&mut conn.qps, &wcs[..n], &mut memory)?;
    }
    Ok(server.end(stamps))
}

/// The safe `send_bw` server's state for one size and the step of its
/// loop ([`SafeServer::complete`]), shared by the blocking loop
/// ([`server_send_safe`]) and the async one (`aio::bw_server`).
pub struct SafeServer {
    iters: u32,
    total: usize,
    /// Per QP, receives posted so far.
    posted: Vec<u32>,
    got: usize,
    first: Option<u64>,
    last: u64,
}

impl SafeServer {
    /// Posts the receives of one size on every QP; resets `stamps`.
    ///
    /// # Errors
    /// Registration or post failures.
    pub fn new(
        conn: &mut Conn,
        opts: &Opts,
        size: usize,
        stamps: &mut BwStamps,
    ) -> Res<SafeServer> {
        let nq = conn.qps.len();
        let slots = rx_slots(opts, size);
        for (q, qp) in conn.qps.iter_mut().enumerate() {
            let bufs = setup::pool(&conn.pd, slots, size, rdma::AccessFlags::LOCAL_WRITE)?;
            qp.post_recv_batch(
                bufs.into_iter()
                    .map(|m| (io::wr_id(q, 0), WrBuffers::One(m))),
            )
            .map_err(|e| e.error)
            .with_context(|| format!("Couldn't post receives on QP {q}"))?;
        }
        stamps.reset(1, true);
        Ok(SafeServer {
            iters: opts.iters,
            total: opts.iters as usize * nq,
            posted: vec![slots; nq],
            got: 0,
            first: None,
            last: clock::now(),
        })
    }

    /// Whether every message has arrived.
    #[inline(always)]
    pub fn finished(&self) -> bool {
        self.got >= self.total
    }

    /// Handles a poll's completions in the compact form: counts them, then
    /// posts each receive's buffer again (from `memory`) while more
    /// messages are due.
    ///
    /// # Errors
    /// A failed completion or post, or a completion of an unknown QP.
    #[inline(always)]
    pub fn complete_wc(
        &mut self,
        qps: &mut [QueuePair],
        wcs: &[WorkCompletion],
        memory: &mut Vec<(u64, WrBuffers)>,
    ) -> Res<()> {
        self.arrived();
        for wc in wcs {
            io::check_wc(wc, "receive")?;
            self.got += 1;
        }
        for (id, b) in memory.drain(..) {
            self.repost(qps, id, b)?;
        }
        Ok(())
    }

    /// Stamps a poll that found messages.
    #[inline(always)]
    fn arrived(&mut self) {
        self.last = clock::now();
        self.first.get_or_insert(self.last);
    }

    /// Posts a receive's buffer again on `id`'s QP while more messages are
    /// due there.
    #[inline(always)]
    fn repost(&mut self, qps: &mut [QueuePair], id: u64, b: WrBuffers) -> Res<()> {
        let (q, _) = io::split_id(id);
        let p = self
            .posted
            .get_mut(q)
            .context("completion for an unknown QP")?;
        if *p < self.iters {
            qps[q]
                .post_recv(id, b)
                .map_err(|e| e.error)
                .with_context(|| format!("Couldn't post a receive on QP {q}"))?;
            *p += 1;
        }
        Ok(())
    }

    /// Stamps the first and last arrivals; returns the number of messages.
    pub fn end(&self, stamps: &mut BwStamps) -> usize {
        stamps.posted.push(self.first.unwrap_or(self.last));
        stamps.completed.push((self.total, self.last));
        self.total
    }
}

/// Raw `send_bw` server: prebuilt receives over slots of one registration
/// per QP, reposted by slot number.
fn server_send_raw(conn: &mut Conn, opts: &Opts, size: usize, stamps: &mut BwStamps) -> Res<usize> {
    let nq = conn.qps.len();
    let slots = rx_slots(opts, size);
    let mut recvs = Vec::with_capacity(nq);
    for (q, qp) in conn.qps.iter_mut().enumerate() {
        let mr = conn
            .pd
            .alloc_mr(size * slots as usize, rdma::AccessFlags::LOCAL_WRITE)
            .with_context(|| {
                format!("Couldn't register {slots} receive buffers of {size} bytes")
            })?;
        let mut r = RawRecv::new(mr.addr(), mr.lkey(), size);
        conn.raw_keep.push(mr);
        for s in 0..slots {
            // SAFETY: slot `s` of the registration just kept in
            // `conn.raw_keep`, posted once, never referenced from Rust.
            unsafe { r.post(qp, s, io::wr_id(q, s)) }.with_context(|| format!("QP {q}"))?;
        }
        recvs.push(r);
    }
    let iters = opts.iters;
    let total = iters as usize * nq;
    let mut posted = vec![slots; nq];
    let mut got = 0usize;
    let mut first = None;
    let mut last = clock::now();
    let mut wc = [ffi::ibv_wc::default(); POLL_BATCH];
    stamps.reset(1, true);
    conn.oob.barrier()?;
    let watch = conn.oob.watch();
    while got < total {
        let n = io::poll_raw(&conn.recv_cq, conn.recv_ch.as_ref(), &mut wc, "receive")?;
        if n == 0 {
            watch.idle()?;
            continue;
        }
        last = clock::now();
        first.get_or_insert(last);
        for w in &wc[..n] {
            let (q, slot) = io::split_id(w.wr_id);
            got += 1;
            let p = posted.get_mut(q).context("completion for an unknown QP")?;
            if *p < iters {
                // SAFETY: the slot's previous receive just completed, so it
                // is free; the registration is kept in `conn.raw_keep`.
                unsafe { recvs[q].post(&mut conn.qps[q], slot, w.wr_id) }
                    .with_context(|| format!("QP {q}"))?;
                *p += 1;
            }
        }
    }
    stamps.posted.push(first.unwrap_or(last));
    stamps.completed.push((total, last));
    Ok(total)
}
