//! The served directory and one connection's session: fids and the
//! operations of 9P2000.L on them.
//!
//! # Staying beneath the root
//! A fid is a path relative to the served directory made only of plain
//! names (`..` in a walk drops the last one, never above the root; a name
//! with `/`, an empty name or `.` is refused). Every use resolves it with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` from the root's
//! descriptor, so a symlink or a rename that would lead outside fails with
//! `EXDEV` instead. Operations on a name (create, unlink, rename, link,
//! readlink, times) resolve its directory that way and then act on the one
//! name with the `*at` call that does not follow it.
//!
//! # Where things are
//! This file holds the export, the session with its fid table, and
//! [`Session::handle`], whose dispatch sends each request to its handler
//! (`Session::t*`, named after the message) with the credentials of the
//! user it acts for. The handlers live by family:
//! - `fids`: `Tversion`, `Tattach`, `Twalk`, `Tclunk` (making and dropping
//!   fids);
//! - `open`: `Tlopen`, `Tlcreate`, and how a file is opened so that nothing
//!   waits on a client's behalf;
//! - `file_io`: `Tread`, `Twrite` (also answered in place in the send buffer),
//!   `Treaddir`, `Tfsync`;
//! - `names`: creating, linking, renaming and removing names, `Treadlink`;
//! - `attr`: `Tgetattr`, `Tsetattr`, `Tstatfs`;
//! - `locks`: `Tlock`, `Tgetlock` (OFD byte-range locks).
//!
//! `Tauth`, `Txattrwalk` and `Txattrcreate` are answered `EOPNOTSUPP`, and
//! `Tflush` at once, in the dispatch itself.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::budget::OpenBudget;
use crate::dir::OpenDir;
use crate::proto::{Request, Rmsg, Tmsg, NOFID};
use crate::sys;
use crate::users::{self, Cred, Users};

mod attr;
mod fids;
mod file_io;
mod locks;
mod names;
mod open;

/// The smallest msize this server agrees to (room for a reply header and
/// a directory entry of a long name).
pub const MIN_MSIZE: u32 = 4096;

/// What is served: a directory, opened once. Cloning shares it.
#[derive(Debug, Clone)]
pub struct Export {
    root: Arc<OwnedFd>,
    read_only: bool,
    max_fids: usize,
    /// The open files connections may hold ([`Export::with_open_budget`]).
    open_budget: Arc<OpenBudget>,
    /// How clients' users map to the server's ([`crate::users`]).
    users: Users,
}

impl Export {
    /// Opens `dir` to serve it, clients' users mapped as by
    /// [`Users::default`] (root squashed; see [`Export::with_users`]).
    ///
    /// # Errors
    /// When `dir` cannot be opened as a directory.
    pub fn new(dir: &Path, read_only: bool, max_fids: usize) -> io::Result<Export> {
        let root = File::open(dir)?;
        if !root.metadata()?.is_dir() {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        Ok(Export {
            root: Arc::new(root.into()),
            read_only,
            max_fids,
            open_budget: Arc::new(OpenBudget::new(max_fids, 0)),
            users: Users::default(),
        })
    }

    /// The same export with its connections' open files (fids opened with
    /// `Tlopen` or `Tlcreate`) taken from `budget`: each connection its
    /// guaranteed share, then the pool they share (`EMFILE` past it, for that
    /// client only), so that one client holding many files cannot make
    /// another's open fail ([`crate::budget`], `server::open_budget`). Fids not
    /// open count only against `max_fids`. Without it, each connection may
    /// open as many files as it has fids.
    pub fn with_open_budget(mut self, budget: Arc<OpenBudget>) -> Export {
        self.open_budget = budget;
        self
    }

    /// The same export with clients' users mapped by `users`.
    pub fn with_users(mut self, users: Users) -> Export {
        self.users = users;
        self
    }

    /// Whether changes are refused.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    fn open(&self, rel: &Path, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
        sys::openat2_beneath(&*self.root, rel.as_os_str(), flags, mode)
    }

    /// An `O_PATH` descriptor of `rel` itself (a symlink is not followed).
    fn opath(&self, rel: &Path) -> io::Result<File> {
        Ok(self.open(rel, libc::O_PATH | libc::O_NOFOLLOW, 0)?.into())
    }

