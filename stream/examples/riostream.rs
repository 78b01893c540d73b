//! rdma-core's `riostream` over this crate, with its flags and its output,
//! so that the C tool and this one can take either role:
//!
//! ```text
//! riostream [-s server_address] [-b bind_address] [-f address_format]
//!           [-B buffer_size] [-i inline_size] [-I iterations]
//!           [-C transfer_count] [-S transfer_size or all] [-p port_number]
//!           [-T test_option]   a (async), b (blocking), n (nonblocking),
//!                              v (verify)
//! ```
//!
//! Without `-s` it serves; with it, it connects. Without `-I`, `-C` or
//! `-S N` it runs the latency series then the bandwidth series, reconnecting
//! in between; with them, one custom test.
//!
//! Each test is `riostream`'s: both sides map a buffer of the transfer size
//! at offset 0 for the peer to write (`riomap`, [`RdmaStream::iomap`]) and
//! swap 16 bytes over the stream (which carries the mappings' announcements
//! before them). Then, each iteration, the client writes its buffer
//! `count` times into the server's mapping (`riowrite`,
//! [`RdmaStream::iowrite`]), the last time with a marker in its last byte,
//! on which the server spins ([`RdmaStream::iomap_wait`]); then the server
//! does the same back. With `-T v` the bytes before the marker of each last
//! transfer carry the tools' pattern, checked on arrival. The stream
//! itself carries nothing but the 16 bytes.
//!
//! `-T a` runs the async stream (`aio::RdmaStream`) on a current-thread
//! tokio runtime, each call to completion (C's `rpoll` before each call);
//! it needs the `tokio` feature.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context as _};
use rdma::Buffer;
use rdma_stream::{IoMap, RdmaListener, RdmaStream};

mod common;

use common::perf::{self, addr, retry, size_to_count, Extra, Pattern, PerfArgs, TEST_SIZES};

const USAGE: &str = "usage: riostream
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
\t[-T test_option]
\t    a|async - asynchronous operation (use poll)
\t    b|blocking - use blocking calls
\t    n|nonblocking - use nonblocking calls
\t    v|verify - verify data";

fn parse(argv: &[String]) -> anyhow::Result<PerfArgs> {
    perf::parse("riostream", argv, USAGE, "sbfBiICSpT", |_: Extra<'_>| {
        Ok(false)
    })
}

/// What a test does with its connection: the stream's calls with the
/// tool's waits (the blocking stream's, or the async one's run to
/// completion).
trait Conn {
    /// `riomap` of `mem` at offset 0, waiting for a credit (C's `riomap`
    /// queues an announcement that finds none and sends it later).
    fn iomap(&self, mem: Vec<u8>) -> io::Result<IoMap>;
    fn iowrite(&self, buf: &[u8], offset: u64) -> io::Result<usize>;
    /// Until byte `at` of `map` is `value` (C's spin on `poll_byte`).
    fn iomap_wait(&self, map: &IoMap, at: usize, value: u8) -> io::Result<()>;
    fn iomap_read(&self, map: &IoMap, at: usize, out: &mut [u8]) -> io::Result<()>;
    fn iounmap(&self, map: IoMap) -> io::Result<Buffer>;
    fn send(&self, buf: &[u8]) -> io::Result<usize>;
    fn recv(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// `rshutdown(SHUT_RDWR)` and `rclose`.
    fn close(&self);
}

/// The blocking stream in the mode of `-T b` or `-T n`.
struct Blocking {
    s: RdmaStream,
    nonblocking: bool,
}

impl Blocking {
    /// `f` in blocking mode, then back in the tool's.
    fn blocking<T>(&self, f: impl FnOnce(&RdmaStream) -> io::Result<T>) -> io::Result<T> {
        self.s.set_nonblocking(false)?;
        let r = f(&self.s);
        self.s.set_nonblocking(self.nonblocking)?;
        r
    }
}

impl Conn for Blocking {
    fn iomap(&self, mem: Vec<u8>) -> io::Result<IoMap> {
        self.blocking(|s| s.iomap(mem, 0))
    }

