//! The crate's error type and the three C return conventions.

use std::borrow::Cow;
use std::ffi::c_int;
use std::io;

/// `Result` with [`enum@Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure of the safe API.
///
/// Verb failures name the C function that failed and carry the OS error it
/// reported ([`Error::errno`]). Invalid arguments caught before calling into
/// C say what was wrong and what would have been valid.
///
/// ```no_run
/// # fn main() {
/// match rdma::Context::open("no-such-device") {
///     Ok(_) => {}
///     // What failed, on what, and the OS error, as one value.
///     Err(e) => eprintln!("{e} (verb {:?}, errno {:?})", e.verb(), e.errno()),
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A verb failed.
    #[error("{verb} failed{}: {source}", context_suffix(.context))]
    Verb {
        /// The C function, e.g. `ibv_alloc_pd`.
        verb: &'static str,
        /// What it was called on or with (device, port, index), may be empty.
        context: Cow<'static, str>,
        /// The OS error it reported.
        #[source]
        source: io::Error,
    },
    /// A verb reported failure (NULL, or `-1`) but left `errno` at 0: the
    /// provider gave no reason.
    ///
    /// `errno` is cleared right before each constructor verb
    /// (`ibv_create_cq`, `ibv_create_qp`, `ibv_alloc_pd`, `rdma_create_qp`,
    /// ...), so this is never a value left over from an earlier call. There
    /// is no OS error behind it: [`Error::errno`] returns `None`, and as an
    /// [`io::Error`] it is [`io::ErrorKind::Other`].
    ///
    /// Seen with siw (rdma-core 44, Linux 6.1): it refuses a CQ or QP whose
    /// queue the kernel mapped at key `0x90000` (the 145th queue page of a
    /// process on one device context, e.g. the 49th connection with a CQ of
    /// its own) and returns NULL without setting `errno`. Before errno was
    /// cleared, that refusal was reported with whatever an earlier call had
    /// left, such as `EOPNOTSUPP` from a probe of `ibv_create_cq_ex`.
    #[error(
        "{verb} failed{}: it returned failure without setting errno (the provider gave no reason)",
        context_suffix(.context)
    )]
    NoReason {
        /// The C function, e.g. `ibv_create_cq`.
        verb: &'static str,
        /// What it was called on or with, may be empty.
        context: Cow<'static, str>,
    },
    /// No RDMA device of that name.
    #[error("no RDMA device named {name:?} (devices present: {available})")]
    DeviceNotFound {
        /// The name asked for.
        name: String,
        /// The devices that exist, comma-separated, or "none".
        available: String,
    },
    /// A port number outside the device's ports.
    #[error("port {port} does not exist on {device}: valid ports are 1..={port_count}")]
    InvalidPort {
        /// The device.
        device: String,
        /// The port asked for.
        port: u32,
        /// The number of physical ports.
        port_count: u32,
    },
    /// A GID index past the end of the port's GID table.
    #[error(
        "GID index {index} is out of range for {device} port {port}: the table has {table_len} entries"
    )]
    InvalidGidIndex {
        /// The device.
        device: String,
        /// The port.
        port: u32,
        /// The index asked for.
        index: u32,
        /// `gid_tbl_len` of the port.
        table_len: u32,
    },
    /// A GID table entry that exists but holds no GID.
    #[error("GID index {index} of {device} port {port} is empty")]
    EmptyGid {
        /// The device.
        device: String,
        /// The port.
        port: u32,
        /// The index asked for.
        index: u32,
    },
    /// The device or its provider does not implement the operation.
    #[error("{what} is not supported by {device}{}", source_suffix(.source.as_ref()))]
    Unsupported {
        /// The operation.
        what: Cow<'static, str>,
        /// The device.
        device: String,
        /// The error the provider returned, if it returned one.
        #[source]
        source: Option<io::Error>,
    },
    /// A work request completed with an error status.
    #[error(
        "work request {wr_id:#x} on QP {qp_num} failed: {status} (vendor error {vendor_err:#x})"
    )]
    Completion {
        /// The work request id.
        wr_id: u64,
        /// The QP number.
        qp_num: u32,
        /// The status.
        status: crate::status::WcStatus,
        /// The vendor syndrome.
        vendor_err: u32,
    },
    /// An argument the verb would reject, caught before calling it.
    #[error("invalid argument to {verb}: {reason}")]
    InvalidArgument {
        /// The verb that would have been called.
        verb: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// A sysfs attribute (`rdma::sysfs`) that is missing, unreadable or malformed.
    #[error("sysfs {}: {problem}{}", .path.display(), source_suffix(.source.as_ref()))]
    Sysfs {
        /// The file or directory.
        path: std::path::PathBuf,
        /// What was wrong with it.
        problem: Cow<'static, str>,
        /// The OS error, when reading failed.
        #[source]
        source: Option<io::Error>,
    },
    /// A discovery lookup (`rdma::sysfs`) that matched nothing.
    #[error("no {what} ({available})")]
    NotFound {
        /// What was looked for, e.g. `RDMA port with port GUID 0002:c903:0010:abcd`.
        what: String,
        /// What exists, e.g. `ports: mlx4_0/1, rxe0/1`.
        available: String,
    },
    /// The connection manager answered an operation with a failure event
    /// (`REJECTED`, `UNREACHABLE`, `ADDR_ERROR`, `ROUTE_ERROR`, ...), or with
    /// an event other than the one waited for.
    #[error("{operation}: {event} (status {status}){}", private_data_suffix(.private_data))]
    CmEvent {
        /// What was waited for, e.g. `rdma_connect`.
        operation: &'static str,
        /// The event that arrived instead of the expected one.
        event: crate::status::CmEventType,
        /// The event's status: a negated errno, or for `REJECTED` the
        /// transport's reject reason.
        status: i32,
        /// The private data the event carried (a reject's reason, ...).
        private_data: Vec<u8>,
    },
    /// The async layer (`rdma::aio`), or a wait it excludes, was used in a
    /// way that cannot work: a CQ without a completion channel, a channel
    /// two readers would share, a runtime adapter outside its runtime.
    #[error("{operation}: {reason}")]
    Async {
        /// What was called, e.g. `AsyncCq::new`.
        operation: &'static str,
        /// What was wrong, and what to do instead.
        reason: Cow<'static, str>,
        /// `EINVAL` for a wrong argument, `EBUSY` for a second reader of a
        /// channel, `ENXIO` outside a runtime.
        errno: i32,
    },
    /// One of rdma-core's libraries could not be opened: only with the
    /// `dlopen` feature, from the first call that needs it (`devices`,
    /// `Context::open`, `EventChannel::new`, `cm::getaddrinfo`, ...; the
    /// library is tried again at the next such call).
    ///
    /// ```no_run
    /// # fn main() {
    /// match rdma::devices() {
    ///     Ok(devices) => println!("{} RDMA devices", devices.len()),
    ///     // "libibverbs.so.1 could not be loaded (libibverbs.so.1: cannot open shared
    ///     // object file: No such file or directory); it comes with rdma-core: install
    ///     // libibverbs1 on Debian and Ubuntu, libibverbs on Fedora and RHEL"
    ///     Err(e @ rdma::Error::LibraryMissing { .. }) => eprintln!("no RDMA here: {e}"),
    ///     Err(e) => eprintln!("{e}"),
    /// }
    /// # }
    /// ```
    #[error(
        "{library} could not be loaded ({reason}); it comes with rdma-core: install {packages}"
    )]
    LibraryMissing {
        /// The soname: `libibverbs.so.1` or `librdmacm.so.1`.
        library: &'static str,
        /// The packages that provide it, e.g. `libibverbs1 on Debian and
        /// Ubuntu, libibverbs on Fedora and RHEL`.
        packages: &'static str,
        /// What the dynamic loader said (`dlerror`).
        reason: String,
    },
}

