//! Host tests on captures the device tests (`capture.rs`) made in ci/vm and that are committed
//! in `tests/data/`: every packet's fields equal tshark's, every ICRC checks, and the messages
//! are what the applications sent.

use std::path::{Path, PathBuf};

use serde_json::Value;

mod common;
use common::{
    check_nfs_rpcs, compare_with_tshark, messages, nfs_content, of_kind, sha, trace_json,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn checked(name: &str) -> Vec<Value> {
    let f = fixture(name);
    let (pkts, payloads) = compare_with_tshark(&f);
    messages(&f, &payloads, &pkts)
}

#[test]
fn rc_pingpong_sends_are_0x7b_buffers() {
    let msgs = checked("rc_pingpong.pcap");
    let sends = of_kind(&msgs, "SEND");
    assert_eq!((msgs.len(), sends.len()), (6, 6));
    for m in sends {
        assert_eq!(m["length"], 3000);
        assert_eq!(m["packets"], 3);
        assert_eq!(m["sha256"].as_str().unwrap(), sha(&[0x7b; 3000]));
    }
}

#[test]
fn ud_pingpong_datagrams_carry_their_source_qp() {
    let msgs = checked("ud_pingpong.pcap");
    assert_eq!(msgs.len(), 6);
    for m in &msgs {
        assert_eq!(m["length"], 500);
        assert!(m["src_qp"].is_u64());
        assert_eq!(m["sha256"].as_str().unwrap(), sha(&[0x7b; 500]));
    }
}

#[test]
fn perftest_messages_have_the_requested_size() {
    for (file, kind) in [
        ("ib_write_bw.pcap", "WRITE"),
        ("ib_read_bw.pcap", "READ"),
        ("ib_send_bw.pcap", "SEND"),
    ] {
        let msgs = checked(file);
        let ms = of_kind(&msgs, kind);
        assert!(ms.len() >= 8, "{file}: {} {kind} messages", ms.len());
        for m in ms {
            assert_eq!(m["length"], 5000, "{file}: {m}");
            if kind != "SEND" {
                assert_eq!(m["dma_len"], 5000, "{file}: {m}");
                assert!(m["rkey"].is_u64() && m["va"].is_u64());
            }
        }
    }
}

#[test]
fn rping_reads_and_writes_back_the_same_buffers_over_a_cm_connection() {
    let msgs = checked("rping.pcap");
    let reads: Vec<&Value> = of_kind(&msgs, "READ");
    let writes: Vec<&Value> = of_kind(&msgs, "WRITE");
    assert_eq!((reads.len(), writes.len()), (3, 3));
    for (r, w) in reads.iter().zip(&writes) {
        assert_eq!(r["length"], 100);
        assert_eq!(r["sha256"], w["sha256"]);
        // The data starts with rping's "rdma-ping-N: " header; the digests differ per ping.
    }
    assert_ne!(reads[0]["sha256"], reads[1]["sha256"]);
    // The READ names the buffer the client advertised in the SEND before it (rping's
    // rping_rdma_info: address, rkey, length, big-endian).
    let pkts = trace_json("show", &fixture("rping.pcap"));
    let cm: Vec<&str> = pkts
        .iter()
        .filter_map(|p| p.pointer("/cm/message/msg").and_then(Value::as_str))
        .collect();
    assert_eq!(cm, ["REQ", "REP", "RTU", "DREQ", "DREP"]);
    let req = pkts[0].pointer("/cm/message/ip").unwrap();
    assert_eq!(
        (req["src"].as_str(), req["dst"].as_str()),
        (Some("10.8.0.1"), Some("10.8.0.2"))
    );
}

/// The kernel's NFSv3 client writing 150000 bytes to the kernel's server over RDMA and reading
/// them back (`capture_nfs3_over_rdma_write_and_read_a_file`): every call paired with its reply,
/// the file whole in the WRITE calls' read chunks and in the READ replies' write chunks, headers
/// equal to tshark's.
#[test]
fn nfs3_over_rdma_rpcs_pair_and_their_chunks_carry_the_file() {
    let f = fixture("nfs3.pcap");
    let (pkts, payloads) = compare_with_tshark(&f);
    messages(&f, &payloads, &pkts);
    let rpcs = check_nfs_rpcs(&f, &nfs_content(150_000));
    assert_eq!(rpcs.len(), 28);
    // One full 128 KiB READ and WRITE, and the 18928-byte tail of each.
    for procedure in [6, 7] {
        let mut lens: Vec<u64> = rpcs
            .iter()
            .filter(|r| r["procedure"] == procedure)
            .flat_map(|r| r["chunks"].as_array().unwrap())
            .map(|c| c["length"].as_u64().unwrap())
            .collect();
        lens.sort();
        assert_eq!(lens, [18928, 131072], "procedure {procedure}");
    }
    // The text form names the chunk and its digest.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rdma-trace"))
        .args(["rpc", "--conn", "10.8.0.2"])
        .arg(&f)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 28);
    assert!(text.contains(&format!(
        "[read@112 0x00000832:18928 len=18928 sha256={}]",
        sha(&nfs_content(150_000)[131_072..])
    )));
}

