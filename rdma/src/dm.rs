//! Device memory (`ibv_alloc_dm(3)`): memory on the adapter itself.
//!
//! [`DeviceMemory`] is not host memory: it is reached only by copying
//! ([`DeviceMemory::write_at`], [`DeviceMemory::read_at`], i.e.
//! `ibv_memcpy_to_dm`/`ibv_memcpy_from_dm`) and by the device, through a
//! [`DeviceMemoryRegion`] (`ibv_reg_dm_mr`). No Rust reference to it ever
//! exists, so a peer writing it through a region races with nothing but other
//! copies.
//!
//! Devices without device memory report `max_dm_size` 0 (soft-RoCE,
//! soft-iWARP); [`Context::alloc_dm`] then fails with [`Error::Unsupported`]
//! before calling into C.
//!
//! Memory of another device, a GPU's say, is registered through the dma-buf
//! that exports it ([`ProtectionDomain::reg_dmabuf_mr`]): the same
//! [`DeviceMemoryRegion`], never Rust memory either (the CPU may not even be
//! able to reach it), used by work requests as a [`DeviceSlice`] and by peers
//! through [`DeviceMemoryRegion::remote`].

use std::fmt;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{call_ptr, check_errno_ret, Error, Result};
use crate::{ffi, AccessFlags, Context, ProtectionDomain, RemoteMemory};

pub(crate) struct DmInner {
    dm: NonNull<ffi::ibv_dm>,
    len: usize,
    /// Made by `ibv_import_dm`: released with `ibv_unimport_dm`, which
    /// leaves the memory to its owner, instead of `ibv_free_dm`.
    imported: bool,
    // Dropped after the memory is freed (field order).
    ctx: Context,
}

// SAFETY: device memory is a kernel/device object; the provider's copy
// functions may be called from any thread (libibverbs' thread safety), and
// the Rust side holds no interior mutability.
unsafe impl Send for DmInner {}
// SAFETY: as above.
unsafe impl Sync for DmInner {}

impl Drop for DmInner {
    fn drop(&mut self) {
        if self.imported {
            // SAFETY: made by ibv_import_dm; every DeviceMemoryRegion over it
            // holds an Arc to it, so none is left; unimported once. The verb
            // reports nothing and never calls the kernel.
            unsafe { ffi::ibv_unimport_dm(self.dm.as_ptr()) };
            return;
        }
        // SAFETY: every DeviceMemoryRegion of this memory holds an Arc to it,
        // so none is left; freed once.
        let rc = unsafe { ffi::ibv_free_dm(self.dm.as_ptr()) };
        if rc != 0 {
            crate::error::teardown_failed(format_args!(
                "ibv_free_dm on {} failed: errno {rc}",
                self.ctx.name()
            ));
        }
    }
}

/// A buffer of device memory (`struct ibv_dm`). Not `Clone`; freed when it
/// and every [`DeviceMemoryRegion`] over it are dropped. Keeps its context
/// open.
///
/// ```no_run
/// # fn main() -> rdma::Result<()> {
/// let ctx = rdma::Context::open("mlx5_0")?;
/// let mut dm = ctx.alloc_dm(4096)?; // memory on the adapter
/// dm.write_at(0, b"hello")?;
/// let mut back = [0u8; 5];
/// dm.read_at(0, &mut back)?;
/// # Ok(()) }
/// ```
pub struct DeviceMemory {
    inner: Arc<DmInner>,
}

/// Checks that `offset..offset + len` lies within `size` bytes.
fn check_dm_range(verb: &'static str, size: usize, offset: u64, len: usize) -> Result<usize> {
    let fits = usize::try_from(offset)
        .ok()
        .and_then(|o| Some((o, o.checked_add(len)?)))
        .filter(|&(_, end)| end <= size);
    match fits {
        Some((o, _)) => Ok(o),
        None => Err(Error::InvalidArgument {
            verb,
            reason: format!(
                "range {offset}..{} is outside the device memory of {size} bytes",
                u128::from(offset) + len as u128
            ),
        }),
    }
}

impl Context {
    /// Allocates `len` bytes of device memory (`ibv_alloc_dm(3)`).
    ///
    /// # Errors
    /// As [`Context::alloc_dm_aligned`].
    pub fn alloc_dm(&self, len: usize) -> Result<DeviceMemory> {
        self.alloc_dm_aligned(len, 0)
    }

