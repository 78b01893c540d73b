//! Synthetic captures, for tests and measurements on captures larger than the VM can make.
//!
//! [`nfs3_rpcs`] writes a RoCEv2 capture (pcap) of NFSv3 over RPC-over-RDMA: RPCs alternating
//! a READ (call SEND, 128 KiB RDMA WRITE into its write chunk, reply SEND) and a WRITE (call
//! SEND with a read chunk, the server's RDMA READ request and 128 KiB of READ responses, reply
//! SEND), 1024-byte packets as rxe sends them, ACKs after each message. It is what the kernel's
//! NFSv3 client and server put on the wire in the device test, scaled up: about 137 KiB of
//! capture per RPC (7700 RPCs make a gigabyte).

use std::io::Write;

use crate::ib;
use crate::net::build_udp4;
use crate::rpcrdma::{build_header, Proc, ReadSegment, Segment};

const CLIENT: [u8; 4] = [10, 8, 0, 1];
const SERVER: [u8; 4] = [10, 8, 0, 2];
const CLIENT_QP: u32 = 0x11;
const SERVER_QP: u32 = 0x12;
const MTU: usize = 1024;
const CHUNK: usize = 128 * 1024;

struct Pcap<W: Write> {
    out: W,
    n: u64,
}

impl<W: Write> Pcap<W> {
    /// One frame as it is (Ethernet).
    fn frame(&mut self, frame: &[u8]) -> std::io::Result<()> {
        self.n += 1;
        let len = frame.len() as u32;
        self.out
            .write_all(&((self.n / 1_000_000) as u32).to_le_bytes())?;
        self.out
            .write_all(&((self.n % 1_000_000) as u32).to_le_bytes())?;
        self.out.write_all(&len.to_le_bytes())?;
        self.out.write_all(&len.to_le_bytes())?;
        self.out.write_all(frame)
    }

    fn new(mut out: W) -> std::io::Result<Self> {
        out.write_all(&0xa1b2_c3d4u32.to_le_bytes())?;
        out.write_all(&2u16.to_le_bytes())?;
        out.write_all(&4u16.to_le_bytes())?;
        out.write_all(&[0; 8])?;
        out.write_all(&65535u32.to_le_bytes())?;
        out.write_all(&1u32.to_le_bytes())?;
        Ok(Pcap { out, n: 0 })
    }

    fn packet(&mut self, from_client: bool, ib: &[u8]) -> std::io::Result<()> {
        let (src, dst) = if from_client {
            (CLIENT, SERVER)
        } else {
            (SERVER, CLIENT)
        };
        let frame = build_udp4(src, dst, 49152, ib::ROCEV2_PORT, ib);
        self.frame(&frame)
    }
}

fn words(ws: &[u32]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_be_bytes()).collect()
}

fn reth(va: u64, rkey: u32, len: u32) -> Vec<u8> {
    let mut v = va.to_be_bytes().to_vec();
    v.extend_from_slice(&rkey.to_be_bytes());
    v.extend_from_slice(&len.to_be_bytes());
    v
}

/// One side's PSN sequence towards its peer's QP.
struct Sender {
    from_client: bool,
    dest_qp: u32,
    psn: u32,
}

impl Sender {
    fn next(&mut self) -> u32 {
        let p = self.psn;
        self.psn = (self.psn + 1) & 0xff_ffff;
        p
    }
}

const ACK: [u8; 4] = [0x1f, 0, 0, 1];

/// A multi-packet message: FIRST (with `first_ext`), MIDDLEs, LAST (with `last_ext`).
#[allow(clippy::too_many_arguments)]
fn message<W: Write>(
    pcap: &mut Pcap<W>,
    s: &mut Sender,
    ops: [u8; 3],
    first_ext: &[u8],
    last_ext: &[u8],
    data: &[u8],
) -> std::io::Result<()> {
    let pieces: Vec<&[u8]> = data.chunks(MTU).collect();
    for (i, p) in pieces.iter().enumerate() {
        let (op, ext) = match i {
            0 => (ops[0], first_ext),
            _ if i == pieces.len() - 1 => (ops[2], last_ext),
            _ => (ops[1], &[][..]),
        };
        pcap.packet(s.from_client, &ib::build(op, s.dest_qp, s.next(), ext, p))?;
    }
    Ok(())
}

/// The client's and the server's senders, in PSN ranges of their own: the client's SENDs
/// and its READ responses (in the server's request PSN space) share a flow, as on the wire.
fn senders() -> (Sender, Sender) {
    let client = Sender {
        from_client: true,
        dest_qp: SERVER_QP,
        psn: 0x10_0000,
    };
    let server = Sender {
        from_client: false,
        dest_qp: CLIENT_QP,
        psn: 0x80_0000,
    };
    (client, server)
}

