#!/bin/busybox sh
# shellcheck shell=sh
# /init of the ci/vm initramfs (runs under busybox as PID 1).
#
# Builds the guest root: the host's / (read-only 9p, tag "hostroot") under a
# tmpfs overlay, the repository (read-write 9p, tag "repo") at its host path,
# and the cached kernel modules at /lib/modules.  Then switch_root into
# ci/lib/guest-stage2.sh.  /vm.conf (VM_REPO, VM_RUN, VM_MODULES) comes from a
# small per-run cpio appended to the initramfs by ci/vm.

/bin/busybox mkdir -p /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec < /dev/null > /dev/console 2>&1

die() {
    echo "vm-init: $*"
    poweroff -f
    sleep 10
}

[ -r /vm.conf ] || die "no /vm.conf in the initramfs"
# shellcheck source=/dev/null
. /vm.conf

for m in /mods/*.ko; do
    insmod "$m" || die "insmod $m failed"
done

opts=trans=virtio,version=9p2000.L,msize=262144
mount -t 9p -o "$opts,ro,cache=loose" hostroot /lower || die "cannot mount the host root (9p)"
mount -t tmpfs -o mode=0755 tmpfs /upper || die "cannot mount tmpfs"
mkdir -p /upper/u /upper/w
mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w /newroot ||
    die "cannot mount the overlay root"
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /newroot/run
mkdir -p /newroot/run/lock
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /newroot/tmp
mkdir -p /newroot/lib/modules
mount --bind "/lower$VM_MODULES" /newroot/lib/modules || die "cannot bind the kernel modules"
# Last, so that a repository under /tmp is not hidden by the tmpfs.
mkdir -p "/newroot$VM_REPO"
mount -t 9p -o "$opts" repo "/newroot$VM_REPO" || die "cannot mount the repository (9p)"
# The host's root once more, read-only and cached (the lower layer above), at
# /run/rdma-vm/host: ci/device-tests runs the test binaries from there. The
# repository's share has no cache (a guest must see what the host writes), so
# the inode of a binary run from it is dropped when the process ends and every
# run reads the binary again over 9p: 0.3-1 s per test process under TCG.
mkdir -p /newroot/run/rdma-vm/host
mount --bind /lower /newroot/run/rdma-vm/host || die "cannot bind the cached host root"
for d in proc sys dev; do
    mount --move "/$d" "/newroot/$d" || die "cannot move /$d"
done
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /newroot/dev/pts
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /newroot/dev/shm

exec switch_root /newroot /bin/bash "$VM_REPO/ci/lib/guest-stage2.sh" "$VM_RUN"
