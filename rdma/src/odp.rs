//! On-demand paging: capabilities, implicit regions and `ibv_advise_mr(3)`.
//!
//! An on-demand paging (ODP) registration does not pin its pages: the device
//! faults them in when it touches them and follows the process's page tables
//! as they change. Register ODP memory through the ordinary constructors
//! ([`ProtectionDomain::alloc_mr`], [`ProtectionDomain::reg_mr`],
//! [`ProtectionDomain::reg_mr_raw`]) with [`AccessFlags::ON_DEMAND`]; the
//! region then behaves like any other [`MemoryRegion`].
//!
//! An *implicit* ODP registration covers the whole address space of the
//! process ([`ProtectionDomain::reg_implicit_odp`]); it is an
//! [`ImplicitOdpRegion`], which has keys but no bytes of its own.
//!
//! Every entry point checks the device's [`OdpCaps`] before calling into C,
//! and reports a device without (implicit) ODP as [`Error::Unsupported`]:
//! the kernel itself answers `IBV_ACCESS_ON_DEMAND` on such a device with a
//! bare `EINVAL` (Linux 6.1, soft-RoCE and soft-iWARP), indistinguishable
//! from a bad argument. `EOPNOTSUPP`/`ENOSYS` from the verbs are mapped to
//! [`Error::Unsupported`] as well.
//! Which transports and operations may page on demand is in
//! [`OdpCaps::rc`] and friends; this crate does not check them when posting.
//! The capabilities and those checks are in `odp_caps.rs`, below the memory
//! regions that use them.

use std::fmt;
use std::ptr::NonNull;

use crate::error::{call_ptr, check_errno_ret, Error, Result};
use crate::macros::c_enum;
use crate::odp_caps::{odp_unsupported, require_odp, IMPLICIT_ODP};
pub use crate::odp_caps::{OdpCaps, OdpGeneralCaps, OdpTransportCaps};
use crate::{ffi, AccessFlags, MemoryRegion, ProtectionDomain};

c_enum! {
    /// What `ibv_advise_mr(3)` is asked to do (`enum ibv_advise_mr_advice`).
    pub enum MrAdvice: u32 {
        /// Make the pages present for the device, read-only
        /// (`IBV_ADVISE_MR_ADVICE_PREFETCH`).
        Prefetch = ffi::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH,
        /// Make the pages present, readable and writable; needs a region
        /// with [`AccessFlags::LOCAL_WRITE`] (`IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE`).
        PrefetchWrite = ffi::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE,
        /// Map the pages that are already present for the CPU, without
        /// faulting others in (`IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT`).
        PrefetchNoFault = ffi::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT,
    }
}

bitflags::bitflags! {
    /// Modifiers of `ibv_advise_mr(3)`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct AdviseFlags: u32 {
        /// Return only once the translations reached the device
        /// (`IBV_ADVISE_MR_FLAG_FLUSH`).
        const FLUSH = ffi::IB_UVERBS_ADVISE_MR_FLAG_FLUSH;
        const _ = !0;
    }
}

/// Largest scatter/gather entry `advise_mr` builds (a region larger than this
/// is advised in several entries).
const MAX_SGE_LEN: usize = 1 << 31;

/// Cuts `addr..addr + len` into entries of at most [`MAX_SGE_LEN`] bytes.
fn push_sges(out: &mut Vec<ffi::ibv_sge>, addr: u64, len: usize, lkey: u32) {
    let mut done = 0usize;
    while done < len {
        let n = (len - done).min(MAX_SGE_LEN);
        out.push(ffi::ibv_sge {
            addr: addr + done as u64,
            // n <= 2^31.
            length: n as u32,
            lkey,
        });
        done += n;
    }
}

