//! The command line of `perf`: the test name, perftest's flags, and the
//! switches that choose how the `rdma` crate posts work.

use rdma::{Mtu, PostPath};

use crate::common::args::{Cli, Flag, Found, Parsed};

/// The operation a test measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// SEND / RECV.
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// Atomic fetch-and-add or compare-and-swap.
    Atomic,
}

/// Bandwidth (streaming) or latency (ping-pong) test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `*_bw`.
    Bw,
    /// `*_lat`.
    Lat,
}

/// One of the eight tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Test {
    /// What is posted.
    pub verb: Verb,
    /// How it is timed.
    pub kind: Kind,
}

const TESTS: [(&str, Verb, Kind); 8] = [
    ("send_bw", Verb::Send, Kind::Bw),
    ("write_bw", Verb::Write, Kind::Bw),
    ("read_bw", Verb::Read, Kind::Bw),
    ("atomic_bw", Verb::Atomic, Kind::Bw),
    ("send_lat", Verb::Send, Kind::Lat),
    ("write_lat", Verb::Write, Kind::Lat),
    ("read_lat", Verb::Read, Kind::Lat),
    ("atomic_lat", Verb::Atomic, Kind::Lat),
];

impl Test {
    /// The name on the command line (`write_bw`, ...).
    pub fn name(self) -> &'static str {
        TESTS
            .iter()
            .find(|(_, v, k)| *v == self.verb && *k == self.kind)
            .map_or("?", |(n, _, _)| n)
    }

    /// The title perftest prints for the same test.
    pub fn title(self) -> String {
        let verb = match self.verb {
            Verb::Send => "Send",
            Verb::Write => "RDMA_Write",
            Verb::Read => "RDMA_Read",
            Verb::Atomic => "Atomic",
        };
        let kind = match self.kind {
            Kind::Bw => "BW",
            Kind::Lat => "Latency",
        };
        format!("{verb} {kind} Test")
    }

    fn parse(s: &str) -> Option<Test> {
        TESTS
            .iter()
            .find(|(n, _, _)| *n == s)
            .map(|&(_, verb, kind)| Test { verb, kind })
    }
}

/// `-A`: which atomic operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicOp {
    /// `FETCH_AND_ADD` (perftest's default).
    FetchAdd,
    /// `CMP_AND_SWAP`.
    CmpSwap,
}

/// The parsed command line.
#[derive(Debug, Clone)]
pub struct Opts {
    /// The test.
    pub test: Test,
    /// `-d`: the device (`None`: the first one).
    pub ib_dev: Option<String>,
    /// `-i`: the device's port.
    pub ib_port: u8,
    /// `-x`: GID index (`None`: 0 on Ethernet, none on InfiniBand).
    pub gid_index: Option<u32>,
    /// `-s`: message size in bytes.
    pub size: usize,
    /// `-n`: iterations (per QP for bandwidth tests).
    pub iters: u32,
    /// `-a`: every size from 2 to 2^23.
    pub all: bool,
    /// `-I`: largest message sent inline (0: none).
    pub inline: u32,
    /// `-e`: sleep on completion events instead of busy polling.
    pub events: bool,
    /// `--wait`: how `-e` sleeps (`perf/events.rs`).
    pub wait: crate::events::Wait,
    /// `-p`: TCP port of the out-of-band exchange.
    pub tcp_port: u16,
    /// `-q`: number of QPs (bandwidth tests).
    pub qps: u32,
    /// `-t`: send queue depth (requests in flight per QP).
    pub tx_depth: u32,
    /// `-r`: receive queue depth (SEND tests).
    pub rx_depth: u32,
    /// `-Q`: one completion every this many sends (`None`: perftest's rule).
    pub cq_mod: Option<u32>,
    /// `-m`: path MTU (`None`: the port's active MTU).
    pub mtu: Option<Mtu>,
    /// `-N`: no peak bandwidth.
    pub no_peak: bool,
    /// `-A`: the atomic operation.
    pub atomic: AtomicOp,
    /// `-o`: outstanding RDMA READ/atomics (`None`: the device maximum).
    pub out_reads: Option<u32>,
    /// `-u`: the ACK timeout exponent of the RC QPs (4.096 us * 2^u).
    pub qp_timeout: u8,
    /// `--post`: the send path of the QPs (when not given: `Auto` on the
    /// slot queue, [`Opts::slot_queue`], else `Legacy`).
    pub post: PostPath,
    /// `--raw`: post prebuilt C work requests through the `unsafe` raw API.
    pub raw: bool,
    /// The safe path posts requests checked once
    /// (`QueuePair::prepare_send`/`post_prepared`); `--post-send` builds
    /// every request for `QueuePair::post_send` instead.
    pub prepared: bool,
    /// `--interleave N` (write_lat): blocks of N iterations alternate between
    /// the safe and the raw path in one run.
    pub interleave: Option<u32>,
    /// `--cpu`: print the CPU time per iteration after the table.
    pub cpu: bool,
    /// `-U` (latency tests): print every sample in the order taken, as
    /// perftest does (`#, usec` then `N, value` lines before the row).
    pub report_unsorted: bool,
    /// `-H` (latency tests): print every sample, sorted.
    pub report_histogram: bool,
    /// The server to connect to (`None`: be the server).
    pub host: Option<String>,
}

