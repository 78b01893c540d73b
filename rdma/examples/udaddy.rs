//! Unreliable datagrams over the connection manager: a port of rdma-core's
//! `udaddy`, wire-compatible with it.
//!
//! ```text
//! udaddy [-b bind_address] [-c connections] [-C count] [-S size] ...          # server
//! udaddy -s server_address [-b bind_address] [-c connections] ...             # client
//! ```
//!
//! The client resolves the server (UDP port space, port 7174), and each
//! connection's `rdma_connect` is a SIDR request: the server answers with its
//! UD QP number and Q_Key, and the client gets them with an address handle in
//! `ESTABLISHED`. The client then sends `-C` datagrams of `-S` bytes per
//! connection, each SEND with immediate data carrying its QP number; the
//! server, once it has them all, answers every connection with as many
//! datagrams to the sender of the first one (an address handle made from
//! that completion, the QP number from its immediate data).
//!
//! Each datagram here has a buffer of its own (memory moves into the work
//! request); the C tool sends and receives every message in one buffer.
//!
//! `-f gid` takes GIDs for `-s` and `-b` (`AF_IB` addresses, from
//! `rdma_getaddrinfo` with `RAI_NUMERICHOST | RAI_FAMILY`). They are for
//! InfiniBand ports: on soft-RoCE a server fails to bind (`ENODEV`) and a
//! client fails to resolve the route (`ENODEV`), at the same step and with
//! the same error as the C tool.

mod common;

use anyhow::{anyhow, Context as _};
use std::process::ExitCode;
use std::time::Duration;

use common::cm::{poll_n, Res, GRH_LEN};
use common::cmatose::{Opts, Tool, UdNode as Node};
use rdma::cm::{CmAddr, CmEvent, CmEventType, CmOption, ConnParam, EventChannel};
use rdma::{QpCreateFlags, SendWr, WcOpcode, WcStatus};

const RESOLVE_TIMEOUT: Duration = Duration::from_millis(2000);
/// The C tool polls forever; this bounds it.
const POLL_TIMEOUT: Duration = Duration::from_secs(600);

fn main() -> ExitCode {
    common::cmatose::main(Tool::Udaddy, run)
}

impl Node {
    /// `verify_test_params`, then `init_node` and `post_recvs`: the
    /// message size checked against the path MTU, the QP, the messages, every
    /// receive posted.
    fn setup(&mut self, o: &Opts) -> Res<()> {
        common::cmatose::check_size(&self.id, "udaddy", o.count, o.size)?;
        self.init(
            "udaddy",
            (o.count, o.size),
            true,
            true,
            QpCreateFlags::empty(),
        )
    }

    /// Sends every message to the peer, SEND with immediate data carrying
    /// this QP's number (`post_sends`).
    fn post_sends(&mut self, signaled: bool) -> Res<()> {
        if !self.connected {
            return Ok(());
        }
        let qp = self.qp.as_mut().expect("initialised");
        let ah = self.ah.as_ref().expect("connected");
        let qpn = qp.qp_num();
        for (i, mr) in std::mem::take(&mut self.sends).into_iter().enumerate() {
            let wr = SendWr::send(i as u64, mr)
                .with_imm(qpn)
                .ud(ah, self.remote_qpn, self.remote_qkey)
                .signaled(signaled);
            qp.post_send(wr)
                .map_err(rdma::PostError::drop_buffers)
                .context("failed to post sends")?;
        }
        Ok(())
    }

    /// Waits for `count` completions; the first receive tells a node without
    /// an address handle where to answer (`poll_cqs` + `create_reply_ah`).
    fn poll(&mut self, o: &Opts) -> Res<()> {
        if !self.connected || o.count == 0 {
            return Ok(());
        }
        let cq = self.cq.as_ref().expect("initialised");
        let done = poll_n(cq, o.count, POLL_TIMEOUT)?;
        for mut c in done {
            if c.status != WcStatus::Success {
                return Err(anyhow!("udaddy: completion failed: {}", c.status));
            }
            if c.opcode != WcOpcode::Recv || self.ah.is_some() {
                continue;
            }
            if c.byte_len as usize != o.size + GRH_LEN {
                return Err(anyhow!(
                    "udaddy: received {} bytes, expected {} + {GRH_LEN} of GRH",
                    c.byte_len,
                    o.size
                ));
            }
            let mr = c.take_buffers().into_one().expect("the receive buffer");
            let mut grh = [0u8; GRH_LEN];
            mr.read_at(0, &mut grh).context("GRH")?;
            let pd = self.pd.as_ref().expect("initialised");
            let ah = pd
                .create_ah_from_wc(self.id.port_num(), &c, &grh)
                .context("ibv_create_ah_from_wc")?;
            self.ah = Some(ah);
            self.remote_qpn = c.imm_data;
            let qp = self.qp.as_ref().expect("initialised");
            self.remote_qkey = qp.query().context("ibv_query_qp")?.as_raw().qkey;
        }
        Ok(())
    }
}

fn event_error(e: &CmEvent) -> anyhow::Error {
    anyhow!("udaddy: event: {}, error: {}", e.event_type(), e.status())
}

fn run(o: &Opts) -> Res<()> {
    let ch = EventChannel::new().context("failed to create event channel")?;
    match &o.dst {
        Some(dst) => run_client(o, &ch, dst),
        None => run_server(o, &ch),
    }
}

