//! The slot queue's requests, built once: one `ibv_send_wr` and one
//! `ibv_recv_wr`, each with its scatter entry, in a block of their own, so
//! that a post writes only what changes per request (the slot's address and
//! length, `wr_id`, the flags, a write's remote) and makes one call, the
//! provider's `post_send` or `post_recv` read from the context once, as
//! perftest posts its prebuilt requests. A request is read by the provider
//! only during the call (it copies it into its queue), so the block is the
//! queue's alone between posts.

use std::ffi::c_int;
use std::ptr::NonNull;

use crate::ffi;

/// The provider's `post_send` (`ibv_post_send(3)` is a `static inline` that
/// calls it through the context's ops).
pub(super) type PostSendFn = unsafe extern "C" fn(
    *mut ffi::ibv_qp,
    *mut ffi::ibv_send_wr,
    *mut *mut ffi::ibv_send_wr,
) -> c_int;

/// The provider's `post_recv` (`ibv_post_recv(3)`, likewise).
pub(super) type PostRecvFn = unsafe extern "C" fn(
    *mut ffi::ibv_qp,
    *mut ffi::ibv_recv_wr,
    *mut *mut ffi::ibv_recv_wr,
) -> c_int;

/// The requests and where the provider reports a refused one.
struct Block {
    send: ffi::ibv_send_wr,
    send_sge: ffi::ibv_sge,
    bad_send: *mut ffi::ibv_send_wr,
    recv: ffi::ibv_recv_wr,
    recv_sge: ffi::ibv_sge,
    bad_recv: *mut ffi::ibv_recv_wr,
}

/// A [`Block`] on the heap, reached only through its raw pointer (the
/// requests point at their own scatter entries, so no reference to the
/// block is ever made after it is built).
pub(super) struct Requests {
    block: NonNull<Block>,
    qp: NonNull<ffi::ibv_qp>,
    post_send: PostSendFn,
    post_recv: PostRecvFn,
}

// SAFETY: the block is owned (freed once, in the drop); the QP pointer is
// the slot queue's own QP, posted to only through `&mut` of the queue.
unsafe impl Send for Requests {}
// SAFETY: `&self` gives no access to the block or the QP.
unsafe impl Sync for Requests {}

impl Requests {
    /// The requests of `qp`'s slots: receives of `slot_len` bytes, both
    /// kinds with `lkey`.
    ///
    /// # Safety
    /// `qp` is a live QP; the requests are posted only while it lives.
    pub(super) unsafe fn new(qp: NonNull<ffi::ibv_qp>, lkey: u32, slot_len: u32) -> Requests {
        // SAFETY: the caller's contract: a live QP whose context is live;
        // `ops` is libibverbs' ABI.
        let ops = unsafe { &(*(*qp.as_ptr()).context).ops };
        let post_send = ops.post_send.unwrap_or(ffi::ibv_post_send);
        let post_recv = ops.post_recv.unwrap_or(ffi::ibv_post_recv);
        let sge = ffi::ibv_sge {
            addr: 0,
            length: 0,
            lkey,
        };
        let block = Box::new(Block {
            send: ffi::ibv_send_wr {
                num_sge: 1,
                ..Default::default()
            },
            send_sge: sge,
            bad_send: std::ptr::null_mut(),
            recv: ffi::ibv_recv_wr {
                wr_id: 0,
                next: std::ptr::null_mut(),
                sg_list: std::ptr::null_mut(),
                num_sge: 1,
            },
            recv_sge: ffi::ibv_sge {
                length: slot_len,
                ..sge
            },
            bad_recv: std::ptr::null_mut(),
        });
        let block = NonNull::from(Box::leak(block));
        let b = block.as_ptr();
        // SAFETY: the block just leaked, reached through its pointer alone
        // from here on.
        unsafe {
            (*b).send.sg_list = &raw mut (*b).send_sge;
            (*b).recv.sg_list = &raw mut (*b).recv_sge;
        }
        Requests {
            block,
            qp,
            post_send,
            post_recv,
        }
    }

    /// Posts the send request with these fields (`ibv_post_send`): a SEND
    /// (`remote` `None`) or an RDMA WRITE. Returns the errno (0 when posted).
    ///
    /// # Safety
    /// The QP lives and the caller posts to it alone (holds the queue
    /// mutably); `addr..addr + len` is registered with the block's `lkey`
    /// and stays valid until the request's completion (inline data is
    /// copied during the call).
    #[inline(always)]
    pub(super) unsafe fn send(
        &mut self,
        remote: Option<(u32, u64)>,
        flags: u32,
        addr: u64,
        len: u32,
        wr_id: u64,
    ) -> c_int {
        let b = self.block.as_ptr();
        // SAFETY: the block is this value's (see `new`); the caller's
        // contract for the request; the provider reads the request only
        // during the call.
        unsafe {
            (*b).send_sge.addr = addr;
            (*b).send_sge.length = len;
            (*b).send.wr_id = wr_id;
            (*b).send.send_flags = flags;
            match remote {
                None => (*b).send.opcode = ffi::IBV_WR_SEND,
                Some((rkey, raddr)) => {
                    (*b).send.opcode = ffi::IBV_WR_RDMA_WRITE;
                    (*b).send.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                        remote_addr: raddr,
                        rkey,
                    };
                }
            }
            (self.post_send)(self.qp.as_ptr(), &raw mut (*b).send, &raw mut (*b).bad_send)
        }
    }

    /// Posts the receive request into `addr` (a slot of the length given to
    /// [`Requests::new`]) with `wr_id` (`ibv_post_recv`). Returns the errno.
    ///
    /// # Safety
    /// As for [`Requests::send`]; the slot is the device's to write until
    /// the receive's completion.
    #[inline(always)]
    pub(super) unsafe fn recv(&mut self, addr: u64, wr_id: u64) -> c_int {
        let b = self.block.as_ptr();
        // SAFETY: as in `send`.
        unsafe {
            (*b).recv_sge.addr = addr;
            (*b).recv.wr_id = wr_id;
            (self.post_recv)(self.qp.as_ptr(), &raw mut (*b).recv, &raw mut (*b).bad_recv)
        }
    }
}