    fn iowrite(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.s.iowrite(buf, offset)
    }

    fn iomap_wait(&self, map: &IoMap, at: usize, value: u8) -> io::Result<()> {
        // In blocking mode the wait also sees the connection manager's
        // events (a peer that went away).
        self.blocking(|s| s.iomap_wait(map, at, value, None))
    }

    fn iomap_read(&self, map: &IoMap, at: usize, out: &mut [u8]) -> io::Result<()> {
        self.s.iomap_read(map, at, out)
    }

    fn iounmap(&self, map: IoMap) -> io::Result<Buffer> {
        self.s.iounmap(map)
    }

    fn send(&self, buf: &[u8]) -> io::Result<usize> {
        (&self.s).write(buf)
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        (&self.s).read(buf)
    }

    fn close(&self) {
        let _ = self.s.shutdown(Shutdown::Both);
    }
}

/// `-T a`: the async stream, each call run to completion on a
/// current-thread tokio runtime.
#[cfg(feature = "tokio")]
struct Async {
    /// The runtime whose reactor the stream is registered with.
    rt: std::rc::Rc<tokio::runtime::Runtime>,
    s: rdma_stream::aio::RdmaStream,
}

#[cfg(feature = "tokio")]
impl Conn for Async {
    fn iomap(&self, mem: Vec<u8>) -> io::Result<IoMap> {
        self.rt.block_on(self.s.iomap(mem, 0))
    }

    fn iowrite(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.rt.block_on(self.s.iowrite(buf, offset))
    }

    fn iomap_wait(&self, map: &IoMap, at: usize, value: u8) -> io::Result<()> {
        self.rt.block_on(self.s.iomap_wait(map, at, value, None))
    }

    fn iomap_read(&self, map: &IoMap, at: usize, out: &mut [u8]) -> io::Result<()> {
        self.s.iomap_read(map, at, out)
    }

    fn iounmap(&self, map: IoMap) -> io::Result<Buffer> {
        self.s.iounmap(map)
    }

    fn send(&self, buf: &[u8]) -> io::Result<usize> {
        let s = &self.s;
        self.rt
            .block_on(std::future::poll_fn(|cx| s.poll_write_bytes(cx, buf)))
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        let s = &self.s;
        self.rt
            .block_on(std::future::poll_fn(|cx| s.poll_read_bytes(cx, buf)))
    }

    fn close(&self) {
        let s = &self.s;
        let _ = self
            .rt
            .block_on(std::future::poll_fn(|cx| s.poll_shutdown_write(cx)));
    }
}

/// The marker's value before any arrived (C's `*poll_byte = -1`): the
/// first ones awaited are 0 and 1, and every later one differs from it
/// until it has been overwritten.
const NO_MARKER: u8 = 0xFF;

/// One side's state across the tests of a run.
struct Test<'a> {
    args: &'a PerfArgs,
    client: bool,
    /// What this side writes into the peer's mapping (C writes from its
    /// mapped buffer itself; here the stream owns the mapped memory, so
    /// the bytes go from a buffer of their own).
    out: Vec<u8>,
    pattern: Pattern,
}

