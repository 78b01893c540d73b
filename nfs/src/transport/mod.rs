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
//!
//! Its files, each using only the ones before it (and the public types):
//! `conn.rs` makes a connection (RDMA CM, the private data, every receive
//! posted before it connects); `send.rs` holds a call in flight (`Pending`,
//! the chunks lent to it) and marshals one (its `Plan`: inline, a payload
//! read chunk, or `RDMA_NOMSG`); `deliver.rs` checks a reply and reads it
//! out of its chunks once no peer can reach them, then hands it to its
//! caller; `engine.rs` is the task (the event loop: credits, completions,
//! invalidations, timeouts, reconnection). This file: the public types and
//! the [`Transport`] handle, which starts the engine.

mod conn;
mod deliver;
mod engine;
mod send;

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

pub use crate::chunks::LentData;
pub use crate::error::{Error, Result};
pub use crate::stats::Stats;

use conn::Conn;
use engine::Engine;

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
        let engine = Engine::new(addr, opts, conn, Arc::clone(&stats));
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

#[cfg(test)]
mod tests {
    use super::*;

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
