//! Direct placement, as rsocket's `riomap`, `riowrite` and `riounmap` (and
//! rdma-core's `riostream`) use it: one side maps memory of its own at an
//! offset of its choosing, the other writes to that offset with a plain
//! RDMA WRITE, which lands in the memory directly, with no message and no
//! copy on the receiving side.
//!
//! # The protocol
//! Each side's target registration (`local.rs`) holds, after its two SGL
//! entries, a table of `Sizes::iomap_entries` mappings the peer may write
//! (`wire::IoMapEntry`: offset, address, rkey, length, in the reader's byte
//! order); the connection data carries its size. [`RdmaStream::iomap`]
//! registers the memory, writes its entry into a free slot of the *peer's*
//! table and says which with an IOMAP_SGL message (an RDMA WRITE WITH
//! IMMEDIATE, on iWARP a WRITE and a SEND), which takes a credit as data
//! does. [`RdmaStream::iowrite`] looks up the offset in the table the peer
//! filled in ours and posts plain RDMA WRITEs (rsocket's `RS_OP_WRITE`,
//! which never reaches the wire as a message: it takes a send queue entry
//! and send buffer, no credit). Nothing tells the mapping side that data
//! arrived: as with `riostream`, the two sides agree on that themselves
//! (`riostream` writes a marker into the last byte and spins on it; RDMA
//! WRITEs of one queue pair land in order). There is no unmap message:
//! [`RdmaStream::iounmap`] deregisters, and a peer that writes after that
//! breaks the connection (its WRITE fails on the stale rkey), as in C.
//!
//! # Soundness
//! - Memory the peer may write is moved into the stream, registered there,
//!   and kept by the engine (beside the queue pair) until it is unmapped or
//!   the stream is gone. It is never lent out as `&[u8]`:
//!   [`RdmaStream::iomap_read`] copies it out with the rdma crate's atomic
//!   copy (a write racing the copy gives torn bytes, never undefined
//!   behaviour), and [`RdmaStream::iounmap`] hands it back as a plain
//!   [`rdma::Buffer`] only once `ibv_dereg_mr` succeeded, when no rkey
//!   reaches it any more.
//! - Every table entry the peer wrote is checked before use: an index past
//!   our table is a protocol error (the engine), an entry whose offsets or
//!   addresses wrap around is `InvalidData`, and a write never goes past the
//!   end of the entry that holds its offset (the next part looks up its own
//!   entry). What the peer's entries name is the peer's own memory under its
//!   own rkey; our memory is reachable by the peer only through the rkeys of
//!   the regions mapped here, which the device bounds.

use std::io;
use std::time::{Duration, Instant};

use rdma::{AccessFlags, Buffer, ProtectionDomain, RemoteMemory};

use crate::blocking::RdmaStream;
use crate::engine::Engine;
use crate::wire::{self, IoMapEntry, Op};

/// A mapping made with [`RdmaStream::iomap`]: the peer writes to its
/// offsets with [`RdmaStream::iowrite`] (or C's `riowrite`). It names memory
/// the stream holds; read it with [`RdmaStream::iomap_read`] and take the
/// memory back with [`RdmaStream::iounmap`].
#[derive(Debug)]
pub struct IoMap {
    /// Its slot in the peer's table (and in the engine's `mapped`).
    index: usize,
    /// Where the registration starts: tells this stream's mapping from
    /// another stream's at the same index.
    addr: u64,
    offset: u64,
    len: usize,
}

impl IoMap {
    /// The first offset the peer writes to.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is mapped (never: an empty mapping is refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// How often [`RdmaStream::iomap_wait`] looks at the connection while it
/// spins (each look costs system calls in blocking mode).
const LOOK_EVERY: Duration = Duration::from_millis(1);

fn invalid(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, why)
}

/// Where our table starts in our target registration (after the SGL).
const TABLE_START: usize = wire::SGL_ENTRIES * wire::SGE_LEN;

/// Entries of our table: what the target registration holds after the
/// SGL (its size is this side's choice, made before connecting).
fn our_entries(e: &Engine) -> usize {
    e.target().len().saturating_sub(TABLE_START) / wire::IOMAP_ENTRY_LEN
}

