//! What the capture tests share: the tshark oracle and the message checks.
#![allow(dead_code)] // each test file uses its part

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The tshark fields compared with `rdma-trace show --json`, and where each sits in its JSON.
const FIELDS: &[(&str, &str)] = &[
    ("infiniband.bth.opcode", "bth.opcode"),
    ("infiniband.bth.se", "bth.se"),
    ("infiniband.bth.m", "bth.migreq"),
    ("infiniband.bth.padcnt", "bth.pad"),
    ("infiniband.bth.tver", "bth.tver"),
    ("infiniband.bth.p_key", "bth.pkey"),
    ("infiniband.bth.destqp", "bth.dest_qp"),
    ("infiniband.bth.a", "bth.ack_req"),
    ("infiniband.bth.psn", "bth.psn"),
    ("infiniband.deth.q_key", "deth.qkey"),
    ("infiniband.deth.srcqp", "deth.src_qp"),
    // Wireshark shows the AtomicETH's address and key under the RETH's field names.
    ("infiniband.reth.va", "reth.va|atomic.va"),
    ("infiniband.reth.r_key", "reth.rkey|atomic.rkey"),
    ("infiniband.reth.dmalen", "reth.dma_len"),
    ("infiniband.aeth.syndrome", "aeth.syndrome"),
    ("infiniband.aeth.msn", "aeth.msn"),
    ("infiniband.atomiceth.swapdt", "atomic.swap_add"),
    ("infiniband.atomiceth.cmpdt", "atomic.compare"),
    ("infiniband.atomicacketh.origremdt", "atomic_ack"),
    ("infiniband.immdt", "imm"),
    ("infiniband.ieth", "ieth"),
    ("infiniband.invariant.crc", "icrc"),
    ("infiniband.mad.attributeid", "cm.header.attribute_id"),
    ("infiniband.mad.transactionid", "cm.header.transaction_id"),
    ("infiniband.cm.req.localqpn", "cm.message.local_qpn@REQ"),
    ("infiniband.cm.req.startpsn", "cm.message.starting_psn@REQ"),
    ("infiniband.cm.req.serviceid", "cm.message.service_id@REQ"),
    (
        "infiniband.cm.req.ip_cm.sport",
        "cm.message.ip.src_port@REQ",
    ),
    ("infiniband.cm.rep.localqpn", "cm.message.local_qpn@REP"),
    ("infiniband.cm.rep.startpsn", "cm.message.starting_psn@REP"),
    (
        "infiniband.cm.rep.remotecommid",
        "cm.message.remote_comm_id@REP",
    ),
    (
        "infiniband.cm.rtu.localcommid",
        "cm.message.local_comm_id@RTU",
    ),
    (
        "infiniband.cm.dreq.localcommid",
        "cm.message.local_comm_id@DREQ",
    ),
    (
        "infiniband.cm.drsp.localcommid",
        "cm.message.local_comm_id@DREP",
    ),
];

/// The fields tshark prints as bytes (hex without a prefix).
const BYTES_FIELDS: &[&str] = &["infiniband.immdt", "infiniband.ieth"];

/// A tshark value as a number: decimal, 0x hex, a boolean, or hex bytes (with or without ':').
fn tshark_number(v: &str) -> Option<u64> {
    let v = v.trim();
    if v.is_empty() {
        return None;
    }
    match v {
        "True" | "true" => return Some(1),
        "False" | "false" => return Some(0),
        _ => {}
    }
    if let Some(h) = v.strip_prefix("0x") {
        return u64::from_str_radix(h, 16).ok();
    }
    if let Ok(n) = v.parse() {
        return Some(n);
    }
    u64::from_str_radix(&v.replace(':', ""), 16).ok()
}

