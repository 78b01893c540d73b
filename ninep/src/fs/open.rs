//! `Tlopen` and `Tlcreate`: opening a fid's file, and how a file is opened
//! so that no read, write or open waits for another party.

use std::fs::File;
use std::os::unix::fs::FileTypeExt;

use super::{check_name, errno, Open, Session, R};
use crate::dir::{qid_of, OpenDir};
use crate::proto::Rmsg;
use crate::sys;

impl Session {
    /// `Tlopen`: opens the object `fid` names.
    pub(super) fn tlopen(&self, fid: u32, flags: u32) -> R<Rmsg<'static>> {
        let ex = &self.export;
        let f = self.fid(fid)?;
        if f.open.is_some() {
            return Err(errno(libc::EBADF));
        }
        self.may_open()?;
        let node = ex.opath(&f.path)?;
        let m = node.metadata()?;
        let open = if m.is_dir() {
            let fd = ex.open(&f.path, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
            Open::Dir(OpenDir::new(fd.into()))
        } else {
            let acc = flags as libc::c_int & libc::O_ACCMODE;
            let trunc = flags as libc::c_int & libc::O_TRUNC;
            if acc != libc::O_RDONLY || trunc != 0 {
                self.writable()?;
            }
            Open::File {
                file: open_plain(&node, acc | trunc)?,
                writable: acc != libc::O_RDONLY,
                regular: m.is_file(),
            }
        };
        self.set_open(fid, open, None)?;
        Ok(Rmsg::Lopen {
            qid: qid_of(&m),
            iounit: 0,
        })
    }

    /// `Tlcreate`: creates `name` in `fid`'s directory (or opens what is
    /// there), and makes `fid` the new file, open.
    pub(super) fn tlcreate(
        &self,
        fid: u32,
        name: &[u8],
        flags: u32,
        mode: u32,
    ) -> R<Rmsg<'static>> {
        let ex = &self.export;
        self.writable()?;
        let name = check_name(name)?;
        let f = self.fid(fid)?;
        if f.open.is_some() {
            return Err(errno(libc::EBADF));
        }
        self.may_open()?;
        let dir = ex.dir(&f.path)?;
        let acc = flags as libc::c_int & libc::O_ACCMODE;
        let extra = flags as libc::c_int & (libc::O_EXCL | libc::O_TRUNC);
        // Created only where nothing is: an existing name (a device
        // node, a FIFO) is opened as Tlopen opens it.
        let file = match sys::openat2_beneath(
            &dir,
            name,
            acc | extra | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            mode,
        ) {
            Ok(fd) => File::from(fd),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) && extra & libc::O_EXCL == 0 => {
                let node: File =
                    sys::openat2_beneath(&dir, name, libc::O_PATH | libc::O_NOFOLLOW, 0)?.into();
                open_plain(&node, acc | (extra & libc::O_TRUNC))?
            }
            Err(e) => return Err(e),
        };
        // Created by the user (its owner and group are the
        // thread's), or an existing file opened: its owner stays.
        let path = f.path.join(name);
        let m = file.metadata()?;
        let open = Open::File {
            file,
            writable: acc != libc::O_RDONLY,
            regular: m.is_file(),
        };
        self.set_open(fid, open, Some(path))?;
        Ok(Rmsg::Lcreate {
            qid: qid_of(&m),
            iounit: 0,
        })
    }
}

/// Opens for reads or writes (`flags`: the access mode, `O_TRUNC`) the
/// object that `node`, an `O_PATH` descriptor, refers to. A device node is
/// refused (`EPERM`) before it is ever opened: its data is not beneath the
/// root, Linux's client opens device nodes on its own side anyway, and
/// opening one can act on the device (a watchdog starts, a tape rewinds).
/// A symlink is refused as `O_NOFOLLOW` refuses it (`ELOOP`), a directory
/// as `open(2)` for writing refuses it (`EISDIR`). Everything is opened
/// with `O_NONBLOCK`, so that a FIFO never waits for its other end; a FIFO
/// or socket keeps it, so that no read or write of one waits either (a
/// read with no writer's data, a write to a full pipe: each would hold a
/// thread, its descriptor and the connection's buffers for as long as
/// somebody likes, after the client is gone too). The client gets `EAGAIN`
/// or a short count instead. A regular file's is cleared.
fn open_plain(node: &File, flags: libc::c_int) -> R<File> {
    let ft = node.metadata()?.file_type();
    if ft.is_block_device() || ft.is_char_device() {
        return Err(errno(libc::EPERM));
    }
    if ft.is_symlink() {
        return Err(errno(libc::ELOOP));
    }
    if ft.is_dir() {
        return Err(errno(libc::EISDIR));
    }
    let file = File::from(sys::reopen(node, flags | libc::O_NONBLOCK)?);
    if ft.is_file() {
        sys::clear_nonblock(&file)?;
    }
    Ok(file)
}
