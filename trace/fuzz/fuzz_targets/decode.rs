//! Every decoder and reassembler of rdma-trace on arbitrary bytes (see `rdma_trace::fuzzing`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rdma_trace::fuzzing::run(data));