/// The call of an NFSv3 READ (`RDMA_MSG`) whose data comes back in the write chunk `seg`.
fn read_call(xid: u32, seg: Segment) -> Vec<u8> {
    let mut call = build_header(xid, 128, Proc::Msg, &[], &[vec![seg]], None);
    call.extend_from_slice(&words(&[xid, 0, 2, 100_003, 3, 6, 0, 0, 0, 0]));
    call.extend_from_slice(&[0; 44]);
    call
}

/// Writes a capture of `rpcs` RPCs to `out` (see the module documentation) and gives `out`
/// back, flushed.
pub fn nfs3_rpcs<W: Write>(out: W, rpcs: u32) -> std::io::Result<W> {
    let mut pcap = Pcap::new(out)?;
    let (mut client, mut server) = senders();
    let mut data = vec![0u8; CHUNK];
    for i in 0..rpcs {
        let xid = 0x5000_0000 + i;
        let rkey = 0x100 + (i & 0xffff);
        let va = 0x7f00_0000_0000 + u64::from(i) * CHUNK as u64;
        for (j, b) in data.iter_mut().enumerate() {
            *b = (j as u32)
                .wrapping_mul(2_654_435_761)
                .wrapping_add(i)
                .to_be_bytes()[0];
        }
        let seg = Segment {
            handle: rkey,
            length: CHUNK as u32,
            offset: va,
        };
        if i % 2 == 0 {
            // NFSv3 READ: the data comes back in a write chunk.
            let call = read_call(xid, seg);
            pcap.packet(true, &ib::build(0x04, SERVER_QP, client.next(), &[], &call))?;
            pcap.packet(
                false,
                &ib::build(0x11, CLIENT_QP, client.psn.wrapping_sub(1), &ACK, &[]),
            )?;
            message(
                &mut pcap,
                &mut server,
                [0x06, 0x07, 0x08],
                &reth(va, rkey, CHUNK as u32),
                &[],
                &data,
            )?;
            let mut reply = build_header(xid, 128, Proc::Msg, &[], &[vec![seg]], None);
            reply.extend_from_slice(&words(&[xid, 1, 0, 0, 0, 0]));
            reply.extend_from_slice(&[0; 104]);
            pcap.packet(
                false,
                &ib::build(0x04, CLIENT_QP, server.next(), &[], &reply),
            )?;
            pcap.packet(
                true,
                &ib::build(0x11, SERVER_QP, server.psn.wrapping_sub(1), &ACK, &[]),
            )?;
        } else {
            // NFSv3 WRITE: the data goes in a read chunk the server READs.
            let read = ReadSegment {
                position: 112,
                segment: seg,
            };
            let mut call = build_header(xid, 128, Proc::Msg, &[read], &[], None);
            call.extend_from_slice(&words(&[xid, 0, 2, 100_003, 3, 7, 0, 0, 0, 0]));
            call.extend_from_slice(&[0; 72]);
            pcap.packet(true, &ib::build(0x04, SERVER_QP, client.next(), &[], &call))?;
            pcap.packet(
                false,
                &ib::build(0x11, CLIENT_QP, client.psn.wrapping_sub(1), &ACK, &[]),
            )?;
            // The request takes one PSN per response packet.
            let first = server.psn;
            pcap.packet(
                false,
                &ib::build(0x0c, CLIENT_QP, first, &reth(va, rkey, CHUNK as u32), &[]),
            )?;
            let mut responder = Sender {
                from_client: true,
                dest_qp: SERVER_QP,
                psn: first,
            };
            message(
                &mut pcap,
                &mut responder,
                [0x0d, 0x0e, 0x0f],
                &ACK,
                &ACK,
                &data,
            )?;
            server.psn = responder.psn;
            let mut reply = build_header(xid, 128, Proc::Msg, &[], &[], None);
            reply.extend_from_slice(&words(&[xid, 1, 0, 0, 0, 0]));
            reply.extend_from_slice(&[0; 112]);
            pcap.packet(
                false,
                &ib::build(0x04, CLIENT_QP, server.next(), &[], &reply),
            )?;
            pcap.packet(
                true,
                &ib::build(0x11, SERVER_QP, server.psn.wrapping_sub(1), &ACK, &[]),
            )?;
        }
    }
    pcap.out.flush()?;
    Ok(pcap.out)
}

