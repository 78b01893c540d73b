//! `rdma-9p serve [--addr A] [--port P] [--read-only] [--msize N] [--max-fids N]
//! [--max-connections N] [--workers N] [--squash root|all|none] [--anon-uid N]
//! [--anon-gid N] DIR`, parsed with clap's derive (`rdma-9p serve --help`).

use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::anyhow;
use clap::{Parser, Subcommand};
use rdma_9p::server::{run, Config, DEFAULT_MSIZE};
use rdma_9p::users::Squash;

/// Who may do what, and the environment: what follows `serve --help`.
const SERVE_NOTE: &str = "\
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

Environment:
  RUST_LOG       what is logged to stderr (env_logger's syntax; info when unset):
                 rdma_9p=trace adds every request, reply and completion;
                 rdma_9p::stats=debug where reads' and writes' time went on
                 the server, after each burst of them
  RDMA_9P_POOL_ALL  when set, reads and writes of regular files go to the
                 thread pool as every other request (for comparisons)
  RDMA_9P_BENCH_NULL  for benchmarks only: when set, reads and writes of
                 regular files are answered without touching the file (a
                 read gets whatever bytes the reply buffer holds)";

/// A 9P2000.L file server over RDMA (RDMA CM, one SEND per message).
#[derive(Parser, Debug)]
#[command(
    name = "rdma-9p",
    after_help = "`rdma-9p serve --help` says who may do what: 9P over RDMA has no authentication."
)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand, Debug)]
enum Commands {
    /// Serves DIR over RDMA until killed (9P over RDMA has no authentication: see --help)
    #[command(args_override_self = true, after_help = SERVE_NOTE)]
    Serve(Serve),
}

/// The options of `serve`; their defaults are [`Config::new`]'s.
#[derive(clap::Args, Debug)]
struct Serve {
    /// The IP address to listen on (0.0.0.0 or ::: every address)
    #[arg(long, value_name = "A", default_value_t = defaults().addr, value_parser = parse_addr)]
    addr: IpAddr,
    /// The RDMA CM port, TCP port space
    #[arg(long, value_name = "P", default_value_t = defaults().port, value_parser = parse_port)]
    port: u16,
    /// Refuse every change (EROFS)
    #[arg(long)]
    read_only: bool,
    /// The largest message size agreed, 4096 to 16777216 bytes;
    /// every receive is this large
    #[arg(long, verbatim_doc_comment, value_name = "N", default_value_t = DEFAULT_MSIZE, value_parser = parse_msize)]
    msize: u32,
    /// The fids one connection may hold
    #[arg(long, value_name = "N", default_value_t = defaults().max_fids,
          value_parser = at_least_1("fids"))]
    max_fids: usize,
    /// Clients served at once, more are rejected; each holds its
    /// receive and send buffers from the moment it connects, and an
    /// equal share of the open files the descriptor limit allows
    /// (raised to the hard limit at start)
    #[arg(long, verbatim_doc_comment, value_name = "N", default_value_t = defaults().max_connections,
          value_parser = at_least_1("connections"))]
    max_connections: usize,
    /// The threads that run requests, shared by every connection,
    /// 1 to 4096; one connection runs at most a quarter of them (at
    /// least 1) at once, and more than one only while more than a
    /// quarter are free; its other requests wait in order, so that
    /// clients whose requests wait (a lock, a lease, a slow file
    /// system) leave threads to the others
    #[arg(long, verbatim_doc_comment, value_name = "N", default_value_t = defaults().workers, value_parser = parse_workers)]
    workers: usize,
    /// root: uid 0 acts as the anonymous user; all: every user does;
    /// none: users act as themselves, root included (tests, trusted
    /// fabrics)
    #[arg(long, verbatim_doc_comment, value_name = "S", default_value = "root", value_parser = parse_squash)]
    squash: Squash,
    /// The anonymous user's uid
    #[arg(long, value_name = "N", default_value_t = rdma_9p::users::ANON_ID,
          value_parser = id("uid"))]
    anon_uid: u32,
    /// The anonymous user's gid
    #[arg(long, value_name = "N", default_value_t = rdma_9p::users::ANON_ID,
          value_parser = id("gid"))]
    anon_gid: u32,
    /// The directory served
    #[arg(value_name = "DIR")]
    dir: PathBuf,
}

