//! Communication identifiers (`rdma_create_id(3)` and the calls on an id).

use std::ffi::{c_int, c_void};
use std::fmt;
use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use super::addr::{from_sockaddr_storage, to_sockaddr, CmAddr};
use super::channel::EventChannel;
use super::event::{CmEvent, ConnParam};
use super::{from_sockaddr, timeout_ms, PortSpace};
use crate::error::{check_minus_one, Error, Result};
use crate::qp::QpOwner;
use crate::{
    ffi, AsyncEventType, Context, ProtectionDomain, QpAttr, QpState, QpType, QueuePair,
    QueuePairBuilder,
};

/// The owner of an id, which events name: its `context` holds a weak
/// reference to it ([`IdInner::new`]); `None` once the owner is being
/// dropped, or for an id without one.
///
/// This replaces a global map from id address to owner, whose first insert
/// and growth (a lock, hashing, reallocations) were most of what the first
/// ids of a process cost (cmtime's `create id` step).
///
/// # Safety
/// `raw` is a live id made or wrapped by this crate (or has a NULL
/// `context`), and the caller holds a reason for the id not to be freed
/// during the call (an unacknowledged event of it, for a reader).
unsafe fn owner(raw: *mut ffi::rdma_cm_id) -> Option<Arc<IdInner>> {
    // SAFETY: per the contract. `context` was written before any operation
    // on the id, so before the kernel could queue an event for it; the
    // reader that reads it got the event from the kernel after that (the
    // order librdmacm itself relies on for the id it hands the kernel).
    let owner = unsafe { (*raw).context }.cast::<IdInner>().cast_const();
    if owner.is_null() {
        return None;
    }
    // SAFETY: `owner` came from `Weak::into_raw` in IdInner::new, and that
    // weak reference is released only after the id is destroyed (Drop), so
    // it is still counted; ManuallyDrop leaves the count alone.
    let weak = ManuallyDrop::new(unsafe { Weak::from_raw(owner) });
    weak.upgrade()
}

// Locking
// =======
//
// Every operation on an id holds the id's own lock (`IdInner::state`), so the
// calls on one id never overlap. What is left is librdmacm's event
// processing: `rdma_get_cm_event` runs under the channel's lock
// (`EventChannel::try_get_event`) and, for some event types, reads or writes
// fields of the id it reports, which is known only when the call returns. An
// operation must exclude it (take the channel's lock) exactly when an event
// that conflicts with the operation may be processed while it runs.
//
// The facts this rests on, read in librdmacm/cma.c of rdma-core (the
// releases with ECE support, v31 on: rdma-core 44, which the crate is tested
// with, exports the same interface, RDMACM_1.3, and imports the ibv_set_ece
// and ibv_query_ece that its CONNECT_RESPONSE processing calls):
//
// L1. What `rdma_get_cm_event` does to the id an event reports, by type:
//     - ADDR_RESOLVED: writes the addresses (`route.addr`), `verbs`, `pd`,
//       `port_num`, P_Key and GIDs and takes a device reference
//       (ucma_query_addr + ucma_query_gid, or ucma_query_route, which also
//       allocates `route.path_rec`); a failure makes it ADDR_ERROR.
//     - ROUTE_RESOLVED: reads `verbs`; on InfiniBand/RoCE writes
//       `route.path_rec`/`num_paths` (ucma_query_path), or through
//       ucma_query_route the addresses too; a failure makes it ROUTE_ERROR.
//     - CONNECT_RESPONSE: with a librdmacm QP, reads `qp`, the local ECE
//       options, `cma_dev` and `port_num`, moves the QP to RTR and RTS (ERR
//       on failure), sends the RTU and writes the remote ECE vendor, the
//       local ECE options and, on failure (then CONNECT_ERROR),
//       `connect_error`; without a QP it writes the remote ECE options.
//     - REJECTED: reads `connect_error`; unless it is set, reads `qp` and
//       moves the QP to ERR. DISCONNECTED reads `connect_error`. With
//       `connect_error` set both are swallowed: acknowledged inside, touching
//       only the id's mutex and event counter.
//     - MULTICAST_JOIN: writes the group's entry (`mgid`, `mlid`) and
//       attaches the id's `qp` to the group; MULTICAST_ERROR reads the entry.
//     - CONNECT_REQUEST: makes and fills a new id before returning it
//       (librdmacm's id table has its own lock); of the listener it reads
//       `channel`, `context`, `ps`, `qp_type` and `sync`.
//     - Every other type (ADDR_ERROR, ROUTE_ERROR, CONNECT_ERROR, UNREACHABLE,
//       ESTABLISHED, DEVICE_REMOVAL, ADDR_CHANGE, TIMEWAIT_EXIT) reads only
//       `qp_type`, fixed at creation.
//     The processing also reads the id's handle and `channel`. State shared
//     between ids (device list, device PDs, id table) has librdmacm's own
//     locks: calls on ids of different channels always ran concurrently.
// L2. The calls: rdma_resolve_addr writes `route.addr.dst_addr` after the
//     kernel took the command, so possibly while its ADDR_RESOLVED is
//     processed. rdma_resolve_route reads `verbs` and the addresses before
//     its kernel command (or before rdma_set_option(RDMA_OPTION_IB_PATH),
//     after which the kernel queues ROUTE_RESOLVED) and no field of the id
//     after it. rdma_connect reads the local ECE options and writes the
//     READ/atomic depths before its kernel command, and after it only
//     `connect`/`connect_len` and `sync`. rdma_listen writes the
//     listener's addresses and device after its kernel command, none of
//     which the CONNECT_REQUEST processing reads. rdma_disconnect, rdma_notify,
//     rdma_reject(_ece), rdma_establish, rdma_set_option, rdma_init_qp_attr
//     and the address and port getters read only `verbs`, `qp`, the
//     addresses, `port_num`, the handle and `channel` (and move the QP with
//     ibv_modify_qp, which is thread-safe). rdma_create_qp(_ex) and
//     rdma_destroy_qp write `qp` (and `pd`, the local ECE options);
//     rdma_set_local_ece and rdma_get_remote_ece touch the ECE options;
//     rdma_leave_multicast reads the group's `mgid`/`mlid` and `qp`;
//     rdma_migrate_id writes `channel` and `sync`.
// L3. A call that fails started nothing: librdmacm fails before its kernel
//     command or because the kernel refused it, and the kernel queues the
//     event of a resolve, connect or join only for a command it took. (On an
//     asynchronous id, librdmacm's ucma_complete returns at once.)
// L4. Each rdma_resolve_addr the kernel took is answered by one
//     ADDR_RESOLVED or ADDR_ERROR, each rdma_resolve_route or IB_PATH option
//     by one ROUTE_RESOLVED or ROUTE_ERROR, never swallowed; or by none when
//     the kernel id changes state first (device removal): the count below
//     then stays up, which costs the lock, not soundness.
// L5. rdma_destroy_id reads the id's handle and `channel`, waits until every
//     event of the id the kernel reported is acknowledged, then frees it.
// L6. The connection events have no end this crate relies on: REJECTED may
//     come while the kernel's id is connecting or connected (on a passive id
//     before rdma_accept when the peer gives up; after ESTABLISHED when the
//     peer's CM sends a REJ), so an id that connected stays exposed to it.
//
// The rules (an id's `Exposure`, an operation's `Access`):
// R1. Reading an event holds the channel's lock around rdma_get_cm_event and
//     `wrap_event`, which lowers the id's `addr`/`route` count after
//     librdmacm processed the event, still under the lock.
// R2. An operation that starts such an event raises its count (`Start`)
//     while it holds the id's lock, before its call (so before the kernel can
//     queue the event), and lowers it again if the call fails (L3). Counts
//     rise only under the id's lock: an operation holding it sees them fall,
//     never rise.
// R3. An operation takes the channel's lock, deciding before it raises its
//     own count, when: it is `Exclusive` (rdma_resolve_addr, L2; multicast
//     joins and leaves); the id is `always` exposed (it joined a multicast
//     group, or migrated from synchronous, with unknown events queued); an
//     ADDR_/ROUTE_ event is pending (it writes what every call reads); or it
//     has `Conn` access and the id connected (CONNECT_RESPONSE and REJECTED
//     use `qp` and the ECE state, L1, L6). Otherwise (`Stable` access on a
//     connected id, anything on an idle one) it runs beside the reader.
// R4. Why that is enough: an operation that skips the lock read each count
//     at zero and each flag clear (Acquire). A zero is the reader's Release
//     decrement after the processing, or nothing was raised; either way every
//     processing that could conflict finished before the operation (through
//     the count) or cannot start during it (nothing pending, nothing raised
//     while it holds the id's lock, R2). The event the operation itself
//     starts may be processed during its call's tail: L2 says what each tail
//     touches, and the calls whose tail conflicts are `Exclusive`.
// R5. Synchronous ids have no channel: their events are processed inside
//     their own calls, under the id's lock. Destroying an id takes no channel
//     lock (L5). Migrating takes both channels' locks.

