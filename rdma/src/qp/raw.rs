//! The untracked post paths for experts (`unsafe`): raw chains, a written
//! contract instead of the tracker.

use super::QueuePair;
use crate::error::{check_errno_ret, Error, Result};
use crate::{ffi, track};

impl QueuePair {
    /// Posts a raw chain of send requests (`ibv_post_send(3)`), untracked.
    ///
    /// # Safety
    /// - `wr` is a valid, NULL-terminated chain of `ibv_send_wr`.
    /// - Every byte that a request's SGEs, inline data or atomic result refers
    ///   to stays valid (and, for memory the device writes, unaliased by any
    ///   Rust reference) until the request's completion is polled, or until
    ///   the QP is dropped; the MRs and AHs it names stay alive as long.
    /// - No `wr_id` in the chain has bit 63 set (that bit marks the safe
    ///   path's own ids; this is checked and rejected).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `wr_id` with bit 63 set;
    /// [`Error::Verb`] naming `ibv_post_send`, with the index of the first
    /// request that was not posted in the context.
    pub unsafe fn post_send_raw(&mut self, wr: *mut ffi::ibv_send_wr) -> Result<()> {
        let mut p = wr;
        while !p.is_null() {
            // SAFETY: the caller guarantees a valid chain.
            let w = unsafe { &*p };
            if w.wr_id & track::TAG != 0 {
                return Err(self.invalid(format!("raw wr_id {:#x} has bit 63 set", w.wr_id)));
            }
            p = w.next;
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: the caller upholds the chain and memory contract.
        let rc = unsafe { ffi::ibv_post_send(self.as_raw(), wr, &mut bad) };
        check_errno_ret("ibv_post_send", || self.ctx_str("raw post"), rc)
    }

    /// Posts a raw chain of receive requests (`ibv_post_recv(3)`), untracked.
    ///
    /// # Safety
    /// As [`QueuePair::post_send_raw`], for receive requests: the memory stays
    /// valid and unaliased until the receive completion is polled or the QP
    /// is dropped.
    ///
    /// # Errors
    /// As [`QueuePair::post_send_raw`].
    pub unsafe fn post_recv_raw(&mut self, wr: *mut ffi::ibv_recv_wr) -> Result<()> {
        let mut p = wr;
        while !p.is_null() {
            // SAFETY: the caller guarantees a valid chain.
            let w = unsafe { &*p };
            if w.wr_id & track::TAG != 0 {
                return Err(Error::InvalidArgument {
                    verb: "ibv_post_recv",
                    reason: format!("raw wr_id {:#x} has bit 63 set", w.wr_id),
                });
            }
            p = w.next;
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: the caller upholds the chain and memory contract.
        let rc = unsafe { ffi::ibv_post_recv(self.as_raw(), wr, &mut bad) };
        check_errno_ret("ibv_post_recv", || self.ctx_str("raw post"), rc)
    }
}