/// The entry of our table (the peer's mappings) that holds `offset`.
fn find(e: &Engine, offset: u64) -> io::Result<Option<IoMapEntry>> {
    let base = TABLE_START;
    for i in 0..our_entries(e) {
        let mut b = [0; wire::IOMAP_ENTRY_LEN];
        // Remotely writable: the crate's atomic copy.
        e.target()
            .read_at(base + i * wire::IOMAP_ENTRY_LEN, &mut b)
            .map_err(crate::io_error)?;
        let entry = IoMapEntry::from_memory(&b).map_err(|w| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("rsocket protocol error: mapping {i}: {w}"),
            )
        })?;
        if let Some(entry) = entry.filter(|m| m.holds(offset)) {
            return Ok(Some(entry));
        }
    }
    Ok(None)
}

/// Copies bytes `at..` of `map`, one of `e`'s mappings, into `out`.
pub(crate) fn read_mapped(e: &Engine, map: &IoMap, at: usize, out: &mut [u8]) -> io::Result<()> {
    let mr = e
        .mapped
        .get(map.index)
        .and_then(Option::as_ref)
        .filter(|mr| mr.addr() == map.addr)
        .ok_or_else(|| invalid("iomap_read: the mapping is not this stream's".into()))?;
    mr.read_at(at, out).map_err(crate::io_error)
}

/// Posts what it can of `data` to the peer's offset `offset`: bytes
/// posted, `None` when the queue is full.
pub(crate) fn post_some(e: &mut Engine, data: &[u8], offset: u64) -> io::Result<Option<usize>> {
    let mut done = 0;
    while done < data.len() {
        let at = offset + done as u64;
        let Some(m) = find(e, at)? else {
            if done == 0 {
                return Err(invalid(format!(
                    "riowrite: offset {at} lies in no mapping the peer announced"
                )));
            }
            break;
        };
        // In the entry (checked by `holds`, which also bounds the sum).
        let into = at - m.offset;
        let room = u64::from(m.sge.length) - into;
        let n = (data.len() - done).min(usize::try_from(room).unwrap_or(usize::MAX));
        let to = RemoteMemory {
            addr: m.sge.addr + into,
            len: n as u64,
            rkey: m.sge.key,
        };
        match e.try_post_direct(&data[done..done + n], to, None)? {
            Some(sent) => done += sent,
            None => break,
        }
    }
    Ok((done > 0).then_some(done))
}

impl RdmaStream {
    /// Maps `buf` for the peer to write at offsets `offset..offset + len`
    /// (rsocket's `riomap` with `PROT_WRITE`, `offset` given): registers
    /// it, which the stream then owns, and announces it in the peer's table
    /// (waiting for a credit if none is free). The peer's writes land in it
    /// without a message: agree with the peer on when they are complete
    /// (`riostream` spins on a marker in the last byte), then read with
    /// [`RdmaStream::iomap_read`].
    ///
    /// Only memory the peer may write is mapped: rsocket's local mappings
    /// (`PROT_NONE`) register memory its `riowrite` never uses.
    ///
    /// # Errors
    /// `Unsupported` when the peer offers no table (a C peer must set
    /// `RDMA_IOMAPSIZE` before connecting, as `riostream` does);
    /// `OutOfMemory` when every slot of it is taken (C's `ENOMEM`);
    /// `InvalidInput` for an empty buffer, one of 4 GiB or more, or offsets
    /// that wrap around; the registration's error; the stream's errors.
    pub fn iomap(&self, buf: impl Into<Box<[u8]>>, offset: u64) -> io::Result<IoMap> {
        let pending = {
            let mut p = self.lock();
            let p = &mut *p;
            Announcement::prepare(&mut p.engine, &p._pd, buf.into(), offset)?
        };
        match self.wait(None, |e| pending.try_post(e)) {
            Ok(()) => Ok(pending.done()),
            Err(e) => {
                pending.abandon(&mut self.lock().engine);
                Err(e)
            }
        }
    }

    /// Copies bytes `at..at + out.len()` of `map` into `out`, with the rdma
    /// crate's atomic copy: a peer writing meanwhile gives torn bytes, never
    /// undefined behaviour.
    ///
    /// # Errors
    /// `InvalidInput` for a range past the mapping, or a mapping of another
    /// stream.
    pub fn iomap_read(&self, map: &IoMap, at: usize, out: &mut [u8]) -> io::Result<()> {
        read_mapped(&self.lock().engine, map, at, out)
    }

