//! The id's QP: one this crate made, moved through its states with the
//! CM's attributes (`rdma_init_qp_attr(3)`), or one librdmacm makes
//! (`rdma_create_qp(3)`) and destroys with `rdma_destroy_qp` before the id.

use std::ffi::c_int;
use std::ptr::NonNull;
use std::sync::Arc;

use super::locking::Access;
use super::private_data::Message;
use super::{verb, CmId, IdInner};
use crate::cm::param::ConnParam;
use crate::error::{call_minus_one, Error, Result};
use crate::qp::QpOwner;
use crate::{ffi, QpAttr, QpState, QpType, QueuePair, QueuePairBuilder};

impl CmId {
    /// The attributes to move a QP of this id to `state`
    /// (`rdma_init_qp_attr(3)`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_init_qp_attr` (`EINVAL` when the id is
    /// not far enough along for that state).
    pub fn init_qp_attr(&self, state: QpState) -> Result<QpAttr> {
        let (raw, mask) = self.init_qp_attr_raw(state)?;
        Ok(QpAttr::from_raw(raw, mask))
    }

    fn init_qp_attr_raw(&self, state: QpState) -> Result<(ffi::ibv_qp_attr, u32)> {
        let mut attr = ffi::ibv_qp_attr {
            qp_state: state.to_raw(),
            ..Default::default()
        };
        let mut mask: c_int = 0;
        // SAFETY: valid id and out-pointers.
        let rc = self.with(Access::Stable, |raw, _| unsafe {
            ffi::rdma_init_qp_attr(raw, &mut attr, &mut mask)
        });
        verb("rdma_init_qp_attr", || format!("{state:?}"), rc)?;
        Ok((attr, mask as u32))
    }

    /// Moves `qp` to `state` with the attributes the CM gives
    /// ([`CmId::init_qp_attr`] + [`QueuePair::modify`]).
    ///
    /// # Errors
    /// As [`CmId::init_qp_attr`] and [`QueuePair::modify`].
    pub fn modify_qp(&self, qp: &QueuePair, state: QpState) -> Result<()> {
        qp.modify(&self.init_qp_attr(state)?)
    }

    /// Connects with a QP this crate made (`ibv_create_qp`): moves it to INIT
    /// if it is in RESET, and sends `param` with its QP number.
    ///
    /// After `CONNECT_RESPONSE` (InfiniBand/RoCE), call
    /// [`CmId::establish_qp`]; on iWARP the next event is `ESTABLISHED`.
    ///
    /// # Errors
    /// As [`CmId::modify_qp`] and [`CmId::connect`].
    pub fn connect_qp(&self, qp: &QueuePair, param: &ConnParam) -> Result<()> {
        if qp.state()? == QpState::Reset {
            self.modify_qp(qp, QpState::Init)?;
        }
        let mut p = param.clone();
        p.qp_num = qp.qp_num();
        p.srq = qp.srq().is_some();
        self.connect(&p)
    }

    /// After `CONNECT_RESPONSE`: INIT again (the response brings the remote
    /// access rights), RTR, RTS, then [`CmId::establish`].
    ///
    /// # Errors
    /// As [`CmId::modify_qp`] and [`CmId::establish`].
    pub fn establish_qp(&self, qp: &QueuePair) -> Result<()> {
        self.modify_qp(qp, QpState::Init)?;
        self.modify_qp(qp, QpState::Rtr)?;
        self.modify_qp(qp, QpState::Rts)?;
        self.establish()
    }

