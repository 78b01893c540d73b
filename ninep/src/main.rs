//! `rdma-9p serve [--addr A] [--port P] [--read-only] [--msize N] [--max-fids N]
//! [--max-connections N] [--workers N] [--squash root|all|none] [--anon-uid N]
//! [--anon-gid N] DIR`

use std::io::Write;
use std::process::ExitCode;

use rdma_9p::server::{run, Config, DEFAULT_MSIZE, DEFAULT_PORT};

const USAGE: &str = "\
usage: rdma-9p serve [OPTIONS] DIR
       rdma-9p --help | serve --help";

fn help() -> String {
    let defaults = Config::new(Default::default());
    format!(
        "\
rdma-9p: a 9P2000.L file server over RDMA (RDMA CM, one SEND per message).

{USAGE}

Serves DIR (nothing outside it is reachable) until killed. Linux mounts it with
  mount -t 9p -o trans=rdma,port=P,version=9p2000.L ADDR /mnt

Who may do what: 9P over RDMA has no authentication. A client names its
user, and whoever can reach the port can name any user: who can reach the
port is who can use the export. As knfsd does, the server believes the user
named, maps it through --squash, and runs each request with that user's
credentials (uid, primary and supplementary groups from this machine's
passwd and group databases), so the kernel checks every permission as for
that user here: device nodes and set-id bits only where the user could make
them locally. Run as root to act for many users; run as another user, the
server acts as itself for every client.

options of serve:
  --addr A       the IP address to listen on (default {addr}: every address)
  --port P       the RDMA CM port, TCP port space (default {DEFAULT_PORT})
  --read-only    refuse every change (EROFS)
  --msize N      the largest message size agreed, 4096 to 16777216 bytes
                 (default {DEFAULT_MSIZE}); every receive is this large
  --max-fids N   the fids one connection may hold (default {fids})
  --max-connections N
                 clients served at once, more are rejected (default {conns});
                 each holds its receive and send buffers from the moment it
                 connects, and an equal share of the open files the
                 descriptor limit allows (raised to the hard limit at start)
  --workers N    the threads that run requests, shared by every connection
                 (default {workers}); one connection runs at most a quarter
                 of them (at least 1) at once, and more than one only while
                 more than a quarter are free; its other requests wait in
                 order, so that clients whose requests wait (a lock, a
                 lease, a slow file system) leave threads to the others
  --squash S     root: uid 0 acts as the anonymous user (the default);
                 all: every user does; none: users act as themselves, root
                 included (tests, trusted fabrics)
  --anon-uid N   the anonymous user's uid (default {anon})
  --anon-gid N   the anonymous user's gid (default {anon})
  -h, --help     print this help

environment:
  RDMA_9P_TRACE  when set, every request, reply and completion is printed to stderr
  RDMA_9P_STATS  when set, where reads' and writes' time went on the server is
                 printed to stderr after each burst of them
  RDMA_9P_POOL_ALL  when set, reads and writes of regular files go to the
                 thread pool as every other request (for comparisons)
  RDMA_9P_BENCH_NULL  for benchmarks only: when set, reads and writes of
                 regular files are answered without touching the file (a
                 read gets whatever bytes the reply buffer holds)",
        addr = defaults.addr,
        fids = defaults.max_fids,
        conns = defaults.max_connections,
        workers = defaults.workers,
        anon = rdma_9p::users::ANON_ID,
    )
}

/// What the command line asks for.
#[derive(Debug)]
enum Command {
    Help,
    Serve(Config),
}

fn number<T: std::str::FromStr>(option: &str, value: &str, what: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{option}: {value:?} is not {what}"))
}

