//! Connection manager events (`rdma_get_cm_event(3)`, `rdma_ack_cm_event(3)`):
//! reading them from an [`EventChannel`], what they carry, acknowledging them.

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::channel::EventChannel;
use super::id::{owner, CmId, IdInner};
use super::param::{bytes, ConnParam, UdParam};
use super::CmEventType;
use crate::error::{last_errno, Result};
use crate::{ffi, AhAttr, Error};

/// Reading events.
impl EventChannel {
    /// Waits for the next event (`rdma_get_cm_event(3)`).
    ///
    /// # Errors
    /// `EAGAIN` (see [`Error::errno`]) in non-blocking mode when nothing is
    /// pending; [`Error::Verb`] naming `rdma_get_cm_event` or `poll`.
    pub fn get_event(&self) -> Result<CmEvent> {
        loop {
            if let Some(event) = self.try_get_event()? {
                return Ok(event);
            }
            if self.is_nonblocking() {
                return Err(Error::verb_errno(
                    "rdma_get_cm_event",
                    "non-blocking channel, no event pending",
                    libc::EAGAIN,
                ));
            }
            self.wait_readable(None)?;
        }
    }

    /// Waits at most `timeout` for the next event; `Ok(None)` when none came.
    ///
    /// # Errors
    /// As [`EventChannel::get_event`].
    pub fn get_event_timeout(&self, timeout: Duration) -> Result<Option<CmEvent>> {
        // The clock is read only once there is something to wait for.
        let mut deadline = None;
        loop {
            if let Some(event) = self.try_get_event()? {
                return Ok(Some(event));
            }
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + timeout);
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.wait_readable(Some(left))?;
        }
    }

    /// Waits for an event of `id` (for a listener: a connect request to it)
    /// of one of `wanted` types, at most `timeout`; events of other ids on
    /// the channel are dropped (acknowledged).
    ///
    /// # Errors
    /// [`Error::CmEvent`] for another event of the id (a failure event,
    /// typically), `ETIMEDOUT` when none came in time, or the errors of
    /// [`EventChannel::get_event`].
    pub fn wait_for(
        &self,
        id: &CmId,
        wanted: &[CmEventType],
        operation: &'static str,
        timeout: Duration,
    ) -> Result<CmEvent> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(event) = self.get_event_timeout(left)? else {
                return Err(Error::verb_errno(
                    "rdma_get_cm_event",
                    format!("{operation}: none of {wanted:?} within {timeout:?}"),
                    libc::ETIMEDOUT,
                ));
            };
            // A connect request names the new id; it is about the listener.
            let about = event.listen_id().unwrap_or(event.id());
            if !about.same_id(id) {
                continue;
            }
            if wanted.contains(&event.event_type()) && event.status() == 0 {
                return Ok(event);
            }
            return Err(event.into_error(operation));
        }
    }

    /// Returns the next event if one is pending, without waiting.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_get_cm_event`; [`Error::Async`]
    /// (`EBUSY`) while an `rdma::aio::CmChannel` reads the channel (the two
    /// readers would take each other's events; the same for
    /// [`EventChannel::get_event`] and the other waits, which call this).
    pub fn try_get_event(&self) -> Result<Option<CmEvent>> {
        if self.inner.driven.load(Ordering::Acquire) {
            return Err(Error::Async {
                operation: "EventChannel::get_event",
                reason: "the event channel is driven by an rdma::aio::CmChannel: await \
                         its ids' events (rdma::aio::AsyncCmId) instead"
                    .into(),
                errno: libc::EBUSY,
            });
        }
        self.read_event()
    }

    /// [`EventChannel::try_get_event`] for the channel's driver.
    pub(crate) fn read_event(&self) -> Result<Option<CmEvent>> {
        loop {
            let outcome = {
                let _guard = self.inner.lock();
                let mut raw: *mut ffi::rdma_cm_event = std::ptr::null_mut();
                // SAFETY: valid channel (non-blocking descriptor) and out-pointer.
                let rc = unsafe { ffi::rdma_get_cm_event(self.as_raw(), &mut raw) };
                if rc < 0 {
                    let errno = last_errno();
                    if errno == libc::EAGAIN || errno == libc::EWOULDBLOCK {
                        return Ok(None);
                    }
                    return Err(Error::verb_errno("rdma_get_cm_event", "", errno));
                }
                match NonNull::new(raw) {
                    // SAFETY: a fresh event from rdma_get_cm_event on this
                    // channel, not acknowledged yet; the channel lock is held.
                    Some(raw) => unsafe { wrap_event(raw, self) },
                    None => None,
                }
            };
            if let Some(event) = outcome {
                if event.event_type() == CmEventType::DeviceRemoval {
                    // Outside the channel's lock: librdmacm takes only its
                    // own device lock here.
                    super::device::forget_removed_devices();
                }
                return Ok(Some(event));
            }
        }
    }
}

