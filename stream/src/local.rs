//! What one side sets up before it connects: the sizes of its queues and
//! buffers ([`Sizes`]), and [`Local`], the memory it registers (the receive
//! buffer the peer writes into, the target SGL the peer writes new receive
//! space into, the receives' slots (where message SENDs land on iWARP), the
//! send ring) with every receive posted, whose keys its connection data
//! carries. The engine takes a `Local` over once the connection is up.

use std::io;

use rdma::{AccessFlags, MemoryRegion, PreparedRecv, ProtectionDomain, QueuePair};

use crate::ring::SendRing;
use crate::wire::{self, ConnData, Sge};

/// `wr_id` bit of a receive (the low bits: its message slot on iWARP).
pub(crate) const RECV: u64 = 1 << 63;

/// The largest direct-placement table the connection data can announce
/// (127 units of 256).
const MAX_IOMAP_ENTRIES: u32 = 127 << 8;

/// Sizes of a connection's queues and buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// Send queue depth (data and control requests).
    pub send_queue: u32,
    /// Receive queue depth: the messages the peer may send unread.
    pub recv_queue: u32,
    /// Send buffer bytes (registered, copied into).
    pub send_buffer: usize,
    /// Receive buffer bytes (registered, the peer writes into it).
    pub recv_buffer: usize,
    /// Bytes sent inline (copied by the provider at post time).
    pub inline: u32,
    /// Entries of the direct-placement table this side offers the peer
    /// (rsocket's `RDMA_IOMAPSIZE`): how many mappings the peer may
    /// announce at once (`riomap`, see `iomap.rs`). Rounded as rsocket
    /// rounds it, to what the connection data can say: up to 128 as is,
    /// larger ones down to a multiple of 256, at most 32512. 0 offers none.
    pub iomap_entries: u32,
}

impl Sizes {
    /// The direct-placement table's entries as offered: `iomap_entries`
    /// rounded as the connection data carries it.
    pub fn iomap_table(&self) -> usize {
        // Capped first: past 32767 rsocket's scaling wraps around.
        let n = self.iomap_entries.min(MAX_IOMAP_ENTRIES);
        wire::scale_to_value(wire::value_to_scale(n)) as usize
    }

    /// Whether the protocol can run with these sizes: the send queue holds
    /// the control slots and a data write (two requests on iWARP), the
    /// receive queue's credits and the receive buffer's halves fit the
    /// connection data's 16 and 32 bits, and both buffers hold a byte.
    ///
    /// # Errors
    /// `InvalidInput`, saying which size is wrong and what it may be.
    pub fn check(&self) -> io::Result<()> {
        let bad = |what: String| Err(io::Error::new(io::ErrorKind::InvalidInput, what));
        let min_sq = wire::CONTROL_SLOTS + 2;
        if self.send_queue < min_sq {
            return bad(format!(
                "send_queue {} is below {min_sq} (rsocket's {} control slots and a data write)",
                self.send_queue,
                wire::CONTROL_SLOTS
            ));
        }
        if !(2..=u32::from(u16::MAX)).contains(&self.recv_queue) {
            return bad(format!(
                "recv_queue {} is outside 2..=65535 (the credits are 16 bits)",
                self.recv_queue
            ));
        }
        if self.recv_buffer < 2 || self.recv_buffer / 2 > u32::MAX as usize {
            return bad(format!(
                "recv_buffer {} is outside 2 bytes to just under 8 GiB (granted in halves of 32-bit lengths)",
                self.recv_buffer
            ));
        }
        if self.send_buffer == 0 {
            return bad("send_buffer is 0".into());
        }
        Ok(())
    }
}

impl Default for Sizes {
    /// rsocket's defaults (384-deep queues, 64 bytes inline), with 256 KiB
    /// buffers each way and a direct-placement table of 8 entries (rsocket
    /// offers none unless told: this side's table lets C's `riostream`
    /// map into it).
    fn default() -> Self {
        Sizes {
            send_queue: 384,
            recv_queue: 384,
            send_buffer: 256 * 1024,
            recv_buffer: 256 * 1024,
            inline: 64,
            iomap_entries: 8,
        }
    }
}

