//! Connection manager events (`rdma_get_cm_event(3)`, `rdma_ack_cm_event(3)`).

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use super::channel::EventChannel;
use super::id::{owner, CmId, IdInner};
use super::CmEventType;
use crate::{ffi, AhAttr, Error};

/// Connection parameters (`struct rdma_conn_param`): what
/// [`CmId::connect`] and [`CmId::accept`] send, and what a connect request,
/// response or established event carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data for the peer. Its room depends on the transport and port
    /// space: an InfiniBand/RoCE REQ carries 56 bytes in the TCP and UDP port
    /// spaces (92 in the IB port space), a REP 196, a REJ 148; iWARP and the
    /// C interface's `uint8_t` length cap everything at 255.
    pub private_data: Vec<u8>,
    /// Outstanding RDMA READ/atomics the peer may send us (255: the
    /// device's maximum).
    pub responder_resources: u8,
    /// Outstanding RDMA READ/atomics we may send (255: the device's maximum).
    pub initiator_depth: u8,
    /// Hardware flow control.
    pub flow_control: u8,
    /// Transport retries (ignored when accepting). Soft-RoCE takes 7 as
    /// "retry forever", like the RNR count (measured on Linux 6.1: sends
    /// across a cut link stayed pending; with 6 they failed with
    /// `RetryExcErr`), so a connection that must notice a dead peer or link
    /// on rxe asks for at most 6.
    pub retry_count: u8,
    /// RNR retries (7: infinite).
    pub rnr_retry_count: u8,
    /// The QP uses an SRQ (set from the QP by the `_qp` helpers).
    pub srq: bool,
    /// The QP number (set from the QP by the `_qp` helpers).
    pub qp_num: u32,
}

impl Default for ConnParam {
    /// No private data, the device's maximum READ/atomic depths, 7 retries,
    /// infinite RNR retries.
    fn default() -> Self {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: ffi::RDMA_MAX_RESP_RES as u8,
            initiator_depth: ffi::RDMA_MAX_INIT_DEPTH as u8,
            flow_control: 0,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            qp_num: 0,
        }
    }
}

impl ConnParam {
    /// The defaults, with `private_data`.
    pub fn with_private_data(data: &[u8]) -> Self {
        ConnParam {
            private_data: data.to_vec(),
            ..Self::default()
        }
    }

    /// The C struct; it points into `self.private_data`.
    pub(crate) fn to_raw(&self) -> crate::Result<ffi::rdma_conn_param> {
        let len = u8::try_from(self.private_data.len()).map_err(|_| Error::InvalidArgument {
            verb: "rdma_connect",
            reason: format!(
                "{} bytes of private data: the connection manager carries at most 255",
                self.private_data.len()
            ),
        })?;
        Ok(ffi::rdma_conn_param {
            private_data: if len == 0 {
                std::ptr::null()
            } else {
                self.private_data.as_ptr().cast()
            },
            private_data_len: len,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: self.flow_control,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: u8::from(self.srq),
            qp_num: self.qp_num,
        })
    }

    /// # Safety
    /// `raw.private_data` points at `private_data_len` readable bytes (or the
    /// length is 0).
    pub(crate) unsafe fn from_raw(raw: &ffi::rdma_conn_param) -> Self {
        ConnParam {
            // SAFETY: per the contract.
            private_data: unsafe { bytes(raw.private_data, raw.private_data_len) },
            responder_resources: raw.responder_resources,
            initiator_depth: raw.initiator_depth,
            flow_control: raw.flow_control,
            retry_count: raw.retry_count,
            rnr_retry_count: raw.rnr_retry_count,
            srq: raw.srq != 0,
            qp_num: raw.qp_num,
        }
    }
}

/// # Safety
/// `p` points at `len` readable bytes, or `len` is 0.
unsafe fn bytes(p: *const std::ffi::c_void, len: u8) -> Vec<u8> {
    if p.is_null() || len == 0 {
        return Vec::new();
    }
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts(p.cast::<u8>(), usize::from(len)) }.to_vec()
}

/// Datagram parameters (`struct rdma_ud_param`) of a UDP/IPoIB port space
/// event or a multicast join: where to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdParam {
    /// Private data (none for multicast events).
    pub private_data: Vec<u8>,
    /// The address to build an address handle from.
    pub ah_attr: AhAttr,
    /// The remote QP number (`0xffffff` for a multicast group).
    pub qp_num: u32,
    /// The remote Q_Key.
    pub qkey: u32,
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
