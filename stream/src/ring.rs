//! The send buffer: registered chunks that outgoing bytes are copied into,
//! cut into pieces that move into the send queue with their RDMA WRITE and
//! come back with its completion, then are joined again.
//!
//! A piece is a [`MemoryRegion`] of its own (a split of its chunk), so the
//! crate's post path owns it while the device reads it: nothing here needs
//! `unsafe`, and a piece lost with a dropped connection is freed with it.
//! Sends complete in order on an RC queue pair, so a chunk's pieces return
//! front to back and join into one region again; the chunk being cut keeps
//! its unused tail open for the next write.

use rdma::{AccessFlags, MemoryRegion, ProtectionDomain};

/// Registered send memory, as chunks and pieces.
#[derive(Debug)]
pub(crate) struct SendRing {
    /// Whole chunks, unused.
    free: Vec<MemoryRegion>,
    /// The unused tail of the chunk being cut.
    open: Option<MemoryRegion>,
    /// Returned pieces and abandoned tails waiting to join into chunks.
    parts: Vec<MemoryRegion>,
    chunk_len: usize,
    /// Bytes not in flight.
    idle: usize,
}

impl SendRing {
    /// `total` bytes (rounded up to whole chunks) in chunks of `chunk_len`.
    pub(crate) fn new(pd: &ProtectionDomain, total: usize, chunk_len: usize) -> rdma::Result<Self> {
        let chunks = total.div_ceil(chunk_len).max(1);
        let free = (0..chunks)
            .map(|_| pd.alloc_mr(chunk_len, AccessFlags::LOCAL_WRITE))
            .collect::<rdma::Result<Vec<_>>>()?;
        Ok(SendRing {
            free,
            open: None,
            parts: Vec::new(),
            chunk_len,
            idle: chunks * chunk_len,
        })
    }

    /// The largest piece [`SendRing::cut`] can hand out now.
    pub(crate) fn largest(&self) -> usize {
        let open = self.open.as_ref().map_or(0, MemoryRegion::len);
        if self.free.is_empty() {
            open
        } else {
            open.max(self.chunk_len)
        }
    }

    /// A piece holding `data` (at most [`SendRing::largest`] bytes of it:
    /// the piece's length says how many), or `None` when no memory is free.
    /// A tail too short for a full piece is left to rejoin its chunk when a
    /// whole free chunk can take the data instead.
    pub(crate) fn cut(&mut self, data: &[u8]) -> Option<MemoryRegion> {
        let want = data.len().min(self.chunk_len);
        if want == 0 {
            return None;
        }
        let open_len = self.open.as_ref().map_or(0, MemoryRegion::len);
        if open_len < want && !self.free.is_empty() {
            if let Some(tail) = self.open.take() {
                self.absorb(tail);
            }
            self.open = self.free.pop();
        }
        let mut piece = self.open.take()?;
        let n = want.min(piece.len());
        if n < piece.len() {
            // Cannot fail: 0 < n < len.
            self.open = piece.split_off(n).ok();
        }
        // A piece of our own registration, with no request in flight: the
        // slice is ours alone.
        piece.as_mut_slice().ok()?[..n].copy_from_slice(&data[..n]);
        self.idle -= n;
        Some(piece)
    }

    /// A piece back from its completion (or a post that failed).
    pub(crate) fn give_back(&mut self, piece: MemoryRegion) {
        self.idle += piece.len();
        self.absorb(piece);
    }

    /// Joins `piece` with whatever adjacent parts there are; a chunk whole
    /// again goes back to the free list.
    fn absorb(&mut self, mut piece: MemoryRegion) {
        loop {
            let mut joined = false;
            let mut i = 0;
            while i < self.parts.len() {
                let part = self.parts.swap_remove(i);
                match piece.unsplit(part) {
                    Ok(()) => joined = true,
                    Err(part) => {
                        // Maybe `piece` follows `part` instead.
                        let mut part = part;
                        match part.unsplit(piece) {
                            Ok(()) => {
                                piece = part;
                                joined = true;
                            }
                            Err(p) => {
                                piece = p;
                                self.parts.push(part);
                                let last = self.parts.len() - 1;
                                self.parts.swap(i, last);
                                i += 1;
                            }
                        }
                    }
                }
            }
            if !joined {
                break;
            }
        }
        if piece.len() == self.chunk_len {
            self.free.push(piece);
        } else {
            self.parts.push(piece);
        }
    }
}
