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
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::error::{call_ptr, check_errno_ret, Error, Result};
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

/// The bytes of a registration: where they are, and who frees them.
///
/// Pure Rust (no verbs), so that its unit tests run under Miri. The bytes are
/// reached only through `base`, a raw pointer with the provenance of the whole
/// allocation. A caller's `Box` is taken apart with `Box::into_raw` and only
/// rebuilt to free it: a `Box` kept alive next to `base` would be retagged as
/// a unique pointer each time it is passed or returned (into the registration,
/// into its `Arc`), which under Stacked Borrows invalidates pointers derived
/// from it before (and under Tree Borrows makes freeing it after a write
/// through them undefined behaviour).
///
/// The device is outside Rust's memory model; its accesses to remotely
/// writable memory are taken to be atomic ones, as another thread's would
/// have to be, so Rust's own accesses that may race with them are atomic too
/// (`read`/`write` with `shared`).
struct Memory {
    base: NonNull<u8>,
    len: usize,
    owner: Owner,
}

/// Who frees a [`Memory`].
enum Owner {
    /// Allocated by this crate with `std::alloc::alloc_zeroed` and this layout.
    Alloc(Layout),
    /// A caller's boxed slice, given up with `Box::into_raw`: freed by
    /// rebuilding the `Box` with `Box::from_raw`.
    Boxed,
    /// Registered with `reg_mr_raw` (the caller keeps it valid), or leaked
    /// after a failed deregistration: never freed here.
    Foreign,
}

// SAFETY: `Memory` owns an allocation (or stands for the caller's) and has no
// thread affinity; its bytes are only reached through the `unsafe` methods,
// whose callers answer for concurrent access.
unsafe impl Send for Memory {}
// SAFETY: shared access reads only the immutable `base`/`len`; the bytes are
// reached as above.
unsafe impl Sync for Memory {}

impl Memory {
    /// `layout.size()` zeroed bytes aligned to `layout.align()`; `None` for a
    /// zero size.
    fn alloc_zeroed(layout: Layout) -> Option<Memory> {
        if layout.size() == 0 {
            return None;
        }
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(base) = NonNull::new(ptr) else {
            std::alloc::handle_alloc_error(layout);
        };
        Some(Memory {
            base,
            len: layout.size(),
            owner: Owner::Alloc(layout),
        })
    }

    /// Takes over a caller's buffer; `None` (dropping it) when it is empty.
    fn from_box(buf: Box<[u8]>) -> Option<Memory> {
        let len = buf.len();
        if len == 0 {
            return None;
        }
        // From here on the only pointer to the bytes, until `Drop` rebuilds
        // the box from it.
        let raw: *mut [u8] = Box::into_raw(buf);
        // SAFETY: a box's pointer is never null.
        let base = unsafe { NonNull::new_unchecked(raw.cast::<u8>()) };
        Some(Memory {
            base,
            len,
            owner: Owner::Boxed,
        })
    }

    /// Memory this crate does not own: never freed here.
    ///
    /// # Safety
    /// `base..base + len` must stay valid for reads and writes for as long as
    /// the returned value is used to reach it.
    unsafe fn foreign(base: NonNull<u8>, len: usize) -> Memory {
        Memory {
            base,
            len,
            owner: Owner::Foreign,
        }
    }

    /// Gives up the memory without freeing it (the device may still reach
    /// it).
    fn leak(&mut self) {
        self.owner = Owner::Foreign;
    }

    /// The first byte.
    fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// The length in bytes.
    fn len(&self) -> usize {
        self.len
    }

    /// The byte at `offset`; in bounds (or one past the end) for
    /// `offset <= len()`. Wrapping arithmetic: computing it is never UB, only
    /// using an out-of-bounds result would be.
    fn ptr_at(&self, offset: usize) -> *mut u8 {
        self.base().wrapping_add(offset)
    }

