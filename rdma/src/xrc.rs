//! XRC domains (`ibv_open_xrcd(3)`).
//!
//! Neither soft-RoCE nor soft-iWARP implements XRC, so this crate wraps the
//! domain (and reports a typed [`Error::Unsupported`] where it is missing);
//! XRC SRQs and QPs are reachable through [`crate::ffi`] for now.

use std::fmt;
use std::ptr::NonNull;

use crate::error::{check_ptr, Error, Result};
use crate::{ffi, Context};

/// An XRC domain (`struct ibv_xrcd`), not shared with other processes.
pub struct XrcDomain {
    xrcd: NonNull<ffi::ibv_xrcd>,
    // Dropped after the domain is closed (field order).
    ctx: Context,
}

// SAFETY: an XRC domain is a kernel object handle usable from any thread.
unsafe impl Send for XrcDomain {}
// SAFETY: as above; no interior mutability.
unsafe impl Sync for XrcDomain {}

impl Context {
    /// Opens a private XRC domain (`ibv_open_xrcd(3)` with no file).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the device has no XRC (rxe, siw);
    /// [`Error::Verb`] naming `ibv_open_xrcd`.
    pub fn open_xrcd(&self) -> Result<XrcDomain> {
        let mut attr = ffi::ibv_xrcd_init_attr {
            comp_mask: ffi::IBV_XRCD_INIT_ATTR_FD | ffi::IBV_XRCD_INIT_ATTR_OFLAGS,
            fd: -1,
            oflags: libc::O_CREAT,
        };
        // SAFETY: valid context and attribute struct.
        let xrcd = unsafe { ffi::ibv_open_xrcd(self.as_raw(), &mut attr) };
        let xrcd = check_ptr("ibv_open_xrcd", || self.name().to_string().into(), xrcd).map_err(
            |e| match e.errno() {
                Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => Error::Unsupported {
                    what: "XRC domains".into(),
                    device: self.name().to_string(),
                    source: e.errno().map(std::io::Error::from_raw_os_error),
                },
                _ => e,
            },
        )?;
        Ok(XrcDomain {
            xrcd,
            ctx: self.clone(),
        })
    }
}

impl XrcDomain {
    /// The raw domain, valid while this handle lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_xrcd {
        self.xrcd.as_ptr()
    }
}

impl Drop for XrcDomain {
    fn drop(&mut self) {
        // SAFETY: opened by open_xrcd, closed once.
        let rc = unsafe { ffi::ibv_close_xrcd(self.xrcd.as_ptr()) };
        if rc != 0 {
            crate::error::teardown_failed(format_args!(
                "ibv_close_xrcd on {} failed: errno {rc}",
                self.ctx.name()
            ));
        }
    }
}

impl fmt::Debug for XrcDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XrcDomain")
            .field("device", &self.ctx.name())
            .finish()
    }
}