    fn meta(&self, rel: &Path) -> io::Result<Metadata> {
        self.opath(rel)?.metadata()
    }

    /// The directory `rel` as an `O_PATH` descriptor, for `*at` calls.
    fn dir(&self, rel: &Path) -> io::Result<File> {
        Ok(self.open(rel, libc::O_PATH | libc::O_DIRECTORY, 0)?.into())
    }

    /// `rel`'s directory and last name; the root has neither (`EBUSY`).
    fn parent(&self, rel: &Path) -> io::Result<(File, OsString)> {
        let name = rel.file_name().ok_or_else(|| errno(libc::EBUSY))?;
        let dir = rel.parent().unwrap_or(Path::new(""));
        Ok((self.dir(dir)?, name.to_os_string()))
    }
}

/// The errno an `Rlerror` carries for `e` (`EIO` if it has none).
fn ecode(e: &io::Error) -> u32 {
    e.raw_os_error().unwrap_or(libc::EIO) as u32
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// A name a client may create or walk to: not empty, not `.` or `..`, no
/// `/` or NUL.
pub fn check_name(name: &[u8]) -> io::Result<&OsStr> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(errno(libc::EINVAL));
    }
    Ok(OsStr::from_bytes(name))
}

/// An open fid's file. A request in progress holds it by `Arc`, so a
/// clunk (or the end of the connection) closes the descriptor when the
/// last request using it is done.
#[derive(Debug)]
enum Open {
    File {
        file: File,
        writable: bool,
        /// A regular file (not a FIFO or a socket): reading or writing it
        /// never waits for another party.
        regular: bool,
    },
    Dir(OpenDir),
}

#[derive(Debug, Clone)]
struct Fid {
    path: PathBuf,
    /// Who the fid acts for: every request on it runs with these
    /// credentials (from its `Tattach`, kept by walks).
    user: Arc<Cred>,
    open: Option<Arc<Open>>,
}

/// One connection's state: its msize and its fids. Requests may be handled
/// on several threads at once (`&self`): the fid table is locked only to
/// look a fid up or change it, never during I/O. Dropping the session (or
/// [`Session::close_all`]) closes every file the client had open.
#[derive(Debug)]
pub struct Session {
    export: Export,
    max_msize: u32,
    msize: AtomicU32,
    fids: Mutex<HashMap<u32, Fid>>,
    /// How many of `fids` are open; changed only under `fids`' lock.
    open_fids: std::sync::atomic::AtomicUsize,
}

type R<T> = io::Result<T>;

