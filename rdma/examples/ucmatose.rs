//! Many simultaneous RC connections over the connection manager: a port of
//! rdma-core's `ucmatose` (`cmatose.c`), wire-compatible with it.
//!
//! ```text
//! ucmatose [-b bind_address] [-c connections] [-C count] [-S size] [-p port] ...   # server
//! ucmatose -s server_address [-b bind_address] [-c connections] ...               # client
//! ```
//!
//! The client opens `-c` connections at once on one event channel (address,
//! route, connect, each step started from the previous step's event); the
//! server accepts them all. Then the server sends `-C` messages of `-S` bytes
//! on every connection and the client answers with as many; the server
//! disconnects everything and both sides wait until every connection is
//! down. `-m` moves every id to a new event channel before disconnecting.
//!
//! Each message has a buffer of its own (memory moves into the work
//! request); the C tool sends and receives everything in one buffer.
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

use common::cm::{poll_n, Res};
use common::cmatose::{Opts, Tool};
use rdma::cm::{CmAddr, CmEvent, CmEventType, CmId, CmOption, ConnParam, EventChannel};
use rdma::{CompletionQueue, MemoryRegion, ProtectionDomain, QpType, QueuePair, SendWr, WcStatus};

const RESOLVE_TIMEOUT: Duration = Duration::from_millis(2000);
/// The C tool polls forever; this bounds it.
const POLL_TIMEOUT: Duration = Duration::from_secs(600);

fn main() -> ExitCode {
    common::cmatose::main(Tool::Ucmatose, run)
}

/// One connection. Field order is drop order: the QP before its CQs and
/// PD, the id last.
struct Node {
    qp: Option<QueuePair>,
    send_cq: Option<CompletionQueue>,
    recv_cq: Option<CompletionQueue>,
    pd: Option<ProtectionDomain>,
    sends: Vec<MemoryRegion>,
    connected: bool,
    id: CmId,
}

impl Node {
    fn new(id: CmId) -> Node {
        Node {
            qp: None,
            send_cq: None,
            recv_cq: None,
            pd: None,
            sends: Vec::new(),
            connected: false,
            id,
        }
    }

    /// PD, a send and a receive CQ, the RC QP (librdmacm's, every send
    /// signaled), the messages, and every receive posted (`init_node` +
    /// `post_recvs`).
    fn init(&mut self, o: &Opts) -> Res<()> {
        let ctx = self
            .id
            .context()
            .context("cmatose: unable to allocate PD")?;
        let pd = ctx.alloc_pd().context("cmatose: unable to allocate PD")?;
        let cqe = o.count.max(1) as u32;
        let send_cq = ctx
            .create_cq(cqe, None, 0)
            .context("cmatose: unable to create CQ")?;
        let recv_cq = ctx
            .create_cq(cqe, None, 0)
            .context("cmatose: unable to create CQ")?;
        let mut qp = self
            .id
            .create_qp(
                pd.qp_builder(QpType::Rc, &send_cq, &recv_cq)
                    .max_send_wr(cqe)
                    .max_recv_wr(cqe)
                    .max_send_sge(1)
                    .max_recv_sge(1)
                    .sq_sig_all(true),
            )
            .context("cmatose: unable to create QP")?;
        if o.count > 0 {
            common::cmatose::post_receives(&mut qp, &pd, o.size, o.count)?;
            self.sends = common::cmatose::messages(&pd, o.size, o.count)?;
        }
        self.pd = Some(pd);
        self.send_cq = Some(send_cq);
        self.recv_cq = Some(recv_cq);
        self.qp = Some(qp);
        Ok(())
    }

    fn post_sends(&mut self) -> Res<()> {
        if !self.connected {
            return Ok(());
        }
        let qp = self.qp.as_mut().expect("initialised");
        let wrs: Vec<SendWr> = std::mem::take(&mut self.sends)
            .into_iter()
            .enumerate()
            .map(|(i, mr)| SendWr::send(i as u64, mr))
            .collect();
        qp.post_send_batch(wrs)
            .map_err(rdma::PostError::drop_buffers)
            .context("failed to post sends")
    }

