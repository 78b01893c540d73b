//! Code shared by the connection manager examples (`rping`, `rdma_server`,
//! `rdma_client`, `udaddy`, `mckey`, `ucmatose`, `cmtime`): address lookup
//! as rdma-core's examples do it, waiting on several descriptors, and the
//! completion loop helpers. Their flags go through [`super::args`].

use anyhow::{anyhow, Context as _};
use std::net::{IpAddr, ToSocketAddrs};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use rdma::cm::{self, AddrInfoFlags, AddrInfoHints, CmAddr, PortSpace};
use rdma::{Completion, CompletionChannel, CompletionQueue};

use super::args::{ArgError, Cli, Parsed};

// Each example uses some of these: unused in one is not unused in all.
#[allow(unused_imports)]
pub use super::Res;

/// An IP address for a host name or literal (`getaddrinfo(3)`, first
/// answer), as `rping` and `mckey` resolve `-a`/`-I`/`-b`/`-m`.
///
/// # Errors
/// The resolver's message.
pub fn host_ip(host: &str) -> Res<IpAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(ip);
    }
    (host, 0)
        .to_socket_addrs()
        .map_err(|e| {
            anyhow!("getaddrinfo failed for {host:?} ({e}) - invalid hostname or IP address")
        })?
        .next()
        .map(|a| a.ip())
        .with_context(|| format!("getaddrinfo failed - no address for {host}"))
}

/// The source and destination addresses of rdma-core's `get_rdma_addr()`
/// (librdmacm/examples/common.c): a passive lookup of `src` for servers,
/// else `dst` (with `src` looked up passively first, its address handed to
/// the second lookup as `ai_src_addr`). IP or, with `-f gid`, `AF_IB`.
pub struct RdmaAddr {
    /// Where to bind (servers) or the source of `rdma_resolve_addr`.
    pub src: Option<CmAddr>,
    /// The peer (clients).
    pub dst: Option<CmAddr>,
}

/// See [`RdmaAddr`]. `flags` and `family` are the tool's `-f` choice
/// (`NUMERICHOST`; `NUMERICHOST | FAMILY` and `AF_IB` for GIDs, 0 for any).
///
/// # Errors
/// `rdma_getaddrinfo error: ...`, as the C tools print it.
pub fn get_rdma_addr(
    src: Option<&str>,
    dst: Option<&str>,
    port: &str,
    passive: bool,
    ps: PortSpace,
    flags: AddrInfoFlags,
    family: i32,
) -> Res<RdmaAddr> {
    let mut hints = AddrInfoHints {
        flags,
        family,
        port_space: Some(ps),
        ..Default::default()
    };
    if passive {
        hints.flags |= AddrInfoFlags::PASSIVE;
        let info =
            cm::getaddrinfo(src, Some(port), Some(&hints)).context("rdma_getaddrinfo error")?;
        let e = info.first();
        return Ok(RdmaAddr {
            src: e.src_cm_addr(),
            dst: e.dst_cm_addr(),
        });
    }
    if let Some(s) = src {
        let mut h = hints;
        h.flags |= AddrInfoFlags::PASSIVE;
        let info = cm::getaddrinfo(Some(s), None, Some(&h)).context("rdma_getaddrinfo error")?;
        hints.src_addr = info.first().src_cm_addr();
    }
    let info = cm::getaddrinfo(dst, Some(port), Some(&hints)).context("rdma_getaddrinfo error")?;
    let e = info.first();
    Ok(RdmaAddr {
        src: e.src_cm_addr(),
        dst: e.dst_cm_addr(),
    })
}

/// Which of `fds` became readable within `timeout` (`None`: wait forever).
///
/// # Errors
/// The `poll(2)` failure.
pub fn wait_readable(fds: &[RawFd], timeout: Option<Duration>) -> Res<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.map_or(-1, |t| {
        std::ffi::c_int::try_from(t.as_millis().max(1)).unwrap_or(std::ffi::c_int::MAX)
    });
    // SAFETY: `pfds` is a valid array of `pfds.len()` pollfd structs.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::Interrupted {
            return Ok(vec![false; fds.len()]);
        }
        return Err(anyhow!("poll failed: {e}"));
    }
    Ok(pfds
        .iter()
        .map(|p| p.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0)
        .collect())
}

