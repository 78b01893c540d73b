//! Safe bindings to rdma-core: InfiniBand verbs (`libibverbs`) and the RDMA
//! connection manager (`librdmacm`).
//!
//! # Object graph
//! ```text
//! devices() -> Device --open--> Context --+--> query_device / query_port / query_gid
//! ```
//! Objects created from a [`Context`] keep it open: handles hold an `Arc` of
//! their parent, so they can be stored together in one struct, moved between
//! threads and dropped in any order; the last drop closes the device.
//!
//! # Errors
//! Every fallible call returns [`Result`]; [`enum@Error`] names the verb that failed
//! and carries its errno ([`Error::errno`]).
//!
//! # Fork
//! A process that forks while it has registered memory must call
//! `ibv_fork_init()` (or set `RDMAV_FORK_SAFE=1`) before it creates any RDMA
//! resource; this crate does not do it for you.
//!
//! # Example
//! ```no_run
//! # fn main() -> rdma::Result<()> {
//! for device in rdma::devices()? {
//!     let ctx = device.open()?;
//!     let port = ctx.query_port(1)?;
//!     println!("{}: {} {}", device.name(), port.state, port.link_layer);
//! }
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

/// The raw bindings (`rdma-sys`), for what the safe API does not cover yet.
pub use rdma_sys as ffi;

mod macros;

mod ah;
mod async_event;
pub mod cm;
mod context;
mod cq;
mod device;
mod device_attr;
mod error;
mod gid;
mod mr;
mod mw;
mod pd;
mod port;
mod qp;
mod srq;
pub mod sysfs;
mod track;
mod wc;
mod wr;
mod xrc;

pub use ah::{AddressHandle, AhAttr, GlobalRoute};
pub use async_event::{AsyncEvent, AsyncEventElement, AsyncEventType, AsyncFd};
pub use context::Context;
pub use cq::{CompletionChannel, CompletionQueue, CqEvent, PollCursor};
pub use device::{device_by_name, devices, Device, Guid, NodeType, TransportType};
pub use device_attr::{AtomicCap, DeviceAttr, DeviceCapFlags};
pub use error::{Error, Result};
pub use gid::{Gid, GidEntry, GidType};
pub use mr::{AccessFlags, MemoryRegion, RemoteMemory};
pub use mw::{MemoryWindow, MwType};
pub use pd::ProtectionDomain;
pub use port::{LinkLayer, Mtu, PortAttr, PortCapFlags, PortState};
pub use qp::{
    InitAttr, PostPath, QpAttr, QpCaps, QpState, QpType, QueuePair, QueuePairBuilder, RtrAttr,
    RtsAttr,
};
pub use srq::{SharedReceiveQueue, SrqAttr};
pub use wc::{Completion, WcFlags, WcOpcode, WcStatus, WrBuffers};
pub use wr::{InlineSend, PostError, SendFlags, SendOp, SendWr, UdDest};
pub use xrc::XrcDomain;

#[cfg(test)]
mod auto_traits {
    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn handles_are_send_and_sync() {
        send_sync::<crate::Context>();
        send_sync::<crate::ProtectionDomain>();
        send_sync::<crate::MemoryRegion>();
        send_sync::<crate::CompletionQueue>();
        send_sync::<crate::CompletionChannel>();
        send_sync::<crate::QueuePair>();
        send_sync::<crate::AddressHandle>();
        send_sync::<crate::Completion>();
        send_sync::<crate::SharedReceiveQueue>();
        send_sync::<crate::Device>();
        send_sync::<crate::Error>();
    }
}
