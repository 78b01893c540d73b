//! Times each step of connection setup and teardown over many connections:
//! a port of rdma-core's `cmtime` (the version of rdma-core 44), with the
//! same flags, steps and output.
//!
//! ```text
//! cmtime [-b bind_address] [-p port_number]                       # server, runs until killed
//! cmtime -s server_address [-b bind_address] [-c connections] [-p port_number] [-r retries] [-t timeout_ms]
//! ```
//!
//! The client makes `-c` ids (default 100) on one event channel and takes
//! them through each step together: `create id`, `bind addr` (with `-b`),
//! `resolve addr`, `resolve route`, `create qp`, `connect`, `disconnect`,
//! `destroy`. A thread reads the connection manager's events and stamps the
//! end of the asynchronous steps; the main thread starts each step on every
//! id, then waits until all have finished. The table at the end gives, per
//! step, the time for all connections (ms), the slowest and fastest single
//! connection (ms, us), and the total divided by the number of connections
//! (us).
//!
//! The server accepts every request with a new QP and, when a connection is
//! disconnected, disconnects and destroys it.
//!
//! QPs: as the C tool, one PD (librdmacm's) and one CQ serve every QP;
//! they are made with the first QP, inside its timed `create qp` step, and
//! each QP is made through `rdma_create_qp` (which moves it to INIT). QPs
//! are destroyed just before the `destroy` step, which then times the ids
//! alone, as the C tool's does.

mod common;

use anyhow::{anyhow, Context as _};
use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::args::{ArgError, Cli, Flag, Parsed};
use common::cm::Res;
use common::cmatose::{Lookup, BIND, PORT, SERVER};
use rdma::cm::{CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use rdma::{CompletionQueue, QpType, QueuePair};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(usize)]
enum Step {
    CreateId,
    Bind,
    ResolveAddr,
    ResolveRoute,
    CreateQp,
    Connect,
    Disconnect,
    Destroy,
}

const STEPS: usize = 8;
const STEP_NAMES: [&str; STEPS] = [
    "create id",
    "bind addr",
    "resolve addr",
    "resolve route",
    "create qp",
    "connect",
    "disconnect",
    "destroy",
];

struct Opts {
    dst: Option<String>,
    src: Option<String>,
    port: String,
    connections: usize,
    retries: u32,
    timeout: Duration,
}

const CLI: Cli<'static, char> = Cli {
    name: "cmtime",
    usage: "  cmtime [-b bind_address] [options]                    # server\n  \
            cmtime -s server_address [-b bind_address] [options]  # client",
    flags: &[
        SERVER,
        BIND,
        Flag::value('c', 'c', "", "connections", "connections (default 100)"),
        PORT,
        Flag::value(
            'r',
            'r',
            "",
            "retries",
            "address and route resolution retries (default 2)",
        ),
        Flag::value(
            't',
            't',
            "",
            "timeout_ms",
            "resolution timeout (default 2000)",
        ),
    ],
    bad_exit: 1,
};

fn parse(args: Parsed<char>) -> Result<Opts, ArgError> {
    args.no_operands()?;
    let mut o = Opts {
        dst: None,
        src: None,
        port: "7471".into(),
        connections: 100,
        retries: 2,
        timeout: Duration::from_millis(2000),
    };
    for f in args.flags {
        match f.key {
            's' => o.dst = Some(f.value),
            'b' => o.src = Some(f.value),
            'c' => o.connections = f.number("a count")?,
            'p' => o.port = f.value,
            'r' => o.retries = f.number("a count")?,
            't' => o.timeout = Duration::from_millis(f.number("milliseconds")?),
            _ => unreachable!("the flags of CLI"),
        }
    }
    Ok(o)
}

fn main() -> ExitCode {
    let opts = match CLI.read(parse) {
        Ok(o) => o,
        Err(code) => return code,
    };
    let r = match opts.dst.clone() {
        Some(dst) => run_client(&opts, &dst),
        None => run_server(&opts),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!("{}", common::Report(&e));
            ExitCode::FAILURE
        }
    }
}

/// Start and end stamps (ns since `base`, 0: not taken) per connection and
/// step, plus the step totals; shared with the event thread.
struct Times {
    base: Instant,
    /// `[conn][step][start, end]`, flattened.
    per_conn: Vec<AtomicU64>,
    total: Vec<AtomicU64>,
}

