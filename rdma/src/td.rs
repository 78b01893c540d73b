//! Thread domains (`ibv_alloc_td(3)`) and parent domains
//! (`ibv_alloc_parent_domain(3)`).
//!
//! A thread domain tells the provider that the objects created under it are
//! used by one thread at a time, so it may drop its internal locks (and share
//! doorbells between those objects). Objects join a thread domain through a
//! parent domain: a protection domain extended with the thread domain, given
//! wherever a PD is expected.
//!
//! This crate's handles are `Send + Sync` and it has no `!Sync` queue or CQ
//! type yet, so it cannot hold up the one-thread-at-a-time rule on its own:
//! a [`ParentDomain`] with a thread domain hands out its PD only through the
//! `unsafe` [`ParentDomain::protection_domain_unchecked`]. Without a thread
//! domain, nothing changes for the objects, and [`ParentDomain::as_pd`] is
//! safe. Custom allocators (`IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS`) are not
//! wrapped.
//!
//! Neither soft-RoCE nor soft-iWARP implements thread or parent domains: both
//! constructors report [`Error::Unsupported`] there.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{call_ptr, Error, Result};
use crate::{ffi, Context, ProtectionDomain};

pub(crate) struct TdInner {
    td: NonNull<ffi::ibv_td>,
    // Dropped after the thread domain is deallocated (field order).
    ctx: Context,
}

// SAFETY: a thread domain is a handle the Rust side never dereferences except
// to deallocate it once; allocating and deallocating are thread-safe verbs.
unsafe impl Send for TdInner {}
// SAFETY: as above; no interior mutability.
unsafe impl Sync for TdInner {}

impl Drop for TdInner {
    fn drop(&mut self) {
        // SAFETY: every parent domain made with this thread domain holds an
        // Arc to it, so none is left; deallocated once.
        let rc = unsafe { ffi::ibv_dealloc_td(self.td.as_ptr()) };
        if rc != 0 {
            crate::error::teardown_failed(format_args!(
                "ibv_dealloc_td on {} failed: errno {rc}",
                self.ctx.name()
            ));
        }
    }
}

/// A thread domain (`struct ibv_td`). Not `Clone`; the parent domains made
/// with it keep it alive, and it keeps its context open.
pub struct ThreadDomain {
    inner: Arc<TdInner>,
}

impl Context {
    /// Allocates a thread domain (`ibv_alloc_td(3)`).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the provider has no thread domains (the
    /// verb fails with `EOPNOTSUPP`/`ENOSYS`; rxe, siw); [`Error::Verb`]
    /// naming `ibv_alloc_td` otherwise.
    pub fn alloc_td(&self) -> Result<ThreadDomain> {
        let mut attr = ffi::ibv_td_init_attr { comp_mask: 0 };
        let td = call_ptr(
            "ibv_alloc_td",
            || self.name().to_string().into(),
            || {
                // SAFETY: valid context and attribute struct.
                unsafe { ffi::ibv_alloc_td(self.as_raw(), &mut attr) }
            },
        )
        .map_err(|e| e.unsupported_if_not_implemented("thread domains", self.name()))?;
        Ok(ThreadDomain {
            inner: Arc::new(TdInner {
                td,
                ctx: self.clone(),
            }),
        })
    }
}

impl ThreadDomain {
    /// The raw `ibv_td`, valid while this handle (or a parent domain made
    /// with it) lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_td {
        self.inner.td.as_ptr()
    }

    /// The context the thread domain belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }
}

impl fmt::Debug for ThreadDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThreadDomain")
            .field("device", &self.inner.ctx.name())
            .field("td", &self.inner.td)
            .finish()
    }
}

/// What a parent domain is made from, released after it.
/// Held, never read: dropping it releases them.
pub(crate) struct ParentParts {
    // Field order: the PD, then the thread domain (independent objects).
    _pd: ProtectionDomain,
    _td: Option<ThreadDomain>,
}

/// A parent domain (`ibv_alloc_parent_domain(3)`): a protection domain
/// extended with an optional [`ThreadDomain`].
///
/// Objects created with its PD belong to the protection domain it was made
/// from. When it has a thread domain, those objects (QPs, CQs, SRQs, ...)
/// must be used by one thread at a time, all of them together: the provider
/// may drop their locks and share hardware resources between them. The
/// crate has no `!Sync` CQ or queue type to enforce that yet, so that PD is
/// reached only through the `unsafe`
/// [`ParentDomain::protection_domain_unchecked`].
///
/// Not `Clone`. Deallocated (`ibv_dealloc_pd`) when it and every object
/// created with its PD are dropped; it keeps its protection domain and
/// thread domain alive until then.
pub struct ParentDomain {
    /// The parent domain as a PD; its `PdInner` owns the `ParentParts`,
    /// which keep `base` and `td` alive whatever the order of drops.
    pd: ProtectionDomain,
    base: ProtectionDomain,
    td: Option<ThreadDomain>,
}

