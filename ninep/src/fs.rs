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

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::budget::OpenBudget;
use crate::dir::{qid_of, OpenDir};
use crate::proto::{
    lock, setattr, Attr, Flock, Qid, Request, Rmsg, SetAttr, StatFs, Tmsg, GETATTR_BASIC, IOHDRSZ,
    NOFID, VERSION,
};
use crate::sys;
use crate::users::{self, Cred, Users};

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
            // (A reentrant borrow cannot happen: dispatch calls no handler.)
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

    /// A well-formed `Tread` or `Twrite` within msize, answered in place in
    /// `out` as [`Session::handle`] would answer it, without the reply
    /// buffer, the thread's data buffer and the copies of the fid that path
    /// costs (the requests of a bulk transfer: one per msize of data).
    /// Returns the reply's length, or `None` for any other message (or an
    /// `out` too short for an `Rread`'s header).
    fn io_into(&self, msg: &[u8], out: &mut [u8]) -> Option<usize> {
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
        let ex = &self.export;
        match m {
            Tmsg::Version { msize, version } => {
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
            Tmsg::Auth { .. } => Err(errno(libc::EOPNOTSUPP)),
            Tmsg::Attach {
                fid,
                uname,
                n_uname,
                ..
            } => {
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
            Tmsg::Flush { .. } => Ok(Rmsg::Flush),
            Tmsg::Walk { fid, newfid, names } => {
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
            Tmsg::Lopen { fid, flags } => {
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
            Tmsg::Lcreate {
                fid,
                name,
                flags,
                mode,
                ..
            } => {
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
                    Err(e)
                        if e.raw_os_error() == Some(libc::EEXIST) && extra & libc::O_EXCL == 0 =>
                    {
                        let node: File =
                            sys::openat2_beneath(&dir, name, libc::O_PATH | libc::O_NOFOLLOW, 0)?
                                .into();
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
            Tmsg::Read { fid, offset, count } => {
                data.resize(self.read_len(count, usize::MAX), 0);
                let got = self.read(fid, offset, count, data)?;
                data.truncate(got);
                Ok(Rmsg::Read { data })
            }
            Tmsg::Write {
                fid,
                offset,
                data: bytes,
            } => {
                let n = self.write(fid, offset, bytes)?;
                Ok(Rmsg::Write { count: n as u32 })
            }
            Tmsg::Clunk { fid } => {
                self.remove_fid(fid)?;
                Ok(Rmsg::Clunk)
            }
            Tmsg::Remove { fid } => {
                // The fid goes whatever happens.
                let f = self.remove_fid(fid)?;
                self.writable()?;
                let m = ex.meta(&f.path)?;
                let (dir, name) = ex.parent(&f.path)?;
                let flags = if m.is_dir() { libc::AT_REMOVEDIR } else { 0 };
                sys::unlinkat(&dir, &name, flags)?;
                Ok(Rmsg::Remove)
            }
            Tmsg::Statfs { fid } => {
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
            Tmsg::Symlink {
                fid, name, target, ..
            } => {
                let qid = self.make(fid, name, |dir, name| {
                    if target.is_empty() || target.contains(&0) {
                        return Err(errno(libc::EINVAL));
                    }
                    sys::symlinkat(OsStr::from_bytes(target), dir, name)
                })?;
                Ok(Rmsg::Symlink { qid })
            }
            Tmsg::Mknod {
                dfid,
                name,
                mode,
                major,
                minor,
                ..
            } => {
                let dev = libc::makedev(major, minor);
                let qid = self.make(dfid, name, |dir, name| sys::mknodat(dir, name, mode, dev))?;
                Ok(Rmsg::Mknod { qid })
            }
            Tmsg::Mkdir {
                dfid, name, mode, ..
            } => {
                let qid = self.make(dfid, name, |dir, name| sys::mkdirat(dir, name, mode))?;
                Ok(Rmsg::Mkdir { qid })
            }
            Tmsg::Rename { fid, dfid, name } => {
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
            Tmsg::Renameat {
                olddirfid,
                oldname,
                newdirfid,
                newname,
            } => {
                self.writable()?;
                let (oname, nname) = (check_name(oldname)?, check_name(newname)?);
                let op = self.fid(olddirfid)?.path.clone();
                let np = self.fid(newdirfid)?.path.clone();
                let (odir, ndir) = (ex.dir(&op)?, ex.dir(&np)?);
                sys::renameat((&odir, oname), (&ndir, nname))?;
                self.renamed(&op.join(oname), &np.join(nname));
                Ok(Rmsg::Renameat)
            }
            Tmsg::Readlink { fid } => {
                let (dir, name) = ex.parent(&self.fid(fid)?.path)?;
                let target = sys::readlinkat(&dir, &name)?;
                *data = target;
                Ok(Rmsg::Readlink { target: data })
            }
            Tmsg::Getattr { fid, .. } => {
                let m = ex.meta(&self.fid(fid)?.path)?;
                Ok(Rmsg::Getattr(Box::new(attr_of(&m))))
            }
            Tmsg::Setattr { fid, attr } => {
                self.writable()?;
                let path = self.fid(fid)?.path.clone();
                self.setattr(&path, &attr)?;
                Ok(Rmsg::Setattr)
            }
            Tmsg::Xattrwalk { .. } | Tmsg::Xattrcreate { .. } => Err(errno(libc::EOPNOTSUPP)),
            Tmsg::Readdir { fid, offset, count } => {
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
            Tmsg::Fsync { fid, datasync } => {
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
            // POSIX byte-range locks, held by the fid's open file (an OFD
            // lock, `F_OFD_SETLK`): locks through two fids conflict, whichever
            // client holds them, and so do those of local processes. A lock
            // that conflicts is refused at once (`LOCK_BLOCKED`); the client
            // waits and asks again. The fid's locks go when its file closes.
            Tmsg::Lock { fid, lock: l } => {
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
            Tmsg::Getlock { fid, lock: l } => {
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
            Tmsg::Link { dfid, fid, name } => {
                self.writable()?;
                let name = check_name(name)?;
                let (odir, oname) = ex.parent(&self.fid(fid)?.path)?;
                let ndir = ex.dir(&self.fid(dfid)?.path)?;
                sys::linkat((&odir, &oname), (&ndir, name))?;
                Ok(Rmsg::Link)
            }
            Tmsg::Unlinkat { dfid, name, flags } => {
                self.writable()?;
                let name = check_name(name)?;
                let dir = ex.dir(&self.fid(dfid)?.path)?;
                let flags = flags as libc::c_int & libc::AT_REMOVEDIR;
                sys::unlinkat(&dir, name, flags)?;
                Ok(Rmsg::Unlinkat)
            }
        }
    }

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
