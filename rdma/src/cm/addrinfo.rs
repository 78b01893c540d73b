//! Address resolution and endpoints (`rdma_getaddrinfo(3)`,
//! `rdma_create_ep(3)`).

use std::ffi::{CStr, CString};
use std::fmt;
use std::net::SocketAddr;
use std::ptr::NonNull;

use super::addr::{from_sockaddr_len, to_sockaddr, CmAddr};
use super::{CmId, PortSpace};
use crate::error::{last_errno, Error, Result};
use crate::qp::QpOwner;
use crate::{ffi, QpType, QueuePair, QueuePairBuilder};

bitflags::bitflags! {
    /// `RAI_*` flags of `struct rdma_addrinfo`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AddrInfoFlags: i32 {
        /// The address is for a listener (`RAI_PASSIVE`).
        const PASSIVE = 0x1;
        /// The node is a numeric address, do not resolve names (`RAI_NUMERICHOST`).
        const NUMERICHOST = 0x2;
        /// Do not resolve a route (`RAI_NOROUTE`).
        const NOROUTE = 0x4;
        /// Use the hint's address family (`RAI_FAMILY`).
        const FAMILY = 0x8;
        const _ = !0;
    }
}

/// Hints for [`getaddrinfo`] (the `hints` argument).
#[derive(Debug, Clone, Copy, Default)]
pub struct AddrInfoHints {
    /// `ai_flags`.
    pub flags: AddrInfoFlags,
    /// `ai_family` (`libc::AF_INET`, `AF_INET6`, `AF_IB` with
    /// [`AddrInfoFlags::FAMILY`]; 0 for any).
    pub family: i32,
    /// `ai_src_addr`: the source address an active lookup resolves from
    /// (what a passive lookup of the local address gave, say); the entries
    /// carry it as their source, and [`create_ep`] binds to it.
    pub src_addr: Option<CmAddr>,
    /// `ai_qp_type` (`None` for any).
    pub qp_type: Option<QpType>,
    /// `ai_port_space` (`None` for any).
    pub port_space: Option<PortSpace>,
}

/// The result of [`getaddrinfo`]: a list of entries, freed on drop
/// (`rdma_freeaddrinfo(3)`).
pub struct AddrInfo {
    head: NonNull<ffi::rdma_addrinfo>,
}

// SAFETY: the list is owned data, only read after creation.
unsafe impl Send for AddrInfo {}
// SAFETY: as above.
unsafe impl Sync for AddrInfo {}

impl Drop for AddrInfo {
    fn drop(&mut self) {
        // SAFETY: the list from rdma_getaddrinfo, freed once; entries borrow
        // `self`, so none is left.
        unsafe { ffi::rdma_freeaddrinfo(self.head.as_ptr()) };
    }
}

/// One entry of an [`AddrInfo`] list.
#[derive(Clone, Copy)]
pub struct AddrInfoEntry<'a> {
    raw: &'a ffi::rdma_addrinfo,
}

/// Resolves `node`/`service` to RDMA addresses (`rdma_getaddrinfo(3)`).
///
/// # Errors
/// [`Error::LibraryMissing`] (the `dlopen` feature); [`Error::InvalidArgument`]
/// for strings with NUL bytes; [`Error::Verb`] naming `rdma_getaddrinfo`
/// (`ENODEV` when no RDMA device has the address; name-resolution failures
/// carry the resolver's message).
pub fn getaddrinfo(
    node: Option<&str>,
    service: Option<&str>,
    hints: Option<&AddrInfoHints>,
) -> Result<AddrInfo> {
    crate::error::load_rdmacm()?;
    let cstr = |s: Option<&str>| -> Result<Option<CString>> {
        s.map(|s| {
            CString::new(s).map_err(|_| Error::InvalidArgument {
                verb: "rdma_getaddrinfo",
                reason: format!("{s:?} contains a NUL byte"),
            })
        })
        .transpose()
    };
    let (node_c, service_c) = (cstr(node)?, cstr(service)?);
    let mut src = hints
        .and_then(|h| h.src_addr)
        .map(|a| to_sockaddr("rdma_getaddrinfo", &a))
        .transpose()?;
    let raw_hints = hints.map(|h| ffi::rdma_addrinfo {
        ai_flags: h.flags.bits(),
        ai_family: h.family,
        ai_qp_type: h.qp_type.map_or(0, |t| t.to_raw() as i32),
        ai_port_space: h.port_space.map_or(0, |p| p.to_raw() as i32),
        ai_src_len: src.as_ref().map_or(0, |(_, len)| *len),
        ai_src_addr: src.as_mut().map_or(std::ptr::null_mut(), |(sa, _)| {
            std::ptr::addr_of_mut!(*sa).cast()
        }),
        ..Default::default()
    });
    let mut res: *mut ffi::rdma_addrinfo = std::ptr::null_mut();
    // SAFETY: NUL-terminated strings (or NULL), hints (or NULL), the source
    // address they point at and the out-pointer live for the call (librdmacm
    // copies what it keeps).
    let rc = unsafe {
        ffi::rdma_getaddrinfo(
            node_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            service_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            raw_hints
                .as_ref()
                .map_or(std::ptr::null(), |h| h as *const _),
            &mut res,
        )
    };
    let what = || format!("node {node:?} service {service:?}");
    if rc == -1 {
        return Err(Error::verb_errno("rdma_getaddrinfo", what(), last_errno()));
    }
    if rc != 0 {
        // A getaddrinfo(3) error code, not an errno.
        // SAFETY: gai_strerror returns a static string for any code.
        let text = unsafe { CStr::from_ptr(libc::gai_strerror(rc)) }.to_string_lossy();
        return Err(Error::Verb {
            verb: "rdma_getaddrinfo",
            context: what().into(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, text.into_owned()),
        });
    }
    let head = NonNull::new(res)
        .ok_or_else(|| Error::verb_errno("rdma_getaddrinfo", what(), libc::ENODATA))?;
    Ok(AddrInfo { head })
}

