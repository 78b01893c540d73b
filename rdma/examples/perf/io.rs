//! Posting and polling, on both paths.
//!
//! - safe: `SendWr`/`InlineSend` through `QueuePair::post_send*`, memory
//!   moved into the queue and given back by `CompletionQueue::poll_wc`.
//! - raw: prebuilt `ibv_send_wr`/`ibv_recv_wr` through the `unsafe`
//!   `post_send_raw`/`post_recv_raw` (or the `ibv_wr_*` calls for
//!   `--post extended`, which `post_send_raw` does not cover), and
//!   `ibv_poll_cq` into a fixed array, as a C program would.
//!
//! Work request ids carry `(qp index << 32) | n`, where `n` counts the
//! requests posted on that QP so far, including this one: a completion tells
//! how many requests of its QP are done, unsignaled ones included.

use rdma::{
    ffi, AccessFlags, CompletionChannel, CompletionQueue, PostPath, QueuePair, RemoteMemory,
    SendOp, SendWr, WcStatus, WorkCompletion, WrBuffers,
};

use anyhow::{anyhow, Context as _};

use crate::common::Res;
use crate::oob::Watch;
use crate::opts::{AtomicOp, Verb};

/// Completions fetched per poll (perftest's `CTX_POLL_BATCH`).
pub const POLL_BATCH: usize = 16;

/// The wr_id of the `n`-th request posted on QP `q`.
pub fn wr_id(q: usize, n: u32) -> u64 {
    ((q as u64) << 32) | u64::from(n)
}

/// The QP index and request count of a wr_id.
pub fn split_id(id: u64) -> (usize, u32) {
    ((id >> 32) as usize, id as u32)
}

#[cold]
fn failed(what: &str, status: WcStatus, vendor_err: u32, id: u64) -> anyhow::Error {
    let (q, n) = split_id(id);
    let hint = if status == WcStatus::LocQpOpErr {
        " (with --post extended and -I: rdma-core's rxe provider before release 51 builds \
         inline ibv_wr_* requests wrongly; use --post legacy or auto for inline sends)"
    } else {
        ""
    };
    anyhow!(
        "{what} completion with error on QP {q}, request {n}: {status} (status {}, vendor error \
         {vendor_err:#x}){hint}",
        status.to_raw()
    )
}

/// Errors out on a failed completion (the async loops').
#[cfg(feature = "tokio")]
#[inline]
pub fn check(c: &rdma::Completion, what: &str) -> Res<()> {
    if c.is_success() {
        Ok(())
    } else {
        Err(failed(what, c.status, c.vendor_err, c.wr_id))
    }
}

/// [`check`] of the compact form.
#[inline(always)]
pub fn check_wc(wc: &WorkCompletion, what: &str) -> Res<()> {
    if wc.is_success() {
        Ok(())
    } else {
        Err(failed(what, wc.status(), wc.vendor_err(), wc.wr_id()))
    }
}

/// Sleeps on `ch` until `cq` has a completion (or a spurious wake-up).
/// `poll` is tried once more after arming, so no completion is missed.
fn sleep_on(
    cq: &CompletionQueue,
    ch: &CompletionChannel,
    mut poll: impl FnMut() -> Res<usize>,
) -> Res<usize> {
    if crate::events::through_cq() {
        return crate::events::sleep(cq, poll);
    }
    cq.req_notify(false)
        .context("Couldn't request CQ notification")?;
    let n = poll()?;
    if n > 0 {
        return Ok(n);
    }
    // Acknowledged when dropped.
    drop(ch.get_event().context("Couldn't get a CQ event")?);
    poll()
}

/// Safe poll: up to `wcs.len()` completions into `wcs` (the compact form,
/// resolved in place), the memory of the requests they finish appended to
/// `memory`. With a channel, sleeps while the CQ is empty; may still
/// return 0.
///
/// # Errors
/// `ibv_poll_cq` failures.
#[inline(always)]
pub fn poll_safe(
    cq: &CompletionQueue,
    ch: Option<&CompletionChannel>,
    wcs: &mut [WorkCompletion],
    memory: &mut Vec<(u64, WrBuffers)>,
) -> Res<usize> {
    let n = cq.poll_wc(wcs, memory).context("poll CQ failed")?;
    match ch {
        Some(ch) if n == 0 => {
            sleep_on(cq, ch, || cq.poll_wc(wcs, memory).context("poll CQ failed"))
        }
        _ => Ok(n),
    }
}

