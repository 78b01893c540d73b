//! Where a resolution puts what it finds: a [`Sink`] is one polled
//! completion being resolved (a [`Completion`], which keeps the memory of
//! its requests in itself, or a [`Compact`] entry of
//! [`crate::WorkCompletion`]s, whose memory goes to a list beside), and a
//! [`Batch`] one poll's worth of them, resolved together under the
//! registry's lock.

use super::Later;
use crate::ffi;
use crate::wc::{Completion, WcStatus};
use crate::wr::WrBuffers;

/// Where a resolution puts what it finds for one polled completion: the
/// caller's `wr_id` in place of ours, and the memory of the requests the
/// completion finishes. A [`Completion`] keeps that memory in itself; the
/// compact form ([`crate::WorkCompletion`]) appends it to a list beside.
pub(crate) trait Sink {
    /// The completion's `wr_id` (ours, for a safe post).
    fn id(&self) -> u64;
    /// Whether the completion's status is success.
    fn ok(&self) -> bool;
    fn set_id(&mut self, wr_id: u64);
    /// The memory of the completion's own request (not `None`'s: quiet
    /// requests never get here).
    fn own(&mut self, buffers: WrBuffers, later: &mut Later);
    /// The memory of an earlier request the completion finishes, oldest
    /// first, with at most `more` to follow (unsignaled sends; receives
    /// whose completions the provider dropped).
    fn earlier(&mut self, wr_id: u64, buffers: WrBuffers, more: u32);
}

impl Sink for Completion {
    #[inline(always)]
    fn id(&self) -> u64 {
        self.wr_id
    }

    #[inline]
    fn ok(&self) -> bool {
        self.status == WcStatus::Success
    }

    #[inline(always)]
    fn set_id(&mut self, wr_id: u64) {
        self.wr_id = wr_id;
    }

    #[inline(always)]
    fn own(&mut self, buffers: WrBuffers, later: &mut Later) {
        // `self` comes without memory from every poll (a test here, where an
        // assignment would run the drop glue of the old value under the
        // lock); anything else goes to `later`.
        let old = std::mem::replace(&mut self.buffers, buffers);
        if !matches!(old, WrBuffers::None) {
            later.keep_memory(old);
        }
    }

    #[inline]
    fn earlier(&mut self, wr_id: u64, buffers: WrBuffers, more: u32) {
        if self.unsignaled.capacity() == 0 {
            self.unsignaled.reserve(more as usize + 1);
        }
        self.unsignaled.push((wr_id, buffers));
    }
}

/// A compact completion being resolved: the provider's entry, and the list
/// the memory of the requests it finishes is appended to.
pub(crate) struct Compact<'a> {
    pub wc: &'a mut ffi::ibv_wc,
    pub memory: &'a mut Vec<(u64, WrBuffers)>,
}

impl Sink for Compact<'_> {
    #[inline(always)]
    fn id(&self) -> u64 {
        self.wc.wr_id
    }

    #[inline]
    fn ok(&self) -> bool {
        self.wc.status == ffi::IBV_WC_SUCCESS
    }

    #[inline(always)]
    fn set_id(&mut self, wr_id: u64) {
        self.wc.wr_id = wr_id;
    }

    #[inline]
    fn own(&mut self, buffers: WrBuffers, _later: &mut Later) {
        if !matches!(buffers, WrBuffers::None) {
            self.memory.push((self.wc.wr_id, buffers));
        }
    }

    #[inline]
    fn earlier(&mut self, wr_id: u64, buffers: WrBuffers, _more: u32) {
        self.memory.push((wr_id, buffers));
    }
}

/// One poll's completions, resolved together by
/// [`Resolver::attach_all`](registry::Resolver::attach_all): each read by
/// index and resolved as a [`Sink`].
pub(crate) trait Batch {
    type Item<'b>: Sink
    where
        Self: 'b;
    fn len(&self) -> usize;
    /// The `wr_id` of completion `i` (< `len`).
    fn id(&self, i: usize) -> u64;
    fn item(&mut self, i: usize) -> Self::Item<'_>;
}

impl Batch for [Completion] {
    type Item<'b> = &'b mut Completion;

    #[inline(always)]
    fn len(&self) -> usize {
        <[Completion]>::len(self)
    }

    #[inline(always)]
    fn id(&self, i: usize) -> u64 {
        self[i].wr_id
    }

    #[inline(always)]
    fn item(&mut self, i: usize) -> &mut Completion {
        &mut self[i]
    }
}

impl<S: Sink + ?Sized> Sink for &mut S {
    #[inline(always)]
    fn id(&self) -> u64 {
        (**self).id()
    }

    #[inline(always)]
    fn ok(&self) -> bool {
        (**self).ok()
    }

    #[inline(always)]
    fn set_id(&mut self, wr_id: u64) {
        (**self).set_id(wr_id);
    }

    #[inline(always)]
    fn own(&mut self, buffers: WrBuffers, later: &mut Later) {
        (**self).own(buffers, later);
    }

    #[inline(always)]
    fn earlier(&mut self, wr_id: u64, buffers: WrBuffers, more: u32) {
        (**self).earlier(wr_id, buffers, more);
    }
}

/// A poll's compact completions, resolved in place, and the list the
/// memory of the requests they finish is appended to.
pub(crate) struct CompactBatch<'a> {
    pub wcs: &'a mut [crate::WorkCompletion],
    pub memory: &'a mut Vec<(u64, WrBuffers)>,
}

impl Batch for CompactBatch<'_> {
    type Item<'b>
        = Compact<'b>
    where
        Self: 'b;

    #[inline(always)]
    fn len(&self) -> usize {
        self.wcs.len()
    }

    #[inline(always)]
    fn id(&self, i: usize) -> u64 {
        self.wcs[i].wr_id()
    }

    #[inline(always)]
    fn item(&mut self, i: usize) -> Compact<'_> {
        Compact {
            wc: self.wcs[i].raw_mut(),
            memory: &mut *self.memory,
        }
    }
}
