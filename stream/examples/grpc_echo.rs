//! gRPC over RDMA: a tonic Echo service whose HTTP/2 connections are
//! [`rdma_stream::aio::RdmaStream`]s (rsocket's protocol), or TCP with
//! `--tcp`, for a comparison.
//!
//! ```text
//! grpc_echo --listen ADDR:PORT [--once] [--tcp]
//!     serve until killed (--once: until the first client disconnects);
//!     says "grpc_echo: listening on ADDR:PORT (rdma|tcp)" on stdout when it
//!     listens (port 0: a free port, the one printed)
//! grpc_echo --connect ADDR:PORT [--count N] [--size BYTES] [--stream-size BYTES] [--tcp]
//!     N unary calls of BYTES (64) each, then one server-streaming call of N
//!     messages of --stream-size BYTES (65536); every payload is checked; prints
//!     calls/s (and a call's min, median and p99 time) and MB/s (10^6 bytes),
//!     exits 0 only when everything verified
//! ```
//!
//! The messages and the service glue are written by hand (what tonic-build
//! would generate from the proto below), so nothing needs `protoc` or a build
//! script. The server hands tonic's `serve_with_incoming` a stream of
//! accepted connections wrapped in [`Conn`], which implements tonic's
//! `Connected`; the client gives `Endpoint::connect_with_connector` a
//! `tower::service_fn` that opens an `RdmaStream`, wrapped in hyper-util's
//! `TokioIo`.
//!
//! ```proto
//! syntax = "proto3";
//! package echo;
//! service Echo {
//!   rpc Echo(EchoRequest) returns (EchoReply);
//!   rpc Stream(StreamRequest) returns (stream EchoReply);
//! }
//! message EchoRequest { uint64 seq = 1; bytes payload = 2; }
//! message EchoReply { uint64 seq = 1; bytes payload = 2; }
//! message StreamRequest { uint32 count = 1; uint32 size = 2; }
//! ```

use std::convert::Infallible;
use std::error::Error;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::process::ExitCode;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use hyper_util::rt::TokioIo;
use prost::bytes::Bytes;
use rdma::aio::tokio_rt::Tokio;
use rdma_stream::aio::{RdmaListener, RdmaStream};
use rdma_stream::Options;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::body::Body;
use tonic::codec::ProstCodec;
use tonic::codegen::http::{self, uri::PathAndQuery, Uri};
use tonic::codegen::{BoxFuture, BoxStream, Service};
use tonic::server::NamedService;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

mod common;

const USAGE: &str = "usage: grpc_echo --listen ADDR:PORT [--once] [--tcp]
       grpc_echo --connect ADDR:PORT [--count N] [--size BYTES] [--stream-size BYTES] [--tcp]";

/// The largest payload: under tonic's default limit of 4 MiB a message.
const MAX_PAYLOAD: usize = 4_000_000;
/// Payloads are windows of one pattern, `i % PERIOD` at byte `i`, starting
/// at `seq % PERIOD`: a prime, so a shifted or misplaced payload differs.
const PERIOD: usize = 251;
/// Accept failures in a row after which the server gives up.
const ACCEPT_RETRIES: u32 = 10;

const ECHO_PATH: &str = "/echo.Echo/Echo";
const STREAM_PATH: &str = "/echo.Echo/Stream";

// The messages, as prost-build would write them for the proto above.

#[derive(Clone, PartialEq, prost::Message)]
struct EchoRequest {
    #[prost(uint64, tag = "1")]
    seq: u64,
    #[prost(bytes = "bytes", tag = "2")]
    payload: Bytes,
}

#[derive(Clone, PartialEq, prost::Message)]
struct EchoReply {
    #[prost(uint64, tag = "1")]
    seq: u64,
    #[prost(bytes = "bytes", tag = "2")]
    payload: Bytes,
}

#[derive(Clone, PartialEq, prost::Message)]
struct StreamRequest {
    #[prost(uint32, tag = "1")]
    count: u32,
    #[prost(uint32, tag = "2")]
    size: u32,
}

/// The pattern payloads are cut from: `len + PERIOD` bytes.
fn pattern(len: usize) -> Bytes {
    (0..len + PERIOD).map(|i| (i % PERIOD) as u8).collect()
}

/// Payload `seq` of `len` bytes, a window of `pattern(len)` (no copy).
fn payload(pattern: &Bytes, seq: u64, len: usize) -> Bytes {
    let start = (seq % PERIOD as u64) as usize;
    pattern.slice(start..start + len)
}

// The server side: the handlers, then the glue tonic-build would generate
// (a `Service` that routes by path, and its gRPC name).

