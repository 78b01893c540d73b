//! `Treaddir`: a directory listed straight from its descriptor, a reply's
//! worth at a time.
//!
//! Nothing is kept between requests: each one seeks the fid's directory
//! descriptor to the offset the client sends (0, or the `d_off` of the last
//! entry it got: the file system's own cookie) and reads entries with
//! `getdents64` until the reply is full. So a listing costs one reply of
//! memory whatever the directory's size, and many fids open on large
//! directories hold nothing but their descriptors.

use std::ffi::OsStr;
use std::fs::File;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;

use crate::proto::{DirEntry, Qid, QTDIR, QTSYMLINK};
use crate::sys;

/// An open directory: its descriptor, and the lock that keeps one
/// request's seek and reads together.
#[derive(Debug)]
pub(crate) struct OpenDir {
    file: File,
    position: Mutex<()>,
}

impl OpenDir {
    pub(crate) fn new(file: File) -> OpenDir {
        OpenDir {
            file,
            position: Mutex::new(()),
        }
    }

    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// Appends to `data` the entries from `offset` on (`.` and `..`
    /// included, as the file system lists them) that fit in `limit` bytes;
    /// `parent` gives the qid of `..` (the served root's own at the root:
    /// nothing above it is named).
    pub(crate) fn read_into(
        &self,
        offset: u64,
        limit: usize,
        data: &mut Vec<u8>,
        parent: impl Fn() -> std::io::Result<Qid>,
    ) -> std::io::Result<()> {
        let offset =
            i64::try_from(offset).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        let _position = self.position.lock().unwrap_or_else(|p| p.into_inner());
        sys::seek_set(&self.file, offset)?;
        // One reply's worth of entries, and room for one of any name.
        let mut buf = vec![MaybeUninit::uninit(); limit.clamp(1024, 64 << 10)];
        sys::read_dir(&self.file, &mut buf, |entry| {
            let qid = match entry.name {
                b"." => qid_of(&self.file.metadata()?),
                b".." => parent()?,
                name => self.qid(name, entry.ino, entry.d_type)?,
            };
            let e = DirEntry {
                qid,
                offset: entry.next,
                ty: entry.d_type,
                name: entry.name,
            };
            if data.len() + e.len() > limit {
                // The rest comes with the next request, which seeks back
                // to the last entry sent.
                return Ok(false);
            }
            e.encode(data);
            Ok(true)
        })
    }

    /// The qid of entry `name` from its inode and type (asked of the file
    /// system when it did not say).
    fn qid(&self, name: &[u8], ino: u64, d_type: u8) -> std::io::Result<Qid> {
        match d_type {
            libc::DT_UNKNOWN => {
                let node: File = sys::openat2_beneath(
                    &self.file,
                    OsStr::from_bytes(name),
                    libc::O_PATH | libc::O_NOFOLLOW,
                    0,
                )?
                .into();
                Ok(qid_of(&node.metadata()?))
            }
            _ => Ok(Qid {
                ty: match d_type {
                    libc::DT_DIR => QTDIR,
                    libc::DT_LNK => QTSYMLINK,
                    _ => 0,
                },
                version: 0,
                path: ino,
            }),
        }
    }
}

/// A file's qid: its type and inode.
pub(crate) fn qid_of(m: &std::fs::Metadata) -> Qid {
    qid(m.file_type(), m.ino())
}

/// A qid from a file's type and inode.
fn qid(ft: std::fs::FileType, ino: u64) -> Qid {
    Qid {
        ty: if ft.is_dir() {
            QTDIR
        } else if ft.is_symlink() {
            QTSYMLINK
        } else {
            0
        },
        version: 0,
        path: ino,
    }
}