impl Test<'_> {
    /// `size` bytes over the stream itself (`send_msg`).
    fn send_msg(&self, s: &dyn Conn, size: usize) -> anyhow::Result<()> {
        let msg = vec![0; size];
        let mut off = 0;
        while off < size {
            let n = retry(|| s.send(&msg[off..])).context("rsend")?;
            if n == 0 {
                bail!("rsend: the stream took no bytes");
            }
            off += n;
        }
        Ok(())
    }

    /// `size` bytes from the stream itself (`recv_msg`).
    fn recv_msg(&self, s: &dyn Conn, size: usize) -> anyhow::Result<()> {
        let mut msg = vec![0; size];
        let mut off = 0;
        while off < size {
            let n = retry(|| s.recv(&mut msg[off..])).context("rrecv")?;
            if n == 0 {
                bail!("rrecv: the peer closed the stream");
            }
            off += n;
        }
        Ok(())
    }

    /// `out[..size]` into the peer's mapping at offset 0 (`send_xfer`).
    fn send_xfer(&self, s: &dyn Conn, size: usize) -> anyhow::Result<()> {
        let mut off = 0;
        while off < size {
            let n = retry(|| s.iowrite(&self.out[off..size], off as u64)).context("riowrite")?;
            if n == 0 {
                bail!("riowrite: the stream took no bytes");
            }
            off += n;
        }
        Ok(())
    }

    /// `count` transfers into the peer's mapping, the last with `marker`
    /// in its last byte (and the pattern before it with `-T v`).
    fn send_xfers(
        &mut self,
        s: &dyn Conn,
        size: usize,
        count: usize,
        marker: u8,
    ) -> anyhow::Result<()> {
        for _ in 1..count {
            self.send_xfer(s, size)?;
        }
        self.out[size - 1] = marker;
        if self.args.verify {
            self.pattern.fill(&mut self.out[..size - 1]);
        }
        self.send_xfer(s, size)
    }

    /// Spins until the peer's marker is in the last byte of `map`
    /// (`recv_xfer`), then checks the bytes before it with `-T v`.
    fn recv_xfer(&mut self, s: &dyn Conn, map: &IoMap, marker: u8) -> anyhow::Result<()> {
        let last = map.len() - 1;
        s.iomap_wait(map, last, marker)
            .with_context(|| format!("waiting for marker {marker}"))?;
        if self.args.verify {
            let mut got = vec![0; last];
            s.iomap_read(map, 0, &mut got)
                .context("reading the mapping")?;
            self.pattern.check(&got)?;
        }
        Ok(())
    }

    /// `riostream`'s `run_test`: map, sync, `iters` rounds of `count`
    /// transfers each way, the line, unmap.
    fn run(
        &mut self,
        s: &dyn Conn,
        name: &str,
        size: usize,
        count: usize,
        iters: usize,
    ) -> anyhow::Result<()> {
        let mut mem = vec![0; size];
        mem[size - 1] = NO_MARKER;
        let map = s.iomap(mem).context("riomap")?;
        self.out[size - 1] = NO_MARKER;
        if self.client {
            self.send_msg(s, 16)?;
            self.recv_msg(s, 16)?;
        } else {
            self.recv_msg(s, 16)?;
            self.send_msg(s, 16)?;
        }
        let start = Instant::now();
        let mut marker = 0u8;
        for _ in 0..iters {
            if self.client {
                self.send_xfers(s, size, count, marker)?;
                self.recv_xfer(s, &map, marker.wrapping_add(1))?;
            } else {
                self.recv_xfer(s, &map, marker)?;
                self.send_xfers(s, size, count, marker.wrapping_add(1))?;
            }
            marker = marker.wrapping_add(2);
        }
        perf::result(name, size, count, iters, start.elapsed());
        s.iounmap(map).context("riounmap")?;
        Ok(())
    }
}

/// Where connections come from: a listener of either stream, or `-s`.
enum Source {
    Blocking(RdmaListener),
    #[cfg(feature = "tokio")]
    Async(
        std::rc::Rc<tokio::runtime::Runtime>,
        rdma_stream::aio::RdmaListener,
    ),
    Connect(std::net::SocketAddr),
}

#[cfg(feature = "tokio")]
fn runtime() -> anyhow::Result<std::rc::Rc<tokio::runtime::Runtime>> {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map(std::rc::Rc::new)
        .context("tokio runtime")
}

