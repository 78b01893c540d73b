//! Reads and writes of open files: `Tread` and `Twrite` (through
//! [`Session::handle`], or answered in place in the send buffer by
//! [`Session::handle_into`]), `Treaddir`, `Tfsync`.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use super::{ecode, errno, Open, Session, R};
use crate::dir::qid_of;
use crate::proto::{Request, Rmsg, Tmsg, IOHDRSZ};

/// Writes the header of an `Rread` (`size[4] type[1] tag[2] count[4]`, its
/// data after it), an `Rwrite` (`size type tag count`) or an `Rlerror`
/// (`size type tag ecode[4]`, `n` the errno) at the start of `out`: a reply
/// of `len` bytes in all. `None` if `out` is shorter than the header.
fn put_io_header(out: &mut [u8], ty: u8, tag: u16, n: usize, len: usize) -> Option<usize> {
    let head = out.get_mut(..IOHDRSZ)?;
    // (Counts and lengths are at most msize, which fits in 32 bits.)
    head[..4].copy_from_slice(&(len as u32).to_le_bytes());
    head[4] = ty;
    head[5..7].copy_from_slice(&tag.to_le_bytes());
    head[7..].copy_from_slice(&(n as u32).to_le_bytes());
    Some(len)
}

impl Session {
    /// A well-formed `Tread` or `Twrite` within msize, answered in place in
    /// `out` as [`Session::handle`] would answer it, without the reply
    /// buffer, the thread's data buffer and the copies of the fid that path
    /// costs (the requests of a bulk transfer: one per msize of data).
    /// Returns the reply's length, or `None` for any other message (or an
    /// `out` too short for an `Rread`'s header).
    pub(super) fn io_into(&self, msg: &[u8], out: &mut [u8]) -> Option<usize> {
        let ty = *msg.get(4)?;
        if msg.len() > self.msize() as usize
            || (ty != crate::proto::ty::TREAD && ty != crate::proto::ty::TWRITE)
        {
            return None;
        }
        let Ok(Request { tag, msg }) = Request::decode(msg) else {
            return None;
        };
        let room = out.get_mut(IOHDRSZ..)?;
        let done = match msg {
            Tmsg::Read { fid, offset, count } => self
                .read(fid, offset, count, room)
                .map(|n| (crate::proto::ty::TREAD + 1, n, IOHDRSZ + n)),
            Tmsg::Write { fid, offset, data } => self
                .write(fid, offset, data)
                .map(|n| (crate::proto::ty::TWRITE + 1, n, IOHDRSZ)),
            _ => return None,
        };
        let (ty, n, len) = match done {
            Ok(r) => r,
            Err(e) => (crate::proto::ty::RLERROR, ecode(&e) as usize, IOHDRSZ),
        };
        put_io_header(out, ty, tag, n, len)
    }

    /// **For benchmarks only** (`RDMA_9P_BENCH_NULL`): answers a `Tread`
    /// or `Twrite` of a regular file ([`Session::is_file_io`]) without
    /// touching the file. A `Tread` gets the bytes it asks for (at most
    /// what fits, as a real read) as they already are in `out`, the
    /// reply's send buffer, allocated once; a `Twrite` is told all its
    /// bytes were written. Returns the reply's length, or `None` for any
    /// other message (handle it as usual). It measures the client and the
    /// transport against a server whose file I/O costs nothing; the data
    /// it serves is not the file's.
    pub fn null_io_into(&self, msg: &[u8], out: &mut [u8]) -> Option<usize> {
        if msg.len() > self.msize() as usize || !self.is_file_io(msg) {
            return None;
        }
        let Ok(Request { tag, msg }) = Request::decode(msg) else {
            return None;
        };
        let (ty, n) = match msg {
            Tmsg::Read { count, .. } => {
                let room = out.len().checked_sub(IOHDRSZ)?;
                (crate::proto::ty::TREAD + 1, self.read_len(count, room))
            }
            Tmsg::Write { data, .. } => (crate::proto::ty::TWRITE + 1, data.len()),
            _ => return None,
        };
        let len = if ty == crate::proto::ty::TREAD + 1 {
            IOHDRSZ + n
        } else {
            IOHDRSZ
        };
        put_io_header(out, ty, tag, n, len)
    }

    /// How many bytes a `Tread` of `count` may return into `room` bytes:
    /// at most what fits in msize after the reply's header.
    fn read_len(&self, count: u32, room: usize) -> usize {
        let max = (self.msize() as usize).saturating_sub(IOHDRSZ);
        (count as usize).min(max).min(room)
    }

