#!/usr/bin/env bash
# ninep/bench/vs-kernel.sh: sequential throughput through the Linux kernel's
# 9P client mounting rdma-9p over RDMA, against the kernel's own RDMA file
# server (knfsd, NFSv3 with proto=rdma) and against diod over TCP, in one VM
# boot, on the same tmpfs, alternated.
#
#   ninep/bench/vs-kernel.sh [--runs N] [--size MiB] [--msize BYTES] [--with-pool]
#
# --with-pool adds a fourth server to the rotation: the same rdma-9p binary
# with RDMA_9P_POOL_ALL=1 (every request on tokio's blocking pool, reads and
# writes of regular files too, instead of on the connection's thread), and a
# row of rdma-9p/that ratios.
#
# Defaults: 7 rounds, a 64 MiB file, msize 128 KiB for both 9P mounts (the
# kernel's default msize, and the rsize/wsize the kernel's NFS client over
# RDMA agrees with knfsd here: each moves 128 KiB per request). Each round runs, for each server in a rotating order (the
# first round rdma-9p, NFS, diod; the next NFS, diod, rdma-9p; ...), fio's
# sequential write of the file (1 MiB blocks, O_DIRECT, fsync at the end) and
# then its sequential read (O_DIRECT, caches dropped first). Everything runs on
# rxe0 (10.8.0.1) in the guest; diod uses TCP over the same veth. One discarded
# warm-up round comes first. Output in target/bench-9p/: runs.txt (one line a
# run: round server direction MB/s) and results.md (medians, and the median of
# the per-round ratios with a 95% interval, ci/lib/interval.awk).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
out=$repo/target/bench-9p
say() { printf 'bench-9p: %s\n' "$*" >&2; }
# shellcheck source=ninep/bench/lib.sh
. "$repo/ninep/bench/lib.sh"

if [ "${1:-}" = --guest ]; then
    runs=$2 size=$3 msize=$4 pool=$5
    ip=10.8.0.1
    bin=/tmp/rdma-9p
    bench_guest "$repo" $((size * 4 + 64)) r9 r9p diod
    # The kernel NFS server, NFSv3 over RDMA.
    bench_knfsd $ip
    # rdma-9p.
    "$bin" serve --addr $ip --port 5640 --msize "$msize" /export/r9 >/tmp/r9.log 2>&1 &
    r9=$!
    bench_wait_serving /tmp/r9.log
    mount -t 9p -o trans=rdma,port=5640,version=9p2000.L,msize="$msize" $ip /mnt/r9
    r9p=
    if [ "$pool" = 1 ]; then
        RDMA_9P_POOL_ALL=1 "$bin" serve --addr $ip --port 5641 --msize "$msize" /export/r9p >/tmp/r9p.log 2>&1 &
        r9p=$!
        bench_wait_serving /tmp/r9p.log
        mount -t 9p -o trans=rdma,port=5641,version=9p2000.L,msize="$msize" $ip /mnt/r9p
    fi
    # diod over TCP (it looks up its client's name: give the address one).
    grep -q '^10\.8\.0\.1[[:space:]]' /etc/hosts || echo '10.8.0.1 rdma-vm-veth0' >>/etc/hosts
    diod -f -n -e /export/diod -l $ip:564 >/tmp/diod.log 2>&1 &
    diod=$!
    for _ in $(seq 100); do ss -ltn | grep -q ":564 " && break; sleep 0.1; done
    order=(r9 nfs diod)
    if ! mount -t 9p -o trans=tcp,port=564,version=9p2000.L,aname=/export/diod,uname=root,access=user,msize="$msize" $ip /mnt/diod; then
        echo "bench-9p: diod's mount failed; diod's log:" >&2
        cat /tmp/diod.log >&2
        order=(r9 nfs)
    fi
    [ -z "$r9p" ] || order+=(r9p)
    grep -E ' /mnt/(nfs|r9|r9p|diod) ' /proc/mounts
    # diod passes O_DIRECT through to the tmpfs it serves, which refuses it
    # on kernels before 6.6: then only the two RDMA servers are compared.
    if [[ " ${order[*]} " = *" diod "* ]] &&
        ! dd if=/dev/zero of=/mnt/diod/probe bs=4k count=1 oflag=direct 2>/dev/null; then
        echo "bench-9p: diod refuses O_DIRECT on this kernel's tmpfs: left out" >&2
        order=(r9 nfs ${r9p:+r9p})
    fi
    rm -f /mnt/diod/probe
    declare -A dir=([r9]=/mnt/r9 [r9p]=/mnt/r9p [nfs]=/mnt/nfs/nfs [diod]=/mnt/diod)
    fio_bw() { # SERVER DIRECTION -> MB/s
        local rw=$2 key=$2
        [ "$rw" = write ] || sync
        echo 3 >/proc/sys/vm/drop_caches
        timeout -k 10 600 taskset -c 0 fio --name=seq --filename="${dir[$1]}/f" --rw="$rw" --bs=1M --size="${size}M" \
            --ioengine=psync --direct=1 --end_fsync=$([ "$rw" = write ] && echo 1 || echo 0) \
            --output-format=json >/tmp/fio.json 2>/tmp/fio.err || {
            echo "bench-9p: fio's $rw on $1 failed:" >&2
            cat /tmp/fio.err /tmp/fio.json >&2
            return 1
        }
        python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]['$key']; print('%.2f' % (j['bw'] * 1024 / 1e6))" </tmp/fio.json
    }
    # Linux's 9P client connects with a transport retry count of 0, and over
    # rxe a retransmit timer expiring on one CPU while the other is
    # mid-request can kill its QP and hang the request for good (issue 22;
    # ci/test, ninep/tests/kernel_mount.rs): as the device tests do, every
    # client's I/O runs on CPU 0 and timers stay on the CPU that armed them.
    echo 0 >/proc/sys/kernel/timer_migration
    for round in $(seq 0 "$runs"); do
        for s in "${order[@]}"; do
            for d in write read; do
                bw=$(fio_bw "$s" "$d")
                echo "$round $s $d $bw"
            done
        done
        order=("${order[@]:1}" "${order[0]}")
    done >"$out/runs.txt"
    umount /mnt/r9 /mnt/nfs
    umount /mnt/diod /mnt/r9p 2>/dev/null || true
    kill $r9 $diod $r9p
    exit 0
