#!/bin/sh
# The Linux kernel's NFS server over RDMA in the ci/vm guest, for rdma-nfs's
# device tests (../shared/kernel-peers.md §1 of the project's notes):
#   nfsd.sh up    export a tmpfs at /export (NFSv3, port 20049 for RDMA); idempotent
#   nfsd.sh down  stop what `up` started and unmount /export; idempotent
# Needs root and nfs-kernel-server (installed on the host by ci/setup; the
# guest sees the host's /).
set -eu
case "${1:-}" in
up)
    for tool in rpc.nfsd exportfs rpc.mountd rpcbind; do
        command -v "$tool" >/dev/null || {
            echo "nfsd.sh: $tool is not installed (ci/setup installs nfs-kernel-server)" >&2
            exit 1
        }
    done
    modprobe nfsd
    modprobe rpcrdma
    mountpoint -q /proc/fs/nfsd || mount -t nfsd nfsd /proc/fs/nfsd
    mkdir -p /export /run/rpcbind /var/lib/nfs
    if mountpoint -q /export; then
        mount -o remount,size=320m /export
    else
        mount -t tmpfs -o size=320m tmpfs /export
    fi
    echo '/export 10.8.0.0/24(rw,no_root_squash,insecure,fsid=0,no_subtree_check)' >/etc/exports
    pidof rpcbind >/dev/null || rpcbind -w
    pidof rpc.mountd >/dev/null || rpc.mountd
    exportfs -ra
    if [ "$(cat /proc/fs/nfsd/threads)" -eq 0 ]; then
        rpc.nfsd --grace-time 10 --lease-time 10 4
    fi
    grep -q '^rdma 20049$' /proc/fs/nfsd/portlist || echo 'rdma 20049' >/proc/fs/nfsd/portlist
    ;;
down)
    if mountpoint -q /proc/fs/nfsd; then
        rpc.nfsd 0 || true
        exportfs -ua || true
    fi
    for d in rpc.mountd rpcbind; do
        for pid in $(pidof "$d" || true); do kill "$pid" || true; done
    done
    ! mountpoint -q /export || umount /export
    ;;
*)
    echo "usage: nfsd.sh up|down" >&2
    exit 2
    ;;
esac