fn run_server(o: &Opts, ch: &EventChannel) -> Res<()> {
    println!("udaddy: starting server");
    let listener = ch
        .create_id(o.ps)
        .context("udaddy: listen request failed")?;
    let addr = o.rdma_addr(None)?;
    let src = addr.src.context("udaddy: no address to bind")?;
    listener
        .bind_addr(src)
        .context("udaddy: bind address failed")?;
    listener
        .listen(0)
        .context("udaddy: failure trying to listen")?;

    let mut nodes: Vec<Node> = Vec::new();
    let mut left = o.connections;
    while left > 0 {
        let e = ch.get_event().context("rdma_get_cm_event")?;
        match e.event_type() {
            CmEventType::ConnectRequest => {
                let id = e.id().clone();
                drop(e);
                if nodes.len() == o.connections {
                    println!("udaddy: failing connection request");
                    let _ = id.reject(&[]);
                    continue;
                }
                let mut node = Node::new(id.clone());
                let accepted = node.setup(o).and_then(|()| {
                    let qpn = node.qp.as_ref().expect("initialised").qp_num();
                    id.accept(&ConnParam {
                        qp_num: qpn,
                        ..ConnParam::default()
                    })
                    .context("udaddy: failure accepting")
                });
                left -= 1;
                match accepted {
                    Ok(()) => {
                        node.connected = true;
                        nodes.push(node);
                    }
                    Err(err) => {
                        println!("{}", common::Report(&err));
                        println!("udaddy: failing connection request");
                        let _ = id.reject(&[]);
                    }
                }
            }
            CmEventType::AddrError
            | CmEventType::RouteError
            | CmEventType::ConnectError
            | CmEventType::Unreachable
            | CmEventType::Rejected => {
                println!("{}", event_error(&e));
                left -= 1;
            }
            _ => {}
        }
    }
    if o.count > 0 {
        println!("receiving data transfers");
        for n in &mut nodes {
            n.poll(o)?;
        }
        println!("sending replies");
        for n in &mut nodes {
            n.post_sends(true)?;
        }
        for n in &mut nodes {
            n.poll(o)?;
        }
        println!("data transfers complete");
    }
    drop(nodes);
    drop(listener);
    Ok(())
}

fn run_client(o: &Opts, ch: &EventChannel, dst: &str) -> Res<()> {
    println!("udaddy: starting client");
    let addr = o
        .rdma_addr(Some(dst))
        .context("udaddy: getaddrinfo error")?;
    let to: CmAddr = addr.dst.context("udaddy: no destination address")?;
    let mut nodes: Vec<Node> = (0..o.connections)
        .map(|_| ch.create_id(o.ps).map(Node::new))
        .collect::<Result<_, _>>()
        .context("rdma_create_id")?;
    println!("udaddy: connecting");
    for n in &nodes {
        n.id.resolve_addr(addr.src, to, RESOLVE_TIMEOUT)
            .context("udaddy: failure getting addr")?;
    }
    let mut left = o.connections;
    let mut failed: Option<anyhow::Error> = None;
    while left > 0 && failed.is_none() {
        let (e, Some(i)) = common::cmatose::next_event(ch, &nodes)? else {
            continue;
        };
        let n = &mut nodes[i];
        match e.event_type() {
            CmEventType::AddrResolved => {
                drop(e);
                if let Some(tos) = o.tos {
                    if let Err(err) = n.id.set_option(CmOption::Tos(tos)) {
                        println!("udaddy: set TOS option failed: {err}");
                    }
                }
                if let Err(err) = n.id.resolve_route(RESOLVE_TIMEOUT) {
                    failed = Some(anyhow!("udaddy: resolve route failed: {err}"));
                    left -= 1;
                }
            }
            CmEventType::RouteResolved => {
                drop(e);
                let r = n.setup(o).and_then(|()| {
                    n.id.connect(&ConnParam::default())
                        .context("udaddy: failure connecting")
                });
                if let Err(err) = r {
                    failed = Some(err);
                    left -= 1;
                }
            }
            CmEventType::Established => {
                let ud = e.ud_param().cloned();
                drop(e);
                let Some(ud) = ud else {
                    failed = Some(anyhow!("udaddy: ESTABLISHED without UD parameters"));
                    break;
                };
                n.remote_qpn = ud.qp_num;
                n.remote_qkey = ud.qkey;
                let pd = n.pd.as_ref().expect("initialised");
                match pd.create_ah(&ud.ah_attr) {
                    Ok(ah) => {
                        n.ah = Some(ah);
                        n.connected = true;
                    }
                    Err(err) => {
                        failed = Some(anyhow!("udaddy: failure creating address handle: {err}"))
                    }
                }
                left -= 1;
            }
            CmEventType::AddrError
            | CmEventType::RouteError
            | CmEventType::ConnectError
            | CmEventType::Unreachable
            | CmEventType::Rejected => {
                failed = Some(event_error(&e));
                left -= 1;
            }
            _ => {}
        }
    }
    if let Some(err) = failed {
        return Err(err);
    }
    if o.count > 0 {
        println!("initiating data transfers");
        for n in &mut nodes {
            n.post_sends(false)?;
        }
        println!("receiving data transfers");
        for n in &mut nodes {
            n.poll(o)?;
        }
        println!("data transfers complete");
    }
    Ok(())
}