    /// Allocates `len` bytes of device memory whose device address is a
    /// multiple of `2^log_align` (`ibv_alloc_dm(3)`, `log_align_req`; atomics
    /// on device memory may need it).
    ///
    /// # Errors
    /// - [`Error::InvalidArgument`] for `len == 0`, `log_align >= 64`, or
    ///   `len` larger than the device's `max_dm_size`;
    /// - [`Error::Unsupported`] when the device reports `max_dm_size` 0
    ///   (checked with `ibv_query_device_ex` before the verb), or the verb
    ///   returns `EOPNOTSUPP`/`ENOSYS`;
    /// - [`Error::Verb`] naming `ibv_alloc_dm` (e.g. `ENOMEM` when the
    ///   device memory is used up).
    pub fn alloc_dm_aligned(&self, len: usize, log_align: u32) -> Result<DeviceMemory> {
        const VERB: &str = "ibv_alloc_dm";
        if len == 0 {
            return Err(Error::InvalidArgument {
                verb: VERB,
                reason: "device memory cannot be empty".into(),
            });
        }
        if log_align >= 64 {
            return Err(Error::InvalidArgument {
                verb: VERB,
                reason: format!("alignment 2^{log_align} is not an address alignment"),
            });
        }
        let max = self.query_device()?.max_dm_size();
        if max == 0 {
            return Err(Error::Unsupported {
                what: "device memory (max_dm_size 0)".into(),
                device: self.name().to_string(),
                source: None,
            });
        }
        if len as u64 > max {
            return Err(Error::InvalidArgument {
                verb: VERB,
                reason: format!("{len} bytes exceed the device's max_dm_size of {max} bytes"),
            });
        }
        let mut attr = ffi::ibv_alloc_dm_attr {
            length: len,
            log_align_req: log_align,
            comp_mask: 0,
        };
        let dm = call_ptr(
            VERB,
            || format!("{} {len} bytes, log_align {log_align}", self.name()).into(),
            || {
                // SAFETY: valid context and attribute struct.
                unsafe { ffi::ibv_alloc_dm(self.as_raw(), &mut attr) }
            },
        )
        .map_err(|e| {
            e.unsupported_if_not_implemented("device memory (ibv_alloc_dm)", self.name())
        })?;
        Ok(DeviceMemory {
            inner: Arc::new(DmInner {
                dm,
                len,
                imported: false,
                ctx: self.clone(),
            }),
        })
    }
}

impl DeviceMemory {
    /// Wraps device memory made by `ibv_import_dm`, unimported on drop.
    ///
    /// # Safety
    /// `dm` was imported into `ctx`, is owned by nobody else here, and is at
    /// least `len` bytes long.
    pub(crate) unsafe fn from_import(
        ctx: &Context,
        dm: NonNull<ffi::ibv_dm>,
        len: usize,
    ) -> DeviceMemory {
        DeviceMemory {
            inner: Arc::new(DmInner {
                dm,
                len,
                imported: true,
                ctx: ctx.clone(),
            }),
        }
    }

    /// The size in bytes (for imported memory: the size the importer
    /// vouched for, see [`Context::import_dm`]).
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// The memory's kernel handle (`ibv_dm->handle`), which names it within
    /// the command file of its context: what [`Context::import_dm`] takes.
    /// `None` when the provider did not set it (`IBV_DM_MASK_HANDLE` clear
    /// in `comp_mask`).
    pub fn handle(&self) -> Option<u32> {
        // SAFETY: reads plain fields of live device memory.
        let (mask, handle) = unsafe {
            let dm = self.inner.dm.as_ptr();
            ((*dm).comp_mask, (*dm).handle)
        };
        (mask & ffi::IBV_DM_MASK_HANDLE != 0).then_some(handle)
    }

    /// True for memory made by [`Context::import_dm`]: dropping it releases
    /// only this process's view (`ibv_unimport_dm`), never the memory.
    pub fn is_imported(&self) -> bool {
        self.inner.imported
    }

