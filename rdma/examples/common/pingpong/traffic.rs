//! The buffers and the ping-pong loop.

use super::*;
use anyhow::{anyhow, Context as _};
use std::time::{Duration, Instant};

use rdma::{
    AccessFlags, AdviseFlags, Completion, CompletionChannel, CompletionQueue, DeviceMemory,
    DeviceSlice, InitAttr, InlineSend, MemoryRegion, MrAdvice, PortAttr, PostError,
    ProtectionDomain, QueuePair, RtrAttr, RtsAttr, SendWr, UdDest, WcStatus, WrBuffers,
};

/// The bytes every message carries. With `-c`: 0x7b with a 0 at the start of
/// every page, which is what the C tools' client writes (their check looks at
/// the first byte of each page); without: 0x7b, the C tools' fill byte.
pub fn message_pattern(len: usize, chk: bool, page: usize) -> Res<Vec<u8>> {
    let mut v = filled(len, 0x7b)?;
    if chk {
        v.iter_mut().step_by(page.max(1)).for_each(|b| *b = 0);
    }
    Ok(v)
}

/// `len` bytes of `byte`, failing (instead of aborting) when memory is short.
pub fn filled(len: usize, byte: u8) -> Res<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| anyhow!("Couldn't allocate {len} bytes of buffers"))?;
    v.resize(len, byte);
    Ok(v)
}

/// Prints the C tools' two result lines: `size × iters` bytes each way in
/// `elapsed`.
pub fn print_results(opts: &Opts, elapsed: Duration) {
    let usec = elapsed.as_secs_f64() * 1e6;
    let bytes = opts.size as u64 * u64::from(opts.iters) * 2;
    println!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        opts.iters,
        usec / 1e6,
        usec / f64::from(opts.iters)
    );
}

#[derive(Debug)]
enum SendBuf {
    /// Copied into the work request at post time (`IBV_SEND_INLINE`).
    Inline(Vec<u8>),
    /// A registered buffer: `None` while the send is in flight.
    Region(Option<MemoryRegion>),
    /// `-j`: the one buffer in device memory, which every send and every
    /// receive use, as in the C tool (each request holds a reference to
    /// its region until its completion).
    Device(DeviceSlice),
}

/// Intervals between receive completions, in device clock ticks (`-t`).
#[derive(Debug)]
struct Timestamps {
    /// The device's `completion_timestamp_mask`: where its clock wraps.
    mask: u64,
    prev: Option<u64>,
    max: u64,
    min: u64,
    total: u64,
    count: u32,
}

impl Timestamps {
    fn receive(&mut self, ts: Option<u64>) {
        let Some(ts) = ts else {
            self.prev = None;
            return;
        };
        if let Some(prev) = self.prev {
            let delta = if ts >= prev {
                ts - prev
            } else {
                // The clock wrapped at `mask`.
                self.mask - prev + ts + 1
            };
            self.max = self.max.max(delta);
            self.min = self.min.min(delta);
            self.total += delta;
            self.count += 1;
        }
        self.prev = Some(ts);
    }
}

#[derive(Debug)]
struct BadMessage {
    index: u32,
    byte_len: u32,
    pages: Vec<usize>,
}

/// The buffers and counters of a ping-pong run.
#[derive(Debug)]
pub struct Traffic {
    size: usize,
    /// Bytes before the payload in a receive buffer (the UD GRH).
    headroom: usize,
    rx_depth: u32,
    /// Receive buffers not posted: each receive completion gives its buffer
    /// back, and the refill posts them again.
    free: Vec<MemoryRegion>,
    /// Receives posted and not completed.
    routs: u32,
    send: SendBuf,
    /// With `-c`: what every payload must be.
    expect: Option<Vec<u8>>,
    page: usize,
    bad: Vec<BadMessage>,
    /// With `-t`: poll with the extended CQ's cursor and keep statistics.
    timestamps: Option<Timestamps>,
    /// With `-j`: the device memory behind [`SendBuf::Device`], read with
    /// `-c` to check what arrived.
    device: Option<DeviceMemory>,
}

