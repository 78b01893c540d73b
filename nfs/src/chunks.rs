//! Chunk memory: the registered regions a call lends the server (read,
//! write and reply chunks), from a pool reused across calls.
//!
//! Two modes, chosen when a connection is made:
//!
//! - **Windows** (the device has type 2 memory windows: rxe, mlx5): a pool of
//!   regions registered once (`LOCAL_WRITE | MW_BIND`, so the region's own
//!   rkey grants no remote access at all), each with a type 2 window. A call
//!   takes a region and binds its window over exactly the bytes it lends,
//!   with exactly the access it needs (`REMOTE_READ` for a read chunk,
//!   `REMOTE_WRITE` for a write or reply chunk): a posted `BIND_MW`, no
//!   system call. Each bind gives the window a **fresh rkey**
//!   (`ibv_inc_rkey`: the key byte moves on), and when the call ends the
//!   window is **invalidated** (a posted `LOCAL_INV`) and the call's reply is
//!   delivered only once that invalidation has completed, as the Linux
//!   client waits for its FRWR invalidations; on soft-RoCE it is
//!   **deallocated** instead and the region gets a new window
//!   ([`ChunkPool::fence`]: a `LOCAL_INV` there may crash the kernel). So after a call ends, its
//!   segment's rkey reaches nothing: a late server access fails with a
//!   remote access error (the key byte wraps after 256 binds of one window,
//!   but every earlier binding was invalidated before the next was made).
//!   If the connection breaks first, the windows bound on it are
//!   deallocated with it (the QP is in error or destroyed, and a type 2
//!   window can only be reached through its QP).
//! - **Per call** (no memory windows: siw): each chunk is registered for its
//!   call and deregistered when the call ends, so each use has a fresh rkey
//!   and nothing outlives the call. A WRITE's payload is moved into its
//!   registration (no copy). The memory of a deregistered chunk is kept
//!   ([`rdma::MemoryRegion::deregister`]) and registered again for a later
//!   chunk of the same size, instead of newly allocated, zeroed memory
//!   (whose zeroing cost about 1 M instructions per MiB read on siw). It is
//!   kept only once `ibv_dereg_mr` has succeeded, so no key the server was
//!   given reaches it while it waits, and the call's data was copied out
//!   of it before, or lent to the caller and given back ([`LentData`]):
//!   the memory is never the caller's while a key reaches it, and the
//!   server reaches it again only under the next call's fresh rkey. What it held (an
//!   earlier reply's data, or payload sent to the same server) is never
//!   handed to a caller: a reply is read only as far as the server says it
//!   wrote, as with zeroed memory.
//!
//! In both modes a chunk's memory is released (invalidated, or deregistered)
//! when its call ends, whether the server used it or not. A READ's write
//! chunk may then be lent to the caller with the data in it, no copy
//! ([`ChunkPool::lend`], [`LentData`]): out of the pool until the caller
//! drops it.
//!
//! The pool never blocks: [`ChunkPool::can_take`] tells the transport whether
//! a call's chunks are available now; when they are not, the call waits in
//! the queue until an invalidation brings a region back.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};

use rdma::{AccessFlags, Buffer, MemoryRegion, MemoryWindow, MwType, ProtectionDomain, QueuePair};

use crate::error::Error;
use crate::rpcrdma::Segment;
use crate::stats::Stats;

/// What to put in a chunk.
pub(crate) enum Fill<'a> {
    /// Nothing: memory for the server to write (zeroed when new; kept
    /// memory of an earlier chunk as it was left, see [`crate::chunks`]).
    Zero,
    /// This buffer, moved into a registration of its own where there is
    /// one (copied into a pooled region).
    Move(Vec<u8>),
    /// These pieces, one after another.
    Pieces(&'a [&'a [u8]]),
}

/// The smallest pooled region.
const MIN_REGION: usize = 64 << 10;
/// The largest pooled region: in window mode a larger chunk gets a window
/// over a region of its own, deregistered when its call ends (still a
/// window: a server that invalidates the call's one rkey with its reply
/// must find a window or a fast-registered key, and a plain registration's
/// rkey is neither: rxe's `rxe_invalidate_mr` refuses every MR but a
/// fast-registration one, read in its source, not provoked).
pub(crate) const MAX_REGION: usize = 4 << 20;