    /// Always false: device memory is never empty.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The context the memory belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The raw `ibv_dm`, valid while this handle (or a region over it) lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_dm {
        self.inner.dm.as_ptr()
    }

    /// Copies `data` into the device memory at `offset`
    /// (`ibv_memcpy_to_dm(3)`). An empty `data` within bounds does nothing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `offset..offset + data.len()` is not
    /// within [`DeviceMemory::len`]; [`Error::Verb`] naming
    /// `ibv_memcpy_to_dm` (providers may require aligned offsets/lengths).
    pub fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        const VERB: &str = "ibv_memcpy_to_dm";
        check_dm_range(VERB, self.inner.len, offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: live DM; the range is within it (checked); `data` is
        // readable for its length and only read.
        let rc = unsafe {
            ffi::ibv_memcpy_to_dm(self.as_raw(), offset, data.as_ptr().cast(), data.len())
        };
        check_errno_ret(
            VERB,
            || format!("offset {offset}, {} bytes", data.len()).into(),
            rc,
        )
    }

    /// Copies device memory at `offset` into `out` (`ibv_memcpy_from_dm(3)`).
    /// An empty `out` within bounds does nothing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `offset..offset + out.len()` is not
    /// within [`DeviceMemory::len`]; [`Error::Verb`] naming
    /// `ibv_memcpy_from_dm`.
    pub fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        const VERB: &str = "ibv_memcpy_from_dm";
        check_dm_range(VERB, self.inner.len, offset, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        // SAFETY: live DM; the range is within it (checked); `out` is
        // writable for its length and exclusively borrowed.
        let rc = unsafe {
            ffi::ibv_memcpy_from_dm(out.as_mut_ptr().cast(), self.as_raw(), offset, out.len())
        };
        check_errno_ret(
            VERB,
            || format!("offset {offset}, {} bytes", out.len()).into(),
            rc,
        )
    }
}

impl fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceMemory")
            .field("device", &self.inner.ctx.name())
            .field("len", &self.inner.len)
            .field("imported", &self.inner.imported)
            .finish()
    }
}

/// A memory region over memory that is not Rust memory: the adapter's own
/// (`ibv_reg_dm_mr(3)`, [`ProtectionDomain::reg_dm_mr`]) or another device's
/// exported as a dma-buf (`ibv_reg_dmabuf_mr(3)`,
/// [`ProtectionDomain::reg_dmabuf_mr`]).
///
/// Device memory regions are zero-based: work requests and peers address
/// them by offset from the first byte ([`DeviceMemoryRegion::remote`] has
/// `addr` 0); a dma-buf region from its iova. It exposes no host memory:
/// read and write device memory through the [`DeviceMemory`], a dma-buf
/// through its exporter. Local work requests take a piece of it as a
/// [`DeviceSlice`] ([`crate::WrBuffers::Device`]). Not `Clone`; keeps the
/// device memory (or the dma-buf's descriptor) and the PD alive.
pub struct DeviceMemoryRegion {
    mr: NonNull<ffi::ibv_mr>,
    offset: usize,
    len: usize,
    access: AccessFlags,
    /// The address work requests and peers use for the first byte: 0 for
    /// device memory (zero-based), the iova for a dma-buf.
    base: u64,
    // Deregistered in Drop, then the memory may go (unless the
    // deregistration failed: the device may still reach it, so it is kept
    // for good), then the PD is released (field order).
    backing: std::mem::ManuallyDrop<Backing>,
    pd: ProtectionDomain,
}