async fn echo(req: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
    let EchoRequest { seq, payload } = req.into_inner();
    Ok(Response::new(EchoReply { seq, payload }))
}

async fn stream(req: Request<StreamRequest>) -> Result<Response<BoxStream<EchoReply>>, Status> {
    let StreamRequest { count, size } = req.into_inner();
    let size = size as usize;
    if size > MAX_PAYLOAD {
        return Err(Status::invalid_argument(format!(
            "size {size} is over {MAX_PAYLOAD} bytes"
        )));
    }
    let pattern = pattern(size);
    // tonic's stream items are `Result<_, Status>`, whose size is not ours.
    #[allow(clippy::result_large_err)]
    let replies = (0..u64::from(count)).map(move |seq| {
        Ok(EchoReply {
            seq,
            payload: payload(&pattern, seq, size),
        })
    });
    Ok(Response::new(Box::pin(tokio_stream::iter(replies))))
}

/// The Echo service, as `echo_server::EchoServer` would be.
#[derive(Clone, Debug)]
struct EchoService;

impl NamedService for EchoService {
    const NAME: &'static str = "echo.Echo";
}

impl Service<http::Request<Body>> for EchoService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        // A codec per method: it encodes that method's reply, decodes its request.
        match req.uri().path() {
            ECHO_PATH => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
                Ok(grpc.unary(tower::service_fn(echo), req).await)
            }),
            STREAM_PATH => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
                Ok(grpc.server_streaming(tower::service_fn(stream), req).await)
            }),
            other => {
                let status = Status::unimplemented(format!("no method {other}"));
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

/// A connection the server hands tonic: an accepted stream with its
/// addresses (what `Request::remote_addr` reads), and a sender dropped with
/// it, which tells `--once` that the client is gone.
struct Conn<IO> {
    io: IO,
    info: TcpConnectInfo,
    _gone: oneshot::Sender<()>,
}

impl<IO> Connected for Conn<IO> {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.info.clone()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Conn<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Conn<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// What the server accepts from: an `RdmaListener`, or a `TcpListener`.
trait Accept: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    fn accept(
        &mut self,
    ) -> impl std::future::Future<Output = io::Result<(Self::Io, TcpConnectInfo)>> + Send;
}

impl Accept for RdmaListener {
    type Io = RdmaStream;

    async fn accept(&mut self) -> io::Result<(RdmaStream, TcpConnectInfo)> {
        let (s, peer) = RdmaListener::accept(self).await?;
        let info = TcpConnectInfo {
            local_addr: Some(s.local_addr()),
            remote_addr: Some(peer),
        };
        Ok((s, info))
    }
}

impl Accept for TcpListener {
    type Io = TcpStream;

    async fn accept(&mut self) -> io::Result<(TcpStream, TcpConnectInfo)> {
        let (s, peer) = TcpListener::accept(self).await?;
        s.set_nodelay(true)?;
        let info = TcpConnectInfo {
            local_addr: s.local_addr().ok(),
            remote_addr: Some(peer),
        };
        Ok((s, info))
    }
}

/// Accepts connections into `tx` (with `once`, one, and waits until tonic
/// dropped it); ends when tonic stops taking them or after
/// `ACCEPT_RETRIES` failures in a row.
async fn accept_loop<L: Accept>(
    mut listener: L,
    tx: mpsc::Sender<io::Result<Conn<L::Io>>>,
    once: bool,
) -> anyhow::Result<()> {
    let mut failures = 0;
    loop {
        let (io, info) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                eprintln!("grpc_echo: accepting a connection: {e}");
                failures += 1;
                if failures == ACCEPT_RETRIES {
                    bail!("{failures} accepts failed in a row, the last: {e}");
                }
                continue;
            }
        };
        failures = 0;
        let (gone_tx, gone_rx) = oneshot::channel();
        let conn = Conn {
            io,
            info,
            _gone: gone_tx,
        };
        if tx.send(Ok(conn)).await.is_err() {
            return Ok(());
        }
        if once {
            // An error here is the wanted news too: the sender was dropped.
            let _ = gone_rx.await;
            return Ok(());
        }
    }
}

async fn serve<L: Accept>(listener: L, once: bool) -> anyhow::Result<()> {
    let (tx, rx) = mpsc::channel(1);
    let acceptor = tokio::spawn(accept_loop(listener, tx, once));
    Server::builder()
        .add_service(EchoService)
        .serve_with_incoming(ReceiverStream::new(rx))
        .await
        .context("serving")?;
    // The incoming connections ended: the accept loop is done, and says why.
    acceptor.await.context("the accept task")?
}

