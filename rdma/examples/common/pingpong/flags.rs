//! The command line of the pingpong tools: the flags of rdma-core's
//! `ibv_*_pingpong`, as a table for the examples' parser
//! ([`crate::common::args`]).

use super::*;
use crate::common::args::{bad, ArgError, Cli, Flag, Found, Parsed};
use std::process::ExitCode;

use rdma::Mtu;

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
    /// Prefetch the on-demand regions before the run (`ibv_advise_mr`).
    pub prefetch: bool,
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
    Prefetch,
    Ts,
    NewSend,
    Unsupported(usize),
    Extra(usize),
}

/// The help texts that depend on the tool.
struct Texts {
    usage: String,
    port: String,
    size: String,
    unsupported: Vec<String>,
}

fn texts(tool: &Tool) -> Texts {
    Texts {
        usage: format!(
            "  {n} [options]          be the server: wait for a client\n  \
             {n} [options] <host>   be the client of the server on <host>\n\n\
             Speaks the handshake of rdma-core's {t}, so either side may be the C tool.",
            n = tool.name,
            t = tool.twin
        ),
        port: format!("TCP port of the handshake (default {DEFAULT_TCP_PORT})"),
        size: format!("bytes per message (default {})", tool.default_size),
        unsupported: tool
            .unsupported
            .iter()
            .map(|u| format!("not supported: {}", u.why))
            .collect(),
    }
}

fn flags<'a>(tool: &Tool, extra: &'a [ExtraFlag], t: &'a Texts) -> Vec<Flag<'a, Key>> {
    let mut v = vec![
        Flag::value(Key::Port, 'p', "port", "port", &t.port),
        Flag::value(
            Key::IbDev,
            'd',
            "ib-dev",
            "dev",
            "RDMA device (default: the first one)",
        ),
        Flag::value(
            Key::IbPort,
            'i',
            "ib-port",
            "port",
            "port of the device (default 1)",
        ),
        Flag::value(Key::Size, 's', "size", "bytes", &t.size),
    ];
    if tool.has_mtu {
        v.push(Flag::value(
            Key::Mtu,
            'm',
            "mtu",
            "bytes",
            "path MTU: 256, 512, 1024, 2048 or 4096 (default: the port's active MTU)",
        ));
    }
    v.extend([
        Flag::value(
            Key::RxDepth,
            'r',
            "rx-depth",
            "n",
            "receives kept posted (default 500)",
        ),
        Flag::value(
            Key::Iters,
            'n',
            "iters",
            "n",
            "messages each way (default 1000)",
        ),
        Flag::value(
            Key::Sl,
            'l',
            "sl",
            "sl",
            "service level, 0 to 15 (default 0)",
        ),
        Flag::switch(
            Key::Events,
            'e',
            "events",
            "sleep on a completion channel instead of busy polling",
        ),
        Flag::value(
            Key::GidIdx,
            'g',
            "gid-idx",
            "index",
            "local GID index, needed on RoCE (default: none)",
        ),
        Flag::switch(
            Key::Chk,
            'c',
            "chk",
            "check the contents of every message received (the pattern of the C tool)",
        ),
    ]);
    if tool.rc_flags {
        v.extend([
            Flag::switch(
                Key::Odp,
                'o',
                "odp",
                "register the buffers with on-demand paging",
            ),
            Flag::switch(
                Key::Prefetch,
                'P',
                "prefetch",
                "prefetch the on-demand buffers (ibv_advise_mr) before the run (needs -o)",
            ),
            Flag::switch(
                Key::Ts,
                't',
                "ts",
                "read completion timestamps (extended CQ) and print receive intervals",
            ),
            Flag::switch(
                Key::NewSend,
                'N',
                "new_send",
                "post sends with the ibv_wr_* API (extended QP) instead of ibv_post_send",
            ),
        ]);
    }
    for (i, e) in extra.iter().enumerate() {
        let value = match e.kind {
            ExtraKind::Switch => None,
            ExtraKind::Number { .. } => Some("n"),
            ExtraKind::Mtu => Some("bytes"),
        };
        v.push(Flag {
            key: Key::Extra(i),
            short: Some(e.short),
            long: e.long,
            value,
            help: e.help,
        });
    }
    for (i, u) in tool.unsupported.iter().enumerate() {
        v.push(Flag::switch(
            Key::Unsupported(i),
            u.short,
            u.long,
            &t.unsupported[i],
        ));
    }
    v
}

/// The help text.
pub fn usage(tool: &Tool) -> String {
    usage_with(tool, &[])
}

/// The help text of a tool with [`ExtraFlag`]s.
pub fn usage_with(tool: &Tool, extra: &[ExtraFlag]) -> String {
    let t = texts(tool);
    let table = flags(tool, extra, &t);
    cli(tool, &t, &table).help()
}

