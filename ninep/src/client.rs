//! A client transport built like Linux's (`net/9p/trans_rdma.c`'s design),
//! and a small 9P2000.L client on it, used by the tests against the server.
//!
//! The transport keeps the kernel's shape: a state machine for setup and
//! teardown ([`State`]); send and receive depths ([`Options::sq`],
//! [`Options::rq`]) counted like semaphores (a request takes a receive
//! credit and a send credit, and the completions give them back);
//! `excess_rc`, the receives posted that no pending request is waiting for
//! (a request that gave up leaves its receive posted, and the next request
//! uses it instead of posting another); a timeout on every connection
//! manager step; and the kernel's mount options (`port=`, `sq=`, `rq=`,
//! `timeout=`, `privport`) parsed with errors that name the bad option.
//!
//! Requests are sent one at a time ([`Transport::rpc`]): the tests need no
//! more, and a late reply to a request that gave up is recognised by its
//! tag and dropped.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use rdma::aio::{tokio_rt as rt, AsyncCmId, AsyncCq};
use rdma::cm::{ConnParam, PortSpace};
use rdma::{BufferPool, MemoryRegion, ProtectionDomain, QueuePair, SendWr, WcOpcode, WcStatus};

use crate::link::{Queues, RECV};
use crate::proto::{self, Qid, Request, Rmsg, Tmsg, NOFID, VERSION};

/// The kernel's default port.
pub const DEFAULT_PORT: u16 = 5640;
/// The kernel's default send and receive queue depths.
pub const DEFAULT_DEPTH: u32 = 32;
/// The kernel's default timeout for connection manager events, in ms.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;

/// The transport's options, as the kernel's `-o` string gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `port=`: the server's port.
    pub port: u16,
    /// `sq=`: send queue depth.
    pub sq: u32,
    /// `rq=`: receive queue depth (at least `sq`).
    pub rq: u32,
    /// `timeout=`: ms to wait for each connection manager event.
    pub timeout_ms: u64,
    /// `privport`: bind a port below 1024 first.
    pub privport: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            port: DEFAULT_PORT,
            sq: DEFAULT_DEPTH,
            rq: DEFAULT_DEPTH,
            timeout_ms: DEFAULT_TIMEOUT_MS,
            privport: false,
        }
    }
}

/// A bad option, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionError {
    /// The option as written (`sq=abc`).
    pub option: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl fmt::Display for OptionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mount option {:?}: {}", self.option, self.reason)
    }
}

impl std::error::Error for OptionError {}

impl Options {
    /// Parses a comma-separated option string. Options of other layers
    /// (`trans=`, `version=`, `msize=`...) are left to them and skipped, as
    /// the kernel does.
    ///
    /// # Errors
    /// [`OptionError`] naming the first option whose value is bad.
    pub fn parse(s: &str) -> Result<Options, OptionError> {
        let mut o = Options::default();
        for opt in s.split(',').filter(|o| !o.is_empty()) {
            let (key, value) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            let bad = |reason| OptionError {
                option: opt.to_string(),
                reason,
            };
            let num = |v: Option<&str>| -> Result<u64, OptionError> {
                v.ok_or_else(|| bad("needs a value"))?
                    .parse::<u64>()
                    .map_err(|_| bad("not a number"))
            };
            match key {
                "port" => {
                    o.port = u16::try_from(num(value)?)
                        .ok()
                        .filter(|&p| p != 0)
                        .ok_or_else(|| bad("a port from 1 to 65535"))?
                }
                "sq" => {
                    o.sq = u32::try_from(num(value)?)
                        .ok()
                        .filter(|&d| d > 0)
                        .ok_or_else(|| bad("a depth from 1"))?
                }
                "rq" => {
                    o.rq = u32::try_from(num(value)?)
                        .ok()
                        .filter(|&d| d > 0)
                        .ok_or_else(|| bad("a depth from 1"))?
                }
                "timeout" => o.timeout_ms = num(value)?,
                "privport" => {
                    if value.is_some() {
                        return Err(bad("takes no value"));
                    }
                    o.privport = true
                }
                _ => {}
            }
        }
        // As the kernel: never fewer receives than sends.
        o.rq = o.rq.max(o.sq);
        Ok(o)
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

/// The transport's state, as the kernel's `p9_trans_rdma.state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Nothing done yet.
    Idle,
    /// Resolving and connecting.
    Connecting,
    /// Requests may be sent.
    Connected,
    /// Disconnecting.
    Closing,
    /// Disconnected.
    Closed,
    /// A failed step or completion: nothing more is sent.
    Error,
}

/// A transport or protocol failure.
#[derive(Debug)]
pub enum ClientError {
    /// An RDMA step failed (what, and why).
    Rdma(String),
    /// A step did not finish within the timeout.
    TimedOut(&'static str),
    /// The transport is not connected (its state).
    NotConnected(State),
    /// The reply could not be decoded.
    Decode(proto::DecodeError),
    /// The server answered `Rlerror`.
    Lerror(u32),
    /// The server answered with another reply than expected.
    Unexpected(String),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Rdma(e) => write!(f, "{e}"),
            ClientError::TimedOut(what) => write!(f, "{what}: timed out"),
            ClientError::NotConnected(s) => write!(f, "transport is {s:?}"),
            ClientError::Decode(e) => write!(f, "bad reply: {e}"),
            ClientError::Lerror(e) => write!(f, "Rlerror {e}"),
            ClientError::Unexpected(r) => write!(f, "unexpected reply {r}"),
        }
    }
}

