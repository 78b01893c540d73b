//! An open device: `struct ibv_context`.
//!
//! See `ibv_open_device(3)`, `ibv_query_device(3)`, `ibv_query_device_ex(3)`,
//! `ibv_query_port(3)`, `ibv_query_gid(3)`, `ibv_query_gid_ex(3)`,
//! `ibv_query_pkey(3)`, `ibv_get_pkey_index(3)`.

use std::borrow::Cow;
use std::fmt;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::async_event::AsyncEvent;
use crate::device::{device_by_name, Device, DeviceListInner, Guid};
use crate::error::{self, call_ptr, check_errno_ret, check_minus_one, Error, Result};
use crate::ffi;
use crate::gid::{Gid, GidEntry};
use crate::port::PortAttr;
use crate::DeviceAttr;

/// Called with every asynchronous event the context reads.
pub(crate) type EventHook = Box<dyn Fn(&AsyncEvent) + Send + Sync>;

pub(crate) struct ContextInner {
    ctx: NonNull<ffi::ibv_context>,
    name: String,
    port_count: u8,
    /// The device's limits, queried once at open (they do not change).
    limits: ffi::ibv_device_attr,
    event_hooks: std::sync::Mutex<Vec<EventHook>>,
    // Dropped after the context is closed (field order): keeps the device
    // struct the context points at alive, or the borrowed context's owner.
    owner: ContextOwner,
}

/// Who closes the `ibv_context`.
enum ContextOwner {
    /// Opened by this crate with `ibv_open_device`: closed on drop. The list
    /// keeps the device struct alive.
    Opened(#[allow(dead_code)] Arc<DeviceListInner>),
    /// Belongs to librdmacm (`cm_id->verbs`, `rdma_get_devices`): never
    /// closed by us; the value keeps its owner (the id, the device list)
    /// alive as long as the context is used.
    Borrowed(#[allow(dead_code)] Arc<dyn Send + Sync>),
    /// Made by `ibv_import_device` from a command descriptor: closed on drop
    /// like an opened one (which also closes the descriptor). The context
    /// holds its device itself (libibverbs takes a reference at import).
    Imported,
}

// SAFETY: libibverbs contexts are thread-safe: every verb on a context may be
// called from any thread, concurrently (libibverbs' thread-safety guarantee).
unsafe impl Send for ContextInner {}
// SAFETY: as above; the Rust side holds no interior mutability.
unsafe impl Sync for ContextInner {}

/// Device attributes of contexts owned by librdmacm, by context and device
/// address. librdmacm opens each device once and keeps its context until
/// the process exits (or the device is removed), and every
/// `CmId::context()` wraps that same context again: reading the attributes
/// once per context instead of once per call saves a system call on each
/// connection (cmtime's `create qp` step measured it).
type LimitsCache = Vec<(usize, usize, ffi::ibv_device_attr)>;
static BORROWED_LIMITS: std::sync::Mutex<LimitsCache> = std::sync::Mutex::new(Vec::new());

pub(crate) fn borrowed_limits(
    ctx: NonNull<ffi::ibv_context>,
    name: &str,
) -> Result<ffi::ibv_device_attr> {
    // SAFETY: an open context (the caller's contract); its device pointer is
    // set for its lifetime.
    let dev = unsafe { (*ctx.as_ptr()).device } as usize;
    let key = (ctx.as_ptr() as usize, dev);
    let mut cache = BORROWED_LIMITS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, _, attr)) = cache.iter().find(|(c, d, _)| (*c, *d) == key) {
        return Ok(*attr);
    }
    let attr = Context::query_limits(ctx, name)?;
    cache.push((key.0, key.1, attr));
    Ok(attr)
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        if matches!(self.owner, ContextOwner::Borrowed(_)) {
            return;
        }
        // SAFETY: `ctx` came from ibv_open_device or ibv_import_device, every
        // child holds an Arc to this inner value, so nothing built on the
        // context is left; closed once.
        let rc = unsafe { ffi::ibv_close_device(self.ctx.as_ptr()) };
        if rc != 0 {
            crate::error::teardown_failed(format_args!(
                "ibv_close_device({}) failed: rc {rc}",
                self.name
            ));
        }
    }
}