fn cli<'a>(tool: &'a Tool, t: &'a Texts, table: &'a [Flag<'a, Key>]) -> Cli<'a, Key> {
    Cli {
        name: tool.name,
        usage: &t.usage,
        flags: table,
        bad_exit: 1,
    }
}

fn apply(
    tool: &Tool,
    extra: &[ExtraFlag],
    opts: &mut Opts,
    f: &Found<Key>,
) -> Result<(), ArgError> {
    let (name, v) = (&f.shown, &f.value);
    match f.key {
        Key::Port => opts.tcp_port = f.c_number("a TCP port, 0 to 65535")?,
        Key::IbDev => opts.ib_dev = Some(v.to_string()),
        Key::IbPort => {
            opts.ib_port = f.c_number("a port number, 1 to 255")?;
            if opts.ib_port == 0 {
                return bad(format!("{name}: ports are numbered from 1"));
            }
        }
        Key::Size => {
            opts.size = f.c_number("a size in bytes")?;
            if opts.size == 0 {
                return bad(format!("{name}: the size must be at least 1"));
            }
        }
        Key::Mtu => opts.mtu = Some(mtu(f)?),
        Key::RxDepth => {
            opts.rx_depth = f.c_number("a count")?;
            if opts.rx_depth == 0 {
                return bad(format!("{name}: at least one receive must be posted"));
            }
        }
        Key::Iters => {
            opts.iters = f.c_number("a count")?;
            if opts.iters == 0 {
                return bad(format!("{name}: at least one iteration"));
            }
        }
        Key::Sl => {
            const SL: &str = "a service level, 0 to 15";
            opts.sl = f.c_number(SL)?;
            if opts.sl > 15 {
                return Err(f.bad(SL));
            }
        }
        Key::GidIdx => {
            // As in the C tools, a negative index means "no GID".
            opts.gid_idx = if v.trim().starts_with('-') {
                None
            } else {
                Some(f.c_number("a GID table index")?)
            };
        }
        Key::Events => opts.events = true,
        Key::Chk => opts.chk = true,
        Key::Odp => opts.odp = true,
        Key::Prefetch => opts.prefetch = true,
        Key::Ts => opts.ts = true,
        Key::NewSend => opts.new_send = true,
        Key::Unsupported(i) => {
            let u = &tool.unsupported[i];
            return bad(format!(
                "-{}/--{} of {} is not supported by this port: {}",
                u.short, u.long, tool.twin, u.why
            ));
        }
        Key::Extra(i) => {
            let e = &extra[i];
            let value = match e.kind {
                ExtraKind::Switch => ExtraValue::Set,
                ExtraKind::Mtu => ExtraValue::Mtu(mtu(f)?),
                ExtraKind::Number { min, max } => {
                    let range = format!("a number from {min} to {max}");
                    let n: u64 = f.c_number(&range)?;
                    if n < min || n > max {
                        return Err(f.bad(range));
                    }
                    ExtraValue::Number(n)
                }
            };
            opts.extra.push((e.short, value));
        }
    }
    Ok(())
}

fn mtu(f: &Found<Key>) -> Result<Mtu, ArgError> {
    const MTUS: &str = "256, 512, 1024, 2048 or 4096";
    Mtu::from_bytes(f.c_number(MTUS)?).ok_or_else(|| f.bad(MTUS))
}

/// Parses `args` (without the program name) the way `getopt_long` does for
/// the C tools ([`Cli::parse`]), the host anywhere.
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
    let t = texts(tool);
    let table = flags(tool, extra, &t);
    cli(tool, &t, &table)
        .parse(args)
        .and_then(|p| opts(tool, extra, p))
}

/// The options the flags of `parsed` give.
fn opts(tool: &Tool, extra: &[ExtraFlag], parsed: Parsed<Key>) -> Result<Opts, ArgError> {
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
        prefetch: false,
        ts: false,
        new_send: false,
        host: None,
        extra: Vec::new(),
    };
    for found in &parsed.flags {
        apply(tool, extra, &mut opts, found)?;
    }
    let mut positional = parsed.operands;
    match positional.len() {
        0 => {}
        1 => opts.host = positional.pop(),
        _ => {
            return bad(format!(
                "one server host at most, got {}",
                positional.join(" ")
            ))
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
    let t = texts(tool);
    let table = flags(tool, extra, &t);
    let opts = match cli(tool, &t, &table).read(|p| opts(tool, extra, p)) {
        Ok(o) => o,
        Err(code) => return code,
    };
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("{}: {}", tool.name, crate::common::Report(&msg));
            ExitCode::FAILURE
        }
    }
}
