//! What rdma-core's cmatose family (`ucmatose`, `udaddy`, `mckey`) shares:
//! the command line of `ucmatose` and `udaddy` (the same flags but for the
//! port space and the few `ucmatose` adds), the resources of a datagram
//! endpoint (`udaddy`, `mckey`), and the steps of their `init_node`: the
//! message size checked against the path MTU, the send messages, the
//! receives posted.

use std::process::ExitCode;

use anyhow::{bail, Context as _};
use rdma::cm::{AddrInfoFlags, CmEvent, CmId, EventChannel, PortSpace};
use rdma::{
    AccessFlags, AddressHandle, CompletionQueue, MemoryRegion, ProtectionDomain, QpCreateFlags,
    QpType, QueuePair,
};

use super::args::{ArgError, Cli, Flag, Parsed};
use super::cm::{address_format, cmatose_main, get_rdma_addr, RdmaAddr, GRH_LEN};
use super::Res;

/// Which tool reads its command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    /// RC connections over the TCP port space (`-P tcp|ib`, `-p` a port).
    Ucmatose,
    /// UD over the UDP port space (`-P udp|ipoib`, `-p` a port space number).
    Udaddy,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Ucmatose => "ucmatose",
            Tool::Udaddy => "udaddy",
        }
    }
}

/// The `main` of `tool`: its command line, then `run` ([`cmatose_main`]).
pub fn main(tool: Tool, run: impl FnOnce(&Opts) -> Res<()>) -> ExitCode {
    let flags = flags(tool);
    let usage = format!(
        "  {n} [-b bind_address] [options]                    # server\n  \
         {n} -s server_address [-b bind_address] [options]  # client",
        n = tool.name()
    );
    let cli = Cli {
        name: tool.name(),
        usage: &usage,
        flags: &flags,
        bad_exit: 1,
    };
    cmatose_main(&cli, |p| opts(tool, p), run)
}

/// The options of `ucmatose` and `udaddy`.
#[derive(Debug)]
pub struct Opts {
    /// `-s`: the server (`None`: be the server).
    pub dst: Option<String>,
    /// `-b`: the local address.
    pub src: Option<String>,
    /// The port: `-p` of ucmatose; udaddy's is fixed.
    pub port: String,
    /// `-c`.
    pub connections: usize,
    /// `-C`: messages each way (0 when `-S` is 0).
    pub count: usize,
    /// `-S`.
    pub size: usize,
    /// `-t`.
    pub tos: Option<u8>,
    /// `-a` (ucmatose).
    pub ack_timeout: Option<u8>,
    /// `-m` (ucmatose): migrate the connections.
    pub migrate: bool,
    /// `-P`, or udaddy's `-p`.
    pub ps: PortSpace,
    /// `-f`: the `rdma_getaddrinfo` flags.
    pub flags: AddrInfoFlags,
    /// `-f`: `ai_family` of the lookups (`AF_IB` with `-f gid`).
    pub family: i32,
}

/// `-s`: the server; without it, be the server (also `cmtime`'s).
pub const SERVER: Flag<'static, char> = Flag::value(
    's',
    's',
    "",
    "server_address",
    "the server (default: be the server)",
);
/// `-b`: the local address (also `cmtime`'s).
pub const BIND: Flag<'static, char> =
    Flag::value('b', 'b', "", "bind_address", "the local address");
/// `-p` of the tools on the TCP port space (`ucmatose`, `cmtime`).
pub const PORT: Flag<'static, char> =
    Flag::value('p', 'p', "", "port_number", "the port (default 7471)");

const SHARED: [Flag<'static, char>; 8] = [
    SERVER,
    BIND,
    Flag::value(
        'f',
        'f',
        "",
        "address_format",
        "name (default), ip, ipv6, or gid",
    ),
    Flag::value('P', 'P', "", "port_space", ""),
    Flag::value('c', 'c', "", "connections", "connections (default 1)"),
    Flag::value('C', 'C', "", "message_count", "messages (default 10)"),
    Flag::value(
        'S',
        'S',
        "",
        "message_size",
        "bytes per message (default 100)",
    ),
    Flag::value('t', 't', "", "type_of_service", "the IP type of service"),
];

impl Opts {
    /// [`Lookup::rdma_addr`] with these options' `-b`, port, port space
    /// and `-f`.
    ///
    /// # Errors
    /// The lookup's.
    pub fn rdma_addr(&self, dst: Option<&str>) -> Res<RdmaAddr> {
        Lookup {
            src: self.src.as_deref(),
            port: &self.port,
            ps: self.ps,
            flags: self.flags,
            family: self.family,
        }
        .rdma_addr(dst)
    }
}

/// What a tool's address lookup takes from its command line: `-b`, the
/// port, the port space and `-f`'s flags and family.
pub struct Lookup<'a> {
    pub src: Option<&'a str>,
    pub port: &'a str,
    pub ps: PortSpace,
    pub flags: AddrInfoFlags,
    pub family: i32,
}

