#!/usr/bin/env bash
# ninep/bench/rxe-retry-trace.sh: runs rdma-9p's rxe kernel-mount tests again
# and again with kprobes on rxe's retransmit timer, QP errors, packets sent and
# ACKs queued to a completer, to see why the kernel's 9P client's QP gives up
# (issue 22, ninep/README.md). Run it in the VM:
#
#   cargo test -p rdma-9p --test kernel_mount --no-run
#   RDMA_VM_SIW=0 ci/vm run -- ninep/bench/rxe-retry-trace.sh N TEST...
#   RDMA_VM_SIW=0 ci/vm run -- env RDMA_9P_TEST_UNPINNED=1 ninep/bench/rxe-retry-trace.sh N TEST...
#
# TEST is kernel_mount_bulk_over_rxe or kernel_mount_concurrent_clients_over_rxe;
# RDMA_9P_TEST_UNPINNED=1 (the second form) runs them as an ordinary
# user would, the I/O on any CPU. Output in target/rxe-retry-trace/: summary
# (one line a run: exit status, seconds, timer expiries, then what the test
# printed: counters that moved, the longest scheduling stall), each run's log,
# and the trace of each failed run. In a trace the timer is the QP's address
# + 0x780 (6.1's struct rxe_qp): `t=` of a `tmo` line against `qp=` of a
# `qperr` line tells whose timer expired; `op` is the BTH opcode (0 SEND
# FIRST, 1 MIDDLE, 2 LAST, 4 ONLY, 17 ACK).
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
out=$repo/target/rxe-retry-trace
n=${1:?usage: rxe-retry-trace.sh N TEST...}
shift
[ "$#" -gt 0 ] || { echo "usage: rxe-retry-trace.sh N TEST..." >&2; exit 2; }
bin=$(find "$repo/target/debug/deps" -maxdepth 1 -name 'kernel_mount-*' -type f -perm -u+x | head -n 1)
[ -n "$bin" ] || { echo "no kernel_mount test binary: cargo test -p rdma-9p --test kernel_mount --no-run" >&2; exit 2; }
mkdir -p "$out"
T=/sys/kernel/tracing
mountpoint -q $T || mount -t tracefs nodev $T
echo 0 > $T/tracing_on
echo > $T/kprobe_events
{
    echo 'p:rxe/tmo retransmit_timer t=%di:x64'
    echo 'p:rxe/qperr rxe_qp_error qp=%di:x64'
    # struct rxe_pkt_info: psn at 36, opcode at 45.
    echo 'p:rxe/xmit rxe_xmit_packet qp=%di:x64 psn=+36(%si):u32 op=+45(%si):u8'
    echo 'p:rxe/compq rxe_comp_queue_pkt qp=%di:x64'
} >> $T/kprobe_events
echo 1 > $T/events/rxe/enable
echo 32768 > $T/buffer_size_kb
for i in $(seq "$n"); do
    for t in "$@"; do
        echo > $T/trace
        echo 1 > $T/tracing_on
        s=$(date +%s)
        timeout 400 "$bin" --ignored --exact "$t" --nocapture > "$out/$t.$i.log" 2>&1
        rc=$?
        echo 0 > $T/tracing_on
        echo "run $i $t rc=$rc secs=$(($(date +%s) - s)) timer_expiries=$(grep -c ' tmo:' $T/trace)" |
            tee -a "$out/summary"
        grep -h 'longest wake-up\|gave up' "$out/$t.$i.log" | cut -c1-600 | tee -a "$out/summary"
        [ "$rc" = 0 ] || cp $T/trace "$out/$t.$i.trace"
    done
done
echo 0 > $T/events/rxe/enable
echo > $T/kprobe_events
