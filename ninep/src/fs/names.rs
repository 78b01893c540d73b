//! Names in directories: `Tsymlink`, `Tmknod`, `Tmkdir`, `Tlink` create
//! them, `Trename` and `Trenameat` move them (and the fids beneath them),
//! `Tremove` and `Tunlinkat` remove them, `Treadlink` reads a link's target.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::{check_name, errno, locked, Session, R};
use crate::dir::qid_of;
use crate::proto::{Qid, Rmsg};
use crate::sys;

impl Session {
    /// Makes `name` in the directory of `dfid` with `make(dir, name)` (after
    /// the checks every creation needs; the thread acts as the fid's user,
    /// so the new object is the user's) and returns its qid.
    fn make(&self, dfid: u32, name: &[u8], make: impl FnOnce(&File, &OsStr) -> R<()>) -> R<Qid> {
        self.writable()?;
        let name = check_name(name)?;
        let f = self.fid(dfid)?;
        let dir = self.export.dir(&f.path)?;
        make(&dir, name)?;
        Ok(qid_of(&self.export.meta(&f.path.join(name))?))
    }

    /// Moves every fid at or under `from` to `to`.
    fn renamed(&self, from: &Path, to: &Path) {
        for f in locked(&self.fids).values_mut() {
            if let Ok(rest) = f.path.strip_prefix(from) {
                // (`join("")` would add a trailing slash.)
                f.path = if rest.as_os_str().is_empty() {
                    to.to_path_buf()
                } else {
                    to.join(rest)
                };
            }
        }
    }

    /// `Tremove`: removes the object `fid` names; the fid goes whatever
    /// happens.
    pub(super) fn tremove(&self, fid: u32) -> R<Rmsg<'static>> {
        let ex = &self.export;
        // The fid goes whatever happens.
        let f = self.remove_fid(fid)?;
        self.writable()?;
        let m = ex.meta(&f.path)?;
        let (dir, name) = ex.parent(&f.path)?;
        let flags = if m.is_dir() { libc::AT_REMOVEDIR } else { 0 };
        sys::unlinkat(&dir, &name, flags)?;
        Ok(Rmsg::Remove)
    }

    /// `Tsymlink`: a symbolic link `name` to `target` in `fid`'s directory.
    pub(super) fn tsymlink(&self, fid: u32, name: &[u8], target: &[u8]) -> R<Rmsg<'static>> {
        let qid = self.make(fid, name, |dir, name| {
            if target.is_empty() || target.contains(&0) {
                return Err(errno(libc::EINVAL));
            }
            sys::symlinkat(OsStr::from_bytes(target), dir, name)
        })?;
        Ok(Rmsg::Symlink { qid })
    }

    /// `Tmknod`: a node `name` (a device, FIFO or socket) in `dfid`'s
    /// directory.
    pub(super) fn tmknod(
        &self,
        dfid: u32,
        name: &[u8],
        mode: u32,
        major: u32,
        minor: u32,
    ) -> R<Rmsg<'static>> {
        let dev = libc::makedev(major, minor);
        let qid = self.make(dfid, name, |dir, name| sys::mknodat(dir, name, mode, dev))?;
        Ok(Rmsg::Mknod { qid })
    }

    /// `Tmkdir`: a directory `name` in `dfid`'s directory.
    pub(super) fn tmkdir(&self, dfid: u32, name: &[u8], mode: u32) -> R<Rmsg<'static>> {
        let qid = self.make(dfid, name, |dir, name| sys::mkdirat(dir, name, mode))?;
        Ok(Rmsg::Mkdir { qid })
    }

    /// `Trename`: moves what `fid` names to `name` in `dfid`'s directory.
    pub(super) fn trename(&self, fid: u32, dfid: u32, name: &[u8]) -> R<Rmsg<'static>> {
        let ex = &self.export;
        self.writable()?;
        let name = check_name(name)?;
        let from = self.fid(fid)?.path.clone();
        let to_dir = self.fid(dfid)?.path.clone();
        let (odir, oname) = ex.parent(&from)?;
        let ndir = ex.dir(&to_dir)?;
        sys::renameat((&odir, &oname), (&ndir, name))?;
        self.renamed(&from, &to_dir.join(name));
        Ok(Rmsg::Rename)
    }

    /// `Trenameat`: moves `oldname` in one directory to `newname` in
    /// another.
    pub(super) fn trenameat(
        &self,
        olddirfid: u32,
        oldname: &[u8],
        newdirfid: u32,
        newname: &[u8],
    ) -> R<Rmsg<'static>> {
        let ex = &self.export;
        self.writable()?;
        let (oname, nname) = (check_name(oldname)?, check_name(newname)?);
        let op = self.fid(olddirfid)?.path.clone();
        let np = self.fid(newdirfid)?.path.clone();
        let (odir, ndir) = (ex.dir(&op)?, ex.dir(&np)?);
        sys::renameat((&odir, oname), (&ndir, nname))?;
        self.renamed(&op.join(oname), &np.join(nname));
        Ok(Rmsg::Renameat)
    }

    /// `Treadlink`: the target of the symbolic link `fid` names.
    pub(super) fn treadlink<'d>(&self, fid: u32, data: &'d mut Vec<u8>) -> R<Rmsg<'d>> {
        let ex = &self.export;
        let (dir, name) = ex.parent(&self.fid(fid)?.path)?;
        let target = sys::readlinkat(&dir, &name)?;
        *data = target;
        Ok(Rmsg::Readlink { target: data })
    }

    /// `Tlink`: a hard link `name` in `dfid`'s directory to what `fid`
    /// names.
    pub(super) fn tlink(&self, dfid: u32, fid: u32, name: &[u8]) -> R<Rmsg<'static>> {
        let ex = &self.export;
        self.writable()?;
        let name = check_name(name)?;
        let (odir, oname) = ex.parent(&self.fid(fid)?.path)?;
        let ndir = ex.dir(&self.fid(dfid)?.path)?;
        sys::linkat((&odir, &oname), (&ndir, name))?;
        Ok(Rmsg::Link)
    }

    /// `Tunlinkat`: removes `name` from `dfid`'s directory.
    pub(super) fn tunlinkat(&self, dfid: u32, name: &[u8], flags: u32) -> R<Rmsg<'static>> {
        let ex = &self.export;
        self.writable()?;
        let name = check_name(name)?;
        let dir = ex.dir(&self.fid(dfid)?.path)?;
        let flags = flags as libc::c_int & libc::AT_REMOVEDIR;
        sys::unlinkat(&dir, name, flags)?;
        Ok(Rmsg::Unlinkat)
    }
}
