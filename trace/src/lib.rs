//! Decoding captured RDMA traffic and reassembling it into messages: the library behind the
//! `rdma-trace` tool.
//!
//! - [`capture`] reads pcap and pcapng files frame by frame;
//! - [`net`] finds the IP addresses and the UDP or TCP payload of a frame;
//! - [`ib`] decodes RoCEv2 (InfiniBand transport headers over UDP port 4791), [`icrc`] checks
//!   its invariant CRC, [`cm`] decodes the connection manager's MADs on QP1;
//! - [`reasm`] puts packets back together into messages: SENDs by connection, QP and PSN, RDMA
//!   WRITEs with the rkey and address of their first packet, READ responses matched to their
//!   request, retransmissions and packets out of order, and what stayed incomplete;
//! - [`rpcrdma`] decodes RPC-over-RDMA version 1 headers (RFC 8166) and the RPC header inside,
//!   [`nfs4`] the operations of an NFSv4 COMPOUND;
//! - [`tcp`] puts TCP streams back in order, [`iwarp`] frames them into MPA units (Request,
//!   Reply, FPDUs with their CRC32c and markers), decodes DDP and RDMAP headers and reassembles
//!   RDMAP messages into the same [`reasm::Message`]s as RoCE's;
//! - [`rpc`] pairs RPC calls with their replies and reassembles their chunks (read chunks from
//!   RDMA READs, write and reply chunks from RDMA WRITEs) from the messages of [`reasm`] and
//!   [`iwarp`].
//!
//! Nothing here panics on input: every length is checked, a packet cut short is reported as such.
//!
//! ```
//! use rdma_trace::{decode, Decoded};
//!
//! // An RC SEND_ONLY of "hi" to QP 0x11, PSN 5, in an Ethernet/IPv4/UDP frame.
//! let ib = rdma_trace::ib::build(0x04, 0x11, 5, &[], b"hi");
//! let frame = rdma_trace::net::build_udp4([10, 8, 0, 1], [10, 8, 0, 2], 49152, 4791, &ib);
//! let Decoded::Roce(p) = decode(1, &frame) else { panic!("not RoCE") };
//! assert_eq!(p.ib.op.name(), "SEND_ONLY");
//! assert_eq!(p.ib.payload, b"hi");
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![doc(test(attr(deny(warnings))))]

pub mod bytes;
pub mod capture;
pub mod cm;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod ib;
pub mod icrc;
pub mod iwarp;
pub mod net;
pub mod nfs4;
pub mod reasm;
pub mod rpc;
pub mod rpcrdma;
pub mod synth;
pub mod tcp;

use std::net::IpAddr;

pub use capture::{for_each_frame, CaptureError, Frame};

/// A RoCEv2 packet with its addresses.
#[derive(Clone, Debug)]
pub struct RocePacket<'a> {
    /// Source IP address.
    pub src: IpAddr,
    /// Destination IP address.
    pub dst: IpAddr,
    /// UDP source port (rxe derives it from the QP pair: a flow label of sorts).
    pub src_port: u16,
    /// The transport headers and payload.
    pub ib: ib::IbPacket<'a>,
    /// Whether the capture holds the whole datagram.
    pub complete: bool,
    /// The ICRC check: `Some(true)` when it matches, `None` when it could not be checked.
    pub icrc_ok: Option<bool>,
    /// The CM MAD, for a send to QP1. Boxed: inline, it would be about two fifths of the
    /// packet's size, copied with every packet as the packet moves on its way, where almost no
    /// packet has one.
    pub cm: Option<Result<Box<cm::CmMad>, bytes::Short>>,
}

/// What a frame holds, as far as this crate is concerned.
// Returned once per frame and consumed at once: boxing the large variant would cost an
// allocation per packet.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Decoded<'a> {
    /// A RoCEv2 packet.
    Roce(RocePacket<'a>),
    /// A RoCEv2 datagram whose transport headers did not decode.
    BadRoce {
        /// Source IP address.
        src: IpAddr,
        /// Destination IP address.
        dst: IpAddr,
        /// What was wrong.
        error: ib::IbError,
    },
    /// A TCP segment (iWARP runs over TCP: [`iwarp::Decoder`] puts the streams together).
    Tcp(iwarp::Segment<'a>),
    /// IP traffic that is not RDMA.
    Other,
    /// A frame without IP, or with a broken IP or UDP header.
    NotIp(net::NetError),
}

/// Decodes one frame of link type `linktype`.
pub fn decode(linktype: i32, data: &[u8]) -> Decoded<'_> {
    let d = match net::dissect(linktype, data) {
        Ok(d) => d,
        Err(e) => return Decoded::NotIp(e),
    };
    let (src_port, header, payload, complete) = match d.l4 {
        net::L4::Udp {
            src_port,
            dst_port: ib::ROCEV2_PORT,
            header,
            payload,
            complete,
        } => (src_port, header, payload, complete),
        net::L4::Tcp {
            src_port,
            dst_port,
            seq,
            syn,
            payload,
            ..
        } => {
            return Decoded::Tcp(iwarp::Segment {
                src: d.src,
                dst: d.dst,
                src_port,
                dst_port,
                seq,
                syn,
                payload,
            })
        }
        _ => return Decoded::Other,
    };
    let p = match ib::parse(payload, complete) {
        Ok(p) => p,
        Err(error) => {
            return Decoded::BadRoce {
                src: d.src,
                dst: d.dst,
                error,
            }
        }
    };
    let icrc_ok = match p.icrc {
        Some(carried) => payload
            .len()
            .checked_sub(4)
            .and_then(|n| payload.get(..n))
            .and_then(|body| icrc::compute(d.ip_header.bytes(), header, body))
            .map(|c| c.swap_bytes() == carried),
        None => None,
    };
    let cm = (p.bth.dest_qp == 1 && p.transport == ib::Transport::Ud)
        .then(|| cm::parse(p.payload))
        .and_then(|r| r.transpose())
        .map(|r| r.map(Box::new));
    Decoded::Roce(RocePacket {
        src: d.src,
        dst: d.dst,
        src_port,
        ib: p,
        complete,
        icrc_ok,
        cm,
    })
}
