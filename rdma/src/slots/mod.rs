//! The slot queue: the data path for latency-bound code. Memory is
//! registered once and lent to the slots of one queue pair for the queue's
//! whole life (as io_uring lends registered buffers), completions come on a
//! CQ that only this queue uses, and a request's `wr_id` is its slot: a post
//! is a range check of the slot plus the provider's calls, a completion is an
//! index. The bookkeeping is in [`ledger`]; this file owns the objects and
//! makes the calls.
//!
//! Against the general path (`QueuePair::post_send` and its tracker), the
//! slot queue gives up moving memory into requests and any CQ sharing, and
//! keeps the guarantee: the caller never writes memory the device may read,
//! never reads memory the device may write, and nothing the device may still
//! reach is freed.

mod ledger;
mod prepared;
mod requests;

use std::borrow::Cow;
use std::ffi::c_int;
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use crate::error::{check_errno_ret, Error, Result};
use crate::qp::{DirectOne, SendFn, WriteFn};
use crate::{
    ffi, AccessFlags, CompletionQueue, MemoryRegion, PostPath, ProtectionDomain, QpType, QueuePair,
    RemoteMemory, WcStatus,
};
use ledger::{Finished, Ledger, Refusal};
pub use prepared::{SlotSender, SlotWriter};
use requests::Requests;

/// How a [`SlotQueue`] is built: its slots, and the queue pair's sizes.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SlotConfig {
    /// Number of slots (at least 1).
    pub slots: u32,
    /// Bytes per slot (at least 1, at most `u32::MAX`).
    pub slot_len: usize,
    /// [`QpType::Rc`] (the default) or [`QpType::Uc`].
    pub qp_type: QpType,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Largest send posted inline (copied during the post).
    pub max_inline_data: u32,
    /// The send path (`ibv_wr_*` or `ibv_post_send`).
    pub post_path: PostPath,
}

impl SlotConfig {
    /// `slots` slots of `slot_len` bytes on an RC QP with 64 sends and 64
    /// receives, no inline data, the default send path.
    pub fn new(slots: u32, slot_len: usize) -> SlotConfig {
        SlotConfig {
            slots,
            slot_len,
            qp_type: QpType::Rc,
            max_send_wr: 64,
            max_recv_wr: 64,
            max_inline_data: 0,
            post_path: PostPath::Auto,
        }
    }
}

/// The provider's `poll_cq` (`ibv_poll_cq(3)` is a `static inline` that calls
/// it through the context's ops; called directly, as the send path calls
/// `ibv_wr_*`'s members, `qp/wr_ops.rs`).
type PollFn = unsafe extern "C" fn(*mut ffi::ibv_cq, c_int, *mut ffi::ibv_wc) -> c_int;

