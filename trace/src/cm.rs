//! InfiniBand Communication Management MADs (IBTA volume 1, chapter 12), which RoCEv2 carries as
//! UD sends to QP1: REQ, REP, RTU, REJ, MRA, DREQ, DREP with their private data, and the IP
//! addressing header rdma_cm puts at the start of a REQ's private data.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::Serialize;

use crate::bytes::{Reader, Short};

/// Management class of the CM.
pub const MGMT_CLASS_CM: u8 = 0x07;

/// The 24-byte common MAD header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MadHeader {
    /// Base version (1).
    pub base_version: u8,
    /// Management class.
    pub mgmt_class: u8,
    /// Class version.
    pub class_version: u8,
    /// Method, with the response bit.
    pub method: u8,
    /// Status.
    pub status: u16,
    /// Class-specific field.
    pub class_specific: u16,
    /// Transaction ID.
    pub transaction_id: u64,
    /// Attribute ID: which CM message.
    pub attribute_id: u16,
    /// Attribute modifier.
    pub attribute_modifier: u32,
}

/// A CM message's own fields. Communication IDs are the sender's ("local") and the peer's
/// ("remote").
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "msg", rename_all = "UPPERCASE")]
pub enum CmMessage {
    /// Connection request.
    Req {
        /// Sender's communication ID.
        local_comm_id: u32,
        /// Service ID.
        service_id: u64,
        /// Sender's CA GUID.
        local_ca_guid: u64,
        /// Sender's QP.
        local_qpn: u32,
        /// Starting PSN of the sender's requests.
        starting_psn: u32,
        /// Partition key.
        pkey: u16,
        /// Path MTU code (1=256 ... 5=4096).
        path_mtu: u8,
        /// Transport service type (0 RC, 1 UC, 3 XRC-ish extended).
        transport: u8,
        /// Primary path: the sender's GID.
        local_gid: [u8; 16],
        /// Primary path: the receiver's GID.
        remote_gid: [u8; 16],
        /// rdma_cm's addressing header, when the service ID is in an rdma_cm port space.
        ip: Option<IpCm>,
        /// Private data (92 bytes, rdma_cm's header included).
        #[serde(serialize_with = "crate::bytes::ser_hex")]
        private: Vec<u8>,
    },
    /// Connection reply.
    Rep {
        /// Sender's communication ID.
        local_comm_id: u32,
        /// The REQ's communication ID.
        remote_comm_id: u32,
        /// Sender's QP.
        local_qpn: u32,
        /// Starting PSN of the sender's requests.
        starting_psn: u32,
        /// Sender's CA GUID.
        local_ca_guid: u64,
        /// Private data (196 bytes).
        #[serde(serialize_with = "crate::bytes::ser_hex")]
        private: Vec<u8>,
    },
    /// Ready to use.
    Rtu {
        /// Sender's communication ID.
        local_comm_id: u32,
        /// Peer's communication ID.
        remote_comm_id: u32,
        /// Private data (224 bytes).
        #[serde(serialize_with = "crate::bytes::ser_hex")]
        private: Vec<u8>,
    },
    /// Reject.
    Rej {
        /// Sender's communication ID.
        local_comm_id: u32,
        /// Peer's communication ID.
        remote_comm_id: u32,
        /// Which message is rejected (0 REQ, 1 REP, 2 other).
        msg_rejected: u8,
        /// Reason code.
        reason: u16,
        /// Private data (148 bytes).
        #[serde(serialize_with = "crate::bytes::ser_hex")]
        private: Vec<u8>,
    },
    /// Message receipt acknowledgement.
    Mra {
        /// Sender's communication ID.
        local_comm_id: u32,
        /// Peer's communication ID.
        remote_comm_id: u32,
        /// Private data (222 bytes).
        #[serde(serialize_with = "crate::bytes::ser_hex")]
        private: Vec<u8>,
    },
    /// Disconnect request.
    Dreq {
        /// Sender's communication ID.
        local_comm_id: u32,
        /// Peer's communication ID.
        remote_comm_id: u32,
        /// The peer's QP.
        remote_qpn: u32,
        /// Private data (220 bytes).
        #[serde(serialize_with = "crate::bytes::ser_hex")]
        private: Vec<u8>,
    },
    /// Disconnect reply.
    Drep {
        /// Sender's communication ID.
        local_comm_id: u32,
        /// Peer's communication ID.
        remote_comm_id: u32,
        /// Private data (224 bytes).
        #[serde(serialize_with = "crate::bytes::ser_hex")]
        private: Vec<u8>,
    },
    /// Another CM attribute (SIDR, LAP, APR, ClassPortInfo), not decoded further.
    Other {
        /// Attribute ID.
        attribute_id: u16,
    },
}

