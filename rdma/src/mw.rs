//! Memory windows (`ibv_alloc_mw(3)`, `ibv_bind_mw(3)`).
//!
//! A window grants a peer remote access to a range of a memory region
//! registered with [`AccessFlags::MW_BIND`] under an rkey of its own, which
//! can be bound, moved and invalidated without re-registering. A bound window
//! keeps its region's registration (and memory) alive.
//!
//! A bind is a work request: the device binds the window when it executes
//! it, not when it is posted. So the registration a window holds changes
//! only as its binds finish ([`Bindings`]): a bind that completes
//! successfully replaces what the window held; one that fails leaves it;
//! one whose outcome is never seen (its QP reset or destroyed with it in
//! flight) adds its region to what the window holds. Until a rebind
//! completes, the region bound before it stays registered, whatever the
//! caller drops: the device may still reach it through the old binding.
//! A window's binds in flight are all on one QP, whose send queue executes
//! them in order, so completions tell the order in which they took effect.

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
    /// The registrations the window may be bound to, kept alive while it
    /// may be, and its binds in flight.
    binds: Mutex<Bindings<Arc<MrInner>>>,
    // Dropped after the window is deallocated (field order).
    pd: ProtectionDomain,
}

/// What a window may be bound to, as its binds finish (the module
/// documentation); `R` is a registration (generic for the unit tests).
#[derive(Debug)]
pub(crate) struct Bindings<R> {
    /// What the device may reach through the window: the region of the
    /// last bind that completed successfully, and the regions of binds
    /// whose outcome was never seen since.
    bound: Vec<R>,
    /// Binds posted and not finished, all on the QP `qp`.
    in_flight: u32,
    /// The QP of the binds in flight (its tracker's address), while any
    /// are.
    qp: usize,
}

/// How a bind request ended, as far as the completions tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Completed successfully (or a later request of its queue did): the
    /// window is bound to its region.
    Bound,
    /// Completed with an error (flushed included): not executed, the window
    /// is as it was.
    Failed,
    /// Never seen (its QP reset or destroyed with it in flight): it may
    /// have taken effect or not.
    Unknown,
}

impl<R> Default for Bindings<R> {
    fn default() -> Self {
        Bindings {
            bound: Vec::new(),
            in_flight: 0,
            qp: 0,
        }
    }
}

impl<R> Bindings<R> {
    /// Why a bind cannot be posted on the QP `qp` now, if it cannot: binds
    /// in flight on another QP, which executes them in an order the
    /// completions would not tell.
    pub(crate) fn refuses(&self, qp: usize) -> Option<String> {
        (self.in_flight > 0 && self.qp != qp).then(|| {
            format!(
                "the window has {} bind(s) in flight on another QP: a window's binds \
                 in flight must all be on one QP (wait for their completions first)",
                self.in_flight
            )
        })
    }

    /// Records a bind posted on the QP `qp`.
    pub(crate) fn posted(&mut self, qp: usize) {
        self.in_flight += 1;
        self.qp = qp;
    }

    /// Records how a bind to `target` ended; returns the registrations
    /// the window no longer holds, to be dropped by the caller after its
    /// lock (dropping one may deregister it).
    pub(crate) fn finish(&mut self, target: R, outcome: Outcome) -> Vec<R> {
        self.in_flight = self.in_flight.saturating_sub(1);
        match outcome {
            Outcome::Bound => std::mem::replace(&mut self.bound, vec![target]),
            Outcome::Failed => vec![target],
            Outcome::Unknown => {
                self.bound.push(target);
                Vec::new()
            }
        }
    }

    /// What the window holds now (tests).
    #[cfg(test)]
    fn held(&self) -> &[R] {
        &self.bound
    }
}

/// A bind in flight: keeps the window and the region it binds to alive,
/// and tells the window how it ended when it is dropped (by its
/// completion's resolution, or unseen by a QP's drain).
pub(crate) struct BindInFlight {
    // Dropped first (field order): the last reference deallocates the
    // window before its regions go.
    mw: Arc<MwInner>,
    target: Option<Arc<MrInner>>,
    outcome: Outcome,
}

impl BindInFlight {
    /// The bind's completion (or a later one of its queue) was resolved,
    /// successfully or not.
    pub(crate) fn completed(mut self: Box<Self>, ok: bool) -> Box<Self> {
        self.outcome = if ok { Outcome::Bound } else { Outcome::Failed };
        self
    }
}

impl Drop for BindInFlight {
    fn drop(&mut self) {
        let Some(target) = self.target.take() else {
            return;
        };
        let released = self
            .mw
            .binds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .finish(target, self.outcome);
        // After the window's lock: the last reference deregisters.
        drop(released);
    }
}