fn source(a: &PerfArgs) -> anyhow::Result<Source> {
    if let Some(dst) = &a.dst {
        return Ok(Source::Connect(addr(dst, &a.port)?));
    }
    let host = a.src.as_deref().unwrap_or("0.0.0.0");
    let at = addr(host, &a.port)?;
    if a.async_io {
        #[cfg(feature = "tokio")]
        {
            let rt = runtime()?;
            let l = rt
                .block_on(async {
                    rdma_stream::aio::RdmaListener::bind(
                        &rdma::aio::tokio_rt::Tokio,
                        at,
                        options(a, true),
                    )
                })
                .context("rbind")?;
            return Ok(Source::Async(rt, l));
        }
        #[cfg(not(feature = "tokio"))]
        bail!("-T a needs this example built with the `tokio` feature")
    }
    Ok(Source::Blocking(
        RdmaListener::bind_with(at, options(a, true)).context("rbind")?,
    ))
}

/// The tools' options (`set_options`), and a direct-placement table of
/// one entry, as riostream sets `RDMA_IOMAPSIZE` (it maps one buffer at a
/// time).
fn options(a: &PerfArgs, latency: bool) -> rdma_stream::Options {
    let mut o = perf::options(a, latency);
    o.sizes.iomap_entries = 1;
    o
}

/// The next connection.
fn connect(a: &PerfArgs, from: &mut Source, latency: bool) -> anyhow::Result<Box<dyn Conn>> {
    let blocking = |s: RdmaStream| -> anyhow::Result<Box<dyn Conn>> {
        s.set_nonblocking(a.nonblocking)
            .context("set_nonblocking")?;
        Ok(Box::new(Blocking {
            s,
            nonblocking: a.nonblocking,
        }))
    };
    match from {
        Source::Blocking(l) => blocking(l.accept().context("raccept")?.0),
        #[cfg(feature = "tokio")]
        Source::Async(rt, l) => {
            let (s, _) = rt.block_on(l.accept()).context("raccept")?;
            Ok(Box::new(Async {
                rt: std::rc::Rc::clone(rt),
                s,
            }))
        }
        Source::Connect(to) if a.async_io => {
            #[cfg(feature = "tokio")]
            {
                let rt = runtime()?;
                let s = rt
                    .block_on(rdma_stream::aio::RdmaStream::connect(
                        &rdma::aio::tokio_rt::Tokio,
                        *to,
                        &options(a, latency),
                    ))
                    .context("rconnect")?;
                Ok(Box::new(Async { rt, s }))
            }
            #[cfg(not(feature = "tokio"))]
            {
                // Read only by the async connect (Rust 1.83 warns otherwise).
                let _ = to;
                bail!("-T a needs this example built with the `tokio` feature")
            }
        }
        Source::Connect(to) => {
            blocking(RdmaStream::connect_with(*to, &options(a, latency)).context("rconnect")?)
        }
    }
}

fn run(a: &PerfArgs) -> anyhow::Result<()> {
    let mut from = source(a)?;
    let largest = if a.custom {
        a.transfer_size
    } else {
        TEST_SIZES[TEST_SIZES.len() - 1].0
    };
    let mut t = Test {
        args: a,
        client: a.dst.is_some(),
        out: vec![0; largest],
        pattern: Pattern::default(),
    };
    perf::header();
    if a.custom {
        let s = connect(a, &mut from, true)?;
        t.run(
            &*s,
            "custom",
            a.transfer_size,
            a.transfer_count,
            a.iterations,
        )?;
        s.close();
        return Ok(());
    }
    for latency in [true, false] {
        let s = connect(a, &mut from, latency)?;
        for &(size, extra) in TEST_SIZES {
            if extra && !a.all_sizes {
                continue;
            }
            let (count, iters) = if latency {
                (1, size_to_count(size))
            } else {
                (size_to_count(size), 1)
            };
            t.run(&*s, &perf::series_name(size, latency), size, count, iters)?;
        }
        s.close();
    }
    Ok(())
}

fn main() -> ExitCode {
    env_logger::init();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    common::exit("riostream", parse(&argv).and_then(|a| run(&a)))
}
