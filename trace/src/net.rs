//! From a captured frame to its IP addresses and UDP or TCP payload, with `etherparse` for the
//! link and IP layers (VLAN tags, IPv4, IPv6 and its extension headers included).

use std::net::IpAddr;

use etherparse::{EtherType, IpNumber, LaxNetSlice, LaxSlicedPacket};

use crate::bytes::Reader;

/// The IP and transport layers of a frame.
#[derive(Clone, Copy, Debug)]
pub struct Datagram<'a> {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// The IP header as captured (the ICRC covers it): IPv4 with its options, IPv6 without
    /// extension headers.
    pub ip_header: IpHeader,
    /// What the IP packet carries.
    pub l4: L4<'a>,
}

/// A copy of an IP header (at most 60 bytes).
#[derive(Clone, Copy, Debug)]
pub struct IpHeader {
    buf: [u8; 60],
    len: usize,
}

impl IpHeader {
    fn new(h: &[u8]) -> Self {
        let mut buf = [0u8; 60];
        let len = h.len().min(60);
        buf[..len].copy_from_slice(&h[..len]);
        IpHeader { buf, len }
    }

    /// The header's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// A transport segment.
#[derive(Clone, Copy, Debug)]
pub enum L4<'a> {
    /// UDP.
    Udp {
        /// Source port.
        src_port: u16,
        /// Destination port.
        dst_port: u16,
        /// The 8-byte header.
        header: &'a [u8],
        /// The payload (what was captured of it).
        payload: &'a [u8],
        /// Whether the capture holds the whole payload.
        complete: bool,
    },
    /// TCP.
    Tcp {
        /// Source port.
        src_port: u16,
        /// Destination port.
        dst_port: u16,
        /// Sequence number.
        seq: u32,
        /// SYN flag.
        syn: bool,
        /// FIN flag.
        fin: bool,
        /// RST flag.
        rst: bool,
        /// The payload (what was captured of it).
        payload: &'a [u8],
        /// Whether the capture holds the whole payload.
        complete: bool,
    },
    /// Another protocol, or a fragment.
    Other,
}

/// Why a frame yields no datagram.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NetError {
    /// A link type this tool does not read.
    LinkType(i32),
    /// Not IP (ARP, LLDP, ...).
    NotIp,
    /// A header cut short or malformed.
    Malformed(String),
}

impl std::fmt::Display for NetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NetError::LinkType(l) => write!(f, "link type {l} not supported"),
            NetError::NotIp => write!(f, "not IP"),
            NetError::Malformed(s) => write!(f, "malformed: {s}"),
        }
    }
}

/// Splits a frame of link type `linktype` into its IP and transport layers.
pub fn dissect(linktype: i32, data: &[u8]) -> Result<Datagram<'_>, NetError> {
    let sliced = match linktype {
        1 => {
            LaxSlicedPacket::from_ethernet(data).map_err(|e| NetError::Malformed(e.to_string()))?
        }
        113 => {
            // Linux cooked capture v1: 16 bytes, protocol in the last two.
            let proto = data
                .get(14..16)
                .ok_or(NetError::Malformed("SLL header".into()))?;
            let rest = data.get(16..).unwrap_or(&[]);
            LaxSlicedPacket::from_ether_type(
                EtherType(u16::from_be_bytes([proto[0], proto[1]])),
                rest,
            )
        }
        276 => {
            // Linux cooked capture v2: 20 bytes, protocol in the first two.
            let proto = data
                .get(0..2)
                .ok_or(NetError::Malformed("SLL2 header".into()))?;
            let rest = data
                .get(20..)
                .ok_or(NetError::Malformed("SLL2 header".into()))?;
            LaxSlicedPacket::from_ether_type(
                EtherType(u16::from_be_bytes([proto[0], proto[1]])),
                rest,
            )
        }
        101 | 228 | 229 | 12 | 14 => {
            LaxSlicedPacket::from_ip(data).map_err(|e| NetError::Malformed(e.to_string()))?
        }
        other => return Err(NetError::LinkType(other)),
    };
    let (src, dst, ip_header, payload) = match &sliced.net {
        Some(LaxNetSlice::Ipv4(v4)) => {
            let h = v4.header();
            (
                IpAddr::V4(h.source_addr()),
                IpAddr::V4(h.destination_addr()),
                IpHeader::new(h.slice()),
                v4.payload(),
            )
        }
        Some(LaxNetSlice::Ipv6(v6)) => {
            let h = v6.header();
            (
                IpAddr::V6(h.source_addr()),
                IpAddr::V6(h.destination_addr()),
                IpHeader::new(h.slice()),
                v6.payload(),
            )
        }
        _ => {
            return Err(match &sliced.stop_err {
                Some((e, _)) => NetError::Malformed(e.to_string()),
                None => NetError::NotIp,
            })
        }
    };
    let ip_complete = !payload.incomplete;
    let l4 = if payload.fragmented {
        L4::Other
    } else if payload.ip_number == IpNumber::UDP {
        udp(payload.payload, ip_complete)?
    } else if payload.ip_number == IpNumber::TCP {
        tcp(payload.payload, ip_complete)?
    } else {
        L4::Other
    };
    Ok(Datagram {
        src,
        dst,
        ip_header,
        l4,
    })
}