/// Polls `cq` until it has given `n` completions, for at most `timeout`
/// (`ibv_poll_cq` in a loop, as the C tools' `poll_cqs`).
///
/// # Errors
/// The poll failure, or a timeout naming how many arrived.
pub fn poll_n(cq: &CompletionQueue, n: usize, timeout: Duration) -> Res<Vec<Completion>> {
    let deadline = Instant::now() + timeout;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let want = (n - out.len()).min(8);
        cq.poll(&mut out, want).context("failed polling CQ")?;
        if out.len() < n {
            if Instant::now() > deadline {
                return Err(anyhow!(
                    "timed out polling CQ: {} of {n} completions",
                    out.len()
                ));
            }
            std::thread::yield_now();
        }
    }
    Ok(out)
}

/// Drains the completion channel after `poll(2)` said it is readable and
/// re-arms `cq` (the `ibv_get_cq_event` / `ibv_req_notify_cq` /
/// `ibv_ack_cq_events` dance; the channel is non-blocking).
///
/// # Errors
/// `ibv_get_cq_event` or `ibv_req_notify_cq` failures.
pub fn rearm(channel: &CompletionChannel, cq: &CompletionQueue) -> Res<()> {
    loop {
        match channel.get_event() {
            Ok(ev) => drop(ev),
            Err(e) if e.errno() == Some(libc::EAGAIN) => break,
            Err(e) => return Err(anyhow!("Failed to get cq event: {e}")),
        }
    }
    cq.req_notify(false).context("Failed to set notify")
}

/// The text of a NUL-terminated C string in `bytes` (all of it if there is
/// no NUL), as `printf("%s")` shows it.
pub fn c_str(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// The size of `struct ibv_grh`, which UD receives get in front of the data.
pub const GRH_LEN: usize = 40;

/// Microseconds between two instants, as `f64`.
pub fn us(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_strings_end_at_the_first_nul() {
        assert_eq!(c_str(b"ab\0cd"), "ab");
        assert_eq!(c_str(b"abc"), "abc");
    }
}

/// `-f` of `udaddy` and `ucmatose`: `ip`/`ipv6` are numeric addresses,
/// `gid` numeric GIDs (`AF_IB` addresses), `name` host names (the default).
/// Returns the `rdma_getaddrinfo` flags and family.
pub fn address_format(v: &str) -> (AddrInfoFlags, i32) {
    let f = v.to_ascii_lowercase();
    if f.starts_with("ip") {
        (AddrInfoFlags::NUMERICHOST, 0)
    } else if f.starts_with("gid") {
        (
            AddrInfoFlags::NUMERICHOST | AddrInfoFlags::FAMILY,
            libc::AF_IB,
        )
    } else {
        if !f.starts_with("name") {
            eprintln!("Warning: unknown address format");
        }
        (AddrInfoFlags::empty(), 0)
    }
}

/// The `main` of the cmatose family (`udaddy`, `mckey`, `ucmatose`): read
/// the flags (the help on error), run, then print `test complete` and
/// `return status N` as rdma-core's tools do.
pub fn cmatose_main<O>(
    cli: &Cli<'_, char>,
    read: impl FnOnce(Parsed<char>) -> Result<O, ArgError>,
    run: impl FnOnce(&O) -> Res<()>,
) -> std::process::ExitCode {
    let opts = match cli.read(read) {
        Ok(o) => o,
        Err(code) => return code,
    };
    let ret: u8 = match run(&opts) {
        Ok(()) => 0,
        Err(e) => {
            println!("{}", super::Report(&e));
            1
        }
    };
    println!("test complete");
    println!("return status {ret}");
    std::process::ExitCode::from(ret)
}
