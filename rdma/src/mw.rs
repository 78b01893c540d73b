//! Memory windows (`ibv_alloc_mw(3)`, `ibv_bind_mw(3)`).
//!
//! A window grants a peer remote access to a range of a memory region
//! registered with [`AccessFlags::MW_BIND`] under an rkey of its own, which
//! can be bound, moved and invalidated without re-registering. A bound window
//! keeps its region's registration (and memory) alive.

use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use crate::error::{call_ptr, Error, Result};
use crate::macros::c_enum;
use crate::mr::{AccessFlags, MrInner};
use crate::{ffi, MemoryRegion, ProtectionDomain, RemoteMemory};

c_enum! {
    /// `enum ibv_mw_type`.
    pub enum MwType: u32 {
        /// Type 1: bound with `ibv_bind_mw`, invalidated by rebinding.
        Type1 = ffi::IBV_MW_TYPE_1,
        /// Type 2: bound and invalidated with work requests.
        Type2 = ffi::IBV_MW_TYPE_2,
    }
}

pub(crate) struct MwInner {
    mw: NonNull<ffi::ibv_mw>,
    /// The registration the window is bound to, kept alive while bound.
    bound: Mutex<Option<Arc<MrInner>>>,
    // Dropped after the window is deallocated (field order).
    pd: ProtectionDomain,
}

// SAFETY: a window is a kernel/provider object; its binding is behind a Mutex.
unsafe impl Send for MwInner {}
// SAFETY: as above.
unsafe impl Sync for MwInner {}

impl fmt::Debug for MwInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MwInner").field("mw", &self.mw).finish()
    }
}

impl Drop for MwInner {
    fn drop(&mut self) {
        // SAFETY: in-flight binds hold an Arc of this inner value; deallocated
        // once. The bound registration is released after (field `bound`).
        let rc = unsafe { ffi::ibv_dealloc_mw(self.mw.as_ptr()) };
        if rc != 0 {
            crate::error::teardown_failed(format_args!(
                "ibv_dealloc_mw failed: errno {rc}; keeping its region registered"
            ));
            // A peer may still reach the region through the window.
            if let Ok(mut b) = self.bound.lock() {
                std::mem::forget(b.take());
            }
        }
    }
}

/// A memory window (`struct ibv_mw`). Unique owner: not `Clone`.
pub struct MemoryWindow {
    pub(crate) inner: Arc<MwInner>,
    mw_type: MwType,
    /// The rkey of the current (or last) binding.
    rkey: u32,
}

impl ProtectionDomain {
    /// Allocates a memory window (`ibv_alloc_mw(3)`).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the device has no windows of that type;
    /// [`Error::Verb`] naming `ibv_alloc_mw`.
    pub fn alloc_mw(&self, mw_type: MwType) -> Result<MemoryWindow> {
        let mw = call_ptr(
            "ibv_alloc_mw",
            || format!("{mw_type:?}").into(),
            || {
                // SAFETY: valid PD.
                unsafe { ffi::ibv_alloc_mw(self.as_raw(), mw_type.to_raw()) }
            },
        )
        .map_err(|e| match e.errno() {
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => Error::Unsupported {
                what: format!("{mw_type:?} memory windows").into(),
                device: self.context().name().to_string(),
                source: e.errno().map(std::io::Error::from_raw_os_error),
            },
            _ => e,
        })?;
        // SAFETY: reads a field of the window just allocated.
        let rkey = unsafe { (*mw.as_ptr()).rkey };
        Ok(MemoryWindow {
            inner: Arc::new(MwInner {
                mw,
                bound: Mutex::new(None),
                pd: self.clone(),
            }),
            mw_type,
            rkey,
        })
    }
}

impl MemoryWindow {
    /// The raw window, valid while this handle lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_mw {
        self.inner.mw.as_ptr()
    }

    /// Type 1 or 2.
    pub fn mw_type(&self) -> MwType {
        self.mw_type
    }

    /// The rkey of the current (or last) binding.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    pub(crate) fn set_rkey(&mut self, rkey: u32) {
        self.rkey = rkey;
    }

    /// Checks a bind request and builds its `ibv_mw_bind_info`; returns it
    /// with what the peer will use.
    pub(crate) fn bind_info(
        &self,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
        access: AccessFlags,
        rkey: u32,
    ) -> Result<(ffi::ibv_mw_bind_info, RemoteMemory)> {
        let bad = |reason: String| Error::InvalidArgument {
            verb: "ibv_bind_mw",
            reason,
        };
        if !mr.access().contains(AccessFlags::MW_BIND) {
            return Err(bad(format!(
                "the region was registered without MW_BIND ({:?})",
                mr.access()
            )));
        }
        if offset.checked_add(len).is_none_or(|end| end > mr.len()) {
            return Err(bad(format!(
                "range {offset}+{len} is outside the region of {} bytes",
                mr.len()
            )));
        }
        if !Arc::ptr_eq(&mr.pd().inner, &self.inner.pd.inner) {
            return Err(bad("the region belongs to another protection domain".into()));
        }
        let info = ffi::ibv_mw_bind_info {
            mr: mr.as_raw(),
            addr: mr.addr() + offset as u64,
            length: len as u64,
            mw_access_flags: access.bits(),
        };
        let remote = RemoteMemory {
            addr: info.addr,
            len: info.length,
            rkey,
        };
        Ok((info, remote))
    }

    /// Records the registration a posted bind refers to.
    pub(crate) fn hold(&self, mr: &MemoryRegion) {
        *self.inner.bound.lock().unwrap_or_else(|p| p.into_inner()) = Some(mr.registration());
    }
}

impl fmt::Debug for MemoryWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryWindow")
            .field("type", &self.mw_type)
            .field("rkey", &self.rkey)
            .finish()
    }
}
