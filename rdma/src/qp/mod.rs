//! Queue pairs (`ibv_create_qp(3)`, `ibv_modify_qp(3)`, `ibv_query_qp(3)`,
//! `ibv_post_send(3)`, `ibv_post_recv(3)`).
//!
//! The files follow a request's way: [`builder`] creates the QP and chooses
//! its send path once; [`attr`] moves it between states; a send is checked
//! once ([`check`]: the quick predicate, then the explaining checks) and
//! handed to the provider by one submit ([`send`]; the extended path's calls
//! are [`wr_ops`]), whose front ends are
//! `post_send`, `post_send_batch`, `post_send_inline` and a window's bind
//! ([`bind`]); [`prepared`] is the narrower entry point that reuses one
//! checked request; [`recv`] posts receives (the chain is shared with shared
//! receive queues, in `track`); [`raw`] is the untracked path for experts.

mod attr;
mod bind;
mod builder;
mod check;
mod ext;
mod outgoing;
mod prepared;
mod prepared_recv;
mod raw;
mod recv;
mod send;
mod wr_ops;

use std::borrow::Cow;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{check_errno_ret, Error, Result};
use crate::macros::c_enum;
use crate::track::QpTracker;
use crate::{ffi, CompletionQueue, ProtectionDomain};
use wr_ops::ExtendedQp;
pub(crate) use wr_ops::{DirectOne, SendFn, WriteFn};

pub(crate) use crate::track::allocate_serial;
pub use attr::{InitAttr, QpAttr, RtrAttr, RtsAttr};
pub use builder::{PostPath, QpCaps, QpCreateFlags, QueuePairBuilder};
pub use check::END_PADDING_ALIGN;
pub use prepared::PreparedSend;
pub use prepared_recv::PreparedRecv;

c_enum! {
    /// `enum ibv_qp_type`.
    pub enum QpType: u32 {
        /// Reliable connected.
        Rc = ffi::IBV_QPT_RC,
        /// Unreliable connected.
        Uc = ffi::IBV_QPT_UC,
        /// Unreliable datagram.
        Ud = ffi::IBV_QPT_UD,
        /// Raw packet.
        RawPacket = ffi::IBV_QPT_RAW_PACKET,
        /// XRC initiator.
        XrcSend = ffi::IBV_QPT_XRC_SEND,
        /// XRC target.
        XrcRecv = ffi::IBV_QPT_XRC_RECV,
        /// Driver-specific.
        Driver = ffi::IBV_QPT_DRIVER,
    }
}

c_enum! {
    /// `enum ibv_qp_state`.
    pub enum QpState: u32 {
        /// Reset.
        Reset = ffi::IBV_QPS_RESET,
        /// Initialised.
        Init = ffi::IBV_QPS_INIT,
        /// Ready to receive.
        Rtr = ffi::IBV_QPS_RTR,
        /// Ready to send.
        Rts = ffi::IBV_QPS_RTS,
        /// Send queue drained.
        Sqd = ffi::IBV_QPS_SQD,
        /// Send queue error.
        Sqe = ffi::IBV_QPS_SQE,
        /// Error.
        Err = ffi::IBV_QPS_ERR,
    }
}

