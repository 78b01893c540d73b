//! The fuzzing entry point: [`run`] hands arbitrary bytes to every decoder
//! of what the server sends: the RPC-over-RDMA header of each receive, the
//! RFC 8797 private data of the connection's accept, the RPC reply header,
//! and the NFSv3 items every reply carries (attributes, weak cache
//! consistency data, file handles). The cargo-fuzz target in `nfs/fuzz/`
//! calls it, and so does the test suite (`tests/no_panic.rs`) on the
//! committed corpus (`tests/corpus/`) and on mutations of it, with stable
//! Rust. Nothing it reaches may panic, and whatever decodes must encode back
//! to the bytes it came from (it checks).
//!
//! The first byte chooses what the rest is read as:
//! - 0: an RPC-over-RDMA header ([`Header::decode`]), re-encoded;
//! - 1: connection private data ([`ConnectPrivate::decode`]), re-encoded;
//! - 2: an RPC reply ([`crate::rpc::decode_reply`]), then NFSv3 items
//!   from where its results start;
//! - anything else: all three, on the rest.

use crate::nfs3;
use crate::rpcrdma::{ConnectPrivate, Header};
use crate::xdr::{Reader, Writer};

/// Runs the input through the part its first byte chooses.
///
/// # Panics
/// Only when a decoded value does not encode back to its bytes (a bug the
/// fuzzer is looking for); never because of the input's shape.
pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode {
        0 => transport_header(rest),
        1 => private_data(rest),
        2 => rpc_reply(rest),
        _ => {
            transport_header(rest);
            private_data(rest);
            rpc_reply(rest);
        }
    }
}

fn transport_header(data: &[u8]) {
    let Ok((h, len)) = Header::decode(data) else {
        return;
    };
    assert!(len <= data.len(), "header length {len} beyond the input");
    let mut w = Writer::new();
    h.encode(&mut w);
    assert_eq!(w.buf, &data[..len], "rpcrdma header round trip: {h:?}");
}

fn private_data(data: &[u8]) {
    if let Some(p) = ConnectPrivate::decode(data) {
        assert_eq!(
            &p.encode()[..],
            &data[..8],
            "private data round trip: {p:?}"
        );
    }
}

fn rpc_reply(data: &[u8]) {
    let results = match crate::rpc::decode_reply(data) {
        Ok((_, r)) => r,
        // The bytes as results, as a reply that got that far would carry.
        Err(_) => Reader::new(data),
    };
    let mut r = results.clone();
    let _ = nfs3::post_op_attr(&mut r).and_then(|_| nfs3::fh(&mut r));
    let mut r = results.clone();
    let _ = nfs3::wcc_data(&mut r).and_then(|()| nfs3::fattr(&mut r));
}