fn json_number(pkt: &Value, path: &str) -> Option<u64> {
    // `a|b`: the first of the two that the packet has.
    if let Some((first, second)) = path.split_once('|') {
        return json_number(pkt, first).or_else(|| json_number(pkt, second));
    }
    let (path, msg) = match path.split_once('@') {
        Some((p, m)) => (p, Some(m)),
        None => (path, None),
    };
    if let Some(m) = msg {
        if pkt.pointer("/cm/message/msg").and_then(Value::as_str) != Some(m) {
            return None;
        }
    }
    let ptr = format!("/{}", path.replace('.', "/"));
    match pkt.pointer(&ptr)? {
        Value::Bool(b) => Some(u64::from(*b)),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

pub fn trace_json(cmd: &str, file: &Path) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_rdma-trace"))
        .args([cmd, "--json"])
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rdma-trace {cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Every packet's fields from tshark equal rdma-trace's; returns the packets, by frame number,
/// and each frame's payload as tshark shows it (hex), for the digests.
pub fn compare_with_tshark(file: &Path) -> (HashMap<u64, Value>, HashMap<u64, Vec<u8>>) {
    let mut cmd = Command::new("tshark");
    cmd.args(["-r"]).arg(file).args([
        "--disable-heuristic",
        "rpcrdma_infiniband",
        "-T",
        "fields",
        "-E",
        "separator=/t",
        "-E",
        "occurrence=f",
        "-e",
        "frame.number",
        "-e",
        "infiniband.payload",
        "-e",
        "data.data",
    ]);
    for (f, _) in FIELDS {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let ours: HashMap<u64, Value> = trace_json("show", file)
        .into_iter()
        .map(|p| (p["frame"].as_u64().unwrap(), p))
        .collect();
    let mut payloads = HashMap::new();
    let mut rows = 0;
    for line in text.lines() {
        let cols: Vec<&str> = line.split('\t').collect();
        let frame: u64 = cols[0].parse().unwrap();
        rows += 1;
        let pkt = ours
            .get(&frame)
            .unwrap_or_else(|| panic!("frame {frame}: tshark decodes it, rdma-trace does not"));
        assert_eq!(
            pkt["icrc_ok"],
            Value::Bool(true),
            "frame {frame}: ICRC check failed"
        );
        let hexdata = if cols[1].is_empty() { cols[2] } else { cols[1] };
        let bytes: Vec<u8> = (0..hexdata.len() / 2)
            .map(|i| u8::from_str_radix(&hexdata[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        payloads.insert(frame, bytes);
        for (i, (field, path)) in FIELDS.iter().enumerate() {
            let col = cols.get(i + 3).copied().unwrap_or("");
            // FT_BYTES fields print as bare hex ("00000691"): never read them as decimal.
            let theirs = if BYTES_FIELDS.contains(field) {
                col.split(',')
                    .next()
                    .filter(|v| !v.is_empty())
                    .and_then(|v| u64::from_str_radix(&v.replace(':', ""), 16).ok())
            } else {
                tshark_number(col)
            };
            let mine = json_number(pkt, path);
            assert_eq!(
                mine, theirs,
                "frame {frame}: {field} is {theirs:?} in tshark, {mine:?} in rdma-trace ({path})"
            );
        }
    }
    assert_eq!(
        rows,
        ours.len(),
        "tshark and rdma-trace see different packet counts"
    );
    assert!(rows > 0, "empty capture");
    (ours, payloads)
}

pub fn sha(b: &[u8]) -> String {
    rdma_trace::bytes::hex(&Sha256::digest(b))
}

/// The reassembled messages of `file`, each checked complete and with a digest equal to the
/// SHA-256 of tshark's payloads of its packets in PSN order.
pub fn messages(
    file: &Path,
    payloads: &HashMap<u64, Vec<u8>>,
    pkts: &HashMap<u64, Value>,
) -> Vec<Value> {
    let msgs = trace_json("messages", file);
    // Payload by (src, dst, qp, psn), first copy seen.
    let mut by_psn: HashMap<(String, String, u64, u64), Vec<u8>> = HashMap::new();
    let mut frames: Vec<&u64> = pkts.keys().collect();
    frames.sort();
    for f in frames {
        let p = &pkts[f];
        let key = (
            p["src"].as_str().unwrap().to_string(),
            p["dst"].as_str().unwrap().to_string(),
            p["bth"]["dest_qp"].as_u64().unwrap(),
            p["bth"]["psn"].as_u64().unwrap(),
        );
        by_psn.entry(key).or_insert_with(|| payloads[f].clone());
    }
    for m in &msgs {
        if !m["incomplete"].is_null() {
            panic!("incomplete message: {m}");
        }
        // Atomics have no digest; tshark shows QP1's MADs as fields, not as a payload.
        if m["sha256"].is_null() || m["flow"]["qp"] == 1 {
            continue;
        }
        let (first, last) = (
            m["first_psn"].as_u64().unwrap(),
            m["last_psn"].as_u64().unwrap(),
        );
        let mut data = Vec::new();
        let mut psn = first;
        loop {
            let key = (
                m["flow"]["src"].as_str().unwrap().to_string(),
                m["flow"]["dst"].as_str().unwrap().to_string(),
                m["flow"]["qp"].as_u64().unwrap(),
                psn,
            );
            data.extend_from_slice(by_psn.get(&key).expect("tshark saw the packet"));
            if psn == last {
                break;
            }
            psn = (psn + 1) & 0xff_ffff;
        }
        assert_eq!(m["length"].as_u64().unwrap(), data.len() as u64, "{m}");
        assert_eq!(m["sha256"].as_str().unwrap(), sha(&data), "{m}");
    }
    msgs
}

pub fn of_kind<'a>(msgs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    msgs.iter().filter(|m| m["kind"] == kind).collect()
}

/// The content the NFS capture test writes: deterministic, without repeats (each chunk's digest
/// matches the file at one offset only).
pub fn nfs_content(n: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// `rdma-trace rpc` on an NFSv3-over-RDMA capture of a client writing `content` to a file and
/// reading it back: every call paired with its reply and complete, every reply a success; the
/// data of the WRITE calls' read chunks and of the READ replies' write chunks each tile the file
/// exactly (lengths and digests); and the transport and RPC headers agree with tshark's.
pub fn check_nfs_rpcs(file: &Path, content: &[u8]) -> Vec<Value> {
    let rpcs = check_nfs_chunks(file, content);
    compare_rpc_with_tshark(file, &rpcs);
    rpcs
}

/// The checks of [`check_nfs_rpcs`] without tshark: every RPC paired and complete, the chunks
/// tiling the file.
pub fn check_nfs_chunks(file: &Path, content: &[u8]) -> Vec<Value> {
    let rpcs = trace_json("rpc", file);
    assert!(!rpcs.is_empty(), "no RPC in the capture");
    for r in &rpcs {
        assert!(r["incomplete"].is_null(), "incomplete RPC: {r}");
        assert!(r["call"].is_object() && r["reply"].is_object(), "{r}");
        assert_eq!(r["status"], "SUCCESS", "{r}");
        // The whole call can be formed (inline, or with its read chunk spliced in); the reply
        // too, unless write chunks carried part of it.
        assert!(r["call"]["sha256"].is_string(), "{r}");
        let written = r["chunks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["kind"] == "write" && c["length"].as_u64() > Some(0));
        assert_eq!(r["reply"]["sha256"].is_string(), !written, "{r}");
    }
    // NFSv3 READ (6): the data comes back in write chunks; WRITE (7): it goes in read chunks.
    for (procedure, kind) in [(6, "write"), (7, "read")] {
        let mut chunks: Vec<(usize, String)> = Vec::new();
        for r in rpcs
            .iter()
            .filter(|r| r["program"] == 100_003 && r["procedure"] == procedure)
        {
            for c in r["chunks"].as_array().unwrap() {
                if c["kind"] == kind {
                    let len = c["length"].as_u64().unwrap() as usize;
                    chunks.push((len, c["sha256"].as_str().unwrap().to_string()));
                }
            }
            // The reassembled size: what the SEND carried plus the chunks.
            let side = if kind == "read" {
                &r["call"]
            } else {
                &r["reply"]
            };
            let chunk_bytes: u64 = r["chunks"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|c| c["kind"] == kind)
                .map(|c| c["length"].as_u64().unwrap())
                .sum();
            assert_eq!(
                side["length"].as_u64().unwrap(),
                side["inline"].as_u64().unwrap() + chunk_bytes,
                "{r}"
            );
        }
        assert!(
            !chunks.is_empty(),
            "no NFS procedure {procedure} with a {kind} chunk"
        );
        // Whatever the order of the RPCs, the chunks must cover the file from 0 to its end.
        let mut at = 0;
        while !chunks.is_empty() {
            let i = chunks
                .iter()
                .position(|(len, h)| content.get(at..at + len).is_some_and(|d| sha(d) == *h))
                .unwrap_or_else(|| {
                    panic!("no {kind} chunk holds the file's bytes from {at}: {chunks:?}")
                });
            at += chunks.remove(i).0;
        }
        assert_eq!(at, content.len(), "{kind} chunks cover {at} bytes");
    }
    rpcs
}

fn tshark_list(v: &str) -> Vec<u64> {
    v.split(',').filter_map(tshark_number).collect()
}

/// Every RPC-over-RDMA header tshark decodes is one rdma-trace paired (same frame, XID,
/// procedure, credits, chunk segments; RPC program, version and procedure where tshark shows
/// them), or a retransmission of one; and every call and reply rdma-trace reports is one
/// tshark decodes.
pub fn compare_rpc_with_tshark(file: &Path, rpcs: &[Value]) {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args([
            "-Y",
            "rpcordma",
            "-T",
            "fields",
            "-E",
            "separator=/t",
            "-E",
            "occurrence=a",
            "-E",
            "aggregator=,",
        ])
        .args(
            [
                "frame.number",
                "rpcordma.xid",
                "rpcordma.msg_type",
                "rpcordma.flow_control",
                "rpc.program",
                "rpc.programversion",
                "rpc.procedure",
                "rpcordma.rdma_handle",
                "rpcordma.rdma_length",
            ]
            .iter()
            .flat_map(|f| ["-e", f]),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // frame -> (rpc, is call)
    let mut ours: HashMap<u64, (&Value, bool)> = HashMap::new();
    for r in rpcs {
        ours.insert(r["call"]["frame"].as_u64().unwrap(), (r, true));
        ours.insert(r["reply"]["frame"].as_u64().unwrap(), (r, false));
    }
    let xids: Vec<u64> = rpcs.iter().map(|r| r["xid"].as_u64().unwrap()).collect();
    let (mut matched, mut again) = (0, 0);
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let cols: Vec<&str> = line.split('\t').collect();
        let col = |i: usize| cols.get(i).copied().unwrap_or("");
        let frame: u64 = col(0).parse().unwrap();
        let xid = tshark_number(col(1)).unwrap();
        let Some((r, is_call)) = ours.get(&frame) else {
            // A SEND rdma-trace counted as a retransmission of one it reported.
            assert!(
                xids.contains(&xid),
                "frame {frame}: tshark's xid 0x{xid:x} is in no RPC of rdma-trace"
            );
            again += 1;
            continue;
        };
        matched += 1;
        let side = if *is_call { &r["call"] } else { &r["reply"] };
        assert_eq!(r["xid"].as_u64(), Some(xid), "frame {frame}");
        let msg_type = match side["proc"].as_str().unwrap() {
            "RDMA_MSG" => 0,
            "RDMA_NOMSG" => 1,
            "RDMA_ERROR" => 4,
            p => panic!("frame {frame}: {p}"),
        };
        assert_eq!(
            tshark_number(col(2)),
            Some(msg_type),
            "frame {frame}: msg_type"
        );
        assert_eq!(
            tshark_number(col(3)),
            side["credits"].as_u64(),
            "frame {frame}: credits"
        );
        for (i, name) in [(4, "program"), (5, "version"), (6, "procedure")] {
            if let Some(&theirs) = tshark_list(col(i)).first() {
                assert_eq!(r[name].as_u64(), Some(theirs), "frame {frame}: {name}");
            }
        }
        // The segments the header lists: a call's as offered, a reply's as used.
        let mut segs = Vec::new();
        for c in r["chunks"].as_array().unwrap() {
            if !is_call && c["kind"] == "read" {
                continue;
            }
            for s in c["segments"].as_array().unwrap() {
                let len = if *is_call { &s["offered"] } else { &s["used"] };
                segs.push((s["handle"].as_u64().unwrap(), len.as_u64().unwrap()));
            }
        }
        let theirs: Vec<(u64, u64)> = tshark_list(col(7))
            .into_iter()
            .zip(tshark_list(col(8)))
            .collect();
        assert_eq!(
            segs, theirs,
            "frame {frame}: chunk segments (handle, length)"
        );
    }
    assert_eq!(
        matched,
        ours.len(),
        "tshark decodes {matched} of rdma-trace's {} calls and replies",
        ours.len()
    );
    eprintln!("tshark: {matched} RPC-over-RDMA headers equal, {again} retransmissions");
}

/// The tshark fields compared with the iWARP units of `rdma-trace show --json`, and where each
/// sits in its JSON (a unit without the JSON field has no tshark value either).
const IWARP_FIELDS: &[(&str, &str)] = &[
    ("iwarp_mpa.marker_flag", "markers@frame"),
    ("iwarp_mpa.crc_flag", "crc@frame"),
    ("iwarp_mpa.rej_flag", "reject@frame"),
    ("iwarp_mpa.res", "res"),
    ("iwarp_mpa.rev", "rev"),
    ("iwarp_mpa.ulpdulength", "ulpdu_len"),
    ("iwarp_mpa.crc", "crc@unchecked"),
    ("iwarp_ddp.tagged_flag", "ddp.tagged"),
    ("iwarp_ddp.last_flag", "ddp.last"),
    ("iwarp_ddp.dv", "ddp.dv"),
    ("iwarp_ddp.stag", "ddp.stag"),
    ("iwarp_ddp.tagged_offset", "ddp.to"),
    ("iwarp_ddp.qn", "ddp.qn"),
    ("iwarp_ddp.msn", "ddp.msn"),
    ("iwarp_ddp.mo", "ddp.mo"),
    ("iwarp_rdma.version", "ddp.rv"),
    ("iwarp_rdma.opcode", "ddp.opcode"),
    ("iwarp_rdma.inval_stag", "ddp.rsvd_ulp@inval"),
    ("iwarp_rdma.sinkstag", "ddp.read.sink_stag"),
    ("iwarp_rdma.sinkto", "ddp.read.sink_to"),
    ("iwarp_rdma.rdmardsz", "ddp.read.size"),
    ("iwarp_rdma.srcstag", "ddp.read.src_stag"),
    ("iwarp_rdma.srcto", "ddp.read.src_to"),
    ("iwarp_rdma.term_layer", "ddp.terminate.layer"),
    ("iwarp_rdma.term_errcode", "ddp.terminate.code"),
];

fn iwarp_value(u: &Value, path: &str) -> Option<u64> {
    let (path, cond) = match path.split_once('@') {
        Some((p, c)) => (p, Some(c)),
        None => (path, None),
    };
    match cond {
        Some("frame") if u["mpa"] != "frame" => return None,
        Some("unchecked") if u["mpa"] != "fpdu" || u["crc_ok"].is_boolean() => return None,
        Some("inval") if !matches!(u["ddp"]["opcode"].as_u64(), Some(4 | 6)) => return None,
        _ => {}
    }
    match u.pointer(&format!("/{}", path.replace('.', "/")))? {
        Value::Bool(b) => Some(u64::from(*b)),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

/// Every iWARP unit's fields (MPA frames and FPDUs, DDP and RDMAP headers) from tshark equal
/// rdma-trace's, frame by frame and in order within a frame; private data too; no FPDU fails
/// its CRC. Returns rdma-trace's units.
pub fn compare_iwarp_with_tshark(file: &Path) -> Vec<Value> {
    let mut fields = vec![
        "frame.number",
        "iwarp_mpa.privatedata",
        "iwarp_mpa.crc_check",
    ];
    fields.extend(IWARP_FIELDS.iter().map(|f| f.0));
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args(["-T", "fields", "-E", "separator=/t", "-E", "occurrence=a"])
        .args(["-E", "aggregator=,"])
        .args(fields.iter().flat_map(|f| ["-e", f]))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let units = trace_json("show", file);
    let mut by_frame: HashMap<u64, Vec<&Value>> = HashMap::new();
    for u in &units {
        assert_eq!(u["transport"], "iWARP", "{u}");
        assert_ne!(u["mpa"], "lost", "{u}");
        assert_ne!(u["crc_ok"], Value::Bool(false), "CRC check failed: {u}");
        assert!(u["ddp_error"].is_null(), "{u}");
        by_frame
            .entry(u["frame"].as_u64().unwrap())
            .or_default()
            .push(u);
    }
    let (mut frames, mut compared) = (0, 0);
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let cols: Vec<&str> = line.split('\t').collect();
        if cols.iter().skip(1).all(|c| c.is_empty()) {
            continue;
        }
        let frame: u64 = cols[0].parse().unwrap();
        frames += 1;
        let ours = by_frame
            .remove(&frame)
            .unwrap_or_else(|| panic!("frame {frame}: tshark decodes iWARP, rdma-trace does not"));
        let private: Vec<String> = ours
            .iter()
            .filter(|u| u["mpa"] == "frame" && u["private"] != "")
            .map(|u| u["private"].as_str().unwrap().to_string())
            .collect();
        let theirs: Vec<String> = cols[1]
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| s.replace(':', ""))
            .collect();
        assert_eq!(private, theirs, "frame {frame}: private data");
        // In a connection that uses CRCs tshark shows the CRC field as `crc_check` (and says
        // in its text whether it is good: counted below).
        let checked: Vec<u64> = ours
            .iter()
            .filter(|u| u["crc_ok"].is_boolean())
            .filter_map(|u| u["crc"].as_u64())
            .collect();
        assert_eq!(checked, tshark_list(cols[2]), "frame {frame}: CRCs checked");
        for (i, (field, path)) in IWARP_FIELDS.iter().enumerate() {
            let col = cols.get(i + 3).copied().unwrap_or("");
            let theirs = tshark_list(col);
            let mine: Vec<u64> = ours.iter().filter_map(|u| iwarp_value(u, path)).collect();
            assert_eq!(
                mine, theirs,
                "frame {frame}: {field} is {theirs:?} in tshark, {mine:?} in rdma-trace ({path})"
            );
            compared += mine.len();
        }
    }
    assert!(
        by_frame.is_empty(),
        "rdma-trace decodes iWARP in frames tshark does not: {:?}",
        by_frame.keys().collect::<Vec<_>>()
    );
    assert!(frames > 0, "no iWARP in the capture");
    let good = units.iter().filter(|u| u["crc_ok"] == true).count();
    if good > 0 {
        let text = Command::new("tshark")
            .arg("-r")
            .arg(file)
            .arg("-V")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&text.stdout);
        assert_eq!(
            text.matches("(Good CRC32)").count(),
            good,
            "CRCs tshark finds good"
        );
        assert_eq!(
            text.matches("(Bad CRC32").count(),
            0,
            "CRCs tshark finds bad"
        );
    }
    eprintln!("tshark: {frames} frames of iWARP, {compared} field values equal");
    units
}

/// Every NFSv4 COMPOUND call rdma-trace lists completely has the operations tshark decodes in
/// it (`nfs.opcode`; tshark shows a call whose data came in a read chunk in the frame that
/// completed it, so calls and replies are matched by XID), and its reply's status is tshark's
/// first `nfs.nfsstat4` of the reply. Returns how many calls were compared.
pub fn compare_nfs4_with_tshark(file: &Path, rpcs: &[Value]) -> usize {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args(["-Y", "nfs", "-T", "fields", "-E", "separator=/t"])
        .args(["-E", "occurrence=a", "-E", "aggregator=,"])
        .args(["-e", "rpc.xid", "-e", "rpc.msgtyp"])
        .args(["-e", "nfs.opcode", "-e", "nfs.nfsstat4"])
        .output()
        .unwrap();
    assert!(out.status.success());
    // (xid, call?) -> (operations, statuses), first decoded copy.
    let mut seen: HashMap<(u64, bool), (Vec<u64>, Vec<u64>)> = HashMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let cols: Vec<&str> = line.split('\t').collect();
        let col = |i: usize| tshark_list(cols.get(i).copied().unwrap_or(""));
        let (xids, types) = (col(0), col(1));
        if let (Some(&xid), Some(&t)) = (xids.first(), types.first()) {
            seen.entry((xid, t == 0)).or_insert((col(2), col(3)));
        }
    }
    let mut compared = 0;
    for r in rpcs
        .iter()
        .filter(|r| r["version"] == 4 && r["procedure"] == 1)
    {
        let xid = r["xid"].as_u64().unwrap();
        let ops: Vec<&str> = r["nfs_ops"]
            .as_array()
            .unwrap_or_else(|| panic!("COMPOUND without its operations: {r}"))
            .iter()
            .map(|o| o.as_str().unwrap())
            .collect();
        let (theirs, _) = seen.get(&(xid, true)).cloned().unwrap_or_default();
        let theirs: Vec<&str> = theirs
            .iter()
            .map(|&o| rdma_trace::nfs4::op_name(o as u32))
            .collect();
        if ops.last().is_some_and(|o| o.starts_with('+')) {
            assert!(
                theirs.starts_with(&ops[..ops.len() - 1]),
                "xid 0x{xid:x}: {theirs:?} {r}"
            );
        } else {
            assert_eq!(ops, theirs, "xid 0x{xid:x}: operations");
            compared += 1;
        }
        if let Some(s) = r["nfs_status"].as_u64() {
            let (_, st) = seen.get(&(xid, false)).cloned().unwrap_or_default();
            assert_eq!(st.first(), Some(&s), "xid 0x{xid:x}: COMPOUND status");
        }
    }
    eprintln!("tshark: {compared} COMPOUND calls list the same operations");
    compared
}
