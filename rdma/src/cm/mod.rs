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
//!   this crate and keeps the id alive. Build the PD, CQs and a crate
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
//! # Threads
//! Ids and channels are `Send + Sync`. Every operation on an id holds a lock
//! on the id and on its channel, and reading an event holds the channel's
//! lock, so librdmacm never updates an id while another thread reads it.
//!
//! # Example
//! ```no_run
//! use std::time::Duration;
//! use rdma::cm::{EventChannel, PortSpace, CmEventType};
//! # fn main() -> rdma::Result<()> {
//! let channel = EventChannel::new()?;
//! let id = channel.create_id(PortSpace::Tcp)?;
//! id.resolve_addr(None, "10.8.0.1:7471".parse().unwrap(), Duration::from_secs(2))?;
//! let event = channel.get_event_timeout(Duration::from_secs(5))?.expect("an event");
//! assert_eq!(event.event_type(), CmEventType::AddrResolved);
//! # Ok(())
//! # }
//! ```

mod addrinfo;
pub mod blocking;
mod channel;
mod device;
mod event;
mod id;
mod verbs;

use std::ffi::CStr;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::ffi;
use crate::macros::c_enum;

pub use addrinfo::{create_ep, getaddrinfo, AddrInfo, AddrInfoEntry, AddrInfoFlags, AddrInfoHints};
pub use channel::EventChannel;
pub use device::get_devices;
pub use event::{CmEvent, ConnParam, UdParam};
pub use id::{CmId, CmOption, Ece, McJoinFlags};
pub use verbs::get_comp;

#[allow(unused_imports)] // used by the docs above
use crate::Context;

c_enum! {
    /// `enum rdma_cm_event_type`. Prints as `rdma_event_str(3)` does.
    pub enum CmEventType: u32 {
        /// Address resolved (`rdma_resolve_addr`).
        AddrResolved = ffi::RDMA_CM_EVENT_ADDR_RESOLVED,
        /// Address resolution failed.
        AddrError = ffi::RDMA_CM_EVENT_ADDR_ERROR,
        /// Route resolved (`rdma_resolve_route`).
        RouteResolved = ffi::RDMA_CM_EVENT_ROUTE_RESOLVED,
        /// Route resolution failed.
        RouteError = ffi::RDMA_CM_EVENT_ROUTE_ERROR,
        /// A connection request on a listener; the event's id is the new
        /// connection.
        ConnectRequest = ffi::RDMA_CM_EVENT_CONNECT_REQUEST,
        /// The peer accepted, on an id without a librdmacm QP: move the QP to
        /// RTS and call [`CmId::establish`] (see [`CmId::establish_qp`]).
        ConnectResponse = ffi::RDMA_CM_EVENT_CONNECT_RESPONSE,
        /// Connecting failed.
        ConnectError = ffi::RDMA_CM_EVENT_CONNECT_ERROR,
        /// The peer did not answer.
        Unreachable = ffi::RDMA_CM_EVENT_UNREACHABLE,
        /// The peer (or its CM) rejected the connection.
        Rejected = ffi::RDMA_CM_EVENT_REJECTED,
        /// The connection is up.
        Established = ffi::RDMA_CM_EVENT_ESTABLISHED,
        /// The connection is down.
        Disconnected = ffi::RDMA_CM_EVENT_DISCONNECTED,
        /// The device went away.
        DeviceRemoval = ffi::RDMA_CM_EVENT_DEVICE_REMOVAL,
        /// Joined a multicast group.
        MulticastJoin = ffi::RDMA_CM_EVENT_MULTICAST_JOIN,
        /// A multicast group failed.
        MulticastError = ffi::RDMA_CM_EVENT_MULTICAST_ERROR,
        /// The address the id is bound to changed.
        AddrChange = ffi::RDMA_CM_EVENT_ADDR_CHANGE,
        /// The QP of a closed connection left time-wait.
        TimewaitExit = ffi::RDMA_CM_EVENT_TIMEWAIT_EXIT,
    }
}

impl fmt::Display for CmEventType {
    /// The text of `rdma_event_str(3)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // SAFETY: rdma_event_str returns a static string for any value.
        let s = unsafe { CStr::from_ptr(ffi::rdma_event_str(self.to_raw())) };
        f.write_str(&s.to_string_lossy())
    }
}

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

/// The errno a failure event stands for ([`crate::Error::CmEvent`]).
pub(crate) fn event_errno(event: CmEventType, status: i32) -> i32 {
    if status < 0 {
        return -status;
    }
    match event {
        CmEventType::Rejected => libc::ECONNREFUSED,
        CmEventType::Unreachable => libc::EHOSTUNREACH,
        CmEventType::AddrError => libc::EADDRNOTAVAIL,
        CmEventType::RouteError => libc::ENETUNREACH,
        CmEventType::ConnectError => libc::ECONNABORTED,
        CmEventType::Disconnected => libc::ECONNRESET,
        CmEventType::DeviceRemoval => libc::ENODEV,
        CmEventType::MulticastError => libc::EADDRNOTAVAIL,
        _ => libc::EIO,
    }
}

/// A socket address in C form, with its length.
pub(crate) fn to_sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_storage is valid.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large and aligned enough for any
            // sockaddr type.
            unsafe { std::ptr::write(std::ptr::addr_of_mut!(storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo().to_be(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above.
            unsafe { std::ptr::write(std::ptr::addr_of_mut!(storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// Reads an IPv4/IPv6 socket address; `None` for NULL, unset (family 0) or
/// other families (InfiniBand `AF_IB`).
///
/// # Safety
/// `sa` is NULL or points at a socket address of its family's size.
pub(crate) unsafe fn from_sockaddr(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees a readable sockaddr.
    let family = i32::from(unsafe { (*sa).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: the family says it is a sockaddr_in.
            let sin = unsafe { std::ptr::read_unaligned(sa.cast::<libc::sockaddr_in>()) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says it is a sockaddr_in6.
            let sin6 = unsafe { std::ptr::read_unaligned(sa.cast::<libc::sockaddr_in6>()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
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

    #[test]
    fn socket_addresses_round_trip() {
        for text in ["10.8.0.1:7471", "[fe80::1%3]:1", "0.0.0.0:0"] {
            let addr: SocketAddr = text.parse().unwrap();
            let (storage, len) = to_sockaddr(&addr);
            assert!(len as usize <= std::mem::size_of_val(&storage));
            // SAFETY: `storage` holds the address just written.
            let back = unsafe { from_sockaddr(std::ptr::addr_of!(storage).cast()) };
            assert_eq!(back, Some(addr));
        }
        // SAFETY: NULL is allowed.
        assert_eq!(unsafe { from_sockaddr(std::ptr::null()) }, None);
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
