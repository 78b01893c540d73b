//! What `rping` and `async_rping` share: the command line (rdma-core
//! `rping`'s flags, and one more each), the control message, the ping text
//! and the limits of `-S`.

use std::net::{IpAddr, Ipv4Addr};

use rdma::RemoteMemory;

use super::args::{bad, ArgError, Cli, Flag, Parsed};
use super::cm::host_ip;

/// Length of a control message (`struct rping_rdma_info`).
pub const INFO_LEN: usize = 16;
/// Largest ping (`RPING_BUFSIZE - 1`).
pub const MAX_SIZE: usize = 64 * 1024 - 1;
/// Smallest ping: room for `rdma-ping-2147483647: ` and the NUL
/// (`sizeof(stringify(INT_MAX)) + sizeof(RPING_MSG_FMT)`).
pub const MIN_SIZE: usize = 26;
/// Send queue depth; the CQ has twice this many entries.
pub const SQ_DEPTH: u32 = 16;

/// The control message describing `mem` (`rping_format_send`).
pub fn info(mem: RemoteMemory, size: usize) -> [u8; INFO_LEN] {
    let mut m = [0u8; INFO_LEN];
    m[..8].copy_from_slice(&mem.addr.to_be_bytes());
    m[8..12].copy_from_slice(&mem.rkey.to_be_bytes());
    m[12..].copy_from_slice(&(size as u32).to_be_bytes());
    m
}

/// Decodes a control message: (address, rkey, length).
pub fn parse_info(m: &[u8; INFO_LEN]) -> (u64, u32, u32) {
    let [a0, a1, a2, a3, a4, a5, a6, a7, k0, k1, k2, k3, l0, l1, l2, l3] = *m;
    (
        u64::from_be_bytes([a0, a1, a2, a3, a4, a5, a6, a7]),
        u32::from_be_bytes([k0, k1, k2, k3]),
        u32::from_be_bytes([l0, l1, l2, l3]),
    )
}

/// The ping text: `rdma-ping-N: `, then letters from `first` up to `z`
/// wrapping to `A`, then a NUL in the last byte.
pub fn fill(buf: &mut [u8], ping: u64, first: u8) {
    let head = format!("rdma-ping-{}: ", ping as i32);
    let n = head.len().min(buf.len() - 1);
    buf[..n].copy_from_slice(&head.as_bytes()[..n]);
    let mut c = first;
    for b in &mut buf[n..] {
        *b = c;
        c = if c >= 122 { 65 } else { c + 1 };
    }
    let last = buf.len() - 1;
    buf[last] = 0;
}

/// The command line of both tools.
#[derive(Debug, Clone)]
pub struct Opts {
    /// `-s` (`-c`: false).
    pub server: bool,
    /// `-a`: the address to bind to (server) or connect to (client).
    pub addr: IpAddr,
    /// `-I`: the client's source address.
    pub src: Option<IpAddr>,
    /// `-p`.
    pub port: u16,
    /// `-C`: pings (0: forever).
    pub count: u64,
    /// `-S`: bytes per ping.
    pub size: usize,
    /// `-v`: print every ping.
    pub verbose: bool,
    /// `-V`: check every ping.
    pub validate: bool,
    /// `-d`: say every step.
    pub debug: bool,
    /// `-P`: serve clients until killed.
    pub persistent: bool,
    /// `-q` (`rping`): a QP made and moved through its states by the tool
    /// itself rather than by the connection manager.
    pub self_qp: bool,
    /// `-N` (`async_rping`): the server exits after this many clients, the
    /// client opens this many connections at once.
    pub n: u64,
}

/// The flags of rdma-core's `rping` but `-q`.
const FLAGS: [Flag<'static, char>; 11] = [
    Flag::switch(
        's',
        's',
        "",
        "server side (to bind to any IPv6 address use -a ::0)",
    ),
    Flag::switch('c', 'c', "", "client side"),
    Flag::value('a', 'a', "", "addr", "address"),
    Flag::value(
        'I',
        'I',
        "",
        "addr",
        "source address to bind to for the client",
    ),
    Flag::value('p', 'p', "", "port", "port (default 7174)"),
    Flag::value('S', 'S', "", "size", "ping data size (default 64)"),
    Flag::value('C', 'C', "", "count", "ping count times (default: forever)"),
    Flag::switch('v', 'v', "", "display ping data to stdout"),
    Flag::switch('V', 'V', "", "validate ping data"),
    Flag::switch('d', 'd', "", "debug printfs"),
    Flag::switch(
        'P',
        'P',
        "",
        "persistent server: serve clients until killed",
    ),
];

