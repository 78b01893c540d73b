//! Who a request acts for: the trust model of exports(5), for 9P.
//!
//! 9P over RDMA has no authentication: a client says which user it is
//! (`Tattach`'s `n_uname`, or its `uname` when that is `~0`), and whoever
//! can reach the server's port can say anything. So, as knfsd does with
//! `AUTH_SYS`, the server believes the user a client names, maps it through
//! a squash policy ([`Squash`]: by default root becomes the anonymous
//! user), and runs every request on that fid with that user's credentials:
//! the thread doing the work switches its file-system user and group and
//! its supplementary groups (from the server's `passwd` and `group`
//! databases) to the user's, so the kernel checks permissions exactly as
//! for that user on the server. Device nodes and set-id bits are then
//! possible only where that user could make them locally (never for an
//! unprivileged or squashed user: the kernel drops `CAP_MKNOD`,
//! `CAP_FSETID` and the other file capabilities with a non-zero fsuid).
//!
//! Credentials are changed per thread (`setfsuid`, `setfsgid` and the raw
//! `setgroups` system call, see `sys::set_fs_cred`): glibc's wrappers of `setgroups`
//! and the `set*id` calls change every thread of the process (setgroups(2),
//! NOTES), and requests of many clients run at once on the thread pool. A
//! server that does not run as root cannot switch: it acts as itself for
//! every client.

use std::ffi::{CStr, CString};
use std::io;
use std::sync::OnceLock;

use nix::unistd::{getegid, getgrouplist, getgroups, Gid, Uid, User};

/// `n_uname` when the client sends none (Linux's client at mount time).
pub(crate) const NONUNAME: u32 = u32::MAX;

/// Which client users become the anonymous user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Squash {
    /// Root (uid 0) becomes the anonymous user; others stay who they are.
    #[default]
    Root,
    /// Every user becomes the anonymous user.
    All,
    /// Users stay who they say they are, root included: for tests and
    /// fabrics where every client is trusted.
    None,
}

/// A squash policy's name that is none of `root`, `all` or `none`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not root, all or none")]
pub struct ParseSquashError(String);

impl std::str::FromStr for Squash {
    type Err = ParseSquashError;

    fn from_str(s: &str) -> Result<Squash, ParseSquashError> {
        match s {
            "root" => Ok(Squash::Root),
            "all" => Ok(Squash::All),
            "none" => Ok(Squash::None),
            _ => Err(ParseSquashError(s.to_owned())),
        }
    }
}

/// How client users map to users of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Users {
    /// Who is squashed.
    pub squash: Squash,
    /// The anonymous user's uid.
    pub anon_uid: u32,
    /// The anonymous user's gid (also the group of a user the server's
    /// `passwd` does not know).
    pub anon_gid: u32,
}

/// The uid and gid of the anonymous user by default (`nobody`, `nogroup`).
pub const ANON_ID: u32 = 65534;

impl Default for Users {
    /// Root squashed to 65534:65534.
    fn default() -> Users {
        Users {
            squash: Squash::Root,
            anon_uid: ANON_ID,
            anon_gid: ANON_ID,
        }
    }
}

/// A user's credentials for the file system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cred {
    /// The file-system user id.
    pub uid: u32,
    /// The file-system group id: the group new files get.
    pub gid: u32,
    /// The supplementary groups.
    pub groups: Vec<u32>,
}

impl Cred {
    /// The same user creating with group `gid` (a `Tlcreate`'s, `Tmkdir`'s,
    /// ... `gid`: the client's process's group), if the user is in it;
    /// otherwise unchanged: a local process of the user could not create
    /// files of another group either.
    pub fn creating_as(&self, gid: u32) -> Cred {
        let mut c = self.clone();
        if gid == self.gid || self.groups.contains(&gid) {
            c.gid = gid;
        }
        c
    }
}

impl Users {
    /// The credentials a client attaching as `uname`/`n_uname` gets: the uid
    /// named (`n_uname`, or when that is `~0` the `passwd` user named
    /// `uname`, the anonymous user if none), squashed as configured, with
    /// its groups from the server's databases (the anonymous group and no
    /// others for a uid they do not know, or a squashed one).
    pub fn resolve(&self, uname: &[u8], n_uname: u32) -> Cred {
        let uid = if n_uname != NONUNAME {
            n_uname
        } else {
            uid_of_name(uname).unwrap_or(self.anon_uid)
        };
        let squashed = match self.squash {
            Squash::All => true,
            Squash::Root => uid == 0,
            Squash::None => false,
        };
        let anon = |uid| Cred {
            uid,
            gid: self.anon_gid,
            groups: Vec::new(),
        };
        if squashed {
            return anon(self.anon_uid);
        }
        match account_of_uid(uid) {
            Some((name, gid)) => Cred {
                uid,
                gid,
                groups: groups_of(&name, gid),
            },
            None => anon(uid),
        }
    }
}

