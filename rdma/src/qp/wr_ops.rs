//! The extended send path's calls (`ibv_wr_*(3)`), made through the
//! function pointers the provider put in the QP's `struct ibv_qp_ex`.
//!
//! Each `ibv_wr_*` function of `verbs.h` is a `static inline` whose whole
//! body is one call through a member of `struct ibv_qp_ex`
//! (`qp->wr_start(qp)`, `qp->wr_rdma_write(qp, rkey, addr)`, ...): that
//! member is the provider's function, and the struct is part of
//! libibverbs' ABI. Through `rdma-sys`'s generated C wrappers every call
//! costs a call into the wrapper on top, five per request, which is most of
//! what the extended path saves in the provider (`ci/bench-instr`). So the
//! send path copies the members it calls when the QP is built, checked
//! non-null once, and calls them directly. This is the one place the crate
//! makes these calls; the rest of `ibv_qp_ex` stays behind the wrappers.

use std::ffi::c_int;
use std::ptr::NonNull;

use super::outgoing::{Op, Outgoing};
use crate::ffi;
use crate::wr::SendOp;

type Qpx = *mut ffi::ibv_qp_ex;

/// An extended QP and the provider's functions for it.
#[derive(Clone, Copy)]
pub(super) struct ExtendedQp {
    qp: NonNull<ffi::ibv_qp_ex>,
    start: unsafe extern "C" fn(Qpx),
    complete: unsafe extern "C" fn(Qpx) -> c_int,
    set_sge: unsafe extern "C" fn(Qpx, u32, u64, u32),
    set_sge_list: unsafe extern "C" fn(Qpx, usize, *const ffi::ibv_sge),
    set_inline_data: unsafe extern "C" fn(Qpx, *mut std::ffi::c_void, usize),
    abort: unsafe extern "C" fn(Qpx),
    /// The operations: a provider sets those the QP was created with
    /// (`send_ops_flags`); a missing one fails the post with `EOPNOTSUPP`.
    send: Option<unsafe extern "C" fn(Qpx)>,
    send_imm: Option<unsafe extern "C" fn(Qpx, u32)>,
    send_inv: Option<unsafe extern "C" fn(Qpx, u32)>,
    rdma_write: Option<unsafe extern "C" fn(Qpx, u32, u64)>,
    rdma_write_imm: Option<unsafe extern "C" fn(Qpx, u32, u64, u32)>,
    rdma_read: Option<unsafe extern "C" fn(Qpx, u32, u64)>,
    cmp_swp: Option<unsafe extern "C" fn(Qpx, u32, u64, u64, u64)>,
    fetch_add: Option<unsafe extern "C" fn(Qpx, u32, u64, u64)>,
    local_inv: Option<unsafe extern "C" fn(Qpx, u32)>,
    bind_mw: Option<unsafe extern "C" fn(Qpx, *mut ffi::ibv_mw, u32, *const ffi::ibv_mw_bind_info)>,
    set_ud_addr: Option<unsafe extern "C" fn(Qpx, *mut ffi::ibv_ah, u32, u32)>,
    set_xrc_srqn: Option<unsafe extern "C" fn(Qpx, u32)>,
}

// By hand: the QP is what identifies it; the provider's function addresses
// say nothing to a reader.
impl std::fmt::Debug for ExtendedQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ExtendedQp").field(&self.qp).finish()
    }
}

