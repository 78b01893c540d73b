//! The RPC-over-RDMA version 1 client transport, on `rdma::aio` and tokio.
//!
//! One task owns the connection (its QP, CQ, buffer pools and the calls in
//! flight); [`Transport`] is a cheap handle that hands it calls and awaits
//! their replies, so any number of tasks may call at once. The task:
//!
//! - connects with RDMA CM, offering RFC 8797 private data with its inline
//!   sizes, and takes the server's when it answers with them (otherwise
//!   both directions use RFC 8166's 1024 bytes);
//! - posts a receive of the inline size into every slot of its receive pool
//!   (one per credit it asks for) **before** it connects, and reposts each
//!   one as soon as its reply has been copied out, so a receive is always
//!   waiting for every call in flight;
//! - keeps at most `min(granted credits, receives)` calls in flight, follows
//!   every reply's grant (a grant of 0 counts as 1, as Linux's client does,
//!   and a grant beyond the receives it posted is capped), and queues the
//!   rest in order;
//! - sends a call inline when it fits the server's inline threshold; else
//!   moves a WRITE's payload to a data-bearing read chunk at its XDR
//!   position; else sends the whole message as a position-zero read chunk
//!   (`RDMA_NOMSG`); offers a write chunk for a READ's data and a reply
//!   chunk for replies that may exceed the inline threshold;
//! - lends chunk memory from a pool reused across calls (`chunks`: type 2
//!   memory windows bound per call over regions registered once, where the
//!   device has them; a registration per chunk where it does not), honours
//!   the length the server returns in a write or reply chunk, and ends
//!   every chunk's remote access when its call ends (window invalidated, on
//!   soft-RoCE deallocated and replaced, or memory deregistered) whether the server used it or not: a reply is
//!   delivered only after its chunks' invalidations have completed, or, if
//!   one does not complete within `Options::invalidate_timeout`, after the
//!   connection was dropped (its QP in error, its windows deallocated);
//! - on a call's timeout while connected, disconnects (RDMA has no
//!   keep-alive), reconnects and retransmits every pending call with its
//!   xid; a late reply to an xid no longer pending is dropped.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdma::aio::{tokio_rt as rt, AsyncCmId, AsyncCq};
use rdma::cm::{CmEventType, ConnParam, PortSpace};
use rdma::{
    AccessFlags, BufferPool, Completion, MemoryRegion, QpState, QpType, QueuePair, SendWr, WcFlags,
    WcOpcode, WcStatus,
};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

pub use crate::chunks::LentData;
use crate::chunks::{Chunk, ChunkPool, Fill, NotLent, MAX_REGION};
pub use crate::error::{Error, Result};
use crate::rpcrdma::{
    Body, Chunks, ConnectPrivate, Header, ReadSegment, Segment, CP_FLAG_REMOTE_INVALIDATE,
    DEFAULT_INLINE, VERSION,
};
pub use crate::stats::Stats;
use crate::xdr::{pad, Writer};

/// The IANA port of NFS over RDMA.
pub const DEFAULT_PORT: u16 = 20049;

/// The transport's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Credits asked for, and receives posted: the most calls in flight.
    pub credits: u32,
    /// The largest message this client sends inline (the server's receive
    /// size caps it).
    pub inline_send: usize,
    /// The largest message this client receives inline: the size of each
    /// posted receive.
    pub inline_recv: usize,
    /// How long each connection step may take.
    pub connect_timeout: Duration,
    /// How long a call waits for its reply before the connection is
    /// dropped, remade and the call sent again.
    pub call_timeout: Duration,
    /// How often a call is sent again after timeouts before it fails.
    pub retries: u32,
    /// Advertise RFC 8797 private data when connecting.
    pub private_data: bool,
    /// Say in that private data that the server may invalidate the call's
    /// chunk with its reply (RFC 8797 `Send With Invalidate`), when the
    /// connection lends memory windows ([`Negotiated::remote_invalidation`]). Linux's
    /// server then sends a reply `SEND_WITH_INV` of the one rkey the call
    /// named, when it named exactly one distinct rkey (its read list, write
    /// list and reply chunk together); the receive completion reports it,
    /// and that chunk needs no `LOCAL_INV`. Any other reply (no
    /// invalidation, another rkey) falls back to ending the window's access
    /// as [`Options::end_access`] says.
    pub remote_invalidation: bool,
    /// Lend chunks through type 2 memory windows over pooled regions when
    /// the device has them (otherwise: a registration per chunk).
    pub memory_windows: bool,
    /// The most pooled chunk regions per connection (at least 3): calls
    /// wait in the queue while every region is lent.
    pub chunk_regions: usize,
    /// How long a call's reply waits for its windows' invalidations
    /// (`LOCAL_INV`, window mode). One that never completes leaves the
    /// window's rkey valid: past this the connection is dropped (its QP in
    /// error, its windows deallocated, so the server reaches nothing), the
    /// reply is delivered, and [`Stats::lost_invalidations`] counts it.
    pub invalidate_timeout: Duration,
    /// How a window the server did not invalidate is put out of reach when
    /// its call ends.
    pub end_access: EndAccess,
    /// Testing only: this many `LOCAL_INV` completions are ignored, as if
    /// they never arrived (how the tests provoke a lost invalidation).
    #[doc(hidden)]
    pub lose_invalidations: u32,
}

/// How a call's memory window that the server did not invalidate with its
/// reply is put out of the server's reach when the call ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndAccess {
    /// [`EndAccess::Deallocate`] on soft-RoCE (rxe), [`EndAccess::LocalInvalidate`]
    /// elsewhere.
    Auto,
    /// A posted `LOCAL_INV`, waited for before the reply is delivered.
    LocalInvalidate,
    /// The window is deallocated (`ibv_dealloc_mw`, which returns once its
    /// rkey reaches nothing) and its region gets a new one; no work request
    /// is posted. Linux 6.1's rxe crashes (a NULL dereference in
    /// `rxe_invalidate_mw`) on a `LOCAL_INV` of a window that is already
    /// invalidated, and a server can invalidate a window (a
    /// `SEND_WITH_INV` naming its rkey in the reply to another call) after
    /// the client posted its `LOCAL_INV` and before the device executes it:
    /// the client cannot order the two. Deallocation checks what the window
    /// holds, so it is safe in either state.
    Deallocate,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            credits: 32,
            inline_send: 4096,
            inline_recv: 4096,
            connect_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(30),
            retries: 2,
            private_data: true,
            remote_invalidation: true,
            memory_windows: true,
            chunk_regions: 64,
            invalidate_timeout: Duration::from_secs(10),
            end_access: EndAccess::Auto,
            lose_invalidations: 0,
        }
    }
}

/// An RPC call to send: the encoded message (its first four bytes, the
/// xid, are filled in by the transport) and, for a WRITE, the payload that
/// follows it in the XDR stream (its length is the last word of `msg`).
#[derive(Debug, Clone, Default)]
pub struct Call {
    /// The RPC call message up to the payload.
    pub msg: Vec<u8>,
    /// A data-bearing item at the end of the message (WRITE's data), sent
    /// through a read chunk when the call does not fit inline.
    pub payload: Payload,
    /// Offer a write chunk of this many bytes for the reply's data item
    /// (READ's data); 0: none.
    pub write_chunk: usize,
    /// The largest reply expected: a reply chunk of this size is offered
    /// when it exceeds the inline receive size.
    pub max_reply: usize,
    /// Where the write chunk's data goes: copied once, straight out of the
    /// chunk memory, instead of into [`Reply::data`] (which it still goes
    /// to when the destination cannot take it: see [`Destination`]).
    pub data_into: Option<Destination>,
    /// Lend the write chunk's data to the caller in place
    /// ([`Reply::lent`]: no copy) when it can be lent: a window once its
    /// rkey is invalidated, a registration of its own once deregistered
    /// (see [`LentData`]). Otherwise (a window whose invalidation was not
    /// proven, the connection broken) the data is copied as without it.
    pub lend_data: bool,
}

/// A range of a buffer that several calls share (the pieces of one large
/// READ), where the transport copies a call's write chunk data: one copy
/// from the chunk memory into its place, no buffer of its own per call.
///
/// The transport never waits for the buffer's lock: when another holder has
/// it (or a panic poisoned it), or the data does not fit after `at`, the
/// data goes to [`Reply::data`] as without a destination.
#[derive(Clone)]
pub struct Destination {
    buf: Arc<Mutex<Vec<u8>>>,
    at: usize,
}