/// Largest message size `-a` runs, and the largest `-s` accepted (perftest's
/// `MAX_SIZE`, 8 MiB).
pub const MAX_SIZE: usize = 1 << 23;
/// perftest turns completion moderation off above this size.
pub const CQ_MOD_SIZE_LIMIT: usize = 8192;

impl Opts {
    /// The sizes to run: `-s`, or every power of two from 2 to 2^23 with `-a`.
    pub fn sizes(&self) -> Vec<usize> {
        if self.all {
            (1..=23).map(|e| 1usize << e).collect()
        } else {
            vec![self.size]
        }
    }

    /// Completion moderation for `size`: `-Q` if given, else perftest's
    /// default (every 100th send signaled; every send above 8 KiB, except
    /// with `-e`: perftest keeps one in 100 in event mode at every size),
    /// never more than the send queue depth. (perftest's `-a` keeps it too;
    /// `perf -a` does not, so that its `--post-send` pools of unsignaled
    /// buffers stay small at the large sizes.)
    pub fn cq_mod_for(&self, size: usize) -> u32 {
        let m = match self.cq_mod {
            Some(m) => m,
            None if size > CQ_MOD_SIZE_LIMIT && !self.events => 1,
            None => 100,
        };
        m.clamp(1, self.tx_depth.max(1))
    }

    /// Whether this side is the server.
    pub fn is_server(&self) -> bool {
        self.host.is_none()
    }

    /// Whether the test runs on an [`rdma::SlotQueue`]: `send_lat` and
    /// `write_lat` busy polling on the safe path with requests checked once
    /// (no `--raw`, `-e`, `--post-send` or `--interleave`), one QP.
    pub fn slot_queue(&self) -> bool {
        self.test.kind == Kind::Lat
            && matches!(self.test.verb, Verb::Send | Verb::Write)
            && !self.raw
            && !self.events
            && self.prepared
            && self.interleave.is_none()
            && self.qps == 1
    }
}

pub use crate::common::args::ArgError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    IbDev,
    IbPort,
    Gid,
    Size,
    Iters,
    All,
    Inline,
    Events,
    Port,
    CpuFreq,
    Qps,
    TxDepth,
    RxDepth,
    CqMod,
    Mtu,
    NoPeak,
    Atomic,
    OutReads,
    QpTimeout,
    Post,
    Raw,
    PostSend,
    Interleave,
    Wait,
    Cpu,
    Unsorted,
    Histogram,
}

