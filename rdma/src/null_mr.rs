//! Null memory regions (`ibv_alloc_null_mr(3)`): an lkey whose writes the
//! device discards and whose reads return no data, for scatter entries that
//! drop (part of) a message.

use std::fmt;
use std::ptr::NonNull;

use crate::error::{call_ptr, Result};
use crate::{ffi, ProtectionDomain};

/// A null memory region (`struct ibv_mr` from `ibv_alloc_null_mr`). It covers
/// no host memory; only its lkey is meaningful. The safe posting API takes
/// [`crate::MemoryRegion`]s only, so work requests that use it go through the
/// raw layer. Not `Clone`; keeps its PD alive.
pub struct NullMemoryRegion {
    mr: NonNull<ffi::ibv_mr>,
    // Released after the region is deregistered (field order).
    pd: ProtectionDomain,
}

// SAFETY: the registration is a kernel object handle; the Rust side only
// reads fields the provider set at allocation.
unsafe impl Send for NullMemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for NullMemoryRegion {}

impl ProtectionDomain {
    /// Allocates a null memory region (`ibv_alloc_null_mr(3)`).
    ///
    /// # Errors
    /// [`Error::Unsupported`](crate::Error::Unsupported) when the provider has none (`EOPNOTSUPP`:
    /// soft-RoCE, soft-iWARP); [`Error::Verb`](crate::Error::Verb) naming `ibv_alloc_null_mr`.
    pub fn alloc_null_mr(&self) -> Result<NullMemoryRegion> {
        const VERB: &str = "ibv_alloc_null_mr";
        let mr = call_ptr(
            VERB,
            || self.context().name().to_string().into(),
            || {
                // SAFETY: valid PD.
                unsafe { ffi::ibv_alloc_null_mr(self.as_raw()) }
            },
        )
        .map_err(|e| {
            e.unsupported_if_not_implemented(
                format!("null memory regions ({VERB})"),
                self.context().name(),
            )
        })?;
        Ok(NullMemoryRegion {
            mr,
            pd: self.clone(),
        })
    }
}

impl NullMemoryRegion {
    /// The local key to put in scatter entries whose data is dropped.
    pub fn lkey(&self) -> u32 {
        // SAFETY: the region lives as long as `self`.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The raw `ibv_mr`, valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_mr {
        self.mr.as_ptr()
    }
}

impl Drop for NullMemoryRegion {
    fn drop(&mut self) {
        // SAFETY: allocated by alloc_null_mr, deregistered once.
        let rc = unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
        if rc != 0 {
            crate::error::teardown_failed(format_args!(
                "ibv_dereg_mr of a null memory region on {} failed: errno {rc}",
                self.pd.context().name()
            ));
        }
    }
}

impl fmt::Debug for NullMemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NullMemoryRegion")
            .field("device", &self.pd.context().name())
            .field("lkey", &self.lkey())
            .finish()
    }
}