impl Drop for Requests {
    fn drop(&mut self) {
        // SAFETY: leaked from a `Box` in `new`, freed once here; the
        // provider holds no pointer into it after a post returns.
        drop(unsafe { Box::from_raw(self.block.as_ptr()) });
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    thread_local! {
        /// What the fake provider's posts were handed, in order.
        static POSTED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    }

    fn posted() -> Vec<String> {
        POSTED.with(|p| std::mem::take(&mut *p.borrow_mut()))
    }

    unsafe extern "C" fn post_send(
        _: *mut ffi::ibv_qp,
        wr: *mut ffi::ibv_send_wr,
        bad: *mut *mut ffi::ibv_send_wr,
    ) -> c_int {
        // SAFETY: the request and its one scatter entry, live during the
        // call, as a provider reads them.
        let (w, s) = unsafe { (&*wr, &*(*wr).sg_list) };
        assert!(w.next.is_null() && w.num_sge == 1);
        // SAFETY: the union's member for an RDMA WRITE; read for a SEND
        // too, where it holds the last write's (or zeros).
        let r = unsafe { w.wr.rdma };
        POSTED.with(|p| {
            p.borrow_mut().push(format!(
                "send {} op {} flags {:#x} sge {:#x} {} {} remote {:#x} {}",
                w.wr_id, w.opcode, w.send_flags, s.addr, s.length, s.lkey, r.remote_addr, r.rkey
            ))
        });
        // SAFETY: the caller's slot for the refused request.
        unsafe { *bad = std::ptr::null_mut() };
        0
    }

    unsafe extern "C" fn post_recv(
        _: *mut ffi::ibv_qp,
        wr: *mut ffi::ibv_recv_wr,
        _: *mut *mut ffi::ibv_recv_wr,
    ) -> c_int {
        // SAFETY: as in `post_send`.
        let (w, s) = unsafe { (&*wr, &*(*wr).sg_list) };
        assert!(w.next.is_null() && w.num_sge == 1);
        POSTED.with(|p| {
            p.borrow_mut().push(format!(
                "recv {} sge {:#x} {} {}",
                w.wr_id, s.addr, s.length, s.lkey
            ))
        });
        1
    }

    #[test]
    fn each_post_rewrites_only_its_own_fields_of_the_prebuilt_requests() {
        // SAFETY: C structs of integers, pointers and nullable function
        // pointers: all zeros is a valid value.
        let mut ctx: Box<ffi::ibv_context> = Box::new(unsafe { std::mem::zeroed() });
        ctx.ops.post_send = Some(post_send);
        ctx.ops.post_recv = Some(post_recv);
        // SAFETY: as above.
        let mut qp: Box<ffi::ibv_qp> = Box::new(unsafe { std::mem::zeroed() });
        qp.context = &mut *ctx;
        // SAFETY: the fake QP and context outlive `r`.
        let mut r = unsafe { Requests::new(NonNull::from(&mut *qp), 7, 64) };
        // SAFETY: the fake provider reads the requests only.
        let rcs = unsafe {
            [
                r.send(Some((9, 0x5000)), 2, 0x1000, 3, 41),
                r.send(None, 0, 0x1040, 1, 42),
                r.recv(0x1080, 43),
                r.send(Some((8, 0x6000)), 8, 0x1000, 64, 44),
            ]
        };
        assert_eq!(rcs, [0, 0, 1, 0]);
        let (write, send) = (ffi::IBV_WR_RDMA_WRITE, ffi::IBV_WR_SEND);
        assert_eq!(
            posted(),
            [
                format!("send 41 op {write} flags 0x2 sge 0x1000 3 7 remote 0x5000 9"),
                // A SEND's opcode; the remote left is not read by a SEND.
                format!("send 42 op {send} flags 0x0 sge 0x1040 1 7 remote 0x5000 9"),
                "recv 43 sge 0x1080 64 7".to_string(),
                format!("send 44 op {write} flags 0x8 sge 0x1000 64 7 remote 0x6000 8"),
            ]
        );
        // Moved, the requests still point at their own scatter entries.
        let mut moved = r;
        // SAFETY: as above.
        assert_eq!(unsafe { moved.recv(0x10c0, 45) }, 1);
        assert_eq!(posted(), ["recv 45 sge 0x10c0 64 7"]);
        drop(moved);
        drop(qp);
        drop(ctx);
    }
}
