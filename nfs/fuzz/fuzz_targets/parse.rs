//! Every decoder of what an NFS server sends, on arbitrary bytes (see `rdma_nfs::fuzzing`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rdma_nfs::fuzzing::run(data));
