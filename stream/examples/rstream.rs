//! rdma-core's `rstream` over this crate, with its flags and its output, so
//! that the C tool and this one can take either role:
//!
//! ```text
//! rstream [-s server_address] [-b bind_address] [-f address_format]
//!         [-B buffer_size] [-i inline_size] [-I iterations] [-C transfer_count]
//!         [-S transfer_size or all] [-p port_number] [-k keepalive_time]
//!         [-T test_option]   s (TCP sockets), a (async), b (blocking),
//!                            n (nonblocking), v (verify)
//! ```
//!
//! Without `-s` it serves; with it, it connects. Without `-I`, `-C` or `-S N`
//! it runs rstream's latency series then its bandwidth series, reconnecting
//! in between; with them, one custom test.

#[cfg(feature = "tokio")]
use std::io;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context as _};
use rdma_stream::{RdmaListener, RdmaStream};

mod common;

use common::perf::{self, addr, retry, size_to_count, Extra, Pattern, PerfArgs, TEST_SIZES};

/// rstream's flags: the common ones (`common::perf`) and `-T s`.
#[derive(Debug, Clone)]
struct Args {
    perf: PerfArgs,
    /// `-T s`: TCP sockets.
    sockets: bool,
}

const USAGE: &str = "usage: rstream
\t[-s server_address]
\t[-b bind_address]
\t[-f address_format]
\t    name, ip, ipv6, or gid
\t[-B buffer_size]
\t[-i inline_size]
\t[-I iterations]
\t[-C transfer_count]
\t[-S transfer_size or all]
\t[-p port_number]
\t[-k keepalive_time]
\t[-T test_option]
\t    s|sockets - use standard tcp/ip sockets
\t    a|async - asynchronous operation (use poll)
\t    b|blocking - use blocking calls
\t    n|nonblocking - use nonblocking calls
\t    v|verify - verify data";

fn parse(argv: &[String]) -> anyhow::Result<Args> {
    let mut sockets = false;
    let perf = perf::parse("rstream", argv, USAGE, "sbfBiICSpkT", |extra| {
        Ok(match extra {
            Extra::Flag('k', _) => {
                eprintln!("rstream: -k (keepalive) is accepted and not used");
                true
            }
            Extra::Test(o) if o.starts_with('s') => {
                sockets = true;
                true
            }
            Extra::Test(o) if o.starts_with('r') => true,
            Extra::Test(o) if o.starts_with('f') => bail!("-T f (fork) is not supported"),
            _ => false,
        })
    })?;
    Ok(Args { perf, sockets })
}

/// A connected stream of either kind.
trait Conn: Read + Write {
    fn close(&mut self);
}

impl Conn for RdmaStream {
    fn close(&mut self) {
        let _ = self.shutdown(Shutdown::Both);
    }
}

impl Conn for TcpStream {
    fn close(&mut self) {
        let _ = self.shutdown(Shutdown::Both);
    }
}

enum Listener {
    Rdma(RdmaListener),
    Tcp(TcpListener),
    #[cfg(feature = "tokio")]
    Async(
        std::rc::Rc<tokio::runtime::Runtime>,
        rdma_stream::aio::RdmaListener,
    ),
}

/// `-T a`: the async stream, each call run to completion on a
/// current-thread tokio runtime (the loop stays the same as the others').
/// A call is polled once before it goes to the runtime, as an `.await` in
/// a task is: one that is done at once (the stream's busy poll found what
/// it waited for) costs no `block_on`, whose entry alone reads the clock
/// (a system call in a TCG guest) and whose waker wakes the runtime
/// through its eventfd.
#[cfg(feature = "tokio")]
struct AsyncConn {
    /// The runtime whose reactor the stream is registered with.
    rt: std::rc::Rc<tokio::runtime::Runtime>,
    s: rdma_stream::aio::RdmaStream,
    /// For the first poll: a call that is not done then is polled again
    /// in `block_on`, which registers its own waker.
    first: std::task::Waker,
}