thread_local! {
    /// Each thread's buffer for the data of a reply (`Rread`, `Rreaddir`).
    static DATA: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A mutex's guard, even if a thread panicked while holding it (the fid
/// table stays consistent: every change is one map operation).
fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Session {
    /// A session that will agree to an msize of at most `max_msize`.
    pub fn new(export: &Export, max_msize: u32) -> Session {
        Session {
            export: export.clone(),
            max_msize: max_msize.max(MIN_MSIZE),
            msize: AtomicU32::new(max_msize.max(MIN_MSIZE)),
            fids: Mutex::new(HashMap::new()),
            open_fids: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The negotiated msize (the maximum until `Tversion`).
    pub fn msize(&self) -> u32 {
        self.msize.load(Ordering::Relaxed)
    }

    /// How many fids are in use.
    pub fn fids(&self) -> usize {
        locked(&self.fids).len()
    }

    /// Whether `msg` is a `Tread` or `Twrite` of a fid open on a regular
    /// file: a request that never waits for another party (a FIFO's other
    /// end, a lock holder), only for the file system, so a server may run
    /// it where it receives it instead of handing it to another thread.
    /// Anything else, malformed messages included, is `false`.
    pub fn is_file_io(&self, msg: &[u8]) -> bool {
        let ty = msg.get(4).copied();
        if ty != Some(crate::proto::ty::TREAD) && ty != Some(crate::proto::ty::TWRITE) {
            return false;
        }
        let Some(fid) = msg.get(7..11) else {
            return false;
        };
        let fid = u32::from_le_bytes([fid[0], fid[1], fid[2], fid[3]]);
        let fids = locked(&self.fids);
        matches!(
            fids.get(&fid).and_then(|f| f.open.as_deref()),
            Some(Open::File { regular: true, .. })
        )
    }

    /// Forgets every fid (the connection is gone): their files close now,
    /// or when a request still using one ends.
    pub fn close_all(&self) {
        let fids = {
            let mut fids = locked(&self.fids);
            let held = self.open_fids.swap(0, Ordering::Relaxed);
            self.export.open_budget.release(held, held);
            std::mem::take(&mut *fids)
        };
        drop(fids);
    }

    /// How many fids are open on a file or directory.
    pub fn open_fids(&self) -> usize {
        let _fids = locked(&self.fids);
        self.open_fids.load(Ordering::Relaxed)
    }

    /// `EMFILE` when this connection may not open one more file now (see
    /// [`Export::with_open_budget`]): asked before a file is opened or
    /// created, so that a refused `Tlcreate` leaves nothing behind (its
    /// `set_open` asks again, and takes it).
    fn may_open(&self) -> R<()> {
        let held = self.open_fids();
        let budget = &self.export.open_budget;
        if held >= budget.guaranteed() && budget.pool().0 >= budget.pool().1 {
            return Err(errno(libc::EMFILE));
        }
        Ok(())
    }

    /// Counts one open fid out (under the fids' lock).
    fn closed_one(&self) {
        let held = self.open_fids.fetch_sub(1, Ordering::Relaxed);
        self.export.open_budget.release(held, 1);
    }

    /// Removes a fid (`Tclunk`, `Tremove`), counting it out of the open
    /// ones if it was open.
    fn remove_fid(&self, fid: u32) -> R<Fid> {
        let mut fids = locked(&self.fids);
        let f = fids.remove(&fid).ok_or_else(|| errno(libc::EBADF))?;
        if f.open.is_some() {
            self.closed_one();
        }
        Ok(f)
    }

    /// Handles one message and writes its reply at the end of `out`.
    ///
    /// # Errors
    /// A message whose header is not sound (size field wrong, shorter than
    /// a header): the connection should be closed. Everything else,
    /// malformed bodies included, gets a reply (`Rlerror`).
    pub fn handle(&self, msg: &[u8], out: &mut Vec<u8>) -> Result<(), crate::proto::DecodeError> {
        if msg.len() > self.msize() as usize {
            // Larger than agreed: answered if the header is sound.
            let (_, tag, _) = crate::proto::split(msg)?;
            Rmsg::Lerror {
                ecode: libc::EMSGSIZE as u32,
            }
            .encode(tag, out);
            return Ok(());
        }
        let req = match Request::decode(msg) {
            Ok(r) => r,
            Err(bad) => {
                let tag = bad.tag.ok_or_else(|| bad.error.clone())?;
                let ecode = match bad.error {
                    crate::proto::DecodeError::UnknownType(_) => libc::EOPNOTSUPP,
                    _ => libc::EPROTO,
                };
                Rmsg::Lerror {
                    ecode: ecode as u32,
                }
                .encode(tag, out);
                return Ok(());
            }
        };
        let tag = req.tag;
        DATA.with(|d| {
            // (A reentrant borrow cannot happen: no handler calls `handle`.)
            let mut fresh = Vec::new();
            let mut held = d.try_borrow_mut();
            let data = match &mut held {
                Ok(d) => &mut **d,
                Err(_) => &mut fresh,
            };
            data.clear();
            match self.dispatch(req.msg, data) {
                Ok(r) => r.encode(tag, out),
                Err(e) => Rmsg::Lerror { ecode: ecode(&e) }.encode(tag, out),
            };
            // Keep no more than one msize of memory per thread.
            if data.capacity() > self.max_msize as usize {
                *data = Vec::new();
            }
        });
        Ok(())
    }

    /// Handles one message and writes its reply at the start of `out` (the
    /// send buffer, at least [`MIN_MSIZE`] bytes); returns the reply's length.
    /// A `Tread` or `Twrite` is answered in place:
    /// a read's bytes go from the file straight into `out` after the reply's
    /// header, the only copy of a read on this side. Other replies are
    /// encoded as by [`Session::handle`] and copied; one that would not fit
    /// in `out` is answered with `EMSGSIZE`.
    ///
    /// # Errors
    /// As [`Session::handle`].
    pub fn handle_into(
        &self,
        msg: &[u8],
        out: &mut [u8],
    ) -> Result<usize, crate::proto::DecodeError> {
        if let Some(len) = self.io_into(msg, out) {
            return Ok(len);
        }
        let mut reply = Vec::new();
        self.handle(msg, &mut reply)?;
        if reply.len() > out.len() {
            let (_, tag, _) = crate::proto::split(msg)?;
            reply.clear();
            Rmsg::Lerror {
                ecode: libc::EMSGSIZE as u32,
            }
            .encode(tag, &mut reply);
        }
        let room = out
            .get_mut(..reply.len())
            .ok_or(crate::proto::DecodeError::Short)?;
        room.copy_from_slice(&reply);
        Ok(reply.len())
    }

    /// The fid's open file, shared (`EBADF` if the fid is unknown or not
    /// open): a read or write needs only that, not a copy of its path.
    fn open_of(&self, fid: u32) -> R<Arc<Open>> {
        locked(&self.fids)
            .get(&fid)
            .and_then(|f| f.open.clone())
            .ok_or_else(|| errno(libc::EBADF))
    }

    /// A copy of the fid's state (its open file shared).
    fn fid(&self, fid: u32) -> R<Fid> {
        locked(&self.fids)
            .get(&fid)
            .cloned()
            .ok_or_else(|| errno(libc::EBADF))
    }

    /// Sets the open file of a fid that had none (`EBADF` if it is gone or
    /// was opened meanwhile); `path` replaces its path when given.
    fn set_open(&self, fid: u32, open: Open, path: Option<PathBuf>) -> R<()> {
        let mut fids = locked(&self.fids);
        let f = fids.get_mut(&fid).ok_or_else(|| errno(libc::EBADF))?;
        if f.open.is_some() {
            return Err(errno(libc::EBADF));
        }
        if !self
            .export
            .open_budget
            .acquire(self.open_fids.load(Ordering::Relaxed))
        {
            // This client's share and the pool are used up (the file just
            // opened closes with `open`).
            return Err(errno(libc::EMFILE));
        }
        self.open_fids.fetch_add(1, Ordering::Relaxed);
        f.open = Some(Arc::new(open));
        if let Some(p) = path {
            f.path = p;
        }
        Ok(())
    }

    fn writable(&self) -> R<()> {
        if self.export.read_only {
            Err(errno(libc::EROFS))
        } else {
            Ok(())
        }
    }

    fn new_fid(&self, newfid: u32, fid: Fid) -> R<()> {
        if newfid == NOFID {
            return Err(errno(libc::EINVAL));
        }
        let mut fids = locked(&self.fids);
        if fids.contains_key(&newfid) {
            return Err(errno(libc::EBADF));
        }
        if fids.len() >= self.export.max_fids {
            return Err(errno(libc::EMFILE));
        }
        fids.insert(newfid, fid);
        Ok(())
    }

    /// Whom a request acts for: the user of the fid it works through, with
    /// the group it asks new files to get when that is one of the user's
    /// ([`Cred::creating_as`]). `None` for requests that touch no file
    /// system object through a path (version, flush, clunk, reads and
    /// writes of an open file, whose permissions were checked when it was
    /// opened), and for `Tattach`, which names its own user.
    fn user_for(&self, m: &Tmsg<'_>) -> R<Option<Arc<Cred>>> {
        let (fid, gid) = match *m {
            Tmsg::Walk { fid, .. }
            | Tmsg::Lopen { fid, .. }
            | Tmsg::Remove { fid }
            | Tmsg::Statfs { fid }
            | Tmsg::Rename { fid, .. }
            | Tmsg::Readlink { fid }
            | Tmsg::Getattr { fid, .. }
            | Tmsg::Setattr { fid, .. }
            | Tmsg::Readdir { fid, .. }
            | Tmsg::Renameat { olddirfid: fid, .. }
            | Tmsg::Link { dfid: fid, .. }
            | Tmsg::Unlinkat { dfid: fid, .. } => (fid, None),
            Tmsg::Lcreate { fid, gid, .. }
            | Tmsg::Symlink { fid, gid, .. }
            | Tmsg::Mknod { dfid: fid, gid, .. }
            | Tmsg::Mkdir { dfid: fid, gid, .. } => (fid, Some(gid)),
            _ => return Ok(None),
        };
        let user = locked(&self.fids)
            .get(&fid)
            .map(|f| Arc::clone(&f.user))
            .ok_or_else(|| errno(libc::EBADF))?;
        Ok(Some(match gid {
            Some(gid) if gid != user.gid => Arc::new(user.creating_as(gid)),
            _ => user,
        }))
    }

    /// Handles a request with the credentials of the user it acts for
    /// ([`Session::user_for`]), this thread itself again afterwards.
    fn dispatch<'d>(&self, m: Tmsg<'_>, data: &'d mut Vec<u8>) -> R<Rmsg<'d>> {
        let user = self.user_for(&m)?;
        let _as_user = user.as_deref().map(users::as_user).transpose()?;
        self.dispatch_as_user(m, data)
    }

    fn dispatch_as_user<'d>(&self, m: Tmsg<'_>, data: &'d mut Vec<u8>) -> R<Rmsg<'d>> {
        match m {
            Tmsg::Version { msize, version } => self.tversion(msize, version),
            Tmsg::Auth { .. } => Err(errno(libc::EOPNOTSUPP)),
            Tmsg::Attach {
                fid,
                uname,
                n_uname,
                ..
            } => self.tattach(fid, uname, n_uname),
            Tmsg::Flush { .. } => Ok(Rmsg::Flush),
            Tmsg::Walk { fid, newfid, names } => self.twalk(fid, newfid, names),
            Tmsg::Lopen { fid, flags } => self.tlopen(fid, flags),
            Tmsg::Lcreate {
                fid,
                name,
                flags,
                mode,
                ..
            } => self.tlcreate(fid, name, flags, mode),
            Tmsg::Read { fid, offset, count } => self.tread(fid, offset, count, data),
            Tmsg::Write { fid, offset, data } => self.twrite(fid, offset, data),
            Tmsg::Clunk { fid } => self.tclunk(fid),
            Tmsg::Remove { fid } => self.tremove(fid),
            Tmsg::Statfs { fid } => self.tstatfs(fid),
            Tmsg::Symlink {
                fid, name, target, ..
            } => self.tsymlink(fid, name, target),
            Tmsg::Mknod {
                dfid,
                name,
                mode,
                major,
                minor,
                ..
            } => self.tmknod(dfid, name, mode, major, minor),
            Tmsg::Mkdir {
                dfid, name, mode, ..
            } => self.tmkdir(dfid, name, mode),
            Tmsg::Rename { fid, dfid, name } => self.trename(fid, dfid, name),
            Tmsg::Renameat {
                olddirfid,
                oldname,
                newdirfid,
                newname,
            } => self.trenameat(olddirfid, oldname, newdirfid, newname),
            Tmsg::Readlink { fid } => self.treadlink(fid, data),
            Tmsg::Getattr { fid, .. } => self.tgetattr(fid),
            Tmsg::Setattr { fid, attr } => self.tsetattr(fid, attr),
            Tmsg::Xattrwalk { .. } | Tmsg::Xattrcreate { .. } => Err(errno(libc::EOPNOTSUPP)),
            Tmsg::Readdir { fid, offset, count } => self.treaddir(fid, offset, count, data),
            Tmsg::Fsync { fid, datasync } => self.tfsync(fid, datasync),
            Tmsg::Lock { fid, lock } => self.tlock(fid, lock),
            Tmsg::Getlock { fid, lock } => self.tgetlock(fid, lock),
            Tmsg::Link { dfid, fid, name } => self.tlink(dfid, fid, name),
            Tmsg::Unlinkat { dfid, name, flags } => self.tunlinkat(dfid, name, flags),
        }
    }
}
