//! Code shared by the pingpong examples (`rc_pingpong`, `uc_pingpong`,
//! `ud_pingpong`, `srq_pingpong`): flag parsing, the TCP handshake of
//! rdma-core's `ibv_*_pingpong` tools, and the ping-pong loop itself
//! (`srq_pingpong`, with its many QPs, has a loop of its own).
//!
//! # Handshake (rdma-core `libibverbs/examples/pingpong.c`)
//! Each side describes itself in one 52-byte message: the text
//! `LLLL:QQQQQQ:PPPPPP:GGGG...` (LID, QP number and initial PSN in lower-case
//! hex, zero-padded to 4, 6 and 6 digits, then the GID as 32 hex digits, the
//! 16 raw bytes in wire order) followed by NUL bytes up to 52.
//!
//! 1. The client connects and sends its message.
//! 2. The server reads it, moves its QP to RTR/RTS towards the client, and
//!    sends its own message.
//! 3. The client reads it and answers with the 5 bytes `"done\0"`.
//!
//! The client connects its QP after the exchange and sends the first ping.
//! `ibv_srq_pingpong` sends a fixed number of such messages each way instead
//! of one (see [`exchange_all`]).
//!
//! # Traffic
//! Both sides keep `rx_depth` receives posted and refill them when only one
//! is left. A side sends its next message once its previous send has
//! completed *and* a message has arrived; the client sends first. Each side
//! sends and receives `iters` messages of `size` bytes.
#![allow(dead_code)] // every example uses a different subset

use std::fmt::Display;
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, TcpListener, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdma::{
    AccessFlags, AhAttr, Completion, CompletionChannel, CompletionQueue, Context, Gid, GlobalRoute,
    InlineSend, LinkLayer, MemoryRegion, Mtu, PortAttr, ProtectionDomain, QueuePair, SendWr,
    UdDest, WcStatus, WrBuffers,
};

/// `wr_id` of every receive.
pub const RECV_WRID: u64 = 1;
/// `wr_id` of every send.
pub const SEND_WRID: u64 = 2;
/// The Q_Key both UD tools use.
pub const UD_QKEY: u32 = 0x1111_1111;
/// The Global Routing Header at the start of every UD receive buffer.
pub const GRH_LEN: usize = 40;
/// The TCP port of the handshake, unless `-p` says otherwise.
pub const DEFAULT_TCP_PORT: u16 = 18515;

/// Failures are messages: every example prints `NAME: message` and exits 1.
pub type Res<T> = Result<T, String>;

/// Adds what was being done to an error.
pub trait OrFail<T> {
    /// `Err(e)` becomes `Err("{what}: {e}")`.
    fn or_fail(self, what: &str) -> Res<T>;
}

impl<T, E: Display> OrFail<T> for Result<T, E> {
    fn or_fail(self, what: &str) -> Res<T> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

// ---------------------------------------------------------------------------
// Flags

/// What distinguishes one example's command line from another's.
#[derive(Debug)]
pub struct Tool {
    /// The example's name.
    pub name: &'static str,
    /// The rdma-core tool it mirrors.
    pub twin: &'static str,
    /// `-s` default.
    pub default_size: usize,
    /// Whether `-m/--mtu` exists (not for UD, whose messages fit one packet).
    pub has_mtu: bool,
    /// Whether `-o/--odp`, `-t/--ts` and `-N/--new_send` exist (rdma-core
    /// has them in `ibv_rc_pingpong` only).
    pub rc_flags: bool,
    /// Flags of the C tool that this port recognises but cannot honour.
    pub unsupported: &'static [Unsupported],
}

/// A flag of the C tool that this port does not implement, and why.
#[derive(Debug)]
pub struct Unsupported {
    /// Short form.
    pub short: char,
    /// Long form.
    pub long: &'static str,
    /// Why it is missing.
    pub why: &'static str,
}

/// A flag that only one example has (`srq_pingpong`'s `-q`), beyond the
/// set [`Tool`] describes. Its value lands in [`Opts::extra`].
#[derive(Debug)]
pub struct ExtraFlag {
    /// Short form.
    pub short: char,
    /// Long form.
    pub long: &'static str,
    /// What the value is.
    pub kind: ExtraKind,
    /// The help line.
    pub help: &'static str,
}

/// The value an [`ExtraFlag`] takes.
#[derive(Debug, Clone, Copy)]
pub enum ExtraKind {
    /// None: the flag is a switch.
    Switch,
    /// A number in `min..=max` (decimal, `0x` hex or `0` octal, as `strtoul`).
    Number {
        /// Smallest accepted.
        min: u64,
        /// Largest accepted.
        max: u64,
    },
    /// A path MTU in bytes: 256, 512, 1024, 2048 or 4096.
    Mtu,
}

/// What an [`ExtraFlag`] was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtraValue {
    /// A switch that was present.
    Set,
    /// A number, within the flag's range.
    Number(u64),
    /// A path MTU.
    Mtu(Mtu),
}

/// The parsed command line.
#[derive(Debug, Clone)]
pub struct Opts {
    /// TCP port of the handshake.
    pub tcp_port: u16,
    /// The device (`None`: the first one).
    pub ib_dev: Option<String>,
    /// The device's port.
    pub ib_port: u8,
    /// Message size in bytes.
    pub size: usize,
    /// Path MTU (`None`: the port's active MTU).
    pub mtu: Option<Mtu>,
    /// Receives kept posted.
    pub rx_depth: u32,
    /// Messages each way.
    pub iters: u32,
    /// Service level.
    pub sl: u8,
    /// Wait on a completion channel instead of busy polling.
    pub events: bool,
    /// Local GID index (`None`: no GID, InfiniBand LID routing).
    pub gid_idx: Option<u32>,
    /// Check every received message.
    pub chk: bool,
    /// Register memory with on-demand paging.
    pub odp: bool,
    /// Completion timestamps (an extended CQ).
    pub ts: bool,
    /// Post sends with the `ibv_wr_*` API (an extended QP).
    pub new_send: bool,
    /// The server to connect to (`None`: be the server).
    pub host: Option<String>,
    /// The [`ExtraFlag`]s given, by short name, in command-line order.
    pub extra: Vec<(char, ExtraValue)>,
}

