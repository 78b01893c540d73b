//! A value read from sysfs on first use and kept until it is dropped.

use std::fmt;
use std::sync::Mutex;

use super::attr::lock;
use crate::error::Result;

/// One cached attribute. The lock is held while the file is read, so a
/// [`Lazy::clear`] that races with a read waits for it and then drops the
/// value: a stale value is never stored after an invalidation. Errors are not
/// cached, so a failed read is retried on the next call.
pub(crate) struct Lazy<T> {
    value: Mutex<Option<T>>,
}

impl<T: Clone> Lazy<T> {
    pub(crate) const fn new() -> Self {
        Lazy {
            value: Mutex::new(None),
        }
    }

    /// The cached value, or the result of `read` (cached when it succeeds).
    /// `read` must not use this same cell.
    pub(crate) fn get_or_read(&self, read: impl FnOnce() -> Result<T>) -> Result<T> {
        let mut guard = lock(&self.value);
        if let Some(value) = &*guard {
            return Ok(value.clone());
        }
        let value = read()?;
        *guard = Some(value.clone());
        Ok(value)
    }

    /// The cached value, without reading.
    pub(crate) fn peek(&self) -> Option<T> {
        lock(&self.value).clone()
    }

    pub(crate) fn clear(&self) {
        *lock(&self.value) = None;
    }
}

impl<T> fmt::Debug for Lazy<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cached = lock(&self.value).is_some();
        f.write_str(if cached { "cached" } else { "not read" })
    }
}
