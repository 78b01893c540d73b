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

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context as _};
use rdma_stream::{Options, RdmaListener, RdmaStream};

mod common;

/// rstream's sizes: (size, shown only with `-S all`).
const TEST_SIZES: &[(usize, bool)] = &[
    (1 << 6, false),
    (1 << 7, true),
    ((1 << 7) + (1 << 6), true),
    (1 << 8, true),
    ((1 << 8) + (1 << 7), true),
    (1 << 9, true),
    ((1 << 9) + (1 << 8), true),
    (1 << 10, true),
    ((1 << 10) + (1 << 9), true),
    (1 << 11, true),
    ((1 << 11) + (1 << 10), true),
    (1 << 12, false),
    ((1 << 12) + (1 << 11), true),
    (1 << 13, true),
    ((1 << 13) + (1 << 12), true),
    (1 << 14, true),
    ((1 << 14) + (1 << 13), true),
    (1 << 15, true),
    ((1 << 15) + (1 << 14), true),
    (1 << 16, false),
    ((1 << 16) + (1 << 15), true),
    (1 << 17, true),
    ((1 << 17) + (1 << 16), true),
    (1 << 18, true),
    ((1 << 18) + (1 << 17), true),
    (1 << 19, true),
    ((1 << 19) + (1 << 18), true),
    (1 << 20, false),
    ((1 << 20) + (1 << 19), true),
    (1 << 21, true),
    ((1 << 21) + (1 << 20), true),
    (1 << 22, true),
    ((1 << 22) + (1 << 21), true),
];

#[derive(Debug, Clone)]
struct Args {
    dst: Option<String>,
    src: Option<String>,
    port: String,
    buffer_size: usize,
    inline_size: u32,
    iterations: usize,
    transfer_count: usize,
    transfer_size: usize,
    custom: bool,
    all_sizes: bool,
    sockets: bool,
    nonblocking: bool,
    /// `-T a`: the async stream, on a tokio runtime.
    async_io: bool,
    verify: bool,
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

fn number(flag: char, v: &str) -> anyhow::Result<usize> {
    let Ok(n) = v.parse() else {
        bail!("-{flag} takes a number, not {v:?}\n{USAGE}");
    };
    Ok(n)
}

fn parse(argv: &[String]) -> anyhow::Result<Args> {
    let mut a = Args {
        dst: None,
        src: None,
        port: "7471".into(),
        buffer_size: 0,
        inline_size: 64,
        iterations: 1,
        transfer_count: 1000,
        transfer_size: 1000,
        custom: false,
        all_sizes: false,
        sockets: false,
        async_io: false,
        // rstream's default is MSG_DONTWAIT with a spin; `-T b` blocks.
        nonblocking: true,
        verify: false,
    };
    let mut i = 0;
    while i < argv.len() {
        let flag = argv[i].strip_prefix('-').and_then(|f| {
            let mut c = f.chars();
            c.next().map(|first| (first, c.as_str().to_owned()))
        });
        let Some((f, glued)) = flag else {
            bail!("unexpected argument {:?}\n{USAGE}", argv[i]);
        };
        let value = if "sbfBiICSpkT".contains(f) {
            if glued.is_empty() {
                i += 1;
                argv.get(i)
                    .cloned()
                    .with_context(|| format!("-{f} needs a value\n{USAGE}"))?
            } else {
                glued
            }
        } else {
            bail!("unknown option -{f}\n{USAGE}");
        };
        match f {
            's' => a.dst = Some(value),
            'b' => a.src = Some(value),
            'f' => {
                if !value.to_ascii_lowercase().starts_with("ip") && value != "name" {
                    bail!("-f {value}: this rstream takes ip or name addresses");
                }
            }
            'B' => a.buffer_size = number(f, &value)?,
            'i' => a.inline_size = number(f, &value)? as u32,
            'I' => {
                a.custom = true;
                a.iterations = number(f, &value)?;
            }
            'C' => {
                a.custom = true;
                a.transfer_count = number(f, &value)?;
            }
            'S' => {
                if value.to_ascii_lowercase().starts_with("all") {
                    a.all_sizes = true;
                } else {
                    a.custom = true;
                    a.transfer_size = number(f, &value)?;
                }
            }
            'p' => a.port = value,
            'k' => eprintln!("rstream: -k (keepalive) is accepted and not used"),
            'T' => {
                for opt in value.split(',') {
                    let o = opt.to_ascii_lowercase();
                    match o.chars().next() {
                        Some('s') => a.sockets = true,
                        Some('a') => a.async_io = true,
                        Some('b') => a.nonblocking = false,
                        Some('n') => a.nonblocking = true,
                        Some('v') => a.verify = true,
                        Some('r') => {}
                        Some('f') => bail!("-T f (fork) is not supported"),
                        _ => bail!("unknown test option {opt:?}\n{USAGE}"),
                    }
                }
            }
            _ => unreachable!("checked above"),
        }
        i += 1;
    }
    if a.transfer_size == 0 || a.transfer_count == 0 || a.iterations == 0 {
        bail!("sizes and counts must be at least 1");
    }
    Ok(a)
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
#[cfg(feature = "tokio")]
struct AsyncConn {
    /// The runtime whose reactor the stream is registered with.
    rt: std::rc::Rc<tokio::runtime::Runtime>,
    s: rdma_stream::aio::RdmaStream,
}

#[cfg(feature = "tokio")]
impl Read for AsyncConn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let s = &self.s;
        self.rt
            .block_on(std::future::poll_fn(|cx| s.poll_read_bytes(cx, buf)))
    }
}

