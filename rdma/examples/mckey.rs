//! Multicast over the connection manager: a port of rdma-core's `mckey`,
//! wire-compatible with it.
//!
//! ```text
//! mckey -m multicast_address [-b bind_address] [-c connections] [-C count] [-S size] [-p ps] [-o] [-l]   # receiver
//! mckey -m multicast_address -s [-b bind_address] ...                                                    # sender
//! mckey -M unmapped_multicast_gid -b bind_address ...                                                    # AF_IB group
//! ```
//!
//! Every connection is a UDP (or IPoIB) port space id that resolves the
//! group's address, makes a UD QP (librdmacm's, attached to the group on
//! join), and joins (`-o`: as a send-only full member). After the join the
//! tool waits 3 s, as the C tool does (time for a subnet manager to program
//! the switches), then the sender sends `-C` datagrams of `-S` bytes to the
//! group (Q_Key and QP number 0xffffff from the join) and the receiver waits
//! for as many; both leave the group at the end.
//!
//! `-M` names the group by a GID instead (an `AF_IB` address, "unmapped":
//! not derived from an IP group); the ids are bound to `-b` and join at once,
//! without resolving the group, as the C tool does. `-l` creates the QPs with
//! `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB` (`rdma_create_qp_ex`), so a sender
//! does not receive its own datagrams.
//!
//! Measured on soft-RoCE (rxe, kernel 6.1), with the same results as the C
//! tool: `-l` fails to create the QP (`EOPNOTSUPP`: the rxe provider takes
//! no create flags), and `-M` fails to join (the kernel's `ENOTSUPP`, 524:
//! `AF_IB` groups need an InfiniBand port).

mod common;

use anyhow::{anyhow, Context as _};
use std::net::{Ipv6Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use common::args::{bad, ArgError, Cli, Flag, Parsed};
use common::cm::{host_ip, poll_n, Res, GRH_LEN};
use common::cmatose::UdNode as Node;
use rdma::cm::{CmAddr, CmEventType, EventChannel, IbAddr, McJoinFlags, PortSpace};
use rdma::{QpCreateFlags, SendWr, WcStatus};

const RESOLVE_TIMEOUT: Duration = Duration::from_millis(2000);
/// The C tool polls forever; this bounds it.
const POLL_TIMEOUT: Duration = Duration::from_secs(600);

struct Opts {
    group: Option<String>,
    src: Option<String>,
    sender: bool,
    connections: usize,
    count: usize,
    size: usize,
    ps: PortSpace,
    send_only: bool,
    /// `-M`: the group is a GID (`AF_IB`).
    unmapped: bool,
    /// `-l`: no multicast loopback.
    no_loopback: bool,
}

const CLI: Cli<'static, char> = Cli {
    name: "mckey",
    usage: "  mckey -m multicast_address [-s] [-b bind_address] [options]\n  \
            mckey -M unmapped_multicast_address -b bind_address [-s] [options]",
    flags: &[
        Flag::value('m', 'm', "", "multicast_address", "the group"),
        Flag::value(
            'M',
            'M',
            "",
            "unmapped_multicast_address",
            "a GID group (AF_IB): replaces -m and requires -b",
        ),
        Flag::switch('s', 's', "", "be the sender"),
        Flag::value('b', 'b', "", "bind_address", "the local address"),
        Flag::value('c', 'c', "", "connections", "memberships (default 1)"),
        Flag::value('C', 'C', "", "message_count", "messages (default 10)"),
        Flag::value(
            'S',
            'S',
            "",
            "message_size",
            "bytes per message (default 100)",
        ),
        Flag::value(
            'p',
            'p',
            "",
            "port_space",
            "0x111 for UDP (default), 0x2 for IPOIB",
        ),
        Flag::switch('o', 'o', "", "join as a send-only full-member"),
        Flag::switch('l', 'l', "", "join without multicast loopback"),
    ],
    bad_exit: 1,
};

