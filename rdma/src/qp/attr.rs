//! QP attributes and state transitions (`ibv_modify_qp(3)`,
//! `ibv_query_qp(3)`), and what a RESET does to the requests in flight.

use std::fmt;

use super::{QpCaps, QpState, QpType, QueuePair};
use crate::ah::AhAttr;
use crate::error::{check_errno_ret, Error, Result};
use crate::mr::AccessFlags;
use crate::track::Pending;
use crate::wr::WrBuffers;
use crate::{ffi, Mtu};

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
///
/// ```no_run
/// # fn f(qp: &rdma::QueuePair, ctx: &rdma::Context, peer_qpn: u32) -> rdma::Result<()> {
/// use rdma::{AccessFlags, AhAttr, InitAttr, RtrAttr, RtsAttr};
/// // RESET -> INIT -> RTR -> RTS against a peer found by its GID (RoCE).
/// let mut init = InitAttr::new(1);
/// init.access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
/// qp.to_init(&init)?;
/// let gid = ctx.query_gid(1, 1)?; // (the peer's, in a real program)
/// let mtu = ctx.query_port(1)?.active_mtu;
/// qp.to_rtr(Some(&RtrAttr::new(AhAttr::global(1, gid, 1), mtu, peer_qpn, 0)))?;
/// qp.to_rts(&RtsAttr::new(0))?;
/// # Ok(()) }
/// ```
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

impl QueuePair {
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
        let mut all = self
            .owned
            .send_cq
            .inner
            .registry
            .reclaim(&self.owned.tracker, false);
        all.extend(
            self.owned
                .recv_cq
                .inner
                .registry
                .reclaim(&self.owned.tracker, true),
        );
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
            // 0: the port reports no limit.
            let limit = if limit == 0 { u32::MAX } else { limit };
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
    /// Not everywhere: soft-iWARP (siw, Linux 6.1) flushes the send queue it
    /// shares with its provider only at its own transitions (the socket's
    /// close, RTS to the error state), so a send posted after its
    /// connection closed, before the application saw the `DISCONNECTED`
    /// event, never completes (measured: 2 to 15 per connection, in
    /// `pair_faults::cm_rc_srq_peer_killed_mid_transfer_iwarp`).
    /// [`QueuePair::reset`] then gives their memory back.
    ///
    /// # Errors
    /// As [`QueuePair::modify`].
    pub fn to_error(&self) -> Result<()> {
        self.modify(QpAttr::new().state(QpState::Err))
    }
}