impl Destination {
    /// The bytes of `buf` from `at` on.
    pub fn new(buf: Arc<Mutex<Vec<u8>>>, at: usize) -> Destination {
        Destination { buf, at }
    }

    /// Runs `f` on the `len` bytes at the destination, if the buffer's lock
    /// is free now and they fit (`None` otherwise; `f` is not run). What
    /// the transport calls: it never waits.
    pub fn try_fill<R>(&self, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        let mut buf = self.buf.try_lock().ok()?;
        let dst = buf.get_mut(self.at..self.at.checked_add(len)?)?;
        Some(f(dst))
    }

    /// Copies `data` to the destination, waiting for the buffer's lock
    /// (held by others only to copy in their own range): `false` when it
    /// does not fit, or a panic poisoned the lock.
    pub fn fill(&self, data: &[u8]) -> bool {
        let Ok(mut buf) = self.buf.lock() else {
            return false;
        };
        let end = self.at.checked_add(data.len());
        match end.and_then(|end| buf.get_mut(self.at..end)) {
            Some(dst) => {
                dst.copy_from_slice(data);
                true
            }
            None => false,
        }
    }
}

impl fmt::Debug for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Destination(at {})", self.at)
    }
}

/// A call's payload: bytes of its own, or a range of a buffer that several
/// calls share (the pieces of one large WRITE, none of them copied until
/// it goes into chunk memory or a send buffer).
#[derive(Clone, Default)]
pub struct Payload(PayloadRepr);

#[derive(Clone)]
enum PayloadRepr {
    Owned(Vec<u8>),
    Shared {
        buf: Arc<Vec<u8>>,
        start: usize,
        end: usize,
    },
}

impl Default for PayloadRepr {
    fn default() -> Self {
        PayloadRepr::Owned(Vec::new())
    }
}

impl Payload {
    /// `range` of `buf`, shared; `None` when it does not lie within `buf`.
    pub fn shared(buf: Arc<Vec<u8>>, range: std::ops::Range<usize>) -> Option<Payload> {
        if range.start > range.end || range.end > buf.len() {
            return None;
        }
        Some(Payload(PayloadRepr::Shared {
            buf,
            start: range.start,
            end: range.end,
        }))
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        match &self.0 {
            PayloadRepr::Owned(v) => v,
            PayloadRepr::Shared { buf, start, end } => &buf[*start..*end],
        }
    }

    /// How many bytes.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// No bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes as a `Vec` of their own: moved when they are, copied from
    /// a shared buffer.
    pub fn into_vec(self) -> Vec<u8> {
        match self.0 {
            PayloadRepr::Owned(v) => v,
            PayloadRepr::Shared { buf, start, end } => buf[start..end].to_vec(),
        }
    }
}

impl From<Vec<u8>> for Payload {
    fn from(v: Vec<u8>) -> Payload {
        Payload(PayloadRepr::Owned(v))
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.0 {
            PayloadRepr::Owned(_) => "owned",
            PayloadRepr::Shared { .. } => "shared",
        };
        write!(f, "Payload({} bytes, {kind})", self.len())
    }
}

/// A reply: the RPC reply message and the data the server wrote into the
/// call's write chunk (as long as it said it wrote).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reply {
    /// The RPC reply, from the xid on.
    pub msg: Vec<u8>,
    /// The write chunk's data, when the server used it (and the call had
    /// no [`Call::data_into`] that took it).
    pub data: Option<Vec<u8>>,
    /// How many bytes of the write chunk's data were copied to
    /// [`Call::data_into`] (then `data` is `None`).
    pub placed: Option<usize>,
    /// The write chunk's data in the chunk's own memory, when the call
    /// asked for it ([`Call::lend_data`]) and it could be lent (then `data`
    /// and `placed` are `None`). Holding it holds that memory: the
    /// connection makes other chunks meanwhile.
    pub lent: Option<LentData>,
}

/// What the connection agreed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// The largest call sent inline.
    pub inline_send: usize,
    /// The largest reply received inline.
    pub inline_recv: usize,
    /// The server sent RFC 8797 private data.
    pub server_private: bool,
    /// Remote invalidation was offered to the server: asked for
    /// ([`Options::remote_invalidation`]), with private data, and the
    /// connection lends windows (a registration per chunk is not offered:
    /// a server's Send With Invalidate of a plain registration's rkey fails
    /// the reply on rxe, measured, and siw's provider would not report it).
    pub remote_invalidation: bool,
}

struct Request {
    call: Call,
    reply: oneshot::Sender<Result<Reply>>,
}

/// A handle to the transport's task. Clones share the connection.
#[derive(Debug, Clone)]
pub struct Transport {
    tx: mpsc::UnboundedSender<Request>,
    stats: Arc<Stats>,
    negotiated: Negotiated,
    done: Arc<tokio::sync::Notify>,
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("msg", &self.call.msg.len())
            .field("payload", &self.call.payload.len())
            .finish()
    }
}

fn rdma_err(what: &'static str) -> impl FnOnce(rdma::Error) -> Error {
    move |e| Error::NotConnected(format!("{what}: {e}"))
}

/// One connection step, bounded by what is left of the connection's
/// deadline (`total`, named in the error).
async fn step<T>(
    t: Duration,
    total: Duration,
    what: &'static str,
    f: impl std::future::Future<Output = rdma::Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(t, f).await {
        Err(_) => Err(Error::NotConnected(format!(
            "{what}: not done within the connection's timeout of {total:?}"
        ))),
        Ok(r) => r.map_err(rdma_err(what)),
    }
}

/// Receive work requests carry this bit.
const RECV: u64 = 1 << 63;

/// One connection: its resources, field order = drop order (QP before CQ,
/// the id last).
struct Conn {
    qp: QueuePair,
    acq: AsyncCq,
    send_pool: BufferPool,
    /// Its slots are posted as receives (and reposted) for the connection's life.
    _recv_pool: BufferPool,
    /// After the QP: windows bound on it are deallocated once it is gone.
    chunks: ChunkPool,
    id: AsyncCmId,
    negotiated: Negotiated,
    /// Unused tails of send buffers in flight, by work request.
    tails: HashMap<u64, MemoryRegion>,
    next_wr: u64,
    /// The receive completion flags that say the server invalidated an
    /// rkey (its value in the immediate data field): [`remote_inv_flags`].
    inv_flags: WcFlags,
    /// Windows the server did not invalidate are deallocated, not
    /// invalidated with a `LOCAL_INV` ([`EndAccess::Deallocate`]).
    dealloc: bool,
    /// The work request of the latest send queue completion seen (a send
    /// queue completes in order, so every request posted before it is done
    /// and its completion resolved: a window's bind holds the window until
    /// then, and deallocating it earlier would wait for that).
    sq_done: u64,
}

/// The vendor id soft-RoCE (rxe) reports.
const RXE_VENDOR_ID: u32 = 0xff_ffff;

/// The flags by which a device's receive completions say the sender
/// invalidated an rkey. `IBV_WC_WITH_INV` everywhere; on soft-RoCE also
/// bit 2: its kernel driver writes the kernel's flag values into the CQ it
/// shares with user space, and the kernel's `IB_WC_WITH_INVALIDATE` is bit
/// 2, which libibverbs calls `IBV_WC_IP_CSUM_OK` (measured: Linux 6.1 and
/// rdma-core 44 report a `SEND_WITH_INV` as flags `0x5`, the rkey in the
/// immediate data field; rxe never reports a checksum). Soft-iWARP's
/// provider reports no flags at all (measured: 0), so its remote
/// invalidations go unseen and it keeps deregistering each chunk.
fn remote_inv_flags(vendor_id: u32) -> WcFlags {
    if vendor_id == RXE_VENDOR_ID {
        WcFlags::WITH_INV | WcFlags::IP_CSUM_OK
    } else {
        WcFlags::WITH_INV
    }
}