impl From<crate::ffi::LoadError> for Error {
    fn from(e: crate::ffi::LoadError) -> Self {
        Error::LibraryMissing {
            library: e.library().soname(),
            packages: e.library().packages(),
            reason: e.reason().to_string(),
        }
    }
}

/// Checks that libibverbs can be called (opens it with the `dlopen` feature;
/// a no-op without it): first thing in every call that makes a first object.
pub(crate) fn load_ibverbs() -> Result<()> {
    Ok(crate::ffi::load_ibverbs()?)
}

/// As [`load_ibverbs`], for librdmacm (and libibverbs, which it needs).
pub(crate) fn load_rdmacm() -> Result<()> {
    Ok(crate::ffi::load_rdmacm()?)
}

fn private_data_suffix(data: &[u8]) -> String {
    if data.is_empty() {
        String::new()
    } else {
        format!(", {} bytes of private data", data.len())
    }
}

fn context_suffix(context: &str) -> String {
    if context.is_empty() {
        String::new()
    } else {
        format!(" ({context})")
    }
}

fn source_suffix(source: Option<&io::Error>) -> String {
    source.map(|e| format!(": {e}")).unwrap_or_default()
}

impl Error {
    /// The OS error number behind the failure, if there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Verb { source, .. } => source.raw_os_error(),
            Error::Unsupported { source, .. } => source
                .as_ref()
                .and_then(io::Error::raw_os_error)
                .or(Some(libc::EOPNOTSUPP)),
            Error::DeviceNotFound { .. } => Some(libc::ENODEV),
            Error::EmptyGid { .. } => Some(libc::ENODATA),
            Error::Completion { .. } => Some(libc::EIO),
            Error::InvalidPort { .. }
            | Error::InvalidGidIndex { .. }
            | Error::InvalidArgument { .. } => Some(libc::EINVAL),
            Error::Sysfs { source, .. } => source
                .as_ref()
                .and_then(io::Error::raw_os_error)
                .or(Some(libc::EINVAL)),
            Error::NotFound { .. } => Some(libc::ENODEV),
            Error::CmEvent { event, status, .. } => {
                Some(crate::status::event_errno(*event, *status))
            }
            Error::Async { errno, .. } => Some(*errno),
            Error::LibraryMissing { .. } => Some(libc::ELIBACC),
            Error::NoReason { .. } => None,
        }
    }

    /// The verb that failed, for [`Error::Verb`], [`Error::NoReason`] and
    /// [`Error::InvalidArgument`].
    pub fn verb(&self) -> Option<&'static str> {
        match self {
            Error::Verb { verb, .. }
            | Error::NoReason { verb, .. }
            | Error::InvalidArgument { verb, .. } => Some(verb),
            _ => None,
        }
    }

    pub(crate) fn verb_errno(
        verb: &'static str,
        context: impl Into<Cow<'static, str>>,
        errno: i32,
    ) -> Self {
        Error::Verb {
            verb,
            context: context.into(),
            source: io::Error::from_raw_os_error(errno),
        }
    }

    /// This error as [`Error::Unsupported`] (`what` on `device`, keeping the errno) when the
    /// provider said it does not implement the call (`EOPNOTSUPP` or `ENOSYS`); otherwise
    /// the error unchanged.
    pub(crate) fn unsupported_if_not_implemented(
        self,
        what: impl Into<Cow<'static, str>>,
        device: &str,
    ) -> Self {
        match self.errno() {
            Some(errno @ (libc::EOPNOTSUPP | libc::ENOSYS)) => Error::Unsupported {
                what: what.into(),
                device: device.to_string(),
                source: Some(io::Error::from_raw_os_error(errno)),
            },
            _ => self,
        }
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        let kind = match &e {
            Error::Verb { source, .. } => source.kind(),
            Error::DeviceNotFound { .. } => io::ErrorKind::NotFound,
            Error::Unsupported { .. } => io::ErrorKind::Unsupported,
            Error::Sysfs {
                source: Some(source),
                ..
            } => source.kind(),
            Error::Sysfs { source: None, .. } => io::ErrorKind::InvalidData,
            Error::NotFound { .. } => io::ErrorKind::NotFound,
            Error::NoReason { .. } => io::ErrorKind::Other,
            Error::LibraryMissing { .. } => io::ErrorKind::NotFound,
            Error::CmEvent { .. } | Error::Async { .. } => {
                io::Error::from_raw_os_error(e.errno().unwrap_or(libc::EIO)).kind()
            }
            _ => io::ErrorKind::InvalidInput,
        };
        io::Error::new(kind, e)
    }
}