impl Traffic {
    /// Registers `rx_depth` receive buffers of `headroom + size` bytes (one
    /// registration cut into pieces) and the send buffer (`inline`: none,
    /// the data is copied at post time).
    ///
    /// # Errors
    /// Allocation or registration failures.
    pub fn new(
        pd: &ProtectionDomain,
        opts: &Opts,
        headroom: usize,
        access: AccessFlags,
        inline: bool,
    ) -> Res<Traffic> {
        let page = page_size();
        let data = message_pattern(opts.size, opts.chk, page)?;
        let piece = opts.size + headroom;
        let total = piece
            .checked_mul(opts.rx_depth as usize)
            .context("the receive buffers (size × rx-depth) do not fit in memory")?;
        let recv = pd
            .reg_mr(filled(total, 0x7b)?, access | AccessFlags::LOCAL_WRITE)
            .with_context(|| format!("Couldn't register {total} bytes of receive buffers"))?;
        let send = if inline {
            SendBuf::Inline(data.clone())
        } else {
            SendBuf::Region(Some(
                pd.reg_mr(data.clone(), access)
                    .context("Couldn't register the send buffer")?,
            ))
        };
        if opts.prefetch {
            // As the C tool: fault the on-demand pages in before the run and
            // wait for it (FLUSH); a failure is reported, not fatal.
            let mut advised = pd.advise_mr(MrAdvice::PrefetchWrite, AdviseFlags::FLUSH, &[&recv]);
            if let (Ok(()), SendBuf::Region(Some(mr))) = (&advised, &send) {
                advised = pd.advise_mr(MrAdvice::Prefetch, AdviseFlags::FLUSH, &[mr]);
            }
            if let Err(e) = advised {
                eprintln!(
                    "Couldn't prefetch MR({}). Continue anyway ({e})",
                    e.errno().unwrap_or(0)
                );
            }
        }
        let free = recv
            .chunks(piece)
            .context("Couldn't cut the receive buffers")?;
        Ok(Traffic {
            size: opts.size,
            headroom,
            rx_depth: opts.rx_depth,
            free,
            routs: 0,
            send,
            expect: opts.chk.then_some(data),
            page,
            bad: Vec::new(),
            timestamps: None,
            device: None,
        })
    }

    /// `-j`: the message buffer in device memory, as the C tool has it: one
    /// region of `size` bytes over `dm` from its first byte, registered with
    /// `LOCAL_WRITE` (and zero-based), filled with the message pattern by
    /// `ibv_memcpy_to_dm`; every send and every receive use it. The C
    /// tool's messages on failure.
    ///
    /// # Errors
    /// Registration or the copy failed.
    pub fn in_device_memory(
        pd: &ProtectionDomain,
        opts: &Opts,
        mut dm: DeviceMemory,
    ) -> Res<Traffic> {
        let page = page_size();
        let data = message_pattern(opts.size, opts.chk, page)?;
        let region = pd
            .reg_dm_mr(&dm, 0, opts.size, AccessFlags::LOCAL_WRITE)
            .context("Couldn't register MR")?;
        dm.write_at(0, &data).context("Copy to dm buffer failed")?;
        Ok(Traffic {
            size: opts.size,
            headroom: 0,
            rx_depth: opts.rx_depth,
            free: Vec::new(),
            routs: 0,
            send: SendBuf::Device(DeviceSlice::whole(region)),
            expect: opts.chk.then_some(data),
            page,
            bad: Vec::new(),
            timestamps: None,
            device: Some(dm),
        })
    }

    /// Reads completion timestamps: the CQ must come from
    /// `create_cq_ex(.., timestamps: true)`; `mask` is the device's
    /// `completion_timestamp_mask`.
    pub fn with_timestamps(&mut self, mask: u64) {
        self.timestamps = Some(Timestamps {
            mask,
            prev: None,
            max: 0,
            min: u64::from(u32::MAX),
            total: 0,
            count: 0,
        });
    }