    /// Spins until byte `at` of `map` is `value`: how `riostream` learns
    /// that the peer's writes are complete (the peer writes the marker
    /// last; RDMA WRITEs of one queue pair land in order, so every byte
    /// before it is there). As C's loop, it spins on the memory; unlike
    /// it, every millisecond it also looks at the connection, so a peer
    /// that closes or fails ends the wait with an error, never a hang (in
    /// non-blocking mode it sees only what completions say: a peer that
    /// vanishes without a word is seen in blocking mode or at `timeout`).
    ///
    /// # Errors
    /// `TimedOut` when `timeout` passes first; `UnexpectedEof` when the
    /// peer closed the stream; the connection's error when it failed;
    /// `InvalidInput` as [`RdmaStream::iomap_read`].
    pub fn iomap_wait(
        &self,
        map: &IoMap,
        at: usize,
        value: u8,
        timeout: Option<Duration>,
    ) -> io::Result<()> {
        let start = Instant::now();
        let mut look_at = start + LOOK_EVERY;
        let mut b = [0];
        loop {
            self.iomap_read(map, at, &mut b)?;
            if b[0] == value {
                return Ok(());
            }
            let now = Instant::now();
            if now >= look_at {
                if timeout.is_some_and(|t| now - start >= t) {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("riomap: byte {at} of the mapping did not become {value}"),
                    ));
                }
                if let Err(e) = self.look_at_connection(at, value) {
                    // The peer's marker WRITE lands before its DISCONNECT: the
                    // byte may have become `value` since it was read above.
                    self.iomap_read(map, at, &mut b)?;
                    if b[0] == value {
                        return Ok(());
                    }
                    return Err(e);
                }
                look_at = now + LOOK_EVERY;
            }
            std::hint::spin_loop();
        }
    }

    /// Takes the completions and connection events there are (without
    /// sleeping): an error when the connection is no longer up.
    fn look_at_connection(&self, at: usize, value: u8) -> io::Result<()> {
        let up = self.wait(Some(Instant::now()), |e| still_up(e, at, value));
        match up {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
                ) =>
            {
                Ok(())
            }
            r => r,
        }
    }

    /// Writes `buf` to the peer's offset `offset` (rsocket's `riowrite`):
    /// plain RDMA WRITEs into the memory the peer mapped there, copied
    /// through the send buffer (or inline); a write that spans two of the
    /// peer's mappings goes into each. Returns when every byte is posted
    /// (in non-blocking mode: what could be, or `WouldBlock`); the peer
    /// sees the bytes in order with the stream's other writes.
    ///
    /// # Errors
    /// `InvalidInput` when `offset` lies in no mapping the peer announced
    /// (a later part that lies in none ends the write short instead);
    /// `InvalidData` for a table entry that cannot be right; the stream's
    /// errors.
    pub fn iowrite(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let at = write_offset(buf.len(), offset, done)?;
            match self.wait(None, |e| post_some(e, &buf[done..], at)) {
                Ok(n) => done += n,
                Err(e) if ends_short(&e, done) => break,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// Unmaps `map` (rsocket's `riounmap`): deregisters it and gives its
    /// memory back, with what the peer wrote. The peer is not told (rsocket
    /// has no message for it): a peer that writes to it afterwards fails
    /// its WRITE and the connection breaks, as with C.
    ///
    /// # Errors
    /// `InvalidInput` for a mapping of another stream; `ibv_dereg_mr`'s
    /// error (the memory is then leaked, never handed back: the device
    /// might still reach it).
    pub fn iounmap(&self, map: IoMap) -> io::Result<Buffer> {
        unmap(&mut self.lock().engine, map)
    }
}

/// A mapping registered into a free slot, not yet announced to the peer:
/// what `iomap` does under the lock, then posts when it can (the blocking
/// and the async stream's).
pub(crate) struct Announcement {
    entry: [u8; wire::IOMAP_ENTRY_LEN],
    to: RemoteMemory,
    map: IoMap,
}

impl Announcement {
    /// Registers `buf` on `pd` into a free slot of the peer's table (the
    /// region kept in `e.mapped` from now on).
    pub(crate) fn prepare(
        e: &mut Engine,
        pd: &ProtectionDomain,
        buf: Box<[u8]>,
        offset: u64,
    ) -> io::Result<Announcement> {
        let len = buf.len();
        let length = u32::try_from(len)
            .ok()
            .filter(|&l| l > 0 && offset.checked_add(u64::from(l)).is_some())
            .ok_or_else(|| {
                invalid(format!(
                    "riomap: {len} bytes at offset {offset} (a mapping has 1 byte to 4 GiB, \
                     and its offsets must not wrap around)"
                ))
            })?;
        let table = e.peer_iomap;
        if table.length == 0 {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "riomap: the peer offers no direct-placement table (a C rsocket sets \
                 RDMA_IOMAPSIZE before connecting)",
            ));
        }
        let slots = table.length as usize;
        let mapped = &mut e.mapped;
        mapped.resize_with(slots.max(mapped.len()), || None);
        let Some(index) = mapped.iter().take(slots).position(Option::is_none) else {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("riomap: the peer's table has {slots} slots, all mapped"),
            ));
        };
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let mr = pd
            .reg_mr(buf, access)
            .map_err(|e| crate::setup::step_error("riomap", e))?;
        let entry = IoMapEntry {
            offset,
            sge: wire::Sge {
                addr: mr.addr(),
                key: mr.rkey(),
                length,
            },
        };
        // Ours before the peer hears of it.
        e.mapped[index] = Some(mr);
        Ok(Announcement {
            entry: entry.to_memory(e.peer_big_endian),
            to: RemoteMemory {
                addr: table.addr + (index * wire::IOMAP_ENTRY_LEN) as u64,
                len: wire::IOMAP_ENTRY_LEN as u64,
                rkey: table.key,
            },
            map: IoMap {
                index,
                addr: entry.sge.addr,
                offset,
                len,
            },
        })
    }

    /// Writes the entry into the peer's table with IOMAP_SGL: `None` while
    /// no credit or send queue entry is free.
    pub(crate) fn try_post(&self, e: &mut Engine) -> io::Result<Option<()>> {
        let msg = wire::msg(Op::IOMAP_SGL, self.map.index as u32);
        Ok(e.try_post_direct(&self.entry, self.to, Some(msg))?
            .map(drop))
    }

    /// Announced: the mapping.
    pub(crate) fn done(self) -> IoMap {
        self.map
    }

    /// Never announced (or the connection failed): the region deregistered
    /// and freed, its slot free again.
    pub(crate) fn abandon(&self, e: &mut Engine) {
        if let Some(slot) = e.mapped.get_mut(self.map.index) {
            drop(slot.take());
        }
    }
}