#[rustfmt::skip]
const FLAGS: &[Flag<'static, Key>] = &[
    Flag { key: Key::IbDev, short: Some('d'), long: "ib-dev", value: Some("dev"), help: "RDMA device (default: the first one)" },
    Flag { key: Key::IbPort, short: Some('i'), long: "ib-port", value: Some("port"), help: "port of the device (default 1)" },
    Flag { key: Key::Gid, short: Some('x'), long: "gid-index", value: Some("index"), help: "GID index (default: 0 on Ethernet, no GID on InfiniBand)" },
    Flag { key: Key::Size, short: Some('s'), long: "size", value: Some("bytes"), help: "message size (default 65536 for bandwidth, 2 for latency, 8 for atomics)" },
    Flag { key: Key::Iters, short: Some('n'), long: "iters", value: Some("n"), help: "iterations, at least 5 (default 5000 for write_bw, else 1000)" },
    Flag { key: Key::All, short: Some('a'), long: "all", value: None, help: "run every size from 2 to 2^23 bytes" },
    Flag { key: Key::Inline, short: Some('I'), long: "inline_size", value: Some("bytes"), help: "send messages up to this size inline (default 0: perftest enables inline only on NICs it knows, not on soft-RoCE)" },
    Flag { key: Key::Events, short: Some('e'), long: "events", value: None, help: "sleep on completion events instead of busy polling" },
    Flag { key: Key::Wait, short: None, long: "wait", value: Some("how"), help: "with -e: channel (CompletionChannel::get_event after arming, default) or cq (the crate's blocking wait, CompletionQueue::wait_until) or async (send_lat and the bandwidth tests: the loop as a future on tokio, completions through rdma::aio::AsyncCq; perf built with --features tokio)" },
    Flag { key: Key::Port, short: Some('p'), long: "port", value: Some("port"), help: "TCP port of the out-of-band exchange (default 18515)" },
    Flag { key: Key::CpuFreq, short: Some('F'), long: "CPU-freq", value: None, help: "accepted for perftest compatibility (perf measures the TSC rate against CLOCK_MONOTONIC over each run)" },
    Flag { key: Key::Qps, short: Some('q'), long: "qp", value: Some("n"), help: "number of QPs, bandwidth tests only (default 1)" },
    Flag { key: Key::TxDepth, short: Some('t'), long: "tx-depth", value: Some("n"), help: "requests in flight per QP (default 128 for bandwidth, 1 for latency)" },
    Flag { key: Key::RxDepth, short: Some('r'), long: "rx-depth", value: Some("n"), help: "receives posted per QP in SEND tests (default 512)" },
    Flag { key: Key::CqMod, short: Some('Q'), long: "cq-mod", value: Some("n"), help: "one completion every n sends (default 100; 1 above 8 KiB)" },
    Flag { key: Key::Mtu, short: Some('m'), long: "mtu", value: Some("bytes"), help: "path MTU: 256 to 4096 (default: the port's active MTU)" },
    Flag { key: Key::NoPeak, short: Some('N'), long: "noPeak", value: None, help: "do not compute the peak bandwidth" },
    Flag { key: Key::Atomic, short: Some('A'), long: "atomic_type", value: Some("type"), help: "FETCH_AND_ADD (default) or CMP_AND_SWAP" },
    Flag { key: Key::OutReads, short: Some('o'), long: "outs", value: Some("n"), help: "outstanding READs/atomics (default: the device maximum)" },
    Flag { key: Key::QpTimeout, short: Some('u'), long: "qp-timeout", value: Some("timeout"), help: "ACK timeout exponent: 4.096 us * 2^timeout, 0 for none (default 14, 67 ms)" },
    Flag { key: Key::Post, short: None, long: "post", value: Some("path"), help: "send path: legacy (ibv_post_send, as perftest on rxe), extended (ibv_wr_*) or auto (extended where the provider has it); default: auto for send_lat and write_lat on the slot queue (busy polling, no --raw, --post-send or --interleave), legacy otherwise" },
    Flag { key: Key::Raw, short: None, long: "raw", value: None, help: "post prebuilt C work requests (unsafe post_send_raw/post_recv_raw, ibv_wr_* for --post extended) and poll with ibv_poll_cq, instead of the safe API" },
    Flag { key: Key::PostSend, short: None, long: "post-send", value: None, help: "the safe path builds every request and posts it with post_send, instead of posting requests prepared once (prepare_send/post_prepared, the default; perftest also builds its requests once)" },
    Flag { key: Key::Interleave, short: None, long: "interleave", value: Some("iterations"), help: "write_lat: alternate blocks of this many iterations between the safe and the raw path in one run; prints each path's latency and safe/raw, which slow periods of the host hit alike" },
    Flag { key: Key::Histogram, short: Some('H'), long: "report-histogram", value: None, help: "latency tests: print every sample, sorted (perftest's format)" },
    Flag { key: Key::Unsorted, short: Some('U'), long: "report-unsorted", value: None, help: "latency tests: print every sample in the order taken" },
    Flag { key: Key::Cpu, short: None, long: "cpu", value: None, help: "print user and system CPU time per iteration after the table" },
];