impl Conn {
    async fn connect(addr: SocketAddr, o: &Options, stats: &Arc<Stats>) -> Result<Conn> {
        // One deadline for every step: "no server" fails within it.
        let deadline = Instant::now() + o.connect_timeout;
        let left = || {
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        };
        let at = |e: Error| match e {
            Error::NotConnected(m) => Error::NotConnected(format!("connecting to {addr}: {m}")),
            e => e,
        };
        let cm = rt::cm_channel().map_err(rdma_err("rdma_create_event_channel"))?;
        let mut id = cm
            .create_id(PortSpace::Tcp)
            .map_err(rdma_err("rdma_create_id"))?;
        step(
            left(),
            o.connect_timeout,
            "rdma_resolve_addr",
            id.resolve_addr(None, addr, left()),
        )
        .await
        .map_err(at)?;
        step(
            left(),
            o.connect_timeout,
            "rdma_resolve_route",
            id.resolve_route(left()),
        )
        .await
        .map_err(at)?;
        let ctx = id.id().context().map_err(rdma_err("rdma_cm context"))?;
        let pd = ctx.alloc_pd().map_err(rdma_err("ibv_alloc_pd"))?;
        let vendor = ctx
            .query_device()
            .map_err(rdma_err("ibv_query_device"))?
            .vendor_id();
        let inv_flags = remote_inv_flags(vendor);
        let dealloc = match o.end_access {
            EndAccess::Auto => vendor == RXE_VENDOR_ID,
            EndAccess::LocalInvalidate => false,
            EndAccess::Deallocate => true,
        };
        let channel = ctx
            .create_comp_channel()
            .map_err(rdma_err("ibv_create_comp_channel"))?;
        // Send queue: a SEND per call in flight, and a bind and an
        // invalidation per pooled region.
        let regions = o.chunk_regions.max(3);
        let send_wr = o.credits + 2 * u32::try_from(regions).unwrap_or(u32::MAX / 4) + 4;
        let cq = ctx
            .create_cq(send_wr + o.credits + 2, Some(&channel), 0)
            .map_err(rdma_err("ibv_create_cq"))?;
        let acq = rt::completions(&cq).map_err(rdma_err("rdma::aio completions"))?;
        let mut qp = pd
            .qp_builder(QpType::Rc, &cq, &cq)
            .max_send_wr(send_wr)
            .max_recv_wr(o.credits)
            .max_send_sge(1)
            .max_recv_sge(1)
            .build()
            .map_err(rdma_err("ibv_create_qp"))?;
        let recv_pool = BufferPool::new(
            &pd,
            o.inline_recv,
            o.credits as usize,
            AccessFlags::LOCAL_WRITE,
        )
        .map_err(rdma_err("receive buffers"))?;
        let send_pool =
            BufferPool::new(&pd, o.inline_send, o.credits as usize, AccessFlags::empty())
                .map_err(rdma_err("send buffers"))?;
        id.id()
            .modify_qp(&qp, QpState::Init)
            .map_err(rdma_err("ibv_modify_qp(INIT)"))?;
        // Every receive is posted before the first call can be sent (siw
        // has no RNR retry: a SEND without a receive breaks the connection).
        let mut next_wr = 0;
        while let Some(buf) = recv_pool.take() {
            next_wr += 1;
            qp.post_recv(RECV | next_wr, buf)
                .map_err(|e| Error::NotConnected(format!("ibv_post_recv: {e}")))?;
        }
        let chunks = ChunkPool::new(&pd, o.memory_windows, regions, stats);
        stats
            .memory_windows
            .store(chunks.windows(), Ordering::Relaxed);
        // Remote invalidation only for windows (`Negotiated::remote_invalidation`).
        let offer_inv = o.private_data && o.remote_invalidation && chunks.windows();
        let mut param = ConnParam::default();
        if o.private_data {
            param.private_data = ConnectPrivate {
                version: 1,
                flags: if offer_inv {
                    CP_FLAG_REMOTE_INVALIDATE
                } else {
                    0
                },
                send_size: o.inline_send,
                recv_size: o.inline_recv,
            }
            .encode()
            .to_vec();
        }
        let peer = match tokio::time::timeout(left(), id.connect(&qp, &param)).await {
            Err(_) => {
                return Err(Error::NotConnected(format!(
                    "rdma_connect to {addr}: no answer within {:?} of the connection's start",
                    o.connect_timeout
                )))
            }
            Ok(Err(rdma::Error::CmEvent {
                event: CmEventType::Rejected,
                ..
            })) => {
                return Err(Error::NotConnected(format!(
                    "rdma_connect to {addr}: rejected (is an NFS server listening for RDMA \
                     on port {}?)",
                    addr.port()
                )))
            }
            Ok(Err(e)) => return Err(Error::NotConnected(format!("rdma_connect to {addr}: {e}"))),
            Ok(Ok(p)) => p,
        };
        let server = ConnectPrivate::decode(&peer.private_data);
        let negotiated = match server {
            Some(s) => Negotiated {
                inline_send: o.inline_send.min(s.recv_size),
                inline_recv: o.inline_recv,
                server_private: true,
                remote_invalidation: offer_inv,
            },
            None => Negotiated {
                inline_send: o.inline_send.min(DEFAULT_INLINE),
                inline_recv: o.inline_recv,
                server_private: false,
                remote_invalidation: offer_inv,
            },
        };
        Ok(Conn {
            qp,
            acq,
            send_pool,
            _recv_pool: recv_pool,
            chunks,
            id,
            negotiated,
            tails: HashMap::new(),
            next_wr,
            inv_flags,
            dealloc,
            sq_done: 0,
        })
    }

    fn next_id(&mut self) -> u64 {
        next_id(&mut self.next_wr)
    }
}

fn next_id(next: &mut u64) -> u64 {
    *next = (*next + 1) & !RECV;
    *next
}

/// A call in flight: what to send again after a reconnection, the chunks
/// its reply may use (released when it ends), where its reply goes.
struct Pending {
    call: Call,
    reply: oneshot::Sender<Result<Reply>>,
    deadline: Instant,
    sent: u32,
    /// The call's payload is the first read chunk's memory, not in `call`.
    payload_in_chunk: bool,
    chunks: Vec<Lent>,
    write: Option<Lent>,
    reply_chunk: Option<Lent>,
    /// Rkeys of its chunks that the server invalidated with the reply to
    /// another call (a receive completion named them): invalid already, so
    /// they take no `LOCAL_INV` (on Linux 6.1's rxe a `LOCAL_INV` of a
    /// window already invalidated crashes the kernel).
    remote: Vec<u32>,
    /// The work request of its last window's bind (all of them precede
    /// its SEND on the send queue).
    last_bind: u64,
}

impl Pending {
    /// Whether the call lent a chunk under `rkey`.
    fn lends(&self, rkey: u32) -> bool {
        self.chunks
            .iter()
            .chain(self.write.as_ref())
            .chain(self.reply_chunk.as_ref())
            .any(|l| l.chunk.as_ref().is_some_and(|c| c.segment().handle == rkey))
    }

    fn lent(&mut self) -> impl Iterator<Item = &mut Lent> {
        self.chunks
            .iter_mut()
            .chain(self.write.as_mut())
            .chain(self.reply_chunk.as_mut())
    }
}

/// A chunk lent to a call, counted in [`Stats::chunks_registered`] while it
/// is; dropping it deregisters the memory or deallocates the window (its
/// rkey is then invalid).
struct Lent {
    chunk: Option<Chunk>,
    stats: Arc<Stats>,
}

impl Lent {
    fn new(chunk: Chunk, stats: &Arc<Stats>) -> Lent {
        stats.chunks_registered.fetch_add(1, Ordering::Relaxed);
        Lent {
            chunk: Some(chunk),
            stats: Arc::clone(stats),
        }
    }

    fn segment(&self) -> Segment {
        self.chunk.as_ref().map(Chunk::segment).unwrap_or(Segment {
            handle: 0,
            length: 0,
            offset: 0,
        })
    }

