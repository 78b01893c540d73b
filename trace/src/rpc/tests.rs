//! The RPC reassembler on messages built by hand.

use std::net::IpAddr;

use sha2::{Digest, Sha256};

use super::*;
use crate::bytes::hex;
use crate::reasm::FlowKey;
use crate::reasm::{Kind, Message};
use crate::rpcrdma::{build_header, Proc, ReadSegment, Segment};

const C: [u8; 4] = [10, 8, 0, 1];
const S: [u8; 4] = [10, 8, 0, 2];

fn words(ws: &[u32]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_be_bytes()).collect()
}

fn msg(kind: Kind, from: [u8; 4], to: [u8; 4], data: Vec<u8>) -> Message {
    Message {
        kind,
        flow: FlowKey {
            src: IpAddr::from(from),
            dst: IpAddr::from(to),
            qp: 0x11,
        },
        src_qp: None,
        first_psn: 0,
        last_psn: 0,
        packets: 1,
        first_frame: 1,
        last_frame: 1,
        length: data.len() as u64,
        sha256: Some(hex(&Sha256::digest(&data))),
        rkey: None,
        va: None,
        dma_len: None,
        imm: None,
        invalidate: None,
        atomic: None,
        duplicates: 0,
        out_of_order: 0,
        incomplete: None,
        data: Some(data),
        tcp_ports: None,
    }
}

fn rdma(kind: Kind, rkey: u32, va: u64, data: Vec<u8>) -> Message {
    // WRITEs go server -> client; READ responses client -> server.
    let (from, to) = if kind == Kind::Write { (S, C) } else { (C, S) };
    let mut m = msg(kind, from, to, data);
    m.rkey = Some(rkey);
    m.va = Some(va);
    m
}

fn seg(handle: u32, length: u32, offset: u64) -> Segment {
    Segment {
        handle,
        length,
        offset,
    }
}

/// An NFSv3 call header (AUTH_NONE) and its arguments.
fn nfs_call(xid: u32, proc_: u32, args: &[u8]) -> Vec<u8> {
    let mut v = words(&[xid, 0, 2, 100_003, 3, proc_, 0, 0, 0, 0]);
    v.extend_from_slice(args);
    v
}

fn success(xid: u32, results: &[u8]) -> Vec<u8> {
    let mut v = words(&[xid, 1, 0, 0, 0, 0]);
    v.extend_from_slice(results);
    v
}

fn run(msgs: &[Message]) -> (Vec<Rpc>, RpcStats) {
    run_with(Tracker::new(), msgs)
}

fn run_with(mut t: Tracker, msgs: &[Message]) -> (Vec<Rpc>, RpcStats) {
    let mut out = Vec::new();
    for m in msgs {
        t.push(m);
        out.extend(t.drain());
    }
    t.finish();
    out.extend(t.drain());
    (out, t.stats())
}

fn sha(b: &[u8]) -> Option<String> {
    Some(hex(&Sha256::digest(b)))
}

#[test]
fn a_read_reply_in_a_write_chunk_written_in_two_pieces_out_of_order() {
    let file: Vec<u8> = (0..10_000u32).map(|i| (i % 253) as u8).collect();
    let mut call = build_header(
        5,
        32,
        Proc::Msg,
        &[],
        &[vec![seg(0x77, 16384, 0x8000)]],
        None,
    );
    call.extend_from_slice(&nfs_call(5, 6, &[0; 20]));
    let mut reply = build_header(
        5,
        32,
        Proc::Msg,
        &[],
        &[vec![seg(0x77, 10_000, 0x8000)]],
        None,
    );
    reply.extend_from_slice(&success(5, &[0; 100]));
    let (rpcs, stats) = run(&[
        msg(Kind::Send, C, S, call),
        rdma(Kind::Write, 0x77, 0x8000 + 4096, file[4096..].to_vec()),
        rdma(Kind::Write, 0x77, 0x8000, file[..4096].to_vec()),
        msg(Kind::Send, S, C, reply.clone()),
    ]);
    assert_eq!(rpcs.len(), 1, "{rpcs:#?}");
    let r = &rpcs[0];
    assert_eq!(r.incomplete, None);
    assert_eq!(
        (r.xid, r.program, r.version, r.procedure),
        (5, Some(100_003), Some(3), Some(6))
    );
    assert_eq!(r.status.as_deref(), Some("SUCCESS"));
    assert_eq!(r.chunks.len(), 1);
    let w = &r.chunks[0];
    assert_eq!((w.kind, w.length), (ChunkKind::Write, 10_000));
    assert_eq!(w.sha256, sha(&file));
    assert_eq!(w.segments[0].used, Some(10_000));
    let reply_side = r.reply.as_ref().unwrap();
    let inline = (reply.len() - (16 + 4 + 4 + 4 + 16 + 4 + 4)) as u64;
    assert_eq!(reply_side.inline, inline);
    assert_eq!(reply_side.length, inline + 10_000);
    assert_eq!((stats.calls, stats.replies, stats.complete), (1, 1, 1));
}

