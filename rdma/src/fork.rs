//! Fork support (`ibv_fork_init(3)`, `ibv_is_fork_initialized(3)`).
//!
//! Before Linux 5.13, a child created by `fork()` could make the parent's
//! registered memory copy-on-write, so the device and the parent saw
//! different pages. `ibv_fork_init` makes libibverbs mark registered memory
//! `MADV_DONTFORK`. Kernels that keep pinned pages in the parent on fork
//! ("copy-on-fork", reported by `rdma system show`) need none of this:
//! [`is_fork_initialized`] then reports [`ForkStatus::Unneeded`] and
//! [`fork_init`] does nothing.

use crate::error::{check_errno_ret, Result};
use crate::ffi;
use crate::macros::c_enum;

c_enum! {
    /// `enum ibv_fork_status`: whether fork support is in effect.
    pub enum ForkStatus: u32 {
        /// Fork support is off: a forked child may break registered memory.
        Disabled = ffi::IBV_FORK_DISABLED,
        /// [`fork_init`] (or `RDMAV_FORK_SAFE`) turned fork support on.
        Enabled = ffi::IBV_FORK_ENABLED,
        /// The kernel keeps registered memory safe across `fork()` by itself.
        Unneeded = ffi::IBV_FORK_UNNEEDED,
    }
}

/// Prepares libibverbs so that the process may `fork()` while it has
/// registered memory (`ibv_fork_init(3)`). Call it before any other verb
/// (before opening a device); on a copy-on-fork kernel it does nothing and
/// succeeds at any time.
///
/// # Errors
/// [`crate::Error::LibraryMissing`] (the `dlopen` feature);
/// [`crate::Error::Verb`] naming `ibv_fork_init`: `EINVAL` when resources
/// already exist on a kernel that needs fork support, `ENOSYS` when the
/// kernel cannot provide it.
pub fn fork_init() -> Result<()> {
    crate::error::load_ibverbs()?;
    // SAFETY: takes no arguments; libibverbs serialises it internally.
    let rc = unsafe { ffi::ibv_fork_init() };
    check_errno_ret("ibv_fork_init", || "".into(), rc)
}

/// Whether fork support is in effect (`ibv_is_fork_initialized(3)`):
/// [`ForkStatus::Disabled`] when libibverbs cannot be opened (the `dlopen`
/// feature).
pub fn is_fork_initialized() -> ForkStatus {
    if crate::error::load_ibverbs().is_err() {
        // Without libibverbs (the `dlopen` feature) nothing turned it on.
        return ForkStatus::Disabled;
    }
    // SAFETY: takes no arguments and only reads library state.
    let raw = unsafe { ffi::ibv_is_fork_initialized() };
    ForkStatus::from_raw(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_values_round_trip() {
        for s in [
            ForkStatus::Disabled,
            ForkStatus::Enabled,
            ForkStatus::Unneeded,
        ] {
            assert_eq!(ForkStatus::from_raw(s.to_raw()), s);
        }
        assert_eq!(ForkStatus::from_raw(77), ForkStatus::Unknown(77));
    }
}
