//! Queue pairs (`ibv_create_qp(3)`, `ibv_modify_qp(3)`, `ibv_query_qp(3)`,
//! `ibv_post_send(3)`, `ibv_post_recv(3)`).

use std::borrow::Cow;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::ah::AhAttr;
use crate::error::{check_errno_ret, check_ptr, Error, Result};
use crate::macros::c_enum;
use crate::mr::{AccessFlags, RemoteMemory};
use crate::track::{self, Pending, QpTracker, Serial};
use crate::wc::WrBuffers;
use crate::wr::{InlineSend, PostError, PreparedSend, SendFlags, SendOp, SendWr, UdDest};
use crate::{ffi, CompletionQueue, MemoryRegion, Mtu, ProtectionDomain};

c_enum! {
    /// `enum ibv_qp_type`.
    pub enum QpType: u32 {
        /// Reliable connected.
        Rc = ffi::IBV_QPT_RC,
        /// Unreliable connected.
        Uc = ffi::IBV_QPT_UC,
        /// Unreliable datagram.
        Ud = ffi::IBV_QPT_UD,
        /// Raw packet.
        RawPacket = ffi::IBV_QPT_RAW_PACKET,
        /// XRC initiator.
        XrcSend = ffi::IBV_QPT_XRC_SEND,
        /// XRC target.
        XrcRecv = ffi::IBV_QPT_XRC_RECV,
        /// Driver-specific.
        Driver = ffi::IBV_QPT_DRIVER,
    }
}

c_enum! {
    /// `enum ibv_qp_state`.
    pub enum QpState: u32 {
        /// Reset.
        Reset = ffi::IBV_QPS_RESET,
        /// Initialised.
        Init = ffi::IBV_QPS_INIT,
        /// Ready to receive.
        Rtr = ffi::IBV_QPS_RTR,
        /// Ready to send.
        Rts = ffi::IBV_QPS_RTS,
        /// Send queue drained.
        Sqd = ffi::IBV_QPS_SQD,
        /// Send queue error.
        Sqe = ffi::IBV_QPS_SQE,
        /// Error.
        Err = ffi::IBV_QPS_ERR,
    }
}

/// Queue sizes (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send request.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive request.
    pub max_recv_sge: u32,
    /// Largest inline send, bytes.
    pub max_inline_data: u32,
}

impl QpCaps {
    fn to_raw(self) -> ffi::ibv_qp_cap {
        ffi::ibv_qp_cap {
            max_send_wr: self.max_send_wr,
            max_recv_wr: self.max_recv_wr,
            max_send_sge: self.max_send_sge,
            max_recv_sge: self.max_recv_sge,
            max_inline_data: self.max_inline_data,
        }
    }

    fn from_raw(c: &ffi::ibv_qp_cap) -> Self {
        QpCaps {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_inline_data: c.max_inline_data,
        }
    }
}

/// Which send path a QP uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PostPath {
    /// The extended `ibv_wr_*` API when the provider has it, else legacy.
    ///
    /// Requests with more than one scatter/gather entry, and inline sends, use
    /// `ibv_post_send` even then: rdma-core's rxe provider before release 51
    /// computes their length wrong in `ibv_wr_set_sge_list` and
    /// `ibv_wr_set_inline_data` (rdma-core pull request 1744 and its
    /// predecessor). Both calls post to the same send queue, one after the
    /// other (`&mut self`).
    #[default]
    Auto,
    /// `ibv_post_send` with `struct ibv_send_wr` chains.
    Legacy,
    /// `ibv_wr_start` / `ibv_wr_*` / `ibv_wr_complete` (`ibv_create_qp_ex`).
    Extended,
}

bitflags::bitflags! {
    /// `enum ibv_qp_create_flags`, for [`QueuePairBuilder::create_flags`].
    /// Unknown bits are kept and passed on.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct QpCreateFlags: u32 {
        /// A UD QP does not receive the multicast it sends itself.
        const BLOCK_SELF_MCAST_LB = ffi::IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;
        /// Scatter the Ethernet frame check sequence (raw packet QPs).
        const SCATTER_FCS = ffi::IBV_QP_CREATE_SCATTER_FCS;
        /// Strip the customer VLAN tag (raw packet QPs).
        const CVLAN_STRIPPING = ffi::IBV_QP_CREATE_CVLAN_STRIPPING;
        /// Send with another QP's number (`source_qpn`; UD).
        const SOURCE_QPN = ffi::IBV_QP_CREATE_SOURCE_QPN;
        /// Pad PCI writes to a cache line.
        const PCI_WRITE_END_PADDING = ffi::IBV_QP_CREATE_PCI_WRITE_END_PADDING;
        const _ = !0;
    }
}

/// Builds a queue pair; see [`ProtectionDomain::qp_builder`].
#[derive(Debug, Clone)]
pub struct QueuePairBuilder {
    pd: ProtectionDomain,
    qp_type: QpType,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    caps: QpCaps,
    sq_sig_all: bool,
    srq: Option<crate::SharedReceiveQueue>,
    post_path: PostPath,
    create_flags: QpCreateFlags,
}

impl ProtectionDomain {
    /// Starts building a QP of `qp_type` that reports to the given CQs (they
    /// may be the same). Defaults: 64 send and receive requests, 1 SGE each,
    /// no inline data, completions only for signaled sends.
    pub fn qp_builder(
        &self,
        qp_type: QpType,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
    ) -> QueuePairBuilder {
        QueuePairBuilder {
            pd: self.clone(),
            qp_type,
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            caps: QpCaps {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
            srq: None,
            post_path: PostPath::Auto,
            create_flags: QpCreateFlags::empty(),
        }
    }
}

impl QueuePairBuilder {
    /// Send queue depth.
    pub fn max_send_wr(&mut self, n: u32) -> &mut Self {
        self.caps.max_send_wr = n;
        self
    }

    /// Receive queue depth.
    pub fn max_recv_wr(&mut self, n: u32) -> &mut Self {
        self.caps.max_recv_wr = n;
        self
    }

    /// Scatter/gather entries per send request.
    pub fn max_send_sge(&mut self, n: u32) -> &mut Self {
        self.caps.max_send_sge = n;
        self
    }

    /// Scatter/gather entries per receive request.
    pub fn max_recv_sge(&mut self, n: u32) -> &mut Self {
        self.caps.max_recv_sge = n;
        self
    }

    /// Largest inline send.
    pub fn max_inline_data(&mut self, n: u32) -> &mut Self {
        self.caps.max_inline_data = n;
        self
    }

    /// Every send generates a completion, whatever its flags.
    pub fn sq_sig_all(&mut self, yes: bool) -> &mut Self {
        self.sq_sig_all = yes;
        self
    }

    /// Chooses the send path (default [`PostPath::Auto`]).
    pub fn post_path(&mut self, path: PostPath) -> &mut Self {
        self.post_path = path;
        self
    }

    /// `create_flags` (default none). A QP with flags is created with
    /// `ibv_create_qp_ex` (`rdma_create_qp_ex` through the connection
    /// manager) even on the legacy post path; a provider without them
    /// refuses with [`Error::Unsupported`] (rxe and siw refuse every flag).
    pub fn create_flags(&mut self, flags: QpCreateFlags) -> &mut Self {
        self.create_flags = flags;
        self
    }

    /// Takes receive requests from `srq` instead of a receive queue of its own.
    pub fn srq(&mut self, srq: &crate::SharedReceiveQueue) -> &mut Self {
        self.srq = Some(srq.clone());
        self
    }

    fn create_error(&self, verb: &'static str, e: Error) -> Error {
        let ctx = self.pd.context();
        match e.errno() {
            Some(libc::EOPNOTSUPP) | Some(libc::EPROTONOSUPPORT) | Some(libc::ENOSYS) => {
                let flags = if self.create_flags.is_empty() {
                    String::new()
                } else {
                    format!(" with create flags {:?}", self.create_flags)
                };
                Error::Unsupported {
                    what: format!("{:?} queue pairs{flags} through {verb}", self.qp_type).into(),
                    device: ctx.name().to_string(),
                    source: e.errno().map(std::io::Error::from_raw_os_error),
                }
            }
            _ => e,
        }
    }

    fn create_legacy(&self, attr: &mut ffi::ibv_qp_init_attr) -> Result<NonNull<ffi::ibv_qp>> {
        if !self.create_flags.is_empty() {
            // Create flags need the extended call, without send operations.
            let mut ex = self.init_attr_ex(attr, true);
            // SAFETY: valid context, PD and CQs (kept alive by the QP).
            let qp = unsafe { ffi::ibv_create_qp_ex(self.pd.context().as_raw(), &mut ex) };
            attr.cap = ex.cap;
            return check_ptr(
                "ibv_create_qp_ex",
                || format!("{:?} QP with {:?}", self.qp_type, self.create_flags).into(),
                qp,
            )
            .map_err(|e| self.create_error("ibv_create_qp_ex", e));
        }
        // SAFETY: valid PD and CQs of the same context (kept alive by the QP).
        let qp = unsafe { ffi::ibv_create_qp(self.pd.as_raw(), attr) };
        check_ptr(
            "ibv_create_qp",
            || {
                format!(
                    "{:?} QP on {} with {:?}",
                    self.qp_type,
                    self.pd.context().name(),
                    self.caps
                )
                .into()
            },
            qp,
        )
        .map_err(|e| self.create_error("ibv_create_qp", e))
    }

    /// `ibv_create_qp_ex` with the send operations of the QP type enabled.
    fn create_extended(
        &self,
        attr: &ffi::ibv_qp_init_attr,
    ) -> Result<(
        NonNull<ffi::ibv_qp>,
        NonNull<ffi::ibv_qp_ex>,
        ffi::ibv_qp_cap,
    )> {
        let mut ex = self.init_attr_ex(attr, false);
        // SAFETY: valid context, PD and CQs (kept alive by the QP).
        let qp = unsafe { ffi::ibv_create_qp_ex(self.pd.context().as_raw(), &mut ex) };
        let qp = check_ptr(
            "ibv_create_qp_ex",
            || {
                format!(
                    "{:?} QP on {} with {:?}",
                    self.qp_type,
                    self.pd.context().name(),
                    self.caps
                )
                .into()
            },
            qp,
        )
        .map_err(|e| self.create_error("ibv_create_qp_ex", e))?;
        // SAFETY: the QP was created with send_ops_flags, so it has an
        // extended view.
        let qpx = unsafe { ffi::ibv_qp_to_qp_ex(qp.as_ptr()) };
        match NonNull::new(qpx) {
            Some(qpx) => Ok((qp, qpx, ex.cap)),
            None => {
                // SAFETY: created above, destroyed once on this error path.
                unsafe { ffi::ibv_destroy_qp(qp.as_ptr()) };
                Err(Error::Unsupported {
                    what: "the ibv_wr_* post API".into(),
                    device: self.pd.context().name().to_string(),
                    source: None,
                })
            }
        }
    }