fn parse(args: Parsed<char>) -> Result<Opts, ArgError> {
    args.no_operands()?;
    let mut o = Opts {
        group: None,
        src: None,
        sender: false,
        connections: 1,
        count: 10,
        size: 100,
        ps: PortSpace::Udp,
        send_only: false,
        unmapped: false,
        no_loopback: false,
    };
    for f in args.flags {
        match f.key {
            'm' => o.group = Some(f.value),
            'M' => {
                o.group = Some(f.value);
                o.unmapped = true;
            }
            's' => o.sender = true,
            'b' => o.src = Some(f.value),
            'c' => o.connections = f.number("a count")?,
            'C' => o.count = f.number("a count")?,
            'S' => o.size = f.number("a size in bytes")?,
            'p' => o.ps = PortSpace::from_raw(f.c_number("a port space")?),
            'o' => o.send_only = true,
            'l' => o.no_loopback = true,
            _ => unreachable!("the flags of CLI"),
        }
    }
    if o.group.is_none() {
        return bad("a multicast address (-m) is required");
    }
    if o.unmapped && o.src.is_none() {
        return bad("unmapped multicast address requires binding to source address");
    }
    if o.size == 0 {
        o.count = 0;
    }
    Ok(o)
}

fn main() -> ExitCode {
    common::cm::cmatose_main(&CLI, parse, run)
}

impl Node {
    /// `addr_handler`: check the size, make PD, CQ, QP and messages, post
    /// the receives (receivers), join.
    fn on_addr(&mut self, o: &Opts, group: CmAddr) -> Res<()> {
        common::cmatose::check_size(&self.id, "mckey", o.count, o.size)?;
        let flags = if o.no_loopback {
            QpCreateFlags::BLOCK_SELF_MCAST_LB
        } else {
            QpCreateFlags::empty()
        };
        self.init("mckey", (o.count, o.size), o.sender, !o.sender, flags)?;
        let joined = if o.send_only {
            self.id
                .join_multicast_ex(group, McJoinFlags::SendOnlyFullMember)
        } else {
            self.id.join_multicast(group)
        };
        joined.context("mckey: failure joining")
    }

    /// Sends every message to the group, SEND with immediate data carrying
    /// this QP's number; the last one is signaled and waited for, so the
    /// datagrams are out before the group is left.
    fn post_sends(&mut self, o: &Opts) -> Res<()> {
        if !self.connected || o.count == 0 {
            return Ok(());
        }
        let qp = self.qp.as_mut().expect("initialised");
        let ah = self.ah.as_ref().expect("joined");
        let qpn = qp.qp_num();
        let n = self.sends.len();
        for (i, mr) in std::mem::take(&mut self.sends).into_iter().enumerate() {
            let wr = SendWr::send(i as u64, mr)
                .with_imm(qpn)
                .ud(ah, self.remote_qpn, self.remote_qkey)
                .signaled(i + 1 == n);
            qp.post_send(wr)
                .map_err(rdma::PostError::drop_buffers)
                .context("failed to post sends")?;
        }
        let c = poll_n(self.cq.as_ref().expect("initialised"), 1, POLL_TIMEOUT)?;
        if c[0].status != WcStatus::Success {
            return Err(anyhow!("mckey: send failed: {}", c[0].status));
        }
        Ok(())
    }

    /// Waits for `count` datagrams from the group.
    fn poll(&self, o: &Opts) -> Res<()> {
        if !self.connected || o.count == 0 {
            return Ok(());
        }
        let done = poll_n(
            self.cq.as_ref().expect("initialised"),
            o.count,
            POLL_TIMEOUT,
        )?;
        for c in done {
            if c.status != WcStatus::Success {
                return Err(anyhow!("mckey: receive failed: {}", c.status));
            }
            if c.byte_len as usize != o.size + GRH_LEN {
                return Err(anyhow!(
                    "mckey: received {} bytes, expected {} + {GRH_LEN} of GRH",
                    c.byte_len,
                    o.size
                ));
            }
        }
        Ok(())
    }
}

