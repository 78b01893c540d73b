//! The TCP handshake of rdma-core's pingpong tools (see the module above).

use super::*;
use anyhow::{anyhow, bail, Context as _};
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, TcpListener, TcpStream, ToSocketAddrs};

use rdma::{AhAttr, Context, Gid, GlobalRoute, LinkLayer, PortAttr};

/// The size of a handshake message: `"0000:000000:000000:"`, 32 GID digits,
/// and a NUL, as the C tools' `sizeof` of their template string.
pub const MSG_LEN: usize = 52;

/// One side's address, as exchanged in the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// Initial packet sequence number (24 bits).
    pub psn: u32,
    /// GID (all zero when no `-g` was given).
    pub gid: Gid,
}

/// The GID as the C tools put it on the wire: 32 lower-case hex digits of the
/// 16 bytes in order (pingpong.c's `gid_to_wire_gid` prints each 4-byte group
/// converted to network order, which is the same thing).
pub fn gid_to_wire(gid: &Gid) -> String {
    gid.raw().iter().map(|b| format!("{b:02x}")).collect()
}

/// The inverse of [`gid_to_wire`].
///
/// # Errors
/// Anything but 32 hex digits.
pub fn gid_from_wire(s: &str) -> Res<Gid> {
    if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(anyhow!("bad GID {s:?}: expected 32 hex digits"));
    }
    let mut raw = [0u8; 16];
    for (i, byte) in raw.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)?;
    }
    Ok(Gid::from_raw(raw))
}

impl Dest {
    /// The 52-byte handshake message.
    pub fn to_wire(self) -> [u8; MSG_LEN] {
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn,
            self.psn,
            gid_to_wire(&self.gid)
        );
        let mut msg = [0u8; MSG_LEN];
        msg[..text.len()].copy_from_slice(text.as_bytes());
        msg
    }

    /// Parses a handshake message.
    ///
    /// # Errors
    /// A message that is not `lid:qpn:psn:gid` in hex.
    pub fn from_wire(msg: &[u8]) -> Res<Dest> {
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = std::str::from_utf8(&msg[..end])
            .map_err(|_| anyhow!("the peer's address is not text"))?;
        let bad = |why: &str| anyhow!("bad address from the peer ({why}): {text:?}");
        let fields: Vec<&str> = text.split(':').collect();
        let [lid, qpn, psn, gid] = fields[..] else {
            return Err(bad("expected lid:qpn:psn:gid"));
        };
        let hex = |s: &str, max: u32, what: &str| {
            u32::from_str_radix(s, 16)
                .ok()
                .filter(|&v| v <= max)
                .ok_or_else(|| bad(what))
        };
        Ok(Dest {
            lid: hex(lid, 0xffff, "LID")? as u16,
            qpn: hex(qpn, 0xff_ffff, "QPN")?,
            psn: hex(psn, 0xff_ffff, "PSN")?,
            gid: gid_from_wire(gid).map_err(|e| bad(&e.to_string()))?,
        })
    }

    /// Prints the address line the C tools print (`label` is `local` or `remote`).
    pub fn print(&self, label: &str) {
        let label = format!("{label} address:");
        println!(
            "  {label:<16}LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            self.lid,
            self.qpn,
            self.psn,
            Ipv6Addr::from(self.gid.raw())
        );
    }
}

/// A random 24-bit PSN (std's hasher keys are random per process).
pub fn random_psn() -> u32 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    (h.finish() as u32) & 0xff_ffff
}

/// This side's address: the port's LID, the `-g` GID, a random PSN.
///
/// # Errors
/// InfiniBand without a LID (`check_lid`), or a GID index that cannot be read.
pub fn local_dest(
    ctx: &Context,
    port: &PortAttr,
    opts: &Opts,
    qpn: u32,
    check_lid: bool,
) -> Res<Dest> {
    if check_lid && port.link_layer != LinkLayer::Ethernet && port.lid == 0 {
        return Err(anyhow!(
            "Couldn't get local LID (is the subnet manager running?)"
        ));
    }
    let gid = match opts.gid_idx {
        Some(i) => ctx
            .query_gid(u32::from(opts.ib_port), i)
            .with_context(|| format!("can't read sgid of index {i}"))?,
        None => Gid::default(),
    };
    Ok(Dest {
        lid: port.lid,
        qpn,
        psn: random_psn(),
        gid,
    })
}