    /// Copies `out.len()` bytes at `offset` into `out`. With `shared`, every
    /// byte is read atomically ([`copy_from_shared`]): a concurrent writer
    /// outside Rust (a peer's RDMA WRITE or atomic) is not a data race.
    ///
    /// # Safety
    /// `offset..offset + out.len()` must lie within the memory, the caller
    /// must have the right to read it (it is a range of its piece), `out` must
    /// not overlap it, and nothing may write it concurrently unless `shared`
    /// and the writes are atomic (the device's, or [`copy_to_shared`]'s over
    /// the same range).
    unsafe fn read(&self, offset: usize, out: &mut [u8], shared: bool) {
        let src = self.ptr_at(offset);
        if shared {
            // SAFETY: in bounds and readable (caller); concurrent writes are
            // atomic (caller).
            unsafe { copy_from_shared(src, out) };
        } else {
            // SAFETY: in bounds, readable, not overlapping `out` and not
            // written concurrently (caller).
            unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        }
    }

    /// Copies `data` into the memory at `offset`, atomically per element with
    /// `shared` ([`copy_to_shared`]).
    ///
    /// # Safety
    /// `offset..offset + data.len()` must lie within the memory, the caller
    /// must have the right to write it (its piece, through `&mut`), `data`
    /// must not overlap it, and nothing may access it concurrently unless
    /// `shared` and the accesses are atomic (the device's, or this crate's
    /// `shared` copies).
    #[inline]
    unsafe fn write(&self, offset: usize, data: &[u8], shared: bool) {
        let dst = self.ptr_at(offset);
        if shared {
            // SAFETY: in bounds and writable (caller); concurrent accesses
            // are atomic (caller).
            unsafe { copy_to_shared(data, dst) };
        } else {
            // SAFETY: in bounds, writable, not overlapping `data` and not
            // accessed concurrently (caller).
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        match self.owner {
            Owner::Alloc(layout) => {
                // SAFETY: allocated with exactly this layout in
                // `alloc_zeroed`; freed once (only `Drop` frees).
                unsafe { std::alloc::dealloc(self.base(), layout) };
            }
            Owner::Boxed => {
                let slice = std::ptr::slice_from_raw_parts_mut(self.base(), self.len);
                // SAFETY: `base`/`len` are the slice `from_box` got from
                // `Box::into_raw`, whose allocation nothing else frees; rebuilt
                // once, here.
                drop(unsafe { Box::from_raw(slice) });
            }
            Owner::Foreign => {}
        }
    }
}

/// The size of the atomic elements of [`copy_from_shared`]/[`copy_to_shared`].
const WORD: usize = std::mem::size_of::<usize>();

/// Words per step of the copies' main loop. Four independent loads per
/// iteration: on a 1 MiB read (host, release build, a noisy machine) never
/// slower than one per step, and up to 1.4x faster in the median.
const UNROLL: usize = 4;

/// How `len` bytes starting at `p` split into a byte-wise head (up to the
/// first `WORD`-aligned address), whole aligned words, and a byte-wise tail:
/// `(head, words)`.
fn split_aligned(p: *const u8, len: usize) -> (usize, usize) {
    // `align_offset` may answer `usize::MAX` ("cannot align"): then every
    // byte goes through the head.
    let head = p.align_offset(WORD).min(len);
    (head, (len - head) / WORD)
}

/// The word at `p`, loaded atomically (relaxed).
///
/// # Safety
/// `p` must be `WORD`-aligned and valid for reads of `WORD` bytes, and every
/// racing write to them atomic and of the same size.
#[inline(always)]
unsafe fn load_word(p: *const u8) -> usize {
    // SAFETY: aligned, valid, and accessed atomically by racing writers
    // (caller); `AtomicUsize` has the size and alignment of `usize`.
    unsafe { AtomicUsize::from_ptr(p.cast_mut().cast()).load(Ordering::Relaxed) }
}

/// Stores `w` at `p` atomically (relaxed).
///
/// # Safety
/// As [`load_word`], for writes, and every racing access atomic and of the
/// same size.
#[inline(always)]
unsafe fn store_word(p: *mut u8, w: usize) {
    // SAFETY: as in `load_word`.
    unsafe { AtomicUsize::from_ptr(p.cast()).store(w, Ordering::Relaxed) }
}

/// Copies `dst.len()` bytes from `src` with relaxed atomic loads: bytes up to
/// the first aligned word, then whole words, then bytes. Racing writers
/// outside Rust (the device) are then not a data race; the copy may see a mix
/// of old and new bytes.
///
/// # Safety
/// `src..src + dst.len()` must be valid for reads, not overlap `dst`, and every
/// write to it that may race with this copy must be atomic: the device's, or
/// [`copy_to_shared`] over the same range (so that racing accesses have the
/// same size).
unsafe fn copy_from_shared(src: *const u8, dst: &mut [u8]) {
    let len = dst.len();
    let out = dst.as_mut_ptr();
    let (head, words) = split_aligned(src, len);
    let body_end = head + words * WORD;
    for i in (0..head).chain(body_end..len) {
        // SAFETY: `i < len`: in bounds of `src` (caller) and `out`; an
        // `AtomicU8` has no alignment requirement; atomic against racing
        // writers (caller).
        unsafe { *out.add(i) = AtomicU8::from_ptr(src.add(i).cast_mut()).load(Ordering::Relaxed) };
    }
    let mut i = head;
    while i + UNROLL * WORD <= body_end {
        // SAFETY: `i..i + UNROLL * WORD` is in bounds of both; `src + i` is
        // `WORD`-aligned (`split_aligned`, and `i - head` is a multiple of
        // `WORD`); racing writers are atomic (caller). `out` is written
        // unaligned.
        unsafe {
            let w: [usize; UNROLL] = std::array::from_fn(|k| load_word(src.add(i + k * WORD)));
            for (k, w) in w.into_iter().enumerate() {
                out.add(i + k * WORD).cast::<usize>().write_unaligned(w);
            }
        }
        i += UNROLL * WORD;
    }
    while i < body_end {
        // SAFETY: as above, for one word.
        unsafe {
            out.add(i)
                .cast::<usize>()
                .write_unaligned(load_word(src.add(i)))
        };
        i += WORD;
    }
}

/// Copies `src` to `dst` with relaxed atomic stores, split as in
/// [`copy_from_shared`] (aligned on `dst`).
///
/// # Safety
/// `dst..dst + src.len()` must be valid for writes, not overlap `src`, and
/// every access to it that may race with this copy must be atomic: the
/// device's, or [`copy_from_shared`] over the same range.
#[inline(always)]
unsafe fn copy_to_shared(src: &[u8], dst: *mut u8) {
    if src.len() < WORD {
        // Fewer bytes than a word hold no whole aligned word: byte stores
        // only, the same ones the split below makes, without computing it.
        for (i, &b) in src.iter().enumerate() {
            // SAFETY: `i < src.len()`: in bounds (caller); an `AtomicU8`
            // has no alignment requirement; racing accesses are atomic
            // (caller).
            unsafe { AtomicU8::from_ptr(dst.add(i)).store(b, Ordering::Relaxed) };
        }
        return;
    }
    // SAFETY: the caller's contract, passed on.
    unsafe { copy_words_to_shared(src, dst) }
}

/// [`copy_to_shared`] of a word or more.
///
/// # Safety
/// As [`copy_to_shared`].
unsafe fn copy_words_to_shared(src: &[u8], dst: *mut u8) {
    let len = src.len();
    let from = src.as_ptr();
    let (head, words) = split_aligned(dst, len);
    let body_end = head + words * WORD;
    for i in (0..head).chain(body_end..len) {
        // SAFETY: as in `copy_from_shared`, with the roles swapped.
        unsafe { AtomicU8::from_ptr(dst.add(i)).store(*from.add(i), Ordering::Relaxed) };
    }
    let mut i = head;
    while i + UNROLL * WORD <= body_end {
        // SAFETY: as in `copy_from_shared`: `dst + i` is `WORD`-aligned,
        // `from` is read unaligned.
        unsafe {
            let w: [usize; UNROLL] =
                std::array::from_fn(|k| from.add(i + k * WORD).cast::<usize>().read_unaligned());
            for (k, w) in w.into_iter().enumerate() {
                store_word(dst.add(i + k * WORD), w);
            }
        }
        i += UNROLL * WORD;
    }
    while i < body_end {
        // SAFETY: as above, for one word.
        unsafe { store_word(dst.add(i), from.add(i).cast::<usize>().read_unaligned()) };
        i += WORD;
    }
}

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

/// What a peer needs to address memory remotely: its address, length and rkey.
///
/// [`RemoteMemory::to_bytes`] is its stable wire encoding; with the `serde`
/// feature it is also `Serialize`/`Deserialize` (a struct of its three
/// fields).
///
/// ```no_run
/// # fn f(pd: &rdma::ProtectionDomain) -> rdma::Result<()> {
/// use rdma::{AccessFlags, RemoteMemory};
/// let target = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
/// // Sent to the peer (private data of a connection, a SEND), who writes
/// // into the first half.
/// let wire = target.remote().to_bytes();
/// let remote = RemoteMemory::from_bytes(&wire)?;
/// let half = remote.slice(0, 2048).expect("within the region");
/// # let _ = half;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
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
            crate::odp::require_odp(self.context(), false)?;
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
    /// `Result` cost a latency loop 4 instructions per message (callgrind,
    /// session 24); the error is built out of line.
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
        if matches!(self.inner.memory.owner, Owner::Foreign) {
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

/// The memory of a registration after `ibv_dereg_mr` returned `rc`: given
/// back only when it succeeded; otherwise the device may still reach it, so
/// it is leaked (never freed, never handed out) and the error returned.
fn released(rc: std::ffi::c_int, mut memory: Memory) -> Result<Memory> {
    match check_errno_ret("ibv_dereg_mr", || "".into(), rc) {
        Ok(()) => Ok(memory),
        Err(e) => {
            memory.leak();
            drop(memory);
            Err(e)
        }
    }
}

/// Memory that a [`MemoryRegion`] owned, given back by
/// [`MemoryRegion::deregister`] after its deregistration succeeded: plain,
/// owned, unregistered bytes that no device reaches, as they were left (not
/// zeroed). Read and write it as a slice; register it again with
/// [`ProtectionDomain::reg_buffer`] (no allocation, no zeroing, the same
/// alignment), or drop it to free it.
///
/// ```no_run
/// # fn f(pd: &rdma::ProtectionDomain) -> rdma::Result<()> {
/// use rdma::AccessFlags;
/// let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
/// // The memory back as plain bytes once nothing can reach it.
/// let buf: rdma::Buffer = mr.deregister().map_err(|(_, e)| e)?;
/// assert_eq!(buf.len(), 4096);
/// # Ok(()) }
/// ```
pub struct Buffer {
    memory: Memory,
}

impl std::ops::Deref for Buffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: the buffer owns the whole allocation, `base..base + len`
        // (`Memory` is never empty); `base` has the provenance of all of it;
        // no registration and so no device reaches it (`deregister`), and
        // nothing else holds a pointer to it.
        unsafe { std::slice::from_raw_parts(self.memory.base(), self.memory.len()) }
    }
}

