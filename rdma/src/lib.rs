//! Safe bindings to rdma-core: InfiniBand verbs (`libibverbs`) and the RDMA
//! connection manager (`librdmacm`).
//!
//! # Object graph
//! ```text
//! devices() -> Device --open--> Context   (or Context::import_device(dup of cmd_fd), see `import`)
//!                                 |-- alloc_pd / import_pd --> ProtectionDomain
//!                                 |                  |-- import_mr ---------> ImportedMemoryRegion
//!                                 |                  |-- alloc_mr / reg_mr --> MemoryRegion (pieces)
//!                                 |                  |-- reg_implicit_odp --> ImplicitOdpRegion
//!                                 |                  |-- reg_dm_mr(&dm) ----> DeviceMemoryRegion
//!                                 |                  |-- alloc_parent_domain(td) -> ParentDomain
//!                                 |                  |-- alloc_mw ----------> MemoryWindow
//!                                 |                  |-- create_ah ---------> AddressHandle
//!                                 |                  |-- create_srq --------> SharedReceiveQueue
//!                                 |                  |-- create_srq_ex(.., Xrc{xrcd, cq}) -> SharedReceiveQueue
//!                                 |                  |-- alloc_null_mr -----> NullMemoryRegion
//!                                 |                  '-- qp_builder(..).build() -> QueuePair
//!                                 |-- alloc_dm / import_dm --> DeviceMemory
//!                                 |-- alloc_td --> ThreadDomain
//!                                 |-- open_xrcd --> XrcDomain --create_qp_ex / open_qp--> XrcRecvQueuePair
//!                                 |-- create_comp_channel --> CompletionChannel
//!                                 |-- create_cq / create_cq_ex --> CompletionQueue
//!                                 '-- get_async_event --> AsyncEvent
//! sysfs::Sysfs --> RdmaDevice --> EndPort      (discovery without opening a device)
//! ```
//! Every object holds an `Arc` of its parents (a QP holds its PD, CQs and
//! SRQ; an MR its PD; a PD or CQ its context), so objects can be kept together
//! in one struct, moved between threads and dropped in any order: the last
//! drop tears down in the order the verbs require. `Context`,
//! `ProtectionDomain`, `CompletionQueue`, `CompletionChannel`,
//! `SharedReceiveQueue` and `AddressHandle` are cheap `Clone` handles;
//! `QueuePair`, `MemoryRegion` and `MemoryWindow` are unique owners.
//!
//! # Safe posting
//! Work requests take [`MemoryRegion`]s by value; the completion polled from
//! the CQ gives them back, with the caller's `wr_id`. Memory the device may
//! still touch is never freed: a dropped QP is moved to the error state and
//! destroyed before the memory of its work in flight is released, and a
//! forgotten handle keeps its registration alive. Regions a peer may write
//! (`REMOTE_WRITE`, `REMOTE_ATOMIC`, `MW_BIND`) are never exposed as
//! `&[u8]`. One region can be the source of many SENDs and RDMA WRITEs in
//! flight at once ([`WrBuffers::Shared`], an `Arc` per request).
//! [`QueuePair::post_send_raw`] remains as `unsafe` for experts.
//!
//! ```no_run
//! # fn main() -> rdma::Result<()> {
//! use rdma::{AccessFlags, QpType, SendWr};
//! let ctx = rdma::Context::open("rxe0")?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(64, None, 0)?;
//! let mut qp = pd.qp_builder(QpType::Rc, &cq, &cq).build()?;
//! // ... to_init / to_rtr / to_rts against a peer ...
//! let msg = pd.reg_mr(b"hello".to_vec(), AccessFlags::empty())?;
//! // A failed post gives the message back; here it is dropped on purpose.
//! qp.post_send(SendWr::send(1, msg))
//!     .map_err(rdma::PostError::drop_buffers)?;
//! let mut done = Vec::new();
//! while cq.poll(&mut done, 1)? == 0 {}
//! let mut c = done.pop().unwrap().ok()?;
//! let msg = c.take_buffers().into_one().unwrap(); // the memory is back
//! # let _ = msg;
//! # Ok(())
//! # }
//! ```
//!
//! # Errors
//! Every fallible call returns [`Result`]; [`enum@Error`] names the verb that failed,
//! what it was called on, and carries its errno ([`Error::errno`]). Failed
//! completions are values ([`Completion::status`]).
//!
//! # Threads
//! Handles are `Send + Sync` (libibverbs verbs are thread-safe); posting
//! needs `&mut QueuePair`; an extended-CQ [`PollCursor`] is `!Send` and
//! excludes other polls of its CQ while it lives.
//!
//! # Async
//! [`aio`] awaits completions ([`aio::AsyncCq`]), connection manager events
//! and connection steps ([`aio::AsyncCmId`], a two-phase
//! [`aio::Incoming`]), room in a queue before posting, and device events,
//! from any reactor: the core takes a small readiness trait, and the
//! `tokio` and `async-io` features provide adapters. Every future may be
//! dropped at any await point without losing a completion or an event, or
//! leaving an event unacknowledged. Without a runtime,
//! [`CompletionQueue::wait`] sleeps on a CQ's channel with a timeout.
//!
//! # Fork
//! On kernels without copy-on-fork (before Linux 5.13), a process that forks
//! while it has registered memory must call [`fork_init`] (or set
//! `RDMAV_FORK_SAFE=1`) before it creates any RDMA resource; this crate does
//! not do it for you. [`is_fork_initialized`] tells whether fork support is
//! on, or [`ForkStatus::Unneeded`] because the kernel keeps registered memory
//! safe by itself.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

