//! The transport's counters, [`crate::transport::Stats`]: below `chunks`
//! and `transport`, which both count in them (re-exported from
//! `transport`, where callers name it).

use std::sync::atomic::AtomicU64;

/// Counters of what the transport did.
#[derive(Debug, Default)]
pub struct Stats {
    /// Calls sent inline (`RDMA_MSG`, no read chunk).
    pub inline_calls: AtomicU64,
    /// Calls whose payload went through a data-bearing read chunk.
    pub read_chunk_calls: AtomicU64,
    /// Calls sent whole as a position-zero read chunk (`RDMA_NOMSG`).
    pub nomsg_calls: AtomicU64,
    /// Replies that used a write chunk.
    pub write_chunk_replies: AtomicU64,
    /// Replies that came in the reply chunk (`RDMA_NOMSG`).
    pub reply_chunk_replies: AtomicU64,
    /// Replies whose write chunk data was copied straight to the call's
    /// [`Call::data_into`].
    ///
    /// [`Call::data_into`]: crate::transport::Call::data_into
    pub data_placed: AtomicU64,
    /// Replies whose write chunk data was lent to the caller in place
    /// ([`Reply::lent`]).
    ///
    /// [`Reply::lent`]: crate::transport::Reply::lent
    pub data_lent: AtomicU64,
    /// Write or reply chunks read with a plain copy, their window's
    /// invalidation complete (the others take the crate's atomic copy).
    pub plain_chunk_reads: AtomicU64,
    /// Replies to no pending call (late duplicates), dropped.
    pub dropped_replies: AtomicU64,
    /// The most calls ever in flight at once.
    pub max_in_flight: AtomicU64,
    /// The last credit grant seen.
    pub granted: AtomicU64,
    /// Connections made (1 + reconnections).
    pub connects: AtomicU64,
    /// `DEVICE_REMOVAL` events seen (each closed the connection).
    pub device_removals: AtomicU64,
    /// Chunks lent to calls now, registered or bound (0 when nothing is in
    /// flight: a call's chunks are released before its reply is delivered).
    pub chunks_registered: AtomicU64,
    /// Memory registrations made for chunks, ever (`ibv_reg_mr`): pooled
    /// regions, or one per chunk without memory windows.
    pub chunk_registrations: AtomicU64,
    /// Chunks registered, without memory windows, on the kept memory of an
    /// earlier chunk's deregistered registration (neither allocated nor
    /// zeroed), ever; each is also in `chunk_registrations`.
    pub chunk_reuses: AtomicU64,
    /// Memory windows bound for chunks, ever.
    pub chunk_binds: AtomicU64,
    /// Memory windows invalidated when their call ended, ever.
    pub chunk_invalidations: AtomicU64,
    /// `LOCAL_INV` work requests posted for chunks, ever.
    pub local_invalidations: AtomicU64,
    /// Chunks (windows or registrations of their own) the server
    /// invalidated with its reply (the receive completion named their
    /// rkey), ever: none of them took a `LOCAL_INV`.
    pub remote_invalidations: AtomicU64,
    /// Replies whose receive completion named an rkey invalidated that the
    /// call had not lent (their chunks' access was ended as usual).
    pub stray_invalidations: AtomicU64,
    /// Of those, the ones whose rkey no call in flight lent: a window whose
    /// call had already ended (deallocated, or its `LOCAL_INV` posted),
    /// named by a misbehaving server. The reply is delivered and the
    /// connection kept: the window reaches nothing either way.
    pub late_invalidations: AtomicU64,
    /// Windows deallocated and replaced when their call ended, instead of a
    /// `LOCAL_INV` ([`EndAccess::Deallocate`]).
    ///
    /// [`EndAccess::Deallocate`]: crate::transport::EndAccess::Deallocate
    pub fenced_windows: AtomicU64,
    /// Pooled chunk regions alive now (0 without memory windows).
    pub chunk_regions: AtomicU64,
    /// Whether the connection lends chunks through memory windows.
    pub memory_windows: std::sync::atomic::AtomicBool,
    /// Calls sent again after a reconnection.
    pub retransmits: AtomicU64,
    /// Invalidations that did not complete within
    /// [`Options::invalidate_timeout`] (each dropped the connection).
    ///
    /// [`Options::invalidate_timeout`]: crate::transport::Options::invalidate_timeout
    pub lost_invalidations: AtomicU64,
}
