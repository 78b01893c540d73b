//! `rdma-nfs [--port P] [--timeout S] ls|cat|put|rm ...`: an NFSv3 client
//! over RPC-over-RDMA.

use std::io::Write;
use std::net::IpAddr;
use std::process::ExitCode;
use std::time::Duration;

use rdma_nfs::nfs3::{Client, NfsError, Options, NF3DIR};

const USAGE: &str = "\
usage: rdma-nfs [--port P] [--timeout S] COMMAND ...
  ls  SERVER:DIR          list a directory (type, size, name)
  cat SERVER:FILE         write a file to standard output
  put LOCAL SERVER:FILE   copy a local file to the server (created or truncated)
  rm  SERVER:FILE         remove a file
NFSv3 over RPC-over-RDMA (RDMA CM, port 20049 by default); the root handle comes from the
server's mountd over TCP, for the longest directory of the path it exports.
  --port P      the server's RDMA port (default 20049)
  --timeout S   seconds for each connection step and each call (default 30)";

#[derive(Debug, PartialEq, Eq)]
enum Cmd {
    Ls(Target),
    Cat(Target),
    Put(String, Target),
    Rm(Target),
}

#[derive(Debug, PartialEq, Eq)]
struct Target {
    server: IpAddr,
    path: String,
}

fn target(s: &str) -> Result<Target, String> {
    let (host, path) = if let Some(rest) = s.strip_prefix('[') {
        let (h, p) = rest
            .split_once("]:")
            .ok_or(format!("{s:?}: expected [IPV6]:PATH"))?;
        (h, p)
    } else {
        s.split_once(':')
            .ok_or(format!("{s:?}: expected SERVER:PATH"))?
    };
    let server = host
        .parse()
        .map_err(|_| format!("{s:?}: {host:?} is not an IP address"))?;
    if !path.starts_with('/') {
        return Err(format!("{s:?}: the path must be absolute"));
    }
    Ok(Target {
        server,
        path: path.to_string(),
    })
}

fn parse(args: &[String]) -> Result<(Options, Cmd), String> {
    let mut o = Options::default();
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--port" => {
                o.port = value()?
                    .parse()
                    .ok()
                    .filter(|&p| p != 0)
                    .ok_or("--port: a port from 1 to 65535")?
            }
            "--timeout" => {
                let s: u64 = value()?
                    .parse()
                    .ok()
                    .filter(|&s| (1..=3600).contains(&s))
                    .ok_or("--timeout: seconds from 1 to 3600")?;
                o.transport.connect_timeout = Duration::from_secs(s);
                o.transport.call_timeout = Duration::from_secs(s);
            }
            "-h" | "--help" => return Err(String::new()),
            s if s.starts_with('-') && s.len() > 1 => return Err(format!("unknown option {s}")),
            s => rest.push(s.to_string()),
        }
    }
    let cmd = match rest.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["ls", t] => Cmd::Ls(target(t)?),
        ["cat", t] => Cmd::Cat(target(t)?),
        ["put", local, t] => Cmd::Put(local.to_string(), target(t)?),
        ["rm", t] => Cmd::Rm(target(t)?),
        [] => return Err("a command is needed".into()),
        [c, ..] if !["ls", "cat", "put", "rm"].contains(&c) => {
            return Err(format!("unknown command {c}"))
        }
        [c, ..] => return Err(format!("{c}: wrong number of arguments")),
    };
    Ok((o, cmd))
}