/// An event of the connection manager.
///
/// It holds its id (and, for a connect request, the listener) and is
/// acknowledged when dropped (`rdma_ack_cm_event(3)`); the id cannot be
/// destroyed before that, so drop events promptly. The parameters are copied
/// out when the event is read.
pub struct CmEvent {
    raw: NonNull<ffi::rdma_cm_event>,
    event: CmEventType,
    status: i32,
    conn: Option<ConnParam>,
    ud: Option<UdParam>,
    // Released after the acknowledgement (Drop runs first): the acknowledged
    // event no longer holds up their destruction.
    id: CmId,
    listen_id: Option<CmId>,
}

// SAFETY: the raw event is only acknowledged (once, in Drop), which librdmacm
// allows from any thread; everything else is owned data.
unsafe impl Send for CmEvent {}
// SAFETY: shared access only reads owned data.
unsafe impl Sync for CmEvent {}

impl CmEvent {
    /// # Safety
    /// `raw` is a fresh, unacknowledged event; `id` (and `listen_id`) are the
    /// ids it names, and the id's events are counted (`outstanding`).
    pub(crate) unsafe fn new(
        raw: NonNull<ffi::rdma_cm_event>,
        id: CmId,
        listen_id: Option<CmId>,
        datagram: bool,
    ) -> CmEvent {
        // SAFETY: a live event.
        let r = unsafe { raw.as_ref() };
        let event = CmEventType::from_raw(r.event);
        let multicast = matches!(
            event,
            CmEventType::MulticastJoin | CmEventType::MulticastError
        );
        let (conn, ud) = if multicast {
            // `private_data` of a multicast event is the join's context.
            // SAFETY: librdmacm filled the `ud` member for multicast events.
            let u = unsafe { &r.param.ud };
            (
                None,
                (event == CmEventType::MulticastJoin).then(|| UdParam {
                    private_data: Vec::new(),
                    ah_attr: AhAttr::from_raw(&u.ah_attr),
                    qp_num: u.qp_num,
                    qkey: u.qkey,
                }),
            )
        } else if datagram {
            // SAFETY: the `ud` member for UD ids; its private data lives in
            // the event.
            let u = unsafe { &r.param.ud };
            // SAFETY: the private data lives in the event.
            let private_data = unsafe { bytes(u.private_data, u.private_data_len) };
            (
                None,
                Some(UdParam {
                    private_data,
                    ah_attr: AhAttr::from_raw(&u.ah_attr),
                    qp_num: u.qp_num,
                    qkey: u.qkey,
                }),
            )
        } else {
            // SAFETY: the `conn` member for connected ids; its private data
            // lives in the event.
            (Some(unsafe { ConnParam::from_raw(&r.param.conn) }), None)
        };
        CmEvent {
            raw,
            event,
            status: r.status,
            conn,
            ud,
            id,
            listen_id,
        }
    }

    /// What happened.
    pub fn event_type(&self) -> CmEventType {
        self.event
    }

    /// The status: 0, a negated errno, or (for `REJECTED` on InfiniBand/RoCE)
    /// the CM's reject reason.
    pub fn status(&self) -> i32 {
        self.status
    }

    /// The id the event is about. For a connect request, the new connection:
    /// accept or reject it.
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// The listener, for a connect request.
    pub fn listen_id(&self) -> Option<&CmId> {
        self.listen_id.as_ref()
    }

    /// Connection parameters (events of connected port spaces).
    pub fn conn_param(&self) -> Option<&ConnParam> {
        self.conn.as_ref()
    }

    /// Datagram parameters (UDP/IPoIB events and multicast joins).
    pub fn ud_param(&self) -> Option<&UdParam> {
        self.ud.as_ref()
    }