impl CmMessage {
    /// Short name: "REQ", "REP", ...
    pub fn name(&self) -> &'static str {
        match self {
            CmMessage::Req { .. } => "REQ",
            CmMessage::Rep { .. } => "REP",
            CmMessage::Rtu { .. } => "RTU",
            CmMessage::Rej { .. } => "REJ",
            CmMessage::Mra { .. } => "MRA",
            CmMessage::Dreq { .. } => "DREQ",
            CmMessage::Drep { .. } => "DREP",
            CmMessage::Other { .. } => "CM",
        }
    }
}

/// rdma_cm's header at the start of a REQ's private data (IP-based connection management).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct IpCm {
    /// Major and minor version byte.
    pub version: u8,
    /// IP version (4 or 6).
    pub ip_version: u8,
    /// Source port.
    pub src_port: u16,
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
}

/// A decoded CM MAD.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CmMad {
    /// The common MAD header.
    pub header: MadHeader,
    /// The CM message.
    pub message: CmMessage,
}

/// Decodes the MAD header of a QP1 payload.
pub fn parse_mad_header(data: &[u8]) -> Result<MadHeader, Short> {
    let mut r = Reader::new(data);
    let h = MadHeader {
        base_version: r.u8("MAD header")?,
        mgmt_class: r.u8("MAD header")?,
        class_version: r.u8("MAD header")?,
        method: r.u8("MAD header")?,
        status: r.u16("MAD header")?,
        class_specific: r.u16("MAD header")?,
        transaction_id: r.u64("MAD header")?,
        attribute_id: r.u16("MAD header")?,
        attribute_modifier: {
            r.u16("MAD header")?;
            r.u32("MAD header")?
        },
    };
    Ok(h)
}

