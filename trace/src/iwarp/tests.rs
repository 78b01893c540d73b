//! The iWARP decoder and assembler on segments built by hand.

use sha2::{Digest, Sha256};

use super::*;
use crate::bytes::hex;
use crate::reasm::{Kind, Message};
use crate::tcp::TcpLimits;

const A: [u8; 4] = [10, 8, 0, 1];
const B: [u8; 4] = [10, 8, 0, 2];

fn sha(b: &[u8]) -> Option<String> {
    Some(hex(&Sha256::digest(b)))
}

#[test]
fn crc32c_check_value() {
    // The CRC-32C check value (the CRC of "123456789").
    assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    assert_eq!(crc32c(b""), 0);
}

/// A TCP stream's segments: (from A?, sequence number, payload).
type Seg = (bool, u32, Vec<u8>);

fn run(segs: &[Seg]) -> (Vec<Pdu>, Vec<Message>, IwarpStats, AssemblerStats) {
    let mut dec = Decoder::new();
    let mut asm = Assembler::new();
    let mut pdus = Vec::new();
    let mut push = |p: &Pdu, payload: &[u8]| {
        pdus.push(p.clone());
        asm.push(p, payload);
    };
    for (i, (from_a, seq, payload)) in segs.iter().enumerate() {
        let (src, dst, sp, dp) = if *from_a {
            (A, B, 40000, 5000)
        } else {
            (B, A, 5000, 40000)
        };
        let s = Segment {
            src: src.into(),
            dst: dst.into(),
            src_port: sp,
            dst_port: dp,
            seq: *seq,
            syn: payload.is_empty(),
            payload,
        };
        dec.push(i as u64 + 1, &s, &mut push);
    }
    dec.finish(&mut push);
    asm.finish();
    let msgs = asm.drain().collect();
    (pdus, msgs, dec.stats(), asm.stats())
}

#[test]
fn a_connection_with_crcs_markers_reordered_segments_and_every_message_kind() {
    // A asks for markers in what it receives and for CRCs; B for neither: CRCs both ways,
    // markers from B to A only.
    let req = build_frame(true, true, true, b"hello");
    let rep = build_frame(false, false, false, b"");
    let data: Vec<u8> = (0..3000u32).map(|i| (i % 253) as u8).collect();
    let mut a = req.clone();
    let a_start = a.len();
    let push_a = |a: &mut Vec<u8>, ulpdu: Vec<u8>| {
        let f = build_fpdu(&ulpdu, (a.len() - a_start) as u64, false, true);
        a.extend_from_slice(&f);
    };
    // A Send in two DDP segments, a Read Request, a Send with Invalidate.
    push_a(
        &mut a,
        build_untagged(3, false, (0, 0, 1, 0), &data[..1500]),
    );
    push_a(
        &mut a,
        build_untagged(3, true, (0, 0, 1, 1500), &data[1500..]),
    );
    let rr = [
        0x11u32.to_be_bytes().as_slice(),
        &0x1000u64.to_be_bytes(),
        &1000u32.to_be_bytes(),
        &0x22u32.to_be_bytes(),
        &0x9000u64.to_be_bytes(),
    ]
    .concat();
    push_a(&mut a, build_untagged(1, true, (0, 1, 1, 0), &rr));
    push_a(&mut a, build_untagged(4, true, (0x77, 0, 2, 0), b"bye"));
    // B: the Read Response (1000 bytes: markers fall inside it) and a Terminate.
    let mut b = rep.clone();
    let b_start = b.len();
    let read: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
    let f = build_fpdu(&build_tagged(2, true, 0x11, 0x1000, &read), 0, true, true);
    b.extend_from_slice(&f);
    let term = build_untagged(7, true, (0, 2, 1, 0), &[0x01, 0x02, 0x00, 0x00]);
    let f2 = build_fpdu(&term, (b.len() - b_start) as u64, true, true);
    b.extend_from_slice(&f2);
    // A's stream cut into 700-byte segments, the second sent after the third and again.
    let isn_a = 0xffff_ff00u32; // wraps inside the stream
    let isn_b = 77u32;
    let mut segs: Vec<Seg> = vec![(true, isn_a, vec![]), (false, isn_b, vec![])];
    let pieces: Vec<(u32, Vec<u8>)> = a
        .chunks(700)
        .enumerate()
        .map(|(i, c)| (isn_a.wrapping_add(1 + 700 * i as u32), c.to_vec()))
        .collect();
    segs.push((true, pieces[0].0, pieces[0].1.clone()));
    segs.push((false, isn_b + 1, b[..b_start].to_vec()));
    segs.push((true, pieces[2].0, pieces[2].1.clone()));
    segs.push((true, pieces[1].0, pieces[1].1.clone()));
    segs.push((true, pieces[1].0, pieces[1].1.clone()));
    for p in &pieces[3..] {
        segs.push((true, p.0, p.1.clone()));
    }
    segs.push((false, isn_b + 1 + b_start as u32, b[b_start..].to_vec()));
    let (pdus, msgs, stats, astats) = run(&segs);
    let names: Vec<String> = pdus
        .iter()
        .map(|p| match &p.unit {
            MpaUnit::Frame(f) => format!("frame {}", f.request),
            MpaUnit::Fpdu(f) => {
                assert_eq!(f.crc_ok, Some(true), "{p:?}");
                f.ddp.as_ref().unwrap().op_name().to_string()
            }
            MpaUnit::Lost { why } => why.clone(),
        })
        .collect();
    assert_eq!(
        names,
        [
            "frame true",
            "frame false",
            "SEND",
            "SEND",
            "RDMA_READ_REQUEST",
            "SEND_INVALIDATE",
            "RDMA_READ_RESPONSE",
            "TERMINATE"
        ]
    );
    let MpaUnit::Frame(f) = &pdus[0].unit else {
        panic!()
    };
    assert_eq!(
        (f.markers, f.crc, &f.private[..]),
        (true, true, &b"hello"[..])
    );
    // The Read Response holds three markers (0, 512, and 1024 just before its CRC: the CRC
    // covers it), each pointing back to the FPDU's start; the Terminate after it none.
    let marks: Vec<Vec<u16>> = pdus[6..]
        .iter()
        .map(|p| match &p.unit {
            MpaUnit::Fpdu(f) => f.markers.clone(),
            _ => vec![],
        })
        .collect();
    assert_eq!(marks.iter().map(Vec::len).collect::<Vec<_>>(), [3, 0]);
    assert_eq!(marks[0], [0, 512, 1024]);
    assert_eq!(stats.fpdus, 6);
    assert_eq!((stats.retransmitted, stats.out_of_order), (1, 1));
    assert_eq!(msgs.len(), 3, "{msgs:#?}");
    assert_eq!(
        (msgs[0].kind, msgs[0].length, msgs[0].packets),
        (Kind::Send, 3000, 2)
    );
    assert_eq!(msgs[0].sha256, sha(&data));
    assert_eq!(msgs[0].first_psn, 1);
    assert_eq!(msgs[0].tcp_ports, Some((40000, 5000)));
    assert_eq!(msgs[1].kind, Kind::Send);
    assert_eq!(
        (msgs[1].invalidate, msgs[1].sha256.clone()),
        (Some(0x77), sha(b"bye"))
    );
    let r = &msgs[2];
    assert_eq!(
        (r.kind, r.length, r.sha256.clone()),
        (Kind::Read, 1000, sha(&read))
    );
    assert_eq!(
        (r.rkey, r.va, r.dma_len),
        (Some(0x22), Some(0x9000), Some(1000))
    );
    assert_eq!(r.flow.src, IpAddr::from(B));
    assert_eq!(astats.terminates, 1);
}

