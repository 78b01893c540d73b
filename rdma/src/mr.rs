//! Memory regions (`ibv_reg_mr(3)`).
//!
//! A [`MemoryRegion`] owns its memory by default and is the unit that safe
//! posting moves into a queue: it cannot be freed, reused or read through a
//! safe reference while the device may touch it, because the work request
//! holds it until its completion gives it back.
//!
//! One registration can be cut into several disjoint regions
//! ([`MemoryRegion::split_off`], [`MemoryRegion::chunks`]); each piece owns its
//! bytes, and the registration (and memory) lives until the last piece is gone.
//!
//! Memory that a peer may write (`REMOTE_WRITE`, `REMOTE_ATOMIC`, or `MW_BIND`,
//! through a window) is shared mutable memory: it is never exposed as a safe
//! `&[u8]`/`&mut [u8]`; use the copying accessors [`MemoryRegion::read_at`] and
//! [`MemoryRegion::write_at`], or the `unsafe` views.

use std::alloc::Layout;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{check_errno_ret, check_ptr, Error, Result};
use crate::{ffi, ProtectionDomain};

bitflags::bitflags! {
    /// Access flags of a memory region or queue pair (`enum ibv_access_flags`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct AccessFlags: u32 {
        /// The local device may write (receive, RDMA READ target, atomics).
        const LOCAL_WRITE = ffi::IBV_ACCESS_LOCAL_WRITE;
        /// Peers may RDMA WRITE into it.
        const REMOTE_WRITE = ffi::IBV_ACCESS_REMOTE_WRITE;
        /// Peers may RDMA READ from it.
        const REMOTE_READ = ffi::IBV_ACCESS_REMOTE_READ;
        /// Peers may run atomics on it.
        const REMOTE_ATOMIC = ffi::IBV_ACCESS_REMOTE_ATOMIC;
        /// Memory windows may be bound to it.
        const MW_BIND = ffi::IBV_ACCESS_MW_BIND;
        /// Zero-based addressing.
        const ZERO_BASED = ffi::IBV_ACCESS_ZERO_BASED;
        /// On-demand paging.
        const ON_DEMAND = ffi::IBV_ACCESS_ON_DEMAND;
        /// Huge pages hint.
        const HUGETLB = ffi::IBV_ACCESS_HUGETLB;
        /// Relaxed ordering (optional: ignored where unsupported).
        const RELAXED_ORDERING = ffi::IBV_ACCESS_RELAXED_ORDERING;
        const _ = !0;
    }
}

impl AccessFlags {
    /// True when a peer may change the memory at any time.
    pub fn remotely_writable(self) -> bool {
        self.intersects(Self::REMOTE_WRITE | Self::REMOTE_ATOMIC | Self::MW_BIND)
    }
}

/// Who owns the bytes of a registration.
enum Memory {
    /// Allocated by this crate with `layout`.
    Owned { ptr: NonNull<u8>, layout: Layout },
    /// A boxed slice handed over by the caller (held, never read: the
    /// region reaches the bytes through `MrInner::base`).
    Boxed(#[allow(dead_code)] Box<[u8]>),
    /// Registered with `reg_mr_raw`: the caller keeps it valid.
    Foreign,
}

impl Drop for Memory {
    fn drop(&mut self) {
        if let Memory::Owned { ptr, layout } = self {
            // SAFETY: allocated with exactly this layout in `alloc_mr`; freed once.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), *layout) };
        }
    }
}

pub(crate) struct MrInner {
    mr: NonNull<ffi::ibv_mr>,
    base: *mut u8,
    access: AccessFlags,
    // Field order: the registration is released in Drop, then the memory is
    // freed, then the PD handle is released.
    memory: Memory,
    pd: ProtectionDomain,
}

// SAFETY: the registration is a kernel object; its memory is only reached
// through MemoryRegion pieces, each of which owns a disjoint range.
unsafe impl Send for MrInner {}
// SAFETY: shared access only reads immutable fields (keys, base, access).
unsafe impl Sync for MrInner {}

impl Drop for MrInner {
    fn drop(&mut self) {
        // SAFETY: every piece and every in-flight work request holds an Arc,
        // so nothing uses the registration any more; deregistered once.
        let rc = unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
        if rc != 0 {
            crate::error::teardown_failed(format_args!(
                "ibv_dereg_mr failed: errno {rc}; leaking its memory"
            ));
            // The device may still reach the memory: never free it.
            std::mem::forget(std::mem::replace(&mut self.memory, Memory::Foreign));
        }
    }
}

/// A registered memory region, or a piece of one (`struct ibv_mr`).
///
/// Unique owner of the bytes `addr()..addr() + len()`. Not `Clone`.
pub struct MemoryRegion {
    inner: Arc<MrInner>,
    offset: usize,
    len: usize,
}

/// What a peer needs to address memory remotely: its address, length and rkey.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteMemory {
    /// Virtual address (or offset for zero-based regions).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// The remote key.
    pub rkey: u32,
}