#[cfg(feature = "tokio")]
impl Write for AsyncConn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let s = &self.s;
        self.rt
            .block_on(std::future::poll_fn(|cx| s.poll_write_bytes(cx, buf)))
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

/// The byte pattern of rstream's `-T v`: a counter that runs on across
/// transfers, one for what is sent and one for what is checked.
#[derive(Default)]
struct Pattern {
    next_sent: u8,
    next_seen: u8,
    seen: u64,
}

impl Pattern {
    fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.next_sent;
            self.next_sent = self.next_sent.wrapping_add(1);
        }
    }

    fn check(&mut self, buf: &[u8]) -> anyhow::Result<()> {
        for b in buf {
            if *b != self.next_seen {
                bail!("data verification failed byte {}", self.seen);
            }
            self.next_seen = self.next_seen.wrapping_add(1);
            self.seen += 1;
        }
        Ok(())
    }
}

struct Test<'a> {
    args: &'a Args,
    buf: Vec<u8>,
    pattern: Pattern,
}

fn retry<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            r => return r,
        }
    }
}

impl Test<'_> {
    fn send(&mut self, c: &mut dyn Conn, size: usize) -> anyhow::Result<()> {
        if self.args.verify {
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
        if self.args.verify {
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
        let client = self.args.dst.is_some();
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
        let usec = start.elapsed().as_secs_f64() * 1e6;
        let bytes = (iters * count * size * 2) as f64;
        println!(
            "{:<10}{:<8}{:<8}{:<8}{:<8}{:>8.2}s{:>10.2}{:>11.2}",
            name,
            size_str(size as u64),
            cnt_str(count as u64),
            cnt_str(iters as u64),
            size_str(bytes as u64),
            usec / 1e6,
            bytes * 8.0 / (1000.0 * usec),
            (usec / iters as f64) / (count * 2) as f64
        );
        Ok(())
    }
}

fn size_str(size: u64) -> String {
    let (base, mag) = if size >= 1 << 30 {
        (1u64 << 30, "g")
    } else if size >= 1 << 20 {
        (1 << 20, "m")
    } else if size >= 1 << 10 {
        (1 << 10, "k")
    } else {
        (1, "")
    };
    let whole = size / base;
    let fraction = if whole < 10 {
        (size % base) * 10 / base
    } else {
        0
    };
    if fraction > 0 {
        format!("{whole}.{fraction}{mag}")
    } else {
        format!("{whole}{mag}")
    }
}

fn cnt_str(cnt: u64) -> String {
    if cnt >= 1_000_000_000 {
        format!("{}b", cnt / 1_000_000_000)
    } else if cnt >= 1_000_000 {
        format!("{}m", cnt / 1_000_000)
    } else if cnt >= 1000 {
        format!("{}k", cnt / 1000)
    } else {
        cnt.to_string()
    }
}

fn size_to_count(size: usize) -> usize {
    if size >= 1 << 20 {
        100
    } else if size >= 1 << 16 {
        1000
    } else if size >= 1 << 10 {
        10000
    } else {
        100000
    }
}

fn options(a: &Args, latency: bool) -> Options {
    let mut o = Options::default();
    // rstream's buffers: -B, or 512 KiB.
    let buffer = if a.buffer_size > 0 {
        a.buffer_size
    } else {
        1 << 19
    };
    o.sizes.send_buffer = buffer;
    o.sizes.recv_buffer = buffer;
    o.sizes.inline = if latency { a.inline_size } else { 16 };
    o
}

fn addr(host: &str, port: &str) -> anyhow::Result<std::net::SocketAddr> {
    let Ok(port) = port.parse() else {
        bail!("bad port {port:?}");
    };
    common::resolve(host, port)
}

fn listen(a: &Args) -> anyhow::Result<Listener> {
    let host = a.src.as_deref().unwrap_or("0.0.0.0");
    let at = addr(host, &a.port)?;
    if a.sockets {
        TcpListener::bind(at).map(Listener::Tcp).context("bind")
    } else if a.async_io {
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
            Ok(Listener::Async(rt, l))
        }
        #[cfg(not(feature = "tokio"))]
        bail!("-T a needs this example built with the `tokio` feature")
    } else {
        RdmaListener::bind_with(at, options(a, true))
            .map(Listener::Rdma)
            .context("rbind")
    }
}