impl AddrInfo {
    /// The entries, in order.
    pub fn iter(&self) -> impl Iterator<Item = AddrInfoEntry<'_>> {
        // SAFETY: the list lives as long as `self`.
        let mut next = Some(unsafe { &*self.head.as_ptr() });
        std::iter::from_fn(move || {
            let cur = next?;
            // SAFETY: `ai_next` is NULL or the next entry of the same list.
            next = unsafe { cur.ai_next.as_ref() };
            Some(AddrInfoEntry { raw: cur })
        })
    }

    /// The first entry.
    pub fn first(&self) -> AddrInfoEntry<'_> {
        // SAFETY: the list lives as long as `self`.
        let raw = unsafe { &*self.head.as_ptr() };
        AddrInfoEntry { raw }
    }
}

impl<'a> AddrInfoEntry<'a> {
    /// `ai_flags`.
    pub fn flags(&self) -> AddrInfoFlags {
        AddrInfoFlags::from_bits_retain(self.raw.ai_flags)
    }

    /// `ai_family` (`libc::AF_INET`, `AF_INET6`, `AF_IB`).
    pub fn family(&self) -> i32 {
        self.raw.ai_family
    }

    /// `ai_qp_type`.
    pub fn qp_type(&self) -> QpType {
        QpType::from_raw(self.raw.ai_qp_type as u32)
    }

    /// `ai_port_space`.
    pub fn port_space(&self) -> PortSpace {
        PortSpace::from_raw(self.raw.ai_port_space as u32)
    }

    /// The source address, if it is an IP one ([`AddrInfoEntry::src_cm_addr`]
    /// reads any family).
    pub fn src_addr(&self) -> Option<SocketAddr> {
        self.src_cm_addr().and_then(|a| a.ip())
    }

    /// The destination address, if it is an IP one
    /// ([`AddrInfoEntry::dst_cm_addr`] reads any family).
    pub fn dst_addr(&self) -> Option<SocketAddr> {
        self.dst_cm_addr().and_then(|a| a.ip())
    }

    /// The source address of any family (`AF_IB` for a GID lookup), if any.
    pub fn src_cm_addr(&self) -> Option<CmAddr> {
        // SAFETY: NULL or an address of `ai_src_len` bytes in the list.
        unsafe { from_sockaddr_len(self.raw.ai_src_addr, self.raw.ai_src_len as usize) }
    }

    /// The destination address of any family, if any.
    pub fn dst_cm_addr(&self) -> Option<CmAddr> {
        // SAFETY: NULL or an address of `ai_dst_len` bytes in the list.
        unsafe { from_sockaddr_len(self.raw.ai_dst_addr, self.raw.ai_dst_len as usize) }
    }

