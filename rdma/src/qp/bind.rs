//! Binding memory windows: type 1 through `ibv_bind_mw(3)`, type 2 as a
//! send request through the QP's submit.

use std::sync::Arc;

use super::outgoing::{Op, Outgoing};
use super::QueuePair;
use crate::error::{check_errno_ret, Result};
use crate::mr::{AccessFlags, RemoteMemory};
use crate::track::Pending;
use crate::wr::{SendFlags, WrBuffers};
use crate::{ffi, MemoryRegion};

impl QueuePair {
    /// Binds `mw` to `offset..offset + len` of `mr` with `access`, and returns
    /// what a peer needs to use the window. Type 1 windows use
    /// `ibv_bind_mw(3)`; type 2 windows post an `IBV_WR_BIND_MW` request with
    /// the next rkey (`ibv_inc_rkey`). Either way a completion with `wr_id`
    /// follows (opcode `BindMw`); the window and the region's registration
    /// stay alive until then, and the registration for as long as the window
    /// is bound. The region the window was bound to before stays registered
    /// until this bind completes successfully (the device may reach it
    /// through the old binding until then), or for as long as the window
    /// lives when the bind's outcome is never seen (the QP reset or
    /// destroyed with it in flight).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when `mr` lacks `MW_BIND`, the range does not
    /// fit, or the PDs differ, or the window has binds in flight on another
    /// QP (a window's binds in flight are on one QP, which executes them in
    /// order); [`Error::Verb`](crate::Error::Verb) naming `ibv_bind_mw` or
    /// `ibv_post_send`.
    pub fn bind_mw(
        &mut self,
        wr_id: u64,
        mw: &mut crate::MemoryWindow,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
        access: AccessFlags,
    ) -> Result<RemoteMemory> {
        let type2 = mw.mw_type() == crate::MwType::Type2;
        let next_rkey = if type2 {
            // SAFETY: a pure function of its argument.
            unsafe { ffi::ibv_inc_rkey(mw.rkey()) }
        } else {
            0
        };
        let (info, _) = mw.bind_info(mr, offset, len, access, next_rkey)?;
        let verb = if type2 {
            "ibv_post_send"
        } else {
            "ibv_bind_mw"
        };
        let qp_key = Arc::as_ptr(&self.owned.tracker) as usize;
        if let Some(reason) = mw.refuses_bind_on(qp_key) {
            return Err(crate::Error::InvalidArgument { verb, reason });
        }
        // SAFETY: `&mut self`: the only poster to this QP's send queue, which
        // pushes at most the count given; the QP holds its CQs.
        let mut ring = unsafe { self.owned.tracker.producer(false, 1) };
        let rc = if type2 {
            let req = Outgoing {
                op: Op::BindMw {
                    mw: mw.as_raw(),
                    rkey: next_rkey,
                    info: &info,
                },
                flags: SendFlags::SIGNALED,
                ud: None,
                xrc_srqn: None,
                sges: &[],
                inline: false,
            };
            self.submit(std::slice::from_ref(&req), &ring).0
        } else {
            let mut bind = ffi::ibv_mw_bind {
                wr_id: ring.wr_id(0),
                send_flags: ffi::IBV_SEND_SIGNALED,
                bind_info: info,
            };
            // SAFETY: live QP, window and region; the bind request is copied.
            unsafe { ffi::ibv_bind_mw(self.as_raw(), mw.as_raw(), &mut bind) }
        };
        if rc == 0 {
            // The region the window was bound to stays held until this
            // bind finishes (`mw::Bindings`).
            ring.push(Pending {
                wr_id,
                buffers: WrBuffers::None,
                _ah: None,
                _bind: Some(mw.posted(qp_key, mr)),
            });
        }
        drop(ring);
        check_errno_ret(
            verb,
            || self.ctx_str(format_args!("bind {:?}", mw.mw_type())),
            rc,
        )?;
        let rkey = if type2 {
            // The provider names the window in the next bind by the rkey in
            // `struct ibv_mw` (rxe: `mw_rkey`, checked against the kernel's
            // current one), and only `ibv_bind_mw` (type 1) updates it: a
            // type 2 window bound a second time failed with MW_BIND_ERR.
            // SAFETY: a plain field of the live window; `&mut` makes this the
            // only writer, and no other post reads it concurrently.
            unsafe { (*mw.as_raw()).rkey = next_rkey };
            next_rkey
        } else {
            // SAFETY: ibv_bind_mw stored the new rkey in the window.
            unsafe { (*mw.as_raw()).rkey }
        };
        mw.set_rkey(rkey);
        Ok(RemoteMemory {
            addr: info.addr,
            len: info.length,
            rkey,
        })
    }
}