    fn len(&self) -> usize {
        self.chunk.as_ref().map_or(0, Chunk::len)
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.stats.chunks_registered.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a reply said, checked, before its chunks' data is read (after they
/// are invalidated).
enum Outcome {
    Failed(Error),
    /// An inline reply, and the bytes the server wrote in the write chunk.
    Msg {
        msg: Vec<u8>,
        written: Option<usize>,
    },
    /// The reply in the reply chunk (its length), and the write chunk's.
    NoMsg {
        len: usize,
        written: Option<usize>,
    },
}

/// A call whose reply came, waiting for its windows' invalidations.
struct Ending {
    pending: Pending,
    outcome: Outcome,
    /// The rkeys of this call's chunks that the server invalidated (the
    /// receive completion of its reply, or of another call's, said so):
    /// they took no `LOCAL_INV`.
    remote: Vec<u32>,
    waiting: u32,
    /// When the invalidations count as lost.
    deadline: Instant,
}

/// How a call's message goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Carry {
    /// Inline, payload and all.
    Inline,
    /// The payload in a data-bearing read chunk.
    Payload,
    /// The whole message as a position-zero read chunk (`RDMA_NOMSG`).
    Whole,
}

/// A call's chunks, decided before any is taken.
struct Plan {
    write: usize,
    reply: usize,
    carry: Carry,
}

impl Plan {
    fn new(call: &Call, n: &Negotiated) -> Plan {
        let write = call.write_chunk;
        let reply = if call.max_reply > n.inline_recv {
            call.max_reply
        } else {
            0
        };
        let none = Segment {
            handle: 0,
            length: 0,
            offset: 0,
        };
        let mut chunks = Chunks::default();
        if write > 0 {
            chunks.write.push(vec![none]);
        }
        if reply > 0 {
            chunks.reply = Some(vec![none]);
        }
        let header_len = |c: &Chunks| {
            let mut w = Writer::new();
            Header {
                xid: 0,
                vers: VERSION,
                credits: 0,
                body: Body::Msg(c.clone()),
            }
            .encode(&mut w);
            w.len()
        };
        let payload_len = call.payload.len() + pad(call.payload.len());
        let read_seg_len = 4 + 4 + 16;
        let limit = n.inline_send;
        let carry = if header_len(&chunks) + call.msg.len() + payload_len <= limit {
            Carry::Inline
        } else if !call.payload.is_empty()
            && header_len(&chunks) + read_seg_len + call.msg.len() <= limit
        {
            Carry::Payload
        } else {
            Carry::Whole
        };
        Plan {
            write,
            reply,
            carry,
        }
    }

    fn sizes(&self, call: &Call) -> Vec<usize> {
        let mut v = Vec::with_capacity(3);
        if self.write > 0 {
            v.push(self.write);
        }
        if self.reply > 0 {
            v.push(self.reply);
        }
        match self.carry {
            Carry::Inline => {}
            Carry::Payload => v.push(call.payload.len()),
            Carry::Whole => v.push(call.msg.len() + call.payload.len() + pad(call.payload.len())),
        }
        v
    }
}

/// The task's state.
struct Engine {
    addr: SocketAddr,
    opts: Options,
    conn: Option<Conn>,
    stats: Arc<Stats>,
    credits: u32,
    in_flight: u32,
    pending: HashMap<u32, Pending>,
    /// Calls whose reply came, waiting for invalidations, by xid.
    ending: HashMap<u32, Ending>,
    /// Invalidations posted: work request to xid.
    invalidating: HashMap<u64, u32>,
    queue: VecDeque<(u32, Request, u32)>,
    next_xid: u32,
    /// Why the last connection was lost (for the error of calls that a
    /// reconnection then fails).
    down: Option<String>,
    /// `LOCAL_INV` completions still to ignore ([`Options::lose_invalidations`]).
    lose_invalidations: u32,
}

impl Transport {
    /// Connects to `addr` and starts the transport's task on the current
    /// tokio runtime.
    ///
    /// # Errors
    /// [`Error::NotConnected`] naming the connection step that failed
    /// (no listener: rejected; no route; timed out).
    pub async fn connect(addr: SocketAddr, opts: Options) -> Result<Transport> {
        if opts.credits == 0 || opts.inline_send < 1024 || opts.inline_recv < 1024 {
            return Err(Error::Permanent(
                "options: credits must be at least 1 and inline sizes at least 1024".into(),
            ));
        }
        let stats = Arc::new(Stats::default());
        let conn = Conn::connect(addr, &opts, &stats).await?;
        let negotiated = conn.negotiated;
        stats.connects.store(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        let done = Arc::new(tokio::sync::Notify::new());
        let lose_invalidations = opts.lose_invalidations;
        let engine = Engine {
            addr,
            opts,
            conn: Some(conn),
            stats: Arc::clone(&stats),
            credits: 1,
            in_flight: 0,
            pending: HashMap::new(),
            ending: HashMap::new(),
            invalidating: HashMap::new(),
            queue: VecDeque::new(),
            // Distinct xids across runs of the process.
            next_xid: std::process::id().wrapping_mul(0x9e37_79b9),
            down: None,
            lose_invalidations,
        };
        let d = Arc::clone(&done);
        tokio::spawn(async move {
            engine.run(rx).await;
            d.notify_one();
        });
        Ok(Transport {
            tx,
            stats,
            negotiated,
            done,
        })
    }

    /// Sends `call` and waits for its reply.
    ///
    /// # Errors
    /// As [`Error`]: the transport's outcome; the RPC reply itself is
    /// decoded by the caller.
    pub async fn call(&self, call: Call) -> Result<Reply> {
        if call.msg.len() < 4 {
            return Err(Error::Permanent("an RPC call of fewer than 4 bytes".into()));
        }
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request { call, reply })
            .map_err(|_| Error::Permanent("the transport is closed".into()))?;
        rx.await
            .unwrap_or_else(|_| Err(Error::Permanent("the transport task ended".into())))
    }

    /// What the connection agreed.
    pub fn negotiated(&self) -> Negotiated {
        self.negotiated
    }

    /// The transport's counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Closes: calls already handed over finish first, then the task
    /// disconnects and ends (this waits for it).
    pub async fn close(self) {
        let Transport { tx, done, .. } = self;
        drop(tx);
        done.notified().await;
    }
}

impl Engine {
    fn window(&self) -> u32 {
        self.credits.min(self.opts.credits)
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Request>) {
        let mut open = true;
        loop {
            self.start_queued();
            if !open && self.pending.is_empty() && self.queue.is_empty() && self.ending.is_empty() {
                break;
            }
            let deadline = self
                .pending
                .values()
                .map(|p| p.deadline)
                .chain(self.ending.values().map(|e| e.deadline))
                .min();
            let Some(conn) = self.conn.as_mut() else {
                // Not connected (the connection broke, or a reconnection
                // gave up): reconnect for the calls that wait, or for the
                // next one to come.
                if self.pending.is_empty() && self.queue.is_empty() {
                    match rx.recv().await {
                        Some(r) => {
                            let xid = self.xid();
                            self.queue.push_back((xid, r, 0));
                        }
                        None => break,
                    }
                }
                self.reconnect().await;
                continue;
            };
            tokio::select! {
                biased;
                c = conn.acq.next() => match c {
                    Ok(c) => self.completion(c),
                    Err(e) => self.broken(format!("polling the CQ: {e}")).await,
                },
                ev = conn.id.next_event() => {
                    let why = match ev {
                        Ok(ev) if ev.event_type() == CmEventType::DeviceRemoval => {
                            // The crate has had librdmacm forget the device
                            // (`rdma_get_devices` as the event was read), so
                            // its context closes with this connection's id.
                            self.stats.device_removals.fetch_add(1, Ordering::Relaxed);
                            "the RDMA device was removed".to_string()
                        }
                        Ok(ev) => format!("the connection manager reported {:?}", ev.event_type()),
                        Err(e) => format!("the connection manager failed: {e}"),
                    };
                    self.broken(why).await;
                }
                r = rx.recv(), if open => match r {
                    Some(r) => {
                        let xid = self.xid();
                        self.queue.push_back((xid, r, 0));
                    }
                    None => open = false,
                },
                _ = sleep_until(deadline) => self.timed_out().await,
            }
        }
        if let Some(mut c) = self.conn.take() {
            let _ = tokio::time::timeout(self.opts.connect_timeout, c.id.disconnect()).await;
            let _ = c.qp.to_error();
        }
    }

    fn xid(&mut self) -> u32 {
        self.next_xid = self.next_xid.wrapping_add(1);
        self.next_xid
    }

    fn start_queued(&mut self) {
        while self.in_flight < self.window() {
            let Some(conn) = self.conn.as_ref() else {
                return;
            };
            if conn.send_pool.available() == 0 {
                return;
            }
            let Some((_, req, _)) = self.queue.front() else {
                return;
            };
            // The call waits (in order) while its chunks are lent to others.
            let plan = Plan::new(&req.call, &conn.negotiated);
            if !conn.chunks.can_take(&plan.sizes(&req.call)) {
                return;
            }
            let Some((xid, req, sent)) = self.queue.pop_front() else {
                return;
            };
            match self.send(xid, req.call, sent, plan) {
                Ok(p) => {
                    let p = Pending {
                        reply: req.reply,
                        ..p
                    };
                    self.pending.insert(xid, p);
                    self.in_flight += 1;
                    self.stats
                        .max_in_flight
                        .fetch_max(u64::from(self.in_flight), Ordering::Relaxed);
                }
                Err(e) => {
                    let _ = req.reply.send(Err(e));
                }
            }
        }
    }