impl std::error::Error for ClientError {}

type CResult<T> = Result<T, ClientError>;

fn rdma_err<E: fmt::Display>(what: &'static str) -> impl FnOnce(E) -> ClientError {
    move |e| ClientError::Rdma(format!("{what}: {e}"))
}

/// An RDMA connection to a 9P server, built like the kernel's.
#[derive(Debug)]
pub struct Transport {
    state: State,
    opts: Options,
    msize: usize,
    id: AsyncCmId,
    qp: QueuePair,
    acq: AsyncCq,
    _pd: ProtectionDomain,
    recv_pool: BufferPool,
    send_pool: BufferPool,
    /// Receive credits left (the rq "semaphore").
    rq_free: u32,
    /// Send credits left (the sq "semaphore").
    sq_free: u32,
    /// Receives posted without a pending request.
    excess_rc: u32,
    /// The unused tail of each send buffer in flight, by work request.
    tails: Vec<(u64, MemoryRegion)>,
    next_wr: u64,
    /// Replies to [`Transport::send_all`]'s messages not yet taken.
    unclaimed: Vec<Vec<u8>>,
}

impl Transport {
    /// Connects to `addr` (its port replaced by `opts.port`), with buffers
    /// of `msize` bytes.
    ///
    /// # Errors
    /// A failed or timed-out connection step.
    pub async fn connect(addr: SocketAddr, opts: &Options, msize: usize) -> CResult<Transport> {
        let addr = SocketAddr::new(addr.ip(), opts.port);
        let cm = rt::cm_channel().map_err(rdma_err("rdma_create_event_channel"))?;
        let mut id = cm
            .create_id(PortSpace::Tcp)
            .map_err(rdma_err("rdma_create_id"))?;
        let src = if opts.privport {
            Some(privileged_source(&addr)?)
        } else {
            None
        };
        let t = opts.timeout();
        step(
            t,
            "rdma_resolve_addr",
            id.resolve_addr(src.map(Into::into), addr, t),
        )
        .await?;
        step(t, "rdma_resolve_route", id.resolve_route(t)).await?;
        let Queues {
            pd,
            acq,
            qp,
            recv_pool,
            send_pool,
        } = Queues::new(id.id(), opts.sq, opts.rq, msize)
            .map_err(|e| ClientError::Rdma(e.to_string()))?;
        step(t, "rdma_connect", id.connect(&qp, &ConnParam::default())).await?;
        Ok(Transport {
            state: State::Connected,
            opts: opts.clone(),
            msize,
            id,
            qp,
            acq,
            _pd: pd,
            recv_pool,
            send_pool,
            rq_free: opts.rq,
            sq_free: opts.sq,
            excess_rc: 0,
            tails: Vec::new(),
            next_wr: 0,
            unclaimed: Vec::new(),
        })
    }