/// The value of `errno` now. Call it right after the failing C call.
static TEARDOWN_FAILURES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many destroy, free or acknowledge calls made while dropping a handle
/// have failed in this process so far.
///
/// `Drop` never panics: a failed teardown is logged (`log::error!`), the
/// object and the memory the device might still use are leaked, and this
/// counter goes up. Tests and long-running services can watch it; callers
/// who want the error itself use the `destroy(self)` methods.
pub fn teardown_failures() -> u64 {
    TEARDOWN_FAILURES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Records a failed teardown in `Drop`: logs it and counts it.
pub(crate) fn teardown_failed(what: std::fmt::Arguments<'_>) {
    log::error!("{what}");
    TEARDOWN_FAILURES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

pub(crate) fn last_errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// `ibv_*` verbs that return 0 or the errno value itself (`ibv_modify_qp`,
/// `ibv_dealloc_pd`, `ibv_post_*`, `ibv_destroy_*`, ...).
///
/// A few providers return `-1` with `errno` set, or a negated errno; both are
/// mapped too.
pub(crate) fn check_errno_ret(
    verb: &'static str,
    context: impl FnOnce() -> Cow<'static, str>,
    rc: c_int,
) -> Result<()> {
    match rc {
        0 => Ok(()),
        -1 => Err(Error::verb_errno(verb, context(), last_errno())),
        rc if rc < 0 => Err(Error::verb_errno(verb, context(), -rc)),
        rc => Err(Error::verb_errno(verb, context(), rc)),
    }
}

/// Verbs that return -1 (or any negative value) and set `errno`: every
/// `rdma_*` call, and `ibv_query_gid`, `ibv_get_cq_event`, ...
pub(crate) fn check_minus_one(
    verb: &'static str,
    context: impl FnOnce() -> Cow<'static, str>,
    rc: c_int,
) -> Result<c_int> {
    if rc < 0 {
        Err(Error::verb_errno(verb, context(), last_errno()))
    } else {
        Ok(rc)
    }
}

/// Calls a constructor that returns NULL and sets `errno` on failure
/// (`ibv_create_cq`, `ibv_create_qp`, `ibv_alloc_pd`, `ibv_reg_mr`, ...):
/// `call` is the C call alone.
///
/// `errno` is cleared first, because a provider may return NULL without
/// setting it (siw refusing mmap key `0x90000`): the error is then
/// [`Error::NoReason`], not a value an earlier call left behind.
pub(crate) fn call_ptr<T>(
    verb: &'static str,
    context: impl FnOnce() -> Cow<'static, str>,
    call: impl FnOnce() -> *mut T,
) -> Result<std::ptr::NonNull<T>> {
    clear_errno();
    let ptr = call();
    match std::ptr::NonNull::new(ptr) {
        Some(ptr) => Ok(ptr),
        None => Err(failed_with(verb, context, errno_now())),
    }
}

/// Calls a verb that returns -1 and sets `errno` on failure, with `errno`
/// cleared first as in [`call_ptr`]: for the CM calls that create verbs
/// objects (`rdma_create_qp`, `rdma_create_qp_ex`, `rdma_create_ep`), whose
/// failure is the provider's and carries its `errno`, or none.
pub(crate) fn call_minus_one(
    verb: &'static str,
    context: impl FnOnce() -> Cow<'static, str>,
    call: impl FnOnce() -> c_int,
) -> Result<c_int> {
    clear_errno();
    let rc = call();
    if rc < 0 {
        Err(failed_with(verb, context, errno_now()))
    } else {
        Ok(rc)
    }
}

/// The error for a failed call whose `errno` was cleared before it.
fn failed_with(
    verb: &'static str,
    context: impl FnOnce() -> Cow<'static, str>,
    errno: i32,
) -> Error {
    if errno == 0 {
        Error::NoReason {
            verb,
            context: context(),
        }
    } else {
        Error::verb_errno(verb, context(), errno)
    }
}

fn clear_errno() {
    // SAFETY: __errno_location returns this thread's errno slot, valid for
    // the thread's life.
    unsafe { *libc::__errno_location() = 0 };
}

/// `errno` as it is, 0 included.
fn errno_now() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none() -> Cow<'static, str> {
        Cow::Borrowed("")
    }

    #[test]
    fn errno_return_convention() {
        assert!(check_errno_ret("ibv_x", none, 0).is_ok());
        let e = check_errno_ret("ibv_modify_qp", || "qp 7".into(), libc::EINVAL).unwrap_err();
        assert_eq!(e.errno(), Some(libc::EINVAL));
        assert_eq!(e.verb(), Some("ibv_modify_qp"));
        let text = e.to_string();
        assert!(text.starts_with("ibv_modify_qp failed (qp 7): "), "{text}");
        let e = check_errno_ret("ibv_x", none, -libc::ENOMEM).unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENOMEM));
    }

    #[test]
    fn minus_one_convention_reads_errno() {
        // SAFETY: __errno_location returns this thread's errno slot.
        unsafe { *libc::__errno_location() = libc::ETIMEDOUT };
        let e = check_minus_one("rdma_connect", none, -1).unwrap_err();
        assert_eq!(e.errno(), Some(libc::ETIMEDOUT));
        assert_eq!(check_minus_one("rdma_connect", none, 3).unwrap(), 3);
    }

    fn set_errno(e: i32) {
        // SAFETY: __errno_location returns this thread's errno slot.
        unsafe { *libc::__errno_location() = e };
    }

    #[test]
    fn null_convention_reads_the_calls_errno() {
        let e = call_ptr::<u8>("ibv_alloc_pd", none, || {
            set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        })
        .unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENOMEM));
        assert!(
            matches!(
                e,
                Error::Verb {
                    verb: "ibv_alloc_pd",
                    ..
                }
            ),
            "{e:?}"
        );
        let mut x = 0u8;
        assert!(call_ptr("ibv_alloc_pd", none, || &mut x as *mut u8).is_ok());
    }

    #[test]
    fn a_stale_errno_is_not_reported_for_a_null_without_one() {
        // What an earlier call left (ibv_create_cq_ex probing siw): the
        // constructor below fails without touching errno, as siw's
        // ibv_create_cq does when it refuses mmap key 0x90000.
        set_errno(libc::EOPNOTSUPP);
        let e = call_ptr::<u8>("ibv_create_cq", || "siw0 cqe 16".into(), std::ptr::null_mut)
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::NoReason {
                    verb: "ibv_create_cq",
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(e.errno(), None);
        assert_eq!(e.verb(), Some("ibv_create_cq"));
        let text = e.to_string();
        assert!(
            text.starts_with("ibv_create_cq failed (siw0 cqe 16): ")
                && text.contains("without setting errno"),
            "{text}"
        );
        let io: io::Error = e.into();
        assert_eq!(io.kind(), io::ErrorKind::Other);
    }

    #[test]
    fn minus_one_with_errno_cleared() {
        set_errno(libc::EOPNOTSUPP);
        let e = call_minus_one("rdma_create_qp_ex", none, || -1).unwrap_err();
        assert!(matches!(e, Error::NoReason { .. }), "{e:?}");
        let e = call_minus_one("rdma_create_qp_ex", none, || {
            set_errno(libc::ENOMEM);
            -1
        })
        .unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENOMEM));
        assert_eq!(call_minus_one("rdma_create_qp_ex", none, || 0).unwrap(), 0);
    }

    #[test]
    fn a_missing_library_names_its_package() {
        let e = Error::LibraryMissing {
            library: rdma_sys::Library::Ibverbs.soname(),
            packages: rdma_sys::Library::Ibverbs.packages(),
            reason: "libibverbs.so.1: cannot open shared object file: No such file or directory"
                .into(),
        };
        assert_eq!(
            e.to_string(),
            "libibverbs.so.1 could not be loaded (libibverbs.so.1: cannot open shared object \
             file: No such file or directory); it comes with rdma-core: install libibverbs1 on \
             Debian and Ubuntu, libibverbs on Fedora and RHEL"
        );
        assert_eq!(e.errno(), Some(libc::ELIBACC));
        assert_eq!(io::Error::from(e).kind(), io::ErrorKind::NotFound);
        // Without `dlopen` the libraries are linked: loading always succeeds.
        if !cfg!(feature = "dlopen") {
            assert!(load_ibverbs().is_ok() && load_rdmacm().is_ok());
        }
    }

    #[test]
    fn into_io_error_keeps_kind() {
        let e: io::Error = Error::verb_errno("ibv_x", "", libc::EAGAIN).into();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        let e: io::Error = Error::DeviceNotFound {
            name: "x".into(),
            available: "none".into(),
        }
        .into();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