impl std::ops::DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only
        // reference.
        unsafe { std::slice::from_raw_parts_mut(self.memory.base(), self.memory.len()) }
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("addr", &self.memory.base())
            .field("len", &self.memory.len())
            .finish()
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

#[cfg(test)]
mod tests {
    //! The pointer handling and copies behind regions, without verbs: they
    //! run under Miri (`ci/miri`), whose Stacked/Tree Borrows and data-race
    //! checks are the point.

    use super::*;

    /// Stands for `MrInner`: the memory moves into a struct, then into an
    /// `Arc`, as a registration's does.
    struct Holder {
        memory: Memory,
    }

    fn own(memory: Memory) -> Arc<Holder> {
        Arc::new(Holder { memory })
    }

    #[test]
    fn boxed_memory_is_reached_through_its_base_after_the_move() {
        let buf: Box<[u8]> = (0..40u8).collect();
        let held = own(Memory::from_box(buf).unwrap());
        let memory = &held.memory;
        assert_eq!(memory.len(), 40);
        // What the device and the accessors do: go through the base pointer.
        // SAFETY: in bounds; nothing else reaches the memory.
        unsafe {
            memory.base().add(3).write(200);
            memory.ptr_at(39).write(201);
        }
        let mut out = [0; 40];
        for shared in [false, true] {
            // SAFETY: in bounds, no concurrent access.
            unsafe { memory.read(0, &mut out, shared) };
            let mut want: Vec<u8> = (0..40).collect();
            want[3] = 200;
            want[39] = 201;
            assert_eq!(out[..], want[..]);
        }
        // SAFETY: as above.
        unsafe { memory.write(5, b"xyz", true) };
        // SAFETY: in bounds, no concurrent access.
        assert_eq!(unsafe { memory.ptr_at(6).read() }, b'y');
        // Dropping frees the box (Miri reports a leak or a bad free otherwise).
        drop(held);
    }

