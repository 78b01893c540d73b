//! Connection manager addresses: IP socket addresses and InfiniBand
//! (`AF_IB`, `struct sockaddr_ib` of `<infiniband/ib.h>`) ones.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use super::PortSpace;
use crate::error::{Error, Result};
use crate::Gid;

/// An address the connection manager takes or reports: an IP socket address,
/// or an InfiniBand (`AF_IB`) address.
///
/// Every call that takes an address takes `impl Into<CmAddr>`, so a
/// [`SocketAddr`] can be passed as it is. Addresses read back from librdmacm
/// keep a family this crate does not know as [`CmAddr::Unknown`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CmAddr {
    /// `AF_INET` / `AF_INET6`.
    Ip(SocketAddr),
    /// `AF_IB`.
    Ib(IbAddr),
    /// An address of another family (the value of its `sa_family`), or one
    /// too short for its family. It cannot be passed back to librdmacm.
    Unknown(u16),
}

/// An InfiniBand address (`struct sockaddr_ib`), with every field in host
/// byte order except the GID, which is in wire order like every [`Gid`].
///
/// The port an id reports ([`super::CmId::src_port`]) is the low 16 bits of
/// the service id; see [`IbAddr::with_service`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IbAddr {
    /// `sib_pkey`: the partition key (0: the port's default).
    pub pkey: u16,
    /// `sib_flowinfo`: the flow label.
    pub flowinfo: u32,
    /// `sib_addr`: the GID.
    pub gid: Gid,
    /// `sib_sid`: the service id.
    pub sid: u64,
    /// `sib_sid_mask`: which bits of `sid` are significant.
    pub sid_mask: u64,
    /// `sib_scope_id`.
    pub scope_id: u64,
}

impl IbAddr {
    /// The address of `gid`, every other field 0.
    pub fn new(gid: Gid) -> IbAddr {
        IbAddr {
            gid,
            ..IbAddr::default()
        }
    }

    /// With the service id librdmacm gives an IP-style `port` of port space
    /// `ps` (`RDMA_IB_IP_PS_*`: the port space in bits 16..32, the port in
    /// bits 0..16), and the mask librdmacm gives it (all bits).
    pub fn with_service(self, ps: PortSpace, port: u16) -> IbAddr {
        IbAddr {
            sid: (u64::from(ps.to_raw()) << 16) | u64::from(port),
            // RDMA_IB_IP_PS_MASK is 0xFFFFFFFFFFFF0000 in the header; bindgen
            // made it an i32, which sign-extends back to it.
            sid_mask: (crate::ffi::RDMA_IB_IP_PS_MASK as i64 as u64)
                | u64::from(crate::ffi::RDMA_IB_IP_PORT_MASK),
            ..self
        }
    }

    /// The port: the low 16 bits of the service id.
    pub fn port(&self) -> u16 {
        self.sid as u16
    }
}

impl fmt::Display for IbAddr {
    /// The GID as `ibv_devinfo` prints it, then the service id.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] sid 0x{:016x}", self.gid, self.sid)
    }
}

impl CmAddr {
    /// The IP socket address, if it is one.
    pub fn ip(&self) -> Option<SocketAddr> {
        match self {
            CmAddr::Ip(a) => Some(*a),
            _ => None,
        }
    }

    /// The InfiniBand address, if it is one.
    pub fn ib(&self) -> Option<IbAddr> {
        match self {
            CmAddr::Ib(a) => Some(*a),
            _ => None,
        }
    }

    /// The address family (`libc::AF_INET`, `AF_INET6`, `AF_IB`, or the
    /// unknown one).
    pub fn family(&self) -> i32 {
        match self {
            CmAddr::Ip(SocketAddr::V4(_)) => libc::AF_INET,
            CmAddr::Ip(SocketAddr::V6(_)) => libc::AF_INET6,
            CmAddr::Ib(_) => libc::AF_IB,
            CmAddr::Unknown(f) => i32::from(*f),
        }
    }
}

