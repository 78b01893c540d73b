//! Lazy ordered lists over a directory of numbered files (`gids/`, `pkeys/`).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::attr::{lock, malformed, numbered_entries, read_raw, unreadable};
use crate::error::{Error, Result};
use crate::gid::Gid;

/// Turns a file's text into an entry: `None` when the text is malformed,
/// `Some(None)` for an empty table slot.
pub(crate) type Parser<T> = fn(&str) -> Option<Option<T>>;

/// How a list reports an index outside its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `gids/`: [`Error::InvalidGidIndex`].
    Gid,
    /// `pkeys/`: [`Error::NotFound`].
    Pkey,
    /// `gid_attrs/*/`: indexed like the GID table, checked by the caller.
    GidAttr,
}

/// A port's table read from a directory of numbered files, one entry per file
/// (the GID table `gids/`, the P_Key table `pkeys/`).
///
/// The set of indices is listed on first use; an entry is read only when it
/// is asked for, then cached until [`DemandList::refresh`] (or the port's
/// refresh) drops the cache. Empty slots (the all-zero GID, P_Key `0x0000`)
/// read as `Ok(None)` and are skipped when iterating.
///
/// A `DemandList` is shared by the clones of its [`super::EndPort`] and is
/// safe to use from several threads.
pub struct DemandList<T> {
    dir: PathBuf,
    device: String,
    port: u32,
    kind: Kind,
    parse: Parser<T>,
    expected: &'static str,
    state: Mutex<State<T>>,
}

struct State<T> {
    /// `None`: not listed yet; `Some(None)`: the directory does not exist.
    indices: Option<Option<Arc<[u32]>>>,
    entries: BTreeMap<u32, Option<T>>,
}

/// The GID table of a port (`ports/<n>/gids/`), indexed by GID index.
pub type GidTable = DemandList<Gid>;

/// The P_Key table of a port (`ports/<n>/pkeys/`), indexed by P_Key index.
pub type PkeyTable = DemandList<u16>;

impl<T: Clone + PartialEq> DemandList<T> {
    pub(crate) fn new(
        dir: PathBuf,
        device: &str,
        port: u32,
        kind: Kind,
        parse: Parser<T>,
        expected: &'static str,
    ) -> Self {
        DemandList {
            dir,
            device: device.to_string(),
            port,
            kind,
            parse,
            expected,
            state: Mutex::new(State {
                indices: None,
                entries: BTreeMap::new(),
            }),
        }
    }

    /// The directory the entries are read from.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The table's indices, or `None` when its directory does not exist.
    pub(crate) fn try_indices(&self) -> Result<Option<Arc<[u32]>>> {
        let mut st = lock(&self.state);
        if let Some(known) = &st.indices {
            return Ok(known.clone());
        }
        let listed = numbered_entries(&self.dir)?.map(Arc::from);
        st.indices = Some(listed.clone());
        Ok(listed)
    }

    /// Every index of the table in ascending order, empty slots included
    /// (for the GID table, `0..gid_tbl_len`).
    ///
    /// # Errors
    /// [`Error::Sysfs`] naming the directory when it cannot be listed or holds
    /// a name that is not a number.
    pub fn indices(&self) -> Result<Arc<[u32]>> {
        self.try_indices()?
            .ok_or_else(|| unreadable(&self.dir, std::io::Error::from_raw_os_error(libc::ENOENT)))
    }

    /// The number of slots in the table, empty ones included.
    ///
    /// # Errors
    /// As [`DemandList::indices`].
    pub fn len(&self) -> Result<usize> {
        Ok(self.indices()?.len())
    }