/// The address vector towards `peer`: by LID, plus a GRH from `-g` when the
/// peer sent a GID (RoCE always does), as the C tools decide it.
///
/// # Errors
/// The peer sent a GID but this side has no `-g`, or the port is Ethernet
/// (RoCE) and the peer sent no GID.
pub fn peer_ah(opts: &Opts, port: &PortAttr, peer: &Dest) -> Res<AhAttr> {
    if peer.gid.is_zero() && port.link_layer == LinkLayer::Ethernet {
        bail!(
            "the peer sent no GID, but on an Ethernet (RoCE) port packets are addressed by \
             GID: run both sides with -g"
        );
    }
    let mut ah = AhAttr::local(opts.ib_port, peer.lid);
    ah.sl = opts.sl;
    if peer.gid.interface_id() != 0 {
        let index = opts.gid_idx.ok_or_else(|| {
            anyhow!(
                "the peer sent GID {}, so this side needs a local GID index: pass -g",
                Ipv6Addr::from(peer.gid.raw())
            )
        })?;
        let sgid_index = u8::try_from(index)
            .map_err(|_| anyhow!("GID index {index} does not fit an address vector"))?;
        ah.grh = Some(GlobalRoute {
            dgid: peer.gid,
            flow_label: 0,
            sgid_index,
            hop_limit: 1,
            traffic_class: 0,
        });
    }
    Ok(ah)
}

/// Reads exactly `buf.len()` bytes; a peer that hangs up early (typically
/// because it could not connect its QP to us) is said so.
fn read_exactly(sock: &mut TcpStream, buf: &mut [u8], what: &str) -> Res<()> {
    sock.read_exact(buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            anyhow!(
                "{what}: the peer closed the connection (it may have refused our address: \
                 see its output)"
            )
        } else {
            anyhow::Error::new(e).context(what.to_string())
        }
    })
}

fn listen(port: u16) -> Res<TcpListener> {
    // Like getaddrinfo(NULL, AI_PASSIVE): the IPv6 wildcard (dual stack on
    // Linux) and, where IPv6 is off, the IPv4 one. std sets SO_REUSEADDR.
    TcpListener::bind((Ipv6Addr::UNSPECIFIED, port))
        .or_else(|_| TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)))
        .with_context(|| format!("Couldn't listen to port {port}"))
}

/// `what`, with the record's index when there are several.
fn which(what: &str, i: usize, n: usize) -> String {
    if n == 1 {
        what.to_string()
    } else {
        format!("{what} [{i}]")
    }
}

/// Reads `n` handshake messages.
fn read_dests(sock: &mut TcpStream, n: usize) -> Res<Vec<Dest>> {
    let mut peers = Vec::with_capacity(n);
    for i in 0..n {
        let mut msg = [0u8; MSG_LEN];
        read_exactly(sock, &mut msg, &which("Couldn't read remote address", i, n))?;
        peers.push(Dest::from_wire(&msg).map_err(|e| anyhow!(which(&e.to_string(), i, n)))?);
    }
    Ok(peers)
}

/// Sends the handshake messages of `mine`, in order.
fn write_dests(sock: &mut TcpStream, mine: &[Dest]) -> Res<()> {
    let wire: Vec<u8> = mine.iter().flat_map(|d| d.to_wire()).collect();
    sock.write_all(&wire).context("Couldn't send local address")
}

/// The one element of a one-record exchange.
fn only(peers: Vec<Dest>) -> Res<Dest> {
    peers
        .into_iter()
        .next()
        .context("the handshake returned no address")
}

