//! InfiniBand transport headers as RoCEv2 carries them: the Base Transport Header and the
//! extended headers each opcode brings (IBTA volume 1, chapter 9).
//!
//! [`parse`] takes the UDP payload of a RoCEv2 datagram and never panics: a header cut short is
//! [`IbError::Short`], an opcode this decoder does not know is [`IbError::UnknownOpcode`].

use serde::Serialize;

use crate::bytes::{Reader, Short};

/// The UDP destination port of RoCEv2.
pub const ROCEV2_PORT: u16 = 4791;

/// Transport service of an opcode: its upper three bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Transport {
    /// Reliable Connected.
    Rc,
    /// Unreliable Connected.
    Uc,
    /// Reliable Datagram.
    Rd,
    /// Unreliable Datagram.
    Ud,
    /// Congestion Notification Packet (RoCEv2).
    Cnp,
    /// Extended Reliable Connected.
    Xrc,
    /// Manufacturer-specific opcodes.
    Vendor,
}

impl Transport {
    /// Short upper-case name, as packet lines print it.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Rc => "RC",
            Transport::Uc => "UC",
            Transport::Rd => "RD",
            Transport::Ud => "UD",
            Transport::Cnp => "CNP",
            Transport::Xrc => "XRC",
            Transport::Vendor => "VENDOR",
        }
    }
}

/// The operation of an opcode: its lower five bits (for CNP, the whole opcode).
#[allow(missing_docs)] // the names are the specification's
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Op {
    SendFirst,
    SendMiddle,
    SendLast,
    SendLastImm,
    SendOnly,
    SendOnlyImm,
    WriteFirst,
    WriteMiddle,
    WriteLast,
    WriteLastImm,
    WriteOnly,
    WriteOnlyImm,
    ReadRequest,
    ReadResponseFirst,
    ReadResponseMiddle,
    ReadResponseLast,
    ReadResponseOnly,
    Acknowledge,
    AtomicAcknowledge,
    CompareSwap,
    FetchAdd,
    SendLastInv,
    SendOnlyInv,
    Cnp,
}

/// Where a packet sits in its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Position {
    /// The first packet of several.
    First,
    /// Neither first nor last.
    Middle,
    /// The last packet of several.
    Last,
    /// The whole message in one packet.
    Only,
}

impl Op {
    /// The name rdma-core and the specification use, upper case with underscores.
    pub fn name(self) -> &'static str {
        match self {
            Op::SendFirst => "SEND_FIRST",
            Op::SendMiddle => "SEND_MIDDLE",
            Op::SendLast => "SEND_LAST",
            Op::SendLastImm => "SEND_LAST_IMM",
            Op::SendOnly => "SEND_ONLY",
            Op::SendOnlyImm => "SEND_ONLY_IMM",
            Op::WriteFirst => "WRITE_FIRST",
            Op::WriteMiddle => "WRITE_MIDDLE",
            Op::WriteLast => "WRITE_LAST",
            Op::WriteLastImm => "WRITE_LAST_IMM",
            Op::WriteOnly => "WRITE_ONLY",
            Op::WriteOnlyImm => "WRITE_ONLY_IMM",
            Op::ReadRequest => "READ_REQUEST",
            Op::ReadResponseFirst => "READ_RESPONSE_FIRST",
            Op::ReadResponseMiddle => "READ_RESPONSE_MIDDLE",
            Op::ReadResponseLast => "READ_RESPONSE_LAST",
            Op::ReadResponseOnly => "READ_RESPONSE_ONLY",
            Op::Acknowledge => "ACK",
            Op::AtomicAcknowledge => "ATOMIC_ACK",
            Op::CompareSwap => "CMP_SWAP",
            Op::FetchAdd => "FETCH_ADD",
            Op::SendLastInv => "SEND_LAST_INV",
            Op::SendOnlyInv => "SEND_ONLY_INV",
            Op::Cnp => "CNP",
        }
    }

    fn from_low_bits(low: u8) -> Option<Op> {
        Some(match low {
            0x00 => Op::SendFirst,
            0x01 => Op::SendMiddle,
            0x02 => Op::SendLast,
            0x03 => Op::SendLastImm,
            0x04 => Op::SendOnly,
            0x05 => Op::SendOnlyImm,
            0x06 => Op::WriteFirst,
            0x07 => Op::WriteMiddle,
            0x08 => Op::WriteLast,
            0x09 => Op::WriteLastImm,
            0x0a => Op::WriteOnly,
            0x0b => Op::WriteOnlyImm,
            0x0c => Op::ReadRequest,
            0x0d => Op::ReadResponseFirst,
            0x0e => Op::ReadResponseMiddle,
            0x0f => Op::ReadResponseLast,
            0x10 => Op::ReadResponseOnly,
            0x11 => Op::Acknowledge,
            0x12 => Op::AtomicAcknowledge,
            0x13 => Op::CompareSwap,
            0x14 => Op::FetchAdd,
            0x16 => Op::SendLastInv,
            0x17 => Op::SendOnlyInv,
            _ => return None,
        })
    }

    /// Where the packet sits in its message, for the operations that carry data.
    pub fn position(self) -> Option<Position> {
        use Op::*;
        Some(match self {
            SendFirst | WriteFirst | ReadResponseFirst => Position::First,
            SendMiddle | WriteMiddle | ReadResponseMiddle => Position::Middle,
            SendLast | SendLastImm | SendLastInv | WriteLast | WriteLastImm | ReadResponseLast => {
                Position::Last
            }
            SendOnly | SendOnlyImm | SendOnlyInv | WriteOnly | WriteOnlyImm | ReadResponseOnly => {
                Position::Only
            }
            _ => return None,
        })
    }

    fn has_reth(self) -> bool {
        matches!(
            self,
            Op::WriteFirst | Op::WriteOnly | Op::WriteOnlyImm | Op::ReadRequest
        )
    }

    fn has_imm(self) -> bool {
        matches!(
            self,
            Op::SendLastImm | Op::SendOnlyImm | Op::WriteLastImm | Op::WriteOnlyImm
        )
    }

    fn has_aeth(self) -> bool {
        matches!(
            self,
            Op::ReadResponseFirst
                | Op::ReadResponseLast
                | Op::ReadResponseOnly
                | Op::Acknowledge
                | Op::AtomicAcknowledge
        )
    }

    fn has_payload(self) -> bool {
        !matches!(
            self,
            Op::ReadRequest
                | Op::Acknowledge
                | Op::AtomicAcknowledge
                | Op::CompareSwap
                | Op::FetchAdd
                | Op::Cnp
        )
    }
}

