//! rdma-core's `rcopy` over this crate: the same usage and the same
//! messages on the rsocket stream, so the C tool and this one can take
//! either role.
//!
//! ```text
//! usage 1: rcopy [-p port_number]
//!              serve: write the files clients send
//! usage 2: rcopy source server[:destination] [-p port_number]
//!              send the file `source` to `server`, to be written there as
//!              `destination` (default: `source`, as written)
//! ```
//!
//! The port is 7427 by default. Like rdma-core's:
//! - the server listens on every address (`0.0.0.0`), takes one connection
//!   at a time and serves for ever (a script stops it with a signal). It
//!   opens the path the client names as it is given (relative to its own
//!   working directory), with the client's mode; a connection ends after
//!   the first step that fails, and the server goes on with the next one.
//!   Unlike rdma-core's it drops the setuid, setgid and sticky bits of the
//!   mode, writes with `write(2)` in bounded chunks rather than through a
//!   mapping (a size the client claims reserves nothing), and a failed or
//!   vanished client leaves nothing open behind it (rdma-core's answers
//!   `EBUSY` to every later client once a client went away with a file
//!   open or a mapping failed, as an empty file's does);
//! - the client prints `opening...transferring......closing...done` and
//!   `N bytes in S seconds = R Gb/sec`, and exits 0 on success; when the
//!   server refuses a step, its exit status is the server's errno (as
//!   rdma-core's `rcopy`, which returns it from `main`); any other failure
//!   exits 1 with a message on standard error.
//!
//! **Trust**: as rdma-core's, the protocol has no authentication and the
//! server writes whatever path a client names with its own user's
//! permissions, anywhere that user may write. Whoever reaches the port can
//! do that: run it as an unprivileged user on a trusted fabric.
//!
//! An empty file is sent as OPEN then CLOSE, with no WRITE: rdma-core's
//! server cannot map a file of zero bytes (it answers a WRITE of 0 bytes
//! with `EINVAL`), but its OPEN creates and truncates the file. rdma-core's
//! client cannot send one (its own `mmap` of the source fails with
//! `EINVAL`, and it exits 22 before it sends anything).
//!
//! # The protocol
//! Every message starts with a 16-byte header, in host byte order as
//! rdma-core writes it (its source says "TODO: handle byte swapping"):
//! `version: u8` (0), `command: u8`, `len: u16` (the whole message,
//! header included), `data: u32`, `id: u64`. Commands: OPEN 1 (`data`:
//! the source's `st_mode`; the destination path follows, NUL-terminated
//! and padded with NULs to a multiple of 8 bytes), CLOSE 2, WRITE 3 (`len`
//! 24: a `u64` size follows the header, then exactly that many bytes of
//! file data). The server answers each with a bare header: `command | 0x80`,
//! `len` 16, `data` the status (0 or an errno), the request's `id`. The
//! client sends OPEN and waits for its answer, then WRITE with all the data
//! and waits, then CLOSE and waits, and closes the connection.

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{anyhow, bail, Context as _};
use rdma_stream::{Options, RdmaListener, RdmaStream};

mod common;

const USAGE: &str = "usage 1: rcopy [options]
\t     starts the server application
\t[-p  port_number]
usage 2: rcopy source server[:destination] [options]
\t     source - file name and path
\t     server - name or address
\t     destination - file name and path
\t[-p  port_number]";

const CMD_OPEN: u8 = 1;
const CMD_CLOSE: u8 = 2;
const CMD_WRITE: u8 = 3;
const CMD_RESP: u8 = 0x80;
const HDR_LEN: usize = 16;
/// A WRITE: the header and the size.
const WRITE_LEN: usize = HDR_LEN + 8;
/// File data moves through one buffer of this size per connection.
const CHUNK: usize = 256 * 1024;

const EINVAL: u32 = 22;
const EBUSY: u32 = 16;
const EIO: u32 = 5;

/// The header every message starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hdr {
    version: u8,
    command: u8,
    len: u16,
    data: u32,
    id: u64,
}

