//! No input makes the decoders or the reassembler panic: real packets from the fixtures,
//! mutated (bytes flipped, cut, extended) and fed through `decode` and the `Assembler`, whole
//! capture files mutated and read, and random bytes. Deterministic (a fixed-seed xorshift), and
//! bounded in time: `RDMA_TRACE_FUZZ_SECS` (default 3) per test.

use std::path::Path;
use std::time::{Duration, Instant};

use rdma_trace::reasm::{Assembler, FlowKey, Kind, Limits, Message};
use rdma_trace::rpc::{RpcLimits, Tracker};
use rdma_trace::rpcrdma::{self, Proc, ReadSegment, Segment};
use rdma_trace::{cm, decode, for_each_frame, ib, Decoded};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn budget() -> Duration {
    let secs = std::env::var("RDMA_TRACE_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    Duration::from_secs_f64(secs)
}

fn fixture_frames() -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut frames = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let f = std::fs::File::open(e.unwrap().path()).unwrap();
        for_each_frame(f, |fr| frames.push(fr.data.to_vec())).unwrap();
    }
    assert!(frames.len() > 100, "{} fixture frames", frames.len());
    frames
}

fn mutate(rng: &mut Rng, data: &mut Vec<u8>) {
    for _ in 0..=rng.below(4) {
        match rng.below(5) {
            0 | 1 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
            2 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] = rng.next() as u8;
            }
            3 => {
                let n = rng.below(data.len() + 1);
                data.truncate(n);
            }
            _ => {
                for _ in 0..rng.below(64) {
                    data.push(rng.next() as u8);
                }
            }
        }
    }
}

#[test]
fn mutated_packets_decode_or_fail_cleanly_and_reassembly_survives_them() {
    let frames = fixture_frames();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut asm = Assembler::with_limits(Limits {
        max_age: 512,
        max_pending: 64,
        max_pending_total: 96,
        max_open: 8,
        max_kept: 1 << 18,
        max_requests: 64,
        max_flows: 16,
        keep_data: 1 << 16,
        hash_kept: false,
    });
    let mut rpcs = Tracker::with_limits(RpcLimits {
        max_calls: 32,
        max_ahead: 1 << 16,
    });
    let end = Instant::now() + budget();
    let (mut n, mut roce) = (0u64, 0u64);
    while Instant::now() < end {
        for _ in 0..1000 {
            let mut f = frames[rng.below(frames.len())].clone();
            mutate(&mut rng, &mut f);
            n += 1;
            if let Decoded::Roce(p) = decode(1, &f) {
                roce += 1;
                asm.push(n, &p);
                asm.drain().for_each(|m| rpcs.push(&m));
                rpcs.drain().for_each(drop);
                // Per flow: messages opened since its last sweep (every 1024 of its
                // packets, given up after 512 without progress) and 64 waiting packets; 16
                // flows; 64 requests.
                assert!(
                    asm.outstanding() <= 16 * (2048 + 64) + 64,
                    "{}",
                    asm.outstanding()
                );
                assert!(rpcs.outstanding() <= 32);
            }
            // The RDMA layers directly, on the frame's tail.
            let off = rng.below(f.len());
            let _ = ib::parse(&f[off..], rng.below(2) == 0);
            let _ = cm::parse(&f[off..]);
            let _ = rpcrdma::parse_header(&f[off..]);
            let _ = rpcrdma::parse_rpc(&f[off..]);
        }
    }
    asm.finish();
    asm.drain().for_each(|m| rpcs.push(&m));
    rpcs.finish();
    rpcs.drain().for_each(drop);
    assert!(n > 1000 && roce > 100, "{n} frames, {roce} decoded as RoCE");
}

#[test]
fn random_bytes_and_mutated_capture_files_never_panic() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let files: Vec<Vec<u8>> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let end = Instant::now() + budget();
    let mut rounds = 0;
    // At least 20 rounds however slow the machine (a loaded host ran fewer than 10 in 3 s).
    while rounds < 20 || Instant::now() < end {
        rounds += 1;
        let mut file = files[rng.below(files.len())].clone();
        for _ in 0..rng.below(8) {
            mutate(&mut rng, &mut file);
        }
        let mut asm = Assembler::new();
        let _ = for_each_frame(&file[..], |fr| {
            if let Decoded::Roce(p) = decode(fr.linktype, fr.data) {
                asm.push(fr.number, &p);
            }
        });
        asm.finish();
        let random: Vec<u8> = (0..rng.below(300)).map(|_| rng.next() as u8).collect();
        for link in [1, 113, 276, 101, 12345] {
            let _ = decode(link, &random);
        }
        let _ = ib::parse(&random, true);
        let _ = cm::parse(&random);
    }
    assert!(rounds > 10);
}

