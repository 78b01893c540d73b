//! Shared receive queues (`ibv_create_srq(3)`, `ibv_create_srq_ex(3)`,
//! `ibv_modify_srq(3)`, `ibv_get_srq_num(3)`, `ibv_post_srq_recv(3)`).

use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

use crate::cq::CqInner;
use crate::error::{call_ptr, check_errno_ret, Error, Result};
use crate::mr::AccessFlags;
use crate::track::{Serial, SrqTracker, Tracked};
use crate::wr::PostError;
use crate::wr::WrBuffers;
use crate::xrcd::XrcdInner;
use crate::{ffi, CompletionQueue, ProtectionDomain, XrcDomain};

pub(crate) struct SrqInner {
    srq: NonNull<ffi::ibv_srq>,
    pub(crate) tracker: Arc<SrqTracker>,
    max_sge: u32,
    /// CQs whose registry knows this SRQ's tracker.
    cqs: Mutex<Vec<Weak<CqInner>>>,
    // Dropped after the SRQ is destroyed (Drop runs first).
    pd: ProtectionDomain,
    /// For an XRC SRQ: its XRC domain and completion queue.
    xrc: Option<(Arc<XrcdInner>, CompletionQueue)>,
}

// SAFETY: SRQ verbs are thread-safe; the tracker and CQ list are Mutexed.
unsafe impl Send for SrqInner {}
// SAFETY: as above.
unsafe impl Sync for SrqInner {}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // SAFETY: every QP attached to the SRQ holds an Arc to it, so none is
        // left; destroyed once.
        let rc = unsafe { ffi::ibv_destroy_srq(self.srq.as_ptr()) };
        if rc != 0 {
            crate::error::teardown_failed(format_args!(
                "ibv_destroy_srq failed: errno {rc}; leaking its receive memory"
            ));
            // The device may still use the memory: never free it (the
            // tracker, which owns it, is never dropped).
            std::mem::forget(Arc::clone(&self.tracker));
            return;
        }
        for cq in self.cqs.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            if let Some(cq) = cq.upgrade() {
                cq.registry.unregister(self.tracker.serial());
            }
        }
        // The device is done with the receive memory only now.
        drop(self.tracker.drain());
    }
}

/// A shared receive queue (`struct ibv_srq`): one pool of receive requests
/// for many QPs. A cheap `Clone` handle; QPs attached to it keep it alive.
///
/// # Examples
/// Two QPs take their receives from one pool; a receive's memory comes back
/// on the CQ of the QP that consumed it.
///
/// ```no_run
/// use rdma::{AccessFlags, PostError, QpType, SrqAttr};
/// # fn main() -> rdma::Result<()> {
/// let ctx = rdma::Context::open("rxe0")?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(256, None, 0)?;
/// let srq = pd.create_srq(SrqAttr { max_wr: 128, max_sge: 1, srq_limit: 0 })?;
/// for i in 0..64 {
///     let buf = pd.alloc_mr(1024, AccessFlags::LOCAL_WRITE)?;
///     srq.post_recv(i, buf).map_err(PostError::drop_buffers)?;
/// }
/// let a = pd.qp_builder(QpType::Rc, &cq, &cq).srq(&srq).build()?;
/// let b = pd.qp_builder(QpType::Rc, &cq, &cq).srq(&srq).build()?;
/// // ... connect `a` and `b` to their peers; then each receive completion
/// // names its QP (`qp_num`) and gives its memory back.
/// let mut done = Vec::new();
/// cq.poll(&mut done, 16)?;
/// for mut c in done {
///     let from = if c.qp_num == a.qp_num() { "a" } else { "b" };
///     let buf = c.take_buffers().into_one();
///     println!("{} bytes for {from}", c.byte_len);
///     # drop(buf);
/// }
/// # drop(b);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SharedReceiveQueue {
    pub(crate) inner: Arc<SrqInner>,
}

/// SRQ sizes (`struct ibv_srq_attr`).
///
/// ```no_run
/// # fn f(pd: &rdma::ProtectionDomain) -> rdma::Result<()> {
/// let srq = pd.create_srq(rdma::SrqAttr {
///     max_wr: 256,
///     max_sge: 1,
///     srq_limit: 0,
/// })?;
/// # let _ = srq;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqAttr {
    /// Queue depth.
    pub max_wr: u32,
    /// Scatter/gather entries per request.
    pub max_sge: u32,
    /// Limit: when fewer requests remain, `SRQ_LIMIT_REACHED` fires (0: off).
    pub srq_limit: u32,
}

