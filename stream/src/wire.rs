//! rsocket's wire format (librdmacm's `rsocket.c`, `SOCK_STREAM`, protocol
//! version 1): the private data of the connection exchange, the 32-bit
//! message that rides in the immediate data of an RDMA WRITE (or in a 4-byte
//! SEND on iWARP), and the scatter/gather entry one side writes into the
//! other's target list to hand it receive space.
//!
//! Nothing here touches a device: every decoder checks its input and
//! returns [`WireError`], so the fuzz-like tests can feed it anything.

use std::fmt;

/// The protocol version both sides send; any other is refused.
pub const VERSION: u8 = 1;
/// Connection flag: the sender's byte order is big-endian ("network").
pub const FLAG_NET: u8 = 1 << 0;
/// Connection flag: the sender has a target list for direct placement
/// (`riomap`), `target_iomap_size` entries after its two SGL entries.
pub const FLAG_IOMAP: u8 = 1 << 1;
/// Bytes of [`ConnData`] on the wire.
pub const CONN_DATA_LEN: usize = 40;
/// Entries in each side's target SGL (two halves of the receive buffer).
pub const SGL_ENTRIES: usize = 2;
/// Bytes of one [`Sge`] in memory.
pub const SGE_LEN: usize = 16;
/// The largest single transfer a C peer makes, and ours.
pub const MAX_TRANSFER: usize = 64 * 1024;
/// The first transfer of a large write: each next one doubles, up to
/// [`MAX_TRANSFER`], so the receiver sees data early.
pub const FIRST_TRANSFER: usize = 2048;
/// Send space below which the C sender waits for completions.
pub const SEND_LOW_WATER: usize = 2048;
/// Control messages one side may have in flight (`RS_QP_CTRL_SIZE`).
pub const CONTROL_SLOTS: u32 = 4;
/// Bytes of a message carried as a SEND (iWARP).
pub const MSG_LEN: usize = 4;

/// The operation in the top three bits of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op(pub u32);

impl Op {
    /// Data: the low 29 bits are the bytes written.
    pub const DATA: Op = Op(0);
    /// Local bookkeeping of a direct write (`riowrite`); never on the wire.
    pub const WRITE: Op = Op(2);
    /// Credits (the low bits: the new sequence limit), with or without a new
    /// SGL entry written just before.
    pub const SGL: Op = Op(4);
    /// A direct-placement target was updated (low bits: its index).
    pub const IOMAP_SGL: Op = Op(6);
    /// Control (low bits: [`Ctrl`]).
    pub const CTRL: Op = Op(7);
}

/// The control messages (low bits of an [`Op::CTRL`] message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ctrl(pub u32);

impl Ctrl {
    /// The sender closed both directions.
    pub const DISCONNECT: Ctrl = Ctrl(0);
    /// A zero-length RDMA WRITE that keeps the connection checked.
    pub const KEEPALIVE: Ctrl = Ctrl(1);
    /// The sender will write no more (`shutdown(SHUT_WR)`).
    pub const SHUTDOWN: Ctrl = Ctrl(2);
}

const DATA_MASK: u32 = 0x1FFF_FFFF;

/// Builds the 32-bit message of `op` with `data` (its low 29 bits).
pub fn msg(op: Op, data: u32) -> u32 {
    (op.0 << 29) | (data & DATA_MASK)
}

/// The operation of a message.
pub fn msg_op(msg: u32) -> Op {
    Op(msg >> 29)
}

/// The data bits of a message.
pub fn msg_data(msg: u32) -> u32 {
    msg & DATA_MASK
}

/// A scatter/gather entry as rsocket keeps it: address, rkey, length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Virtual address of the memory.
    pub addr: u64,
    /// Its rkey.
    pub key: u32,
    /// Its length in bytes (in a target SGL descriptor: the entry count).
    pub length: u32,
}

