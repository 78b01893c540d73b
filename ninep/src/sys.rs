//! The few system calls `std` does not offer, each a small safe wrapper.
//!
//! Every path argument here is a single name component (checked by the
//! caller, [`crate::fs::check_name`]) or a path relative to a directory
//! descriptor that is resolved with `openat2(RESOLVE_BENEATH)`, so nothing
//! here can reach outside the served directory.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

fn cstr(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `struct open_how` of `linux/openat2.h` (libc's is `non_exhaustive`).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `openat2(dir, path, {flags, mode, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS})`:
/// `path` is resolved beneath `dir`; `..` that would climb above it, an
/// absolute path or a symlink that leads out fail with `EXDEV`.
pub fn openat2_beneath(
    dir: &impl AsRawFd,
    path: &OsStr,
    flags: libc::c_int,
    mode: u32,
) -> io::Result<OwnedFd> {
    let path = cstr(if path.is_empty() {
        OsStr::new(".")
    } else {
        path
    })?;
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 {
            u64::from(mode & 0o7777)
        } else {
            0
        },
        resolve: libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: `path` is a NUL-terminated string and `how` a valid
    // `open_how` whose size is passed; both outlive the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = libc::c_int::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel just returned this descriptor, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens again, with `flags`, the object that the `O_PATH` descriptor `fd`
/// refers to, through `/proc/self/fd` (the kernel's way to reopen a
/// descriptor): the same inode, with no path resolved again, so nothing can
/// be swapped in between. `O_NOFOLLOW` must not be in `flags` (the
/// `/proc` entry is itself a link).
pub fn reopen(fd: &impl AsRawFd, flags: libc::c_int) -> io::Result<OwnedFd> {
    let path = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `path` is NUL-terminated and outlives the call; no mode is
    // needed without O_CREAT.
    let fd = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `mkdirat(dir, name, mode)`.
pub fn mkdirat(dir: &impl AsRawFd, name: &OsStr, mode: u32) -> io::Result<()> {
    let name = cstr(name)?;
    // SAFETY: `name` is NUL-terminated and outlives the call.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode & 0o7777) })
}

/// `mknodat(dir, name, mode, dev)`.
pub fn mknodat(dir: &impl AsRawFd, name: &OsStr, mode: u32, dev: u64) -> io::Result<()> {
    let name = cstr(name)?;
    // SAFETY: `name` is NUL-terminated and outlives the call.
    check(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, dev) })
}

/// `symlinkat(target, dir, name)`.
pub fn symlinkat(target: &OsStr, dir: &impl AsRawFd, name: &OsStr) -> io::Result<()> {
    let (target, name) = (cstr(target)?, cstr(name)?);
    // SAFETY: both strings are NUL-terminated and outlive the call.
    check(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })
}

/// `readlinkat(dir, name)`.
pub fn readlinkat(dir: &impl AsRawFd, name: &OsStr) -> io::Result<Vec<u8>> {
    let name = cstr(name)?;
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: `name` is NUL-terminated; `buf` has `buf.len()` writable bytes.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// A name in a directory: `(dir, name)`.
pub type At<'a> = (&'a std::fs::File, &'a OsStr);

/// A two-name call, `f(olddir, oldname, newdir, newname)`, with the names as
/// C strings that outlive it.
fn two_names(
    (olddir, oldname): At<'_>,
    (newdir, newname): At<'_>,
    f: impl FnOnce(libc::c_int, *const libc::c_char, libc::c_int, *const libc::c_char) -> libc::c_int,
) -> io::Result<()> {
    let (o, n) = (cstr(oldname)?, cstr(newname)?);
    check(f(
        olddir.as_raw_fd(),
        o.as_ptr(),
        newdir.as_raw_fd(),
        n.as_ptr(),
    ))
}

/// `linkat(olddir, oldname, newdir, newname, 0)`: a symlink is linked, not followed.
pub fn linkat(from: At<'_>, to: At<'_>) -> io::Result<()> {
    two_names(from, to, |od, o, nd, n| {
        // SAFETY: `two_names` passes NUL-terminated strings that outlive the call.
        unsafe { libc::linkat(od, o, nd, n, 0) }
    })
}

/// `renameat(olddir, oldname, newdir, newname)`.
pub fn renameat(from: At<'_>, to: At<'_>) -> io::Result<()> {
    two_names(from, to, |od, o, nd, n| {
        // SAFETY: `two_names` passes NUL-terminated strings that outlive the call.
        unsafe { libc::renameat(od, o, nd, n) }
    })
}

/// `unlinkat(dir, name, flags)` (`AT_REMOVEDIR` or 0).
pub fn unlinkat(dir: &impl AsRawFd, name: &OsStr, flags: libc::c_int) -> io::Result<()> {
    let name = cstr(name)?;
    // SAFETY: `name` is NUL-terminated and outlives the call.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) })
}

/// `fchownat(fd, "", uid, gid, AT_EMPTY_PATH)`: the object `fd` refers to
/// (an `O_PATH` descriptor of a symlink changes the link). `u32::MAX`
/// leaves a field as it is.
pub fn fchown_fd(fd: &impl AsRawFd, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: the path is a static empty C string.
    check(unsafe {
        libc::fchownat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

/// `utimensat(dir, name, times, AT_SYMLINK_NOFOLLOW)`.
pub fn utimensat(dir: &impl AsRawFd, name: &OsStr, times: [libc::timespec; 2]) -> io::Result<()> {
    let name = cstr(name)?;
    // SAFETY: `name` is NUL-terminated and `times` two valid timespecs, both
    // outliving the call.
    check(unsafe {
        libc::utimensat(
            dir.as_raw_fd(),
            name.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

/// `fstatfs(fd)`.
pub fn fstatfs(fd: &impl AsRawFd) -> io::Result<libc::statfs> {
    // SAFETY: all-zero is a valid `statfs` (plain integers).
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `s` is a writable `statfs`.
    check(unsafe { libc::fstatfs(fd.as_raw_fd(), &mut s) })?;
    Ok(s)
}

/// Clears `O_NONBLOCK` on `fd` (set only so that opening a FIFO does not wait).
pub fn clear_nonblock(fd: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: F_GETFL takes no argument and only reads the descriptor's flags.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    check(flags)?;
    if flags & libc::O_NONBLOCK == 0 {
        return Ok(());
    }
    // SAFETY: F_SETFL takes an int of flags; nothing else is touched.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) })
}

fn flock(ty: libc::c_short, start: libc::off_t, len: libc::off_t) -> libc::flock {
    // SAFETY: all-zero is a valid `flock` (plain integers); l_pid must be 0
    // for open file description locks.
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
    // SAFETY: F_OFD_SETLK reads the `flock` pointed to, which outlives the call.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &fl as *const libc::flock) };
    match check(rc) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
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
    // SAFETY: F_OFD_GETLK reads and writes the `flock` pointed to, which
    // outlives the call.
    check(unsafe {
        libc::fcntl(
            fd.as_raw_fd(),
            libc::F_OFD_GETLK,
            &mut fl as *mut libc::flock,
        )
    })?;
    Ok((fl.l_type != libc::F_UNLCK as libc::c_short).then_some(fl))
}

/// The effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Sets this thread's supplementary groups, file-system group and
/// file-system user (in that order: the groups need `CAP_SETGID`, which a
/// non-zero fsuid leaves alone) through the raw system calls, which change
/// the calling thread only (glibc's `setgroups` changes every thread).
/// `setfsuid` and `setfsgid` report no error: each is read back.
pub fn set_fs_cred(uid: u32, gid: u32, groups: &[u32]) -> io::Result<()> {
    // SAFETY: `groups` holds `groups.len()` gids (`gid_t` is `u32`), which
    // the kernel only reads.
    let rc = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    for (call, id) in [(libc::SYS_setfsgid, gid), (libc::SYS_setfsuid, uid)] {
        // SAFETY: setfsgid/setfsuid take an id and cannot fault; `-1` (no
        // id) changes nothing and returns the current one.
        let now = unsafe {
            libc::syscall(call, id);
            libc::syscall(call, u32::MAX)
        };
        if now != libc::c_long::from(id) {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
    }
    Ok(())
}

/// Raises this process's soft limit of open files to its hard limit;
/// returns the limit now in force.
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `l` is a valid rlimit to fill.
    check(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) })?;
    if l.rlim_cur < l.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: l.rlim_max,
            rlim_max: l.rlim_max,
        };
        // SAFETY: a valid rlimit, read above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            l = raised;
        }
    }
    Ok(l.rlim_cur)
}

/// Moves a directory's position to `offset` (0, or a `d_off` it gave).
pub fn seek_set(fd: &impl AsRawFd, offset: i64) -> io::Result<()> {
    // SAFETY: lseek on a descriptor the caller holds.
    let rc = unsafe { libc::lseek(fd.as_raw_fd(), offset, libc::SEEK_SET) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads directory entries (`struct linux_dirent64` records) into `buf`
/// from the directory's position on; returns how many bytes, 0 at the end.
pub fn getdents64(fd: &impl AsRawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            fd.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}
