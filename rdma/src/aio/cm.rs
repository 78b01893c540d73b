//! Connection manager event channels driven by a reactor, and ids whose
//! connection steps are futures.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use super::wake::{DrivenSource, DriverWaker, Hub, Source};
use super::{reactor_error, would_block, Reactor, Readiness};
use crate::cm::{CmAddr, CmEvent, CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use crate::error::{Error, Result};
use crate::QueuePair;

/// The waiter key of [`CmChannel::next_event`]: the hub's first key, never
/// released (ids get theirs from [`super::wake::Waiters::alloc`]).
const UNROUTED: usize = 0;

#[derive(Default)]
struct CmState {
    /// Events of the ids with an [`AsyncCmId`], by the id's waiter key (a
    /// connect request under its listener): a waiter's poll finds its
    /// mailbox without hashing. Each event holds its id and is acknowledged
    /// when dropped.
    boxes: Vec<Option<VecDeque<CmEvent>>>,
    /// The waiter key of each id with an [`AsyncCmId`], by id: what an
    /// event names (one lookup per event read, not per poll).
    keys: HashMap<usize, usize>,
    /// Events of other ids, for [`CmChannel::next_event`].
    unrouted: VecDeque<CmEvent>,
}

struct CmShared {
    /// Dropped first (field order): the registration goes while the
    /// descriptor is open.
    readiness: Box<dyn Readiness>,
    state: Mutex<CmState>,
    hub: Hub,
    /// Given to the reactor: reads the channel and wakes the waiters of the
    /// ids whose events came (see `wake.rs`).
    driver_waker: Waker,
    channel: EventChannel,
}

fn id_key(id: &CmId) -> usize {
    Arc::as_ptr(&id.inner) as usize
}

impl CmShared {
    fn state(&self) -> MutexGuard<'_, CmState> {
        // Nothing panics while holding it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ready with the next event for `key` (an id, or [`UNROUTED`]); reads
    /// the channel (every pending event, until `EAGAIN`) while there is none.
    fn poll_event(&self, key: usize, cx: &mut Context<'_>) -> Poll<Result<CmEvent>> {
        self.hub.waiters.register(key, cx.waker());
        if let Some(e) = pop(&mut self.state(), key) {
            return Poll::Ready(Ok(e));
        }
        if self.hub.armed() {
            // The reactor holds the driver's waker: an event for `key`, when
            // one comes, is read by it and wakes this waiter (registered
            // above, before the look at the mailbox). An id whose events are
            // awaited beside its completions (a `select!`) costs a look at
            // its mailbox per sleep, not a read of the channel.
            return Poll::Pending;
        }
        let read = self.hub.drive(self, &self.driver_waker, key);
        if let Some(e) = pop(&mut self.state(), key) {
            return Poll::Ready(Ok(e));
        }
        match read {
            Err(e) => Poll::Ready(Err(e)),
            Ok(()) => Poll::Pending,
        }
    }

    /// Registers `id`: its events go to a mailbox of its own, and those
    /// already waiting among the unrouted ones move there.
    fn register(self: &Arc<Self>, id: CmId, operation: &'static str) -> Result<AsyncCmId> {
        let address = id_key(&id);
        let mut st = self.state();
        if st.keys.contains_key(&address) {
            return Err(Error::Async {
                operation,
                reason: "the id already has an AsyncCmId (one async handle per id)".into(),
                errno: libc::EBUSY,
            });
        }
        let (mine, rest): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut st.unrouted)
            .into_iter()
            .partition(|e| about(e) == address);
        st.unrouted = rest;
        let key = self.hub.waiters.alloc();
        if key >= st.boxes.len() {
            st.boxes.resize_with(key + 1, || None);
        }
        st.boxes[key] = Some(mine);
        st.keys.insert(address, key);
        drop(st);
        Ok(AsyncCmId {
            chan: Arc::clone(self),
            id,
            key,
        })
    }
}

impl Source for CmShared {
    fn hub(&self) -> &Hub {
        &self.hub
    }

