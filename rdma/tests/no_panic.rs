//! No input from outside makes the crate panic: the fuzz entry point
//! (`rdma::fuzzing::run`: private data and CM event parameters, socket
//! addresses, sysfs trees) on the committed corpus (`tests/corpus/`, also
//! the fuzzer's seed corpus), on mutations of it (bytes flipped, cut,
//! extended) and on random bytes. Deterministic (fixed-seed xorshift), and
//! bounded in time: `RDMA_FUZZ_SECS` (default 2) per test, and at least a
//! stated number of inputs however slow the machine. Built only with the
//! `fuzzing` feature (`--all-features` in CI), which exposes that entry point.

use std::path::Path;
use std::time::{Duration, Instant};

use rdma::fuzzing::Rng;

fn budget() -> Duration {
    rdma::fuzzing::budget("RDMA_FUZZ_SECS", 2.0)
}

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("tests/corpus")
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

fn mutate(rng: &mut Rng, data: &mut Vec<u8>) {
    for _ in 0..=rng.below(4) {
        match rng.below(6) {
            // Never the mode byte: mutations stay in their part.
            0 | 1 if data.len() > 1 => {
                let i = 1 + rng.below(data.len() - 1);
                data[i] ^= 1 << rng.below(8);
            }
            2 if data.len() > 1 => {
                let i = 1 + rng.below(data.len() - 1);
                data[i] = rng.next() as u8;
            }
            3 => {
                let n = 1 + rng.below(data.len());
                data.truncate(n);
            }
            4 if data.len() > 1 => {
                // A separator of the sysfs mode, somewhere.
                let i = 1 + rng.below(data.len() - 1);
                data.insert(i, 0xff);
            }
            _ => {
                for _ in 0..rng.below(32) {
                    data.push(rng.next() as u8);
                }
            }
        }
    }
}

#[test]
fn the_corpus_covers_every_mode_and_runs_clean() {
    let corpus = corpus();
    let mut modes = [0usize; 4];
    for (name, data) in &corpus {
        modes[usize::from(data[0].min(3))] += 1;
        eprintln!("{name}: {} bytes", data.len());
        rdma::fuzzing::run(data);
    }
    assert!(
        modes.iter().all(|&n| n > 0),
        "inputs per mode (private data, address, sysfs, all): {modes:?}"
    );
}

#[test]
fn mutated_private_data_and_addresses_never_panic() {
    let corpus: Vec<Vec<u8>> = corpus()
        .into_iter()
        .map(|(_, d)| d)
        .filter(|d| d[0] < 2)
        .collect();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let end = Instant::now() + budget();
    let mut n = 0u64;
    while n < 20_000 || Instant::now() < end {
        for _ in 0..1000 {
            let mut d = corpus[rng.below(corpus.len())].clone();
            mutate(&mut rng, &mut d);
            rdma::fuzzing::run(&d);
            n += 1;
        }
        // Random bytes in every mode.
        let random: Vec<u8> = (0..rng.below(300)).map(|_| rng.next() as u8).collect();
        for mode in 0..2u8 {
            let mut d = vec![mode];
            d.extend_from_slice(&random);
            rdma::fuzzing::run(&d);
        }
    }
    eprintln!("{n} inputs");
}

#[test]
fn mutated_sysfs_trees_never_panic() {
    let corpus: Vec<Vec<u8>> = corpus()
        .into_iter()
        .map(|(_, d)| d)
        .filter(|d| d[0] >= 2)
        .collect();
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let end = Instant::now() + budget();
    let mut n = 0u64;
    // Each input writes and reads a small tree: at least 100 of them.
    while n < 100 || Instant::now() < end {
        for _ in 0..50 {
            let mut d = corpus[rng.below(corpus.len())].clone();
            for _ in 0..=rng.below(3) {
                mutate(&mut rng, &mut d);
            }
            rdma::fuzzing::run(&d);
            n += 1;
        }
    }
    eprintln!("{n} trees");
}
