//! Shared receive queues (`ibv_create_srq(3)`, `ibv_modify_srq(3)`,
//! `ibv_post_srq_recv(3)`).

use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

use crate::cq::CqInner;
use crate::error::{check_errno_ret, check_ptr, Error, Result};
use crate::mr::AccessFlags;
use crate::track::{self, Tracker};
use crate::wc::WrBuffers;
use crate::wr::PostError;
use crate::{ffi, ProtectionDomain};

pub(crate) struct SrqInner {
    srq: NonNull<ffi::ibv_srq>,
    pub(crate) tracker: Arc<Tracker>,
    max_sge: u32,
    /// CQs whose registry knows this SRQ's tracker.
    cqs: Mutex<Vec<Weak<CqInner>>>,
    // Dropped after the SRQ is destroyed (field order).
    pd: ProtectionDomain,
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
            std::mem::forget(self.tracker.drain());
            return;
        }
        for cq in self.cqs.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            if let Some(cq) = cq.upgrade() {
                cq.registry.unregister(self.tracker.serial);
            }
        }
        // The device is done with the receive memory only now.
        drop(self.tracker.drain());
    }
}

/// A shared receive queue (`struct ibv_srq`): one pool of receive requests
/// for many QPs. A cheap `Clone` handle; QPs attached to it keep it alive.
#[derive(Clone)]
pub struct SharedReceiveQueue {
    pub(crate) inner: Arc<SrqInner>,
}

/// SRQ sizes (`struct ibv_srq_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqAttr {
    /// Queue depth.
    pub max_wr: u32,
    /// Scatter/gather entries per request.
    pub max_sge: u32,
    /// Limit: when fewer requests remain, `SRQ_LIMIT_REACHED` fires (0: off).
    pub srq_limit: u32,
}

impl ProtectionDomain {
    /// Creates a shared receive queue (`ibv_create_srq(3)`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] past the device's `max_srq_wr`/`max_srq_sge`;
    /// [`Error::Verb`] naming `ibv_create_srq`.
    pub fn create_srq(&self, attr: SrqAttr) -> Result<SharedReceiveQueue> {
        let dev = crate::DeviceAttr::from_limits(self.context().limits());
        if attr.max_wr == 0 || attr.max_wr > dev.max_srq_wr() || attr.max_sge > dev.max_srq_sge() {
            return Err(Error::InvalidArgument {
                verb: "ibv_create_srq",
                reason: format!(
                    "{attr:?} is outside the device's limits (max_srq_wr {}, max_srq_sge {})",
                    dev.max_srq_wr(),
                    dev.max_srq_sge()
                ),
            });
        }
        let mut init = ffi::ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: ffi::ibv_srq_attr {
                max_wr: attr.max_wr,
                max_sge: attr.max_sge,
                srq_limit: attr.srq_limit,
            },
        };
        // SAFETY: valid PD and init struct.
        let srq = unsafe { ffi::ibv_create_srq(self.as_raw(), &mut init) };
        let srq = check_ptr("ibv_create_srq", || format!("{attr:?}").into(), srq)?;
        Ok(SharedReceiveQueue {
            inner: Arc::new(SrqInner {
                srq,
                tracker: Tracker::new(),
                max_sge: init.attr.max_sge.max(attr.max_sge),
                cqs: Mutex::new(Vec::new()),
                pd: self.clone(),
            }),
        })
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
        cq.registry.register(&self.inner.tracker);
        self.inner
            .cqs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::downgrade(cq));
    }

    /// Receive requests posted and not completed yet.
    pub fn in_flight(&self) -> usize {
        self.inner.tracker.in_flight().1
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
        // SAFETY: `post_recvs` hands over a well-formed chain whose memory it
        // parks in the tracker; the SRQ is live.
        let (rc, unposted) = track::post_recvs(&self.inner.tracker, wrs, |chain, bad| unsafe {
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
