//! Writes a synthetic RoCEv2 capture (pcap) of NFSv3 over RPC-over-RDMA to standard output
//! (`rdma_trace::synth::nfs3_rpcs`), for measuring `rdma-trace` on captures larger than the VM
//! can make; or one of the hostile captures `rdma_trace::synth` makes (`--hostile`), for
//! measuring what they cost it.
//!
//! Usage: `cargo run --release -p rdma-trace --example synth_rpc -- RPCS > big.pcap`
//! (about 137 KiB of capture per RPC: 7700 RPCs make a gigabyte), or
//! `... -- --hostile writes|iwarp|gap N > hostile.pcap` (N unfinished RDMA WRITEs over RoCE
//! or iWARP, or N calls with 2000 KiB of data each past a gap in its write chunk).

use std::io::BufWriter;

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = || -> ! {
        eprintln!("usage: synth_rpc RPCS > FILE.pcap\n       synth_rpc --hostile writes|iwarp|gap N > FILE.pcap");
        std::process::exit(2);
    };
    let number = |s: &str| s.parse::<u32>().unwrap_or_else(|_| usage());
    let stdout = std::io::stdout();
    let out = BufWriter::with_capacity(1 << 20, stdout.lock());
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [n] => drop(rdma_trace::synth::nfs3_rpcs(out, number(n))?),
        ["--hostile", "writes", n] => drop(rdma_trace::synth::unfinished_writes(out, number(n))?),
        ["--hostile", "iwarp", n] => {
            drop(rdma_trace::synth::iwarp_unfinished_writes(out, number(n))?)
        }
        ["--hostile", "gap", n] => drop(rdma_trace::synth::data_past_a_gap(out, number(n), 2000)?),
        _ => usage(),
    }
    Ok(())
}