/// The kind of SRQ [`ProtectionDomain::create_srq_ex`] creates
/// (`enum ibv_srq_type` with the objects each kind needs).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum SrqType<'a> {
    /// A plain SRQ (`IBV_SRQT_BASIC`), as [`ProtectionDomain::create_srq`].
    Basic,
    /// An XRC SRQ (`IBV_SRQT_XRC`): receives for XRC target QPs of `xrcd`,
    /// whose completions go to `cq`.
    Xrc {
        /// The XRC domain.
        xrcd: &'a XrcDomain,
        /// Where the receive completions go.
        cq: &'a CompletionQueue,
    },
}

impl ProtectionDomain {
    fn check_srq_attr(&self, verb: &'static str, attr: SrqAttr) -> Result<()> {
        let dev = crate::DeviceAttr::from_limits(self.context().limits());
        if attr.max_wr == 0 || attr.max_wr > dev.max_srq_wr() || attr.max_sge > dev.max_srq_sge() {
            return Err(Error::InvalidArgument {
                verb,
                reason: format!(
                    "{attr:?} is outside the device's limits (max_srq_wr {}, max_srq_sge {})",
                    dev.max_srq_wr(),
                    dev.max_srq_sge()
                ),
            });
        }
        Ok(())
    }

    fn wrap_srq(
        &self,
        srq: NonNull<ffi::ibv_srq>,
        attr: SrqAttr,
        granted: &ffi::ibv_srq_attr,
        xrc: Option<(Arc<XrcdInner>, CompletionQueue)>,
        serial: Serial,
    ) -> SharedReceiveQueue {
        let srq = SharedReceiveQueue {
            inner: Arc::new(SrqInner {
                srq,
                tracker: SrqTracker::new(serial),
                max_sge: granted.max_sge.max(attr.max_sge),
                cqs: Mutex::new(Vec::new()),
                pd: self.clone(),
                xrc,
            }),
        };
        if let Some((_, cq)) = &srq.inner.xrc {
            // An XRC SRQ reports its receive completions to its own CQ.
            srq.attach_cq(&cq.inner);
        }
        srq
    }

    /// Creates a shared receive queue (`ibv_create_srq(3)`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] past the device's `max_srq_wr`/`max_srq_sge`;
    /// [`Error::Verb`] naming `ibv_create_srq`.
    pub fn create_srq(&self, attr: SrqAttr) -> Result<SharedReceiveQueue> {
        self.check_srq_attr("ibv_create_srq", attr)?;
        let serial = crate::track::allocate_serial("ibv_create_srq")?;
        let mut init = ffi::ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: ffi::ibv_srq_attr {
                max_wr: attr.max_wr,
                max_sge: attr.max_sge,
                srq_limit: attr.srq_limit,
            },
        };
        let srq = call_ptr(
            "ibv_create_srq",
            || format!("{attr:?}").into(),
            || {
                // SAFETY: valid PD and init struct.
                unsafe { ffi::ibv_create_srq(self.as_raw(), &mut init) }
            },
        )?;
        Ok(self.wrap_srq(srq, attr, &init.attr, None, serial))
    }

    /// Creates a shared receive queue of the given kind in this PD
    /// (`ibv_create_srq_ex(3)`). An XRC SRQ keeps its XRC domain and CQ
    /// alive; its receive requests are posted like any SRQ's and come back
    /// with the completions polled from its CQ.
    ///
    /// # Errors
    /// - [`Error::InvalidArgument`] past the device's
    ///   `max_srq_wr`/`max_srq_sge`, or for an XRC domain or CQ of another
    ///   context than the PD's;
    /// - [`Error::Unsupported`] when the provider lacks the kind
    ///   (`EOPNOTSUPP`);
    /// - [`Error::Verb`] naming `ibv_create_srq_ex`.
    pub fn create_srq_ex(
        &self,
        attr: SrqAttr,
        srq_type: SrqType<'_>,
    ) -> Result<SharedReceiveQueue> {
        const VERB: &str = "ibv_create_srq_ex";
        self.check_srq_attr(VERB, attr)?;
        let serial = crate::track::allocate_serial(VERB)?;
        let ctx = self.context();
        let mut init = ffi::ibv_srq_init_attr_ex {
            attr: ffi::ibv_srq_attr {
                max_wr: attr.max_wr,
                max_sge: attr.max_sge,
                srq_limit: attr.srq_limit,
            },
            comp_mask: ffi::IBV_SRQ_INIT_ATTR_TYPE | ffi::IBV_SRQ_INIT_ATTR_PD,
            srq_type: ffi::IBV_SRQT_BASIC,
            pd: self.as_raw(),
            ..Default::default()
        };
        let mut xrc = None;
        if let SrqType::Xrc { xrcd, cq } = srq_type {
            for (what, other) in [("XRC domain", xrcd.context()), ("CQ", cq.context())] {
                if other.as_raw() != ctx.as_raw() {
                    return Err(Error::InvalidArgument {
                        verb: VERB,
                        reason: format!(
                            "the {what} belongs to another context ({}) than the PD ({})",
                            other.name(),
                            ctx.name()
                        ),
                    });
                }
            }
            init.srq_type = ffi::IBV_SRQT_XRC;
            init.comp_mask |= ffi::IBV_SRQ_INIT_ATTR_XRCD | ffi::IBV_SRQ_INIT_ATTR_CQ;
            init.xrcd = xrcd.as_raw();
            init.cq = cq.as_raw();
            xrc = Some((Arc::clone(&xrcd.inner), cq.clone()));
        }
        let srq = call_ptr(
            VERB,
            || format!("{srq_type:?} SRQ, {attr:?}").into(),
            || {
                // SAFETY: valid context; the PD, XRC domain and CQ belong to it
                // (checked) and the SRQ keeps them alive.
                unsafe { ffi::ibv_create_srq_ex(ctx.as_raw(), &mut init) }
            },
        )
        .map_err(|e| {
            e.unsupported_if_not_implemented(format!("{srq_type:?} SRQs ({VERB})"), ctx.name())
        })?;
        Ok(self.wrap_srq(srq, attr, &init.attr, xrc, serial))
    }
}

