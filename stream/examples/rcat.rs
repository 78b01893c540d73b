//! netcat over rsocket.
//!
//! ```text
//! rcat [-v] -l ADDR PORT   accept one connection, write what it sends to
//!                          stdout, exit 0 when the peer closes (`-v`: say on
//!                          stderr when listening)
//! rcat ADDR PORT      connect, send stdin, close, exit 0
//! ```
//!
//! The peer can be another `rcat`, or any TCP program run under rdma-core's
//! `librspreload.so` (`LD_PRELOAD=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so`).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::process::ExitCode;

use anyhow::{bail, Context as _};
use rdma_stream::{RdmaListener, RdmaStream};

mod common;

const USAGE: &str = "usage: rcat [-v] -l ADDR PORT | rcat ADDR PORT";

fn addr(host: &str, port: &str) -> anyhow::Result<SocketAddr> {
    let Ok(port) = port.parse() else {
        bail!("bad port {port:?}\n{USAGE}");
    };
    common::resolve(host, port)
}

fn copy(from: &mut dyn Read, to: &mut dyn Write) -> io::Result<u64> {
    let mut buf = vec![0; 256 * 1024];
    let mut total = 0;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
        total += n as u64;
    }
}

fn run(mut args: &[String]) -> anyhow::Result<()> {
    let verbose = args.first().is_some_and(|a| a == "-v");
    if verbose {
        args = &args[1..];
    }
    match args {
        [l, host, port] if l == "-l" => {
            let listener = RdmaListener::bind(addr(host, port)?).context("listen")?;
            if verbose {
                eprintln!("rcat: listening on {host} port {port}");
            }
            let (mut s, _) = listener.accept().context("accept")?;
            let mut out = io::stdout().lock();
            copy(&mut s, &mut out).context("receiving")?;
            out.flush().context("stdout")?;
            s.close().context("closing")
        }
        [host, port] => {
            let mut s = RdmaStream::connect(addr(host, port)?).context("connect")?;
            copy(&mut io::stdin().lock(), &mut s).context("sending")?;
            s.shutdown(Shutdown::Write).context("closing")?;
            // Waits for the peer to close too: exiting at once would end
            // the background close, and the peer still reads.
            s.close().context("closing")
        }
        _ => bail!(USAGE),
    }
}

fn main() -> ExitCode {
    env_logger::init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    common::exit("rcat", run(&args))
}