/// An open RDMA device (`struct ibv_context`).
///
/// `Context` is a cheap handle: cloning it clones an `Arc`, and every object
/// created from it keeps it open, so the device is closed when the last of them
/// is dropped.
///
/// # Examples
/// List the devices, open one by name and read its limits and first port, as
/// `ibv_devinfo` does:
///
/// ```no_run
/// # fn main() -> rdma::Result<()> {
/// for dev in rdma::devices()? {
///     println!("{} ({}, GUID {})", dev.name(), dev.transport_type(), dev.guid());
/// }
/// let ctx = rdma::Context::open("rxe0")?;
/// let attr = ctx.query_device()?;
/// println!("firmware {}, {} ports, up to {} QPs", attr.fw_ver(), ctx.port_count(), attr.max_qp());
/// let port = ctx.query_port(1)?;
/// println!("port 1: {}, MTU {:?}, {}", port.state, port.active_mtu, port.link_layer);
/// let gid = ctx.query_gid(1, 0)?;
/// println!("GID[0] {gid}");
/// // Everything made from the context keeps it open.
/// let pd = ctx.alloc_pd()?;
/// drop(ctx);
/// # drop(pd);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

/// Opening is the context's side: a device is below the contexts opened
/// from it.
impl Device {
    /// Opens the device (`ibv_open_device(3)`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_open_device`, e.g. `EACCES` without access
    /// to `/dev/infiniband/uverbsN`.
    pub fn open(&self) -> Result<Context> {
        Context::from_device(self)
    }
}

impl Context {
    /// Opens the device called `name` (`rxe0`, `mlx5_0`, ...).
    ///
    /// # Errors
    /// [`Error::DeviceNotFound`] naming the devices that exist, or the errors of
    /// [`crate::devices`] and [`Device::open`].
    pub fn open(name: &str) -> Result<Context> {
        device_by_name(name)?.open()
    }

    pub(crate) fn from_device(device: &Device) -> Result<Context> {
        let name = device.name().to_string();
        let ctx = call_ptr(
            "ibv_open_device",
            || name.clone().into(),
            || {
                // SAFETY: the device belongs to a live device list.
                unsafe { ffi::ibv_open_device(device.as_raw()) }
            },
        )?;
        let owner = ContextOwner::Opened(Arc::clone(device.list()));
        Self::wrap(ctx, name, owner).inspect_err(|_| {
            // SAFETY: opened above, closed once on this error path.
            unsafe { ffi::ibv_close_device(ctx.as_ptr()) };
        })
    }

    /// Queries the device's limits once and builds the handle.
    fn query_limits(ctx: NonNull<ffi::ibv_context>, name: &str) -> Result<ffi::ibv_device_attr> {
        let mut attr = MaybeUninit::<ffi::ibv_device_attr>::zeroed();
        // SAFETY: valid context and out-pointer.
        let rc = unsafe { ffi::ibv_query_device(ctx.as_ptr(), attr.as_mut_ptr()) };
        check_errno_ret("ibv_query_device", || name.to_string().into(), rc)?;
        // SAFETY: ibv_query_device succeeded and filled the struct (zeroed first).
        Ok(unsafe { attr.assume_init() })
    }

    fn wrap(ctx: NonNull<ffi::ibv_context>, name: String, owner: ContextOwner) -> Result<Context> {
        let limits = match &owner {
            ContextOwner::Opened(_) | ContextOwner::Imported => Self::query_limits(ctx, &name)?,
            ContextOwner::Borrowed(_) => borrowed_limits(ctx, &name)?,
        };
        Ok(Context {
            inner: Arc::new(ContextInner {
                ctx,
                name,
                port_count: limits.phys_port_cnt,
                limits,
                event_hooks: std::sync::Mutex::new(Vec::new()),
                owner,
            }),
        })
    }