fn connect(a: &Args, l: Option<&mut Listener>, latency: bool) -> anyhow::Result<Box<dyn Conn>> {
    match (l, &a.dst) {
        (Some(Listener::Tcp(l)), _) => {
            let (s, _) = l.accept().context("accept")?;
            let _ = s.set_nodelay(true);
            Ok(Box::new(s))
        }
        #[cfg(feature = "tokio")]
        (Some(Listener::Async(rt, l)), _) => {
            let (s, _) = rt.block_on(l.accept()).context("raccept")?;
            Ok(Box::new(AsyncConn {
                rt: std::rc::Rc::clone(rt),
                s,
            }))
        }
        (Some(Listener::Rdma(l)), _) => {
            let (s, _) = l.accept().context("raccept")?;
            s.set_nonblocking(a.nonblocking)
                .context("set_nonblocking")?;
            Ok(Box::new(s))
        }
        (None, Some(dst)) => {
            let to = addr(dst, &a.port)?;
            if a.sockets {
                let s = TcpStream::connect(to).context("connect")?;
                let _ = s.set_nodelay(true);
                Ok(Box::new(s))
            } else if a.async_io {
                #[cfg(feature = "tokio")]
                {
                    let rt = runtime()?;
                    let s = rt
                        .block_on(rdma_stream::aio::RdmaStream::connect(
                            &rdma::aio::tokio_rt::Tokio,
                            to,
                            &options(a, latency),
                        ))
                        .context("rconnect")?;
                    Ok(Box::new(AsyncConn { rt, s }))
                }
                #[cfg(not(feature = "tokio"))]
                bail!("-T a needs this example built with the `tokio` feature")
            } else {
                let s = RdmaStream::connect_with(to, &options(a, latency)).context("rconnect")?;
                s.set_nonblocking(a.nonblocking)
                    .context("set_nonblocking")?;
                Ok(Box::new(s))
            }
        }
        (None, None) => unreachable!("a server has a listener"),
    }
}

fn run(a: &Args) -> anyhow::Result<()> {
    let mut listener = if a.dst.is_none() {
        Some(listen(a)?)
    } else {
        None
    };
    let largest = if a.custom {
        a.transfer_size
    } else {
        TEST_SIZES[TEST_SIZES.len() - 1].0
    };
    let mut t = Test {
        args: a,
        buf: vec![0; largest.max(16)],
        pattern: Pattern::default(),
    };
    println!(
        "{:<10}{:<8}{:<8}{:<8}{:<8}{:>8} {:>10}{:>13}",
        "name", "bytes", "xfers", "iters", "total", "time", "Gb/sec", "usec/xfer"
    );
    if a.custom {
        let mut c = connect(a, listener.as_mut(), true)?;
        t.run(
            &mut *c,
            "custom",
            a.transfer_size,
            a.transfer_count,
            a.iterations,
        )?;
        c.close();
        return Ok(());
    }
    for latency in [true, false] {
        let mut c = connect(a, listener.as_mut(), latency)?;
        for &(size, extra) in TEST_SIZES {
            if extra && !a.all_sizes {
                continue;
            }
            let name = format!(
                "{}_{}",
                size_str(size as u64),
                if latency { "lat" } else { "bw" }
            );
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
