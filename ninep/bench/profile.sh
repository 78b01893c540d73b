#!/usr/bin/env bash
# ninep/bench/profile.sh: where the time of a sequential 1 MiB transfer goes,
# through the kernel's 9P client mounting rdma-9p and through its NFS client
# mounting knfsd, both over rxe0 in one VM boot (the setup of vs-kernel.sh).
#
#   ninep/bench/profile.sh [--size MiB] [--msize BYTES] [--rounds N] [--no-perf]
#
# For each server and direction (fio, 1 MiB blocks, O_DIRECT, fio on CPU 0):
#  - MB/s and fio's mean completion latency per 1 MiB call (the client's view);
#  - CPU time of the whole guest per CPU (user, system, softirq, idle) and of
#    the server (rdma-9p's process, or every nfsd thread), per MiB;
#  - rdma-9p's own per-request timings (RUST_LOG=rdma_9p::stats=debug: receive polled ->
#    handed to a thread -> handler -> reply posted, and the idle gap to the
#    next request);
#  - unless --no-perf, one more pass under `perf record -a -g` (cpu-clock),
#    reported by command, by object and by symbol.
# Output in target/bench-9p/profile/ (summary.txt, perf-*.txt).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
out=$repo/target/bench-9p/profile
say() { printf 'profile-9p: %s\n' "$*" >&2; }
# shellcheck source=ninep/bench/lib.sh
. "$repo/ninep/bench/lib.sh"

if [ "${1:-}" = --guest ]; then
    size=$2 msize=$3 rounds=$4 perf=$5
    trap 'echo "profile-9p: guest failed at line $LINENO (status $?)" >&2; cat /tmp/dd.err 2>/dev/null >&2' ERR
    ip=10.8.0.1
    bin=/tmp/rdma-9p
    bench_guest "$repo" $((size * 3 + 64)) r9 r9p
    bench_knfsd $ip
    RUST_LOG=info,rdma_9p::stats=debug "$bin" serve --addr $ip --port 5640 --msize "$msize" /export/r9 >/tmp/r9.log 2>&1 &
    r9=$!
    # The same binary with every request on the blocking pool, reads and
    # writes too (what running them on the connection's thread saves).
    RUST_LOG=info,rdma_9p::stats=debug RDMA_9P_POOL_ALL=1 "$bin" serve --addr $ip --port 5641 --msize "$msize" /export/r9p >/tmp/r9p.log 2>&1 &
    r9p=$!
    bench_wait_serving /tmp/r9.log /tmp/r9p.log
    echo 0 >/proc/sys/kernel/timer_migration
    echo -1 >/proc/sys/kernel/perf_event_paranoid
    echo 0 >/proc/sys/kernel/kptr_restrict
    declare -A dir=([r9]=/mnt/r9 [r9p]=/mnt/r9p [nfs]=/mnt/nfs/nfs)
    declare -A pid=([r9]=$r9 [r9p]=$r9p)
    hz=$(getconf CLK_TCK)
    # CPU ticks of the server: rdma-9p's process, or every nfsd thread.
    server_ticks() { if [ "$1" = nfs ]; then bench_server_ticks nfs; else bench_server_ticks "${pid[$1]}"; fi; }
    # cpuN user+nice system softirq+irq idle+iowait (ticks), one line per CPU.
    cpu_ticks() { awk '/^cpu[0-9]/ { print $1, $2 + $3, $4, $7 + $8, $5 + $6 }' /proc/stat; }
    rxe() { cat /sys/class/infiniband/rxe0/ports/1/hw_counters/sent_pkts; }
    dd_run() { # SERVER DIRECTION [prefix...]: the same calls as fio's, from a small program
        local s=$1 rw=$2
        shift 2
        [ "$rw" = write ] || sync
        echo 3 >/proc/sys/vm/drop_caches
        if [ "$rw" = write ]; then
            "$@" taskset -c 0 dd if=/dev/zero of="${dir[$s]}/g" bs=1M count="$size" oflag=direct conv=notrunc 2>/tmp/dd.err
        else
            "$@" taskset -c 0 dd if="${dir[$s]}/g" of=/dev/null bs=1M count="$size" iflag=direct 2>/tmp/dd.err
        fi
    }
    fio_run() { # SERVER DIRECTION
        local s=$1 rw=$2
        shift 2
        [ "$rw" = write ] || sync
        echo 3 >/proc/sys/vm/drop_caches
        "$@" timeout -k 10 600 taskset -c 0 fio --name=seq --filename="${dir[$s]}/f" --rw="$rw" --bs=1M \
            --size="${size}M" --ioengine=psync --direct=1 --end_fsync=$([ "$rw" = write ] && echo 1 || echo 0) \
            --output-format=json >/tmp/fio.json 2>/tmp/fio.err || {
            echo "profile-9p: fio's $rw on $s failed:" >&2
            cat /tmp/fio.err /tmp/fio.json >&2
            return 1
        }
    }
    mount -t 9p -o trans=rdma,port=5640,version=9p2000.L,msize="$msize" $ip /mnt/r9
    mount -t 9p -o trans=rdma,port=5641,version=9p2000.L,msize="$msize" $ip /mnt/r9p
    # A warm-up of each (the files exist, the caches are filled once).
    order=(r9 r9p nfs)
    for s in "${order[@]}"; do fio_run $s write; fio_run $s read; dd_run $s write; done
    for round in $(seq 1 "$rounds"); do
        for s in "${order[@]}"; do
            for d in write read; do
                fio_run $s $d
                python3 -c "import json; j=json.load(open('/tmp/fio.json'))['jobs'][0]['$d']; print('fio $round $s $d %.2f %.0f' % (j['bw'] * 1024 / 1e6, j['clat_ns']['mean'] / 1e3))" >>"$out/fio.txt"
                c0=$(cpu_ticks) s0=$(server_ticks $s) p0=$(rxe) t0=$(date +%s.%N)
                dd_run $s $d
                c1=$(cpu_ticks) s1=$(server_ticks $s) p1=$(rxe) t1=$(date +%s.%N)
                python3 - "$round" "$s" "$d" "$size" "$hz" "$s0" "$s1" "$p0" "$p1" "$c0" "$c1" "$t0" "$t1" <<'EOF'
