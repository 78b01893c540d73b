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