/// A queue pair whose requests use the slots of one registered region, and
/// the CQ its completions come to.
///
/// Slot `i` is bytes `i * slot_len .. (i + 1) * slot_len` of the region.
/// SEND and RDMA WRITE read a slot (several may be in flight from one slot);
/// a receive writes it. The caller reads a slot ([`SlotQueue::slot`]) while
/// no receive is posted in it, and writes it ([`SlotQueue::slot_mut`]) while
/// nothing in flight uses it: a receive's bytes are readable once its
/// completion has been polled, a send's slot writable once its completion,
/// or a later send's, has been. A request is in flight until its completion
/// is polled from this queue (with [`SlotQueue::poll`]), including the
/// flushed completions of a QP in the error state.
///
/// A loop that posts the same request again and again (a latency loop)
/// prepares it once: [`SlotQueue::writer`] and [`SlotQueue::sender`] check
/// the slot, the length and a write's remote range when they are made, and
/// each post through them checks only what changes from post to post.
///
/// The QP is reached through [`SlotQueue::qp`] for its state changes
/// (`to_init`, `to_rtr`, `to_rts`, `to_error`); it cannot be posted to but
/// through the queue. Its CQ is this queue's alone: polling it elsewhere
/// (a clone of `qp().send_cq()`) takes completions the queue then never
/// sees, and their slots stay lent (never unsafe, but lost). Dropping the
/// queue destroys the QP before the memory is released, whatever is in
/// flight; [`SlotQueue::reset`] takes every slot back.
///
/// Through the connection manager (the only way an iWARP QP connects):
/// make the queue on a PD of the id's context
/// ([`CmId::context`](crate::cm::CmId::context)) and hand its QP to
/// [`CmId::connect_qp`](crate::cm::CmId::connect_qp) (then
/// [`CmId::establish_qp`](crate::cm::CmId::establish_qp) at
/// `CONNECT_RESPONSE` on InfiniBand and RoCE) or
/// [`CmId::accept_qp`](crate::cm::CmId::accept_qp). The QP stays the
/// queue's own (`ibv_create_qp`, never `rdma_create_qp`): the CM only moves
/// it through its states (on iWARP the kernel's, which also moves it to the
/// error state when the connection ends), so the id may be dropped before
/// or after the queue, and nothing above depends on it.
///
/// ```no_run
/// use rdma::{SlotConfig, SlotQueue};
/// # fn main() -> rdma::Result<()> {
/// let ctx = rdma::Context::open("rxe0")?;
/// let pd = ctx.alloc_pd()?;
/// let mut q = SlotQueue::new(&pd, &SlotConfig::new(4, 4096))?;
/// // ... move q.qp() to RTS with the peer's address (see the crate docs)
/// q.slot_mut(0)?[..5].copy_from_slice(b"hello");
/// q.post_send(0, 5, true)?;
/// q.post_recv(1)?;
/// loop {
///     match q.poll()? {
///         Some(c) if c.is_recv() => {
///             let got = &q.slot(c.slot())?[..c.byte_len() as usize];
///             println!("{got:?}");
///             break;
///         }
///         _ => {}
///     }
/// }
/// # Ok(())
/// # }
/// ```
pub struct SlotQueue {
    /// Taken by the drop, which destroys the QP before anything below is
    /// released, and leaks `memory` when that fails.
    qp: Option<QueuePair>,
    /// The CQ of both queues of `qp`, created here and used by no other QP.
    cq: CompletionQueue,
    /// The slots' memory, registered with local write access only: no peer
    /// can write it, so a slot that no request uses is the caller's.
    memory: Option<MemoryRegion>,
    /// `memory`'s first byte, taken once from its unique borrow.
    base: NonNull<u8>,
    /// `cq`'s C object, read once: a poll loads one pointer, not a
    /// handle's `Arc` and then its field.
    cq_raw: NonNull<ffi::ibv_cq>,
    lkey: u32,
    slot_len: u32,
    max_inline: u32,
    /// The shortest SEND and RDMA WRITE posted by their direct calls, less
    /// one: `max_inline`, or `u32::MAX` on the legacy path, so that a post
    /// compares its length once (the `Option`'s test stays: no unchecked
    /// unwrap).
    send_above: u32,
    write_above: u32,
    /// SEND's and RDMA WRITE's direct calls on the extended path (`None`:
    /// the prebuilt request of `requests` and `ibv_post_send`), each of
    /// one operation; the write's remote is given per post.
    send: Option<DirectOne<SendFn>>,
    write: Option<DirectOne<WriteFn>>,
    poll_cq: PollFn,
    /// The prebuilt requests and the provider's legacy posts.
    requests: Requests,
    ledger: Ledger,
    /// This queue among all made in the process: a prepared post
    /// (`prepared.rs`) checks that its handle still reaches the queue it
    /// was made for, since [`SlotWriter::queue`] lends the queue mutably and
    /// another queue can be swapped in there.
    id: u64,
}

/// The next [`SlotQueue`]'s `id`.
static NEXT_QUEUE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

// SAFETY: the queue owns the QP, the CQ and the region (each `Send`); the
// raw pointers are into those objects (the slots' memory, the provider's
// functions of the QP), used only through `&mut self` for posts and polls.
unsafe impl Send for SlotQueue {}
// SAFETY: `&self` methods read the ledger and the slots the ledger says no
// request writes, or call thread-safe verbs (the QP's `&self` methods).
unsafe impl Sync for SlotQueue {}

/// A remote buffer that RDMA WRITEs of a [`SlotQueue`] go to
/// ([`SlotQueue::write_target`]). Only data: any queue may write to it (what
/// a write reaches is the peer's to allow; the slot it reads is what the
/// queue checks).
#[derive(Debug, Clone, Copy)]
pub struct SlotTarget {
    remote: RemoteMemory,
}

