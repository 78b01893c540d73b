# shellcheck shell=bash
# ninep/bench/lib.sh: what the rdma-9p benchmarks (vs-kernel.sh, null-bound.sh, profile.sh)
# share, sourced by each on the host and in the guest: the guest's kernel servers and modules,
# waiting for rdma-9p to listen, the server's CPU time, the host's argument checks, the build
# and the median. Each script keeps only what it measures.

# The guest's common setup: the release build copied to /tmp/rdma-9p (the repository may
# change under a run), the modules loaded, a tmpfs of MiB at /export with a directory and a
# mount point /mnt/NAME for each NAME (nfs among them: knfsd's export is /export/nfs).
bench_guest() { # REPO MiB NAME...
    local repo=$1 mib=$2 s
    shift 2
    cp "$repo/target/release/rdma-9p" /tmp/rdma-9p
    bench_modules
    mkdir -p /export /run/rpcbind /var/lib/nfs
    mount -t tmpfs -o size="${mib}m" tmpfs /export
    for s in nfs "$@"; do mkdir -p "/mnt/$s" "/export/$s"; done
}

# Loads the kernel's 9P client over RDMA and the NFS server and its RDMA transport.
bench_modules() {
    modprobe 9pnet_rdma
    modprobe 9p
    modprobe nfsd
    modprobe rpcrdma
}

# The kernel NFS server (../shared/kernel-peers.md §1) exporting /export, NFSv3 over RDMA on
# port 20049, mounted at /mnt/nfs (knfsd's export lives in /mnt/nfs/nfs).
bench_knfsd() { # IP
    mount -t nfsd nfsd /proc/fs/nfsd
    echo '/export 10.8.0.0/24(rw,no_root_squash,insecure,fsid=0,no_subtree_check)' >/etc/exports
    rpcbind -w
    exportfs -ra
    rpc.mountd
    rpc.nfsd --grace-time 10 --lease-time 10 4
    echo 'rdma 20049' >/proc/fs/nfsd/portlist
    mount -t nfs -o vers=3,nolock,proto=rdma,port=20049 "$1":/export /mnt/nfs
}

# Waits (10 s at most) for each rdma-9p log to say it is serving; prints the log and fails
# otherwise.
bench_wait_serving() { # LOG...
    local l
    for l in "$@"; do
        for _ in $(seq 100); do grep -q serving "$l" && break; sleep 0.1; done
        grep -q serving "$l" || { cat "$l"; return 1; }
    done
}

# CPU ticks (user + system) of a server: the processes PID..., or every nfsd thread for `nfs`.
bench_server_ticks() { # nfs | PID...
    local pids=("$@")
    [ "$1" != nfs ] || mapfile -t pids < <(pgrep -x nfsd)
    for p in "${pids[@]}"; do cat "/proc/$p/stat"; done | awk '{ s += $14 + $15 } END { print s + 0 }'
}

# Fails (status 2) unless every argument is a positive whole number; SAY prints the message.
bench_positive() { # SAY VALUE...
    local say=$1 v
    shift
    for v in "$@"; do
        [[ $v =~ ^[1-9][0-9]*$ ]] || { "$say" "not a positive number: $v"; exit 2; }
    done
}

# The host's side of a run, from the repository's root: the release build the guest copies
# (offline: the dependencies are in cargo's cache), the last run's results (OUT's *.txt and
# *.log) removed, then SCRIPT --guest ARGS... in one VM boot of at most SECS; fails, through
# SAY, when the guest wrote no RESULT in OUT.
bench_run() { # SAY SECS OUT RESULT SCRIPT ARGS...
    local say=$1 secs=$2 out=$3 result=$4 script=$5
    shift 5
    cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
    cargo build --release --offline -p rdma-9p >&2
    mkdir -p "$out"
    rm -f "$out"/*.txt "$out"/*.log
    ci/vm run --timeout "$secs" -- "$script" --guest "$@"
    [ -s "$out/$result" ] || { "$say" "the guest wrote no results"; exit 1; }
}

# The median of the numbers on standard input, one a line ("n/a" for none).
median() { sort -n | awk '{v[NR]=$1} END {print NR ? (NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2) : "n/a"}'; }