/// How an operation's librdmacm call relates to event processing (R3).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Touches only fields that connection events at most read (L2).
    Stable,
    /// Touches the QP, the ECE options or the addresses and device it sets
    /// up: excluded while connection events may come.
    Conn,
    /// Always under the channel's lock.
    Exclusive,
}

/// The event an operation starts (R2).
#[derive(Clone, Copy)]
enum Start {
    /// ADDR_RESOLVED or ADDR_ERROR.
    Addr,
    /// ROUTE_RESOLVED or ROUTE_ERROR.
    Route,
    /// The connection's events (L6).
    Connect,
    /// MULTICAST_JOIN or MULTICAST_ERROR, and later errors of the group.
    Multicast,
}

/// What the processing of an id's events may still touch (R1-R3).
#[derive(Default)]
struct Exposure {
    /// `rdma_resolve_addr` calls whose ADDR_RESOLVED/ADDR_ERROR has not been
    /// processed.
    addr: AtomicU32,
    /// `rdma_resolve_route` calls and IB_PATH options whose
    /// ROUTE_RESOLVED/ROUTE_ERROR has not been processed.
    route: AtomicU32,
    /// A connection was started, or the id came from a connect request.
    connected: AtomicBool,
    /// Every operation takes the channel's lock.
    always: AtomicBool,
}

impl Exposure {
    /// R3, for an operation of `access` on an asynchronous id.
    fn needs_lock(&self, access: Access) -> bool {
        access == Access::Exclusive
            || self.always.load(Ordering::Acquire)
            || self.addr.load(Ordering::Acquire) != 0
            || self.route.load(Ordering::Acquire) != 0
            || (access == Access::Conn && self.connected.load(Ordering::Acquire))
    }

    /// R2: raises what `start` exposes; returns the flag's previous value
    /// for [`Exposure::undo`].
    fn raise(&self, start: Start) -> bool {
        match start {
            Start::Addr => self.addr.fetch_add(1, Ordering::AcqRel) != 0,
            Start::Route => self.route.fetch_add(1, Ordering::AcqRel) != 0,
            Start::Connect => self.connected.swap(true, Ordering::AcqRel),
            Start::Multicast => self.always.swap(true, Ordering::AcqRel),
        }
    }

    /// Undoes [`Exposure::raise`] after a failed call, which started
    /// nothing (L3).
    fn undo(&self, start: Start, was: bool) {
        match start {
            Start::Addr => Self::lower(&self.addr),
            Start::Route => Self::lower(&self.route),
            Start::Connect if !was => self.connected.store(false, Ordering::Release),
            Start::Multicast if !was => self.always.store(false, Ordering::Release),
            Start::Connect | Start::Multicast => {}
        }
    }

    /// R1: librdmacm processed an event of type `event` for this id.
    fn processed(&self, event: u32) {
        match event {
            ffi::RDMA_CM_EVENT_ADDR_RESOLVED | ffi::RDMA_CM_EVENT_ADDR_ERROR => {
                Self::lower(&self.addr)
            }
            ffi::RDMA_CM_EVENT_ROUTE_RESOLVED | ffi::RDMA_CM_EVENT_ROUTE_ERROR => {
                Self::lower(&self.route)
            }
            _ => {}
        }
    }