impl ProtectionDomain {
    /// Allocates a parent domain over this PD, with `td` if given
    /// (`ibv_alloc_parent_domain(3)`, no custom allocators).
    ///
    /// # Errors
    /// - [`Error::InvalidArgument`] when `td` belongs to another context;
    /// - [`Error::Unsupported`] when the provider has no parent domains (the
    ///   verb fails with `EOPNOTSUPP`/`ENOSYS`; rxe, siw);
    /// - [`Error::Verb`] naming `ibv_alloc_parent_domain`.
    pub fn alloc_parent_domain(&self, td: Option<&ThreadDomain>) -> Result<ParentDomain> {
        let ctx = self.context();
        if let Some(td) = td {
            if td.context().as_raw() != ctx.as_raw() {
                return Err(Error::InvalidArgument {
                    verb: "ibv_alloc_parent_domain",
                    reason: format!(
                        "the thread domain belongs to another context ({}) than the PD ({})",
                        td.context().name(),
                        ctx.name()
                    ),
                });
            }
        }
        let mut attr = ffi::ibv_parent_domain_init_attr {
            pd: self.as_raw(),
            td: td.map_or(std::ptr::null_mut(), ThreadDomain::as_raw),
            ..Default::default()
        };
        let raw = call_ptr(
            "ibv_alloc_parent_domain",
            || {
                let with = if td.is_some() { "with" } else { "without" };
                format!("{} {with} a thread domain", ctx.name()).into()
            },
            || {
                // SAFETY: valid context, PD and (optional) TD of that context;
                // comp_mask 0, so the allocator fields are ignored.
                unsafe { ffi::ibv_alloc_parent_domain(ctx.as_raw(), &mut attr) }
            },
        )
        .map_err(|e| e.unsupported_if_not_implemented("parent domains", ctx.name()))?;
        let td = td.map(|td| ThreadDomain {
            inner: Arc::clone(&td.inner),
        });
        let parts = ParentParts {
            _pd: self.clone(),
            _td: td.as_ref().map(|td| ThreadDomain {
                inner: Arc::clone(&td.inner),
            }),
        };
        // SAFETY: a parent domain of `ctx` made from `parts`, owned by nobody
        // else.
        let pd = unsafe { ProtectionDomain::from_parent_domain(ctx, raw, Box::new(parts)) };
        Ok(ParentDomain {
            pd,
            base: self.clone(),
            td,
        })
    }
}

impl ParentDomain {
    /// The raw parent domain (a `struct ibv_pd`), valid while this handle
    /// (or an object created with it) lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_pd {
        self.pd.as_raw()
    }

    /// The protection domain it was made from.
    pub fn protection_domain(&self) -> &ProtectionDomain {
        &self.base
    }

    /// Its thread domain, if it has one.
    pub fn thread_domain(&self) -> Option<&ThreadDomain> {
        self.td.as_ref()
    }

    /// The parent domain as a [`ProtectionDomain`] to create objects with,
    /// when it has no thread domain (`None` otherwise). Objects created with
    /// it keep the parent domain alive.
    pub fn as_pd(&self) -> Option<ProtectionDomain> {
        self.thread_domain().is_none().then(|| self.pd.clone())
    }

    /// The parent domain as a [`ProtectionDomain`], thread domain or not.
    ///
    /// # Safety
    /// If the parent domain has a thread domain, every object created with
    /// the returned PD (and its clones) that the provider ties to the thread
    /// domain (queue pairs, completion queues, SRQs, work queues) must be
    /// used by one thread at a time, all such objects of the thread domain
    /// together, although their handles are `Send + Sync`.
    pub unsafe fn protection_domain_unchecked(&self) -> ProtectionDomain {
        self.pd.clone()
    }

    /// The context.
    pub fn context(&self) -> &Context {
        self.pd.context()
    }
}

impl fmt::Debug for ParentDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParentDomain")
            .field("device", &self.context().name())
            .field("pd", &self.as_raw())
            .field("thread_domain", &self.thread_domain().is_some())
            .finish()
    }
}
