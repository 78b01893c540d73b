//! Reading pcap and pcapng files frame by frame, with `pcap-parser`: a fixed-size buffer, so
//! memory does not grow with the file.

use std::io::Read;

use pcap_parser::pcapng::Block;
use pcap_parser::{create_reader, PcapBlockOwned, PcapError};

/// One captured frame.
#[derive(Clone, Copy, Debug)]
pub struct Frame<'a> {
    /// 1-based number of the frame in the file (tshark's `frame.number`).
    pub number: u64,
    /// Capture time, seconds since the epoch.
    pub time: f64,
    /// Link type of the interface (1 Ethernet, 113 Linux SLL, 276 SLL2, 101/228/229 raw IP).
    pub linktype: i32,
    /// The captured bytes.
    pub data: &'a [u8],
    /// The frame's length on the wire (more than `data.len()` when the capture cut it).
    pub orig_len: u32,
}

/// A capture file that could not be read to its end.
#[derive(Debug)]
pub enum CaptureError {
    /// Not a pcap or pcapng file, or a block that does not parse.
    Format(String),
    /// The file ends in the middle of a block.
    Truncated {
        /// Frames read before the cut.
        frames: u64,
    },
    /// Reading the file failed.
    Io(std::io::Error),
    /// A block (a frame and its header) larger than the reader holds at once.
    RecordTooLarge {
        /// Frames read before it.
        frames: u64,
        /// The most a block may be, in bytes.
        max: usize,
    },
}

impl std::fmt::Display for CaptureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CaptureError::Format(s) => write!(f, "not a readable pcap/pcapng file: {s}"),
            CaptureError::Truncated { frames } => {
                write!(f, "capture file cut short after frame {frames}")
            }
            CaptureError::Io(e) => write!(f, "reading the capture: {e}"),
            CaptureError::RecordTooLarge { frames, max } => write!(
                f,
                "the block after frame {frames} is larger than the {} KiB a block may be (a \
                 frame of more than 256 KiB, or a corrupt length): not read",
                max >> 10
            ),
        }
    }
}

impl std::error::Error for CaptureError {}

/// The largest block the reader's buffer holds (a 256 KiB frame plus its block header).
const BUFFER: usize = 1 << 19;