fn message(rng: &mut Rng, kind: Kind, data: Vec<u8>) -> Message {
    let ips = [[10, 8, 0, 1], [10, 8, 0, 2]];
    let from = rng.below(2);
    Message {
        kind,
        flow: FlowKey {
            src: ips[from].into(),
            dst: ips[1 - from].into(),
            qp: 0x11,
        },
        src_qp: None,
        first_psn: 0,
        last_psn: 0,
        packets: 1,
        first_frame: 1,
        last_frame: 1,
        length: data.len() as u64,
        sha256: Some(String::new()),
        rkey: Some(rng.below(8) as u32),
        va: Some(rng.below(1 << 14) as u64),
        dma_len: None,
        imm: None,
        invalidate: None,
        atomic: None,
        duplicates: 0,
        out_of_order: 0,
        incomplete: (rng.below(16) == 0).then(|| "lost".to_string()),
        tcp_ports: None,
        data: (rng.below(16) != 0).then_some(data),
    }
}

/// RPC-over-RDMA headers with random chunk lists (then mutated) and RDMA READs and WRITEs at
/// random handles and addresses, in random order: the tracker neither panics nor keeps more
/// calls than its limit.
#[test]
fn rpc_tracker_survives_random_calls_replies_and_chunk_data() {
    let mut rng = Rng(0x0bad_cafe_f00d_d00d);
    let mut t = Tracker::with_limits(RpcLimits {
        max_calls: 16,
        max_ahead: 1 << 16,
    });
    let end = Instant::now() + budget();
    let (mut pushed, mut out) = (0u64, 0u64);
    while Instant::now() < end {
        for _ in 0..1000 {
            let seg = |rng: &mut Rng| Segment {
                handle: rng.below(8) as u32,
                length: rng.below(1 << 13) as u32,
                offset: rng.below(1 << 14) as u64,
            };
            let m = match rng.below(3) {
                0 => {
                    let reads: Vec<ReadSegment> = (0..rng.below(3))
                        .map(|_| ReadSegment {
                            position: rng.below(3) as u32 * 4,
                            segment: seg(&mut rng),
                        })
                        .collect();
                    let writes: Vec<Vec<Segment>> = (0..rng.below(3))
                        .map(|_| (0..rng.below(3)).map(|_| seg(&mut rng)).collect())
                        .collect();
                    let reply: Vec<Segment> = (0..rng.below(2)).map(|_| seg(&mut rng)).collect();
                    let proc_ = [Proc::Msg, Proc::NoMsg, Proc::Done][rng.below(3)];
                    let mut b = rpcrdma::build_header(
                        rng.below(4) as u32,
                        1,
                        proc_,
                        &reads,
                        &writes,
                        (!reply.is_empty()).then_some(&reply[..]),
                    );
                    let rpc: Vec<u8> = [rng.below(4) as u32, rng.below(2) as u32, 2, 100_003, 3]
                        .iter()
                        .flat_map(|w| w.to_be_bytes())
                        .collect();
                    b.extend_from_slice(&rpc);
                    if rng.below(4) == 0 {
                        mutate(&mut rng, &mut b);
                    }
                    message(&mut rng, Kind::Send, b)
                }
                k => {
                    let data: Vec<u8> = vec![rng.next() as u8; rng.below(1 << 13)];
                    let kind = if k == 1 { Kind::Write } else { Kind::Read };
                    message(&mut rng, kind, data)
                }
            };
            t.push(&m);
            pushed += 1;
            out += t.drain().count() as u64;
            assert!(t.outstanding() <= 16);
        }
    }
    t.finish();
    out += t.drain().count() as u64;
    assert!(pushed > 1000 && out > 10, "{pushed} pushed, {out} out");
}

/// The fuzz target's entry point (`rdma_trace::fuzzing::run`, what `fuzz/` runs under
/// libfuzzer with nightly) on the committed corpus, then on mutations of it (bytes flipped,
/// cut, extended, and the mode byte changed) for the time budget: no panic, and the limits
/// it checks hold.
#[test]
fn fuzz_entry_point_on_the_corpus_and_its_mutations() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/decode");
    let corpus: Vec<Vec<u8>> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    assert!(corpus.len() >= 8, "{} corpus files", corpus.len());
    for c in &corpus {
        rdma_trace::fuzzing::run(c);
    }
    let mut rng = Rng(0x5eed_0ff0_2200);
    let end = Instant::now() + budget();
    let mut runs = 0;
    while runs < 50 || Instant::now() < end {
        runs += 1;
        let mut input = corpus[rng.below(corpus.len())].clone();
        for _ in 0..=rng.below(8) {
            mutate(&mut rng, &mut input);
        }
        if rng.below(8) == 0 {
            if let Some(m) = input.first_mut() {
                *m = rng.below(4) as u8;
            }
        }
        rdma_trace::fuzzing::run(&input);
    }
}