impl SharedReceiveQueue {
    /// The raw SRQ, valid while this handle lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_srq {
        self.inner.srq.as_ptr()
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }

    pub(crate) fn attach_cq(&self, cq: &Arc<CqInner>) {
        cq.registry
            .register(Tracked::Srq(Arc::clone(&self.inner.tracker)));
        let mut cqs = self.inner.cqs.lock().unwrap_or_else(|p| p.into_inner());
        // Once per CQ, however many of its QPs share this SRQ.
        let cq_weak = Arc::downgrade(cq);
        if !cqs.iter().any(|w| w.ptr_eq(&cq_weak)) {
            cqs.push(cq_weak);
        }
    }

    /// Receive requests posted and not completed yet.
    pub fn in_flight(&self) -> usize {
        self.inner.tracker.in_flight()
    }

    /// The SRQ number a remote XRC initiator names to reach this XRC SRQ
    /// (`ibv_get_srq_num(3)`).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the provider has no SRQ numbers
    /// (`EOPNOTSUPP`: every SRQ of soft-RoCE and soft-iWARP, which have no
    /// XRC); [`Error::Verb`] naming `ibv_get_srq_num`.
    pub fn get_srq_num(&self) -> Result<u32> {
        let mut num = 0u32;
        // SAFETY: valid SRQ and out-value.
        let rc = unsafe { ffi::ibv_get_srq_num(self.as_raw(), &mut num) };
        if rc == libc::EOPNOTSUPP || rc == libc::ENOSYS {
            return Err(Error::Unsupported {
                what: "SRQ numbers (ibv_get_srq_num)".into(),
                device: self.pd().context().name().to_string(),
                source: Some(std::io::Error::from_raw_os_error(rc)),
            });
        }
        check_errno_ret("ibv_get_srq_num", || "".into(), rc)?;
        Ok(num)
    }

    /// Current attributes (`ibv_query_srq(3)`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_query_srq`.
    pub fn query(&self) -> Result<SrqAttr> {
        let mut a = ffi::ibv_srq_attr::default();
        // SAFETY: valid SRQ and out-struct.
        let rc = unsafe { ffi::ibv_query_srq(self.as_raw(), &mut a) };
        check_errno_ret("ibv_query_srq", || "".into(), rc)?;
        Ok(SrqAttr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        })
    }

    /// Arms the limit: when fewer than `limit` requests remain, the context's
    /// async events report `SRQ_LIMIT_REACHED` once (`ibv_modify_srq(3)`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `ibv_modify_srq`.
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        let mut a = ffi::ibv_srq_attr {
            srq_limit: limit,
            ..Default::default()
        };
        // SAFETY: valid SRQ and attribute struct.
        let rc = unsafe {
            ffi::ibv_modify_srq(self.as_raw(), &mut a, ffi::IBV_SRQ_LIMIT as std::ffi::c_int)
        };
        check_errno_ret("ibv_modify_srq", || format!("limit {limit}").into(), rc)
    }

    /// Resizes the queue (`ibv_modify_srq(3)` with `IBV_SRQ_MAX_WR`).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the device cannot resize SRQs;
    /// [`Error::Verb`] naming `ibv_modify_srq`.
    pub fn resize(&self, max_wr: u32) -> Result<()> {
        let mut a = ffi::ibv_srq_attr {
            max_wr,
            ..Default::default()
        };
        // SAFETY: valid SRQ and attribute struct.
        let rc = unsafe {
            ffi::ibv_modify_srq(
                self.as_raw(),
                &mut a,
                ffi::IBV_SRQ_MAX_WR as std::ffi::c_int,
            )
        };
        if rc == libc::EOPNOTSUPP || rc == libc::ENOSYS {
            return Err(Error::Unsupported {
                what: "SRQ resize".into(),
                device: self.pd().context().name().to_string(),
                source: Some(std::io::Error::from_raw_os_error(rc)),
            });
        }
        check_errno_ret("ibv_modify_srq", || format!("max_wr {max_wr}").into(), rc)
    }

    /// Posts one receive request (`ibv_post_srq_recv(3)`).
    ///
    /// # Errors
    /// As [`SharedReceiveQueue::post_recv_batch`].
    pub fn post_recv(
        &self,
        wr_id: u64,
        buffers: impl Into<WrBuffers>,
    ) -> std::result::Result<(), PostError> {
        self.post_recv_batch(std::iter::once((wr_id, buffers.into())))
    }

    /// Posts several receive requests with one doorbell. Their memory comes
    /// back with the receive completions, on the CQ of whichever QP consumed
    /// them.
    ///
    /// # Errors
    /// The error and the memory of the requests not posted:
    /// [`Error::InvalidArgument`] (too many SGEs, wrong PD, no `LOCAL_WRITE`),
    /// [`Error::Verb`] naming `ibv_post_srq_recv` (`ENOMEM`: full).
    pub fn post_recv_batch(
        &self,
        wrs: impl IntoIterator<Item = (u64, WrBuffers)>,
    ) -> std::result::Result<(), PostError> {
        let wrs: Vec<(u64, WrBuffers)> = wrs.into_iter().collect();
        for (_, b) in &wrs {
            let mut reason = None;
            if b.len() > self.inner.max_sge as usize {
                reason = Some(format!(
                    "{} scatter/gather entries, but the SRQ allows {}",
                    b.len(),
                    self.inner.max_sge
                ));
            }
            if b.is_shared() {
                reason = Some(crate::wr::SHARED_IS_READ_ONLY.into());
            }
            if let (None, crate::WrBuffers::Device(d)) = (&reason, b) {
                reason = crate::wr::check_device_slice(d, &self.inner.pd, true).err();
            }
            b.for_each(|m| {
                if reason.is_none() && !Arc::ptr_eq(&m.pd().inner, &self.inner.pd.inner) {
                    reason = Some("a memory region belongs to another protection domain".into());
                } else if reason.is_none() && !m.access().contains(AccessFlags::LOCAL_WRITE) {
                    reason = Some(format!("a receive region lacks LOCAL_WRITE ({m:?})"));
                }
            });
            if let Some(reason) = reason {
                return Err(PostError {
                    error: Error::InvalidArgument {
                        verb: "ibv_post_srq_recv",
                        reason,
                    },
                    returned: wrs,
                });
            }
        }
        let srq = self.as_raw();
        // SAFETY: the tracker hands over a well-formed chain whose memory it
        // has parked; the SRQ is live.
        let (rc, unposted) = self.inner.tracker.post(wrs, |chain, bad| unsafe {
            ffi::ibv_post_srq_recv(srq, chain, bad)
        });
        if rc == 0 {
            return Ok(());
        }
        let n = unposted.len();
        Err(PostError {
            error: Error::verb_errno(
                "ibv_post_srq_recv",
                format!("{n} requests not posted"),
                if rc < 0 { -rc } else { rc },
            ),
            returned: unposted,
        })
    }
}

impl fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedReceiveQueue")
            .field("srq", &self.inner.srq)
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

impl crate::AsyncEvent {
    /// True when the event is about `srq`.
    pub fn is_srq(&self, srq: &SharedReceiveQueue) -> bool {
        self.element == crate::AsyncEventElement::Srq(srq.as_raw() as usize)
    }
}