/// Calls `f` on every frame of the capture read from `input`, in file order. Stops at the end of
/// the file or at the first error; a cut-off last block is [`CaptureError::Truncated`], reported
/// after the frames before it were handed to `f`.
pub fn for_each_frame<R: Read + Send>(
    input: R,
    mut f: impl FnMut(Frame<'_>),
) -> Result<u64, CaptureError> {
    let mut reader =
        create_reader(BUFFER, input).map_err(|e| CaptureError::Format(format!("{e:?}")))?;
    let mut legacy_link = 1i32;
    let mut legacy_nanos = false;
    // Per pcapng interface: link type, timestamp units per second, offset.
    let mut interfaces: Vec<(i32, u64, i64)> = Vec::new();
    let mut number = 0u64;
    let mut stalled = false;
    loop {
        match reader.next() {
            Ok((offset, block)) => {
                stalled = false;
                match block {
                    PcapBlockOwned::LegacyHeader(h) => {
                        legacy_link = h.network.0;
                        legacy_nanos = h.is_nanosecond_precision();
                    }
                    PcapBlockOwned::Legacy(b) => {
                        number += 1;
                        let frac = if legacy_nanos { 1e-9 } else { 1e-6 };
                        f(Frame {
                            number,
                            time: f64::from(b.ts_sec) + f64::from(b.ts_usec) * frac,
                            linktype: legacy_link,
                            data: b.data,
                            orig_len: b.origlen,
                        });
                    }
                    PcapBlockOwned::NG(Block::SectionHeader(_)) => interfaces.clear(),
                    PcapBlockOwned::NG(Block::InterfaceDescription(idb)) => {
                        let res = idb.ts_resolution().unwrap_or(1_000_000);
                        interfaces.push((idb.linktype.0, res, idb.ts_offset()));
                    }
                    PcapBlockOwned::NG(Block::EnhancedPacket(epb)) => {
                        number += 1;
                        let (link, res, off) = usize::try_from(epb.if_id)
                            .ok()
                            .and_then(|i| interfaces.get(i).copied())
                            .unwrap_or((1, 1_000_000, 0));
                        let ticks = (u64::from(epb.ts_high) << 32) | u64::from(epb.ts_low);
                        #[allow(clippy::cast_precision_loss)] // a timestamp for display
                        let time = ticks as f64 / res.max(1) as f64 + off as f64;
                        let caplen = usize::try_from(epb.caplen).unwrap_or(usize::MAX);
                        f(Frame {
                            number,
                            time,
                            linktype: link,
                            data: epb.data.get(..caplen).unwrap_or(epb.data),
                            orig_len: epb.origlen,
                        });
                    }
                    PcapBlockOwned::NG(Block::SimplePacket(spb)) => {
                        number += 1;
                        let link = interfaces.first().map_or(1, |i| i.0);
                        let len = usize::try_from(spb.origlen).unwrap_or(usize::MAX);
                        f(Frame {
                            number,
                            time: 0.0,
                            linktype: link,
                            data: spb.data.get(..len).unwrap_or(spb.data),
                            orig_len: spb.origlen,
                        });
                    }
                    PcapBlockOwned::NG(_) => {}
                }
                // Not `consume`: it moves what is left to the buffer's start whenever half
                // the buffer is read, which copied the whole file a second time (a tenth of
                // `rpc`'s time). `refill` moves the rest of a partial block before reading.
                reader.consume_noshift(offset);
            }
            Err(PcapError::Eof) => return Ok(number),
            Err(PcapError::Incomplete(_)) => {
                if stalled {
                    return Err(CaptureError::Truncated { frames: number });
                }
                reader.refill().map_err(|e| match e {
                    PcapError::BufferTooSmall => CaptureError::RecordTooLarge {
                        frames: number,
                        max: BUFFER,
                    },
                    e => CaptureError::Format(format!("{e:?}")),
                })?;
                stalled = true;
            }
            Err(PcapError::UnexpectedEof) => {
                return Err(CaptureError::Truncated { frames: number })
            }
            Err(PcapError::ReadError) => {
                return Err(CaptureError::Io(std::io::Error::other("read failed")))
            }
            Err(PcapError::BufferTooSmall) => {
                return Err(CaptureError::RecordTooLarge {
                    frames: number,
                    max: BUFFER,
                })
            }
            Err(e) => return Err(CaptureError::Format(format!("{e:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pcap whose second record is `len` bytes long (the first one 60).
    fn pcap_with_record(len: usize) -> Vec<u8> {
        let mut f = Vec::new();
        for x in [0xa1b2_c3d4u32, 0x0004_0002, 0, 0, 0x0010_0000, 1] {
            f.extend_from_slice(&x.to_le_bytes());
        }
        for n in [60usize, len] {
            for x in [0u32, 0, n as u32, n as u32] {
                f.extend_from_slice(&x.to_le_bytes());
            }
            f.extend(std::iter::repeat_n(0u8, n));
        }
        f
    }

    /// A record larger than the reader's buffer is an error that says so, after the frames
    /// before it (not a parser's internal name, nor a claim that the file was cut short).
    #[test]
    fn a_record_larger_than_the_buffer_says_so() {
        let mut seen = 0;
        let e = for_each_frame(&pcap_with_record(BUFFER + 4096)[..], |_| seen += 1).unwrap_err();
        assert_eq!(seen, 1);
        assert!(
            matches!(e, CaptureError::RecordTooLarge { frames: 1, .. }),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(
            text.contains("larger than the 512 KiB a block may be"),
            "{text}"
        );
        // One that fits is read.
        let n = for_each_frame(&pcap_with_record(200_000)[..], |_| {}).unwrap();
        assert_eq!(n, 2);
    }
}
