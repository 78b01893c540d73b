//! `rdma-trace`: RDMA traffic from a packet capture, packet by packet or as messages.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::mpsc::Receiver;

use rdma_trace::bytes::hex;
use rdma_trace::cm::CmMessage;
use rdma_trace::iwarp::{self, MpaUnit, Pdu};
use rdma_trace::reasm::{Assembler, Limits, Message};
use rdma_trace::rpc::{Rpc, Tracker};
use rdma_trace::{decode, for_each_frame, CaptureError, Decoded, RocePacket};
use serde::Serialize;

const USAGE: &str = "\
Usage: rdma-trace COMMAND [OPTIONS] FILE

Commands:
  show      one line per RDMA packet (RoCEv2, IB CM on QP1) or iWARP unit
            (MPA Request/Reply, FPDU with its DDP and RDMAP headers)
  messages  packets reassembled into messages: SEND, WRITE, READ, atomics, with
            their length and the SHA-256 of their payload; incomplete ones say why
  rpc       RPC-over-RDMA: calls paired with their replies by XID, with their chunks
            (read, write, reply) reassembled from the RDMA READs and WRITEs that moved
            them, their sizes and digests; incomplete ones say why

Options:
  --json          one JSON object per line
  --qp QPN        only this QP (destination QP, or UD source QP); decimal or 0x hex
                  (show, messages; RoCE only: iWARP has no QP numbers)
  --conn IP[,IP]  only traffic from or to IP (with two, only between them)
  --op NAME       only opcodes (show) or kinds (messages) whose name contains NAME
  --threads N     rpc: 1 decodes, reassembles and hashes on one thread; 2 (the default)
                  decodes and reassembles on a second one (the output is the same)
  -h, --help      this text

FILE is a pcap or pcapng capture; `-` reads standard input. iWARP is found in any TCP
connection that starts with an MPA Request (the capture must hold its start).
";

#[derive(Default)]
struct Filter {
    qp: Option<u32>,
    conn: Vec<IpAddr>,
    op: Option<String>,
}

impl Filter {
    fn addrs(&self, src: IpAddr, dst: IpAddr) -> bool {
        match self.conn.as_slice() {
            [] => true,
            [a] => src == *a || dst == *a,
            [a, b, ..] => (src == *a && dst == *b) || (src == *b && dst == *a),
        }
    }

    fn name(&self, name: &str) -> bool {
        self.op.as_deref().is_none_or(|want| {
            name.to_ascii_uppercase()
                .contains(&want.to_ascii_uppercase())
        })
    }

    fn packet(&self, p: &RocePacket<'_>) -> bool {
        self.addrs(p.src, p.dst)
            && self
                .qp
                .is_none_or(|q| p.ib.bth.dest_qp == q || p.ib.deth.is_some_and(|d| d.src_qp == q))
            && self.name(p.ib.op.name())
    }

    fn pdu(&self, p: &Pdu) -> bool {
        self.addrs(p.src, p.dst) && self.qp.is_none() && self.name(pdu_name(p))
    }

    fn message(&self, m: &Message) -> bool {
        self.addrs(m.flow.src, m.flow.dst)
            && self
                .qp
                .is_none_or(|q| m.tcp_ports.is_none() && (m.flow.qp == q || m.src_qp == Some(q)))
            && self.name(m.kind.name())
    }
}

struct Args {
    command: String,
    json: bool,
    filter: Filter,
    file: String,
    threads: usize,
}

fn parse_qp(s: &str) -> Result<u32, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    };
    v.map_err(|_| format!("--qp: '{s}' is not a QP number"))
}

fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut it = args.iter();
    let command = it.next().ok_or("no command given")?.clone();
    if !["show", "messages", "rpc"].contains(&command.as_str()) {
        return Err(format!("unknown command '{command}'"));
    }
    let mut json = false;
    let mut threads = 2;
    let mut filter = Filter::default();
    let mut file = None;
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().cloned().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--json" => json = true,
            "--qp" => filter.qp = Some(parse_qp(&value("--qp")?)?),
            "--conn" => {
                for ip in value("--conn")?.split(',') {
                    filter.conn.push(
                        ip.parse()
                            .map_err(|_| format!("--conn: '{ip}' is not an IP address"))?,
                    );
                }
            }
            "--op" => filter.op = Some(value("--op")?),
            "--threads" => {
                let v = value("--threads")?;
                threads = match v.parse() {
                    Ok(n @ 1..=2) => n,
                    _ => return Err(format!("--threads: '{v}' is not 1 or 2")),
                };
            }
            "-" => file = Some("-".to_string()),
            s if s.starts_with('-') => return Err(format!("unknown option '{s}'")),
            s => {
                if file.replace(s.to_string()).is_some() {
                    return Err("more than one FILE".into());
                }
            }
        }
    }
    Ok(Args {
        command,
        json,
        filter,
        file: file.ok_or("no FILE given")?,
        threads,
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let args = match parse_args(&args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rdma-trace: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let stdout = std::io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    let result = if args.file == "-" {
        run(&args, std::io::stdin(), &mut out)
    } else {
        match File::open(&args.file) {
            Ok(f) => run(&args, f, &mut out),
            Err(e) => {
                eprintln!("rdma-trace: {}: {e}", args.file);
                return ExitCode::FAILURE;
            }
        }
    };
    if let Err(e) = out.flush() {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("rdma-trace: writing: {e}");
            return ExitCode::FAILURE;
        }
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A capture cut short (a capture still being written, a killed tcpdump): what was
        // there has been decoded; say so, but it is not a failure of the tool.
        Err(e @ CaptureError::Truncated { .. }) => {
            eprintln!("rdma-trace: warning: {e}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rdma-trace: {}: {e}", args.file);
            ExitCode::FAILURE
        }
    }
}

fn run<R: std::io::Read + Send>(
    args: &Args,
    input: R,
    out: &mut impl Write,
) -> Result<(), CaptureError> {
    if args.command == "rpc" {
        return run_rpc(args, input, out);
    }
    let mut asm = Assembler::new();
    let mut iw = iwarp::Decoder::new();
    let mut iasm = iwarp::Assembler::new();
    let mut write_failed = false;
    let mut last_time = 0.0;
    let messages = args.command == "messages";
    let r = for_each_frame(input, |frame| {
        if write_failed {
            return;
        }
        last_time = frame.time;
        let d = decode(frame.linktype, frame.data);
        let mut res = Ok(());
        if let Decoded::Tcp(seg) = &d {
            iw.push(frame.number, seg, &mut |p, payload| {
                if messages {
                    iasm.push(p, payload);
                } else if args.filter.pdu(p) && res.is_ok() {
                    res = print_pdu(out, p, frame.time, args.json);
                }
            });
        }
        if messages {
            if let Decoded::Roce(p) = &d {
                asm.push(frame.number, p);
            }
            res = res.and_then(|()| {
                asm.drain()
                    .chain(iasm.drain())
                    .filter(|m| args.filter.message(m))
                    .try_for_each(|m| print_message(out, &m, args.json))
            });
        } else if !matches!(d, Decoded::Tcp(_)) {
            res = print_packet(out, &frame, &d, args);
        }
        write_failed = res.is_err();
    });
    if write_failed {
        return r.map(|_| ());
    }
    let mut res = Ok(());
    iw.finish(&mut |p, payload| {
        if messages {
            iasm.push(p, payload);
        } else if args.filter.pdu(p) && res.is_ok() {
            res = print_pdu(out, p, last_time, args.json);
        }
    });
    if messages {
        asm.finish();
        iasm.finish();
        for m in asm.drain().chain(iasm.drain()) {
            if args.filter.message(&m) {
                res = res.and_then(|()| print_message(out, &m, args.json));
            }
        }
        let s = asm.stats();
        eprintln!(
            "rdma-trace: {} RoCE packets, {} messages complete, {} incomplete, {} duplicate and {} out-of-order packets, {} ACKs, {} NAKs",
            s.packets, s.complete, s.incomplete, s.duplicates, s.out_of_order, s.acks, s.naks
        );
        let i = iasm.stats();
        if i.segments > 0 {
            eprintln!(
                "rdma-trace: {} iWARP DDP segments, {} messages complete, {} incomplete, {} duplicate and {} out-of-order segments, {} Terminates",
                i.segments, i.complete, i.incomplete, i.duplicates, i.out_of_order, i.terminates
            );
        }
        Bounds { roce: s, iwarp: i }.report(0);
    }
    let t = iw.stats();
    if t.connections > 0 {
        eprintln!(
            "rdma-trace: {} iWARP connections, {} FPDUs ({} CRC errors); TCP: {} retransmitted, {} overlapping and {} out-of-order segments, {} bytes missing",
            t.connections, t.fpdus, t.crc_errors, t.retransmitted, t.overlapping, t.out_of_order, t.lost_bytes
        );
    }
    let _ = res;
    r.map(|_| ())
}

fn pdu_name(p: &Pdu) -> &'static str {
    match &p.unit {
        MpaUnit::Frame(f) if f.request => "MPA_REQUEST",
        MpaUnit::Frame(_) => "MPA_REPLY",
        MpaUnit::Fpdu(f) => f.ddp.as_ref().map_or("FPDU", |d| d.op_name()),
        MpaUnit::Lost { .. } => "MPA_LOST",
    }
}

