//! XRC domains (`ibv_open_xrcd(3)`): what XRC target QPs (`xrc.rs`) and
//! XRC shared receive queues (`srq.rs`) are made in. Below both, so that
//! an SRQ names its domain without naming the QPs.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{call_ptr, Error, Result};
use crate::{ffi, Context};

pub(crate) struct XrcdInner {
    xrcd: NonNull<ffi::ibv_xrcd>,
    // Dropped after the domain is closed (field order).
    pub(crate) ctx: Context,
}

// SAFETY: an XRC domain is a kernel object handle usable from any thread.
unsafe impl Send for XrcdInner {}
// SAFETY: as above; no interior mutability.
unsafe impl Sync for XrcdInner {}

impl Drop for XrcdInner {
    fn drop(&mut self) {
        // SAFETY: every XRC SRQ and target QP of the domain holds an Arc to
        // it, so none is left; opened by open_xrcd, closed once.
        let rc = unsafe { ffi::ibv_close_xrcd(self.xrcd.as_ptr()) };
        if rc != 0 {
            crate::error::teardown_failed(format_args!(
                "ibv_close_xrcd on {} failed: errno {rc}",
                self.ctx.name()
            ));
        }
    }
}

/// An XRC domain (`struct ibv_xrcd`), not shared with other processes.
/// Not `Clone`; closed when it and every XRC SRQ and target QP in it are
/// dropped. Keeps its context open.
pub struct XrcDomain {
    pub(crate) inner: Arc<XrcdInner>,
}

/// Maps the "not implemented" errnos of an XRC verb to [`Error::Unsupported`].
pub(crate) fn unsupported(e: Error, what: &'static str, ctx: &Context) -> Error {
    match e.errno() {
        Some(errno @ (libc::EOPNOTSUPP | libc::ENOSYS | libc::EPROTONOSUPPORT)) => {
            Error::Unsupported {
                what: what.into(),
                device: ctx.name().to_string(),
                source: Some(std::io::Error::from_raw_os_error(errno)),
            }
        }
        _ => e,
    }
}

impl Context {
    /// Opens a private XRC domain (`ibv_open_xrcd(3)` with no file).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the device has no XRC (`EOPNOTSUPP`: rxe,
    /// siw); [`Error::Verb`] naming `ibv_open_xrcd`.
    pub fn open_xrcd(&self) -> Result<XrcDomain> {
        let mut attr = ffi::ibv_xrcd_init_attr {
            comp_mask: ffi::IBV_XRCD_INIT_ATTR_FD | ffi::IBV_XRCD_INIT_ATTR_OFLAGS,
            fd: -1,
            oflags: libc::O_CREAT,
        };
        let xrcd = call_ptr(
            "ibv_open_xrcd",
            || self.name().to_string().into(),
            || {
                // SAFETY: valid context and attribute struct.
                unsafe { ffi::ibv_open_xrcd(self.as_raw(), &mut attr) }
            },
        )
        .map_err(|e| unsupported(e, "XRC domains", self))?;
        Ok(XrcDomain {
            inner: Arc::new(XrcdInner {
                xrcd,
                ctx: self.clone(),
            }),
        })
    }
}

impl XrcDomain {
    /// The raw domain, valid while this handle lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_xrcd {
        self.inner.xrcd.as_ptr()
    }

    /// The context the domain belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }
}

impl fmt::Debug for XrcDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XrcDomain")
            .field("device", &self.inner.ctx.name())
            .finish()
    }
}