/// An opcode split into its transport and operation. `None` for opcodes a transport does not
/// define (or that this decoder does not handle: RD, FLUSH, ATOMIC WRITE).
pub fn opcode(code: u8) -> Option<(Transport, Op)> {
    let low = code & 0x1f;
    match code >> 5 {
        0 => Op::from_low_bits(low).map(|op| (Transport::Rc, op)),
        1 if low <= 0x0b => Op::from_low_bits(low).map(|op| (Transport::Uc, op)),
        3 if low == 0x04 || low == 0x05 => Op::from_low_bits(low).map(|op| (Transport::Ud, op)),
        4 if code == 0x81 => Some((Transport::Cnp, Op::Cnp)),
        5 => Op::from_low_bits(low).map(|op| (Transport::Xrc, op)),
        _ => None,
    }
}

/// Base Transport Header (12 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Bth {
    /// OpCode.
    pub opcode: u8,
    /// Solicited Event.
    pub se: bool,
    /// MigReq.
    pub migreq: bool,
    /// Pad count: bytes of padding after the payload.
    pub pad: u8,
    /// Transport header version.
    pub tver: u8,
    /// Partition key.
    pub pkey: u16,
    /// The reserved byte after the P_Key (FECN/BECN in some uses).
    pub resv8a: u8,
    /// Destination QP.
    pub dest_qp: u32,
    /// AckReq.
    pub ack_req: bool,
    /// Reserved bits after AckReq.
    pub resv7: u8,
    /// Packet sequence number (24 bits).
    pub psn: u32,
}

/// RDMA Extended Transport Header: the remote memory a WRITE or READ names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Reth {
    /// Virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length of the whole operation.
    pub dma_len: u32,
}

/// Atomic Extended Transport Header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct AtomicEth {
    /// Virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap (or add) data.
    pub swap_add: u64,
    /// Compare data.
    pub compare: u64,
}

/// ACK Extended Transport Header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Aeth {
    /// Syndrome: ACK, RNR NAK or NAK, with its value.
    pub syndrome: u8,
    /// Message sequence number.
    pub msn: u32,
}

impl Aeth {
    /// What the syndrome says: "ACK", "RNR_NAK", "NAK" or "RESERVED".
    pub fn kind(&self) -> &'static str {
        match self.syndrome >> 5 {
            0 => "ACK",
            1 => "RNR_NAK",
            3 => "NAK",
            _ => "RESERVED",
        }
    }
}

