//! Connections in one call on the async layer (`rdma::aio::Connection`,
//! `Listener`, `PendingConnection`), on tokio and on async-io, over RoCE
//! (rxe) and iWARP (siw): a message each way with the first receives posted
//! in the setup closures (iWARP has no RNR retry: the side that sends first
//! needs the other's receive posted before the connection is up), the
//! addresses each end reports, a connection to a port nobody listens on,
//! a connection from a given source port that TCP holds (iWARP),
//! a disconnection from either side, an accept that the timeout ends, and
//! 16 clients at once.
//!
//! Every wait is bounded (a lost wake-up or a hang fails the test).
//! Addresses as in `aio/main.rs`: `RDMA_TEST_IP` reaches rxe0,
//! `RDMA_TEST_IWARP_IP` siw0; a test whose variable is missing fails.
#![cfg(all(feature = "tokio", feature = "async-io"))]

mod common;

use common::iwarp::iwarp_ip;
use common::roce_ip;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use rdma::aio::{
    async_io_rt::AsyncIo, tokio_rt, tokio_rt::Tokio, CmChannel, ConnectOptions, Connection,
    Listener, Reactor,
};
use rdma::cm::{CmEventType, ConnParam, EventChannel, PortSpace};
use rdma::{
    AccessFlags, Completion, Error, PostError, ProtectionDomain, QpType, QueuePair, SendWr,
    WcOpcode, WcStatus,
};

const LW: AccessFlags = AccessFlags::LOCAL_WRITE;
/// The bound of a whole test body.
const LIMIT: Duration = Duration::from_secs(60);

/// Generous steps: TCG, a loaded host, 16 handshakes at once.
fn opts() -> ConnectOptions {
    ConnectOptions {
        timeout: Duration::from_secs(20),
        ..ConnectOptions::default()
    }
}

fn with_data(data: &[u8]) -> ConnectOptions {
    ConnectOptions {
        conn_param: ConnParam::with_private_data(data),
        ..opts()
    }
}

fn on_tokio(what: &str, f: impl Future<Output = ()>) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            tokio::time::timeout(LIMIT, f)
                .await
                .unwrap_or_else(|_| panic!("{what}: not within {LIMIT:?} on tokio"))
        });
    assert_eq!(rdma::teardown_failures(), 0);
}

fn on_async_io(what: &str, f: impl Future<Output = ()>) {
    async_io::block_on(futures_lite::future::or(f, async {
        async_io::Timer::after(LIMIT).await;
        panic!("{what}: not within {LIMIT:?} on async-io");
    }));
    assert_eq!(rdma::teardown_failures(), 0);
}

/// Posts a 64-byte receive with `wr_id`.
fn post_recv(qp: &mut QueuePair, pd: &ProtectionDomain, wr_id: u64) -> rdma::Result<()> {
    qp.post_recv(wr_id, pd.alloc_mr(64, LW)?)
        .map_err(PostError::drop_buffers)
}

fn post_send(conn: &mut Connection, wr_id: u64, data: &[u8]) {
    let msg = conn
        .pd()
        .reg_mr(data.to_vec(), AccessFlags::empty())
        .unwrap();
    conn.qp()
        .post_send(SendWr::send(wr_id, msg))
        .map_err(PostError::drop_buffers)
        .unwrap();
}

/// The next `n` completions of the connection, each successful.
async fn completions(conn: &mut Connection, n: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    for _ in 0..n {
        let c = conn.cq().next().await.unwrap();
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        out.push(c);
    }
    out
}

/// The bytes of the receive `wr_id` among `cs`.
fn received(cs: &mut [Completion], wr_id: u64) -> Vec<u8> {
    let Some(c) = cs.iter_mut().find(|c| c.wr_id == wr_id) else {
        panic!("no completion {wr_id} in {cs:?}");
    };
    assert_eq!(c.opcode, WcOpcode::Recv, "{c:?}");
    let len = c.byte_len as usize;
    let buf = c.take_buffers().into_one().unwrap().to_vec();
    buf[..len].to_vec()
}

/// Which end disconnects.
#[derive(Clone, Copy, PartialEq)]
enum Closer {
    Client,
    Server,
}

