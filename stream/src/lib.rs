//! Byte streams over RDMA that speak librdmacm's **rsocket** protocol
//! (`rsocket.c`, `SOCK_STREAM`, version 1): a Rust service and rdma-core's
//! C programs (`rstream`, `rcopy`, anything run under `librspreload.so`)
//! talk to each other, on InfiniBand/RoCE and on iWARP.
//!
//! # The protocol, as this crate speaks it
//! - Each side registers a receive buffer and a two-entry *target SGL*, and
//!   sends their addresses and rkeys, with its receive queue depth as
//!   credits, in the private data of the connect request or the accept
//!   ([`wire::ConnData`]).
//! - Data goes by RDMA WRITE WITH IMMEDIATE straight into the peer's
//!   receive buffer; the immediate data says how many bytes
//!   ([`wire::msg`]). On iWARP, which has no immediate data, a 4-byte SEND
//!   follows each WRITE.
//! - The reader grants more: new credits (zero-length messages) and, each
//!   time half its buffer has been read, that half again, written into the
//!   writer's target SGL.
//! - Control messages: SHUTDOWN (half-close), DISCONNECT, KEEPALIVE.
//!
//! Everything the peer sends is checked: a message beyond its credits,
//! data beyond the space granted, an unknown operation end the connection
//! with `InvalidData`; remotely written memory is only read with the
//! crate's atomic copies.
//!
//! ```no_run
//! use std::io::{Read, Write};
//! # fn main() -> std::io::Result<()> {
//! // A C peer: `rstream -s 10.8.0.1` (or `rcat -l 10.8.0.1 7471`).
//! let mut s = rdma_stream::RdmaStream::connect("10.8.0.1:7471")?;
//! s.write_all(b"over rsocket")?;
//! # Ok(()) }
//! ```

pub mod aio;
mod blocking;
mod engine;
mod iomap;
mod linger;
mod local;
mod ring;
mod setup;
pub mod wire;

pub use blocking::{RdmaListener, RdmaStream};
pub use iomap::IoMap;
pub use local::Sizes;
pub use setup::Options;

/// A verbs error as an I/O error (its kind from the errno).
pub(crate) fn io_error(e: rdma::Error) -> std::io::Error {
    std::io::Error::from(e)
}