/// A completion polled from a [`SlotQueue`]: the slot it gives back.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SlotCompletion {
    slot: u32,
    recv: bool,
    status: u32,
    /// `vendor_err` (low half) and `byte_len` (high half), which lie side
    /// by side in `struct ibv_wc`: one load where two fields were two.
    err_len: u64,
}

impl std::fmt::Debug for SlotCompletion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotCompletion")
            .field("slot", &self.slot)
            .field("recv", &self.recv)
            .field("status", &self.status())
            .field("vendor_err", &self.vendor_err())
            .field("byte_len", &self.byte_len())
            .finish()
    }
}

impl SlotCompletion {
    #[inline(always)]
    fn new(f: Finished, wc: &ffi::ibv_wc) -> SlotCompletion {
        SlotCompletion {
            slot: f.slot,
            recv: f.recv,
            status: wc.status,
            err_len: u64::from(wc.vendor_err) | u64::from(wc.byte_len) << 32,
        }
    }

    /// The slot of the request (for a send, the signaled one; the sends
    /// before it are complete too).
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// A receive's completion (else a send's or an RDMA WRITE's).
    pub fn is_recv(&self) -> bool {
        self.recv
    }

    /// The request succeeded.
    pub fn is_success(&self) -> bool {
        self.status == ffi::IBV_WC_SUCCESS
    }

    /// The status (`enum ibv_wc_status`).
    pub fn status(&self) -> WcStatus {
        WcStatus::from_raw(self.status)
    }

    /// The provider's error code of a failed request.
    pub fn vendor_err(&self) -> u32 {
        self.err_len as u32
    }

    /// Bytes received (receives).
    pub fn byte_len(&self) -> u32 {
        (self.err_len >> 32) as u32
    }
}

impl SlotQueue {
    /// Registers `config.slots * config.slot_len` bytes on `pd` (zeroed,
    /// local write access), creates a CQ for them alone and a QP on it in
    /// RESET.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no slots, empty or too large slots,
    /// or a QP type other than RC or UC; the failed verb's error otherwise.
    pub fn new(pd: &ProtectionDomain, config: &SlotConfig) -> Result<SlotQueue> {
        let invalid = |reason: String| Error::InvalidArgument {
            verb: "SlotQueue::new",
            reason,
        };
        let slot_len = u32::try_from(config.slot_len)
            .ok()
            .filter(|&l| l > 0)
            .ok_or_else(|| {
                invalid(format!(
                    "slot length {} (1 to 2^32 - 1 bytes)",
                    config.slot_len
                ))
            })?;
        if config.slots == 0 || config.slots > 1 << 31 {
            return Err(invalid(format!("{} slots (1 to 2^31)", config.slots)));
        }
        let total = (config.slots as usize)
            .checked_mul(config.slot_len)
            .ok_or_else(|| {
                invalid(format!(
                    "{} slots of {slot_len} bytes overflow",
                    config.slots
                ))
            })?;
        if !matches!(config.qp_type, QpType::Rc | QpType::Uc) {
            return Err(invalid(format!(
                "a {:?} QP: the slot queue takes RC or UC (one peer, sends completed in order)",
                config.qp_type
            )));
        }
        let cqe = config.max_send_wr.saturating_add(config.max_recv_wr).max(1);
        let cq = pd.context().create_cq(cqe, None, 0)?;
        let qp = pd
            .qp_builder(config.qp_type, &cq, &cq)
            .max_send_wr(config.max_send_wr)
            .max_recv_wr(config.max_recv_wr)
            .max_inline_data(config.max_inline_data)
            .post_path(config.post_path)
            .build()?;
        let mut memory = pd.alloc_mr(total, AccessFlags::LOCAL_WRITE)?;
        let base = NonNull::new(memory.as_mut_slice()?.as_mut_ptr())
            .ok_or_else(|| invalid("the region has no memory".into()))?;
        let qp_raw = NonNull::new(qp.as_raw()).ok_or_else(|| invalid("no QP".into()))?;
        let cq_raw = NonNull::new(cq.as_raw()).ok_or_else(|| invalid("no CQ".into()))?;
        // SAFETY: a live CQ whose context is live; `ops` is libibverbs' ABI.
        let poll = unsafe { (*(*cq_raw.as_ptr()).context).ops.poll_cq };
        let lkey = memory.lkey();
        // SAFETY: the queue's live QP, which outlives every post (the
        // queue's methods post; the drop destroys it).
        let requests = unsafe { Requests::new(qp_raw, lkey, slot_len) };
        // What was asked for: a provider may give more, and a message the
        // caller did not want inline is not sent inline.
        let max_inline = config.max_inline_data.min(qp.caps().max_inline_data);
        let send = qp.direct_send();
        let write = qp.direct_write();
        let above = |direct: bool| if direct { max_inline } else { u32::MAX };
        Ok(SlotQueue {
            cq_raw,
            lkey,
            slot_len,
            max_inline,
            send_above: above(send.is_some()),
            write_above: above(write.is_some()),
            send,
            write,
            poll_cq: poll.unwrap_or(ffi::ibv_poll_cq),
            requests,
            ledger: Ledger::new(config.slots),
            id: NEXT_QUEUE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            base,
            qp: Some(qp),
            cq,
            memory: Some(memory),
        })
    }

