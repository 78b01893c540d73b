//! The system calls `std` does not offer, through `rustix` (the calls on
//! descriptors and paths, which take and return `OwnedFd`/`BorrowedFd`) and
//! `nix` (open file description locks, the file-system ids, resource
//! limits): small wrappers that keep the rest of the crate in `std`'s and
//! `libc`'s terms.
//!
//! Every path argument here is a single name component (checked by the
//! caller, [`crate::fs::check_name`]) or a path relative to a directory
//! descriptor that is resolved with `openat2(RESOLVE_BENEATH)`, so nothing
//! here can reach outside the served directory.

use std::ffi::OsStr;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::fcntl::{fcntl, FcntlArg};
use nix::unistd::{Gid, Uid};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, RawDir, ResolveFlags, Timespec, Timestamps};

/// `openat2(dir, path, {flags, mode, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS})`:
/// `path` is resolved beneath `dir`; `..` that would climb above it, an
/// absolute path or a symlink that leads out fail with `EXDEV`.
pub fn openat2_beneath(
    dir: &impl AsFd,
    path: &OsStr,
    flags: libc::c_int,
    mode: u32,
) -> io::Result<OwnedFd> {
    let path = if path.is_empty() {
        OsStr::new(".")
    } else {
        path
    };
    // The mode matters only to a file being made; the kernel refuses one
    // given otherwise.
    let mode = if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 {
        Mode::from_raw_mode(mode & 0o7777)
    } else {
        Mode::empty()
    };
    Ok(rustix::fs::openat2(
        dir,
        path,
        oflags(flags | libc::O_CLOEXEC),
        mode,
        ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
    )?)
}

/// `open(2)`'s flags as rustix's type, every bit kept.
fn oflags(flags: libc::c_int) -> OFlags {
    OFlags::from_bits_retain(flags as u32)
}

/// Opens again, with `flags`, the object that the `O_PATH` descriptor `fd`
/// refers to, through `/proc/self/fd` (the kernel's way to reopen a
/// descriptor): the same inode, with no path resolved again, so nothing can
/// be swapped in between. `O_NOFOLLOW` must not be in `flags` (the
/// `/proc` entry is itself a link).
pub fn reopen(fd: &impl AsRawFd, flags: libc::c_int) -> io::Result<OwnedFd> {
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    // No mode: nothing is created (no O_CREAT).
    Ok(rustix::fs::open(
        path.as_str(),
        oflags(flags | libc::O_CLOEXEC),
        Mode::empty(),
    )?)
}

/// `mkdirat(dir, name, mode)`.
pub fn mkdirat(dir: &impl AsFd, name: &OsStr, mode: u32) -> io::Result<()> {
    Ok(rustix::fs::mkdirat(
        dir,
        name,
        Mode::from_raw_mode(mode & 0o7777),
    )?)
}

/// `mknodat(dir, name, mode, dev)`: `mode` holds the file type and the
/// permission bits, as `mknod(2)`'s does (no type is a regular file; a
/// type that is none of the known ones stays invalid, `EINVAL`).
pub fn mknodat(dir: &impl AsFd, name: &OsStr, mode: u32, dev: u64) -> io::Result<()> {
    let file_type = match mode & libc::S_IFMT {
        0 => FileType::RegularFile,
        t => FileType::from_raw_mode(t),
    };
    Ok(rustix::fs::mknodat(
        dir,
        name,
        file_type,
        Mode::from_raw_mode(mode & !libc::S_IFMT),
        dev,
    )?)
}

/// `symlinkat(target, dir, name)`.
pub fn symlinkat(target: &OsStr, dir: &impl AsFd, name: &OsStr) -> io::Result<()> {
    Ok(rustix::fs::symlinkat(target, dir, name)?)
}

/// `readlinkat(dir, name)`.
pub fn readlinkat(dir: &impl AsFd, name: &OsStr) -> io::Result<Vec<u8>> {
    let target = rustix::fs::readlinkat(dir, name, Vec::new())?;
    Ok(target.into_bytes())
}

/// A name in a directory: `(dir, name)`.
pub type At<'a> = (&'a std::fs::File, &'a OsStr);