fn defaults() -> Config {
    Config::new(PathBuf::new())
}

fn parse_addr(s: &str) -> anyhow::Result<IpAddr> {
    s.parse()
        .map_err(|_| anyhow!("'{s}' is not an IP address (such as 10.8.0.1 or ::)"))
}

fn parse_port(s: &str) -> anyhow::Result<u16> {
    s.parse()
        .map_err(|_| anyhow!("'{s}' is not a port number (0 to 65535)"))
}

fn parse_msize(s: &str) -> anyhow::Result<u32> {
    let range = rdma_9p::fs::MIN_MSIZE..=16 << 20;
    match s.parse::<u32>() {
        Ok(m) if range.contains(&m) => Ok(m),
        Ok(m) => Err(anyhow!(
            "{m} is outside {} to {} bytes",
            range.start(),
            range.end()
        )),
        Err(_) => Err(anyhow!("'{s}' is not a size in bytes")),
    }
}

/// A count of `what`, at least 1.
fn at_least_1(what: &'static str) -> impl Fn(&str) -> anyhow::Result<usize> + Clone {
    move |s: &str| match s.parse::<usize>() {
        Ok(0) => Err(anyhow!("at least 1")),
        Ok(n) => Ok(n),
        Err(_) => Err(anyhow!("'{s}' is not a number of {what}")),
    }
}

fn parse_workers(s: &str) -> anyhow::Result<usize> {
    match s.parse::<usize>() {
        Ok(n @ 1..=4096) => Ok(n),
        Ok(_) => Err(anyhow!("1 to 4096")),
        Err(_) => Err(anyhow!("'{s}' is not a number of threads")),
    }
}

fn parse_squash(s: &str) -> anyhow::Result<Squash> {
    s.parse::<Squash>()
        .map_err(|_| anyhow!("'{s}' is not root, all or none"))
}

/// A uid or gid (`what`).
fn id(what: &'static str) -> impl Fn(&str) -> anyhow::Result<u32> + Clone {
    move |s: &str| s.parse().map_err(|_| anyhow!("'{s}' is not a {what}"))
}

impl Serve {
    fn config(self) -> Config {
        let mut c = Config::new(self.dir);
        c.addr = self.addr;
        c.port = self.port;
        c.read_only = self.read_only;
        c.max_msize = self.msize;
        c.max_fids = self.max_fids;
        c.max_connections = self.max_connections;
        c.workers = self.workers;
        c.users.squash = self.squash;
        c.users.anon_uid = self.anon_uid;
        c.users.anon_gid = self.anon_gid;
        c
    }
}