    /// Lowers a count, never below zero (an unmatched event lowers nothing).
    fn lower(count: &AtomicU32) {
        let _ = count.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
}

pub(crate) struct IdState {
    /// The channel the id reports to; `None` for a synchronous id.
    channel: Option<EventChannel>,
    /// A synchronous id from `rdma_get_request`: the connect request is
    /// acknowledged (against the listener) only when it is accepted or
    /// destroyed, so the listener must outlive it until then.
    listener: Option<Arc<IdInner>>,
    /// librdmacm's PD for the id's device (`cm_id->pd` until a QP is made
    /// with another PD), once seen.
    default_pd: Option<usize>,
    /// `cm_id->pd` may name a caller's PD (a QP was made through the id).
    pd_changed: bool,
    /// A passive endpoint's QP template (`rdma_create_ep` with attributes):
    /// keeps the PD and CQs it names alive, and adopts the QPs
    /// `rdma_get_request` creates. Boxed: only passive endpoints have one,
    /// and every id's owner is allocated as the id is made (a smaller owner
    /// touches fewer fresh heap pages when many ids are made at once).
    ep_template: Option<Box<QueuePairBuilder>>,
}

pub(crate) struct IdInner {
    raw: NonNull<ffi::rdma_cm_id>,
    ps: PortSpace,
    /// Made by `rdma_create_ep`: destroyed with `rdma_destroy_ep`.
    endpoint: bool,
    /// Events of this id handed out and not yet acknowledged.
    outstanding: AtomicUsize,
    /// What the processing of this id's events may still touch: whether an
    /// operation must exclude `rdma_get_cm_event` (see "Locking" above).
    exposure: Exposure,
    // Dropped after the id is destroyed (Drop runs first): the channel, the
    // listener and the QP template outlive the id.
    state: Mutex<IdState>,
}

// SAFETY: librdmacm ids may be used from any thread; this crate serialises
// every call on an id (and reads of its fields) with `state`, and keeps them
// apart from the event processing they could overlap with the channel's lock
// ("Locking" above).
unsafe impl Send for IdInner {}
// SAFETY: as above.
unsafe impl Sync for IdInner {}

impl IdInner {
    fn new(
        raw: NonNull<ffi::rdma_cm_id>,
        ps: PortSpace,
        endpoint: bool,
        channel: Option<EventChannel>,
    ) -> Arc<IdInner> {
        let inner = Arc::new(IdInner {
            raw,
            ps,
            endpoint,
            outstanding: AtomicUsize::new(0),
            exposure: Exposure::default(),
            state: Mutex::new(IdState {
                channel,
                listener: None,
                default_pd: None,
                pd_changed: false,
                ep_template: None,
            }),
        });
        let weak = Weak::into_raw(Arc::downgrade(&inner));
        // SAFETY: the id is live and nothing reads its `context` yet: the
        // id is fresh (or, for a connect request, not handed out yet), so no
        // event of it can be read before an operation on it, which needs
        // the Arc returned here. librdmacm itself only copies a listener's
        // `context` into the ids of its connect requests, which get their
        // own here. The weak reference is released in Drop.
        unsafe { (*raw.as_ptr()).context = weak.cast_mut().cast() };
        inner
    }

    fn state(&self) -> MutexGuard<'_, IdState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for IdInner {
    fn drop(&mut self) {
        // SAFETY: the id is live; only IdInner::new writes `context`.
        let weak = unsafe { (*self.raw.as_ptr()).context }
            .cast::<IdInner>()
            .cast_const();
        // Without the channel's lock (L5 above): rdma_destroy_id reads only
        // the id's handle and channel before it waits for the id's reported
        // events to be acknowledged, and frees the id after that; an event
        // of this id that a reader is processing was reported, so it is
        // acknowledged (by `wrap_event`, whose `owner` finds no owner any
        // more) before the memory goes. rdma_destroy_ep also reads `qp` and
        // `srq`, NULL by now: every QP made through the id holds it.
        let destroyed = if self.endpoint {
            // SAFETY: every QP the id made holds an Arc to it (destroyed
            // already) and every event of it too (acknowledged already);
            // destroyed once.
            unsafe { ffi::rdma_destroy_ep(self.raw.as_ptr()) };
            // rdma_destroy_ep does not say whether the id went. A
            // synchronous one has no reader that could look at it again; a
            // migrated one might, so its weak reference stays (a leak of
            // this allocation, never a dangling `context`).
            let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
            state.channel.is_none()
        } else {
            // SAFETY: as above.
            let rc = unsafe { ffi::rdma_destroy_id(self.raw.as_ptr()) };
            if rc != 0 {
                let e = std::io::Error::last_os_error();
                crate::error::teardown_failed(format_args!("rdma_destroy_id failed: {e}"));
            }
            rc == 0
        };
        if destroyed {
            // SAFETY: the weak reference IdInner::new leaked into the id's
            // `context`, released once; nothing can read it any more. (The
            // allocation outlives this call: the strong references' own weak
            // count is released only after Drop.)
            drop(unsafe { Weak::from_raw(weak) });
        }
    }
}

/// Turns a fresh event into a [`CmEvent`] holding its ids, or acknowledges it
/// at once when its id is being destroyed (which waits for that). Lowers
/// the id's exposure for the event (R1).
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
        // A passive id is connecting from its birth (L6).
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

/// Multicast join flags (`enum rdma_cm_mc_join_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum McJoinFlags {
    /// Send and receive.
    FullMember,
    /// Send only: the QP is not attached to the group.
    SendOnlyFullMember,
}

/// Enhanced connection establishment options (`struct ibv_ece`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ece {
    /// The vendor (IEEE OUI).
    pub vendor_id: u32,
    /// Vendor-specific option bits.
    pub options: u32,
}