    /// The queue pair, for its state changes and queries.
    pub fn qp(&self) -> &QueuePair {
        match &self.qp {
            Some(qp) => qp,
            // Only the drop takes it.
            None => unreachable!("SlotQueue without its QP"),
        }
    }

    /// The CQ of the queue's completions (poll it only through
    /// [`SlotQueue::poll`]).
    pub fn cq(&self) -> &CompletionQueue {
        &self.cq
    }

    /// Number of slots.
    pub fn slots(&self) -> u32 {
        self.ledger.len()
    }

    /// Bytes per slot.
    pub fn slot_len(&self) -> usize {
        self.slot_len as usize
    }

    /// Requests posted whose completion has not been polled: (sends,
    /// receives).
    pub fn in_flight(&self) -> (u64, usize) {
        self.ledger.in_flight()
    }

    /// The bytes of `slot`, when no receive is posted in it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a slot out of range or with a receive
    /// posted.
    #[inline]
    pub fn slot(&self, slot: u32) -> Result<&[u8]> {
        self.ledger
            .readable(slot)
            .map_err(|r| refused("SlotQueue::slot", slot, r))?;
        // SAFETY: the slot is in the region (the ledger knows it), which
        // lives as long as `self`; no receive is posted in it and no peer
        // can write the region (local access only), so nothing writes it
        // while `&self` is borrowed (posts and polls take `&mut self`).
        Ok(unsafe { std::slice::from_raw_parts(self.at(slot), self.slot_len as usize) })
    }

    /// The bytes of `slot`, mutably, when no request in flight uses it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a slot out of range or in use.
    #[inline]
    pub fn slot_mut(&mut self, slot: u32) -> Result<&mut [u8]> {
        self.ledger
            .writable(slot)
            .map_err(|r| refused("SlotQueue::slot_mut", slot, r))?;
        // SAFETY: as in `slot`, and no send in flight reads it; `&mut self`
        // makes the borrow unique.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.at(slot), self.slot_len as usize) })
    }

    /// Slot `slot`'s first byte; `slot` is in range.
    #[inline(always)]
    fn at(&self, slot: u32) -> *mut u8 {
        // SAFETY: `slot < slots`, so the offset is inside the region.
        unsafe {
            self.base
                .as_ptr()
                .add(slot as usize * self.slot_len as usize)
        }
    }

    /// The scatter entry of `len` bytes of `slot` (in range): lkey,
    /// address, length.
    #[inline(always)]
    fn sge(&self, slot: u32, len: u32) -> (u32, u64, u32) {
        (self.lkey, self.at(slot) as u64, len)
    }

    /// The target of RDMA WRITEs to `remote`, for [`SlotQueue::post_write`]:
    /// each write lands at `remote.addr` and may carry at most `remote.len`
    /// bytes (a part of a peer's region is a [`RemoteMemory::slice`]).
    pub fn write_target(&self, remote: RemoteMemory) -> SlotTarget {
        SlotTarget { remote }
    }

    /// Posts a SEND of the first `len` bytes of `slot`; `signaled` asks for
    /// its completion (an unsignaled send is complete with the next
    /// signaled one).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a slot out of range, with a receive
    /// posted, or shorter than `len`; `ibv_post_send`'s error (the slot is
    /// then as before).
    #[inline(always)]
    pub fn post_send(&mut self, slot: u32, len: u32, signaled: bool) -> Result<()> {
        self.post::<false, false>(None, slot, len, signaled, |_| {})
    }