#[cfg(feature = "tokio")]
impl AsyncConn {
    fn new(rt: std::rc::Rc<tokio::runtime::Runtime>, s: rdma_stream::aio::RdmaStream) -> Self {
        struct Nobody;
        impl std::task::Wake for Nobody {
            fn wake(self: std::sync::Arc<Self>) {}
        }
        AsyncConn {
            rt,
            s,
            first: std::sync::Arc::new(Nobody).into(),
        }
    }

    /// `op` polled once, then, if not done, run to completion on the runtime.
    fn call<T>(
        &self,
        mut op: impl FnMut(
            &rdma_stream::aio::RdmaStream,
            &mut std::task::Context<'_>,
        ) -> std::task::Poll<T>,
    ) -> T {
        let s = &self.s;
        if let std::task::Poll::Ready(v) = op(s, &mut std::task::Context::from_waker(&self.first)) {
            return v;
        }
        self.rt.block_on(std::future::poll_fn(|cx| op(s, cx)))
    }
}

#[cfg(feature = "tokio")]
impl Read for AsyncConn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.call(|s, cx| s.poll_read_bytes(cx, buf))
    }
}

#[cfg(feature = "tokio")]
impl Write for AsyncConn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.call(|s, cx| s.poll_write_bytes(cx, buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(feature = "tokio")]
impl Conn for AsyncConn {
    fn close(&mut self) {
        let s = &self.s;
        let _ = self
            .rt
            .block_on(std::future::poll_fn(|cx| s.poll_shutdown_write(cx)));
    }
}

#[cfg(feature = "tokio")]
fn runtime() -> anyhow::Result<std::rc::Rc<tokio::runtime::Runtime>> {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map(std::rc::Rc::new)
        .context("tokio runtime")
}

struct Test<'a> {
    args: &'a Args,
    buf: Vec<u8>,
    pattern: Pattern,
}

impl Test<'_> {
    fn send(&mut self, c: &mut dyn Conn, size: usize) -> anyhow::Result<()> {
        if self.args.perf.verify {
            let b = &mut self.buf[..size];
            self.pattern.fill(b);
        }
        let mut off = 0;
        while off < size {
            let n = retry(|| c.write(&self.buf[off..size])).context("rsend")?;
            if n == 0 {
                bail!("rsend: the stream took no bytes");
            }
            off += n;
        }
        Ok(())
    }

    fn recv(&mut self, c: &mut dyn Conn, size: usize) -> anyhow::Result<()> {
        let mut off = 0;
        while off < size {
            let n = retry(|| c.read(&mut self.buf[off..size])).context("rrecv")?;
            if n == 0 {
                bail!("rrecv: the peer closed the stream");
            }
            off += n;
        }
        if self.args.perf.verify {
            self.pattern.check(&self.buf[..size])?;
        }
        Ok(())
    }

    /// rstream's `run_test`: a 16-byte handshake, then `iterations` rounds
    /// of `count` transfers each way.
    fn run(
        &mut self,
        c: &mut dyn Conn,
        name: &str,
        size: usize,
        count: usize,
        iters: usize,
    ) -> anyhow::Result<()> {
        let client = self.args.perf.dst.is_some();
        if client {
            self.send(c, 16)?;
            self.recv(c, 16)?;
        } else {
            self.recv(c, 16)?;
            self.send(c, 16)?;
        }
        let start = Instant::now();
        for _ in 0..iters {
            for _ in 0..count {
                if client {
                    self.send(c, size)?;
                } else {
                    self.recv(c, size)?;
                }
            }
            for _ in 0..count {
                if client {
                    self.recv(c, size)?;
                } else {
                    self.send(c, size)?;
                }
            }
        }
        perf::result(name, size, count, iters, start.elapsed());
        Ok(())
    }
}

