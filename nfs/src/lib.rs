//! An NFSv3 client over RPC-over-RDMA version 1 (RFC 8166), built on
//! `rdma::aio` and tokio, that talks to the Linux kernel's NFS server.
//!
//! - [`xdr`]: XDR items; the reader checks every length.
//! - [`rpc`]: ONC RPC calls (`AUTH_NONE`, `AUTH_SYS`) and replies.
//! - [`rpcrdma`]: RPC-over-RDMA headers (read list, write list, reply
//!   chunk, `RDMA_ERROR`) and RFC 8797 connection private data.
//! - [`transport`]: the connection: credits, buffer pools, inline
//!   threshold, chunks, timeouts with reconnection and retransmission.
//! - [`mount`]: MOUNT v3 over TCP (with rpcbind) for the root file handle.
//! - [`nfs3`]: NFSv3 procedures on the transport.
//!
//! ```no_run
//! # #[allow(dead_code)]
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use rdma_nfs::nfs3::Client;
//! let client = Client::mount("10.8.0.1".parse()?, "/export", Default::default()).await?;
//! let fh = client.lookup_path("hello.txt").await?;
//! let data = client.read_all(&fh).await?;
//! println!("{} bytes", data.len());
//! # Ok(()) }
//! ```
#![doc(test(attr(deny(warnings))))]

mod chunks;
mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod mount;
pub mod nfs3;
pub mod rpc;
pub mod rpcrdma;
mod stats;
mod status;
pub mod transport;
pub mod xdr;
