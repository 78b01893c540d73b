//! The bytes of a registration ([`Memory`]: where they are and who frees
//! them), and [`Buffer`], what a deregistered region gives back. Pure Rust,
//! no verbs: its unit tests (these and the atomic copies' of `copy.rs`)
//! run under Miri.

use std::alloc::Layout;
use std::fmt;
use std::ptr::NonNull;

use super::copy::{copy_from_shared, copy_to_shared};
use crate::error::{check_errno_ret, Result};
#[cfg(doc)]
use crate::{MemoryRegion, ProtectionDomain};

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
pub(super) struct Memory {
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
    pub(super) fn alloc_zeroed(layout: Layout) -> Option<Memory> {
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
    pub(super) fn from_box(buf: Box<[u8]>) -> Option<Memory> {
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
    pub(super) unsafe fn foreign(base: NonNull<u8>, len: usize) -> Memory {
        Memory {
            base,
            len,
            owner: Owner::Foreign,
        }
    }

    /// True for memory this crate does not own (registered with
    /// `reg_mr_raw`, or leaked): it is the caller's, or nobody's.
    pub(super) fn is_foreign(&self) -> bool {
        matches!(self.owner, Owner::Foreign)
    }

    /// Gives up the memory without freeing it (the device may still reach
    /// it).
    pub(super) fn leak(&mut self) {
        self.owner = Owner::Foreign;
    }

    /// The first byte.
    pub(super) fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// The length in bytes.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The byte at `offset`; in bounds (or one past the end) for
    /// `offset <= len()`. Wrapping arithmetic: computing it is never UB, only
    /// using an out-of-bounds result would be.
    pub(super) fn ptr_at(&self, offset: usize) -> *mut u8 {
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
    pub(super) unsafe fn read(&self, offset: usize, out: &mut [u8], shared: bool) {
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
    pub(super) unsafe fn write(&self, offset: usize, data: &[u8], shared: bool) {
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

/// The memory of a registration after `ibv_dereg_mr` returned `rc`: given
/// back only when it succeeded; otherwise the device may still reach it, so
/// it is leaked (never freed, never handed out) and the error returned.
pub(super) fn released(rc: std::ffi::c_int, mut memory: Memory) -> Result<Memory> {
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
    pub(super) memory: Memory,
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

#[cfg(test)]
mod tests {
    //! The pointer handling and copies behind regions, without verbs: they
    //! run under Miri (`ci/miri`), whose Stacked/Tree Borrows and data-race
    //! checks are the point.

    use std::sync::Arc;

    use super::super::copy::{UNROLL, WORD};
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