    #[test]
    fn allocated_memory_is_zeroed_aligned_and_freed() {
        let layout = Layout::from_size_align(100, 64).unwrap();
        let held = own(Memory::alloc_zeroed(layout).unwrap());
        let memory = &held.memory;
        assert_eq!(memory.base().align_offset(64), 0);
        let mut out = [1; 100];
        // SAFETY: in bounds, no concurrent access.
        unsafe { memory.read(0, &mut out, true) };
        assert_eq!(out, [0; 100]);
        // SAFETY: as above.
        unsafe {
            memory.base().add(99).write(9);
            memory.write(0, &[5; 10], false);
            memory.read(90, &mut out[..10], false);
        }
        assert_eq!(out[..10], [0, 0, 0, 0, 0, 0, 0, 0, 0, 9]);
        // SAFETY: in bounds, no concurrent access.
        assert_eq!(unsafe { memory.ptr_at(9).read() }, 5);
    }

    #[test]
    fn shared_writes_shorter_than_a_word_land_byte_by_byte() {
        // Every length below a word (the byte-store path) at every offset
        // of a word, and one word (the split), against a plain model. Fresh
        // memory each time: Miri's weak-memory emulation stops (an internal
        // error, not a finding) at a byte store over an earlier word store.
        let layout = Layout::from_size_align(32, 8).unwrap();
        for len in 0..=WORD {
            for offset in 0..WORD {
                let held = own(Memory::alloc_zeroed(layout).unwrap());
                let memory = &held.memory;
                let data: Vec<u8> = (0..len).map(|i| (len * 16 + offset + i) as u8).collect();
                // SAFETY: `offset + len <= 16`, in bounds; no concurrent access.
                unsafe { memory.write(offset, &data, true) };
                let mut model = [0u8; 32];
                model[offset..offset + len].copy_from_slice(&data);
                let mut out = [0u8; 32];
                // SAFETY: in bounds, no concurrent access.
                unsafe { memory.read(0, &mut out, true) };
                assert_eq!(out, model, "{len} bytes at {offset}");
            }
        }
    }