#[derive(Serialize)]
struct PduJson<'a> {
    time: f64,
    transport: &'static str,
    op: &'static str,
    #[serde(flatten)]
    pdu: &'a Pdu,
}

fn print_pdu(out: &mut impl Write, p: &Pdu, time: f64, json: bool) -> std::io::Result<()> {
    if json {
        let j = PduJson {
            time,
            transport: "iWARP",
            op: pdu_name(p),
            pdu: p,
        };
        serde_json::to_writer(&mut *out, &j)?;
        return writeln!(out);
    }
    write!(
        out,
        "{} {time:.6} {}:{} -> {}:{} iWARP {}",
        p.frame,
        p.src,
        p.src_port,
        p.dst,
        p.dst_port,
        pdu_name(p)
    )?;
    match &p.unit {
        MpaUnit::Frame(f) => {
            write!(
                out,
                " M={} C={} R={} rev={}",
                u8::from(f.markers),
                u8::from(f.crc),
                u8::from(f.reject),
                f.rev
            )?;
            if !f.private.is_empty() {
                write!(out, " private={}", hex(&f.private))?;
            }
        }
        MpaUnit::Fpdu(f) => {
            if let Some(d) = &f.ddp {
                if let (Some(stag), Some(to)) = (d.stag, d.to) {
                    write!(out, " stag=0x{stag:08x} to=0x{to:x}")?;
                }
                if let (Some(qn), Some(msn), Some(mo)) = (d.qn, d.msn, d.mo) {
                    write!(out, " qn={qn} msn={msn} mo={mo}")?;
                }
                if matches!(d.opcode, 4 | 6) {
                    if let Some(i) = d.rsvd_ulp {
                        write!(out, " invalidate=0x{i:08x}")?;
                    }
                }
                if let Some(r) = d.read {
                    write!(
                        out,
                        " sink=0x{:08x}:0x{:x} size={} src=0x{:08x}:0x{:x}",
                        r.sink_stag, r.sink_to, r.size, r.src_stag, r.src_to
                    )?;
                }
                if let Some(t) = &d.terminate {
                    write!(
                        out,
                        " layer={} etype={} code=0x{:02x}",
                        t.layer, t.etype, t.code
                    )?;
                }
                if d.payload_len > 0 {
                    write!(out, " len={}", d.payload_len)?;
                }
                if d.last {
                    write!(out, " L")?;
                }
            }
            if let Some(e) = &f.ddp_error {
                write!(out, " {e}")?;
            }
            if !f.markers.is_empty() {
                write!(out, " markers={}", f.markers.len())?;
            }
            if f.crc_ok == Some(false) {
                write!(out, " CRC-BAD")?;
            }
        }
        MpaUnit::Lost { why } => write!(out, " {why}")?,
    }
    writeln!(out)
}

