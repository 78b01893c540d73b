//! The RoCE reassembler on packets built by hand.

use std::net::IpAddr;

use sha2::{Digest, Sha256};

use super::assemble::SPARE_BYTES;
use super::*;
use crate::bytes::hex;
use crate::ib;
use crate::RocePacket;

const A: [u8; 4] = [10, 8, 0, 1];
const B: [u8; 4] = [10, 8, 0, 2];

fn reth(va: u64, rkey: u32, len: u32) -> Vec<u8> {
    let mut v = va.to_be_bytes().to_vec();
    v.extend_from_slice(&rkey.to_be_bytes());
    v.extend_from_slice(&len.to_be_bytes());
    v
}

/// Feeds `(from, opcode, qp, psn, ext, payload)` packets, numbered from 1, and finishes.
/// From, opcode, destination QP, PSN, extended headers, payload.
type Pkt = ([u8; 4], u8, u32, u32, Vec<u8>, Vec<u8>);

fn run(pkts: &[Pkt]) -> (Vec<Message>, Stats) {
    run_with(Limits::default(), pkts)
}

fn run_with(limits: Limits, pkts: &[Pkt]) -> (Vec<Message>, Stats) {
    run_recycling(limits, pkts, &mut |_| {})
}

/// [`run_with`], handing the assembler the spare buffers `spares` adds before each packet.
fn run_recycling(
    limits: Limits,
    pkts: &[Pkt],
    spares: &mut dyn FnMut(&mut Assembler),
) -> (Vec<Message>, Stats) {
    let mut asm = Assembler::with_limits(limits);
    let mut out = Vec::new();
    for (n, (from, op, qp, psn, ext, payload)) in pkts.iter().enumerate() {
        let to = if *from == A { B } else { A };
        let bytes = ib::build(*op, *qp, *psn, ext, payload);
        let p = RocePacket {
            src: IpAddr::from(*from),
            dst: IpAddr::from(to),
            src_port: 49152,
            ib: ib::parse(&bytes, true).unwrap(),
            complete: true,
            icrc_ok: None,
            cm: None,
        };
        spares(&mut asm);
        asm.push(n as u64 + 1, &p);
        out.extend(asm.drain());
    }
    asm.finish();
    out.extend(asm.drain());
    (out, asm.stats())
}

fn sha(b: &[u8]) -> Option<String> {
    Some(hex(&Sha256::digest(b)))
}

#[test]
fn send_in_three_packets_out_of_order_with_a_retransmission() {
    let data: Vec<u8> = (0..2500u32).map(|i| (i % 251) as u8).collect();
    let (f, m, l) = (&data[..1024], &data[1024..2048], &data[2048..]);
    let (msgs, stats) = run(&[
        (A, 0x00, 0x11, 100, vec![], f.to_vec()),
        (A, 0x02, 0x11, 102, vec![], l.to_vec()), // ahead of the gap
        (A, 0x01, 0x11, 101, vec![], m.to_vec()),
        (A, 0x02, 0x11, 102, vec![], l.to_vec()), // retransmitted
        (A, 0x04, 0x11, 103, vec![], b"next".to_vec()),
    ]);
    assert_eq!(msgs.len(), 2, "{msgs:#?}");
    let m0 = &msgs[0];
    assert_eq!((m0.kind, m0.length, m0.packets), (Kind::Send, 2500, 3));
    assert_eq!((m0.first_psn, m0.last_psn, m0.out_of_order), (100, 102, 1));
    assert_eq!(m0.sha256, sha(&data));
    assert_eq!(m0.incomplete, None);
    assert_eq!(msgs[1].sha256, sha(b"next"));
    assert_eq!(
        (stats.duplicates, stats.complete, stats.incomplete),
        (1, 2, 0)
    );
}

