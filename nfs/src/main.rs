//! `rdma-nfs [--port P] [--timeout S] ls|cat|put|rm ...`: an NFSv3 client
//! over RPC-over-RDMA; the command line is clap's derive (`rdma-nfs --help`).

use std::io::Write;
use std::net::IpAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::{Parser, Subcommand};
use rdma_nfs::nfs3::{Client, NfsError, Options, NF3DIR};

/// What follows the help of the tool and of each command.
const NOTE: &str = "\
NFSv3 over RPC-over-RDMA (RDMA CM, port 20049 by default); the root handle comes from the
server's mountd over TCP, for the longest directory of the path it exports. SERVER is an IP
address ([IPV6]:PATH for IPv6), PATH is absolute.";

/// An NFSv3 client over RPC-over-RDMA version 1.
#[derive(Parser, Debug)]
#[command(name = "rdma-nfs", after_help = NOTE, args_override_self = true)]
struct Cli {
    /// The server's RDMA port, 1 to 65535
    #[arg(long, global = true, value_name = "P", default_value_t = rdma_nfs::transport::DEFAULT_PORT,
          value_parser = parse_port)]
    port: u16,
    /// Seconds for each connection step and each call, 1 to 3600 (default: 10 for a
    /// connection step, 30 for a call)
    #[arg(long, global = true, value_name = "S", value_parser = parse_timeout)]
    timeout: Option<u64>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug, PartialEq, Eq)]
