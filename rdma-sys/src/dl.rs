//! Opening rdma-core's libraries at run time (the `dlopen` feature), and the
//! load functions every build has.

use std::fmt;

/// One of rdma-core's libraries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Library {
    /// `libibverbs.so.1`: the verbs (`ibv_*`).
    Ibverbs,
    /// `librdmacm.so.1`: the connection manager (`rdma_*`); it needs libibverbs.
    Rdmacm,
}

impl Library {
    /// The soname it is opened by: `libibverbs.so.1`, `librdmacm.so.1`.
    pub fn soname(self) -> &'static str {
        match self {
            Library::Ibverbs => "libibverbs.so.1",
            Library::Rdmacm => "librdmacm.so.1",
        }
    }

    /// The distribution packages that install it (all built from rdma-core).
    pub fn packages(self) -> &'static str {
        match self {
            Library::Ibverbs => "libibverbs1 on Debian and Ubuntu, libibverbs on Fedora and RHEL",
            Library::Rdmacm => "librdmacm1 on Debian and Ubuntu, librdmacm on Fedora and RHEL",
        }
    }
}

/// A library of rdma-core that could not be opened (the `dlopen` feature).
///
/// Its `Display` names the library, why the dynamic loader refused it, and
/// the packages that provide it:
///
/// ```text
/// libibverbs.so.1 could not be loaded (libibverbs.so.1: cannot open shared object file:
/// No such file or directory); it comes with rdma-core: install libibverbs1 on Debian and
/// Ubuntu, libibverbs on Fedora and RHEL
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    library: Library,
    reason: String,
}

impl LoadError {
    /// The library that could not be opened.
    pub fn library(&self) -> Library {
        self.library
    }

    /// What the dynamic loader said (`dlerror`).
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} could not be loaded ({}); it comes with rdma-core: install {}",
            self.library.soname(),
            self.reason,
            self.library.packages()
        )
    }
}

impl std::error::Error for LoadError {}

/// Makes sure libibverbs can be called.
///
/// With the `dlopen` feature, opens `libibverbs.so.1` the first time (again
/// after a failure, so a library installed later is found) and looks its
/// functions up; without it, the library is linked and this always succeeds.
/// Call it before any `ibv_*` function of this crate: see "The `dlopen`
/// feature" in the crate documentation.
///
/// # Errors
/// [`LoadError`] when the library cannot be opened.
pub fn load_ibverbs() -> Result<(), LoadError> {
    #[cfg(feature = "dlopen")]
    loaded::try_ibverbs()?;
    Ok(())
}

/// Makes sure librdmacm (and libibverbs, which it needs) can be called: as
/// [`load_ibverbs`], for `librdmacm.so.1`. Call it before any `rdma_*`
/// function of this crate.
///
/// # Errors
/// [`LoadError`] naming libibverbs or librdmacm, whichever cannot be opened.
pub fn load_rdmacm() -> Result<(), LoadError> {
    #[cfg(feature = "dlopen")]
    loaded::try_rdmacm()?;
    Ok(())
}

#[cfg(feature = "dlopen")]
pub(crate) use loaded::{ibverbs, missing_symbol, rdmacm};

#[cfg(feature = "dlopen")]
mod loaded {
    use super::{Library, LoadError};
    use crate::generated::{IbverbsFns, RdmacmFns};
    use std::sync::{Mutex, OnceLock};

    /// An opened library and its functions. Never closed: providers and
    /// objects made by it may live until the process ends.
    struct Loaded<T> {
        _lib: libloading::Library,
        fns: T,
    }

    static IBVERBS: OnceLock<Loaded<IbverbsFns>> = OnceLock::new();
    static RDMACM: OnceLock<Loaded<RdmacmFns>> = OnceLock::new();
    /// Held while opening: one thread opens, the others wait and find it open.
    static OPENING: Mutex<()> = Mutex::new(());

    fn open<T>(
        cell: &'static OnceLock<Loaded<T>>,
        library: Library,
        resolve: unsafe fn(&libloading::Library) -> T,
    ) -> Result<&'static T, LoadError> {
        if let Some(l) = cell.get() {
            return Ok(&l.fns);
        }
        let _opening = OPENING.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = cell.get() {
            return Ok(&l.fns);
        }
        let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL;
        // SAFETY: rdma-core's libraries' initialisers only set up their own
        // state (libibverbs reads its configuration; providers are opened
        // later, by ibv_get_device_list), which is sound from any thread.
        let lib = unsafe { libloading::os::unix::Library::open(Some(library.soname()), flags) }
            .map_err(|e| LoadError {
                library,
                reason: e.to_string(),
            })?;
        let lib = libloading::Library::from(lib);
        // SAFETY: `lib` is the library `resolve` describes (opened by the
        // soname these bindings were generated for).
        let fns = unsafe { resolve(&lib) };
        Ok(&cell.get_or_init(|| Loaded { _lib: lib, fns }).fns)
    }

    /// libibverbs' functions, opening it if need be.
    pub(super) fn try_ibverbs() -> Result<&'static IbverbsFns, LoadError> {
        open(&IBVERBS, Library::Ibverbs, IbverbsFns::resolve)
    }

    /// librdmacm's functions, opening it (and libibverbs first) if need be.
    pub(super) fn try_rdmacm() -> Result<&'static RdmacmFns, LoadError> {
        try_ibverbs()?;
        open(&RDMACM, Library::Rdmacm, RdmacmFns::resolve)
    }

    /// For the forwarders: the table, or the end of the process (a C
    /// signature cannot carry the error).
    pub(crate) fn ibverbs() -> &'static IbverbsFns {
        try_ibverbs().unwrap_or_else(|e| fatal(&e))
    }

    /// As [`ibverbs`], for librdmacm.
    pub(crate) fn rdmacm() -> &'static RdmacmFns {
        try_rdmacm().unwrap_or_else(|e| fatal(&e))
    }

    #[cold]
    fn fatal(e: &LoadError) -> ! {
        eprintln!(
            "rdma-verbs-sys: {e}. A function of that library was called without a successful \
             rdma_sys::load_ibverbs() / load_rdmacm() first; aborting"
        );
        std::process::abort()
    }

    /// A forwarder whose function the opened library does not export (a
    /// library older than the headers the crate was built with).
    #[cold]
    pub(crate) fn missing_symbol(library: Library, symbol: &str) -> ! {
        eprintln!(
            "rdma-verbs-sys: {} does not export {symbol} (it is older than the headers this \
             program was built with); aborting",
            library.soname()
        );
        std::process::abort()
    }
}

#[cfg(all(test, feature = "dlopen"))]
mod tests {
    /// Every function of the bindings is exported by the library its name
    /// assigns it to (`rdma_*`: librdmacm; the rest: libibverbs), the
    /// installed rdma-core being at least the bindings' release.
    #[test]
    fn every_forwarder_resolves_in_its_library() {
        super::load_rdmacm().expect("rdma-core's libraries are installed");
        assert_eq!(super::ibverbs().missing(), Vec::<&str>::new());
        assert_eq!(super::rdmacm().missing(), Vec::<&str>::new());
    }
}