    /// Wraps a context this crate does not own (librdmacm's `cm_id->verbs`
    /// or an entry of `rdma_get_devices`); it is never closed by us.
    ///
    /// # Safety
    /// `ctx` must be an open context that stays open while `keep` lives.
    pub(crate) unsafe fn borrowed(
        ctx: NonNull<ffi::ibv_context>,
        keep: Arc<dyn Send + Sync>,
    ) -> Result<Context> {
        // SAFETY: the caller guarantees an open context.
        let name = unsafe { Self::device_name_of(ctx) };
        Self::wrap(ctx, name, ContextOwner::Borrowed(keep))
    }

    /// True for a context that belongs to librdmacm (see [`crate::cm`]): this
    /// crate never closes it.
    pub fn is_borrowed(&self) -> bool {
        matches!(self.inner.owner, ContextOwner::Borrowed(_))
    }

    /// Wraps a context made by `ibv_import_device`, closed on drop.
    ///
    /// # Safety
    /// `ctx` is an open context owned by nobody else.
    pub(crate) unsafe fn imported(ctx: NonNull<ffi::ibv_context>) -> Result<Context> {
        // SAFETY: an open context (the caller's contract).
        let name = unsafe { Self::device_name_of(ctx) };
        Self::wrap(ctx, name, ContextOwner::Imported)
    }

    /// The kernel name of the device of `ctx`.
    ///
    /// # Safety
    /// `ctx` is an open context.
    pub(crate) unsafe fn device_name_of(ctx: NonNull<ffi::ibv_context>) -> String {
        // SAFETY: an open context (the caller's contract); its device and the
        // device's name live as long as it.
        unsafe { std::ffi::CStr::from_ptr(ffi::ibv_get_device_name((*ctx.as_ptr()).device)) }
            .to_string_lossy()
            .into_owned()
    }

    /// True for a context made by [`Context::import_device`].
    pub fn is_imported(&self) -> bool {
        matches!(self.inner.owner, ContextOwner::Imported)
    }

    /// Registers a hook run for every asynchronous event read through
    /// [`Context::get_async_event`] (used by [`crate::sysfs`] caches).
    pub(crate) fn add_event_hook(&self, hook: EventHook) {
        self.inner
            .event_hooks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(hook);
    }

