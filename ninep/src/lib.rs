//! A 9P2000.L file server over RDMA that the Linux kernel mounts with
//! `mount -t 9p -o trans=rdma,port=5640,version=9p2000.L ADDR /mnt`.
//!
//! - [`proto`]: the messages, decoded and encoded with every length checked.
//! - [`fs`]: the served directory and a connection's fids; nothing resolves
//!   outside the directory (`openat2` with `RESOLVE_BENEATH`).
//! - [`client`]: a client transport built like Linux's `trans_rdma` (states,
//!   queue depths, `excess_rc`, a CM timeout, the kernel's options) and a
//!   small 9P client on it.
//! - [`server`]: RDMA CM on the crate's async layer (tokio): one QP per
//!   client, every message one SEND, receives of the largest msize always
//!   posted (before the connection is accepted, too).
//! - [`workers`]: the threads that run requests, and each connection's
//!   share of them.
//!
//! ```no_run
//! # fn main() -> Result<(), rdma_9p::Error> {
//! let config = rdma_9p::server::Config::new("/srv/export".into());
//! rdma_9p::server::run(config, |addr| println!("serving on {addr}"))
//! # }
//! ```
#![doc(test(attr(deny(warnings))))]

pub mod budget;
pub mod client;
mod dir;
mod error;
pub mod fs;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod link;
pub mod proto;
pub mod server;
mod stats;
mod sys;
pub mod users;
pub mod workers;

pub use error::Error;