/// The server's half: waits for one client, reads its address, runs
/// `connect` with it (RTR/RTS), then answers with `me`.
///
/// # Errors
/// Socket errors, a malformed message, or `connect`'s error.
pub fn server_exchange(port: u16, me: &Dest, connect: impl FnOnce(&Dest) -> Res<()>) -> Res<Dest> {
    only(server_exchange_all(
        port,
        std::slice::from_ref(me),
        |peers| match peers {
            [peer] => connect(peer),
            _ => Err(anyhow!("expected one address")),
        },
    )?)
}

/// The server's half for `mine.len()` addresses each way: waits for one
/// client, reads as many messages as `mine` has, runs `connect` with them,
/// then answers with `mine`.
///
/// # Errors
/// Socket errors, a malformed message, or `connect`'s error.
pub fn server_exchange_all(
    port: u16,
    mine: &[Dest],
    connect: impl FnOnce(&[Dest]) -> Res<()>,
) -> Res<Vec<Dest>> {
    let listener = listen(port)?;
    let (mut sock, _) = listener.accept().context("accept() failed")?;
    drop(listener);
    let peers = read_dests(&mut sock, mine.len())?;
    connect(&peers).context("Couldn't connect to remote QP")?;
    write_dests(&mut sock, mine)?;
    let mut done = [0u8; 5];
    read_exactly(&mut sock, &mut done, "Couldn't read the client's \"done\"")?;
    if &done != b"done\0" {
        return Err(anyhow!("expected \"done\" from the client, got {done:?}"));
    }
    Ok(peers)
}

/// The client's half: connects to `host:port`, sends `me`, reads the
/// server's address and says `"done"`.
///
/// # Errors
/// Name resolution, connection and socket errors; a malformed message.
pub fn client_exchange(host: &str, port: u16, me: &Dest) -> Res<Dest> {
    only(client_exchange_all(host, port, std::slice::from_ref(me))?)
}

/// The client's half for `mine.len()` addresses each way: connects to
/// `host:port`, sends `mine`, reads as many messages back and says `"done"`.
///
/// # Errors
/// Name resolution, connection and socket errors; a malformed message.
pub fn client_exchange_all(host: &str, port: u16, mine: &[Dest]) -> Res<Vec<Dest>> {
    let addrs = (host, port)
        .to_socket_addrs()
        .with_context(|| format!("Couldn't resolve {host}:{port}"))?;
    let mut last = None;
    let mut sock = None;
    for addr in addrs {
        match TcpStream::connect(addr) {
            Ok(s) => {
                sock = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let mut sock = sock.ok_or_else(|| match last {
        Some(e) => anyhow::Error::new(e).context(format!("Couldn't connect to {host}:{port}")),
        None => anyhow!("Couldn't connect to {host}:{port}: no address"),
    })?;
    write_dests(&mut sock, mine)?;
    let peers = read_dests(&mut sock, mine.len())?;
    sock.write_all(b"done\0")
        .context("Couldn't send \"done\"")?;
    Ok(peers)
}

/// Runs the handshake for the side `opts` says, connecting the QP with
/// `connect`: the server inside the exchange, the client right after it.
///
/// # Errors
/// As [`server_exchange`] and [`client_exchange`].
pub fn exchange(opts: &Opts, me: &Dest, connect: impl FnOnce(&Dest) -> Res<()>) -> Res<Dest> {
    only(exchange_all(
        opts,
        std::slice::from_ref(me),
        |peers| match peers {
            [peer] => connect(peer),
            _ => Err(anyhow!("expected one address")),
        },
    )?)
}

/// [`exchange`] with `mine.len()` messages each way (`ibv_srq_pingpong`
/// sends one per QP slot); `connect` gets the peer's, in order.
///
/// # Errors
/// As [`server_exchange_all`] and [`client_exchange_all`].
pub fn exchange_all(
    opts: &Opts,
    mine: &[Dest],
    connect: impl FnOnce(&[Dest]) -> Res<()>,
) -> Res<Vec<Dest>> {
    match &opts.host {
        Some(host) => {
            let peers = client_exchange_all(host, opts.tcp_port, mine)?;
            connect(&peers)?;
            Ok(peers)
        }
        None => server_exchange_all(opts.tcp_port, mine, connect),
    }
}