#[test]
fn write_checks_the_reth_length_and_carries_the_immediate() {
    let mut last_ext = vec![];
    last_ext.extend_from_slice(&0xfeedu32.to_be_bytes());
    let (msgs, _) = run(&[
        (
            A,
            0x06,
            0x11,
            0xff_fffe,
            reth(0x1000, 0x42, 1030),
            vec![1; 1024],
        ),
        (A, 0x09, 0x11, 0xff_ffff, last_ext, vec![2; 6]),
        (A, 0x0a, 0x11, 0, reth(0x2000, 0x42, 10), vec![3; 4]),
    ]);
    assert_eq!(msgs.len(), 2);
    let w = &msgs[0];
    assert_eq!(
        (w.kind, w.rkey, w.va, w.dma_len),
        (Kind::Write, Some(0x42), Some(0x1000), Some(1030))
    );
    assert_eq!(
        (w.imm, w.length, w.incomplete.as_deref()),
        (Some(0xfeed), 1030, None)
    );
    // PSNs wrap at 2^24.
    assert_eq!((w.first_psn, w.last_psn), (0xff_fffe, 0xff_ffff));
    assert!(msgs[1]
        .incomplete
        .as_deref()
        .unwrap()
        .contains("RETH announced 10"));
    assert_eq!(msgs[1].sha256, None);
}

#[test]
fn read_response_is_matched_to_its_request_and_a_retry_from_the_middle_continues_it() {
    let aeth = vec![0x1f, 0, 0, 1];
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    let (msgs, stats) = run(&[
        (A, 0x0c, 0x22, 500, reth(0x9000, 0x77, 3000), vec![]),
        (B, 0x0d, 0x11, 500, aeth.clone(), data[..1024].to_vec()),
        // the middle response is lost; A asks again for the rest
        (
            A,
            0x0c,
            0x22,
            501,
            reth(0x9000 + 1024, 0x77, 3000 - 1024),
            vec![],
        ),
        (B, 0x0d, 0x11, 501, aeth.clone(), data[1024..2048].to_vec()),
        (B, 0x0f, 0x11, 502, aeth.clone(), data[2048..].to_vec()),
        // a request nobody answers
        (A, 0x0c, 0x22, 503, reth(0xa000, 0x78, 8), vec![]),
    ]);
    assert_eq!(msgs.len(), 2, "{msgs:#?}");
    let r = &msgs[0];
    assert_eq!(
        (r.kind, r.rkey, r.va, r.dma_len),
        (Kind::Read, Some(0x77), Some(0x9000), Some(3000))
    );
    assert_eq!(
        (r.length, r.first_frame, r.sha256.clone()),
        (3000, 1, sha(&data))
    );
    assert_eq!(r.flow.src, IpAddr::from(B));
    assert_eq!(
        msgs[1].incomplete.as_deref(),
        Some("READ request without a response")
    );
    assert_eq!(msgs[1].rkey, Some(0x78));
    assert_eq!(stats.naks, 0);
    assert_eq!(stats.acks, 3);
}

#[test]
fn a_read_retried_from_the_middle_and_answered_with_middle_packets_is_answered() {
    // As rxe did in an NFS capture: the whole response arrives, the requester asks again
    // from PSN 11 (address advanced by 1024) and the responder resends MIDDLE and LAST.
    let aeth = vec![0x1f, 0, 0, 1];
    let data: Vec<u8> = (0..3072u32).map(|i| (i * 3) as u8).collect();
    let (msgs, stats) = run(&[
        (A, 0x0c, 0x22, 10, reth(0x9000, 0x77, 3072), vec![]),
        (B, 0x0d, 0x11, 10, aeth.clone(), data[..1024].to_vec()),
        (B, 0x0e, 0x11, 11, vec![], data[1024..2048].to_vec()),
        (B, 0x0f, 0x11, 12, aeth.clone(), data[2048..].to_vec()),
        (A, 0x0c, 0x22, 11, reth(0x9400, 0x77, 2048), vec![]),
        (B, 0x0e, 0x11, 11, vec![], data[1024..2048].to_vec()),
        (B, 0x0f, 0x11, 12, aeth.clone(), data[2048..].to_vec()),
    ]);
    assert_eq!(msgs.len(), 1, "{msgs:#?}");
    assert_eq!((msgs[0].length, msgs[0].incomplete.clone()), (3072, None));
    assert_eq!(msgs[0].sha256, sha(&data));
    assert_eq!((stats.duplicates, stats.incomplete), (2, 0));
}