impl Times {
    fn new(conns: usize) -> Times {
        Times {
            base: Instant::now(),
            per_conn: (0..conns * STEPS * 2).map(|_| AtomicU64::new(0)).collect(),
            total: (0..STEPS * 2).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn now(&self) -> u64 {
        // At least 1: 0 means "not taken".
        (self.base.elapsed().as_nanos() as u64).max(1)
    }

    fn start(&self, c: usize, s: Step) {
        self.per_conn[(c * STEPS + s as usize) * 2].store(self.now(), Ordering::Relaxed);
    }

    fn end(&self, c: usize, s: Step) {
        self.per_conn[(c * STEPS + s as usize) * 2 + 1].store(self.now(), Ordering::Relaxed);
    }

    fn start_all(&self, s: Step) {
        self.total[s as usize * 2].store(self.now(), Ordering::Relaxed);
    }

    fn end_all(&self, s: Step) {
        self.total[s as usize * 2 + 1].store(self.now(), Ordering::Relaxed);
    }

    /// `show_perf`: the table of rdma-core's cmtime.
    fn show(&self, conns: usize, bound: bool) {
        println!("step              total ms     max ms     min us  us / conn");
        for (i, name) in STEP_NAMES.iter().enumerate() {
            if i == Step::Bind as usize && !bound {
                continue;
            }
            let (mut max, mut min) = (0f64, 999_999_999f64);
            for c in 0..conns {
                let s = self.per_conn[(c * STEPS + i) * 2].load(Ordering::Relaxed);
                let e = self.per_conn[(c * STEPS + i) * 2 + 1].load(Ordering::Relaxed);
                if s != 0 && e != 0 {
                    let us = (e as f64 - s as f64) / 1000.0;
                    max = max.max(us);
                    min = min.min(us);
                }
            }
            let s = self.total[i * 2].load(Ordering::Relaxed) as f64;
            let e = self.total[i * 2 + 1].load(Ordering::Relaxed) as f64;
            let us = (e - s) / 1000.0;
            println!(
                "{name:<13}: {:11.2}{:11.2}{:11.2}{:11.2}",
                us / 1000.0,
                max / 1000.0,
                min,
                us / conns as f64
            );
        }
    }
}

/// What every connection's QP shares: the PD and one CQ, made when the
/// first QP is (inside that connection's timed `create qp`), as rdma-core's
/// cmtime does (traced in the guest: per connection its `create qp` step
/// makes the QP and moves it to INIT, and one CQ serves all QPs).
struct Verbs {
    pd: rdma::ProtectionDomain,
    cq: CompletionQueue,
}

/// `create_qp` of the C tool: an RC QP of one request and one SGE per
/// queue on the shared CQ, through `rdma_create_qp` (which also moves it to
/// INIT).
fn create_qp(id: &CmId, verbs: &mut Option<Verbs>) -> rdma::Result<QueuePair> {
    let v = match verbs {
        Some(v) => v,
        None => verbs.insert(Verbs {
            pd: id.pd()?,
            cq: id.context()?.create_cq(1, None, 0)?,
        }),
    };
    id.create_qp(
        v.pd.qp_builder(QpType::Rc, &v.cq, &v.cq)
            .max_send_wr(1)
            .max_recv_wr(1)
            .max_send_sge(1)
            .max_recv_sge(1),
    )
}

/// State shared by the main thread and the event thread.
struct Shared {
    times: Times,
    ids: Vec<CmId>,
    index: HashMap<usize, usize>,
    completed: [AtomicUsize; STEPS],
    retries: Vec<AtomicUsize>,
    error: Vec<AtomicBool>,
    src: Option<rdma::cm::CmAddr>,
    dst: rdma::cm::CmAddr,
    timeout: Duration,
    stop: AtomicBool,
}

impl Shared {
    fn done(&self, c: usize, s: Step) {
        self.times.end(c, s);
        self.completed[s as usize].fetch_add(1, Ordering::AcqRel);
    }

    /// `cma_handler` of the client.
    fn handle(&self, e: &rdma::cm::CmEvent) {
        let Some(&c) = self.index.get(&(e.id().as_raw() as usize)) else {
            return;
        };
        match e.event_type() {
            CmEventType::AddrResolved => self.done(c, Step::ResolveAddr),
            CmEventType::RouteResolved => self.done(c, Step::ResolveRoute),
            CmEventType::Established => self.done(c, Step::Connect),
            CmEventType::AddrError => {
                if self.retry(c)
                    && self.ids[c]
                        .resolve_addr(self.src, self.dst, self.timeout)
                        .is_ok()
                {
                    return;
                }
                println!("RDMA_CM_EVENT_ADDR_ERROR, error: {}", e.status());
                self.error[c].store(true, Ordering::Relaxed);
                self.done(c, Step::ResolveAddr);
            }
            CmEventType::RouteError => {
                if self.retry(c) && self.ids[c].resolve_route(self.timeout).is_ok() {
                    return;
                }
                println!("RDMA_CM_EVENT_ROUTE_ERROR, error: {}", e.status());
                self.error[c].store(true, Ordering::Relaxed);
                self.done(c, Step::ResolveRoute);
            }
            CmEventType::ConnectError | CmEventType::Unreachable | CmEventType::Rejected => {
                println!("event: {}, error: {}", e.event_type(), e.status());
                self.error[c].store(true, Ordering::Relaxed);
                self.done(c, Step::Connect);
            }
            CmEventType::Disconnected => self.done(c, Step::Disconnect),
            _ => {}
        }
    }

    fn retry(&self, c: usize) -> bool {
        self.retries[c]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| r.checked_sub(1))
            .is_ok()
    }

    fn failed(&self, c: usize) -> bool {
        self.error[c].load(Ordering::Relaxed)
    }

    /// Waits (yielding, as the C tool does) until `started` ids finished `s`.
    fn wait(&self, s: Step, started: usize) {
        while self.completed[s as usize].load(Ordering::Acquire) < started {
            std::thread::yield_now();
        }
    }
}

fn run_client(o: &Opts, dst: &str) -> Res<()> {
    let n = o.connections;
    let channel = EventChannel::new().context("failed to create event channel")?;
    let times = Times::new(n);
    println!("creating id");
    times.start_all(Step::CreateId);
    let mut ids = Vec::with_capacity(n);
    for c in 0..n {
        times.start(c, Step::CreateId);
        ids.push(
            channel
                .create_id(PortSpace::Tcp)
                .context("rdma_create_id")?,
        );
        times.end(c, Step::CreateId);
    }
    times.end_all(Step::CreateId);

    let addr = Lookup::tcp(o.src.as_deref(), &o.port)
        .rdma_addr(Some(dst))
        .context("getaddrinfo error")?;
    let dst_addr = addr
        .dst
        .context("getaddrinfo error: no destination address")?;
    let index = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_raw() as usize, i))
        .collect();
    let shared = Arc::new(Shared {
        times,
        ids,
        index,
        completed: std::array::from_fn(|_| AtomicUsize::new(0)),
        retries: (0..n).map(|_| AtomicUsize::new(0)).collect(),
        error: (0..n).map(|_| AtomicBool::new(false)).collect(),
        src: addr.src,
        dst: dst_addr,
        timeout: o.timeout,
        stop: AtomicBool::new(false),
    });
    let events = {
        let shared = Arc::clone(&shared);
        let channel = channel.clone();
        std::thread::spawn(move || -> Res<()> {
            while !shared.stop.load(Ordering::Acquire) {
                if let Some(e) = channel
                    .get_event_timeout(Duration::from_millis(50))
                    .context("failure in rdma_get_cm_event in process_server_events")?
                {
                    shared.handle(&e);
                }
            }
            Ok(())
        })
    };
    let s = &*shared;
    let t = &s.times;
    let param = ConnParam {
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: o.retries.min(7) as u8,
        rnr_retry_count: 0,
        ..ConnParam::default()
    };

    if let Some(src) = addr.src.filter(|_| o.src.is_some()) {
        println!("binding source address");
        t.start_all(Step::Bind);
        for (c, id) in s.ids.iter().enumerate() {
            t.start(c, Step::Bind);
            if let Err(e) = id.bind_addr(src) {
                println!("failure bind addr: {e}");
                s.error[c].store(true, Ordering::Relaxed);
                continue;
            }
            t.end(c, Step::Bind);
        }
        t.end_all(Step::Bind);
    }

    println!("resolving address");
    t.start_all(Step::ResolveAddr);
    let mut started = 0;
    for (c, id) in s.ids.iter().enumerate() {
        if s.failed(c) {
            continue;
        }
        s.retries[c].store(o.retries as usize, Ordering::Relaxed);
        t.start(c, Step::ResolveAddr);
        if let Err(e) = id.resolve_addr(s.src, s.dst, o.timeout) {
            println!("failure getting addr: {e}");
            s.error[c].store(true, Ordering::Relaxed);
            continue;
        }
        started += 1;
    }
    s.wait(Step::ResolveAddr, started);
    t.end_all(Step::ResolveAddr);

    println!("resolving route");
    t.start_all(Step::ResolveRoute);
    let mut started = 0;
    for (c, id) in s.ids.iter().enumerate() {
        if s.failed(c) {
            continue;
        }
        s.retries[c].store(o.retries as usize, Ordering::Relaxed);
        t.start(c, Step::ResolveRoute);
        if let Err(e) = id.resolve_route(o.timeout) {
            println!("failure resolving route: {e}");
            s.error[c].store(true, Ordering::Relaxed);
            continue;
        }
        started += 1;
    }
    s.wait(Step::ResolveRoute, started);
    t.end_all(Step::ResolveRoute);

    println!("creating qp");
    t.start_all(Step::CreateQp);
    let mut qps: Vec<Option<QueuePair>> = Vec::with_capacity(n);
    let mut verbs = None;
    for (c, id) in s.ids.iter().enumerate() {
        if s.failed(c) {
            qps.push(None);
            continue;
        }
        t.start(c, Step::CreateQp);
        match create_qp(id, &mut verbs) {
            Ok(q) => qps.push(Some(q)),
            Err(e) => {
                println!("failure creating qp: {e}");
                s.error[c].store(true, Ordering::Relaxed);
                qps.push(None);
                continue;
            }
        }
        t.end(c, Step::CreateQp);
    }
    t.end_all(Step::CreateQp);

    println!("connecting");
    t.start_all(Step::Connect);
    let mut started = 0;
    for (c, id) in s.ids.iter().enumerate() {
        if s.failed(c) {
            continue;
        }
        t.start(c, Step::Connect);
        if let Err(e) = id.connect(&param) {
            println!("failure rconnecting: {e}");
            s.error[c].store(true, Ordering::Relaxed);
            continue;
        }
        started += 1;
    }
    s.wait(Step::Connect, started);
    t.end_all(Step::Connect);

    println!("disconnecting");
    t.start_all(Step::Disconnect);
    let mut started = 0;
    for (c, id) in s.ids.iter().enumerate() {
        if s.failed(c) {
            continue;
        }
        t.start(c, Step::Disconnect);
        let _ = id.disconnect();
        started += 1;
    }
    s.wait(Step::Disconnect, started);
    t.end_all(Step::Disconnect);

    shared.stop.store(true, Ordering::Release);
    events
        .join()
        .map_err(|_| anyhow!("the event thread panicked"))??;
    let Ok(shared) = Arc::try_unwrap(shared) else {
        return Err(anyhow!("the event thread still holds the ids"));
    };
    let Shared { times, ids, .. } = shared;
    // The QPs (and their CQs) go first, outside the timed step: the C tool
    // times rdma_destroy_id alone and leaves its QPs to process exit.
    drop(qps);
    drop(verbs);
    println!("destroying id");
    times.start_all(Step::Destroy);
    for (c, id) in ids.into_iter().enumerate() {
        times.start(c, Step::Destroy);
        drop(id);
        times.end(c, Step::Destroy);
    }
    times.end_all(Step::Destroy);
    // The channel goes after the timed step, as in the C tool
    // (rdma_destroy_event_channel after the loop): had this handle gone
    // first, the last id would close the channel inside its timed destroy.
    drop(channel);
    times.show(n, o.src.is_some());
    Ok(())
}