/// Decodes a CM MAD (QP1 payload, 256 bytes). `Ok(None)` for a MAD of another management class.
pub fn parse(data: &[u8]) -> Result<Option<CmMad>, Short> {
    let header = parse_mad_header(data)?;
    if header.mgmt_class != MGMT_CLASS_CM {
        return Ok(None);
    }
    let body = data.get(24..).unwrap_or(&[]);
    let mut r = Reader::new(body);
    let message = match header.attribute_id {
        0x0010 => {
            let local_comm_id = r.u32("REQ")?;
            r.u32("REQ")?;
            let service_id = r.u64("REQ")?;
            let local_ca_guid = r.u64("REQ")?;
            r.u32("REQ")?;
            r.u32("REQ")?; // local Q_Key
            let local_qpn = r.u32("REQ")? >> 8;
            r.u32("REQ")?; // local EECN, initiator depth
            let w = r.u32("REQ")?; // remote EECN, timeouts, transport type, flow control
            let transport = u8::try_from((w >> 1) & 3).unwrap_or(0);
            let starting_psn = r.u32("REQ")? >> 8;
            let pkey = r.u16("REQ")?;
            let path_mtu = r.u8("REQ")? >> 4;
            r.u8("REQ")?;
            r.u32("REQ")?; // LIDs
            let local_gid = r.array::<16>("REQ")?;
            let remote_gid = r.array::<16>("REQ")?;
            r.take(52, "REQ")?; // rest of the primary path (44 bytes), alternate path (44)
            let private = r.take(92, "REQ private data")?.to_vec();
            // rdma_cm's service IDs: port space << 16 | port (TCP 0x106, UDP 0x111, IB 0x13f).
            let ip = if matches!(service_id >> 16, 0x0106 | 0x0111 | 0x013f) {
                parse_ip_cm(&private)
            } else {
                None
            };
            CmMessage::Req {
                local_comm_id,
                service_id,
                local_ca_guid,
                local_qpn,
                starting_psn,
                pkey,
                path_mtu,
                transport,
                local_gid,
                remote_gid,
                ip,
                private,
            }
        }
        0x0013 => {
            let local_comm_id = r.u32("REP")?;
            let remote_comm_id = r.u32("REP")?;
            r.u32("REP")?;
            let local_qpn = r.u32("REP")? >> 8;
            r.u32("REP")?;
            let starting_psn = r.u32("REP")? >> 8;
            r.u32("REP")?;
            let local_ca_guid = r.u64("REP")?;
            let private = r.take(196, "REP private data")?.to_vec();
            CmMessage::Rep {
                local_comm_id,
                remote_comm_id,
                local_qpn,
                starting_psn,
                local_ca_guid,
                private,
            }
        }
        0x0014 | 0x0016 | 0x0011 => {
            let local_comm_id = r.u32("CM")?;
            let remote_comm_id = r.u32("CM")?;
            if header.attribute_id == 0x0011 {
                r.u16("MRA")?;
                let private = r.take(222, "MRA private data")?.to_vec();
                CmMessage::Mra {
                    local_comm_id,
                    remote_comm_id,
                    private,
                }
            } else {
                let private = r.take(224, "private data")?.to_vec();
                if header.attribute_id == 0x0014 {
                    CmMessage::Rtu {
                        local_comm_id,
                        remote_comm_id,
                        private,
                    }
                } else {
                    CmMessage::Drep {
                        local_comm_id,
                        remote_comm_id,
                        private,
                    }
                }
            }
        }
        0x0012 => {
            let local_comm_id = r.u32("REJ")?;
            let remote_comm_id = r.u32("REJ")?;
            let msg_rejected = r.u8("REJ")? >> 6;
            r.u8("REJ")?;
            let reason = r.u16("REJ")?;
            r.take(72, "REJ")?;
            let private = r.take(148, "REJ private data")?.to_vec();
            CmMessage::Rej {
                local_comm_id,
                remote_comm_id,
                msg_rejected,
                reason,
                private,
            }
        }
        0x0015 => {
            let local_comm_id = r.u32("DREQ")?;
            let remote_comm_id = r.u32("DREQ")?;
            let remote_qpn = r.u32("DREQ")? >> 8;
            let private = r.take(220, "DREQ private data")?.to_vec();
            CmMessage::Dreq {
                local_comm_id,
                remote_comm_id,
                remote_qpn,
                private,
            }
        }
        attribute_id => CmMessage::Other { attribute_id },
    };
    Ok(Some(CmMad { header, message }))
}