impl Hdr {
    fn encode(&self) -> [u8; HDR_LEN] {
        let mut b = [0; HDR_LEN];
        b[0] = self.version;
        b[1] = self.command;
        b[2..4].copy_from_slice(&self.len.to_ne_bytes());
        b[4..8].copy_from_slice(&self.data.to_ne_bytes());
        b[8..16].copy_from_slice(&self.id.to_ne_bytes());
        b
    }

    fn decode(b: &[u8; HDR_LEN]) -> Hdr {
        let [v, c, l0, l1, d0, d1, d2, d3, i0, i1, i2, i3, i4, i5, i6, i7] = *b;
        Hdr {
            version: v,
            command: c,
            len: u16::from_ne_bytes([l0, l1]),
            data: u32::from_ne_bytes([d0, d1, d2, d3]),
            id: u64::from_ne_bytes([i0, i1, i2, i3, i4, i5, i6, i7]),
        }
    }

    fn response(&self, status: u32) -> Hdr {
        Hdr {
            version: 0,
            command: self.command | CMD_RESP,
            len: HDR_LEN as u16,
            data: status,
            id: self.id,
        }
    }
}

fn command_name(c: u8) -> &'static str {
    match c & !CMD_RESP {
        CMD_OPEN => "OPEN",
        CMD_CLOSE => "CLOSE",
        CMD_WRITE => "WRITE",
        _ => "an unknown command",
    }
}