enum Cmd {
    /// List a directory (type, size, name)
    #[command(after_help = NOTE)]
    Ls {
        /// The directory
        #[arg(value_name = "SERVER:DIR", value_parser = target)]
        dir: Target,
    },
    /// Write a file to standard output
    #[command(after_help = NOTE)]
    Cat {
        /// The file
        #[arg(value_name = "SERVER:FILE", value_parser = target)]
        file: Target,
    },
    /// Copy a local file to the server (created or truncated)
    #[command(after_help = NOTE)]
    Put {
        /// The local file
        #[arg(value_name = "LOCAL")]
        local: String,
        /// Where it goes
        #[arg(value_name = "SERVER:FILE", value_parser = target)]
        file: Target,
    },
    /// Remove a file
    #[command(after_help = NOTE)]
    Rm {
        /// The file
        #[arg(value_name = "SERVER:FILE", value_parser = target)]
        file: Target,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    server: IpAddr,
    path: String,
}

fn target(s: &str) -> anyhow::Result<Target> {
    let (host, path) = if let Some(rest) = s.strip_prefix('[') {
        rest.split_once("]:").context("expected [IPV6]:PATH")?
    } else {
        s.split_once(':').context("expected SERVER:PATH")?
    };
    let server = host
        .parse()
        .map_err(|_| anyhow!("'{host}' is not an IP address"))?;
    if !path.starts_with('/') {
        bail!("the path must be absolute");
    }
    Ok(Target {
        server,
        path: path.to_string(),
    })
}

fn parse_port(s: &str) -> anyhow::Result<u16> {
    match s.parse() {
        Ok(p) if p != 0 => Ok(p),
        _ => bail!("'{s}' is not a port from 1 to 65535"),
    }
}

fn parse_timeout(s: &str) -> anyhow::Result<u64> {
    match s.parse() {
        Ok(t @ 1..=3600) => Ok(t),
        _ => bail!("'{s}' is not a number of seconds from 1 to 3600"),
    }
}

impl Cli {
    /// The client's options and the command.
    fn options(self) -> (Options, Cmd) {
        let mut o = Options {
            port: self.port,
            ..Options::default()
        };
        if let Some(s) = self.timeout {
            o.transport.connect_timeout = Duration::from_secs(s);
            o.transport.call_timeout = Duration::from_secs(s);
        }
        (o, self.command)
    }
}

/// Splits `/a/b/c` into its directory and last name.
fn split(path: &str) -> anyhow::Result<(&str, &str)> {
    let p = path.trim_end_matches('/');
    match p.rsplit_once('/') {
        Some((_, "")) | None => bail!("{path}: names no file"),
        Some(("", name)) => Ok(("/", name)),
        Some((dir, name)) => Ok((dir, name)),
    }
}

/// Mounts the longest directory of `dir` that mountd exports, and looks up
/// the rest: a client and the directory's handle.
async fn open(
    server: IpAddr,
    dir: &str,
    o: &Options,
) -> anyhow::Result<(Client, rdma_nfs::nfs3::Fh)> {
    let mut export = dir.trim_end_matches('/').to_string();
    if export.is_empty() {
        export = "/".into();
    }
    let mut first_err = None;
    loop {
        match Client::mount(server, &export, o.clone()).await {
            Ok(c) => {
                let rest = dir[export.len().min(dir.len())..].to_string();
                let f = c.lookup_path(&rest).await.context(dir.to_string())?;
                return Ok((c, f));
            }
            Err(NfsError::Mount(rdma_nfs::mount::MountError::Refused(..))) if export != "/" => {
                first_err.get_or_insert_with(|| format!("mount {export}: refused"));
                export = match export.rsplit_once('/') {
                    Some(("", _)) => "/".into(),
                    Some((p, _)) => p.into(),
                    None => "/".into(),
                };
            }
            Err(e) => {
                return Err(match first_err {
                    Some(f) => anyhow!("{f}; {e}"),
                    None => anyhow!(e),
                });
            }
        }
    }
}

async fn run(o: Options, cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Ls { dir: t } => {
            let (c, dir) = open(t.server, &t.path, &o).await?;
            let mut entries = c.readdirplus(&dir).await.with_context(|| t.path.clone())?;
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            let mut out = std::io::stdout().lock();
            for e in entries {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                let (kind, size) = match e.attr {
                    Some(a) if a.ftype == NF3DIR => ('d', a.size),
                    Some(a) => ('-', a.size),
                    None => ('?', 0),
                };
                writeln!(
                    out,
                    "{kind} {size:>12} {}",
                    String::from_utf8_lossy(&e.name)
                )
                .context("stdout")?;
            }
            c.close().await;
        }
        Cmd::Cat { file: t } => {
            let (dir, name) = split(&t.path)?;
            let (c, d) = open(t.server, dir, &o).await?;
            let (f, _) = c
                .lookup(&d, name.as_bytes())
                .await
                .with_context(|| t.path.clone())?;
            // Each READ's data written out from where it landed (the
            // write chunk's memory, lent: no copy in this process).
            let mut out = std::io::stdout().lock();
            c.read_each(&f, |piece| out.write_all(piece))
                .await
                .with_context(|| t.path.clone())?
                .and_then(|_| out.flush())
                .context("stdout")?;
            c.close().await;
        }
        Cmd::Put { local, file: t } => {
            let data = std::fs::read(&local).with_context(|| local.clone())?;
            let (dir, name) = split(&t.path)?;
            let (c, d) = open(t.server, dir, &o).await?;
            let f = c
                .create(&d, name.as_bytes(), 0o644)
                .await
                .with_context(|| t.path.clone())?;
            // The pieces are ranges of the file's bytes (copied once, into
            // chunk memory or a send buffer).
            c.write_all_shared(&f, std::sync::Arc::new(data))
                .await
                .with_context(|| t.path.clone())?;
            c.close().await;
        }
        Cmd::Rm { file: t } => {
            let (dir, name) = split(&t.path)?;
            let (c, d) = open(t.server, dir, &o).await?;
            c.remove(&d, name.as_bytes())
                .await
                .with_context(|| t.path.clone())?;
            c.close().await;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    // On an error, or for --help, clap prints and exits (status 2 for an error).
    let (o, cmd) = Cli::parse().options();
    logger();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rdma-nfs: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(o, cmd)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}`: each context, then its cause ("PATH: NFS3ERR_NOENT").
            eprintln!("rdma-nfs: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// What the library logs (`log`: connection losses, reconnections) goes to
/// standard error as `RUST_LOG` selects (`RUST_LOG=rdma_nfs=info`; errors
/// only by default), each line with the wall clock's seconds (mod 1000) and
/// milliseconds, to be lined up with the server's or the kernel's log.
fn logger() {
    env_logger::Builder::from_default_env()
        .format(|out, r| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            writeln!(
                out,
                "rdma-nfs: [{}.{:03}] {} {}: {}",
                t.as_secs() % 1000,
                t.subsec_millis(),
                r.level(),
                r.target(),
                r.args()
            )
        })
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;

    fn parse(s: &str) -> Result<(Options, Cmd), clap::Error> {
        Cli::try_parse_from(std::iter::once("rdma-nfs").chain(s.split_whitespace()))
            .map(Cli::options)
    }

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn commands_parse_and_bad_input_says_what_is_wrong() {
        let (o, c) = parse("--port 2050 cat 10.8.0.1:/export/a").unwrap();
        assert_eq!(o.port, 2050);
        assert_eq!(
            c,
            Cmd::Cat {
                file: Target {
                    server: "10.8.0.1".parse().unwrap(),
                    path: "/export/a".into()
                }
            }
        );
        let d = Options::default();
        assert_eq!(o.transport.call_timeout, d.transport.call_timeout);
        assert_eq!(o.transport.connect_timeout, d.transport.connect_timeout);
        // The options go before or after the command.
        let (o, _) = parse("ls 10.8.0.1:/ --port 2051 --timeout 5").unwrap();
        assert_eq!(o.port, 2051);
        assert_eq!(o.transport.call_timeout, Duration::from_secs(5));
        assert_eq!(o.transport.connect_timeout, Duration::from_secs(5));
        assert_eq!(parse("ls 10.8.0.1:/").unwrap().0.port, 20049);
        assert!(matches!(
            parse("put x [::1]:/e/f").unwrap().1,
            Cmd::Put { local, .. } if local == "x"
        ));
        for s in ["--help", "-h", "help", "help put", "put --help", "ls -h"] {
            let e = parse(s).expect_err(s);
            assert_eq!(e.kind(), ErrorKind::DisplayHelp, "{s}");
            assert!(e.to_string().contains("mountd"), "{s}: {e}");
        }
        assert_eq!(
            parse("").unwrap_err().kind(),
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        );
        for (bad, says) in [
            ("cp a b", "unrecognized subcommand 'cp'"),
            ("ls", "<SERVER:DIR>"),
            (
                "ls 10.8.0.1:/a 10.8.0.1:/b",
                "unexpected argument '10.8.0.1:/b'",
            ),
            (
                "cat host:/x",
                "invalid value 'host:/x' for '<SERVER:FILE>': 'host' is not an IP address",
            ),
            (
                "cat 10.8.0.1",
                "'10.8.0.1' for '<SERVER:FILE>': expected SERVER:PATH",
            ),
            ("cat [::1/x", "expected [IPV6]:PATH"),
            (
                "cat 10.8.0.1:rel",
                "'10.8.0.1:rel' for '<SERVER:FILE>': the path must be absolute",
            ),
            (
                "--port 0 ls 10.8.0.1:/",
                "'0' for '--port <P>': '0' is not a port",
            ),
            ("--port", "a value is required for '--port <P>'"),
            (
                "--timeout x ls 10.8.0.1:/",
                "for '--timeout <S>': 'x' is not a number",
            ),
            ("--timeout 0 ls 10.8.0.1:/", "from 1 to 3600"),
            ("--bogus ls 10.8.0.1:/", "unexpected argument '--bogus'"),
            (
                "--prot 1 ls 10.8.0.1:/",
                "a similar argument exists: '--port'",
            ),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        assert_eq!(split("/export/a").unwrap(), ("/export", "a"));
        assert_eq!(split("/a").unwrap(), ("/", "a"));
        assert!(split("/").is_err());
    }
}
