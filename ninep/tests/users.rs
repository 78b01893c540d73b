//! Who may do what: each request acts with its client's user's credentials
//! (`rdma_9p::users`), driven through `Session::handle` as a hostile client
//! would (no device). The server must run as root to act as other users,
//! so these tests need root (CI runs as root; so does the VM).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

mod common;

use common::session::{lcreate, lerror, mkdir, mknod_null, setattr, Client, TempDir};
use rdma_9p::fs::Export;
use rdma_9p::proto::{setattr as valid, Tmsg};
use rdma_9p::users::{Squash, Users};

const EACCES: u32 = libc::EACCES as u32;
const EPERM: u32 = libc::EPERM as u32;
/// A uid and gid this machine's databases need not know.
const USER: u32 = 4_000_123;

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "these tests check that the server acts as its clients' users, which needs a \
         server running as root: run them as root (ci/test does; or in the VM, ci/vm run)"
    );
}

fn export(dir: &Path, squash: Squash) -> Export {
    require_root();
    Export::new(dir, false, 64).unwrap().with_users(Users {
        squash,
        anon_uid: 65534,
        anon_gid: 65534,
    })
}

/// A fresh directory anybody may create in (mode 1777, as `/tmp`).
fn open_to_all(what: &str) -> TempDir {
    let t = TempDir::new(what);
    std::fs::set_permissions(&t.0, std::fs::Permissions::from_mode(0o1777)).unwrap();
    t
}

/// A root-owned file of `mode` in `dir`.
fn root_file(dir: &Path, name: &str, mode: u32) {
    let p = dir.join(name);
    std::fs::write(&p, b"root's").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn open(c: &mut Client<'_>, fid: u32, name: &[u8], flags: i32) -> Option<u32> {
    let walked = lerror(&c.walk(0, fid, &[name]));
    assert_eq!(walked, None, "walk to {:?}", String::from_utf8_lossy(name));
    lerror(&c.rpc(Tmsg::Lopen {
        fid,
        flags: flags as u32,
    }))
}

/// This thread's file-system uid and gid, and groups, from the kernel.
fn thread_ids() -> (String, String, String) {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    let line = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap()
            .trim()
            .to_string()
    };
    (line("Uid:"), line("Gid:"), line("Groups:"))
}

/// A client attached as another user opens a root-owned 0600 file as the
/// kernel would let that user: refused, for reading and for writing, and
/// the file is untouched. Before, the server opened it with its own (root)
/// credentials and the client overwrote it.
#[test]
fn a_user_cannot_open_another_s_private_file() {
    let t = TempDir::new("users-private");
    root_file(&t.0, "secret", 0o600);
    root_file(&t.0, "public", 0o644);
    let ex = export(&t.0, Squash::Root);
    let mut c = Client::attach_as(&ex, b"", USER);
    assert_eq!(open(&mut c, 1, b"secret", libc::O_RDWR), Some(EACCES));
    assert_eq!(open(&mut c, 2, b"secret", libc::O_RDONLY), Some(EACCES));
    assert_eq!(open(&mut c, 3, b"public", libc::O_RDWR), Some(EACCES));
    assert_eq!(open(&mut c, 4, b"public", libc::O_RDONLY), None);
    assert_eq!(std::fs::read(t.0.join("secret")).unwrap(), b"root's");
    // Not even through Tlcreate of the existing name.
    let out = c.rpc(lcreate(0, b"secret", 0o666));
    assert_eq!(lerror(&out), Some(EACCES));
    // The thread that ran those requests is the server again.
    let ids = thread_ids();
    assert!(ids.0.ends_with("\t0") && ids.0.starts_with('0'), "{ids:?}");
    assert!(ids.1.ends_with("\t0") && ids.1.starts_with('0'), "{ids:?}");
}

/// What a user creates is the user's, with the group it asks for only when
/// it is in it; an existing file opened by `Tlcreate` keeps its owner.
#[test]
fn creations_belong_to_the_user_and_existing_files_keep_their_owner() {
    let t = open_to_all("users-create");
    root_file(&t.0, "shared", 0o666);
    let ex = export(&t.0, Squash::Root);
    let mut c = Client::attach_as(&ex, b"", USER);
    // Tlcreate opens the fid it is given: clones of the root for each.
    for fid in [5, 1] {
        assert_eq!(lerror(&c.walk(0, fid, &[])), None);
    }
    c.ok(lcreate(5, b"shared", 0o600));
    let m = std::fs::metadata(t.0.join("shared")).unwrap();
    assert_eq!((m.uid(), m.gid()), (0, 0), "Tlcreate changed the owner");
    assert_eq!(m.mode() & 0o7777, 0o666);

    c.ok(lcreate(1, b"mine", 0o640));
    let m = std::fs::metadata(t.0.join("mine")).unwrap();
    assert_eq!((m.uid(), m.gid()), (USER, 65534));
    c.ok(mkdir(0, b"dir"));
    let m = std::fs::metadata(t.0.join("dir")).unwrap();
    assert_eq!((m.uid(), m.gid()), (USER, 65534));
    // Nor can it give its file away or take another's.
    let walked = lerror(&c.walk(0, 2, &[b"mine"]));
    assert_eq!(walked, None);
    assert_eq!(c.err(setattr(2, valid::UID, 0, 0)), EPERM);
    let walked = lerror(&c.walk(0, 3, &[b"shared"]));
    assert_eq!(walked, None);
    assert_eq!(c.err(setattr(3, valid::MODE, 0o4777, 0)), EPERM);
}