fn parse_ip_cm(p: &[u8]) -> Option<IpCm> {
    let mut r = Reader::new(p);
    let version = r.u8("").ok()?;
    let ip_version = r.u8("").ok()? >> 4;
    let src_port = r.u16("").ok()?;
    let s = r.array::<16>("").ok()?;
    let d = r.array::<16>("").ok()?;
    let addr = |a: [u8; 16]| -> IpAddr {
        if ip_version == 4 {
            IpAddr::V4(Ipv4Addr::new(a[12], a[13], a[14], a[15]))
        } else {
            IpAddr::V6(Ipv6Addr::from(a))
        }
    };
    Some(IpCm {
        version,
        ip_version,
        src_port,
        src: addr(s),
        dst: addr(d),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A 256-byte CM MAD with `attr` and body bytes `body` at the start of the CM data.
    pub(crate) fn mad(attr: u16, body: &[u8]) -> Vec<u8> {
        let mut m = vec![1, MGMT_CLASS_CM, 2, 3, 0, 0, 0, 0];
        m.extend_from_slice(&0x1234_5678_9abc_def0u64.to_be_bytes());
        m.extend_from_slice(&attr.to_be_bytes());
        m.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        m.extend_from_slice(body);
        m.resize(256, 0);
        m
    }

    #[test]
    fn req_with_rdma_cm_header() {
        let mut b = vec![0u8; 232];
        b[0..4].copy_from_slice(&0x1111_2222u32.to_be_bytes());
        b[8..16].copy_from_slice(&0x0000_0000_0106_1234u64.to_be_bytes());
        b[16..24].copy_from_slice(&0x0202_0304_0506_0708u64.to_be_bytes());
        b[32..36].copy_from_slice(&(0x0000_1234u32 << 8 | 4).to_be_bytes());
        b[40] = 0; // remote EECN
        b[43] = 0; // RC, no flow control
        b[44..48].copy_from_slice(&(0x00ab_cdefu32 << 8).to_be_bytes());
        b[48..50].copy_from_slice(&0xffffu16.to_be_bytes());
        b[50] = 3 << 4;
        b[56..72].copy_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 8, 0, 1]);
        // rdma_cm header: version 0, IPv4, port 0x5555, 10.8.0.1 -> 10.8.0.2
        b[140] = 0;
        b[141] = 0x40;
        b[142..144].copy_from_slice(&0x5555u16.to_be_bytes());
        b[156..160].copy_from_slice(&[10, 8, 0, 1]);
        b[172..176].copy_from_slice(&[10, 8, 0, 2]);
        b[176] = 0x99;
        let m = parse(&mad(0x10, &b)).unwrap().unwrap();
        assert_eq!(m.header.transaction_id, 0x1234_5678_9abc_def0);
        let CmMessage::Req {
            local_comm_id,
            service_id,
            local_qpn,
            starting_psn,
            path_mtu,
            local_gid,
            ip,
            private,
            ..
        } = m.message
        else {
            panic!("not a REQ: {:?}", m.message)
        };
        assert_eq!(local_comm_id, 0x1111_2222);
        assert_eq!(service_id, 0x0106_1234);
        assert_eq!(local_qpn, 0x1234);
        assert_eq!(starting_psn, 0xab_cdef);
        assert_eq!(path_mtu, 3);
        assert_eq!(local_gid[15], 1);
        assert_eq!(private.len(), 92);
        assert_eq!(private[36], 0x99);
        let ip = ip.unwrap();
        assert_eq!(ip.src, IpAddr::V4(Ipv4Addr::new(10, 8, 0, 1)));
        assert_eq!(ip.dst, IpAddr::V4(Ipv4Addr::new(10, 8, 0, 2)));
        assert_eq!(ip.src_port, 0x5555);
    }

    #[test]
    fn rep_rtu_rej_dreq_drep() {
        let mut b = vec![0u8; 232];
        b[0..4].copy_from_slice(&5u32.to_be_bytes());
        b[4..8].copy_from_slice(&6u32.to_be_bytes());
        b[12..16].copy_from_slice(&(0x77u32 << 8).to_be_bytes());
        b[36] = 0xaa;
        let CmMessage::Rep {
            local_qpn, private, ..
        } = parse(&mad(0x13, &b)).unwrap().unwrap().message
        else {
            panic!()
        };
        assert_eq!((local_qpn, private.len(), private[0]), (0x77, 196, 0xaa));
        assert_eq!(
            parse(&mad(0x14, &b)).unwrap().unwrap().message.name(),
            "RTU"
        );
        let mut rej = b.clone();
        rej[8] = 0x40;
        rej[10..12].copy_from_slice(&28u16.to_be_bytes());
        let CmMessage::Rej {
            msg_rejected,
            reason,
            private,
            ..
        } = parse(&mad(0x12, &rej)).unwrap().unwrap().message
        else {
            panic!()
        };
        assert_eq!((msg_rejected, reason, private.len()), (1, 28, 148));
        let mut dreq = b.clone();
        dreq[8..12].copy_from_slice(&(0x77u32 << 8).to_be_bytes());
        let CmMessage::Dreq { remote_qpn, .. } = parse(&mad(0x15, &dreq)).unwrap().unwrap().message
        else {
            panic!()
        };
        assert_eq!(remote_qpn, 0x77);
        assert_eq!(
            parse(&mad(0x16, &b)).unwrap().unwrap().message.name(),
            "DREP"
        );
        // Cut short anywhere: an error, never a panic.
        let full = mad(0x10, &b);
        for cut in 0..full.len() {
            assert!(parse(&full[..cut]).is_err(), "cut {cut}");
        }
        // Another management class.
        let mut sa = mad(0x10, &b);
        sa[1] = 0x03;
        assert_eq!(parse(&sa), Ok(None));
    }
}