/// A pooled region and its window.
pub(crate) struct Region {
    // The window before the region (field order = drop order): a bound
    // window holds the region's registration anyway.
    mw: MemoryWindow,
    mr: MemoryRegion,
    /// The bytes from the start that may hold an earlier call's data (the
    /// most any call lent): zeroed before the region is lent for the server
    /// to write, so that bytes a server says it wrote and did not read as
    /// zeros, never as another call's.
    dirty: usize,
}

/// Memory lent to one call.
pub(crate) enum Chunk {
    /// A pooled region, its window bound to `len` bytes under `rkey`.
    Bound { region: Region, len: usize },
    /// A registration of its own, deregistered when dropped.
    Own(MemoryRegion),
}

impl Chunk {
    /// What the server is told.
    pub(crate) fn segment(&self) -> Segment {
        match self {
            Chunk::Bound { region, len } => Segment {
                handle: region.mw.rkey(),
                length: u32::try_from(*len).unwrap_or(u32::MAX),
                offset: region.mr.addr(),
            },
            Chunk::Own(mr) => Segment {
                handle: mr.rkey(),
                length: u32::try_from(mr.len()).unwrap_or(u32::MAX),
                offset: mr.addr(),
            },
        }
    }

    /// The bytes lent.
    pub(crate) fn len(&self) -> usize {
        match self {
            Chunk::Bound { len, .. } => *len,
            Chunk::Own(mr) => mr.len(),
        }
    }

    /// Copies `out.len()` bytes from the start of the chunk, with the
    /// crate's atomic copy (the server may still reach the memory: an own
    /// registration lives until the chunk is dropped, and a window is read
    /// here only when its invalidation did not complete).
    pub(crate) fn read(&self, out: &mut [u8]) -> rdma::Result<()> {
        match self {
            Chunk::Bound { region, .. } => region.mr.read_at(0, out),
            Chunk::Own(mr) => mr.read_at(0, out),
        }
    }

    /// The first `len` bytes of the chunk, in place, for a plain copy
    /// (`None` when `len` exceeds what was lent).
    ///
    /// # Safety
    /// The caller must know that no peer can reach the chunk any more:
    /// - a pooled region: the successful completion of a `LOCAL_INV` of its
    ///   window ([`Chunk::window_rkey`]), posted after the call's reply
    ///   arrived, or that window deallocated after it ([`ChunkPool::fence`]),
    ///   or the reply's receive completion reporting the window's
    ///   rkey invalidated by the server (`IBV_WC_WITH_INV`), and the window
    ///   not bound again since: its rkey was the only key to the region the
    ///   server was ever given (the region is registered without remote
    ///   access of its own);
    /// - a registration of its own: the reply's receive completion
    ///   reporting its rkey invalidated by the server. The responder
    ///   invalidates before it makes that completion, and the server's
    ///   RDMA operations on the chunk came before its reply on the same
    ///   connection.
    ///
    /// So no peer writes these bytes while the returned borrow lives.
    pub(crate) unsafe fn invalidated_bytes(&self, len: usize) -> Option<&[u8]> {
        match self {
            Chunk::Bound { region, len: lent } if len <= *lent => {
                // SAFETY: the region's own registration grants no remote
                // access (`LOCAL_WRITE | MW_BIND`), and its window's
                // invalidation completed (caller): no peer writes it while
                // `&self` lives, and no work request holds it.
                let all = unsafe { region.mr.as_slice_unchecked() };
                all.get(..len)
            }
            Chunk::Own(mr) if len <= mr.len() => {
                // SAFETY: the registration's rkey was invalidated by the
                // server before the reply's completion (caller): no peer
                // writes it while `&self` lives, and a chunk is never in a
                // local work request.
                let all = unsafe { mr.as_slice_unchecked() };
                all.get(..len)
            }
            _ => None,
        }
    }

    /// The payload moved into an own registration, taken back out (a call
    /// sent again).
    pub(crate) fn to_vec(&self) -> Vec<u8> {
        match self {
            Chunk::Bound { region, len } => {
                let mut v = vec![0; *len];
                let _ = region.mr.read_at(0, &mut v);
                v
            }
            Chunk::Own(mr) => mr.to_vec(),
        }
    }

