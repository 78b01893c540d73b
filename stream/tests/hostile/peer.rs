//! The test peer: an RC queue pair on the route's device with a receive
//! buffer and a target SGL as rsocket has them, built directly on the
//! `rdma` crate and `rdma_stream::wire`, which sends what it is told (valid
//! or not) and keeps every message the stream sends it.

use super::*;

/// `wr_id` bit of the test peer's receives.
pub(crate) const RECV: u64 = 1 << 63;
/// The test peer's receive queue depth (and its credits unless told).
pub(crate) const PEER_RQ: u32 = 64;
/// The test peer's receive buffer: half of it is its first grant.
pub(crate) const PEER_RBUF: usize = 64 * 1024;

/// A test peer: an RC QP on the route's device, a receive buffer and a
/// target SGL as rsocket has them, and the stream's connection data.
/// Field order is teardown order (the QP before its CQ, the id last).
pub(crate) struct Peer {
    pub(crate) qp: QueuePair,
    pub(crate) cq: CompletionQueue,
    pub(crate) _comp: CompletionChannel,
    pub(crate) target: MemoryRegion,
    /// Read by the coalescing tests (async, feature `tokio`).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) rbuf: MemoryRegion,
    pub(crate) pd: ProtectionDomain,
    /// The connection's id and its event channel (the closing tests watch it).
    pub(crate) cm_id: CmId,
    pub(crate) cm_events: EventChannel,
    /// What the stream sent.
    pub(crate) theirs: ConnData,
    pub(crate) iwarp: bool,
    /// Where the next data goes in the stream's first segment.
    pub(crate) offset: u64,
    pub(crate) next_id: u64,
    pub(crate) posted: u64,
    pub(crate) done: u64,
    /// The first failed send, if any.
    pub(crate) failed: Option<WcStatus>,
    /// Messages the stream sent us, not yet taken.
    pub(crate) messages: VecDeque<u32>,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("theirs", &self.theirs)
            .finish()
    }
}

pub(crate) struct Made {
    pub(crate) qp: QueuePair,
    pub(crate) cq: CompletionQueue,
    pub(crate) comp: CompletionChannel,
    pub(crate) target: MemoryRegion,
    pub(crate) rbuf: MemoryRegion,
    pub(crate) pd: ProtectionDomain,
    pub(crate) ours: ConnData,
}

/// The verbs objects of a peer on `id`'s device, every receive posted,
/// and the connection data that describes them, with `credits`.
pub(crate) fn make(id: &CmId, iwarp: bool, credits: u16) -> Made {
    let ctx = id.context().expect("the route's device");
    let pd = ctx.alloc_pd().expect("ibv_alloc_pd");
    let comp = ctx.create_comp_channel().expect("ibv_create_comp_channel");
    let cq = ctx.create_cq(2048, Some(&comp), 0).expect("ibv_create_cq");
    let mut qp = pd
        .qp_builder(QpType::Rc, &cq, &cq)
        .max_send_wr(1024)
        .max_recv_wr(PEER_RQ)
        .max_inline_data(64)
        .build()
        .expect("ibv_create_qp");
    id.modify_qp(&qp, QpState::Init).expect("QP to INIT");
    let remote = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let rbuf = pd.alloc_mr(PEER_RBUF, remote).expect("receive buffer");
    let target = pd
        .alloc_mr(wire::SGL_ENTRIES * wire::SGE_LEN, remote)
        .expect("target SGL");
    for _ in 0..PEER_RQ {
        post_recv(&mut qp, &pd, iwarp);
    }
    let ours = ConnData {
        flags: if cfg!(target_endian = "big") {
            wire::FLAG_NET
        } else {
            0
        },
        credits,
        target_iomap_size: 0,
        target_sgl: Sge {
            addr: target.addr(),
            key: target.rkey(),
            length: wire::SGL_ENTRIES as u32,
        },
        data_buf: Sge {
            addr: rbuf.addr(),
            key: rbuf.rkey(),
            length: (PEER_RBUF / 2) as u32,
        },
    };
    Made {
        qp,
        cq,
        comp,
        target,
        rbuf,
        pd,
        ours,
    }
}

/// One receive: no memory on RoCE (messages ride in the immediate data), a
/// 4-byte slot on iWARP (messages are SENDs).
pub(crate) fn post_recv(qp: &mut QueuePair, pd: &ProtectionDomain, iwarp: bool) {
    let r = if iwarp {
        let slot = pd
            .alloc_mr(wire::MSG_LEN, AccessFlags::LOCAL_WRITE)
            .expect("message slot");
        qp.post_recv(RECV, slot)
    } else {
        qp.post_recv(RECV, WrBuffers::None)
    };
    r.map_err(PostError::drop_buffers).expect("ibv_post_recv");
}