impl Opts {
    /// The value of extra flag `short` (the last one given), if given.
    pub fn extra(&self, short: char) -> Option<ExtraValue> {
        self.extra
            .iter()
            .rev()
            .find(|(c, _)| *c == short)
            .map(|(_, v)| *v)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Port,
    IbDev,
    IbPort,
    Size,
    Mtu,
    RxDepth,
    Iters,
    Sl,
    Events,
    GidIdx,
    Chk,
    Odp,
    Ts,
    NewSend,
    Help,
    Unsupported(usize),
    Extra(usize),
}

#[derive(Debug)]
struct Flag {
    short: char,
    long: &'static str,
    takes_value: bool,
    key: Key,
}

fn flags(tool: &Tool, extra: &[ExtraFlag]) -> Vec<Flag> {
    let f = |short, long, takes_value, key| Flag {
        short,
        long,
        takes_value,
        key,
    };
    let mut v = vec![
        f('p', "port", true, Key::Port),
        f('d', "ib-dev", true, Key::IbDev),
        f('i', "ib-port", true, Key::IbPort),
        f('s', "size", true, Key::Size),
        f('r', "rx-depth", true, Key::RxDepth),
        f('n', "iters", true, Key::Iters),
        f('l', "sl", true, Key::Sl),
        f('e', "events", false, Key::Events),
        f('g', "gid-idx", true, Key::GidIdx),
        f('c', "chk", false, Key::Chk),
        f('h', "help", false, Key::Help),
    ];
    if tool.has_mtu {
        v.push(f('m', "mtu", true, Key::Mtu));
    }
    if tool.rc_flags {
        v.push(f('o', "odp", false, Key::Odp));
        v.push(f('t', "ts", false, Key::Ts));
        v.push(f('N', "new_send", false, Key::NewSend));
    }
    for (i, u) in tool.unsupported.iter().enumerate() {
        v.push(f(u.short, u.long, false, Key::Unsupported(i)));
    }
    for (i, e) in extra.iter().enumerate() {
        let takes_value = !matches!(e.kind, ExtraKind::Switch);
        v.push(f(e.short, e.long, takes_value, Key::Extra(i)));
    }
    v
}

/// The help text.
pub fn usage(tool: &Tool) -> String {
    usage_with(tool, &[])
}

/// The help text of a tool with [`ExtraFlag`]s.
pub fn usage_with(tool: &Tool, extra: &[ExtraFlag]) -> String {
    let mut s = format!(
        "Usage:\n  {n} [options]          be the server: wait for a client\n  \
         {n} [options] <host>   be the client of the server on <host>\n\n\
         Speaks the handshake of rdma-core's {t}, so either side may be the C tool.\n\n\
         Options:\n",
        n = tool.name,
        t = tool.twin
    );
    let mut line = |flags: &str, text: &str| s.push_str(&format!("  {flags:<26}{text}\n"));
    line(
        "-p, --port=<port>",
        &format!("TCP port of the handshake (default {DEFAULT_TCP_PORT})"),
    );
    line("-d, --ib-dev=<dev>", "RDMA device (default: the first one)");
    line("-i, --ib-port=<port>", "port of the device (default 1)");
    line(
        "-s, --size=<bytes>",
        &format!("bytes per message (default {})", tool.default_size),
    );
    if tool.has_mtu {
        line(
            "-m, --mtu=<bytes>",
            "path MTU: 256, 512, 1024, 2048 or 4096 (default: the port's active MTU)",
        );
    }
    line("-r, --rx-depth=<n>", "receives kept posted (default 500)");
    line("-n, --iters=<n>", "messages each way (default 1000)");
    line("-l, --sl=<sl>", "service level, 0 to 15 (default 0)");
    line(
        "-e, --events",
        "sleep on a completion channel instead of busy polling",
    );
    line(
        "-g, --gid-idx=<index>",
        "local GID index, needed on RoCE (default: none)",
    );
    line(
        "-c, --chk",
        "check the contents of every message received (the pattern of the C tool)",
    );
    if tool.rc_flags {
        line("-o, --odp", "register the buffers with on-demand paging");
        line(
            "-t, --ts",
            "read completion timestamps (extended CQ) and print receive intervals",
        );
        line(
            "-N, --new_send",
            "post sends with the ibv_wr_* API (extended QP) instead of ibv_post_send",
        );
    }
    for e in extra {
        let value = match e.kind {
            ExtraKind::Switch => "",
            ExtraKind::Number { .. } => "=<n>",
            ExtraKind::Mtu => "=<bytes>",
        };
        line(&format!("-{}, --{}{value}", e.short, e.long), e.help);
    }
    line("-h, --help", "print this text");
    for u in tool.unsupported {
        line(
            &format!("-{}, --{}", u.short, u.long),
            &format!("not supported: {}", u.why),
        );
    }
    s
}

/// Why the command line was not accepted.
#[derive(Debug)]
pub enum ArgError {
    /// `-h`/`--help`.
    Help,
    /// A bad flag or value, with what was wrong.
    Bad(String),
}

/// Parses a number as C's `strtoul(s, NULL, 0)` would accept it: decimal,
/// `0x` hexadecimal or `0` octal; unlike `strtoul`, trailing junk is an error.
fn parse_c_number(s: &str) -> Option<u64> {
    let s = s.trim();
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).ok()
    } else if s.len() > 1 && s.starts_with('0') {
        u64::from_str_radix(&s[1..], 8).ok()
    } else {
        s.parse().ok()
    }
}

fn number<T: TryFrom<u64>>(flag: &str, value: &str, range: &str) -> Result<T, ArgError> {
    parse_c_number(value)
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| ArgError::Bad(format!("invalid value {value:?} for {flag}: {range}")))
}