impl From<SocketAddr> for CmAddr {
    fn from(a: SocketAddr) -> Self {
        CmAddr::Ip(a)
    }
}

impl From<SocketAddrV4> for CmAddr {
    fn from(a: SocketAddrV4) -> Self {
        CmAddr::Ip(a.into())
    }
}

impl From<SocketAddrV6> for CmAddr {
    fn from(a: SocketAddrV6) -> Self {
        CmAddr::Ip(a.into())
    }
}

impl From<IbAddr> for CmAddr {
    fn from(a: IbAddr) -> Self {
        CmAddr::Ib(a)
    }
}

impl fmt::Display for CmAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmAddr::Ip(a) => a.fmt(f),
            CmAddr::Ib(a) => a.fmt(f),
            CmAddr::Unknown(family) => write!(f, "<address of family {family}>"),
        }
    }
}

/// `struct sockaddr_ib` of `<infiniband/ib.h>` (bindgen leaves socket types
/// to libc, which does not have this one). The multi-byte fields are
/// big-endian except `sib_scope_id`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct SockaddrIb {
    sib_family: libc::sa_family_t,
    sib_pkey: u16,
    sib_flowinfo: u32,
    /// `struct ib_addr`: a union whose widest member is `__be64[2]`.
    sib_addr: [u64; 2],
    sib_sid: u64,
    sib_sid_mask: u64,
    sib_scope_id: u64,
}

impl SockaddrIb {
    fn from_addr(a: &IbAddr) -> Self {
        let raw = a.gid.raw();
        let (hi, lo) = raw.split_at(8);
        SockaddrIb {
            sib_family: libc::AF_IB as libc::sa_family_t,
            sib_pkey: a.pkey.to_be(),
            sib_flowinfo: a.flowinfo.to_be(),
            // The bytes in wire order, whatever the host order.
            sib_addr: [
                u64::from_ne_bytes(hi.try_into().expect("8 bytes")),
                u64::from_ne_bytes(lo.try_into().expect("8 bytes")),
            ],
            sib_sid: a.sid.to_be(),
            sib_sid_mask: a.sid_mask.to_be(),
            sib_scope_id: a.scope_id,
        }
    }

    fn to_addr(self) -> IbAddr {
        let mut gid = [0u8; 16];
        gid[..8].copy_from_slice(&self.sib_addr[0].to_ne_bytes());
        gid[8..].copy_from_slice(&self.sib_addr[1].to_ne_bytes());
        IbAddr {
            pkey: u16::from_be(self.sib_pkey),
            flowinfo: u32::from_be(self.sib_flowinfo),
            gid: Gid::from_raw(gid),
            sid: u64::from_be(self.sib_sid),
            sid_mask: u64::from_be(self.sib_sid_mask),
            scope_id: self.sib_scope_id,
        }
    }
}

