//! The out-of-band exchange over TCP: a line-based protocol of perf's own.
//!
//! ```text
//! client -> server   perf 1 test=write_bw size=65536 all=0 iters=5000 qps=1 atomic=fetch_add
//! server -> client   ok                       (or: mismatch <what differs>)
//! client -> server   qp LID QPN PSN GID RKEY ADDR LEN      (one line per QP, hex)
//! server -> client   qp ...                                (one line per QP)
//! either way         sync                     (a barrier: before and after every size)
//! ```
//! Both sides must be given the same test and options; the first line makes
//! a mismatch an error on both sides instead of a hang.

use std::cell::Cell;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, Ipv6Addr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use rdma::Gid;

use anyhow::{anyhow, bail, Context as _};

use crate::common::Res;

/// One QP's address and the memory a peer may target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// Initial packet sequence number.
    pub psn: u32,
    /// GID (zero without one).
    pub gid: Gid,
    /// rkey of the target region.
    pub rkey: u32,
    /// Address of the target region.
    pub addr: u64,
    /// Length of the target region.
    pub len: u64,
}

impl Dest {
    fn to_line(self) -> String {
        let gid: String = self.gid.raw().iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "qp {:x} {:x} {:x} {gid} {:x} {:x} {:x}",
            self.lid, self.qpn, self.psn, self.rkey, self.addr, self.len
        )
    }

    fn from_line(line: &str) -> Res<Dest> {
        let bad = || anyhow!("malformed QP address from the peer: {line:?}");
        let f: Vec<&str> = line.split_whitespace().collect();
        let ["qp", lid, qpn, psn, gid, rkey, addr, len] = f[..] else {
            return Err(bad());
        };
        let hex = |s: &str| u64::from_str_radix(s, 16).map_err(|_| bad());
        if gid.len() != 32 {
            return Err(bad());
        }
        let mut raw = [0u8; 16];
        for (i, b) in raw.iter_mut().enumerate() {
            *b = u8::from_str_radix(&gid[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Dest {
            lid: u16::try_from(hex(lid)?).map_err(|_| bad())?,
            qpn: u32::try_from(hex(qpn)?).map_err(|_| bad())?,
            psn: u32::try_from(hex(psn)?).map_err(|_| bad())?,
            gid: Gid::from_raw(raw),
            rkey: u32::try_from(hex(rkey)?).map_err(|_| bad())?,
            addr: hex(addr)?,
            len: hex(len)?,
        })
    }

    /// Prints the address lines perftest prints.
    pub fn print(&self, label: &str, with_mem: bool) {
        let mem = if with_mem {
            format!(" RKey {:#08x} VAddr {:#016x}", self.rkey, self.addr)
        } else {
            String::new()
        };
        println!(
            " {label} address: LID {:#06x} QPN {:#06x} PSN {:#08x}{mem}",
            self.lid, self.qpn, self.psn
        );
        println!(" GID: {}", Ipv6Addr::from(self.gid.raw()));
    }
}

/// The TCP connection to the peer.
#[derive(Debug)]
pub struct Oob {
    out: TcpStream,
    input: BufReader<TcpStream>,
    line: String,
}

impl Oob {
    fn new(sock: TcpStream) -> Res<Oob> {
        // Barriers are tiny messages: do not let Nagle delay them.
        sock.set_nodelay(true).context("setsockopt(TCP_NODELAY)")?;
        let input = BufReader::new(sock.try_clone().context("Couldn't clone the socket")?);
        Ok(Oob {
            out: sock,
            input,
            line: String::new(),
        })
    }

    /// Listens on `port` (IPv6 wildcard, dual stack; IPv4 where IPv6 is
    /// off) and accepts one client.
    ///
    /// # Errors
    /// The port is taken, or accept fails.
    pub fn server(port: u16) -> Res<Oob> {
        let listener = TcpListener::bind((Ipv6Addr::UNSPECIFIED, port))
            .or_else(|_| TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)))
            .with_context(|| format!("Couldn't listen on TCP port {port}"))?;
        let (sock, _) = listener.accept().context("accept() failed")?;
        Oob::new(sock)
    }

    /// Connects to the server.
    ///
    /// # Errors
    /// Name resolution or connection failures, naming the address.
    pub fn client(host: &str, port: u16) -> Res<Oob> {
        let addrs = (host, port)
            .to_socket_addrs()
            .with_context(|| format!("Couldn't resolve {host}:{port}"))?;
        let mut last = None;
        for addr in addrs {
            match TcpStream::connect(addr) {
                Ok(s) => return Oob::new(s),
                Err(e) => last = Some(e),
            }
        }
        Err(match last {
            Some(e) => anyhow!("Couldn't connect to {host}:{port}: {e} (is the server running?)"),
            None => anyhow!("Couldn't connect to {host}:{port}: no address"),
        })
    }

    /// Sends one line.
    ///
    /// # Errors
    /// Socket errors.
    pub fn send(&mut self, line: &str) -> Res<()> {
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
        self.out
            .write_all(&buf)
            .context("Couldn't send to the peer over TCP")
    }

    /// Receives one line (without the newline).
    ///
    /// # Errors
    /// Socket errors, or the peer closed the connection.
    pub fn recv(&mut self) -> Res<&str> {
        self.line.clear();
        let n = self
            .input
            .read_line(&mut self.line)
            .context("Couldn't read from the peer over TCP")?;
        if n == 0 {
            return Err(anyhow!(
                "the peer closed the connection (see its error message)"
            ));
        }
        Ok(self.line.trim_end())
    }

    /// A liveness check for busy loops (see [`Watch`]).
    pub fn watch(&self) -> Watch<'_> {
        Watch {
            fd: self.out.as_fd(),
            spins: Cell::new(0),
        }
    }

    /// Waits until the peer reaches the same point.
    ///
    /// # Errors
    /// Socket errors or a protocol error.
    pub fn barrier(&mut self) -> Res<()> {
        self.send("sync")?;
        match self.recv()? {
            "sync" => Ok(()),
            other => Err(anyhow!(
                "out of step with the peer: expected sync, got {other:?}"
            )),
        }
    }

    /// Checks that both sides run the same test: the client sends `params`,
    /// the server compares them with its own.
    ///
    /// # Errors
    /// A mismatch, named on both sides.
    pub fn agree(&mut self, server: bool, params: &str) -> Res<()> {
        let hello = format!("perf 1 {params}");
        if server {
            let theirs = self.recv()?.to_string();
            if theirs == hello {
                return self.send("ok");
            }
            let why = format!("the client runs `{theirs}`, this server `{hello}`");
            let _ = self.send(&format!("mismatch {why}"));
            Err(anyhow!("Options differ from the client's: {why}"))
        } else {
            self.send(&hello)?;
            match self.recv()? {
                "ok" => Ok(()),
                r => match r.strip_prefix("mismatch ") {
                    Some(why) => Err(anyhow!("Options differ from the server's: {why}")),
                    None => Err(anyhow!("unexpected answer from the server: {r:?}")),
                },
            }
        }
    }

    /// Swaps QP addresses: the client sends first.
    ///
    /// # Errors
    /// Socket errors, malformed lines, or a different number of QPs.
    pub fn exchange(&mut self, server: bool, mine: &[Dest]) -> Res<Vec<Dest>> {
        if !server {
            for d in mine {
                self.send(&d.to_line())?;
            }
        }
        let mut theirs = Vec::with_capacity(mine.len());
        for _ in mine {
            let line = self.recv()?.to_string();
            theirs.push(Dest::from_line(&line)?);
        }
        if server {
            for d in mine {
                self.send(&d.to_line())?;
            }
        }
        Ok(theirs)
    }
}

