//! Safe bindings to rdma-core: InfiniBand verbs (`libibverbs`) and the RDMA
//! connection manager (`librdmacm`).
//!
//! The package is `rdma-verbs` (the names `rdma` and `rdma-sys` on crates.io
//! belong to other crates); its library is called `rdma`:
//!
//! ```toml
//! [dependencies]
//! rdma-verbs = "0.1"
//! ```
//!
//! Where to start: the [tour](#tour-connect-exchange-a-remotememory-rdma-write-with-immediate-tear-down)
//! below, then [`Context`], [`ProtectionDomain`], [`MemoryRegion`],
//! [`QueuePair`], [`CompletionQueue`], and [`cm::blocking`] for connections.
//! The raw bindings are [`ffi`]. Building needs rdma-core's headers and a C
//! compiler; libclang only with the `bindgen` feature (see the README).
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
//! Two queue pairs of one device connected to each other by hand (the way
//! `rc_pingpong` does it after exchanging addresses over TCP; the
//! [`cm`] module does it for you), one SEND from `a` to `b`:
//!
//! ```no_run
//! use rdma::{AccessFlags, AhAttr, InitAttr, PostError, QpType, RtrAttr, RtsAttr, SendWr};
//! # fn main() -> rdma::Result<()> {
//! let ctx = rdma::Context::open("rxe0")?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(64, None, 0)?;
//! let mut a = pd.qp_builder(QpType::Rc, &cq, &cq).build()?;
//! let mut b = pd.qp_builder(QpType::Rc, &cq, &cq).build()?;
//! // RESET -> INIT -> RTR -> RTS, each QP aimed at the other. On RoCE the
//! // address is a GID (soft-RoCE: index 1, the IPv4 one).
//! let gid_index = 1;
//! let gid = ctx.query_gid(1, gid_index.into())?;
//! let mtu = ctx.query_port(1)?.active_mtu;
//! for (me, peer) in [(&a, &b), (&b, &a)] {
//!     me.to_init(&InitAttr::new(1))?;
//!     let ah = AhAttr::global(1, gid, gid_index);
//!     me.to_rtr(Some(&RtrAttr::new(ah, mtu, peer.qp_num(), 0)))?;
//!     me.to_rts(&RtsAttr::new(0))?;
//! }
//! // The memory moves into the queue with the request; a failed post gives
//! // it back (here it is dropped on purpose).
//! let buf = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE)?;
//! b.post_recv(1, buf).map_err(PostError::drop_buffers)?;
//! let msg = pd.reg_mr(b"hello".to_vec(), AccessFlags::empty())?;
//! a.post_send(SendWr::send(2, msg)).map_err(PostError::drop_buffers)?;
//! // ... and comes back with the completion, with the request's `wr_id`.
//! let mut done = Vec::new();
//! while done.len() < 2 {
//!     cq.poll(&mut done, 2)?;
//! }
//! for c in done {
//!     let mut c = c.ok()?;
//!     let memory = c.take_buffers().into_one().expect("one region per request");
//!     if c.wr_id == 1 {
//!         assert_eq!(&memory.as_slice()?[..c.byte_len as usize], b"hello");
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Tour: connect, exchange a [`RemoteMemory`], RDMA WRITE with immediate, tear down
//! A server and a client in one program, on two threads, through the
//! connection manager's blocking layer ([`cm::blocking`]). The server grants
//! the client write access to a region and sends it the region's address,
//! length and rkey; the client writes into it with an RDMA WRITE that carries
//! an immediate value, which consumes a receive at the server and tells it
//! the bytes are there. `ip` is an address of an RDMA device (soft-RoCE
//! included: see the README). The device test `tests/tour.rs` runs this
//! code, line for line.
//!
//! ```no_run
//! use std::net::SocketAddr;
//!
//! use rdma::cm::blocking::{ConnectOptions, Connection, Listener};
//! use rdma::{AccessFlags, PostError, RemoteMemory, SendWr, WcOpcode};
//!
//! # fn main() -> rdma::Result<()> {
//! # let ip: std::net::IpAddr = "10.8.0.1".parse().unwrap();
//! // Server: listen on port 0 (any free port) and read back the port.
//! let listener = Listener::bind(SocketAddr::new(ip, 0), 8)?;
//! let addr = listener.local_addr().expect("bound to an address");
//! let server = std::thread::spawn(move || -> rdma::Result<(Vec<u8>, Option<u32>)> {
//!     // Before accepting: the region the client may write, and the receive
//!     // its WRITE with immediate will consume (it carries no bytes).
//!     let mut target = None;
//!     let mut conn = listener.accept_with(&ConnectOptions::default(), |qp, pd| {
//!         let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
//!         target = Some(pd.alloc_mr(4096, access)?);
//!         qp.post_recv(1, Vec::new()).map_err(PostError::drop_buffers)
//!     })?;
//!     let target = target.expect("set by the closure");
//!     // Tell the client where to write: a SEND of the region's description.
//!     let desc = target.remote().to_bytes().to_vec();
//!     let desc = conn.pd().reg_mr(desc, AccessFlags::empty())?;
//!     conn.qp()
//!         .post_send(SendWr::send(2, desc))
//!         .map_err(PostError::drop_buffers)?;
//!     // Two completions: the SEND's (its memory comes back) and the receive's.
//!     let mut done = Vec::new();
//!     while done.len() < 2 {
//!         conn.cq().poll(&mut done, 2)?;
//!     }
//!     let mut imm = None;
//!     for c in done {
//!         let c = c.ok()?;
//!         if c.opcode == WcOpcode::RecvRdmaWithImm {
//!             imm = c.imm();
//!         }
//!     }
//!     // The region grants remote write, so it is read by copying out.
//!     let mut bytes = vec![0; 15];
//!     target.read_at(0, &mut bytes)?;
//!     conn.wait_disconnected()?;
//!     Ok((bytes, imm))
//! });
//!
//! // Client: post the receive for the description before connecting (on
//! // iWARP a SEND that finds no receive breaks the connection).
//! let opts = ConnectOptions::default();
//! let mut conn = Connection::connect_with(addr, &opts, |qp, pd| {
//!     let buf = pd.alloc_mr(RemoteMemory::WIRE_LEN, AccessFlags::LOCAL_WRITE)?;
//!     qp.post_recv(1, buf).map_err(PostError::drop_buffers)
//! })?;
//! let mut c = loop {
//!     if let Some(c) = conn.cq().poll_one()? {
//!         break c.ok()?;
//!     }
//! };
//! let buf = c.take_buffers().into_one().expect("the receive's region");
//! let remote = RemoteMemory::from_bytes(&buf.as_slice()?[..c.byte_len as usize])?;
//! // RDMA WRITE with immediate: the bytes land in the server's region, the
//! // immediate value in the completion of the server's receive.
//! let msg = conn
//!     .pd()
//!     .reg_mr(b"hello over RDMA".to_vec(), AccessFlags::empty())?;
//! conn.qp()
//!     .post_send(SendWr::write(2, msg, remote).with_imm(42))
//!     .map_err(PostError::drop_buffers)?;
//! loop {
//!     if let Some(c) = conn.cq().poll_one()? {
//!         c.ok()?;
//!         break;
//!     }
//! }
//! // Tear down: disconnect, then drop. Dropping in any order is fine: each
//! // object keeps what it needs alive and the last drop frees it.
//! conn.disconnect()?;
//! drop(conn);
//! let (bytes, imm) = server.join().expect("the server thread")?;
//! assert_eq!((&bytes[..], imm), (&b"hello over RDMA"[..], Some(42)));
//! # Ok(())
//! # }
//! ```
//!
//! # Errors
//! Every fallible call returns [`Result`]; [`enum@Error`] names the verb that failed,
//! what it was called on, and carries its errno ([`Error::errno`]). Failed
//! completions are values ([`Completion::status`]).
//!
//! # Hot loops
//! A request checked once owns its memory and is posted again and again
//! without moving it: [`QueuePair::prepare_send`] and
//! [`QueuePair::post_prepared`] lend ranges of a region to sends,
//! [`QueuePair::prepare_recv`] and [`QueuePair::post_prepared_recv`] slots of
//! one to receives. [`CompletionQueue::poll_wc`] polls into the caller's
//! array of [`WorkCompletion`]s (the provider's own entries, resolved in
//! place; any memory comes back in a list beside them), as `ibv_poll_cq`
//! into an array of `struct ibv_wc` does.
//!
//! For latency-bound code the path is a [`SlotQueue`]: memory registered
//! once and lent to the slots of one queue pair for the queue's life, with
//! a CQ of its own, so that a post is a check of the slot and the
//! provider's calls and a completion is an index; [`SlotQueue::writer`] and
//! [`SlotQueue::sender`] check a repeated request once. The `perf` example's
//! latency tests run on it (BENCHMARKS.md compares them with perftest).
//!
//! # Threads
//! Handles are `Send + Sync` (libibverbs verbs are thread-safe); posting
//! needs `&mut QueuePair`; an extended-CQ [`PollCursor`] is `!Send` and
//! excludes other polls of its CQ while it lives.
//!
//! # Async
//! [`aio`] connects and accepts in one call ([`aio::Connection`],
//! [`aio::Listener`], the async mirror of [`cm::blocking`]), and awaits
//! completions ([`aio::AsyncCq`]), connection manager events and connection
//! steps ([`aio::AsyncCmId`], a two-phase [`aio::Incoming`]), room in a
//! queue before posting, and device events,
//! from any reactor: the core takes a small readiness trait, and the
//! `tokio` and `async-io` features provide adapters. Every future may be
//! dropped at any await point without losing a completion or an event, or
//! leaving an event unacknowledged. Without a runtime,
//! [`CompletionQueue::wait`] sleeps on a CQ's channel with a timeout.
//!
//! # Optional features
//! None is on by default; each item that needs one says so in these docs.
//!
//! | feature | what it adds |
//! |---|---|
//! | `tokio` | `rdma::aio::tokio_rt`: the async layer's adapter for tokio (connections in one call, awaited completions as a `Stream`, CM events and connection steps, device events, posting that waits for room) |
//! | `async-io` | `rdma::aio::async_io_rt`: the same on async-io / smol |
//! | `serde` | `Serialize`/`Deserialize` for [`RemoteMemory`] (its [`RemoteMemory::to_bytes`] wire encoding needs no feature) |
//! | `dlopen` | no link against `libibverbs` or `librdmacm`: they are opened by soname (`libibverbs.so.1`, `librdmacm.so.1`) when first needed, and a missing one is [`Error::LibraryMissing`], naming it and its package, from the call that needed it ([`devices`], [`cm::EventChannel::new`], ...) |
//! | `fuzzing` | the entry point of the crate's fuzz target and corpus tests (`rdma::fuzzing`, hidden): not part of the public API |
//!
//! The runtime-agnostic core of the async layer, [`aio`], is always built.
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
// Doc examples are code a reader copies: no warnings in them (functions that only
// give an example a signature are allowed to go unused).
#![doc(test(attr(deny(warnings), allow(dead_code))))]
#![warn(clippy::undocumented_unsafe_blocks)]