/// Payload kept per message for the RPC layer: RPC-over-RDMA moves at most a few MiB per
/// RDMA operation (NFS: 1 MiB), and only messages being reassembled hold it.
const RPC_KEEP: u64 = 16 << 20;

/// Reassembled messages handed from the decoding thread to the RPC thread at a time: a batch
/// goes once it holds this much payload (or [`BATCH_MESSAGES`] messages).
const BATCH_BYTES: usize = 1 << 20;
const BATCH_MESSAGES: usize = 256;
/// Batches in flight between the two threads. With [`BATCH_BYTES`] this bounds what the
/// pipeline adds to memory: a few batches, each at most one message over the threshold. On a
/// busy host, every time one thread waits for the other it waits for the scheduler too: with
/// 64 KiB batches and 4 in flight, the two threads together got less of a host at load 17
/// than tshark's one (7-11 s of wall time for 1.3 s of CPU time).
const BATCH_QUEUE: usize = 8;
/// Payload buffers on their way back to the decoder for reuse.
const SPARES: usize = 64;

/// Decode and RDMA reassembly of a capture into messages, handed to `emit` in capture order
/// (the order `rpc` must see them in): the first half of `rpc`, whichever thread it runs on.
/// `emit` returns false when the consumer has stopped; the rest of the capture is then read
/// without decoding it. Payload buffers the consumer is done with come back through `spares`
/// to be reused.
fn rpc_messages<R: std::io::Read + Send>(
    input: R,
    spares: &Receiver<Vec<u8>>,
    mut emit: impl FnMut(Message) -> bool,
) -> Result<Bounds, CaptureError> {
    let limits = Limits {
        keep_data: RPC_KEEP,
        // The tracker hashes chunks; hashing each WRITE and READ as well doubled the cost.
        hash_kept: false,
        ..Limits::default()
    };
    let mut asm = Assembler::with_limits(limits);
    let mut iw = iwarp::Decoder::new();
    let mut iasm = iwarp::Assembler::with_limits(limits);
    let mut stopped = false;
    let r = for_each_frame(input, |frame| {
        if stopped {
            return;
        }
        match decode(frame.linktype, frame.data) {
            Decoded::Roce(p) => {
                // Only a FIRST or ONLY packet opens a message and takes a buffer: looking at
                // the channel on every packet cost 1% of `rpc --threads 1`.
                if matches!(
                    p.ib.op.position(),
                    Some(rdma_trace::ib::Position::First | rdma_trace::ib::Position::Only)
                ) {
                    for b in spares.try_iter() {
                        asm.recycle(b);
                    }
                }
                asm.push(frame.number, &p);
                stopped = !asm.drain().all(&mut emit);
            }
            Decoded::Tcp(seg) => {
                iw.push(frame.number, &seg, &mut |p, payload| iasm.push(p, payload));
                stopped = !iasm.drain().all(&mut emit);
            }
            _ => {}
        }
    });
    if !stopped {
        asm.finish();
        iw.finish(&mut |p, payload| iasm.push(p, payload));
        iasm.finish();
        let _ = asm.drain().chain(iasm.drain()).all(&mut emit);
    }
    r.map(|_| Bounds {
        roce: asm.stats(),
        iwarp: iasm.stats(),
    })
}

/// What the reassemblers gave up or left out to stay within their memory bounds.
struct Bounds {
    roce: rdma_trace::reasm::Stats,
    iwarp: iwarp::AssemblerStats,
}