impl ExtendedQp {
    /// The functions of `qp`, or `None` when the provider left one of those
    /// every post needs unset (the QP then posts with `ibv_post_send`).
    ///
    /// # Safety
    /// `qp` is the extended view of a live QP (`ibv_qp_to_qp_ex`).
    pub(super) unsafe fn new(qp: NonNull<ffi::ibv_qp_ex>) -> Option<ExtendedQp> {
        // SAFETY: the caller's contract: a live `struct ibv_qp_ex`, whose
        // members the provider set when it created the QP.
        let q = unsafe { qp.as_ref() };
        Some(ExtendedQp {
            qp,
            start: q.wr_start?,
            complete: q.wr_complete?,
            set_sge: q.wr_set_sge?,
            set_sge_list: q.wr_set_sge_list?,
            set_inline_data: q.wr_set_inline_data?,
            abort: q.wr_abort?,
            send: q.wr_send,
            send_imm: q.wr_send_imm,
            send_inv: q.wr_send_inv,
            rdma_write: q.wr_rdma_write,
            rdma_write_imm: q.wr_rdma_write_imm,
            rdma_read: q.wr_rdma_read,
            cmp_swp: q.wr_atomic_cmp_swp,
            fetch_add: q.wr_atomic_fetch_add,
            local_inv: q.wr_local_inv,
            bind_mw: q.wr_bind_mw,
            set_ud_addr: q.wr_set_ud_addr,
            set_xrc_srqn: q.wr_set_xrc_srqn,
        })
    }

    #[cfg(test)]
    pub(super) fn as_ptr(&self) -> Qpx {
        self.qp.as_ptr()
    }