    /// The private data the peer sent (empty if none).
    pub fn private_data(&self) -> &[u8] {
        match (&self.conn, &self.ud) {
            (Some(c), _) => &c.private_data,
            (_, Some(u)) => &u.private_data,
            _ => &[],
        }
    }

    /// The raw event, valid until this value is dropped.
    pub fn as_raw(&self) -> *mut ffi::rdma_cm_event {
        self.raw.as_ptr()
    }

    /// This event as the failure of `operation` ([`Error::CmEvent`]).
    pub fn into_error(self, operation: &'static str) -> Error {
        Error::CmEvent {
            operation,
            event: self.event,
            status: self.status,
            private_data: self.private_data().to_vec(),
        }
    }
}

/// Turns a fresh event into a [`CmEvent`] holding its ids, or acknowledges it
/// at once when its id is being destroyed (which waits for that). Lowers
/// the id's exposure for the event (R1 in `cm/id/locking.rs`).
///
/// # Safety
/// `raw` comes from `rdma_get_cm_event` on `channel`, is not acknowledged
/// yet, and the channel's lock is held.
pub(crate) unsafe fn wrap_event(
    raw: NonNull<ffi::rdma_cm_event>,
    channel: &EventChannel,
) -> Option<CmEvent> {
    // SAFETY: a live event.
    let r = unsafe { raw.as_ref() };
    // SAFETY: the event's id is live until the event is acknowledged.
    let datagram = unsafe { (*r.id).qp_type } == ffi::IBV_QPT_UD;
    if r.event == ffi::RDMA_CM_EVENT_CONNECT_REQUEST {
        // SAFETY: the listener is live until the request is acknowledged.
        let Some(listener) = (unsafe { owner(r.listen_id) }) else {
            // The listener is being destroyed: drop the request.
            // SAFETY: the new id belongs to nobody else yet; the event is
            // acknowledged once, after which the listener's destroy goes on.
            unsafe {
                ffi::rdma_destroy_id(r.id);
                ffi::rdma_ack_cm_event(raw.as_ptr());
            }
            return None;
        };
        // SAFETY: librdmacm made the new id for this request; it is ours now.
        let new_raw = unsafe { NonNull::new_unchecked(r.id) };
        let new = IdInner::new(new_raw, listener.ps, false, Some(channel.clone()));
        // A passive id is connecting from its birth (L6 in `cm/id/locking.rs`).
        new.exposure.connected.store(true, Ordering::Release);
        listener.outstanding.fetch_add(1, Ordering::AcqRel);
        // SAFETY: the request counts against the listener, which the event holds.
        return Some(unsafe {
            CmEvent::new(
                raw,
                CmId { inner: new },
                Some(CmId { inner: listener }),
                datagram,
            )
        });
    }
    // SAFETY: the id is live until the event is acknowledged.
    match unsafe { owner(r.id) } {
        Some(inner) => {
            inner.exposure.processed(r.event);
            inner.outstanding.fetch_add(1, Ordering::AcqRel);
            // SAFETY: the event counts against its id, which it holds.
            Some(unsafe { CmEvent::new(raw, CmId { inner }, None, datagram) })
        }
        None => {
            // The id is being destroyed and waits for this acknowledgement.
            // SAFETY: acknowledged exactly once.
            unsafe { ffi::rdma_ack_cm_event(raw.as_ptr()) };
            None
        }
    }
}

impl Drop for CmEvent {
    fn drop(&mut self) {
        // SAFETY: an event from rdma_get_cm_event, acknowledged exactly once;
        // the ids it names are still alive (fields drop after this).
        let rc = unsafe { ffi::rdma_ack_cm_event(self.raw.as_ptr()) };
        if rc != 0 {
            crate::error::teardown_failed(format_args!("rdma_ack_cm_event failed: rc {rc}"));
        }
        let counted = self.listen_id.as_ref().unwrap_or(&self.id);
        counted.event_acked();
    }
}

impl fmt::Debug for CmEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmEvent")
            .field("event", &self.event)
            .field("status", &self.status)
            .field("id", &self.id)
            .field("listen_id", &self.listen_id)
            .field("conn", &self.conn)
            .field("ud", &self.ud)
            .finish()
    }
}