/// A server and a client on `reactor`: the client sends first, into the
/// receive the server posted in `accept_with`'s closure; the server
/// answers into the one the client posted in `connect_with`'s. The
/// listener is dropped as soon as it has accepted. Then the addresses, the
/// private data both ways, and a disconnection by `closer` that the other
/// end sees.
async fn exchange<R: Reactor + Clone + 'static>(reactor: R, ip: IpAddr, closer: Closer) {
    let mut listener = Listener::bind(&reactor, SocketAddr::new(ip, 0), 16).unwrap();
    let addr = listener.local_addr();
    assert_eq!(addr.ip(), ip);
    assert_ne!(addr.port(), 0, "the picked port");
    assert_eq!(listener.id().src_port(), addr.port());
    let server_opts = with_data(b"welcome");
    let client_opts = with_data(b"hello");
    let server = async {
        let mut conn = listener
            .accept_with(&server_opts, |qp, pd| post_recv(qp, pd, 1))
            .await
            .unwrap();
        // Accepted connections do not need the listener.
        drop(listener);
        let mut cs = completions(&mut conn, 1).await;
        assert_eq!(received(&mut cs, 1), b"ping");
        post_send(&mut conn, 2, b"pong");
        let cs = completions(&mut conn, 1).await;
        assert_eq!((cs[0].wr_id, cs[0].opcode), (2, WcOpcode::Send));
        conn
    };
    let client = async {
        let mut conn =
            Connection::connect_with(&reactor, addr, &client_opts, |qp, pd| post_recv(qp, pd, 10))
                .await
                .unwrap();
        post_send(&mut conn, 11, b"ping");
        let mut cs = completions(&mut conn, 2).await;
        assert_eq!(received(&mut cs, 10), b"pong");
        conn
    };
    let (mut server, mut client) = futures_lite::future::zip(server, client).await;
    // RoCE pads the private data to the message's fixed size; iWARP does not.
    assert!(
        server.peer_private_data().starts_with(b"hello"),
        "{:?}",
        server.peer_private_data()
    );
    assert!(
        client.peer_private_data().starts_with(b"welcome"),
        "{:?}",
        client.peer_private_data()
    );
    assert_eq!(client.peer_addr(), addr);
    assert_eq!(server.local_addr(), addr);
    assert_eq!(server.peer_addr(), client.local_addr());
    assert_eq!(client.local_addr().ip(), ip, "one device, both ends");
    assert_eq!(client.id().dst_port(), addr.port());
    let (active, passive) = match closer {
        Closer::Client => (&mut client, &mut server),
        Closer::Server => (&mut server, &mut client),
    };
    let (a, p) = futures_lite::future::zip(active.disconnect(), passive.disconnected()).await;
    a.expect("disconnect");
    p.expect("the peer's disconnection");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn tokio_connect_and_accept_with_receives_posted_exchange_both_ways() {
    on_tokio("the exchange", exchange(Tokio, roce_ip(), Closer::Client));
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_tokio_connect_and_accept_with_receives_posted_exchange_both_ways() {
    on_tokio("the exchange", exchange(Tokio, iwarp_ip(), Closer::Client));
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn async_io_connect_and_accept_with_receives_posted_exchange_both_ways() {
    on_async_io("the exchange", exchange(AsyncIo, roce_ip(), Closer::Client));
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_async_io_connect_and_accept_with_receives_posted_exchange_both_ways() {
    on_async_io(
        "the exchange",
        exchange(AsyncIo, iwarp_ip(), Closer::Client),
    );
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn tokio_server_disconnect_is_seen_by_the_client() {
    on_tokio("the exchange", exchange(Tokio, roce_ip(), Closer::Server));
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_async_io_server_disconnect_is_seen_by_the_client() {
    on_async_io(
        "the exchange",
        exchange(AsyncIo, iwarp_ip(), Closer::Server),
    );
}

/// A port nobody listens on: bound by a listener that is then dropped.
fn closed_port(reactor: &(impl Reactor + Clone + 'static), ip: IpAddr) -> SocketAddr {
    let listener = Listener::bind(reactor, SocketAddr::new(ip, 0), 1).unwrap();
    listener.local_addr()
}

/// The connection is refused: an error naming the peer's answer (or the
/// refused TCP connection under iWARP), well before the timeout, never a
/// hang.
async fn refused<R: Reactor + Clone + 'static>(reactor: R, ip: IpAddr) {
    let dst = closed_port(&reactor, ip);
    let opts = opts();
    let start = Instant::now();
    let e = Connection::connect(&reactor, dst, &opts)
        .await
        .expect_err("nobody listens");
    let took = start.elapsed();
    // RoCE: the peer's CM answers REJECTED; siw: its TCP connection is
    // refused, and rdma_connect itself fails.
    let answered = matches!(
        &e,
        Error::CmEvent {
            event: CmEventType::Rejected | CmEventType::Unreachable | CmEventType::ConnectError,
            ..
        }
    );
    assert!(
        answered || e.errno() == Some(libc::ECONNREFUSED),
        "not the peer's refusal: {e}"
    );
    assert!(took < opts.timeout, "refused after {took:?}: {e}");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn tokio_connect_to_a_port_nobody_listens_on_fails_without_waiting() {
    on_tokio("the refusal", refused(Tokio, roce_ip()));
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_async_io_connect_to_a_port_nobody_listens_on_fails_without_waiting() {
    on_async_io("the refusal", refused(AsyncIo, iwarp_ip()));
}

/// A source port that a TCP socket holds, given in `ConnectOptions::src`:
/// on iWARP the connection's TCP connection cannot take it, and the
/// caller's port is kept, so the connect fails naming `rdma_connect` and
/// `EADDRINUSE` at once (a port the connection manager chose would be
/// replaced instead).
async fn from_a_held_source_port<R: Reactor + Clone + 'static>(reactor: R, ip: IpAddr) {
    let listener = Listener::bind(&reactor, SocketAddr::new(ip, 0), 1).unwrap();
    let tcp = std::net::TcpListener::bind(SocketAddr::new(ip, 0)).unwrap();
    let opts = ConnectOptions {
        src: Some(tcp.local_addr().unwrap()),
        ..opts()
    };
    let e = Connection::connect(&reactor, listener.local_addr(), &opts)
        .await
        .expect_err("the source port is TCP's");
    assert_eq!(e.verb(), Some("rdma_connect"), "{e}");
    assert_eq!(e.errno(), Some(libc::EADDRINUSE), "{e}");
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_tokio_connect_from_a_given_source_port_held_by_tcp_names_it() {
    on_tokio("the held port", from_a_held_source_port(Tokio, iwarp_ip()));
}

/// `n` clients at once, each in a task of its own (spawned: the futures
/// are `Send`); the server takes each request with `incoming`, posts the
/// receive on the pending connection, and finishes each handshake in a
/// task of its own. Each client sends its number and gets it back plus
/// one. Small queues: siw holds at most 144 queue pages per process.
async fn many(ip: IpAddr, n: u64) {
    let opts = ConnectOptions {
        max_send_wr: 4,
        max_recv_wr: 4,
        cqe: 16,
        ..opts()
    };
    let mut listener = tokio_rt::listen(SocketAddr::new(ip, 0), 64).unwrap();
    let addr = listener.local_addr();
    let server_opts = opts.clone();
    let server = tokio::spawn(async move {
        let mut served = tokio::task::JoinSet::new();
        for _ in 0..n {
            let mut pending = listener.incoming(&server_opts).await.unwrap();
            let k = u64::from_be_bytes(pending.peer_private_data()[..8].try_into().unwrap());
            let buf = pending.pd().alloc_mr(64, LW).unwrap();
            pending
                .qp()
                .post_recv(k, buf)
                .map_err(PostError::drop_buffers)
                .unwrap();
            served.spawn(async move {
                let mut conn = pending.accept(&ConnParam::default()).await.unwrap();
                let mut cs = completions(&mut conn, 1).await;
                let got = received(&mut cs, k);
                let v = u64::from_be_bytes(got.try_into().unwrap()) + 1;
                post_send(&mut conn, v, &v.to_be_bytes());
                completions(&mut conn, 1).await;
                conn.disconnected().await.unwrap();
                k
            });
        }
        let mut done = Vec::new();
        while let Some(k) = served.join_next().await {
            done.push(k.unwrap());
        }
        done.sort_unstable();
        done
    });
    let mut clients = tokio::task::JoinSet::new();
    for k in 0..n {
        let opts = ConnectOptions {
            conn_param: ConnParam::with_private_data(&k.to_be_bytes()),
            ..opts.clone()
        };
        clients.spawn(async move {
            let mut conn =
                Connection::connect_with(&Tokio, addr, &opts, |qp, pd| post_recv(qp, pd, 1000 + k))
                    .await
                    .unwrap();
            post_send(&mut conn, k, &k.to_be_bytes());
            let mut cs = completions(&mut conn, 2).await;
            let got = received(&mut cs, 1000 + k);
            assert_eq!(u64::from_be_bytes(got.try_into().unwrap()), k + 1);
            conn.disconnect().await.unwrap();
            k
        });
    }
    let mut done = Vec::new();
    while let Some(k) = clients.join_next().await {
        done.push(k.unwrap());
    }
    done.sort_unstable();
    let all: Vec<u64> = (0..n).collect();
    assert_eq!(done, all, "every client got its answer");
    assert_eq!(server.await.unwrap(), all, "every connection served");
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn tokio_sixteen_clients_at_once_on_one_listener() {
    on_tokio("16 clients", many(roce_ip(), 16));
}

#[test]
#[ignore = "needs an iWARP device (RDMA_TEST_IWARP_DEVICE)"]
fn iwarp_tokio_sixteen_clients_at_once_on_one_listener() {
    on_tokio("16 clients", many(iwarp_ip(), 16));
}

struct Noop;
impl std::task::Wake for Noop {
    fn wake(self: std::sync::Arc<Self>) {}
}

/// An accept dropped while it waits for a request loses nothing: the
/// request that comes next waits in the listener's mailbox for the next
/// accept.
#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn tokio_a_dropped_accept_loses_no_request() {
    on_tokio("the accept after a dropped one", async {
        let ip = roce_ip();
        let mut listener = tokio_rt::listen(SocketAddr::new(ip, 0), 16).unwrap();
        let addr = listener.local_addr();
        let opts = opts();
        {
            let waker = std::task::Waker::from(std::sync::Arc::new(Noop));
            let mut f = std::pin::pin!(listener.accept(&opts));
            let polled = f.as_mut().poll(&mut std::task::Context::from_waker(&waker));
            assert!(polled.is_pending(), "no client yet");
        }
        let (server, client) =
            futures_lite::future::zip(listener.accept(&opts), tokio_rt::connect(addr, &opts)).await;
        let (mut server, mut client) = (server.unwrap(), client.unwrap());
        assert_eq!(server.peer_addr(), client.local_addr());
        let (a, p) = futures_lite::future::zip(client.disconnect(), server.disconnected()).await;
        a.unwrap();
        p.unwrap();
    });
}

/// A client that sends its request and never finishes the handshake: it
/// takes `CONNECT_RESPONSE` and does not establish (no RTU goes out), so
/// the server's `ESTABLISHED` never comes. Returns what must outlive the
/// server's wait.
async fn silent_client(reactor: &dyn Reactor, dst: SocketAddr) -> impl Sized {
    let t = Duration::from_secs(5);
    let cm = CmChannel::new(&EventChannel::new().unwrap(), reactor).unwrap();
    let mut id = cm.create_id(PortSpace::Tcp).unwrap();
    id.resolve_addr(None, dst, t).await.unwrap();
    id.resolve_route(t).await.unwrap();
    let ctx = id.id().context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None, 0).unwrap();
    let qp = pd.qp_builder(QpType::Rc, &cq, &cq).build().unwrap();
    id.id().connect_qp(&qp, &ConnParam::default()).unwrap();
    let e = id.next_event().await.unwrap();
    assert_eq!(e.event_type(), CmEventType::ConnectResponse, "{e:?}");
    drop(e);
    (qp, cq, pd, id)
}

/// The accept's wait for `ESTABLISHED` ends at `ConnectOptions::timeout`
/// with `ETIMEDOUT` (the timer on the reactor: no runtime timer), long
/// before the CM's own REP retries give up (seconds each).
async fn accept_times_out<R: Reactor + Clone + 'static>(reactor: R) {
    let ip = roce_ip();
    let mut listener = Listener::bind(&reactor, SocketAddr::new(ip, 0), 4).unwrap();
    let addr = listener.local_addr();
    let opts = ConnectOptions {
        timeout: Duration::from_secs(1),
        ..ConnectOptions::default()
    };
    let server = async {
        let pending = listener.incoming(&opts).await.unwrap();
        let start = Instant::now();
        let e = pending
            .accept(&ConnParam::default())
            .await
            .expect_err("the client never establishes");
        (e, start.elapsed())
    };
    let ((e, took), client) =
        futures_lite::future::zip(server, silent_client(&reactor, addr)).await;
    assert_eq!(e.errno(), Some(libc::ETIMEDOUT), "{e}");
    assert!(e.to_string().contains("ESTABLISHED"), "{e}");
    assert!(
        took >= opts.timeout && took < opts.timeout * 3,
        "timed out after {took:?}"
    );
    drop(client);
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn tokio_an_accept_whose_client_never_establishes_times_out_at_the_bound() {
    on_tokio("the bounded accept", accept_times_out(Tokio));
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn async_io_an_accept_whose_client_never_establishes_times_out_at_the_bound() {
    on_async_io("the bounded accept", accept_times_out(AsyncIo));
}
