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
//!
//! The folder follows the seams of a region: [`AccessFlags`] here;
//! `region.rs` the [`MemoryRegion`] type, its registration and its pieces;
//! `memory.rs` the bytes a registration owns (and [`Buffer`], what is left
//! of them after deregistration); `copy.rs` the atomic copies that read and
//! write memory a peer may change. [`RemoteMemory`], what a peer is told of
//! a region, lives in `remote.rs` with its wire encoding.

mod copy;
mod memory;
mod region;

use crate::ffi;

pub use memory::Buffer;
pub use region::MemoryRegion;
pub(crate) use region::MrInner;
// Re-exported where it was defined, so `crate::mr::RemoteMemory` keeps working.
pub use crate::remote::RemoteMemory;

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