impl fmt::Debug for BindInFlight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BindInFlight")
            .field("mw", &self.mw)
            .field("outcome", &self.outcome)
            .finish_non_exhaustive()
    }
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
        // once. The bound registrations are released after (field `binds`).
        let rc = unsafe { ffi::ibv_dealloc_mw(self.mw.as_ptr()) };
        if rc != 0 {
            crate::error::teardown_failed(format_args!(
                "ibv_dealloc_mw failed: errno {rc}; keeping its regions registered"
            ));
            // A peer may still reach the regions through the window.
            let binds = self.binds.get_mut().unwrap_or_else(|p| p.into_inner());
            std::mem::forget(std::mem::take(&mut binds.bound));
        }
    }
}

/// A memory window (`struct ibv_mw`). Unique owner: not `Clone`.
///
/// ```no_run
/// # fn f(qp: &mut rdma::QueuePair, pd: &rdma::ProtectionDomain) -> rdma::Result<()> {
/// use rdma::{AccessFlags, MwType};
/// let mr = pd.alloc_mr(1 << 20, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)?;
/// let mut mw = pd.alloc_mw(MwType::Type2)?;
/// // The peer may write the first 4 KiB, under the window's own rkey.
/// let remote = qp.bind_mw(1, &mut mw, &mr, 0, 4096, AccessFlags::REMOTE_WRITE)?;
/// # let _ = remote;
/// # Ok(()) }
/// ```
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
                binds: Mutex::new(Bindings::default()),
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

    /// Why a bind cannot be posted on the QP whose tracker is at `qp` now,
    /// if it cannot (see [`Bindings::refuses`]).
    pub(crate) fn refuses_bind_on(&self, qp: usize) -> Option<String> {
        self.inner
            .binds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .refuses(qp)
    }

    /// Records a bind to `mr` posted on the QP whose tracker is at `qp`;
    /// returns what its request keeps until it finishes.
    pub(crate) fn posted(&self, qp: usize, mr: &MemoryRegion) -> Box<BindInFlight> {
        self.inner
            .binds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .posted(qp);
        Box::new(BindInFlight {
            mw: Arc::clone(&self.inner),
            target: Some(mr.registration()),
            outcome: Outcome::Unknown,
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    const QP: usize = 0x1000;

    /// A rebind posted does not let go of the region bound before it: only
    /// its successful completion does.
    #[test]
    fn a_rebind_releases_the_old_region_only_when_it_completes() {
        let mut b = Bindings::default();
        b.posted(QP);
        assert!(b.finish("old", Outcome::Bound).is_empty());
        assert_eq!(b.held(), ["old"]);
        b.posted(QP);
        assert_eq!(b.held(), ["old"], "held while the rebind is in flight");
        assert_eq!(b.finish("new", Outcome::Bound), ["old"]);
        assert_eq!(b.held(), ["new"]);
    }

    /// A bind that fails leaves the window as it was; one never seen may
    /// have taken effect, so both regions stay until a bind completes.
    #[test]
    fn failed_and_unseen_binds_keep_what_the_window_may_reach() {
        let mut b = Bindings::default();
        b.posted(QP);
        b.finish("old", Outcome::Bound);
        b.posted(QP);
        assert_eq!(b.finish("new", Outcome::Failed), ["new"]);
        assert_eq!(b.held(), ["old"]);
        b.posted(QP);
        assert!(b.finish("unseen", Outcome::Unknown).is_empty());
        assert_eq!(b.held(), ["old", "unseen"]);
        b.posted(QP);
        assert_eq!(b.finish("last", Outcome::Bound), ["old", "unseen"]);
        assert_eq!(b.held(), ["last"]);
    }

    /// Binds in flight on one QP execute in its order; a second QP's could
    /// overtake them unseen, so it waits until none is in flight.
    #[test]
    fn binds_in_flight_are_on_one_qp() {
        let mut b = Bindings::default();
        assert_eq!(b.refuses(QP), None);
        b.posted(QP);
        b.posted(QP);
        assert_eq!(b.refuses(QP), None, "the same QP may post more");
        let err = b.refuses(QP + 1).unwrap();
        assert!(err.contains("2 bind(s) in flight on another QP"), "{err}");
        b.finish("a", Outcome::Bound);
        assert!(b.refuses(QP + 1).is_some());
        b.finish("b", Outcome::Failed);
        assert_eq!(b.refuses(QP + 1), None, "none in flight");
    }
}
