//! Attributes: `Tgetattr`, `Tsetattr`, and `Tstatfs` for the file system
//! that holds a fid's object.

use std::ffi::OsStr;
use std::fs::{File, Metadata};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use super::{errno, Session, R};
use crate::dir::qid_of;
use crate::proto::{setattr, Attr, Rmsg, SetAttr, StatFs, GETATTR_BASIC};
use crate::sys;

impl Session {
    /// `Tstatfs`: the file system that holds what `fid` names.
    pub(super) fn tstatfs(&self, fid: u32) -> R<Rmsg<'static>> {
        let ex = &self.export;
        let f = ex.opath(&self.fid(fid)?.path)?;
        let s = sys::fstatfs(&f)?;
        Ok(Rmsg::Statfs(StatFs {
            ty: s.f_type as u32,
            bsize: s.f_bsize as u32,
            blocks: s.f_blocks,
            bfree: s.f_bfree,
            bavail: s.f_bavail,
            files: s.f_files,
            ffree: s.f_ffree,
            fsid: 0,
            namelen: s.f_namelen as u32,
        }))
    }

    /// `Tgetattr`: the attributes of what `fid` names.
    pub(super) fn tgetattr(&self, fid: u32) -> R<Rmsg<'static>> {
        let ex = &self.export;
        let m = ex.meta(&self.fid(fid)?.path)?;
        Ok(Rmsg::Getattr(Box::new(attr_of(&m))))
    }

    /// `Tsetattr`: changes them.
    pub(super) fn tsetattr(&self, fid: u32, attr: SetAttr) -> R<Rmsg<'static>> {
        self.writable()?;
        let path = self.fid(fid)?.path.clone();
        self.setattr(&path, &attr)?;
        Ok(Rmsg::Setattr)
    }

    fn setattr(&self, path: &Path, a: &SetAttr) -> R<()> {
        let ex = &self.export;
        let obj = ex.opath(path)?;
        let m = obj.metadata()?;
        if a.valid & setattr::MODE != 0 {
            if m.file_type().is_symlink() {
                return Err(errno(libc::EOPNOTSUPP));
            }
            // Through the descriptor's /proc link: exactly the object
            // resolved beneath the root, whatever happens to its name.
            let proc = format!("/proc/self/fd/{}", obj.as_raw_fd());
            std::fs::set_permissions(proc, std::fs::Permissions::from_mode(a.mode & 0o7777))?;
        }
        if a.valid & (setattr::UID | setattr::GID) != 0 {
            let uid = if a.valid & setattr::UID != 0 {
                a.uid
            } else {
                u32::MAX
            };
            let gid = if a.valid & setattr::GID != 0 {
                a.gid
            } else {
                u32::MAX
            };
            sys::fchown_fd(&obj, uid, gid)?;
        }
        if a.valid & setattr::SIZE != 0 {
            if !m.is_file() {
                return Err(errno(libc::EINVAL));
            }
            // The regular file just looked at, not whatever the name holds
            // by now (a device or FIFO renamed in would be opened).
            File::from(sys::reopen(&obj, libc::O_WRONLY)?).set_len(a.size)?;
        }
        if a.valid & (setattr::ATIME | setattr::MTIME) != 0 {
            let t = |on: u32, set: u32, sec: u64, nsec: u64| libc::timespec {
                tv_sec: if a.valid & set != 0 {
                    sec as libc::time_t
                } else {
                    0
                },
                tv_nsec: if a.valid & on == 0 {
                    libc::UTIME_OMIT
                } else if a.valid & set != 0 {
                    nsec as libc::c_long
                } else {
                    libc::UTIME_NOW
                },
            };
            let times = [
                t(
                    setattr::ATIME,
                    setattr::ATIME_SET,
                    a.atime_sec,
                    a.atime_nsec,
                ),
                t(
                    setattr::MTIME,
                    setattr::MTIME_SET,
                    a.mtime_sec,
                    a.mtime_nsec,
                ),
            ];
            match path.file_name() {
                Some(name) => {
                    let dir = ex.dir(path.parent().unwrap_or(Path::new("")))?;
                    sys::utimensat(&dir, name, times)?;
                }
                None => sys::utimensat(&*ex.root, OsStr::new("."), times)?,
            }
        }
        Ok(())
    }
}

fn attr_of(m: &Metadata) -> Attr {
    Attr {
        valid: GETATTR_BASIC,
        qid: qid_of(m),
        mode: m.mode(),
        uid: m.uid(),
        gid: m.gid(),
        nlink: m.nlink(),
        rdev: m.rdev(),
        size: m.size(),
        blksize: m.blksize(),
        blocks: m.blocks(),
        atime_sec: m.atime() as u64,
        atime_nsec: m.atime_nsec() as u64,
        mtime_sec: m.mtime() as u64,
        mtime_nsec: m.mtime_nsec() as u64,
        ctime_sec: m.ctime() as u64,
        ctime_nsec: m.ctime_nsec() as u64,
        ..Attr::default()
    }
}