/// Reads the command line of `name` with its own flag `own` (`-q` or `-N`)
/// besides rping's; rping's exit status for a bad one, `EINVAL`.
pub fn read(
    name: &str,
    usage: &str,
    own: Flag<'static, char>,
) -> Result<Opts, std::process::ExitCode> {
    let flags = flags(own);
    let cli = Cli {
        name,
        usage,
        flags: &flags,
        bad_exit: libc::EINVAL as u8,
    };
    cli.read(opts)
}

/// rping's flags and the tool's own.
pub fn flags(own: Flag<'static, char>) -> Vec<Flag<'static, char>> {
    let mut flags = FLAGS.to_vec();
    flags.push(own);
    flags
}

/// The options `args` give.
///
/// # Errors
/// A bad value, naming it, or neither `-s` nor `-c`.
pub fn opts(args: Parsed<char>) -> Result<Opts, ArgError> {
    args.no_operands()?;
    let mut o = Opts {
        server: false,
        addr: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        src: None,
        port: 7174,
        count: 0,
        size: 64,
        verbose: false,
        validate: false,
        debug: false,
        persistent: false,
        self_qp: false,
        n: 1,
    };
    let mut side = None;
    for f in args.flags {
        let ip = |v: &str| host_ip(v).map_err(|e| ArgError::Bad(e.to_string()));
        match f.key {
            's' => side = Some(true),
            'c' => side = Some(false),
            'a' => o.addr = ip(&f.value)?,
            'I' => o.src = Some(ip(&f.value)?),
            'p' => o.port = f.number("a port, 0 to 65535")?,
            'S' => {
                let size: i64 = f.number("a size in bytes")?;
                if size < MIN_SIZE as i64 || size > MAX_SIZE as i64 {
                    return bad(format!(
                        "Invalid size {size} (valid range is {MIN_SIZE} to {})",
                        MAX_SIZE + 1
                    ));
                }
                o.size = size as usize;
            }
            'C' => {
                let count: i64 = f.number("a count")?;
                if count < 0 {
                    return bad(format!("Invalid count {count}"));
                }
                o.count = count as u64;
            }
            'v' => o.verbose = true,
            'V' => o.validate = true,
            'd' => o.debug = true,
            'P' => o.persistent = true,
            'q' => o.self_qp = true,
            'N' => o.n = f.number::<u64>("a count")?.max(1),
            _ => unreachable!("the flags of FLAGS and the tool's own"),
        }
    }
    match side {
        Some(s) => o.server = s,
        None => return bad("one of -s (server) or -c (client) is required"),
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::cm::c_str;

    #[test]
    fn ping_text_matches_rping() {
        let mut b = vec![0u8; 64];
        fill(&mut b, 0, 65);
        assert_eq!(
            c_str(&b),
            "rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr"
        );
        fill(&mut b, 1, 66);
        assert!(c_str(&b).starts_with("rdma-ping-1: BCD"));
        assert_eq!(b[63], 0);
    }

    #[test]
    fn info_is_big_endian() {
        let m = info(
            RemoteMemory {
                addr: 0x0102_0304_0506_0708,
                len: 0,
                rkey: 0x0a0b_0c0d,
            },
            64,
        );
        assert_eq!(&m[..8], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(parse_info(&m), (0x0102_0304_0506_0708, 0x0a0b_0c0d, 64));
    }

    #[test]
    fn options_parse_like_rping() {
        let flags = flags(Flag::value('N', 'N', "", "n", ""));
        let cli = Cli {
            name: "t",
            usage: "",
            flags: &flags,
            bad_exit: 1,
        };
        let parse = |s: &str| cli.parse(s.split(' ').map(String::from)).and_then(opts);
        let o = parse("-c -a 10.8.0.1 -p 7000 -C 5 -vV -S 100 -N 8").unwrap();
        assert!(!o.server && o.verbose && o.validate);
        assert_eq!((o.port, o.count, o.size, o.n), (7000, 5, 100, 8));
        let e = parse("-s -S 10").unwrap_err();
        assert!(e.to_string().contains("Invalid size"), "{e}");
        assert!(parse("-a 1.2.3.4").is_err());
        assert!(parse("-c -q").is_err());
    }
}
