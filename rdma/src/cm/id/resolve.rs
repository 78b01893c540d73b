//! Addresses and routes: binding an id (`rdma_bind_addr(3)`), resolving
//! (`rdma_resolve_addr(3)`, `rdma_resolve_route(3)`), and reading them back.

use std::net::SocketAddr;
use std::time::Duration;

use super::locking::{Access, Start};
use super::{addr_context, verb, CmId};
use crate::cm::addr::{from_sockaddr_storage, to_sockaddr, CmAddr};
use crate::cm::{from_sockaddr, timeout_ms};
use crate::error::Result;
use crate::ffi;
#[allow(unused_imports)] // used by the docs below
use crate::Error;

impl CmId {
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
}
