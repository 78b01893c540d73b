//! The [`MemoryRegion`] type: its registration (`ibv_reg_mr(3)`, through
//! [`ProtectionDomain`]), shared by the pieces it is cut into, and what a
//! piece does (keys, copies in and out, splitting, re-registration,
//! deregistration).

use std::alloc::Layout;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use super::memory::{released, Buffer, Memory};
use super::AccessFlags;
use crate::error::{call_ptr, Error, Result};
use crate::remote::RemoteMemory;
use crate::{ffi, ProtectionDomain};

pub(crate) struct MrInner {
    mr: NonNull<ffi::ibv_mr>,
    access: AccessFlags,
    // Field order: the registration is released in Drop, then the memory is
    // freed, then the PD handle is released.
    memory: Memory,
    pd: ProtectionDomain,
}

// SAFETY: the registration is a kernel object; its memory is only reached
// through MemoryRegion pieces, each of which owns a disjoint range.
unsafe impl Send for MrInner {}
// SAFETY: shared access only reads immutable fields (keys, memory's base and
// length, access).
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
            self.memory.leak();
        }
    }
}

/// A registered memory region, or a piece of one (`struct ibv_mr`).
///
/// Unique owner of the bytes `addr()..addr() + len()`. Not `Clone`.
///
/// A region moves into a work request when it is posted and comes back with
/// the request's completion ([`crate::Completion::take_buffers`]), so the
/// device never uses memory Rust could free. A region a peer may write
/// (`REMOTE_WRITE`, `REMOTE_ATOMIC`, `MW_BIND`) gives no `&[u8]`: its bytes
/// can change at any moment, so they are copied in and out.
///
/// # Examples
/// ```no_run
/// use rdma::AccessFlags;
/// # fn main() -> rdma::Result<()> {
/// let ctx = rdma::Context::open("rxe0")?;
/// let pd = ctx.alloc_pd()?;
///
/// // Local memory: plain slices.
/// let mut local = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE)?;
/// local.as_mut_slice()?[..5].copy_from_slice(b"hello");
/// assert_eq!(&local.as_slice()?[..5], b"hello");
///
/// // Memory a peer may write: copies only, and a description for the peer.
/// let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
/// let mut shared = pd.alloc_mr(4096, access)?;
/// assert!(shared.as_slice().is_err());
/// shared.write_at(0, b"ready")?;
/// let mut word = [0; 5];
/// shared.read_at(0, &mut word)?;
/// let remote = shared.remote(); // address, length and rkey
/// let to_send: [u8; 20] = remote.to_bytes();
///
/// // One registration, several pieces: each can be posted on its own.
/// let pieces = local.chunks(16)?;
/// assert_eq!(pieces.len(), 4);
/// # let _ = to_send;
/// # Ok(())
/// # }
/// ```
pub struct MemoryRegion {
    inner: Arc<MrInner>,
    offset: usize,
    len: usize,
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).unwrap_or(4096).max(1)
}

