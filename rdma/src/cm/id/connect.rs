//! Connections: listening, connecting, accepting, rejecting, establishing
//! and disconnecting (`rdma_listen(3)`, `rdma_connect(3)`, `rdma_accept(3)`,
//! ...). The private data each message can carry is checked in
//! `private_data.rs`.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::locking::{Access, Start};
use super::private_data::Message;
use super::qp::CmQp;
use super::{verb, CmId, IdInner};
use crate::cm::param::ConnParam;
use crate::error::{Error, Result};
use crate::qp::QpOwner;
use crate::{ffi, AsyncEventType, QueuePair};

impl CmId {
    /// Listens for connection requests (`rdma_listen(3)`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_listen` (`EADDRINUSE`, ...).
    pub fn listen(&self, backlog: i32) -> Result<()> {
        // SAFETY: valid id.
        let rc = self.with(Access::Conn, |raw, _| unsafe {
            ffi::rdma_listen(raw, backlog)
        });
        verb("rdma_listen", || format!("backlog {backlog}"), rc)
    }

    /// Waits for the next connection request on a synchronous listener
    /// (`rdma_get_request(3)`). The new id is synchronous too. For a passive
    /// endpoint made with a QP template, librdmacm created the new id's QP:
    /// it comes back as a crate [`QueuePair`].
    ///
    /// # Errors
    /// `EINVAL` on an asynchronous listener (read `CONNECT_REQUEST` events
    /// instead); [`Error::Verb`] naming `rdma_get_request`.
    pub fn get_request(&self) -> Result<(CmId, Option<QueuePair>)> {
        let mut new: *mut ffi::rdma_cm_id = std::ptr::null_mut();
        let (rc, template) = self.with(Access::Conn, |raw, st| {
            // SAFETY: valid listener and out-pointer.
            (
                unsafe { ffi::rdma_get_request(raw, &mut new) },
                st.ep_template.as_deref().cloned(),
            )
        });
        verb("rdma_get_request", String::new, rc)?;
        let new = NonNull::new(new)
            .ok_or_else(|| Error::verb_errno("rdma_get_request", "", libc::EIO))?;
        let inner = IdInner::new(new, self.inner.ps, self.inner.endpoint, None);
        // Connecting from its birth (L6); synchronous until migrated.
        inner.exposure.connected.store(true, Ordering::Release);
        inner.state().listener = Some(Arc::clone(&self.inner));
        let id = CmId { inner };
        // SAFETY: the field is read under the new id's locks.
        let qp = id.with(Access::Stable, |raw, _| unsafe { (*raw).qp });
        let qp = match (NonNull::new(qp), template) {
            (Some(qp), Some(template)) => {
                let attr = template.checked_init_attr()?;
                let owner: Arc<dyn QpOwner> = Arc::new(CmQp {
                    id: Arc::clone(&id.inner),
                });
                let serial = crate::track::allocate_serial("rdma_get_request")?;
                Some(template.finish(qp, None, attr.cap, Some(owner), serial))
            }
            _ => None,
        };
        Ok((id, qp))
    }

    /// Connects (`rdma_connect(3)`): for RC, sends a connection request
    /// carrying `param` (whose `qp_num` names the QP, unless librdmacm made
    /// it); for UD, asks the peer for its QP number and Q_Key.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for private data longer than the transport
    /// carries; `EINVAL` before the route is resolved; [`Error::Verb`] naming
    /// `rdma_connect`.
    pub fn connect(&self, param: &ConnParam) -> Result<()> {
        // rdma_connect reads the id's ECE options before the kernel command
        // and, after it, only fields the CONNECT_RESPONSE processing leaves
        // alone (`connect`/`connect_len` of an endpoint, `sync`).
        self.start(Start::Connect, Access::Conn, |raw, _| {
            self.verbs(raw, "rdma_connect")?;
            self.check_private_data(raw, &param.private_data, Message::Connect, "rdma_connect")?;
            let mut p = param.to_raw()?;
            // SAFETY: a bound id; `p` points into `param`, alive for the call.
            let rc = unsafe { ffi::rdma_connect(raw, &mut p) };
            verb("rdma_connect", || format!("QP {}", param.qp_num), rc)
        })
    }