/// Writes a hostile RoCEv2 capture: `n` RDMA WRITEs that each begin (a FIRST packet of 1 KiB
/// whose RETH claims a DMA length of 2 GiB) and never end, in one flow, their PSNs apart so
/// that none continues another. What a reassembler holds for them grows with `n`, and what it
/// would reserve from the lengths they claim is terabytes. Gives `out` back, flushed.
pub fn unfinished_writes<W: Write>(out: W, n: u32) -> std::io::Result<W> {
    let mut pcap = Pcap::new(out)?;
    let payload = [0x5au8; MTU];
    for i in 0..n {
        let psn = (i * 2) & 0xff_ffff;
        let ext = reth(
            0x7f00_0000_0000 + u64::from(i) * 0x1000,
            0x100 + i,
            0x7fff_ffff,
        );
        pcap.packet(false, &ib::build(0x06, CLIENT_QP, psn, &ext, &payload))?;
    }
    pcap.out.flush()?;
    Ok(pcap.out)
}

/// Writes a hostile capture of NFSv3 over RPC-over-RDMA: `calls` READ calls, each offering a
/// write chunk of 64 MiB, into which the server WRITEs `writes` 1 KiB pieces each, all past
/// the first byte of the chunk (a gap that never fills): data that a reassembler waiting for
/// the gap would keep without end. Gives `out` back, flushed.
pub fn data_past_a_gap<W: Write>(out: W, calls: u32, writes: u32) -> std::io::Result<W> {
    let mut pcap = Pcap::new(out)?;
    let (mut client, mut server) = senders();
    let data = [0xa5u8; MTU];
    for i in 0..calls {
        let xid = 0x6000_0000 + i;
        let rkey = 0x200 + i;
        let va = 0x7e00_0000_0000 + u64::from(i) * (64 << 20);
        let seg = Segment {
            handle: rkey,
            length: 64 << 20,
            offset: va,
        };
        let call = read_call(xid, seg);
        pcap.packet(true, &ib::build(0x04, SERVER_QP, client.next(), &[], &call))?;
        for w in 0..writes {
            let at = va + 1 + u64::from(w) * MTU as u64;
            pcap.packet(
                false,
                &ib::build(
                    0x0a,
                    CLIENT_QP,
                    server.next(),
                    &reth(at, rkey, MTU as u32),
                    &data,
                ),
            )?;
        }
    }
    pcap.out.flush()?;
    Ok(pcap.out)
}

/// Writes a hostile iWARP capture: one TCP connection (MPA Request and Reply, no markers or
/// CRCs), on which `n` RDMA Writes each send a first segment of 1 KiB, with a Steering Tag of
/// its own, and never their last: `n` messages open at once, whose buffers a reassembler
/// would size from nothing but their count. Gives `out` back, flushed.
pub fn iwarp_unfinished_writes<W: Write>(out: W, n: u32) -> std::io::Result<W> {
    use crate::iwarp::{build_fpdu, build_frame, build_tagged};
    use crate::net::build_tcp4;
    let mut pcap = Pcap::new(out)?;
    let ports = [(40000u16, 7174u16), (7174, 40000)];
    let ips = [(CLIENT, SERVER), (SERVER, CLIENT)];
    let mut seq = [1000u32, 5000];
    pcap.frame(&build_tcp4(
        CLIENT,
        SERVER,
        ports[0],
        (seq[0] - 1, 0),
        0x02,
        &[],
    ))?;
    pcap.frame(&build_tcp4(
        SERVER,
        CLIENT,
        ports[1],
        (seq[1] - 1, seq[0]),
        0x12,
        &[],
    ))?;
    let mut send = |pcap: &mut Pcap<W>, s: usize, bytes: &[u8]| {
        let f = build_tcp4(
            ips[s].0,
            ips[s].1,
            ports[s],
            (seq[s], seq[1 - s]),
            0x18,
            bytes,
        );
        seq[s] = seq[s].wrapping_add(bytes.len() as u32);
        pcap.frame(&f)
    };
    send(&mut pcap, 0, &build_frame(true, false, false, b""))?;
    send(&mut pcap, 1, &build_frame(false, false, false, b""))?;
    let data = [0x3cu8; MTU];
    let mut off = 0u64;
    for i in 0..n {
        let ulpdu = build_tagged(0, false, 0x1000 + i, 0x7f00_0000_0000, &data);
        let f = build_fpdu(&ulpdu, off, false, false);
        off += f.len() as u64;
        send(&mut pcap, 1, &f)?;
    }
    pcap.out.flush()?;
    Ok(pcap.out)
}