/// The memory one side registers before connecting, whose keys its
/// connection data carries.
#[derive(Debug)]
pub(crate) struct Local {
    /// The receive buffer: the peer writes data here.
    pub(crate) rbuf: MemoryRegion,
    /// The target SGL: the peer writes new receive space here; then the
    /// direct-placement table, where the peer writes its mappings.
    pub(crate) target: MemoryRegion,
    /// One 4-byte slot per receive, lent to it for the connection's life:
    /// where a message SEND lands on iWARP (on RoCE the messages are
    /// immediate data, and the slots stay unwritten). A receive's
    /// `wr_id` is [`RECV`] and its slot.
    pub(crate) recvs: PreparedRecv,
    pub(crate) ring: SendRing,
    pub(crate) sizes: Sizes,
}

impl Local {
    /// Registers the buffers on `pd` and posts every receive on `qp` (in
    /// INIT or later).
    pub(crate) fn new(
        pd: &ProtectionDomain,
        qp: &mut QueuePair,
        sizes: Sizes,
    ) -> io::Result<Local> {
        let remote = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let rbuf = pd
            .alloc_mr(sizes.recv_buffer, remote)
            .map_err(crate::io_error)?;
        let target = pd
            .alloc_mr(
                wire::SGL_ENTRIES * wire::SGE_LEN + sizes.iomap_table() * wire::IOMAP_ENTRY_LEN,
                remote,
            )
            .map_err(crate::io_error)?;
        let chunk = wire::MAX_TRANSFER.min(sizes.send_buffer.max(wire::SEND_LOW_WATER));
        let ring = SendRing::new(pd, sizes.send_buffer, chunk).map_err(crate::io_error)?;
        // Prepared once: a receive posted again is a range check and the
        // provider's call, its completion an index (no memory moves in and
        // out of the tracker per message).
        let slots = pd
            .alloc_mr(
                wire::MSG_LEN * sizes.recv_queue as usize,
                AccessFlags::LOCAL_WRITE,
            )
            .map_err(crate::io_error)?;
        let mut recvs = qp
            .prepare_recv(slots, wire::MSG_LEN)
            .map_err(|e| crate::io_error(e.drop_buffers()))?;
        for slot in 0..recvs.slots() {
            qp.post_prepared_recv(&mut recvs, RECV | slot as u64, slot)
                .map_err(crate::io_error)?;
        }
        Ok(Local {
            rbuf,
            target,
            recvs,
            ring,
            sizes,
        })
    }

    /// What this side sends in its private data.
    pub(crate) fn conn_data(&self) -> ConnData {
        let flags = wire::FLAG_IOMAP
            | if cfg!(target_endian = "big") {
                wire::FLAG_NET
            } else {
                0
            };
        ConnData {
            flags,
            credits: self.sizes.recv_queue as u16,
            target_iomap_size: wire::value_to_scale(self.sizes.iomap_table() as u32),
            target_sgl: Sge {
                addr: self.target.addr(),
                key: self.target.rkey(),
                length: wire::SGL_ENTRIES as u32,
            },
            data_buf: Sge {
                addr: self.rbuf.addr(),
                key: self.rbuf.rkey(),
                length: (self.sizes.recv_buffer / 2) as u32,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_sizes_pass_and_each_impossible_one_is_named() {
        assert!(Sizes::default().check().is_ok());
        type Change = fn(&mut Sizes);
        let cases: [(Change, &str); 6] = [
            (|s| s.send_queue = 5, "send_queue 5"),
            (|s| s.recv_queue = 1, "recv_queue 1"),
            (|s| s.recv_queue = 65536, "recv_queue 65536"),
            (|s| s.recv_buffer = 1, "recv_buffer 1"),
            (|s| s.recv_buffer = 1 << 34, "recv_buffer 17179869184"),
            (|s| s.send_buffer = 0, "send_buffer is 0"),
        ];
        for (change, says) in cases {
            let mut sizes = Sizes::default();
            change(&mut sizes);
            let e = sizes.check().expect_err(says);
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{says}");
            assert!(e.to_string().starts_with(says), "{e} should name {says}");
        }
        let smallest = Sizes {
            send_queue: 6,
            recv_queue: 2,
            recv_buffer: 2,
            send_buffer: 1,
            ..Sizes::default()
        };
        assert!(smallest.check().is_ok());
    }
}