fi

runs=7 size=64 msize=131072 pool=0
while [ $# -gt 0 ]; do
    case $1 in
        --runs) runs=${2:?--runs needs a value}; shift 2 ;;
        --size) size=${2:?--size needs a value}; shift 2 ;;
        --msize) msize=${2:?--msize needs a value}; shift 2 ;;
        --with-pool) pool=1; shift ;;
        -h | --help) sed -n '2,24s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) say "unknown argument $1 (see --help)"; exit 2 ;;
    esac
done
bench_positive say "$runs" "$size" "$msize"
command -v fio >/dev/null || { say "fio is missing (ci/setup installs it)"; exit 1; }
command -v diod >/dev/null || { say "diod is missing (ci/setup installs it)"; exit 1; }
bench_run say 3000 "$out" runs.txt "$0" "$runs" "$size" "$msize" "$pool"

# Round 0 is the warm-up.
ratios() { # DIRECTION OTHER: rdma-9p / OTHER per round
    awk -v d="$1" -v o="$2" '$1 > 0 && $3 == d { bw[$1, $2] = $4; r[$1] = 1 }
        END { for (k in r) if (bw[k, o] > 0) print bw[k, "r9"] / bw[k, o] }' "$out/runs.txt"
}
{
    echo "| direction | rdma-9p MB/s | knfsd (NFSv3/RDMA) MB/s | diod (TCP) MB/s | rdma-9p/knfsd | rdma-9p/diod |"
    echo "|---|---|---|---|---|---|"
    for d in write read; do
        m() { awk -v d="$d" -v s="$1" '$1 > 0 && $2 == s && $3 == d {print $4}' "$out/runs.txt" | median; }
        printf '| %s | %s | %s | %s | %s | %s |\n' "$d" "$(m r9)" "$(m nfs)" "$(m diod)" \
            "$(ratios "$d" nfs | awk -f ci/lib/interval.awk)" "$(ratios "$d" diod | awk -f ci/lib/interval.awk)"
    done
    if [ "$pool" = 1 ]; then
        echo
        echo "rdma-9p / rdma-9p with RDMA_9P_POOL_ALL=1 (every request on the blocking pool), per round: write $(ratios write r9p | awk -f ci/lib/interval.awk), read $(ratios read r9p | awk -f ci/lib/interval.awk)"
    fi
    echo
    echo "$runs rounds (after one warm-up), ${size} MiB file, 1 MiB blocks, O_DIRECT, msize $msize; MB/s medians; ratios: median of the per-round ratios (95% interval)."
} >"$out/results.md"
cat "$out/results.md"