    /// Lets `fill` write `slot` (all of it), then posts an RDMA WRITE of its
    /// first `len` bytes to `target`: [`SlotQueue::slot_mut`] and
    /// [`SlotQueue::post_write`] with one look at the slot's state.
    ///
    /// # Errors
    /// As [`SlotQueue::post_write`], and a slot that a request in flight
    /// uses (`fill` is then not called).
    #[inline(always)]
    pub fn post_write_with(
        &mut self,
        target: &SlotTarget,
        slot: u32,
        len: u32,
        signaled: bool,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<()> {
        self.post::<true, true>(Some(&target.remote), slot, len, signaled, fill)
    }

    /// Posts an RDMA WRITE of the first `len` bytes of `slot` to the start
    /// of `target`.
    ///
    /// # Errors
    /// As [`SlotQueue::post_send`], and [`Error::InvalidArgument`] for more
    /// bytes than `target`'s remote range holds (which the peer would
    /// refuse, moving the QP to the error state).
    #[inline(always)]
    pub fn post_write(
        &mut self,
        target: &SlotTarget,
        slot: u32,
        len: u32,
        signaled: bool,
    ) -> Result<()> {
        self.post::<false, true>(Some(&target.remote), slot, len, signaled, |_| {})
    }

    /// A SEND (`WRITE` false, `remote` `None`) or an RDMA WRITE to the
    /// start of `remote` of `len` bytes of `slot`; with `FILL`, the slot
    /// must be free and `fill` writes it first.
    #[inline(always)]
    fn post<const FILL: bool, const WRITE: bool>(
        &mut self,
        remote: Option<&RemoteMemory>,
        slot: u32,
        len: u32,
        signaled: bool,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<()> {
        if len > self.slot_len {
            return Err(too_long(slot, len, self.slot_len));
        }
        // The peer refuses a write past the range it gave (a remote access
        // error, and the QP goes to the error state): refused here instead.
        if let Some(r) = remote {
            if !fits_remote(len, r) {
                return Err(self.beyond_remote(slot, len, r));
            }
        }
        let (wr_id, prev) = self
            .ledger
            .send::<FILL>(slot)
            .map_err(|r| refused("ibv_post_send", slot, r))?;
        let at = self.at(slot);
        if FILL {
            // SAFETY: as in `slot_mut`: in range and used by no request in
            // flight (the ledger checked it); the request just recorded is
            // handed to the provider only after this borrow ends.
            fill(unsafe { std::slice::from_raw_parts_mut(at, self.slot_len as usize) });
        }
        let flags = if signaled { ffi::IBV_SEND_SIGNALED } else { 0 };
        // `*_above` is `u32::MAX` without direct calls, where the length
        // test then always takes the prebuilt request.
        let rc = match (remote, &self.write, &self.send) {
            (Some(r), Some(d), _) if WRITE && len > self.write_above => {
                // SAFETY: `d` was made for this queue's QP, which lives and
                // which `&mut self` keeps from any other post; the bytes
                // are in the registered slot, which the ledger now holds
                // lent until the completion (it is never freed before the
                // QP is destroyed, see the drop).
                unsafe { d.post(flags, wr_id, || (r.rkey, r.addr), || self.sge(slot, len)) }
            }
            (None, _, Some(d)) if !WRITE && len > self.send_above => {
                // SAFETY: as for the write.
                unsafe { d.post(flags, wr_id, || self.sge(slot, len)) }
            }
            _ => {
                let remote = remote.map(|r| (r.rkey, r.addr));
                self.post_prebuilt(remote, flags, at as u64, len, wr_id, slot, prev)
            }
        };
        self.posted(slot, prev, rc)
    }

    /// The end of every send's post: `rc` is the provider's answer, `slot`
    /// and `prev` what the ledger recorded (undone if the send was refused).
    #[inline(always)]
    fn posted(&mut self, slot: u32, prev: u64, rc: c_int) -> Result<()> {
        if rc != 0 {
            return self.post_refused(slot, prev, rc);
        }
        Ok(())
    }

    /// A send from `slot` that the provider refused with `rc`: the ledger
    /// as before it (the post's `prev`), and the error.
    #[cold]
    fn post_refused(&mut self, slot: u32, prev: u64, rc: c_int) -> Result<()> {
        self.ledger.unsend(slot, prev);
        check_errno_ret("ibv_post_send", || self.describe(slot), rc)
    }

    /// The send as the prebuilt request (the legacy path, and inline
    /// sends); an inline send's slot is free again when the call returns.
    #[allow(clippy::too_many_arguments)] // the request's fields, by register
    #[inline(always)]
    fn post_prebuilt(
        &mut self,
        remote: Option<(u32, u64)>,
        flags: u32,
        addr: u64,
        len: u32,
        wr_id: u64,
        slot: u32,
        prev: u64,
    ) -> c_int {
        let inline = len <= self.max_inline;
        let flags = if inline {
            flags | ffi::IBV_SEND_INLINE
        } else {
            flags
        };
        // SAFETY: this queue's live QP, which `&mut self` keeps from any
        // other post, over the slot the ledger holds lent (inline data is
        // copied during the call).
        let rc = unsafe { self.requests.send(remote, flags, addr, len, wr_id) };
        if rc == 0 && inline {
            self.ledger.copied(slot, prev);
        }
        rc
    }

    /// Posts a receive into `slot` (all of it).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a slot out of range or in use;
    /// `ibv_post_recv`'s error (the slot is then as before).
    #[inline(always)]
    pub fn post_recv(&mut self, slot: u32) -> Result<()> {
        let wr_id = self
            .ledger
            .recv(slot)
            .map_err(|r| refused("ibv_post_recv", slot, r))?;
        let at = self.at(slot) as u64;
        // SAFETY: the live QP, which `&mut self` keeps from any other post,
        // into the slot the ledger now holds lent to the device until its
        // completion.
        let rc = unsafe { self.requests.recv(at, wr_id) };
        if rc != 0 {
            self.ledger.unrecv(slot);
            return check_errno_ret("ibv_post_recv", || self.describe(slot), rc);
        }
        Ok(())
    }

    /// Polls one completion: the slot it gives back, or `None` when the CQ
    /// is empty. A completion that finishes nothing of this queue (one left
    /// from before a [`SlotQueue::reset`]) is skipped.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_poll_cq` (a CQ overrun).
    #[inline(always)]
    pub fn poll(&mut self) -> Result<Option<SlotCompletion>> {
        let mut wc = MaybeUninit::<ffi::ibv_wc>::uninit();
        let wc = match self.poll_one(&mut wc) {
            Ok(wc) => wc,
            Err(n) => return self.empty_or_failed(n),
        };
        match self.ledger.complete(wc.wr_id) {
            Some(f) => Ok(Some(SlotCompletion::new(f, wc))),
            // Out of line: a loop here would have the ledger's fields loaded
            // before every poll, whichever kind of completion comes.
            None => self.poll_past_stale(),
        }
    }

    /// [`SlotQueue::poll`] after a completion that finished nothing: polls
    /// on until one does or the CQ is empty.
    #[cold]
    #[inline(never)]
    fn poll_past_stale(&mut self) -> Result<Option<SlotCompletion>> {
        loop {
            let mut wc = MaybeUninit::<ffi::ibv_wc>::uninit();
            let wc = match self.poll_one(&mut wc) {
                Ok(wc) => wc,
                Err(n) => return self.empty_or_failed(n),
            };
            if let Some(f) = self.ledger.complete(wc.wr_id) {
                return Ok(Some(SlotCompletion::new(f, wc)));
            }
        }
    }

    /// The provider's `poll_cq` for one entry: the entry, or what the call
    /// returned when it gave none (0, or a negative error).
    #[inline(always)]
    fn poll_one<'w>(
        &self,
        wc: &'w mut MaybeUninit<ffi::ibv_wc>,
    ) -> std::result::Result<&'w ffi::ibv_wc, c_int> {
        // SAFETY: the queue's live CQ, room for one entry.
        let n = unsafe { (self.poll_cq)(self.cq_raw.as_ptr(), 1, wc.as_mut_ptr()) };
        if n <= 0 {
            return Err(n);
        }
        // SAFETY: the provider wrote the entry it counted.
        Ok(unsafe { wc.assume_init_ref() })
    }