impl<'a> Lookup<'a> {
    /// The TCP port space, names or addresses of any family (no `-f`).
    pub fn tcp(src: Option<&'a str>, port: &'a str) -> Lookup<'a> {
        Lookup {
            src,
            port,
            ps: PortSpace::Tcp,
            flags: AddrInfoFlags::empty(),
            family: 0,
        }
    }

    /// The addresses of `rdma_getaddrinfo` for `-b` and the port: a passive
    /// lookup for a server (`dst` is `None`), else of `dst`
    /// ([`get_rdma_addr`]).
    ///
    /// # Errors
    /// The lookup's.
    pub fn rdma_addr(&self, dst: Option<&str>) -> Res<RdmaAddr> {
        get_rdma_addr(
            self.src,
            dst,
            self.port,
            dst.is_none(),
            self.ps,
            self.flags,
            self.family,
        )
    }
}

/// The flags of `tool`.
pub fn flags(tool: Tool) -> Vec<Flag<'static, char>> {
    let mut v = SHARED.to_vec();
    match tool {
        Tool::Ucmatose => {
            v[3].help = "tcp (default) or ib";
            v.extend([
                PORT,
                Flag::switch('m', 'm', "", "migrate the connections (rdma_migrate_id)"),
                Flag::value('a', 'a', "", "ack_timeout", "the ACK timeout exponent"),
            ]);
        }
        Tool::Udaddy => {
            v[3].help = "udp (default) or ipoib";
            v.push(Flag::value(
                'p',
                'p',
                "",
                "port_space",
                "0x111 for UDP (default), 0x2 for IPOIB",
            ));
        }
    }
    v
}

/// The options `args` give `tool`.
///
/// # Errors
/// An operand, or a value that is not a number where one is needed.
pub fn opts(tool: Tool, args: Parsed<char>) -> Result<Opts, ArgError> {
    args.no_operands()?;
    let mut o = Opts {
        dst: None,
        src: None,
        port: match tool {
            Tool::Ucmatose => "7471",
            Tool::Udaddy => "7174",
        }
        .into(),
        connections: 1,
        count: 10,
        size: 100,
        tos: None,
        ack_timeout: None,
        migrate: false,
        ps: match tool {
            Tool::Ucmatose => PortSpace::Tcp,
            Tool::Udaddy => PortSpace::Udp,
        },
        flags: AddrInfoFlags::empty(),
        family: 0,
    };
    for f in args.flags {
        match (f.key, tool) {
            ('s', _) => o.dst = Some(f.value),
            ('b', _) => o.src = Some(f.value),
            ('f', _) => (o.flags, o.family) = address_format(&f.value),
            ('P', _) => {
                let p = f.value.to_ascii_lowercase();
                let (default, other, space) = match tool {
                    Tool::Ucmatose => ("tcp", "ib", PortSpace::Ib),
                    Tool::Udaddy => ("udp", "ipoib", PortSpace::Ipoib),
                };
                if p.starts_with(other) {
                    o.ps = space;
                } else if !p.starts_with(default) {
                    eprintln!("Warning: unknown port space format");
                }
            }
            ('c', _) => o.connections = f.number("a count")?,
            ('C', _) => o.count = f.number("a count")?,
            ('S', _) => o.size = f.number("a size in bytes")?,
            ('t', _) => o.tos = Some(f.c_number("a type of service, 0 to 255")?),
            ('p', Tool::Ucmatose) => o.port = f.value,
            ('p', Tool::Udaddy) => o.ps = PortSpace::from_raw(f.c_number("a port space")?),
            ('m', _) => o.migrate = true,
            ('a', _) => o.ack_timeout = Some(f.c_number("a timeout exponent, 0 to 255")?),
            _ => unreachable!("the flags of flags(tool)"),
        }
    }
    if o.size == 0 {
        o.count = 0;
    }
    Ok(o)
}

/// Refuses messages larger than the path MTU of `id`'s port
/// (`verify_test_params`); `tool` starts the message, as in C.
///
/// # Errors
/// The port query, or a size above the MTU.
pub fn check_size(id: &CmId, tool: &str, count: usize, size: usize) -> Res<()> {
    let ctx = id.context().with_context(|| format!("{tool}: no device"))?;
    let port = ctx
        .query_port(u32::from(id.port_num()))
        .context("ibv_query_port")?;
    let mtu = port.active_mtu.bytes().unwrap_or(0) as usize;
    if count > 0 && size > mtu {
        bail!("{tool}: message_size {size} is larger than active mtu {mtu}");
    }
    Ok(())
}