    /// The `ibv_wr_*` operations the QP type can post.
    fn send_ops(&self) -> u32 {
        match self.qp_type {
            // An XRC initiator posts what an RC QP posts (each request names
            // the remote XRC SRQ besides).
            QpType::Rc | QpType::XrcSend => {
                ffi::IBV_QP_EX_WITH_SEND
                    | ffi::IBV_QP_EX_WITH_SEND_WITH_IMM
                    | ffi::IBV_QP_EX_WITH_RDMA_WRITE
                    | ffi::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
                    | ffi::IBV_QP_EX_WITH_RDMA_READ
                    | ffi::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
                    | ffi::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
                    | ffi::IBV_QP_EX_WITH_LOCAL_INV
                    | ffi::IBV_QP_EX_WITH_BIND_MW
                    | ffi::IBV_QP_EX_WITH_SEND_WITH_INV
            }
            QpType::Uc => {
                ffi::IBV_QP_EX_WITH_SEND
                    | ffi::IBV_QP_EX_WITH_SEND_WITH_IMM
                    | ffi::IBV_QP_EX_WITH_RDMA_WRITE
                    | ffi::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
            }
            _ => ffi::IBV_QP_EX_WITH_SEND | ffi::IBV_QP_EX_WITH_SEND_WITH_IMM,
        }
    }

    /// Creates the QP (`ibv_create_qp(3)`), in the RESET state.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for queue sizes past the device limits
    /// (`max_qp_wr`, `max_sge`); [`Error::Unsupported`] for a QP type the
    /// provider lacks; [`Error::Verb`] naming `ibv_create_qp` otherwise.
    pub fn build(&self) -> Result<QueuePair> {
        let mut attr = self.checked_init_attr()?;
        let serial = allocate_serial("ibv_create_qp")?;
        let (qp, qpx, cap) = match self.post_path {
            PostPath::Legacy => (self.create_legacy(&mut attr)?, None, attr.cap),
            path => match self.create_extended(&attr) {
                Ok((qp, qpx, cap)) => (qp, Some(qpx), cap),
                Err(e) if path == PostPath::Auto && e.errno() == Some(libc::EOPNOTSUPP) => {
                    (self.create_legacy(&mut attr)?, None, attr.cap)
                }
                Err(e) => return Err(e),
            },
        };
        Ok(self.finish(qp, qpx, cap, None, serial))
    }

    /// The raw PD the QP will be created in.
    pub(crate) fn pd_raw(&self) -> *mut ffi::ibv_pd {
        self.pd.as_raw()
    }

    /// The init attributes, after checking the queue sizes against the device.
    pub(crate) fn checked_init_attr(&self) -> Result<ffi::ibv_qp_init_attr> {
        let ctx = self.pd.context();
        let dev = crate::DeviceAttr::from_limits(ctx.limits());
        let c = self.caps;
        for (what, v, max, limit) in [
            ("max_send_wr", c.max_send_wr, dev.max_qp_wr(), "max_qp_wr"),
            ("max_recv_wr", c.max_recv_wr, dev.max_qp_wr(), "max_qp_wr"),
            ("max_send_sge", c.max_send_sge, dev.max_sge(), "max_sge"),
            ("max_recv_sge", c.max_recv_sge, dev.max_sge(), "max_sge"),
        ] {
            if v > max {
                return Err(Error::InvalidArgument {
                    verb: "ibv_create_qp",
                    reason: format!(
                        "{what} {v} exceeds the device's {limit} {max} on {}",
                        ctx.name()
                    ),
                });
            }
        }
        Ok(ffi::ibv_qp_init_attr {
            send_cq: self.send_cq.as_raw(),
            recv_cq: self.recv_cq.as_raw(),
            cap: c.to_raw(),
            qp_type: self.qp_type.to_raw(),
            sq_sig_all: i32::from(self.sq_sig_all),
            srq: self
                .srq
                .as_ref()
                .map_or(std::ptr::null_mut(), crate::SharedReceiveQueue::as_raw),
            ..Default::default()
        })
    }

    /// The extended init attributes: the PD, and the send operations of the
    /// QP type unless `legacy`.
    pub(crate) fn init_attr_ex(
        &self,
        attr: &ffi::ibv_qp_init_attr,
        legacy: bool,
    ) -> ffi::ibv_qp_init_attr_ex {
        let mut ex = ffi::ibv_qp_init_attr_ex {
            send_cq: attr.send_cq,
            recv_cq: attr.recv_cq,
            srq: attr.srq,
            cap: attr.cap,
            qp_type: attr.qp_type,
            sq_sig_all: attr.sq_sig_all,
            comp_mask: ffi::IBV_QP_INIT_ATTR_PD,
            pd: self.pd.as_raw(),
            ..Default::default()
        };
        if !legacy {
            ex.comp_mask |= ffi::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
            ex.send_ops_flags = u64::from(self.send_ops());
        }
        if !self.create_flags.is_empty() {
            ex.comp_mask |= ffi::IBV_QP_INIT_ATTR_CREATE_FLAGS;
            ex.create_flags = self.create_flags.bits();
        }
        ex
    }

    /// Creates the QP through `create` (the connection manager's
    /// `rdma_create_qp_ex`); `owner` destroys it.
    pub(crate) fn build_with(
        &self,
        create: &mut dyn FnMut(&mut ffi::ibv_qp_init_attr_ex) -> Result<NonNull<ffi::ibv_qp>>,
        owner: Arc<dyn QpOwner>,
    ) -> Result<QueuePair> {
        let attr = self.checked_init_attr()?;
        let serial = allocate_serial("rdma_create_qp_ex")?;
        let legacy = self.post_path == PostPath::Legacy;
        let mut ex = self.init_attr_ex(&attr, legacy);
        let qp = match create(&mut ex) {
            Err(e) if self.post_path == PostPath::Auto && e.errno() == Some(libc::EOPNOTSUPP) => {
                ex = self.init_attr_ex(&attr, true);
                create(&mut ex).map_err(|e| self.create_error("rdma_create_qp_ex", e))?
            }
            r => r.map_err(|e| self.create_error("rdma_create_qp_ex", e))?,
        };
        let qpx = if ex.comp_mask & ffi::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
            // SAFETY: the QP was created with send_ops_flags.
            NonNull::new(unsafe { ffi::ibv_qp_to_qp_ex(qp.as_ptr()) })
        } else {
            None
        };
        Ok(self.finish(qp, qpx, ex.cap, Some(owner), serial))
    }

    /// Wraps a created QP: registers its tracker with the CQs.
    pub(crate) fn finish(
        &self,
        qp: NonNull<ffi::ibv_qp>,
        qpx: Option<NonNull<ffi::ibv_qp_ex>>,
        cap: ffi::ibv_qp_cap,
        owner: Option<Arc<dyn QpOwner>>,
        serial: Serial,
    ) -> QueuePair {
        let tracker = QpTracker::new(
            serial,
            &self.send_cq.inner.registry,
            &self.recv_cq.inner.registry,
        );
        if let Some(srq) = &self.srq {
            srq.attach_cq(&self.recv_cq.inner);
        }
        QueuePair {
            qp,
            qpx,
            auto_path: self.post_path == PostPath::Auto,
            qp_type: self.qp_type,
            caps: QpCaps::from_raw(&cap),
            plain_sends: !matches!(self.qp_type, QpType::Ud | QpType::XrcSend)
                && cap.max_send_sge > 0,
            max_msg: std::sync::atomic::AtomicU32::new(0),
            tracker,
            send_cq: self.send_cq.clone(),
            recv_cq: self.recv_cq.clone(),
            srq: self.srq.clone(),
            pd: self.pd.clone(),
            owner,
        }
    }
}

/// The identity of a new QP's or SRQ's tracker, taken before the object is
/// created (so that running out is an error, not a created object to undo).
pub(crate) fn allocate_serial(verb: &'static str) -> Result<Serial> {
    Serial::allocate().ok_or_else(|| {
        Error::verb_errno(
            verb,
            "2^30 queue pairs and shared receive queues are alive (or their completions \
             still wait in CQs): no work request identity is left",
            libc::ENOSPC,
        )
    })
}

/// Destroys a QP that another library created and owns (the connection
/// manager's `rdma_create_qp`): `ibv_destroy_qp` and the owner's bookkeeping.
pub(crate) trait QpOwner: Send + Sync {
    /// Destroys `qp`; returns 0 or an errno value.
    fn destroy_qp(&self, qp: *mut ffi::ibv_qp) -> std::ffi::c_int;
}

/// QP attributes for [`QueuePair::modify`], with the attribute mask computed
/// from the setters called (`struct ibv_qp_attr` + `ibv_qp_attr_mask`).
#[derive(Clone, Copy, Default)]
pub struct QpAttr {
    raw: ffi::ibv_qp_attr,
    mask: u32,
}

