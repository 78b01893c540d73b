//! Protection domains (`ibv_alloc_pd(3)`).

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{call_ptr, Result};
use crate::{ffi, Context};

/// Who releases an `ibv_pd`, and with which verb.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PdRelease {
    /// Allocated here (`ibv_alloc_pd`, `ibv_alloc_parent_domain`):
    /// `ibv_dealloc_pd`.
    Dealloc,
    /// librdmacm's PD of a device (`cm_id->pd`): never released by us.
    Borrowed,
    /// Made by `ibv_import_pd`: `ibv_unimport_pd`, which frees what the
    /// import allocated and leaves the kernel object to its owner.
    Unimport,
}

pub(crate) struct PdInner {
    pd: NonNull<ffi::ibv_pd>,
    release: PdRelease,
    /// For a parent domain: the PD and thread domain it was made from
    /// (`td.rs`'s `ParentParts`), released after it is deallocated (field
    /// order). Held, never read, so a PD needs nothing of what they are.
    #[allow(dead_code)] // held, never read
    parent: Option<Box<dyn Send + Sync>>,
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
        match self.release {
            PdRelease::Dealloc => {}
            PdRelease::Borrowed => return,
            PdRelease::Unimport => {
                // SAFETY: made by ibv_import_pd; every object created in it
                // (parent domains included) holds an Arc to it, so none is
                // left (mlx5 aborts on an unimport with users); unimported
                // once. The verb reports nothing and never calls the kernel.
                unsafe { ffi::ibv_unimport_pd(self.pd.as_ptr()) };
                return;
            }
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
///
/// # Examples
/// Memory and queue pairs are made in a protection domain; a QP may only use
/// memory registered in its own.
///
/// ```no_run
/// use rdma::{AccessFlags, QpType};
/// # fn main() -> rdma::Result<()> {
/// let ctx = rdma::Context::open("rxe0")?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(64, None, 0)?;
/// // 4 KiB of zeroed memory the device may write (receives, READ results).
/// let buf = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
/// // Memory the program already has: the region owns it from now on.
/// let msg = pd.reg_mr(b"hello".to_vec(), AccessFlags::empty())?;
/// // An RC queue pair whose sends and receives complete on `cq`.
/// let qp = pd
///     .qp_builder(QpType::Rc, &cq, &cq)
///     .max_send_wr(16)
///     .max_recv_wr(16)
///     .build()?;
/// println!("QP {} in PD {}", qp.qp_num(), pd.handle());
/// # drop((buf, msg));
/// # Ok(())
/// # }
/// ```
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
        let pd = call_ptr(
            "ibv_alloc_pd",
            || self.name().to_string().into(),
            || {
                // SAFETY: valid context.
                unsafe { ffi::ibv_alloc_pd(self.as_raw()) }
            },
        )?;
        Ok(ProtectionDomain {
            inner: Arc::new(PdInner {
                pd,
                release: PdRelease::Dealloc,
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
                release: PdRelease::Borrowed,
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
        parts: Box<dyn Send + Sync>,
    ) -> ProtectionDomain {
        ProtectionDomain {
            inner: Arc::new(PdInner {
                pd,
                release: PdRelease::Dealloc,
                parent: Some(parts),
                ctx: ctx.clone(),
            }),
        }
    }

    /// Wraps a PD made by `ibv_import_pd`, unimported on drop.
    ///
    /// # Safety
    /// `pd` was imported into `ctx` and is owned by nobody else here.
    pub(crate) unsafe fn from_import(ctx: &Context, pd: NonNull<ffi::ibv_pd>) -> ProtectionDomain {
        ProtectionDomain {
            inner: Arc::new(PdInner {
                pd,
                release: PdRelease::Unimport,
                parent: None,
                ctx: ctx.clone(),
            }),
        }
    }

    /// The raw `ibv_pd`, valid while this handle (or a clone) lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_pd {
        self.inner.pd.as_ptr()
    }

    /// The PD's kernel handle (`ibv_pd->handle`), which names it within the
    /// command file of its context: what [`Context::import_pd`] takes, in
    /// this process or another one that imported the context
    /// ([`Context::import_device`]). A parent domain is no kernel object of
    /// its own: share the PD it was made from.
    pub fn handle(&self) -> u32 {
        // SAFETY: reads a field of a live PD.
        unsafe { (*self.as_raw()).handle }
    }

    /// True for a PD made by [`Context::import_pd`]: dropping it releases
    /// only this process's view (`ibv_unimport_pd`), never the PD itself.
    pub fn is_imported(&self) -> bool {
        self.inner.release == PdRelease::Unimport
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
            .field("release", &self.inner.release)
            .finish()
    }
}
