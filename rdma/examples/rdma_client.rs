//! The active side of rdma-core's synchronous endpoint example
//! (`rdma_client`): `rdma_getaddrinfo`, `rdma_create_ep`, `rdma_connect`,
//! then one 16-byte message each way; pairs with `rdma_server` (this
//! example's or rdma-core's).
//!
//! ```text
//! rdma_client [-s server_address] [-p port_number]
//! ```
//!
//! Prints `rdma_client: start` and, at the end, `rdma_client: end N` with
//! N = 0 on success, as the C tool does. Both sides are in
//! `common/endpoint.rs`.

mod common;

fn main() -> std::process::ExitCode {
    common::endpoint::main(common::endpoint::Side::Client)
}