    fn read(&self, cx: &mut Context<'_>, woken: &mut Vec<usize>) -> Poll<Result<()>> {
        let mut st = self.state();
        let mut failure = None;
        let read = self.readiness.poll_read(cx, &mut || loop {
            match self.channel.read_event() {
                Ok(Some(event)) => woken.push(route(&mut st, event)),
                Ok(None) => return Err(would_block()),
                Err(e) => {
                    let io = io::Error::other(e.to_string());
                    failure = Some(e);
                    return Err(io);
                }
            }
        });
        match (read, failure) {
            (Poll::Ready(Err(_)), Some(e)) => Poll::Ready(Err(e)),
            (Poll::Ready(Err(e)), None) => Poll::Ready(Err(reactor_error("rdma_get_cm_event", e))),
            _ => Poll::Pending,
        }
    }
}

impl DrivenSource for CmShared {
    fn driver_waker(&self) -> &Waker {
        &self.driver_waker
    }
}

/// The key an event is routed by: its id, or for a connect request the
/// listener.
fn about(e: &CmEvent) -> usize {
    id_key(e.listen_id().unwrap_or(e.id()))
}

/// Puts `event` where its waiter looks; returns that waiter's key.
fn route(st: &mut CmState, event: CmEvent) -> usize {
    let key = st.keys.get(&about(&event)).copied();
    match key.and_then(|k| Some((k, st.boxes.get_mut(k)?.as_mut()?))) {
        Some((key, b)) => {
            b.push_back(event);
            key
        }
        None => {
            st.unrouted.push_back(event);
            UNROUTED
        }
    }
}

fn pop(st: &mut CmState, key: usize) -> Option<CmEvent> {
    if key == UNROUTED {
        st.unrouted.pop_front()
    } else {
        st.boxes.get_mut(key)?.as_mut()?.pop_front()
    }
}

impl Drop for CmShared {
    fn drop(&mut self) {
        self.channel.inner.driven.store(false, Ordering::Release);
    }
}

/// An [`EventChannel`] driven by a reactor: reads its events and hands each
/// to the [`AsyncCmId`] it is about (a connect request to its listener), or,
/// for an id without one, to [`CmChannel::next_event`].
///
/// While it lives it is the channel's only reader: the channel's own
/// `get_event`, `try_get_event`, `get_event_timeout` and `wait_for` refuse
/// (`EBUSY`). A cheap `Clone` handle.
///
/// An event holds its id until it is dropped, and `rdma_destroy_id` waits
/// for that: events wait in their id's mailbox, which goes (acknowledging
/// them) with the id's [`AsyncCmId`]; events of ids without one wait for
/// [`CmChannel::next_event`] or for the last handle of the channel.
///
/// A server on tokio (feature `tokio`), one connection at a time:
///
/// ```no_run
/// # #[cfg(feature = "tokio")]
/// # async fn f() -> rdma::Result<()> {
/// use rdma::cm::ConnParam;
/// use rdma::{AccessFlags, PostError, QpState, QpType};
///
/// let cm = rdma::aio::tokio_rt::cm_channel()?;
/// let mut listener = cm.listen("10.8.0.1:7471".parse().unwrap(), 16)?;
/// loop {
///     let request = listener.get_request().await?;
///     // The request knows its device: make the connection's objects on it.
///     let ctx = request.context()?;
///     let pd = ctx.alloc_pd()?;
///     let cq = ctx.create_cq(64, None, 0)?;
///     let mut qp = pd.qp_builder(QpType::Rc, &cq, &cq).build()?;
///     // A receive posted before accepting is there for the first message.
///     request.id().modify_qp(&qp, QpState::Init)?;
///     let buf = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
///     qp.post_recv(1, buf).map_err(PostError::drop_buffers)?;
///     let mut conn = request.accept(&qp, &ConnParam::default()).await?;
///     // ... traffic ...
///     conn.disconnected().await?;
/// }
/// # }
/// ```
#[derive(Clone)]
pub struct CmChannel {
    shared: Arc<CmShared>,
}