/// Safe: waits for one completion, polled into `wc` (the memory of the
/// requests it finishes appended to `memory`), and returns it (checked).
///
/// # Errors
/// Poll failures, or a completion with an error status.
#[inline(always)]
pub fn wait_one_safe<'w>(
    cq: &CompletionQueue,
    ch: Option<&CompletionChannel>,
    wc: &'w mut [WorkCompletion; 1],
    memory: &mut Vec<(u64, WrBuffers)>,
    watch: &Watch<'_>,
    what: &str,
) -> Res<&'w WorkCompletion> {
    while poll_safe(cq, ch, wc, memory)? == 0 {
        if ch.is_none() {
            watch.idle()?;
        }
    }
    check_wc(&wc[0], what)?;
    Ok(&wc[0])
}

/// Raw poll: `ibv_poll_cq` into `wc`; with a channel, sleeps while empty.
///
/// # Errors
/// `ibv_poll_cq` failures, failed completions.
#[inline(always)]
pub fn poll_raw(
    cq: &CompletionQueue,
    ch: Option<&CompletionChannel>,
    wc: &mut [ffi::ibv_wc],
    what: &str,
) -> Res<usize> {
    let mut poll = || -> Res<usize> {
        let max = std::ffi::c_int::try_from(wc.len()).unwrap_or(std::ffi::c_int::MAX);
        // SAFETY: the CQ is live (borrowed) and `wc` has room for `max`
        // entries.
        let n = unsafe { ffi::ibv_poll_cq(cq.as_raw(), max, wc.as_mut_ptr()) };
        let n = usize::try_from(n).map_err(|_| anyhow!("poll CQ failed: {n}"))?;
        for w in &wc[..n] {
            if w.status != ffi::IBV_WC_SUCCESS {
                return Err(failed(
                    what,
                    WcStatus::from_raw(w.status),
                    w.vendor_err,
                    w.wr_id,
                ));
            }
        }
        Ok(n)
    };
    let n = poll()?;
    match ch {
        Some(ch) if n == 0 => sleep_on(cq, ch, poll),
        _ => Ok(n),
    }
}

/// Raw: waits for one completion; returns its wr_id.
///
/// # Errors
/// As [`poll_raw`].
#[inline(always)]
pub fn wait_one_raw(
    cq: &CompletionQueue,
    ch: Option<&CompletionChannel>,
    wc: &mut [ffi::ibv_wc; 1],
    watch: &Watch<'_>,
    what: &str,
) -> Res<u64> {
    while poll_raw(cq, ch, wc, what)? == 0 {
        watch.idle()?;
    }
    Ok(wc[0].wr_id)
}

/// The safe request of `verb` over `buffers`.
pub fn safe_wr(
    verb: Verb,
    atomic: AtomicOp,
    id: u64,
    buffers: impl Into<WrBuffers>,
    remote: RemoteMemory,
) -> SendWr {
    SendWr::new(id, safe_op(verb, atomic, remote), buffers)
}

/// Whether the requests of `verb` only read their local buffer (SEND,
/// RDMA WRITE), so that every request in flight can use the same one, as
/// perftest's do: the safe path shares one region among them
/// (`WrBuffers::Shared`), the raw path posts them all from one buffer.
/// READ and atomic results are written locally: one buffer per request.
pub fn shares_buffer(verb: Verb) -> bool {
    matches!(verb, Verb::Send | Verb::Write)
}

/// The operation of `verb`'s requests (an atomic adds 1 or swaps 0 for 0).
pub fn safe_op(verb: Verb, atomic: AtomicOp, remote: RemoteMemory) -> SendOp {
    match verb {
        Verb::Send => SendOp::Send,
        Verb::Write => SendOp::Write(remote),
        Verb::Read => SendOp::Read(remote),
        Verb::Atomic => match atomic {
            AtomicOp::FetchAdd => SendOp::FetchAdd { remote, add: 1 },
            AtomicOp::CmpSwap => SendOp::CompareSwap {
                remote,
                compare: 0,
                swap: 0,
            },
        },
    }
}