#[test]
fn a_write_call_with_a_read_chunk_in_two_segments_read_in_sub_segments() {
    let data: Vec<u8> = (0..9000u32).map(|i| (i * 31 % 256) as u8).collect();
    let reads = [
        ReadSegment {
            position: 100,
            segment: seg(0x10, 6000, 0x1000),
        },
        ReadSegment {
            position: 100,
            segment: seg(0x11, 3000, 0x9000),
        },
    ];
    let mut call = build_header(9, 32, Proc::Msg, &reads, &[], None);
    let args = [0u8; 60];
    call.extend_from_slice(&nfs_call(9, 7, &args));
    let mut reply = build_header(9, 32, Proc::Msg, &[], &[], None);
    reply.extend_from_slice(&success(9, &[0; 40]));
    // The second segment read first, the first one in two READs (sub-segments).
    let (rpcs, _) = run(&[
        msg(Kind::Send, C, S, call),
        rdma(Kind::Read, 0x11, 0x9000, data[6000..].to_vec()),
        rdma(Kind::Read, 0x10, 0x1000, data[..2000].to_vec()),
        rdma(Kind::Read, 0x10, 0x1000 + 2000, data[2000..6000].to_vec()),
        msg(Kind::Send, S, C, reply),
    ]);
    assert_eq!(rpcs.len(), 1);
    let r = &rpcs[0];
    assert_eq!(r.incomplete, None, "{r:#?}");
    assert_eq!(r.procedure, Some(7));
    let c = &r.chunks[0];
    assert_eq!(
        (c.kind, c.position, c.length),
        (ChunkKind::Read, Some(100), 9000)
    );
    assert_eq!(c.sha256, sha(&data));
    let call = r.call.as_ref().unwrap();
    assert_eq!(call.length, call.inline + 9000);
    assert_eq!(call.inline, 40 + 60);
}

#[test]
fn nomsg_call_and_reply_chunk_carry_the_rpc_headers() {
    let body = nfs_call(0x44, 16, &[7; 3000]);
    let reads = [ReadSegment {
        position: 0,
        segment: seg(0x20, body.len() as u32, 0x100),
    }];
    let call = build_header(
        0x44,
        8,
        Proc::NoMsg,
        &reads,
        &[],
        Some(&[seg(0x21, 65536, 0x5000)]),
    );
    let rep = success(0x44, &[1; 5000]);
    let reply = build_header(
        0x44,
        8,
        Proc::NoMsg,
        &[],
        &[],
        Some(&[seg(0x21, rep.len() as u32, 0x5000)]),
    );
    let (rpcs, _) = run(&[
        msg(Kind::Send, C, S, call),
        rdma(Kind::Read, 0x20, 0x100, body.clone()),
        rdma(Kind::Write, 0x21, 0x5000, rep.clone()),
        msg(Kind::Send, S, C, reply),
    ]);
    assert_eq!(rpcs.len(), 1);
    let r = &rpcs[0];
    assert_eq!(r.incomplete, None, "{r:#?}");
    assert_eq!((r.program, r.procedure), (Some(100_003), Some(16)));
    assert_eq!(r.status.as_deref(), Some("SUCCESS"));
    // The chunks hold the whole messages.
    assert_eq!(r.call.as_ref().unwrap().sha256, sha(&body));
    assert_eq!(r.reply.as_ref().unwrap().sha256, sha(&rep));
    assert_eq!(r.call.as_ref().unwrap().length, body.len() as u64);
    assert_eq!(r.reply.as_ref().unwrap().length, rep.len() as u64);
    assert_eq!(r.chunks[1].sha256, sha(&rep));
}