macro_rules! qp_attr_setters {
    ($( $(#[$m:meta])* $name:ident: $ty:ty => $field:ident, $bit:expr; )*) => {
        $(
            $(#[$m])*
            pub fn $name(&mut self, v: $ty) -> &mut Self {
                self.raw.$field = v.into();
                self.mask |= $bit;
                self
            }
        )*
    };
}

impl QpAttr {
    /// No attributes (empty mask).
    pub fn new() -> Self {
        Self::default()
    }

    /// Every attribute of a QP (`ibv_query_qp(3)` up to DEST_QPN; RATE_LIMIT
    /// is modify-only: providers reject it in a query).
    ///
    /// # Safety
    /// `qp` is a live QP.
    pub(crate) unsafe fn query_all(
        qp: *mut ffi::ibv_qp,
        what: impl FnOnce() -> std::borrow::Cow<'static, str>,
    ) -> Result<QpAttr> {
        let mut attr = ffi::ibv_qp_attr::default();
        let mut init = ffi::ibv_qp_init_attr::default();
        let mask = 0x1f_ffff;
        // SAFETY: the caller guarantees a live QP; valid out-structs.
        let rc = unsafe { ffi::ibv_query_qp(qp, &mut attr, mask, &mut init) };
        check_errno_ret("ibv_query_qp", what, rc)?;
        Ok(QpAttr {
            raw: attr,
            mask: mask as u32,
        })
    }

    /// Attributes and mask as a verb returned them (`rdma_init_qp_attr`).
    pub(crate) fn from_raw(raw: ffi::ibv_qp_attr, mask: u32) -> Self {
        QpAttr { raw, mask }
    }

    /// The mask the setters have built.
    pub fn mask(&self) -> u32 {
        self.mask
    }

    /// The raw struct.
    pub fn as_raw(&self) -> &ffi::ibv_qp_attr {
        &self.raw
    }

    /// Target state.
    pub fn state(&mut self, s: QpState) -> &mut Self {
        self.raw.qp_state = s.to_raw();
        self.mask |= ffi::IBV_QP_STATE;
        self
    }

    /// Assumed current state.
    pub fn cur_state(&mut self, s: QpState) -> &mut Self {
        self.raw.cur_qp_state = s.to_raw();
        self.mask |= ffi::IBV_QP_CUR_STATE;
        self
    }

    /// Remote access rights granted to incoming RDMA/atomics.
    pub fn access_flags(&mut self, a: AccessFlags) -> &mut Self {
        self.raw.qp_access_flags = a.bits();
        self.mask |= ffi::IBV_QP_ACCESS_FLAGS;
        self
    }

    /// Path MTU.
    pub fn path_mtu(&mut self, m: Mtu) -> &mut Self {
        self.raw.path_mtu = m.to_raw();
        self.mask |= ffi::IBV_QP_PATH_MTU;
        self
    }

    /// The primary path's address vector.
    pub fn ah_attr(&mut self, ah: &AhAttr) -> &mut Self {
        self.raw.ah_attr = ah.to_raw();
        self.mask |= ffi::IBV_QP_AV;
        self
    }

    /// Queue sizes (resize, where supported).
    pub fn cap(&mut self, c: QpCaps) -> &mut Self {
        self.raw.cap = c.to_raw();
        self.mask |= ffi::IBV_QP_CAP;
        self
    }

    qp_attr_setters! {
        /// P_Key index.
        pkey_index: u16 => pkey_index, ffi::IBV_QP_PKEY_INDEX;
        /// Port.
        port: u8 => port_num, ffi::IBV_QP_PORT;
        /// Q_Key (UD).
        qkey: u32 => qkey, ffi::IBV_QP_QKEY;
        /// Local ACK timeout (4.096 µs × 2^timeout).
        timeout: u8 => timeout, ffi::IBV_QP_TIMEOUT;
        /// Transport retries.
        retry_cnt: u8 => retry_cnt, ffi::IBV_QP_RETRY_CNT;
        /// RNR retries (7: infinite).
        rnr_retry: u8 => rnr_retry, ffi::IBV_QP_RNR_RETRY;
        /// Receive PSN.
        rq_psn: u32 => rq_psn, ffi::IBV_QP_RQ_PSN;
        /// Outstanding RDMA READ/atomics as initiator.
        max_rd_atomic: u8 => max_rd_atomic, ffi::IBV_QP_MAX_QP_RD_ATOMIC;
        /// Minimum RNR NAK timer.
        min_rnr_timer: u8 => min_rnr_timer, ffi::IBV_QP_MIN_RNR_TIMER;
        /// Send PSN.
        sq_psn: u32 => sq_psn, ffi::IBV_QP_SQ_PSN;
        /// Outstanding RDMA READ/atomics as target.
        max_dest_rd_atomic: u8 => max_dest_rd_atomic, ffi::IBV_QP_MAX_DEST_RD_ATOMIC;
        /// Remote QP number.
        dest_qp_num: u32 => dest_qp_num, ffi::IBV_QP_DEST_QPN;
        /// Rate limit, kbps.
        rate_limit: u32 => rate_limit, ffi::IBV_QP_RATE_LIMIT;
    }

    /// Target (or queried) state.
    pub fn get_state(&self) -> QpState {
        QpState::from_raw(self.raw.qp_state)
    }

    /// Queried access flags.
    pub fn get_access_flags(&self) -> AccessFlags {
        AccessFlags::from_bits_retain(self.raw.qp_access_flags)
    }

    /// Queried path MTU.
    pub fn get_path_mtu(&self) -> Mtu {
        Mtu::from_raw(self.raw.path_mtu)
    }

    /// Queried address vector.
    pub fn get_ah_attr(&self) -> AhAttr {
        AhAttr::from_raw(&self.raw.ah_attr)
    }

    /// Queried queue sizes.
    pub fn get_cap(&self) -> QpCaps {
        QpCaps::from_raw(&self.raw.cap)
    }
}

impl fmt::Debug for QpAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.raw;
        f.debug_struct("QpAttr")
            .field("mask", &format_args!("{:#x}", self.mask))
            .field("qp_state", &QpState::from_raw(r.qp_state))
            .field("path_mtu", &Mtu::from_raw(r.path_mtu))
            .field("qkey", &r.qkey)
            .field("rq_psn", &r.rq_psn)
            .field("sq_psn", &r.sq_psn)
            .field("dest_qp_num", &r.dest_qp_num)
            .field(
                "qp_access_flags",
                &AccessFlags::from_bits_retain(r.qp_access_flags),
            )
            .field("port_num", &r.port_num)
            .field("pkey_index", &r.pkey_index)
            .field("max_rd_atomic", &r.max_rd_atomic)
            .field("max_dest_rd_atomic", &r.max_dest_rd_atomic)
            .field("min_rnr_timer", &r.min_rnr_timer)
            .field("timeout", &r.timeout)
            .field("retry_cnt", &r.retry_cnt)
            .field("rnr_retry", &r.rnr_retry)
            .finish_non_exhaustive()
    }
}

/// RESET → INIT parameters.
#[derive(Debug, Clone, Copy)]
pub struct InitAttr {
    /// Port.
    pub port: u8,
    /// P_Key index.
    pub pkey_index: u16,
    /// RC/UC: remote access granted to the peer.
    pub access: AccessFlags,
    /// UD: the Q_Key.
    pub qkey: u32,
}

impl InitAttr {
    /// Port `port`, P_Key index 0, no remote access, Q_Key 0x11111111.
    pub fn new(port: u8) -> Self {
        InitAttr {
            port,
            pkey_index: 0,
            access: AccessFlags::empty(),
            qkey: 0x1111_1111,
        }
    }
}

/// INIT → RTR parameters (RC/UC; UD needs none).
#[derive(Debug, Clone, Copy)]
pub struct RtrAttr {
    /// The peer's address.
    pub ah: AhAttr,
    /// Path MTU: take it from the port's `active_mtu`; a larger one can hang.
    pub path_mtu: Mtu,
    /// The peer's QP number.
    pub dest_qp_num: u32,
    /// The peer's initial send PSN.
    pub rq_psn: u32,
    /// RC: outstanding READ/atomics the peer may send us.
    pub max_dest_rd_atomic: u8,
    /// RC: RNR NAK timer.
    pub min_rnr_timer: u8,
}

impl RtrAttr {
    /// Defaults rdma-core's pingpong examples use: 1 READ/atomic, RNR timer 12.
    pub fn new(ah: AhAttr, path_mtu: Mtu, dest_qp_num: u32, rq_psn: u32) -> Self {
        RtrAttr {
            ah,
            path_mtu,
            dest_qp_num,
            rq_psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
        }
    }
}

/// RTR → RTS parameters.
#[derive(Debug, Clone, Copy)]
pub struct RtsAttr {
    /// Our initial send PSN.
    pub sq_psn: u32,
    /// RC: ACK timeout exponent.
    pub timeout: u8,
    /// RC: transport retries.
    pub retry_cnt: u8,
    /// RC: RNR retries (7: infinite).
    pub rnr_retry: u8,
    /// RC: outstanding READ/atomics we may send.
    pub max_rd_atomic: u8,
}

impl RtsAttr {
    /// Defaults of rdma-core's pingpong examples: timeout 14, 7 retries,
    /// 7 RNR retries, 1 READ/atomic.
    pub fn new(sq_psn: u32) -> Self {
        RtsAttr {
            sq_psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
        }
    }
}

/// A queue pair (`struct ibv_qp`). Unique owner: not `Clone`.
///
/// Dropping it moves the QP to the error state, destroys it, and only then
/// releases the memory of the work requests still in flight.
pub struct QueuePair {
    qp: NonNull<ffi::ibv_qp>,
    /// The extended view, when the QP was created for the `ibv_wr_*` path.
    qpx: Option<NonNull<ffi::ibv_qp_ex>>,
    /// Chosen by [`PostPath::Auto`]: scatter lists and inline data go through
    /// `ibv_post_send` (see [`PostPath::Auto`]).
    auto_path: bool,
    qp_type: QpType,
    caps: QpCaps,
    /// Sends of this QP may take the quick check: its type needs no UD
    /// destination or XRC SRQ, and it has a send scatter entry (set once).
    plain_sends: bool,
    /// The largest message the QP may send, learnt at `to_init` from the
    /// port (`max_msg_sz`; the active MTU for UD); 0 until then.
    max_msg: std::sync::atomic::AtomicU32,
    tracker: Arc<QpTracker>,
    // Parents: released after the QP is destroyed (Drop runs first).
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    srq: Option<crate::SharedReceiveQueue>,
    pd: ProtectionDomain,
    /// For a QP the connection manager created: destroys it, and keeps the
    /// `rdma_cm_id` alive until then.
    owner: Option<Arc<dyn QpOwner>>,
}

// SAFETY: a QP may be used from any thread; posting needs `&mut self`, the
// tracker is behind Mutexes.
unsafe impl Send for QueuePair {}
// SAFETY: `&self` methods (query, modify) are thread-safe verbs.
unsafe impl Sync for QueuePair {}

impl QueuePair {
    /// The raw QP, valid while this handle lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_qp {
        self.qp.as_ptr()
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: reads a field of a live QP.
        unsafe { (*self.as_raw()).qp_num }
    }

    /// The send path in use.
    pub fn post_path(&self) -> PostPath {
        if self.qpx.is_some() {
            PostPath::Extended
        } else {
            PostPath::Legacy
        }
    }

    /// The QP type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// The queue sizes the provider actually gave.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The send CQ.
    pub fn send_cq(&self) -> &CompletionQueue {
        &self.send_cq
    }

    /// The receive CQ.
    pub fn recv_cq(&self) -> &CompletionQueue {
        &self.recv_cq
    }

    /// The shared receive queue, if the QP uses one.
    pub fn srq(&self) -> Option<&crate::SharedReceiveQueue> {
        self.srq.as_ref()
    }

    /// Work requests posted through the safe API and not completed yet
    /// (send queue, receive queue).
    pub fn in_flight(&self) -> (usize, usize) {
        self.tracker.in_flight()
    }

    fn ctx_str(&self, what: impl fmt::Display) -> Cow<'static, str> {
        Cow::Owned(format!(
            "QP {} on {}: {what}",
            self.qp_num(),
            self.pd.context().name()
        ))
    }

    /// Modifies the QP (`ibv_modify_qp(3)`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_modify_qp`, with the attribute mask; `EINVAL`
    /// for a transition or attribute the state machine does not allow.
    ///
    /// Moving to RESET empties both work queues: the memory of every request
    /// still in flight is released (dropped) once the verb succeeded, as the
    /// device no longer uses it and its completions may never come (rxe
    /// makes none; mlx4, mlx5 and hns remove them from the CQ).
    /// [`QueuePair::reset`] gives that memory back instead.
    pub fn modify(&self, attr: &QpAttr) -> Result<()> {
        self.modify_raw(attr)?;
        if attr.mask & ffi::IBV_QP_STATE != 0 && attr.raw.qp_state == ffi::IBV_QPS_RESET {
            drop(self.reclaim());
        }
        Ok(())
    }

    /// Moves the QP to RESET (`ibv_modify_qp(3)`) and gives back the
    /// requests that were in flight on its send and receive queue, oldest
    /// first, sends before receives: RESET discards them, and their
    /// completions may never be polled. The QP can then be brought up again
    /// (INIT, RTR, RTS).
    ///
    /// # Errors
    /// As [`QueuePair::modify`]; the requests stay in flight then.
    pub fn reset(&self) -> Result<Vec<(u64, WrBuffers)>> {
        self.modify_raw(QpAttr::new().state(QpState::Reset))?;
        Ok(self
            .reclaim()
            .into_iter()
            .map(|p| (p.wr_id, p.buffers))
            .collect())
    }

    /// Takes every request in flight, as the consumer of each queue (under
    /// its CQ's registry lock). No one posts meanwhile: posting needs the
    /// QP mutably, and `&self` is held.
    fn reclaim(&self) -> Vec<Pending> {
        let mut all = self.send_cq.inner.registry.reclaim(&self.tracker, false);
        all.extend(self.recv_cq.inner.registry.reclaim(&self.tracker, true));
        all
    }

    fn modify_raw(&self, attr: &QpAttr) -> Result<()> {
        let mut raw = attr.raw;
        let mask = std::ffi::c_int::try_from(attr.mask).unwrap_or(std::ffi::c_int::MAX);
        // SAFETY: valid QP and attribute struct.
        let rc = unsafe { ffi::ibv_modify_qp(self.as_raw(), &mut raw, mask) };
        check_errno_ret(
            "ibv_modify_qp",
            || {
                self.ctx_str(format_args!(
                    "to {:?} with mask {:#x}",
                    QpState::from_raw(attr.raw.qp_state),
                    attr.mask
                ))
            },
            rc,
        )
    }

    /// Queries every attribute (`ibv_query_qp(3)`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_query_qp`.
    pub fn query(&self) -> Result<QpAttr> {
        // SAFETY: this QP is live while `self` is.
        unsafe { QpAttr::query_all(self.as_raw(), || self.ctx_str("query")) }
    }

    /// The current state (`ibv_query_qp(3)`).
    ///
    /// # Errors
    /// As [`QueuePair::query`].
    pub fn state(&self) -> Result<QpState> {
        Ok(self.query()?.get_state())
    }

    /// RESET → INIT. RC/UC grant `attr.access`; UD sets `attr.qkey`.
    ///
    /// # Errors
    /// As [`QueuePair::modify`].
    pub fn to_init(&self, attr: &InitAttr) -> Result<()> {
        let mut a = QpAttr::new();
        a.state(QpState::Init)
            .pkey_index(attr.pkey_index)
            .port(attr.port);
        match self.qp_type {
            QpType::Ud => a.qkey(attr.qkey),
            _ => a.access_flags(attr.access),
        };
        self.modify(&a)?;
        self.learn_max_msg(attr.port);
        Ok(())
    }

    /// Remembers the port's message limit, so oversized requests get a clear
    /// error instead of whatever the device does with them.
    fn learn_max_msg(&self, port: u8) {
        if let Ok(p) = self.pd.context().query_port(u32::from(port)) {
            let limit = match self.qp_type {
                QpType::Ud => p.active_mtu.bytes().unwrap_or(0),
                _ => p.max_msg_sz,
            };
            self.max_msg
                .store(limit, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// INIT → RTR. UD ignores `attr` (pass `None`); RC and UC need it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for RC/UC without `attr`; as
    /// [`QueuePair::modify`].
    pub fn to_rtr(&self, attr: Option<&RtrAttr>) -> Result<()> {
        let mut a = QpAttr::new();
        a.state(QpState::Rtr);
        if self.qp_type != QpType::Ud {
            let r = attr.ok_or_else(|| Error::InvalidArgument {
                verb: "ibv_modify_qp",
                reason: format!(
                    "a {:?} QP needs the peer's address to reach RTR",
                    self.qp_type
                ),
            })?;
            a.ah_attr(&r.ah)
                .path_mtu(r.path_mtu)
                .dest_qp_num(r.dest_qp_num)
                .rq_psn(r.rq_psn);
            if self.qp_type == QpType::Rc {
                a.max_dest_rd_atomic(r.max_dest_rd_atomic)
                    .min_rnr_timer(r.min_rnr_timer);
            }
        }
        self.modify(&a)
    }

    /// RTR → RTS.
    ///
    /// # Errors
    /// As [`QueuePair::modify`].
    pub fn to_rts(&self, attr: &RtsAttr) -> Result<()> {
        let mut a = QpAttr::new();
        a.state(QpState::Rts).sq_psn(attr.sq_psn);
        if self.qp_type == QpType::Rc {
            a.timeout(attr.timeout)
                .retry_cnt(attr.retry_cnt)
                .rnr_retry(attr.rnr_retry)
                .max_rd_atomic(attr.max_rd_atomic);
        }
        self.modify(&a)
    }

    /// Moves the QP to the error state: outstanding work completes with
    /// `WR_FLUSH_ERR`.
    ///
    /// # Errors
    /// As [`QueuePair::modify`].
    pub fn to_error(&self) -> Result<()> {
        self.modify(QpAttr::new().state(QpState::Err))
    }

    fn invalid(&self, reason: String) -> Error {
        let _ = self;
        Error::InvalidArgument {
            verb: "ibv_post_send",
            reason,
        }
    }

    fn check_buffers(
        &self,
        bufs: &WrBuffers,
        max_sge: u32,
        local_write: bool,
        verb: &'static str,
    ) -> Result<()> {
        if bufs.len() > max_sge as usize {
            return Err(Error::InvalidArgument {
                verb,
                reason: format!(
                    "{} scatter/gather entries, but QP {} allows {max_sge}",
                    bufs.len(),
                    self.qp_num()
                ),
            });
        }
        if local_write && bufs.is_shared() {
            return Err(Error::InvalidArgument {
                verb,
                reason: crate::wc::SHARED_IS_READ_ONLY.into(),
            });
        }
        let mut err = None;
        bufs.for_each(|m| {
            if err.is_some() {
                return;
            }
            if m.pd().as_raw() != self.pd.as_raw() {
                err = Some(format!(
                    "a memory region ({m:?}) belongs to another protection domain"
                ));
            } else if u32::try_from(m.len()).is_err() {
                err = Some(format!(
                    "a memory region of {} bytes is longer than one SGE can be",
                    m.len()
                ));
            } else if local_write && !m.access().contains(AccessFlags::LOCAL_WRITE) {
                err = Some(format!(
                    "the device must write into a region registered without LOCAL_WRITE ({m:?})"
                ));
            }
        });
        match err {
            Some(reason) => Err(Error::InvalidArgument { verb, reason }),
            None => Ok(()),
        }
    }

    fn total_len(bufs: &WrBuffers) -> u64 {
        let mut n = 0u64;
        bufs.for_each(|m| n += m.len() as u64);
        n
    }

    fn check_send(
        &self,
        op: &SendOp,
        len: u64,
        ud: &Option<UdDest>,
        xrc_srqn: Option<u32>,
    ) -> Result<()> {
        let max = u64::from(self.max_msg.load(std::sync::atomic::Ordering::Relaxed));
        if max != 0 && len > max {
            return Err(self.invalid(format!(
                "a {len}-byte message exceeds the port's limit of {max} bytes{}",
                if self.qp_type == QpType::Ud {
                    " (a UD message must fit the path MTU)"
                } else {
                    " (max_msg_sz)"
                }
            )));
        }
        if let Some(remote) = op.remote() {
            if op.is_atomic() {
                if len != 8 {
                    return Err(self.invalid(format!(
                        "an atomic operation needs one 8-byte local buffer, got {len} bytes"
                    )));
                }
                if remote.addr % 8 != 0 {
                    return Err(self.invalid(format!(
                        "atomic target address {:#x} is not 8-byte aligned",
                        remote.addr
                    )));
                }
                if remote.len < 8 {
                    return Err(self.invalid(format!("atomic target of {} bytes", remote.len)));
                }
            } else if len > remote.len {
                return Err(self.invalid(format!(
                    "{len} bytes do not fit the remote range of {} bytes",
                    remote.len
                )));
            }
        }
        check_destination(self.qp_type, op, ud.is_some(), xrc_srqn).map_err(|r| self.invalid(r))
    }

    fn fill_send(
        raw: &mut ffi::ibv_send_wr,
        op: &SendOp,
        ud: &Option<UdDest>,
        xrc_srqn: Option<u32>,
    ) {
        raw.opcode = op.opcode();
        if let Some(imm) = op.imm() {
            raw.__bindgen_anon_1.imm_data = imm.to_be();
        }
        if let Some(rkey) = op.invalidate() {
            raw.__bindgen_anon_1.invalidate_rkey = rkey;
        }
        match *op {
            SendOp::Write(r) | SendOp::WriteWithImm(r, _) | SendOp::Read(r) => {
                raw.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                    remote_addr: r.addr,
                    rkey: r.rkey,
                };
            }
            SendOp::CompareSwap {
                remote,
                compare,
                swap,
            } => {
                raw.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr: remote.addr,
                    compare_add: compare,
                    swap,
                    rkey: remote.rkey,
                };
            }
            SendOp::FetchAdd { remote, add } => {
                raw.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr: remote.addr,
                    compare_add: add,
                    swap: 0,
                    rkey: remote.rkey,
                };
            }
            SendOp::Send
            | SendOp::SendWithImm(_)
            | SendOp::SendWithInvalidate(_)
            | SendOp::LocalInvalidate(_) => {}
        }
        if let Some(d) = ud {
            raw.wr.ud = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
                ah: d.ah.as_raw(),
                remote_qpn: d.remote_qpn,
                remote_qkey: d.remote_qkey,
            };
        }
        if let Some(remote_srqn) = xrc_srqn {
            raw.qp_type = ffi::ibv_send_wr__bindgen_ty_3 {
                xrc: ffi::ibv_send_wr__bindgen_ty_3__bindgen_ty_1 { remote_srqn },
            };
        }
    }

    /// Posts one send request (`ibv_post_send(3)`). Its memory is held until
    /// its completion (or, if unsignaled, a later one) is polled.
    ///
    /// The memory moves into the queue: it cannot be touched until the
    /// completion gives it back.
    ///
    /// ```compile_fail
    /// # fn f(qp: &mut rdma::QueuePair, mr: rdma::MemoryRegion) {
    /// qp.post_send(rdma::SendWr::send(1, mr)).unwrap();
    /// let _ = mr.as_slice(); // moved into the send queue
    /// # }
    /// ```
    ///
    /// Posting needs the QP exclusively:
    ///
    /// ```compile_fail
    /// # fn f(qp: &rdma::QueuePair, mr: rdma::MemoryRegion) {
    /// qp.post_send(rdma::SendWr::send(1, mr)).unwrap(); // needs &mut QueuePair
    /// # }
    /// ```
    ///
    /// # Errors
    /// The error and the request's memory: [`Error::InvalidArgument`] for a
    /// request the QP cannot take (too many SGEs, wrong PD, misaligned
    /// atomic, missing `LOCAL_WRITE`, ...), [`Error::Verb`] naming
    /// `ibv_post_send` (e.g. `EINVAL` in a state that cannot send, `ENOMEM`
    /// when the send queue is full).
    pub fn post_send(&mut self, wr: SendWr) -> std::result::Result<(), PostError> {
        // One request with a short scatter list: no allocation on the way.
        const SHORT: usize = 4;
        if !self.send_plainly_valid(&wr) {
            // (The quick check passes one region at most.)
            if wr.buffers.len() > SHORT {
                return self.post_send_batch(std::iter::once(wr));
            }
            // The full checks, which explain what is wrong (the quick one
            // only accepts common requests it can vouch for).
            let check = self
                .check_buffers(
                    &wr.buffers,
                    self.caps.max_send_sge,
                    wr.op.writes_local(),
                    "ibv_post_send",
                )
                .and_then(|()| {
                    self.check_send(&wr.op, Self::total_len(&wr.buffers), &wr.ud, wr.xrc_srqn)
                });
            if let Err(error) = check {
                return Err(PostError {
                    error,
                    returned: vec![(wr.wr_id, wr.buffers)],
                });
            }
        }
        // The scatter list: built in place, only as long as it needs to be.
        let mut one;
        let mut many;
        let sges: &mut [ffi::ibv_sge] = match &wr.buffers {
            WrBuffers::None => &mut [],
            WrBuffers::One(m) => {
                one = m.sge();
                std::slice::from_mut(&mut one)
            }
            WrBuffers::Shared(m) => {
                one = m.sge();
                std::slice::from_mut(&mut one)
            }
            WrBuffers::Many(v) => {
                many = [ffi::ibv_sge::default(); SHORT];
                for (s, m) in many.iter_mut().zip(v) {
                    *s = m.sge();
                }
                // At most SHORT: longer lists went to post_send_batch above
                // (the quick check passes no list).
                &mut many[..v.len()]
            }
        };
        let n = sges.len();
        // SAFETY: `&mut self`: the only poster to this QP's send queue.
        let mut ring = unsafe { self.tracker.producer(false) };
        let rc = match self.qpx {
            Some(qpx) if !(self.auto_path && n > 1) => {
                let sge_at = [(0, n)];
                let one = std::slice::from_ref(&wr);
                Self::post_extended(qpx, one, sges, &sge_at, &ring).0
            }
            _ => {
                let mut raw = ffi::ibv_send_wr {
                    wr_id: ring.wr_id(0),
                    sg_list: if n == 0 {
                        std::ptr::null_mut()
                    } else {
                        sges.as_mut_ptr()
                    },
                    num_sge: n as std::ffi::c_int,
                    send_flags: wr.flags.bits(),
                    ..Default::default()
                };
                Self::fill_send(&mut raw, &wr.op, &wr.ud, wr.xrc_srqn);
                let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
                // SAFETY: one well-formed request whose SGEs point into
                // memory held by `wr`, which is parked in the tracker below
                // and published when `ring` is dropped (a poll that sees the
                // completion first waits for that).
                unsafe { ffi::ibv_post_send(self.as_raw(), &mut raw, &mut bad) }
            }
        };
        if rc != 0 {
            drop(ring);
            return Err(self.not_posted("ibv_post_send", rc, (wr.wr_id, wr.buffers)));
        }
        ring.push(Pending {
            wr_id: wr.wr_id,
            buffers: wr.buffers,
            _ah: wr.ud.map(|d| d.ah),
            _mw: None,
        });
        Ok(())
    }

    /// A quick check that accepts only requests [`Self::check_buffers`] and
    /// [`Self::check_send`] would accept: at most one region of this QP's
    /// PD, no UD destination or XRC SRQ (nor a UD or XRC_SEND QP), no
    /// atomics. Everything else (and every error)
    /// goes through the full checks.
    #[inline]
    fn send_plainly_valid(&self, wr: &SendWr) -> bool {
        if !self.plain_sends || wr.ud.is_some() || wr.xrc_srqn.is_some() {
            return false;
        }
        // `plain_sends`: the QP has a send scatter entry.
        let Some(len) = self.buffers_plainly_valid(&wr.buffers, 1, wr.op.writes_local()) else {
            return false;
        };
        let max = u64::from(self.max_msg.load(std::sync::atomic::Ordering::Relaxed));
        if max != 0 && len > max {
            return false;
        }
        match wr.op {
            SendOp::Send
            | SendOp::SendWithImm(_)
            | SendOp::SendWithInvalidate(_)
            | SendOp::LocalInvalidate(_) => true,
            SendOp::Write(r) | SendOp::WriteWithImm(r, _) | SendOp::Read(r) => len <= r.len,
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => false,
        }
    }

    /// The quick half of [`Self::check_buffers`] for the common case: no
    /// region, or one region of this QP's PD that one SGE can describe
    /// (with `LOCAL_WRITE` when the device writes it). Returns the length,
    /// or `None` for anything the full checks must look at.
    #[inline]
    fn buffers_plainly_valid(
        &self,
        bufs: &WrBuffers,
        max_sge: u32,
        local_write: bool,
    ) -> Option<u64> {
        let m = match bufs {
            WrBuffers::None => return Some(0),
            WrBuffers::Many(_) => return None,
            _ => bufs.single()?,
        };
        // A shared region is never written by the device.
        let writable = !bufs.is_shared() && m.access().contains(AccessFlags::LOCAL_WRITE);
        (max_sge > 0
            && m.pd().as_raw() == self.pd.as_raw()
            && u32::try_from(m.len()).is_ok()
            && (!local_write || writable))
            .then_some(m.len() as u64)
    }

    /// Posts several send requests with one doorbell.
    ///
    /// # Errors
    /// As [`QueuePair::post_send`]; requests not posted come back in
    /// [`PostError::returned`], in order.
    pub fn post_send_batch(
        &mut self,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> std::result::Result<(), PostError> {
        let wrs: Vec<SendWr> = wrs.into_iter().collect();
        let give_back = |wrs: Vec<SendWr>, error| PostError {
            error,
            returned: wrs.into_iter().map(|w| (w.wr_id, w.buffers)).collect(),
        };
        for w in &wrs {
            let check = self
                .check_buffers(
                    &w.buffers,
                    self.caps.max_send_sge,
                    w.op.writes_local(),
                    "ibv_post_send",
                )
                .and_then(|()| {
                    self.check_send(&w.op, Self::total_len(&w.buffers), &w.ud, w.xrc_srqn)
                });
            if let Err(e) = check {
                return Err(give_back(wrs, e));
            }
        }
        if wrs.is_empty() {
            return Ok(());
        }
        // Build the C chain: SGEs first (stable Vec), then the WRs.
        let mut sges: Vec<ffi::ibv_sge> = Vec::new();
        let mut sge_at = Vec::with_capacity(wrs.len());
        for w in &wrs {
            sge_at.push((sges.len(), w.buffers.len()));
            w.buffers.for_each(|m| sges.push(m.sge()));
        }
        // SAFETY: `&mut self`: the only poster to this QP's send queue.
        let mut ring = unsafe { self.tracker.producer(false) };
        let scatter = self.auto_path && wrs.iter().any(|w| w.buffers.len() > 1);
        let (rc, posted) = match self.qpx {
            Some(qpx) if !scatter => Self::post_extended(qpx, &wrs, &mut sges, &sge_at, &ring),
            _ => self.post_legacy(&wrs, &mut sges, &sge_at, &ring),
        };
        let mut rest = wrs;
        let unposted = rest.split_off(posted);
        for w in rest {
            ring.push(Pending {
                wr_id: w.wr_id,
                buffers: w.buffers,
                _ah: w.ud.map(|d| d.ah),
                _mw: None,
            });
        }
        drop(ring);
        if rc == 0 {
            return Ok(());
        }
        let qpn = self.qp_num();
        let err = check_errno_ret(
            "ibv_post_send",
            || {
                format!(
                    "QP {qpn}: {} of {} requests not posted",
                    unposted.len(),
                    posted + unposted.len()
                )
                .into()
            },
            rc,
        )
        .expect_err("rc != 0");
        Err(give_back(unposted, err))
    }

    /// `ibv_post_send` over a chain built from `wrs`; returns the errno and
    /// how many requests were posted.
    fn post_legacy(
        &self,
        wrs: &[SendWr],
        sges: &mut [ffi::ibv_sge],
        sge_at: &[(usize, usize)],
        ring: &track::Producer<'_>,
    ) -> (std::ffi::c_int, usize) {
        // One request (the common case) needs no heap.
        let mut single = [ffi::ibv_send_wr::default()];
        let mut many: Vec<ffi::ibv_send_wr> = Vec::new();
        let raw: &mut [ffi::ibv_send_wr] = if wrs.len() == 1 {
            &mut single
        } else {
            many.resize_with(wrs.len(), Default::default);
            &mut many
        };
        for (i, w) in wrs.iter().enumerate() {
            let (at, n) = sge_at[i];
            let mut r = ffi::ibv_send_wr {
                wr_id: ring.wr_id(i as u32),
                sg_list: if n == 0 {
                    std::ptr::null_mut()
                } else {
                    sges[at..].as_mut_ptr()
                },
                num_sge: n as std::ffi::c_int,
                send_flags: w.flags.bits(),
                ..Default::default()
            };
            Self::fill_send(&mut r, &w.op, &w.ud, w.xrc_srqn);
            raw[i] = r;
        }
        let base = raw.as_mut_ptr();
        for i in 1..raw.len() {
            // SAFETY: `i` and `i - 1` are in bounds of `raw`, which is not
            // reallocated from here on.
            unsafe { (*base.add(i - 1)).next = base.add(i) };
        }
        let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: a well-formed chain whose SGEs point into memory held by
        // `wrs` (the caller parks it in the tracker while holding the ring
        // lock, so no completion is resolved before it is there).
        let rc = unsafe { ffi::ibv_post_send(self.as_raw(), base, &mut bad) };
        let posted = if rc == 0 {
            wrs.len()
        } else if bad.is_null() {
            0
        } else {
            // SAFETY: `bad` points into `raw`.
            usize::try_from(unsafe { bad.offset_from(base) }).unwrap_or(0)
        };
        (rc, posted)
    }

    /// Emits the `ibv_wr_*` call of `op` (and the UD address or the remote
    /// XRC SRQ) on an open batch.
    ///
    /// # Safety
    /// `q` is a live extended QP between `ibv_wr_start` and `ibv_wr_complete`,
    /// with `wr_id` and `wr_flags` already set.
    unsafe fn emit_op(
        q: *mut ffi::ibv_qp_ex,
        op: &SendOp,
        ud: &Option<UdDest>,
        xrc_srqn: Option<u32>,
    ) {
        // SAFETY: guaranteed by the caller.
        unsafe {
            match *op {
                SendOp::Send => ffi::ibv_wr_send(q),
                SendOp::SendWithImm(imm) => ffi::ibv_wr_send_imm(q, imm.to_be()),
                SendOp::Write(r) => ffi::ibv_wr_rdma_write(q, r.rkey, r.addr),
                SendOp::WriteWithImm(r, imm) => {
                    ffi::ibv_wr_rdma_write_imm(q, r.rkey, r.addr, imm.to_be())
                }
                SendOp::Read(r) => ffi::ibv_wr_rdma_read(q, r.rkey, r.addr),
                SendOp::CompareSwap {
                    remote,
                    compare,
                    swap,
                } => ffi::ibv_wr_atomic_cmp_swp(q, remote.rkey, remote.addr, compare, swap),
                SendOp::FetchAdd { remote, add } => {
                    ffi::ibv_wr_atomic_fetch_add(q, remote.rkey, remote.addr, add)
                }
                SendOp::SendWithInvalidate(rkey) => ffi::ibv_wr_send_inv(q, rkey),
                SendOp::LocalInvalidate(rkey) => ffi::ibv_wr_local_inv(q, rkey),
            }
            if let Some(d) = ud {
                ffi::ibv_wr_set_ud_addr(q, d.ah.as_raw(), d.remote_qpn, d.remote_qkey);
            }
            if let Some(remote_srqn) = xrc_srqn {
                ffi::ibv_wr_set_xrc_srqn(q, remote_srqn);
            }
        }
    }

    /// The `ibv_wr_*` post path: all requests or none.
    fn post_extended(
        qpx: NonNull<ffi::ibv_qp_ex>,
        wrs: &[SendWr],
        sges: &mut [ffi::ibv_sge],
        sge_at: &[(usize, usize)],
        ring: &track::Producer<'_>,
    ) -> (std::ffi::c_int, usize) {
        let q = qpx.as_ptr();
        // SAFETY: `q` is the extended view of this live QP; the batch is
        // started, filled and completed within this call (`&mut self`), and
        // every SGE points into memory held by `wrs` (parked by the caller).
        unsafe {
            ffi::ibv_wr_start(q);
            for (i, w) in wrs.iter().enumerate() {
                (*q).wr_id = ring.wr_id(i as u32);
                (*q).wr_flags = w.flags.bits();
                Self::emit_op(q, &w.op, &w.ud, w.xrc_srqn);
                let (at, n) = sge_at[i];
                let list = if n == 0 {
                    std::ptr::null()
                } else {
                    sges[at..].as_ptr()
                };
                ffi::ibv_wr_set_sge_list(q, n, list);
            }
            let rc = ffi::ibv_wr_complete(q);
            (rc, if rc == 0 { wrs.len() } else { 0 })
        }
    }

    /// Posts a send whose data is copied at post time (`IBV_SEND_INLINE`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the data exceeds `max_inline_data`,
    /// [`Error::Verb`] naming `ibv_post_send`.
    pub fn post_send_inline(&mut self, wr: InlineSend<'_>) -> Result<()> {
        if wr.data.len() > self.caps.max_inline_data as usize {
            return Err(self.invalid(format!(
                "{} bytes of inline data, but QP {} allows {}",
                wr.data.len(),
                self.qp_num(),
                self.caps.max_inline_data
            )));
        }
        if matches!(
            wr.op,
            SendOp::Read(_) | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        ) {
            return Err(self.invalid("only SEND and RDMA WRITE can be inline".into()));
        }
        self.check_send(&wr.op, wr.data.len() as u64, &wr.ud, wr.xrc_srqn)?;
        let mut sge = ffi::ibv_sge {
            addr: wr.data.as_ptr() as u64,
            length: wr.data.len() as u32,
            lkey: 0,
        };
        // SAFETY: `&mut self`: the only poster to this QP's send queue.
        let mut ring = unsafe { self.tracker.producer(false) };
        let mut raw = ffi::ibv_send_wr {
            wr_id: ring.wr_id(0),
            sg_list: &mut sge,
            num_sge: i32::from(!wr.data.is_empty()),
            send_flags: (wr.flags | SendFlags::INLINE).bits(),
            ..Default::default()
        };
        let rc = match self.qpx {
            Some(qpx) if !self.auto_path => {
                let q = qpx.as_ptr();
                // SAFETY: a one-request batch on the live extended QP; the
                // data is copied by ibv_wr_set_inline_data.
                unsafe {
                    ffi::ibv_wr_start(q);
                    (*q).wr_id = raw.wr_id;
                    (*q).wr_flags = wr.flags.bits() & !ffi::IBV_SEND_INLINE;
                    Self::emit_op(q, &wr.op, &wr.ud, wr.xrc_srqn);
                    ffi::ibv_wr_set_inline_data(
                        q,
                        wr.data.as_ptr().cast_mut().cast(),
                        wr.data.len(),
                    );
                    ffi::ibv_wr_complete(q)
                }
            }
            _ => {
                Self::fill_send(&mut raw, &wr.op, &wr.ud, wr.xrc_srqn);
                let mut bad = std::ptr::null_mut();
                // SAFETY: the data is copied by the provider during this call.
                unsafe { ffi::ibv_post_send(self.as_raw(), &mut raw, &mut bad) }
            }
        };
        if rc == 0 {
            ring.push(Pending {
                wr_id: wr.wr_id,
                buffers: WrBuffers::None,
                _ah: wr.ud.map(|d| d.ah),
                _mw: None,
            });
        }
        drop(ring);
        check_errno_ret("ibv_post_send", || self.ctx_str("inline send"), rc)
    }

    /// Checks a send request once, for [`QueuePair::post_prepared`] to post
    /// again and again with one region each time.
    ///
    /// For RC and UC QPs (UD: [`QueuePair::prepare_send_ud`]; a request to
    /// an XRC SRQ goes through [`QueuePair::post_send`]); any operation that
    /// takes memory, with
    /// `flags` (`SIGNALED`, `FENCE`, `SOLICITED`; not `INLINE`). A remote
    /// range bounds the regions it may be posted with, an atomic takes an
    /// 8-byte region.
    ///
    /// ```no_run
    /// # fn f(qp: &mut rdma::QueuePair, cq: &rdma::CompletionQueue, mut mr: rdma::MemoryRegion,
    /// #      remote: rdma::RemoteMemory) -> Result<(), Box<dyn std::error::Error>> {
    /// use rdma::{SendFlags, SendOp};
    /// let mut write = qp.prepare_send(SendOp::Write(remote), SendFlags::SIGNALED)?;
    /// for i in 0..1000 {
    ///     mr.write_at(0, &[i as u8])?;
    ///     qp.post_prepared(&mut write, i, mr)?;
    ///     let done = loop {
    ///         if let Some(c) = cq.poll_one()? {
    ///             break c.ok()?;
    ///         }
    ///     };
    ///     mr = done.buffers.into_one().expect("the region comes back");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `ibv_post_send` for a request
    /// [`QueuePair::post_send`] would refuse whatever the region, or that
    /// has no region to take.
    pub fn prepare_send(&self, op: SendOp, flags: SendFlags) -> Result<PreparedSend> {
        if !self.plain_sends {
            return Err(self.invalid(format!(
                "a prepared send needs an RC or UC QP with a send scatter entry; QP {} is {:?} \
                 with max_send_sge {} (use prepare_send_ud for UD, post_send otherwise)",
                self.qp_num(),
                self.qp_type,
                self.caps.max_send_sge
            )));
        }
        self.prepare(op, flags, None)
    }

    /// [`QueuePair::prepare_send`] for a UD QP: every post goes to
    /// `remote_qpn` (Q_Key `remote_qkey`) through `ah`, which the request
    /// keeps alive, as does every post in flight. A SEND (with or without
    /// immediate data) of at most the path MTU.
    ///
    /// # Errors
    /// As [`QueuePair::prepare_send`]; [`Error::InvalidArgument`] also for a
    /// QP that is not UD.
    pub fn prepare_send_ud(
        &self,
        op: SendOp,
        flags: SendFlags,
        ah: &crate::AddressHandle,
        remote_qpn: u32,
        remote_qkey: u32,
    ) -> Result<PreparedSend> {
        if self.qp_type != QpType::Ud || self.caps.max_send_sge == 0 {
            return Err(self.invalid(format!(
                "prepare_send_ud needs a UD QP with a send scatter entry; QP {} is {:?} \
                 with max_send_sge {} (use prepare_send)",
                self.qp_num(),
                self.qp_type,
                self.caps.max_send_sge
            )));
        }
        let dest = UdDest {
            ah: ah.clone(),
            remote_qpn,
            remote_qkey,
        };
        self.prepare(op, flags, Some(dest))
    }

    /// The checks and the template of [`QueuePair::prepare_send`] and
    /// [`QueuePair::prepare_send_ud`] (which checked the QP type).
    fn prepare(&self, op: SendOp, flags: SendFlags, ud: Option<UdDest>) -> Result<PreparedSend> {
        if flags.contains(SendFlags::INLINE) {
            return Err(self.invalid(
                "a prepared send posts a region; inline data goes through post_send_inline".into(),
            ));
        }
        if matches!(op, SendOp::LocalInvalidate(_)) {
            return Err(
                self.invalid("a local invalidate takes no memory: post it with post_send".into())
            );
        }
        let (min_len, max_len) = if op.is_atomic() {
            (8, 8)
        } else {
            let remote = op.remote().map_or(u64::MAX, |r| r.len);
            (
                0,
                usize::try_from(remote.min(u64::from(u32::MAX))).unwrap_or(usize::MAX),
            )
        };
        self.check_send(&op, min_len as u64, &ud, None)?;
        let mut raw = ffi::ibv_send_wr {
            num_sge: 1,
            send_flags: flags.bits(),
            ..Default::default()
        };
        Self::fill_send(&mut raw, &op, &ud, None);
        Ok(PreparedSend {
            raw,
            sge: ffi::ibv_sge::default(),
            op,
            flags,
            ud,
            serial: self.tracker.serial(),
            min_len,
            max_len,
        })
    }

    /// Posts the request `p` ([`QueuePair::prepare_send`]) with `mr` as its
    /// one scatter entry, under the caller's `wr_id`: what
    /// [`QueuePair::post_send`] does with the same request, with only the
    /// checks that depend on the region (its PD, its length, `LOCAL_WRITE`
    /// where the device writes it). The region comes back with the
    /// completion.
    ///
    /// The region moves into the queue, as with [`QueuePair::post_send`]:
    ///
    /// ```compile_fail
    /// # fn f(qp: &mut rdma::QueuePair, p: &mut rdma::PreparedSend, mr: rdma::MemoryRegion) {
    /// qp.post_prepared(p, 1, mr).unwrap();
    /// let _ = mr.len(); // moved into the send queue
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`QueuePair::post_send`], with the region in
    /// [`PostError::returned`]; [`Error::InvalidArgument`] also when `p` was
    /// prepared by another QP.
    #[inline]
    pub fn post_prepared(
        &mut self,
        p: &mut PreparedSend,
        wr_id: u64,
        mr: MemoryRegion,
    ) -> std::result::Result<(), PostError> {
        self.post_prepared_with(p, wr_id, WrBuffers::One(mr))
    }

    /// [`QueuePair::post_prepared`] with a region shared with other
    /// requests and holders ([`WrBuffers::Shared`]): for SENDs and RDMA
    /// WRITEs, which the device only reads; this request holds one reference
    /// until its completion gives it back.
    ///
    /// # Errors
    /// As [`QueuePair::post_prepared`]; [`Error::InvalidArgument`] also when
    /// the prepared operation writes local memory (RDMA READ, atomics).
    #[inline]
    pub fn post_prepared_shared(
        &mut self,
        p: &mut PreparedSend,
        wr_id: u64,
        mr: std::sync::Arc<MemoryRegion>,
    ) -> std::result::Result<(), PostError> {
        self.post_prepared_with(p, wr_id, WrBuffers::Shared(mr))
    }

    /// The body of both: `buffers` is `One` or `Shared` (anything else is
    /// refused with the full checks' reason).
    #[inline(always)]
    fn post_prepared_with(
        &mut self,
        p: &mut PreparedSend,
        wr_id: u64,
        buffers: WrBuffers,
    ) -> std::result::Result<(), PostError> {
        let Some(mr) = buffers.single() else {
            return Err(self.prepared_refused(p, wr_id, buffers));
        };
        let len = mr.len();
        let max = self.max_msg.load(std::sync::atomic::Ordering::Relaxed) as usize;
        // (The QP's kind again: serials wrap after 2^30 QPs, and a template
        // checked for an RC QP must never reach a UD one, nor the reverse.)
        if p.serial != self.tracker.serial()
            || !(if p.ud.is_some() {
                self.qp_type == QpType::Ud
            } else {
                self.plain_sends
            })
            || len < p.min_len
            || len > p.max_len
            || (max != 0 && len > max)
            || mr.pd().as_raw() != self.pd.as_raw()
            || (p.op.writes_local()
                && (buffers.is_shared() || !mr.access().contains(AccessFlags::LOCAL_WRITE)))
        {
            return Err(self.prepared_refused(p, wr_id, buffers));
        }
        let sge = mr.sge();
        // SAFETY: `&mut self`: the only poster to this QP's send queue.
        let mut ring = unsafe { self.tracker.producer(false) };
        let rc = match self.qpx {
            Some(qpx) => {
                let q = qpx.as_ptr();
                // SAFETY: a one-request batch on the live extended QP; the
                // SGE points into `buffers`' region, parked in the tracker below.
                unsafe {
                    ffi::ibv_wr_start(q);
                    (*q).wr_id = ring.wr_id(0);
                    (*q).wr_flags = p.flags.bits();
                    Self::emit_op(q, &p.op, &p.ud, None);
                    ffi::ibv_wr_set_sge(q, sge.lkey, sge.addr, sge.length);
                    ffi::ibv_wr_complete(q)
                }
            }
            None => {
                p.sge = sge;
                p.raw.wr_id = ring.wr_id(0);
                p.raw.sg_list = &mut p.sge;
                let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
                // SAFETY: a well-formed request (checked when prepared, the
                // region just now) whose one SGE points into `buffers`' region, which is
                // parked in the tracker below and published when `ring` is
                // dropped (a poll that sees the completion first waits).
                unsafe { ffi::ibv_post_send(self.as_raw(), &mut p.raw, &mut bad) }
            }
        };
        if rc != 0 {
            drop(ring);
            return Err(self.not_posted("ibv_post_send", rc, (wr_id, buffers)));
        }
        ring.push(Pending {
            wr_id,
            buffers,
            _ah: p.ud.as_ref().map(|d| d.ah.clone()),
            _mw: None,
        });
        Ok(())
    }

    /// Why [`QueuePair::post_prepared`] refused `buffers` (the full checks of
    /// [`QueuePair::post_send`] explain it).
    #[cold]
    fn prepared_refused(&self, p: &PreparedSend, wr_id: u64, buffers: WrBuffers) -> PostError {
        let error = if p.serial != self.tracker.serial() {
            self.invalid(format!(
                "the request was prepared by another QP than QP {}",
                self.qp_num()
            ))
        } else {
            let len = Self::total_len(&buffers);
            match self
                .check_buffers(&buffers, 1, p.op.writes_local(), "ibv_post_send")
                .and_then(|()| self.check_send(&p.op, len, &p.ud, None))
            {
                Err(e) => e,
                Ok(()) => self.invalid(format!(
                    "a {len}-byte region, but the prepared {:?} takes {} to {} bytes",
                    p.op, p.min_len, p.max_len
                )),
            }
        };
        PostError {
            error,
            returned: vec![(wr_id, buffers)],
        }
    }

    /// The provider refused a single request (`rc`, an errno value, not 0):
    /// the error naming `verb`, and the request's memory back.
    #[cold]
    fn not_posted(
        &self,
        verb: &'static str,
        rc: std::ffi::c_int,
        req: (u64, WrBuffers),
    ) -> PostError {
        let error = check_errno_ret(verb, || self.ctx_str("1 request not posted"), rc)
            .expect_err("rc != 0");
        PostError {
            error,
            returned: vec![req],
        }
    }

    /// Posts one receive request (`ibv_post_recv(3)`); its memory comes back
    /// with the receive completion.
    ///
    /// # Errors
    /// As [`QueuePair::post_recv_batch`].
    pub fn post_recv(
        &mut self,
        wr_id: u64,
        buffers: impl Into<WrBuffers>,
    ) -> std::result::Result<(), PostError> {
        let buffers = buffers.into();
        let plainly_valid = self.srq.is_none()
            && self
                .buffers_plainly_valid(&buffers, self.caps.max_recv_sge, true)
                .is_some();
        let check = if plainly_valid {
            Ok(())
        } else if self.srq.is_some() {
            Err(Error::InvalidArgument {
                verb: "ibv_post_recv",
                reason: format!(
                    "QP {} takes its receives from an SRQ: post them there",
                    self.qp_num()
                ),
            })
        } else {
            self.check_buffers(&buffers, self.caps.max_recv_sge, true, "ibv_post_recv")
        };
        if let Err(error) = check {
            return Err(PostError {
                error,
                returned: vec![(wr_id, buffers)],
            });
        }
        let qp = self.as_raw();
        // SAFETY: `&mut self`: the only poster to this QP's receive queue.
        let mut ring = unsafe { self.tracker.producer(true) };
        // SAFETY: `post_chain` hands over a well-formed request whose memory
        // is parked below, before `ring` publishes it (a poll that sees the
        // completion first waits for that); the QP is live.
        let (rc, _) = track::post_chain(&[(ring.wr_id(0), &buffers)], |wr, bad| unsafe {
            ffi::ibv_post_recv(qp, wr, bad)
        });
        if rc != 0 {
            drop(ring);
            return Err(self.not_posted("ibv_post_recv", rc, (wr_id, buffers)));
        }
        ring.push(Pending::memory(wr_id, buffers));
        Ok(())
    }

    /// Posts several receive requests with one doorbell.
    ///
    /// # Errors
    /// The error and the memory of the requests not posted:
    /// [`Error::InvalidArgument`] (too many SGEs, wrong PD, no `LOCAL_WRITE`),
    /// [`Error::Verb`] naming `ibv_post_recv` (e.g. `ENOMEM`: queue full).
    pub fn post_recv_batch(
        &mut self,
        wrs: impl IntoIterator<Item = (u64, WrBuffers)>,
    ) -> std::result::Result<(), PostError> {
        let wrs: Vec<(u64, WrBuffers)> = wrs.into_iter().collect();
        if self.srq.is_some() {
            return Err(PostError {
                error: Error::InvalidArgument {
                    verb: "ibv_post_recv",
                    reason: format!(
                        "QP {} takes its receives from an SRQ: post them there",
                        self.qp_num()
                    ),
                },
                returned: wrs,
            });
        }
        for (_, b) in &wrs {
            if let Err(error) = self.check_buffers(b, self.caps.max_recv_sge, true, "ibv_post_recv")
            {
                return Err(PostError {
                    error,
                    returned: wrs,
                });
            }
        }
        let qp = self.as_raw();
        // SAFETY: `&mut self`: the only poster to this QP's receive queue.
        let mut ring = unsafe { self.tracker.producer(true) };
        let chain: Vec<(u64, &WrBuffers)> = wrs
            .iter()
            .enumerate()
            .map(|(i, (_, b))| (ring.wr_id(i as u32), b))
            .collect();
        // SAFETY: `post_chain` hands over a well-formed chain whose memory
        // is parked below, before `ring` publishes it; the QP is live.
        let (rc, posted) = track::post_chain(&chain, |chain, bad| unsafe {
            ffi::ibv_post_recv(qp, chain, bad)
        });
        drop(chain);
        let mut wrs = wrs;
        let unposted = wrs.split_off(posted);
        for (wr_id, buffers) in wrs {
            ring.push(Pending::memory(wr_id, buffers));
        }
        drop(ring);
        if rc == 0 {
            return Ok(());
        }
        let qpn = self.qp_num();
        let error = check_errno_ret(
            "ibv_post_recv",
            || format!("QP {qpn}: {} requests not posted", unposted.len()).into(),
            rc,
        )
        .expect_err("rc != 0");
        Err(PostError {
            error,
            returned: unposted,
        })
    }

    /// Binds `mw` to `offset..offset + len` of `mr` with `access`, and returns
    /// what a peer needs to use the window. Type 1 windows use
    /// `ibv_bind_mw(3)`; type 2 windows post an `IBV_WR_BIND_MW` request with
    /// the next rkey (`ibv_inc_rkey`). Either way a completion with `wr_id`
    /// follows (opcode `BindMw`); the window and the region's registration
    /// stay alive until then, and the registration for as long as the window
    /// is bound.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `mr` lacks `MW_BIND`, the range does not
    /// fit, or the PDs differ; [`Error::Verb`] naming `ibv_bind_mw` or
    /// `ibv_post_send`.
    pub fn bind_mw(
        &mut self,
        wr_id: u64,
        mw: &mut crate::MemoryWindow,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
        access: AccessFlags,
    ) -> Result<RemoteMemory> {
        let type2 = mw.mw_type() == crate::MwType::Type2;
        let next_rkey = if type2 {
            // SAFETY: a pure function of its argument.
            unsafe { ffi::ibv_inc_rkey(mw.rkey()) }
        } else {
            0
        };
        let (info, _) = mw.bind_info(mr, offset, len, access, next_rkey)?;
        // SAFETY: `&mut self`: the only poster to this QP's send queue.
        let mut ring = unsafe { self.tracker.producer(false) };
        let id = ring.wr_id(0);
        let rc = if !type2 {
            let mut bind = ffi::ibv_mw_bind {
                wr_id: id,
                send_flags: ffi::IBV_SEND_SIGNALED,
                bind_info: info,
            };
            // SAFETY: live QP, window and region; the bind request is copied.
            unsafe { ffi::ibv_bind_mw(self.as_raw(), mw.as_raw(), &mut bind) }
        } else if let Some(qpx) = self.qpx {
            let q = qpx.as_ptr();
            // SAFETY: a one-request batch on the live extended QP.
            unsafe {
                ffi::ibv_wr_start(q);
                (*q).wr_id = id;
                (*q).wr_flags = ffi::IBV_SEND_SIGNALED;
                ffi::ibv_wr_bind_mw(q, mw.as_raw(), next_rkey, &info);
                ffi::ibv_wr_complete(q)
            }
        } else {
            let mut raw = ffi::ibv_send_wr {
                wr_id: id,
                opcode: ffi::IBV_WR_BIND_MW,
                send_flags: ffi::IBV_SEND_SIGNALED,
                ..Default::default()
            };
            raw.__bindgen_anon_2.bind_mw = ffi::ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
                mw: mw.as_raw(),
                rkey: next_rkey,
                bind_info: info,
            };
            let mut bad = std::ptr::null_mut();
            // SAFETY: a single well-formed request on a live QP.
            unsafe { ffi::ibv_post_send(self.as_raw(), &mut raw, &mut bad) }
        };
        if rc == 0 {
            mw.hold(mr);
            ring.push(Pending {
                wr_id,
                buffers: WrBuffers::None,
                _ah: None,
                _mw: Some(Arc::clone(&mw.inner)),
            });
        }
        drop(ring);
        let verb = if type2 {
            "ibv_post_send"
        } else {
            "ibv_bind_mw"
        };
        check_errno_ret(
            verb,
            || self.ctx_str(format_args!("bind {:?}", mw.mw_type())),
            rc,
        )?;
        let rkey = if type2 {
            next_rkey
        } else {
            // SAFETY: ibv_bind_mw stored the new rkey in the window.
            unsafe { (*mw.as_raw()).rkey }
        };
        mw.set_rkey(rkey);
        Ok(RemoteMemory {
            addr: info.addr,
            len: info.length,
            rkey,
        })
    }

    /// Posts a raw chain of send requests (`ibv_post_send(3)`), untracked.
    ///
    /// # Safety
    /// - `wr` is a valid, NULL-terminated chain of `ibv_send_wr`.
    /// - Every byte that a request's SGEs, inline data or atomic result refers
    ///   to stays valid (and, for memory the device writes, unaliased by any
    ///   Rust reference) until the request's completion is polled, or until
    ///   the QP is dropped; the MRs and AHs it names stay alive as long.
    /// - No `wr_id` in the chain has bit 63 set (that bit marks the safe
    ///   path's own ids; this is checked and rejected).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `wr_id` with bit 63 set;
    /// [`Error::Verb`] naming `ibv_post_send`, with the index of the first
    /// request that was not posted in the context.
    pub unsafe fn post_send_raw(&mut self, wr: *mut ffi::ibv_send_wr) -> Result<()> {
        let mut p = wr;
        while !p.is_null() {
            // SAFETY: the caller guarantees a valid chain.
            let w = unsafe { &*p };
            if w.wr_id & track::TAG != 0 {
                return Err(self.invalid(format!("raw wr_id {:#x} has bit 63 set", w.wr_id)));
            }
            p = w.next;
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: the caller upholds the chain and memory contract.
        let rc = unsafe { ffi::ibv_post_send(self.as_raw(), wr, &mut bad) };
        check_errno_ret("ibv_post_send", || self.ctx_str("raw post"), rc)
    }

    /// Posts a raw chain of receive requests (`ibv_post_recv(3)`), untracked.
    ///
    /// # Safety
    /// As [`QueuePair::post_send_raw`], for receive requests: the memory stays
    /// valid and unaliased until the receive completion is polled or the QP
    /// is dropped.
    ///
    /// # Errors
    /// As [`QueuePair::post_send_raw`].
    pub unsafe fn post_recv_raw(&mut self, wr: *mut ffi::ibv_recv_wr) -> Result<()> {
        let mut p = wr;
        while !p.is_null() {
            // SAFETY: the caller guarantees a valid chain.
            let w = unsafe { &*p };
            if w.wr_id & track::TAG != 0 {
                return Err(Error::InvalidArgument {
                    verb: "ibv_post_recv",
                    reason: format!("raw wr_id {:#x} has bit 63 set", w.wr_id),
                });
            }
            p = w.next;
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: the caller upholds the chain and memory contract.
        let rc = unsafe { ffi::ibv_post_recv(self.as_raw(), wr, &mut bad) };
        check_errno_ret("ibv_post_recv", || self.ctx_str("raw post"), rc)
    }

    fn teardown(&mut self) -> Result<()> {
        // Flush first, so completions of the work in flight reach the CQs of
        // any other consumer; then destroy, after which the device no longer
        // touches the QP's memory.
        let _ = self.to_error();
        let rc = match &self.owner {
            Some(owner) => owner.destroy_qp(self.as_raw()),
            // SAFETY: valid QP, destroyed once (callers forget or drop `self`).
            None => unsafe { ffi::ibv_destroy_qp(self.as_raw()) },
        };
        check_errno_ret("ibv_destroy_qp", || self.ctx_str("destroy"), rc)?;
        self.send_cq
            .inner
            .registry
            .unregister(self.tracker.serial());
        self.recv_cq
            .inner
            .registry
            .unregister(self.tracker.serial());
        // Memory of requests still in flight goes back (is dropped) only now.
        // SAFETY: the QP is destroyed and unregistered, and `&mut self` holds
        // it: nobody posts or polls its queues any more.
        drop(unsafe { self.tracker.drain() });
        Ok(())
    }

    /// Destroys the QP now, reporting failure (`ibv_destroy_qp(3)`).
    ///
    /// # Errors
    /// Gives the QP back with the error; its memory stays held.
    #[allow(clippy::result_large_err)] // the rusqlite-style `close` signature, rarely taken
    pub fn destroy(self) -> std::result::Result<(), (Self, Error)> {
        let mut this = std::mem::ManuallyDrop::new(self);
        match this.teardown() {
            Ok(()) => {
                // SAFETY: the QP is destroyed; the remaining fields are each
                // dropped exactly once here and `this` is never used again.
                unsafe {
                    std::ptr::drop_in_place(&mut this.tracker);
                    std::ptr::drop_in_place(&mut this.send_cq);
                    std::ptr::drop_in_place(&mut this.recv_cq);
                    std::ptr::drop_in_place(&mut this.srq);
                    std::ptr::drop_in_place(&mut this.pd);
                    std::ptr::drop_in_place(&mut this.owner);
                }
                Ok(())
            }
            Err(e) => Err((std::mem::ManuallyDrop::into_inner(this), e)),
        }
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            crate::error::teardown_failed(format_args!(
                "{e}; leaking the QP and the memory of its work in flight"
            ));
            // The device may still use the memory: never free it (the
            // tracker, which owns it, is never dropped).
            std::mem::forget(Arc::clone(&self.tracker));
        }
    }
}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &self.qp_num())
            .field("qp_type", &self.qp_type)
            .field("caps", &self.caps)
            .finish()
    }
}

