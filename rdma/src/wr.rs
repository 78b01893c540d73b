//! Work requests for the safe post path.

use crate::macros::c_enum;
use crate::mr::RemoteMemory;
use crate::{ffi, AddressHandle, DeviceSlice, MemoryRegion};
use std::sync::Arc;

c_enum! {
    /// `enum ibv_wr_opcode`: the operation of a send work request.
    pub enum WrOpcode: u32 {
        /// RDMA write.
        RdmaWrite = ffi::IBV_WR_RDMA_WRITE,
        /// RDMA write with immediate data.
        RdmaWriteWithImm = ffi::IBV_WR_RDMA_WRITE_WITH_IMM,
        /// Send.
        Send = ffi::IBV_WR_SEND,
        /// Send with immediate data.
        SendWithImm = ffi::IBV_WR_SEND_WITH_IMM,
        /// RDMA read.
        RdmaRead = ffi::IBV_WR_RDMA_READ,
        /// Atomic compare and swap.
        AtomicCmpAndSwp = ffi::IBV_WR_ATOMIC_CMP_AND_SWP,
        /// Atomic fetch and add.
        AtomicFetchAndAdd = ffi::IBV_WR_ATOMIC_FETCH_AND_ADD,
        /// Local invalidate.
        LocalInv = ffi::IBV_WR_LOCAL_INV,
        /// Memory window bind.
        BindMw = ffi::IBV_WR_BIND_MW,
        /// Send with invalidate.
        SendWithInv = ffi::IBV_WR_SEND_WITH_INV,
        /// TCP segmentation offload (raw packet QPs).
        Tso = ffi::IBV_WR_TSO,
        /// Driver-specific.
        Driver1 = ffi::IBV_WR_DRIVER1,
        /// Atomic write.
        AtomicWrite = ffi::IBV_WR_ATOMIC_WRITE,
    }
}

/// A C work request that points to the next one of its chain.
pub(crate) trait Linked: Sized {
    fn set_next(&mut self, next: *mut Self);
}

impl Linked for ffi::ibv_send_wr {
    fn set_next(&mut self, next: *mut Self) {
        self.next = next;
    }
}

impl Linked for ffi::ibv_recv_wr {
    fn set_next(&mut self, next: *mut Self) {
        self.next = next;
    }
}

/// Links `reqs` into one chain, first to last, and returns its head; the
/// chain stays valid while `reqs` is neither moved nor reallocated.
pub(crate) fn link<T: Linked>(reqs: &mut [T]) -> *mut T {
    let base = reqs.as_mut_ptr();
    for i in 1..reqs.len() {
        // SAFETY: `i` and `i - 1` are in bounds of `reqs`.
        unsafe { (*base.add(i - 1)).set_next(base.add(i)) };
    }
    base
}

/// How many requests of the `len`-long chain from `base` a post verb took:
/// all when it returned 0, otherwise those before `bad`, where it stopped.
pub(crate) fn posted<T>(rc: std::ffi::c_int, base: *mut T, bad: *mut T, len: usize) -> usize {
    if rc == 0 {
        len
    } else if bad.is_null() {
        0
    } else {
        // SAFETY: the verb points `bad` into the chain it was given, which
        // starts at `base`.
        usize::try_from(unsafe { bad.offset_from(base) }).unwrap_or(0)
    }
}