fn apply(
    tool: &Tool,
    extra: &[ExtraFlag],
    opts: &mut Opts,
    key: Key,
    name: &str,
    v: &str,
) -> Result<(), ArgError> {
    match key {
        Key::Port => opts.tcp_port = number(name, v, "expected a TCP port, 0 to 65535")?,
        Key::IbDev => opts.ib_dev = Some(v.to_string()),
        Key::IbPort => {
            opts.ib_port = number(name, v, "expected a port number, 1 to 255")?;
            if opts.ib_port == 0 {
                return Err(ArgError::Bad(format!("{name}: ports are numbered from 1")));
            }
        }
        Key::Size => {
            opts.size = number(name, v, "expected a size in bytes")?;
            if opts.size == 0 {
                return Err(ArgError::Bad(format!(
                    "{name}: the size must be at least 1"
                )));
            }
        }
        Key::Mtu => opts.mtu = Some(mtu(name, v)?),
        Key::RxDepth => {
            opts.rx_depth = number(name, v, "expected a count")?;
            if opts.rx_depth == 0 {
                return Err(ArgError::Bad(format!(
                    "{name}: at least one receive must be posted"
                )));
            }
        }
        Key::Iters => {
            opts.iters = number(name, v, "expected a count")?;
            if opts.iters == 0 {
                return Err(ArgError::Bad(format!("{name}: at least one iteration")));
            }
        }
        Key::Sl => {
            opts.sl = number(name, v, "expected a service level, 0 to 15")?;
            if opts.sl > 15 {
                return Err(ArgError::Bad(format!(
                    "invalid value {v:?} for {name}: expected a service level, 0 to 15"
                )));
            }
        }
        Key::GidIdx => {
            // As in the C tools, a negative index means "no GID".
            opts.gid_idx = if v.trim().starts_with('-') {
                None
            } else {
                Some(number(name, v, "expected a GID table index")?)
            };
        }
        Key::Events => opts.events = true,
        Key::Chk => opts.chk = true,
        Key::Odp => opts.odp = true,
        Key::Ts => opts.ts = true,
        Key::NewSend => opts.new_send = true,
        Key::Help => return Err(ArgError::Help),
        Key::Unsupported(i) => {
            let u = &tool.unsupported[i];
            return Err(ArgError::Bad(format!(
                "-{}/--{} of {} is not supported by this port: {}",
                u.short, u.long, tool.twin, u.why
            )));
        }
        Key::Extra(i) => {
            let e = &extra[i];
            let value = match e.kind {
                ExtraKind::Switch => ExtraValue::Set,
                ExtraKind::Mtu => ExtraValue::Mtu(mtu(name, v)?),
                ExtraKind::Number { min, max } => {
                    let range = format!("expected a number from {min} to {max}");
                    let n: u64 = number(name, v, &range)?;
                    if n < min || n > max {
                        return Err(ArgError::Bad(format!(
                            "invalid value {v:?} for {name}: {range}"
                        )));
                    }
                    ExtraValue::Number(n)
                }
            };
            opts.extra.push((e.short, value));
        }
    }
    Ok(())
}

fn mtu(name: &str, v: &str) -> Result<Mtu, ArgError> {
    let bytes: u32 = number(name, v, "expected 256, 512, 1024, 2048 or 4096")?;
    Mtu::from_bytes(bytes).ok_or_else(|| {
        ArgError::Bad(format!(
            "invalid value {v:?} for {name}: expected 256, 512, 1024, 2048 or 4096"
        ))
    })
}

/// Parses `args` (without the program name) the way `getopt_long` does for
/// the C tools: clustered short flags (`-ec`), attached or separate values
/// (`-n50`, `-n 50`), `--long=value` or `--long value`, unique prefixes of
/// long names, `--` to end the flags, and the host anywhere.
///
/// # Errors
/// [`ArgError::Help`] for `-h`, [`ArgError::Bad`] for anything not accepted.
pub fn parse_args(tool: &Tool, args: impl IntoIterator<Item = String>) -> Result<Opts, ArgError> {
    parse_args_with(tool, &[], args)
}

/// [`parse_args`] for a tool with [`ExtraFlag`]s.
///
/// # Errors
/// As [`parse_args`].
pub fn parse_args_with(
    tool: &Tool,
    extra: &[ExtraFlag],
    args: impl IntoIterator<Item = String>,
) -> Result<Opts, ArgError> {
    let table = flags(tool, extra);
    let mut opts = Opts {
        tcp_port: DEFAULT_TCP_PORT,
        ib_dev: None,
        ib_port: 1,
        size: tool.default_size,
        mtu: None,
        rx_depth: 500,
        iters: 1000,
        sl: 0,
        events: false,
        gid_idx: None,
        chk: false,
        odp: false,
        ts: false,
        new_send: false,
        host: None,
        extra: Vec::new(),
    };
    let mut positional = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "--" {
            positional.extend(args.by_ref());
            break;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            let exact = table.iter().find(|f| f.long == name);
            let prefixed: Vec<&Flag> = table.iter().filter(|f| f.long.starts_with(name)).collect();
            let flag = match (exact, prefixed.as_slice()) {
                (Some(f), _) => f,
                (None, [f]) if !name.is_empty() => *f,
                (None, []) | (None, [_]) => {
                    return Err(ArgError::Bad(format!("unrecognized option '--{name}'")))
                }
                (None, _) => return Err(ArgError::Bad(format!("option '--{name}' is ambiguous"))),
            };
            let shown = format!("--{}", flag.long);
            let value = match (flag.takes_value, inline) {
                (true, Some(v)) => v,
                (true, None) => args.next().ok_or_else(|| {
                    ArgError::Bad(format!("option '{shown}' requires an argument"))
                })?,
                (false, Some(_)) => {
                    return Err(ArgError::Bad(format!(
                        "option '{shown}' doesn't allow an argument"
                    )))
                }
                (false, None) => String::new(),
            };
            apply(tool, extra, &mut opts, flag.key, &shown, &value)?;
        } else if let Some(cluster) = arg.strip_prefix('-').filter(|c| !c.is_empty()) {
            for (at, c) in cluster.char_indices() {
                let flag = table
                    .iter()
                    .find(|f| f.short == c)
                    .ok_or_else(|| ArgError::Bad(format!("invalid option -- '{c}'")))?;
                let shown = format!("-{c}");
                if flag.takes_value {
                    let rest = &cluster[at + c.len_utf8()..];
                    let value = if rest.is_empty() {
                        args.next().ok_or_else(|| {
                            ArgError::Bad(format!("option requires an argument -- '{c}'"))
                        })?
                    } else {
                        rest.to_string()
                    };
                    apply(tool, extra, &mut opts, flag.key, &shown, &value)?;
                    break;
                }
                apply(tool, extra, &mut opts, flag.key, &shown, "")?;
            }
        } else {
            positional.push(arg);
        }
    }
    match positional.len() {
        0 => {}
        1 => opts.host = positional.pop(),
        _ => {
            return Err(ArgError::Bad(format!(
                "one server host at most, got {}",
                positional.join(" ")
            )))
        }
    }
    Ok(opts)
}

/// Parses the command line and runs `run`; prints errors as `NAME: message`.
/// Exit status: 0 on success, 1 on any failure (as the C tools).
pub fn main(tool: &Tool, run: impl FnOnce(&Opts) -> Res<()>) -> ExitCode {
    main_with(tool, &[], run)
}