impl Bounds {
    /// A line on standard error saying what was dropped to stay in bounds, when anything was
    /// (`rpc`: also the chunk data the tracker dropped).
    fn report(&self, ahead_dropped: u64) {
        let (r, i) = (&self.roce, &self.iwarp);
        let data = r.data_dropped + i.data_dropped;
        let open = r.open_dropped + i.open_dropped;
        if data + open + r.pending_dropped + ahead_dropped == 0 {
            return;
        }
        eprintln!(
            "rdma-trace: to stay within its memory bounds: {open} open messages given up, {} \
             packets ahead of a gap dropped, {data} messages without their kept payload, \
             {ahead_dropped} chunks' data ahead of a gap dropped (each reported incomplete)",
            r.pending_dropped
        );
    }
}

/// `rpc`: messages into RPCs, printed as they complete. With `threads` > 1, decoding and
/// reassembly run on a second thread, this one tracks RPCs, hashes chunks and prints; the
/// tracker sees the same messages in the same order either way, so the output is the same.
fn run_rpc<R: std::io::Read + Send>(
    args: &Args,
    input: R,
    out: &mut impl Write,
) -> Result<(), CaptureError> {
    // A call's digest with its read chunk spliced in is printed only in JSON: forming it
    // hashes that chunk a second time.
    let mut rpcs = Tracker::new().spliced_digests(args.json);
    let mut write_failed = false;
    let (spare_tx, spares) = std::sync::mpsc::sync_channel(SPARES);
    let mut take = |rpcs: &mut Tracker, m: Message| {
        if write_failed {
            return false;
        }
        rpcs.push(&m);
        if let Some(d) = m.data {
            // Dropped when the decoder has enough.
            let _ = spare_tx.try_send(d);
        }
        write_failed = rpcs
            .drain()
            .filter(|r| args.filter.addrs(r.client, r.server))
            .try_for_each(|r| print_rpc(out, &r, args.json))
            .is_err();
        !write_failed
    };
    let r = if args.threads <= 1 {
        rpc_messages(input, &spares, |m| take(&mut rpcs, m))
    } else {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Message>>(BATCH_QUEUE);
        std::thread::scope(|s| {
            let decoder = s.spawn(move || {
                let mut batch = Vec::new();
                let mut bytes = 0;
                let r = rpc_messages(input, &spares, |m| {
                    bytes += m.data.as_ref().map_or(0, Vec::len);
                    batch.push(m);
                    if bytes < BATCH_BYTES && batch.len() < BATCH_MESSAGES {
                        return true;
                    }
                    bytes = 0;
                    tx.send(std::mem::take(&mut batch)).is_ok()
                });
                if !batch.is_empty() {
                    let _ = tx.send(batch);
                }
                r
            });
            for batch in &rx {
                if !batch.into_iter().all(|m| take(&mut rpcs, m)) {
                    break;
                }
            }
            // The decoder stops at its next send once this end is gone.
            drop(rx);
            decoder
                .join()
                .unwrap_or_else(|e| std::panic::resume_unwind(e))
        })
    };
    if !write_failed {
        rpcs.finish();
        let res = rpcs
            .drain()
            .filter(|r| args.filter.addrs(r.client, r.server))
            .try_for_each(|r| print_rpc(out, &r, args.json));
        let s = rpcs.stats();
        eprintln!(
            "rdma-trace: {} calls, {} replies, {} RPCs complete, {} incomplete, {} other SENDs, {} RDMA operations outside any chunk",
            s.calls, s.replies, s.complete, s.incomplete, s.other_sends, s.unmatched_rdma
        );
        if let Ok(b) = &r {
            b.report(s.ahead_dropped);
        }
        let _ = res;
    }
    r.map(|_| ())
}