/// The memory a work request used, given back with its completion.
///
/// A request owns its memory until the completion hands it back: `One` and
/// `Many` move regions into the queue. `Shared` lends a region that the
/// device only reads (the gather list of a SEND or an RDMA WRITE) to any
/// number of requests at once, on one queue pair or many: each request
/// holds one `Arc` reference until its completion, so the region stays
/// registered while any of them is in flight, and nobody can get `&mut`
/// access to it (`Arc::get_mut` and `Arc::into_inner` succeed only once
/// every request gave its reference back). Requests that make the device
/// write local memory (receives, RDMA READ, atomics) refuse it. `Device`
/// is a piece of a region of device memory, which is never Rust memory:
/// its region is always held by `Arc`, by any requests at once
/// ([`DeviceSlice`]).
///
/// ```
/// # fn demo(qp: &mut rdma::QueuePair, qp2: &mut rdma::QueuePair, pd: &rdma::ProtectionDomain)
/// #     -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use rdma::{AccessFlags, SendWr, WrBuffers};
/// let mut block = pd.alloc_mr(4096, AccessFlags::empty())?;
/// block.as_mut_slice()?.fill(7);
/// let block = Arc::new(block);
/// // The same bytes to two peers at once (two replicas, say).
/// qp.post_send(SendWr::send(1, WrBuffers::Shared(Arc::clone(&block))))
///     .map_err(rdma::PostError::drop_buffers)?;
/// qp2.post_send(SendWr::send(2, WrBuffers::Shared(Arc::clone(&block))))
///     .map_err(rdma::PostError::drop_buffers)?;
/// # Ok(()) }
/// ```
#[derive(Debug, Default)]
pub enum WrBuffers {
    /// None (inline data, or a zero-length operation).
    #[default]
    None,
    /// One region (one scatter/gather entry).
    One(MemoryRegion),
    /// Several regions, in scatter/gather order.
    Many(Vec<MemoryRegion>),
    /// One region that the device only reads, shared with other requests
    /// and holders (one scatter/gather entry).
    Shared(Arc<MemoryRegion>),
    /// A piece of a region of device memory (one scatter/gather entry,
    /// zero-based: its offset in the region is its address). Checked on
    /// every post with the full checks (never the quick ones).
    Device(DeviceSlice),
}

/// Why a request whose device writes its local memory (a receive, an RDMA
/// READ, an atomic) refuses [`WrBuffers::Shared`]: the QP's and the SRQ's
/// full checks give this reason.
pub(crate) const SHARED_IS_READ_ONLY: &str =
    "the device writes into this request's memory (a receive, RDMA READ or atomic), and a \
     shared region may only be read: post a region of its own (WrBuffers::One)";

impl WrBuffers {
    /// The regions as a `Vec`, in scatter/gather order. A `Shared` region
    /// is in it only when this was its last reference (`Arc::into_inner`);
    /// otherwise its other holders keep it. A `Device` slice is host memory
    /// of nobody's: take it with [`WrBuffers::into_device`] instead (here
    /// its reference is dropped).
    pub fn into_vec(self) -> Vec<MemoryRegion> {
        match self {
            WrBuffers::None | WrBuffers::Device(_) => Vec::new(),
            WrBuffers::One(m) => vec![m],
            WrBuffers::Many(v) => v,
            WrBuffers::Shared(a) => Arc::into_inner(a).into_iter().collect(),
        }
    }

    /// The only region, if there is exactly one (for `Shared`: if this was
    /// its last reference, as [`WrBuffers::into_vec`]).
    #[inline(always)]
    pub fn into_one(self) -> Option<MemoryRegion> {
        match self {
            WrBuffers::One(m) => Some(m),
            WrBuffers::Many(mut v) if v.len() == 1 => v.pop(),
            WrBuffers::Shared(a) => Arc::into_inner(a),
            WrBuffers::None => None,
            // Dropped out of line, and the function always inlined: with the
            // device slice's drop in it, LLVM does not inline it into
            // polling loops, a call per completion (callgrind).
            other => {
                drop_out_of_line(other);
                None
            }
        }
    }

    /// The shared region of a `Shared` request.
    pub fn into_shared(self) -> Option<Arc<MemoryRegion>> {
        match self {
            WrBuffers::Shared(a) => Some(a),
            _ => None,
        }
    }

    /// The device memory slice of a `Device` request.
    pub fn into_device(self) -> Option<DeviceSlice> {
        match self {
            WrBuffers::Device(d) => Some(d),
            _ => None,
        }
    }

