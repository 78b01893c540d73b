//! TCP stream reassembly, one direction at a time: segments in capture order in, the stream's
//! bytes in sequence order out.
//!
//! A segment at the next expected sequence number is handed on at once; one ahead of a gap is
//! kept (up to [`TcpLimits::max_ahead`] bytes per direction) until the gap fills; one that lies
//! wholly before it is a retransmission and is counted, and one that overlaps it is cut to what
//! is new. When the bytes kept ahead of a gap pass the limit, the gap is given up: the stream
//! continues after it and the consumer is told ([`Chunk::Gap`]) so that it can resynchronise
//! or stop. Offsets are 64-bit counts from the SYN, so sequence numbers may wrap.

use std::collections::BTreeMap;

/// Limits that bound a direction's memory.
#[derive(Clone, Copy, Debug)]
pub struct TcpLimits {
    /// Bytes kept ahead of a gap; beyond it the gap is given up.
    pub max_ahead: usize,
}

impl Default for TcpLimits {
    fn default() -> Self {
        TcpLimits { max_ahead: 4 << 20 }
    }
}

/// What [`Half::push`] hands on, in stream order.
#[derive(Debug, PartialEq, Eq)]
pub enum Chunk<'a> {
    /// Bytes at stream offset `offset` (0 is the byte after the SYN), delivered by frame
    /// `frame`.
    Data {
        /// Offset in the stream.
        offset: u64,
        /// The frame whose segment carried them.
        frame: u64,
        /// The bytes.
        data: &'a [u8],
    },
    /// Bytes the capture does not hold: `len` bytes from `offset` are missing.
    Gap {
        /// Where the missing bytes start.
        offset: u64,
        /// How many.
        len: u64,
    },
}

/// Counters of one direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HalfStats {
    /// Segments wholly before the next expected byte (retransmissions).
    pub retransmitted: u64,
    /// Segments that overlapped bytes already handed on (cut to what was new).
    pub overlapping: u64,
    /// Segments that arrived ahead of a gap.
    pub out_of_order: u64,
    /// Bytes given up (gaps).
    pub lost: u64,
}

/// One direction of a TCP connection.
#[derive(Debug, Default)]
pub struct Half {
    /// Sequence number of stream offset 0; `None` until the SYN (or a first segment) is seen.
    isn: Option<u32>,
    /// Offset of the next byte to hand on.
    next: u64,
    /// Segments ahead of a gap, by offset, each with its frame.
    ahead: BTreeMap<u64, (u64, Vec<u8>)>,
    ahead_bytes: usize,
    /// Whether the stream was seen from its SYN (else offset 0 is wherever the capture began).
    pub from_syn: bool,
    /// Counters.
    pub stats: HalfStats,
}

impl Half {
    /// The offset of the next byte to hand on.
    pub fn next_offset(&self) -> u64 {
        self.next
    }

    /// Bytes kept ahead of a gap.
    pub fn kept(&self) -> usize {
        self.ahead_bytes
    }

    /// The stream offset of sequence number `seq`, relative to the next expected byte (a
    /// segment more than 2 GiB away from it is taken as behind).
    fn offset(&self, isn: u32, seq: u32) -> Option<u64> {
        let rel = seq.wrapping_sub(isn);
        // The 32-bit offset of `next`, and how far `rel` is from it (signed).
        let next32 = self.next as u32;
        let delta = rel.wrapping_sub(next32) as i32;
        self.next.checked_add_signed(i64::from(delta))
    }

