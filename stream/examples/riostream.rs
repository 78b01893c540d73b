//! rdma-core's `riostream` over this crate, with its flags and its output,
//! so that the C tool and this one can take either role:
//!
//! ```text
//! riostream [-s server_address] [-b bind_address] [-f address_format]
//!           [-B buffer_size] [-i inline_size] [-I iterations]
//!           [-C transfer_count] [-S transfer_size or all] [-p port_number]
//!           [-T test_option]   b (blocking), n (nonblocking), v (verify)
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
//! `-T a` (C's `rpoll` loop) is refused: the async stream has no direct
//! placement.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context as _};
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
    let a = perf::parse("riostream", argv, USAGE, "sbfBiICSpT", |_: Extra<'_>| {
        Ok(false)
    })?;
    if a.async_io {
        bail!("-T a (async) is not supported: the async stream has no direct placement");
    }
    Ok(a)
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
    fn send_msg(&self, s: &RdmaStream, size: usize) -> anyhow::Result<()> {
        let msg = vec![0; size];
        let mut off = 0;
        while off < size {
            let n = retry(|| (&*s).write(&msg[off..])).context("rsend")?;
            if n == 0 {
                bail!("rsend: the stream took no bytes");
            }
            off += n;
        }
        Ok(())
    }

    /// `size` bytes from the stream itself (`recv_msg`).
    fn recv_msg(&self, s: &RdmaStream, size: usize) -> anyhow::Result<()> {
        let mut msg = vec![0; size];
        let mut off = 0;
        while off < size {
            let n = retry(|| (&*s).read(&mut msg[off..])).context("rrecv")?;
            if n == 0 {
                bail!("rrecv: the peer closed the stream");
            }
            off += n;
        }
        Ok(())
    }

    /// `out[..size]` into the peer's mapping at offset 0 (`send_xfer`).
    fn send_xfer(&self, s: &RdmaStream, size: usize) -> anyhow::Result<()> {
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
        s: &RdmaStream,
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
    fn recv_xfer(&mut self, s: &RdmaStream, map: &IoMap, marker: u8) -> anyhow::Result<()> {
        let last = map.len() - 1;
        // Blocking mode for the wait: then it also sees the connection
        // manager's events (a peer that went away); C spins on the byte
        // whatever its flags.
        s.set_nonblocking(false).context("set_nonblocking")?;
        let waited = s.iomap_wait(map, last, marker, None);
        s.set_nonblocking(self.args.nonblocking)
            .context("set_nonblocking")?;
        waited.with_context(|| format!("waiting for marker {marker}"))?;
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
        s: &RdmaStream,
        name: &str,
        size: usize,
        count: usize,
        iters: usize,
    ) -> anyhow::Result<()> {
        let mut mem = vec![0; size];
        mem[size - 1] = NO_MARKER;
        // C's riomap queues an announcement that finds no credit and sends
        // it later; ours waits for one, in blocking mode.
        s.set_nonblocking(false).context("set_nonblocking")?;
        let map = s.iomap(mem, 0).context("riomap")?;
        s.set_nonblocking(self.args.nonblocking)
            .context("set_nonblocking")?;
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

/// The next connection: accepted on `listener`, or made to `-s`.
fn connect(
    a: &PerfArgs,
    listener: Option<&RdmaListener>,
    latency: bool,
) -> anyhow::Result<RdmaStream> {
    let s = match (listener, &a.dst) {
        (Some(l), _) => l.accept().context("raccept")?.0,
        (None, Some(dst)) => {
            let to = addr(dst, &a.port)?;
            RdmaStream::connect_with(to, &perf::options(a, latency)).context("rconnect")?
        }
        (None, None) => unreachable!("a server has a listener"),
    };
    s.set_nonblocking(a.nonblocking)
        .context("set_nonblocking")?;
    Ok(s)
}

/// `rshutdown(SHUT_RDWR)` and `rclose`.
fn close(s: RdmaStream) {
    let _ = s.shutdown(Shutdown::Both);
}

fn run(a: &PerfArgs) -> anyhow::Result<()> {
    let listener = match &a.dst {
        Some(_) => None,
        None => {
            let host = a.src.as_deref().unwrap_or("0.0.0.0");
            let at = addr(host, &a.port)?;
            Some(RdmaListener::bind_with(at, perf::options(a, true)).context("rbind")?)
        }
    };
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
        let s = connect(a, listener.as_ref(), true)?;
        t.run(
            &s,
            "custom",
            a.transfer_size,
            a.transfer_count,
            a.iterations,
        )?;
        close(s);
        return Ok(());
    }
    for latency in [true, false] {
        let s = connect(a, listener.as_ref(), latency)?;
        for &(size, extra) in TEST_SIZES {
            if extra && !a.all_sizes {
                continue;
            }
            let (count, iters) = if latency {
                (1, size_to_count(size))
            } else {
                (size_to_count(size), 1)
            };
            t.run(&s, &perf::series_name(size, latency), size, count, iters)?;
        }
        close(s);
    }
    Ok(())
}

fn main() -> ExitCode {
    env_logger::init();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    common::exit("riostream", parse(&argv).and_then(|a| run(&a)))
}