    /// The number of regions.
    pub fn len(&self) -> usize {
        match self {
            WrBuffers::None => 0,
            WrBuffers::One(_) | WrBuffers::Shared(_) | WrBuffers::Device(_) => 1,
            WrBuffers::Many(v) => v.len(),
        }
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True for a `Shared` region (which the device may only read).
    pub fn is_shared(&self) -> bool {
        matches!(self, WrBuffers::Shared(_))
    }

    /// The region of a one-entry request of host memory (`One` or
    /// `Shared`).
    #[inline]
    pub(crate) fn single(&self) -> Option<&MemoryRegion> {
        match self {
            WrBuffers::One(m) => Some(m),
            WrBuffers::Shared(a) => Some(a),
            WrBuffers::None | WrBuffers::Many(_) | WrBuffers::Device(_) => None,
        }
    }

    /// Each region of host memory (a `Device` slice has none: the checks
    /// look at it on its own).
    pub(crate) fn for_each(&self, mut f: impl FnMut(&MemoryRegion)) {
        match self {
            WrBuffers::None | WrBuffers::Device(_) => {}
            WrBuffers::One(m) => f(m),
            WrBuffers::Many(v) => v.iter().for_each(f),
            WrBuffers::Shared(a) => f(a),
        }
    }

    /// Each scatter/gather entry, in order: what a post hands the
    /// provider, for requests the checks accepted.
    pub(crate) fn for_each_sge(&self, mut f: impl FnMut(ffi::ibv_sge)) {
        // One match, the shape of `for_each`'s (whose callers this
        // replaced on the receive path): no second dispatch per request.
        match self {
            WrBuffers::None => {}
            WrBuffers::One(m) => f(m.sge()),
            WrBuffers::Many(v) => v.iter().for_each(|m| f(m.sge())),
            WrBuffers::Shared(a) => f(a.sge()),
            WrBuffers::Device(d) => f(d.sge()),
        }
    }
}

impl From<MemoryRegion> for WrBuffers {
    fn from(m: MemoryRegion) -> Self {
        WrBuffers::One(m)
    }
}

impl From<Arc<MemoryRegion>> for WrBuffers {
    fn from(a: Arc<MemoryRegion>) -> Self {
        WrBuffers::Shared(a)
    }
}

impl From<DeviceSlice> for WrBuffers {
    fn from(d: DeviceSlice) -> Self {
        WrBuffers::Device(d)
    }
}

impl From<Vec<MemoryRegion>> for WrBuffers {
    fn from(v: Vec<MemoryRegion>) -> Self {
        if v.is_empty() {
            WrBuffers::None
        } else {
            WrBuffers::Many(v)
        }
    }
}

bitflags::bitflags! {
    /// `enum ibv_send_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Wait for earlier RDMA READ/atomics to finish first.
        const FENCE = ffi::IBV_SEND_FENCE;
        /// Generate a completion.
        const SIGNALED = ffi::IBV_SEND_SIGNALED;
        /// Solicited event at the receiver.
        const SOLICITED = ffi::IBV_SEND_SOLICITED;
        /// Data is inline (set by the inline post methods).
        const INLINE = ffi::IBV_SEND_INLINE;
        /// IP checksum offload.
        const IP_CSUM = ffi::IBV_SEND_IP_CSUM;
        const _ = !0;
    }
}

/// The operation of a send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendOp {
    /// SEND.
    Send,
    /// SEND with immediate data.
    SendWithImm(u32),
    /// RDMA WRITE to remote memory.
    Write(RemoteMemory),
    /// RDMA WRITE with immediate data (consumes a receive at the peer).
    WriteWithImm(RemoteMemory, u32),
    /// RDMA READ from remote memory into the local buffers.
    Read(RemoteMemory),
    /// 64-bit compare and swap; the old value lands in the 8-byte local buffer.
    CompareSwap {
        /// Remote 8-byte, 8-aligned word.
        remote: RemoteMemory,
        /// Expected value.
        compare: u64,
        /// New value.
        swap: u64,
    },
    /// SEND that also invalidates an rkey at the peer (a type 2 window or an
    /// MR with remote invalidation).
    SendWithInvalidate(u32),
    /// Invalidates a local rkey (a type 2 memory window bound by this QP).
    ///
    /// Never post it for a window the peer has already invalidated (a
    /// receive completed with [`WcFlags::WITH_INV`](crate::WcFlags::WITH_INV)
    /// naming it): on Linux 6.1's rxe that crashed the kernel (a NULL
    /// dereference in `rxe_invalidate_mw`, measured in the VM). rxe also
    /// reports a remote invalidation with the kernel's flag bit 2, which
    /// libibverbs names `IP_CSUM_OK`, the rkey in `imm_data`
    /// (`nfs/README.md`).
    LocalInvalidate(u32),
    /// 64-bit fetch and add; the old value lands in the 8-byte local buffer.
    FetchAdd {
        /// Remote 8-byte, 8-aligned word.
        remote: RemoteMemory,
        /// Value to add.
        add: u64,
    },
}

