//! How each kind of field goes on the wire: `get` reads it, `put` writes it.
//! A message's fields name their codec in the message table (`messages.rs`),
//! so a message is described once and its decoder, encoder and type follow
//! from that.

use super::{Attr, DecodeError, Flock, Qid, Reader, SetAttr, StatFs, Writer, MAXWELEM};

type D<T> = Result<T, DecodeError>;

pub mod byte {
    use super::*;
    pub fn get(r: &mut Reader<'_>) -> D<u8> {
        r.u8()
    }
    pub fn put(v: &u8, w: &mut Writer<'_>) {
        w.u8(*v);
    }
}
pub mod short {
    use super::*;
    pub fn get(r: &mut Reader<'_>) -> D<u16> {
        r.u16()
    }
    pub fn put(v: &u16, w: &mut Writer<'_>) {
        w.u16(*v);
    }
}
pub mod int {
    use super::*;
    pub fn get(r: &mut Reader<'_>) -> D<u32> {
        r.u32()
    }
    pub fn put(v: &u32, w: &mut Writer<'_>) {
        w.u32(*v);
    }
}
pub mod long {
    use super::*;
    pub fn get(r: &mut Reader<'_>) -> D<u64> {
        r.u64()
    }
    pub fn put(v: &u64, w: &mut Writer<'_>) {
        w.u64(*v);
    }
}
/// A `u32` that older clients leave out at the end (`Tfsync`'s
/// `datasync`): 0 when absent.
pub mod opt_int {
    use super::*;
    pub fn get(r: &mut Reader<'_>) -> D<u32> {
        if r.remaining() == 0 {
            Ok(0)
        } else {
            r.u32()
        }
    }
    pub fn put(v: &u32, w: &mut Writer<'_>) {
        w.u32(*v);
    }
}
/// `len[2]` and that many bytes.
pub mod string {
    use super::*;
    pub fn get<'a>(r: &mut Reader<'a>) -> D<&'a [u8]> {
        r.str()
    }
    pub fn put(v: &[u8], w: &mut Writer<'_>) {
        w.str(v);
    }
}
/// `count[4]` and that many bytes (`Twrite`'s data).
pub mod data {
    use super::*;
    pub fn get<'a>(r: &mut Reader<'a>) -> D<&'a [u8]> {
        let n = r.u32()?;
        r.bytes(usize::try_from(n).map_err(|_| DecodeError::Truncated)?)
    }
    pub fn put(v: &[u8], w: &mut Writer<'_>) {
        w.u32(u32::try_from(v.len()).unwrap_or(u32::MAX)).bytes(v);
    }
}
/// `nwname[2]` and that many strings, at most [`MAXWELEM`].
pub mod names {
    use super::*;
    pub fn get<'a>(r: &mut Reader<'a>) -> D<Vec<&'a [u8]>> {
        let n = r.u16()?;
        if usize::from(n) > MAXWELEM {
            return Err(DecodeError::TooManyNames(n));
        }
        (0..n).map(|_| r.str()).collect()
    }
    pub fn put(v: &[&[u8]], w: &mut Writer<'_>) {
        w.u16(v.len() as u16);
        for n in v {
            w.str(n);
        }
    }
}
pub mod qid {
    use super::*;
    pub fn get(r: &mut Reader<'_>) -> D<Qid> {
        r.qid()
    }
    pub fn put(v: &Qid, w: &mut Writer<'_>) {
        w.qid(v);
    }
}
/// `nwqid[2]` and that many qids, at most [`MAXWELEM`].
pub mod qids {
    use super::*;
    pub fn get(r: &mut Reader<'_>) -> D<Vec<Qid>> {
        let n = r.u16()?;
        if usize::from(n) > MAXWELEM {
            return Err(DecodeError::TooManyNames(n));
        }
        (0..n).map(|_| r.qid()).collect()
    }
    pub fn put(v: &[Qid], w: &mut Writer<'_>) {
        w.u16(v.len() as u16);
        for q in v {
            w.qid(q);
        }
    }
}
pub mod statfs {
    use super::*;
    pub fn get(r: &mut Reader<'_>) -> D<StatFs> {
        Ok(StatFs {
            ty: r.u32()?,
            bsize: r.u32()?,
            blocks: r.u64()?,
            bfree: r.u64()?,
            bavail: r.u64()?,
            files: r.u64()?,
            ffree: r.u64()?,
            fsid: r.u64()?,
            namelen: r.u32()?,
        })
    }
    pub fn put(s: &StatFs, w: &mut Writer<'_>) {
        w.u32(s.ty).u32(s.bsize);
        w.u64(s.blocks).u64(s.bfree).u64(s.bavail);
        w.u64(s.files).u64(s.ffree).u64(s.fsid).u32(s.namelen);
    }
}
pub mod attr {
    use super::*;
    pub fn get(r: &mut Reader<'_>) -> D<Box<Attr>> {
        Ok(Box::new(Attr {
            valid: r.u64()?,
            qid: r.qid()?,
            mode: r.u32()?,
            uid: r.u32()?,
            gid: r.u32()?,
            nlink: r.u64()?,
            rdev: r.u64()?,
            size: r.u64()?,
            blksize: r.u64()?,
            blocks: r.u64()?,
            atime_sec: r.u64()?,
            atime_nsec: r.u64()?,
            mtime_sec: r.u64()?,
            mtime_nsec: r.u64()?,
            ctime_sec: r.u64()?,
            ctime_nsec: r.u64()?,
            btime_sec: r.u64()?,
            btime_nsec: r.u64()?,
            gen: r.u64()?,
            data_version: r.u64()?,
        }))
    }
    pub fn put(a: &Attr, w: &mut Writer<'_>) {
        w.u64(a.valid).qid(&a.qid).u32(a.mode).u32(a.uid).u32(a.gid);
        w.u64(a.nlink)
            .u64(a.rdev)
            .u64(a.size)
            .u64(a.blksize)
            .u64(a.blocks);
        w.u64(a.atime_sec).u64(a.atime_nsec);
        w.u64(a.mtime_sec).u64(a.mtime_nsec);
        w.u64(a.ctime_sec).u64(a.ctime_nsec);
        w.u64(a.btime_sec).u64(a.btime_nsec);
        w.u64(a.gen).u64(a.data_version);
    }
}
pub mod setattr {
    use super::*;
    pub fn get(r: &mut Reader<'_>) -> D<SetAttr> {
        Ok(SetAttr {
            valid: r.u32()?,
            mode: r.u32()?,
            uid: r.u32()?,
            gid: r.u32()?,
            size: r.u64()?,
            atime_sec: r.u64()?,
            atime_nsec: r.u64()?,
            mtime_sec: r.u64()?,
            mtime_nsec: r.u64()?,
        })
    }
    pub fn put(a: &SetAttr, w: &mut Writer<'_>) {
        w.u32(a.valid).u32(a.mode).u32(a.uid).u32(a.gid).u64(a.size);
        w.u64(a.atime_sec).u64(a.atime_nsec);
        w.u64(a.mtime_sec).u64(a.mtime_nsec);
    }
}
/// `Tlock`'s lock: with `flags`.
pub mod lock {
    use super::*;
    pub fn get<'a>(r: &mut Reader<'a>) -> D<Flock<'a>> {
        super::flock(r, true)
    }
    pub fn put(v: &Flock<'_>, w: &mut Writer<'_>) {
        super::put_flock(w, v, true);
    }
}
/// `Tgetlock`'s and `Rgetlock`'s lock: without `flags`.
pub mod getlock {
    use super::*;
    pub fn get<'a>(r: &mut Reader<'a>) -> D<Flock<'a>> {
        super::flock(r, false)
    }
    pub fn put(v: &Flock<'_>, w: &mut Writer<'_>) {
        super::put_flock(w, v, false);
    }
}

fn flock<'a>(r: &mut Reader<'a>, with_flags: bool) -> Result<Flock<'a>, DecodeError> {
    Ok(Flock {
        ty: r.u8()?,
        flags: if with_flags { r.u32()? } else { 0 },
        start: r.u64()?,
        length: r.u64()?,
        proc_id: r.u32()?,
        client_id: r.str()?,
    })
}

fn put_flock(w: &mut Writer<'_>, l: &Flock<'_>, with_flags: bool) {
    w.u8(l.ty);
    if with_flags {
        w.u32(l.flags);
    }
    w.u64(l.start).u64(l.length).u32(l.proc_id).str(l.client_id);
}