/// A queue pair (`struct ibv_qp`). Unique owner: not `Clone`.
///
/// Dropping it moves the QP to the error state, destroys it, and only then
/// releases the memory of the work requests still in flight.
///
/// ```no_run
/// use rdma::{AccessFlags, InitAttr, PostError, QpType};
/// # fn main() -> rdma::Result<()> {
/// let ctx = rdma::Context::open("rxe0")?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(64, None, 0)?;
/// let mut qp = pd
///     .qp_builder(QpType::Rc, &cq, &cq)
///     .max_send_wr(16)
///     .max_recv_wr(16)
///     .build()?;
/// qp.to_init(&InitAttr::new(1))?;
/// // Receives may be posted from INIT on; the region comes back with the
/// // completion, tagged with the request's `wr_id` (7).
/// let buf = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
/// qp.post_recv(7, buf).map_err(PostError::drop_buffers)?;
/// // RTR and RTS need the peer's QP number and address (`to_rtr`, `to_rts`:
/// // see the crate docs), or the connection manager does it all (`rdma::cm`).
/// println!("QP {:#x} in INIT", qp.qp_num());
/// # Ok(())
/// # }
/// ```
pub struct QueuePair {
    /// The C object, with the only `Drop` that destroys it. First, so that
    /// the QP is destroyed before the parents below are released.
    owned: OwnedQp,
    /// How sends reach the provider, chosen when the QP was built.
    path: SendPath,
    qp_type: QpType,
    caps: QpCaps,
    /// Sends of this QP may take the quick check: its type needs no UD
    /// destination or XRC SRQ, it has a send scatter entry, and it does not
    /// pad the device's writes (set once).
    plain_sends: bool,
    /// Receives of this QP may take the quick check: it has a receive
    /// queue of its own and does not pad the device's writes (set once).
    plain_recvs: bool,
    /// Built with [`QpCreateFlags::PCI_WRITE_END_PADDING`]: the device
    /// pads each write it makes into local memory to the end of a cache
    /// line, past the end of the scatter entry unless that end is aligned.
    /// Every entry the device writes must end on [`END_PADDING_ALIGN`].
    end_padding: bool,
    /// The largest message the QP may send, learnt at `to_init` from the
    /// port (`max_msg_sz`; the active MTU for UD); `u32::MAX` (no limit)
    /// until then or when the port reports none, so a post compares once.
    max_msg: std::sync::atomic::AtomicU32,
    srq: Option<crate::SharedReceiveQueue>,
    pd: ProtectionDomain,
}

// SAFETY: a QP may be used from any thread; posting needs `&mut self`, and
// the tracker's consumers take their CQ's registry lock.
unsafe impl Send for QueuePair {}
// SAFETY: `&self` methods (query, modify) are thread-safe verbs.
unsafe impl Sync for QueuePair {}

/// How a QP's sends reach the provider: chosen once, when it is built.
#[derive(Debug)]
enum SendPath {
    /// `ibv_post_send` with `struct ibv_send_wr` chains.
    Legacy,
    /// `ibv_wr_*` for every request.
    Extended(ExtendedQp),
    /// [`PostPath::Auto`] on a provider with `ibv_wr_*`: requests with one
    /// scatter entry or none go through it; scatter lists and inline data
    /// through `ibv_post_send`.
    Mixed(ExtendedQp),
}

/// The C QP and what its destruction touches: the tracker whose memory is
/// released after it, the CQs whose registries know it. The only `Drop` of
/// a queue pair.
struct OwnedQp {
    qp: NonNull<ffi::ibv_qp>,
    /// For a QP the connection manager created: destroys it, and keeps the
    /// `rdma_cm_id` alive until then.
    owner: Option<Arc<dyn QpOwner>>,
    tracker: Arc<QpTracker>,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    /// Set by [`QueuePair::destroy`]: the drop has nothing left to do.
    destroyed: bool,
}

impl OwnedQp {
    fn describe(&self, what: impl fmt::Display) -> Cow<'static, str> {
        // SAFETY: reads a field of a live QP.
        let qpn = unsafe { (*self.qp.as_ptr()).qp_num };
        Cow::Owned(format!(
            "QP {qpn} on {}: {what}",
            self.send_cq.context().name()
        ))
    }

    /// Moves the QP to the error state (so completions of the work in flight
    /// reach the CQs of any other consumer), destroys it, after which the
    /// device no longer touches the memory of its requests, and releases
    /// that memory.
    fn destroy(&mut self) -> Result<()> {
        let mut err = ffi::ibv_qp_attr {
            qp_state: ffi::IBV_QPS_ERR,
            ..Default::default()
        };
        // SAFETY: a live QP and attribute struct. A failure (a QP still in
        // RESET) is no reason not to destroy it.
        let _ = unsafe {
            ffi::ibv_modify_qp(
                self.qp.as_ptr(),
                &mut err,
                ffi::IBV_QP_STATE as std::ffi::c_int,
            )
        };
        let rc = match &self.owner {
            Some(owner) => owner.destroy_qp(self.qp.as_ptr()),
            // SAFETY: a live QP, destroyed once (`destroyed` guards the drop).
            None => unsafe { ffi::ibv_destroy_qp(self.qp.as_ptr()) },
        };
        check_errno_ret("ibv_destroy_qp", || self.describe("destroy"), rc)?;
        self.destroyed = true;
        let serial = self.tracker.serial();
        self.send_cq.inner.registry.unregister(serial);
        self.recv_cq.inner.registry.unregister(serial);
        // SAFETY: the QP is destroyed and unregistered, and its owner is held
        // mutably: nobody posts to or polls its queues any more.
        drop(unsafe { self.tracker.drain() });
        Ok(())
    }
}