/// [`main`] for a tool with [`ExtraFlag`]s.
pub fn main_with(tool: &Tool, extra: &[ExtraFlag], run: impl FnOnce(&Opts) -> Res<()>) -> ExitCode {
    let opts = match parse_args_with(tool, extra, std::env::args().skip(1)) {
        Ok(o) => o,
        Err(ArgError::Help) => {
            print!("{}", usage_with(tool, extra));
            return ExitCode::SUCCESS;
        }
        Err(ArgError::Bad(msg)) => {
            eprintln!("{}: {msg}", tool.name);
            eprint!("{}", usage_with(tool, extra));
            return ExitCode::FAILURE;
        }
    };
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("{}: {msg}", tool.name);
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------
// Device

/// Opens `-d` (or the first device) and queries `-i`.
///
/// # Errors
/// No such device, no device at all, or no such port, said plainly.
/// Posts receives of `free` buffers with `post` (a QP's or an SRQ's
/// `post_recv_batch`) until `rx_depth` are outstanding (`routs`); buffers
/// the post gives back go back to `free`.
///
/// # Errors
/// `Couldn't post receive (N)` when fewer than `rx_depth` are posted.
pub fn refill_from(
    free: &mut Vec<MemoryRegion>,
    routs: &mut u32,
    rx_depth: u32,
    post: impl FnOnce(Vec<(u64, WrBuffers)>) -> Result<(), rdma::PostError>,
) -> Res<()> {
    let want = (rx_depth - *routs) as usize;
    let n = want.min(free.len());
    let batch = free
        .split_off(free.len() - n)
        .into_iter()
        .map(|m| (RECV_WRID, WrBuffers::from(m)))
        .collect();
    let mut error = None;
    let mut posted = n as u32;
    if let Err(e) = post(batch) {
        posted -= e.returned.len() as u32;
        for (_, b) in e.returned {
            free.extend(b.into_vec());
        }
        error = Some(e.error);
    }
    *routs += posted;
    if *routs < rx_depth {
        return Err(match error {
            Some(e) => format!("Couldn't post receive ({routs}): {e}"),
            None => format!("Couldn't post receive ({routs}): only {n} buffers are free"),
        });
    }
    Ok(())
}

/// `-e`: a completion channel for the CQs, or none (busy polling).
///
/// # Errors
/// `Couldn't create completion channel`.
pub fn comp_channel(ctx: &Context, events: bool) -> Res<Option<CompletionChannel>> {
    if !events {
        return Ok(None);
    }
    ctx.create_comp_channel()
        .map(Some)
        .or_fail("Couldn't create completion channel")
}

/// `-o`: [`AccessFlags::ON_DEMAND`] if the device pages RC sends and the
/// receives `recv` names (`IBV_ODP_SUPPORT_RECV` or `_SRQ_RECV`, described
/// by `recvs`) on demand.
///
/// # Errors
/// The device lacks on-demand paging of them.
pub fn odp_access(ctx: &Context, recv: u32, recvs: &str) -> Res<AccessFlags> {
    let attr = ctx
        .query_device()
        .or_fail("Couldn't query device for its features")?;
    let rc = attr.as_raw().odp_caps.per_transport_caps.rc_odp_caps;
    let need = rdma::ffi::IBV_ODP_SUPPORT_SEND | recv;
    if attr.odp_general_caps() & u64::from(rdma::ffi::IBV_ODP_SUPPORT) == 0 || rc & need != need {
        return Err(format!(
            "{} does not support on-demand paging of RC sends and {recvs}",
            ctx.name()
        ));
    }
    Ok(AccessFlags::ON_DEMAND)
}

pub fn open_device(opts: &Opts) -> Res<(Context, PortAttr)> {
    let ctx = match &opts.ib_dev {
        Some(name) => Context::open(name).map_err(|e| e.to_string())?,
        None => {
            let devices = rdma::devices().or_fail("Failed to get the RDMA device list")?;
            let first = devices.first().ok_or("No RDMA devices found")?;
            first
                .open()
                .or_fail(&format!("Couldn't open {}", first.name()))?
        }
    };
    let port = ctx
        .query_port(u32::from(opts.ib_port))
        .or_fail("Couldn't get port info")?;
    Ok((ctx, port))
}

/// The page size, which the `-c` pattern is laid out on.
pub fn page_size() -> usize {
    // The safe crate has no page-size query (its own is private).
    // SAFETY: sysconf has no preconditions and touches no memory of ours.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

// ---------------------------------------------------------------------------
// Handshake

/// The size of a handshake message: `"0000:000000:000000:"`, 32 GID digits,
/// and a NUL, as the C tools' `sizeof` of their template string.
pub const MSG_LEN: usize = 52;

/// One side's address, as exchanged in the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// Initial packet sequence number (24 bits).
    pub psn: u32,
    /// GID (all zero when no `-g` was given).
    pub gid: Gid,
}

/// The GID as the C tools put it on the wire: 32 lower-case hex digits of the
/// 16 bytes in order (pingpong.c's `gid_to_wire_gid` prints each 4-byte group
/// converted to network order, which is the same thing).
pub fn gid_to_wire(gid: &Gid) -> String {
    gid.raw().iter().map(|b| format!("{b:02x}")).collect()
}

/// The inverse of [`gid_to_wire`].
///
/// # Errors
/// Anything but 32 hex digits.
pub fn gid_from_wire(s: &str) -> Res<Gid> {
    if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("bad GID {s:?}: expected 32 hex digits"));
    }
    let mut raw = [0u8; 16];
    for (i, byte) in raw.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    Ok(Gid::from_raw(raw))
}

impl Dest {
    /// The 52-byte handshake message.
    pub fn to_wire(self) -> [u8; MSG_LEN] {
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn,
            self.psn,
            gid_to_wire(&self.gid)
        );
        let mut msg = [0u8; MSG_LEN];
        msg[..text.len()].copy_from_slice(text.as_bytes());
        msg
    }

    /// Parses a handshake message.
    ///
    /// # Errors
    /// A message that is not `lid:qpn:psn:gid` in hex.
    pub fn from_wire(msg: &[u8]) -> Res<Dest> {
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = std::str::from_utf8(&msg[..end])
            .map_err(|_| "the peer's address is not text".to_string())?;
        let bad = |why: &str| format!("bad address from the peer ({why}): {text:?}");
        let fields: Vec<&str> = text.split(':').collect();
        let [lid, qpn, psn, gid] = fields[..] else {
            return Err(bad("expected lid:qpn:psn:gid"));
        };
        let hex = |s: &str, max: u32, what: &str| {
            u32::from_str_radix(s, 16)
                .ok()
                .filter(|&v| v <= max)
                .ok_or_else(|| bad(what))
        };
        Ok(Dest {
            lid: hex(lid, 0xffff, "LID")? as u16,
            qpn: hex(qpn, 0xff_ffff, "QPN")?,
            psn: hex(psn, 0xff_ffff, "PSN")?,
            gid: gid_from_wire(gid).map_err(|e| bad(&e))?,
        })
    }

    /// Prints the address line the C tools print (`label` is `local` or `remote`).
    pub fn print(&self, label: &str) {
        let label = format!("{label} address:");
        println!(
            "  {label:<16}LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            self.lid,
            self.qpn,
            self.psn,
            Ipv6Addr::from(self.gid.raw())
        );
    }
}

