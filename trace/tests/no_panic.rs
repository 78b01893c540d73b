//! No input makes the decoders or the reassembler panic: real packets from the fixtures,
//! mutated (bytes flipped, cut, extended) and fed through `decode` and the `Assembler`, whole
//! capture files mutated and read, and random bytes. Deterministic (a fixed-seed xorshift), and
//! bounded in time: `RDMA_TRACE_FUZZ_SECS` (default 3) per test.

use std::path::Path;
use std::time::{Duration, Instant};

use rdma_trace::reasm::{Assembler, Limits};
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
        max_requests: 64,
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
                asm.drain().for_each(drop);
                assert!(asm.outstanding() <= 64 * 64 + 64);
            }
            // The RDMA layers directly, on the frame's tail.
            let off = rng.below(f.len());
            let _ = ib::parse(&f[off..], rng.below(2) == 0);
            let _ = cm::parse(&f[off..]);
        }
    }
    asm.finish();
    asm.drain().for_each(drop);
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
    while Instant::now() < end {
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