/// What a [`DeviceMemoryRegion`] covers.
enum Backing {
    /// Device memory, kept allocated while registered.
    Dm(#[allow(dead_code)] Arc<DmInner>),
    /// A dma-buf: its descriptor, kept open while registered (the exporter
    /// keeps the buffer while a descriptor of it is).
    DmaBuf(#[allow(dead_code)] OwnedFd),
}

// SAFETY: the registration is a kernel object handle; the Rust side only
// reads immutable fields.
unsafe impl Send for DeviceMemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for DeviceMemoryRegion {}

impl ProtectionDomain {
    /// Registers `offset..offset + len` of `dm` as a memory region
    /// (`ibv_reg_dm_mr(3)`). [`AccessFlags::ZERO_BASED`], which the verb
    /// requires, is added to `access`.
    ///
    /// # Errors
    /// - [`Error::InvalidArgument`] for `len == 0`, a range outside `dm`, or
    ///   device memory of another context than the PD's;
    /// - [`Error::Unsupported`] when the verb returns `EOPNOTSUPP`/`ENOSYS`;
    /// - [`Error::Verb`] naming `ibv_reg_dm_mr`.
    pub fn reg_dm_mr(
        &self,
        dm: &DeviceMemory,
        offset: usize,
        len: usize,
        access: AccessFlags,
    ) -> Result<DeviceMemoryRegion> {
        const VERB: &str = "ibv_reg_dm_mr";
        if len == 0 {
            return Err(Error::InvalidArgument {
                verb: VERB,
                reason: "a memory region cannot be empty".into(),
            });
        }
        check_dm_range(VERB, dm.len(), offset as u64, len)?;
        if dm.context().as_raw() != self.context().as_raw() {
            return Err(Error::InvalidArgument {
                verb: VERB,
                reason: format!(
                    "the device memory belongs to another context ({}) than the PD ({})",
                    dm.context().name(),
                    self.context().name()
                ),
            });
        }
        let access = access | AccessFlags::ZERO_BASED;
        let mr = call_ptr(
            VERB,
            || format!("offset {offset}, {len} bytes, access {access:?}").into(),
            || {
                // SAFETY: valid PD and DM of the same context; the range is within
                // the DM. The region keeps the DM alive (`dm` field).
                unsafe {
                    ffi::ibv_reg_dm_mr(
                        self.as_raw(),
                        dm.as_raw(),
                        offset as u64,
                        len,
                        access.bits(),
                    )
                }
            },
        )
        .map_err(|e| {
            e.unsupported_if_not_implemented(
                "device memory regions (ibv_reg_dm_mr)",
                self.context().name(),
            )
        })?;
        Ok(DeviceMemoryRegion {
            mr,
            offset,
            len,
            access,
            base: 0,
            backing: std::mem::ManuallyDrop::new(Backing::Dm(Arc::clone(&dm.inner))),
            pd: self.clone(),
        })
    }

    /// Registers `len` bytes of the dma-buf `fd` from `offset` as a memory
    /// region that work requests and peers address from `iova`
    /// (`ibv_reg_dmabuf_mr(3)`): GPU memory, or any device's that its driver
    /// exports as a dma-buf. The region keeps its own duplicate of `fd`
    /// open while it is registered. Its memory is never Rust memory: local
    /// requests use it as a [`DeviceSlice`], peers through
    /// [`DeviceMemoryRegion::remote`].
    ///
    /// Providers: mlx5 (and efa, irdma, bnxt_re in recent rdma-core) register
    /// dma-bufs; soft-RoCE and soft-iWARP on Linux 6.1 do not (their
    /// [`Error::Unsupported`] carries the errno).
    ///
    /// ```no_run
    /// # fn f(pd: &rdma::ProtectionDomain, gpu_buffer: std::os::fd::BorrowedFd<'_>)
    /// #     -> rdma::Result<()> {
    /// use rdma::{AccessFlags, DeviceSlice, RemoteMemory};
    /// // `gpu_buffer`: a dma-buf descriptor from the GPU driver (its export of
    /// // a 1 MiB allocation).
    /// let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    /// let region = pd.reg_dmabuf_mr(gpu_buffer, 0, 1 << 20, 0, access)?;
    /// let for_the_peer: RemoteMemory = region.remote();
    /// let first_page = DeviceSlice::new(region, 0, 4096); // for a local request
    /// # let _ = (for_the_peer, first_page);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// - [`Error::InvalidArgument`] for `len == 0`;
    /// - [`Error::Verb`] naming `fcntl` when `fd` cannot be duplicated;
    /// - [`Error::Unsupported`] when the provider cannot register dma-bufs
    ///   (`EOPNOTSUPP`, `ENOSYS`), with the errno;
    /// - [`Error::Verb`] naming `ibv_reg_dmabuf_mr` otherwise (`EBADF` for a
    ///   descriptor that is no dma-buf, `EINVAL` for a range past the buffer,
    ///   `EACCES`/`EINVAL` for access the buffer cannot give, as the kernel
    ///   says).
    pub fn reg_dmabuf_mr(
        &self,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<DeviceMemoryRegion> {
        const VERB: &str = "ibv_reg_dmabuf_mr";
        if len == 0 {
            return Err(Error::InvalidArgument {
                verb: VERB,
                reason: "a memory region cannot be empty".into(),
            });
        }
        let fd = fd.try_clone_to_owned().map_err(|e| Error::Verb {
            verb: "fcntl",
            context: "F_DUPFD_CLOEXEC of the dma-buf's descriptor".into(),
            source: e,
        })?;
        let raw_fd = std::os::fd::AsRawFd::as_raw_fd(&fd);
        let mr = call_ptr(
            VERB,
            || {
                format!(
                    "fd {raw_fd}, offset {offset}, {len} bytes, iova {iova:#x}, access {access:?}"
                )
                .into()
            },
            || {
                // SAFETY: valid PD; the descriptor is open (the region keeps
                // it), and the verb only reads the arguments.
                unsafe {
                    ffi::ibv_reg_dmabuf_mr(
                        self.as_raw(),
                        offset,
                        len,
                        iova,
                        raw_fd,
                        access.bits() as i32,
                    )
                }
            },
        )
        .map_err(|e| {
            e.unsupported_if_not_implemented(
                "dma-buf memory regions (ibv_reg_dmabuf_mr)",
                self.context().name(),
            )
        })?;
        Ok(DeviceMemoryRegion {
            mr,
            offset: usize::try_from(offset).unwrap_or(usize::MAX),
            len,
            access,
            base: iova,
            backing: std::mem::ManuallyDrop::new(Backing::DmaBuf(fd)),
            pd: self.clone(),
        })
    }
}

impl DeviceMemoryRegion {
    /// The local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: the registration lives as long as `self`.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr.as_ptr()).rkey }
    }

    /// Where the region starts in its device memory (or its dma-buf).
    pub fn dm_offset(&self) -> usize {
        self.offset
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: regions are never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The access flags, [`AccessFlags::ZERO_BASED`] included.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The raw `ibv_mr`, valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_mr {
        self.mr.as_ptr()
    }

    /// What a peer needs to address the region: `addr` 0 (zero-based), its
    /// length and rkey.
    pub fn remote(&self) -> RemoteMemory {
        RemoteMemory {
            addr: self.base,
            len: self.len as u64,
            rkey: self.rkey(),
        }
    }
}

impl Drop for DeviceMemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered by reg_dm_mr, deregistered once, before the
        // device memory it covers can be freed (field order).
        let rc = unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
        if rc != 0 {
            crate::error::teardown_failed(format_args!(
                "ibv_dereg_mr of a device memory region on {} failed: errno {rc}; keeping \
                 its memory",
                self.pd.context().name()
            ));
            return;
        }
        // SAFETY: taken once, here, and never used again.
        drop(unsafe { std::mem::ManuallyDrop::take(&mut self.backing) });
    }
}

impl fmt::Debug for DeviceMemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceMemoryRegion")
            .field("device", &self.pd.context().name())
            .field("dma_buf", &matches!(*self.backing, Backing::DmaBuf(_)))
            .field("dm_offset", &self.offset)
            .field("len", &self.len)
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .field("access", &self.access)
            .finish()
    }
}