    /// Feeds one segment of this direction (frame `frame`); calls `out` with what is now in
    /// order.
    pub fn push(
        &mut self,
        frame: u64,
        seq: u32,
        syn: bool,
        payload: &[u8],
        limits: &TcpLimits,
        out: &mut dyn FnMut(Chunk<'_>),
    ) {
        if syn {
            if self.isn.is_none() {
                self.isn = Some(seq.wrapping_add(1));
                self.from_syn = true;
            }
            // A SYN's payload (TCP Fast Open) is not expected here; it is ignored.
            return;
        }
        let isn = *self.isn.get_or_insert(seq);
        if payload.is_empty() {
            return;
        }
        let Some(off) = self.offset(isn, seq) else {
            self.stats.retransmitted += 1;
            return;
        };
        let end = off + payload.len() as u64;
        if end <= self.next {
            self.stats.retransmitted += 1;
            return;
        }
        if off > self.next {
            self.stats.out_of_order += 1;
            self.keep(off, frame, payload);
            while self.ahead_bytes > limits.max_ahead && !self.ahead.is_empty() {
                self.give_up_gap(out);
            }
            return;
        }
        if off < self.next {
            self.stats.overlapping += 1;
        }
        let skip = usize::try_from(self.next - off).unwrap_or(usize::MAX);
        let new = payload.get(skip..).unwrap_or(&[]);
        out(Chunk::Data {
            offset: self.next,
            frame,
            data: new,
        });
        self.next += new.len() as u64;
        self.drain(out);
    }

    fn keep(&mut self, off: u64, frame: u64, payload: &[u8]) {
        // A segment already kept at the same offset and at least as long: a retransmission.
        if let Some((_, d)) = self.ahead.get(&off) {
            if d.len() >= payload.len() {
                self.stats.retransmitted += 1;
                return;
            }
            self.ahead_bytes -= d.len();
        }
        self.ahead_bytes += payload.len();
        self.ahead.insert(off, (frame, payload.to_vec()));
    }

    /// Hands on the kept segments that the stream has now reached.
    fn drain(&mut self, out: &mut dyn FnMut(Chunk<'_>)) {
        while let Some(entry) = self.ahead.first_entry() {
            let off = *entry.key();
            if off > self.next {
                break;
            }
            let (frame, data) = entry.remove();
            self.ahead_bytes -= data.len();
            let end = off + data.len() as u64;
            if end <= self.next {
                self.stats.retransmitted += 1;
                continue;
            }
            if off < self.next {
                self.stats.overlapping += 1;
            }
            let skip = usize::try_from(self.next - off).unwrap_or(usize::MAX);
            let new = data.get(skip..).unwrap_or(&[]);
            out(Chunk::Data {
                offset: self.next,
                frame,
                data: new,
            });
            self.next = end;
        }
    }

    /// Gives up the gap before the first kept segment and hands on what follows it.
    fn give_up_gap(&mut self, out: &mut dyn FnMut(Chunk<'_>)) {
        let Some((&off, _)) = self.ahead.first_key_value() else {
            return;
        };
        let len = off - self.next;
        self.stats.lost += len;
        out(Chunk::Gap {
            offset: self.next,
            len,
        });
        self.next = off;
        self.drain(out);
    }

    /// Ends the stream: gaps still open are given up, in order, and what follows them is
    /// handed on.
    pub fn finish(&mut self, out: &mut dyn FnMut(Chunk<'_>)) {
        while !self.ahead.is_empty() {
            self.give_up_gap(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(h: &mut Half, segs: &[(u32, bool, &[u8])]) -> (Vec<u8>, Vec<(u64, u64)>) {
        let mut data = Vec::new();
        let mut gaps = Vec::new();
        for (i, (seq, syn, p)) in segs.iter().enumerate() {
            h.push(
                i as u64 + 1,
                *seq,
                *syn,
                p,
                &TcpLimits { max_ahead: 10 },
                &mut |c| match c {
                    Chunk::Data {
                        offset, data: d, ..
                    } => {
                        assert_eq!(
                            offset,
                            data.len() as u64 + gaps.iter().map(|g: &(u64, u64)| g.1).sum::<u64>()
                        );
                        data.extend_from_slice(d)
                    }
                    Chunk::Gap { offset, len } => gaps.push((offset, len)),
                },
            );
        }
        (data, gaps)
    }

    #[test]
    fn reorders_cuts_overlaps_and_drops_retransmissions_across_the_wrap() {
        let mut h = Half::default();
        let isn = u32::MAX - 3; // data starts at MAX - 2: sequence numbers wrap inside it
        let (data, gaps) = collect(
            &mut h,
            &[
                (isn, true, b""),
                (isn.wrapping_add(5), false, b"efg"), // ahead of a gap
                (isn.wrapping_add(1), false, b"abcd"),
                (isn.wrapping_add(1), false, b"abcd"), // retransmitted
                (isn.wrapping_add(6), false, b"fghij"), // overlaps
                (isn.wrapping_add(11), false, b"k"),
            ],
        );
        assert_eq!(data, b"abcdefghijk");
        assert!(gaps.is_empty());
        assert_eq!(
            h.stats,
            HalfStats {
                retransmitted: 1,
                overlapping: 1,
                out_of_order: 1,
                lost: 0
            }
        );
        assert_eq!(h.kept(), 0);
    }

    #[test]
    fn a_gap_too_long_to_wait_for_is_given_up_and_memory_stays_bounded() {
        let mut h = Half::default();
        let (data, gaps) = collect(
            &mut h,
            &[
                (100, true, b""),
                (101, false, b"ab"),
                (110, false, b"0123456"),
                (117, false, b"789abc"), // 13 bytes ahead: more than 10
                (103, false, b"late"),   // behind now: a retransmission
            ],
        );
        assert_eq!(gaps, vec![(2, 7)]);
        assert_eq!(data, b"ab0123456789abc");
        assert_eq!(h.stats.lost, 7);
        assert_eq!(h.kept(), 0);
    }
}