/// Under the default policy a client that says it is root is the anonymous
/// user: no device nodes, no set-uid-root files, no chown to root.
#[test]
fn a_squashed_root_cannot_plant_devices_or_set_uid_root_files() {
    let t = open_to_all("users-squash");
    root_file(&t.0, "tool", 0o755);
    let ex = export(&t.0, Squash::Root);
    let mut c = Client::attach_as(&ex, b"root", 0);
    let out = c.rpc(mknod_null(0, b"null"));
    assert_eq!(lerror(&out), Some(EPERM), "a device node was made");
    assert!(!t.0.join("null").exists());
    // A FIFO is something the anonymous user may make.
    c.ok(Tmsg::Mknod {
        dfid: 0,
        name: b"fifo",
        mode: libc::S_IFIFO | 0o644,
        major: 0,
        minor: 0,
        gid: 0,
    });
    assert_eq!(std::fs::metadata(t.0.join("fifo")).unwrap().uid(), 65534);
    let walked = lerror(&c.walk(0, 1, &[b"tool"]));
    assert_eq!(walked, None);
    assert_eq!(c.err(setattr(1, valid::MODE, 0o4755, 0)), EPERM);
    assert_eq!(c.err(setattr(1, valid::UID, 0, 0)), EPERM);
    let m = std::fs::metadata(t.0.join("tool")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o755, "the set-uid bit was set");
    // Its own file may get a set-uid bit: of the anonymous user, as locally.
    c.walk(0, 2, &[]);
    c.ok(lcreate(2, b"anon-tool", 0o755));
    c.walk(0, 3, &[b"anon-tool"]);
    c.ok(setattr(3, valid::MODE, 0o4755, 0));
    let m = std::fs::metadata(t.0.join("anon-tool")).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (65534, 0o4755));
}

/// `--squash none`: root is root (device nodes included); `all`: everyone
/// is the anonymous user.
#[test]
fn squash_none_trusts_root_and_all_squashes_everyone() {
    let t = open_to_all("users-none");
    let ex = export(&t.0, Squash::None);
    let mut c = Client::attach_as(&ex, b"root", 0);
    c.ok(mknod_null(0, b"null"));
    let m = std::fs::metadata(t.0.join("null")).unwrap();
    assert_eq!((m.uid(), m.rdev()), (0, libc::makedev(1, 3)));

    let ex = export(&t.0, Squash::All);
    let mut c = Client::attach_as(&ex, b"", USER);
    c.ok(mkdir(0, b"by-all"));
    let m = std::fs::metadata(t.0.join("by-all")).unwrap();
    assert_eq!((m.uid(), m.gid()), (65534, 65534));
}

/// Linux's client attaches once at mount time with no `n_uname` (`~0`) and
/// its `uname` ("nobody" by default): the name decides, through passwd,
/// never root by default.
#[test]
fn an_attach_without_a_uid_is_the_user_it_names() {
    let t = open_to_all("users-uname");
    let ex = export(&t.0, Squash::None);
    for (uname, uid) in [(&b"root"[..], 0), (b"no such user", 65534)] {
        let mut c = Client::attach_as(&ex, uname, u32::MAX);
        let name = format!("by-{}", String::from_utf8_lossy(uname).replace(' ', "-"));
        c.ok(mkdir(0, name.as_bytes()));
        assert_eq!(std::fs::metadata(t.0.join(&name)).unwrap().uid(), uid);
    }
}

/// Requests of two users at once on two threads each act as their own user
/// (credentials are per thread: glibc's wrappers would have switched the
/// whole process).
#[test]
fn two_users_at_once_each_act_as_themselves() {
    let t = open_to_all("users-threads");
    let ex = export(&t.0, Squash::Root);
    std::thread::scope(|s| {
        for uid in [USER, USER + 1] {
            let ex = &ex;
            let dir = &t.0;
            s.spawn(move || {
                let mut c = Client::attach_as(ex, b"", uid);
                for i in 0..200 {
                    let name = format!("u{uid}-{i}");
                    c.ok(mkdir(0, name.as_bytes()));
                    let m = std::fs::metadata(dir.join(&name)).unwrap();
                    assert_eq!(m.uid(), uid, "{name}");
                }
            });
        }
    });
    // The test's own thread never switched.
    assert!(thread_ids().0.starts_with("0\t0\t0\t0"));
}