/// Reads a header; `None` at the end of the stream before its first byte.
fn read_hdr(s: &mut impl Read) -> io::Result<Option<Hdr>> {
    let mut b = [0; HDR_LEN];
    let mut got = 0;
    while got < HDR_LEN {
        match s.read(&mut b[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the peer closed the connection {got} bytes into a message header"),
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Some(Hdr::decode(&b)))
}

/// An errno from the peer, as text.
fn errno_text(status: u32) -> String {
    match i32::try_from(status) {
        Ok(e) => format!("{} (errno {status})", io::Error::from_raw_os_error(e)),
        Err(_) => format!("status {status}"),
    }
}

/// The server refused a step: its errno is the client's exit status.
#[derive(Debug)]
struct Refused {
    why: String,
    status: u32,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

impl std::error::Error for Refused {}

struct Client {
    s: RdmaStream,
    id: u64,
}

impl Client {
    fn send(&mut self, command: u8, data: u32, extra: &[u8]) -> anyhow::Result<Hdr> {
        self.id += 1;
        let len = HDR_LEN + extra.len();
        let hdr = Hdr {
            version: 0,
            command,
            len: u16::try_from(len)
                .with_context(|| format!("{} message of {len} bytes", command_name(command)))?,
            data,
            id: self.id,
        };
        let mut msg = hdr.encode().to_vec();
        msg.extend_from_slice(extra);
        self.s
            .write_all(&msg)
            .with_context(|| format!("sending {}", command_name(command)))?;
        Ok(hdr)
    }

    /// Waits for the answer to `req`: its status.
    fn answer(&mut self, req: &Hdr) -> anyhow::Result<u32> {
        let what = command_name(req.command);
        let r = read_hdr(&mut self.s)
            .with_context(|| format!("waiting for the answer to {what}"))?
            .with_context(|| format!("the server closed the connection before answering {what}"))?;
        if r.version != 0
            || usize::from(r.len) != HDR_LEN
            || r.command != req.command | CMD_RESP
            || r.id != req.id
        {
            bail!(
                "the answer to {what} is not one: version {}, command {:#x} (expected {:#x}), \
                 length {} (expected {HDR_LEN}), id {} (expected {})",
                r.version,
                r.command,
                req.command | CMD_RESP,
                r.len,
                r.id,
                req.id
            );
        }
        Ok(r.data)
    }

    fn step(&mut self, command: u8, data: u32, extra: &[u8], what: &str) -> anyhow::Result<()> {
        let req = self.send(command, data, extra)?;
        match self.answer(&req)? {
            0 => Ok(()),
            e => Err(Refused {
                why: format!("the server could not {what}: {}", errno_text(e)),
                status: e,
            }
            .into()),
        }
    }
}

fn progress(text: &str) {
    print!("{text}");
    let _ = io::stdout().flush();
}

fn client(src: &str, host: &str, dst: &str, port: u16) -> anyhow::Result<()> {
    let mut file = File::open(src).with_context(|| format!("opening {src}"))?;
    let meta = file
        .metadata()
        .with_context(|| format!("reading the attributes of {src}"))?;
    if !meta.is_file() {
        bail!("{src} is not a regular file");
    }
    let size = meta.len();
    // The path, NUL-terminated and padded with NULs to a multiple of 8.
    if dst.as_bytes().contains(&0) {
        bail!("the destination {dst:?} holds a NUL byte");
    }
    let mut path = dst.as_bytes().to_vec();
    path.resize((dst.len() + 8) & !7, 0);
    if HDR_LEN + path.len() > usize::from(u16::MAX) {
        bail!(
            "the destination name is {} bytes: an OPEN message holds at most {}",
            dst.len(),
            usize::from(u16::MAX) - HDR_LEN - 8
        );
    }
    let addr = common::resolve(host, port)?;
    let s = RdmaStream::connect_with(addr, &Options::default())
        .with_context(|| format!("connecting to {addr}"))?;
    let mut c = Client { s, id: 0 };

    progress("opening...");
    c.step(CMD_OPEN, meta.mode(), &path, &format!("open {dst}"))?;

    progress("transferring");
    let start = Instant::now();
    if size > 0 {
        let mut msg = Vec::with_capacity(8);
        msg.extend_from_slice(&size.to_ne_bytes());
        let req = c.send(CMD_WRITE, 0, &msg)?;
        progress("...");
        let mut buf = vec![0; CHUNK];
        let mut left = size;
        while left > 0 {
            let want = usize::try_from(left).map_or(CHUNK, |l| l.min(CHUNK));
            let n = match file.read(&mut buf[..want]) {
                Ok(0) => {
                    bail!(
                        "{src} shrank while it was sent: it ended {} bytes short of {size}",
                        left
                    )
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e).with_context(|| format!("reading {src}")),
            };
            c.s.write_all(&buf[..n])
                .with_context(|| format!("sending {src}, {} of {size} bytes sent", size - left))?;
            left -= n as u64;
        }
        match c.answer(&req)? {
            0 => {}
            e => {
                let failure = Refused {
                    why: format!("the server could not write {dst}: {}", errno_text(e)),
                    status: e,
                };
                // rdma-core's client closes after a failed WRITE too; its
                // server has ended the connection by then.
                let _ = c.step(CMD_CLOSE, 0, &[], "close");
                return Err(failure.into());
            }
        }
    } else {
        progress("...");
    }
    let elapsed = start.elapsed();

    progress("closing...");
    c.step(CMD_CLOSE, 0, &[], &format!("close {dst}"))?;
    println!("done");
    // The file is written and closed once CLOSE is answered: a failure to
    // close the connection after that is reported, not a failed copy (as
    // rdma-core's client, which ignores rshutdown's result).
    if let Err(e) = c.s.shutdown(Shutdown::Both) {
        eprintln!("rcopy: closing the connection: {e}");
    }
    let usec = elapsed.as_secs_f64() * 1e6;
    println!(
        "{size} bytes in {:.2} seconds = {:.2} Gb/sec",
        usec / 1e6,
        if usec > 0.0 {
            (size as f64 * 8.0) / (1000.0 * usec)
        } else {
            0.0
        }
    );
    Ok(())
}

/// Why a connection ended early.
type Ended = anyhow::Error;

struct Conn {
    s: RdmaStream,
    file: Option<(File, String)>,
    buf: Vec<u8>,
}

impl Conn {
    fn respond(&mut self, req: &Hdr, status: u32) -> Result<(), Ended> {
        self.s
            .write_all(&req.response(status).encode())
            .with_context(|| format!("answering {}", command_name(req.command)))
    }

    /// Answers a failed step and ends the connection, as rdma-core's server.
    fn refuse(&mut self, req: &Hdr, status: u32, why: String) -> Result<(), Ended> {
        self.respond(req, status)?;
        Err(anyhow!(why))
    }

    /// Reads exactly `buf.len()` bytes; what was missing as an error.
    fn read_exact(&mut self, len: usize, what: &str) -> Result<(), Ended> {
        self.s
            .read_exact(&mut self.buf[..len])
            .with_context(|| format!("receiving {what}"))
    }

    fn open(&mut self, req: &Hdr) -> Result<(), Ended> {
        progress("opening: ");
        // At most 64 KiB - 16: the length is a u16.
        let len = usize::from(req.len) - HDR_LEN;
        self.read_exact(len, "the path of an OPEN")?;
        if let Some((_, open)) = &self.file {
            println!("cannot open another file");
            let why = format!("OPEN while {open} is open");
            return self.refuse(req, EBUSY, why);
        }
        let raw = &self.buf[..len];
        let name = raw.split(|&b| b == 0).next().unwrap_or(raw);
        let path = OsStr::from_bytes(name).to_owned();
        let shown = path.to_string_lossy().into_owned();
        progress(&format!("{shown}, "));
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(req.data & 0o777)
            .open(&path)
        {
            Ok(f) => {
                self.file = Some((f, shown));
                self.respond(req, 0)
            }
            Err(e) => {
                println!("unable to open destination file");
                let why = format!("opening {shown}: {e}");
                self.refuse(req, e.raw_os_error().map_or(EIO, |n| n as u32), why)
            }
        }
    }

    fn close(&mut self, req: &Hdr) -> Result<(), Ended> {
        progress("closing...");
        self.file = None;
        self.respond(req, 0)?;
        println!("done");
        Ok(())
    }

    fn write(&mut self, req: &Hdr) -> Result<(), Ended> {
        progress("transferring");
        if self.file.is_none() {
            println!("...file not opened");
            return self.refuse(req, EINVAL, "WRITE with no file open".into());
        }
        if usize::from(req.len) != WRITE_LEN {
            println!("...invalid message length {}", req.len);
            let why = format!("WRITE of length {} (not {WRITE_LEN})", req.len);
            return self.refuse(req, EINVAL, why);
        }
        self.read_exact(8, "the size of a WRITE")?;
        let mut size = [0; 8];
        size.copy_from_slice(&self.buf[..8]);
        let size = u64::from_ne_bytes(size);
        progress(&format!("...{size} bytes..."));
        let Some((file, shown)) = self.file.as_mut() else {
            bail!("WRITE with no file open");
        };
        // Each WRITE carries the whole file, from its start.
        let mut failed: Option<io::Error> = file.set_len(0).and_then(|()| file.rewind()).err();
        let mut left = size;
        while left > 0 {
            let want = usize::try_from(left).map_or(CHUNK, |l| l.min(CHUNK));
            let n = match self.s.read(&mut self.buf[..want]) {
                Ok(0) => {
                    println!("...error receiving data");
                    bail!(
                        "the client closed the connection {} bytes into {size} of {shown}",
                        size - left
                    );
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    println!("...error receiving data");
                    return Err(e).with_context(|| format!("receiving {shown}"));
                }
            };
            // After a failed write the rest is read and dropped, so that
            // the client reads the errno rather than a broken connection.
            if failed.is_none() {
                failed = file.write_all(&self.buf[..n]).err();
            }
            left -= n as u64;
        }
        match failed {
            None => self.respond(req, 0),
            Some(e) => {
                println!("...error writing the file");
                let why = format!("writing {shown}: {e}");
                self.refuse(req, e.raw_os_error().map_or(EIO, |n| n as u32), why)
            }
        }
    }

    fn serve(&mut self) -> Result<(), Ended> {
        loop {
            let Some(req) = read_hdr(&mut self.s).context("receiving")? else {
                return Ok(());
            };
            if req.version != 0 || usize::from(req.len) < HDR_LEN {
                println!("invalid version {} or length {}", req.version, req.len);
                bail!(
                    "a message of version {} and length {}",
                    req.version,
                    req.len
                );
            }
            match req.command {
                CMD_OPEN => self.open(&req)?,
                CMD_CLOSE => self.close(&req)?,
                CMD_WRITE => self.write(&req)?,
                c => {
                    let why = format!("unknown command {c:#x}");
                    self.refuse(&req, EINVAL, why)?
                }
            }
        }
    }
}

fn server(port: u16) -> anyhow::Result<()> {
    let listener = RdmaListener::bind(SocketAddr::from(([0, 0, 0, 0], port)))
        .with_context(|| format!("listening on port {port}"))?;
    let mut buf = vec![0; CHUNK];
    loop {
        progress("waiting for connection...");
        let (s, peer) = match listener.accept() {
            Ok(a) => a,
            Err(e) => {
                println!();
                eprintln!("rcopy: accepting a connection: {e}");
                continue;
            }
        };
        println!(
            "client: {}",
            peer.map_or_else(String::new, |p| p.ip().to_string())
        );
        let mut conn = Conn {
            s,
            file: None,
            buf: std::mem::take(&mut buf),
        };
        if let Err(e) = conn.serve() {
            let from = peer.map_or_else(|| "an unknown address".into(), |p| p.to_string());
            eprintln!(
                "rcopy: the connection from {from} ended: {}",
                common::chain(e.as_ref())
            );
        }
        buf = std::mem::take(&mut conn.buf);
        // Dropping the stream closes it as rclose does.
    }
}

enum Mode {
    Server {
        port: u16,
    },
    Client {
        src: String,
        host: String,
        dst: String,
        port: u16,
    },
}

fn parse(argv: &[String]) -> anyhow::Result<Mode> {
    let mut port = 7427u16;
    let mut positional = Vec::new();
    let mut i = 0;
    while i < argv.len() {
        let a = &argv[i];
        if let Some(glued) = a.strip_prefix("-p") {
            let v = if glued.is_empty() {
                i += 1;
                argv.get(i)
                    .with_context(|| format!("-p needs a port number\n{USAGE}"))?
                    .as_str()
            } else {
                glued
            };
            let Ok(p) = v.parse() else {
                bail!("-p takes a port number, not {v:?}\n{USAGE}");
            };
            port = p;
        } else if a.starts_with('-') && a.len() > 1 {
            bail!("unknown option {a}\n{USAGE}");
        } else {
            positional.push(a.clone());
        }
        i += 1;
    }
    // rdma-core's rule: no arguments, or an option first, is the server.
    let server = match argv.first() {
        None => true,
        Some(a) => a.starts_with('-'),
    };
    if server {
        if !positional.is_empty() {
            bail!("the server takes no file: {positional:?}\n{USAGE}");
        }
        return Ok(Mode::Server { port });
    }
    let [src, target] = positional.as_slice() else {
        bail!(USAGE);
    };
    // server[:destination]; [v6-address]:destination too.
    let (host, dst) = match target.strip_prefix('[').and_then(|t| t.split_once(']')) {
        Some((h, rest)) => (h.to_owned(), rest.strip_prefix(':')),
        None => match target.split_once(':') {
            Some((h, d)) => (h.to_owned(), Some(d)),
            None => (target.clone(), None),
        },
    };
    let dst = dst.unwrap_or(src).to_owned();
    if dst.is_empty() {
        bail!("{target}: the destination file name is empty");
    }
    Ok(Mode::Client {
        src: src.clone(),
        host,
        dst,
        port,
    })
}

fn main() -> ExitCode {
    env_logger::init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = parse(&args).and_then(|mode| match mode {
        Mode::Server { port } => server(port),
        Mode::Client {
            src,
            host,
            dst,
            port,
        } => client(&src, &host, &dst, port).inspect_err(|_| println!()),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            common::report("rcopy", &e);
            // rdma-core's returns the errno from main: its low byte (and
            // 1 where that is 0).
            let status = e
                .downcast_ref::<Refused>()
                .map_or(1, |r| (r.status & 0xff) as u8);
            ExitCode::from(status.max(1))
        }
    }
}
