//! The passive side of rdma-core's synchronous endpoint example
//! (`rdma_server`): `rdma_getaddrinfo`, `rdma_create_ep`, `rdma_listen`,
//! `rdma_get_request`, then one 16-byte message each way; pairs with
//! `rdma_client` (this example's or rdma-core's).
//!
//! ```text
//! rdma_server [-s server_address] [-p port_number]
//! ```
//!
//! Prints `rdma_server: start` and, at the end, `rdma_server: end N` with
//! N = 0 on success, as the C tool does. Both sides are in
//! `common/endpoint.rs`.

mod common;

fn main() -> std::process::ExitCode {
    common::endpoint::main(common::endpoint::Side::Server)
}
