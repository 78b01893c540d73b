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