    /// Waits for `count` completions on the send or receive CQ.
    fn poll(&mut self, o: &Opts, recv: bool) -> Res<()> {
        if !self.connected || o.count == 0 {
            return Ok(());
        }
        let cq = if recv {
            self.recv_cq.as_ref()
        } else {
            self.send_cq.as_ref()
        }
        .expect("initialised");
        for c in poll_n(cq, o.count, POLL_TIMEOUT)? {
            if c.status != WcStatus::Success {
                return Err(anyhow!("cmatose: completion failed: {}", c.status));
            }
            if recv && c.byte_len as usize != o.size {
                return Err(anyhow!(
                    "cmatose: received {} bytes, expected {}",
                    c.byte_len,
                    o.size
                ));
            }
        }
        Ok(())
    }
}

/// Connection state shared by the event handlers.
struct Test {
    nodes: Vec<Node>,
    connects_left: usize,
    disconnects_left: usize,
    channel: EventChannel,
}

fn event_error(e: &CmEvent) -> anyhow::Error {
    anyhow!("cmatose: event: {}, error: {}", e.event_type(), e.status())
}

impl Test {
    /// `cma_handler` for one event.
    fn handle(&mut self, o: &Opts, e: CmEvent) -> Res<()> {
        let who = self.nodes.iter().position(|n| n.id.same_id(e.id()));
        match (e.event_type(), who) {
            (CmEventType::AddrResolved, Some(i)) => {
                drop(e);
                let id = &self.nodes[i].id;
                if let Some(tos) = o.tos {
                    if let Err(err) = id.set_option(CmOption::Tos(tos)) {
                        println!("cmatose: set TOS option failed: {err}");
                    }
                }
                if let Some(t) = o.ack_timeout {
                    if let Err(err) = id.set_option(CmOption::AckTimeout(t)) {
                        println!("cmatose: set ack timeout option failed: {err}");
                    }
                }
                if let Err(err) = id.resolve_route(RESOLVE_TIMEOUT) {
                    self.connects_left -= 1;
                    return Err(anyhow!("cmatose: resolve route failed: {err}"));
                }
            }
            (CmEventType::RouteResolved, Some(i)) => {
                drop(e);
                let n = &mut self.nodes[i];
                let r = n.init(o).and_then(|()| {
                    n.id.connect(&ConnParam {
                        responder_resources: 1,
                        initiator_depth: 1,
                        retry_count: 5,
                        rnr_retry_count: 0,
                        ..ConnParam::default()
                    })
                    .context("cmatose: failure connecting")
                });
                if let Err(err) = r {
                    self.connects_left -= 1;
                    return Err(err);
                }
            }
            (CmEventType::ConnectRequest, _) => {
                let id = e.id().clone();
                drop(e);
                if self.nodes.len() == o.connections {
                    println!("cmatose: failing connection request");
                    let _ = id.reject(&[]);
                    return Ok(());
                }
                let mut n = Node::new(id.clone());
                let r = n.init(o).and_then(|()| {
                    id.accept(&ConnParam::default())
                        .context("cmatose: failure accepting")
                });
                if let Err(err) = r {
                    println!("{}", common::Report(&err));
                    println!("cmatose: failing connection request");
                    self.connects_left -= 1;
                    let _ = id.reject(&[]);
                    return Ok(());
                }
                self.nodes.push(n);
            }
            (CmEventType::Established, Some(i)) => {
                self.nodes[i].connected = true;
                self.connects_left -= 1;
                self.disconnects_left += 1;
            }
            (
                CmEventType::AddrError
                | CmEventType::RouteError
                | CmEventType::ConnectError
                | CmEventType::Unreachable
                | CmEventType::Rejected,
                _,
            ) => {
                self.connects_left = self.connects_left.saturating_sub(1);
                return Err(event_error(&e));
            }
            (CmEventType::Disconnected, _) => {
                let id = e.id().clone();
                drop(e);
                let _ = id.disconnect();
                self.disconnects_left = self.disconnects_left.saturating_sub(1);
            }
            _ => {}
        }
        Ok(())
    }