    /// The state.
    pub fn state(&self) -> State {
        self.state
    }

    /// Receives posted that no pending request waits for.
    pub fn excess_rc(&self) -> u32 {
        self.excess_rc
    }

    /// Sends one whole message and returns the reply whose tag matches
    /// (`wait`: how long to wait for it). A reply that does not come in
    /// time leaves its receive posted, counted in `excess_rc`.
    ///
    /// # Errors
    /// [`ClientError::NotConnected`] unless connected; a failed completion
    /// (the state becomes [`State::Error`]); a timeout.
    pub async fn rpc(&mut self, msg: &[u8], wait: Duration) -> CResult<Vec<u8>> {
        let tag = self.start(msg, None).await?;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let got = tokio::time::timeout_at(deadline, self.complete_one(tag)).await;
            match got {
                Err(_) => {
                    // Its receive stays posted, for nobody.
                    self.excess_rc += 1;
                    return Err(ClientError::TimedOut("reply"));
                }
                Ok(Err(e)) => return Err(e),
                Ok(Ok(Some(reply))) => return Ok(reply),
                Ok(Ok(None)) => {}
            }
        }
    }

    /// Sends every message of `msgs` (each with a tag of its own; no more
    /// of them than receive credits are free) without waiting for replies:
    /// [`Transport::next_replies`] takes them as they come.
    ///
    /// # Errors
    /// As [`Transport::rpc`]; [`ClientError::Rdma`] when `msgs` exceeds the
    /// free receive credits.
    pub async fn send_all(&mut self, msgs: &[Vec<u8>]) -> CResult<()> {
        if msgs.len() > (self.rq_free + self.excess_rc) as usize {
            return Err(ClientError::Rdma(format!(
                "{} messages at once, with {} receive credits free",
                msgs.len(),
                self.rq_free + self.excess_rc
            )));
        }
        let mut early = std::mem::take(&mut self.unclaimed);
        let r = async {
            for m in msgs {
                self.start(m, Some(&mut early)).await?;
            }
            Ok(())
        }
        .await;
        self.unclaimed = early;
        r
    }

    /// The next `n` replies to messages of [`Transport::send_all`], in the
    /// order they came (`wait`: how long to wait for all `n`). A request
    /// that is never answered keeps its receive posted.
    ///
    /// # Errors
    /// [`ClientError::TimedOut`] when fewer than `n` came in time (those
    /// that did are kept for the next call); as [`Transport::rpc`].
    pub async fn next_replies(&mut self, n: usize, wait: Duration) -> CResult<Vec<Vec<u8>>> {
        let deadline = tokio::time::Instant::now() + wait;
        while self.unclaimed.len() < n {
            match tokio::time::timeout_at(deadline, self.complete_any()).await {
                Err(_) => return Err(ClientError::TimedOut("reply")),
                Ok(Err(e)) => return Err(e),
                Ok(Ok(Some(reply))) => self.unclaimed.push(reply),
                Ok(Ok(None)) => {}
            }
        }
        Ok(self.unclaimed.drain(..n).collect())
    }

    /// Posts a receive for the reply and sends `msg`; returns its tag.
    /// Replies that come meanwhile go to `early` (dropped without one).
    async fn start(
        &mut self,
        msg: &[u8],
        mut early: Option<&mut Vec<Vec<u8>>>,
    ) -> CResult<Option<u16>> {
        if self.state != State::Connected {
            return Err(ClientError::NotConnected(self.state));
        }
        if msg.len() > self.msize {
            return Err(ClientError::Rdma(format!(
                "a message of {} bytes exceeds msize {}",
                msg.len(),
                self.msize
            )));
        }
        let tag = msg.get(5..7).map(|t| u16::from_le_bytes([t[0], t[1]]));
        // A receive for the reply: one left by a request that gave up, or
        // a new one (a receive credit).
        if self.excess_rc > 0 {
            self.excess_rc -= 1;
        } else {
            while self.rq_free == 0 {
                if let (Some(r), Some(e)) = (self.complete_any().await?, early.as_deref_mut()) {
                    e.push(r);
                }
            }
            let buf = self
                .recv_pool
                .take()
                .ok_or_else(|| ClientError::Rdma("no receive buffer".into()))?;
            let wr = RECV | self.next_id();
            self.qp
                .post_recv(wr, buf)
                .map_err(|e| self.fail(format!("ibv_post_recv: {e}")))?;
            self.rq_free -= 1;
        }
        while self.sq_free == 0 || self.send_pool.available() == 0 {
            if let (Some(r), Some(e)) = (self.complete_any().await?, early.as_deref_mut()) {
                e.push(r);
            }
        }
        let mut slot = self
            .send_pool
            .take()
            .ok_or_else(|| ClientError::Rdma("no send buffer".into()))?;
        slot.write_at(0, msg).map_err(rdma_err("send buffer"))?;
        let tail = if msg.len() < slot.len() {
            Some(slot.split_off(msg.len()).map_err(rdma_err("send buffer"))?)
        } else {
            None
        };
        let wr = self.next_id();
        let r = self
            .acq
            .post_send(&mut self.qp, SendWr::send(wr, slot))
            .await;
        if let Err(e) = r {
            return Err(self.fail(format!("ibv_post_send: {e}")));
        }
        self.sq_free -= 1;
        if let Some(t) = tail {
            self.tails.push((wr, t));
        }
        Ok(tag)
    }

    fn next_id(&mut self) -> u64 {
        self.next_wr = (self.next_wr + 1) & !RECV;
        self.next_wr
    }

    fn fail(&mut self, e: String) -> ClientError {
        self.state = State::Error;
        ClientError::Rdma(e)
    }

    /// Handles one completion; returns a reply whose tag is `want`.
    async fn complete_one(&mut self, want: Option<u16>) -> CResult<Option<Vec<u8>>> {
        let reply = self.complete_any().await?;
        let tag = reply
            .as_ref()
            .and_then(|r| r.get(5..7))
            .map(|t| u16::from_le_bytes([t[0], t[1]]));
        if want.is_some() && tag == want {
            Ok(reply)
        } else {
            // A late reply to a request that gave up: its receive was
            // counted in excess_rc, which the next request already used.
            Ok(None)
        }
    }

    /// Handles one completion; returns the reply it brought, if any.
    async fn complete_any(&mut self) -> CResult<Option<Vec<u8>>> {
        let mut c = self
            .acq
            .next()
            .await
            .map_err(|e| self.fail(format!("poll: {e}")))?;
        if c.status != WcStatus::Success {
            let e = format!("completion {:#x}: {}", c.wr_id, c.status);
            return Err(self.fail(e));
        }
        let Some(mut buf) = c.take_buffers().into_one() else {
            return Err(self.fail("a completion without its buffer".into()));
        };
        if c.opcode != WcOpcode::Recv {
            if let Some(i) = self.tails.iter().position(|(w, _)| *w == c.wr_id) {
                let (_, t) = self.tails.swap_remove(i);
                let _ = buf.unsplit(t);
            }
            let _ = self.send_pool.put(buf);
            self.sq_free += 1;
            return Ok(None);
        }
        self.rq_free += 1;
        let len = c.byte_len as usize;
        let reply = buf
            .as_slice()
            .ok()
            .and_then(|b| b.get(..len))
            .map(<[u8]>::to_vec)
            .unwrap_or_default();
        let _ = self.recv_pool.put(buf);
        Ok(Some(reply))
    }

    /// Disconnects.
    ///
    /// # Errors
    /// A failed or timed-out disconnect.
    pub async fn close(mut self) -> CResult<()> {
        self.state = State::Closing;
        let t = self.opts.timeout();
        let r = step(t, "rdma_disconnect", self.id.disconnect()).await;
        let _ = self.qp.to_error();
        self.state = State::Closed;
        r
    }
}