/// Local access a buffer of `verb` needs (the device writes READ and atomic
/// results).
pub fn local_access(verb: Verb) -> AccessFlags {
    match verb {
        Verb::Send | Verb::Write => AccessFlags::empty(),
        Verb::Read | Verb::Atomic => AccessFlags::LOCAL_WRITE,
    }
}

/// A prebuilt send request for the raw path, reused for every post: only
/// the buffer address, the id and the flags change.
pub struct RawSend {
    sge: ffi::ibv_sge,
    wr: ffi::ibv_send_wr,
    /// The extended view of the QP, for `--post extended`.
    qpx: Option<*mut ffi::ibv_qp_ex>,
    verb: Verb,
    atomic: AtomicOp,
    remote: RemoteMemory,
}

impl RawSend {
    /// A request of `verb` on `qp` from `len` bytes at `lkey` towards
    /// `remote`; `inline` sends the data inline. A QP on the extended path
    /// is posted to with `ibv_wr_*`, others with `post_send_raw`.
    pub fn new(
        qp: &QueuePair,
        verb: Verb,
        atomic: AtomicOp,
        lkey: u32,
        len: usize,
        remote: RemoteMemory,
        inline: bool,
    ) -> RawSend {
        let mut wr = ffi::ibv_send_wr {
            num_sge: 1,
            opcode: match (verb, atomic) {
                (Verb::Send, _) => ffi::IBV_WR_SEND,
                (Verb::Write, _) => ffi::IBV_WR_RDMA_WRITE,
                (Verb::Read, _) => ffi::IBV_WR_RDMA_READ,
                (Verb::Atomic, AtomicOp::FetchAdd) => ffi::IBV_WR_ATOMIC_FETCH_AND_ADD,
                (Verb::Atomic, AtomicOp::CmpSwap) => ffi::IBV_WR_ATOMIC_CMP_AND_SWP,
            },
            send_flags: if inline { ffi::IBV_SEND_INLINE } else { 0 },
            ..Default::default()
        };
        match verb {
            Verb::Write | Verb::Read => {
                wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                }
            }
            Verb::Atomic => {
                wr.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr: remote.addr,
                    compare_add: u64::from(atomic == AtomicOp::FetchAdd),
                    swap: 0,
                    rkey: remote.rkey,
                }
            }
            Verb::Send => {}
        }
        let qpx = (qp.post_path() == PostPath::Extended).then(|| {
            // SAFETY: with --post extended the QP was created by
            // ibv_create_qp_ex with send_ops_flags (PostPath::Extended
            // fails otherwise), so it has an extended view.
            unsafe { ffi::ibv_qp_to_qp_ex(qp.as_raw()) }
        });
        RawSend {
            sge: ffi::ibv_sge {
                addr: 0,
                length: u32::try_from(len).unwrap_or(u32::MAX),
                lkey,
            },
            wr,
            qpx,
            verb,
            atomic,
            remote,
        }
    }

    /// Posts the request for the buffer at `addr`.
    ///
    /// # Safety
    /// `addr..addr + len` lies in a registration (of the `lkey` given to
    /// [`RawSend::new`]) that outlives `qp`'s work (it is kept in
    /// `Conn::raw_keep`, dropped after the QPs), and is not accessed through
    /// a Rust reference while the device may read or write it; `qp` is the
    /// QP given to `new`. Inlined, as the safe path's post is: the raw
    /// loops are the floor the safe ones are measured against
    /// (`ci/bench-instr --perf-args --raw`), not a call and its register
    /// saves per request.
    #[inline(always)]
    pub unsafe fn post(
        &mut self,
        qp: &mut QueuePair,
        addr: u64,
        id: u64,
        signaled: bool,
    ) -> Res<()> {
        self.sge.addr = addr;
        let inline = self.wr.send_flags & ffi::IBV_SEND_INLINE;
        let flags = inline | if signaled { ffi::IBV_SEND_SIGNALED } else { 0 };
        if let Some(q) = self.qpx {
            let r = self.remote;
            // SAFETY: `q` is the extended view of `qp` (see `new`), which
            // `&mut` keeps from any other post; the buffer contract is the
            // caller's.
            let rc = unsafe {
                ffi::ibv_wr_start(q);
                (*q).wr_id = id;
                (*q).wr_flags = flags & !ffi::IBV_SEND_INLINE;
                match (self.verb, self.atomic) {
                    (Verb::Send, _) => ffi::ibv_wr_send(q),
                    (Verb::Write, _) => ffi::ibv_wr_rdma_write(q, r.rkey, r.addr),
                    (Verb::Read, _) => ffi::ibv_wr_rdma_read(q, r.rkey, r.addr),
                    (Verb::Atomic, AtomicOp::FetchAdd) => {
                        ffi::ibv_wr_atomic_fetch_add(q, r.rkey, r.addr, 1)
                    }
                    (Verb::Atomic, AtomicOp::CmpSwap) => {
                        ffi::ibv_wr_atomic_cmp_swp(q, r.rkey, r.addr, 0, 0)
                    }
                }
                if inline != 0 {
                    ffi::ibv_wr_set_inline_data(
                        q,
                        addr as usize as *mut _,
                        self.sge.length as usize,
                    );
                } else {
                    ffi::ibv_wr_set_sge(q, self.sge.lkey, addr, self.sge.length);
                }
                ffi::ibv_wr_complete(q)
            };
            if rc != 0 {
                return Err(anyhow!(
                    "Couldn't post send (ibv_wr_complete): {}",
                    std::io::Error::from_raw_os_error(rc)
                ));
            }
            return Ok(());
        }
        self.wr.wr_id = id;
        self.wr.send_flags = flags;
        self.wr.sg_list = &mut self.sge;
        self.wr.next = std::ptr::null_mut();
        // SAFETY: a single well-formed request whose SGE points into memory
        // the caller guarantees (see above); `wr_id` has bit 63 clear.
        unsafe { qp.post_send_raw(&mut self.wr) }.context("Couldn't post send")
    }
}

