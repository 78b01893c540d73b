//! Sharing verbs objects between contexts: `ibv_import_device(3)`,
//! `ibv_import_pd(3)`, `ibv_import_mr(3)`, `ibv_import_dm(3)` and the
//! matching unimport verbs.
//!
//! # The model
//!
//! The kernel keeps the objects of a context (PDs, MRs, device memory, QPs,
//! ...) in the file behind its command descriptor ([`Context::cmd_fd`]).
//! A duplicate of that descriptor — `dup` in this process, or `SCM_RIGHTS`
//! to another one — refers to the same file, and [`Context::import_device`]
//! makes a second context on it. Objects of the file are named by their
//! kernel handle ([`ProtectionDomain::handle`], [`crate::MemoryRegion::handle`],
//! [`DeviceMemory::handle`]); importing one gives this context its own view
//! of it, and dropping the view releases only the view (`ibv_unimport_*`
//! frees what the import allocated and never calls the kernel). The object
//! itself belongs to whoever allocated it, who destroys it with the usual
//! verb (`ibv_dealloc_pd`, `ibv_dereg_mr`, `ibv_free_dm`).
//!
//! # What is safe, and why
//!
//! - **Handles are checked by the kernel.** An import asks the kernel about
//!   the handle (mlx5, the provider that implements the imports in
//!   rdma-core 44, queries the object: `ibv_cmd_query_mr` for a region), and
//!   every later verb on the view names the handle again, so a handle that
//!   names nothing fails with an error, never touches memory. [`Context::import_pd`] and
//!   [`ProtectionDomain::import_mr`] are therefore safe.
//! - **The owner may destroy the object at any time** (the man pages leave
//!   the coordination to the application). The view's own memory stays
//!   valid until it is dropped; verbs on it then fail, or — the kernel
//!   reuses handles — act on whatever object of the same file got the
//!   handle next. Neither gives the device access to memory this crate lends
//!   out as a Rust reference: a region created in an imported PD is still
//!   registered by, and owned by, this process; a PD mix-up only makes work
//!   requests fail with protection errors. A PD that still has objects in it
//!   cannot be destroyed (the kernel answers `EBUSY`).
//! - **An imported memory region is not memory.** Its bytes belong to the
//!   process that registered them: [`ImportedMemoryRegion`] exposes its keys,
//!   length and handle, never a slice, and the safe posting API does not
//!   take it. Using its lkey goes through the `unsafe`
//!   [`crate::QueuePair::post_send_raw`], whose contract then covers the
//!   memory.
//! - **Device memory is reached by copying only**, but the importer does not
//!   learn its size (`struct ibv_dm` has no length), and the provider's copy
//!   routines trust the range: [`Context::import_dm`] is `unsafe` and takes
//!   the length the caller vouches for.
//! - **Asynchronous events are per file, not per context.** Events about a
//!   QP, CQ, SRQ or WQ created through any context of the file go to the one
//!   asynchronous event descriptor of the file (the original context's; an
//!   imported context has none in rdma-core 44, so
//!   [`Context::get_async_event`] fails on it), and carry the address of the
//!   object's `struct` in the process that created it, which
//!   `ibv_get_async_event`/`ibv_ack_async_event` dereference. Within one
//!   process that address is valid; across processes it is not. That is why
//!   [`Context::import_device`] is `unsafe`.
//!
//! # On soft-RoCE and soft-iWARP
//!
//! Measured in the VM (Linux 6.1, rdma-core 44): neither `rxe` nor `siw`
//! implements any import. `ibv_import_device` with a duplicate of a
//! context's command descriptor, `ibv_import_pd`, `ibv_import_mr` and
//! `ibv_import_dm` all fail with `EOPNOTSUPP` ([`Error::Unsupported`]),
//! whatever the handle; `ibv_import_device` on a character device that is not
//! an RDMA device (`/dev/null`) fails with `ENODEV`. The success paths are
//! therefore untested here.

use std::fmt;
use std::os::fd::{BorrowedFd, IntoRawFd, OwnedFd};
use std::ptr::NonNull;

use crate::error::{call_ptr, Error, Result};
use crate::{ffi, Context, DeviceMemory, ProtectionDomain};

/// Maps the errnos of a verb the provider does not implement to
/// [`Error::Unsupported`]; anything else stays the verb's error.
fn unsupported(e: Error, what: &'static str, device: impl FnOnce() -> String) -> Error {
    match e.errno() {
        Some(errno @ (libc::EOPNOTSUPP | libc::EPROTONOSUPPORT | libc::ENOSYS)) => {
            Error::Unsupported {
                what: what.into(),
                device: device(),
                source: Some(std::io::Error::from_raw_os_error(errno)),
            }
        }
        _ => e,
    }
}

