//! `Tversion`, `Tattach`, `Twalk`, `Tclunk`: a connection's fids made and
//! dropped.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{check_name, errno, locked, Fid, Session, MIN_MSIZE, R};
use crate::dir::qid_of;
use crate::proto::{Rmsg, VERSION};
use crate::users;

impl Session {
    /// `Tversion`: forgets every fid and agrees to an msize.
    pub(super) fn tversion(&self, msize: u32, version: &[u8]) -> R<Rmsg<'static>> {
        self.close_all();
        let msize = msize.clamp(MIN_MSIZE, self.max_msize);
        self.msize.store(msize, Ordering::Relaxed);
        let version: &'static [u8] = if version.starts_with(VERSION) {
            VERSION
        } else {
            b"unknown"
        };
        Ok(Rmsg::Version { msize, version })
    }

    /// `Tattach`: a new fid on the root, acting for the user the message
    /// names (mapped by the export's [`Users`](crate::users::Users)).
    pub(super) fn tattach(&self, fid: u32, uname: &[u8], n_uname: u32) -> R<Rmsg<'static>> {
        let ex = &self.export;
        let user = Arc::new(ex.users.resolve(uname, n_uname));
        // The root as the user sees it (search permission included).
        let m = {
            let _as_user = users::as_user(&user)?;
            ex.meta(Path::new(""))?
        };
        self.new_fid(
            fid,
            Fid {
                path: PathBuf::new(),
                user,
                open: None,
            },
        )?;
        Ok(Rmsg::Attach { qid: qid_of(&m) })
    }

    /// `Twalk`: `newfid` (or `fid` itself) at the path `names` lead to from
    /// `fid`'s, when every name is found; the qids of those found.
    pub(super) fn twalk(&self, fid: u32, newfid: u32, names: Vec<&[u8]>) -> R<Rmsg<'static>> {
        let ex = &self.export;
        let f = self.fid(fid)?;
        if f.open.is_some() {
            return Err(errno(libc::EBADF));
        }
        let (mut path, user) = (f.path.clone(), f.user);
        let mut qids = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            let next = if *name == b".." {
                path.parent().map(Path::to_path_buf).unwrap_or_default()
            } else {
                match check_name(name) {
                    Ok(n) => path.join(n),
                    Err(e) if i == 0 => return Err(e),
                    Err(_) => break,
                }
            };
            match ex.meta(&next) {
                Ok(m) => qids.push(qid_of(&m)),
                Err(e) if i == 0 => return Err(e),
                Err(_) => break,
            }
            path = next;
        }
        if qids.len() == names.len() {
            let nf = Fid {
                path,
                user,
                open: None,
            };
            if newfid == fid {
                let mut fids = locked(&self.fids);
                // (Opened meanwhile by another request: counted out.)
                if fids.insert(fid, nf).is_some_and(|old| old.open.is_some()) {
                    self.closed_one();
                }
            } else {
                self.new_fid(newfid, nf)?;
            }
        }
        Ok(Rmsg::Walk { qids })
    }

    /// `Tclunk`: forgets `fid`.
    pub(super) fn tclunk(&self, fid: u32) -> R<Rmsg<'static>> {
        self.remove_fid(fid)?;
        Ok(Rmsg::Clunk)
    }
}
