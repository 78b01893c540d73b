//! `Tlock` and `Tgetlock`: POSIX byte-range locks, held by the fid's open
//! file (an OFD lock, `F_OFD_SETLK`): locks through two fids conflict,
//! whichever client holds them, and so do those of local processes. A lock
//! that conflicts is refused at once (`LOCK_BLOCKED`); the client waits and
//! asks again. The fid's locks go when its file closes.

use super::{errno, Open, Session, R};
use crate::proto::{lock, Flock, Rmsg};
use crate::sys;

impl Session {
    /// `Tlock`: takes or releases a lock, or answers `LOCK_BLOCKED`.
    pub(super) fn tlock(&self, fid: u32, l: Flock<'_>) -> R<Rmsg<'static>> {
        let f = self.fid(fid)?;
        let Some(Open::File { file, .. }) = f.open.as_deref() else {
            return Err(errno(libc::EBADF));
        };
        let (start, len) = lock_range(l.start, l.length)?;
        let granted = sys::ofd_setlk(file, lock_type(l.ty)?, start, len)?;
        Ok(Rmsg::Lock {
            status: if granted {
                lock::SUCCESS
            } else {
                lock::BLOCKED
            },
        })
    }

    /// `Tgetlock`: the first lock that would conflict with `l`, or `l`
    /// unlocked when none would.
    pub(super) fn tgetlock(&self, fid: u32, l: Flock<'_>) -> R<Rmsg<'static>> {
        let f = self.fid(fid)?;
        let Some(Open::File { file, .. }) = f.open.as_deref() else {
            return Err(errno(libc::EBADF));
        };
        let (start, len) = lock_range(l.start, l.length)?;
        // Linux's client asks with F_UNLCK ("any lock here?"), which
        // F_OFD_GETLK refuses: a write lock conflicts with every lock.
        let ty = match lock_type(l.ty)? {
            t if t == libc::F_UNLCK as libc::c_short => libc::F_WRLCK as libc::c_short,
            t => t,
        };
        let held = sys::ofd_getlk(file, ty, start, len)?;
        let client_id: &'static [u8] = b"";
        let lock = match held {
            // No conflict: the lock asked about, as unlocked.
            None => Flock {
                ty: lock::UNLCK,
                flags: 0,
                start: l.start,
                length: l.length,
                proc_id: l.proc_id,
                client_id,
            },
            // The conflicting lock; its holder is an open file, not
            // a process, so it has no process id to give.
            Some(h) => Flock {
                ty: if h.l_type == libc::F_RDLCK as libc::c_short {
                    lock::RDLCK
                } else {
                    lock::WRLCK
                },
                flags: 0,
                start: u64::try_from(h.l_start).unwrap_or(0),
                length: u64::try_from(h.l_len).unwrap_or(0),
                proc_id: 0,
                client_id,
            },
        };
        Ok(Rmsg::Getlock { lock })
    }
}

/// A 9P lock type as `fcntl`'s.
fn lock_type(ty: u8) -> R<libc::c_short> {
    Ok(match ty {
        lock::RDLCK => libc::F_RDLCK,
        lock::WRLCK => libc::F_WRLCK,
        lock::UNLCK => libc::F_UNLCK,
        _ => return Err(errno(libc::EINVAL)),
    } as libc::c_short)
}

/// A 9P lock range (`length` 0: to the end of the file) as `fcntl`'s.
fn lock_range(start: u64, length: u64) -> R<(libc::off_t, libc::off_t)> {
    let start = libc::off_t::try_from(start).map_err(|_| errno(libc::EINVAL))?;
    let len = libc::off_t::try_from(length).map_err(|_| errno(libc::EINVAL))?;
    if start.checked_add(len).is_none() {
        return Err(errno(libc::EOVERFLOW));
    }
    Ok((start, len))
}