#[test]
fn filters_select_by_qp_connection_and_opcode() {
    let f = fixture("rping.pcap");
    let run = |args: &[&str]| -> Vec<String> {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_rdma-trace"))
            .args(args)
            .arg(&f)
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(String::from)
            .collect()
    };
    let reads = run(&["show", "--op", "read_req"]);
    assert_eq!(reads.len(), 3);
    assert!(reads.iter().all(|l| l.contains("READ_REQUEST")));
    let qp1 = run(&["show", "--qp", "1"]);
    assert_eq!(qp1.len(), 5);
    let writes = run(&["messages", "--op", "write", "--conn", "10.8.0.2,10.8.0.1"]);
    assert_eq!(writes.len(), 3);
    assert!(run(&["messages", "--conn", "10.9.9.9"]).is_empty());
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_rdma-trace"))
        .args(["show", "--qp", "x"])
        .arg(&f)
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn a_capture_cut_short_is_decoded_up_to_the_cut() {
    let data = std::fs::read(fixture("rc_pingpong.pcap")).unwrap();
    let dir = std::env::temp_dir().join(format!("rdma-trace-cut-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cut = dir.join("cut.pcap");
    std::fs::write(&cut, &data[..data.len() - 500]).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rdma-trace"))
        .args(["messages", "--json"])
        .arg(&cut)
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cut short"), "{stderr}");
    let msgs: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(msgs.len(), 6);
    assert_eq!(msgs.iter().filter(|m| m["incomplete"].is_null()).count(), 5);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// iWARP (siw) captures: every unit equals tshark's decoding; messages complete.
fn iwarp_checked(name: &str) -> Vec<Value> {
    let f = fixture(name);
    common::compare_iwarp_with_tshark(&f);
    let msgs = trace_json("messages", &f);
    for m in &msgs {
        assert!(m["incomplete"].is_null(), "{name}: {m}");
        assert!(m["tcp_ports"].is_array(), "{name}: {m}");
    }
    msgs
}

#[test]
fn iwarp_perftest_messages_have_the_requested_size() {
    for (file, kind) in [
        ("iwarp_ib_write_bw.pcap", "WRITE"),
        ("iwarp_ib_read_bw.pcap", "READ"),
        ("iwarp_ib_send_bw.pcap", "SEND"),
    ] {
        let msgs = iwarp_checked(file);
        let ms: Vec<&Value> = of_kind(&msgs, kind)
            .into_iter()
            .filter(|m| m["length"] == 5000)
            .collect();
        assert!(
            ms.len() >= 8,
            "{file}: {} {kind} messages of 5000 bytes",
            ms.len()
        );
        for m in ms {
            if kind != "SEND" {
                assert!(m["rkey"].is_u64() && m["va"].is_u64(), "{file}: {m}");
            }
            if kind == "READ" {
                assert_eq!(m["dma_len"], 5000, "{file}: {m}");
            }
        }
    }
}

#[test]
fn iwarp_rping_reads_and_writes_back_the_same_buffers() {
    let msgs = iwarp_checked("iwarp_rping.pcap");
    let reads = of_kind(&msgs, "READ");
    let writes = of_kind(&msgs, "WRITE");
    assert_eq!((reads.len(), writes.len()), (3, 3));
    for (r, w) in reads.iter().zip(&writes) {
        assert_eq!(r["length"], 100);
        assert_eq!(r["sha256"], w["sha256"]);
        // The READ moves the client's buffer (the Read Request's data source) to the server.
        assert_eq!(r["flow"]["src"], w["flow"]["dst"]);
    }
    // rping's data: "rdma-ping-N: " and a rotating alphabet, NUL-terminated at 100 bytes.
    for (n, r) in reads.iter().enumerate() {
        let mut b = format!("rdma-ping-{n}: ").into_bytes();
        let mut c = b'A' + n as u8;
        while b.len() < 99 {
            b.push(c);
            c = if c == b'z' { b'A' } else { c + 1 };
        }
        b.push(0);
        assert_eq!(r["sha256"].as_str().unwrap(), sha(&b), "ping {n}");
    }
}

/// Writes `frames` (Ethernet) as a pcap file.
fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let mut f = vec![];
    for x in [0xa1b2_c3d4u32, 0x0004_0002, 0, 0, 0x0004_0000, 1] {
        f.extend_from_slice(&x.to_le_bytes());
    }
    // (major, minor) are two u16s: fix the second word's halves.
    f[4..8].copy_from_slice(&[2, 0, 4, 0]);
    for (i, fr) in frames.iter().enumerate() {
        for x in [i as u32, 0, fr.len() as u32, fr.len() as u32] {
            f.extend_from_slice(&x.to_le_bytes());
        }
        f.extend_from_slice(fr);
    }
    std::fs::write(path, f).unwrap();
}

/// A synthetic iWARP connection with CRCs and markers both ways (siw supports neither, so
/// the VM's captures have none): tshark finds the same units, the same fields and the same
/// CRCs, so the markers' places and the CRC's byte order agree with Wireshark's reading of
/// RFC 5044. Each FPDU has a TCP segment of its own: tshark reads markers only then (the
/// decoder's unit tests cut FPDUs and markers across segments).
#[test]
fn iwarp_crcs_and_markers_agree_with_tshark() {
    use rdma_trace::iwarp::{build_fpdu, build_frame, build_tagged, build_untagged};
    use rdma_trace::net::build_tcp4;
    let (a, b) = ([10, 8, 0, 1], [10, 8, 0, 2]);
    let ports = [(40000u16, 7174u16), (7174, 40000)];
    let ips = [(a, b), (b, a)];
    let frames_ = [
        build_frame(true, true, true, b"req"),
        build_frame(false, true, false, b""),
    ];
    let data: Vec<u8> = (0..7000u32).map(|i| (i * 13 % 251) as u8).collect();
    let mut seq = [1000u32, 5000];
    let mut off = [0u64; 2];
    let mut frames = vec![
        build_tcp4(a, b, ports[0], (seq[0] - 1, 0), 0x02, &[]),
        build_tcp4(b, a, ports[1], (seq[1] - 1, seq[0]), 0x12, &[]),
    ];
    let mut send = |frames: &mut Vec<Vec<u8>>, s: usize, bytes: &[u8]| {
        frames.push(build_tcp4(
            ips[s].0,
            ips[s].1,
            ports[s],
            (seq[s], seq[1 - s]),
            0x18,
            bytes,
        ));
        seq[s] += bytes.len() as u32;
    };
    send(&mut frames, 0, &frames_[0]);
    send(&mut frames, 1, &frames_[1]);
    for (i, len) in [10usize, 600, 1500, 3, 2000, 511, 513].iter().enumerate() {
        for (s, off) in off.iter_mut().enumerate() {
            let ulpdu = if s == 0 {
                build_untagged(3, true, (0, 0, i as u32 + 1, 0), &data[..*len])
            } else {
                build_tagged(0, true, 0x42, 0x1000 * i as u64, &data[..*len])
            };
            let f = build_fpdu(&ulpdu, *off, true, true);
            *off += f.len() as u64;
            send(&mut frames, s, &f);
        }
    }
    let dir = std::env::temp_dir().join(format!("rdma-trace-fixtures-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("iwarp_crc_markers.pcap");
    write_pcap(&file, &frames);
    let units = common::compare_iwarp_with_tshark(&file);
    let marked = units
        .iter()
        .filter(|u| u["markers"].as_array().is_some_and(|m| !m.is_empty()))
        .count();
    assert!(marked >= 10, "{marked} FPDUs with markers");
    assert!(units.iter().filter(|u| u["crc_ok"] == true).count() == 14);
    let msgs = trace_json("messages", &file);
    assert_eq!(msgs.len(), 14);
    for m in &msgs {
        let len = m["length"].as_u64().unwrap() as usize;
        assert_eq!(m["sha256"].as_str().unwrap(), sha(&data[..len]), "{m}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// NFSv3 over iWARP (siw, both ends on 10.8.0.2), the kernel's client and server, writing the
/// same file and reading it back (made in ci/vm by `capture_iwarp_nfs3_write_and_read_a_file`,
/// a device test since taken out: see `tests/capture/iwarp.rs`): every FPDU
/// equal to tshark's decoding, every message complete, every call paired with its reply, the
/// WRITE calls' read chunks (moved by RDMA Read Requests and Responses) and the READ replies'
/// write chunks (RDMA Writes) each tiling the file, RPC-over-RDMA headers equal to tshark's.
#[test]
fn iwarp_nfs3_rpcs_pair_and_their_chunks_carry_the_file() {
    let f = fixture("iwarp_nfs3.pcap");
    iwarp_checked("iwarp_nfs3.pcap");
    let rpcs = check_nfs_rpcs(&f, &nfs_content(150_000));
    assert_eq!(rpcs.len(), 28);
    for procedure in [6, 7] {
        let mut lens: Vec<u64> = rpcs
            .iter()
            .filter(|r| r["procedure"] == procedure)
            .flat_map(|r| r["chunks"].as_array().unwrap())
            .map(|c| c["length"].as_u64().unwrap())
            .collect();
        lens.sort();
        assert_eq!(lens, [18928, 131072], "procedure {procedure}");
    }
}

/// NFSv4.2 over iWARP (made in ci/vm by `capture_iwarp_nfs4_compounds`, since taken out):
/// every RPC complete, the COMPOUNDs'
/// operations and statuses equal to tshark's, the session's life in order.
#[test]
fn iwarp_nfs4_compounds_list_their_operations() {
    let f = fixture("iwarp_nfs4.pcap");
    iwarp_checked("iwarp_nfs4.pcap");
    let rpcs = trace_json("rpc", &f);
    for r in &rpcs {
        assert!(r["incomplete"].is_null(), "{r}");
    }
    assert!(common::compare_nfs4_with_tshark(&f, &rpcs) >= 10);
    let firsts: Vec<&str> = rpcs
        .iter()
        .filter_map(|r| r["nfs_ops"][0].as_str())
        .collect();
    for op in [
        "EXCHANGE_ID",
        "CREATE_SESSION",
        "DESTROY_SESSION",
        "DESTROY_CLIENTID",
    ] {
        assert!(firsts.contains(&op), "no {op}: {firsts:?}");
    }
    let ops: Vec<String> = rpcs
        .iter()
        .filter_map(|r| r["nfs_ops"].as_array())
        .map(|o| {
            o.iter()
                .map(|x| x.as_str().unwrap())
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    for want in ["SEQUENCE,PUTFH,WRITE,GETATTR", "SEQUENCE,PUTFH,READ"] {
        assert!(ops.iter().any(|o| o == want), "no {want}: {ops:?}");
    }
}

/// `rpc` decodes on a second thread by default (`--threads 2`): on every committed capture, in
/// text and JSON, its output and exit status are byte for byte those of `--threads 1`, which
/// does everything on one thread.
#[test]
fn rpc_output_is_the_same_on_one_thread_and_on_two() {
    let run = |threads: &str, json: bool, file: &Path| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_rdma-trace"));
        c.args(["rpc", "--threads", threads]);
        if json {
            c.arg("--json");
        }
        let out = c.arg(file).output().unwrap();
        (out.status.code(), out.stdout, out.stderr)
    };
    let mut rpcs = 0;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 10, "{files:?}");
    for f in &files {
        for json in [false, true] {
            let one = run("1", json, f);
            let two = run("2", json, f);
            assert_eq!(one.0, Some(0), "{f:?}: {}", String::from_utf8_lossy(&one.2));
            assert!(
                one == two,
                "{f:?} (json {json}): --threads 1 and 2 differ:\n{}\n---\n{}",
                String::from_utf8_lossy(&one.1),
                String::from_utf8_lossy(&two.1)
            );
            rpcs += one.1.iter().filter(|&&b| b == b'\n').count();
        }
    }
    // The NFS captures alone hold 105 RPCs (each printed twice: text and JSON).
    assert!(rpcs >= 210, "{rpcs} lines");
}

/// The same on a synthetic capture that takes more batches than the two threads' queue holds
/// (about 11 MiB of chunk data against 8 batches of 1 MiB in flight): every RPC complete, the
/// output of one thread and of two byte for byte the same, in text and JSON.
#[test]
fn rpc_output_is_the_same_on_one_thread_and_on_two_when_the_queue_fills() {
    let dir = std::env::temp_dir().join(format!("rdma-trace-threads-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("synth.pcap");
    let out = std::io::BufWriter::new(std::fs::File::create(&file).unwrap());
    rdma_trace::synth::nfs3_rpcs(out, 90).unwrap();
    let run = |threads: &str, json: bool| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_rdma-trace"));
        c.args(["rpc", "--threads", threads]);
        if json {
            c.arg("--json");
        }
        let out = c.arg(&file).output().unwrap();
        (out.status.code(), out.stdout, out.stderr)
    };
    for json in [false, true] {
        let one = run("1", json);
        let two = run("2", json);
        assert_eq!(one.0, Some(0), "{}", String::from_utf8_lossy(&one.2));
        let text = String::from_utf8(one.1.clone()).unwrap();
        assert_eq!(text.lines().count(), 90);
        assert!(text.lines().all(|l| !l.contains("INCOMPLETE")), "{text}");
        assert!(one == two, "json {json}: --threads 1 and 2 differ");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
