//! The RDMA connection manager (`librdmacm`, `rdma_cm(7)`).
//!
//! # Objects
//! ```text
//! EventChannel --create_id--> CmId --context()--> Context (borrowed) --> PD, CQ, QP
//!      ^                        |
//!      +---- get_event -- CmEvent (holds its CmId until dropped = acked)
//! getaddrinfo() -> AddrInfo --create_ep--> CmId (synchronous)
//! ```
//! - An [`EventChannel`] reports the events of many ids. It is a cheap `Clone`
//!   handle and a file descriptor ([`std::os::fd::AsFd`]): use it blocking
//!   ([`EventChannel::get_event`]), with a bound
//!   ([`EventChannel::get_event_timeout`]), or from an event loop
//!   ([`EventChannel::try_get_event`] until it returns `None`, which is what an
//!   edge-triggered poller needs).
//! - A [`CmId`] keeps its channel alive (`rdma_destroy_event_channel` needs
//!   every id gone); ids accepted from a listener keep the listener's channel
//!   alive, so they survive the listener and its channel handle being
//!   dropped. [`CmId::migrate_id`] moves an id to a channel of its own.
//! - A [`CmEvent`] holds its id (and the listener, for a connect request), and
//!   is acknowledged when dropped: `rdma_destroy_id` blocks until every event
//!   of the id is acknowledged, so the id is destroyed only after its last
//!   event is gone.
//! - The device context behind an id (`cm_id->verbs`) belongs to librdmacm:
//!   [`CmId::context`] returns a borrowed [`Context`] that is never closed by
//!   this crate and keeps the id alive (on siw, with a CQ that covers the
//!   mmap key siw's provider refuses: see [`CmId::context`]). Build the PD,
//!   CQs and a crate
//!   [`crate::QueuePair`] on it, and drive the QP with
//!   [`CmId::connect_qp`] / [`CmId::accept_qp`] / [`CmId::establish_qp`]
//!   (`rdma_init_qp_attr`-driven transitions). The safe post path then works on
//!   CM connections. [`CmId::create_qp`] makes librdmacm create the QP instead
//!   (`rdma_create_qp`); it is a crate `QueuePair` as well, destroyed with
//!   `rdma_destroy_qp` before the id.
//! - A synchronous id ([`CmId::create_sync`], [`create_ep`]) has no channel:
//!   each call waits for its own event.
//! - [`blocking`] connects and accepts in one call, on top of all this.
//!
//! # Addresses
//! Calls that take an address take `impl Into<`[`CmAddr`]`>`: a
//! [`std::net::SocketAddr`], or an InfiniBand address
//! ([`IbAddr`], `AF_IB`: a GID and a service id). Addresses read back keep
//! their `SocketAddr` accessors, which see only IP addresses
//! ([`CmId::local_addr`], [`AddrInfoEntry::src_addr`], ...); the `*_cm_addr`
//! twins ([`CmId::local_cm_addr`], [`CmId::peer_cm_addr`],
//! [`AddrInfoEntry::src_cm_addr`], [`AddrInfoEntry::dst_cm_addr`]) read every
//! family. Events carry no address of their own: read it from
//! [`CmEvent::id`].
//!
//! `AF_IB` addresses are for InfiniBand ports. Measured on soft-RoCE (rxe,
//! kernel 6.1): `rdma_bind_addr` of the device's GID fails with `ENODEV`;
//! `rdma_resolve_addr` to it without a source and with the default P_Key
//! (0xffff, what `rdma_getaddrinfo` gives) resolves, and the id's addresses
//! read back as `AF_IB`, but `rdma_resolve_route` then fails with `ENODEV`
//! (with P_Key 0 or an `AF_IB` source, `rdma_resolve_addr` fails at once
//! with `ENODEV`); `rdma_join_multicast` of an `AF_IB` group fails with the
//! kernel's internal `ENOTSUPP` (524). librdmacm builds `AF_IB` addresses
//! with P_Key 0xffff and a service-id mask of all ones.
//!
//! # Threads
//! Ids and channels are `Send + Sync`. Every operation on an id holds a lock
//! on the id. Reading an event holds the channel's lock, because librdmacm's
//! event processing writes the id an address, route, connection or
//! multicast event reports; an operation on an id takes the channel's lock
//! too while such an event of that id may be processed (a resolve is
//! pending, or the id is connected and the operation touches its QP or ECE
//! state), so librdmacm never updates an id while another thread uses it.
//! Other operations (binding, creating the QP before connecting,
//! disconnecting, destroying, the getters, ...) run beside the event reader,
//! as in C. The rules and the librdmacm facts behind them are written down
//! in `cm/id/locking.rs`.
//!
//! # Example
//! ```no_run
//! use std::time::Duration;
//! use rdma::cm::{EventChannel, PortSpace, CmEventType};
//! # fn main() -> rdma::Result<()> {
//! let channel = EventChannel::new()?;
//! let id = channel.create_id(PortSpace::Tcp)?;
//! let dst: std::net::SocketAddr = "10.8.0.1:7471".parse().unwrap();
//! id.resolve_addr(None, dst, Duration::from_secs(2))?;
//! let event = channel.get_event_timeout(Duration::from_secs(5))?.expect("an event");
//! assert_eq!(event.event_type(), CmEventType::AddrResolved);
//! # Ok(())
//! # }
//! ```