fn run(o: &Opts) -> Res<()> {
    println!(
        "mckey: starting {}",
        if o.sender { "client" } else { "server" }
    );
    let src = o
        .src
        .as_deref()
        .map(host_ip)
        .transpose()?
        .map(|ip| SocketAddr::new(ip, 0));
    let text = o.group.as_deref().expect("checked");
    let group: CmAddr = if o.unmapped {
        // `-M`: the GID in IPv6 notation, every other field 0.
        let gid: Ipv6Addr = text
            .parse()
            .map_err(|_| anyhow!("mckey: -M {text}: not a GID in IPv6 notation"))?;
        IbAddr::new(gid.into()).into()
    } else {
        let ip = host_ip(text)?;
        // librdmacm resolves a unicast group like any address and the join
        // then times out (`ADDR_ERROR, error: -110`): name the cause instead.
        if !ip.is_multicast() {
            return Err(anyhow!(
                "mckey: -m {text}: {ip} is not a multicast address \
                 (IPv4 224.0.0.0/4, IPv6 ff00::/8)"
            ));
        }
        SocketAddr::new(ip, 0).into()
    };
    let ch = EventChannel::new().context("failed to create event channel")?;
    let mut nodes: Vec<Node> = Vec::with_capacity(o.connections);
    for _ in 0..o.connections {
        let id = ch.create_id(o.ps).context("rdma_create_id")?;
        nodes.push(Node::new(id));
    }
    println!("mckey: joining");
    let mut result = Ok(());
    for n in &mut nodes {
        if let Some(src) = src {
            n.id.bind_addr(src).context("mckey: addr bind failure")?;
        }
        if o.unmapped {
            // Nothing to resolve: the bound id joins the GID at once.
            result = n.on_addr(o, group);
            if result.is_err() {
                break;
            }
        } else {
            n.id.resolve_addr(src.map(Into::into), group, RESOLVE_TIMEOUT)
                .context("mckey: resolve addr failure")?;
        }
    }

    let result = result.and_then(|()| transfer(o, &ch, &mut nodes, group));
    // Leave every group that was joined, whatever happened.
    let mut left_ok = Ok(());
    for n in &nodes {
        if n.connected {
            if let Err(e) = n.id.leave_multicast(group) {
                println!("mckey: failure leaving: {e}");
                left_ok = Err(anyhow!("mckey: failure leaving"));
            }
        }
    }
    result.and(left_ok)
}

fn transfer(o: &Opts, ch: &EventChannel, nodes: &mut [Node], group: CmAddr) -> Res<()> {
    let mut left = nodes.len();
    while left > 0 {
        let (e, Some(i)) = common::cmatose::next_event(ch, nodes)? else {
            continue;
        };
        let n = &mut nodes[i];
        match e.event_type() {
            CmEventType::AddrResolved => {
                drop(e);
                n.on_addr(o, group)?;
            }
            CmEventType::MulticastJoin => {
                let ud = e
                    .ud_param()
                    .cloned()
                    .context("mckey: join without UD parameters")?;
                drop(e);
                let (dgid, dlid, sl) = (
                    ud.ah_attr
                        .grh
                        .map_or(Ipv6Addr::UNSPECIFIED, |g| g.dgid.to_ipv6()),
                    ud.ah_attr.dlid,
                    ud.ah_attr.sl,
                );
                println!("mckey: joined dgid: {} mlid 0x{dlid:x} sl {sl}", dgid);
                n.remote_qpn = ud.qp_num;
                n.remote_qkey = ud.qkey;
                let pd = n.pd.as_ref().expect("initialised");
                let ah = pd
                    .create_ah(&ud.ah_attr)
                    .context("mckey: failure creating address handle")?;
                n.ah = Some(ah);
                n.connected = true;
                left -= 1;
            }
            CmEventType::AddrError | CmEventType::RouteError | CmEventType::MulticastError => {
                return Err(anyhow!(
                    "mckey: event: {}, error: {}",
                    e.event_type(),
                    e.status()
                ));
            }
            _ => {}
        }
    }
    // As the C tool: give a subnet manager time to program the switches.
    std::thread::sleep(Duration::from_secs(3));
    // Report what the C tool's event thread reports meanwhile.
    while let Some(e) = ch.try_get_event().context("rdma_get_cm_event")? {
        if matches!(
            e.event_type(),
            CmEventType::MulticastError | CmEventType::AddrChange
        ) {
            println!("mckey: event: {}, status: {}", e.event_type(), e.status());
        }
    }
    if o.count > 0 {
        if o.sender {
            println!("initiating data transfers");
            for n in nodes.iter_mut() {
                n.post_sends(o)?;
            }
        } else {
            println!("receiving data transfers");
            for n in nodes.iter() {
                n.poll(o)?;
            }
        }
        println!("data transfers complete");
    }
    Ok(())
}