fn print_rpc(out: &mut impl Write, r: &Rpc, json: bool) -> std::io::Result<()> {
    if json {
        serde_json::to_writer(&mut *out, r)?;
        return writeln!(out);
    }
    write!(out, "RPC xid=0x{:08x} {} -> {}", r.xid, r.client, r.server)?;
    match (r.program, r.version, r.procedure) {
        (Some(p), Some(v), Some(c)) => write!(out, " prog={p} vers={v} proc={c}")?,
        _ => write!(out, " prog=?")?,
    }
    for (name, side) in [("call", &r.call), ("reply", &r.reply)] {
        if let Some(s) = side {
            write!(
                out,
                " {name}={} frame={} inline={} len={}",
                s.proc, s.frame, s.inline, s.length
            )?;
        }
    }
    if let Some(s) = &r.status {
        write!(out, " status={s}")?;
    }
    if let Some(ops) = &r.nfs_ops {
        write!(out, " ops={}", ops.join(","))?;
    }
    if let Some(s) = r.nfs_status {
        write!(out, " nfs_status={s}")?;
    }
    for c in &r.chunks {
        let kind = match c.kind {
            rdma_trace::rpc::ChunkKind::Read => "read",
            rdma_trace::rpc::ChunkKind::Write => "write",
            rdma_trace::rpc::ChunkKind::Reply => "reply",
        };
        write!(out, " [{kind}")?;
        if let Some(p) = c.position {
            write!(out, "@{p}")?;
        }
        for s in &c.segments {
            write!(out, " 0x{:08x}:{}", s.handle, s.used.unwrap_or(s.offered))?;
        }
        write!(out, " len={}", c.length)?;
        if let Some(h) = &c.sha256 {
            write!(out, " sha256={h}")?;
        }
        write!(out, "]")?;
    }
    if r.retransmissions > 0 {
        write!(out, " retransmitted={}", r.retransmissions)?;
    }
    if let Some(why) = &r.incomplete {
        write!(out, " INCOMPLETE: {why}")?;
    }
    writeln!(out)
}

fn print_message(out: &mut impl Write, m: &Message, json: bool) -> std::io::Result<()> {
    if json {
        serde_json::to_writer(&mut *out, m)?;
        return writeln!(out);
    }
    match m.tcp_ports {
        Some((sp, dp)) => write!(
            out,
            "{} {}:{sp} -> {}:{dp} iWARP",
            m.kind.name(),
            m.flow.src,
            m.flow.dst
        )?,
        None => write!(
            out,
            "{} {} -> {} qp=0x{:06x}",
            m.kind.name(),
            m.flow.src,
            m.flow.dst,
            m.flow.qp
        )?,
    }
    if let Some(q) = m.src_qp {
        write!(out, " src_qp=0x{q:06x}")?;
    }
    if m.tcp_ports.is_some() {
        if m.kind == rdma_trace::reasm::Kind::Send {
            write!(out, " msn={}", m.first_psn)?;
        }
        write!(
            out,
            " frames={}-{} segments={} len={}",
            m.first_frame, m.last_frame, m.packets, m.length
        )?;
    } else {
        write!(
            out,
            " psn={}-{} frames={}-{} packets={} len={}",
            m.first_psn, m.last_psn, m.first_frame, m.last_frame, m.packets, m.length
        )?;
    }
    if let (Some(rkey), Some(va)) = (m.rkey, m.va) {
        let (k, v) = if m.tcp_ports.is_some() {
            ("stag", "to")
        } else {
            ("rkey", "va")
        };
        write!(out, " {k}=0x{rkey:08x} {v}=0x{va:x}")?;
    }
    if let Some(d) = m.dma_len {
        write!(out, " dma_len={d}")?;
    }
    if let Some(i) = m.imm {
        write!(out, " imm=0x{i:08x}")?;
    }
    if let Some(i) = m.invalidate {
        write!(out, " invalidate=0x{i:08x}")?;
    }
    if let Some(a) = m.atomic {
        write!(
            out,
            " swap_add=0x{:x} compare=0x{:x}",
            a.swap_add, a.compare
        )?;
        if let Some(o) = a.original {
            write!(out, " original=0x{o:x}")?;
        }
    }
    if m.duplicates > 0 {
        write!(out, " dup={}", m.duplicates)?;
    }
    if m.out_of_order > 0 {
        write!(out, " reordered={}", m.out_of_order)?;
    }
    if let Some(h) = &m.sha256 {
        write!(out, " sha256={h}")?;
    }
    if let Some(why) = &m.incomplete {
        write!(out, " INCOMPLETE: {why}")?;
    }
    writeln!(out)
}