    /// Appends up to `max` completions, with their timestamps under `-t`.
    fn poll(
        &self,
        cq: &CompletionQueue,
        out: &mut Vec<(Completion, Option<u64>)>,
        max: usize,
    ) -> Res<usize> {
        if self.timestamps.is_none() {
            let mut wcs = Vec::with_capacity(max);
            let n = cq.poll(&mut wcs, max).context("poll CQ failed")?;
            out.extend(wcs.into_iter().map(|c| (c, None)));
            return Ok(n);
        }
        let Some(mut cursor) = cq.start_poll().context("poll CQ failed")? else {
            return Ok(0);
        };
        let mut n = 0;
        loop {
            let ts = cursor.completion_ts();
            if let Some(c) = cursor.take() {
                out.push((c, ts));
                n += 1;
            }
            if n >= max || !cursor.next().context("poll CQ failed")? {
                return Ok(n);
            }
        }
    }

    /// Posts receives until `rx_depth` are outstanding.
    ///
    /// # Errors
    /// `Couldn't post receive (N)` when fewer than `rx_depth` are posted.
    pub fn refill(&mut self, qp: &mut QueuePair) -> Res<()> {
        let SendBuf::Device(slice) = &self.send else {
            return refill_from(&mut self.free, &mut self.routs, self.rx_depth, |batch| {
                qp.post_recv_batch(batch)
            });
        };
        // -j: every receive lands in the one buffer.
        let want = self.rx_depth - self.routs;
        let batch = (0..want).map(|_| (RECV_WRID, WrBuffers::from(slice.clone())));
        let (posted, error) = match qp.post_recv_batch(batch) {
            Ok(()) => (want, None),
            Err(e) => (want - e.returned.len() as u32, Some(e.error)),
        };
        self.routs += posted;
        match error {
            Some(e) => Err(anyhow!("Couldn't post receive ({}): {e}", self.routs)),
            None => Ok(()),
        }
    }

    fn post_send(&mut self, qp: &mut QueuePair, ud: Option<&UdDest>) -> Res<()> {
        match &mut self.send {
            SendBuf::Inline(data) => {
                let mut wr = InlineSend::send(SEND_WRID, data);
                if let Some(d) = ud {
                    wr = wr.ud(&d.ah, d.remote_qpn, d.remote_qkey);
                }
                qp.post_send_inline(wr).context("Couldn't post send")
            }
            SendBuf::Region(slot) => {
                let mr = slot
                    .take()
                    .context("Couldn't post send: the previous send has not completed")?;
                let mut wr = SendWr::send(SEND_WRID, mr);
                if let Some(d) = ud {
                    wr = wr.ud(&d.ah, d.remote_qpn, d.remote_qkey);
                }
                qp.post_send(wr).map_err(|e| {
                    *slot = e
                        .returned
                        .into_iter()
                        .next()
                        .and_then(|(_, b)| b.into_one());
                    anyhow::Error::new(e.error).context("Couldn't post send")
                })
            }
            SendBuf::Device(slice) => {
                // Another reference to the region for this request; the
                // one a failed post gives back is dropped with the error.
                let mut wr = SendWr::send(SEND_WRID, slice.clone());
                if let Some(d) = ud {
                    wr = wr.ud(&d.ah, d.remote_qpn, d.remote_qkey);
                }
                qp.post_send(wr)
                    .map_err(PostError::drop_buffers)
                    .context("Couldn't post send")
            }
        }
    }