impl Drop for OwnedQp {
    fn drop(&mut self) {
        if self.destroyed {
            return;
        }
        if let Err(e) = self.destroy() {
            crate::error::teardown_failed(format_args!(
                "{e}; leaking the QP and the memory of its work in flight"
            ));
            // The device may still use the memory: never free it (the
            // tracker, which owns it, is never dropped).
            std::mem::forget(Arc::clone(&self.tracker));
        }
    }
}

impl QueuePair {
    /// The raw QP, valid while this handle lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_qp {
        self.owned.qp.as_ptr()
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: reads a field of a live QP.
        unsafe { (*self.as_raw()).qp_num }
    }

    /// The send path in use.
    pub fn post_path(&self) -> PostPath {
        match self.path {
            SendPath::Legacy => PostPath::Legacy,
            SendPath::Extended(_) | SendPath::Mixed(_) => PostPath::Extended,
        }
    }

    /// The extended path's calls of a SEND alone, for the slot queue;
    /// `None` on the legacy path or when the provider has no `wr_send`.
    pub(crate) fn direct_send(&self) -> Option<DirectOne<SendFn>> {
        self.path.extended(1, false)?.direct_send()
    }

    /// The extended path's calls of an RDMA WRITE alone, its remote given
    /// per post, for the slot queue; `None` on the legacy path or when the
    /// provider has no `wr_rdma_write`.
    pub(crate) fn direct_write(&self) -> Option<DirectOne<WriteFn>> {
        self.path.extended(1, false)?.direct_write()
    }

    /// The QP type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// The queue sizes the provider actually gave.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The send CQ.
    pub fn send_cq(&self) -> &CompletionQueue {
        &self.owned.send_cq
    }

    /// The receive CQ.
    pub fn recv_cq(&self) -> &CompletionQueue {
        &self.owned.recv_cq
    }

    /// The shared receive queue, if the QP uses one.
    pub fn srq(&self) -> Option<&crate::SharedReceiveQueue> {
        self.srq.as_ref()
    }

    /// Work requests posted through the safe API and not completed yet
    /// (send queue, receive queue).
    pub fn in_flight(&self) -> (usize, usize) {
        self.owned.tracker.in_flight()
    }

    pub(super) fn ctx_str(&self, what: impl fmt::Display) -> Cow<'static, str> {
        self.owned.describe(what)
    }

    pub(super) fn invalid(&self, reason: String) -> Error {
        let _ = self;
        Error::InvalidArgument {
            verb: "ibv_post_send",
            reason,
        }
    }

    /// Destroys the QP now, reporting failure (`ibv_destroy_qp(3)`).
    ///
    /// # Errors
    /// Gives the QP back with the error; its memory stays held.
    #[allow(clippy::result_large_err)] // the rusqlite-style `close` signature, rarely taken
    pub fn destroy(mut self) -> std::result::Result<(), (Self, Error)> {
        match self.owned.destroy() {
            // The rest is released as any drop does; the QP's own drop
            // finds it destroyed.
            Ok(()) => Ok(()),
            Err(e) => Err((self, e)),
        }
    }
}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &self.qp_num())
            .field("qp_type", &self.qp_type)
            .field("caps", &self.caps)
            .finish()
    }
}

/// Destroys a QP that another library created and owns (the connection
/// manager's `rdma_create_qp`): `ibv_destroy_qp` and the owner's bookkeeping.
pub(crate) trait QpOwner: Send + Sync {
    /// Destroys `qp`; returns 0 or an errno value.
    fn destroy_qp(&self, qp: *mut ffi::ibv_qp) -> std::ffi::c_int;
}

impl crate::AsyncEvent {
    /// True when the event is about `qp`.
    pub fn is_qp(&self, qp: &QueuePair) -> bool {
        self.element
            == crate::AsyncEventElement::Qp {
                qp_num: qp.qp_num(),
            }
    }
}