    /// Accepts a connection request with a QP this crate made: a UD QP is
    /// made ready ([`CmId::ready_ud_qp`]); an RC QP goes through INIT, RTR
    /// and RTS with the CM's attributes (and `param`'s READ/atomic depths
    /// unless they are 255), then [`CmId::accept`] sends its number.
    ///
    /// # Errors
    /// As [`CmId::modify_qp`] and [`CmId::accept`].
    pub fn accept_qp(&self, qp: &QueuePair, param: &ConnParam) -> Result<()> {
        {
            // Fail early, before touching the QP, when accept cannot work.
            let r: Result<()> = self.with(Access::Conn, |raw, _| {
                self.verbs(raw, "rdma_accept")?;
                self.check_private_data(raw, &param.private_data, Message::Accept, "rdma_accept")
            });
            r?;
        }
        if qp.qp_type() == QpType::Ud {
            self.ready_ud_qp(qp)?;
        } else {
            self.modify_qp(qp, QpState::Init)?;
            let (mut rtr, mask) = self.init_qp_attr_raw(QpState::Rtr)?;
            if param.responder_resources != ffi::RDMA_MAX_RESP_RES as u8 {
                rtr.max_dest_rd_atomic = param.responder_resources;
            }
            qp.modify(&QpAttr::from_raw(rtr, mask))?;
            let (mut rts, mask) = self.init_qp_attr_raw(QpState::Rts)?;
            if param.initiator_depth != ffi::RDMA_MAX_INIT_DEPTH as u8 {
                rts.max_rd_atomic = param.initiator_depth;
            }
            qp.modify(&QpAttr::from_raw(rts, mask))?;
        }
        let mut p = param.clone();
        p.qp_num = qp.qp_num();
        p.srq = qp.srq().is_some();
        self.accept(&p)
    }

    /// Makes a UD QP ready to send and receive: INIT with the CM's P_Key,
    /// port and Q_Key, then RTR, then RTS with send PSN 0.
    ///
    /// # Errors
    /// As [`CmId::modify_qp`].
    pub fn ready_ud_qp(&self, qp: &QueuePair) -> Result<()> {
        self.modify_qp(qp, QpState::Init)?;
        let mut a = QpAttr::new();
        a.state(QpState::Rtr);
        qp.modify(&a)?;
        let mut a = QpAttr::new();
        a.state(QpState::Rts).sq_psn(0);
        qp.modify(&a)
    }

    /// Has librdmacm create the id's QP (`rdma_create_qp(3)`, the legacy post
    /// path) from `builder`, whose PD must be on the id's context
    /// ([`CmId::context`], [`CmId::pd`]). librdmacm moves it to INIT now and
    /// through RTR/RTS on connect/accept. It is a crate [`QueuePair`] (safe
    /// posting) that keeps the id alive and is destroyed with
    /// `rdma_destroy_qp` before the id.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the PD is on another context; `EINVAL`
    /// when the id already has a QP or no device; [`Error::Verb`] naming
    /// `rdma_create_qp`.
    pub fn create_qp(&self, builder: &QueuePairBuilder) -> Result<QueuePair> {
        let mut b = builder.clone();
        b.post_path(crate::PostPath::Legacy);
        self.create_qp_with(&b)
    }

    /// As [`CmId::create_qp`], through `rdma_create_qp_ex(3)` with the send
    /// operations of the builder's post path (the extended `ibv_wr_*` path
    /// where the provider has it).
    ///
    /// # Errors
    /// As [`CmId::create_qp`], naming `rdma_create_qp_ex`.
    pub fn create_qp_ex(&self, builder: &QueuePairBuilder) -> Result<QueuePair> {
        self.create_qp_with(builder)
    }

