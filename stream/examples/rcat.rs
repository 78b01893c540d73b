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
use std::net::{Shutdown, SocketAddr, ToSocketAddrs};
use std::process::ExitCode;

use rdma_stream::{RdmaListener, RdmaStream};

const USAGE: &str = "usage: rcat [-v] -l ADDR PORT | rcat ADDR PORT";

fn addr(host: &str, port: &str) -> Result<SocketAddr, String> {
    let port: u16 = port
        .parse()
        .map_err(|_| format!("bad port {port:?}\n{USAGE}"))?;
    (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host} has no address"))
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

fn run(mut args: &[String]) -> Result<(), String> {
    let verbose = args.first().is_some_and(|a| a == "-v");
    if verbose {
        args = &args[1..];
    }
    match args {
        [l, host, port] if l == "-l" => {
            let listener =
                RdmaListener::bind(addr(host, port)?).map_err(|e| format!("listen: {e}"))?;
            if verbose {
                eprintln!("rcat: listening on {host} port {port}");
            }
            let (mut s, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
            let mut out = io::stdout().lock();
            copy(&mut s, &mut out).map_err(|e| format!("receiving: {e}"))?;
            out.flush().map_err(|e| format!("stdout: {e}"))?;
            Ok(())
        }
        [host, port] => {
            let mut s =
                RdmaStream::connect(addr(host, port)?).map_err(|e| format!("connect: {e}"))?;
            copy(&mut io::stdin().lock(), &mut s).map_err(|e| format!("sending: {e}"))?;
            s.shutdown(Shutdown::Write)
                .map_err(|e| format!("closing: {e}"))?;
            Ok(())
        }
        _ => Err(USAGE.into()),
    }
}

fn main() -> ExitCode {
    env_logger::init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rcat: {e}");
            ExitCode::from(1)
        }
    }
}
