#!/usr/bin/env bash
# ninep/bench/null-bound.sh: how fast the Linux kernel's 9P client can go over
# RDMA at all, whatever the server does. Three servers in one VM boot, on the
# same tmpfs, alternated: rdma-9p with RDMA_9P_BENCH_NULL=1 (reads and writes
# of regular files answered without touching the file: a server whose file
# I/O costs nothing), rdma-9p as it is, and the kernel's NFS server over RDMA
# (knfsd, NFSv3 proto=rdma), the target's reference. If the null server is
# slower than knfsd, no server-side change can meet rdma-9p/knfsd >= 1.00.
#
#   ninep/bench/null-bound.sh [--runs N] [--size MiB] [--msize BYTES] [--baseline BIN]
#
# --baseline BIN adds a fourth server, alternated with the others: the
# rdma-9p binary BIN (one built from another commit), so that a change's
# effect is a per-round ratio of the same boot (rdma-9p/baseline).
# Defaults: 9 rounds after one discarded warm-up, a 64 MiB file, msize 128 KiB
# (the kernel's default; knfsd's rsize/wsize over RDMA here). Each round runs,
# for each server in a rotating order, fio's sequential write (1 MiB blocks,
# O_DIRECT, fsync at the end) and then its sequential read (O_DIRECT, caches
# dropped), fio on CPU 0, as vs-kernel.sh. Around each fio run it reads the
# CPU time of the server (rdma-9p's process, or every nfsd thread) and of the
# whole guest (every vCPU's non-idle time), per MiB moved (fio's own setup is
# in the window too, the same for every server). The null server's file is
# made 64 MiB long beforehand (its writes do not extend it).
# Output in target/bench-9p/null/: runs.txt (round server direction MB/s
# server-ms/MiB guest-ms/MiB) and results.md (medians; per-round ratios
# with a 95% interval, ci/lib/interval.awk).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
out=$repo/target/bench-9p/null
say() { printf 'null-bound: %s\n' "$*" >&2; }
# shellcheck source=ninep/bench/lib.sh
. "$repo/ninep/bench/lib.sh"

if [ "${1:-}" = --guest ]; then
    runs=$2 size=$3 msize=$4 base=${5:-}
    trap 'echo "null-bound: guest failed at line $LINENO (status $?)" >&2' ERR
    ip=10.8.0.1
    bin=/tmp/rdma-9p
    bench_guest "$repo" $((size * 4 + 64)) r9 r9n r9b
    truncate -s "${size}M" /export/r9n/f
    bench_knfsd $ip
    "$bin" serve --addr $ip --port 5640 --msize "$msize" /export/r9 >/tmp/r9.log 2>&1 &
    r9=$!
    RDMA_9P_BENCH_NULL=1 "$bin" serve --addr $ip --port 5642 --msize "$msize" /export/r9n >/tmp/r9n.log 2>&1 &
    r9n=$!
    logs=(/tmp/r9.log /tmp/r9n.log)
    order=(r9n nfs r9)
    declare -A pid=([r9]=$r9 [r9n]=$r9n)
    if [ -n "$base" ]; then
        cp "$base" /tmp/rdma-9p-base
        /tmp/rdma-9p-base serve --addr $ip --port 5643 --msize "$msize" /export/r9b >/tmp/r9b.log 2>&1 &
        pid[r9b]=$!
        logs+=(/tmp/r9b.log)
        order+=(r9b)
    fi
    bench_wait_serving "${logs[@]}"
    grep -q RDMA_9P_BENCH_NULL /tmp/r9n.log || { echo "null-bound: the null server did not say so" >&2; exit 1; }
    mount -t 9p -o trans=rdma,port=5640,version=9p2000.L,msize="$msize" $ip /mnt/r9
    mount -t 9p -o trans=rdma,port=5642,version=9p2000.L,msize="$msize" $ip /mnt/r9n
    [ -z "$base" ] || mount -t 9p -o trans=rdma,port=5643,version=9p2000.L,msize="$msize" $ip /mnt/r9b
    declare -A dir=([r9]=/mnt/r9 [r9n]=/mnt/r9n [nfs]=/mnt/nfs/nfs [r9b]=/mnt/r9b)
    hz=$(getconf CLK_TCK)
    server_ticks() { if [ "$1" = nfs ]; then bench_server_ticks nfs; else bench_server_ticks "${pid[$1]}"; fi; }
    # Every vCPU's non-idle ticks (user nice system irq softirq steal).
    guest_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
    fio_run() { # SERVER DIRECTION -> "MB/s server-ms/MiB guest-ms/MiB"
        local s=$1 rw=$2
        [ "$rw" = write ] || sync
        echo 3 >/proc/sys/vm/drop_caches
        local s0 g0 s1 g1
        s0=$(server_ticks "$s") g0=$(guest_ticks)
        timeout -k 10 180 taskset -c 0 fio --name=seq --filename="${dir[$s]}/f" --rw="$rw" --bs=1M --size="${size}M" \
            --ioengine=psync --direct=1 --end_fsync=$([ "$rw" = write ] && echo 1 || echo 0) \
            --output-format=json >/tmp/fio.json 2>/tmp/fio.err || {
            echo "null-bound: fio's $rw on $s failed:" >&2
            cat /tmp/fio.err /tmp/fio.json >&2
            # Whose side broke: the server's last lines and the kernel's.
            [ "$s" = nfs ] || tail -n 20 "/tmp/$s.log" >&2
            dmesg | tail -n 30 >&2
            return 1
        }
        s1=$(server_ticks "$s") g1=$(guest_ticks)
        python3 -c "import json,sys; j=json.load(open('/tmp/fio.json'))['jobs'][0]['$rw']; ms=lambda t: t * 1000 / $hz / $size; print('%.2f %.1f %.1f' % (j['bw'] * 1024 / 1e6, ms($s1 - $s0), ms($g1 - $g0)))"
    }
    # As vs-kernel.sh: every client's I/O on CPU 0, timers where armed
    # (rxe's retransmit timer on the other CPU can kill the 9P client's QP).
    echo 0 >/proc/sys/kernel/timer_migration
    for round in $(seq 0 "$runs"); do
        for s in "${order[@]}"; do
            for d in write read; do
                echo "$round $s $d $(fio_run "$s" "$d")"
            done
        done
        order=("${order[@]:1}" "${order[0]}")
    done >"$out/runs.txt"
    # The null server really served nothing of the file: still a hole.
    [ "$(du -k /export/r9n/f | cut -f1)" -lt 1024 ] || { echo "null-bound: the null server wrote the file" >&2; exit 1; }
    umount /mnt/r9 /mnt/r9n /mnt/nfs
    [ -z "$base" ] || umount /mnt/r9b
    kill "${pid[@]}"
    exit 0