#[derive(Serialize)]
struct PacketJson<'a> {
    frame: u64,
    time: f64,
    src: IpAddr,
    dst: IpAddr,
    src_port: u16,
    transport: &'static str,
    op: &'static str,
    bth: rdma_trace::ib::Bth,
    deth: Option<rdma_trace::ib::Deth>,
    xrc_srq: Option<u32>,
    reth: Option<rdma_trace::ib::Reth>,
    aeth: Option<rdma_trace::ib::Aeth>,
    atomic: Option<rdma_trace::ib::AtomicEth>,
    atomic_ack: Option<u64>,
    imm: Option<u32>,
    ieth: Option<u32>,
    payload_len: usize,
    icrc: Option<u32>,
    icrc_ok: Option<bool>,
    truncated: bool,
    cm: Option<&'a rdma_trace::cm::CmMad>,
    cm_error: Option<String>,
}

fn print_packet(
    out: &mut impl Write,
    frame: &rdma_trace::Frame<'_>,
    d: &Decoded<'_>,
    args: &Args,
) -> std::io::Result<()> {
    let p = match d {
        Decoded::Roce(p) => p,
        Decoded::BadRoce { src, dst, error } => {
            if !args.filter.addrs(*src, *dst)
                || args.filter.qp.is_some()
                || args.filter.op.is_some()
            {
                return Ok(());
            }
            if args.json {
                let v = serde_json::json!({
                    "frame": frame.number, "src": src, "dst": dst, "error": error.to_string()
                });
                serde_json::to_writer(&mut *out, &v)?;
                return writeln!(out);
            }
            return writeln!(
                out,
                "{} {:.6} {src} -> {dst} RoCEv2 {error}",
                frame.number, frame.time
            );
        }
        Decoded::Tcp(_) | Decoded::Other | Decoded::NotIp(_) => return Ok(()),
    };
    if !args.filter.packet(p) {
        return Ok(());
    }
    let ib = &p.ib;
    if args.json {
        let (cm, cm_error) = match &p.cm {
            Some(Ok(c)) => (Some(&**c), None),
            Some(Err(s)) => (
                None,
                Some(format!(
                    "truncated {}: {} of {} bytes",
                    s.what, s.have, s.need
                )),
            ),
            None => (None, None),
        };
        let j = PacketJson {
            frame: frame.number,
            time: frame.time,
            src: p.src,
            dst: p.dst,
            src_port: p.src_port,
            transport: ib.transport.name(),
            op: ib.op.name(),
            bth: ib.bth,
            deth: ib.deth,
            xrc_srq: ib.xrc_srq,
            reth: ib.reth,
            aeth: ib.aeth,
            atomic: ib.atomic,
            atomic_ack: ib.atomic_ack,
            imm: ib.imm,
            ieth: ib.ieth,
            payload_len: ib.payload.len(),
            icrc: ib.icrc,
            icrc_ok: p.icrc_ok,
            truncated: !p.complete,
            cm,
            cm_error,
        };
        serde_json::to_writer(&mut *out, &j)?;
        return writeln!(out);
    }
    write!(
        out,
        "{} {:.6} {} -> {} {} {} qp=0x{:06x} psn={}",
        frame.number,
        frame.time,
        p.src,
        p.dst,
        ib.transport.name(),
        ib.op.name(),
        ib.bth.dest_qp,
        ib.bth.psn
    )?;
    if ib.bth.ack_req {
        write!(out, " A")?;
    }
    if ib.bth.se {
        write!(out, " SE")?;
    }
    if let Some(d) = ib.deth {
        write!(out, " qkey=0x{:08x} src_qp=0x{:06x}", d.qkey, d.src_qp)?;
    }
    if let Some(x) = ib.xrc_srq {
        write!(out, " xrc_srq=0x{x:06x}")?;
    }
    if let Some(r) = ib.reth {
        write!(
            out,
            " va=0x{:x} rkey=0x{:08x} dma_len={}",
            r.va, r.rkey, r.dma_len
        )?;
    }
    if let Some(a) = ib.atomic {
        write!(
            out,
            " va=0x{:x} rkey=0x{:08x} swap_add=0x{:x} compare=0x{:x}",
            a.va, a.rkey, a.swap_add, a.compare
        )?;
    }
    if let Some(a) = ib.aeth {
        write!(
            out,
            " {} syndrome=0x{:02x} msn={}",
            a.kind(),
            a.syndrome,
            a.msn
        )?;
    }
    if let Some(o) = ib.atomic_ack {
        write!(out, " original=0x{o:x}")?;
    }
    if let Some(i) = ib.imm {
        write!(out, " imm=0x{i:08x}")?;
    }
    if let Some(i) = ib.ieth {
        write!(out, " invalidate=0x{i:08x}")?;
    }
    if !ib.payload.is_empty() {
        write!(out, " len={}", ib.payload.len())?;
    }
    match (p.complete, p.icrc_ok) {
        (false, _) => write!(out, " TRUNCATED")?,
        (true, Some(false)) => write!(out, " ICRC-BAD")?,
        _ => {}
    }
    match &p.cm {
        Some(Ok(c)) => write_cm(out, &c.message)?,
        Some(Err(s)) => write!(
            out,
            " CM truncated {}: {} of {} bytes",
            s.what, s.have, s.need
        )?,
        None => {}
    }
    writeln!(out)
}