    fn create_qp_with(&self, builder: &QueuePairBuilder) -> Result<QueuePair> {
        let owner: Arc<dyn QpOwner> = Arc::new(CmQp {
            id: Arc::clone(&self.inner),
        });
        let mut create = |ex: &mut ffi::ibv_qp_init_attr_ex| -> Result<NonNull<ffi::ibv_qp>> {
            self.with(Access::Conn, |raw, st| {
                let verbs = self.verbs(raw, "rdma_create_qp")?;
                Self::note_default_pd(raw, st);
                // SAFETY: the builder's PD is alive; fields read under the
                // id's locks.
                let (pd_ctx, has_qp) = unsafe { ((*ex.pd).context, !(*raw).qp.is_null()) };
                if pd_ctx != verbs.as_ptr() {
                    return Err(Error::InvalidArgument {
                        verb: "rdma_create_qp",
                        reason: "the PD belongs to another device context than the id's; \
                                 build it on CmId::context() or use CmId::pd()"
                            .into(),
                    });
                }
                if has_qp {
                    return Err(Error::verb_errno(
                        "rdma_create_qp",
                        "the id already has a QP",
                        libc::EINVAL,
                    ));
                }
                // `rdma_create_qp` takes neither send operations nor create
                // flags.
                let legacy = ex.comp_mask
                    & (ffi::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | ffi::IBV_QP_INIT_ATTR_CREATE_FLAGS)
                    == 0;
                let name = if legacy {
                    "rdma_create_qp"
                } else {
                    "rdma_create_qp_ex"
                };
                let what = {
                    let qp_type = QpType::from_raw(ex.qp_type);
                    if ex.comp_mask & ffi::IBV_QP_INIT_ATTR_CREATE_FLAGS == 0 {
                        format!("{qp_type:?} QP")
                    } else {
                        let flags = crate::QpCreateFlags::from_bits_retain(ex.create_flags);
                        format!("{qp_type:?} QP with create flags {flags:?}")
                    }
                };
                // errno is cleared first: librdmacm returns -1 with the
                // provider's errno, which it may have left unset (siw).
                call_minus_one(
                    name,
                    || what.into(),
                    || {
                        if legacy {
                            let mut attr = ffi::ibv_qp_init_attr {
                                qp_context: ex.qp_context,
                                send_cq: ex.send_cq,
                                recv_cq: ex.recv_cq,
                                srq: ex.srq,
                                cap: ex.cap,
                                qp_type: ex.qp_type,
                                sq_sig_all: ex.sq_sig_all,
                            };
                            // SAFETY: bound id; PD and CQs of its context,
                            // kept alive by the QueuePair.
                            let rc = unsafe { ffi::rdma_create_qp(raw, ex.pd, &mut attr) };
                            ex.cap = attr.cap;
                            rc
                        } else {
                            // SAFETY: as above.
                            unsafe { ffi::rdma_create_qp_ex(raw, ex) }
                        }
                    },
                )?;
                st.pd_changed = true;
                // SAFETY: set by the successful call above.
                NonNull::new(unsafe { (*raw).qp })
                    .ok_or_else(|| Error::verb_errno(name, "", libc::EIO))
            })
        };
        builder.build_with(&mut create, owner)
    }

    /// The QP librdmacm made for the id, if any (`cm_id->qp`).
    pub fn raw_qp(&self) -> *mut ffi::ibv_qp {
        // SAFETY: read under the id's locks.
        self.with(Access::Stable, |raw, _| unsafe { (*raw).qp })
    }
}

pub(crate) fn cm_qp_owner(id: &CmId) -> CmQp {
    CmQp {
        id: Arc::clone(&id.inner),
    }
}

/// Destroys a QP librdmacm made for an id, with `rdma_destroy_qp`, before
/// the id (which this value keeps alive).
pub(crate) struct CmQp {
    pub(super) id: Arc<IdInner>,
}

impl QpOwner for CmQp {
    fn destroy_qp(&self, qp: *mut ffi::ibv_qp) -> c_int {
        let id = CmId {
            inner: Arc::clone(&self.id),
        };
        id.with(Access::Conn, |raw, _| {
            // SAFETY: read under the id's locks.
            if unsafe { (*raw).qp } != qp {
                crate::error::teardown_failed(format_args!(
                    "rdma_destroy_qp: the id no longer holds this QP; leaking it"
                ));
                return libc::EINVAL;
            }
            // SAFETY: the id's own QP (made by rdma_create_qp), destroyed
            // once; the QueuePair releases its memory only after this.
            unsafe { ffi::rdma_destroy_qp(raw) };
            0
        })
    }
}