import json, sys
round_, s, d, size, hz, s0, s1, p0, p1, c0, c1, t0, t1 = sys.argv[1:]
size, hz = int(size), int(hz)
f = open('/tmp/fio.json')
j = json.load(f)['jobs'][0][d]
ms = lambda ticks: ticks * 1000 / hz / size
cpu = []
for a, b in zip(c0.splitlines(), c1.splitlines()):
    a, b = a.split(), b.split()
    u, sy, si, idle = (int(y) - int(x) for x, y in zip(a[1:], b[1:]))
    cpu.append('%s usr %.1f sys %.1f soft %.1f idle %.1f' % (a[0], ms(u), ms(sy), ms(si), ms(idle)))
print('%s %s %s fio MB/s %.2f clat_us %.0f | dd ms/MiB %.1f server_ms/MiB %.1f pkts/MiB %.0f | %s (ms/MiB)' % (
    round_, s, d, j['bw'] * 1024 / 1e6, j['clat_ns']['mean'] / 1e3, (float(t1) - float(t0)) * 1000 / size,
    ms(int(s1) - int(s0)), (int(p1) - int(p0)) / size, ' | '.join(cpu)))
EOF
            done
        done
        order=("${order[@]:1}" "${order[0]}")
    done >"$out/summary.txt"
    if [ "$perf" = 1 ]; then
        for s in "${order[@]}"; do
            for d in write read; do
                dd_run $s $d perf record -a -g -F 499 -o /tmp/perf.data --
                perf report -i /tmp/perf.data --stdio --no-children -g none --sort cpu,comm --percent-limit 0.5 \
                    >"$out/perf-$s-$d.txt" 2>/dev/null
                perf report -i /tmp/perf.data --stdio --no-children -g none --sort comm,dso --percent-limit 0.5 \
                    >>"$out/perf-$s-$d.txt" 2>/dev/null
                perf report -i /tmp/perf.data --stdio --no-children -g none --sort sym --percent-limit 0.4 \
                    >>"$out/perf-$s-$d.txt" 2>/dev/null
                perf report -i /tmp/perf.data --stdio --children -g none --sort sym --percent-limit 2 \
                    >"$out/perf-children-$s-$d.txt" 2>/dev/null
            done
        done
    fi
    umount /mnt/r9 /mnt/r9p /mnt/nfs
    kill $r9 $r9p
    wait $r9 $r9p || true
    cat /tmp/r9.log >"$out/r9.log"
    cat /tmp/r9p.log >"$out/r9p.log"
    exit 0
fi

size=32 msize=131072 rounds=3 perf=1
while [ $# -gt 0 ]; do
    case $1 in
        --size) size=${2:?--size needs a value}; shift 2 ;;
        --msize) msize=${2:?--msize needs a value}; shift 2 ;;
        --rounds) rounds=${2:?--rounds needs a value}; shift 2 ;;
        --no-perf) perf=0; shift ;;
        -h | --help) sed -n '2,17s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) say "unknown argument $1 (see --help)"; exit 2 ;;
    esac
done
bench_positive say "$size" "$msize" "$rounds"
bench_run say 2400 "$out" summary.txt "$0" "$size" "$msize" "$rounds" "$perf"
cat "$out/fio.txt" "$out/summary.txt" "$out"/*.log