/// The raw bindings (`rdma-sys`), for what the safe API does not cover yet.
pub use rdma_sys as ffi;

mod macros;

mod ah;
pub mod aio;
mod async_event;
pub mod cm;
mod context;
mod cq;
mod cq_wait;
mod device;
mod device_attr;
mod dm;
mod ece;
mod error;
mod fork;
mod gid;
pub mod import;
mod mr;
mod mw;
mod null_mr;
mod odp;
mod pd;
mod pool;
mod port;
mod qp;
mod remote;
mod srq;
pub mod sysfs;
mod td;
mod track;
mod wc;
mod wr;
mod xrc;

pub use ah::{AddressHandle, AhAttr, GlobalRoute};
pub use async_event::{AsyncEvent, AsyncEventElement, AsyncEventType, AsyncFd};
pub use context::Context;
pub use cq::{CompletionChannel, CompletionQueue, CqEvent, CqModeration, PollCursor};
pub use device::{device_by_name, devices, Device, Guid, NodeType, TransportType};
pub use device_attr::{AtomicCap, DeviceAttr, DeviceCapFlags};
pub use dm::{DeviceMemory, DeviceMemoryRegion};
pub use ece::Ece;
pub use error::{teardown_failures, Error, Result};
pub use fork::{fork_init, is_fork_initialized, ForkStatus};
pub use gid::{Gid, GidEntry, GidType};
pub use import::ImportedMemoryRegion;
pub use mr::{AccessFlags, MemoryRegion, RemoteMemory};
pub use mw::{MemoryWindow, MwType};
pub use null_mr::NullMemoryRegion;
pub use odp::{
    AdviseFlags, ImplicitOdpRegion, MrAdvice, OdpCaps, OdpGeneralCaps, OdpTransportCaps,
};
pub use pd::ProtectionDomain;
pub use pool::BufferPool;
pub use port::{LinkLayer, Mtu, PortAttr, PortCapFlags, PortState};
pub use qp::{
    InitAttr, PostPath, QpAttr, QpCaps, QpCreateFlags, QpState, QpType, QueuePair,
    QueuePairBuilder, RtrAttr, RtsAttr,
};
pub use srq::{SharedReceiveQueue, SrqAttr, SrqType};
pub use td::{ParentDomain, ThreadDomain};
pub use wc::{Completion, WcFlags, WcOpcode, WcStatus};
pub use wr::{
    InlineSend, PostError, PreparedSend, SendFlags, SendOp, SendWr, UdDest, WrBuffers, WrOpcode,
};
pub use xrc::{XrcDomain, XrcRecvQueuePair};

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
        send_sync::<crate::DeviceMemory>();
        send_sync::<crate::DeviceMemoryRegion>();
        send_sync::<crate::ImplicitOdpRegion>();
        send_sync::<crate::ThreadDomain>();
        send_sync::<crate::ParentDomain>();
        send_sync::<crate::XrcDomain>();
        send_sync::<crate::XrcRecvQueuePair>();
        send_sync::<crate::NullMemoryRegion>();
        send_sync::<crate::ImportedMemoryRegion>();
        send_sync::<crate::PreparedSend>();
        // A shared region moves between threads inside the requests and
        // completions that hold it.
        send_sync::<crate::WrBuffers>();
        send_sync::<crate::SendWr>();
        send_sync::<std::sync::Arc<crate::MemoryRegion>>();
    }
}
