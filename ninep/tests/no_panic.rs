//! No message a peer can send makes the 9P decoders panic
//! (`rdma_9p::fuzzing::run`: requests, replies, `Rreaddir` entries): the
//! committed corpus, mutations of it (bytes flipped, cut, extended), and
//! random bytes. Deterministic (a fixed-seed xorshift) and bounded in time:
//! `RDMA_9P_FUZZ_SECS` (default 2).

use std::path::Path;
use std::time::{Duration, Instant};

use rdma::fuzzing::Rng;
use rdma_9p::proto::{DirEntry, Request, Rmsg};

fn budget() -> Duration {
    rdma::fuzzing::budget("RDMA_9P_FUZZ_SECS", 2.0)
}

fn corpus() -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/parse");
    rdma::fuzzing::corpus(&dir, 10).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// `rdma::fuzzing::mutate`, and every message's size field fixed up half of
/// the time, so that mutations reach the bodies' decoders.
fn mutate(rng: &mut Rng, data: &mut Vec<u8>) {
    rdma::fuzzing::mutate(rng, data);
    if data.len() >= 5 && data[0] < 2 && rng.below(2) == 0 {
        let size = (data.len() - 1) as u32;
        data[1..5].copy_from_slice(&size.to_le_bytes());
    }
}

#[test]
fn the_corpus_decodes() {
    for seed in corpus() {
        rdma_9p::fuzzing::run(&seed);
        let (mode, rest) = seed.split_first().unwrap();
        let ok = match mode {
            0 => Request::decode(rest).is_ok(),
            1 => Rmsg::decode(rest).is_ok(),
            2 => DirEntry::decode_all(rest).is_ok(),
            _ => true,
        };
        assert!(ok, "seed {seed:02x?} does not decode");
    }
}

#[test]
fn mutated_and_random_input_never_panics() {
    let seeds = corpus();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let end = Instant::now() + budget();
    let (mut runs, mut decoded) = (0u64, 0u64);
    while Instant::now() < end {
        for seed in &seeds {
            let mut d = seed.clone();
            mutate(&mut rng, &mut d);
            rdma_9p::fuzzing::run(&d);
            if d.first() == Some(&0) && Request::decode(&d[1..]).is_ok() {
                decoded += 1;
            }
            runs += 1;
        }
        let mut d = vec![0u8; rng.below(256)];
        d.iter_mut().for_each(|b| *b = rng.next() as u8);
        rdma_9p::fuzzing::run(&d);
        runs += 1;
    }
    assert!(runs > 1000, "only {runs} inputs in the time budget");
    // The mutations reach the bodies' decoders, not only the header check.
    assert!(decoded > 0, "no mutated request decoded in {runs} inputs");
}