/// What rsocket sends besides its data (as `setup.rs`).
pub(crate) fn param(private_data: Vec<u8>, iwarp: bool) -> ConnParam {
    ConnParam {
        private_data,
        flow_control: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        initiator_depth: u8::from(iwarp),
        ..ConnParam::default()
    }
}

/// How a connection attempt of the test peer ended.
pub(crate) enum Dialed {
    Up(Box<Peer>),
    /// The event that ended the attempt, and its status.
    Refused(CmEventType, i32),
}

impl Peer {
    /// Connects to an `RdmaListener` at `dst` with valid connection data
    /// granting `credits`.
    pub(crate) fn connect(dst: SocketAddr, iwarp: bool, credits: u16) -> Peer {
        match Self::dial(dst, iwarp, credits, |d| d.encode().to_vec()) {
            Dialed::Up(p) => *p,
            Dialed::Refused(e, st) => {
                panic!("the listener refused a valid rsocket peer: {e:?} (status {st})")
            }
        }
    }

    /// Connects with the private data `private` makes of valid connection
    /// data.
    pub(crate) fn dial(
        dst: SocketAddr,
        iwarp: bool,
        credits: u16,
        private: impl FnOnce(&ConnData) -> Vec<u8>,
    ) -> Dialed {
        let events = EventChannel::new().expect("rdma_create_event_channel");
        let id = events.create_id(PortSpace::Tcp).expect("rdma_create_id");
        id.resolve_addr(None, dst, STEP).expect("rdma_resolve_addr");
        drop(
            events
                .wait_for(&id, &[CmEventType::AddrResolved], "resolve", STEP)
                .expect("address resolved"),
        );
        id.resolve_route(STEP).expect("rdma_resolve_route");
        drop(
            events
                .wait_for(&id, &[CmEventType::RouteResolved], "route", STEP)
                .expect("route resolved"),
        );
        let m = make(&id, iwarp, credits);
        id.connect_qp(&m.qp, &param(private(&m.ours), iwarp))
            .expect("rdma_connect");
        let event = events
            .get_event_timeout(STEP)
            .expect("rdma_get_cm_event")
            .expect("an answer to the connect request within the bound");
        let kind = event.event_type();
        if !matches!(
            kind,
            CmEventType::ConnectResponse | CmEventType::Established
        ) {
            return Dialed::Refused(kind, event.status());
        }
        let theirs = ConnData::decode(event.private_data()).expect("the stream's ConnData");
        drop(event);
        if kind == CmEventType::ConnectResponse {
            id.establish_qp(&m.qp).expect("rdma_establish");
        }
        Dialed::Up(Box::new(Peer::new(m, id, events, theirs, iwarp)))
    }

    /// Accepts the next connect request on `listening` (an `RdmaStream`
    /// connecting) with valid connection data granting `credits`, on an
    /// event channel of its own.
    pub(crate) fn accept(listening: &EventChannel, iwarp: bool, credits: u16) -> Peer {
        let event = listening
            .get_event_timeout(STEP)
            .expect("rdma_get_cm_event")
            .expect("a connect request within the bound");
        assert_eq!(event.event_type(), CmEventType::ConnectRequest);
        let id = event.id().clone();
        let theirs = ConnData::decode(event.private_data()).expect("the stream's ConnData");
        drop(event);
        let events = EventChannel::new().expect("rdma_create_event_channel");
        id.migrate_id(Some(&events)).expect("rdma_migrate_id");
        let m = make(&id, iwarp, credits);
        id.accept_qp(&m.qp, &param(m.ours.encode().to_vec(), iwarp))
            .expect("rdma_accept");
        drop(
            events
                .wait_for(&id, &[CmEventType::Established], "accept", STEP)
                .expect("established"),
        );
        Peer::new(m, id, events, theirs, iwarp)
    }

    pub(crate) fn new(
        m: Made,
        id: CmId,
        events: EventChannel,
        theirs: ConnData,
        iwarp: bool,
    ) -> Peer {
        Peer {
            qp: m.qp,
            cq: m.cq,
            _comp: m.comp,
            target: m.target,
            rbuf: m.rbuf,
            pd: m.pd,
            cm_id: id,
            cm_events: events,
            theirs,
            iwarp,
            offset: 0,
            next_id: 1,
            posted: 0,
            done: 0,
            failed: None,
            messages: VecDeque::new(),
        }
    }