    pub(crate) fn run_event_hooks(&self, event: &AsyncEvent) {
        for hook in self
            .inner
            .event_hooks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            hook(event);
        }
    }

    /// The device's kernel name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The raw `ibv_context`, valid while this handle (or a clone) lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_context {
        self.inner.ctx.as_ptr()
    }

    /// The device's limits as queried at open (`max_cqe`, `max_qp_wr`, ...),
    /// for argument checks that should not cost a command to the kernel.
    pub(crate) fn limits(&self) -> &ffi::ibv_device_attr {
        &self.inner.limits
    }

    /// The number of physical ports; valid port numbers are `1..=port_count`.
    pub fn port_count(&self) -> u8 {
        self.inner.port_count
    }

    /// The number of completion vectors (`num_comp_vectors`).
    pub fn num_comp_vectors(&self) -> u32 {
        // SAFETY: reads a field of a live context.
        let n = unsafe { (*self.as_raw()).num_comp_vectors };
        u32::try_from(n).unwrap_or(0)
    }

    fn ctx_str(&self, what: String) -> Cow<'static, str> {
        Cow::Owned(format!("{} {what}", self.inner.name))
    }

    /// The device's attributes (`ibv_query_device_ex(3)`, which falls back to
    /// `ibv_query_device` for providers without the extended verb).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_query_device_ex`.
    pub fn query_device(&self) -> Result<DeviceAttr> {
        let mut attr = ffi::ibv_device_attr_ex::default();
        // SAFETY: valid context; NULL input is allowed; `attr` is writable.
        let rc = unsafe { ffi::ibv_query_device_ex(self.as_raw(), std::ptr::null(), &mut attr) };
        check_errno_ret("ibv_query_device_ex", || self.inner.name.clone().into(), rc)?;
        Ok(DeviceAttr::from_raw(attr))
    }

    pub(crate) fn check_port(&self, port: u32) -> Result<u8> {
        match u8::try_from(port) {
            Ok(p) if p >= 1 && p <= self.inner.port_count => Ok(p),
            _ => Err(Error::InvalidPort {
                device: self.inner.name.clone(),
                port,
                port_count: u32::from(self.inner.port_count),
            }),
        }
    }

    /// The attributes of `port` (`ibv_query_port(3)`: the header macro, so the
    /// extended fields `link_layer`, `flags` and `port_cap_flags2` are set).
    ///
    /// # Errors
    /// [`Error::InvalidPort`] for a port the device does not have, otherwise
    /// [`Error::Verb`] naming `ibv_query_port`.
    pub fn query_port(&self, port: u32) -> Result<PortAttr> {
        let p = self.check_port(port)?;
        let mut attr = ffi::ibv_port_attr::default();
        // SAFETY: valid context, checked port, writable out-struct of the size
        // the header macro expects.
        let rc = unsafe { ffi::ibv_query_port(self.as_raw(), p, &mut attr) };
        check_errno_ret(
            "ibv_query_port",
            || self.ctx_str(format!("port {port}")),
            rc,
        )?;
        Ok(PortAttr::from_raw(attr))
    }

    fn check_gid_index(&self, port: u32, index: u32) -> Result<u8> {
        let p = self.check_port(port)?;
        let len = self.query_port(port)?.gid_tbl_len;
        if index >= len {
            return Err(Error::InvalidGidIndex {
                device: self.inner.name.clone(),
                port,
                index,
                table_len: len,
            });
        }
        Ok(p)
    }

    /// The GID at `index` of `port`'s table (`ibv_query_gid(3)`). An empty
    /// entry reads as the zero GID; [`Context::query_gid_ex`] tells them apart.
    ///
    /// # Errors
    /// [`Error::InvalidPort`], [`Error::InvalidGidIndex`] (index past
    /// `gid_tbl_len`), or [`Error::Verb`] naming `ibv_query_gid`.
    pub fn query_gid(&self, port: u32, index: u32) -> Result<Gid> {
        let p = self.check_gid_index(port, index)?;
        let mut gid = ffi::ibv_gid::default();
        let idx = std::ffi::c_int::try_from(index).unwrap_or(std::ffi::c_int::MAX);
        // SAFETY: valid context, checked port and index, writable out-union.
        let rc = unsafe { ffi::ibv_query_gid(self.as_raw(), p, idx, &mut gid) };
        check_minus_one(
            "ibv_query_gid",
            || self.ctx_str(format!("port {port} index {index}")),
            rc,
        )?;
        // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
        Ok(Gid::from_raw(unsafe { gid.raw }))
    }

    /// The GID table entry at `index` of `port`, with its type and netdev
    /// (`ibv_query_gid_ex(3)`).
    ///
    /// # Errors
    /// [`Error::InvalidPort`], [`Error::InvalidGidIndex`], [`Error::EmptyGid`]
    /// for an unused entry, or [`Error::Verb`] naming `ibv_query_gid_ex`.
    pub fn query_gid_ex(&self, port: u32, index: u32) -> Result<GidEntry> {
        self.check_gid_index(port, index)?;
        let mut entry = ffi::ibv_gid_entry::default();
        // SAFETY: valid context, checked port and index, writable out-struct.
        let rc = unsafe { ffi::ibv_query_gid_ex(self.as_raw(), port, index, &mut entry, 0) };
        if rc == libc::ENODATA || rc == -libc::ENODATA {
            return Err(Error::EmptyGid {
                device: self.inner.name.clone(),
                port,
                index,
            });
        }
        check_errno_ret(
            "ibv_query_gid_ex",
            || self.ctx_str(format!("port {port} index {index}")),
            rc,
        )?;
        Ok(GidEntry::from_raw(&entry))
    }

    /// Every valid entry of every port's GID table (`ibv_query_gid_table(3)`),
    /// ordered by port, then index. Empty entries are left out.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_query_gid_table` or `ibv_query_port`.
    pub fn query_gid_table(&self) -> Result<Vec<GidEntry>> {
        let mut total = 0usize;
        for port in 1..=u32::from(self.inner.port_count) {
            total += self.query_port(port)?.gid_tbl_len as usize;
        }
        let mut entries = vec![ffi::ibv_gid_entry::default(); total.max(1)];
        // SAFETY: valid context; `entries` has room for `entries.len()` entries.
        let n = unsafe {
            ffi::ibv_query_gid_table(self.as_raw(), entries.as_mut_ptr(), entries.len(), 0)
        };
        let n = usize::try_from(n).map_err(|_| {
            // Returns a negated errno on failure.
            let errno = i32::try_from(-n).unwrap_or(libc::EIO);
            Error::verb_errno("ibv_query_gid_table", self.inner.name.clone(), errno)
        })?;
        let mut out: Vec<GidEntry> = entries[..n].iter().map(GidEntry::from_raw).collect();
        out.sort_by_key(|e| (e.port, e.index));
        Ok(out)
    }

    /// The raw `ibv_port_attr` for callers that need a field this crate does
    /// not expose yet.
    ///
    /// # Errors
    /// As [`Context::query_port`].
    pub fn query_port_raw(&self, port: u32) -> Result<ffi::ibv_port_attr> {
        self.query_port(port).map(|p| p.raw)
    }

    /// The checked port and its P_Key table length; P_Key verbs on a port
    /// without a table (iWARP: `pkey_tbl_len` 0) are unsupported.
    fn pkey_table_len(&self, port: u32, verb: &'static str) -> Result<(u8, u16)> {
        let p = self.check_port(port)?;
        let len = self.query_port(port)?.pkey_tbl_len;
        if len == 0 {
            return Err(Error::Unsupported {
                what: format!("P_Keys ({verb}: port {port} has no P_Key table)").into(),
                device: self.inner.name.clone(),
                source: None,
            });
        }
        Ok((p, len))
    }

    /// The P_Key at `index` of `port`'s P_Key table, in host order
    /// (`ibv_query_pkey(3)`). RoCE ports have one entry, the default P_Key
    /// `0xffff`.
    ///
    /// # Errors
    /// - [`Error::InvalidPort`] for a port the device does not have;
    /// - [`Error::Unsupported`] when the port has no P_Key table (iWARP);
    /// - [`Error::InvalidArgument`] for an index past `pkey_tbl_len`;
    /// - [`Error::Verb`] naming `ibv_query_pkey` (it reads sysfs: `ENOENT`
    ///   for an entry sysfs does not list).
    pub fn query_pkey(&self, port: u32, index: u16) -> Result<u16> {
        const VERB: &str = "ibv_query_pkey";
        let (p, len) = self.pkey_table_len(port, VERB)?;
        if index >= len {
            return Err(Error::InvalidArgument {
                verb: VERB,
                reason: format!(
                    "P_Key index {index} is past the table of {len} entries of {} port {port}",
                    self.inner.name
                ),
            });
        }
        let mut pkey: ffi::__be16 = 0;
        // SAFETY: valid context, checked port, writable out-value.
        let rc = unsafe { ffi::ibv_query_pkey(self.as_raw(), p, i32::from(index), &mut pkey) };
        check_minus_one(
            VERB,
            || self.ctx_str(format!("port {port} P_Key index {index}")),
            rc,
        )?;
        Ok(u16::from_be(pkey))
    }

    /// The index of `pkey` (host order) in `port`'s P_Key table, or `None`
    /// when the table does not hold it (`ibv_get_pkey_index(3)`).
    ///
    /// # Errors
    /// - [`Error::InvalidPort`] for a port the device does not have;
    /// - [`Error::Unsupported`] when the port has no P_Key table (iWARP);
    /// - [`Error::Verb`] naming `ibv_get_pkey_index` for a failure other
    ///   than reaching the end of the table (which it reports as `ENOENT`).
    pub fn get_pkey_index(&self, port: u32, pkey: u16) -> Result<Option<u16>> {
        const VERB: &str = "ibv_get_pkey_index";
        let (p, _) = self.pkey_table_len(port, VERB)?;
        // SAFETY: valid context and checked port; the P_Key is passed by value.
        let rc = unsafe { ffi::ibv_get_pkey_index(self.as_raw(), p, pkey.to_be()) };
        if rc >= 0 {
            return Ok(u16::try_from(rc).ok());
        }
        // The verb walks the table until a read fails: ENOENT is its end.
        match error::last_errno() {
            libc::ENOENT => Ok(None),
            errno => Err(Error::verb_errno(
                VERB,
                self.ctx_str(format!("port {port} P_Key {pkey:#06x}")),
                errno,
            )),
        }
    }

    /// The node GUID as the device reports it in `query_device`.
    ///
    /// # Errors
    /// As [`Context::query_device`].
    pub fn node_guid(&self) -> Result<Guid> {
        Ok(self.query_device()?.node_guid())
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.inner.name)
            .field("ctx", &self.inner.ctx)
            .finish()
    }
}