impl SendOp {
    pub(crate) fn opcode(&self) -> ffi::ibv_wr_opcode {
        match self {
            SendOp::Send => ffi::IBV_WR_SEND,
            SendOp::SendWithImm(_) => ffi::IBV_WR_SEND_WITH_IMM,
            SendOp::Write(_) => ffi::IBV_WR_RDMA_WRITE,
            SendOp::WriteWithImm(..) => ffi::IBV_WR_RDMA_WRITE_WITH_IMM,
            SendOp::Read(_) => ffi::IBV_WR_RDMA_READ,
            SendOp::CompareSwap { .. } => ffi::IBV_WR_ATOMIC_CMP_AND_SWP,
            SendOp::FetchAdd { .. } => ffi::IBV_WR_ATOMIC_FETCH_AND_ADD,
            SendOp::SendWithInvalidate(_) => ffi::IBV_WR_SEND_WITH_INV,
            SendOp::LocalInvalidate(_) => ffi::IBV_WR_LOCAL_INV,
        }
    }

    /// The device writes into the local buffers.
    pub(crate) fn writes_local(&self) -> bool {
        matches!(
            self,
            SendOp::Read(_) | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        )
    }

    pub(crate) fn remote(&self) -> Option<RemoteMemory> {
        match *self {
            SendOp::Write(r)
            | SendOp::WriteWithImm(r, _)
            | SendOp::Read(r)
            | SendOp::CompareSwap { remote: r, .. }
            | SendOp::FetchAdd { remote: r, .. } => Some(r),
            SendOp::Send
            | SendOp::SendWithImm(_)
            | SendOp::SendWithInvalidate(_)
            | SendOp::LocalInvalidate(_) => None,
        }
    }

    pub(crate) fn imm(&self) -> Option<u32> {
        match *self {
            SendOp::SendWithImm(i) | SendOp::WriteWithImm(_, i) => Some(i),
            _ => None,
        }
    }

    pub(crate) fn invalidate(&self) -> Option<u32> {
        match *self {
            SendOp::SendWithInvalidate(k) | SendOp::LocalInvalidate(k) => Some(k),
            _ => None,
        }
    }

    pub(crate) fn is_atomic(&self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }
}

/// Where a UD send goes.
#[derive(Debug, Clone)]
pub struct UdDest {
    /// The address handle (kept alive until the send completes).
    pub ah: AddressHandle,
    /// The remote QP number.
    pub remote_qpn: u32,
    /// The remote Q_Key.
    pub remote_qkey: u32,
}

/// A send work request whose memory moves into the queue with it.
///
/// ```no_run
/// # fn f(qp: &mut rdma::QueuePair, pd: &rdma::ProtectionDomain, peer: rdma::RemoteMemory)
/// #     -> rdma::Result<()> {
/// use rdma::{AccessFlags, PostError, SendWr};
/// let data = pd.reg_mr(vec![1u8; 1024], AccessFlags::empty())?;
/// // An RDMA WRITE with immediate data, signaled: its memory comes back with
/// // its completion.
/// let wr = SendWr::write(7, data, peer).with_imm(42);
/// qp.post_send(wr).map_err(PostError::drop_buffers)?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct SendWr {
    pub(crate) wr_id: u64,
    pub(crate) op: SendOp,
    pub(crate) buffers: WrBuffers,
    pub(crate) flags: SendFlags,
    pub(crate) ud: Option<UdDest>,
    /// The remote XRC SRQ number, for an XRC_SEND QP.
    pub(crate) xrc_srqn: Option<u32>,
}