/// The RDMA device behind a command descriptor, for error messages: the
/// `ibdev` attribute of its character device in sysfs.
fn device_of_fd(fd: i32) -> String {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: fstat writes a `struct stat` into the out-pointer; an invalid
    // descriptor only makes it fail.
    let rc = unsafe { libc::fstat(fd, st.as_mut_ptr()) };
    let fallback = || format!("the device of command descriptor {fd}");
    if rc != 0 {
        return fallback();
    }
    // SAFETY: fstat succeeded and filled the struct.
    let st = unsafe { st.assume_init() };
    if st.st_mode & libc::S_IFMT != libc::S_IFCHR {
        return format!("command descriptor {fd} (not a character device)");
    }
    let (major, minor) = (libc::major(st.st_rdev), libc::minor(st.st_rdev));
    std::fs::read_to_string(format!("/sys/dev/char/{major}:{minor}/ibdev"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| format!("character device {major}:{minor} (not an RDMA device)"))
}

impl Context {
    /// The command descriptor (`ibv_context->cmd_fd`): the file that holds
    /// the context's kernel objects. A duplicate of it
    /// ([`BorrowedFd::try_clone_to_owned`], or `SCM_RIGHTS` to another
    /// process) is what [`Context::import_device`] takes. Valid while the
    /// context is open; never close it.
    ///
    /// Handing it out adds nothing a program could not do before: the same
    /// device node can be opened by anyone with access to it.
    pub fn cmd_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: an open context's command descriptor is open (not -1)
        // until ibv_close_device, which runs only when the last handle of
        // this context is gone; the borrow is tied to `&self`.
        unsafe { BorrowedFd::borrow_raw((*self.as_raw()).cmd_fd) }
    }

    /// Makes a context on the command file of another context
    /// (`ibv_import_device(3)`): `fd` is a duplicate of that context's
    /// [`Context::cmd_fd`], from this process or another one. The new
    /// context sees the objects of that file by handle
    /// ([`Context::import_pd`], ...). It owns `fd`: dropping the last handle
    /// closes the context (`ibv_close_device`), which closes `fd`; the
    /// original context and its objects live on.
    ///
    /// On failure `fd` is neither closed nor given back: libibverbs closes
    /// it on some failure paths (inside the provider) and not on others
    /// (`ENODEV`, `EOPNOTSUPP` before the provider is reached), and closing
    /// it again could close an unrelated descriptor that took its number in
    /// the meantime. At worst it leaks.
    ///
    /// # Safety
    /// Asynchronous events belong to the command file, not to a context:
    /// every event about a QP, CQ, SRQ or WQ created through any context of
    /// the file goes to the file's one event descriptor, carrying the
    /// address of that object's `struct` in the process that created it,
    /// which `ibv_get_async_event` and `ibv_ack_async_event` (and so
    /// [`Context::get_async_event`]) read and write through. When `fd` comes
    /// from a context of another process, the caller must make sure that no
    /// process reads asynchronous events of the shared file while another
    /// process has QPs, CQs, SRQs or WQs in it (for example: create none
    /// through the imported context, or have the other process never read
    /// its events). Within one process there is no condition: the addresses
    /// are valid wherever the event is read.
    ///
    /// Nothing else is required of `fd`: a descriptor that is not the command
    /// file of a context makes the import fail (`ENODEV` for a device that is
    /// not an RDMA device, an error from the kernel's context query for an
    /// RDMA device file without a context).
    ///
    /// # Errors
    /// - [`Error::LibraryMissing`] when libibverbs cannot be opened (the
    ///   `dlopen` feature; `fd` is closed);
    /// - [`Error::Unsupported`] when the provider cannot import contexts
    ///   (`EOPNOTSUPP`: rxe, siw; `EPROTONOSUPPORT`/`ENOSYS` from an older
    ///   kernel);
    /// - [`Error::Verb`] naming `ibv_import_device` otherwise (`ENODEV` for
    ///   a descriptor of no RDMA device, `EINVAL` for one that is not a
    ///   character device).
    pub unsafe fn import_device(fd: OwnedFd) -> Result<Context> {
        const VERB: &str = "ibv_import_device";
        // Before taking the descriptor: an error here drops (closes) it.
        crate::error::load_ibverbs()?;
        let raw = fd.into_raw_fd();
        let ctx = call_ptr(
            VERB,
            || format!("command descriptor {raw}").into(),
            || {
                // SAFETY: `raw` is an open descriptor whose ownership passes to
                // libibverbs (see above for the failure paths); the event-address
                // condition is the caller's contract.
                unsafe { ffi::ibv_import_device(raw) }
            },
        )
        .map_err(|e| {
            unsupported(e, "importing a device (ibv_import_device)", || {
                device_of_fd(raw)
            })
        })?;
        // SAFETY: just imported: an open context nobody else owns.
        unsafe { Context::imported(ctx) }.inspect_err(|_| {
            // SAFETY: imported above, closed once on this error path (which
            // also closes `raw`).
            unsafe { ffi::ibv_close_device(ctx.as_ptr()) };
        })
    }

    /// Imports the PD named `handle` in this context's command file
    /// (`ibv_import_pd(3)`): a [`ProtectionDomain`] usable with every verb
    /// that takes one, whose drop calls `ibv_unimport_pd` (releasing this
    /// view only, never the PD). The PD itself belongs to whoever allocated
    /// it; see the [module documentation](crate::import) for what happens
    /// when they deallocate it first (verbs on the view fail or hit the
    /// PD that reuses the handle; nothing unsound).
    ///
    /// # Errors
    /// - [`Error::Unsupported`] when the provider cannot import PDs
    ///   (`EOPNOTSUPP`: rxe, siw, whatever the handle);
    /// - [`Error::Verb`] naming `ibv_import_pd`, e.g. for a handle that names
    ///   no PD of the file.
    pub fn import_pd(&self, handle: u32) -> Result<ProtectionDomain> {
        const VERB: &str = "ibv_import_pd";
        let pd = call_ptr(
            VERB,
            || format!("{} PD handle {handle}", self.name()).into(),
            || {
                // SAFETY: valid context; the handle is checked by the provider and
                // the kernel (a bad one fails).
                unsafe { ffi::ibv_import_pd(self.as_raw(), handle) }
            },
        )
        .map_err(|e| unsupported(e, "importing a PD (ibv_import_pd)", || self.name().into()))?;
        // SAFETY: just imported into this context; only this handle owns it.
        Ok(unsafe { ProtectionDomain::from_import(self, pd) })
    }

    /// Imports the device memory named `handle` in this context's command
    /// file (`ibv_import_dm(3)`): a [`DeviceMemory`] whose copies and
    /// regions work as for memory allocated here, and whose drop calls
    /// `ibv_unimport_dm` (releasing this view only, never the memory).
    ///
    /// # Safety
    /// `len` must not exceed the size of the device memory `handle` names
    /// (the importer cannot learn it, and the provider's copy routines trust
    /// the range [`DeviceMemory::write_at`]/[`DeviceMemory::read_at`] check
    /// against `len`), and its owner must not free it while the returned
    /// handle or a region over it lives.
    ///
    /// # Errors
    /// - [`Error::InvalidArgument`] for `len == 0`;
    /// - [`Error::Unsupported`] when the provider cannot import device
    ///   memory (`EOPNOTSUPP`: rxe, siw);
    /// - [`Error::Verb`] naming `ibv_import_dm`, e.g. for a handle that names
    ///   no device memory of the file.
    pub unsafe fn import_dm(&self, handle: u32, len: usize) -> Result<DeviceMemory> {
        const VERB: &str = "ibv_import_dm";
        if len == 0 {
            return Err(Error::InvalidArgument {
                verb: VERB,
                reason: "device memory cannot be empty".into(),
            });
        }
        let dm = call_ptr(
            VERB,
            || format!("{} device memory handle {handle}", self.name()).into(),
            || {
                // SAFETY: valid context; the handle is checked by the provider and
                // the kernel (a bad one fails).
                unsafe { ffi::ibv_import_dm(self.as_raw(), handle) }
            },
        )
        .map_err(|e| {
            unsupported(e, "importing device memory (ibv_import_dm)", || {
                self.name().into()
            })
        })?;
        // SAFETY: just imported into this context, owned by this handle
        // only; the caller vouches for `len`.
        Ok(unsafe { DeviceMemory::from_import(self, dm, len) })
    }
}