#[test]
fn a_bad_crc_a_gap_and_a_stream_cut_short_are_reported() {
    let mut a = build_frame(true, false, true, b"");
    let start = a.len();
    let mut f = build_fpdu(&build_tagged(0, true, 5, 0, b"abcd"), 0, false, true);
    let n = f.len();
    f[n - 6] ^= 1; // a payload byte
    a.extend_from_slice(&f);
    let good = build_fpdu(&build_tagged(0, true, 5, 4, b"efgh"), 0, false, true);
    a.extend_from_slice(&good);
    let cut = a.len();
    a.extend_from_slice(&good[..10]);
    // A's FPDUs come before B's Reply: they wait for it (markers and CRCs depend on it).
    let rep = build_frame(false, false, false, b"");
    let segs: Vec<Seg> = vec![
        (true, 9, vec![]),
        (false, 499, vec![]),
        (true, 10, a[..cut].to_vec()),
        (false, 500, rep),
        (true, 10 + cut as u32, a[cut..].to_vec()),
    ];
    let (pdus, msgs, stats, _) = run(&segs);
    assert_eq!(stats.crc_errors, 1);
    let MpaUnit::Fpdu(f) = &pdus[2].unit else {
        panic!("{pdus:?}")
    };
    assert_eq!(f.crc_ok, Some(false));
    assert_eq!(pdus[2].frame, 3);
    assert!(matches!(&pdus[4].unit, MpaUnit::Lost { why } if why.contains("ended")));
    assert_eq!(pdus.len(), 5);
    // Two one-segment WRITEs (the first altered: its digest is of what was captured).
    assert_eq!(msgs.len(), 2);
    assert!(msgs.iter().all(|m| m.incomplete.is_none()));
    let _ = start;

    // A gap the TCP reassembly gives up on: the direction is not decoded after it.
    let mut dec = Decoder::with_limits(IwarpLimits {
        tcp: TcpLimits { max_ahead: 100 },
        ..IwarpLimits::default()
    });
    let mut lost = Vec::new();
    fn mk(seq: u32, syn: bool, payload: &[u8]) -> Segment<'_> {
        Segment {
            src: A.into(),
            dst: B.into(),
            src_port: 1,
            dst_port: 2,
            seq,
            syn,
            payload,
        }
    }
    let req = build_frame(true, false, false, b"");
    dec.push(1, &mk(0, true, b""), &mut |_, _| {});
    dec.push(2, &mk(1, false, &req), &mut |_, _| {});
    dec.push(3, &mk(500, false, &[0; 150]), &mut |p, _| {
        lost.push(p.clone())
    });
    assert_eq!(lost.len(), 1);
    assert!(matches!(&lost[0].unit, MpaUnit::Lost { why } if why.contains("not in the capture")));
    assert_eq!(dec.held(), 0);
    assert_eq!(dec.stats().lost_bytes, 500 - 1 - req.len() as u64);
}

#[test]
fn tcp_that_is_not_mpa_is_left_alone() {
    let (pdus, msgs, stats, _) = run(&[
        (true, 1, vec![]),
        (true, 2, b"GET / HTTP/1.1\r\n\r\n".to_vec()),
    ]);
    assert!(pdus.is_empty() && msgs.is_empty());
    assert_eq!(stats.connections, 0);
}