    /// Marshals and posts one call; the result's `reply` is a placeholder.
    /// A failure releases what was taken.
    fn send(&mut self, xid: u32, call: Call, sent: u32, plan: Plan) -> Result<Pending> {
        let conn = self
            .conn
            .as_mut()
            .ok_or_else(|| Error::NotConnected("no connection".into()))?;
        let mut p = Pending {
            call,
            reply: oneshot::channel().0,
            deadline: Instant::now() + self.opts.call_timeout,
            sent: sent + 1,
            payload_in_chunk: false,
            chunks: Vec::new(),
            write: None,
            reply_chunk: None,
            remote: Vec::new(),
            last_bind: 0,
        };
        let r = Self::marshal(conn, &self.stats, self.opts.credits, xid, &mut p, &plan);
        match r {
            Ok(()) => Ok(p),
            Err(e) => {
                for l in p.lent() {
                    if let Some(c) = l.chunk.take() {
                        conn.chunks.discard(c);
                    }
                }
                Err(e)
            }
        }
    }

    fn marshal(
        conn: &mut Conn,
        stats: &Arc<Stats>,
        credits: u32,
        xid: u32,
        p: &mut Pending,
        plan: &Plan,
    ) -> Result<()> {
        let call = &mut p.call;
        call.msg[..4].copy_from_slice(&xid.to_be_bytes());
        let limit = conn.negotiated.inline_send;
        let mut chunks = Chunks::default();
        let Conn {
            qp,
            chunks: pool,
            next_wr,
            ..
        } = conn;
        let remote_write = AccessFlags::REMOTE_WRITE;
        if plan.write > 0 {
            let c = pool.take(qp, next_id(next_wr), plan.write, Fill::Zero, remote_write)?;
            let l = Lent::new(c, stats);
            chunks.write.push(vec![l.segment()]);
            p.write = Some(l);
        }
        if plan.reply > 0 {
            let c = pool.take(qp, next_id(next_wr), plan.reply, Fill::Zero, remote_write)?;
            let l = Lent::new(c, stats);
            chunks.reply = Some(vec![l.segment()]);
            p.reply_chunk = Some(l);
        }
        let pad_bytes = [0u8; 4];
        let pad_len = pad(call.payload.len());
        match plan.carry {
            Carry::Inline => {
                stats.inline_calls.fetch_add(1, Ordering::Relaxed);
            }
            Carry::Payload => {
                // Per-call registration moves the payload into the chunk (no
                // copy; a retransmission takes it back out); a pooled region
                // gets a copy and the call keeps it.
                let len = call.payload.len();
                let one: [&[u8]; 1];
                let fill = if pool.windows() && len <= MAX_REGION {
                    one = [call.payload.as_slice()];
                    Fill::Pieces(&one)
                } else {
                    p.payload_in_chunk = true;
                    Fill::Move(std::mem::take(&mut call.payload).into_vec())
                };
                let c = pool.take(qp, next_id(next_wr), len, fill, AccessFlags::REMOTE_READ)?;
                let l = Lent::new(c, stats);
                chunks.read.push(ReadSegment {
                    position: u32::try_from(call.msg.len()).unwrap_or(u32::MAX),
                    segment: l.segment(),
                });
                p.chunks.push(l);
                stats.read_chunk_calls.fetch_add(1, Ordering::Relaxed);
            }
            Carry::Whole => {
                // msg, payload and its XDR pad, copied once into the chunk.
                let len = call.msg.len() + call.payload.len() + pad_len;
                let pieces: [&[u8]; 3] =
                    [&call.msg, call.payload.as_slice(), &pad_bytes[..pad_len]];
                let c = pool.take(
                    qp,
                    next_id(next_wr),
                    len,
                    Fill::Pieces(&pieces),
                    AccessFlags::REMOTE_READ,
                )?;
                let l = Lent::new(c, stats);
                chunks.read.push(ReadSegment {
                    position: 0,
                    segment: l.segment(),
                });
                p.chunks.push(l);
                stats.nomsg_calls.fetch_add(1, Ordering::Relaxed);
            }
        }
        // Every bind of the call was posted with an id up to here.
        p.last_bind = *next_wr;
        let body = if plan.carry == Carry::Whole {
            Body::NoMsg(chunks)
        } else {
            Body::Msg(chunks)
        };
        let mut out = Writer::new();
        Header {
            xid,
            vers: VERSION,
            credits,
            body,
        }
        .encode(&mut out);
        if plan.carry == Carry::Whole && out.len() > limit {
            return Err(Error::Permanent(format!(
                "the call's transport header alone exceeds the inline threshold {limit}"
            )));
        }
        let Some(mut slot) = conn.send_pool.take() else {
            return Err(Error::NoBuffers("no send buffer".into()));
        };
        // The header, then the message (and an inline payload) copied
        // straight into the registered send buffer.
        let mut at = 0;
        let mut put = |slot: &mut MemoryRegion, b: &[u8]| {
            let r = slot.write_at(at, b);
            at += b.len();
            r
        };
        let mut w = put(&mut slot, &out.buf);
        if plan.carry != Carry::Whole {
            w = w.and_then(|()| put(&mut slot, &call.msg));
            if plan.carry == Carry::Inline {
                w = w
                    .and_then(|()| put(&mut slot, call.payload.as_slice()))
                    .and_then(|()| put(&mut slot, &pad_bytes[..pad_len]));
            }
        }
        if let Err(e) = w {
            let _ = conn.send_pool.put(slot);
            return Err(Error::Permanent(format!("send buffer: {e}")));
        }
        let tail = if at < slot.len() {
            slot.split_off(at).ok()
        } else {
            None
        };
        let wr = conn.next_id();
        if let Err(e) = conn.qp.post_send(SendWr::send(wr, slot)) {
            let why = format!("ibv_post_send: {}", e.error);
            if let Some(mut buf) = e
                .returned
                .into_iter()
                .next()
                .and_then(|(_, b)| b.into_one())
            {
                if let Some(t) = tail {
                    let _ = buf.unsplit(t);
                }
                let _ = conn.send_pool.put(buf);
            }
            return Err(Error::NotConnected(why));
        }
        if let Some(t) = tail {
            conn.tails.insert(wr, t);
        }
        Ok(())
    }

    fn completion(&mut self, mut c: Completion) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        if c.status != WcStatus::Success {
            let why = format!(
                "work request {:#x} completed with {} (vendor error {:#x})",
                c.wr_id, c.status, c.vendor_err
            );
            // The connection is gone; the next turn of the loop reconnects.
            self.lost(why);
            return;
        }
        if c.opcode != WcOpcode::Recv {
            conn.sq_done = conn.sq_done.max(c.wr_id);
        }
        match c.opcode {
            WcOpcode::BindMw => return,
            WcOpcode::LocalInv => {
                if self.lose_invalidations > 0 {
                    self.lose_invalidations -= 1;
                    return;
                }
                self.invalidated(c.wr_id);
                return;
            }
            _ => {}
        }
        let Some(buf) = c.take_buffers().into_one() else {
            self.lost("a completion without its buffer".into());
            return;
        };
        if c.opcode != WcOpcode::Recv {
            let mut buf = buf;
            if let Some(t) = conn.tails.remove(&c.wr_id) {
                let _ = buf.unsplit(t);
            }
            let _ = conn.send_pool.put(buf);
            return;
        }
        let len = (c.byte_len as usize).min(buf.len());
        // A `SEND_WITH_INV`: the rkey the server invalidated, before this
        // completion was made.
        let inv = c.wc_flags.intersects(conn.inv_flags).then_some(c.imm_data);
        // The receive buffer is local-only memory: read in place, and only
        // the RPC message is copied out (once).
        match buf.as_slice() {
            Ok(b) => self.reply(&b[..len], inv),
            Err(_) => {
                let mut bytes = vec![0; len];
                if buf.read_at(0, &mut bytes).is_ok() {
                    self.reply(&bytes, inv);
                }
            }
        }
        // Repost at once: a receive waits for every call in flight.
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let wr = RECV | conn.next_id();
        if let Err(e) = conn.qp.post_recv(wr, buf) {
            self.lost(format!("ibv_post_recv: {e}"));
        }
    }