impl ProtectionDomain {
    /// Advises the device about on-demand paged regions of this PD
    /// (`ibv_advise_mr(3)`): prefetch their pages so the first access does
    /// not fault. Best effort unless `flags` has [`AdviseFlags::FLUSH`].
    ///
    /// # Errors
    /// - [`Error::InvalidArgument`] for an empty `regions`, a region of
    ///   another PD, a region not registered with [`AccessFlags::ON_DEMAND`],
    ///   or [`MrAdvice::PrefetchWrite`] on a region without
    ///   [`AccessFlags::LOCAL_WRITE`];
    /// - [`Error::Unsupported`] when the device reports no on-demand paging
    ///   (checked before the verb), or the verb returns `EOPNOTSUPP`/`ENOSYS`;
    /// - [`Error::Verb`] naming `ibv_advise_mr` otherwise (`EFAULT`,
    ///   `EPERM`, `ENOENT`, ...).
    pub fn advise_mr(
        &self,
        advice: MrAdvice,
        flags: AdviseFlags,
        regions: &[&MemoryRegion],
    ) -> Result<()> {
        const VERB: &str = "ibv_advise_mr";
        if regions.is_empty() {
            return Err(Error::InvalidArgument {
                verb: VERB,
                reason: "no regions to advise".into(),
            });
        }
        if let Some(i) = regions
            .iter()
            .position(|r| r.pd().as_raw() != self.as_raw())
        {
            return Err(Error::InvalidArgument {
                verb: VERB,
                reason: format!("region {i} belongs to another protection domain"),
            });
        }
        require_odp(self.context(), false)?;
        let mut sges = Vec::with_capacity(regions.len());
        for (i, r) in regions.iter().enumerate() {
            check_advisable(i, r.access(), advice)?;
            push_sges(&mut sges, r.addr(), r.len(), r.lkey());
        }
        self.advise_sges(advice, flags, &mut sges)
    }

    fn advise_sges(
        &self,
        advice: MrAdvice,
        flags: AdviseFlags,
        sges: &mut [ffi::ibv_sge],
    ) -> Result<()> {
        let n = u32::try_from(sges.len()).map_err(|_| Error::InvalidArgument {
            verb: "ibv_advise_mr",
            reason: format!("{} scatter/gather entries do not fit a u32", sges.len()),
        })?;
        // SAFETY: valid PD; `sges` holds `n` initialised entries that the
        // verb only reads. Prefetching changes page translations, never the
        // contents of memory.
        let rc = unsafe {
            ffi::ibv_advise_mr(
                self.as_raw(),
                advice.to_raw(),
                flags.bits(),
                sges.as_mut_ptr(),
                n,
            )
        };
        check_errno_ret(
            "ibv_advise_mr",
            || format!("{advice:?}, {flags:?}, {n} entries").into(),
            rc,
        )
        .map_err(|e| odp_unsupported(e, "ibv_advise_mr", self.context()))
    }

    /// Registers the whole address space of the process with on-demand
    /// paging (`ibv_reg_mr(3)` with `addr` NULL, `length` `SIZE_MAX` and
    /// `IBV_ACCESS_ON_DEMAND`), for local access only.
    ///
    /// [`AccessFlags::ON_DEMAND`] is added to `access`. The region has an
    /// lkey that reaches any address of the process; this crate's safe
    /// posting never uses it (only [`crate::QueuePair::post_send_raw`] and
    /// the raw layer can), so registering it is safe. Remote access would let
    /// peers read or write any memory: use
    /// [`ProtectionDomain::reg_implicit_odp_unchecked`] for that.
    ///
    /// # Errors
    /// - [`Error::InvalidArgument`] when `access` has `REMOTE_READ`,
    ///   `REMOTE_WRITE`, `REMOTE_ATOMIC` or `MW_BIND`;
    /// - [`Error::Unsupported`] when the device does not report
    ///   [`OdpGeneralCaps::SUPPORT_IMPLICIT`] (checked before the verb), or
    ///   the verb returns `EOPNOTSUPP`/`ENOSYS`;
    /// - [`Error::Verb`] naming `ibv_reg_mr`.
    pub fn reg_implicit_odp(&self, access: AccessFlags) -> Result<ImplicitOdpRegion> {
        let remote = AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_ATOMIC
            | AccessFlags::MW_BIND;
        if access.intersects(remote) {
            return Err(Error::InvalidArgument {
                verb: "ibv_reg_mr",
                reason: format!(
                    "an implicit on-demand region with {:?} would let peers reach every \
                     byte of the process; use the unsafe reg_implicit_odp_unchecked",
                    access & remote
                ),
            });
        }
        // SAFETY: no remote access: only the lkey reaches memory, and only
        // through unsafe posting.
        unsafe { self.reg_implicit_odp_unchecked(access) }
    }

