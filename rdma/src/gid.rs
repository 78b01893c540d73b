//! GIDs and GID table entries (`union ibv_gid`, `struct ibv_gid_entry`).

use std::ffi::CStr;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::ffi;
use crate::macros::c_enum;

/// A 128-bit global identifier, in network byte order as on the wire.
///
/// ```no_run
/// # fn main() -> rdma::Result<()> {
/// let ctx = rdma::Context::open("rxe0")?;
/// let gid: rdma::Gid = ctx.query_gid(1, 1)?;
/// println!("{gid}"); // as sysfs prints it: 0000:0000:0000:0000:0000:ffff:0a08:0001
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid([u8; 16]);

impl Gid {
    /// From the 16 raw bytes.
    pub const fn from_raw(raw: [u8; 16]) -> Self {
        Gid(raw)
    }

    /// The 16 raw bytes.
    pub const fn raw(&self) -> [u8; 16] {
        self.0
    }

    /// The subnet prefix (first 8 bytes), in host byte order.
    pub fn subnet_prefix(&self) -> u64 {
        u64::from_be_bytes(self.0[..8].try_into().expect("8 bytes"))
    }

    /// The interface id (last 8 bytes), in host byte order.
    pub fn interface_id(&self) -> u64 {
        u64::from_be_bytes(self.0[8..].try_into().expect("8 bytes"))
    }

    /// True for the all-zero GID (an unused table entry).
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// The GID as an IPv6 address (RoCE GIDs are IP addresses).
    pub fn to_ipv6(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.0)
    }

    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`, RoCE v2).
    pub fn to_ipv4_mapped(&self) -> Option<Ipv4Addr> {
        self.to_ipv6().to_ipv4_mapped()
    }

    /// The raw C union.
    pub fn to_ffi(&self) -> ffi::ibv_gid {
        ffi::ibv_gid { raw: self.0 }
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(a: Ipv6Addr) -> Self {
        Gid(a.octets())
    }
}

impl From<Ipv4Addr> for Gid {
    /// The IPv4-mapped GID `::ffff:a.b.c.d`.
    fn from(a: Ipv4Addr) -> Self {
        Gid(a.to_ipv6_mapped().octets())
    }
}

impl fmt::Display for Gid {
    /// Eight groups of four hex digits, as `ibv_devinfo` and sysfs print them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

c_enum! {
    /// `enum ibv_gid_type`.
    pub enum GidType: u32 {
        /// InfiniBand (also what iWARP devices report).
        Ib = ffi::IBV_GID_TYPE_IB,
        /// RoCE v1 (Ethernet, ethertype 0x8915).
        RoceV1 = ffi::IBV_GID_TYPE_ROCE_V1,
        /// RoCE v2 (UDP/IP, port 4791).
        RoceV2 = ffi::IBV_GID_TYPE_ROCE_V2,
    }
}

impl fmt::Display for GidType {
    /// As sysfs `gid_attrs/types` spells them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GidType::Ib => f.write_str("IB/RoCE v1"),
            GidType::RoceV1 => f.write_str("RoCE v1"),
            GidType::RoceV2 => f.write_str("RoCE v2"),
            GidType::Unknown(v) => write!(f, "unknown ({v})"),
        }
    }
}

/// One entry of a port's GID table (`struct ibv_gid_entry`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GidEntry {
    /// The GID.
    pub gid: Gid,
    /// Its index in the port's table.
    pub index: u32,
    /// The port.
    pub port: u32,
    /// Its type.
    pub gid_type: GidType,
    /// The ifindex of the netdev it belongs to (0: none).
    pub ndev_ifindex: u32,
}

impl GidEntry {
    pub(crate) fn from_raw(e: &ffi::ibv_gid_entry) -> Self {
        GidEntry {
            // SAFETY: any bit pattern is a valid `[u8; 16]`.
            gid: Gid(unsafe { e.gid.raw }),
            index: e.gid_index,
            port: e.port_num,
            gid_type: GidType::from_raw(e.gid_type),
            ndev_ifindex: e.ndev_ifindex,
        }
    }

    /// The name of the netdev behind the GID (`veth0`, `eth0`), if any.
    pub fn netdev_name(&self) -> Option<String> {
        if self.ndev_ifindex == 0 {
            return None;
        }
        let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
        // SAFETY: `buf` has IF_NAMESIZE bytes, as if_indextoname requires.
        let p = unsafe { libc::if_indextoname(self.ndev_ifindex, buf.as_mut_ptr()) };
        if p.is_null() {
            return None;
        }
        // SAFETY: on success the buffer holds a NUL-terminated name.
        let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
        Some(name.to_string_lossy().into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_mapped_gid() {
        let g = Gid::from(Ipv4Addr::new(10, 8, 0, 1));
        assert_eq!(g.to_string(), "0000:0000:0000:0000:0000:ffff:0a08:0001");
        assert_eq!(g.to_ipv4_mapped(), Some(Ipv4Addr::new(10, 8, 0, 1)));
        assert_eq!(g.subnet_prefix(), 0);
        assert_eq!(g.interface_id(), 0x0000_ffff_0a08_0001);
        assert!(!g.is_zero());
        assert!(Gid::default().is_zero());
    }

    #[test]
    fn gid_type_unknown_kept() {
        assert_eq!(GidType::from_raw(2), GidType::RoceV2);
        assert_eq!(GidType::from_raw(9), GidType::Unknown(9));
    }
}
