//! Traffic over the safe post path: every operation and QP type, data checked
//! byte for byte. Modelled on rdma-core's tests/test_qp.py, test_qpex.py and
//! test_atomic.py; two QPs on the test device talk to each other.
//!
//! The tests live in the modules below, along what they test; each takes the
//! imports and helpers of this file with `use super::*`.

#[path = "../common/mod.rs"]
mod common;

use common::{take, wait};
use std::sync::Arc;

use rdma::{
    AccessFlags, AhAttr, Error, InlineSend, PostPath, QpType, SendFlags, SendOp, SendWr, WcOpcode,
    WcStatus, WrBuffers,
};

const LW: AccessFlags = AccessFlags::LOCAL_WRITE;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// An address handle to the test port's own GID (the pair's QPs are on it).
fn local_ah(p: &common::Pair) -> rdma::AddressHandle {
    let gid = p.ctx.query_gid(1, u32::from(p.gid_index)).unwrap();
    p.pd.create_ah(&AhAttr::global(1, gid, p.gid_index))
        .unwrap()
}

/// Runs a traffic test over both send paths: `NAME::legacy` uses
/// `ibv_post_send`, `NAME::extended` the `ibv_wr_*` API.
macro_rules! both_paths {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                #[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
                fn legacy() {
                    super::$name(rdma::PostPath::Legacy);
                }

                #[test]
                #[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
                fn extended() {
                    super::$name(rdma::PostPath::Extended);
                }

                #[test]
                #[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
                fn auto() {
                    super::$name(rdma::PostPath::Auto);
                }
            }
        )*
    };
}

/// Like `both_paths!` for requests that rdma-core 44's rxe provider gets
/// wrong on the `ibv_wr_*` path (scatter lists, inline data): legacy and
/// auto (which routes them through `ibv_post_send`).
macro_rules! legacy_and_auto {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                #[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
                fn legacy() {
                    super::$name(rdma::PostPath::Legacy);
                }

                #[test]
                #[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
                fn auto() {
                    super::$name(rdma::PostPath::Auto);
                }
            }
        )*
    };
}

/// Posts three `len`-byte receives on `p.b` (ids 10..13), pieces of one
/// registration.
fn three_receives(p: &mut common::Pair, len: usize) {
    let recvs = p.pd.alloc_mr(3 * len, LW).unwrap().chunks(len).unwrap();
    p.b.post_recv_batch(
        recvs
            .into_iter()
            .enumerate()
            .map(|(i, m)| (10 + i as u64, m.into())),
    )
    .unwrap();
}

mod polling;
mod prepared_recv;
mod prepared_send;
mod qp_types;
mod rdma_ops;
mod send;
mod shared_cq;
mod shared_region;