    /// `Tread`: reads from `fid`'s open file at `offset` into the start of
    /// `buf`, at most [`Session::read_len`] bytes; returns how many.
    fn read(&self, fid: u32, offset: u64, count: u32, buf: &mut [u8]) -> R<usize> {
        let open = self.open_of(fid)?;
        let Open::File { file, .. } = &*open else {
            return Err(errno(libc::EBADF));
        };
        let n = self.read_len(count, buf.len());
        read_full_at(file, &mut buf[..n], offset)
    }

    /// `Twrite`: writes `data` at `offset` in `fid`'s open file; returns how
    /// many bytes were written (all of them for a regular file, what one
    /// non-blocking write took for a FIFO or socket).
    fn write(&self, fid: u32, offset: u64, data: &[u8]) -> R<usize> {
        self.writable()?;
        let open = self.open_of(fid)?;
        let Open::File {
            file,
            writable: true,
            ..
        } = &*open
        else {
            return Err(errno(libc::EBADF));
        };
        write_all_at(file, data, offset)
    }

    /// `Tread` through [`Session::handle`]: into the thread's data buffer.
    pub(super) fn tread<'d>(
        &self,
        fid: u32,
        offset: u64,
        count: u32,
        data: &'d mut Vec<u8>,
    ) -> R<Rmsg<'d>> {
        data.resize(self.read_len(count, usize::MAX), 0);
        let got = self.read(fid, offset, count, data)?;
        data.truncate(got);
        Ok(Rmsg::Read { data })
    }

    /// `Twrite` through [`Session::handle`].
    pub(super) fn twrite(&self, fid: u32, offset: u64, bytes: &[u8]) -> R<Rmsg<'static>> {
        let n = self.write(fid, offset, bytes)?;
        Ok(Rmsg::Write { count: n as u32 })
    }

    /// `Treaddir`: the entries of `fid`'s open directory from `offset`, at
    /// most `count` bytes of them (and what fits in msize).
    pub(super) fn treaddir<'d>(
        &self,
        fid: u32,
        offset: u64,
        count: u32,
        data: &'d mut Vec<u8>,
    ) -> R<Rmsg<'d>> {
        let ex = &self.export;
        let max = (self.msize() as usize).saturating_sub(IOHDRSZ);
        let limit = (count as usize).min(max);
        let f = self.fid(fid)?;
        let Some(Open::Dir(dir)) = f.open.as_deref() else {
            return Err(errno(libc::EBADF));
        };
        let parent = || match f.path.parent() {
            Some(p) => Ok(qid_of(&ex.meta(p)?)),
            None => Ok(qid_of(&dir.file().metadata()?)),
        };
        dir.read_into(offset, limit, data, parent)?;
        Ok(Rmsg::Readdir { data })
    }

    /// `Tfsync`: `fsync` or `fdatasync` of `fid`'s open file or directory.
    pub(super) fn tfsync(&self, fid: u32, datasync: u32) -> R<Rmsg<'static>> {
        let f = self.fid(fid)?;
        let file = match f.open.as_deref() {
            Some(Open::File { file, .. }) => file,
            Some(Open::Dir(dir)) => dir.file(),
            None => return Err(errno(libc::EBADF)),
        };
        if datasync != 0 {
            file.sync_data()?
        } else {
            file.sync_all()?
        }
        Ok(Rmsg::Fsync)
    }
}

/// Writes all of `data` at `offset`; to a FIFO or socket (no offsets, and
/// non-blocking), what one write takes. Returns how many bytes.
fn write_all_at(mut file: &File, data: &[u8], offset: u64) -> R<usize> {
    match file.write_all_at(data, offset) {
        Err(e) if e.raw_os_error() == Some(libc::ESPIPE) => io::Write::write(&mut file, data),
        r => r.map(|()| data.len()),
    }
}

/// Reads until `buf` is full or the file ends; from a FIFO or socket, what
/// one read returns.
fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> R<usize> {
    match file.read_at(buf, offset) {
        Err(e) if e.raw_os_error() == Some(libc::ESPIPE) => {
            return io::Read::read(&mut &*file, buf);
        }
        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
        Err(e) => return Err(e),
        Ok(0) => return Ok(0),
        Ok(n) if n == buf.len() => return Ok(n),
        Ok(n) => return read_rest_at(file, buf, offset, n),
    }
    read_rest_at(file, buf, offset, 0)
}

fn read_rest_at(file: &File, buf: &mut [u8], offset: u64, mut done: usize) -> R<usize> {
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset.saturating_add(done as u64)) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}
