//! The file server's operations and its confinement, driven through
//! `Session::handle` with encoded messages (no device needed).
//!
//! - `files`: creating, writing, reading, listing, linking, renaming and
//!   removing, and the attributes;
//! - `confinement`: nothing resolves or is opened outside the root, a
//!   read-only export changes nothing, bad and mutated messages;
//! - `resources`: what one client may hold (directory listings, open
//!   files, locks, FIFOs) and what it leaves the others;
//! - `inline_io`: the reads and writes answered where they are received,
//!   and the benchmark-only null mode.
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;
#[path = "../common/mod.rs"]
mod common;

mod confinement;
mod files;
mod inline_io;
mod resources;

use common::session::{lerror, lopen_read, Client, TempDir, EINVAL, ENOENT, EROFS, EXDEV};
use rdma_9p::fs::Export;
use rdma_9p::proto::{
    setattr, DirEntry, Flock, Request, Rmsg, SetAttr, Tmsg, IOHDRSZ, NOFID, VERSION,
};
use rdma_9p::users::{Squash, Users};

/// An export whose clients act as the users they name, root included (the
/// tests attach as root and check the server's own behaviour; the trust
/// model has its own tests in `tests/users.rs`).
fn export(dir: &Path) -> Export {
    Export::new(dir, false, 64).unwrap().with_users(trusting())
}

fn trusting() -> Users {
    Users {
        squash: Squash::None,
        ..Users::default()
    }
}

/// Opens `name` (beneath the root) on `fid` with `flags`.
fn open_file(c: &mut Client<'_>, fid: u32, name: &[u8], flags: i32) {
    assert_eq!(lerror(&c.walk(0, fid, &[name])), None);
    c.ok(Tmsg::Lopen {
        fid,
        flags: flags as u32,
    });
}