    /// With `-c`, records message `index` if its `byte_len` or its bytes
    /// (the receive buffer `mr`, or under `-j` the device memory, copied
    /// out with `ibv_memcpy_from_dm`) are not the pattern.
    fn check(&mut self, mr: Option<&MemoryRegion>, byte_len: u32, index: u32) -> Res<()> {
        let Some(expect) = &self.expect else {
            return Ok(());
        };
        let copied;
        let bytes = match (mr, &self.device) {
            (Some(mr), _) => mr.as_slice().context("Couldn't read a receive buffer")?,
            (None, Some(dm)) => {
                let mut out = filled(self.size, 0)?;
                dm.read_at(0, &mut out)
                    .context("Copy from DM buffer failed")?;
                copied = out;
                &copied[..]
            }
            (None, None) => return Err(anyhow!("a receive completed without a buffer")),
        };
        let payload = &bytes[self.headroom..];
        let len_ok = byte_len as usize == self.headroom + self.size;
        if len_ok && payload == &expect[..] {
            return Ok(());
        }
        let pages = bad_pages(payload, expect, self.page);
        self.bad.push(BadMessage {
            index,
            byte_len,
            pages,
        });
        Ok(())
    }

    /// Runs the ping-pong: `iters` sends and receives on this side, the client
    /// (`opts.host`) sending first. With a channel, waits for events (the CQ
    /// must have been armed before the peer could send), re-arms, then drains
    /// the CQ; without, busy-polls. Returns the time from the first send on.
    ///
    /// # Errors
    /// A failed completion, post or poll, as the C tools report them.
    pub fn run(
        &mut self,
        qp: &mut QueuePair,
        cq: &CompletionQueue,
        channel: Option<&CompletionChannel>,
        ud: Option<&UdDest>,
        opts: &Opts,
    ) -> Res<Duration> {
        let iters = opts.iters;
        let mut pending = RECV_WRID;
        if opts.host.is_some() {
            self.post_send(qp, ud)?;
            pending |= SEND_WRID;
        }
        let start = Instant::now();
        let (mut rcnt, mut scnt) = (0u32, 0u32);
        let mut wcs = Vec::with_capacity(16);
        while rcnt < iters || scnt < iters {
            match channel {
                Some(ch) => {
                    let event = ch.get_event().context("Failed to get cq_event")?;
                    if event.cq().as_raw() != cq.as_raw() {
                        return Err(anyhow!("CQ event for unknown CQ"));
                    }
                    drop(event); // acknowledges it
                    cq.req_notify(false)
                        .context("Couldn't request CQ notification")?;
                    while self.poll(cq, &mut wcs, 16)? > 0 {}
                }
                None => {
                    while wcs.is_empty() {
                        self.poll(cq, &mut wcs, 2)?;
                    }
                }
            }
            for (mut wc, ts) in wcs.drain(..) {
                if wc.status != WcStatus::Success {
                    return Err(anyhow!(
                        "Failed status {} ({}) for wr_id {}",
                        wc.status,
                        wc.status.to_raw(),
                        wc.wr_id
                    ));
                }
                match wc.wr_id {
                    SEND_WRID => {
                        scnt += 1;
                        match &mut self.send {
                            SendBuf::Region(slot) => {
                                *slot = Some(wc.take_buffers().into_one().context(
                                    "the send buffer did not come back with its completion",
                                )?)
                            }
                            SendBuf::Device(_) => {
                                wc.take_buffers().into_device().context(
                                    "the device memory did not come back with its completion",
                                )?;
                            }
                            SendBuf::Inline(_) => {}
                        }
                    }
                    RECV_WRID => {
                        let back = wc.take_buffers();
                        let mr = match (&self.send, back) {
                            (SendBuf::Device(_), WrBuffers::Device(_)) => None,
                            (_, back) => Some(back.into_one().context(
                                "a receive buffer did not come back with its completion",
                            )?),
                        };
                        self.check(mr.as_ref(), wc.byte_len, rcnt)?;
                        if let Some(t) = &mut self.timestamps {
                            t.receive(ts);
                        }
                        self.free.extend(mr);
                        self.routs -= 1;
                        if self.routs <= 1 {
                            self.refill(qp)?;
                        }
                        rcnt += 1;
                    }
                    other => return Err(anyhow!("Completion for unknown wr_id {other}")),
                }
                pending &= !wc.wr_id;
                if scnt < iters && pending == 0 {
                    self.post_send(qp, ud)?;
                    pending = RECV_WRID | SEND_WRID;
                }
            }
        }
        Ok(start.elapsed())
    }

