//! Everything rdma-verbs reads from outside the program (private data, CM event parameters,
//! socket addresses, sysfs trees) on arbitrary bytes (see `rdma::fuzzing`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rdma::fuzzing::run(data));