/// An address in C form, with its length.
///
/// # Errors
/// [`Error::InvalidArgument`] naming `verb` for [`CmAddr::Unknown`].
pub(crate) fn to_sockaddr(
    verb: &'static str,
    addr: &CmAddr,
) -> Result<(libc::sockaddr_storage, libc::socklen_t)> {
    // SAFETY: an all-zero sockaddr_storage is valid.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let at = std::ptr::addr_of_mut!(storage);
    let len = match addr {
        CmAddr::Ip(SocketAddr::V4(a)) => {
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
            unsafe { std::ptr::write(at.cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        CmAddr::Ip(SocketAddr::V6(a)) => {
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
            unsafe { std::ptr::write(at.cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
        CmAddr::Ib(a) => {
            // SAFETY: as above (sockaddr_ib is 48 bytes, 8-aligned; the
            // storage 128 bytes, 8-aligned).
            unsafe { std::ptr::write(at.cast(), SockaddrIb::from_addr(a)) };
            std::mem::size_of::<SockaddrIb>()
        }
        CmAddr::Unknown(family) => {
            return Err(Error::InvalidArgument {
                verb,
                reason: format!(
                    "an address of family {family}: only IPv4, IPv6 and AF_IB addresses \
                     can be passed to librdmacm"
                ),
            })
        }
    };
    Ok((storage, len as libc::socklen_t))
}

/// Reads a socket address of at most `len` bytes; `None` for NULL or unset
/// (family 0). A family this crate does not know, or an address shorter than
/// its family's struct, is [`CmAddr::Unknown`].
///
/// # Safety
/// `sa` is NULL or points at `len` readable bytes (at least the family
/// field).
pub(crate) unsafe fn from_sockaddr_len(sa: *const libc::sockaddr, len: usize) -> Option<CmAddr> {
    if sa.is_null() || len < std::mem::size_of::<libc::sa_family_t>() {
        return None;
    }
    // SAFETY: the caller guarantees the family field is readable.
    let family = unsafe { std::ptr::read_unaligned(std::ptr::addr_of!((*sa).sa_family)) };
    let fits = |size: usize| len >= size;
    match i32::from(family) {
        0 => None,
        libc::AF_INET if fits(std::mem::size_of::<libc::sockaddr_in>()) => {
            // SAFETY: the family says it is a sockaddr_in, and it fits.
            let sin = unsafe { std::ptr::read_unaligned(sa.cast::<libc::sockaddr_in>()) };
            Some(CmAddr::Ip(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            ))))
        }
        libc::AF_INET6 if fits(std::mem::size_of::<libc::sockaddr_in6>()) => {
            // SAFETY: the family says it is a sockaddr_in6, and it fits.
            let sin6 = unsafe { std::ptr::read_unaligned(sa.cast::<libc::sockaddr_in6>()) };
            Some(CmAddr::Ip(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            ))))
        }
        libc::AF_IB if fits(std::mem::size_of::<SockaddrIb>()) => {
            // SAFETY: the family says it is a sockaddr_ib, and it fits.
            let sib = unsafe { std::ptr::read_unaligned(sa.cast::<SockaddrIb>()) };
            Some(CmAddr::Ib(sib.to_addr()))
        }
        _ => Some(CmAddr::Unknown(family)),
    }
}

/// [`from_sockaddr_len`] for an address in a `sockaddr_storage` (the
/// addresses inside an id).
///
/// # Safety
/// `sa` is NULL or points at a `sockaddr_storage`.
pub(crate) unsafe fn from_sockaddr_storage(sa: *const libc::sockaddr) -> Option<CmAddr> {
    // SAFETY: per the contract.
    unsafe { from_sockaddr_len(sa, std::mem::size_of::<libc::sockaddr_storage>()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(addr: CmAddr) -> Option<CmAddr> {
        let (storage, len) = to_sockaddr("test", &addr).unwrap();
        assert!(len as usize <= std::mem::size_of_val(&storage));
        // SAFETY: `storage` holds the address just written, `len` bytes.
        unsafe { from_sockaddr_len(std::ptr::addr_of!(storage).cast(), len as usize) }
    }

    #[test]
    fn socket_addresses_round_trip() {
        for text in ["10.8.0.1:7471", "[fe80::1%3]:1", "0.0.0.0:0"] {
            let addr: SocketAddr = text.parse().unwrap();
            assert_eq!(round_trip(addr.into()), Some(CmAddr::Ip(addr)));
        }
        // SAFETY: NULL is allowed.
        assert_eq!(unsafe { from_sockaddr_storage(std::ptr::null()) }, None);
    }

    /// The layout of `<infiniband/ib.h>`: 48 bytes, 8-aligned, fields at
    /// these offsets.
    #[test]
    fn sockaddr_ib_layout_matches_the_header() {
        assert_eq!(std::mem::size_of::<SockaddrIb>(), 48);
        assert_eq!(std::mem::align_of::<SockaddrIb>(), 8);
        assert_eq!(std::mem::offset_of!(SockaddrIb, sib_pkey), 2);
        assert_eq!(std::mem::offset_of!(SockaddrIb, sib_flowinfo), 4);
        assert_eq!(std::mem::offset_of!(SockaddrIb, sib_addr), 8);
        assert_eq!(std::mem::offset_of!(SockaddrIb, sib_sid), 24);
        assert_eq!(std::mem::offset_of!(SockaddrIb, sib_sid_mask), 32);
        assert_eq!(std::mem::offset_of!(SockaddrIb, sib_scope_id), 40);
    }

    #[test]
    fn sockaddr_ib_round_trips_in_wire_order() {
        let gid: Gid = "fe80::2:c903:a:b".parse::<Ipv6Addr>().unwrap().into();
        let addr = IbAddr {
            pkey: 0xffff,
            flowinfo: 0x0001_2345,
            gid,
            sid: 0x0000_0000_0106_1c46,
            sid_mask: !0,
            scope_id: 7,
        };
        assert_eq!(round_trip(addr.into()), Some(CmAddr::Ib(addr)));
        // The bytes as the kernel reads them: family in host order, the
        // rest big-endian, the GID as on the wire.
        let (storage, len) = to_sockaddr("test", &addr.into()).unwrap();
        assert_eq!(len, 48);
        // SAFETY: 48 initialised bytes of the storage.
        let bytes: &[u8] =
            unsafe { std::slice::from_raw_parts(std::ptr::addr_of!(storage).cast(), 48) };
        assert_eq!(
            &bytes[..2],
            &(libc::AF_IB as libc::sa_family_t).to_ne_bytes()
        );
        assert_eq!(&bytes[2..4], &[0xff, 0xff]);
        assert_eq!(&bytes[4..8], &[0, 1, 0x23, 0x45]);
        assert_eq!(&bytes[8..24], &gid.raw());
        assert_eq!(&bytes[24..32], &0x0106_1c46u64.to_be_bytes());
        assert_eq!(&bytes[32..40], &[0xff; 8]);
        assert_eq!(&bytes[40..48], &7u64.to_ne_bytes());
    }

    #[test]
    fn services_and_ports() {
        let a = IbAddr::new(Gid::default()).with_service(PortSpace::Tcp, 7471);
        assert_eq!(a.sid, u64::from(crate::ffi::RDMA_IB_IP_PS_TCP) | 7471);
        assert_eq!(a.sid_mask, !0, "as librdmacm sets it");
        assert_eq!(a.port(), 7471);
        assert_eq!(CmAddr::from(a).family(), libc::AF_IB);
    }

    #[test]
    fn unknown_families_are_kept_and_refused_as_input() {
        // SAFETY: an all-zero sockaddr_storage is valid.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        storage.ss_family = libc::AF_UNIX as libc::sa_family_t;
        // SAFETY: a whole storage.
        let got = unsafe { from_sockaddr_storage(std::ptr::addr_of!(storage).cast()) };
        assert_eq!(got, Some(CmAddr::Unknown(libc::AF_UNIX as u16)));
        let e = to_sockaddr("rdma_bind_addr", &got.unwrap()).unwrap_err();
        assert!(e.to_string().contains("rdma_bind_addr"), "{e}");
        // An AF_IB address cut short is not read past its end.
        storage.ss_family = libc::AF_IB as libc::sa_family_t;
        // SAFETY: 16 readable bytes.
        let short = unsafe { from_sockaddr_len(std::ptr::addr_of!(storage).cast(), 16) };
        assert_eq!(short, Some(CmAddr::Unknown(libc::AF_IB as u16)));
        // Unset.
        storage.ss_family = 0;
        // SAFETY: a whole storage.
        let unset = unsafe { from_sockaddr_storage(std::ptr::addr_of!(storage).cast()) };
        assert_eq!(unset, None);
    }
}
