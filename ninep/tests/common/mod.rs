//! What the device tests of rdma-9p share: the environment the VM sets,
//! and the server run as a child process.
#![allow(dead_code)]

pub mod session;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub fn required_env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: this test needs an RDMA device. Run it in the VM (ci/vm run ...)."
        )
    })
}

/// The device must exist: its sysfs entry is checked, not assumed.
pub fn require_device(name: &str) {
    let p = format!("/sys/class/infiniband/{name}");
    assert!(
        Path::new(&p).exists(),
        "requested RDMA device {name} is missing"
    );
}

pub fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn tmpdir(what: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("rdma-9p-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// A kernel 9P mount, unmounted on drop (lazily when a test failed).
pub struct Mount {
    pub at: PathBuf,
    mounted: bool,
}

impl Mount {
    pub fn new(addr: &str, port: u16, at: &Path) -> Mount {
        Mount::with(addr, port, at, "")
    }

    /// A mount with more options (`extra` starts with a comma).
    pub fn with(addr: &str, port: u16, at: &Path, extra: &str) -> Mount {
        Mount::try_with(addr, port, at, extra).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A mount, or what `mount` said when it failed (within 60 s: a hung connection must
    /// fail the test, not hang it).
    pub fn try_with(addr: &str, port: u16, at: &Path, extra: &str) -> Result<Mount, String> {
        std::fs::create_dir_all(at).unwrap();
        let opts = format!("trans=rdma,port={port},version=9p2000.L{extra}");
        let out = Command::new("timeout")
            .args(["60", "mount", "-t", "9p", "-o", &opts, addr])
            .arg(at)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount {addr}:{port} on {}: {}\n{}",
                at.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(Mount {
            at: at.to_path_buf(),
            mounted: true,
        })
    }

    pub fn p(&self, rel: &str) -> PathBuf {
        self.at.join(rel)
    }

    pub fn unmount(mut self) {
        run("timeout", &["60", "umount", self.at.to_str().unwrap()]);
        self.mounted = false;
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg("-l").arg(&self.at).status();
        }
    }
}

/// The server process, killed on drop.
pub struct Server {
    child: Child,
}

impl Server {
    /// The server of the kernel-mount battery: its clients act as the
    /// users they name, root included (`--squash none`: the battery checks
    /// what root does, `chown` among it).
    pub fn start(addr: &str, port: u16, dir: &Path) -> Server {
        Server::start_with(addr, port, dir, &["--squash", "none"])
    }

    /// The server with `options` before the directory.
    pub fn start_with(addr: &str, port: u16, dir: &Path, options: &[&str]) -> Server {
        Server::start_under(&[], addr, port, dir, options)
    }

    /// The server run by the command `under` (`prlimit --nofile=...`,
    /// say), with `options` before the directory.
    pub fn start_under(
        under: &[&str],
        addr: &str,
        port: u16,
        dir: &Path,
        options: &[&str],
    ) -> Server {
        let bin = env!("CARGO_BIN_EXE_rdma-9p");
        let mut cmd = match under.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let mut child = cmd
            .args(["serve", "--addr", addr, "--port", &port.to_string()])
            .args(options)
            .arg(dir)
            .stdout(Stdio::piped())
            .spawn()
            .expect("rdma-9p starts");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("rdma-9p says it listens within 30 s");
        assert!(line.contains("serving"), "rdma-9p said {line:?}");
        Server { child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