async fn server(addr: SocketAddr, tcp: bool, once: bool) -> anyhow::Result<()> {
    let listening = |bound: SocketAddr, kind: &str| {
        // The line a script waits for before it starts a client.
        println!("grpc_echo: listening on {bound} ({kind})");
    };
    if tcp {
        let l = TcpListener::bind(addr)
            .await
            .with_context(|| format!("listening on {addr} (tcp)"))?;
        listening(l.local_addr().context("local_addr")?, "tcp");
        serve(l, once).await
    } else {
        let l = RdmaListener::bind(&Tokio, addr, Options::default())
            .with_context(|| format!("listening on {addr} (rdma)"))?;
        listening(l.local_addr(), "rdma");
        serve(l, once).await
    }
}

// The client side: the glue tonic-build would generate
// (`echo_client::EchoClient`), then the calls and their checks.

/// A client of the Echo service on a channel.
#[derive(Clone, Debug)]
struct EchoClient {
    inner: tonic::client::Grpc<Channel>,
}

impl EchoClient {
    async fn ready(&mut self) -> Result<(), Status> {
        self.inner
            .ready()
            .await
            .map_err(|e| Status::unknown(format!("service was not ready: {}", common::chain(&e))))
    }

    async fn echo(&mut self, req: EchoRequest) -> Result<Response<EchoReply>, Status> {
        self.ready().await?;
        let path = PathAndQuery::from_static(ECHO_PATH);
        self.inner
            .unary(Request::new(req), path, ProstCodec::default())
            .await
    }

    async fn stream(
        &mut self,
        req: StreamRequest,
    ) -> Result<Response<tonic::Streaming<EchoReply>>, Status> {
        self.ready().await?;
        let path = PathAndQuery::from_static(STREAM_PATH);
        self.inner
            .server_streaming(Request::new(req), path, ProstCodec::default())
            .await
    }
}

/// A channel over one connection to `addr`: an `RdmaStream`, or a
/// `TcpStream` with `tcp`.
async fn channel(addr: SocketAddr, tcp: bool) -> Result<Channel, tonic::transport::Error> {
    // The authority is only what HTTP/2 sends: the connectors ignore the URI.
    let endpoint =
        Endpoint::from_shared(format!("http://{addr}"))?.connect_timeout(Duration::from_secs(30));
    if tcp {
        let connector = tower::service_fn(move |_: Uri| async move {
            let s = TcpStream::connect(addr).await?;
            s.set_nodelay(true)?;
            Ok::<_, io::Error>(TokioIo::new(s))
        });
        endpoint.connect_with_connector(connector).await
    } else {
        let connector = tower::service_fn(move |_: Uri| async move {
            let s = RdmaStream::connect(&Tokio, addr, &Options::default()).await?;
            Ok::<_, io::Error>(TokioIo::new(s))
        });
        endpoint.connect_with_connector(connector).await
    }
}

async fn client(a: &ClientArgs) -> anyhow::Result<()> {
    let kind = if a.tcp { "tcp" } else { "rdma" };
    let ch = channel(a.addr, a.tcp)
        .await
        .with_context(|| format!("connecting to {} ({kind})", a.addr))?;
    let mut client = EchoClient {
        inner: tonic::client::Grpc::new(ch),
    };

    let unary_pattern = pattern(a.size);
    let mut times = Vec::with_capacity(a.count as usize);
    let start = Instant::now();
    for seq in 0..u64::from(a.count) {
        let call = Instant::now();
        let sent = payload(&unary_pattern, seq, a.size);
        let req = EchoRequest {
            seq,
            payload: sent.clone(),
        };
        let reply = client
            .echo(req)
            .await
            .map_err(|s| anyhow!("unary call {seq}: {}", status(&s)))?
            .into_inner();
        if reply.seq != seq || reply.payload != sent {
            bail!(
                "unary call {seq}: the reply (seq {}, {} B) is not the request ({} B)",
                reply.seq,
                reply.payload.len(),
                sent.len()
            );
        }
        times.push(call.elapsed());
    }
    let unary = start.elapsed();
    times.sort_unstable();
    let us = |q: usize| times[(times.len() - 1) * q / 100].as_micros();
    println!(
        "unary: {} calls of {} B in {:.3} s: {:.0} calls/s (µs per call: min {}, median {}, p99 {})",
        a.count,
        a.size,
        unary.as_secs_f64(),
        f64::from(a.count) / unary.as_secs_f64(),
        us(0),
        us(50),
        us(99)
    );

    let stream_pattern = pattern(a.stream_size);
    let start = Instant::now();
    let req = StreamRequest {
        count: a.count,
        size: a.stream_size as u32,
    };
    let mut replies = client
        .stream(req)
        .await
        .map_err(|s| anyhow!("the streaming call: {}", status(&s)))?
        .into_inner();
    let mut seq = 0u64;
    while let Some(reply) = replies
        .message()
        .await
        .map_err(|s| anyhow!("the streaming call, after {seq} messages: {}", status(&s)))?
    {
        if seq == u64::from(a.count) {
            bail!("the streaming call: more than {seq} messages");
        }
        if reply.seq != seq || reply.payload != payload(&stream_pattern, seq, a.stream_size) {
            bail!(
                "the streaming call: message {seq} (seq {}, {} B) is not the one expected ({} B)",
                reply.seq,
                reply.payload.len(),
                a.stream_size
            );
        }
        seq += 1;
    }
    if seq != u64::from(a.count) {
        bail!(
            "the streaming call ended after {seq} of {} messages",
            a.count
        );
    }
    let streamed = start.elapsed();
    let bytes = a.stream_size as f64 * f64::from(a.count);
    println!(
        "stream: {} messages of {} B in {:.3} s: {:.1} MB/s",
        a.count,
        a.stream_size,
        streamed.as_secs_f64(),
        bytes / streamed.as_secs_f64() / 1e6
    );
    println!(
        "verified: {} unary calls and {} streamed messages over {kind}",
        a.count, a.count
    );
    Ok(())
}