#[test]
fn kept_payloads_come_out_whole_and_hashing_them_can_be_left_to_the_consumer() {
    let limits = Limits {
        keep_data: 1500,
        hash_kept: false,
        ..Limits::default()
    };
    let w: Vec<u8> = (0..1400u32).map(|i| (i % 199) as u8).collect();
    let big: Vec<u8> = (0..2048u32).map(|i| (i % 197) as u8).collect();
    let (msgs, _) = run_with(
        limits,
        &[
            (A, 0x06, 0x11, 1, reth(0x10, 1, 1400), w[..1024].to_vec()),
            (A, 0x08, 0x11, 2, vec![], w[1024..].to_vec()),
            (A, 0x04, 0x11, 3, vec![], b"call".to_vec()),
            (A, 0x06, 0x11, 4, reth(0x10, 1, 2048), big[..1024].to_vec()),
            (A, 0x08, 0x11, 5, vec![], big[1024..].to_vec()),
        ],
    );
    assert_eq!(msgs.len(), 3);
    // Kept, not hashed, complete.
    assert_eq!(
        (
            msgs[0].data.as_deref(),
            msgs[0].sha256.clone(),
            msgs[0].incomplete.clone()
        ),
        (Some(&w[..]), None, None)
    );
    // SENDs are always hashed.
    assert_eq!(msgs[1].sha256, sha(b"call"));
    assert_eq!(msgs[1].data.as_deref(), Some(&b"call"[..]));
    // Too long to keep: hashed after all, the kept part first.
    assert_eq!(
        (msgs[2].data.clone(), msgs[2].sha256.clone()),
        (None, sha(&big))
    );

    // Given buffers to reuse (too small, holding old bytes, too many to keep): the same.
    let pkts: Vec<Pkt> = (0..40u32)
        .flat_map(|i| {
            let psn = 10 + 2 * i;
            [
                (A, 0x06, 0x11, psn, reth(0x10, 1, 1400), w[..1024].to_vec()),
                (A, 0x08, 0x11, psn + 1, vec![], w[1024..].to_vec()),
            ]
        })
        .collect();
    let mut given = 0;
    let (reused, _) = run_recycling(limits, &pkts, &mut |asm| {
        given += 1;
        asm.recycle(vec![0xee; 7 * given]);
        asm.recycle(Vec::with_capacity(SPARE_BYTES / 3));
    });
    let (fresh, _) = run_with(limits, &pkts);
    assert_eq!(reused.len(), 40);
    assert!(reused.iter().all(|m| m.data.as_deref() == Some(&w[..])));
    assert_eq!(format!("{reused:?}"), format!("{fresh:?}"));
}

#[test]
fn atomics_pair_with_their_ack_and_ud_keeps_the_source_qp() {
    let mut ateth = 0x3000u64.to_be_bytes().to_vec();
    ateth.extend_from_slice(&0x55u32.to_be_bytes());
    ateth.extend_from_slice(&5u64.to_be_bytes());
    ateth.extend_from_slice(&0u64.to_be_bytes());
    let mut ack = vec![0, 0, 0, 1];
    ack.extend_from_slice(&40u64.to_be_bytes());
    let mut deth = 0x1111_1111u32.to_be_bytes().to_vec();
    deth.extend_from_slice(&0x33u32.to_be_bytes());
    let (msgs, _) = run(&[
        (A, 0x14, 0x22, 7, ateth, vec![]),
        (B, 0x12, 0x11, 7, ack, vec![]),
        (A, 0x64, 0x99, 1, deth, b"datagram".to_vec()),
    ]);
    assert_eq!(msgs.len(), 2);
    assert_eq!(msgs[0].kind, Kind::FetchAdd);
    assert_eq!(
        msgs[0].atomic,
        Some(AtomicValues {
            swap_add: 5,
            compare: 0,
            original: Some(40)
        })
    );
    assert_eq!(
        (msgs[1].src_qp, msgs[1].sha256.clone()),
        (Some(0x33), sha(b"datagram"))
    );
}