    /// The rkey to invalidate when the call ends, for a bound window.
    pub(crate) fn window_rkey(&self) -> Option<u32> {
        match self {
            Chunk::Bound { region, .. } => Some(region.mw.rkey()),
            Chunk::Own(_) => None,
        }
    }
}

/// Why [`ChunkPool::lend`] did not lend a chunk.
pub(crate) enum NotLent {
    /// The chunk, unchanged: read it with a copy.
    Kept(Chunk),
    /// Its deregistration failed and its memory was leaked.
    Lost(rdma::Error),
}

/// Memory a caller holds a reply's data in.
pub(crate) enum LentMemory {
    /// A pooled region (or one of its own), its window invalidated.
    Region(Region),
    /// The memory of a deregistered registration.
    Buffer(Buffer),
}

/// A READ's data where the server wrote it: the write chunk's memory, lent
/// to the caller after no peer can reach it any more (see
/// [`crate::transport::Call::lend_data`]). Reading it copies nothing;
/// dropping it gives the memory back to the connection's chunk pool (or
/// frees it when the connection is gone).
pub struct LentData {
    memory: Option<LentMemory>,
    len: usize,
    home: Weak<Mutex<Vec<LentMemory>>>,
}

impl LentData {
    /// Shortens the data to `len` bytes (no effect when it is not longer).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

impl std::ops::Deref for LentData {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        let all: &[u8] = match &self.memory {
            Some(LentMemory::Region(r)) => {
                // SAFETY: the region was lent by `ChunkPool::lend` only once
                // its window's rkey was invalidated (its `LOCAL_INV`
                // completed, or the server invalidated it with the reply,
                // after all its writes), and its own registration grants no
                // remote access: no peer writes these bytes. The window is
                // bound again only after this value is dropped (the region
                // is out of the pool until then), and no local work request
                // names the region. So nothing writes them while `&self`
                // lives.
                unsafe { r.mr.as_slice_unchecked() }
            }
            Some(LentMemory::Buffer(b)) => b,
            None => &[],
        };
        all.get(..self.len).unwrap_or(all)
    }
}

impl Drop for LentData {
    fn drop(&mut self) {
        let (Some(m), Some(home)) = (self.memory.take(), self.home.upgrade()) else {
            return;
        };
        // A poisoned list: the memory is simply freed.
        let mut list = home.lock();
        if let Ok(v) = &mut list {
            v.push(m);
        }
    }
}

impl fmt::Debug for LentData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LentData({} bytes)", self.len)
    }
}

impl PartialEq for LentData {
    fn eq(&self, other: &LentData) -> bool {
        self[..] == other[..]
    }
}

impl Eq for LentData {}

/// A connection's chunk memory.
pub(crate) struct ChunkPool {
    pd: ProtectionDomain,
    windows: bool,
    /// Regions whose window is invalidated (or never bound).
    free: Vec<Region>,
    /// Pooled regions alive: free, lent, or being invalidated.
    live: usize,
    /// Per-call mode: memory of deregistered chunks (no key reaches it),
    /// at most `cap` buffers of at most [`MAX_REGION`] bytes, newest last.
    spare: Vec<Buffer>,
    cap: usize,
    stats: Arc<Stats>,
    /// Memory lent to callers ([`LentData`]) and given back when they
    /// dropped it: taken in again by the next [`ChunkPool::take`].
    returned: Arc<Mutex<Vec<LentMemory>>>,
}

impl ChunkPool {
    /// A pool on `pd` of at most `cap` regions; window mode when `windows`
    /// is asked for and the device allocates a type 2 window.
    pub(crate) fn new(
        pd: &ProtectionDomain,
        windows: bool,
        cap: usize,
        stats: &Arc<Stats>,
    ) -> ChunkPool {
        let mut pool = ChunkPool {
            pd: pd.clone(),
            windows: false,
            free: Vec::new(),
            live: 0,
            spare: Vec::new(),
            cap: cap.max(3),
            stats: Arc::clone(stats),
            returned: Arc::new(Mutex::new(Vec::new())),
        };
        if windows {
            // One region now: proves the device has type 2 windows (siw
            // does not: per-call registration then).
            if let Ok(r) = pool.region(MIN_REGION) {
                pool.windows = true;
                pool.live = 1;
                pool.free.push(r);
            }
        }
        pool.publish();
        pool
    }