pub(crate) mod addr;
mod addrinfo;
pub mod blocking;
mod channel;
mod device;
mod event;
mod id;
pub(crate) mod key_plug;
mod param;
mod verbs;

use std::net::SocketAddr;

use crate::ffi;
use crate::macros::c_enum;

#[cfg(test)]
use crate::status::event_errno;
pub use crate::status::CmEventType;
pub use addr::{CmAddr, IbAddr};
pub use addrinfo::{create_ep, getaddrinfo, AddrInfo, AddrInfoEntry, AddrInfoFlags, AddrInfoHints};
pub use channel::EventChannel;
pub use device::get_devices;
pub use event::CmEvent;
pub use id::{CmId, CmOption, McJoinFlags};
pub use param::{ConnParam, UdParam};
pub use verbs::get_comp;
// `Ece` lives at the crate root, next to the QP's own ECE calls; the
// connection manager carries it too.
#[doc(no_inline)]
pub use crate::Ece;

#[allow(unused_imports)] // used by the docs above
use crate::Context;

c_enum! {
    /// `enum rdma_port_space`: the kind of connection an id makes.
    pub enum PortSpace: u32 {
        /// Reliable connections (RC QPs), TCP-like addressing.
        Tcp = ffi::RDMA_PS_TCP,
        /// Unreliable datagrams (UD QPs), UDP-like addressing; also multicast.
        Udp = ffi::RDMA_PS_UDP,
        /// InfiniBand service ids: RC or UD.
        Ib = ffi::RDMA_PS_IB,
        /// IPoIB (UD).
        Ipoib = ffi::RDMA_PS_IPOIB,
    }
}

impl PortSpace {
    /// Whether ids of this port space use UD QPs.
    pub fn is_datagram(self) -> bool {
        matches!(self, PortSpace::Udp | PortSpace::Ipoib)
    }
}

/// Reads an IPv4/IPv6 socket address out of an id's `sockaddr_storage`;
/// `None` for NULL, unset (family 0) or other families (`AF_IB`).
///
/// # Safety
/// `sa` is NULL or points at a `sockaddr_storage`.
pub(crate) unsafe fn from_sockaddr(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    // SAFETY: per the contract.
    unsafe { addr::from_sockaddr_storage(sa) }.and_then(|a| a.ip())
}

fn timeout_ms(verb: &'static str, t: std::time::Duration) -> crate::Result<std::ffi::c_int> {
    std::ffi::c_int::try_from(t.as_millis()).map_err(|_| crate::Error::InvalidArgument {
        verb,
        reason: format!("timeout {t:?} does not fit a C int of milliseconds"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "calls into rdma-core, which Miri cannot run")]
    fn event_names_match_rdma_event_str() {
        assert_eq!(
            CmEventType::AddrResolved.to_string(),
            "RDMA_CM_EVENT_ADDR_RESOLVED"
        );
        assert_eq!(
            CmEventType::TimewaitExit.to_string(),
            "RDMA_CM_EVENT_TIMEWAIT_EXIT"
        );
        let unknown = CmEventType::from_raw(99);
        assert_eq!(unknown, CmEventType::Unknown(99));
        assert_eq!(unknown.to_raw(), 99);
        assert_eq!(unknown.to_string(), "UNKNOWN EVENT");
        for raw in 0..16 {
            assert!(!matches!(
                CmEventType::from_raw(raw),
                CmEventType::Unknown(_)
            ));
        }
    }

    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn handles_are_send_and_sync() {
        send_sync::<EventChannel>();
        send_sync::<CmId>();
        send_sync::<CmEvent>();
        send_sync::<AddrInfo>();
        send_sync::<blocking::Connection>();
        send_sync::<blocking::Listener>();
    }

    #[test]
    fn failure_events_map_to_errnos() {
        assert_eq!(event_errno(CmEventType::Rejected, 28), libc::ECONNREFUSED);
        assert_eq!(
            event_errno(CmEventType::AddrError, -libc::ETIMEDOUT),
            libc::ETIMEDOUT
        );
        assert!(PortSpace::Udp.is_datagram());
        assert!(!PortSpace::Tcp.is_datagram());
    }
}