impl ProtectionDomain {
    /// Imports the memory region named `handle` in the command file of this
    /// PD's context (`ibv_import_mr(3)`). The result carries the region's
    /// keys and length, not its memory (see [`ImportedMemoryRegion`]); its
    /// drop calls `ibv_unimport_mr`, never `ibv_dereg_mr`.
    ///
    /// # Errors
    /// - [`Error::Unsupported`] when the provider cannot import memory
    ///   regions (`EOPNOTSUPP`: rxe, siw);
    /// - [`Error::Verb`] naming `ibv_import_mr`, e.g. for a handle that names
    ///   no memory region of the file.
    pub fn import_mr(&self, handle: u32) -> Result<ImportedMemoryRegion> {
        const VERB: &str = "ibv_import_mr";
        let mr = call_ptr(
            VERB,
            || format!("{} MR handle {handle}", self.context().name()).into(),
            || {
                // SAFETY: valid PD; the handle is checked by the provider and the
                // kernel (a bad one fails).
                unsafe { ffi::ibv_import_mr(self.as_raw(), handle) }
            },
        )
        .map_err(|e| {
            unsupported(e, "importing a memory region (ibv_import_mr)", || {
                self.context().name().into()
            })
        })?;
        Ok(ImportedMemoryRegion {
            mr,
            pd: self.clone(),
        })
    }
}