    /// What a poll that gave no entry returns: `None` for an empty CQ, the
    /// error of a failed call.
    #[inline(always)]
    fn empty_or_failed(&self, n: c_int) -> Result<Option<SlotCompletion>> {
        if n == 0 {
            Ok(None)
        } else {
            Err(self.poll_failed(n))
        }
    }

    /// Moves the QP to RESET (`ibv_modify_qp(3)`): the device drops every
    /// request, so every slot is the caller's again; completions left in the
    /// CQ from before are skipped by later polls. The QP can then be brought
    /// up again (INIT, RTR, RTS).
    ///
    /// # Errors
    /// As [`QueuePair::reset`]; the slots stay lent then.
    pub fn reset(&mut self) -> Result<()> {
        // The general path's requests: none, the QP is posted to only here.
        let _ = self.qp().reset()?;
        self.ledger.reset();
        Ok(())
    }

    #[cold]
    fn poll_failed(&self, n: c_int) -> Error {
        Error::verb_errno(
            "ibv_poll_cq",
            format!(
                "the slot queue's CQ of QP {} (returned {n})",
                self.qp().qp_num()
            ),
            libc::EINVAL,
        )
    }

    #[cold]
    fn beyond_remote(&self, slot: u32, len: u32, remote: &RemoteMemory) -> Error {
        write_beyond_remote(self.qp().qp_num(), slot, len, remote)
    }

