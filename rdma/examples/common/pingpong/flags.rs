//! The command line of the pingpong tools: the flags of rdma-core's
//! `ibv_*_pingpong`, parsed with [`crate::common::args::parse`].

use super::*;
use crate::common::args::{self, parse_c_number};
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
        v.push(f('P', "prefetch", false, Key::Prefetch));
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
            "-P, --prefetch",
            "prefetch the on-demand buffers (ibv_advise_mr) before the run (needs -o)",
        );
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
        Key::Prefetch => opts.prefetch = true,
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
/// the C tools ([`args::parse`]), the host anywhere.
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
        prefetch: false,
        ts: false,
        new_send: false,
        host: None,
        extra: Vec::new(),
    };
    let scan: Vec<args::Flag> = table
        .iter()
        .map(|f| args::Flag::new(f.short, f.long, f.takes_value))
        .collect();
    let parsed = args::parse(args, &scan).map_err(ArgError::Bad)?;
    for found in &parsed.flags {
        let key = table[found.index].key;
        apply(tool, extra, &mut opts, key, &found.shown, &found.value)?;
    }
    let mut positional = parsed.operands;
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