    pub(crate) fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.posted += 1;
        self.next_id
    }

    pub(crate) fn send_inline(&mut self, wr: InlineSend<'_>) {
        self.qp
            .post_send_inline(wr)
            .expect("ibv_post_send (inline)");
    }

    /// A bare message: a zero-length WRITE WITH IMMEDIATE, or a 4-byte SEND
    /// on iWARP.
    pub(crate) fn msg(&mut self, m: u32) {
        let id = self.id();
        if self.iwarp {
            self.send_inline(InlineSend::send(id, &m.to_ne_bytes()));
        } else {
            let to = RemoteMemory {
                addr: self.theirs.target_sgl.addr,
                len: 0,
                rkey: self.theirs.target_sgl.key,
            };
            self.qp
                .post_send(SendWr::new(
                    id,
                    SendOp::WriteWithImm(to, m),
                    WrBuffers::None,
                ))
                .map_err(PostError::drop_buffers)
                .expect("ibv_post_send");
        }
    }

    /// Writes `data` at `to` with message `m` (one WRITE WITH IMMEDIATE, or
    /// a WRITE and the message's SEND on iWARP).
    pub(crate) fn write_msg(&mut self, data: &[u8], to: RemoteMemory, m: u32) {
        let id = self.id();
        let imm = !self.iwarp;
        if data.len() <= 64 {
            let wr = InlineSend::write(id, data, to);
            self.send_inline(if imm { wr.with_imm(m) } else { wr });
        } else {
            let mr = self
                .pd
                .reg_mr(data.to_vec(), AccessFlags::empty())
                .expect("ibv_reg_mr");
            let op = if imm {
                SendOp::WriteWithImm(to, m)
            } else {
                SendOp::Write(to)
            };
            self.qp
                .post_send(SendWr::new(id, op, mr))
                .map_err(PostError::drop_buffers)
                .expect("ibv_post_send");
        }
        if !imm {
            let id = self.id();
            self.send_inline(InlineSend::send(id, &m.to_ne_bytes()));
        }
    }

    /// Writes `data` into the stream's first segment (after what was
    /// written before) and says it holds `claim` bytes.
    pub(crate) fn data_claiming(&mut self, data: &[u8], claim: u32) {
        let to = RemoteMemory {
            addr: self.theirs.data_buf.addr + self.offset,
            len: data.len() as u64,
            rkey: self.theirs.data_buf.key,
        };
        assert!(
            self.offset + data.len() as u64 <= u64::from(self.theirs.data_buf.length),
            "the test writes only into the first segment"
        );
        self.offset += data.len() as u64;
        self.write_msg(data, to, wire::msg(Op::DATA, claim));
    }

    /// Legitimate data.
    pub(crate) fn data(&mut self, data: &[u8]) {
        self.data_claiming(data, data.len() as u32);
    }

    pub(crate) fn take(&mut self, mut c: Completion) {
        if c.wr_id & RECV != 0 {
            let piece = c.take_buffers().into_one();
            if c.status != WcStatus::Success {
                return;
            }
            let m = match (c.imm(), &piece) {
                (Some(imm), _) => imm,
                (None, Some(p)) => {
                    let mut b = [0; wire::MSG_LEN];
                    p.read_at(0, &mut b).expect("our message slot");
                    u32::from_ne_bytes(b)
                }
                (None, None) => panic!("a receive without a message: {c:?}"),
            };
            self.messages.push_back(m);
            let r = match piece {
                Some(p) => self.qp.post_recv(RECV, p),
                None => self.qp.post_recv(RECV, WrBuffers::None),
            };
            r.map_err(PostError::drop_buffers).expect("repost");
        } else {
            self.done += 1;
            if c.status != WcStatus::Success && self.failed.is_none() {
                self.failed = Some(c.status);
            }
        }
    }

    /// Waits for one completion (`false`: none within `STEP`).
    pub(crate) fn poll(&mut self, deadline: Instant) -> bool {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.cq.wait(Some(left)).expect("CompletionQueue::wait") {
            Some(c) => {
                self.take(c);
                true
            }
            None => false,
        }
    }

    /// Waits until every send posted has completed; the first failure.
    pub(crate) fn wait_sends(&mut self) -> Result<(), WcStatus> {
        let deadline = Instant::now() + STEP;
        while self.done < self.posted {
            assert!(
                self.poll(deadline),
                "{} of the test peer's {} sends completed within {STEP:?}",
                self.done,
                self.posted
            );
        }
        match self.failed {
            None => Ok(()),
            Some(s) => Err(s),
        }
    }

    /// The next message the stream sends.
    pub(crate) fn next_message(&mut self) -> u32 {
        let deadline = Instant::now() + STEP;
        loop {
            if let Some(m) = self.messages.pop_front() {
                return m;
            }
            assert!(
                self.poll(deadline),
                "no message from the stream in {STEP:?}"
            );
        }
    }

    /// Waits for the stream's first credits (sent when it is connected)
    /// and returns the bytes granted so far: the first segment and the
    /// one it wrote into our target SGL.
    pub(crate) fn first_grant(&mut self) -> u64 {
        let m = self.next_message();
        assert_eq!(wire::msg_op(m), Op::SGL, "the stream's first message");
        let mut b = [0; wire::SGE_LEN];
        self.target
            .read_at(wire::SGE_LEN, &mut b)
            .expect("our target SGL");
        let second = Sge::from_memory(&b);
        assert_eq!(second.key, self.theirs.data_buf.key);
        u64::from(self.theirs.data_buf.length) + u64::from(second.length)
    }
}