    /// Registers the whole address space of the process with on-demand
    /// paging, with any access flags (see
    /// [`ProtectionDomain::reg_implicit_odp`]).
    ///
    /// # Safety
    /// With `REMOTE_WRITE`, `REMOTE_ATOMIC` or `MW_BIND`, every peer given
    /// the rkey (or a window on it) may write any memory of the process,
    /// including memory Rust code holds references to. The caller must make
    /// sure no peer writes memory it does not own by protocol, until the
    /// region is dropped. With `REMOTE_READ`, peers may read every byte of
    /// the process, secrets included.
    ///
    /// # Errors
    /// As [`ProtectionDomain::reg_implicit_odp`], without the access check.
    pub unsafe fn reg_implicit_odp_unchecked(
        &self,
        access: AccessFlags,
    ) -> Result<ImplicitOdpRegion> {
        let access = access | AccessFlags::ON_DEMAND;
        let flags =
            std::ffi::c_int::try_from(access.bits()).map_err(|_| Error::InvalidArgument {
                verb: "ibv_reg_mr",
                reason: format!("access flags {access:?} do not fit a C int"),
            })?;
        require_odp(self.context(), true)?;
        let mr = call_ptr(
            "ibv_reg_mr",
            || format!("implicit on-demand region, access {access:?}").into(),
            || {
                // SAFETY: valid PD. An implicit ODP registration pins and maps
                // nothing; the caller answers for what its keys can reach.
                unsafe { ffi::ibv_reg_mr(self.as_raw(), std::ptr::null_mut(), usize::MAX, flags) }
            },
        )
        .map_err(|e| odp_unsupported(e, IMPLICIT_ODP, self.context()))?;
        Ok(ImplicitOdpRegion {
            mr,
            access,
            pd: self.clone(),
        })
    }
}

fn check_advisable(i: usize, access: AccessFlags, advice: MrAdvice) -> Result<()> {
    if !access.contains(AccessFlags::ON_DEMAND) {
        return Err(Error::InvalidArgument {
            verb: "ibv_advise_mr",
            reason: format!(
                "region {i} is not an on-demand registration (access {access:?}): \
                 only ON_DEMAND regions can be advised"
            ),
        });
    }
    if advice == MrAdvice::PrefetchWrite && !access.contains(AccessFlags::LOCAL_WRITE) {
        return Err(Error::InvalidArgument {
            verb: "ibv_advise_mr",
            reason: format!("PrefetchWrite needs LOCAL_WRITE, region {i} has {access:?}"),
        });
    }
    Ok(())
}

impl MemoryRegion {
    /// Advises the device about this on-demand region
    /// ([`ProtectionDomain::advise_mr`] with just this piece).
    ///
    /// # Errors
    /// As [`ProtectionDomain::advise_mr`].
    pub fn advise(&self, advice: MrAdvice, flags: AdviseFlags) -> Result<()> {
        self.pd().advise_mr(advice, flags, &[self])
    }
}

/// An implicit on-demand registration of the whole address space
/// (`ibv_reg_mr` with `addr` NULL and `length` `SIZE_MAX`).
///
/// It owns no bytes and offers no view of memory: only its keys, for work
/// requests built with the raw layer, and [`ImplicitOdpRegion::advise`]. Not
/// `Clone`; deregistered on drop. Keeps its PD alive.
pub struct ImplicitOdpRegion {
    mr: NonNull<ffi::ibv_mr>,
    access: AccessFlags,
    // Dropped after the region is deregistered (field order).
    pd: ProtectionDomain,
}