/// `count` send messages of `size` bytes, one registration cut in pieces,
/// its bytes numbered (the C tools' `msgs` buffer).
///
/// # Errors
/// The registration.
pub fn messages(pd: &ProtectionDomain, size: usize, count: usize) -> Res<Vec<MemoryRegion>> {
    let mut m = pd
        .alloc_mr(size * count, AccessFlags::empty())
        .context("failed to reg MR")?;
    for (i, b) in m
        .as_mut_slice()
        .expect("local buffer")
        .iter_mut()
        .enumerate()
    {
        *b = i as u8;
    }
    m.chunks(size).context("failed to reg MR")
}

/// Posts `count` receives of `len` bytes each (`post_recvs`), their
/// `wr_id`s 0 to `count - 1`.
///
/// # Errors
/// The registration, or the post.
pub fn post_receives(
    qp: &mut QueuePair,
    pd: &ProtectionDomain,
    len: usize,
    count: usize,
) -> Res<()> {
    let recvs = pd
        .alloc_mr(len * count, AccessFlags::LOCAL_WRITE)
        .context("failed to reg MR")?
        .chunks(len)
        .context("failed to reg MR")?;
    qp.post_recv_batch(
        recvs
            .into_iter()
            .enumerate()
            .map(|(i, m)| (i as u64, m.into())),
    )
    .map_err(rdma::PostError::drop_buffers)
    .context("failed to post receives")
}

/// A datagram endpoint of `udaddy` or `mckey` (a connection, a group
/// membership): its id and what `init_node` makes for it. Field order is
/// drop order: the AH and QP before the CQ and PD, the id last.
pub struct UdNode {
    /// The address handle of the peer (or group).
    pub ah: Option<AddressHandle>,
    /// librdmacm's UD QP.
    pub qp: Option<QueuePair>,
    /// Its one CQ.
    pub cq: Option<CompletionQueue>,
    /// Its PD.
    pub pd: Option<ProtectionDomain>,
    /// Send buffers, one per message.
    pub sends: Vec<MemoryRegion>,
    /// The peer's QP number, from the connection or the join.
    pub remote_qpn: u32,
    /// The peer's Q_Key.
    pub remote_qkey: u32,
    /// Whether it got as far as sending.
    pub connected: bool,
    /// The id.
    pub id: CmId,
}

/// The next event of `ch`, and which of `nodes` it is for (`None`: none
/// of them, as the C tools' handlers ignore such an event).
///
/// # Errors
/// `rdma_get_cm_event`'s.
pub fn next_event(ch: &EventChannel, nodes: &[UdNode]) -> Res<(CmEvent, Option<usize>)> {
    let e = ch.get_event().context("rdma_get_cm_event")?;
    let i = nodes.iter().position(|n| n.id.same_id(e.id()));
    Ok((e, i))
}

impl UdNode {
    /// `init_node` of a datagram tool: a PD, a CQ of `2 * count` entries
    /// (2 without messages), librdmacm's UD QP (ready at once) for `count`
    /// requests each way with `flags`, then `count` messages of `size` bytes
    /// to send (`sends`) and receives posted for as many, each with room for
    /// the GRH in front (`receives`). `tool` starts the messages, as in C.
    ///
    /// # Errors
    /// The step that failed.
    pub fn init(
        &mut self,
        tool: &str,
        (count, size): (usize, usize),
        sends: bool,
        receives: bool,
        flags: QpCreateFlags,
    ) -> Res<()> {
        let ctx = self
            .id
            .context()
            .with_context(|| format!("{tool}: unable to allocate PD"))?;
        let pd = ctx
            .alloc_pd()
            .with_context(|| format!("{tool}: unable to allocate PD"))?;
        let cqe = if count > 0 { count * 2 } else { 2 } as u32;
        let cq = ctx
            .create_cq(cqe, None, 0)
            .with_context(|| format!("{tool}: unable to create CQ"))?;
        let depth = count.max(1) as u32;
        let mut qp = self
            .id
            .create_qp(
                pd.qp_builder(QpType::Ud, &cq, &cq)
                    .max_send_wr(depth)
                    .max_recv_wr(depth)
                    .max_send_sge(1)
                    .max_recv_sge(1)
                    .create_flags(flags),
            )
            .with_context(|| format!("{tool}: unable to create QP"))?;
        if count > 0 && receives {
            post_receives(&mut qp, &pd, size + GRH_LEN, count)?;
        }
        if count > 0 && sends {
            self.sends = messages(&pd, size, count)?;
        }
        self.pd = Some(pd);
        self.cq = Some(cq);
        self.qp = Some(qp);
        Ok(())
    }

    /// A node with nothing made yet.
    pub fn new(id: CmId) -> UdNode {
        UdNode {
            ah: None,
            qp: None,
            cq: None,
            pd: None,
            sends: Vec::new(),
            remote_qpn: 0,
            remote_qkey: 0,
            connected: false,
            id,
        }
    }
}
