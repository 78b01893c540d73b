//! The printers: one line (or one JSON object) per packet of RoCE or IB CM
//! (`show`), per iWARP unit (`show`), per reassembled message (`messages`)
//! and per RPC (`rpc`), with the CM messages' fields and private data.

use std::io::Write;
use std::net::IpAddr;

use rdma_trace::bytes::hex;
use rdma_trace::cm::CmMessage;
use rdma_trace::iwarp::{MpaUnit, Pdu};
use rdma_trace::reasm::Message;
use rdma_trace::rpc::Rpc;
use rdma_trace::Decoded;
use serde::Serialize;

use super::args::{pdu_name, Args};

#[derive(Serialize)]
struct PduJson<'a> {
    time: f64,
    transport: &'static str,
    op: &'static str,
    #[serde(flatten)]
    pdu: &'a Pdu,
}

pub(crate) fn print_pdu(
    out: &mut impl Write,
    p: &Pdu,
    time: f64,
    json: bool,
) -> std::io::Result<()> {
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

pub(crate) fn print_rpc(out: &mut impl Write, r: &Rpc, json: bool) -> std::io::Result<()> {
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

pub(crate) fn print_message(out: &mut impl Write, m: &Message, json: bool) -> std::io::Result<()> {
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

pub(crate) fn print_packet(
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