const CLI: Cli<'static, Key> = Cli {
    name: "perf",
    usage: "  perf TEST [options]          be the server: wait for a client\n  \
            perf TEST [options] HOST     be the client of the server on HOST\n\n\
            TEST: send_bw write_bw read_bw atomic_bw send_lat write_lat read_lat atomic_lat\n\n\
            A perftest-style benchmark of the `rdma` crate over RC queue pairs. Both sides\n\
            need the same test and options; the out-of-band exchange is perf's own (it does\n\
            not interoperate with perftest).",
    flags: FLAGS,
    bad_exit: 1,
};

/// A number as perftest reads it: decimal, or hexadecimal after `0x`.
fn number<T: TryFrom<u64>>(f: &Found<Key>, what: &str) -> Result<T, ArgError> {
    let t = f.value.trim();
    let n = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else {
        t.parse::<u64>().ok()
    };
    n.and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| f.bad(what))
}

#[derive(Default)]
struct Given {
    size: Option<usize>,
    iters: Option<u32>,
    tx_depth: Option<u32>,
    rx_depth: Option<u32>,
    inline: Option<u32>,
    post: Option<PostPath>,
    post_send: bool,
}

fn apply(o: &mut Opts, g: &mut Given, f: &Found<Key>) -> Result<(), ArgError> {
    let (flag, v) = (f.shown.as_str(), f.value.as_str());
    match f.key {
        Key::IbDev => o.ib_dev = Some(v.to_string()),
        Key::IbPort => o.ib_port = f.in_range(number(f, "a port number")?, 1, 255)?,
        Key::Gid => o.gid_index = Some(number(f, "a GID table index")?),
        Key::Size => g.size = Some(f.in_range(number(f, "a size in bytes")?, 1, MAX_SIZE)?),
        Key::Iters => g.iters = Some(f.in_range(number(f, "a count")?, 5, 100_000_000)?),
        Key::All => o.all = true,
        Key::Inline => g.inline = Some(f.in_range(number(f, "bytes")?, 0, 912)?),
        Key::Events => o.events = true,
        Key::Wait => o.wait = crate::events::parse(flag, v)?,
        Key::Port => o.tcp_port = number(f, "a TCP port")?,
        Key::CpuFreq => {}
        Key::Qps => o.qps = f.in_range(number(f, "a count")?, 1, 16384)?,
        Key::TxDepth => g.tx_depth = Some(f.in_range(number(f, "a depth")?, 1, 15000)?),
        Key::RxDepth => g.rx_depth = Some(f.in_range(number(f, "a depth")?, 1, 16384)?),
        Key::CqMod => o.cq_mod = Some(f.in_range(number(f, "a count")?, 1, 1024)?),
        Key::Mtu => {
            let b: u32 = number(f, "256, 512, 1024, 2048 or 4096")?;
            o.mtu = Some(Mtu::from_bytes(b).ok_or_else(|| {
                ArgError::Bad(format!(
                    "invalid MTU {v:?} for {flag}: 256, 512, 1024, 2048 or 4096"
                ))
            })?);
        }
        Key::NoPeak => o.no_peak = true,
        Key::Atomic => {
            o.atomic = match v {
                "FETCH_AND_ADD" => AtomicOp::FetchAdd,
                "CMP_AND_SWAP" => AtomicOp::CmpSwap,
                _ => {
                    return Err(ArgError::Bad(format!(
                        "invalid value {v:?} for {flag}: FETCH_AND_ADD or CMP_AND_SWAP"
                    )))
                }
            }
        }
        Key::OutReads => o.out_reads = Some(f.in_range(number(f, "a count")?, 1, 255)?),
        Key::QpTimeout => o.qp_timeout = f.in_range(number(f, "an exponent")?, 0, 31)?,
        Key::Post => {
            g.post = Some(match v {
                "legacy" => PostPath::Legacy,
                "extended" => PostPath::Extended,
                "auto" => PostPath::Auto,
                _ => {
                    return Err(ArgError::Bad(format!(
                        "invalid value {v:?} for {flag}: legacy, extended or auto"
                    )))
                }
            })
        }
        Key::Raw => o.raw = true,
        Key::PostSend => g.post_send = true,
        Key::Interleave => {
            o.interleave = Some(f.in_range(number(f, "iterations")?, 1, 1_000_000)?)
        }
        Key::Cpu => o.cpu = true,
        Key::Histogram => o.report_histogram = true,
        Key::Unsorted => o.report_unsorted = true,
    }
    Ok(())
}