impl CmChannel {
    /// Drives `channel` from `reactor` (its descriptor is always
    /// non-blocking).
    ///
    /// # Errors
    /// [`Error::Async`] (`EBUSY`) when another `CmChannel` drives it; the
    /// reactor's errors ([`Error::Async`] outside its runtime).
    pub fn new(channel: &EventChannel, reactor: &dyn Reactor) -> Result<CmChannel> {
        if channel.inner.driven.swap(true, Ordering::AcqRel) {
            return Err(Error::Async {
                operation: "CmChannel::new",
                reason: "another CmChannel drives the event channel".into(),
                errno: libc::EBUSY,
            });
        }
        let readiness = reactor
            .register(channel.as_fd())
            .inspect_err(|_| channel.inner.driven.store(false, Ordering::Release))?;
        Ok(CmChannel {
            shared: Arc::new_cyclic(|me: &std::sync::Weak<CmShared>| {
                let me: std::sync::Weak<dyn DrivenSource> = std::sync::Weak::<CmShared>::clone(me);
                let hub = Hub::default();
                // The first key, UNROUTED's (a fresh hub hands out 0).
                let unrouted = hub.waiters.alloc();
                debug_assert_eq!(unrouted, UNROUTED);
                CmShared {
                    readiness,
                    state: Mutex::new(CmState::default()),
                    hub,
                    driver_waker: Waker::from(Arc::new(DriverWaker(me))),
                    channel: channel.clone(),
                }
            }),
        })
    }

    /// The event channel.
    pub fn channel(&self) -> &EventChannel {
        &self.shared.channel
    }

    /// Creates an id on the channel ([`EventChannel::create_id`]), with its
    /// mailbox.
    ///
    /// # Errors
    /// As [`EventChannel::create_id`].
    pub fn create_id(&self, ps: PortSpace) -> Result<AsyncCmId> {
        let id = self.shared.channel.create_id(ps)?;
        self.shared.register(id, "CmChannel::create_id")
    }

    /// Gives an existing id of this channel a mailbox: its events go there
    /// from now on (with those already read and not taken).
    ///
    /// # Errors
    /// [`Error::Async`]: `EINVAL` for an id of another channel (or a
    /// synchronous one), `EBUSY` when the id already has an `AsyncCmId`.
    pub fn register(&self, id: &CmId) -> Result<AsyncCmId> {
        match id.channel() {
            Some(ch) if ch.same_channel(&self.shared.channel) => {}
            _ => {
                return Err(Error::Async {
                    operation: "CmChannel::register",
                    reason: "the id reports to another event channel (or is synchronous): \
                             migrate it first (CmId::migrate_id)"
                        .into(),
                    errno: libc::EINVAL,
                })
            }
        }
        self.shared.register(id.clone(), "CmChannel::register")
    }

    /// Creates an id, binds it to `addr` (port 0: any free port) and
    /// listens.
    ///
    /// # Errors
    /// As [`CmId::bind_addr`] and [`CmId::listen`].
    pub fn listen(&self, addr: std::net::SocketAddr, backlog: i32) -> Result<AsyncCmId> {
        let id = self.create_id(PortSpace::Tcp)?;
        id.id().bind_addr(addr)?;
        id.id().listen(backlog)?;
        Ok(id)
    }

    /// Polls for the next event of an id without an [`AsyncCmId`].
    ///
    /// # Errors
    /// As [`EventChannel::try_get_event`]; the reactor's failure as
    /// [`Error::Verb`] naming `rdma_get_cm_event`.
    pub fn poll_event(&self, cx: &mut Context<'_>) -> Poll<Result<CmEvent>> {
        self.shared.poll_event(UNROUTED, cx)
    }

    /// Waits for the next event of an id without an [`AsyncCmId`]. One
    /// task at a time should wait here (the last one registered is woken).
    ///
    /// Cancel safety: events are read into the channel's queues, never into
    /// the future: dropping it loses nothing.
    ///
    /// # Errors
    /// As [`CmChannel::poll_event`].
    pub fn next_event(&self) -> impl Future<Output = Result<CmEvent>> + '_ {
        std::future::poll_fn(move |cx| self.poll_event(cx))
    }
}

impl fmt::Debug for CmChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.shared.state();
        f.debug_struct("CmChannel")
            .field("channel", &self.shared.channel)
            .field("ids", &st.keys.len())
            .field("unrouted", &st.unrouted.len())
            .finish()
    }
}