    /// Prints the C tools' two result lines and, with `-c`, what was wrong.
    ///
    /// # Errors
    /// With `-c`, when any received message differed from the pattern.
    pub fn report(&self, opts: &Opts, elapsed: Duration) -> Res<()> {
        print_results(opts, elapsed);
        if let Some(t) = self.timestamps.as_ref().filter(|t| t.count > 0) {
            println!("Max receive completion clock cycles = {}", t.max);
            println!("Min receive completion clock cycles = {}", t.min);
            println!(
                "Average receive completion clock cycles = {:.6}",
                t.total as f64 / f64::from(t.count)
            );
        }
        let Some(first) = self.bad.first() else {
            return Ok(());
        };
        for page in &first.pages {
            println!("invalid data in page {page}");
        }
        Err(anyhow!(
            "{} of {} messages received had invalid data (the first: message {}, {} bytes \
             received, {} expected)",
            self.bad.len(),
            opts.iters,
            first.index,
            first.byte_len,
            self.headroom + self.size
        ))
    }
}

/// The indices of the `page`-sized pages where `got` differs from `want`
/// (what `-c` reports as "invalid data in page N").
pub fn bad_pages(got: &[u8], want: &[u8], page: usize) -> Vec<usize> {
    got.chunks(page)
        .zip(want.chunks(page))
        .enumerate()
        .filter(|(_, (g, w))| g != w)
        .map(|(i, _)| i)
        .collect()
}

impl Traffic {
    /// The rest of a connected tool's run (`rc_pingpong`, `uc_pingpong`) once
    /// its QP and buffers exist: the QP to INIT with the receives posted, the CQ
    /// armed (`-e`) before the peer learns our address so that no completion is
    /// missed, the handshake, the QP to RTR and RTS towards the peer, the
    /// traffic and its report. No remote access: the peer only SENDs.
    /// `RtrAttr::new`/`RtsAttr::new` have the C tools' defaults (1 outstanding
    /// READ/atomic, RNR timer 12; timeout 14, 7 retries, 7 RNR retries), of which
    /// a UC QP takes only the address, MTU, QPN and PSNs: UC has no
    /// acknowledgements, so no timeouts.
    pub fn run_connected(
        mut self,
        ctx: &rdma::Context,
        port: &PortAttr,
        opts: &Opts,
        qp: &mut QueuePair,
        cq: &CompletionQueue,
        channel: Option<&CompletionChannel>,
    ) -> Res<()> {
        qp.to_init(&InitAttr::new(opts.ib_port))
            .context("Failed to modify QP to INIT")?;
        self.refill(qp)?;
        if channel.is_some() {
            cq.req_notify(false)
                .context("Couldn't request CQ notification")?;
        }
        let me = local_dest(ctx, port, opts, qp.qp_num(), true)?;
        me.print("local");
        let mtu = opts.mtu.unwrap_or(port.active_mtu);
        let connect = |peer: &Dest| -> Res<()> {
            let ah = peer_ah(opts, port, peer)?;
            qp.to_rtr(Some(&RtrAttr::new(ah, mtu, peer.qpn, peer.psn)))
                .context("Failed to modify QP to RTR")?;
            qp.to_rts(&RtsAttr::new(me.psn))
                .context("Failed to modify QP to RTS")
        };
        let peer = exchange(opts, &me, connect)?;
        peer.print("remote");
        let elapsed = self.run(qp, cq, channel, None, opts)?;
        self.report(opts, elapsed)
    }
}
