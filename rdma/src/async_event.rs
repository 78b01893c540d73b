//! Asynchronous events of a device (`ibv_get_async_event(3)`).
//!
//! Events are acknowledged as soon as they are read, and carry copies of what
//! identifies their object (QP number, CQ/SRQ address, port number) rather
//! than the object: holding an event can never block the destruction of a QP,
//! CQ or SRQ, which waits for its events to be acknowledged.
//!
//! The event values live here, below the context (whose hooks see them) and
//! the objects they name; reading them is the context's
//! ([`Context::get_async_event`](crate::Context::get_async_event), in
//! `context.rs`), and telling which object an event is about
//! ([`AsyncEvent::is_qp`], [`AsyncEvent::is_cq`], [`AsyncEvent::is_srq`]) is
//! each object's, in its own module.

use std::fmt;

use crate::ffi;
use crate::macros::c_enum;

c_enum! {
    /// `enum ibv_event_type`.
    pub enum AsyncEventType: u32 {
        /// CQ overrun or protection error.
        CqErr = ffi::IBV_EVENT_CQ_ERR,
        /// A QP hit an error it cannot report in a completion.
        QpFatal = ffi::IBV_EVENT_QP_FATAL,
        /// Invalid request on a QP (responder).
        QpReqErr = ffi::IBV_EVENT_QP_REQ_ERR,
        /// Access violation on a QP (responder).
        QpAccessErr = ffi::IBV_EVENT_QP_ACCESS_ERR,
        /// Communication established (first packet received in RTR).
        CommEst = ffi::IBV_EVENT_COMM_EST,
        /// Send queue drained (SQD).
        SqDrained = ffi::IBV_EVENT_SQ_DRAINED,
        /// Path migrated.
        PathMig = ffi::IBV_EVENT_PATH_MIG,
        /// Path migration failed.
        PathMigErr = ffi::IBV_EVENT_PATH_MIG_ERR,
        /// The device failed.
        DeviceFatal = ffi::IBV_EVENT_DEVICE_FATAL,
        /// A port became active.
        PortActive = ffi::IBV_EVENT_PORT_ACTIVE,
        /// A port went down.
        PortErr = ffi::IBV_EVENT_PORT_ERR,
        /// A port's LID changed.
        LidChange = ffi::IBV_EVENT_LID_CHANGE,
        /// A port's P_Key table changed.
        PkeyChange = ffi::IBV_EVENT_PKEY_CHANGE,
        /// The subnet manager changed.
        SmChange = ffi::IBV_EVENT_SM_CHANGE,
        /// An SRQ failed.
        SrqErr = ffi::IBV_EVENT_SRQ_ERR,
        /// An SRQ fell below its limit.
        SrqLimitReached = ffi::IBV_EVENT_SRQ_LIMIT_REACHED,
        /// The last WQE of a QP attached to an SRQ was consumed.
        QpLastWqeReached = ffi::IBV_EVENT_QP_LAST_WQE_REACHED,
        /// The SM asks clients to re-register.
        ClientReregister = ffi::IBV_EVENT_CLIENT_REREGISTER,
        /// A port's GID table changed.
        GidChange = ffi::IBV_EVENT_GID_CHANGE,
        /// A work queue failed.
        WqFatal = ffi::IBV_EVENT_WQ_FATAL,
    }
}

impl fmt::Display for AsyncEventType {
    /// The text of `ibv_event_type_str(3)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if ffi::load_ibverbs().is_err() {
            // Only with the `dlopen` feature and no libibverbs: the name.
            return write!(f, "{self:?}");
        }
        // SAFETY: ibv_event_type_str returns a static string for any value;
        // libibverbs is open (checked above).
        let s = unsafe { std::ffi::CStr::from_ptr(ffi::ibv_event_type_str(self.to_raw())) };
        f.write_str(&s.to_string_lossy())
    }
}

/// The object an asynchronous event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncEventElement {
    /// A queue pair, by number.
    Qp {
        /// The QP number.
        qp_num: u32,
    },
    /// A completion queue (compare with [`AsyncEvent::is_cq`]).
    Cq(usize),
    /// A shared receive queue (compare with [`AsyncEvent::is_srq`]).
    Srq(usize),
    /// A work queue.
    Wq(usize),
    /// A port.
    Port(u8),
    /// The whole device.
    Device,
}

/// An asynchronous event, already acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// What happened.
    pub event_type: AsyncEventType,
    /// To what.
    pub element: AsyncEventElement,
}

impl AsyncEvent {
    pub(crate) fn from_raw(ev: &ffi::ibv_async_event) -> Self {
        let event_type = AsyncEventType::from_raw(ev.event_type);
        // SAFETY: the union member read is the one `event_type` selects (per
        // ibv_get_async_event(3)); the pointers are only read (QP number) or
        // kept as plain addresses, before the event is acknowledged.
        let element = unsafe {
            use AsyncEventType as T;
            match event_type {
                T::QpFatal
                | T::QpReqErr
                | T::QpAccessErr
                | T::CommEst
                | T::SqDrained
                | T::PathMig
                | T::PathMigErr
                | T::QpLastWqeReached => AsyncEventElement::Qp {
                    qp_num: (*ev.element.qp).qp_num,
                },
                T::CqErr => AsyncEventElement::Cq(ev.element.cq as usize),
                T::SrqErr | T::SrqLimitReached => AsyncEventElement::Srq(ev.element.srq as usize),
                T::WqFatal => AsyncEventElement::Wq(ev.element.wq as usize),
                T::PortActive
                | T::PortErr
                | T::LidChange
                | T::PkeyChange
                | T::SmChange
                | T::ClientReregister
                | T::GidChange => {
                    AsyncEventElement::Port(u8::try_from(ev.element.port_num).unwrap_or(0))
                }
                T::DeviceFatal | T::Unknown(_) => AsyncEventElement::Device,
            }
        };
        AsyncEvent {
            event_type,
            element,
        }
    }

    /// True for the port events after which cached port attributes (LID,
    /// P_Keys, SM, GIDs, state) must be read again.
    pub fn changes_port(&self) -> bool {
        use AsyncEventType as T;
        matches!(
            self.event_type,
            T::LidChange
                | T::PkeyChange
                | T::SmChange
                | T::ClientReregister
                | T::GidChange
                | T::PortActive
                | T::PortErr
        )
    }

    /// The port, for port events.
    pub fn port(&self) -> Option<u8> {
        match self.element {
            AsyncEventElement::Port(p) => Some(p),
            _ => None,
        }
    }
}

impl fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.event_type, self.event_type.to_raw())?;
        match self.element {
            AsyncEventElement::Qp { qp_num } => write!(f, " on QP {qp_num}"),
            AsyncEventElement::Port(p) => write!(f, " on port {p}"),
            AsyncEventElement::Cq(a) => write!(f, " on CQ {a:#x}"),
            AsyncEventElement::Srq(a) => write!(f, " on SRQ {a:#x}"),
            AsyncEventElement::Wq(a) => write!(f, " on WQ {a:#x}"),
            AsyncEventElement::Device => Ok(()),
        }
    }
}
