//! `rdma-9p serve [--addr A] [--port P] [--read-only] [--msize N] [--max-fids N] DIR`

use std::io::Write;
use std::process::ExitCode;

use rdma_9p::server::{run, Config};

const USAGE: &str = "\
usage: rdma-9p serve [--addr A] [--port P] [--read-only] [--msize N] [--max-fids N] DIR
  Serves DIR as 9P2000.L over RDMA (RDMA CM, port 5640 by default). Linux mounts it with
  mount -t 9p -o trans=rdma,port=P,version=9p2000.L A /mnt";

fn parse(args: &[String]) -> Result<Config, String> {
    let mut it = args.iter();
    match it.next().map(String::as_str) {
        Some("serve") => {}
        Some(other) => return Err(format!("unknown command {other}")),
        None => return Err("a command is needed".into()),
    }
    let mut dir = None;
    let mut c = Config::new(Default::default());
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--addr" => c.addr = value()?.parse().map_err(|_| "--addr: an IP address")?,
            "--port" => c.port = value()?.parse().map_err(|_| "--port: a port number")?,
            "--read-only" => c.read_only = true,
            "--msize" => {
                c.max_msize = value()?
                    .parse()
                    .ok()
                    .filter(|&m| (rdma_9p::fs::MIN_MSIZE..=16 << 20).contains(&m))
                    .ok_or("--msize: a size from 4096 to 16 MiB")?
            }
            "--max-fids" => {
                c.max_fids = value()?
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or("--max-fids: a positive number")?
            }
            "-h" | "--help" => return Err(String::new()),
            s if s.starts_with('-') => return Err(format!("unknown option {s}")),
            s if dir.is_none() => dir = Some(s.into()),
            s => return Err(format!("unexpected argument {s}")),
        }
    }
    c.dir = dir.ok_or("the directory to serve is missing")?;
    Ok(c)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let config = match parse(&args) {
        Ok(c) => c,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("rdma-9p: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let dir = config.dir.clone();
    let result = run(config, |addr| {
        println!("rdma-9p: serving {} on {addr}", dir.display());
        let _ = std::io::stdout().flush();
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rdma-9p: {e}");
            ExitCode::FAILURE
        }
    }
}