/// A memory region imported from the command file of its context
/// ([`ProtectionDomain::import_mr`]).
///
/// Its memory belongs to whoever registered it, possibly another process,
/// and may be written by them (and by the device) at any time: this type
/// gives no access to it, and the safe posting API does not take it. Its
/// keys can go into raw work requests ([`crate::QueuePair::post_send_raw`],
/// whose contract then covers the memory). Its owner may deregister it at
/// any time; the keys then stop working, or name whatever registration the
/// device gives them next, and work requests using them fail or touch that
/// memory — which is why only the raw, `unsafe` post path can use them.
///
/// Not `Clone`; dropping it calls `ibv_unimport_mr`. Keeps its PD (and so
/// its context) alive.
pub struct ImportedMemoryRegion {
    mr: NonNull<ffi::ibv_mr>,
    // Released after the region is unimported (Drop runs first).
    pd: ProtectionDomain,
}

// SAFETY: the view is a plain struct that only the import and the unimport
// write; this type only reads its fields.
unsafe impl Send for ImportedMemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for ImportedMemoryRegion {}

impl ImportedMemoryRegion {
    /// The local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: the view lives as long as `self`.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr.as_ptr()).rkey }
    }

    /// The length in bytes, as the kernel reported it at import.
    pub fn len(&self) -> usize {
        // SAFETY: as above.
        unsafe { (*self.mr.as_ptr()).length }
    }

    /// True for a region of zero bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `addr` field of the view. `ibv_import_mr(3)`: "not applicable,
    /// NULL value is expected" — the address lives in the owner's address
    /// space; ask the owner for it.
    pub fn addr(&self) -> u64 {
        // SAFETY: as above.
        unsafe { (*self.mr.as_ptr()).addr as u64 }
    }

    /// The kernel handle it was imported with.
    pub fn handle(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr.as_ptr()).handle }
    }

    /// The PD it was imported through.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The raw `ibv_mr` view, valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_mr {
        self.mr.as_ptr()
    }
}

impl Drop for ImportedMemoryRegion {
    fn drop(&mut self) {
        // SAFETY: made by ibv_import_mr, unimported once; the verb frees the
        // view only, never calls the kernel and reports nothing.
        unsafe { ffi::ibv_unimport_mr(self.mr.as_ptr()) };
    }
}

impl fmt::Debug for ImportedMemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImportedMemoryRegion")
            .field("device", &self.pd.context().name())
            .field("handle", &self.handle())
            .field("len", &self.len())
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn not_implemented_errnos_become_unsupported() {
        for errno in [libc::EOPNOTSUPP, libc::EPROTONOSUPPORT, libc::ENOSYS] {
            let e = unsupported(
                Error::verb_errno("ibv_import_pd", "rxe0 PD handle 0", errno),
                "importing a PD (ibv_import_pd)",
                || "rxe0".into(),
            );
            match &e {
                Error::Unsupported { what, device, .. } => {
                    assert_eq!(what, "importing a PD (ibv_import_pd)");
                    assert_eq!(device, "rxe0");
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(e.errno(), Some(errno));
        }
        let e = unsupported(
            Error::verb_errno("ibv_import_pd", "rxe0 PD handle 7", libc::EINVAL),
            "importing a PD (ibv_import_pd)",
            || unreachable!("only asked for Unsupported"),
        );
        assert_eq!(e.verb(), Some("ibv_import_pd"));
        assert_eq!(e.errno(), Some(libc::EINVAL));
        assert!(e.to_string().contains("PD handle 7"), "{e}");
    }

    #[test]
    fn device_of_a_descriptor_that_is_not_rdma() {
        let null = std::fs::File::open("/dev/null").unwrap();
        let text = device_of_fd(null.as_raw_fd());
        assert!(text.contains("not an RDMA device"), "{text}");
        let file = std::fs::File::open("/proc/self/status").unwrap();
        let text = device_of_fd(file.as_raw_fd());
        assert!(text.contains("not a character device"), "{text}");
        assert!(device_of_fd(-1).contains("descriptor -1"));
    }
}