impl Sge {
    /// The entry as the peer's memory holds it: `big_endian` when the peer
    /// said [`FLAG_NET`] (the writer swaps to the reader's order).
    pub fn to_memory(self, big_endian: bool) -> [u8; SGE_LEN] {
        let mut out = [0; SGE_LEN];
        if big_endian {
            self.encode_be(&mut out);
        } else {
            out[..8].copy_from_slice(&self.addr.to_le_bytes());
            out[8..12].copy_from_slice(&self.key.to_le_bytes());
            out[12..].copy_from_slice(&self.length.to_le_bytes());
        }
        out
    }

    /// An entry from our own memory (written by the peer in our order).
    pub fn from_memory(b: &[u8; SGE_LEN]) -> Sge {
        let word = |r: std::ops::Range<usize>| {
            let mut w = [0; 4];
            w.copy_from_slice(&b[r]);
            u32::from_ne_bytes(w)
        };
        let mut a = [0; 8];
        a.copy_from_slice(&b[..8]);
        Sge {
            addr: u64::from_ne_bytes(a),
            key: word(8..12),
            length: word(12..16),
        }
    }

    fn encode_be(self, out: &mut [u8]) {
        out[..8].copy_from_slice(&self.addr.to_be_bytes());
        out[8..12].copy_from_slice(&self.key.to_be_bytes());
        out[12..16].copy_from_slice(&self.length.to_be_bytes());
    }

    fn decode_be(b: &[u8]) -> Sge {
        let mut a = [0; 8];
        a.copy_from_slice(&b[..8]);
        let mut k = [0; 4];
        k.copy_from_slice(&b[8..12]);
        let mut l = [0; 4];
        l.copy_from_slice(&b[12..16]);
        Sge {
            addr: u64::from_be_bytes(a),
            key: u32::from_be_bytes(k),
            length: u32::from_be_bytes(l),
        }
    }
}

/// Bytes of one entry of a direct-placement table (`struct rs_iomap`): the
/// offset the mapping answers to, then its [`Sge`].
pub const IOMAP_ENTRY_LEN: usize = 8 + SGE_LEN;

/// One entry of a direct-placement table (`riomap`): the mapping's owner
/// takes writes to its offsets `offset..offset + sge.length` at `sge.addr`
/// under `sge.key`. Each side's table follows its two target SGL entries,
/// in the same registration, and the peer writes entries into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IoMapEntry {
    /// The first offset the mapping answers to.
    pub offset: u64,
    /// Where those offsets are, and how many.
    pub sge: Sge,
}

impl IoMapEntry {
    /// The entry as the peer's memory holds it (its byte order, as
    /// [`Sge::to_memory`]).
    pub fn to_memory(self, big_endian: bool) -> [u8; IOMAP_ENTRY_LEN] {
        let mut out = [0; IOMAP_ENTRY_LEN];
        let offset = if big_endian {
            self.offset.to_be_bytes()
        } else {
            self.offset.to_le_bytes()
        };
        out[..8].copy_from_slice(&offset);
        out[8..].copy_from_slice(&self.sge.to_memory(big_endian));
        out
    }

    /// An entry from our own memory (written by the peer in our order),
    /// checked: `Ok(None)` for an empty slot (length 0), an error for one
    /// whose offsets or addresses would wrap around.
    ///
    /// # Errors
    /// `offset + length` or `addr + length` past `u64::MAX`.
    pub fn from_memory(b: &[u8; IOMAP_ENTRY_LEN]) -> Result<Option<IoMapEntry>, WireError> {
        let mut o = [0; 8];
        o.copy_from_slice(&b[..8]);
        let mut sge = [0; SGE_LEN];
        sge.copy_from_slice(&b[8..]);
        let e = IoMapEntry {
            offset: u64::from_ne_bytes(o),
            sge: Sge::from_memory(&sge),
        };
        if e.sge.length == 0 {
            return Ok(None);
        }
        let len = u64::from(e.sge.length);
        if e.offset.checked_add(len).is_none() || e.sge.addr.checked_add(len).is_none() {
            return Err(WireError(format!(
                "the peer announced a mapping of {len} bytes at offset {:#x}, address {:#x}: \
                 it wraps around",
                e.offset, e.sge.addr
            )));
        }
        Ok(Some(e))
    }