/// Splits `/a/b/c` into its directory and last name.
fn split(path: &str) -> Result<(&str, &str), String> {
    let p = path.trim_end_matches('/');
    match p.rsplit_once('/') {
        Some((_, "")) | None => Err(format!("{path}: names no file")),
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
) -> Result<(Client, rdma_nfs::nfs3::Fh), String> {
    let mut export = dir.trim_end_matches('/').to_string();
    if export.is_empty() {
        export = "/".into();
    }
    let mut first_err = None;
    loop {
        match Client::mount(server, &export, o.clone()).await {
            Ok(c) => {
                let rest = dir[export.len().min(dir.len())..].to_string();
                let f = c
                    .lookup_path(&rest)
                    .await
                    .map_err(|e| format!("{dir}: {e}"))?;
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
            Err(e) => return Err(first_err.map_or_else(|| e.to_string(), |f| format!("{f}; {e}"))),
        }
    }
}

async fn run(o: Options, cmd: Cmd) -> Result<(), String> {
    match cmd {
        Cmd::Ls(t) => {
            let (c, dir) = open(t.server, &t.path, &o).await?;
            let mut entries = c
                .readdirplus(&dir)
                .await
                .map_err(|e| format!("{}: {e}", t.path))?;
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
                .map_err(|e| format!("stdout: {e}"))?;
            }
            c.close().await;
        }
        Cmd::Cat(t) => {
            let (dir, name) = split(&t.path)?;
            let (c, d) = open(t.server, dir, &o).await?;
            let (f, _) = c
                .lookup(&d, name.as_bytes())
                .await
                .map_err(|e| format!("{}: {e}", t.path))?;
            // Each READ's data written out from where it landed (the
            // write chunk's memory, lent: no copy in this process).
            let mut out = std::io::stdout().lock();
            c.read_each(&f, |piece| out.write_all(piece))
                .await
                .map_err(|e| format!("{}: {e}", t.path))?
                .and_then(|_| out.flush())
                .map_err(|e| format!("stdout: {e}"))?;
            c.close().await;
        }
        Cmd::Put(local, t) => {
            let data = std::fs::read(&local).map_err(|e| format!("{local}: {e}"))?;
            let (dir, name) = split(&t.path)?;
            let (c, d) = open(t.server, dir, &o).await?;
            let f = c
                .create(&d, name.as_bytes(), 0o644)
                .await
                .map_err(|e| format!("{}: {e}", t.path))?;
            // The pieces are ranges of the file's bytes (copied once, into
            // chunk memory or a send buffer).
            c.write_all_shared(&f, std::sync::Arc::new(data))
                .await
                .map_err(|e| format!("{}: {e}", t.path))?;
            c.close().await;
        }
        Cmd::Rm(t) => {
            let (dir, name) = split(&t.path)?;
            let (c, d) = open(t.server, dir, &o).await?;
            c.remove(&d, name.as_bytes())
                .await
                .map_err(|e| format!("{}: {e}", t.path))?;
            c.close().await;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (o, cmd) = match parse(&args) {
        Ok(x) => x,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("rdma-nfs: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
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
            eprintln!("rdma-nfs: {e}");
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

    #[test]
    fn commands_parse_and_bad_input_says_what_is_wrong() {
        let (o, c) = parse(&args("--port 2050 cat 10.8.0.1:/export/a")).unwrap();
        assert_eq!(o.port, 2050);
        assert_eq!(
            c,
            Cmd::Cat(Target {
                server: "10.8.0.1".parse().unwrap(),
                path: "/export/a".into()
            })
        );
        assert!(matches!(
            parse(&args("put x [::1]:/e/f")).unwrap().1,
            Cmd::Put(l, _) if l == "x"
        ));
        assert_eq!(parse(&args("--help")).unwrap_err(), "");
        for (bad, says) in [
            ("", "a command is needed"),
            ("cp a b", "unknown command cp"),
            ("ls", "wrong number"),
            ("cat host:/x", "not an IP address"),
            ("cat 10.8.0.1", "expected SERVER:PATH"),
            ("cat 10.8.0.1:rel", "absolute"),
            ("--port 0 ls 10.8.0.1:/", "--port"),
            ("--port", "needs a value"),
            ("--timeout x ls 10.8.0.1:/", "--timeout"),
            ("--bogus ls 10.8.0.1:/", "unknown option"),
        ] {
            let e = parse(&args(bad)).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        assert_eq!(split("/export/a").unwrap(), ("/export", "a"));
        assert_eq!(split("/a").unwrap(), ("/", "a"));
        assert!(split("/").is_err());
    }
}