/// An option for [`CmId::set_option`] (`rdma_set_option(3)`).
#[derive(Clone, Copy)]
#[non_exhaustive]
pub enum CmOption<'a> {
    /// `RDMA_OPTION_ID_TOS`: the type of service (RFC 2474) of the
    /// connection's traffic; set before resolving the route.
    Tos(u8),
    /// `RDMA_OPTION_ID_REUSEADDR`: let the port be reused (set before
    /// binding).
    ReuseAddr(bool),
    /// `RDMA_OPTION_ID_AFONLY`: an IPv6 id does not accept IPv4 (set before
    /// binding).
    AfOnly(bool),
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`: the QP's ACK timeout exponent
    /// (4.096 µs × 2^timeout).
    AckTimeout(u8),
    /// `RDMA_OPTION_IB_PATH`: InfiniBand path records to use instead of
    /// resolving the route.
    IbPath(&'a [ffi::ibv_path_data]),
}

impl fmt::Debug for CmOption<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmOption::Tos(v) => write!(f, "Tos({v})"),
            CmOption::ReuseAddr(v) => write!(f, "ReuseAddr({v})"),
            CmOption::AfOnly(v) => write!(f, "AfOnly({v})"),
            CmOption::AckTimeout(v) => write!(f, "AckTimeout({v})"),
            CmOption::IbPath(p) => write!(f, "IbPath({} paths)", p.len()),
        }
    }
}

/// A communication identifier (`struct rdma_cm_id`): the connection
/// manager's socket.
///
/// A cheap `Clone` handle: the id is destroyed (`rdma_destroy_id(3)`) when
/// the last handle, the last event about it, the last QP it made and the last
/// borrowed context from it are gone.
#[derive(Clone)]
pub struct CmId {
    pub(crate) inner: Arc<IdInner>,
}

/// An address for an error's context; `AF_IB` ones say where they work
/// (measured on soft-RoCE: `rdma_bind_addr` of a GID fails with `ENODEV`,
/// `rdma_join_multicast` with the kernel's `ENOTSUPP`, 524; see the module
/// docs).
fn addr_context(addr: &CmAddr) -> String {
    match addr {
        CmAddr::Ib(_) => format!(
            "AF_IB address {addr} (AF_IB addresses are for InfiniBand ports: \
             RoCE and iWARP devices refuse them)"
        ),
        _ => addr.to_string(),
    }
}

fn verb(name: &'static str, ctx: impl FnOnce() -> String, rc: c_int) -> Result<()> {
    check_minus_one(name, || ctx().into(), rc).map(|_| ())
}

/// The limits of private data per message on InfiniBand/RoCE (`ib_cm.h`),
/// and the IP header the CM puts in front of a REQ outside the IB port space.
const IB_REQ: usize = 92;
const IB_REP: usize = 196;
const IB_REJ: usize = 148;
const IB_SIDR_REQ: usize = 216;
const IB_SIDR_REP: usize = 136;
const CMA_IP_HEADER: usize = 36;

#[derive(Clone, Copy)]
enum Message {
    Connect,
    Accept,
    Reject,
}

impl EventChannel {
    /// Creates an id that reports to this channel (`rdma_create_id(3)`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_create_id`.
    pub fn create_id(&self, ps: PortSpace) -> Result<CmId> {
        let mut raw: *mut ffi::rdma_cm_id = std::ptr::null_mut();
        // Without the channel's lock: rdma_create_id only reads the channel's
        // descriptor and touches no other id (librdmacm locks its own id
        // table; its event processing creates ids the same way for connect
        // requests).
        // SAFETY: valid channel and out-pointer.
        let rc = unsafe {
            ffi::rdma_create_id(self.as_raw(), &mut raw, std::ptr::null_mut(), ps.to_raw())
        };
        verb("rdma_create_id", || format!("{ps:?}"), rc)?;
        let raw =
            NonNull::new(raw).ok_or_else(|| Error::verb_errno("rdma_create_id", "", libc::EIO))?;
        Ok(CmId {
            inner: IdInner::new(raw, ps, false, Some(self.clone())),
        })
    }
}

impl CmId {
    /// Creates a synchronous id (`rdma_create_id(3)` with no channel): each
    /// call waits for its own event, and failures come back as errors.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_create_id`.
    pub fn create_sync(ps: PortSpace) -> Result<CmId> {
        let mut raw: *mut ffi::rdma_cm_id = std::ptr::null_mut();
        // SAFETY: NULL channel asks for a synchronous id; valid out-pointer.
        let rc = unsafe {
            ffi::rdma_create_id(
                std::ptr::null_mut(),
                &mut raw,
                std::ptr::null_mut(),
                ps.to_raw(),
            )
        };
        verb("rdma_create_id", || format!("synchronous {ps:?}"), rc)?;
        let raw =
            NonNull::new(raw).ok_or_else(|| Error::verb_errno("rdma_create_id", "", libc::EIO))?;
        Ok(CmId {
            inner: IdInner::new(raw, ps, false, None),
        })
    }

    /// Wraps an id made by `rdma_create_ep`.
    /// `with_pd`: the caller gave `rdma_create_ep` a PD (`cm_id->pd` is it).
    pub(crate) fn from_endpoint(raw: NonNull<ffi::rdma_cm_id>, with_pd: bool) -> CmId {
        // SAFETY: a live id.
        let ps = PortSpace::from_raw(unsafe { (*raw.as_ptr()).ps });
        let inner = IdInner::new(raw, ps, true, None);
        inner.state().pd_changed = with_pd;
        CmId { inner }
    }

    pub(crate) fn set_ep_template(&self, template: QueuePairBuilder) {
        self.inner.state().ep_template = Some(Box::new(template));
    }

    /// Runs `f` with the id's lock held, and its channel's lock when an
    /// operation of `access` needs it (R3).
    pub(crate) fn with<R>(
        &self,
        access: Access,
        f: impl FnOnce(*mut ffi::rdma_cm_id, &mut IdState) -> R,
    ) -> R {
        let mut state = self.inner.state();
        let channel = (state.channel.as_ref())
            .filter(|_| self.inner.exposure.needs_lock(access))
            .cloned();
        let _guard = channel.as_ref().map(|c| c.inner.lock());
        f(self.as_raw(), &mut state)
    }