/// A random 24-bit PSN (std's hasher keys are random per process).
pub fn random_psn() -> u32 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    (h.finish() as u32) & 0xff_ffff
}

/// This side's address: the port's LID, the `-g` GID, a random PSN.
///
/// # Errors
/// InfiniBand without a LID (`check_lid`), or a GID index that cannot be read.
pub fn local_dest(
    ctx: &Context,
    port: &PortAttr,
    opts: &Opts,
    qpn: u32,
    check_lid: bool,
) -> Res<Dest> {
    if check_lid && port.link_layer != LinkLayer::Ethernet && port.lid == 0 {
        return Err("Couldn't get local LID (is the subnet manager running?)".into());
    }
    let gid = match opts.gid_idx {
        Some(i) => ctx
            .query_gid(u32::from(opts.ib_port), i)
            .or_fail(&format!("can't read sgid of index {i}"))?,
        None => Gid::default(),
    };
    Ok(Dest {
        lid: port.lid,
        qpn,
        psn: random_psn(),
        gid,
    })
}

/// The address vector towards `peer`: by LID, plus a GRH from `-g` when the
/// peer sent a GID (RoCE always does), as the C tools decide it.
///
/// # Errors
/// The peer sent a GID but this side has no `-g`, or the port is Ethernet
/// (RoCE) and the peer sent no GID.
pub fn peer_ah(opts: &Opts, port: &PortAttr, peer: &Dest) -> Res<AhAttr> {
    if peer.gid.is_zero() && port.link_layer == LinkLayer::Ethernet {
        return Err(
            "the peer sent no GID, but on an Ethernet (RoCE) port packets are addressed by \
             GID: run both sides with -g"
                .into(),
        );
    }
    let mut ah = AhAttr::local(opts.ib_port, peer.lid);
    ah.sl = opts.sl;
    if peer.gid.interface_id() != 0 {
        let index = opts.gid_idx.ok_or_else(|| {
            format!(
                "the peer sent GID {}, so this side needs a local GID index: pass -g",
                Ipv6Addr::from(peer.gid.raw())
            )
        })?;
        let sgid_index = u8::try_from(index)
            .map_err(|_| format!("GID index {index} does not fit an address vector"))?;
        ah.grh = Some(GlobalRoute {
            dgid: peer.gid,
            flow_label: 0,
            sgid_index,
            hop_limit: 1,
            traffic_class: 0,
        });
    }
    Ok(ah)
}

/// Reads exactly `buf.len()` bytes; a peer that hangs up early (typically
/// because it could not connect its QP to us) is said so.
fn read_exactly(sock: &mut TcpStream, buf: &mut [u8], what: &str) -> Res<()> {
    sock.read_exact(buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            format!(
                "{what}: the peer closed the connection (it may have refused our address: \
                 see its output)"
            )
        } else {
            format!("{what}: {e}")
        }
    })
}

fn listen(port: u16) -> Res<TcpListener> {
    // Like getaddrinfo(NULL, AI_PASSIVE): the IPv6 wildcard (dual stack on
    // Linux) and, where IPv6 is off, the IPv4 one. std sets SO_REUSEADDR.
    TcpListener::bind((Ipv6Addr::UNSPECIFIED, port))
        .or_else(|_| TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)))
        .or_fail(&format!("Couldn't listen to port {port}"))
}

/// `what`, with the record's index when there are several.
fn which(what: &str, i: usize, n: usize) -> String {
    if n == 1 {
        what.to_string()
    } else {
        format!("{what} [{i}]")
    }
}

/// Reads `n` handshake messages.
fn read_dests(sock: &mut TcpStream, n: usize) -> Res<Vec<Dest>> {
    let mut peers = Vec::with_capacity(n);
    for i in 0..n {
        let mut msg = [0u8; MSG_LEN];
        read_exactly(sock, &mut msg, &which("Couldn't read remote address", i, n))?;
        peers.push(Dest::from_wire(&msg).map_err(|e| which(&e, i, n))?);
    }
    Ok(peers)
}

/// Sends the handshake messages of `mine`, in order.
fn write_dests(sock: &mut TcpStream, mine: &[Dest]) -> Res<()> {
    let wire: Vec<u8> = mine.iter().flat_map(|d| d.to_wire()).collect();
    sock.write_all(&wire).or_fail("Couldn't send local address")
}

/// The one element of a one-record exchange.
fn only(peers: Vec<Dest>) -> Res<Dest> {
    peers
        .into_iter()
        .next()
        .ok_or_else(|| "the handshake returned no address".to_string())
}

/// The server's half: waits for one client, reads its address, runs
/// `connect` with it (RTR/RTS), then answers with `me`.
///
/// # Errors
/// Socket errors, a malformed message, or `connect`'s error.
pub fn server_exchange(port: u16, me: &Dest, connect: impl FnOnce(&Dest) -> Res<()>) -> Res<Dest> {
    only(server_exchange_all(
        port,
        std::slice::from_ref(me),
        |peers| match peers {
            [peer] => connect(peer),
            _ => Err("expected one address".into()),
        },
    )?)
}

/// The server's half for `mine.len()` addresses each way: waits for one
/// client, reads as many messages as `mine` has, runs `connect` with them,
/// then answers with `mine`.
///
/// # Errors
/// Socket errors, a malformed message, or `connect`'s error.
pub fn server_exchange_all(
    port: u16,
    mine: &[Dest],
    connect: impl FnOnce(&[Dest]) -> Res<()>,
) -> Res<Vec<Dest>> {
    let listener = listen(port)?;
    let (mut sock, _) = listener.accept().or_fail("accept() failed")?;
    drop(listener);
    let peers = read_dests(&mut sock, mine.len())?;
    connect(&peers).map_err(|e| format!("Couldn't connect to remote QP: {e}"))?;
    write_dests(&mut sock, mine)?;
    let mut done = [0u8; 5];
    read_exactly(&mut sock, &mut done, "Couldn't read the client's \"done\"")?;
    if &done != b"done\0" {
        return Err(format!("expected \"done\" from the client, got {done:?}"));
    }
    Ok(peers)
}