// SAFETY: the registration is a kernel object handle; the Rust side only
// reads its immutable keys.
unsafe impl Send for ImplicitOdpRegion {}
// SAFETY: as above.
unsafe impl Sync for ImplicitOdpRegion {}

impl ImplicitOdpRegion {
    /// The local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: the registration lives as long as `self`.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    /// The remote key (useless to peers unless registered with remote
    /// access through [`ProtectionDomain::reg_implicit_odp_unchecked`]).
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr.as_ptr()).rkey }
    }

    /// The access flags, [`AccessFlags::ON_DEMAND`] included.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The raw `ibv_mr`, valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_mr {
        self.mr.as_ptr()
    }

    /// Advises the device about `addr..addr + len` of the address space
    /// (`ibv_advise_mr(3)`). Prefetching only changes translations, never
    /// memory contents, so any range may be given; unmapped ones fail with
    /// `EFAULT`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `len == 0`, or
    /// [`MrAdvice::PrefetchWrite`] without [`AccessFlags::LOCAL_WRITE`];
    /// otherwise as [`ProtectionDomain::advise_mr`].
    pub fn advise(
        &self,
        advice: MrAdvice,
        flags: AdviseFlags,
        addr: u64,
        len: usize,
    ) -> Result<()> {
        if len == 0 {
            return Err(Error::InvalidArgument {
                verb: "ibv_advise_mr",
                reason: "an empty range cannot be advised".into(),
            });
        }
        check_advisable(0, self.access, advice)?;
        require_odp(self.pd.context(), true)?;
        let mut sges = Vec::new();
        push_sges(&mut sges, addr, len, self.lkey());
        self.pd.advise_sges(advice, flags, &mut sges)
    }
}

impl Drop for ImplicitOdpRegion {
    fn drop(&mut self) {
        // SAFETY: registered by reg_implicit_odp_unchecked, deregistered once.
        let rc = unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
        if rc != 0 {
            crate::error::teardown_failed(format_args!(
                "ibv_dereg_mr of an implicit on-demand region on {} failed: errno {rc}",
                self.pd.context().name()
            ));
        }
    }
}

impl fmt::Debug for ImplicitOdpRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImplicitOdpRegion")
            .field("device", &self.pd.context().name())
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .field("access", &self.access)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advice_round_trips() {
        for a in [
            MrAdvice::Prefetch,
            MrAdvice::PrefetchWrite,
            MrAdvice::PrefetchNoFault,
        ] {
            assert_eq!(MrAdvice::from_raw(a.to_raw()), a);
        }
        assert_eq!(MrAdvice::from_raw(7), MrAdvice::Unknown(7));
    }

    #[test]
    fn large_ranges_are_cut_into_entries() {
        let mut v = Vec::new();
        push_sges(&mut v, 0x1000, 5 << 30, 9);
        let lens: Vec<u32> = v.iter().map(|s| s.length).collect();
        assert_eq!(lens, [1 << 31, 1 << 31, 1 << 30]);
        assert_eq!(v[1].addr, 0x1000 + (1 << 31));
        assert!(v.iter().all(|s| s.lkey == 9));
        v.clear();
        push_sges(&mut v, 0, 10, 1);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].length, 10);
    }

    #[test]
    fn advisable_regions() {
        let odp = AccessFlags::ON_DEMAND;
        assert!(check_advisable(0, odp, MrAdvice::Prefetch).is_ok());
        let e = check_advisable(2, AccessFlags::LOCAL_WRITE, MrAdvice::Prefetch).unwrap_err();
        assert!(
            e.to_string().contains("region 2 is not an on-demand"),
            "{e}"
        );
        let e = check_advisable(0, odp, MrAdvice::PrefetchWrite).unwrap_err();
        assert!(e.to_string().contains("LOCAL_WRITE"), "{e}");
        assert!(
            check_advisable(0, odp | AccessFlags::LOCAL_WRITE, MrAdvice::PrefetchWrite).is_ok()
        );
    }
}