#[test]
fn what_never_completes_is_reported_at_the_end() {
    let (msgs, stats) = run(&[
        (A, 0x00, 0x11, 10, vec![], vec![1; 1024]),
        (A, 0x01, 0x11, 11, vec![], vec![1; 1024]),
        (A, 0x02, 0x11, 40, vec![], vec![1; 8]), // its FIRST is not in the capture
    ]);
    assert_eq!(msgs.len(), 2);
    assert!(msgs[0]
        .incomplete
        .as_deref()
        .unwrap()
        .starts_with("capture ended"));
    assert_eq!((msgs[0].length, msgs[0].packets), (2048, 2));
    assert!(msgs[1].incomplete.as_deref().unwrap().contains("FIRST"));
    assert_eq!(stats.incomplete, 2);
}

#[test]
fn sends_on_two_flows_interleaved_packet_by_packet_both_complete() {
    // Each packet switches flows, so the flow kept out of the map (the last one) goes
    // back and forth; `outstanding` counts the open message in it too.
    let a: Vec<u8> = (0..3000u32).map(|i| (i % 253) as u8).collect();
    let b: Vec<u8> = (0..3000u32).map(|i| (i % 241) as u8).collect();
    let mut asm = Assembler::new();
    let mut out = Vec::new();
    let ops = [0x00u8, 0x01, 0x02];
    for (n, (op, i)) in ops.iter().zip(0u32..).enumerate() {
        let r = (i as usize) * 1000..(i as usize + 1) * 1000;
        for (from, qp, data) in [(A, 0x11, &a), (B, 0x22, &b)] {
            let to = if from == A { B } else { A };
            let bytes = ib::build(*op, qp, 500 + i, &[], &data[r.clone()]);
            let p = RocePacket {
                src: IpAddr::from(from),
                dst: IpAddr::from(to),
                src_port: 1,
                ib: ib::parse(&bytes, true).unwrap(),
                complete: true,
                icrc_ok: None,
                cm: None,
            };
            asm.push(n as u64 * 2 + 1 + u64::from(from == B), &p);
            out.extend(asm.drain());
        }
        if n < 2 {
            assert_eq!(asm.outstanding(), 2, "after packet {n} of each");
        }
    }
    asm.finish();
    out.extend(asm.drain());
    assert_eq!(asm.outstanding(), 0);
    let got: Vec<_> = out
        .iter()
        .map(|m| (m.flow.qp, m.length, m.packets, m.sha256.clone()))
        .collect();
    assert_eq!(got, [(0x11, 3000, 3, sha(&a)), (0x22, 3000, 3, sha(&b))]);
}

#[test]
fn memory_stays_bounded_when_first_packets_never_come() {
    let mut asm = Assembler::with_limits(Limits {
        max_age: 100,
        max_pending: 50,
        max_requests: 10,
        max_flows: 8,
        keep_data: 0,
        hash_kept: true,
        ..Limits::default()
    });
    let mut reported = 0;
    for i in 0..10_000u32 {
        let bytes = ib::build(0x01, 0x11, i * 2, &[], &[0; 64]);
        let p = RocePacket {
            src: IpAddr::from(A),
            dst: IpAddr::from(B),
            src_port: 1,
            ib: ib::parse(&bytes, true).unwrap(),
            complete: true,
            icrc_ok: None,
            cm: None,
        };
        asm.push(u64::from(i), &p);
        reported += asm.drain().count();
        assert!(asm.outstanding() <= 50, "{}", asm.outstanding());
    }
    assert!(reported >= 9_950);
}