/// `linkat(olddir, oldname, newdir, newname, 0)`: a symlink is linked, not followed.
pub fn linkat((olddir, oldname): At<'_>, (newdir, newname): At<'_>) -> io::Result<()> {
    Ok(rustix::fs::linkat(
        olddir,
        oldname,
        newdir,
        newname,
        AtFlags::empty(),
    )?)
}

/// `renameat(olddir, oldname, newdir, newname)`.
pub fn renameat((olddir, oldname): At<'_>, (newdir, newname): At<'_>) -> io::Result<()> {
    Ok(rustix::fs::renameat(olddir, oldname, newdir, newname)?)
}

/// `unlinkat(dir, name, flags)` (`AT_REMOVEDIR` or 0).
pub fn unlinkat(dir: &impl AsFd, name: &OsStr, flags: libc::c_int) -> io::Result<()> {
    Ok(rustix::fs::unlinkat(
        dir,
        name,
        AtFlags::from_bits_retain(flags as u32),
    )?)
}

/// `fchownat(fd, "", uid, gid, AT_EMPTY_PATH)`: the object `fd` refers to
/// (an `O_PATH` descriptor of a symlink changes the link). `u32::MAX`
/// leaves a field as it is.
pub fn fchown_fd(fd: &impl AsFd, uid: u32, gid: u32) -> io::Result<()> {
    let uid = (uid != u32::MAX).then(|| rustix::fs::Uid::from_raw(uid));
    let gid = (gid != u32::MAX).then(|| rustix::fs::Gid::from_raw(gid));
    Ok(rustix::fs::chownat(
        fd,
        "",
        uid,
        gid,
        AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
    )?)
}

/// `utimensat(dir, name, times, AT_SYMLINK_NOFOLLOW)`: access then
/// modification time, each of which may be `UTIME_NOW` or `UTIME_OMIT`.
pub fn utimensat(dir: &impl AsFd, name: &OsStr, times: [libc::timespec; 2]) -> io::Result<()> {
    let ts = |t: libc::timespec| Timespec {
        tv_sec: t.tv_sec,
        tv_nsec: t.tv_nsec as _,
    };
    let times = Timestamps {
        last_access: ts(times[0]),
        last_modification: ts(times[1]),
    };
    Ok(rustix::fs::utimensat(
        dir,
        name,
        &times,
        AtFlags::SYMLINK_NOFOLLOW,
    )?)
}

/// `fstatfs(fd)`.
pub fn fstatfs(fd: &impl AsFd) -> io::Result<rustix::fs::StatFs> {
    Ok(rustix::fs::fstatfs(fd)?)
}

/// Clears `O_NONBLOCK` on `fd` (set only so that opening a FIFO does not wait).
pub fn clear_nonblock(fd: &impl AsFd) -> io::Result<()> {
    let flags = rustix::fs::fcntl_getfl(fd)?;
    if flags.contains(OFlags::NONBLOCK) {
        rustix::fs::fcntl_setfl(fd, flags - OFlags::NONBLOCK)?;
    }
    Ok(())
}

fn flock(ty: libc::c_short, start: libc::off_t, len: libc::off_t) -> libc::flock {
    // SAFETY: all-zero is a valid `flock` (plain integers; l_pid must be 0
    // for open file description locks). Zeroing, rather than a struct
    // literal, also covers the padding fields some targets' `flock` has.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ty;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start;
    fl.l_len = len;
    fl
}