/// Where part `done` of a write of `len` bytes at `offset` goes.
pub(crate) fn write_offset(len: usize, offset: u64, done: usize) -> io::Result<u64> {
    offset.checked_add(done as u64).ok_or_else(|| {
        invalid(format!(
            "riowrite: {len} bytes at offset {offset} wrap around"
        ))
    })
}

/// Whether `e`, after `done` bytes, ends a write short rather than failing
/// it: the queue is full in non-blocking mode, or the rest lies in no
/// mapping.
pub(crate) fn ends_short(e: &io::Error, done: usize) -> bool {
    done > 0
        && matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::InvalidInput
        )
}

/// Deregisters `map`, one of `e`'s mappings, and gives its memory back.
pub(crate) fn unmap(e: &mut Engine, map: IoMap) -> io::Result<Buffer> {
    let slot = e
        .mapped
        .get_mut(map.index)
        .filter(|s| s.as_ref().is_some_and(|mr| mr.addr() == map.addr))
        .ok_or_else(|| invalid("riounmap: the mapping is not this stream's".into()))?;
    let mr = slot
        .take()
        .ok_or_else(|| invalid("riounmap: not mapped".into()))?;
    match mr.deregister() {
        Ok(buf) => Ok(buf),
        Err((back, err)) => {
            // Still registered (in use): it stays mapped.
            if let Some(mr) = back {
                e.mapped[map.index] = Some(mr);
            }
            Err(crate::setup::step_error("riounmap", err))
        }
    }
}

/// For a wait on byte `at` of a mapping becoming `value`: `None` while the
/// connection is up; else its failure (a read of nothing says it when no
/// data is left unread) or the end of the stream. The blocking and async
/// `look_at_connection` both ask it.
pub(crate) fn still_up(e: &mut Engine, at: usize, value: u8) -> io::Result<Option<()>> {
    if e.connected() {
        return Ok(None);
    }
    e.try_read(&mut [])?;
    Err(io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!(
            "riomap: the peer closed the stream before byte {at} of the mapping became {value}"
        ),
    ))
}