/// Whether a send's destination fits the QP type: a UD QP needs an address
/// (and sends only), an XRC_SEND QP needs the remote XRC SRQ number, and no
/// other QP type takes either. The error is the reason, for
/// [`Error::InvalidArgument`].
fn check_destination(
    qp_type: QpType,
    op: &SendOp,
    ud: bool,
    xrc_srqn: Option<u32>,
) -> std::result::Result<(), String> {
    match (qp_type, ud) {
        (QpType::Ud, false) => return Err("a UD send needs a destination (SendWr::ud)".into()),
        (QpType::Ud, true) if op.remote().is_some() => {
            return Err("UD QPs only support SEND".into())
        }
        (t, true) if t != QpType::Ud => {
            return Err(format!("a {t:?} QP does not take a UD destination"))
        }
        _ => {}
    }
    match (qp_type, xrc_srqn) {
        (QpType::XrcSend, None) => Err("an XRC_SEND QP needs the remote XRC SRQ number of \
             every request (SendWr::xrc_remote_srqn)"
            .into()),
        (t, Some(n)) if t != QpType::XrcSend => Err(format!(
            "a {t:?} QP does not take a remote XRC SRQ number ({n}): only XRC_SEND QPs do"
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REMOTE: RemoteMemory = RemoteMemory {
        addr: 0x1000,
        len: 64,
        rkey: 7,
    };

    #[test]
    fn xrc_send_qps_need_the_remote_srq_number() {
        let err = check_destination(QpType::XrcSend, &SendOp::Send, false, None).unwrap_err();
        assert!(
            err.contains("XRC_SEND QP needs the remote XRC SRQ number"),
            "{err}"
        );
        assert!(err.contains("SendWr::xrc_remote_srqn"), "{err}");
        for op in [SendOp::Send, SendOp::Write(REMOTE), SendOp::Read(REMOTE)] {
            assert_eq!(
                check_destination(QpType::XrcSend, &op, false, Some(5)),
                Ok(())
            );
        }
        // A UD address is no substitute, and is refused on its own.
        let err = check_destination(QpType::XrcSend, &SendOp::Send, true, Some(5)).unwrap_err();
        assert!(
            err.contains("XrcSend QP does not take a UD destination"),
            "{err}"
        );
    }

    #[test]
    fn other_qps_refuse_a_remote_srq_number() {
        for t in [QpType::Rc, QpType::Uc, QpType::Ud, QpType::XrcRecv] {
            let ud = t == QpType::Ud;
            assert_eq!(
                check_destination(t, &SendOp::Send, ud, None),
                Ok(()),
                "{t:?}"
            );
            let err = check_destination(t, &SendOp::Send, ud, Some(42)).unwrap_err();
            assert!(
                err.contains(&format!(
                    "a {t:?} QP does not take a remote XRC SRQ number (42)"
                )),
                "{err}"
            );
        }
    }

    #[test]
    fn ud_destination_rules_are_unchanged() {
        let err = check_destination(QpType::Ud, &SendOp::Send, false, None).unwrap_err();
        assert!(err.contains("needs a destination"), "{err}");
        let err = check_destination(QpType::Ud, &SendOp::Write(REMOTE), true, None).unwrap_err();
        assert!(err.contains("only support SEND"), "{err}");
        let err = check_destination(QpType::Rc, &SendOp::Send, true, None).unwrap_err();
        assert!(
            err.contains("Rc QP does not take a UD destination"),
            "{err}"
        );
    }

    #[test]
    fn legacy_request_carries_the_remote_srq_number() {
        let mut raw = ffi::ibv_send_wr::default();
        QueuePair::fill_send(&mut raw, &SendOp::SendWithImm(9), &None, Some(0x00ab_cdef));
        assert_eq!(raw.opcode, ffi::IBV_WR_SEND_WITH_IMM);
        // SAFETY: `xrc` is the union's only member, just written.
        assert_eq!(unsafe { raw.qp_type.xrc.remote_srqn }, 0x00ab_cdef);
        // SAFETY: the immediate-data member was written for SEND_WITH_IMM.
        assert_eq!(unsafe { raw.__bindgen_anon_1.imm_data }, 9u32.to_be());

        let mut raw = ffi::ibv_send_wr::default();
        QueuePair::fill_send(&mut raw, &SendOp::Write(REMOTE), &None, Some(3));
        // SAFETY: as above.
        assert_eq!(unsafe { raw.qp_type.xrc.remote_srqn }, 3);
        // SAFETY: the rdma member was written for RDMA WRITE.
        let rdma = unsafe { raw.wr.rdma };
        assert_eq!((rdma.remote_addr, rdma.rkey), (REMOTE.addr, REMOTE.rkey));

        // Without one the field stays zero, as before.
        let mut raw = ffi::ibv_send_wr::default();
        QueuePair::fill_send(&mut raw, &SendOp::Send, &None, None);
        // SAFETY: as above (zeroed by Default).
        assert_eq!(unsafe { raw.qp_type.xrc.remote_srqn }, 0);
    }

    #[test]
    fn builders_set_the_remote_srq_number() {
        let wr = SendWr::send(1, crate::WrBuffers::None).xrc_remote_srqn(77);
        assert_eq!(wr.xrc_srqn, Some(77));
        assert_eq!(SendWr::send(1, crate::WrBuffers::None).xrc_srqn, None);
        let inline = InlineSend::send(2, b"x").xrc_remote_srqn(78);
        assert_eq!(inline.xrc_srqn, Some(78));
    }
}