/// The client's half: connects to `host:port`, sends `me`, reads the
/// server's address and says `"done"`.
///
/// # Errors
/// Name resolution, connection and socket errors; a malformed message.
pub fn client_exchange(host: &str, port: u16, me: &Dest) -> Res<Dest> {
    only(client_exchange_all(host, port, std::slice::from_ref(me))?)
}

/// The client's half for `mine.len()` addresses each way: connects to
/// `host:port`, sends `mine`, reads as many messages back and says `"done"`.
///
/// # Errors
/// Name resolution, connection and socket errors; a malformed message.
pub fn client_exchange_all(host: &str, port: u16, mine: &[Dest]) -> Res<Vec<Dest>> {
    let addrs = (host, port)
        .to_socket_addrs()
        .or_fail(&format!("Couldn't resolve {host}:{port}"))?;
    let mut last = None;
    let mut sock = None;
    for addr in addrs {
        match TcpStream::connect(addr) {
            Ok(s) => {
                sock = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let mut sock = sock.ok_or_else(|| match last {
        Some(e) => format!("Couldn't connect to {host}:{port}: {e}"),
        None => format!("Couldn't connect to {host}:{port}: no address"),
    })?;
    write_dests(&mut sock, mine)?;
    let peers = read_dests(&mut sock, mine.len())?;
    sock.write_all(b"done\0")
        .or_fail("Couldn't send \"done\"")?;
    Ok(peers)
}

/// Runs the handshake for the side `opts` says, connecting the QP with
/// `connect`: the server inside the exchange, the client right after it.
///
/// # Errors
/// As [`server_exchange`] and [`client_exchange`].
pub fn exchange(opts: &Opts, me: &Dest, connect: impl FnOnce(&Dest) -> Res<()>) -> Res<Dest> {
    only(exchange_all(
        opts,
        std::slice::from_ref(me),
        |peers| match peers {
            [peer] => connect(peer),
            _ => Err("expected one address".into()),
        },
    )?)
}

/// [`exchange`] with `mine.len()` messages each way (`ibv_srq_pingpong`
/// sends one per QP slot); `connect` gets the peer's, in order.
///
/// # Errors
/// As [`server_exchange_all`] and [`client_exchange_all`].
pub fn exchange_all(
    opts: &Opts,
    mine: &[Dest],
    connect: impl FnOnce(&[Dest]) -> Res<()>,
) -> Res<Vec<Dest>> {
    match &opts.host {
        Some(host) => {
            let peers = client_exchange_all(host, opts.tcp_port, mine)?;
            connect(&peers)?;
            Ok(peers)
        }
        None => server_exchange_all(opts.tcp_port, mine, connect),
    }
}

// ---------------------------------------------------------------------------
// Traffic

/// The bytes every message carries. With `-c`: 0x7b with a 0 at the start of
/// every page, which is what the C tools' client writes (their check looks at
/// the first byte of each page); without: 0x7b, the C tools' fill byte.
pub fn message_pattern(len: usize, chk: bool, page: usize) -> Res<Vec<u8>> {
    let mut v = filled(len, 0x7b)?;
    if chk {
        v.iter_mut().step_by(page.max(1)).for_each(|b| *b = 0);
    }
    Ok(v)
}

/// `len` bytes of `byte`, failing (instead of aborting) when memory is short.
pub fn filled(len: usize, byte: u8) -> Res<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| format!("Couldn't allocate {len} bytes of buffers"))?;
    v.resize(len, byte);
    Ok(v)
}

/// Prints the C tools' two result lines: `size × iters` bytes each way in
/// `elapsed`.
pub fn print_results(opts: &Opts, elapsed: Duration) {
    let usec = elapsed.as_secs_f64() * 1e6;
    let bytes = opts.size as u64 * u64::from(opts.iters) * 2;
    println!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        opts.iters,
        usec / 1e6,
        usec / f64::from(opts.iters)
    );
}

#[derive(Debug)]
enum SendBuf {
    /// Copied into the work request at post time (`IBV_SEND_INLINE`).
    Inline(Vec<u8>),
    /// A registered buffer: `None` while the send is in flight.
    Region(Option<MemoryRegion>),
}

/// Intervals between receive completions, in device clock ticks (`-t`).
#[derive(Debug)]
struct Timestamps {
    /// The device's `completion_timestamp_mask`: where its clock wraps.
    mask: u64,
    prev: Option<u64>,
    max: u64,
    min: u64,
    total: u64,
    count: u32,
}

impl Timestamps {
    fn receive(&mut self, ts: Option<u64>) {
        let Some(ts) = ts else {
            self.prev = None;
            return;
        };
        if let Some(prev) = self.prev {
            let delta = if ts >= prev {
                ts - prev
            } else {
                // The clock wrapped at `mask`.
                self.mask - prev + ts + 1
            };
            self.max = self.max.max(delta);
            self.min = self.min.min(delta);
            self.total += delta;
            self.count += 1;
        }
        self.prev = Some(ts);
    }
}

#[derive(Debug)]
struct BadMessage {
    index: u32,
    byte_len: u32,
    pages: Vec<usize>,
}

/// The buffers and counters of a ping-pong run.
#[derive(Debug)]
pub struct Traffic {
    size: usize,
    /// Bytes before the payload in a receive buffer (the UD GRH).
    headroom: usize,
    rx_depth: u32,
    /// Receive buffers not posted: each receive completion gives its buffer
    /// back, and the refill posts them again.
    free: Vec<MemoryRegion>,
    /// Receives posted and not completed.
    routs: u32,
    send: SendBuf,
    /// With `-c`: what every payload must be.
    expect: Option<Vec<u8>>,
    page: usize,
    bad: Vec<BadMessage>,
    /// With `-t`: poll with the extended CQ's cursor and keep statistics.
    timestamps: Option<Timestamps>,
}

impl Traffic {
    /// Registers `rx_depth` receive buffers of `headroom + size` bytes (one
    /// registration cut into pieces) and the send buffer (`inline`: none,
    /// the data is copied at post time).
    ///
    /// # Errors
    /// Allocation or registration failures.
    pub fn new(
        pd: &ProtectionDomain,
        opts: &Opts,
        headroom: usize,
        access: AccessFlags,
        inline: bool,
    ) -> Res<Traffic> {
        let page = page_size();
        let data = message_pattern(opts.size, opts.chk, page)?;
        let piece = opts.size + headroom;
        let total = piece
            .checked_mul(opts.rx_depth as usize)
            .ok_or("the receive buffers (size × rx-depth) do not fit in memory")?;
        let recv = pd
            .reg_mr(filled(total, 0x7b)?, access | AccessFlags::LOCAL_WRITE)
            .or_fail(&format!(
                "Couldn't register {total} bytes of receive buffers"
            ))?;
        let free = recv
            .chunks(piece)
            .or_fail("Couldn't cut the receive buffers")?;
        let send = if inline {
            SendBuf::Inline(data.clone())
        } else {
            SendBuf::Region(Some(
                pd.reg_mr(data.clone(), access)
                    .or_fail("Couldn't register the send buffer")?,
            ))
        };
        Ok(Traffic {
            size: opts.size,
            headroom,
            rx_depth: opts.rx_depth,
            free,
            routs: 0,
            send,
            expect: opts.chk.then_some(data),
            page,
            bad: Vec::new(),
            timestamps: None,
        })
    }