/// Parses the arguments (without the program name) as `getopt_long` would
/// ([`Cli::parse`]); the test name and the host are the operands.
///
/// # Errors
/// [`ArgError::Help`] for `-h`, [`ArgError::Bad`] otherwise.
#[cfg(test)]
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Opts, ArgError> {
    CLI.parse(args).and_then(opts)
}

/// Reads the process's command line ([`Cli::read`]): the options, or the
/// exit status after the help or the error was printed.
pub fn read() -> Result<Opts, std::process::ExitCode> {
    CLI.read(opts)
}

/// The options the flags and operands give.
fn opts(args: Parsed<Key>) -> Result<Opts, ArgError> {
    let mut o = Opts {
        test: Test {
            verb: Verb::Write,
            kind: Kind::Bw,
        },
        ib_dev: None,
        ib_port: 1,
        gid_index: None,
        size: 0,
        iters: 0,
        all: false,
        inline: 0,
        events: false,
        wait: crate::events::Wait::Channel,
        tcp_port: 18515,
        qps: 1,
        tx_depth: 0,
        rx_depth: 0,
        cq_mod: None,
        mtu: None,
        no_peak: false,
        atomic: AtomicOp::FetchAdd,
        out_reads: None,
        qp_timeout: 14,
        post: PostPath::Legacy,
        raw: false,
        prepared: false,
        interleave: None,
        cpu: false,
        report_unsorted: false,
        report_histogram: false,
        host: None,
    };
    let mut g = Given::default();
    for f in &args.flags {
        apply(&mut o, &mut g, f)?;
    }
    let mut positional = args.operands.into_iter();
    let name = positional
        .next()
        .ok_or_else(|| ArgError::Bad("missing the test name (e.g. write_bw)".into()))?;
    o.test = Test::parse(&name).ok_or_else(|| {
        ArgError::Bad(format!(
            "unknown test {name:?}: expected one of {}",
            TESTS.map(|t| t.0).join(", ")
        ))
    })?;
    o.host = positional.next();
    if let Some(extra) = positional.next() {
        return Err(ArgError::Bad(format!("unexpected argument {extra:?}")));
    }
    finish(o, g)
}