fn main() -> ExitCode {
    // On an error, or for --help, clap prints and exits (status 2 for an error).
    let Commands::Serve(serve) = Cli::parse().command;
    // Connections and warnings are logged unless RUST_LOG says otherwise.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    match serve_dir(serve) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The library's errors say what failed and why in their own
            // message (as rdma's do), so the outermost one is the whole story.
            eprintln!("rdma-9p: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Serves the directory `serve` names until an error stops the server.
fn serve_dir(serve: Serve) -> anyhow::Result<()> {
    let config = serve.config();
    let dir = config.dir.clone();
    run(config, |addr| {
        println!("rdma-9p: serving {} on {addr}", dir.display());
        let _ = std::io::stdout().flush();
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;

    fn parse(s: &str) -> Result<Config, clap::Error> {
        let Commands::Serve(serve) =
            Cli::try_parse_from(std::iter::once("rdma-9p").chain(s.split_whitespace()))?.command;
        Ok(serve.config())
    }

    fn err(s: &str) -> String {
        parse(s).expect_err(s).to_string()
    }

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn help_is_asked_for_in_every_place() {
        for s in [
            "--help",
            "-h",
            "help",
            "help serve",
            "serve --help",
            "serve -h",
            "serve --port 1 -h",
        ] {
            let e = parse(s).expect_err(s);
            assert_eq!(e.kind(), ErrorKind::DisplayHelp, "{s}");
        }
        let h = parse("serve --help").unwrap_err().to_string();
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
            "trans=rdma",
            "5640",
            "65534",
            "RUST_LOG",
        ] {
            assert!(h.contains(word), "the help lacks {word}");
        }
        // `-h` says as much as `--help`.
        assert_eq!(h, parse("serve -h").unwrap_err().to_string());
    }

    #[test]
    fn a_good_command_line() {
        let c =
            parse("serve --addr 10.8.0.1 --port=5641 --read-only --msize 65536 --max-fids 9 /srv")
                .unwrap();
        assert_eq!(c.addr.to_string(), "10.8.0.1");
        assert_eq!(
            (c.port, c.read_only, c.max_msize, c.max_fids),
            (5641, true, 65536, 9)
        );
        assert_eq!(c.dir, std::path::Path::new("/srv"));
        assert_eq!(c.users, rdma_9p::users::Users::default());
        assert_eq!((c.workers, c.max_running()), (64, 16));
        // The defaults are the library's.
        let d = Config::new("/srv".into());
        let c = parse("serve /srv").unwrap();
        assert_eq!(
            (c.addr, c.port, c.read_only, c.max_msize, c.max_fids),
            (d.addr, d.port, d.read_only, d.max_msize, d.max_fids)
        );
        assert_eq!(
            (c.max_connections, c.workers, c.users),
            (d.max_connections, d.workers, d.users)
        );
        let c = parse("serve --workers 6 /srv").unwrap();
        assert_eq!((c.workers, c.max_running()), (6, 1));
        let c = parse("serve --squash all --anon-uid 1234 --anon-gid=99 /srv").unwrap();
        assert_eq!(
            (c.users.squash, c.users.anon_uid, c.users.anon_gid),
            (Squash::All, 1234, 99)
        );
        let c = parse("serve -- -dir").unwrap();
        assert_eq!(c.dir, std::path::Path::new("-dir"));
        // A flag given twice: the last one counts, as with getopt_long.
        assert_eq!(parse("serve --port 1 --port 2 /srv").unwrap().port, 2);
    }

    #[test]
    fn every_bad_argument_is_named() {
        assert_eq!(
            parse("").unwrap_err().kind(),
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        );
        assert!(err("mount /x").contains("unrecognized subcommand 'mount'"));
        assert!(err("--port 1").contains("unexpected argument '--port'"));
        assert!(err("serve").contains("<DIR>"));
        assert!(err("serve /a /b").contains("unexpected argument '/b'"));
        assert!(err("serve --bogus /a").contains("unexpected argument '--bogus'"));
        assert!(err("serve --prot 1 /a").contains("a similar argument exists: '--port'"));
        assert!(err("serve /a --port").contains("a value is required for '--port <P>'"));
        assert!(err("serve --port 70000 /a")
            .contains("invalid value '70000' for '--port <P>': '70000' is not a port number"));
        assert!(err("serve --port=x /a").contains("'x' is not a port number"));
        assert!(err("serve --addr 10.8.0 /a")
            .contains("for '--addr <A>': '10.8.0' is not an IP address"));
        assert!(err("serve --msize 100 /a").contains("'--msize <N>': 100 is outside 4096"));
        assert!(err("serve --msize=-5 /a").contains("'-5' is not a size"));
        assert!(err("serve --max-fids 0 /a").contains("'--max-fids <N>': at least 1"));
        assert!(err("serve --max-connections 0 /a").contains("'--max-connections <N>': at least 1"));
        assert!(err("serve --max-connections x /a").contains("not a number of connections"));
        assert!(err("serve --workers 0 /a").contains("'--workers <N>': 1 to 4096"));
        assert!(err("serve --workers lots /a").contains("not a number of threads"));
        assert!(
            err("serve --read-only=yes /a").contains("unexpected value 'yes' for '--read-only'")
        );
        assert!(err("serve --squash some /a")
            .contains("for '--squash <S>': 'some' is not root, all or none"));
        assert!(err("serve --anon-uid=-1 /a").contains("'--anon-uid <N>': '-1' is not a uid"));
        assert!(err("serve --anon-gid /a").contains("'--anon-gid <N>': '/a' is not a gid"));
    }
}