#[test]
fn a_read_chunk_is_spliced_into_the_call_at_its_position_with_its_xdr_padding() {
    // An RPC whose opaque argument (5 bytes) went in a read chunk at position 48: the
    // call's digest is the inline part up to 48, the data, 3 zeros, the rest.
    let mut inline = nfs_call(0x61, 7, &[0xcc; 8]);
    inline.extend_from_slice(&words(&[0xdead]));
    let data = b"12345".to_vec();
    let reads = [ReadSegment {
        position: 48,
        segment: seg(0x40, 5, 0x100),
    }];
    let mut call = build_header(0x61, 1, Proc::Msg, &reads, &[], None);
    call.extend_from_slice(&inline);
    let mut reply = build_header(0x61, 1, Proc::Msg, &[], &[], None);
    let reply_inline = success(0x61, &[9; 12]);
    reply.extend_from_slice(&reply_inline);
    let (call_again, reply_again) = (call.clone(), reply.clone());
    let (rpcs, _) = run(&[
        msg(Kind::Send, C, S, call),
        rdma(Kind::Read, 0x40, 0x100, data.clone()),
        msg(Kind::Send, S, C, reply),
    ]);
    let mut whole = inline[..48].to_vec();
    whole.extend_from_slice(&data);
    whole.extend_from_slice(&[0, 0, 0]);
    whole.extend_from_slice(&inline[48..]);
    let r = &rpcs[0];
    assert_eq!(r.incomplete, None);
    assert_eq!(r.call.as_ref().unwrap().sha256, sha(&whole));
    // A reply without chunks: its inline part.
    assert_eq!(r.reply.as_ref().unwrap().sha256, sha(&reply_inline));
    assert_eq!(r.chunks[0].sha256, sha(&data));

    // Without spliced digests, that digest alone is gone.
    let (quick, _) = run_with(
        Tracker::new().spliced_digests(false),
        &[
            msg(Kind::Send, C, S, call_again),
            rdma(Kind::Read, 0x40, 0x100, data.clone()),
            msg(Kind::Send, S, C, reply_again),
        ],
    );
    let mut expected = r.clone();
    expected.call.as_mut().unwrap().sha256 = None;
    assert_eq!(quick, [expected]);
}

#[test]
fn missing_pieces_are_reported() {
    let mut call = build_header(1, 1, Proc::Msg, &[], &[vec![seg(0x30, 8192, 0)]], None);
    call.extend_from_slice(&nfs_call(1, 6, &[]));
    let mut reply = build_header(1, 1, Proc::Msg, &[], &[vec![seg(0x30, 8192, 0)]], None);
    reply.extend_from_slice(&success(1, &[]));
    let mut lonely = build_header(2, 1, Proc::Msg, &[], &[], None);
    lonely.extend_from_slice(&success(2, &[]));
    let mut unanswered = build_header(3, 1, Proc::Msg, &[], &[], None);
    unanswered.extend_from_slice(&nfs_call(3, 1, &[]));
    let (rpcs, stats) = run(&[
        msg(Kind::Send, C, S, call),
        rdma(Kind::Write, 0x30, 4096, vec![0; 4096]), // the first 4096 bytes never come
        msg(Kind::Send, S, C, reply),
        msg(Kind::Send, S, C, lonely),
        msg(Kind::Send, C, S, unanswered),
        msg(Kind::Send, C, S, b"not rpc-over-rdma".to_vec()),
    ]);
    assert_eq!(rpcs.len(), 3, "{rpcs:#?}");
    let why: Vec<&str> = rpcs
        .iter()
        .map(|r| r.incomplete.as_deref().unwrap())
        .collect();
    assert_eq!(why[0], "reply without its call in the capture");
    assert_eq!(why[1], "write chunk 0: 0 of 8192 bytes");
    assert_eq!(why[2], "call without its reply in the capture");
    assert_eq!(rpcs[1].chunks[0].sha256, None);
    assert_eq!((stats.incomplete, stats.other_sends), (3, 1));
}
