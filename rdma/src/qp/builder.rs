//! Creating queue pairs: the builder, queue sizes, the send path.

use std::ptr::NonNull;
use std::sync::Arc;

use super::wr_ops::ExtendedQp;
use super::{allocate_serial, OwnedQp, QpOwner, QpType, QueuePair, SendPath};
use crate::error::{call_ptr, Error, Result};
use crate::track::{QpTracker, Serial};
use crate::{ffi, CompletionQueue, ProtectionDomain};

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
    pub(super) fn to_raw(self) -> ffi::ibv_qp_cap {
        ffi::ibv_qp_cap {
            max_send_wr: self.max_send_wr,
            max_recv_wr: self.max_recv_wr,
            max_send_sge: self.max_send_sge,
            max_recv_sge: self.max_recv_sge,
            max_inline_data: self.max_inline_data,
        }
    }

    pub(super) fn from_raw(c: &ffi::ibv_qp_cap) -> Self {
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
        /// Pad PCI writes to a cache line (mlx5): the device writes on
        /// past the end of what it places in local memory (a receive's
        /// message, an RDMA READ's or an atomic's result) to the end of the
        /// cache line. Past a scatter entry whose end is not aligned, that
        /// is memory the request does not own (the next piece of a split
        /// region, or whatever follows the registration). So on such a QP
        /// every entry the device writes must end at a multiple of
        /// [`END_PADDING_ALIGN`](crate::END_PADDING_ALIGN) bytes (an address, whatever the
        /// start): posts check it (its requests skip the quick checks), a
        /// prepared receive's region and slots must be aligned to it, a
        /// prepared send that the device writes into is refused (use
        /// `post_send`), and the flag is refused with a shared receive queue,
        /// whose receives do not know which QP will take them.
        const PCI_WRITE_END_PADDING = ffi::IBV_QP_CREATE_PCI_WRITE_END_PADDING;
        const _ = !0;
    }
}

/// Whether a QP of `qp_type` with `max_send_sge` send entries sends
/// without a UD destination or XRC SRQ and has a scatter entry for a
/// region: what the quick send check and prepared sends need.
pub(super) fn sends_plainly(qp_type: QpType, max_send_sge: u32) -> bool {
    !matches!(qp_type, QpType::Ud | QpType::XrcSend) && max_send_sge > 0
}

/// Builds a queue pair; see [`ProtectionDomain::qp_builder`].
///
/// ```no_run
/// # fn f(pd: &rdma::ProtectionDomain, cq: &rdma::CompletionQueue) -> rdma::Result<()> {
/// use rdma::QpType;
/// let qp = pd
///     .qp_builder(QpType::Rc, cq, cq)
///     .max_send_wr(64)
///     .max_recv_wr(64)
///     .max_inline_data(64)
///     .build()?;
/// println!("QP {:#x}", qp.qp_num());
/// # Ok(()) }
/// ```
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
            let qp = call_ptr(
                "ibv_create_qp_ex",
                || format!("{:?} QP with {:?}", self.qp_type, self.create_flags).into(),
                || {
                    // SAFETY: valid context, PD and CQs (kept alive by the QP).
                    unsafe { ffi::ibv_create_qp_ex(self.pd.context().as_raw(), &mut ex) }
                },
            );
            attr.cap = ex.cap;
            return qp.map_err(|e| self.create_error("ibv_create_qp_ex", e));
        }
        call_ptr(
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
            || {
                // SAFETY: valid PD and CQs of the same context (kept alive by
                // the QP).
                unsafe { ffi::ibv_create_qp(self.pd.as_raw(), attr) }
            },
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
        let qp = call_ptr(
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
            || {
                // SAFETY: valid context, PD and CQs (kept alive by the QP).
                unsafe { ffi::ibv_create_qp_ex(self.pd.context().as_raw(), &mut ex) }
            },
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
        if self.srq.is_some()
            && self
                .create_flags
                .contains(QpCreateFlags::PCI_WRITE_END_PADDING)
        {
            return Err(Error::InvalidArgument {
                verb: "ibv_create_qp_ex",
                reason: "PCI_WRITE_END_PADDING with a shared receive queue: the device would \
                         pad past the end of receives posted without knowing this QP takes them"
                    .into(),
            });
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
            (cap.max_send_wr, cap.max_recv_wr),
        );
        if let Some(srq) = &self.srq {
            srq.attach_cq(&self.recv_cq.inner);
        }
        // SAFETY: `q` is the extended view of the QP just created. (A
        // provider that left one of the calls every post needs unset gets
        // `ibv_post_send`, which every QP takes.)
        let extended = qpx.and_then(|q| unsafe { ExtendedQp::new(q) });
        let path = match extended {
            None => SendPath::Legacy,
            Some(x) if self.post_path == PostPath::Auto => SendPath::Mixed(x),
            Some(x) => SendPath::Extended(x),
        };
        let end_padding = self
            .create_flags
            .contains(QpCreateFlags::PCI_WRITE_END_PADDING);
        QueuePair {
            owned: OwnedQp {
                qp,
                owner,
                tracker,
                send_cq: self.send_cq.clone(),
                recv_cq: self.recv_cq.clone(),
                destroyed: false,
            },
            path,
            qp_type: self.qp_type,
            caps: QpCaps::from_raw(&cap),
            plain_sends: sends_plainly(self.qp_type, cap.max_send_sge) && !end_padding,
            plain_recvs: self.srq.is_none() && !end_padding,
            end_padding,
            max_msg: std::sync::atomic::AtomicU32::new(u32::MAX),
            srq: self.srq.clone(),
            pd: self.pd.clone(),
        }
    }
}