fn listen(a: &Args) -> anyhow::Result<Listener> {
    let host = a.perf.src.as_deref().unwrap_or("0.0.0.0");
    let at = addr(host, &a.perf.port)?;
    if a.sockets {
        TcpListener::bind(at).map(Listener::Tcp).context("bind")
    } else if a.perf.async_io {
        #[cfg(feature = "tokio")]
        {
            let rt = runtime()?;
            let l = rt
                .block_on(async {
                    rdma_stream::aio::RdmaListener::bind(
                        &rdma::aio::tokio_rt::Tokio,
                        at,
                        perf::options(&a.perf, true),
                    )
                })
                .context("rbind")?;
            Ok(Listener::Async(rt, l))
        }
        #[cfg(not(feature = "tokio"))]
        bail!("-T a needs this example built with the `tokio` feature")
    } else {
        RdmaListener::bind_with(at, perf::options(&a.perf, true))
            .map(Listener::Rdma)
            .context("rbind")
    }
}

fn connect(a: &Args, l: Option<&mut Listener>, latency: bool) -> anyhow::Result<Box<dyn Conn>> {
    match (l, &a.perf.dst) {
        (Some(Listener::Tcp(l)), _) => {
            let (s, _) = l.accept().context("accept")?;
            let _ = s.set_nodelay(true);
            Ok(Box::new(s))
        }
        #[cfg(feature = "tokio")]
        (Some(Listener::Async(rt, l)), _) => {
            let (s, _) = rt.block_on(l.accept()).context("raccept")?;
            Ok(Box::new(AsyncConn::new(std::rc::Rc::clone(rt), s)))
        }
        (Some(Listener::Rdma(l)), _) => {
            let (s, _) = l.accept().context("raccept")?;
            s.set_nonblocking(a.perf.nonblocking)
                .context("set_nonblocking")?;
            Ok(Box::new(s))
        }
        (None, Some(dst)) => {
            let to = addr(dst, &a.perf.port)?;
            if a.sockets {
                let s = TcpStream::connect(to).context("connect")?;
                let _ = s.set_nodelay(true);
                Ok(Box::new(s))
            } else if a.perf.async_io {
                #[cfg(feature = "tokio")]
                {
                    let rt = runtime()?;
                    let s = rt
                        .block_on(rdma_stream::aio::RdmaStream::connect(
                            &rdma::aio::tokio_rt::Tokio,
                            to,
                            &perf::options(&a.perf, latency),
                        ))
                        .context("rconnect")?;
                    Ok(Box::new(AsyncConn::new(rt, s)))
                }
                #[cfg(not(feature = "tokio"))]
                bail!("-T a needs this example built with the `tokio` feature")
            } else {
                let s = RdmaStream::connect_with(to, &perf::options(&a.perf, latency))
                    .context("rconnect")?;
                s.set_nonblocking(a.perf.nonblocking)
                    .context("set_nonblocking")?;
                Ok(Box::new(s))
            }
        }
        (None, None) => unreachable!("a server has a listener"),
    }
}

fn run(a: &Args) -> anyhow::Result<()> {
    let mut listener = if a.perf.dst.is_none() {
        Some(listen(a)?)
    } else {
        None
    };
    let largest = if a.perf.custom {
        a.perf.transfer_size
    } else {
        TEST_SIZES[TEST_SIZES.len() - 1].0
    };
    let mut t = Test {
        args: a,
        buf: vec![0; largest.max(16)],
        pattern: Pattern::default(),
    };
    perf::header();
    if a.perf.custom {
        let mut c = connect(a, listener.as_mut(), true)?;
        t.run(
            &mut *c,
            "custom",
            a.perf.transfer_size,
            a.perf.transfer_count,
            a.perf.iterations,
        )?;
        c.close();
        return Ok(());
    }
    for latency in [true, false] {
        let mut c = connect(a, listener.as_mut(), latency)?;
        for &(size, extra) in TEST_SIZES {
            if extra && !a.perf.all_sizes {
                continue;
            }
            let name = perf::series_name(size, latency);
            let (count, iters) = if latency {
                (1, size_to_count(size))
            } else {
                (size_to_count(size), 1)
            };
            t.run(&mut *c, &name, size, count, iters)?;
        }
        c.close();
    }
    Ok(())
}

fn main() -> ExitCode {
    env_logger::init();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    common::exit("rstream", parse(&argv).and_then(|a| run(&a)))
}
