//! eXtended Reliable Connection: XRC domains (`ibv_open_xrcd(3)`), XRC
//! target queue pairs (`ibv_create_qp_ex(3)` with `IBV_QPT_XRC_RECV`,
//! `ibv_open_qp(3)`), and, elsewhere, XRC shared receive queues
//! ([`crate::ProtectionDomain::create_srq_ex`] with [`crate::SrqType::Xrc`],
//! [`crate::SharedReceiveQueue::get_srq_num`]) and XRC initiator QPs
//! ([`crate::ProtectionDomain::qp_builder`] with [`crate::QpType::XrcSend`]).
//!
//! An XRC initiator sends to a remote XRC target QP and names, in each send,
//! the remote XRC SRQ that receives it: [`crate::SendWr::xrc_remote_srqn`]
//! (`qp_type.xrc.remote_srqn` of `struct ibv_send_wr`, or
//! `ibv_wr_set_xrc_srqn` on the extended path). The safe post refuses a
//! request without it on an XRC initiator, and one with it on any other QP,
//! with [`Error::InvalidArgument`].
//!
//! Neither soft-RoCE nor soft-iWARP implements XRC: [`Context::open_xrcd`]
//! fails there with [`Error::Unsupported`] (`EOPNOTSUPP`), and so does
//! creating an XRC initiator QP. Posting on an XRC initiator is therefore
//! untested here beyond the host-side checks.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

#[cfg(doc)]
use crate::error::Error;
use crate::error::{call_ptr, check_errno_ret, Result};
pub use crate::xrcd::XrcDomain;
use crate::xrcd::{unsupported, XrcdInner};
use crate::{ffi, QpAttr, QpState, QpType};

impl XrcDomain {
    /// Creates an XRC target QP in this domain (`ibv_create_qp_ex(3)` with
    /// `IBV_QPT_XRC_RECV` and `IBV_QP_INIT_ATTR_XRCD`), in the RESET state.
    /// It has no queues of its own: what it receives goes to the XRC SRQ
    /// each send names.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the provider has no XRC;
    /// [`Error::Verb`] naming `ibv_create_qp_ex`.
    pub fn create_qp_ex(&self) -> Result<XrcRecvQueuePair> {
        let ctx = self.context();
        let mut attr = ffi::ibv_qp_init_attr_ex {
            qp_type: ffi::IBV_QPT_XRC_RECV,
            comp_mask: ffi::IBV_QP_INIT_ATTR_XRCD,
            xrcd: self.as_raw(),
            ..Default::default()
        };
        let qp = call_ptr(
            "ibv_create_qp_ex",
            || format!("XRC target QP on {}", ctx.name()).into(),
            || {
                // SAFETY: valid context and XRC domain of that context (kept alive by
                // the QP); the attribute struct is initialised.
                unsafe { ffi::ibv_create_qp_ex(ctx.as_raw(), &mut attr) }
            },
        )
        .map_err(|e| unsupported(e, "XRC target QPs (ibv_create_qp_ex)", ctx))?;
        Ok(XrcRecvQueuePair {
            qp,
            opened: false,
            xrcd: Arc::clone(&self.inner),
        })
    }

    /// Opens the XRC target QP `qp_num` that another process created in
    /// this domain's shared XRC domain (`ibv_open_qp(3)`). Dropping the
    /// handle closes it; the QP lives on while its creator keeps it.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the provider has no XRC;
    /// [`Error::Verb`] naming `ibv_open_qp` (e.g. `EINVAL` when no such QP
    /// is in the domain).
    pub fn open_qp(&self, qp_num: u32) -> Result<XrcRecvQueuePair> {
        let ctx = self.context();
        let mut attr = ffi::ibv_qp_open_attr {
            comp_mask: ffi::IBV_QP_OPEN_ATTR_NUM
                | ffi::IBV_QP_OPEN_ATTR_XRCD
                | ffi::IBV_QP_OPEN_ATTR_TYPE,
            qp_num,
            xrcd: self.as_raw(),
            qp_context: std::ptr::null_mut(),
            qp_type: ffi::IBV_QPT_XRC_RECV,
        };
        let qp = call_ptr(
            "ibv_open_qp",
            || format!("XRC target QP {qp_num} on {}", ctx.name()).into(),
            || {
                // SAFETY: valid context and XRC domain of that context (kept alive by
                // the handle); the attribute struct is initialised.
                unsafe { ffi::ibv_open_qp(ctx.as_raw(), &mut attr) }
            },
        )
        .map_err(|e| unsupported(e, "shared XRC target QPs (ibv_open_qp)", ctx))?;
        Ok(XrcRecvQueuePair {
            qp,
            opened: true,
            xrcd: Arc::clone(&self.inner),
        })
    }
}

