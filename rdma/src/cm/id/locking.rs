//! Locking: when an operation on an id excludes librdmacm's event
//! processing ([`Access`], [`Exposure`]), and the librdmacm facts that
//! decide it.
//!
//! Every operation on an id holds the id's own lock (`IdInner::state`), so the
//! calls on one id never overlap. What is left is librdmacm's event
//! processing: `rdma_get_cm_event` runs under the channel's lock
//! (`EventChannel::try_get_event`) and, for some event types, reads or writes
//! fields of the id it reports, which is known only when the call returns. An
//! operation must exclude it (take the channel's lock) exactly when an event
//! that conflicts with the operation may be processed while it runs.
//!
//! The facts this rests on, read in librdmacm/cma.c of rdma-core (the
//! releases with ECE support, v31 on: rdma-core 44, which the crate is tested
//! with, exports the same interface, RDMACM_1.3, and imports the ibv_set_ece
//! and ibv_query_ece that its CONNECT_RESPONSE processing calls):
//!
//! L1. What `rdma_get_cm_event` does to the id an event reports, by type:
//!     - ADDR_RESOLVED: writes the addresses (`route.addr`), `verbs`, `pd`,
//!       `port_num`, P_Key and GIDs and takes a device reference
//!       (ucma_query_addr + ucma_query_gid, or ucma_query_route, which also
//!       allocates `route.path_rec`); a failure makes it ADDR_ERROR.
//!     - ROUTE_RESOLVED: reads `verbs`; on InfiniBand/RoCE writes
//!       `route.path_rec`/`num_paths` (ucma_query_path), or through
//!       ucma_query_route the addresses too; a failure makes it ROUTE_ERROR.
//!     - CONNECT_RESPONSE: with a librdmacm QP, reads `qp`, the local ECE
//!       options, `cma_dev` and `port_num`, moves the QP to RTR and RTS (ERR
//!       on failure), sends the RTU and writes the remote ECE vendor, the
//!       local ECE options and, on failure (then CONNECT_ERROR),
//!       `connect_error`; without a QP it writes the remote ECE options.
//!     - REJECTED: reads `connect_error`; unless it is set, reads `qp` and
//!       moves the QP to ERR. DISCONNECTED reads `connect_error`. With
//!       `connect_error` set both are swallowed: acknowledged inside, touching
//!       only the id's mutex and event counter.
//!     - MULTICAST_JOIN: writes the group's entry (`mgid`, `mlid`) and
//!       attaches the id's `qp` to the group; MULTICAST_ERROR reads the entry.
//!     - CONNECT_REQUEST: makes and fills a new id before returning it
//!       (librdmacm's id table has its own lock); of the listener it reads
//!       `channel`, `context`, `ps`, `qp_type` and `sync`.
//!     - Every other type (ADDR_ERROR, ROUTE_ERROR, CONNECT_ERROR, UNREACHABLE,
//!       ESTABLISHED, DEVICE_REMOVAL, ADDR_CHANGE, TIMEWAIT_EXIT) reads only
//!       `qp_type`, fixed at creation.
//!     The processing also reads the id's handle and `channel`. State shared
//!     between ids (device list, device PDs, id table) has librdmacm's own
//!     locks: calls on ids of different channels always ran concurrently.
//! L2. The calls: rdma_resolve_addr writes `route.addr.dst_addr` after the
//!     kernel took the command, so possibly while its ADDR_RESOLVED is
//!     processed. rdma_resolve_route reads `verbs` and the addresses before
//!     its kernel command (or before rdma_set_option(RDMA_OPTION_IB_PATH),
//!     after which the kernel queues ROUTE_RESOLVED) and no field of the id
//!     after it. rdma_connect reads the local ECE options and writes the
//!     READ/atomic depths before its kernel command, and after it only
//!     `connect`/`connect_len` and `sync`. rdma_listen writes the
//!     listener's addresses and device after its kernel command, none of
//!     which the CONNECT_REQUEST processing reads. rdma_disconnect, rdma_notify,
//!     rdma_reject(_ece), rdma_establish, rdma_set_option, rdma_init_qp_attr
//!     and the address and port getters read only `verbs`, `qp`, the
//!     addresses, `port_num`, the handle and `channel` (and move the QP with
//!     ibv_modify_qp, which is thread-safe). rdma_create_qp(_ex) and
//!     rdma_destroy_qp write `qp` (and `pd`, the local ECE options);
//!     rdma_set_local_ece and rdma_get_remote_ece touch the ECE options;
//!     rdma_leave_multicast reads the group's `mgid`/`mlid` and `qp`;
//!     rdma_migrate_id writes `channel` and `sync`.
//! L3. A call that fails started nothing: librdmacm fails before its kernel
//!     command or because the kernel refused it, and the kernel queues the
//!     event of a resolve, connect or join only for a command it took. (On an
//!     asynchronous id, librdmacm's ucma_complete returns at once.)
//! L4. Each rdma_resolve_addr the kernel took is answered by one
//!     ADDR_RESOLVED or ADDR_ERROR, each rdma_resolve_route or IB_PATH option
//!     by one ROUTE_RESOLVED or ROUTE_ERROR, never swallowed; or by none when
//!     the kernel id changes state first (device removal): the count below
//!     then stays up, which costs the lock, not soundness.
//! L5. rdma_destroy_id reads the id's handle and `channel`, waits until every
//!     event of the id the kernel reported is acknowledged, then frees it.
//! L6. The connection events have no end this crate relies on: REJECTED may
//!     come while the kernel's id is connecting or connected (on a passive id
//!     before rdma_accept when the peer gives up; after ESTABLISHED when the
//!     peer's CM sends a REJ), so an id that connected stays exposed to it.
//!
//! The rules (an id's `Exposure`, an operation's `Access`):
//! R1. Reading an event holds the channel's lock around rdma_get_cm_event and
//!     `wrap_event`, which lowers the id's `addr`/`route` count after
//!     librdmacm processed the event, still under the lock.
//! R2. An operation that starts such an event raises its count (`Start`)
//!     while it holds the id's lock, before its call (so before the kernel can
//!     queue the event), and lowers it again if the call fails (L3). Counts
//!     rise only under the id's lock: an operation holding it sees them fall,
//!     never rise.
//! R3. An operation takes the channel's lock, deciding before it raises its
//!     own count, when: it is `Exclusive` (rdma_resolve_addr, L2; multicast
//!     joins and leaves); the id is `always` exposed (it joined a multicast
//!     group, or migrated from synchronous, with unknown events queued); an
//!     ADDR_/ROUTE_ event is pending (it writes what every call reads); or it
//!     has `Conn` access and the id connected (CONNECT_RESPONSE and REJECTED
//!     use `qp` and the ECE state, L1, L6). Otherwise (`Stable` access on a
//!     connected id, anything on an idle one) it runs beside the reader.
//! R4. Why that is enough: an operation that skips the lock read each count
//!     at zero and each flag clear (Acquire). A zero is the reader's Release
//!     decrement after the processing, or nothing was raised; either way every
//!     processing that could conflict finished before the operation (through
//!     the count) or cannot start during it (nothing pending, nothing raised
//!     while it holds the id's lock, R2). The event the operation itself
//!     starts may be processed during its call's tail: L2 says what each tail
//!     touches, and the calls whose tail conflicts are `Exclusive`.
//! R5. Synchronous ids have no channel: their events are processed inside
//!     their own calls, under the id's lock. Destroying an id takes no channel
//!     lock (L5). Migrating takes both channels' locks.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use super::{CmId, IdState};
use crate::error::Result;
use crate::ffi;

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
pub(super) enum Start {
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
pub(in crate::cm) struct Exposure {
    /// `rdma_resolve_addr` calls whose ADDR_RESOLVED/ADDR_ERROR has not been
    /// processed.
    addr: AtomicU32,
    /// `rdma_resolve_route` calls and IB_PATH options whose
    /// ROUTE_RESOLVED/ROUTE_ERROR has not been processed.
    route: AtomicU32,
    /// A connection was started, or the id came from a connect request.
    pub(in crate::cm) connected: AtomicBool,
    /// Every operation takes the channel's lock.
    pub(super) always: AtomicBool,
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
    pub(in crate::cm) fn processed(&self, event: u32) {
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

impl CmId {
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
    pub(super) fn start<T>(
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
}
