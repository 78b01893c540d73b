//! No reply a server can send makes the client's decoders panic
//! (`rdma_nfs::fuzzing::run`: RPC-over-RDMA headers, RFC 8797 private
//! data, RPC replies and the NFSv3 items in them): the committed corpus,
//! mutations of it (bytes flipped, cut, extended), and random bytes.
//! Deterministic (a fixed-seed xorshift) and bounded in time:
//! `RDMA_NFS_FUZZ_SECS` (default 2).

use std::path::Path;
use std::time::{Duration, Instant};

use rdma::fuzzing::Rng;

fn budget() -> Duration {
    rdma::fuzzing::budget("RDMA_NFS_FUZZ_SECS", 2.0)
}

fn corpus() -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/parse");
    rdma::fuzzing::corpus(&dir, 10).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

#[test]
fn the_corpus_decodes_and_encodes_back() {
    let mut decoded = 0;
    for seed in corpus() {
        rdma_nfs::fuzzing::run(&seed);
        // Every seed is a well-formed message of its kind: check that the
        // decoders accept it (so that mutations start from real input).
        let (mode, rest) = seed.split_first().unwrap();
        let ok = match mode {
            0 => rdma_nfs::rpcrdma::Header::decode(rest).is_ok(),
            1 => rdma_nfs::rpcrdma::ConnectPrivate::decode(rest).is_some(),
            2 => rdma_nfs::rpc::reply_xid(rest).is_ok(),
            _ => true,
        };
        assert!(ok, "seed {seed:02x?} does not decode");
        decoded += 1;
    }
    assert!(decoded >= 10);
}

#[test]
fn mutated_and_random_input_never_panics() {
    let seeds = corpus();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let end = Instant::now() + budget();
    let mut runs = 0u64;
    while Instant::now() < end {
        for seed in &seeds {
            let mut d = seed.clone();
            rdma::fuzzing::mutate(&mut rng, &mut d);
            rdma_nfs::fuzzing::run(&d);
            runs += 1;
        }
        let mut d = vec![0u8; rng.below(256)];
        d.iter_mut().for_each(|b| *b = rng.next() as u8);
        rdma_nfs::fuzzing::run(&d);
        runs += 1;
    }
    assert!(runs > 1000, "only {runs} inputs in the time budget");
}