impl RemoteMemory {
    /// The sub-range `offset..offset + len`, or `None` if it does not fit.
    pub fn slice(&self, offset: u64, len: u64) -> Option<RemoteMemory> {
        (offset.checked_add(len)? <= self.len).then_some(RemoteMemory {
            addr: self.addr + offset,
            len,
            rkey: self.rkey,
        })
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).unwrap_or(4096).max(1)
}

impl ProtectionDomain {
    /// Allocates `len` zeroed, page-aligned bytes and registers them.
    ///
    /// With [`AccessFlags::ON_DEMAND`] the registration pages on demand
    /// (see [`crate::OdpCaps`]); the device's ODP support is checked first.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `len == 0`; [`Error::Unsupported`] for
    /// `ON_DEMAND` on a device without on-demand paging (checked with
    /// `ibv_query_device_ex` before the verb, or `EOPNOTSUPP`/`ENOSYS` from
    /// it); [`Error::Verb`] naming `ibv_reg_mr` (e.g. `EINVAL` for
    /// unsupported access flags, `ENOMEM` past the locked-memory limit).
    pub fn alloc_mr(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion> {
        if len == 0 {
            return Err(Error::InvalidArgument {
                verb: "ibv_reg_mr",
                reason: "a memory region cannot be empty".into(),
            });
        }
        let layout =
            Layout::from_size_align(len, page_size()).map_err(|e| Error::InvalidArgument {
                verb: "ibv_reg_mr",
                reason: format!("{len} bytes cannot be allocated: {e}"),
            })?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(ptr) else {
            std::alloc::handle_alloc_error(layout);
        };
        let memory = Memory::Owned { ptr, layout };
        self.register(ptr.as_ptr(), len, access, memory)
    }

    /// Registers a buffer the region then owns (`ibv_reg_mr(3)`).
    ///
    /// # Errors
    /// As [`ProtectionDomain::alloc_mr`].
    pub fn reg_mr(&self, buf: impl Into<Box<[u8]>>, access: AccessFlags) -> Result<MemoryRegion> {
        let mut buf: Box<[u8]> = buf.into();
        if buf.is_empty() {
            return Err(Error::InvalidArgument {
                verb: "ibv_reg_mr",
                reason: "a memory region cannot be empty".into(),
            });
        }
        let (ptr, len) = (buf.as_mut_ptr(), buf.len());
        self.register(ptr, len, access, Memory::Boxed(buf))
    }

    /// Registers memory this crate does not own (`ibv_reg_mr(3)`).
    ///
    /// # Safety
    /// `addr..addr + len` must be valid, writable memory that stays allocated,
    /// and is not accessed except through the returned region (and the device),
    /// until the region and every piece split from it are dropped and every
    /// work request that used them has completed.
    ///
    /// # Errors
    /// As [`ProtectionDomain::alloc_mr`].
    pub unsafe fn reg_mr_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<MemoryRegion> {
        if len == 0 || addr.is_null() {
            return Err(Error::InvalidArgument {
                verb: "ibv_reg_mr",
                reason: "a memory region needs a non-null address and a non-zero length".into(),
            });
        }
        self.register(addr, len, access, Memory::Foreign)
    }

    fn register(
        &self,
        ptr: *mut u8,
        len: usize,
        access: AccessFlags,
        memory: Memory,
    ) -> Result<MemoryRegion> {
        let flags =
            std::ffi::c_int::try_from(access.bits()).map_err(|_| Error::InvalidArgument {
                verb: "ibv_reg_mr",
                reason: format!("access flags {access:?} do not fit a C int"),
            })?;
        let on_demand = access.contains(AccessFlags::ON_DEMAND);
        if on_demand {
            crate::odp::require_odp(self.context(), false)?;
        }
        // SAFETY: `ptr..ptr+len` is memory that `memory` keeps alive until
        // after deregistration (MrInner's drop order).
        let mr = unsafe { ffi::ibv_reg_mr(self.as_raw(), ptr.cast(), len, flags) };
        let mr = check_ptr(
            "ibv_reg_mr",
            || format!("{} bytes, access {access:?}", len).into(),
            mr,
        )
        .map_err(|e| {
            if on_demand {
                crate::odp::odp_unsupported(
                    e,
                    "on-demand paging (IBV_ACCESS_ON_DEMAND)",
                    self.context(),
                )
            } else {
                e
            }
        })?;
        Ok(MemoryRegion {
            inner: Arc::new(MrInner {
                mr,
                base: ptr,
                access,
                memory,
                pd: self.clone(),
            }),
            offset: 0,
            len,
        })
    }
}

impl MemoryRegion {
    /// The local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: the registration lives as long as `inner`.
        unsafe { (*self.inner.mr.as_ptr()).lkey }
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.inner.mr.as_ptr()).rkey }
    }

    /// The address of this piece's first byte.
    pub fn addr(&self) -> u64 {
        self.inner.base as u64 + self.offset as u64
    }

    /// The length of this piece in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: regions are never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The access flags of the registration.
    pub fn access(&self) -> AccessFlags {
        self.inner.access
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }

    /// The raw `ibv_mr` of the whole registration.
    pub fn as_raw(&self) -> *mut ffi::ibv_mr {
        self.inner.mr.as_ptr()
    }

    /// The registration's kernel handle (`ibv_mr->handle`), which names it
    /// within the command file of its context: what
    /// [`ProtectionDomain::import_mr`] takes. The same for every piece of
    /// one registration.
    pub fn handle(&self) -> u32 {
        // SAFETY: the registration lives as long as `inner`.
        unsafe { (*self.inner.mr.as_ptr()).handle }
    }

    /// Address, length and rkey of this piece, to hand to a peer.
    pub fn remote(&self) -> RemoteMemory {
        RemoteMemory {
            addr: self.addr(),
            len: self.len as u64,
            rkey: self.rkey(),
        }
    }

    /// The scatter/gather entry for `range` of this piece.
    pub(crate) fn sge(&self) -> ffi::ibv_sge {
        ffi::ibv_sge {
            addr: self.addr(),
            length: u32::try_from(self.len).unwrap_or(u32::MAX),
            lkey: self.lkey(),
        }
    }

    /// The registration, to keep it alive (memory windows bound to it).
    pub(crate) fn registration(&self) -> Arc<MrInner> {
        Arc::clone(&self.inner)
    }

    pub(crate) fn same_registration(&self, other: &MemoryRegion) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    fn ptr(&self) -> *mut u8 {
        // SAFETY: offset <= registration length, within the same allocation.
        unsafe { self.inner.base.add(self.offset) }
    }

    fn local_only(&self) -> Result<()> {
        if self.inner.access.remotely_writable() {
            Err(Error::InvalidArgument {
                verb: "MemoryRegion::as_slice",
                reason: format!(
                    "the region grants remote write access ({:?}): a peer may change it \
                     under any reference; use read_at/write_at",
                    self.inner.access
                ),
            })
        } else {
            Ok(())
        }
    }

    /// The bytes, when no peer can write them.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the registration grants remote write,
    /// atomic or memory-window access.
    pub fn as_slice(&self) -> Result<&[u8]> {
        self.local_only()?;
        // SAFETY: this piece owns its range exclusively; no peer can write it
        // and no work request holds it (posting moves the piece).
        Ok(unsafe { std::slice::from_raw_parts(self.ptr(), self.len) })
    }

    /// The bytes, mutably, when no peer can write them.
    ///
    /// # Errors
    /// As [`MemoryRegion::as_slice`].
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8]> {
        self.local_only()?;
        // SAFETY: as in as_slice, and `&mut self` makes the borrow unique.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) })
    }

    /// The bytes, whatever the access flags.
    ///
    /// # Safety
    /// If the region is remotely writable, the caller must know that no peer
    /// writes it (e.g. by protocol) while the returned reference lives.
    pub unsafe fn as_slice_unchecked(&self) -> &[u8] {
        // SAFETY: the range is owned by this piece; the caller rules out peers.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }

    /// The bytes, mutably, whatever the access flags.
    ///
    /// # Safety
    /// As [`MemoryRegion::as_slice_unchecked`].
    pub unsafe fn as_mut_slice_unchecked(&mut self) -> &mut [u8] {
        // SAFETY: as above, unique through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) }
    }

    fn check_range(&self, what: &'static str, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::InvalidArgument {
                verb: what,
                reason: format!(
                    "range {offset}..{} is outside the region of {} bytes",
                    offset.saturating_add(len),
                    self.len
                ),
            }),
        }
    }

    /// Copies bytes out of the region, starting at `offset`. Works for
    /// remotely writable regions: the copy sees whatever the memory holds.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range does not fit.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range("MemoryRegion::read_at", offset, out.len())?;
        // SAFETY: in bounds (checked); raw copy from memory that only this
        // piece and (for remote access) the device reach; `out` is distinct.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr().add(offset), out.as_mut_ptr(), out.len())
        };
        Ok(())
    }

    /// Copies bytes into the region at `offset`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range does not fit.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range("MemoryRegion::write_at", offset, data.len())?;
        // SAFETY: in bounds (checked); `&mut self` owns the range locally.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr().add(offset), data.len()) };
        Ok(())
    }

    /// The whole piece copied into a `Vec`.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len];
        self.read_at(0, &mut v).expect("whole range is in bounds");
        v
    }

    /// Splits the piece in two: `self` keeps `..at`, the result owns `at..`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `0 < at < len()`.
    pub fn split_off(&mut self, at: usize) -> Result<MemoryRegion> {
        if at == 0 || at >= self.len {
            return Err(Error::InvalidArgument {
                verb: "MemoryRegion::split_off",
                reason: format!("cannot split a region of {} bytes at {at}", self.len),
            });
        }
        let tail = MemoryRegion {
            inner: Arc::clone(&self.inner),
            offset: self.offset + at,
            len: self.len - at,
        };
        self.len = at;
        Ok(tail)
    }

    /// Cuts the piece into pieces of `size` bytes (the last may be shorter).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `size == 0`.
    pub fn chunks(self, size: usize) -> Result<Vec<MemoryRegion>> {
        if size == 0 {
            return Err(Error::InvalidArgument {
                verb: "MemoryRegion::chunks",
                reason: "chunk size 0".into(),
            });
        }
        let mut out = Vec::with_capacity(self.len.div_ceil(size));
        let mut rest = self;
        while rest.len > size {
            let tail = rest.split_off(size)?;
            out.push(rest);
            rest = tail;
        }
        out.push(rest);
        Ok(out)
    }

    /// Joins `other` back onto the end of `self` when it is the adjacent piece
    /// of the same registration; otherwise gives it back.
    ///
    /// # Errors
    /// Returns `other` unchanged when the two are not adjacent.
    pub fn unsplit(&mut self, other: MemoryRegion) -> std::result::Result<(), MemoryRegion> {
        if self.same_registration(&other) && self.offset + self.len == other.offset {
            self.len += other.len;
            Ok(())
        } else {
            Err(other)
        }
    }

    /// Changes the access flags of the registration in place
    /// (`ibv_rereg_mr(3)` with `IBV_REREG_MR_CHANGE_ACCESS`). Only the sole
    /// piece of a registration, with no work in flight, can do this.
    ///
    /// # Errors
    /// `EBUSY` when other pieces or work requests hold the registration;
    /// [`Error::Unsupported`] when the provider cannot re-register (rxe,
    /// siw); [`Error::Verb`] naming `ibv_rereg_mr` otherwise (the region is
    /// then unchanged).
    pub fn rereg_access(&mut self, access: AccessFlags) -> Result<()> {
        let device = self.inner.pd.context().name().to_string();
        let Some(inner) = Arc::get_mut(&mut self.inner) else {
            return Err(Error::verb_errno(
                "ibv_rereg_mr",
                "other pieces of the registration or in-flight work requests hold it",
                libc::EBUSY,
            ));
        };
        let flags =
            std::ffi::c_int::try_from(access.bits()).map_err(|_| Error::InvalidArgument {
                verb: "ibv_rereg_mr",
                reason: format!("access flags {access:?} do not fit a C int"),
            })?;
        // SAFETY: the only reference to a live registration; only the access
        // flags change, the memory stays the same.
        let rc = unsafe {
            ffi::ibv_rereg_mr(
                inner.mr.as_ptr(),
                ffi::IBV_REREG_MR_CHANGE_ACCESS as std::ffi::c_int,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                flags,
            )
        };
        if rc != 0 {
            // Returns a negative `ibv_rereg_mr_err_code` and sets errno.
            let errno = crate::error::last_errno();
            if errno == libc::EOPNOTSUPP || errno == libc::ENOSYS {
                return Err(Error::Unsupported {
                    what: "ibv_rereg_mr".into(),
                    device,
                    source: Some(std::io::Error::from_raw_os_error(errno)),
                });
            }
            return Err(Error::verb_errno(
                "ibv_rereg_mr",
                format!("to {access:?} (code {rc})"),
                errno,
            ));
        }
        inner.access = access;
        Ok(())
    }

    /// Deregisters now when this is the last piece, reporting failure.
    ///
    /// # Errors
    /// Gives the region back when other pieces or in-flight work requests still
    /// hold the registration (`EBUSY`); the `ibv_dereg_mr` error otherwise (the
    /// memory is then leaked, never freed while the device may use it).
    pub fn destroy(self) -> std::result::Result<(), (Option<Self>, Error)> {
        let MemoryRegion { inner, offset, len } = self;
        match Arc::try_unwrap(inner) {
            Ok(inner) => {
                let mut inner = std::mem::ManuallyDrop::new(inner);
                // SAFETY: last reference; deregistered once (Drop is skipped).
                let rc = unsafe { ffi::ibv_dereg_mr(inner.mr.as_ptr()) };
                let result = check_errno_ret("ibv_dereg_mr", || "".into(), rc);
                // SAFETY: each field is moved out exactly once and `inner` is
                // never used or dropped again.
                let (memory, pd) =
                    unsafe { (std::ptr::read(&inner.memory), std::ptr::read(&inner.pd)) };
                let _ = &mut inner;
                if result.is_err() {
                    std::mem::forget(memory);
                } else {
                    drop(memory);
                }
                drop(pd);
                result.map_err(|e| (None, e))
            }
            Err(inner) => Err((
                Some(MemoryRegion { inner, offset, len }),
                Error::verb_errno(
                    "ibv_dereg_mr",
                    "other pieces of the registration or in-flight work requests hold it",
                    libc::EBUSY,
                ),
            )),
        }
    }
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .field("access", &self.inner.access)
            .finish()
    }
}