/// The uid of the `passwd` user `name` (a name that is not UTF-8 is no
/// user: nix's lookups take `&str`, and `useradd` makes no such name).
fn uid_of_name(name: &[u8]) -> Option<u32> {
    let name = std::str::from_utf8(name).ok()?;
    let user = User::from_name(name).ok()??;
    Some(user.uid.as_raw())
}

/// The `passwd` name and primary group of `uid`.
fn account_of_uid(uid: u32) -> Option<(CString, u32)> {
    let user = User::from_uid(Uid::from_raw(uid)).ok()??;
    let name = CString::new(user.name).ok()?;
    Some((name, user.gid.as_raw()))
}

/// The supplementary groups of the user `name` whose primary group is
/// `gid` (`getgrouplist(3)`), `gid` left out; none when the lookup fails.
fn groups_of(name: &CStr, gid: u32) -> Vec<u32> {
    let mut groups: Vec<u32> = getgrouplist(name, Gid::from_raw(gid))
        .unwrap_or_default()
        .into_iter()
        .map(Gid::as_raw)
        .filter(|&g| g != gid)
        .collect();
    groups.sort_unstable();
    groups.dedup();
    groups
}

/// The credentials the server itself runs with, read once.
fn own() -> &'static Cred {
    static OWN: OnceLock<Cred> = OnceLock::new();
    OWN.get_or_init(|| Cred {
        uid: crate::sys::euid(),
        gid: getegid().as_raw(),
        groups: getgroups()
            .unwrap_or_default()
            .into_iter()
            .map(Gid::as_raw)
            .collect(),
    })
}

/// Whether this server can act as other users: it runs as root.
pub fn can_switch() -> bool {
    own().uid == 0
}

/// This thread acting as a client's user until dropped, when it is itself
/// again (see [`as_user`]).
#[derive(Debug)]
#[must_use = "the thread is itself again when this is dropped"]
pub struct AsUser {
    switched: bool,
}

/// Switches this thread's file-system credentials to `cred` until the
/// guard is dropped. A server that is not root stays itself (it cannot
/// switch).
///
/// # Errors
/// When the kernel refuses a change (the thread is left as itself).
pub fn as_user(cred: &Cred) -> io::Result<AsUser> {
    let me = own();
    if me.uid != 0 || cred == me {
        return Ok(AsUser { switched: false });
    }
    let guard = AsUser { switched: true };
    // The guard restores whatever was changed if a step fails.
    crate::sys::set_fs_cred(cred.uid, cred.gid, &cred.groups)?;
    Ok(guard)
}

impl Drop for AsUser {
    fn drop(&mut self) {
        if !self.switched {
            return;
        }
        let me = own();
        if let Err(e) = crate::sys::set_fs_cred(me.uid, me.gid, &me.groups) {
            // A pool thread left acting as a client's user would serve the
            // next client as that user: stop rather than go on.
            log::error!("cannot restore the server's credentials ({e}); aborting");
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squash_policies_map_the_user_named() {
        let users = |squash| Users {
            squash,
            anon_uid: 7000,
            anon_gid: 7001,
        };
        let anon = Cred {
            uid: 7000,
            gid: 7001,
            groups: vec![],
        };
        assert_eq!(users(Squash::Root).resolve(b"", 0), anon);
        assert_eq!(users(Squash::All).resolve(b"", 1000).uid, 7000);
        assert_eq!(users(Squash::None).resolve(b"", 0).uid, 0);
        assert_eq!(users(Squash::Root).resolve(b"", 1000).uid, 1000);
        // Root is in the server's passwd on every Linux: its group.
        assert_eq!(users(Squash::None).resolve(b"", 0).gid, 0);
        // A uid no database knows: the anonymous group, no others.
        let stranger = users(Squash::Root).resolve(b"", 4_000_123);
        assert_eq!((stranger.gid, stranger.groups.len()), (7001, 0));
        // No n_uname: the name decides, through passwd.
        assert_eq!(users(Squash::None).resolve(b"root", NONUNAME).uid, 0);
        assert_eq!(users(Squash::Root).resolve(b"root", NONUNAME).uid, 7000);
        assert_eq!(
            users(Squash::None)
                .resolve(b"no such user here", NONUNAME)
                .uid,
            7000
        );
    }

    #[test]
    fn a_user_creates_only_with_its_own_groups() {
        let c = Cred {
            uid: 1000,
            gid: 100,
            groups: vec![20, 30],
        };
        assert_eq!(c.creating_as(30).gid, 30);
        assert_eq!(c.creating_as(100).gid, 100);
        assert_eq!(c.creating_as(0).gid, 100, "not a member of group 0");
    }

    #[test]
    fn squash_names_parse() {
        assert_eq!("root".parse(), Ok(Squash::Root));
        assert_eq!("all".parse(), Ok(Squash::All));
        assert_eq!("none".parse(), Ok(Squash::None));
        assert!("everyone"
            .parse::<Squash>()
            .unwrap_err()
            .to_string()
            .contains("root, all or none"));
    }
}
