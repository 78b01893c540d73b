//! What `rstream` and `riostream` share, as rdma-core's two tools do
//! (`librdmacm/examples/common.c` and the flags both take): the flags
//! themselves ([`parse`]), the table of test sizes and the counts a size
//! gets, the stream options the flags ask for ([`options`]), the byte
//! pattern of `-T v` ([`Pattern`]) and the table they print ([`header`],
//! [`result`]).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context as _};
use rdma_stream::Options;

/// The tools' sizes: (size, shown only with `-S all`).
pub const TEST_SIZES: &[(usize, bool)] = &[
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

/// The flags both tools take.
#[derive(Debug, Clone)]
pub struct PerfArgs {
    /// `-s`: connect to it (else serve).
    pub dst: Option<String>,
    /// `-b`: the address a server binds.
    pub src: Option<String>,
    pub port: String,
    /// `-B`: 0 for the tools' default.
    pub buffer_size: usize,
    pub inline_size: u32,
    pub iterations: usize,
    pub transfer_count: usize,
    pub transfer_size: usize,
    /// `-I`, `-C` or `-S N`: one custom test instead of the series.
    pub custom: bool,
    /// `-S all`.
    pub all_sizes: bool,
    /// `-T n` (the default: MSG_DONTWAIT and a spin) or `-T b`.
    pub nonblocking: bool,
    /// `-T a`: the async stream, on a tokio runtime.
    pub async_io: bool,
    /// `-T v`.
    pub verify: bool,
}

/// A flag or `-T` option the common part does not know, for the tool.
pub enum Extra<'a> {
    /// `-f value` for a tool-specific flag `f` (one of `value_flags`).
    Flag(char, &'a str),
    /// One `-T` option (lower-cased).
    Test(&'a str),
}

fn number(flag: char, v: &str, usage: &str) -> anyhow::Result<usize> {
    let Ok(n) = v.parse() else {
        bail!("-{flag} takes a number, not {v:?}\n{usage}");
    };
    Ok(n)
}

/// Parses `tool`'s `argv` as rdma-core's tools do with getopt: every flag of
/// `value_flags` takes a value, glued (`-p7471`) or next; `-T` takes
/// options by their first letter, several comma-separated. Flags and `-T`
/// options the common part does not know go to `extra`, which says whether
/// it took them.
pub fn parse(
    tool: &str,
    argv: &[String],
    usage: &str,
    value_flags: &str,
    mut extra: impl FnMut(Extra<'_>) -> anyhow::Result<bool>,
) -> anyhow::Result<PerfArgs> {
    let mut a = PerfArgs {
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
        async_io: false,
        // The tools' default is MSG_DONTWAIT with a spin; `-T b` blocks.
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
            bail!("unexpected argument {:?}\n{usage}", argv[i]);
        };
        let value = if value_flags.contains(f) {
            if glued.is_empty() {
                i += 1;
                argv.get(i)
                    .cloned()
                    .with_context(|| format!("-{f} needs a value\n{usage}"))?
            } else {
                glued
            }
        } else {
            bail!("unknown option -{f}\n{usage}");
        };
        match f {
            's' => a.dst = Some(value),
            'b' => a.src = Some(value),
            'f' => {
                if !value.to_ascii_lowercase().starts_with("ip") && value != "name" {
                    bail!("-f {value}: this {tool} takes ip or name addresses");
                }
            }
            'B' => a.buffer_size = number(f, &value, usage)?,
            'i' => a.inline_size = number(f, &value, usage)? as u32,
            'I' => {
                a.custom = true;
                a.iterations = number(f, &value, usage)?;
            }
            'C' => {
                a.custom = true;
                a.transfer_count = number(f, &value, usage)?;
            }
            'S' => {
                if value.to_ascii_lowercase().starts_with("all") {
                    a.all_sizes = true;
                } else {
                    a.custom = true;
                    a.transfer_size = number(f, &value, usage)?;
                }
            }
            'p' => a.port = value,
            'T' => {
                for opt in value.split(',') {
                    let o = opt.to_ascii_lowercase();
                    match o.chars().next() {
                        Some('a') => a.async_io = true,
                        Some('b') => a.nonblocking = false,
                        Some('n') => a.nonblocking = true,
                        Some('v') => a.verify = true,
                        _ if extra(Extra::Test(&o))? => {}
                        _ => bail!("unknown test option {opt:?}\n{usage}"),
                    }
                }
            }
            other => {
                if !extra(Extra::Flag(other, &value))? {
                    bail!("unknown option -{other}\n{usage}");
                }
            }
        }
        i += 1;
    }
    if a.transfer_size == 0 || a.transfer_count == 0 || a.iterations == 0 {
        bail!("sizes and counts must be at least 1");
    }
    Ok(a)
}

/// The stream options the tools set (`set_options`): `-B` or 512 KiB each
/// way, as `SO_SNDBUF` and `SO_RCVBUF`, which rsocket doubles (as Linux does
/// for TCP): rdma-core's tools run with twice the size given, 1 MiB each
/// way by default, and ours take the same; inline `-i` when optimising
/// for latency, else rsocket's least (16).
pub fn options(a: &PerfArgs, latency: bool) -> Options {
    let mut o = Options::default();
    let asked = if a.buffer_size > 0 {
        a.buffer_size
    } else {
        1 << 19
    };
    // rsocket's floor for the send buffer: twice its low-water mark.
    o.sizes.send_buffer = asked
        .saturating_mul(2)
        .max(2 * rdma_stream::wire::SEND_LOW_WATER);
    o.sizes.recv_buffer = asked.saturating_mul(2);
    o.sizes.inline = if latency { a.inline_size } else { 16 };
    o
}

/// `host` and the port of `-p`.
pub fn addr(host: &str, port: &str) -> anyhow::Result<SocketAddr> {
    let Ok(port) = port.parse() else {
        bail!("bad port {port:?}");
    };
    super::resolve(host, port)
}

/// Runs `f` again while it would block or was interrupted (the tools'
/// MSG_DONTWAIT loops spin).
pub fn retry<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            r => return r,
        }
    }
}