/// Defaults that depend on the test, and combinations perftest refuses.
fn finish(mut o: Opts, g: Given) -> Result<Opts, ArgError> {
    let bad = |s: &str| Err(ArgError::Bad(s.to_string()));
    let (verb, kind) = (o.test.verb, o.test.kind);
    o.size = g.size.unwrap_or(match (verb, kind) {
        (Verb::Atomic, _) => 8,
        (_, Kind::Bw) => 65536,
        (_, Kind::Lat) => 2,
    });
    o.iters = g.iters.unwrap_or(if o.test.name() == "write_bw" {
        5000
    } else {
        1000
    });
    o.tx_depth = g.tx_depth.unwrap_or(match kind {
        Kind::Bw => 128,
        Kind::Lat => 1,
    });
    o.rx_depth = g.rx_depth.unwrap_or(512);
    o.inline = g.inline.unwrap_or(0);
    if verb == Verb::Atomic {
        if o.size != 8 {
            return bad("atomic tests use 8-byte operands: -s must be 8");
        }
        if o.all {
            return bad("-a does not apply to atomic tests (8-byte operands)");
        }
    }
    if o.wait != crate::events::Wait::Channel && (!o.events || o.raw) {
        return bad("--wait applies to -e on the safe path (leave out --raw)");
    }
    if o.wait == crate::events::Wait::Async {
        if kind != Kind::Bw && o.test.name() != "send_lat" {
            return bad("--wait async is implemented for send_lat and the bandwidth tests");
        }
        if !cfg!(feature = "tokio") {
            return bad("--wait async needs perf built with the tokio feature \
                 (cargo build --release --example perf --features tokio)");
        }
    }
    if kind == Kind::Lat && o.qps != 1 {
        return bad("-q applies to bandwidth tests only: latency tests use one QP");
    }
    if kind == Kind::Bw && (o.report_histogram || o.report_unsorted) {
        return bad("-H and -U apply to latency tests only");
    }
    if o.events && o.test.name() == "write_lat" {
        return bad("-e does not apply to write_lat, which polls memory for arrivals");
    }
    if o.all && g.size.is_some() {
        return bad("-a and -s exclude each other");
    }
    if g.post_send && o.raw {
        return bad("--post-send chooses how the safe path posts: leave out --raw");
    }
    o.prepared = !o.raw && !g.post_send;
    // The slot queue's default is the crate's (the extended path where the
    // provider has it); the other paths keep perftest's on rxe.
    o.post = g.post.unwrap_or(if o.slot_queue() {
        PostPath::Auto
    } else {
        PostPath::Legacy
    });
    if o.raw && o.post == PostPath::Auto {
        return bad("--raw needs an explicit path: --post legacy or --post extended");
    }
    if o.interleave.is_some() {
        if o.test.name() != "write_lat" {
            return bad("--interleave applies to write_lat only");
        }
        if o.raw {
            return bad("--interleave runs both paths: leave out --raw");
        }
        if o.post == PostPath::Auto {
            return bad("--interleave needs an explicit path: --post legacy or --post extended");
        }
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Opts, ArgError> {
        parse(s.split_whitespace().map(String::from))
    }

    #[test]
    fn perftest_defaults() {
        let o = p("write_bw").unwrap();
        assert_eq!((o.size, o.iters, o.tx_depth, o.qps), (65536, 5000, 128, 1));
        assert_eq!(o.cq_mod_for(65536), 1);
        assert_eq!(o.cq_mod_for(4096), 100);
        // perftest keeps moderation at every size in event mode.
        assert_eq!(p("send_bw -e").unwrap().cq_mod_for(65536), 100);
        assert_eq!(p("send_bw -e -Q 1").unwrap().cq_mod_for(65536), 1);
        let o = p("send_lat -F -x 1 10.0.0.1").unwrap();
        assert_eq!(
            (o.size, o.iters, o.host.as_deref()),
            (2, 1000, Some("10.0.0.1"))
        );
        assert_eq!(p("atomic_bw").unwrap().size, 8);
        assert_eq!(p("send_bw").unwrap().qp_timeout, 14);
        assert_eq!(p("send_bw -u 18").unwrap().qp_timeout, 18);
        assert_eq!(p("send_bw --qp-timeout=0").unwrap().qp_timeout, 0);
    }

    #[test]
    fn flags_cluster_and_attach() {
        let o = p("read_bw -d rxe0 -x1 -Fs 4096 -n50 --post=extended --raw -q 2 host").unwrap();
        assert_eq!(o.ib_dev.as_deref(), Some("rxe0"));
        assert_eq!(
            (o.gid_index, o.size, o.iters, o.qps),
            (Some(1), 4096, 50, 2)
        );
        assert_eq!(o.post, PostPath::Extended);
        assert!(o.raw);
    }

    #[test]
    fn bad_input_is_an_error() {
        for s in [
            "",
            "foo_bw",
            "write_bw -s 0",
            "write_bw -n 2",
            "write_bw -z",
            "write_bw --post fast",
            "send_lat -q 2",
            "atomic_bw -s 16",
            "write_bw -m 1000",
            "write_bw -u 32",
            "write_bw a b",
            "write_bw --raw --post auto",
            "send_lat --interleave 50",
            "write_lat --interleave 0",
            "write_lat --interleave 50 --raw",
            "write_lat --interleave 50 --post auto",
            "write_lat --post-send --raw",
        ] {
            assert!(matches!(p(s), Err(ArgError::Bad(_))), "{s:?} accepted");
        }
        assert!(matches!(p("write_bw -h"), Err(ArgError::Help)));
    }

    #[test]
    fn wait_async_is_send_lat_or_bw_with_events_and_the_tokio_feature() {
        for s in [
            "send_bw --wait async",
            "write_bw -e --raw --wait async",
            "read_lat -e --wait async",
            "write_lat -e --wait async",
            "send_lat --wait async",
            "send_lat -e --raw --post legacy --wait async",
            "send_lat -e --wait later",
        ] {
            assert!(matches!(p(s), Err(ArgError::Bad(_))), "{s:?} accepted");
        }
        for s in [
            "send_lat -e --wait async",
            "send_bw -e --wait async",
            "write_bw -e --wait async",
            "read_bw -e --wait async",
        ] {
            let r = p(s);
            if cfg!(feature = "tokio") {
                assert_eq!(r.unwrap().wait, crate::events::Wait::Async, "{s:?}");
            } else {
                assert!(
                    matches!(&r, Err(ArgError::Bad(m)) if m.contains("--features tokio")),
                    "{s:?} accepted without the feature"
                );
            }
        }
    }

    #[test]
    fn the_safe_path_posts_prepared_requests_unless_told() {
        assert!(p("write_lat").unwrap().prepared);
        assert!(p("read_lat host").unwrap().prepared);
        assert!(p("write_lat --interleave 50").unwrap().prepared);
        assert!(p("write_bw").unwrap().prepared);
        assert!(!p("send_lat --post-send").unwrap().prepared);
        assert!(!p("write_bw --post-send").unwrap().prepared);
        assert!(!p("write_lat --raw --post legacy").unwrap().prepared);
        assert!(!p("write_bw --raw --post legacy").unwrap().prepared);
    }

    #[test]
    fn the_slot_queue_posts_on_the_crates_default_path_unless_told() {
        for s in ["write_lat", "send_lat -s 64 host"] {
            let o = p(s).unwrap();
            assert!(o.slot_queue(), "{s:?}");
            assert_eq!(o.post, PostPath::Auto, "{s:?}");
        }
        assert_eq!(p("write_lat --post legacy").unwrap().post, PostPath::Legacy);
        for s in [
            "write_bw",
            "read_lat",
            "send_lat -e",
            "send_lat --post-send",
            "write_lat --raw",
            "write_lat --interleave 50",
        ] {
            let o = p(s).unwrap();
            assert!(!o.slot_queue(), "{s:?}");
            assert_eq!(o.post, PostPath::Legacy, "{s:?}");
        }
    }

    #[test]
    fn interleave_takes_a_block_length() {
        assert_eq!(p("write_lat").unwrap().interleave, None);
        let o = p("write_lat -d rxe0 --interleave 50 --post extended host").unwrap();
        assert_eq!((o.interleave, o.post), (Some(50), PostPath::Extended));
    }
}