    /// Whether the mapping answers to `offset`.
    pub fn holds(&self, offset: u64) -> bool {
        offset >= self.offset && offset - self.offset < u64::from(self.sge.length)
    }
}

/// A table size as the connection data carries it (rsocket's
/// `rs_value_to_scale(n, 8)`: up to 128 as is, larger ones in units of 256).
pub fn value_to_scale(n: u32) -> u8 {
    if n <= 128 {
        n as u8
    } else {
        (128 | (n >> 8)).min(255) as u8
    }
}

/// A table size from the connection data (rsocket's `rs_scale_to_value`).
pub fn scale_to_value(v: u8) -> u32 {
    if v <= 128 {
        u32::from(v)
    } else {
        u32::from(v & 0x7F) << 8
    }
}

/// What each side sends in the private data of its connect request or
/// accept (`struct rs_conn_data`, all fields big-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnData {
    /// [`FLAG_NET`], [`FLAG_IOMAP`].
    pub flags: u8,
    /// Messages the sender can take before it grants more (its receive
    /// queue depth).
    pub credits: u16,
    /// Direct-placement targets, scaled (`rs_value_to_scale(n, 8)`).
    pub target_iomap_size: u8,
    /// The sender's target SGL: where the peer writes new receive space
    /// (`length` is the entry count, 2).
    pub target_sgl: Sge,
    /// The first receive space the peer may write (half the sender's
    /// receive buffer).
    pub data_buf: Sge,
}

/// Input that does not follow the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError(pub String);

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WireError {}

impl ConnData {
    /// The 40 bytes of the private data.
    pub fn encode(&self) -> [u8; CONN_DATA_LEN] {
        let mut out = [0; CONN_DATA_LEN];
        out[0] = VERSION;
        out[1] = self.flags;
        out[2..4].copy_from_slice(&self.credits.to_be_bytes());
        // 4..7 reserved, zero.
        out[7] = self.target_iomap_size;
        self.target_sgl.encode_be(&mut out[8..24]);
        self.data_buf.encode_be(&mut out[24..40]);
        out
    }

    /// Decodes a peer's private data (InfiniBand/RoCE pads it with zeros to
    /// the request's fixed size: longer input is fine).
    ///
    /// # Errors
    /// Fewer than 40 bytes, another version, an SGL that is not two entries,
    /// no credits or an empty first receive space.
    pub fn decode(b: &[u8]) -> Result<ConnData, WireError> {
        if b.len() < CONN_DATA_LEN {
            return Err(WireError(format!(
                "the peer's connection data has {} bytes; rsocket's has {CONN_DATA_LEN} \
                 (is the peer an rsocket?)",
                b.len()
            )));
        }
        if b[0] != VERSION {
            return Err(WireError(format!(
                "the peer speaks rsocket protocol version {}; this side speaks {VERSION}",
                b[0]
            )));
        }
        let d = ConnData {
            flags: b[1],
            credits: u16::from_be_bytes([b[2], b[3]]),
            target_iomap_size: b[7],
            target_sgl: Sge::decode_be(&b[8..24]),
            data_buf: Sge::decode_be(&b[24..40]),
        };
        if d.target_sgl.length as usize != SGL_ENTRIES {
            return Err(WireError(format!(
                "the peer's target SGL has {} entries; rsocket's has {SGL_ENTRIES}",
                d.target_sgl.length
            )));
        }
        if d.credits == 0 || d.data_buf.length == 0 {
            return Err(WireError(format!(
                "the peer grants {} messages and {} bytes: nothing could ever be sent",
                d.credits, d.data_buf.length
            )));
        }
        Ok(d)
    }