    #[cold]
    fn describe(&self, slot: u32) -> Cow<'static, str> {
        Cow::Owned(format!(
            "slot {slot} of the slot queue on QP {}",
            self.qp().qp_num()
        ))
    }
}

impl Drop for SlotQueue {
    fn drop(&mut self) {
        let Some(qp) = self.qp.take() else {
            return;
        };
        // Destroyed first: the device reaches no slot after it returns.
        if let Err((qp, e)) = qp.destroy() {
            crate::error::teardown_failed(format_args!(
                "{e}; leaking the slot queue's memory (the device may still reach it)"
            ));
            // Never deregistered, never freed.
            std::mem::forget(self.memory.take());
            drop(qp);
        }
    }
}

impl std::fmt::Debug for SlotQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotQueue")
            .field("qp", &self.qp)
            .field("slots", &self.ledger.len())
            .field("slot_len", &self.slot_len)
            .field("in_flight", &self.ledger.in_flight())
            .finish_non_exhaustive()
    }
}

#[cold]
fn refused(verb: &'static str, slot: u32, why: Refusal) -> Error {
    let reason = match why {
        Refusal::NoSlot => format!("slot {slot} is out of range"),
        Refusal::Receiving => format!("slot {slot} has a receive posted (the device may write it)"),
        Refusal::Sending => {
            format!("slot {slot} is read by a send whose completion has not been polled")
        }
        Refusal::TooManyUnseen => {
            "2^29 sends are posted and not seen complete (is the CQ polled elsewhere?)".into()
        }
    };
    Error::InvalidArgument { verb, reason }
}

/// Whether an RDMA WRITE of `len` bytes fits `remote` from its start.
#[inline(always)]
fn fits_remote(len: u32, remote: &RemoteMemory) -> bool {
    u64::from(len) <= remote.len
}

/// The refusal of an RDMA WRITE of `len` bytes from `slot` of the queue
/// on QP `qp_num` to `remote`, which holds fewer.
#[cold]
fn write_beyond_remote(qp_num: u32, slot: u32, len: u32, remote: &RemoteMemory) -> Error {
    Error::InvalidArgument {
        verb: "ibv_post_send",
        reason: format!(
            "an RDMA WRITE of {len} bytes from slot {slot} of the slot queue on QP {qp_num} \
             does not fit its target, the remote range of {} bytes at {:#x} (rkey {:#x}): \
             the peer would refuse it and the QP would go to the error state",
            remote.len, remote.addr, remote.rkey
        ),
    }
}

#[cold]
fn too_long(slot: u32, len: u32, slot_len: u32) -> Error {
    Error::InvalidArgument {
        verb: "ibv_post_send",
        reason: format!("{len} bytes from slot {slot}, whose slots are {slot_len} bytes"),
    }
}

#[cfg(test)]
mod tests;