    /// As [`CmId::with`], for a call that starts `start`'s event: raised
    /// before the call, lowered again when it fails (R2).
    fn start<T>(
        &self,
        start: Start,
        access: Access,
        f: impl FnOnce(*mut ffi::rdma_cm_id, &mut IdState) -> Result<T>,
    ) -> Result<T> {
        let mut state = self.inner.state();
        let exposure = &self.inner.exposure;
        // Decided before this call's own event is counted (R3).
        let channel = (state.channel.as_ref())
            .filter(|_| exposure.needs_lock(access))
            .cloned();
        let _guard = channel.as_ref().map(|c| c.inner.lock());
        // A synchronous id processes the event inside the call (R5).
        let raised = state.channel.is_some().then(|| exposure.raise(start));
        let r = f(self.as_raw(), &mut state);
        if let (Err(_), Some(was)) = (&r, raised) {
            exposure.undo(start, was);
        }
        r
    }

    /// The raw id, valid while this handle (or a clone) lives. Calls on it
    /// bypass the locking described in the module docs. Its `context`
    /// belongs to this crate (it names the id's owner for events): do not
    /// change it.
    pub fn as_raw(&self) -> *mut ffi::rdma_cm_id {
        self.inner.raw.as_ptr()
    }

    /// Whether `other` is a handle to the same id.
    pub fn same_id(&self, other: &CmId) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    pub(crate) fn event_acked(&self) {
        self.inner.outstanding.fetch_sub(1, Ordering::AcqRel);
    }

    /// The port space the id was created in.
    pub fn port_space(&self) -> PortSpace {
        self.inner.ps
    }

    /// The QP type connections of this id use (UD for UDP/IPoIB, else RC).
    pub fn qp_type(&self) -> QpType {
        // SAFETY: reads a field librdmacm sets at creation only.
        QpType::from_raw(unsafe { (*self.as_raw()).qp_type })
    }

    /// Whether the id is synchronous (no event channel).
    pub fn is_sync(&self) -> bool {
        self.inner.state().channel.is_none()
    }

    /// The channel the id reports to (`None` for a synchronous id).
    pub fn channel(&self) -> Option<EventChannel> {
        self.inner.state().channel.clone()
    }

    /// The port of the device the id is bound to (0 before binding).
    pub fn port_num(&self) -> u8 {
        // SAFETY: the field is read under the id's locks.
        self.with(Access::Stable, |raw, _| unsafe { (*raw).port_num })
    }

    fn verbs(
        &self,
        raw: *mut ffi::rdma_cm_id,
        verb: &'static str,
    ) -> Result<NonNull<ffi::ibv_context>> {
        // SAFETY: the caller holds the id's locks.
        NonNull::new(unsafe { (*raw).verbs }).ok_or_else(|| {
            Error::verb_errno(
                verb,
                "the id is not bound to a device yet (bind_addr or resolve_addr first, or it is not a connection request)",
                libc::EINVAL,
            )
        })
    }

    fn note_default_pd(raw: *mut ffi::rdma_cm_id, st: &mut IdState) {
        if st.default_pd.is_none() && !st.pd_changed {
            // SAFETY: read under the id's locks.
            let pd = unsafe { (*raw).pd };
            if !pd.is_null() {
                st.default_pd = Some(pd as usize);
            }
        }
    }

    /// The device the id is bound to, as a borrowed [`Context`]: librdmacm
    /// owns it, this crate never closes it, and it keeps the id alive.
    ///
    /// # Errors
    /// `EINVAL` before the id is bound to a device; [`Error::Verb`] naming
    /// `ibv_query_device`.
    pub fn context(&self) -> Result<Context> {
        let ctx = self.with(Access::Stable, |raw, _| {
            self.verbs(raw, "rdma_cm_id::verbs")
        })?;
        let keep: Arc<dyn Send + Sync> = Arc::clone(&self.inner) as Arc<dyn Send + Sync>;
        // SAFETY: the context stays open while the id holds its device,
        // i.e. while `keep` lives.
        unsafe { Context::borrowed(ctx, keep) }
    }

    /// librdmacm's protection domain for the id's device (`cm_id->pd`, what
    /// `rdma_reg_msgs` registers in): borrowed, never deallocated by us, and
    /// it keeps the id alive.
    ///
    /// # Errors
    /// As [`CmId::context`].
    pub fn pd(&self) -> Result<ProtectionDomain> {
        let ctx = self.context()?;
        let pd = self.with(Access::Stable, |raw, st| {
            Self::note_default_pd(raw, st);
            st.default_pd
        });
        let pd = NonNull::new(pd.unwrap_or(0) as *mut ffi::ibv_pd).ok_or_else(|| {
            Error::verb_errno(
                "rdma_cm_id::pd",
                "librdmacm's PD of the device is not known for this id (its QP was made with the caller's PD)",
                libc::EINVAL,
            )
        })?;
        // SAFETY: librdmacm's PD of the device lives while the id holds the
        // device, which the borrowed context guarantees.
        Ok(unsafe { ctx.borrowed_pd(pd) })
    }

    /// Binds the id to a local address (`rdma_bind_addr(3)`): a
    /// [`SocketAddr`] or a [`CmAddr`]; port 0 picks a free port
    /// ([`CmId::src_port`] reads it back).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a [`CmAddr::Unknown`]; [`Error::Verb`]
    /// naming `rdma_bind_addr` (`EADDRINUSE`, `EADDRNOTAVAIL`, `ENODEV` for
    /// an address without an RDMA device, and for an `AF_IB` address on a
    /// RoCE or iWARP device).
    pub fn bind_addr(&self, addr: impl Into<CmAddr>) -> Result<()> {
        let addr = addr.into();
        let (mut sa, _) = to_sockaddr("rdma_bind_addr", &addr)?;
        // SAFETY: valid id and address.
        let rc = self.with(Access::Conn, |raw, _| unsafe {
            ffi::rdma_bind_addr(raw, std::ptr::addr_of_mut!(sa).cast())
        });
        verb("rdma_bind_addr", || addr_context(&addr), rc)
    }

