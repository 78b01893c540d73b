//! Asynchronous events of a device (`ibv_get_async_event(3)`).
//!
//! Events are acknowledged as soon as they are read, and carry copies of what
//! identifies their object (QP number, CQ/SRQ address, port number) rather
//! than the object: holding an event can never block the destruction of a QP,
//! CQ or SRQ, which waits for its events to be acknowledged.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

use crate::error::{check_minus_one, Result};
use crate::macros::c_enum;
use crate::{ffi, CompletionQueue, Context, QueuePair};

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
    fn from_raw(ev: &ffi::ibv_async_event) -> Self {
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

    /// True when the event is about `qp`.
    pub fn is_qp(&self, qp: &QueuePair) -> bool {
        self.element
            == AsyncEventElement::Qp {
                qp_num: qp.qp_num(),
            }
    }

    /// True when the event is about `cq`.
    pub fn is_cq(&self, cq: &CompletionQueue) -> bool {
        self.element == AsyncEventElement::Cq(cq.as_raw() as usize)
    }

    /// True when the event is about `srq`.
    pub fn is_srq(&self, srq: &crate::SharedReceiveQueue) -> bool {
        self.element == AsyncEventElement::Srq(srq.as_raw() as usize)
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

/// The context's asynchronous event file descriptor, for polling
/// ([`Context::async_fd`]).
#[derive(Debug)]
pub struct AsyncFd<'a> {
    /// Open (never -1) while the context lives, which `'a` guarantees.
    fd: RawFd,
    _ctx: std::marker::PhantomData<&'a Context>,
}

impl AsFd for AsyncFd<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: `fd` is not -1 (checked when `self` was made) and stays
        // open while the context, which `self` borrows, lives.
        unsafe { BorrowedFd::borrow_raw(self.fd) }
    }
}

impl AsRawFd for AsyncFd<'_> {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

impl Context {
    /// Waits for the next asynchronous event (`ibv_get_async_event(3)`) and
    /// acknowledges it (`ibv_ack_async_event(3)`).
    ///
    /// # Errors
    /// [`crate::Error::Unsupported`] for a context without an event
    /// descriptor (see [`Context::async_fd`]); [`crate::Error::Verb`] naming
    /// `ibv_get_async_event`; `EAGAIN` when the descriptor is non-blocking
    /// and nothing is pending.
    pub fn get_async_event(&self) -> Result<AsyncEvent> {
        self.async_fd()?;
        let mut ev = ffi::ibv_async_event {
            element: ffi::ibv_async_event__bindgen_ty_1 { port_num: 0 },
            event_type: 0,
        };
        // SAFETY: valid context and out-struct.
        let rc = unsafe { ffi::ibv_get_async_event(self.as_raw(), &mut ev) };
        check_minus_one("ibv_get_async_event", || self.name().to_string().into(), rc)?;
        let event = AsyncEvent::from_raw(&ev);
        // SAFETY: the event came from ibv_get_async_event; acked exactly once.
        unsafe { ffi::ibv_ack_async_event(&mut ev) };
        self.run_event_hooks(&event);
        Ok(event)
    }

    /// The asynchronous event descriptor, e.g. for `poll(2)` or an async
    /// runtime's readiness API.
    ///
    /// # Errors
    /// [`crate::Error::Unsupported`] for a context that has none: a context
    /// made by [`Context::import_device`] (libibverbs 44 leaves its
    /// `async_fd` at -1; the events of its command file go to the original
    /// context's descriptor).
    pub fn async_fd(&self) -> Result<AsyncFd<'_>> {
        // SAFETY: reads a field of a live context.
        let fd = unsafe { (*self.as_raw()).async_fd };
        if fd < 0 {
            return Err(crate::Error::Unsupported {
                what: "asynchronous events (the context has no event descriptor: \
                       an imported context's events go to the original context)"
                    .into(),
                device: self.name().to_string(),
                source: None,
            });
        }
        Ok(AsyncFd {
            fd,
            _ctx: std::marker::PhantomData,
        })
    }

    /// Switches the asynchronous event descriptor to non-blocking mode.
    ///
    /// # Errors
    /// As [`Context::async_fd`]; [`crate::Error::Verb`] naming `fcntl`.
    pub fn set_async_nonblocking(&self, nonblocking: bool) -> Result<()> {
        let fd = self.async_fd()?.as_raw_fd();
        // SAFETY: fcntl on a descriptor the context owns.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        check_minus_one("fcntl", || "F_GETFL on the async fd".into(), flags)?;
        let flags = if nonblocking {
            flags | libc::O_NONBLOCK
        } else {
            flags & !libc::O_NONBLOCK
        };
        // SAFETY: as above.
        let rc = unsafe { libc::fcntl(fd, libc::F_SETFL, flags) };
        check_minus_one("fcntl", || "F_SETFL on the async fd".into(), rc)?;
        Ok(())
    }
}
