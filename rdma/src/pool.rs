//! A registered buffer pool: fixed-size slots carved from one region.

use std::fmt;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::{AccessFlags, MemoryRegion, ProtectionDomain};

struct PoolInner {
    free: Mutex<Vec<MemoryRegion>>,
    slot_len: usize,
    slots: usize,
    /// The registration the slots are pieces of: its lkey and first byte.
    lkey: u32,
    base: u64,
}

/// Fixed-size slots carved from one registered region: taken and given back
/// without a system call (a lock that is only contended, never slept on,
/// when threads share the pool), and usable with safe posting: a slot is a
/// [`MemoryRegion`] piece, posted by value and back with its completion.
///
/// ```no_run
/// # fn f(pd: &rdma::ProtectionDomain, qp: &mut rdma::QueuePair,
/// #      cq: &rdma::CompletionQueue) -> rdma::Result<()> {
/// let pool = rdma::BufferPool::new(pd, 4096, 64, rdma::AccessFlags::LOCAL_WRITE)?;
/// let slot = pool.take().expect("a free slot");
/// qp.post_recv(1, slot).map_err(rdma::PostError::drop_buffers)?;
/// // ... the completion gives the slot back:
/// let mut c = loop {
///     if let Some(c) = cq.poll_one()? {
///         break c.ok()?;
///     }
/// };
/// let slot = c.take_buffers().into_one().expect("the receive's slot");
/// pool.put(slot).expect("a slot of this pool");
/// # Ok(()) }
/// ```
///
/// A cheap `Clone` handle. The registration lives while any slot does,
/// in the pool or out of it (a slot in flight keeps it registered).
#[derive(Clone)]
pub struct BufferPool {
    inner: Arc<PoolInner>,
}

impl BufferPool {
    /// Registers `slot_len * slots` zeroed bytes on `pd` with `access`, cut
    /// into `slots` slots of `slot_len` bytes, all free.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero `slot_len` or `slots`, or a
    /// size that overflows; as [`ProtectionDomain::alloc_mr`].
    pub fn new(
        pd: &ProtectionDomain,
        slot_len: usize,
        slots: usize,
        access: AccessFlags,
    ) -> Result<BufferPool> {
        let total = slot_len
            .checked_mul(slots)
            .filter(|&t| t > 0)
            .ok_or_else(|| Error::InvalidArgument {
                verb: "BufferPool::new",
                reason: format!(
                    "{slots} slots of {slot_len} bytes: need a non-zero size that fits"
                ),
            })?;
        let region = pd.alloc_mr(total, access)?;
        let (lkey, base) = (region.lkey(), region.addr());
        let mut free = region.chunks(slot_len)?;
        // Taken from the end: the first slot first.
        free.reverse();
        Ok(BufferPool {
            inner: Arc::new(PoolInner {
                free: Mutex::new(free),
                slot_len,
                slots,
                lkey,
                base,
            }),
        })
    }

    fn free(&self) -> std::sync::MutexGuard<'_, Vec<MemoryRegion>> {
        // Nothing panics while holding it.
        self.inner.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a free slot, or `None` when every slot is out.
    pub fn take(&self) -> Option<MemoryRegion> {
        self.free().pop()
    }

    /// Gives a slot back.
    ///
    /// # Errors
    /// Gives `slot` back unchanged when it is not a whole slot of this pool
    /// (another registration, or a piece split off a slot).
    pub fn put(&self, slot: MemoryRegion) -> std::result::Result<(), MemoryRegion> {
        if !self.owns(&slot) {
            return Err(slot);
        }
        self.free().push(slot);
        Ok(())
    }

    /// Whether `region` is a whole slot of this pool.
    pub fn owns(&self, region: &MemoryRegion) -> bool {
        let i = &self.inner;
        let Some(offset) = region.addr().checked_sub(i.base) else {
            return false;
        };
        let slot_len = i.slot_len as u64;
        region.lkey() == i.lkey
            && region.len() == i.slot_len
            && offset % slot_len == 0
            && offset / slot_len < i.slots as u64
    }

    /// Free slots now.
    pub fn available(&self) -> usize {
        self.free().len()
    }

    /// The number of slots.
    pub fn slots(&self) -> usize {
        self.inner.slots
    }

    /// The length of a slot.
    pub fn slot_len(&self) -> usize {
        self.inner.slot_len
    }
}

impl fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferPool")
            .field("slot_len", &self.inner.slot_len)
            .field("slots", &self.inner.slots)
            .field("available", &self.available())
            .finish()
    }
}