    fn text(p: *mut std::ffi::c_char) -> Option<&'a str> {
        // SAFETY: NULL or a NUL-terminated string in the list.
        (!p.is_null())
            .then(|| unsafe { CStr::from_ptr(p) }.to_str().ok())
            .flatten()
    }

    /// The source's canonical name.
    pub fn src_canonname(&self) -> Option<&'a str> {
        Self::text(self.raw.ai_src_canonname)
    }

    /// The destination's canonical name.
    pub fn dst_canonname(&self) -> Option<&'a str> {
        Self::text(self.raw.ai_dst_canonname)
    }

    fn blob(p: *mut std::ffi::c_void, len: usize) -> &'a [u8] {
        if p.is_null() || len == 0 {
            return &[];
        }
        // SAFETY: `len` bytes at `p`, owned by the list.
        unsafe { std::slice::from_raw_parts(p.cast(), len) }
    }

    /// Routing data (`ai_route`: InfiniBand path records).
    pub fn route(&self) -> &'a [u8] {
        Self::blob(self.raw.ai_route, self.raw.ai_route_len)
    }

    /// Connection data (`ai_connect`).
    pub fn connect_data(&self) -> &'a [u8] {
        Self::blob(self.raw.ai_connect, self.raw.ai_connect_len)
    }

    /// The raw entry.
    pub fn as_raw(&self) -> *const ffi::rdma_addrinfo {
        self.raw
    }
}

impl fmt::Debug for AddrInfoEntry<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AddrInfoEntry")
            .field("flags", &self.flags())
            .field("family", &self.family())
            .field("qp_type", &self.qp_type())
            .field("port_space", &self.port_space())
            .field("src", &self.src_cm_addr())
            .field("dst", &self.dst_cm_addr())
            .finish()
    }
}

impl fmt::Debug for AddrInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Creates a synchronous endpoint for `entry` (`rdma_create_ep(3)`): an id
/// bound (passive entries, ready for [`CmId::listen`]) or resolved to its
/// route (active entries, ready for [`CmId::connect`]).
///
/// With `qp`, whose PD must be on librdmacm's context for the device (from
/// [`super::get_devices`] or another id's [`CmId::context`]), an active
/// endpoint gets its QP now (returned as a crate [`QueuePair`]); a passive
/// one keeps the template and every id from [`CmId::get_request`] gets a QP
/// made from it. Without, make the QP afterwards with [`CmId::create_qp`]
/// on [`CmId::pd`], or use a crate QP with [`CmId::connect_qp`].
///
/// The endpoint is destroyed with `rdma_destroy_ep`.
///
/// # Errors
/// [`Error::Verb`] naming `rdma_create_ep` (`ENODEV`, `ETIMEDOUT`, `EINVAL`
/// for a PD of another context).
pub fn create_ep(
    entry: &AddrInfoEntry<'_>,
    qp: Option<&QueuePairBuilder>,
) -> Result<(CmId, Option<QueuePair>)> {
    let mut attr = qp.map(QueuePairBuilder::checked_init_attr).transpose()?;
    let pd = qp.map_or(std::ptr::null_mut(), |b| b.pd_raw());
    let mut raw: *mut ffi::rdma_cm_id = std::ptr::null_mut();
    // errno is cleared first: with a QP, librdmacm returns -1 with the
    // provider's errno, which it may have left unset (siw).
    crate::error::call_minus_one(
        "rdma_create_ep",
        || format!("{entry:?}").into(),
        || {
            // SAFETY: the entry lives in its list for the call; PD and CQs
            // (if any) are alive and kept alive below as long as librdmacm
            // may use them.
            unsafe {
                ffi::rdma_create_ep(
                    &mut raw,
                    (entry.raw as *const ffi::rdma_addrinfo).cast_mut(),
                    pd,
                    attr.as_mut().map_or(std::ptr::null_mut(), |a| a as *mut _),
                )
            }
        },
    )?;
    let raw =
        NonNull::new(raw).ok_or_else(|| Error::verb_errno("rdma_create_ep", "", libc::EIO))?;
    let id = CmId::from_endpoint(raw, qp.is_some());
    let Some(builder) = qp else {
        return Ok((id, None));
    };
    if entry.flags().contains(AddrInfoFlags::PASSIVE) {
        id.set_ep_template(builder.clone());
        return Ok((id, None));
    }
    let qp = id.raw_qp();
    let qp = NonNull::new(qp)
        .ok_or_else(|| Error::verb_errno("rdma_create_ep", "no QP was created", libc::EIO))?;
    let owner: std::sync::Arc<dyn QpOwner> = std::sync::Arc::new(super::id::cm_qp_owner(&id));
    let cap = attr.map(|a| a.cap).unwrap_or_default();
    let serial = crate::track::allocate_serial("rdma_create_ep")?;
    Ok((id, Some(builder.finish(qp, None, cap, Some(owner), serial))))
}
