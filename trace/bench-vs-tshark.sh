#!/usr/bin/env bash
# rdma-trace against tshark on one large synthetic capture of NFSv3 over RPC-over-RDMA (RoCEv2):
# `rdma-trace rpc` (decode, ICRC, reassembly by PSN, chunk reassembly, SHA-256 of every chunk)
# and `tshark -T fields` with the RoCE, RPC-over-RDMA and RPC fields, alternated RUNS times.
# Prints each run's CPU time (user + system), wall time and peak RSS, and each pair's ratio of
# CPU times. CPU time is the measure: the host is shared and its wall times swing by 5x.
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

printf '%-4s %-28s %-28s %s\n' run "rdma-trace rpc (cpu wall KB)" "tshark -T fields (cpu wall KB)" "cpu ratio"
for ((i = 1; i <= runs; i++)); do
    read -r tc tw tm < <(measure tshark -r "$cap" -T fields "${targs[@]}")
    read -r rc rw rm < <(measure "$bin/rdma-trace" rpc "$cap")
    printf '%-4s %-28s %-28s %.1f\n' "$i" "$rc $rw $rm" "$tc $tw $tm" "$(echo "$tc / $rc" | bc -l)"
done