async fn step<T>(
    t: Duration,
    what: &'static str,
    f: impl std::future::Future<Output = rdma::Result<T>>,
) -> CResult<T> {
    match tokio::time::timeout(t, f).await {
        Err(_) => Err(ClientError::TimedOut(what)),
        Ok(r) => r.map_err(rdma_err(what)),
    }
}

/// A privileged source address for `privport` (port 1023; the kernel
/// tries the ports below it too), of `dst`'s family.
fn privileged_source(dst: &SocketAddr) -> CResult<SocketAddr> {
    let ip = match dst {
        SocketAddr::V4(_) => std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        SocketAddr::V6(_) => std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
    };
    // The port is bound by rdma_resolve_addr; a taken one fails there.
    Ok(SocketAddr::new(ip, 1023))
}

/// A small 9P2000.L client on a [`Transport`].
#[derive(Debug)]
pub struct Client {
    t: Transport,
    tag: u16,
    msize: u32,
    wait: Duration,
    buf: Vec<u8>,
}

impl Client {
    /// Negotiates the version with at most `msize`.
    ///
    /// # Errors
    /// A transport error, or a server that does not speak 9P2000.L.
    pub async fn new(t: Transport, msize: u32) -> CResult<Client> {
        let mut c = Client {
            t,
            tag: 0,
            msize,
            wait: Duration::from_secs(30),
            buf: Vec::new(),
        };
        let out = c
            .raw(
                proto::NOTAG,
                Tmsg::Version {
                    msize,
                    version: VERSION,
                },
            )
            .await?;
        match Rmsg::decode(&out).map_err(ClientError::Decode)?.1 {
            Rmsg::Version { msize, version } if version == VERSION => {
                c.msize = msize;
                Ok(c)
            }
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// How long each request waits for its reply (30 s at first).
    pub fn set_wait(&mut self, wait: Duration) {
        self.wait = wait;
    }

    /// The negotiated msize.
    pub fn msize(&self) -> u32 {
        self.msize
    }

    /// The transport underneath.
    pub fn transport(&mut self) -> &mut Transport {
        &mut self.t
    }

    async fn raw(&mut self, tag: u16, msg: Tmsg<'_>) -> CResult<Vec<u8>> {
        self.buf.clear();
        Request { tag, msg }.encode(&mut self.buf);
        let msg = std::mem::take(&mut self.buf);
        let r = self.t.rpc(&msg, self.wait).await;
        self.buf = msg;
        r
    }

    /// Sends `msg` and returns the decoded reply's owner buffer; Rlerror
    /// becomes [`ClientError::Lerror`].
    pub async fn call(&mut self, msg: Tmsg<'_>) -> CResult<Vec<u8>> {
        self.tag = (self.tag + 1) % proto::NOTAG;
        let out = self.raw(self.tag, msg).await?;
        match Rmsg::decode(&out).map_err(ClientError::Decode)?.1 {
            Rmsg::Lerror { ecode } => Err(ClientError::Lerror(ecode)),
            _ => Ok(out),
        }
    }

    /// Sends bytes as they are (for tests of malformed messages).
    ///
    /// # Errors
    /// As [`Transport::rpc`].
    pub async fn send_raw(&mut self, bytes: &[u8]) -> CResult<Vec<u8>> {
        self.t.rpc(bytes, self.wait).await
    }

    fn qid(out: &[u8]) -> CResult<Qid> {
        match Rmsg::decode(out).map_err(ClientError::Decode)?.1 {
            Rmsg::Attach { qid }
            | Rmsg::Lopen { qid, .. }
            | Rmsg::Lcreate { qid, .. }
            | Rmsg::Mkdir { qid }
            | Rmsg::Symlink { qid } => Ok(qid),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// `Tattach` of `fid` to the root.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn attach(&mut self, fid: u32) -> CResult<Qid> {
        let out = self
            .call(Tmsg::Attach {
                fid,
                afid: NOFID,
                uname: b"root",
                aname: b"",
                n_uname: 0,
            })
            .await?;
        Self::qid(&out)
    }

    /// `Twalk`: the qids of the names walked (fewer than asked: the walk
    /// stopped, and `newfid` was not made).
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn walk(&mut self, fid: u32, newfid: u32, names: &[&[u8]]) -> CResult<Vec<Qid>> {
        let out = self
            .call(Tmsg::Walk {
                fid,
                newfid,
                names: names.to_vec(),
            })
            .await?;
        match Rmsg::decode(&out).map_err(ClientError::Decode)?.1 {
            Rmsg::Walk { qids } => Ok(qids),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// `Tlopen`.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn open(&mut self, fid: u32, flags: u32) -> CResult<Qid> {
        let out = self.call(Tmsg::Lopen { fid, flags }).await?;
        Self::qid(&out)
    }

    /// `Tlcreate`: `fid` (a directory) becomes the new open file.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn create(&mut self, fid: u32, name: &[u8], flags: u32, mode: u32) -> CResult<Qid> {
        let out = self
            .call(Tmsg::Lcreate {
                fid,
                name,
                flags,
                mode,
                gid: 0,
            })
            .await?;
        Self::qid(&out)
    }

    /// `Tread`.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn read(&mut self, fid: u32, offset: u64, count: u32) -> CResult<Vec<u8>> {
        let out = self.call(Tmsg::Read { fid, offset, count }).await?;
        match Rmsg::decode(&out).map_err(ClientError::Decode)?.1 {
            Rmsg::Read { data } => Ok(data.to_vec()),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// `Twrite`: how many bytes the server took.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn write(&mut self, fid: u32, offset: u64, data: &[u8]) -> CResult<u32> {
        let out = self.call(Tmsg::Write { fid, offset, data }).await?;
        match Rmsg::decode(&out).map_err(ClientError::Decode)?.1 {
            Rmsg::Write { count } => Ok(count),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// `Treaddir` until the end: every entry's name.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn readdir(&mut self, fid: u32) -> CResult<Vec<Vec<u8>>> {
        let mut names = Vec::new();
        let mut offset = 0;
        let count = self.msize - proto::IOHDRSZ as u32;
        loop {
            let out = self.call(Tmsg::Readdir { fid, offset, count }).await?;
            let Rmsg::Readdir { data } = Rmsg::decode(&out).map_err(ClientError::Decode)?.1 else {
                return Err(ClientError::Unexpected("not Rreaddir".into()));
            };
            let entries = proto::DirEntry::decode_all(data).map_err(ClientError::Decode)?;
            let Some(last) = entries.last() else {
                return Ok(names);
            };
            offset = last.offset;
            names.extend(entries.iter().map(|e| e.name.to_vec()));
        }
    }

    /// `Tclunk`.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn clunk(&mut self, fid: u32) -> CResult<()> {
        self.call(Tmsg::Clunk { fid }).await.map(drop)
    }

    /// Disconnects.
    ///
    /// # Errors
    /// As [`Transport::close`].
    pub async fn close(self) -> CResult<()> {
        self.t.close().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_like_the_kernel() {
        assert_eq!(Options::parse("").unwrap(), Options::default());
        let o = Options::parse("trans=rdma,port=5641,sq=8,rq=4,timeout=500,privport,msize=8192")
            .unwrap();
        assert_eq!(
            o,
            Options {
                port: 5641,
                sq: 8,
                // Never fewer receives than sends.
                rq: 8,
                timeout_ms: 500,
                privport: true,
            }
        );
        for (s, bad) in [
            ("port=x", "port=x"),
            ("port=0", "port=0"),
            ("port=70000", "port=70000"),
            ("sq=0", "sq=0"),
            ("rq=-1", "rq=-1"),
            ("rq", "rq"),
            ("timeout=soon", "timeout=soon"),
            ("privport=1", "privport=1"),
            ("sq=4,rq=x", "rq=x"),
        ] {
            let e = Options::parse(s).unwrap_err();
            assert_eq!(e.option, bad, "{s}");
            assert!(e.to_string().contains(bad));
        }
    }
}