    #[test]
    fn empty_memory_is_refused() {
        assert!(Memory::from_box(Box::new([])).is_none());
        assert!(Memory::alloc_zeroed(Layout::from_size_align(0, 4096).unwrap()).is_none());
    }

    #[test]
    fn leaked_and_foreign_memory_is_not_freed() {
        let mut memory = Memory::from_box(vec![3u8; 16].into_boxed_slice()).unwrap();
        memory.leak();
        let (base, len) = (memory.base(), memory.len());
        drop(memory);
        // Still allocated: a free in `drop` would make this a use after free
        // and a double free under Miri.
        // SAFETY: the slice `from_box` took apart, not freed.
        let back = unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(base, len)) };
        assert_eq!(*back, [3; 16]);

        let mut backing = [4u8; 8];
        let ptr = NonNull::from(&mut backing).cast::<u8>();
        // SAFETY: `backing` outlives `memory` and is not used meanwhile.
        let memory = unsafe { Memory::foreign(ptr, 8) };
        // SAFETY: in bounds, no concurrent access.
        unsafe { memory.write(1, &[6], true) };
        drop(memory);
        assert_eq!(backing, [4, 6, 4, 4, 4, 4, 4, 4]);
    }

    #[test]
    fn a_buffer_is_the_memory_as_left_and_frees_it() {
        let memory = Memory::from_box((0..32u8).collect()).unwrap();
        // SAFETY: in bounds, no concurrent access.
        unsafe { memory.write(2, &[9, 9], true) };
        let mut buf = Buffer {
            memory: released(0, memory).expect("a successful deregistration"),
        };
        assert_eq!(buf.len(), 32);
        assert_eq!(buf[..5], [0, 1, 9, 9, 4]);
        buf[31] = 7;
        // Moved back into a registration's place: still reached through the
        // base pointer.
        let held = own(buf.memory);
        let mut out = [0; 2];
        // SAFETY: in bounds, no concurrent access.
        unsafe { held.memory.read(30, &mut out, false) };
        assert_eq!(out, [30, 7]);
        let page = Memory::alloc_zeroed(Layout::from_size_align(64, 64).unwrap()).unwrap();
        let buf = Buffer {
            memory: released(0, page).unwrap(),
        };
        assert_eq!(*buf, [0; 64]);
        // Both freed on drop (Miri reports a leak or a bad free otherwise).
    }

    #[test]
    fn a_failed_deregistration_hands_nothing_back_and_frees_nothing() {
        let memory = Memory::from_box(vec![5u8; 16].into_boxed_slice()).unwrap();
        let (base, len) = (memory.base(), memory.len());
        for rc in [libc::EINVAL, -1] {
            let memory = Memory::from_box(vec![6u8; 8].into_boxed_slice()).unwrap();
            let (b, l) = (memory.base(), memory.len());
            assert!(released(rc, memory).is_err(), "rc {rc}");
            // SAFETY: leaked by `released`, not freed: rebuilt once here.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(b, l)) });
        }
        let err = released(libc::EBUSY, memory).map(drop).unwrap_err();
        assert!(err.to_string().contains("ibv_dereg_mr"), "{err}");
        // Still allocated and intact: a free would make this a use after
        // free under Miri.
        // SAFETY: the slice `from_box` took apart, leaked by `released`.
        let back = unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(base, len)) };
        assert_eq!(*back, [5; 16]);
    }

    /// Every start alignment and length up to a few words: head, unrolled
    /// and single words, and tail in every combination, against a plain copy.
    #[test]
    fn atomic_copies_match_plain_copies() {
        let size = (UNROLL + 2) * WORD + 3;
        for offset in 0..=WORD + 1 {
            for len in 0..=size - offset {
                // Fresh memory each time: Miri's weak-memory emulation cannot
                // follow atomic stores of different sizes that partly overlap
                // (it stops with an internal error), even sequential ones.
                let memory = Memory::from_box(vec![0u8; size].into_boxed_slice()).unwrap();
                let data: Vec<u8> = (0..len).map(|i| (i * 7 + offset + len) as u8).collect();
                let mut plain = vec![0; len];
                let mut atomic = vec![0; len];
                // SAFETY: in bounds, no concurrent access.
                unsafe {
                    memory.write(offset, &data, true);
                    memory.read(offset, &mut plain, false);
                    memory.read(offset, &mut atomic, true);
                }
                assert_eq!(plain, data, "write at {offset}, {len} bytes");
                assert_eq!(atomic, data, "read at {offset}, {len} bytes");
            }
        }
    }

    /// A peer writing a remotely writable region while it is read: the
    /// atomic copies make this a race on values (torn reads), not a data race
    /// (which Miri would report).
    #[test]
    fn copy_racing_with_a_writer_is_not_a_data_race() {
        const ROUNDS: u8 = 4;
        // Unaligned start and end: a byte head, an unrolled step and a
        // single word, a byte tail.
        let (offset, len) = (3, 5 + (UNROLL + 1) * WORD + 3);
        let memory = Memory::alloc_zeroed(Layout::from_size_align(64, 64).unwrap()).unwrap();
        let memory = &memory;
        std::thread::scope(|s| {
            s.spawn(move || {
                for round in 1..=ROUNDS {
                    // SAFETY: in bounds; the reader's copy is atomic over the
                    // same range.
                    unsafe { memory.write(offset, &[round; 64][..len], true) };
                }
            });
            for _ in 0..ROUNDS {
                let mut out = vec![0xff; len];
                // SAFETY: in bounds; the racing writes are atomic over the
                // same range.
                unsafe { memory.read(offset, &mut out, true) };
                // Torn at worst: every byte from some round.
                assert!(out.iter().all(|&b| b <= ROUNDS), "{out:?}");
            }
        });
        let mut out = vec![0; len];
        // SAFETY: the writer has been joined.
        unsafe { memory.read(offset, &mut out, false) };
        assert_eq!(out, vec![ROUNDS; len]);
    }
}