/// The byte pattern of `-T v` (`format_buf`, `verify_buf`): a counter that
/// runs on across transfers, one for what is sent and one for what is
/// checked.
#[derive(Default)]
pub struct Pattern {
    next_sent: u8,
    next_seen: u8,
    seen: u64,
}

impl Pattern {
    pub fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.next_sent;
            self.next_sent = self.next_sent.wrapping_add(1);
        }
    }

    pub fn check(&mut self, buf: &[u8]) -> anyhow::Result<()> {
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

/// The table's header, which a server prints once it listens.
pub fn header() {
    println!(
        "{:<10}{:<8}{:<8}{:<8}{:<8}{:>8} {:>10}{:>13}",
        "name", "bytes", "xfers", "iters", "total", "time", "Gb/sec", "usec/xfer"
    );
}

/// One test's line (`show_perf`): `iters` rounds of `count` transfers of
/// `size` bytes each way in `took`.
pub fn result(name: &str, size: usize, count: usize, iters: usize, took: Duration) {
    let usec = took.as_secs_f64() * 1e6;
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
}

/// A size as the tools print it: `1.5k`, `64k`, `1m`.
pub fn size_str(size: u64) -> String {
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

/// A count as the tools print it: `100k`, `1m`.
pub fn cnt_str(cnt: u64) -> String {
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

/// Transfers of the series at `size`: the latency test's iterations, the
/// bandwidth test's count.
pub fn size_to_count(size: usize) -> usize {
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

/// The name of a series test: `64_lat`, `1m_bw`.
pub fn series_name(size: usize, latency: bool) -> String {
    format!(
        "{}_{}",
        size_str(size as u64),
        if latency { "lat" } else { "bw" }
    )
}
