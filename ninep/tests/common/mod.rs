//! What the device tests of rdma-9p share: the environment the VM sets,
//! and the server run as a child process.
#![allow(dead_code)]

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

/// The server process, killed on drop.
pub struct Server {
    child: Child,
}

impl Server {
    pub fn start(addr: &str, port: u16, dir: &Path) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rdma-9p"))
            .args(["serve", "--addr", addr, "--port", &port.to_string()])
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