/// Notices a peer that died in the middle of a test: busy loops call
/// [`Watch::idle`] on every empty spin, and every 65536th call peeks at the
/// TCP connection (one non-blocking syscall). Without it, a side whose peer
/// failed would poll forever.
#[derive(Debug)]
pub struct Watch<'a> {
    fd: BorrowedFd<'a>,
    spins: Cell<u32>,
}

impl Watch<'_> {
    /// Counts one idle spin; fails when the peer has closed the connection.
    ///
    /// # Errors
    /// The peer is gone.
    pub fn idle(&self) -> Res<()> {
        let n = self.spins.get().wrapping_add(1);
        self.spins.set(n);
        if n % (1 << 16) != 0 {
            return Ok(());
        }
        let mut byte = 0u8;
        // SAFETY: a socket kept open by the borrowed `Oob`, and a writable
        // one-byte buffer; MSG_PEEK leaves any data for the protocol.
        let r = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                std::ptr::addr_of_mut!(byte).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if r == 0 {
            bail!(
                "the peer closed the connection in the middle of the test \
                 (see its error message)"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dest_lines_round_trip() {
        let d = Dest {
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid: Gid::from_raw([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 10, 8, 0, 1]),
            rkey: 0x1234,
            addr: 0x5577_e715_c000,
            len: 65536,
        };
        assert_eq!(Dest::from_line(&d.to_line()).unwrap(), d);
        assert!(Dest::from_line("qp 1 2 3").is_err());
    }
}