fn udp(seg: &[u8], ip_complete: bool) -> Result<L4<'_>, NetError> {
    let mut r = Reader::new(seg);
    let bad = |s: crate::bytes::Short| {
        NetError::Malformed(format!("UDP header: {} of {} bytes", s.have, s.need))
    };
    let header = r.take(8, "UDP").map_err(bad)?;
    let mut h = Reader::new(header);
    let src_port = h.u16("UDP").map_err(bad)?;
    let dst_port = h.u16("UDP").map_err(bad)?;
    let len = usize::from(h.u16("UDP").map_err(bad)?);
    let want = len.saturating_sub(8);
    let rest = r.rest();
    let complete = ip_complete && rest.len() >= want;
    Ok(L4::Udp {
        src_port,
        dst_port,
        header,
        payload: rest.get(..want).unwrap_or(rest),
        complete,
    })
}

fn tcp(seg: &[u8], ip_complete: bool) -> Result<L4<'_>, NetError> {
    let bad = |s: crate::bytes::Short| {
        NetError::Malformed(format!("TCP header: {} of {} bytes", s.have, s.need))
    };
    let mut r = Reader::new(seg);
    let src_port = r.u16("TCP").map_err(bad)?;
    let dst_port = r.u16("TCP").map_err(bad)?;
    let seq = r.u32("TCP").map_err(bad)?;
    r.u32("TCP").map_err(bad)?;
    let off_flags = r.u16("TCP").map_err(bad)?;
    let hlen = usize::from(off_flags >> 12) * 4;
    if hlen < 20 {
        return Err(NetError::Malformed(format!("TCP data offset {hlen}")));
    }
    let mut r = Reader::new(seg);
    r.take(hlen, "TCP options").map_err(bad)?;
    Ok(L4::Tcp {
        src_port,
        dst_port,
        seq,
        syn: off_flags & 0x02 != 0,
        fin: off_flags & 0x01 != 0,
        rst: off_flags & 0x04 != 0,
        payload: r.rest(),
        complete: ip_complete,
    })
}

/// Builds an Ethernet/IPv4/UDP frame around `payload` (tests and fixtures).
pub fn build_udp4(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
    let total = u16::try_from(20 + 8 + payload.len()).unwrap_or(u16::MAX);
    f.extend_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0]);
    f[16..18].copy_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&src);
    f.extend_from_slice(&dst);
    let mut sum = 0u32;
    for c in f[14..34].chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let csum = !u16::try_from(sum).unwrap_or(0);
    f[24..26].copy_from_slice(&csum.to_be_bytes());
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&(total - 20).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    f
}

/// Builds an Ethernet/IPv4/TCP frame around `payload` (tests and fixtures): `flags` is the
/// TCP flags byte (0x02 SYN, 0x10 ACK, 0x18 PSH+ACK); the TCP checksum is left zero.
pub fn build_tcp4(
    src: [u8; 4],
    dst: [u8; 4],
    (sport, dport): (u16, u16),
    (seq, ack): (u32, u32),
    flags: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut tcp = Vec::with_capacity(20 + payload.len());
    tcp.extend_from_slice(&sport.to_be_bytes());
    tcp.extend_from_slice(&dport.to_be_bytes());
    tcp.extend_from_slice(&seq.to_be_bytes());
    tcp.extend_from_slice(&ack.to_be_bytes());
    tcp.extend_from_slice(&[0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
    tcp.extend_from_slice(payload);
    let mut f = build_udp4(src, dst, 0, 0, &[]);
    f.truncate(34);
    f[23] = 6;
    let total = u16::try_from(20 + tcp.len()).unwrap_or(u16::MAX);
    f[16..18].copy_from_slice(&total.to_be_bytes());
    f[24..26].copy_from_slice(&[0, 0]);
    let mut sum = 0u32;
    for c in f[14..34].chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let csum = !u16::try_from(sum).unwrap_or(0);
    f[24..26].copy_from_slice(&csum.to_be_bytes());
    f.extend_from_slice(&tcp);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_over_ethernet_and_cut_frames() {
        let f = build_udp4([10, 8, 0, 1], [10, 8, 0, 2], 49152, 4791, b"abcdefgh");
        let d = dissect(1, &f).unwrap();
        assert_eq!(d.src.to_string(), "10.8.0.1");
        assert_eq!(d.dst.to_string(), "10.8.0.2");
        assert_eq!(d.ip_header.bytes().len(), 20);
        let L4::Udp {
            dst_port,
            payload,
            complete,
            ..
        } = d.l4
        else {
            panic!("{:?}", d.l4)
        };
        assert_eq!(
            (dst_port, payload, complete),
            (4791, &b"abcdefgh"[..], true)
        );
        // Ethernet padding after the datagram is not payload.
        let mut padded = f.clone();
        padded.extend_from_slice(&[0; 6]);
        let L4::Udp { payload, .. } = dissect(1, &padded).unwrap().l4 else {
            panic!()
        };
        assert_eq!(payload, b"abcdefgh");
        // Cut anywhere: an error or an incomplete payload, never a panic.
        for cut in 0..f.len() {
            if let Ok(Datagram {
                l4: L4::Udp {
                    complete, payload, ..
                },
                ..
            }) = dissect(1, &f[..cut])
            {
                assert!(!complete);
                assert_eq!(payload.len(), cut - 42);
            }
        }
        assert_eq!(dissect(147, &f).unwrap_err(), NetError::LinkType(147));
    }
}