fn parse(args: &[String]) -> Result<Command, String> {
    let mut it = args.iter();
    match it.next().map(String::as_str) {
        Some("serve") => {}
        Some("-h" | "--help" | "help") => return Ok(Command::Help),
        Some(other) if other.starts_with('-') => {
            return Err(format!(
                "unknown option {other:?} (the command comes first: serve)"
            ))
        }
        Some(other) => return Err(format!("unknown command {other:?} (the only one is serve)")),
        None => return Err("a command is needed: serve".into()),
    }
    let mut dir: Option<String> = None;
    let mut c = Config::new(Default::default());
    let mut options_done = false;
    while let Some(a) = it.next() {
        if options_done || !a.starts_with('-') || a == "-" {
            if let Some(first) = &dir {
                return Err(format!(
                    "one directory is served: {first:?}, and then {a:?}"
                ));
            }
            dir = Some(a.clone());
            continue;
        }
        // `--opt=value` or `--opt value`.
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or(format!("{name} needs a value"))
        };
        match name {
            "--addr" => {
                let v = value()?;
                c.addr = number(name, &v, "an IP address (such as 10.8.0.1 or ::)")?;
            }
            "--port" => {
                let v = value()?;
                c.port = number(name, &v, "a port number (0 to 65535)")?;
            }
            "--msize" => {
                let v = value()?;
                let m: u32 = number(name, &v, "a size in bytes")?;
                if !(rdma_9p::fs::MIN_MSIZE..=16 << 20).contains(&m) {
                    return Err(format!(
                        "--msize: {m} is outside {} to {} bytes",
                        rdma_9p::fs::MIN_MSIZE,
                        16 << 20
                    ));
                }
                c.max_msize = m;
            }
            "--max-connections" => {
                let v = value()?;
                let n: usize = number(name, &v, "a number of connections")?;
                if n == 0 {
                    return Err("--max-connections: at least 1".into());
                }
                c.max_connections = n;
            }
            "--workers" => {
                let v = value()?;
                let n: usize = number(name, &v, "a number of threads")?;
                if !(1..=4096).contains(&n) {
                    return Err("--workers: 1 to 4096".into());
                }
                c.workers = n;
            }
            "--max-fids" => {
                let v = value()?;
                let n: usize = number(name, &v, "a number of fids")?;
                if n == 0 {
                    return Err("--max-fids: at least 1".into());
                }
                c.max_fids = n;
            }
            "--squash" => {
                let v = value()?;
                c.users.squash = v.parse().map_err(|e| format!("{name}: {e}"))?;
            }
            "--anon-uid" => {
                let v = value()?;
                c.users.anon_uid = number(name, &v, "a uid")?;
            }
            "--anon-gid" => {
                let v = value()?;
                c.users.anon_gid = number(name, &v, "a gid")?;
            }
            "--read-only" if inline.is_none() => c.read_only = true,
            "--read-only" => return Err("--read-only takes no value".into()),
            "-h" | "--help" => return Ok(Command::Help),
            "--" => options_done = true,
            _ => return Err(format!("unknown option {a:?}")),
        }
    }
    let dir = dir.ok_or("the directory to serve is missing")?;
    if dir.is_empty() {
        return Err("the directory to serve is an empty name".into());
    }
    c.dir = dir.into();
    Ok(Command::Serve(c))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let config = match parse(&args) {
        Ok(Command::Serve(c)) => c,
        Ok(Command::Help) => {
            println!("{}", help());
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("rdma-9p: {e}\n{USAGE}\n(rdma-9p --help says more)");
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn err(s: &str) -> String {
        parse(&args(s)).expect_err(s)
    }

    #[test]
    fn help_is_asked_for_in_every_place() {
        for s in [
            "--help",
            "-h",
            "help",
            "serve --help",
            "serve -h",
            "serve --port 1 -h",
        ] {
            assert!(matches!(parse(&args(s)), Ok(Command::Help)), "{s}");
        }
        let h = help();
        for word in [
            "--addr",
            "--port",
            "--read-only",
            "--msize",
            "--max-fids",
            "--max-connections",
            "--workers",
            "--squash",
            "--anon-uid",
            "--anon-gid",
            "no authentication",
            "5640",
        ] {
            assert!(h.contains(word), "the help lacks {word}");
        }
    }

    #[test]
    fn a_good_command_line() {
        let Ok(Command::Serve(c)) = parse(&args(
            "serve --addr 10.8.0.1 --port=5641 --read-only --msize 65536 --max-fids 9 /srv",
        )) else {
            panic!("not parsed")
        };
        assert_eq!(c.addr.to_string(), "10.8.0.1");
        assert_eq!(
            (c.port, c.read_only, c.max_msize, c.max_fids),
            (5641, true, 65536, 9)
        );
        assert_eq!(c.dir, std::path::Path::new("/srv"));
        assert_eq!(c.users, rdma_9p::users::Users::default());
        assert_eq!((c.workers, c.max_running()), (64, 16));
        let Ok(Command::Serve(c)) = parse(&args("serve --workers 6 /srv")) else {
            panic!("not parsed")
        };
        assert_eq!((c.workers, c.max_running()), (6, 1));
        let Ok(Command::Serve(c)) = parse(&args(
            "serve --squash all --anon-uid 1234 --anon-gid=99 /srv",
        )) else {
            panic!("not parsed")
        };
        assert_eq!(
            (c.users.squash, c.users.anon_uid, c.users.anon_gid),
            (rdma_9p::users::Squash::All, 1234, 99)
        );
        let Ok(Command::Serve(c)) = parse(&args("serve -- -dir")) else {
            panic!("not parsed")
        };
        assert_eq!(c.dir, std::path::Path::new("-dir"));
    }

    #[test]
    fn every_bad_argument_is_named() {
        assert!(err("").contains("a command is needed"));
        assert!(err("mount /x").contains("unknown command \"mount\""));
        assert!(err("--port 1").contains("unknown option \"--port\""));
        assert!(err("serve").contains("directory to serve is missing"));
        assert!(err("serve /a /b").contains("\"/a\", and then \"/b\""));
        assert!(err("serve --bogus /a").contains("unknown option \"--bogus\""));
        assert!(err("serve /a --port").contains("--port needs a value"));
        assert!(err("serve --port 70000 /a").contains("\"70000\" is not a port number"));
        assert!(err("serve --port=x /a").contains("\"x\" is not a port number"));
        assert!(err("serve --addr 10.8.0 /a").contains("\"10.8.0\" is not an IP address"));
        assert!(err("serve --msize 100 /a").contains("100 is outside 4096"));
        assert!(err("serve --msize -5 /a").contains("\"-5\" is not a size"));
        assert!(err("serve --max-fids 0 /a").contains("at least 1"));
        assert!(err("serve --max-connections 0 /a").contains("--max-connections: at least 1"));
        assert!(err("serve --max-connections x /a").contains("not a number of connections"));
        assert!(err("serve --workers 0 /a").contains("--workers: 1 to 4096"));
        assert!(err("serve --workers lots /a").contains("not a number of threads"));
        assert!(err("serve --read-only=yes /a").contains("takes no value"));
        assert!(
            err("serve --squash some /a").contains("--squash: \"some\" is not root, all or none")
        );
        assert!(err("serve --anon-uid -1 /a").contains("\"-1\" is not a uid"));
        assert!(err("serve --anon-gid /a").contains("\"/a\" is not a gid"));
    }
}