/// Accepts every connection request and tears down every connection the
/// peer disconnects, until killed (the C tool's server never returns).
fn run_server(o: &Opts) -> Res<()> {
    let channel = EventChannel::new().context("failed to create event channel")?;
    let listener = channel
        .create_id(PortSpace::Tcp)
        .context("listen request failed")?;
    let addr = Lookup::tcp(o.src.as_deref(), &o.port)
        .rdma_addr(None)
        .context("getrdmaaddr error")?;
    listener
        .bind_addr(addr.src.context("bind address failed: no address")?)
        .context("bind address failed")?;
    listener.listen(0).context("failure trying to listen")?;
    let mut conns: HashMap<usize, (CmId, QueuePair)> = HashMap::new();
    let mut verbs = None;
    loop {
        let e = channel
            .get_event()
            .context("failure in rdma_get_cm_event in process_server_events")?;
        match e.event_type() {
            CmEventType::ConnectRequest => {
                let id = e.id().clone();
                drop(e);
                let accepted = create_qp(&id, &mut verbs)
                    .context("failure creating qp")
                    .and_then(|qp| {
                        id.accept(&ConnParam::default())
                            .context("failure accepting")?;
                        Ok(qp)
                    });
                match accepted {
                    Ok(qp) => {
                        let key = id.as_raw() as usize;
                        conns.insert(key, (id, qp));
                    }
                    Err(err) => {
                        println!("{}", common::Report(&err));
                        println!("failing connection request");
                        let _ = id.reject(&[]);
                    }
                }
            }
            CmEventType::Disconnected => {
                let key = e.id().as_raw() as usize;
                drop(e);
                if let Some((id, qp)) = conns.remove(&key) {
                    let _ = id.disconnect();
                    drop(qp);
                    drop(id);
                }
            }
            _ => {}
        }
    }
}
