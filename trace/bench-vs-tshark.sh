#!/usr/bin/env bash
# rdma-trace against tshark on one large synthetic capture of NFSv3 over RPC-over-RDMA (RoCEv2):
# `rdma-trace rpc` (decode, ICRC, reassembly by PSN, chunk reassembly, SHA-256 of every chunk)
# and `tshark -T fields` with the RoCE, RPC-over-RDMA and RPC fields, alternated RUNS times:
# tshark, then `rdma-trace rpc` (decoding on a second thread, the default), then
# `rdma-trace rpc --threads 1`. Prints each run's CPU time (user + system), wall time and peak
# RSS, the load average before the round, and the ratios tshark/rdma-trace of wall times (two
# threads) and of CPU times (one thread). Checks once that both rdma-trace runs print the same.
#
# Usage: trace/bench-vs-tshark.sh [RPCS [RUNS]]   (defaults 7700 RPCs = 1.09 GB, 3 runs)
# Environment: BENCH_DIR (default /tmp/rdma-trace-bench) holds the capture.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rpcs=${1:-7700}
runs=${2:-3}
dir=${BENCH_DIR:-/tmp/rdma-trace-bench}
mkdir -p "$dir"

cargo build --quiet --release --manifest-path "$repo/Cargo.toml" -p rdma-trace \
    --bin rdma-trace --example synth_rpc
bin=$repo/target/release
cap=$dir/nfs-$rpcs.pcap
[[ -s $cap ]] || "$bin/examples/synth_rpc" "$rpcs" > "$cap"
echo "capture: $cap, $(stat -L -c %s "$cap") bytes"

fields=(frame.number infiniband.bth.opcode infiniband.bth.destqp infiniband.bth.psn
    infiniband.reth.va infiniband.reth.r_key infiniband.reth.dmalen infiniband.aeth.syndrome
    infiniband.aeth.msn rpcordma.xid rpcordma.msg_type rpcordma.rdma_handle rpcordma.rdma_length
    rpc.xid rpc.procedure)
targs=()
for f in "${fields[@]}"; do targs+=(-e "$f"); done

# Prints "CPU-seconds wall-seconds peak-KB" of one command (its output discarded).
measure() {
    local t
    t=$(mktemp)
    /usr/bin/time -f '%U %S %e %M' -o "$t" "$@" > /dev/null 2> /dev/null
    awk '{ printf "%.2f %.2f %d\n", $1 + $2, $3, $4 }' "$t"
    rm -f "$t"
}

one=$(mktemp)
two=$(mktemp)
"$bin/rdma-trace" rpc --threads 1 "$cap" > "$one" 2> /dev/null
"$bin/rdma-trace" rpc "$cap" > "$two" 2> /dev/null
cmp -s "$one" "$two" || { echo "rdma-trace rpc: --threads 1 and 2 print different output" >&2; exit 1; }
echo "rdma-trace rpc: $(wc -l < "$one") lines, the same with one thread and two"
rm -f "$one" "$two"

printf '%-4s %-6s %-22s %-22s %-22s %s\n' run load "tshark (cpu wall KB)" "rpc (cpu wall KB)" \
    "rpc --threads 1" "wall ratio, cpu ratio"
for ((i = 1; i <= runs; i++)); do
    load=$(cut -d' ' -f1 /proc/loadavg)
    read -r tc tw tm < <(measure tshark -r "$cap" -T fields "${targs[@]}")
    read -r rc rw rm < <(measure "$bin/rdma-trace" rpc "$cap")
    read -r oc ow om < <(measure "$bin/rdma-trace" rpc --threads 1 "$cap")
    printf '%-4s %-6s %-22s %-22s %-22s %.1f %.1f\n' "$i" "$load" "$tc $tw $tm" "$rc $rw $rm" \
        "$oc $ow $om" "$(echo "$tw / $rw" | bc -l)" "$(echo "$tc / $oc" | bc -l)"
done
