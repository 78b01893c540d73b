//! Communication identifiers (`rdma_create_id(3)` and the calls on an id).
//!
//! The id itself (its owner, lifetime and teardown, its channel and
//! device) is here; the calls on an id are split by what they do:
//! - `locking`: which operations exclude librdmacm's event processing
//!   (`Access`, `Exposure`), and the librdmacm facts behind the rules;
//! - `resolve`: binding, resolving addresses and routes, reading them back;
//! - `connect`: listening, connecting, accepting, rejecting, disconnecting;
//! - `qp`: the id's QP, made by this crate or by librdmacm;
//! - `multicast`: joining and leaving groups;
//! - `options`: `rdma_set_option` and the ECE options.

mod connect;
mod locking;
mod multicast;
mod options;
mod private_data;
mod qp;
mod resolve;

use std::ffi::c_int;
use std::fmt;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::addr::CmAddr;
use super::channel::EventChannel;
use super::PortSpace;
use crate::error::{check_minus_one, Error, Result};
use crate::{ffi, Context, ProtectionDomain, QpType, QueuePairBuilder};

pub(crate) use locking::Access;
use locking::Exposure;
pub use multicast::McJoinFlags;
pub use options::CmOption;
pub(crate) use qp::cm_qp_owner;

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
pub(in crate::cm) unsafe fn owner(raw: *mut ffi::rdma_cm_id) -> Option<Arc<IdInner>> {
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
    pub(in crate::cm) ps: PortSpace,
    /// Made by `rdma_create_ep`: destroyed with `rdma_destroy_ep`.
    endpoint: bool,
    /// Events of this id handed out and not yet acknowledged.
    pub(in crate::cm) outstanding: AtomicUsize,
    /// What the processing of this id's events may still touch: whether an
    /// operation must exclude `rdma_get_cm_event` (the rules are in `locking`).
    pub(in crate::cm) exposure: Exposure,
    // Dropped after the id is destroyed (Drop runs first): the channel, the
    // listener and the QP template outlive the id.
    state: Mutex<IdState>,
}

// SAFETY: librdmacm ids may be used from any thread; this crate serialises
// every call on an id (and reads of its fields) with `state`, and keeps them
// apart from the event processing they could overlap with the channel's lock
// (the rules in `locking`).
unsafe impl Send for IdInner {}
// SAFETY: as above.
unsafe impl Sync for IdInner {}

impl IdInner {
    pub(in crate::cm) fn new(
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
        // Without the channel's lock (L5 in `locking`): rdma_destroy_id reads only
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

/// A communication identifier (`struct rdma_cm_id`): the connection
/// manager's socket.
///
/// # Examples
/// The active side of a connection, step by step (the [`blocking`] layer
/// does the same in one call): resolve the address and the route, make a
/// QP on the device the route goes through, connect.
///
/// [`blocking`]: crate::cm::blocking
///
/// ```no_run
/// use std::time::Duration;
/// use rdma::cm::{CmEventType, ConnParam, EventChannel, PortSpace};
/// use rdma::{QpState, QpType};
/// # fn main() -> rdma::Result<()> {
/// let t = Duration::from_secs(5);
/// let channel = EventChannel::new()?;
/// let id = channel.create_id(PortSpace::Tcp)?;
/// let dst: std::net::SocketAddr = "10.8.0.1:7471".parse().unwrap();
/// id.resolve_addr(None, dst, t)?;
/// drop(channel.wait_for(&id, &[CmEventType::AddrResolved], "resolve_addr", t)?);
/// id.resolve_route(t)?;
/// drop(channel.wait_for(&id, &[CmEventType::RouteResolved], "resolve_route", t)?);
/// // The id knows its device now.
/// let ctx = id.context()?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(64, None, 0)?;
/// let qp = pd.qp_builder(QpType::Rc, &cq, &cq).build()?;
/// id.modify_qp(&qp, QpState::Init)?; // post the first receives after this
/// id.connect_qp(&qp, &ConnParam::default())?;
/// let wanted = [CmEventType::ConnectResponse, CmEventType::Established];
/// let event = channel.wait_for(&id, &wanted, "connect", t)?;
/// if event.event_type() == CmEventType::ConnectResponse {
///     id.establish_qp(&qp)?;
/// }
/// drop(event);
/// // ... traffic on `qp` ...
/// id.disconnect()?;
/// # Ok(())
/// # }
/// ```
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

    /// Whether the id is bound to `ctx`'s device (librdmacm opens each
    /// device once, so the same device is the same verbs context).
    pub(crate) fn on_device(&self, ctx: &Context) -> bool {
        // SAFETY: the field is read under the id's locks.
        let verbs = self.with(Access::Stable, |raw, _| unsafe { (*raw).verbs });
        verbs == ctx.as_raw()
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
    /// On siw, the context also holds a 1 MiB CQ while any context of that
    /// device from this call lives (made when none does): rdma-core's siw
    /// provider refuses the object mapped at key `0x90000`, which would stop
    /// a process at about 48 connections, and the CQ covers that key.
    ///
    /// # Errors
    /// `EINVAL` before the id is bound to a device; [`Error::Verb`] naming
    /// `ibv_query_device`.
    pub fn context(&self) -> Result<Context> {
        let ctx = self.with(Access::Stable, |raw, _| {
            self.verbs(raw, "rdma_cm_id::verbs")
        })?;
        let id: Arc<dyn Send + Sync> = Arc::clone(&self.inner) as Arc<dyn Send + Sync>;
        // On siw, the context's key plug (`cm::key_plug`), held with the id.
        // SAFETY: the context stays open while the id holds its device; the
        // plug is held next to the id (`Keep`).
        let plug = unsafe {
            let name = Context::device_name_of(ctx);
            let attr = crate::context::borrowed_limits(ctx, &name)?;
            crate::cm::key_plug::plugged(ctx, &attr, &name)
        };
        let keep: Arc<dyn Send + Sync> = Arc::new(crate::cm::key_plug::Keep {
            _plug: plug,
            _id: id,
        });
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
}

impl fmt::Debug for CmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmId")
            .field("raw", &self.inner.raw)
            .field("ps", &self.inner.ps)
            .finish_non_exhaustive()
    }
}