impl SendWr {
    /// A request of `op` over `buffers` (scatter/gather order), signaled.
    pub fn new(wr_id: u64, op: SendOp, buffers: impl Into<WrBuffers>) -> Self {
        SendWr {
            wr_id,
            op,
            buffers: buffers.into(),
            flags: SendFlags::SIGNALED,
            ud: None,
            xrc_srqn: None,
        }
    }

    /// SEND of `buffers`.
    pub fn send(wr_id: u64, buffers: impl Into<WrBuffers>) -> Self {
        Self::new(wr_id, SendOp::Send, buffers)
    }

    /// RDMA WRITE of `buffers` to `remote`.
    pub fn write(wr_id: u64, buffers: impl Into<WrBuffers>, remote: RemoteMemory) -> Self {
        Self::new(wr_id, SendOp::Write(remote), buffers)
    }

    /// RDMA READ of `remote` into `buffers`.
    pub fn read(wr_id: u64, buffers: impl Into<WrBuffers>, remote: RemoteMemory) -> Self {
        Self::new(wr_id, SendOp::Read(remote), buffers)
    }

    /// Compare-and-swap on `remote`; the old value lands in `result` (8 bytes).
    pub fn compare_swap(
        wr_id: u64,
        result: MemoryRegion,
        remote: RemoteMemory,
        compare: u64,
        swap: u64,
    ) -> Self {
        Self::new(
            wr_id,
            SendOp::CompareSwap {
                remote,
                compare,
                swap,
            },
            result,
        )
    }

    /// Fetch-and-add on `remote`; the old value lands in `result` (8 bytes).
    pub fn fetch_add(wr_id: u64, result: MemoryRegion, remote: RemoteMemory, add: u64) -> Self {
        Self::new(wr_id, SendOp::FetchAdd { remote, add }, result)
    }

    /// Invalidates local `rkey` (`IBV_WR_LOCAL_INV`), e.g. a type 2 window.
    pub fn local_invalidate(wr_id: u64, rkey: u32) -> Self {
        Self::new(wr_id, SendOp::LocalInvalidate(rkey), WrBuffers::None)
    }

    /// SEND of `buffers` that invalidates `rkey` at the peer.
    pub fn send_with_invalidate(wr_id: u64, buffers: impl Into<WrBuffers>, rkey: u32) -> Self {
        Self::new(wr_id, SendOp::SendWithInvalidate(rkey), buffers)
    }

    /// Adds immediate data: SEND becomes SEND_WITH_IMM, WRITE becomes
    /// WRITE_WITH_IMM; other operations are left unchanged.
    pub fn with_imm(mut self, imm: u32) -> Self {
        self.op = match self.op {
            SendOp::Send | SendOp::SendWithImm(_) => SendOp::SendWithImm(imm),
            SendOp::Write(r) | SendOp::WriteWithImm(r, _) => SendOp::WriteWithImm(r, imm),
            other => other,
        };
        self
    }

    /// Whether the request generates a completion (default: yes). The memory
    /// of an unsignaled request comes back with the next signaled completion
    /// of the same send queue ([`crate::Completion::unsignaled`]).
    pub fn signaled(mut self, yes: bool) -> Self {
        self.flags.set(SendFlags::SIGNALED, yes);
        self
    }

    /// Sets the fence flag.
    pub fn fence(mut self) -> Self {
        self.flags |= SendFlags::FENCE;
        self
    }

    /// Sets the solicited-event flag.
    pub fn solicited(mut self) -> Self {
        self.flags |= SendFlags::SOLICITED;
        self
    }

    /// The destination of a UD send.
    pub fn ud(mut self, ah: &AddressHandle, remote_qpn: u32, remote_qkey: u32) -> Self {
        self.ud = Some(UdDest {
            ah: ah.clone(),
            remote_qpn,
            remote_qkey,
        });
        self
    }

