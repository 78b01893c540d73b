//! Every 9P decoder of what a peer sends, on arbitrary bytes (see `rdma_9p::fuzzing`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rdma_9p::fuzzing::run(data));