/// A [`CmId`] with a mailbox in its [`CmChannel`]: its events, awaited, and
/// its connection steps as futures.
///
/// Waiting takes `&mut self`: one task waits for an id's events at a time.
/// Dropping the handle drops (acknowledges) the events still in the mailbox;
/// the id itself goes when its last [`CmId`] handle does.
///
/// Cancel safety of the steps: each step makes its call (`rdma_connect`,
/// ...) in the first poll, then waits for its event. Dropped while waiting,
/// the step's event stays in the mailbox and [`AsyncCmId::next_event`]
/// returns it; the step is not redone, and a step that waits for another
/// event type next (the following step) reports the left-over event as an
/// [`Error::CmEvent`]. Nothing is acknowledged late: the mailbox goes with
/// this handle.
///
/// A client on tokio (feature `tokio`): each step is awaited.
///
/// ```no_run
/// # #[cfg(feature = "tokio")]
/// # async fn f() -> rdma::Result<()> {
/// use std::time::Duration;
///
/// use rdma::cm::{ConnParam, PortSpace};
/// use rdma::QpType;
///
/// let cm = rdma::aio::tokio_rt::cm_channel()?;
/// let mut id = cm.create_id(PortSpace::Tcp)?;
/// let dst: std::net::SocketAddr = "10.8.0.1:7471".parse().unwrap();
/// id.resolve_addr(None, dst, Duration::from_secs(2)).await?;
/// id.resolve_route(Duration::from_secs(2)).await?;
/// // The route names the device: make the connection's objects on it.
/// let ctx = id.id().context()?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(64, None, 0)?;
/// let qp = pd.qp_builder(QpType::Rc, &cq, &cq).build()?;
/// id.connect(&qp, &ConnParam::default()).await?;
/// // ... traffic ...
/// id.disconnect().await?;
/// # Ok(())
/// # }
/// ```
pub struct AsyncCmId {
    chan: Arc<CmShared>,
    id: CmId,
    key: usize,
}

impl AsyncCmId {
    /// The id.
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// The driver of the id's channel.
    pub fn channel(&self) -> CmChannel {
        CmChannel {
            shared: Arc::clone(&self.chan),
        }
    }

    /// Polls for the id's next event (for a listener: the next connect
    /// request).
    ///
    /// # Errors
    /// As [`CmChannel::poll_event`].
    pub fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Result<CmEvent>> {
        self.chan.poll_event(self.key, cx)
    }