    /// Resolves `dst` (and binds to `src`, if given) to an RDMA address
    /// (`rdma_resolve_addr(3)`). Asynchronous ids get `ADDR_RESOLVED` or
    /// `ADDR_ERROR` within `timeout`; synchronous ids wait for it.
    ///
    /// `dst` is a [`SocketAddr`] or a [`CmAddr`]; `src` a [`CmAddr`]
    /// (`Some(addr.into())` for a [`SocketAddr`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a timeout that does not fit a C int or
    /// a [`CmAddr::Unknown`]; [`Error::Verb`] naming `rdma_resolve_addr`.
    pub fn resolve_addr(
        &self,
        src: Option<CmAddr>,
        dst: impl Into<CmAddr>,
        timeout: Duration,
    ) -> Result<()> {
        let dst = dst.into();
        let ms = timeout_ms("rdma_resolve_addr", timeout)?;
        let mut src_sa = src
            .map(|s| to_sockaddr("rdma_resolve_addr", &s).map(|(sa, _)| sa))
            .transpose()?;
        let (mut dst_sa, _) = to_sockaddr("rdma_resolve_addr", &dst)?;
        let src_ptr = src_sa
            .as_mut()
            .map_or(std::ptr::null_mut(), |s| std::ptr::addr_of_mut!(*s).cast());
        // Under the channel's lock: rdma_resolve_addr writes the id's
        // destination address after the kernel took the command, when the
        // ADDR_RESOLVED it starts may already be processed (which writes it
        // too).
        self.start(Start::Addr, Access::Exclusive, |raw, _| {
            // SAFETY: valid id and addresses.
            let rc = unsafe {
                ffi::rdma_resolve_addr(raw, src_ptr, std::ptr::addr_of_mut!(dst_sa).cast(), ms)
            };
            verb(
                "rdma_resolve_addr",
                || match src {
                    Some(s) => format!("{} -> {}", addr_context(&s), addr_context(&dst)),
                    None => format!("-> {}", addr_context(&dst)),
                },
                rc,
            )
        })
    }