    /// Whether the peer's memory is big-endian.
    pub fn big_endian(&self) -> bool {
        self.flags & FLAG_NET != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_pack_op_and_data_as_rsocket_does() {
        let m = msg(Op::SGL, 384 + 7);
        assert_eq!(m, (4 << 29) | 391);
        assert_eq!(msg_op(m), Op::SGL);
        assert_eq!(msg_data(m), 391);
        // Data bits above 29 are cut, as the C macro's mask does on decode.
        assert_eq!(msg_data(msg(Op::DATA, u32::MAX)), 0x1FFF_FFFF);
        assert_eq!(msg_op(msg(Op::CTRL, Ctrl::SHUTDOWN.0)), Op::CTRL);
    }

    #[test]
    fn conn_data_round_trips_in_big_endian() {
        let d = ConnData {
            flags: FLAG_IOMAP,
            credits: 384,
            target_iomap_size: 0,
            target_sgl: Sge {
                addr: 0x1122_3344_5566_7788,
                key: 0xAABB_CCDD,
                length: 2,
            },
            data_buf: Sge {
                addr: 0x7f00_0000_1000,
                key: 0x1234,
                length: 65536,
            },
        };
        let b = d.encode();
        assert_eq!(b[0], 1);
        assert_eq!(&b[2..4], &[1, 128]);
        assert_eq!(&b[8..16], &0x1122_3344_5566_7788u64.to_be_bytes());
        assert_eq!(&b[36..40], &65536u32.to_be_bytes());
        let mut padded = b.to_vec();
        padded.resize(56, 0);
        assert_eq!(ConnData::decode(&padded), Ok(d));
    }

    #[test]
    fn bad_conn_data_is_refused_with_a_reason() {
        let good = ConnData {
            flags: 0,
            credits: 16,
            target_iomap_size: 0,
            target_sgl: Sge {
                addr: 1,
                key: 2,
                length: 2,
            },
            data_buf: Sge {
                addr: 3,
                key: 4,
                length: 5,
            },
        }
        .encode();
        assert!(ConnData::decode(&good[..39])
            .unwrap_err()
            .0
            .contains("39 bytes"));
        let mut v2 = good;
        v2[0] = 2;
        assert!(ConnData::decode(&v2).unwrap_err().0.contains("version 2"));
        let mut sgl = good;
        sgl[23] = 9;
        assert!(ConnData::decode(&sgl).unwrap_err().0.contains("9 entries"));
        let mut none = good;
        none[2] = 0;
        none[3] = 0;
        assert!(ConnData::decode(&none).is_err());
    }

    #[test]
    fn iomap_entries_are_checked_and_sizes_scaled_as_rsocket() {
        let e = IoMapEntry {
            offset: 4096,
            sge: Sge {
                addr: 0x7f00_0000_0000,
                key: 7,
                length: 100,
            },
        };
        let mem = e.to_memory(cfg!(target_endian = "big"));
        assert_eq!(IoMapEntry::from_memory(&mem), Ok(Some(e)));
        assert!(e.holds(4096) && e.holds(4195) && !e.holds(4196) && !e.holds(4095));
        let empty = IoMapEntry::default().to_memory(false);
        assert_eq!(IoMapEntry::from_memory(&empty), Ok(None));
        let wraps = IoMapEntry {
            offset: u64::MAX - 10,
            ..e
        }
        .to_memory(cfg!(target_endian = "big"));
        assert!(IoMapEntry::from_memory(&wraps)
            .unwrap_err()
            .0
            .contains("wraps"));
        for n in [0, 1, 8, 128] {
            assert_eq!(scale_to_value(value_to_scale(n)), n);
        }
        assert_eq!(scale_to_value(value_to_scale(512)), 512);
    }

    #[test]
    fn an_sge_is_written_in_the_readers_order() {
        let s = Sge {
            addr: 0x0102_0304_0506_0708,
            key: 0x0A0B_0C0D,
            length: 0x1000,
        };
        let le = s.to_memory(false);
        assert_eq!(&le[..8], &0x0102_0304_0506_0708u64.to_le_bytes());
        let be = s.to_memory(true);
        assert_eq!(&be[12..], &0x1000u32.to_be_bytes());
        if cfg!(target_endian = "little") {
            assert_eq!(Sge::from_memory(&le), s);
        } else {
            assert_eq!(Sge::from_memory(&be), s);
        }
    }
}