    /// Waits for the id's next event.
    ///
    /// Cancel safety: the event is taken from the mailbox only in the poll
    /// that returns it; dropping the future loses nothing.
    ///
    /// # Errors
    /// As [`CmChannel::poll_event`].
    pub fn next_event(&mut self) -> impl Future<Output = Result<CmEvent>> + '_ {
        std::future::poll_fn(move |cx| self.poll_event(cx))
    }

    /// Waits for the id's next event and checks that it is one of `wanted`
    /// with status 0.
    ///
    /// Cancel safety: as [`AsyncCmId::next_event`].
    ///
    /// # Errors
    /// [`Error::CmEvent`] for another event (naming `operation`), or as
    /// [`AsyncCmId::next_event`].
    pub async fn expect(
        &mut self,
        wanted: &[CmEventType],
        operation: &'static str,
    ) -> Result<CmEvent> {
        let event = self.next_event().await?;
        if wanted.contains(&event.event_type()) && event.status() == 0 {
            Ok(event)
        } else {
            Err(event.into_error(operation))
        }
    }

    /// Resolves `dst` ([`CmId::resolve_addr`]) and waits for
    /// `ADDR_RESOLVED`.
    ///
    /// Cancel safety: see the type's documentation.
    ///
    /// # Errors
    /// As [`CmId::resolve_addr`]; [`Error::CmEvent`] for `ADDR_ERROR` (or
    /// another event).
    pub async fn resolve_addr(
        &mut self,
        src: Option<CmAddr>,
        dst: impl Into<CmAddr>,
        timeout: Duration,
    ) -> Result<()> {
        self.id.resolve_addr(src, dst, timeout)?;
        drop(
            self.expect(&[CmEventType::AddrResolved], "rdma_resolve_addr")
                .await?,
        );
        Ok(())
    }

    /// Resolves the route ([`CmId::resolve_route`]) and waits for
    /// `ROUTE_RESOLVED`.
    ///
    /// Cancel safety: see the type's documentation.
    ///
    /// # Errors
    /// As [`CmId::resolve_route`]; [`Error::CmEvent`] for `ROUTE_ERROR`.
    pub async fn resolve_route(&mut self, timeout: Duration) -> Result<()> {
        self.id.resolve_route(timeout)?;
        drop(
            self.expect(&[CmEventType::RouteResolved], "rdma_resolve_route")
                .await?,
        );
        Ok(())
    }

    /// Connects with `qp` ([`CmId::connect_qp`]) and waits until the
    /// connection is up: after `CONNECT_RESPONSE` (InfiniBand/RoCE) it moves
    /// the QP to RTS and establishes ([`CmId::establish_qp`]); on iWARP the
    /// event is `ESTABLISHED`. Returns the peer's connection parameters
    /// (its private data).
    ///
    /// Cancel safety: see the type's documentation. Dropped before the
    /// response, the request stays out; dropping the id abandons it.
    ///
    /// # Errors
    /// As [`CmId::connect_qp`] and [`CmId::establish_qp`];
    /// [`Error::CmEvent`] for `REJECTED` (with the peer's private data),
    /// `UNREACHABLE`, `CONNECT_ERROR`.
    pub async fn connect(&mut self, qp: &QueuePair, param: &ConnParam) -> Result<ConnParam> {
        self.id.connect_qp(qp, param)?;
        let event = self
            .expect(
                &[CmEventType::ConnectResponse, CmEventType::Established],
                "rdma_connect",
            )
            .await?;
        let peer = event.conn_param().cloned().unwrap_or_default();
        let response = event.event_type() == CmEventType::ConnectResponse;
        drop(event);
        if response {
            self.id.establish_qp(qp)?;
        }
        Ok(peer)
    }

    /// Waits for the next connection request on a listening id, and returns
    /// it with a mailbox of its own: [`Incoming::accept`] or
    /// [`Incoming::reject`] it, after making the connection's PD, memory and
    /// QP on [`Incoming::context`] (two-phase accept).
    ///
    /// Cancel safety: as [`AsyncCmId::next_event`].
    ///
    /// # Errors
    /// [`Error::CmEvent`] for another event of the listener; as
    /// [`AsyncCmId::next_event`].
    pub async fn get_request(&mut self) -> Result<Incoming> {
        let event = self
            .expect(&[CmEventType::ConnectRequest], "rdma_listen")
            .await?;
        let param = event.conn_param().cloned().unwrap_or_default();
        let id = event.id().clone();
        drop(event);
        let id = self.chan.register(id, "AsyncCmId::get_request")?;
        Ok(Incoming { id, param })
    }

    /// Disconnects ([`CmId::disconnect`]) and waits for `DISCONNECTED`.
    ///
    /// Cancel safety: see the type's documentation.
    ///
    /// # Errors
    /// As [`CmId::disconnect`]; [`Error::CmEvent`] for another event.
    pub async fn disconnect(&mut self) -> Result<()> {
        self.id.disconnect()?;
        drop(
            self.expect(&[CmEventType::Disconnected], "rdma_disconnect")
                .await?,
        );
        Ok(())
    }

    /// Waits until the peer disconnects (`DISCONNECTED`), then completes the
    /// disconnection from this side.
    ///
    /// Cancel safety: as [`AsyncCmId::next_event`].
    ///
    /// # Errors
    /// [`Error::CmEvent`] for another event; as [`AsyncCmId::next_event`].
    pub async fn disconnected(&mut self) -> Result<()> {
        drop(
            self.expect(&[CmEventType::Disconnected], "wait for DISCONNECTED")
                .await?,
        );
        // Already disconnected locally (iWARP) is fine.
        let _ = self.id.disconnect();
        Ok(())
    }
}

impl Drop for AsyncCmId {
    fn drop(&mut self) {
        let mailbox = {
            let mut st = self.chan.state();
            st.keys.remove(&id_key(&self.id));
            st.boxes.get_mut(self.key).and_then(Option::take)
        };
        // After the mailbox is gone: a new id given the key finds none of
        // this one's events.
        self.chan.hub.waiters.release(self.key);
        // Outside the lock: acknowledging may let the id be destroyed.
        drop(mailbox);
    }
}

impl fmt::Debug for AsyncCmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncCmId").field("id", &self.id).finish()
    }
}

