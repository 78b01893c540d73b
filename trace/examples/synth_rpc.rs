//! Writes a synthetic RoCEv2 capture (pcap) of NFSv3 over RPC-over-RDMA to standard output
//! (`rdma_trace::synth::nfs3_rpcs`), for measuring `rdma-trace` on captures larger than the VM
//! can make.
//!
//! Usage: `cargo run --release -p rdma-trace --example synth_rpc -- RPCS > big.pcap`
//! (about 137 KiB of capture per RPC: 7700 RPCs make a gigabyte).

use std::io::BufWriter;

fn main() -> std::io::Result<()> {
    let rpcs: u32 = match std::env::args().nth(1).map(|a| a.parse()) {
        Some(Ok(n)) => n,
        _ => {
            eprintln!("usage: synth_rpc RPCS > FILE.pcap");
            std::process::exit(2);
        }
    };
    let stdout = std::io::stdout();
    rdma_trace::synth::nfs3_rpcs(BufWriter::with_capacity(1 << 20, stdout.lock()), rpcs)?;
    Ok(())
}