    /// Accepts a connection request (`rdma_accept(3)`) on the id a
    /// `CONNECT_REQUEST` event (or [`CmId::get_request`]) gave. `param.qp_num`
    /// names the QP unless librdmacm made it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for private data longer than the transport
    /// carries; `EINVAL` on an id that is not a connection request;
    /// [`Error::Verb`] naming `rdma_accept`.
    pub fn accept(&self, param: &ConnParam) -> Result<()> {
        let rc = self.with(Access::Conn, |raw, st| {
            self.verbs(raw, "rdma_accept")?;
            self.check_private_data(raw, &param.private_data, Message::Accept, "rdma_accept")?;
            let mut p = param.to_raw()?;
            // SAFETY: a bound id; `p` points into `param`.
            let rc = unsafe { ffi::rdma_accept(raw, &mut p) };
            if rc == 0 {
                // The request is acknowledged: the listener may go.
                st.listener = None;
            }
            Ok::<_, Error>(rc)
        })?;
        verb("rdma_accept", || format!("QP {}", param.qp_num), rc)
    }

    /// Rejects a connection request (`rdma_reject(3)`); the peer gets a
    /// `REJECTED` event carrying `private_data`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for private data longer than the transport
    /// carries; [`Error::Verb`] naming `rdma_reject`.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        self.reject_with("rdma_reject", private_data, false)
    }

    /// Rejects a connection request because of its ECE options
    /// (`rdma_reject_ece(3)`).
    ///
    /// # Errors
    /// As [`CmId::reject`], naming `rdma_reject_ece`.
    pub fn reject_ece(&self, private_data: &[u8]) -> Result<()> {
        self.reject_with("rdma_reject_ece", private_data, true)
    }

    fn reject_with(&self, name: &'static str, data: &[u8], ece: bool) -> Result<()> {
        let rc = self.with(Access::Stable, |raw, _| {
            self.check_private_data(raw, data, Message::Reject, name)?;
            let len = u8::try_from(data.len()).unwrap_or(u8::MAX);
            let p: *const c_void = if data.is_empty() {
                std::ptr::null()
            } else {
                data.as_ptr().cast()
            };
            // SAFETY: valid id; `data` outlives the call.
            Ok::<_, Error>(unsafe {
                if ece {
                    ffi::rdma_reject_ece(raw, p, len)
                } else {
                    ffi::rdma_reject(raw, p, len)
                }
            })
        })?;
        verb(name, || format!("{} bytes of private data", data.len()), rc)
    }

    /// Completes an active connection after `CONNECT_RESPONSE`, on an id
    /// without a librdmacm QP (`rdma_establish(3)`). See
    /// [`CmId::establish_qp`].
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_establish` (`EINVAL` when librdmacm made
    /// the QP).
    pub fn establish(&self) -> Result<()> {
        // SAFETY: valid id.
        let rc = self.with(Access::Stable, |raw, _| unsafe { ffi::rdma_establish(raw) });
        verb("rdma_establish", String::new, rc)
    }

    /// Disconnects (`rdma_disconnect(3)`): the QP librdmacm made goes to the
    /// error state; both sides get `DISCONNECTED`.
    ///
    /// A QP of this crate's own (connected with [`CmId::connect_qp`] or
    /// [`CmId::accept_qp`]) is left as it is: move it to the error state
    /// ([`QueuePair::to_error`](crate::QueuePair::to_error)) to flush what it
    /// still has queued. Until then its sends to a peer that is gone keep
    /// retrying, and on soft-RoCE a retry count of 7 (the
    /// [`ConnParam`](crate::cm::ConnParam) default) means retrying forever.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_disconnect` (`EINVAL` when not connected).
    pub fn disconnect(&self) -> Result<()> {
        // SAFETY: valid id; librdmacm checks that it has a device.
        let rc = self.with(Access::Stable, |raw, _| unsafe {
            ffi::rdma_disconnect(raw)
        });
        verb("rdma_disconnect", String::new, rc)
    }

    /// Tells the CM about a QP event it cannot see (`rdma_notify(3)`), e.g.
    /// `COMM_EST` on a QP that received before `ESTABLISHED`.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_notify`.
    pub fn notify(&self, event: AsyncEventType) -> Result<()> {
        // SAFETY: valid id.
        let rc = self.with(Access::Stable, |raw, _| unsafe {
            ffi::rdma_notify(raw, event.to_raw())
        });
        verb("rdma_notify", || event.to_string(), rc)
    }
}