fn write_cm(out: &mut impl Write, m: &CmMessage) -> std::io::Result<()> {
    write!(out, " CM {}", m.name())?;
    let private = match m {
        CmMessage::Req {
            local_comm_id,
            service_id,
            local_qpn,
            starting_psn,
            ip,
            private,
            ..
        } => {
            write!(
                out,
                " comm=0x{local_comm_id:08x} service=0x{service_id:016x} qpn=0x{local_qpn:06x} start_psn={starting_psn}"
            )?;
            if let Some(ip) = ip {
                write!(out, " rdma_cm {}:{} -> {}", ip.src, ip.src_port, ip.dst)?;
                // rdma_cm's 36-byte header comes before the application's data.
                return write_private(out, private.get(36..).unwrap_or(&[]));
            }
            private
        }
        CmMessage::Rep {
            local_comm_id,
            remote_comm_id,
            local_qpn,
            starting_psn,
            private,
            ..
        } => {
            write!(
                out,
                " comm=0x{local_comm_id:08x} remote=0x{remote_comm_id:08x} qpn=0x{local_qpn:06x} start_psn={starting_psn}"
            )?;
            private
        }
        CmMessage::Rej {
            local_comm_id,
            remote_comm_id,
            reason,
            private,
            ..
        } => {
            write!(
                out,
                " comm=0x{local_comm_id:08x} remote=0x{remote_comm_id:08x} reason={reason}"
            )?;
            private
        }
        CmMessage::Dreq {
            local_comm_id,
            remote_comm_id,
            remote_qpn,
            private,
        } => {
            write!(
                out,
                " comm=0x{local_comm_id:08x} remote=0x{remote_comm_id:08x} remote_qpn=0x{remote_qpn:06x}"
            )?;
            private
        }
        CmMessage::Rtu {
            local_comm_id,
            remote_comm_id,
            private,
        }
        | CmMessage::Drep {
            local_comm_id,
            remote_comm_id,
            private,
        }
        | CmMessage::Mra {
            local_comm_id,
            remote_comm_id,
            private,
        } => {
            write!(
                out,
                " comm=0x{local_comm_id:08x} remote=0x{remote_comm_id:08x}"
            )?;
            private
        }
        CmMessage::Other { attribute_id } => {
            return write!(out, " attribute=0x{attribute_id:04x}");
        }
    };
    write_private(out, private)
}

/// Private data, without its trailing zeros (most of it is padding).
fn write_private(out: &mut impl Write, p: &[u8]) -> std::io::Result<()> {
    let used = p.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    if used > 0 {
        write!(out, " private={}", hex(&p[..used]))?;
    }
    Ok(())
}