/// A piece of a [`DeviceMemoryRegion`] as one scatter/gather entry of a
/// work request ([`crate::WrBuffers::Device`]): `len` bytes from `offset`,
/// counted from the region's first byte (the entry's address is that offset
/// for zero-based device memory, the region's iova plus it for a dma-buf).
///
/// The region is held by `Arc` (a region given by value is moved into one)
/// and each request in flight holds a reference until its completion gives
/// the slice back, so the region stays registered, and its device memory
/// allocated, while the device may use it. Unlike host memory, one region
/// may be written by the device for several requests at once (receives, RDMA
/// READ, atomics): device memory is never Rust memory (see the module
/// documentation), so nothing aliases; which bytes mean what is the
/// program's affair, as for the peers that write it through its rkey.
///
/// The range is checked when the request is posted: a range outside the
/// region (or longer than one entry's `u32` length) is an
/// [`Error::InvalidArgument`] naming the post verb, with the slice given
/// back in the [`crate::PostError`], and nothing is posted.
///
/// ```no_run
/// # fn demo(ctx: &rdma::Context, pd: &rdma::ProtectionDomain, qp: &mut rdma::QueuePair)
/// #     -> Result<(), Box<dyn std::error::Error>> {
/// use rdma::{AccessFlags, DeviceSlice, SendWr};
/// let mut dm = ctx.alloc_dm(4096)?;
/// dm.write_at(0, b"hello")?;
/// let region = pd.reg_dm_mr(&dm, 0, 4096, AccessFlags::LOCAL_WRITE)?;
/// qp.post_send(SendWr::send(1, DeviceSlice::new(region, 0, 5)))
///     .map_err(rdma::PostError::drop_buffers)?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct DeviceSlice {
    region: Arc<DeviceMemoryRegion>,
    offset: u64,
    len: usize,
}

impl DeviceSlice {
    /// `len` bytes of `region` from `offset` (checked when posted).
    pub fn new(region: impl Into<Arc<DeviceMemoryRegion>>, offset: u64, len: usize) -> Self {
        DeviceSlice {
            region: region.into(),
            offset,
            len,
        }
    }

    /// The whole region.
    pub fn whole(region: impl Into<Arc<DeviceMemoryRegion>>) -> Self {
        let region = region.into();
        let len = region.len();
        DeviceSlice::new(region, 0, len)
    }