    /// Window mode.
    pub(crate) fn windows(&self) -> bool {
        self.windows
    }

    fn publish(&self) {
        self.stats
            .chunk_regions
            .store(self.live as u64, Ordering::Relaxed);
    }

    fn region(&self, len: usize) -> rdma::Result<Region> {
        self.region_of(len.next_power_of_two().max(MIN_REGION))
    }

    fn region_of(&self, size: usize) -> rdma::Result<Region> {
        let mw = self.pd.alloc_mw(MwType::Type2)?;
        let mr = self
            .pd
            .alloc_mr(size, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)?;
        self.stats
            .chunk_registrations
            .fetch_add(1, Ordering::Relaxed);
        // Fresh memory is zeroed by `alloc_mr`.
        Ok(Region { mw, mr, dirty: 0 })
    }

    /// Whether chunks of these sizes can be had now (always in per-call
    /// mode; in window mode, pooled regions free or still to be made).
    pub(crate) fn can_take(&self, sizes: &[usize]) -> bool {
        if !self.windows {
            return true;
        }
        // Each pooled chunk takes a free region that fits, or one made new
        // (in a free slot, or in place of a free region too small).
        let pooled = sizes.iter().filter(|&&s| s <= MAX_REGION).count();
        pooled <= self.cap - self.live + self.free.len()
    }