/// A status as its code and message, then its sources (tonic's `Display`
/// of a status also prints its empty details and metadata).
fn status(s: &Status) -> String {
    let mut text = format!("{:?}: {}", s.code(), s.message());
    if let Some(source) = s.source() {
        let more = common::chain(source);
        // The message is often the source's own text: said once.
        match more.strip_prefix(s.message()) {
            Some(rest) => text.push_str(rest),
            None => text = format!("{text}: {more}"),
        }
    }
    text
}

struct ClientArgs {
    addr: SocketAddr,
    count: u32,
    size: usize,
    stream_size: usize,
    tcp: bool,
}

enum Mode {
    Listen {
        addr: SocketAddr,
        tcp: bool,
        once: bool,
    },
    Connect(ClientArgs),
}

fn socket_addr(v: &str) -> anyhow::Result<SocketAddr> {
    v.to_socket_addrs()
        .with_context(|| format!("{v} (ADDR:PORT expected)"))?
        .next()
        .with_context(|| format!("{v} has no address"))
}

fn number<T: std::str::FromStr>(flag: &str, v: &str) -> anyhow::Result<T> {
    let Ok(n) = v.parse() else {
        bail!("{flag} takes a number, not {v:?}");
    };
    Ok(n)
}

fn size(flag: &str, v: &str) -> anyhow::Result<usize> {
    let n = number(flag, v)?;
    if n > MAX_PAYLOAD {
        bail!("{flag} {n} is over {MAX_PAYLOAD} bytes");
    }
    Ok(n)
}

/// The mode, or `None` for `-h`/`--help`.
fn parse(argv: &[String]) -> anyhow::Result<Option<Mode>> {
    let (mut listen, mut connect, mut tcp, mut once) = (None, None, false, false);
    let (mut count, mut size_b, mut stream_size) = (1000u32, 64, 65536);
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .map(String::as_str)
                .with_context(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--listen" => listen = Some(socket_addr(value()?)?),
            "--connect" => connect = Some(socket_addr(value()?)?),
            "--count" => count = number(flag, value()?)?,
            "--size" => size_b = size(flag, value()?)?,
            "--stream-size" => stream_size = size(flag, value()?)?,
            "--tcp" => tcp = true,
            "--once" => once = true,
            "-h" | "--help" => return Ok(None),
            other => bail!("unknown argument {other:?}"),
        }
    }
    match (listen, connect) {
        (Some(addr), None) => Ok(Some(Mode::Listen { addr, tcp, once })),
        (None, Some(addr)) if count == 0 => bail!("--count must be at least 1 ({addr})"),
        (None, Some(addr)) => Ok(Some(Mode::Connect(ClientArgs {
            addr,
            count,
            size: size_b,
            stream_size,
            tcp,
        }))),
        _ => bail!("one of --listen and --connect, please"),
    }
}

fn main() -> ExitCode {
    env_logger::init();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mode = match parse(&argv) {
        Ok(Some(m)) => m,
        Ok(None) => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
        Err(e) => {
            common::report("grpc_echo", &e);
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("grpc_echo: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        match mode {
            Mode::Listen { addr, tcp, once } => server(addr, tcp, once).await,
            Mode::Connect(a) => client(&a).await,
        }
    });
    common::exit("grpc_echo", result)
}