    /// Posts `reqs` as one batch (`ibv_wr_start`, each request,
    /// `ibv_wr_complete`), the `i`-th with `wr_id(i)`: all of them or none.
    /// Returns the errno (0 when posted).
    ///
    /// # Safety
    /// The caller posts to this QP alone (holds it mutably) and every SGE
    /// points into memory it holds until the completions (inline data is
    /// copied during the call); a window to bind is live.
    #[inline(always)]
    pub(super) unsafe fn post(&self, reqs: &[Outgoing<'_>], wr_id: impl Fn(usize) -> u64) -> c_int {
        let q = self.qp.as_ptr();
        // SAFETY: the caller's contract; each function is the provider's
        // for this QP, called between `start` and `complete` (or `abort`)
        // as `ibv_wr_start(3)` prescribes.
        unsafe {
            (self.start)(q);
            for (i, r) in reqs.iter().enumerate() {
                (*q).wr_id = wr_id(i);
                (*q).wr_flags = (r.flags - crate::wr::SendFlags::INLINE).bits();
                if !self.emit(q, r) {
                    return self.abort(q);
                }
                match (r.inline, r.sges) {
                    (true, [s]) => (self.set_inline_data)(q, s.addr as *mut _, s.length as usize),
                    (true, _) => (self.set_inline_data)(q, std::ptr::null_mut(), 0),
                    (false, []) => (self.set_sge_list)(q, 0, std::ptr::null()),
                    (false, [s]) => (self.set_sge)(q, s.lkey, s.addr, s.length),
                    (false, list) => (self.set_sge_list)(q, list.len(), list.as_ptr()),
                }
            }
            (self.complete)(q)
        }
    }

    /// Posts one request with one scatter entry (a prepared request's
    /// post): [`ExtendedQp::post`] without the loop and the inline cases.
    ///
    /// # Safety
    /// As for [`ExtendedQp::post`]; `r` is not inline.
    #[inline(always)]
    pub(super) unsafe fn post_one(
        &self,
        r: &Outgoing<'_>,
        sge: &ffi::ibv_sge,
        wr_id: u64,
    ) -> c_int {
        let q = self.qp.as_ptr();
        // SAFETY: as in `post`.
        unsafe {
            (self.start)(q);
            (*q).wr_id = wr_id;
            (*q).wr_flags = r.flags.bits();
            if !self.emit(q, r) {
                return self.abort(q);
            }
            (self.set_sge)(q, sge.lkey, sge.addr, sge.length);
            (self.complete)(q)
        }
    }

    /// Emits `r`'s operation (and its UD address or remote XRC SRQ) into the
    /// open batch; `false` when the provider has no function for it.
    ///
    /// # Safety
    /// `q` is this QP, between `start` and `complete`, with `wr_id` and
    /// `wr_flags` set; a window to bind is live.
    #[inline(always)]
    unsafe fn emit(&self, q: Qpx, r: &Outgoing<'_>) -> bool {
        // SAFETY: guaranteed by the caller.
        unsafe {
            let done = match r.op {
                Op::Send(op) => match *op {
                    SendOp::Send => self.send.map(|f| f(q)),
                    SendOp::SendWithImm(imm) => self.send_imm.map(|f| f(q, imm.to_be())),
                    SendOp::Write(m) => self.rdma_write.map(|f| f(q, m.rkey, m.addr)),
                    SendOp::WriteWithImm(m, imm) => self
                        .rdma_write_imm
                        .map(|f| f(q, m.rkey, m.addr, imm.to_be())),
                    SendOp::Read(m) => self.rdma_read.map(|f| f(q, m.rkey, m.addr)),
                    SendOp::CompareSwap {
                        remote,
                        compare,
                        swap,
                    } => self
                        .cmp_swp
                        .map(|f| f(q, remote.rkey, remote.addr, compare, swap)),
                    SendOp::FetchAdd { remote, add } => {
                        self.fetch_add.map(|f| f(q, remote.rkey, remote.addr, add))
                    }
                    SendOp::SendWithInvalidate(rkey) => self.send_inv.map(|f| f(q, rkey)),
                    SendOp::LocalInvalidate(rkey) => self.local_inv.map(|f| f(q, rkey)),
                },
                Op::BindMw { mw, rkey, info } => self.bind_mw.map(|f| f(q, mw, rkey, info)),
            };
            if done.is_none() {
                return false;
            }
            if let Some(d) = r.ud {
                let Some(f) = self.set_ud_addr else {
                    return false;
                };
                f(q, d.ah.as_raw(), d.remote_qpn, d.remote_qkey);
            }
            if let Some(remote_srqn) = r.xrc_srqn {
                let Some(f) = self.set_xrc_srqn else {
                    return false;
                };
                f(q, remote_srqn);
            }
            true
        }
    }

    /// Drops the open batch (`ibv_wr_abort`) of a request the provider has
    /// no function for: out of line, as no provider that sets the
    /// operations a QP was created with gets here.
    ///
    /// # Safety
    /// `q` is this QP, with a batch open.
    #[cold]
    #[inline(never)]
    unsafe fn abort(&self, q: Qpx) -> c_int {
        // SAFETY: the caller's contract.
        unsafe { (self.abort)(q) };
        libc::EOPNOTSUPP
    }
}

/// A prepared request's calls, chosen once when it is prepared: the
/// provider's function for its operation with the remote key and address
/// bound, so a post makes the calls of [`ExtendedQp::post_one`] with no
/// dispatch on the operation, no test of a missing function and no UD or
/// XRC step: the per-post work a prepared request exists to save.
///
/// Valid while its QP is: a post checks that the request was prepared by
/// the QP it is posted to, which is then live (held by the poster).
#[derive(Clone, Copy)]
pub(crate) struct Direct {
    qp: NonNull<ffi::ibv_qp_ex>,
    start: unsafe extern "C" fn(Qpx),
    complete: unsafe extern "C" fn(Qpx) -> c_int,
    set_sge: unsafe extern "C" fn(Qpx, u32, u64, u32),
    op: DirectOp,
}

/// The operation of a [`Direct`] request.
#[derive(Clone, Copy)]
enum DirectOp {
    /// `wr_send`.
    Send(unsafe extern "C" fn(Qpx)),
    /// `wr_rdma_write` or `wr_rdma_read`, with the remote key and address.
    Remote(unsafe extern "C" fn(Qpx, u32, u64), u32, u64),
}

impl ExtendedQp {
    /// The direct calls of a prepared `op` sent without a UD destination
    /// or XRC SRQ: a SEND, RDMA WRITE or RDMA READ whose function the
    /// provider has. `None` for anything else, which posts through
    /// [`ExtendedQp::post_one`].
    pub(super) fn direct(&self, op: &SendOp) -> Option<Direct> {
        let op = match *op {
            SendOp::Send => DirectOp::Send(self.send?),
            SendOp::Write(m) => DirectOp::Remote(self.rdma_write?, m.rkey, m.addr),
            SendOp::Read(m) => DirectOp::Remote(self.rdma_read?, m.rkey, m.addr),
            _ => return None,
        };
        Some(Direct {
            qp: self.qp,
            start: self.start,
            complete: self.complete,
            set_sge: self.set_sge,
            op,
        })
    }
}

impl Direct {
    /// Posts the request with `flags` (`enum ibv_send_flags`, not
    /// `INLINE`), the one scatter entry `sge` and `wr_id`, as
    /// [`ExtendedQp::post_one`] does. Returns the errno (0 when posted).
    ///
    /// # Safety
    /// As for [`ExtendedQp::post`]: the caller posts to this QP alone (holds
    /// it mutably), and the QP is the live one this was made for.
    #[inline(always)]
    pub(crate) unsafe fn post(&self, flags: u32, sge: &ffi::ibv_sge, wr_id: u64) -> c_int {
        let q = self.qp.as_ptr();
        // SAFETY: the caller's contract; the functions are the provider's
        // for this QP, called between `start` and `complete` as
        // `ibv_wr_start(3)` prescribes.
        unsafe {
            (self.start)(q);
            (*q).wr_id = wr_id;
            (*q).wr_flags = flags;
            match self.op {
                DirectOp::Send(f) => f(q),
                DirectOp::Remote(f, rkey, addr) => f(q, rkey, addr),
            }
            (self.set_sge)(q, sge.lkey, sge.addr, sge.length);
            (self.complete)(q)
        }
    }
}

/// The direct calls of one operation, fixed by the type: what the slot
/// queue posts (a SEND, an RDMA WRITE), each post with its scatter entry
/// and, for a write, its remote given as values. Against [`Direct`] a post
/// has no dispatch on the operation, and nothing is built in memory for
/// the calls (no `ibv_sge` or remote to load back): the arguments go from
/// the caller's registers to the provider's.
///
/// Valid while its QP is, as [`Direct`].
#[derive(Clone, Copy)]
pub(crate) struct DirectOne<F> {
    qp: NonNull<ffi::ibv_qp_ex>,
    start: unsafe extern "C" fn(Qpx),
    complete: unsafe extern "C" fn(Qpx) -> c_int,
    set_sge: unsafe extern "C" fn(Qpx, u32, u64, u32),
    op: F,
}

/// `wr_send`'s function.
pub(crate) type SendFn = unsafe extern "C" fn(Qpx);
/// `wr_rdma_write`'s function.
pub(crate) type WriteFn = unsafe extern "C" fn(Qpx, u32, u64);

impl ExtendedQp {
    /// The direct calls of a SEND, when the provider has `wr_send`.
    pub(super) fn direct_send(&self) -> Option<DirectOne<SendFn>> {
        Some(self.one(self.send?))
    }