impl std::fmt::Debug for RawSend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawSend")
            .field("verb", &self.verb)
            .field("opcode", &self.wr.opcode)
            .field("len", &self.sge.length)
            .field("extended", &self.qpx.is_some())
            .finish_non_exhaustive()
    }
}

/// Prebuilt receive requests for the raw path: slot `i` receives into
/// `base + i * len`.
pub struct RawRecv {
    sge: ffi::ibv_sge,
    wr: ffi::ibv_recv_wr,
    base: u64,
    len: u64,
}

impl std::fmt::Debug for RawRecv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawRecv")
            .field("base", &format_args!("{:#x}", self.base))
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl RawRecv {
    /// Receives of `len` bytes into the registration at `base` (`lkey`).
    pub fn new(base: u64, lkey: u32, len: usize) -> RawRecv {
        RawRecv {
            sge: ffi::ibv_sge {
                addr: base,
                length: u32::try_from(len).unwrap_or(u32::MAX),
                lkey,
            },
            wr: ffi::ibv_recv_wr {
                num_sge: 1,
                ..Default::default()
            },
            base,
            len: len as u64,
        }
    }

    /// Posts slot `slot` with wr_id `id`.
    ///
    /// # Safety
    /// Slot `slot` lies in the registration given to [`RawRecv::new`], which
    /// outlives `qp`'s work (`Conn::raw_keep`), and is not posted twice at
    /// once nor accessed through a Rust reference while posted. Inlined,
    /// as [`RawSend::post`].
    #[inline(always)]
    pub unsafe fn post(&mut self, qp: &mut QueuePair, slot: u32, id: u64) -> Res<()> {
        self.sge.addr = self.base + u64::from(slot) * self.len;
        self.wr.wr_id = id;
        self.wr.sg_list = &mut self.sge;
        self.wr.next = std::ptr::null_mut();
        // SAFETY: one well-formed request over memory the caller guarantees;
        // bit 63 of the id is clear.
        unsafe { qp.post_recv_raw(&mut self.wr) }.context("Couldn't post receive")
    }
}