    /// Reads completion timestamps: the CQ must come from
    /// `create_cq_ex(.., timestamps: true)`; `mask` is the device's
    /// `completion_timestamp_mask`.
    pub fn with_timestamps(&mut self, mask: u64) {
        self.timestamps = Some(Timestamps {
            mask,
            prev: None,
            max: 0,
            min: u64::from(u32::MAX),
            total: 0,
            count: 0,
        });
    }

    /// Appends up to `max` completions, with their timestamps under `-t`.
    fn poll(
        &self,
        cq: &CompletionQueue,
        out: &mut Vec<(Completion, Option<u64>)>,
        max: usize,
    ) -> Res<usize> {
        if self.timestamps.is_none() {
            let mut wcs = Vec::with_capacity(max);
            let n = cq.poll(&mut wcs, max).or_fail("poll CQ failed")?;
            out.extend(wcs.into_iter().map(|c| (c, None)));
            return Ok(n);
        }
        let Some(mut cursor) = cq.start_poll().or_fail("poll CQ failed")? else {
            return Ok(0);
        };
        let mut n = 0;
        loop {
            let ts = cursor.completion_ts();
            if let Some(c) = cursor.take() {
                out.push((c, ts));
                n += 1;
            }
            if n >= max || !cursor.next().or_fail("poll CQ failed")? {
                return Ok(n);
            }
        }
    }

    /// Posts receives until `rx_depth` are outstanding.
    ///
    /// # Errors
    /// `Couldn't post receive (N)` when fewer than `rx_depth` are posted.
    pub fn refill(&mut self, qp: &mut QueuePair) -> Res<()> {
        refill_from(&mut self.free, &mut self.routs, self.rx_depth, |batch| {
            qp.post_recv_batch(batch)
        })
    }

    fn post_send(&mut self, qp: &mut QueuePair, ud: Option<&UdDest>) -> Res<()> {
        match &mut self.send {
            SendBuf::Inline(data) => {
                let mut wr = InlineSend::send(SEND_WRID, data);
                if let Some(d) = ud {
                    wr = wr.ud(&d.ah, d.remote_qpn, d.remote_qkey);
                }
                qp.post_send_inline(wr).or_fail("Couldn't post send")
            }
            SendBuf::Region(slot) => {
                let mr = slot
                    .take()
                    .ok_or("Couldn't post send: the previous send has not completed")?;
                let mut wr = SendWr::send(SEND_WRID, mr);
                if let Some(d) = ud {
                    wr = wr.ud(&d.ah, d.remote_qpn, d.remote_qkey);
                }
                qp.post_send(wr).map_err(|e| {
                    *slot = e
                        .returned
                        .into_iter()
                        .next()
                        .and_then(|(_, b)| b.into_one());
                    format!("Couldn't post send: {}", e.error)
                })
            }
        }
    }

    fn check(&mut self, mr: &MemoryRegion, byte_len: u32, index: u32) -> Res<()> {
        let Some(expect) = &self.expect else {
            return Ok(());
        };
        let bytes = mr.as_slice().or_fail("Couldn't read a receive buffer")?;
        let payload = &bytes[self.headroom..];
        let len_ok = byte_len as usize == self.headroom + self.size;
        if len_ok && payload == &expect[..] {
            return Ok(());
        }
        let pages = bad_pages(payload, expect, self.page);
        self.bad.push(BadMessage {
            index,
            byte_len,
            pages,
        });
        Ok(())
    }

    /// Runs the ping-pong: `iters` sends and receives on this side, the client
    /// (`opts.host`) sending first. With a channel, waits for events (the CQ
    /// must have been armed before the peer could send), re-arms, then drains
    /// the CQ; without, busy-polls. Returns the time from the first send on.
    ///
    /// # Errors
    /// A failed completion, post or poll, as the C tools report them.
    pub fn run(
        &mut self,
        qp: &mut QueuePair,
        cq: &CompletionQueue,
        channel: Option<&CompletionChannel>,
        ud: Option<&UdDest>,
        opts: &Opts,
    ) -> Res<Duration> {
        let iters = opts.iters;
        let mut pending = RECV_WRID;
        if opts.host.is_some() {
            self.post_send(qp, ud)?;
            pending |= SEND_WRID;
        }
        let start = Instant::now();
        let (mut rcnt, mut scnt) = (0u32, 0u32);
        let mut wcs = Vec::with_capacity(16);
        while rcnt < iters || scnt < iters {
            match channel {
                Some(ch) => {
                    let event = ch.get_event().or_fail("Failed to get cq_event")?;
                    if event.cq().as_raw() != cq.as_raw() {
                        return Err("CQ event for unknown CQ".into());
                    }
                    drop(event); // acknowledges it
                    cq.req_notify(false)
                        .or_fail("Couldn't request CQ notification")?;
                    while self.poll(cq, &mut wcs, 16)? > 0 {}
                }
                None => {
                    while wcs.is_empty() {
                        self.poll(cq, &mut wcs, 2)?;
                    }
                }
            }
            for (mut wc, ts) in wcs.drain(..) {
                if wc.status != WcStatus::Success {
                    return Err(format!(
                        "Failed status {} ({}) for wr_id {}",
                        wc.status,
                        wc.status.to_raw(),
                        wc.wr_id
                    ));
                }
                match wc.wr_id {
                    SEND_WRID => {
                        scnt += 1;
                        if let SendBuf::Region(slot) = &mut self.send {
                            *slot =
                                Some(wc.take_buffers().into_one().ok_or(
                                    "the send buffer did not come back with its completion",
                                )?);
                        }
                    }
                    RECV_WRID => {
                        let mr = wc
                            .take_buffers()
                            .into_one()
                            .ok_or("a receive buffer did not come back with its completion")?;
                        self.check(&mr, wc.byte_len, rcnt)?;
                        if let Some(t) = &mut self.timestamps {
                            t.receive(ts);
                        }
                        self.free.push(mr);
                        self.routs -= 1;
                        if self.routs <= 1 {
                            self.refill(qp)?;
                        }
                        rcnt += 1;
                    }
                    other => return Err(format!("Completion for unknown wr_id {other}")),
                }
                pending &= !wc.wr_id;
                if scnt < iters && pending == 0 {
                    self.post_send(qp, ud)?;
                    pending = RECV_WRID | SEND_WRID;
                }
            }
        }
        Ok(start.elapsed())
    }