fi

runs=9 size=64 msize=131072 base=
while [ $# -gt 0 ]; do
    case $1 in
        --runs) runs=${2:?--runs needs a value}; shift 2 ;;
        --size) size=${2:?--size needs a value}; shift 2 ;;
        --msize) msize=${2:?--msize needs a value}; shift 2 ;;
        --baseline) base=$(realpath "${2:?--baseline needs a binary}"); shift 2 ;;
        -h | --help) sed -n '2,27s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) say "unknown argument $1 (see --help)"; exit 2 ;;
    esac
done
bench_positive say "$runs" "$size" "$msize"
[ -z "$base" ] || [ -x "$base" ] || { say "not an executable: $base"; exit 2; }
command -v fio >/dev/null || { say "fio is missing (ci/setup installs it)"; exit 1; }
bench_run say 3000 "$out" runs.txt "$0" "$runs" "$size" "$msize" "$base"

# Round 0 is the warm-up.
col() { # SERVER DIRECTION FIELD
    awk -v s="$1" -v d="$2" -v f="$3" '$1 > 0 && $2 == s && $3 == d {print $f}' "$out/runs.txt" | median
}
ratios() { # DIRECTION A B: A / B MB/s per round
    awk -v d="$1" -v a="$2" -v b="$3" '$1 > 0 && $3 == d { bw[$1, $2] = $4; r[$1] = 1 }
        END { for (k in r) if (bw[k, b] > 0) print bw[k, a] / bw[k, b] }' "$out/runs.txt" | awk -f ci/lib/interval.awk
}
{
    echo "| direction | null rdma-9p MB/s | rdma-9p MB/s | knfsd MB/s | null/knfsd | rdma-9p/knfsd | rdma-9p/null |"
    echo "|---|---|---|---|---|---|---|"
    for d in write read; do
        printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$d" "$(col r9n $d 4)" "$(col r9 $d 4)" "$(col nfs $d 4)" \
            "$(ratios $d r9n nfs)" "$(ratios $d r9 nfs)" "$(ratios $d r9 r9n)"
    done
    echo
    echo "| CPU ms per MiB (median) | null rdma-9p | rdma-9p | knfsd |"
    echo "|---|---|---|---|"
    for d in write read; do
        printf '| %s, server | %s | %s | %s |\n' "$d" "$(col r9n $d 5)" "$(col r9 $d 5)" "$(col nfs $d 5)"
        printf '| %s, whole guest | %s | %s | %s |\n' "$d" "$(col r9n $d 6)" "$(col r9 $d 6)" "$(col nfs $d 6)"
    done
    echo
    if [ -n "$base" ]; then
        echo
        echo "| direction | baseline MB/s | baseline/knfsd | rdma-9p/baseline |"
        echo "|---|---|---|---|"
        for d in write read; do
            printf '| %s | %s | %s | %s |\n' "$d" "$(col r9b $d 4)" "$(ratios $d r9b nfs)" "$(ratios $d r9 r9b)"
        done
        printf '| CPU ms per MiB, server (write, read) | %s, %s | | |\n' "$(col r9b write 5)" "$(col r9b read 5)"
        echo
        echo "Baseline: $base."
    fi
    echo "$runs rounds (after one warm-up), ${size} MiB file, 1 MiB blocks, O_DIRECT, msize $msize; MB/s and CPU: medians; ratios: median of the per-round ratios (95% interval)."
} >"$out/results.md"
cat "$out/results.md"