/// An XRC target queue pair (`IBV_QPT_XRC_RECV`), created with
/// [`XrcDomain::create_qp_ex`] or opened with [`XrcDomain::open_qp`]. It has
/// no send or receive queue, so nothing is posted to it; it is connected
/// with [`XrcRecvQueuePair::modify`]. Unique owner: not `Clone`. Keeps its
/// XRC domain alive.
pub struct XrcRecvQueuePair {
    qp: NonNull<ffi::ibv_qp>,
    /// Opened with `ibv_open_qp` rather than created.
    opened: bool,
    // Released after the QP is destroyed (Drop runs first).
    xrcd: Arc<XrcdInner>,
}

// SAFETY: a QP handle may be used from any thread; modify and query are
// thread-safe verbs and the Rust side has no interior mutability.
unsafe impl Send for XrcRecvQueuePair {}
// SAFETY: as above.
unsafe impl Sync for XrcRecvQueuePair {}

impl XrcRecvQueuePair {
    /// The raw QP, valid while this handle lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_qp {
        self.qp.as_ptr()
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: reads a field of a live QP.
        unsafe { (*self.as_raw()).qp_num }
    }

    /// Always [`QpType::XrcRecv`].
    pub fn qp_type(&self) -> QpType {
        QpType::XrcRecv
    }

    /// Whether the handle was opened with [`XrcDomain::open_qp`].
    pub fn is_opened(&self) -> bool {
        self.opened
    }

    fn describe(&self, what: impl fmt::Display) -> std::borrow::Cow<'static, str> {
        format!(
            "XRC target QP {} on {}: {what}",
            self.qp_num(),
            self.xrcd.ctx.name()
        )
        .into()
    }

    /// Modifies the QP (`ibv_modify_qp(3)`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_modify_qp`, with the attribute mask.
    pub fn modify(&self, attr: &QpAttr) -> Result<()> {
        let mut raw = *attr.as_raw();
        let mask = std::ffi::c_int::try_from(attr.mask()).unwrap_or(std::ffi::c_int::MAX);
        // SAFETY: valid QP and attribute struct.
        let rc = unsafe { ffi::ibv_modify_qp(self.as_raw(), &mut raw, mask) };
        check_errno_ret(
            "ibv_modify_qp",
            || {
                self.describe(format_args!(
                    "to {:?} with mask {:#x}",
                    QpState::from_raw(raw.qp_state),
                    attr.mask()
                ))
            },
            rc,
        )
    }

    /// Queries every attribute (`ibv_query_qp(3)`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_query_qp`.
    pub fn query(&self) -> Result<QpAttr> {
        // SAFETY: this QP is live while `self` is.
        unsafe { QpAttr::query_all(self.as_raw(), || self.describe("query")) }
    }
}

impl Drop for XrcRecvQueuePair {
    fn drop(&mut self) {
        // SAFETY: created by create_qp_ex or opened by open_qp, destroyed (for an opened
        // QP: closed) once. Nothing is ever posted to it, so no memory
        // depends on it.
        let rc = unsafe { ffi::ibv_destroy_qp(self.qp.as_ptr()) };
        if rc != 0 {
            crate::error::teardown_failed(format_args!(
                "ibv_destroy_qp of XRC target QP on {} failed: errno {rc}",
                self.xrcd.ctx.name()
            ));
        }
    }
}

impl fmt::Debug for XrcRecvQueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XrcRecvQueuePair")
            .field("qp_num", &self.qp_num())
            .field("opened", &self.opened)
            .finish()
    }
}