    /// Resolves the route to the resolved address (`rdma_resolve_route(3)`):
    /// `ROUTE_RESOLVED` or `ROUTE_ERROR`.
    ///
    /// # Errors
    /// `EINVAL` before the address is resolved; [`Error::Verb`] naming
    /// `rdma_resolve_route`.
    pub fn resolve_route(&self, timeout: Duration) -> Result<()> {
        let ms = timeout_ms("rdma_resolve_route", timeout)?;
        // rdma_resolve_route touches nothing of the id once the kernel has
        // the command (or the path, through rdma_set_option), so the
        // processing of the ROUTE_RESOLVED it starts cannot overlap it.
        self.start(Start::Route, Access::Stable, |raw, _| {
            self.verbs(raw, "rdma_resolve_route")?;
            // SAFETY: a bound id (librdmacm reads its device).
            let rc = unsafe { ffi::rdma_resolve_route(raw, ms) };
            verb("rdma_resolve_route", || format!("timeout {timeout:?}"), rc)
        })
    }

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
                Some(template.finish(qp, None, attr.cap, Some(owner)))
            }
            _ => None,
        };
        Ok((id, qp))
    }

    fn check_private_data(
        &self,
        raw: *mut ffi::rdma_cm_id,
        data: &[u8],
        msg: Message,
        verb: &'static str,
    ) -> Result<()> {
        let too_long = |limit: usize, what: &str| Error::InvalidArgument {
            verb,
            reason: format!(
                "{} bytes of private data, but {what} carries at most {limit}",
                data.len()
            ),
        };
        if data.len() > 255 {
            return Err(too_long(255, "the connection manager's interface"));
        }
        // SAFETY: the caller holds the id's locks; the device outlives the id.
        let transport = unsafe {
            let verbs = (*raw).verbs;
            if verbs.is_null() {
                return Ok(());
            }
            (*(*verbs).device).transport_type
        };
        if transport != ffi::IBV_TRANSPORT_IB {
            return Ok(());
        }
        let header = if self.inner.ps == PortSpace::Ib {
            0
        } else {
            CMA_IP_HEADER
        };
        let datagram = self.inner.ps.is_datagram();
        let (limit, what) = match (msg, datagram) {
            (Message::Connect, false) => {
                (IB_REQ - header, "an InfiniBand/RoCE REQ in this port space")
            }
            (Message::Connect, true) => (
                IB_SIDR_REQ - header,
                "an InfiniBand/RoCE SIDR REQ in this port space",
            ),
            (Message::Accept, false) => (IB_REP, "an InfiniBand/RoCE REP"),
            (Message::Reject, false) => (IB_REJ, "an InfiniBand/RoCE REJ"),
            (_, true) => (IB_SIDR_REP, "an InfiniBand/RoCE SIDR REP"),
        };
        if data.len() > limit {
            return Err(too_long(limit, what));
        }
        Ok(())
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

    /// Moves the id (and its pending events) to `channel`, or makes it
    /// synchronous with `None` (`rdma_migrate_id(3)`).
    ///
    /// # Errors
    /// `EBUSY` while events of the id are held (librdmacm would wait for
    /// them forever); `EINVAL` making a synchronous id synchronous;
    /// [`Error::Verb`] naming `rdma_migrate_id`.
    pub fn migrate_id(&self, channel: Option<&EventChannel>) -> Result<()> {
        let mut state = self.inner.state();
        if let (Some(old), Some(new)) = (&state.channel, channel) {
            if old.same_channel(new) {
                return Ok(());
            }
        }
        let old = state.channel.clone();
        // Both channels' locks, in address order: rdma_migrate_id writes
        // `channel` and `sync`, which every event processing reads (L1),
        // and no reader of either channel wraps an event of the id
        // meanwhile, so the check below holds through the call.
        let mut chans: Vec<&EventChannel> = old.iter().chain(channel).collect();
        chans.sort_by_key(|c| Arc::as_ptr(&c.inner) as usize);
        let _guards: Vec<_> = chans.iter().map(|c| c.inner.lock()).collect();
        if self.inner.outstanding.load(Ordering::Acquire) != 0 {
            return Err(Error::verb_errno(
                "rdma_migrate_id",
                "events of the id are still held: drop them first",
                libc::EBUSY,
            ));
        }
        let new_raw = channel.map_or(std::ptr::null_mut(), EventChannel::as_raw);
        // SAFETY: valid id and channel (or NULL); no event of the id is held.
        let rc = unsafe { ffi::rdma_migrate_id(self.as_raw(), new_raw) };
        verb(
            "rdma_migrate_id",
            || {
                if channel.is_some() {
                    "to a channel".into()
                } else {
                    "to synchronous".into()
                }
            },
            rc,
        )?;
        if old.is_none() && channel.is_some() {
            // Which events of its synchronous past wait in the queue that
            // moved along is not known (any type of L1): every operation
            // takes the lock from now on (R3). The exposure of an
            // asynchronous id moves with it: its pending events do too.
            self.inner.exposure.always.store(true, Ordering::Release);
        }
        state.channel = channel.cloned();
        Ok(())
    }

    /// Sets an option (`rdma_set_option(3)`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_set_option` (`EINVAL` for an option the
    /// id's state does not allow, e.g. `AfOnly` after binding).
    pub fn set_option(&self, option: CmOption<'_>) -> Result<()> {
        let mut byte: u8 = 0;
        let mut int: c_int = 0;
        let (level, name, ptr, len): (u32, u32, *mut c_void, usize) = match option {
            CmOption::Tos(v) => {
                byte = v;
                (
                    ffi::RDMA_OPTION_ID,
                    ffi::RDMA_OPTION_ID_TOS,
                    std::ptr::addr_of_mut!(byte).cast(),
                    1,
                )
            }
            CmOption::AckTimeout(v) => {
                byte = v;
                (
                    ffi::RDMA_OPTION_ID,
                    ffi::RDMA_OPTION_ID_ACK_TIMEOUT,
                    std::ptr::addr_of_mut!(byte).cast(),
                    1,
                )
            }
            CmOption::ReuseAddr(v) | CmOption::AfOnly(v) => {
                int = c_int::from(v);
                let name = if matches!(option, CmOption::ReuseAddr(_)) {
                    ffi::RDMA_OPTION_ID_REUSEADDR
                } else {
                    ffi::RDMA_OPTION_ID_AFONLY
                };
                (
                    ffi::RDMA_OPTION_ID,
                    name,
                    std::ptr::addr_of_mut!(int).cast(),
                    std::mem::size_of::<c_int>(),
                )
            }
            CmOption::IbPath(paths) => (
                ffi::RDMA_OPTION_IB,
                ffi::RDMA_OPTION_IB_PATH,
                paths.as_ptr().cast_mut().cast(),
                std::mem::size_of_val(paths),
            ),
        };
        let call = |raw: *mut ffi::rdma_cm_id, _: &mut IdState| {
            // SAFETY: valid id; `ptr` points at `len` bytes alive for the
            // call (the kernel only reads them).
            let rc = unsafe { ffi::rdma_set_option(raw, level as c_int, name as c_int, ptr, len) };
            verb("rdma_set_option", || format!("{option:?}"), rc)
        };
        // Setting the path records resolves the route: the kernel queues a
        // ROUTE_RESOLVED, as for rdma_resolve_route. The other options only
        // reach the kernel.
        let r = if matches!(option, CmOption::IbPath(_)) {
            self.start(Start::Route, Access::Stable, call)
        } else {
            self.with(Access::Stable, call)
        };
        let _ = (byte, int);
        r
    }

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
                let rc = if legacy {
                    let mut attr = ffi::ibv_qp_init_attr {
                        qp_context: ex.qp_context,
                        send_cq: ex.send_cq,
                        recv_cq: ex.recv_cq,
                        srq: ex.srq,
                        cap: ex.cap,
                        qp_type: ex.qp_type,
                        sq_sig_all: ex.sq_sig_all,
                    };
                    // SAFETY: bound id; PD and CQs of its context, kept alive
                    // by the QueuePair.
                    let rc = unsafe { ffi::rdma_create_qp(raw, ex.pd, &mut attr) };
                    ex.cap = attr.cap;
                    rc
                } else {
                    // SAFETY: as above.
                    unsafe { ffi::rdma_create_qp_ex(raw, ex) }
                };
                verb(
                    name,
                    || {
                        let qp_type = QpType::from_raw(ex.qp_type);
                        if ex.comp_mask & ffi::IBV_QP_INIT_ATTR_CREATE_FLAGS == 0 {
                            format!("{qp_type:?} QP")
                        } else {
                            let flags = crate::QpCreateFlags::from_bits_retain(ex.create_flags);
                            format!("{qp_type:?} QP with create flags {flags:?}")
                        }
                    },
                    rc,
                )?;
                st.pd_changed = true;
                // SAFETY: set by the successful call above.
                NonNull::new(unsafe { (*raw).qp })
                    .ok_or_else(|| Error::verb_errno(name, "", libc::EIO))
            })
        };
        builder.build_with(&mut create, owner)
    }

    /// Joins a multicast group (`rdma_join_multicast(3)`); a
    /// `MULTICAST_JOIN` event with the group's address follows. A QP
    /// librdmacm made is attached to the group.
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_join_multicast`.
    pub fn join_multicast(&self, addr: impl Into<CmAddr>) -> Result<()> {
        let addr = addr.into();
        let (mut sa, _) = to_sockaddr("rdma_join_multicast", &addr)?;
        self.start(Start::Multicast, Access::Exclusive, |raw, _| {
            // SAFETY: valid id and address (copied by librdmacm).
            let rc = unsafe {
                ffi::rdma_join_multicast(
                    raw,
                    std::ptr::addr_of_mut!(sa).cast(),
                    std::ptr::null_mut(),
                )
            };
            verb("rdma_join_multicast", || addr_context(&addr), rc)
        })
    }

    /// Joins a multicast group with `flags` (`rdma_join_multicast_ex(3)`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_join_multicast_ex` (`EOPNOTSUPP`/`EINVAL`
    /// where the kernel lacks send-only joins).
    pub fn join_multicast_ex(&self, addr: impl Into<CmAddr>, flags: McJoinFlags) -> Result<()> {
        let addr = addr.into();
        let (mut sa, _) = to_sockaddr("rdma_join_multicast_ex", &addr)?;
        let mut attr = ffi::rdma_cm_join_mc_attr_ex {
            comp_mask: ffi::RDMA_CM_JOIN_MC_ATTR_ADDRESS | ffi::RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
            join_flags: match flags {
                McJoinFlags::FullMember => ffi::RDMA_MC_JOIN_FLAG_FULLMEMBER,
                McJoinFlags::SendOnlyFullMember => ffi::RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER,
            },
            addr: std::ptr::addr_of_mut!(sa).cast(),
        };
        self.start(Start::Multicast, Access::Exclusive, |raw, _| {
            // SAFETY: valid id; `attr` and the address live for the call.
            let rc = unsafe { ffi::rdma_join_multicast_ex(raw, &mut attr, std::ptr::null_mut()) };
            verb(
                "rdma_join_multicast_ex",
                || format!("{} {flags:?}", addr_context(&addr)),
                rc,
            )
        })
    }

    /// Leaves a multicast group (`rdma_leave_multicast(3)`).
    ///
    /// # Errors
    /// `EBUSY` while events of the id are held (librdmacm would wait for
    /// them forever); `EADDRNOTAVAIL` for a group not joined;
    /// [`Error::Verb`] naming `rdma_leave_multicast`.
    pub fn leave_multicast(&self, addr: impl Into<CmAddr>) -> Result<()> {
        let addr = addr.into();
        if self.inner.outstanding.load(Ordering::Acquire) != 0 {
            return Err(Error::verb_errno(
                "rdma_leave_multicast",
                "events of the id are still held: drop them first",
                libc::EBUSY,
            ));
        }
        let (mut sa, _) = to_sockaddr("rdma_leave_multicast", &addr)?;
        // SAFETY: valid id and address.
        let rc = self.with(Access::Exclusive, |raw, _| unsafe {
            ffi::rdma_leave_multicast(raw, std::ptr::addr_of_mut!(sa).cast())
        });
        verb("rdma_leave_multicast", || addr_context(&addr), rc)
    }

    /// The local port (`rdma_get_src_port(3)`), 0 if unbound.
    pub fn src_port(&self) -> u16 {
        // SAFETY: valid id, read under its locks.
        u16::from_be(self.with(Access::Stable, |raw, _| unsafe {
            ffi::rdma_get_src_port(raw)
        }))
    }

    /// The peer's port (`rdma_get_dst_port(3)`), 0 if unconnected.
    pub fn dst_port(&self) -> u16 {
        // SAFETY: valid id, read under its locks.
        u16::from_be(self.with(Access::Stable, |raw, _| unsafe {
            ffi::rdma_get_dst_port(raw)
        }))
    }

    /// The local IP address (`rdma_get_local_addr(3)`); `None` while
    /// unbound, and for an `AF_IB` address ([`CmId::local_cm_addr`] reads
    /// those).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the address lives in the id, read under its locks.
        self.with(Access::Stable, |raw, _| unsafe {
            from_sockaddr(ffi::rdma_get_local_addr(raw))
        })
    }

    /// The peer's IP address (`rdma_get_peer_addr(3)`); `None` while unset,
    /// and for an `AF_IB` address ([`CmId::peer_cm_addr`]).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as above.
        self.with(Access::Stable, |raw, _| unsafe {
            from_sockaddr(ffi::rdma_get_peer_addr(raw))
        })
    }

    /// The local address of any family (`rdma_get_local_addr(3)`); `None`
    /// while unbound.
    pub fn local_cm_addr(&self) -> Option<CmAddr> {
        // SAFETY: the address is a sockaddr_storage in the id, read under
        // its locks.
        self.with(Access::Stable, |raw, _| unsafe {
            from_sockaddr_storage(ffi::rdma_get_local_addr(raw))
        })
    }

    /// The peer's address of any family (`rdma_get_peer_addr(3)`); `None`
    /// while unset.
    pub fn peer_cm_addr(&self) -> Option<CmAddr> {
        // SAFETY: as above.
        self.with(Access::Stable, |raw, _| unsafe {
            from_sockaddr_storage(ffi::rdma_get_peer_addr(raw))
        })
    }

    /// Sets the ECE options this side proposes (`rdma_set_local_ece(3)`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_set_local_ece` (`EOPNOTSUPP` where the
    /// device has no ECE).
    pub fn set_local_ece(&self, ece: Ece) -> Result<()> {
        let mut raw_ece = ffi::ibv_ece {
            vendor_id: ece.vendor_id,
            options: ece.options,
            comp_mask: 0,
        };
        // SAFETY: valid id and struct.
        let rc = self.with(Access::Conn, |raw, _| unsafe {
            ffi::rdma_set_local_ece(raw, &mut raw_ece)
        });
        verb("rdma_set_local_ece", || format!("{ece:?}"), rc)
    }

    /// The ECE options the peer proposed (`rdma_get_remote_ece(3)`).
    ///
    /// # Errors
    /// [`Error::Verb`] naming `rdma_get_remote_ece`.
    pub fn remote_ece(&self) -> Result<Ece> {
        let mut e = ffi::ibv_ece::default();
        // SAFETY: valid id and out-struct.
        let rc = self.with(Access::Conn, |raw, _| unsafe {
            ffi::rdma_get_remote_ece(raw, &mut e)
        });
        verb("rdma_get_remote_ece", String::new, rc)?;
        Ok(Ece {
            vendor_id: e.vendor_id,
            options: e.options,
        })
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
    id: Arc<IdInner>,
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

impl fmt::Debug for CmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmId")
            .field("raw", &self.inner.raw)
            .field("ps", &self.inner.ps)
            .finish_non_exhaustive()
    }
}