    fn connect_events(&mut self, o: &Opts) -> Res<()> {
        while self.connects_left > 0 {
            let e = self
                .channel
                .get_event()
                .context("cmatose: failure in rdma_get_cm_event in connect events")?;
            self.handle(o, e)?;
        }
        Ok(())
    }

    fn disconnect_events(&mut self, o: &Opts) -> Res<()> {
        while self.disconnects_left > 0 {
            let e = self
                .channel
                .get_event()
                .context("cmatose: failure in rdma_get_cm_event in disconnect events")?;
            self.handle(o, e)?;
        }
        Ok(())
    }

    /// `-m`: every id (and the listener) moves to a new channel.
    fn migrate(&mut self, listener: Option<&CmId>) -> Res<()> {
        println!("migrating to new event channel");
        let channel = EventChannel::new().context("cmatose: failed to create event channel")?;
        for id in listener.into_iter().chain(self.nodes.iter().map(|n| &n.id)) {
            id.migrate_id(Some(&channel))
                .context("cmatose: failure migrating to channel")?;
        }
        self.channel = channel;
        Ok(())
    }
}

fn run(o: &Opts) -> Res<()> {
    let channel = EventChannel::new().context("failed to create event channel")?;
    let mut t = Test {
        nodes: Vec::new(),
        connects_left: o.connections,
        disconnects_left: 0,
        channel,
    };
    match &o.dst {
        Some(dst) => run_client(o, &mut t, dst),
        None => run_server(o, &mut t),
    }
}

fn run_server(o: &Opts, t: &mut Test) -> Res<()> {
    println!("cmatose: starting server");
    let listener = t
        .channel
        .create_id(o.ps)
        .context("cmatose: listen request failed")?;
    let addr = o.rdma_addr(None).context("cmatose: getrdmaaddr error")?;
    listener
        .bind_addr(addr.src.context("cmatose: no address to bind")?)
        .context("cmatose: bind address failed")?;
    listener
        .listen(0)
        .context("cmatose: failure trying to listen")?;
    t.connect_events(o)?;
    if o.count > 0 {
        println!("initiating data transfers");
        for n in &mut t.nodes {
            n.post_sends()?;
        }
        println!("completing sends");
        for n in &mut t.nodes {
            n.poll(o, false)?;
        }
        println!("receiving data transfers");
        for n in &mut t.nodes {
            n.poll(o, true)?;
        }
        println!("data transfers complete");
    }
    if o.migrate {
        t.migrate(Some(&listener))?;
    }
    println!("cmatose: disconnecting");
    for n in &mut t.nodes {
        if n.connected {
            n.connected = false;
            let _ = n.id.disconnect();
        }
    }
    t.disconnect_events(o)?;
    println!("disconnected");
    Ok(())
}

fn run_client(o: &Opts, t: &mut Test, dst: &str) -> Res<()> {
    println!("cmatose: starting client");
    let addr = o
        .rdma_addr(Some(dst))
        .context("cmatose: getaddrinfo error")?;
    let to: CmAddr = addr.dst.context("cmatose: no destination address")?;
    for _ in 0..o.connections {
        let id = t.channel.create_id(o.ps).context("rdma_create_id")?;
        t.nodes.push(Node::new(id));
    }
    println!("cmatose: connecting");
    for n in &t.nodes {
        n.id.resolve_addr(addr.src, to, RESOLVE_TIMEOUT)
            .context("cmatose: failure getting addr")?;
    }
    let connected = (|| -> Res<()> {
        t.connect_events(o)?;
        if o.count > 0 {
            println!("receiving data transfers");
            for n in &mut t.nodes {
                n.poll(o, true)?;
            }
            println!("sending replies");
            for n in &mut t.nodes {
                n.post_sends()?;
            }
            println!("data transfers complete");
        }
        if o.migrate {
            t.migrate(None)?;
        }
        Ok(())
    })();
    let disconnected = t.disconnect_events(o);
    connected.and(disconnected)
}