fn empty_region() -> Error {
    Error::InvalidArgument {
        verb: "ibv_reg_mr",
        reason: "a memory region cannot be empty".into(),
    }
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
        let layout =
            Layout::from_size_align(len, page_size()).map_err(|e| Error::InvalidArgument {
                verb: "ibv_reg_mr",
                reason: format!("{len} bytes cannot be allocated: {e}"),
            })?;
        let Some(memory) = Memory::alloc_zeroed(layout) else {
            return Err(empty_region());
        };
        self.register(memory, access)
    }

    /// Registers a buffer the region then owns (`ibv_reg_mr(3)`).
    ///
    /// # Errors
    /// As [`ProtectionDomain::alloc_mr`].
    pub fn reg_mr(&self, buf: impl Into<Box<[u8]>>, access: AccessFlags) -> Result<MemoryRegion> {
        let Some(memory) = Memory::from_box(buf.into()) else {
            return Err(empty_region());
        };
        self.register(memory, access)
    }

    /// Registers the memory of a deregistered region again
    /// (`ibv_reg_mr(3)`), as it is: not zeroed, not copied, with its
    /// alignment; the region owns it, under fresh keys.
    ///
    /// # Errors
    /// As [`ProtectionDomain::alloc_mr`] (the buffer is then freed).
    pub fn reg_buffer(&self, buf: Buffer, access: AccessFlags) -> Result<MemoryRegion> {
        self.register(buf.memory, access)
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
        let Some(addr) = NonNull::new(addr).filter(|_| len != 0) else {
            return Err(Error::InvalidArgument {
                verb: "ibv_reg_mr",
                reason: "a memory region needs a non-null address and a non-zero length".into(),
            });
        };
        // SAFETY: the caller keeps the memory valid while the region (and so
        // `memory`, owned by its registration) lives.
        let memory = unsafe { Memory::foreign(addr, len) };
        self.register(memory, access)
    }

    fn register(&self, memory: Memory, access: AccessFlags) -> Result<MemoryRegion> {
        let (ptr, len) = (memory.base(), memory.len());
        let flags =
            std::ffi::c_int::try_from(access.bits()).map_err(|_| Error::InvalidArgument {
                verb: "ibv_reg_mr",
                reason: format!("access flags {access:?} do not fit a C int"),
            })?;
        let on_demand = access.contains(AccessFlags::ON_DEMAND);
        if on_demand {
            crate::odp_caps::require_odp(self.context(), false)?;
        }
        let mr = call_ptr(
            "ibv_reg_mr",
            || format!("{} bytes, access {access:?}", len).into(),
            || {
                // SAFETY: `ptr..ptr+len` is memory that `memory` keeps alive until
                // after deregistration (MrInner's drop order); the device reaches it
                // through `ptr`, the base pointer every access of the region uses.
                unsafe { ffi::ibv_reg_mr(self.as_raw(), ptr.cast(), len, flags) }
            },
        )
        .map_err(|e| {
            if on_demand {
                crate::odp_caps::odp_unsupported(
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
        self.inner.memory.base() as u64 + self.offset as u64
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

    /// This piece's first byte (`offset + len` never exceeds the
    /// registration's length).
    fn ptr(&self) -> *mut u8 {
        self.inner.memory.ptr_at(self.offset)
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

    /// Whether `offset..offset + len` lies within the piece: two comparisons,
    /// no overflow, inlined whole into [`MemoryRegion::write_racy`], where a
    /// latency loop writes a byte or two per message.
    #[inline(always)]
    fn holds(&self, offset: usize, len: usize) -> bool {
        offset <= self.len && len <= self.len - offset
    }

    fn check_range(&self, what: &'static str, offset: usize, len: usize) -> Result<()> {
        if !self.holds(offset, len) {
            return Err(self.out_of_range(what, offset, len));
        }
        Ok(())
    }

    /// The error of a range outside the piece.
    #[cold]
    fn out_of_range(&self, what: &'static str, offset: usize, len: usize) -> Error {
        Error::InvalidArgument {
            verb: what,
            reason: format!(
                "range {offset}..{} is outside the region of {} bytes",
                offset.saturating_add(len),
                self.len
            ),
        }
    }

    /// Copies bytes out of the region, starting at `offset`. Works for
    /// remotely writable regions: the copy sees whatever the memory holds.
    ///
    /// When the registration is remotely writable
    /// ([`AccessFlags::remotely_writable`]), a peer may write these bytes while
    /// they are copied; the copy then reads each byte (each aligned machine
    /// word) atomically, so a concurrent write is not undefined behaviour, but
    /// `out` may hold a torn value: a mix of old and new bytes. Agree with the
    /// peer (e.g. by a message after its write) on when the bytes are
    /// complete. Other regions are copied with a plain `memcpy`: no one can
    /// write them while `&self` lives.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range does not fit.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range("MemoryRegion::read_at", offset, out.len())?;
        // SAFETY: in bounds (checked) of this piece, which owns its range;
        // `out` is a distinct borrow. A peer's writes (the only ones possible
        // while `&self` lives: local device writes need the piece in a work
        // request) are atomic with respect to Rust, and reach only remotely
        // writable registrations, which take the atomic copy.
        unsafe {
            self.inner.memory.read(
                self.offset + offset,
                out,
                self.inner.access.remotely_writable(),
            )
        };
        Ok(())
    }

    /// Copies bytes into the region at `offset`.
    ///
    /// When the registration is remotely writable, a peer may read or write
    /// these bytes concurrently: the copy writes each byte (each aligned
    /// machine word) atomically, so this is not undefined behaviour, but a
    /// peer writing at the same time may leave a mix of its bytes and `data`,
    /// and a peer reading may see part of `data` only. Other regions are
    /// written with a plain `memcpy`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range does not fit.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range("MemoryRegion::write_at", offset, data.len())?;
        // SAFETY: in bounds (checked) of this piece; `&mut self` makes this
        // the only Rust access to the range; `data` is a distinct borrow. A
        // peer's accesses (atomic with respect to Rust) are only possible on
        // remotely writable registrations, which take the atomic copy (peers
        // with read access only do not write).
        unsafe {
            self.inner.memory.write(
                self.offset + offset,
                data,
                self.inner.access.remotely_writable(),
            )
        };
        Ok(())
    }

    /// [`MemoryRegion::read_at`] with the atomic copy whatever the access
    /// flags: for a region lent to requests in flight
    /// ([`crate::PreparedSend::read_at`], [`crate::PreparedRecv::read_at`]),
    /// which the device may write; `verb` names the caller in errors.
    pub(crate) fn read_racy(
        &self,
        verb: &'static str,
        offset: usize,
        out: &mut [u8],
    ) -> Result<()> {
        self.check_range(verb, offset, out.len())?;
        // SAFETY: in bounds (checked) of this piece, which owns its range;
        // `out` is a distinct borrow; the device's and peers' accesses are
        // atomic with respect to Rust, and so is this copy.
        unsafe { self.inner.memory.read(self.offset + offset, out, true) };
        Ok(())
    }

    /// [`MemoryRegion::write_at`] with the atomic copy whatever the access
    /// flags ([`crate::PreparedSend::write_at`]).
    /// The range is tested here rather than through `check_range`, whose
    /// `Result` adds to every message of a latency loop (callgrind); the
    /// error is built out of line.
    #[inline]
    pub(crate) fn write_racy(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        if !self.holds(offset, data.len()) {
            return Err(self.out_of_range("PreparedSend::write_at", offset, data.len()));
        }
        // SAFETY: in bounds (checked) of this piece; `&mut self` makes this
        // the only Rust access to the range; the device's and peers'
        // accesses are atomic with respect to Rust, and so is this copy.
        unsafe { self.inner.memory.write(self.offset + offset, data, true) };
        Ok(())
    }

    /// The whole piece copied into a `Vec`, as [`MemoryRegion::read_at`]
    /// copies (a concurrent peer write may leave a torn value).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len];
        // SAFETY: the whole piece, as in `read_at`.
        unsafe {
            self.inner
                .memory
                .read(self.offset, &mut v, self.inner.access.remotely_writable())
        };
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
        self.deregister_last().map(drop)
    }

    /// Deregisters the region and gives its memory back, bytes intact, to be
    /// read, reused, or registered again with [`ProtectionDomain::reg_buffer`]
    /// without the zeroing (or allocation) of a new region.
    ///
    /// This must be the last piece of the registration: the [`Buffer`] is the
    /// whole registration's memory (pieces split off and dropped before
    /// included). Once this returns `Ok`, `ibv_dereg_mr` has succeeded, so the
    /// device reaches the memory through no key of this registration any
    /// more, and its work requests are all complete (each held the
    /// registration): the buffer is plain local memory.
    ///
    /// # Errors
    /// - [`Error::InvalidArgument`], the region given back untouched and
    ///   still registered, when its memory is the caller's
    ///   ([`ProtectionDomain::reg_mr_raw`]): it is not this crate's to give.
    /// - `EBUSY` ([`Error::Verb`] naming `ibv_dereg_mr`), the region given
    ///   back still registered, when other pieces, memory windows bound to it,
    ///   or in-flight work requests hold the registration.
    /// - The `ibv_dereg_mr` error otherwise, with no region and **no memory**:
    ///   the device may still reach the memory, so it is leaked, never handed
    ///   back or freed.
    ///
    /// # Examples
    /// ```no_run
    /// use rdma::AccessFlags;
    /// # fn main() -> rdma::Result<()> {
    /// let ctx = rdma::Context::open("siw0")?;
    /// let pd = ctx.alloc_pd()?;
    /// let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    /// let mut mr = pd.alloc_mr(1 << 20, access)?;
    /// mr.write_at(0, b"left from the last use")?;
    /// // ... a peer writes into it with `mr.remote()` ...
    /// let buf = mr.deregister().map_err(|(_, e)| e)?;
    /// assert_eq!(&buf[..4], b"left"); // a plain slice: no peer reaches it
    /// // The same memory, a fresh rkey, not zeroed again.
    /// let again = pd.reg_buffer(buf, access)?;
    /// # let _ = again;
    /// # Ok(())
    /// # }
    /// ```
    pub fn deregister(self) -> std::result::Result<Buffer, (Option<Self>, Error)> {
        if self.inner.memory.is_foreign() {
            return Err((
                Some(self),
                Error::InvalidArgument {
                    verb: "ibv_dereg_mr",
                    reason: "the region's memory was registered with reg_mr_raw and \
                             belongs to the caller: deregister it with destroy"
                        .into(),
                },
            ));
        }
        self.deregister_last().map(|memory| Buffer { memory })
    }

    /// `ibv_dereg_mr` when this is the last piece: the memory, once the
    /// device can no longer reach it.
    fn deregister_last(self) -> std::result::Result<Memory, (Option<Self>, Error)> {
        let MemoryRegion { inner, offset, len } = self;
        match Arc::try_unwrap(inner) {
            Ok(inner) => {
                let mut inner = std::mem::ManuallyDrop::new(inner);
                // SAFETY: last reference (no piece, window or work request
                // holds the registration); deregistered once (Drop is
                // skipped).
                let rc = unsafe { ffi::ibv_dereg_mr(inner.mr.as_ptr()) };
                // SAFETY: each field is moved out exactly once and `inner` is
                // never used or dropped again.
                let (memory, pd) =
                    unsafe { (std::ptr::read(&inner.memory), std::ptr::read(&inner.pd)) };
                let _ = &mut inner;
                let result = released(rc, memory);
                // The PD after the registration, as `MrInner`'s field order.
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