/// Datagram Extended Transport Header (UD).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Deth {
    /// Queue key.
    pub qkey: u32,
    /// Source QP.
    pub src_qp: u32,
}

/// One decoded RoCEv2 packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IbPacket<'a> {
    /// Base Transport Header.
    pub bth: Bth,
    /// Transport of the opcode.
    pub transport: Transport,
    /// Operation of the opcode.
    pub op: Op,
    /// XRC Extended Transport Header: the XRC SRQ number.
    pub xrc_srq: Option<u32>,
    /// Datagram header (UD).
    pub deth: Option<Deth>,
    /// RDMA header (WRITE First/Only, READ Request).
    pub reth: Option<Reth>,
    /// Atomic request header.
    pub atomic: Option<AtomicEth>,
    /// ACK header.
    pub aeth: Option<Aeth>,
    /// Atomic ACK: the original remote data.
    pub atomic_ack: Option<u64>,
    /// Immediate data.
    pub imm: Option<u32>,
    /// Invalidate header: the rkey to invalidate.
    pub ieth: Option<u32>,
    /// Payload without the padding.
    pub payload: &'a [u8],
    /// The invariant CRC as carried, read in wire order as tshark shows it (the CRC value
    /// byte-swapped: RoCEv2 carries it least significant byte first); `None` when the capture
    /// cut it off.
    pub icrc: Option<u32>,
    /// Bytes of headers (BTH through the last extended header).
    pub header_len: usize,
}

/// Why a RoCEv2 datagram did not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IbError {
    /// A header was cut short.
    Short(Short),
    /// An opcode this decoder does not know (its BTH decoded).
    UnknownOpcode(Bth),
    /// The pad count is larger than the payload.
    BadPad(Bth),
}

impl std::fmt::Display for IbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IbError::Short(s) => write!(f, "truncated {}: {} of {} bytes", s.what, s.have, s.need),
            IbError::UnknownOpcode(b) => write!(f, "unknown opcode 0x{:02x}", b.opcode),
            IbError::BadPad(b) => write!(f, "pad count {} longer than the payload", b.pad),
        }
    }
}

impl From<Short> for IbError {
    fn from(s: Short) -> Self {
        IbError::Short(s)
    }
}

/// Decodes the Base Transport Header at the start of `data`.
pub fn parse_bth(data: &[u8]) -> Result<Bth, Short> {
    let mut r = Reader::new(data);
    let opcode = r.u8("BTH")?;
    let flags = r.u8("BTH")?;
    let pkey = r.u16("BTH")?;
    let resv8a = r.u8("BTH")?;
    let dest_qp = r.u24("BTH")?;
    let a = r.u8("BTH")?;
    let psn = r.u24("BTH")?;
    Ok(Bth {
        opcode,
        se: flags & 0x80 != 0,
        migreq: flags & 0x40 != 0,
        pad: (flags >> 4) & 3,
        tver: flags & 15,
        pkey,
        resv8a,
        dest_qp,
        ack_req: a & 0x80 != 0,
        resv7: a & 0x7f,
        psn,
    })
}

/// Decodes a RoCEv2 UDP payload. `complete` says whether the capture holds the whole datagram:
/// when it does not, the ICRC is unknown and the payload is what was captured of it.
pub fn parse(data: &[u8], complete: bool) -> Result<IbPacket<'_>, IbError> {
    let bth = parse_bth(data)?;
    let (transport, op) = opcode(bth.opcode).ok_or(IbError::UnknownOpcode(bth))?;
    let mut r = Reader::new(data);
    r.take(12, "BTH")?;
    let mut p = IbPacket {
        bth,
        transport,
        op,
        xrc_srq: None,
        deth: None,
        reth: None,
        atomic: None,
        aeth: None,
        atomic_ack: None,
        imm: None,
        ieth: None,
        payload: &[],
        icrc: None,
        header_len: 0,
    };
    if transport == Transport::Ud {
        let qkey = r.u32("DETH")?;
        let src_qp = r.u32("DETH")? & 0x00ff_ffff;
        p.deth = Some(Deth { qkey, src_qp });
    }
    if transport == Transport::Xrc {
        p.xrc_srq = Some(r.u32("XRCETH")? & 0x00ff_ffff);
    }
    if op.has_reth() {
        p.reth = Some(Reth {
            va: r.u64("RETH")?,
            rkey: r.u32("RETH")?,
            dma_len: r.u32("RETH")?,
        });
    }
    if matches!(op, Op::CompareSwap | Op::FetchAdd) {
        p.atomic = Some(AtomicEth {
            va: r.u64("AtomicETH")?,
            rkey: r.u32("AtomicETH")?,
            swap_add: r.u64("AtomicETH")?,
            compare: r.u64("AtomicETH")?,
        });
    }
    if op.has_aeth() {
        let syndrome = r.u8("AETH")?;
        let msn = r.u24("AETH")?;
        p.aeth = Some(Aeth { syndrome, msn });
    }
    if op == Op::AtomicAcknowledge {
        p.atomic_ack = Some(r.u64("AtomicAckETH")?);
    }
    if op.has_imm() {
        p.imm = Some(r.u32("ImmDt")?);
    }
    if matches!(op, Op::SendLastInv | Op::SendOnlyInv) {
        p.ieth = Some(r.u32("IETH")?);
    }
    if op == Op::Cnp {
        r.take(16, "CNP")?;
    }
    p.header_len = r.pos();
    let rest = r.rest();
    if complete {
        let Some(body_len) = rest.len().checked_sub(4) else {
            return Err(IbError::Short(Short {
                what: "ICRC",
                need: 4,
                have: rest.len(),
            }));
        };
        let (body, crc) = rest.split_at(body_len);
        p.icrc = Some(u32::from_be_bytes([crc[0], crc[1], crc[2], crc[3]]));
        let pad = usize::from(bth.pad);
        let Some(payload_len) = body.len().checked_sub(pad) else {
            return Err(IbError::BadPad(bth));
        };
        p.payload = body.get(..payload_len).unwrap_or(&[]);
    } else {
        p.payload = rest;
    }
    if !op.has_payload() {
        p.payload = &[];
    }
    Ok(p)
}