/// A connection request taken from a listener and not answered yet: the
/// first phase of a two-phase accept. Make the connection's resources on
/// [`Incoming::context`] (the PD, memory whose rkey the private data of the
/// accept can carry, the CQ and QP), then [`Incoming::accept`].
///
/// Dropped unanswered, the request's id is destroyed, which rejects it.
///
/// ```no_run
/// # #[cfg(feature = "tokio")]
/// # async fn f() -> rdma::Result<()> {
/// use rdma::cm::ConnParam;
/// use rdma::{AccessFlags, QpType};
///
/// let cm = rdma::aio::tokio_rt::cm_channel()?;
/// let mut listener = cm.listen("10.8.0.1:7471".parse().unwrap(), 16)?;
/// let incoming = listener.get_request().await?;
/// // The connection's objects, on the device the request came in on.
/// let ctx = incoming.context()?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(64, None, 0)?;
/// let qp = pd.qp_builder(QpType::Rc, &cq, &cq).build()?;
/// // Memory the peer may write, registered on this PD: its address, length
/// // and rkey travel in the accept's private data.
/// let target = pd.alloc_mr(1 << 20, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
/// let param = ConnParam {
///     private_data: target.remote().to_bytes().to_vec(),
///     ..ConnParam::default()
/// };
/// let conn = incoming.accept(&qp, &param).await?;
/// // ... the peer writes into `target` ...
/// # drop(conn);
/// # Ok(())
/// # }
/// ```
pub struct Incoming {
    id: AsyncCmId,
    param: ConnParam,
}

impl Incoming {
    /// The new connection's id.
    pub fn id(&self) -> &CmId {
        self.id.id()
    }

    /// The device the request came in on (borrowed from the id).
    ///
    /// # Errors
    /// As [`CmId::context`].
    pub fn context(&self) -> Result<crate::Context> {
        self.id.id().context()
    }

    /// What the peer sent with its request.
    pub fn conn_param(&self) -> &ConnParam {
        &self.param
    }

    /// The peer's private data.
    pub fn private_data(&self) -> &[u8] {
        &self.param.private_data
    }

    /// Accepts with `qp` ([`CmId::accept_qp`]) and `param` (its private data
    /// may carry the rkey of memory registered on the connection's PD), and
    /// waits for `ESTABLISHED`. Returns the connection's id.
    ///
    /// Cancel safety: dropped before `ESTABLISHED`, the future drops the
    /// id's handle (and its mailbox, acknowledging its events): the
    /// connection is abandoned and the id destroyed once its last handle
    /// goes; nothing is left unacknowledged.
    ///
    /// # Errors
    /// As [`CmId::accept_qp`]; [`Error::CmEvent`] for another event.
    pub async fn accept(self, qp: &QueuePair, param: &ConnParam) -> Result<AsyncCmId> {
        let mut id = self.id;
        id.id.accept_qp(qp, param)?;
        drop(
            id.expect(&[CmEventType::Established], "rdma_accept")
                .await?,
        );
        Ok(id)
    }

    /// Accepts with a QP the caller has already moved to RTS itself (with
    /// [`CmId::init_qp_attr`]'s attributes, changed where it must: more
    /// transport retries than the peer's request asked for, say), sending
    /// `param` with `qp`'s number ([`CmId::accept`]), and waits for
    /// `ESTABLISHED`. Returns the connection's id.
    ///
    /// Cancel safety: as [`Incoming::accept`].
    ///
    /// # Errors
    /// As [`CmId::accept`]; [`Error::CmEvent`] for another event.
    pub async fn accept_ready(self, qp: &QueuePair, param: &ConnParam) -> Result<AsyncCmId> {
        let mut id = self.id;
        let mut p = param.clone();
        p.qp_num = qp.qp_num();
        p.srq = qp.srq().is_some();
        id.id.accept(&p)?;
        drop(
            id.expect(&[CmEventType::Established], "rdma_accept")
                .await?,
        );
        Ok(id)
    }

    /// Rejects the request ([`CmId::reject`]) with `private_data`.
    ///
    /// # Errors
    /// As [`CmId::reject`].
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        self.id.id().reject(private_data)
    }
}

impl fmt::Debug for Incoming {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Incoming")
            .field("id", &self.id)
            .field("param", &self.param)
            .finish()
    }
}
