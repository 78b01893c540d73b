//! Protection domains (`ibv_alloc_pd(3)`).

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{check_ptr, Result};
use crate::{ffi, Context};

pub(crate) struct PdInner {
    pd: NonNull<ffi::ibv_pd>,
    /// librdmacm's PD of a device (`cm_id->pd`): never deallocated by us.
    borrowed: bool,
    /// For a parent domain: the PD and thread domain it was made from,
    /// released after it is deallocated (field order).
    #[allow(dead_code)] // held, never read
    parent: Option<crate::td::ParentParts>,
    // Dropped after the PD is deallocated (field order). For a borrowed PD
    // this is the borrowed context, which keeps the PD's owner alive.
    ctx: Context,
}

// SAFETY: a PD is a kernel object handle; verbs on it are thread-safe.
unsafe impl Send for PdInner {}
// SAFETY: as above; no interior mutability on the Rust side.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        if self.borrowed {
            return;
        }
        // SAFETY: every MR, QP, AH, MW and SRQ of this PD holds an Arc to it,
        // so none is left; deallocated once. A parent domain is deallocated
        // with ibv_dealloc_pd too (ibv_alloc_parent_domain(3)).
        let rc = unsafe { ffi::ibv_dealloc_pd(self.pd.as_ptr()) };
        if rc != 0 {
            crate::error::teardown_failed(format_args!(
                "ibv_dealloc_pd on {} failed: errno {rc}",
                self.ctx.name()
            ));
        }
    }
}

/// A protection domain (`struct ibv_pd`). A cheap `Clone` handle; memory
/// regions, queue pairs and address handles created in it keep it alive.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) inner: Arc<PdInner>,
}

impl Context {
    /// Allocates a protection domain (`ibv_alloc_pd(3)`).
    ///
    /// # Errors
    /// [`crate::Error::Verb`] naming `ibv_alloc_pd` (e.g. `ENOMEM`).
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        // SAFETY: valid context.
        let pd = unsafe { ffi::ibv_alloc_pd(self.as_raw()) };
        let pd = check_ptr("ibv_alloc_pd", || self.name().to_string().into(), pd)?;
        Ok(ProtectionDomain {
            inner: Arc::new(PdInner {
                pd,
                borrowed: false,
                parent: None,
                ctx: self.clone(),
            }),
        })
    }

    /// Wraps a PD this crate does not own (librdmacm's `cm_id->pd`).
    ///
    /// # Safety
    /// `pd` belongs to this (borrowed) context and stays allocated while the
    /// context's owner lives.
    pub(crate) unsafe fn borrowed_pd(&self, pd: NonNull<ffi::ibv_pd>) -> ProtectionDomain {
        ProtectionDomain {
            inner: Arc::new(PdInner {
                pd,
                borrowed: true,
                parent: None,
                ctx: self.clone(),
            }),
        }
    }
}

impl ProtectionDomain {
    /// Wraps a parent domain (`ibv_alloc_parent_domain(3)`), deallocated on
    /// drop, after which `parts` are released.
    ///
    /// # Safety
    /// `pd` is a parent domain of `ctx` made from `parts`, owned by nobody else.
    pub(crate) unsafe fn from_parent_domain(
        ctx: &Context,
        pd: NonNull<ffi::ibv_pd>,
        parts: crate::td::ParentParts,
    ) -> ProtectionDomain {
        ProtectionDomain {
            inner: Arc::new(PdInner {
                pd,
                borrowed: false,
                parent: Some(parts),
                ctx: ctx.clone(),
            }),
        }
    }

    /// The raw `ibv_pd`, valid while this handle (or a clone) lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_pd {
        self.inner.pd.as_ptr()
    }

    /// The context the PD belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }
}

impl fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("device", &self.inner.ctx.name())
            .field("pd", &self.inner.pd)
            .finish()
    }
}