    /// True when the table has no slots at all.
    ///
    /// # Errors
    /// As [`DemandList::indices`].
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.indices()?.is_empty())
    }

    pub(crate) fn check_index(&self, index: u32) -> Result<()> {
        let indices = self.indices()?;
        if indices.binary_search(&index).is_ok() {
            return Ok(());
        }
        let table_len = u32::try_from(indices.len()).unwrap_or(u32::MAX);
        Err(match self.kind {
            Kind::Gid | Kind::GidAttr => Error::InvalidGidIndex {
                device: self.device.clone(),
                port: self.port,
                index,
                table_len,
            },
            Kind::Pkey => Error::NotFound {
                what: format!("P_Key index {index} on {}/{}", self.device, self.port),
                available: format!("the table has {table_len} entries"),
            },
        })
    }

    /// The entry at `index`: `Ok(None)` for an empty slot. Read from sysfs
    /// on first use, then cached.
    ///
    /// # Errors
    /// [`Error::InvalidGidIndex`] (GID table) or [`Error::NotFound`] (P_Key
    /// table) for an index outside the table, [`Error::Sysfs`] naming the file
    /// when it cannot be read or is malformed.
    pub fn get(&self, index: u32) -> Result<Option<T>> {
        self.check_index(index)?;
        self.get_unchecked(index)
    }

    /// Reads entry `index` without checking it against the listed indices
    /// (the per-GID attribute lists, whose indices are the GID table's).
    pub(crate) fn get_unchecked(&self, index: u32) -> Result<Option<T>> {
        let mut st = lock(&self.state);
        if let Some(cached) = st.entries.get(&index) {
            return Ok(cached.clone());
        }
        let path = self.dir.join(index.to_string());
        let value = match read_raw(&path) {
            Ok(text) => {
                (self.parse)(&text).ok_or_else(|| malformed(&path, &text, self.expected))?
            }
            // gid_attrs/{types,ndevs}/<i> fail with EINVAL for an entry
            // without a type or netdev.
            Err(e) if self.kind == Kind::GidAttr && e.raw_os_error() == Some(libc::EINVAL) => None,
            Err(e) => return Err(unreadable(&path, e)),
        };
        st.entries.insert(index, value.clone());
        Ok(value)
    }

    /// The non-empty entries as `(index, value)`, in index order. Each entry
    /// is read (and cached) when the iterator reaches it.
    ///
    /// An error listing the table or reading an entry is yielded in its
    /// place; `collect::<Result<Vec<_>>>()` stops at the first one.
    pub fn iter(&self) -> impl Iterator<Item = Result<(u32, T)>> + '_ {
        let (indices, listing_error) = match self.indices() {
            Ok(indices) => (indices, None),
            Err(e) => (Arc::from(Vec::new()), Some(e)),
        };
        let mut pos = 0;
        let mut listing_error = listing_error;
        std::iter::from_fn(move || {
            if let Some(e) = listing_error.take() {
                return Some(Err(e));
            }
            while let Some(&index) = indices.get(pos) {
                pos += 1;
                match self.get_unchecked(index) {
                    Ok(Some(value)) => return Some(Ok((index, value))),
                    Ok(None) => {}
                    Err(e) => return Some(Err(e)),
                }
            }
            None
        })
    }

    /// The first non-empty entry (for the GID table: the default GID).
    ///
    /// # Errors
    /// As [`DemandList::get`].
    pub fn first(&self) -> Result<Option<(u32, T)>> {
        self.iter().next().transpose()
    }

    /// The lowest index holding `value`, reading entries in order until it is
    /// found; `Ok(None)` when no slot holds it.
    ///
    /// # Errors
    /// As [`DemandList::get`].
    pub fn index_of(&self, value: &T) -> Result<Option<u32>> {
        for entry in self.iter() {
            let (index, v) = entry?;
            if v == *value {
                return Ok(Some(index));
            }
        }
        Ok(None)
    }

    /// Drops the cached indices and entries; the next access reads sysfs
    /// again.
    pub fn refresh(&self) {
        let mut st = lock(&self.state);
        st.indices = None;
        st.entries.clear();
    }
}

impl<T> fmt::Debug for DemandList<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = lock(&self.state);
        f.debug_struct("DemandList")
            .field("path", &self.dir)
            .field(
                "listed",
                &st.indices.as_ref().map(|i| i.as_ref().map(|i| i.len())),
            )
            .field("cached_entries", &st.entries.len())
            .finish()
    }
}