    /// The remote XRC SRQ that receives the request, for a QP of type
    /// [`crate::QpType::XrcSend`], which needs one on every request
    /// (`qp_type.xrc.remote_srqn` of `struct ibv_send_wr`,
    /// `ibv_wr_set_xrc_srqn` on the extended path). The number is the
    /// peer's [`crate::SharedReceiveQueue::get_srq_num`]. Posting it on any
    /// other QP type is an [`crate::Error::InvalidArgument`].
    ///
    /// No device this crate is tested on implements XRC (soft-RoCE and
    /// soft-iWARP refuse XRC QPs with `EOPNOTSUPP`): the checks are tested,
    /// the post itself is not.
    pub fn xrc_remote_srqn(mut self, srqn: u32) -> Self {
        self.xrc_srqn = Some(srqn);
        self
    }

    /// The caller's id.
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }

    /// Takes the request apart (to reuse its memory).
    pub fn into_buffers(self) -> WrBuffers {
        self.buffers
    }
}

/// A send whose data is copied at post time (`IBV_SEND_INLINE`): no memory
/// region needed, at most `max_inline_data` bytes.
///
/// ```no_run
/// # fn f(qp: &mut rdma::QueuePair) -> rdma::Result<()> {
/// // A small message copied at post time: nothing to keep until it completes.
/// qp.post_send_inline(rdma::InlineSend::send(1, b"ping"))?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct InlineSend<'a> {
    pub(crate) wr_id: u64,
    pub(crate) op: SendOp,
    pub(crate) data: &'a [u8],
    pub(crate) flags: SendFlags,
    pub(crate) ud: Option<UdDest>,
    pub(crate) xrc_srqn: Option<u32>,
}

impl<'a> InlineSend<'a> {
    /// A SEND of `data`, signaled.
    pub fn send(wr_id: u64, data: &'a [u8]) -> Self {
        InlineSend {
            wr_id,
            op: SendOp::Send,
            data,
            flags: SendFlags::SIGNALED | SendFlags::INLINE,
            ud: None,
            xrc_srqn: None,
        }
    }

    /// An RDMA WRITE of `data` to `remote`, signaled.
    pub fn write(wr_id: u64, data: &'a [u8], remote: RemoteMemory) -> Self {
        InlineSend {
            op: SendOp::Write(remote),
            ..Self::send(wr_id, data)
        }
    }

    /// Adds immediate data (SEND_WITH_IMM / WRITE_WITH_IMM).
    pub fn with_imm(mut self, imm: u32) -> Self {
        self.op = match self.op {
            SendOp::Write(r) | SendOp::WriteWithImm(r, _) => SendOp::WriteWithImm(r, imm),
            _ => SendOp::SendWithImm(imm),
        };
        self
    }

    /// Whether the request generates a completion (default: yes).
    pub fn signaled(mut self, yes: bool) -> Self {
        self.flags.set(SendFlags::SIGNALED, yes);
        self
    }

    /// The destination of a UD send.
    pub fn ud(mut self, ah: &AddressHandle, remote_qpn: u32, remote_qkey: u32) -> Self {
        self.ud = Some(UdDest {
            ah: ah.clone(),
            remote_qpn,
            remote_qkey,
        });
        self
    }

    /// The remote XRC SRQ that receives the request, as
    /// [`SendWr::xrc_remote_srqn`].
    pub fn xrc_remote_srqn(mut self, srqn: u32) -> Self {
        self.xrc_srqn = Some(srqn);
        self
    }
}