/// The context's asynchronous event file descriptor, for polling
/// ([`Context::async_fd`]).
#[derive(Debug)]
pub struct AsyncFd<'a> {
    /// Open (never -1) while the context lives, which `'a` guarantees.
    fd: RawFd,
    _ctx: std::marker::PhantomData<&'a Context>,
}

impl AsFd for AsyncFd<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: `fd` is not -1 (checked when `self` was made) and stays
        // open while the context, which `self` borrows, lives.
        unsafe { BorrowedFd::borrow_raw(self.fd) }
    }
}

impl AsRawFd for AsyncFd<'_> {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

impl Context {
    /// Waits for the next asynchronous event (`ibv_get_async_event(3)`) and
    /// acknowledges it (`ibv_ack_async_event(3)`).
    ///
    /// # Errors
    /// [`crate::Error::Unsupported`] for a context without an event
    /// descriptor (see [`Context::async_fd`]); [`crate::Error::Verb`] naming
    /// `ibv_get_async_event`; `EAGAIN` when the descriptor is non-blocking
    /// and nothing is pending.
    pub fn get_async_event(&self) -> Result<AsyncEvent> {
        self.async_fd()?;
        let mut ev = ffi::ibv_async_event {
            element: ffi::ibv_async_event__bindgen_ty_1 { port_num: 0 },
            event_type: 0,
        };
        // SAFETY: valid context and out-struct.
        let rc = unsafe { ffi::ibv_get_async_event(self.as_raw(), &mut ev) };
        check_minus_one("ibv_get_async_event", || self.name().to_string().into(), rc)?;
        let event = AsyncEvent::from_raw(&ev);
        // SAFETY: the event came from ibv_get_async_event; acked exactly once.
        unsafe { ffi::ibv_ack_async_event(&mut ev) };
        self.run_event_hooks(&event);
        Ok(event)
    }