/// `fcntl(fd, F_OFD_SETLK, {ty, start, len})`: an open file description
/// lock (`F_RDLCK`, `F_WRLCK` or `F_UNLCK` to release). `Ok(false)` when
/// another open file holds a conflicting lock (`EAGAIN`/`EACCES`).
pub fn ofd_setlk(
    fd: &impl AsRawFd,
    ty: libc::c_short,
    start: libc::off_t,
    len: libc::off_t,
) -> io::Result<bool> {
    let fl = flock(ty, start, len);
    match fcntl(fd.as_raw_fd(), FcntlArg::F_OFD_SETLK(&fl)) {
        Ok(_) => Ok(true),
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// `fcntl(fd, F_OFD_GETLK, {ty, start, len})`: the first lock that would
/// conflict with that one, if any.
pub fn ofd_getlk(
    fd: &impl AsRawFd,
    ty: libc::c_short,
    start: libc::off_t,
    len: libc::off_t,
) -> io::Result<Option<libc::flock>> {
    let mut fl = flock(ty, start, len);
    fcntl(fd.as_raw_fd(), FcntlArg::F_OFD_GETLK(&mut fl))?;
    Ok((fl.l_type != libc::F_UNLCK as libc::c_short).then_some(fl))
}

/// The effective user id.
pub fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Sets this thread's supplementary groups, file-system group and
/// file-system user (in that order: the groups need `CAP_SETGID`, which a
/// non-zero fsuid leaves alone). Each changes the calling thread only:
/// the groups through rustix's `set_thread_groups`, the raw system call
/// (glibc's `setgroups`, and nix's, change every thread), the ids through
/// `setfsgid`/`setfsuid`, which glibc does not broadcast. Those two
/// report no error: each is read back (`-1`, no id, changes nothing and
/// returns the current one).
pub fn set_fs_cred(uid: u32, gid: u32, groups: &[u32]) -> io::Result<()> {
    let groups: Vec<_> = groups
        .iter()
        .map(|&g| rustix::thread::Gid::from_raw(g))
        .collect();
    rustix::thread::set_thread_groups(&groups)?;
    nix::unistd::setfsgid(Gid::from_raw(gid));
    let now = nix::unistd::setfsgid(Gid::from_raw(u32::MAX)).as_raw();
    if now != gid {
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    nix::unistd::setfsuid(Uid::from_raw(uid));
    let now = nix::unistd::setfsuid(Uid::from_raw(u32::MAX)).as_raw();
    if now != uid {
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    Ok(())
}

/// Raises this process's soft limit of open files to its hard limit;
/// returns the limit now in force.
pub fn raise_nofile_limit() -> io::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return Ok(hard);
    }
    Ok(soft)
}

/// Moves a directory's position to `offset` (0, or a `d_off` it gave).
pub fn seek_set(fd: &impl AsRawFd, offset: i64) -> io::Result<()> {
    nix::unistd::lseek(fd.as_raw_fd(), offset, nix::unistd::Whence::SeekSet)?;
    Ok(())
}

/// One directory entry as `getdents64` gives it.
pub struct Dirent<'a> {
    /// Its inode.
    pub ino: u64,
    /// The position after it (`d_off`, the file system's cookie).
    pub next: u64,
    /// `d_type` (`DT_DIR` ...).
    pub d_type: u8,
    /// Its name.
    pub name: &'a [u8],
}

/// Calls `each` for every entry of the directory from its position on,
/// read with `getdents64` into `buf`, until `each` returns `Ok(false)` or
/// the directory ends.
pub fn read_dir(
    fd: &impl AsFd,
    buf: &mut [MaybeUninit<u8>],
    mut each: impl FnMut(Dirent<'_>) -> io::Result<bool>,
) -> io::Result<()> {
    let mut dir = RawDir::new(fd, buf);
    while let Some(entry) = dir.next() {
        let entry = entry?;
        let more = each(Dirent {
            ino: entry.ino(),
            next: entry.next_entry_cookie(),
            d_type: d_type(entry.file_type()),
            name: entry.file_name().to_bytes(),
        })?;
        if !more {
            break;
        }
    }
    Ok(())
}

/// The `DT_*` value of a type rustix read from `d_type`.
fn d_type(t: FileType) -> u8 {
    match t {
        FileType::RegularFile => libc::DT_REG,
        FileType::Directory => libc::DT_DIR,
        FileType::Symlink => libc::DT_LNK,
        FileType::Fifo => libc::DT_FIFO,
        FileType::Socket => libc::DT_SOCK,
        FileType::CharacterDevice => libc::DT_CHR,
        FileType::BlockDevice => libc::DT_BLK,
        _ => libc::DT_UNKNOWN,
    }
}