/// Builds RoCEv2 packets for tests (here and in the integration tests): BTH, the extended
/// headers in `ext`, the payload padded to 4 bytes, and a zero ICRC.
pub fn build(opcode: u8, dest_qp: u32, psn: u32, ext: &[u8], payload: &[u8]) -> Vec<u8> {
    let pad = (4 - payload.len() % 4) % 4;
    let mut v = Vec::with_capacity(12 + ext.len() + payload.len() + pad + 4);
    v.push(opcode);
    // SE=0 M=0 PadCnt TVer=0
    v.push(u8::try_from(pad).unwrap_or(0) << 4);
    v.extend_from_slice(&0xffffu16.to_be_bytes());
    v.push(0);
    v.extend_from_slice(&dest_qp.to_be_bytes()[1..]);
    v.push(0x80);
    v.extend_from_slice(&psn.to_be_bytes()[1..]);
    v.extend_from_slice(ext);
    v.extend_from_slice(payload);
    v.resize(v.len() + pad + 4, 0);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reth(va: u64, rkey: u32, len: u32) -> Vec<u8> {
        let mut v = va.to_be_bytes().to_vec();
        v.extend_from_slice(&rkey.to_be_bytes());
        v.extend_from_slice(&len.to_be_bytes());
        v
    }

    #[test]
    fn every_defined_opcode_has_a_transport_and_an_operation() {
        let defined: Vec<u8> = (0u8..=255).filter(|&c| opcode(c).is_some()).collect();
        // RC 0x00-0x14, 0x16, 0x17; UC 0x20-0x2b; UD 0x64, 0x65; CNP 0x81; XRC like RC.
        assert_eq!(defined.len(), 23 + 12 + 2 + 1 + 23);
        assert_eq!(opcode(0x15), None);
        assert_eq!(opcode(0x2c), None);
        assert_eq!(opcode(0x60), None);
        assert_eq!(opcode(0x0c), Some((Transport::Rc, Op::ReadRequest)));
        assert_eq!(opcode(0x2a), Some((Transport::Uc, Op::WriteOnly)));
        assert_eq!(opcode(0x65), Some((Transport::Ud, Op::SendOnlyImm)));
        assert_eq!(opcode(0xb7), Some((Transport::Xrc, Op::SendOnlyInv)));
    }

    #[test]
    fn bth_fields() {
        let b = parse_bth(&[
            0x04, 0xb3, 0x12, 0x34, 0x56, 0xab, 0xcd, 0xef, 0x81, 0x01, 0x02, 0x03,
        ])
        .unwrap();
        assert_eq!(
            b,
            Bth {
                opcode: 4,
                se: true,
                migreq: false,
                pad: 3,
                tver: 3,
                pkey: 0x1234,
                resv8a: 0x56,
                dest_qp: 0xabcdef,
                ack_req: true,
                resv7: 1,
                psn: 0x010203,
            }
        );
    }

    #[test]
    fn write_only_with_immediate_has_reth_then_immdt_then_padded_payload() {
        let mut ext = reth(0x1122_3344_5566_7788, 0xdead_beef, 5);
        ext.extend_from_slice(&0x0102_0304u32.to_be_bytes());
        let pkt = build(0x0b, 0x11, 7, &ext, b"hello");
        assert_eq!(pkt.len(), 12 + 16 + 4 + 8 + 4);
        let p = parse(&pkt, true).unwrap();
        assert_eq!(p.op, Op::WriteOnlyImm);
        assert_eq!(
            p.reth,
            Some(Reth {
                va: 0x1122_3344_5566_7788,
                rkey: 0xdead_beef,
                dma_len: 5
            })
        );
        assert_eq!(p.imm, Some(0x0102_0304));
        assert_eq!(p.payload, b"hello");
        assert_eq!(p.bth.pad, 3);
        assert_eq!(p.icrc, Some(0));
        assert_eq!(p.header_len, 32);
    }

    #[test]
    fn acks_atomics_and_datagrams() {
        let ack = build(0x11, 5, 9, &[0x60, 0, 0, 7], &[]);
        let p = parse(&ack, true).unwrap();
        assert_eq!(
            p.aeth,
            Some(Aeth {
                syndrome: 0x60,
                msn: 7
            })
        );
        assert_eq!(p.aeth.unwrap().kind(), "NAK");
        assert!(p.payload.is_empty());

        let mut ext = vec![0x1f, 0, 0, 1];
        ext.extend_from_slice(&42u64.to_be_bytes());
        let b1 = build(0x12, 5, 9, &ext, &[]);
        let p = parse(&b1, true).unwrap();
        assert_eq!(p.atomic_ack, Some(42));
        assert_eq!(p.aeth.unwrap().kind(), "ACK");

        let mut ext = 0x1000u64.to_be_bytes().to_vec();
        ext.extend_from_slice(&0x77u32.to_be_bytes());
        ext.extend_from_slice(&1u64.to_be_bytes());
        ext.extend_from_slice(&2u64.to_be_bytes());
        let b2 = build(0x13, 5, 9, &ext, &[]);
        let p = parse(&b2, true).unwrap();
        assert_eq!(
            p.atomic,
            Some(AtomicEth {
                va: 0x1000,
                rkey: 0x77,
                swap_add: 1,
                compare: 2
            })
        );

        let mut ext = 0x1111_1111u32.to_be_bytes().to_vec();
        ext.extend_from_slice(&[0, 0, 0, 0x2a]);
        ext.extend_from_slice(&9u32.to_be_bytes());
        let b3 = build(0x65, 5, 9, &ext, b"ud");
        let p = parse(&b3, true).unwrap();
        assert_eq!(p.transport, Transport::Ud);
        assert_eq!(
            p.deth,
            Some(Deth {
                qkey: 0x1111_1111,
                src_qp: 0x2a
            })
        );
        assert_eq!(p.imm, Some(9));
        assert_eq!(p.payload, b"ud");

        let b4 = build(0x17, 5, 9, &0xabcdu32.to_be_bytes(), b"x");
        let p = parse(&b4, true).unwrap();
        assert_eq!(p.ieth, Some(0xabcd));
        let b5 = build(0xa4, 5, 9, &77u32.to_be_bytes(), b"xrc");
        let p = parse(&b5, true).unwrap();
        assert_eq!(
            (p.transport, p.xrc_srq, p.payload),
            (Transport::Xrc, Some(77), &b"xrc"[..])
        );
    }

    #[test]
    fn truncation_is_an_error_or_a_partial_payload_never_a_panic() {
        let pkt = build(0x06, 1, 2, &reth(1, 2, 3000), &[7u8; 100]);
        for cut in 0..pkt.len() {
            let part = &pkt[..cut];
            let r = parse(part, true);
            if cut < 12 + 16 + 4 {
                assert!(matches!(r, Err(IbError::Short(_))), "cut {cut}: {r:?}");
            }
            // A capture that says it is partial still yields the headers when they are there.
            let r = parse(part, false);
            if cut >= 28 {
                let p = r.unwrap();
                assert_eq!(p.payload.len(), cut - 28);
                assert_eq!(p.icrc, None);
            } else {
                assert!(r.is_err());
            }
        }
        // Pad count larger than what follows the headers.
        let mut bad = build(0x04, 1, 2, &[], &[]);
        bad[1] = 0x30;
        assert!(matches!(parse(&bad, true), Err(IbError::BadPad(_))));
        assert!(matches!(
            parse(&build(0x15, 1, 2, &[], &[]), true),
            Err(IbError::UnknownOpcode(_))
        ));
    }
}