    /// The direct calls of an RDMA WRITE, when the provider has
    /// `wr_rdma_write`.
    pub(super) fn direct_write(&self) -> Option<DirectOne<WriteFn>> {
        Some(self.one(self.rdma_write?))
    }

    fn one<F>(&self, op: F) -> DirectOne<F> {
        DirectOne {
            qp: self.qp,
            start: self.start,
            complete: self.complete,
            set_sge: self.set_sge,
            op,
        }
    }
}

impl<F: Copy> DirectOne<F> {
    /// The calls around the operation's: `wr_start`, `wr_id` and the
    /// `flags` (`enum ibv_send_flags`, not `INLINE`), `op` with the
    /// operation's function, then the one scatter entry that `sge` gives
    /// (lkey, address, length) and `wr_complete`. Returns the errno (0
    /// when posted).
    ///
    /// `op` and `sge` run after `wr_start` returns: what they read (a
    /// remote, the slot's address) is loaded where it is used, rather than
    /// before the first call and kept across it, which costs a store and a
    /// load more per value when the caller's loop has no register left.
    ///
    /// # Safety
    /// As for [`Direct::post`]; `op` makes the operation's call on its QP
    /// argument, and `sge` is memory registered with its lkey that stays
    /// valid until the request's completion.
    #[inline(always)]
    unsafe fn post_with(
        &self,
        flags: u32,
        wr_id: u64,
        op: impl FnOnce(F, Qpx),
        sge: impl FnOnce() -> (u32, u64, u32),
    ) -> c_int {
        let q = self.qp.as_ptr();
        // SAFETY: the caller's contract; the functions are the provider's
        // for this QP, called between `start` and `complete` as
        // `ibv_wr_start(3)` prescribes.
        unsafe {
            (self.start)(q);
            (*q).wr_id = wr_id;
            (*q).wr_flags = flags;
            op(self.op, q);
            let (lkey, addr, len) = sge();
            (self.set_sge)(q, lkey, addr, len);
            (self.complete)(q)
        }
    }
}

impl DirectOne<SendFn> {
    /// Posts a SEND with `flags` and `wr_id` of the bytes `sge` gives
    /// (lkey, address, length; called after the first provider call).
    /// Returns the errno (0 when posted).
    ///
    /// # Safety
    /// As for [`Direct::post`]: the caller posts to this QP alone (holds
    /// it mutably), the QP is the live one this was made for, and the
    /// bytes are registered with the lkey and stay valid until the
    /// request's completion.
    #[inline(always)]
    pub(crate) unsafe fn post(
        &self,
        flags: u32,
        wr_id: u64,
        sge: impl FnOnce() -> (u32, u64, u32),
    ) -> c_int {
        // SAFETY: the caller's contract; `send` is the QP's `wr_send`.
        unsafe { self.post_with(flags, wr_id, |send, q| send(q), sge) }
    }
}

impl DirectOne<WriteFn> {
    /// Posts an RDMA WRITE with `flags` and `wr_id` of the bytes `sge`
    /// gives to the remote `remote` gives (rkey, address); both are called
    /// after the first provider call. Returns the errno (0 when posted).
    ///
    /// # Safety
    /// As for [`DirectOne::<SendFn>::post`].
    #[inline(always)]
    pub(crate) unsafe fn post(
        &self,
        flags: u32,
        wr_id: u64,
        remote: impl FnOnce() -> (u32, u64),
        sge: impl FnOnce() -> (u32, u64, u32),
    ) -> c_int {
        let op = |write: WriteFn, q| {
            let (rkey, raddr) = remote();
            // SAFETY: the caller's contract; `write` is the QP's
            // `wr_rdma_write`, called after `wr_start`.
            unsafe { write(q, rkey, raddr) }
        };
        // SAFETY: the caller's contract.
        unsafe { self.post_with(flags, wr_id, op, sge) }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::mr::RemoteMemory;
    use crate::wr::SendFlags;

    thread_local! {
        /// What the fake provider's functions were called with, in order.
        static CALLS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    }

    fn log(call: String) {
        CALLS.with(|c| c.borrow_mut().push(call));
    }

    fn calls() -> Vec<String> {
        CALLS.with(|c| std::mem::take(&mut *c.borrow_mut()))
    }

    unsafe extern "C" fn start(q: Qpx) {
        // SAFETY: the test's live fake QP.
        let _ = unsafe { (*q).wr_id };
        log("start".into());
    }
    unsafe extern "C" fn complete(q: Qpx) -> c_int {
        // SAFETY: the test's live fake QP.
        let (id, flags) = unsafe { ((*q).wr_id, (*q).wr_flags) };
        log(format!("complete {id} {flags:#x}"));
        0
    }
    unsafe extern "C" fn abort(_: Qpx) {
        log("abort".into());
    }
    unsafe extern "C" fn set_sge(_: Qpx, lkey: u32, addr: u64, len: u32) {
        log(format!("sge {lkey} {addr:#x} {len}"));
    }
    unsafe extern "C" fn set_sge_list(_: Qpx, n: usize, _: *const ffi::ibv_sge) {
        log(format!("sge list {n}"));
    }
    unsafe extern "C" fn set_inline_data(_: Qpx, _: *mut std::ffi::c_void, len: usize) {
        log(format!("inline {len}"));
    }
    unsafe extern "C" fn send(q: Qpx) {
        // SAFETY: the test's live fake QP.
        let id = unsafe { (*q).wr_id };
        log(format!("send {id}"));
    }
    unsafe extern "C" fn rdma_write(q: Qpx, rkey: u32, addr: u64) {
        // SAFETY: the test's live fake QP.
        let id = unsafe { (*q).wr_id };
        log(format!("write {id} {rkey} {addr:#x}"));
    }

    /// A `struct ibv_qp_ex` whose provider has RDMA WRITE only. Held
    /// through a raw pointer: the calls write `wr_id` and `wr_flags`
    /// through the pointer `ExtendedQp` keeps, as a provider's QP is.
    pub struct FakeProvider(NonNull<ffi::ibv_qp_ex>);

    impl FakeProvider {
        pub fn new() -> Self {
            // SAFETY: a C struct of integers, pointers and nullable
            // function pointers: all zeros is a valid value.
            let mut q: Box<ffi::ibv_qp_ex> = Box::new(unsafe { std::mem::zeroed() });
            q.wr_start = Some(start);
            q.wr_complete = Some(complete);
            q.wr_abort = Some(abort);
            q.wr_set_sge = Some(set_sge);
            q.wr_set_sge_list = Some(set_sge_list);
            q.wr_set_inline_data = Some(set_inline_data);
            q.wr_rdma_write = Some(rdma_write);
            FakeProvider(NonNull::from(Box::leak(q)))
        }

        pub fn extended(&self) -> ExtendedQp {
            // SAFETY: a live struct with the calls every post needs set.
            unsafe { ExtendedQp::new(self.0) }.expect("every call set")
        }
    }

    impl Drop for FakeProvider {
        fn drop(&mut self) {
            // SAFETY: leaked from a `Box` in `new`, freed once here.
            drop(unsafe { Box::from_raw(self.0.as_ptr()) });
        }
    }

    const REMOTE: RemoteMemory = RemoteMemory {
        addr: 0x1000,
        len: 64,
        rkey: 7,
    };

    #[test]
    fn a_post_makes_the_calls_of_ibv_wr_star_in_their_order() {
        let provider = FakeProvider::new();
        let x = provider.extended();
        let write = SendOp::Write(REMOTE);
        let sge = ffi::ibv_sge {
            addr: 0x2000,
            length: 16,
            lkey: 5,
        };
        let reqs = [
            Outgoing {
                sges: std::slice::from_ref(&sge),
                ..Outgoing::prepared(&write, SendFlags::SIGNALED, None)
            },
            Outgoing {
                sges: std::slice::from_ref(&sge),
                inline: true,
                ..Outgoing::prepared(&write, SendFlags::INLINE, None)
            },
        ];
        // SAFETY: the fake provider reads nothing the SGEs point at.
        let rc = unsafe { x.post(&reqs, |i| 40 + i as u64) };
        assert_eq!(rc, 0);
        assert_eq!(
            calls(),
            [
                "start",
                "write 40 7 0x1000",
                "sge 5 0x2000 16",
                // INLINE is the call, not a flag.
                "write 41 7 0x1000",
                "inline 16",
                "complete 41 0x0",
            ]
        );
    }

    #[test]
    fn a_direct_post_makes_the_calls_of_post_one() {
        let provider = FakeProvider::new();
        let x = provider.extended();
        let write = SendOp::Write(REMOTE);
        let sge = ffi::ibv_sge {
            addr: 0x2000,
            length: 16,
            lkey: 5,
        };
        let flags = SendFlags::SIGNALED;
        // SAFETY: the fake provider reads nothing the SGE points at.
        let rc = unsafe { x.post_one(&Outgoing::prepared(&write, flags, None), &sge, 9) };
        assert_eq!(rc, 0);
        let general = calls();
        let direct = x.direct(&write).expect("the fake has RDMA WRITE");
        // SAFETY: as above.
        let rc = unsafe { direct.post(flags.bits(), &sge, 9) };
        assert_eq!(rc, 0);
        assert_eq!(calls(), general);
        assert_eq!(general.len(), 4, "{general:?}");
        // Operations the fake lacks, or that are not direct, are not.
        assert!(x.direct(&SendOp::Read(REMOTE)).is_none());
        assert!(x.direct(&SendOp::Send).is_none());
        assert!(x.direct(&SendOp::SendWithImm(1)).is_none());
    }

    #[test]
    fn a_one_operation_post_makes_the_calls_of_post_one_with_its_remote() {
        let provider = FakeProvider::new();
        let x = provider.extended();
        let write = SendOp::Write(REMOTE);
        let sge = ffi::ibv_sge {
            addr: 0x2000,
            length: 16,
            lkey: 5,
        };
        let flags = SendFlags::SIGNALED;
        // SAFETY: the fake provider reads nothing the SGE points at.
        let rc = unsafe { x.post_one(&Outgoing::prepared(&write, flags, None), &sge, 9) };
        assert_eq!(rc, 0);
        let general = calls();
        let one = x.direct_write().expect("the fake has RDMA WRITE");
        // SAFETY: as above.
        let rc = unsafe {
            one.post(
                flags.bits(),
                9,
                || (REMOTE.rkey, REMOTE.addr),
                || (5, 0x2000, 16),
            )
        };
        assert_eq!(rc, 0);
        assert_eq!(calls(), general);
        // Another remote and length, the same calls.
        // SAFETY: as above.
        let rc = unsafe { one.post(0, 10, || (8, 0x3000), || (5, 0x2000, 1)) };
        assert_eq!(rc, 0);
        assert_eq!(
            calls(),
            [
                "start",
                "write 10 8 0x3000",
                "sge 5 0x2000 1",
                "complete 10 0x0"
            ]
        );
        // The fake has no `wr_send`.
        assert!(x.direct_send().is_none());
    }

    #[test]
    fn a_one_operation_send_makes_the_send_call() {
        let provider = FakeProvider::new();
        // SAFETY: the fake's struct, which nothing else uses meanwhile.
        unsafe { (*provider.0.as_ptr()).wr_send = Some(send) };
        let x = provider.extended();
        let one = x.direct_send().expect("the fake has SEND now");
        // SAFETY: the fake provider reads nothing the SGE points at.
        assert_eq!(unsafe { one.post(2, 11, || (6, 0x4000, 3)) }, 0);
        assert_eq!(
            calls(),
            ["start", "send 11", "sge 6 0x4000 3", "complete 11 0x2"]
        );
    }

    #[test]
    fn an_operation_the_provider_lacks_aborts_the_batch() {
        let provider = FakeProvider::new();
        let x = provider.extended();
        let (write, read) = (SendOp::Write(REMOTE), SendOp::Read(REMOTE));
        let reqs = [
            Outgoing::prepared(&write, SendFlags::SIGNALED, None),
            Outgoing::prepared(&read, SendFlags::SIGNALED, None),
        ];
        // SAFETY: no memory is referenced.
        let rc = unsafe { x.post(&reqs, |i| i as u64) };
        assert_eq!(rc, libc::EOPNOTSUPP);
        assert_eq!(
            calls(),
            ["start", "write 0 7 0x1000", "sge list 0", "abort"]
        );
    }

    #[test]
    fn a_provider_without_a_call_every_post_needs_gets_the_legacy_path() {
        let provider = FakeProvider::new();
        // SAFETY: the fake's struct, which nothing else uses meanwhile.
        unsafe { (*provider.0.as_ptr()).wr_set_sge = None };
        // SAFETY: a live struct.
        assert!(unsafe { ExtendedQp::new(provider.0) }.is_none());
    }
}