/// A failed post: the error, and the memory of every request that was not
/// posted, as `(wr_id, memory)`, so nothing is lost.
///
/// Not a `std::error::Error`, and not convertible into [`crate::Error`]: `?`
/// would drop the memory unseen. Take it back from
/// [`PostError::returned`], or drop it on purpose with
/// [`PostError::drop_buffers`].
///
/// ```no_run
/// # fn f(qp: &mut rdma::QueuePair, wr: rdma::SendWr) {
/// match qp.post_send(wr) {
///     Ok(()) => {}
///     Err(e) => {
///         // The requests not posted come back with their memory.
///         for (wr_id, memory) in e.returned {
///             eprintln!("request {wr_id} not posted ({} regions back)", memory.len());
///         }
///         eprintln!("{}", e.error);
///     }
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct PostError {
    /// What went wrong.
    pub error: crate::Error,
    /// The requests that were not posted, with their memory.
    pub returned: Vec<(u64, WrBuffers)>,
}

impl PostError {
    /// The error alone, dropping the memory of the requests not posted: a
    /// visible choice, where `?` would hide it.
    ///
    /// ```no_run
    /// # fn f(qp: &mut rdma::QueuePair, mr: rdma::MemoryRegion) -> rdma::Result<()> {
    /// qp.post_send(rdma::SendWr::send(1, mr))
    ///     .map_err(rdma::PostError::drop_buffers)?;
    /// # Ok(()) }
    /// ```
    ///
    /// `?` alone does not compile, into [`crate::Error`] or any boxed
    /// error, so the memory is never lost without a word:
    ///
    /// ```compile_fail
    /// # fn f(qp: &mut rdma::QueuePair, mr: rdma::MemoryRegion) -> rdma::Result<()> {
    /// qp.post_send(rdma::SendWr::send(1, mr))?;
    /// # Ok(()) }
    /// ```
    ///
    /// ```compile_fail
    /// # fn f(qp: &mut rdma::QueuePair, mr: rdma::MemoryRegion)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// qp.post_send(rdma::SendWr::send(1, mr))?;
    /// # Ok(()) }
    /// ```
    pub fn drop_buffers(self) -> crate::Error {
        self.error
    }
}

impl std::fmt::Display for PostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({} requests not posted, their memory in PostError::returned)",
            self.error,
            self.returned.len()
        )
    }
}

/// Drops `b` in a function of its own, for the rare kinds of memory whose
/// drop would otherwise be inlined into a hot caller.
#[cold]
#[inline(never)]
fn drop_out_of_line(b: WrBuffers) {
    drop(b);
}

/// Why a device memory slice cannot be a scatter/gather entry of a request
/// on a queue of `pd` (`local_write`: the device writes it), if it cannot:
/// the QP's and the SRQ's full checks.
pub(crate) fn check_device_slice(
    d: &crate::DeviceSlice,
    pd: &crate::ProtectionDomain,
    local_write: bool,
) -> std::result::Result<(), String> {
    let region = d.region();
    if region.pd().as_raw() != pd.as_raw() {
        return Err(format!(
            "a device memory region ({region:?}) belongs to another protection domain"
        ));
    }
    d.check()?;
    if local_write && !region.access().contains(crate::AccessFlags::LOCAL_WRITE) {
        return Err(format!(
            "the device must write into a device memory region registered without \
             LOCAL_WRITE ({region:?})"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{WrBuffers, WrOpcode};

    #[test]
    fn a_device_slice_makes_a_request_no_larger() {
        // Every completion carries a `WrBuffers` (CONVENTIONS, "Data path":
        // bytes moved count): `Device` is as large as `One`, a pointer and
        // two words, so the tag still fits in the fourth word.
        assert_eq!(
            std::mem::size_of::<crate::DeviceSlice>(),
            std::mem::size_of::<crate::MemoryRegion>()
        );
        assert!(std::mem::size_of::<WrBuffers>() <= 4 * std::mem::size_of::<usize>());
    }

    #[test]
    fn wr_opcodes_keep_unknown_values() {
        assert_eq!(WrOpcode::from_raw(0), WrOpcode::RdmaWrite);
        assert_eq!(WrOpcode::from_raw(15), WrOpcode::AtomicWrite);
        assert_eq!(WrOpcode::from_raw(14), WrOpcode::Unknown(14));
        assert_eq!(WrOpcode::Unknown(14).to_raw(), 14);
    }
}