    /// Prints the C tools' two result lines and, with `-c`, what was wrong.
    ///
    /// # Errors
    /// With `-c`, when any received message differed from the pattern.
    pub fn report(&self, opts: &Opts, elapsed: Duration) -> Res<()> {
        print_results(opts, elapsed);
        if let Some(t) = self.timestamps.as_ref().filter(|t| t.count > 0) {
            println!("Max receive completion clock cycles = {}", t.max);
            println!("Min receive completion clock cycles = {}", t.min);
            println!(
                "Average receive completion clock cycles = {:.6}",
                t.total as f64 / f64::from(t.count)
            );
        }
        let Some(first) = self.bad.first() else {
            return Ok(());
        };
        for page in &first.pages {
            println!("invalid data in page {page}");
        }
        Err(format!(
            "{} of {} messages received had invalid data (the first: message {}, {} bytes \
             received, {} expected)",
            self.bad.len(),
            opts.iters,
            first.index,
            first.byte_len,
            self.headroom + self.size
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RC: Tool = Tool {
        name: "rc_pingpong",
        twin: "ibv_rc_pingpong",
        default_size: 4096,
        has_mtu: true,
        rc_flags: true,
        unsupported: &[Unsupported {
            short: 'j',
            long: "dm",
            why: "no device memory",
        }],
    };

    fn parse(args: &[&str]) -> Result<Opts, ArgError> {
        parse_args(&RC, args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn wire_format_matches_the_c_tools() {
        // What ibv_rc_pingpong sends for QPN 0x11, PSN 0x4c5d1e, GID ::ffff:10.8.0.1.
        let c = b"0000:000011:4c5d1e:00000000000000000000ffff0a080001\0";
        assert_eq!(c.len(), MSG_LEN);
        let d = Dest::from_wire(c).unwrap();
        assert_eq!((d.lid, d.qpn, d.psn), (0, 0x11, 0x4c_5d1e));
        assert_eq!(d.gid, Gid::from(Ipv4Addr::new(10, 8, 0, 1)));
        assert_eq!(&d.to_wire(), c);
        assert!(Dest::from_wire(b"0000:000011:4c5d1e:0000\0").is_err());
        assert!(Dest::from_wire(b"zz:1:2:00000000000000000000ffff0a080001\0").is_err());
    }

    #[test]
    fn flags_parse_like_getopt_long() {
        let o = parse(&["-n50", "-ec", "--size=64", "--rx", "8", "-g", "1", "host"]).unwrap();
        assert_eq!(
            (o.iters, o.size, o.rx_depth, o.gid_idx),
            (50, 64, 8, Some(1))
        );
        assert!(o.events && o.chk);
        assert_eq!(o.host.as_deref(), Some("host"));
        let o = parse(&["-p", "0x4853", "-m", "2048", "-g", "-1", "-tN"]).unwrap();
        assert!(o.ts && o.new_send && !o.odp);
        assert_eq!(
            (o.tcp_port, o.mtu, o.gid_idx),
            (0x4853, Some(Mtu::Mtu2048), None)
        );
        for bad in [
            &["-x"][..],
            &["--bogus"],
            &["-m", "1000"],
            &["-p", "70000"],
            &["-n"],
            &["-s", "0"],
            &["a", "b"],
            &["-j"],
            &["--e=1"],
        ] {
            assert!(matches!(parse(bad), Err(ArgError::Bad(_))), "{bad:?}");
        }
    }

    #[test]
    fn extra_flags_parse_and_validate() {
        const EXTRA: &[ExtraFlag] = &[
            ExtraFlag {
                short: 'q',
                long: "num-qp",
                kind: ExtraKind::Number { min: 1, max: 255 },
                help: "",
            },
            ExtraFlag {
                short: 'm',
                long: "mtu",
                kind: ExtraKind::Mtu,
                help: "",
            },
            ExtraFlag {
                short: 'o',
                long: "odp",
                kind: ExtraKind::Switch,
                help: "",
            },
        ];
        const SRQ: Tool = Tool {
            name: "srq_pingpong",
            twin: "ibv_srq_pingpong",
            default_size: 4096,
            has_mtu: false,
            rc_flags: false,
            unsupported: &[],
        };
        let parse =
            |args: &[&str]| parse_args_with(&SRQ, EXTRA, args.iter().map(|s| s.to_string()));
        let o = parse(&["-q4", "--num=0x10", "-eo", "--mtu", "2048", "h"]).unwrap();
        assert_eq!(o.extra('q'), Some(ExtraValue::Number(16)));
        assert_eq!(o.extra('m'), Some(ExtraValue::Mtu(Mtu::Mtu2048)));
        assert_eq!(o.extra('o'), Some(ExtraValue::Set));
        assert!(o.events && o.mtu.is_none());
        assert_eq!(parse(&[]).unwrap().extra('q'), None);
        for bad in [
            &["-q", "0"][..],
            &["-q", "256"],
            &["-q"],
            &["-m", "1000"],
            &["--odp=1"],
            &["-t"],
        ] {
            assert!(matches!(parse(bad), Err(ArgError::Bad(_))), "{bad:?}");
        }
        assert!(usage_with(&SRQ, EXTRA).contains("-q, --num-qp=<n>"));
    }

    #[test]
    fn chk_pattern_marks_page_starts() {
        let p = message_pattern(10, true, 4).unwrap();
        assert_eq!(p, [0, 0x7b, 0x7b, 0x7b, 0, 0x7b, 0x7b, 0x7b, 0, 0x7b]);
        assert!(message_pattern(5, false, 4)
            .unwrap()
            .iter()
            .all(|&b| b == 0x7b));
    }
}

/// The indices of the `page`-sized pages where `got` differs from `want`
/// (what `-c` reports as "invalid data in page N").
pub fn bad_pages(got: &[u8], want: &[u8], page: usize) -> Vec<usize> {
    got.chunks(page)
        .zip(want.chunks(page))
        .enumerate()
        .filter(|(_, (g, w))| g != w)
        .map(|(i, _)| i)
        .collect()
}