// The README's Rust example is compiled as a doc example (only under `cargo test --doc`:
// the packaged crate carries the README at its root, where this path does not lead).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeExample;

/// The raw bindings (package `rdma-verbs-sys`), for what the safe API does not cover yet.
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
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod gid;
pub mod import;
mod mr;
mod mw;
mod null_mr;
mod odp;
mod odp_caps;
mod pd;
mod pool;
mod port;
mod qp;
mod remote;
mod slots;
mod srq;
mod status;
pub mod sysfs;
mod td;
mod track;
mod wc;
mod wr;
mod xrc;
mod xrcd;

pub use ah::{AddressHandle, AhAttr, GlobalRoute};
pub use async_event::{AsyncEvent, AsyncEventElement, AsyncEventType};
pub use context::{AsyncFd, Context};
pub use cq::{CompletionChannel, CompletionQueue, CqEvent, CqModeration, PollCursor};
pub use device::{device_by_name, devices, Device, Guid, NodeType, TransportType};
pub use device_attr::{AtomicCap, DeviceAttr, DeviceCapFlags};
pub use dm::{DeviceMemory, DeviceMemoryRegion, DeviceSlice};
pub use ece::Ece;
pub use error::{teardown_failures, Error, Result};
pub use fork::{fork_init, is_fork_initialized, ForkStatus};
pub use gid::{Gid, GidEntry, GidType};
pub use import::ImportedMemoryRegion;
pub use mr::{AccessFlags, Buffer, MemoryRegion, RemoteMemory};
pub use mw::{MemoryWindow, MwType};
pub use null_mr::NullMemoryRegion;
pub use odp::{
    AdviseFlags, ImplicitOdpRegion, MrAdvice, OdpCaps, OdpGeneralCaps, OdpTransportCaps,
};
pub use pd::ProtectionDomain;
pub use pool::BufferPool;
pub use port::{LinkLayer, Mtu, PortAttr, PortCapFlags, PortState};
pub use qp::{
    InitAttr, PostPath, PreparedRecv, PreparedSend, QpAttr, QpCaps, QpCreateFlags, QpState, QpType,
    QueuePair, QueuePairBuilder, RtrAttr, RtsAttr, END_PADDING_ALIGN,
};
pub use slots::{SlotCompletion, SlotConfig, SlotQueue, SlotSender, SlotTarget, SlotWriter};
pub use srq::{SharedReceiveQueue, SrqAttr, SrqType};
pub use td::{ParentDomain, ThreadDomain};
pub use wc::{Completion, WcFlags, WcOpcode, WcStatus, WorkCompletion};
pub use wr::{InlineSend, PostError, SendFlags, SendOp, SendWr, UdDest, WrBuffers, WrOpcode};
pub use xrc::{XrcDomain, XrcRecvQueuePair};

#[cfg(test)]
mod auto_traits {
    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn handles_are_send_and_sync() {
        send_sync::<crate::Context>();
        send_sync::<crate::ProtectionDomain>();
        send_sync::<crate::MemoryRegion>();
        send_sync::<crate::Buffer>();
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
        send_sync::<crate::PreparedRecv>();
        // A shared region moves between threads inside the requests and
        // completions that hold it.
        send_sync::<crate::WrBuffers>();
        send_sync::<crate::SendWr>();
        send_sync::<std::sync::Arc<crate::MemoryRegion>>();
    }
}