    /// The region.
    pub fn region(&self) -> &Arc<DeviceMemoryRegion> {
        &self.region
    }

    /// The region back (this slice's reference to it).
    pub fn into_region(self) -> Arc<DeviceMemoryRegion> {
        self.region
    }

    /// Where the slice starts, from the region's first byte.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length slice.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Why this slice cannot be a scatter/gather entry, if it cannot.
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        check_slice(self.region.len, self.offset, self.len).map(|_| ())
    }

    /// The scatter/gather entry, for a slice [`DeviceSlice::check`] accepted.
    pub(crate) fn sge(&self) -> ffi::ibv_sge {
        ffi::ibv_sge {
            addr: self.region.base + self.offset,
            length: u32::try_from(self.len).unwrap_or(u32::MAX),
            lkey: self.region.lkey(),
        }
    }
}

impl From<DeviceMemoryRegion> for DeviceSlice {
    fn from(region: DeviceMemoryRegion) -> Self {
        DeviceSlice::whole(region)
    }
}

impl From<Arc<DeviceMemoryRegion>> for DeviceSlice {
    fn from(region: Arc<DeviceMemoryRegion>) -> Self {
        DeviceSlice::whole(region)
    }
}

/// Checks that `len` bytes from `offset` lie within a zero-based region of
/// `region_len` bytes and fit one scatter/gather entry; returns the entry's
/// length.
fn check_slice(region_len: usize, offset: u64, len: usize) -> std::result::Result<u32, String> {
    let end = u128::from(offset) + len as u128;
    if end > region_len as u128 {
        return Err(format!(
            "bytes {offset}..{end} are outside the device memory region of {region_len} bytes"
        ));
    }
    u32::try_from(len)
        .map_err(|_| format!("a device memory slice of {len} bytes is longer than one SGE can be"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_inside_the_region() {
        assert_eq!(check_slice(4096, 0, 4096), Ok(4096));
        assert_eq!(check_slice(4096, 4000, 96), Ok(96));
        // Empty slices anywhere up to the end (a zero-length receive).
        assert_eq!(check_slice(4096, 4096, 0), Ok(0));
        assert_eq!(check_slice(4096, 0, 0), Ok(0));
    }

    #[test]
    fn slices_beyond_the_region_are_refused_naming_the_range() {
        let e = check_slice(4096, 4000, 97).unwrap_err();
        assert_eq!(
            e,
            "bytes 4000..4097 are outside the device memory region of 4096 bytes"
        );
        let e = check_slice(4096, 4097, 0).unwrap_err();
        assert!(e.contains("4097..4097"), "{e}");
        // No wrapping: the end is computed wide.
        let e = check_slice(4096, u64::MAX, 2).unwrap_err();
        assert!(
            e.contains("18446744073709551615..18446744073709551617"),
            "{e}"
        );
        assert!(check_slice(4096, 1, usize::MAX).is_err());
        assert!(check_slice(usize::MAX, 0, usize::MAX).is_err());
    }

    #[test]
    fn a_slice_longer_than_an_sge_is_refused() {
        if let Ok(big) = usize::try_from(u64::from(u32::MAX) + 1) {
            let e = check_slice(big, 0, big).unwrap_err();
            assert!(e.contains("longer than one SGE"), "{e}");
            assert_eq!(check_slice(big, 1, big - 1), Ok(u32::MAX));
        }
    }

    #[test]
    fn ranges_inside_the_memory() {
        assert_eq!(check_dm_range("v", 64, 0, 64).unwrap(), 0);
        assert_eq!(check_dm_range("v", 64, 60, 4).unwrap(), 60);
        assert_eq!(check_dm_range("v", 64, 64, 0).unwrap(), 64);
    }

    #[test]
    fn ranges_outside_the_memory() {
        let e = check_dm_range("ibv_memcpy_to_dm", 64, 60, 8).unwrap_err();
        assert_eq!(e.verb(), Some("ibv_memcpy_to_dm"));
        assert_eq!(e.errno(), Some(libc::EINVAL));
        assert!(
            e.to_string()
                .contains("range 60..68 is outside the device memory of 64 bytes"),
            "{e}"
        );
        assert!(check_dm_range("v", 64, 65, 0).is_err());
        // Overflowing ranges are outside, not wrapped.
        let e = check_dm_range("v", 64, u64::MAX, 2).unwrap_err();
        assert!(e.to_string().contains("18446744073709551617"), "{e}");
        assert!(check_dm_range("v", 64, 1, usize::MAX).is_err());
    }
}