    fn reply(&mut self, bytes: &[u8], inv: Option<u32>) {
        let (h, hlen) = match Header::decode(bytes) {
            Ok(h) => h,
            Err(e) => {
                // Fail the call it names, if it names one.
                if let Some(xid) = bytes
                    .get(..4)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                {
                    self.finish(
                        xid,
                        Outcome::Failed(Error::Malformed(format!("transport header: {e}"))),
                        inv,
                    );
                }
                return;
            }
        };
        self.credits = h.credits.clamp(1, self.opts.credits);
        self.stats
            .granted
            .store(u64::from(h.credits), Ordering::Relaxed);
        let Some(p) = self.pending.get(&h.xid) else {
            self.stats.dropped_replies.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let r = match &h.body {
            Body::Error(e) => Err(Error::Rdma(*e)),
            Body::Msg(c) => written(p, c).map(|written| Outcome::Msg {
                msg: bytes[hlen..].to_vec(),
                written,
            }),
            Body::NoMsg(c) => nomsg_reply(p, c).and_then(|len| {
                self.stats
                    .reply_chunk_replies
                    .fetch_add(1, Ordering::Relaxed);
                written(p, c).map(|written| Outcome::NoMsg { len, written })
            }),
        };
        let outcome = r.unwrap_or_else(Outcome::Failed);
        if let Outcome::Msg {
            written: Some(_), ..
        }
        | Outcome::NoMsg {
            written: Some(_), ..
        } = &outcome
        {
            self.stats
                .write_chunk_replies
                .fetch_add(1, Ordering::Relaxed);
        }
        self.finish(h.xid, outcome, inv);
    }

    /// A call's reply came: its windows are invalidated, and the reply is
    /// delivered once they all are (at once for registrations of its own,
    /// which go when it does). `inv`: the rkey the reply's receive
    /// completion says the server invalidated (`SEND_WITH_INV`); when it is
    /// one this call lent, that chunk is already unreachable and takes no
    /// `LOCAL_INV`.
    fn finish(&mut self, xid: u32, outcome: Outcome, inv: Option<u32>) {
        let Some(mut p) = self.pending.remove(&xid) else {
            // A late duplicate: its invalidation (if any) named a chunk
            // that call already released.
            self.stats.dropped_replies.fetch_add(1, Ordering::Relaxed);
            return;
        };
        self.in_flight -= 1;
        if let Some(k) = inv {
            let owner = if p.lends(k) {
                Some(&mut p)
            } else {
                // Not this call's: another call in flight may have lent it
                // (a server that invalidates the wrong rkey). Either way
                // that rkey is invalid now, and this call's own chunks' access
                // is ended as usual.
                self.stats
                    .stray_invalidations
                    .fetch_add(1, Ordering::Relaxed);
                self.pending.values_mut().find(|q| q.lends(k))
            };
            match owner {
                Some(owner) => {
                    owner.remote.push(k);
                    self.stats
                        .remote_invalidations
                        .fetch_add(1, Ordering::Relaxed);
                }
                // No call in flight lends it: a window whose call ended
                // (deallocated, or its `LOCAL_INV` posted), or a key never
                // lent. Its window, if any, reaches nothing either way.
                None => {
                    self.stats
                        .late_invalidations
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let remote = std::mem::take(&mut p.remote);
        let last_bind = p.last_bind;
        let mut waiting = 0;
        let mut broken = None;
        let mut windows = 0;
        if let Some(conn) = self.conn.as_mut() {
            for l in p.lent() {
                let Some(rkey) = l.chunk.as_ref().and_then(Chunk::window_rkey) else {
                    continue;
                };
                windows += 1;
                if broken.is_some() || remote.contains(&rkey) {
                    continue;
                }
                if conn.dealloc {
                    // No `LOCAL_INV` that a server's stray invalidation of the
                    // same window could overtake: the window is deallocated
                    // now (its bind's completion, which holds it, was
                    // resolved: the send queue completed past it) and its
                    // region gets a new one.
                    if conn.sq_done < last_bind {
                        broken = Some(
                            "a reply came before its call's window binds completed: \
                             the windows cannot be deallocated now"
                                .to_string(),
                        );
                        continue;
                    }
                    let Some(chunk) = l.chunk.as_mut() else {
                        continue;
                    };
                    match conn.chunks.fence(chunk) {
                        Ok(()) => {
                            self.stats.fenced_windows.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => broken = Some(e),
                    }
                    continue;
                }
                let wr = conn.next_id();
                match conn.qp.post_send(SendWr::local_invalidate(wr, rkey)) {
                    Ok(()) => {
                        self.invalidating.insert(wr, xid);
                        self.stats
                            .local_invalidations
                            .fetch_add(1, Ordering::Relaxed);
                        waiting += 1;
                    }
                    Err(e) => broken = Some(format!("ibv_post_send(LOCAL_INV): {}", e.error)),
                }
            }
        }
        let now = waiting == 0 && broken.is_none();
        // The deadline matters only while the call waits in `ending`: a call
        // delivered now reads no clock (`clock_gettime` is a system call in
        // the VM's guest: 8 fewer per MiB read on rxe, where the server
        // invalidates every READ's window).
        let deadline = if now {
            p.deadline
        } else {
            Instant::now() + self.opts.invalidate_timeout
        };
        let e = Ending {
            pending: p,
            outcome,
            remote,
            waiting,
            deadline,
        };
        if now {
            // No window was lent (or there is no connection to have bound
            // one on), or each was invalidated by the server before a
            // reply's completion said so: nothing to wait for.
            deliver(e, self.conn.as_mut().map(|c| &mut c.chunks), windows > 0);
        } else {
            self.ending.insert(xid, e);
        }
        if let Some(why) = broken {
            self.lost(why);
        }
    }

    /// An invalidation completed: the call's reply goes once it was the
    /// last.
    fn invalidated(&mut self, wr: u64) {
        let Some(xid) = self.invalidating.remove(&wr) else {
            return;
        };
        let Some(e) = self.ending.get_mut(&xid) else {
            return;
        };
        e.waiting = e.waiting.saturating_sub(1);
        if e.waiting == 0 {
            if let Some(e) = self.ending.remove(&xid) {
                // Every window this call was lent had its `LOCAL_INV`
                // posted in `finish` (a failed post drops the connection,
                // which delivers the call without this), and each has now
                // completed successfully (a failed completion drops the
                // connection too), but the one the server invalidated with
                // its reply, if any (`finish` skipped it).
                deliver(e, self.conn.as_mut().map(|c| &mut c.chunks), true);
            }
        }
    }

    fn fail_all(&mut self, e: Error) {
        for (_, p) in self.pending.drain() {
            let Pending { reply, .. } = p;
            let _ = reply.send(Err(e.clone()));
        }
        self.in_flight = 0;
        for (_, r, _) in self.queue.drain(..) {
            let _ = r.reply.send(Err(e.clone()));
        }
    }

    /// The connection broke: drop it (its QP first, so nothing can touch
    /// the chunks any more), keep the calls to send again. Calls whose
    /// reply came and whose invalidations cannot complete now are
    /// delivered, their windows deallocated.
    fn lost(&mut self, why: String) {
        if trace() {
            say(&format!("connection to {} lost: {why}", self.addr));
        }
        if let Some(mut c) = self.conn.take() {
            let _ = c.qp.to_error();
            // RESET gives back what the queues held, binds in flight
            // included: each holds its window until it ends, and a window
            // must be deallocated before its QP goes (below).
            drop(c.qp.reset());
            self.invalidating.clear();
            for (_, e) in self.ending.drain() {
                deliver_discarding(e, &mut c.chunks);
            }
            // The calls to send again: their windows are deallocated before
            // the QP goes (`ChunkPool::unbind_for_loss`).
            for p in self.pending.values_mut() {
                for l in p.lent() {
                    if let Some(chunk) = l.chunk.take() {
                        l.chunk = Some(c.chunks.unbind_for_loss(chunk));
                    }
                }
            }
        }
        self.down = Some(why);
    }

    async fn broken(&mut self, why: String) {
        self.lost(why);
        self.reconnect().await;
    }

    /// Reconnects and puts every pending call back at the head of the
    /// queue, with its xid, to be sent again (a call sent more than
    /// `retries` times fails with [`Error::TimedOut`]). While the server
    /// refuses, it tries again with a growing pause, for up to one call
    /// timeout; then every waiting call fails with the last error.
    async fn reconnect(&mut self) {
        if let Some(mut c) = self.conn.take() {
            let _ = tokio::time::timeout(self.opts.connect_timeout, c.id.disconnect()).await;
            let _ = c.qp.to_error();
        }
        let mut pending: Vec<(u32, Pending)> = self.pending.drain().collect();
        pending.sort_by_key(|(_, p)| p.deadline);
        self.in_flight = 0;
        self.credits = 1;
        for (xid, p) in pending.into_iter().rev() {
            if p.sent > self.opts.retries {
                let _ = p.reply.send(Err(Error::TimedOut { xid, sent: p.sent }));
                continue;
            }
            self.stats.retransmits.fetch_add(1, Ordering::Relaxed);
            let mut call = p.call;
            if p.payload_in_chunk {
                call.payload = p
                    .chunks
                    .first()
                    .and_then(|l| l.chunk.as_ref())
                    .map(|c| Payload::from(c.to_vec()))
                    .unwrap_or_default();
            }
            let req = Request {
                call,
                reply: p.reply,
            };
            self.queue.push_front((xid, req, p.sent));
        }
        // The server may be restarting: try again, backing off, for up to
        // one call timeout.
        let give_up = Instant::now() + self.opts.call_timeout;
        let mut backoff = Duration::from_millis(100);
        loop {
            match Conn::connect(self.addr, &self.opts, &self.stats).await {
                Ok(c) => {
                    if trace() {
                        say(&format!("reconnected to {}", self.addr));
                    }
                    self.stats.connects.fetch_add(1, Ordering::Relaxed);
                    self.conn = Some(c);
                    self.down = None;
                    return;
                }
                Err(e) if Instant::now() + backoff < give_up => {
                    if trace() {
                        say(&format!("reconnecting to {}: {e}", self.addr));
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    let e = match (self.down.take(), e) {
                        (Some(why), Error::NotConnected(m)) => {
                            Error::NotConnected(format!("{why}; reconnecting: {m}"))
                        }
                        (_, e) => e,
                    };
                    self.fail_all(e);
                    return;
                }
            }
        }
    }

    async fn timed_out(&mut self) {
        let now = Instant::now();
        // An invalidation that never completed: the window may still be
        // valid, and only the QP's end makes it unreachable (`lost`).
        let stuck: Vec<u32> = self
            .ending
            .iter()
            .filter(|(_, e)| e.deadline <= now)
            .map(|(x, _)| *x)
            .collect();
        if let Some(xid) = stuck.first() {
            self.stats
                .lost_invalidations
                .fetch_add(stuck.len() as u64, Ordering::Relaxed);
            self.lost(format!(
                "the invalidation (LOCAL_INV) of call {xid:#x}'s chunks did not complete within \
                 {:?}{}",
                self.opts.invalidate_timeout,
                if stuck.len() > 1 {
                    format!(" ({} calls)", stuck.len())
                } else {
                    String::new()
                }
            ));
            self.reconnect().await;
            return;
        }
        let expired: Vec<u32> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(x, _)| *x)
            .collect();
        if expired.is_empty() {
            return;
        }
        self.lost(format!("{} call(s) timed out", expired.len()));
        self.reconnect().await;
    }
}

/// `RDMA_NFS_TRACE` set: connection losses are written to stderr.
fn trace() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("RDMA_NFS_TRACE").is_some())
}

/// A trace line, with the wall-clock time (seconds and milliseconds).
fn say(what: &str) {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    eprintln!(
        "rdma-nfs: [{}.{:03}] {what}",
        t.as_secs() % 1000,
        t.subsec_millis()
    );
}

async fn sleep_until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// The bytes the server wrote into the call's write chunk: as many as the
/// segments it returned say, never more than offered.
fn written(p: &Pending, c: &Chunks) -> Result<Option<usize>> {
    let Some(chunk) = c.write.first() else {
        return Ok(None);
    };
    let Some(l) = &p.write else {
        return Err(Error::Malformed(
            "a write chunk in a reply to a call that offered none".into(),
        ));
    };
    let len: u64 = chunk.iter().map(|s| u64::from(s.length)).sum();
    if len > l.len() as u64 || c.write.len() > 1 {
        return Err(Error::Malformed(format!(
            "the server returned a write list of {} chunk(s), {len} bytes, for one chunk of {}",
            c.write.len(),
            l.len()
        )));
    }
    Ok(Some(len as usize))
}

/// An `RDMA_NOMSG` reply's length in the reply chunk.
fn nomsg_reply(p: &Pending, c: &Chunks) -> Result<usize> {
    let (Some(chunk), Some(l)) = (&c.reply, &p.reply_chunk) else {
        return Err(Error::Malformed(
            "RDMA_NOMSG without a reply chunk, or to a call that offered none".into(),
        ));
    };
    let len: u64 = chunk.iter().map(|s| u64::from(s.length)).sum();
    if len > l.len() as u64 || len < 4 {
        return Err(Error::Malformed(format!(
            "the server returned a reply chunk of {len} bytes for one of {}",
            l.len()
        )));
    }
    Ok(len as usize)
}

/// Counts a chunk read with a plain copy.
fn plain_read(l: &Option<Lent>) {
    if let Some(l) = l {
        l.stats.plain_chunk_reads.fetch_add(1, Ordering::Relaxed);
    }
}

/// Which of a call's chunks no peer can reach any more, so that they may be
/// read with a plain copy.
#[derive(Clone, Copy)]
struct Gone<'a> {
    /// Every window the call was lent was invalidated: its `LOCAL_INV`
    /// completed successfully after the reply came, or it is in `remote`.
    windows: bool,
    /// The rkeys of the call's chunks that the server invalidated, as
    /// receive completions reported (`IBV_WC_WITH_INV`).
    remote: &'a [u32],
}

impl Gone<'_> {
    /// Whether `c`'s rkey is invalid: a window, when all were invalidated;
    /// a registration of its own, when the server invalidated its rkey.
    fn unreachable(self, c: &Chunk) -> bool {
        match c.window_rkey() {
            Some(_) => self.windows,
            None => self.remote.contains(&c.segment().handle),
        }
    }
}

/// Reads `len` bytes of a lent chunk: a plain copy when `gone` proves it
/// unreachable, else the crate's atomic copy.
fn read_lent(l: &Option<Lent>, len: usize, what: &str, gone: Gone) -> Result<Vec<u8>> {
    let Some(c) = l.as_ref().and_then(|l| l.chunk.as_ref()) else {
        return Err(Error::Malformed(format!("{what}: never offered")));
    };
    if gone.unreachable(c) {
        // SAFETY: `gone` says this chunk's rkey is invalid: a window whose
        // `LOCAL_INV` (posted in `Engine::finish`, after its reply came)
        // completed successfully (`Engine::invalidated`), or whose rkey, or
        // a registration whose rkey, the reply's receive completion reported
        // invalidated by the server; windows are not bound again before
        // `deliver` puts them back, registrations are dropped after.
        if let Some(b) = unsafe { c.invalidated_bytes(len) } {
            plain_read(l);
            return Ok(b.to_vec());
        }
    }
    let mut v = vec![0; len];
    c.read(&mut v)
        .map_err(|e| Error::Malformed(format!("{what}: {e}")))?;
    Ok(v)
}

/// The reply, read out of its chunks: with a plain copy where `gone`
/// proves no peer can reach them, else with the atomic copy (the windows'
/// QP may be in error, or a registration still valid until it is dropped).
fn outcome(p: &Pending, o: Outcome, gone: Gone, lent: Result<Option<LentData>>) -> Result<Reply> {
    let (msg, written) = match o {
        Outcome::Failed(e) => return Err(e),
        Outcome::Msg { msg, written } => (msg, written),
        Outcome::NoMsg { len, written } => (
            read_lent(&p.reply_chunk, len, "reply chunk", gone)?,
            written,
        ),
    };
    check_reply_xid(&p.call.msg, &msg)?;
    if let Some(d) = lent? {
        return Ok(Reply {
            msg,
            data: None,
            placed: None,
            lent: Some(d),
        });
    }
    let Some(n) = written else {
        return Ok(Reply {
            msg,
            data: None,
            placed: None,
            lent: None,
        });
    };
    if let (Some(d), Some(c)) = (
        &p.call.data_into,
        p.write.as_ref().and_then(|l| l.chunk.as_ref()),
    ) {
        let plain = if gone.unreachable(c) {
            // SAFETY: as in `read_lent`: this chunk's rkey is invalid (its
            // `LOCAL_INV` completed after the reply came, or the server
            // invalidated it with the reply), and it is neither bound again
            // nor deregistered before `deliver` is done with it.
            unsafe { c.invalidated_bytes(n) }
        } else {
            None
        };
        let placed = if let Some(b) = plain {
            let r = d.try_fill(n, |dst| dst.copy_from_slice(b));
            if r.is_some() {
                plain_read(&p.write);
            }
            r
        } else {
            d.try_fill(n, |dst| c.read(dst).is_ok())
                .filter(|ok| *ok)
                .map(|_| ())
        };
        if placed.is_some() {
            if let Some(l) = &p.write {
                l.stats.data_placed.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(Reply {
                msg,
                data: None,
                placed: Some(n),
                lent: None,
            });
        }
    }
    Ok(Reply {
        msg,
        data: Some(read_lent(&p.write, n, "write chunk", gone)?),
        placed: None,
        lent: None,
    })
}

/// The write chunk's data lent in place ([`Call::lend_data`]), when the call
/// asked for it, the reply says the server wrote it, and the chunk can be
/// lent ([`ChunkPool::lend`]: a window proven invalidated, a registration
/// of its own deregistered); the chunk is then out of the call, and is not
/// put back or discarded with the others. `Ok(None)`: read it with a copy.
fn lend_write(
    p: &mut Pending,
    o: &Outcome,
    gone: Gone,
    pool: Option<&mut ChunkPool>,
) -> Result<Option<LentData>> {
    let (Outcome::Msg {
        written: Some(n), ..
    }
    | Outcome::NoMsg {
        written: Some(n), ..
    }) = *o
    else {
        return Ok(None);
    };
    let (true, Some(pool), Some(l)) = (p.call.lend_data, pool, p.write.as_mut()) else {
        return Ok(None);
    };
    let Some(c) = l.chunk.take() else {
        return Ok(None);
    };
    let invalidated = gone.unreachable(&c);
    match pool.lend(c, n, invalidated) {
        Ok(d) => {
            l.stats.data_lent.fetch_add(1, Ordering::Relaxed);
            Ok(Some(d))
        }
        Err(NotLent::Kept(c)) => {
            l.chunk = Some(c);
            Ok(None)
        }
        Err(NotLent::Lost(e)) => Err(Error::Permanent(format!(
            "deregistering the write chunk to lend its data: {e}"
        ))),
    }
}

/// Delivers a reply: its chunks go back to `pool` (the connection they were
/// bound on), or are dropped without one. `windows`: every window the call
/// was lent is invalidated (its `LOCAL_INV` completed, it was deallocated
/// and replaced, or the server invalidated it with the reply); only then does a window's region go back
/// to the pool, whose regions are all unbound; a call with windows and no
/// such proof has them discarded.
fn deliver(e: Ending, pool: Option<&mut ChunkPool>, windows: bool) {
    let Ending {
        mut pending,
        outcome: o,
        remote,
        ..
    } = e;
    let gone = Gone {
        windows,
        remote: &remote,
    };
    let mut pool = pool;
    let lent = lend_write(&mut pending, &o, gone, pool.as_deref_mut());
    let r = outcome(&pending, o, gone, lent);
    match pool {
        Some(pool) => {
            for l in pending.lent() {
                if let Some(c) = l.chunk.take() {
                    if windows || c.window_rkey().is_none() {
                        pool.put(c);
                    } else {
                        pool.discard(c);
                    }
                }
            }
        }
        None => drop(std::mem::take(&mut pending.chunks)),
    }
    let Pending { reply, .. } = pending;
    let _ = reply.send(r);
}

/// Delivers a reply whose invalidations cannot complete (the connection
/// broke; its QP is in error): its windows are deallocated.
fn deliver_discarding(e: Ending, pool: &mut ChunkPool) {
    let Ending {
        mut pending,
        outcome: o,
        remote: e_remote,
        ..
    } = e;
    // A registration the server invalidated is still unreachable (the
    // windows are read with the atomic copy: their QP is in error).
    let gone = Gone {
        windows: false,
        remote: &e_remote,
    };
    // A registration of its own can still be lent (deregistered first).
    let lent = lend_write(&mut pending, &o, gone, Some(&mut *pool));
    let r = outcome(&pending, o, gone, lent);
    for l in pending.lent() {
        if let Some(c) = l.chunk.take() {
            pool.discard(c);
        }
    }
    let Pending { reply, .. } = pending;
    let _ = reply.send(r);
}

/// Whether the RPC reply `msg` (inline, or read from the reply chunk of a
/// `RDMA_NOMSG` reply) is the reply to `call`: both start with the xid.
fn check_reply_xid(call: &[u8], msg: &[u8]) -> Result<()> {
    let xid = |b: &[u8]| {
        b.get(..4)
            .map(|x| u32::from_be_bytes([x[0], x[1], x[2], x[3]]))
    };
    match (xid(call), xid(msg)) {
        (Some(call), Some(reply)) if call != reply => Err(Error::XidMismatch { call, reply }),
        (Some(_), None) => Err(Error::Malformed(format!(
            "an RPC reply of {} bytes, shorter than its xid",
            msg.len()
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The RPC reply's own xid is the call's, or the reply is refused as a
    /// typed error (the transport header's xid alone matched it).
    #[test]
    fn a_reply_whose_rpc_xid_is_another_call_s_is_refused() {
        let call = [0, 0, 0, 7, 0, 0, 0, 0];
        assert_eq!(check_reply_xid(&call, &[0, 0, 0, 7, 0, 0, 0, 1]), Ok(()));
        assert_eq!(
            check_reply_xid(&call, &[0, 0, 0, 8, 0, 0, 0, 1]),
            Err(Error::XidMismatch { call: 7, reply: 8 })
        );
        assert!(matches!(
            check_reply_xid(&call, &[0, 0]),
            Err(Error::Malformed(m)) if m.contains("shorter than its xid")
        ));
        assert_eq!(
            Error::XidMismatch { call: 7, reply: 8 }.to_string(),
            "the server answered call 0x7 with the RPC reply of call 0x8"
        );
    }

    #[test]
    fn remote_invalidation_is_read_from_rxe_s_kernel_bit_only_on_rxe() {
        // rxe: IBV_WC_WITH_INV, or bit 2 (its kernel's IB_WC_WITH_INVALIDATE).
        let rxe = remote_inv_flags(RXE_VENDOR_ID);
        assert!(rxe.contains(WcFlags::WITH_INV));
        assert!(
            WcFlags::from_bits_retain(0x5).intersects(rxe),
            "rxe's SEND_WITH_INV"
        );
        assert!(
            !WcFlags::from_bits_retain(0x1).intersects(rxe),
            "rxe's plain SEND"
        );
        // Any other device: IBV_WC_WITH_INV only (a checksum flag is not an
        // invalidation there).
        let other = remote_inv_flags(0x02c9);
        assert_eq!(other, WcFlags::WITH_INV);
        assert!(!WcFlags::from_bits_retain(0x5).intersects(other));
    }

    #[test]
    fn a_destination_fills_its_range_and_never_waits_in_try_fill() {
        let buf = Arc::new(Mutex::new(vec![0u8; 10]));
        let d = Destination::new(Arc::clone(&buf), 4);
        assert_eq!(d.try_fill(3, |b| b.copy_from_slice(&[1, 2, 3])), Some(()));
        assert!(d.fill(&[9, 9]));
        assert_eq!(*buf.lock().unwrap(), [0, 0, 0, 0, 9, 9, 3, 0, 0, 0]);
        // Past the end: neither fills, nothing changes.
        assert_eq!(d.try_fill(7, |b| b.fill(5)), None);
        assert!(!d.fill(&[5; 7]));
        assert!(!Destination::new(Arc::clone(&buf), usize::MAX).fill(&[1]));
        // Held by someone else: `try_fill` gives up at once.
        let held = buf.lock().unwrap();
        assert_eq!(d.try_fill(1, |b| b.fill(5)), None);
        drop(held);
        assert_eq!(*buf.lock().unwrap(), [0, 0, 0, 0, 9, 9, 3, 0, 0, 0]);
    }

    #[test]
    fn a_shared_payload_is_its_range_and_nothing_else() {
        let buf = Arc::new((0u8..100).collect::<Vec<u8>>());
        let p = Payload::shared(Arc::clone(&buf), 10..20).expect("in range");
        assert_eq!(p.as_slice(), &buf[10..20]);
        assert_eq!(p.len(), 10);
        assert_eq!(p.clone().into_vec(), buf[10..20].to_vec());
        assert!(Payload::shared(Arc::clone(&buf), 90..101).is_none());
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = 20..10;
        assert!(Payload::shared(Arc::clone(&buf), backwards).is_none());
        assert!(Payload::shared(Arc::clone(&buf), 100..100).is_some_and(|p| p.is_empty()));
        let owned = Payload::from(vec![1, 2, 3]);
        assert_eq!(owned.as_slice(), &[1, 2, 3]);
        assert_eq!(format!("{owned:?}"), "Payload(3 bytes, owned)");
        assert_eq!(format!("{p:?}"), "Payload(10 bytes, shared)");
    }
}