    /// The asynchronous event descriptor, e.g. for `poll(2)` or an async
    /// runtime's readiness API.
    ///
    /// # Errors
    /// [`crate::Error::Unsupported`] for a context that has none: a context
    /// made by [`Context::import_device`] (libibverbs 44 leaves its
    /// `async_fd` at -1; the events of its command file go to the original
    /// context's descriptor).
    pub fn async_fd(&self) -> Result<AsyncFd<'_>> {
        // SAFETY: reads a field of a live context.
        let fd = unsafe { (*self.as_raw()).async_fd };
        if fd < 0 {
            return Err(Error::Unsupported {
                what: "asynchronous events (the context has no event descriptor: \
                       an imported context's events go to the original context)"
                    .into(),
                device: self.name().to_string(),
                source: None,
            });
        }
        Ok(AsyncFd {
            fd,
            _ctx: std::marker::PhantomData,
        })
    }

    /// Switches the asynchronous event descriptor to non-blocking mode.
    ///
    /// # Errors
    /// As [`Context::async_fd`]; [`crate::Error::Verb`] naming `fcntl`.
    pub fn set_async_nonblocking(&self, nonblocking: bool) -> Result<()> {
        let fd = self.async_fd()?.as_raw_fd();
        // SAFETY: fcntl on a descriptor the context owns.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        check_minus_one("fcntl", || "F_GETFL on the async fd".into(), flags)?;
        let flags = if nonblocking {
            flags | libc::O_NONBLOCK
        } else {
            flags & !libc::O_NONBLOCK
        };
        // SAFETY: as above.
        let rc = unsafe { libc::fcntl(fd, libc::F_SETFL, flags) };
        check_minus_one("fcntl", || "F_SETFL on the async fd".into(), rc)?;
        Ok(())
    }
}