    /// Lends `len` bytes with remote `access`, filled first as `fill` says.
    /// Window mode binds a pooled region's window on `qp` with `wr_id` (a
    /// region of its own beyond [`MAX_REGION`]);
    /// per-call mode registers a moved buffer itself (no copy), or the
    /// pieces joined, or `len` bytes for the server to write: each of the
    /// last two on a kept buffer of that size ([`ChunkPool::keep`]) when
    /// there is one, else on new memory.
    pub(crate) fn take(
        &mut self,
        qp: &mut QueuePair,
        wr_id: u64,
        len: usize,
        fill: Fill<'_>,
        access: AccessFlags,
    ) -> Result<Chunk, Error> {
        let what = if access.contains(AccessFlags::REMOTE_READ) {
            "a read chunk"
        } else {
            "a write or reply chunk"
        };
        self.take_back();
        if !self.windows {
            let spare = match &fill {
                Fill::Move(_) => None,
                // Exactly the pieces' length: every byte is overwritten.
                Fill::Pieces(p) => self.spare_of(p.iter().map(|b| b.len()).sum()),
                Fill::Zero => self.spare_of(len),
            };
            let reused = spare.is_some();
            let mr = match (fill, spare) {
                (Fill::Move(d), _) => self.pd.reg_mr(d, access),
                (Fill::Pieces(p), Some(mut buf)) => {
                    let mut rest = &mut buf[..];
                    for b in p {
                        let (dst, tail) = rest.split_at_mut(b.len());
                        dst.copy_from_slice(b);
                        rest = tail;
                    }
                    self.pd.reg_buffer(buf, access)
                }
                (Fill::Pieces(p), None) => self.pd.reg_mr(p.concat(), access),
                // Zeroed: only what the server says it wrote is read, but a
                // server may say it wrote bytes it did not: those must not
                // be an earlier call's.
                (Fill::Zero, Some(mut buf)) => {
                    buf.fill(0);
                    self.pd.reg_buffer(buf, AccessFlags::LOCAL_WRITE | access)
                }
                (Fill::Zero, None) => self.pd.alloc_mr(len, AccessFlags::LOCAL_WRITE | access),
            }
            .map_err(|e| Error::NoBuffers(format!("registering {what}: {e}")))?;
            self.stats
                .chunk_registrations
                .fetch_add(1, Ordering::Relaxed);
            if reused {
                self.stats.chunk_reuses.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(Chunk::Own(mr));
        }
        let free = if len > MAX_REGION {
            // A region of its own, exactly as large (never pooled).
            Some(
                self.region_of(len)
                    .map_err(|e| Error::NoBuffers(format!("registering {what}: {e}")))?,
            )
        } else {
            self.free_fit(len)
        };
        let mut region = match free {
            Some(r) => r,
            None => {
                if self.live >= self.cap {
                    // Make room: a free region too small goes.
                    if self.free.is_empty() {
                        return Err(Error::NoBuffers(format!(
                            "{what}: all {} pooled regions are lent",
                            self.cap
                        )));
                    }
                    self.free.remove(0);
                    self.live -= 1;
                }
                let r = self
                    .region(len)
                    .map_err(|e| Error::NoBuffers(format!("registering {what}: {e}")))?;
                self.live += 1;
                self.publish();
                r
            }
        };
        // The window is not bound yet: no peer reaches the region while it
        // is filled. (The crate's atomic copy, which needs no argument about
        // who else reaches the region: a plain copy, resting on free regions
        // never being bound, was measured no cheaper per byte in the VM;
        // docs/benchmarks-log.md.)
        let mut at = 0;
        let mut fill_one = |region: &mut Region, b: &[u8]| {
            let r = region.mr.write_at(at, b);
            at += b.len();
            r
        };
        let filled = match fill {
            // What an earlier call left where the server may write: zeroed
            // (see `Region::dirty`).
            Fill::Zero => zero(&mut region.mr, len.min(region.dirty)),
            Fill::Move(d) => fill_one(&mut region, &d),
            Fill::Pieces(p) => p.iter().try_for_each(|b| fill_one(&mut region, b)),
        };
        if let Err(e) = filled {
            self.unbound(region);
            return Err(Error::Permanent(format!("{what}: {e}")));
        }
        region.dirty = region.dirty.max(len);
        match qp.bind_mw(wr_id, &mut region.mw, &region.mr, 0, len, access) {
            Ok(_) => {
                self.stats.chunk_binds.fetch_add(1, Ordering::Relaxed);
                Ok(Chunk::Bound { region, len })
            }
            Err(e) => {
                // Never bound: still free.
                self.unbound(region);
                Err(Error::NotConnected(format!("binding a memory window: {e}")))
            }
        }
    }

    /// A region whose window is not bound goes back to the free list; one
    /// of its own (larger than [`MAX_REGION`]) is dropped: deregistered.
    fn unbound(&mut self, region: Region) {
        if region.mr.len() <= MAX_REGION {
            self.free.push(region);
        }
    }

    /// A spare buffer of exactly `len` bytes (the newest: still in cache).
    fn spare_of(&mut self, len: usize) -> Option<Buffer> {
        let i = self.spare.iter().rposition(|b| b.len() == len)?;
        Some(self.spare.remove(i))
    }

    /// Per-call mode: an own registration is deregistered, and its memory
    /// kept for a later chunk only when `ibv_dereg_mr` succeeded (the
    /// server's keys reach it no more). A registration still held elsewhere
    /// is dropped (deregistered when the last holder goes); a failed
    /// deregistration leaks the memory inside the rdma crate.
    fn keep(&mut self, mr: MemoryRegion) {
        if mr.len() > MAX_REGION {
            return;
        }
        if let Ok(buf) = mr.deregister() {
            if self.spare.len() >= self.cap {
                self.spare.remove(0);
            }
            self.spare.push(buf);
        }
    }

    fn free_fit(&mut self, len: usize) -> Option<Region> {
        let i = (0..self.free.len())
            .filter(|&i| self.free[i].mr.len() >= len)
            .min_by_key(|&i| self.free[i].mr.len())?;
        Some(self.free.swap_remove(i))
    }

    /// A chunk whose window was invalidated comes back (an own
    /// registration is deregistered, its memory kept: [`ChunkPool::keep`]).
    pub(crate) fn put(&mut self, chunk: Chunk) {
        match chunk {
            Chunk::Bound { region, .. } => {
                self.stats
                    .chunk_invalidations
                    .fetch_add(1, Ordering::Relaxed);
                self.unbound(region);
            }
            Chunk::Own(mr) => self.keep(mr),
        }
    }

    /// Lends a write chunk's first `len` bytes, the data the server wrote,
    /// to the caller in place: no copy. [`NotLent::Kept`] (the chunk given
    /// back as it was, to be read with a copy and put back as usual) when
    /// `len` exceeds what was lent, when `invalidated` is false for a
    /// window, or when an own registration's deregistration failed and gave
    /// it back; [`NotLent::Lost`] when the deregistration failed and the
    /// `rdma` crate leaked the memory (the data is lost with it).
    ///
    /// What makes the shared borrow [`LentData`] gives sound is that no
    /// peer can write the bytes while it lives, nor can this process's
    /// device:
    /// - a window ([`Chunk::Bound`]): `invalidated` says its rkey was
    ///   invalidated after the reply came: the successful completion of its
    ///   `LOCAL_INV`, or its deallocation ([`ChunkPool::fence`]: the region
    ///   now has a new window, never bound), or the reply's receive completion reporting it
    ///   invalidated by the server (who did all its RDMA writes into it
    ///   before that send, on the same connection). That rkey was the only
    ///   key to the region the server was ever given: the region's own
    ///   registration has no remote access (`LOCAL_WRITE | MW_BIND`).
    ///   While lent, the region is out of the pool (not counted among its
    ///   live regions), so its window is not bound again until the caller
    ///   drops the data and the pool takes it back, unbound;
    /// - an own registration ([`Chunk::Own`]): it is deregistered here
    ///   (`ibv_dereg_mr` succeeded): no key reaches the memory any more,
    ///   and the caller gets plain memory ([`rdma::Buffer`]).
    ///
    /// In both cases no local work request names the memory: a chunk is
    /// only ever lent to the server, and the bind that exposed a window
    /// completed before the call's send (one send queue, in order).
    pub(crate) fn lend(
        &mut self,
        chunk: Chunk,
        len: usize,
        invalidated: bool,
    ) -> Result<LentData, NotLent> {
        let home = Arc::downgrade(&self.returned);
        match chunk {
            Chunk::Bound { region, len: lent } if invalidated && len <= lent => {
                self.stats
                    .chunk_invalidations
                    .fetch_add(1, Ordering::Relaxed);
                if region.mr.len() <= MAX_REGION {
                    // Out of the pool while lent: a new region may be made
                    // in its place, and it comes back only if there is room.
                    self.live -= 1;
                    self.publish();
                }
                Ok(LentData {
                    memory: Some(LentMemory::Region(region)),
                    len,
                    home,
                })
            }
            Chunk::Own(mr) if len <= mr.len() => match mr.deregister() {
                Ok(buf) => Ok(LentData {
                    memory: Some(LentMemory::Buffer(buf)),
                    len,
                    home,
                }),
                Err((Some(mr), _)) => Err(NotLent::Kept(Chunk::Own(mr))),
                Err((None, e)) => Err(NotLent::Lost(e)),
            },
            other => Err(NotLent::Kept(other)),
        }
    }

    /// Takes in the memory callers gave back: a region (unbound; its window
    /// was invalidated before it was lent) becomes free again if the pool
    /// has room for it, a buffer becomes spare memory. Never waits: when
    /// another thread holds the list, what it holds waits for the next call.
    fn take_back(&mut self) {
        let back = match self.returned.try_lock() {
            Ok(mut v) if !v.is_empty() => std::mem::take(&mut *v),
            _ => return,
        };
        for m in back {
            match m {
                LentMemory::Region(r) if self.windows && r.mr.len() <= MAX_REGION => {
                    if self.live < self.cap {
                        self.live += 1;
                        self.free.push(r);
                    }
                }
                LentMemory::Region(_) => {}
                LentMemory::Buffer(b) if !self.windows && b.len() <= MAX_REGION => {
                    if self.spare.len() >= self.cap {
                        self.spare.remove(0);
                    }
                    self.spare.push(b);
                }
                LentMemory::Buffer(_) => {}
            }
        }
        self.publish();
    }

    /// Puts a window out of reach without a work request: the window is
    /// deallocated (`ibv_dealloc_mw` returns once its rkey resolves to
    /// nothing: a server's later access or invalidation naming it fails)
    /// and the region gets a new, unbound one, so the chunk goes back to
    /// the pool as after a `LOCAL_INV`. The caller makes sure that no bind
    /// of the window is still unresolved (a bind in flight holds the window,
    /// which would then be deallocated only when it completes). An own
    /// registration is left as it is (deregistered when it goes back).
    ///
    /// What this is for: Linux 6.1's rxe (`rxe_mw.c`) lets a `LOCAL_INV`
    /// through to `rxe_do_invalidate_mw` when the window is already
    /// invalidated (the free state passes `rxe_check_invalidate_mw`), which
    /// then dereferences the window's NULL QP and crashes the kernel; a
    /// server's `SEND_WITH_INV` of the window in another reply can come
    /// between the post of a `LOCAL_INV` and its execution. Deallocation
    /// (`rxe_do_dealloc_mw`, or `rxe_mw_cleanup` in later kernels) checks
    /// for NULL, so it is safe whether or not the server invalidated the
    /// window meanwhile.
    ///
    /// # Errors
    /// [`FenceError`]: no new window could be allocated; the chunk is left
    /// as it was (the caller drops the connection, which discards it).
    pub(crate) fn fence(&mut self, chunk: &mut Chunk) -> Result<(), FenceError> {
        let Chunk::Bound { region, .. } = chunk else {
            return Ok(());
        };
        match self.pd.alloc_mw(MwType::Type2) {
            Ok(new) => {
                // Dropping the old handle deallocates it (nothing else
                // holds it: see above).
                drop(std::mem::replace(&mut region.mw, new));
                Ok(())
            }
            Err(e) => Err(FenceError(e)),
        }
    }

    /// A chunk of a call still in flight when its connection broke, taken
    /// off its window while the QP still exists: the window is deallocated
    /// now, and the region stays, unbound, as a registration of its own
    /// (without remote access) for what the call may still need of it (a
    /// payload to send again). rxe holds a reference to the QP from every
    /// type 2 window bound on it: a QP destroyed first waits for them, warns
    /// (`__rxe_cleanup` from `rxe_destroy_qp`, seen in the VM on Linux 6.1)
    /// and goes on without them, and the windows' later deallocation then
    /// drops references to a destroyed QP. The connection's pool forgets the
    /// region (the pool goes with the connection).
    pub(crate) fn unbind_for_loss(&mut self, chunk: Chunk) -> Chunk {
        match chunk {
            Chunk::Bound { region, .. } => {
                if region.mr.len() <= MAX_REGION {
                    self.live -= 1;
                    self.publish();
                }
                let Region { mw, mr, .. } = region;
                drop(mw);
                Chunk::Own(mr)
            }
            own => own,
        }
    }

    /// A chunk that cannot be invalidated (its connection broke): its
    /// window is deallocated with it, and the pool forgets the region.
    pub(crate) fn discard(&mut self, chunk: Chunk) {
        if let Chunk::Bound { region, .. } = &chunk {
            // A region of its own was never counted among the pooled ones.
            if region.mr.len() <= MAX_REGION {
                self.live -= 1;
                self.publish();
            }
        }
        drop(chunk);
    }
}

/// Why [`ChunkPool::fence`] failed: the window to take the place of the
/// one to deallocate could not be allocated (`ibv_alloc_mw`'s error).
#[derive(Debug)]
pub(crate) struct FenceError(rdma::Error);

impl std::fmt::Display for FenceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ibv_alloc_mw, for a window in place of one to deallocate: {}",
            self.0
        )
    }
}

// The cause is part of the message (the engine keeps the message alone, as
// why the connection was dropped), so it is not also given as `source`.
impl std::error::Error for FenceError {}

/// Zeroes the first `len` bytes of `mr` (not bound: nobody else reaches it)
/// with the crate's copy, a page at a time.
fn zero(mr: &mut MemoryRegion, len: usize) -> rdma::Result<()> {
    static ZEROS: [u8; 4096] = [0; 4096];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(ZEROS.len());
        mr.write_at(at, &ZEROS[..n])?;
        at += n;
    }
    Ok(())
}

impl Drop for ChunkPool {
    fn drop(&mut self) {
        self.stats.chunk_regions.store(0, Ordering::Relaxed);
    }
}
