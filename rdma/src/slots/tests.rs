//! Unit tests of the slot queue's checks that need no device (pure Rust,
//! run under Miri too); the queue's traffic is tested on the device in
//! `tests/slot_queue.rs`.

use super::{fits_remote, write_beyond_remote};
use crate::{Error, RemoteMemory};

#[test]
fn a_write_fits_its_remote_range_up_to_its_last_byte() {
    let r = RemoteMemory {
        addr: 0x7000,
        len: 64,
        rkey: 3,
    };
    assert!(fits_remote(0, &r));
    assert!(fits_remote(64, &r));
    assert!(!fits_remote(65, &r));
    assert!(!fits_remote(u32::MAX, &r));
    // An empty range takes only an empty write.
    let empty = RemoteMemory { len: 0, ..r };
    assert!(fits_remote(0, &empty));
    assert!(!fits_remote(1, &empty));
    // A range longer than any post takes every length.
    let huge = RemoteMemory { len: u64::MAX, ..r };
    assert!(fits_remote(u32::MAX, &huge));
    let four_gib = RemoteMemory {
        len: u64::from(u32::MAX),
        ..r
    };
    assert!(fits_remote(u32::MAX, &four_gib));
}

#[test]
fn a_write_past_its_remote_range_is_refused_with_the_post_the_length_and_the_range() {
    let r = RemoteMemory {
        addr: 0x7000,
        len: 64,
        rkey: 0x2a,
    };
    match write_beyond_remote(17, 3, 65, &r) {
        Error::InvalidArgument { verb, reason } => {
            assert_eq!(verb, "ibv_post_send");
            for says in [
                "RDMA WRITE of 65 bytes",
                "slot 3",
                "QP 17",
                "64 bytes at 0x7000",
                "rkey 0x2a",
                "error state",
            ] {
                assert!(reason.contains(says), "{reason:?} does not say {says:?}");
            }
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}
