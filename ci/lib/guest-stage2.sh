#!/bin/bash
# Stage 2 of the ci/vm guest: PID 1 after switch_root into the overlay root.
#
# Sets up soft-RoCE (rxe0) and, if available, soft-iWARP (siw0) on a veth
# pair, runs the user's command in the repository, reports its exit status
# (file in the run dir + isa-debug-exit) and powers the VM off.
#
# Argument: the per-run directory (on the repository share), which holds
# vm.env written by ci/vm.  Lines starting with $VM_TOKEN are protocol lines
# for the host side and are not shown to the user.
#
# In a pair (`ci/vm pair`, kernel argument rdma_vm_role=a|b) there is no veth:
# rxe0 sits on the NIC of the first QEMU link (10.9.0.1 a, 10.9.0.2 b) and
# siw0 on the NIC of the second (10.9.1.1, 10.9.1.2); the status files of the
# run directory carry the role as a suffix.
set -u

RUN=$1
# shellcheck source=/dev/null
source "$RUN/vm.env" # VM_TOKEN VM_REPO VM_KVER VM_SIW_KO VM_SIW_REASON VM_SIW_REQUIRED VM_SIW_NETDEV VM_DEBUG VM_PATH VM_CMD VM_ENV

ROLE=''
for word in $(< /proc/cmdline); do
    case $word in rdma_vm_role=a | rdma_vm_role=b) ROLE=${word#*=} ;; esac
done
SUFFIX=${ROLE:+.$ROLE}
# A pair's guests talk to each other and to the host through files in the run
# directory: ci/vm shares it (tag "run"), since it may live outside the
# repository share (.cache/vm can be a symlink into another checkout, which the
# guest would then see in its own tmpfs overlay).
if [[ -n $ROLE ]] &&
    ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 run "$RUN" 2> /dev/null; then
    echo "cannot mount the run directory (9p tag run) at $RUN" > /dev/console
    /bin/busybox poweroff -f
fi

IP=10.8.0.1
PEER_IP=10.8.0.2
NETDEV=veth0
IB=/sys/class/infiniband
# siw0 sits on veth1 (10.8.0.2) by default: rdma_cm maps an address to the
# first RDMA device on its netdev, so on veth0 beside rxe0 (RDMA_VM_SIW_NETDEV=
# veth0) it could never be reached through rdma_cm.
SIW_IP=$IP
[[ $VM_SIW_NETDEV == veth1 ]] && SIW_IP=$PEER_IP

say() { printf '%s msg %s\n' "$VM_TOKEN" "$*"; }

# With RDMA_VM_DEBUG=1 on the host: guest uptime at each setup step.
trace() {
    [[ $VM_DEBUG == 1 ]] || return 0
    local up
    read -r up _ < /proc/uptime
    say "[$up] $*"
}

poweroff_now() {
    sync
    /bin/busybox poweroff -f 2> /dev/null
    echo o > /proc/sysrq-trigger
    sleep 60
}

# Report RC to the host and power off.  0 powers off cleanly; anything else
# also goes through isa-debug-exit (qemu exits with (RC << 1) | 1).
finish() {
    local rc=$1
    echo "$rc" > "$RUN/status$SUFFIX"
    sync
    printf '%s exit %s\n' "$VM_TOKEN" "$rc"
    if ((rc != 0)); then
        # shellcheck disable=SC2059 # the format is the octal escape for rc
        printf "\\$(printf '%03o' "$((rc & 255))")" |
            dd of=/dev/port bs=1 seek=244 count=1 status=none 2> /dev/null
    fi
    poweroff_now
}

# The harness itself could not set the guest up: no command is run.
setup_failed() {
    echo "$*" > "$RUN/setup-failed$SUFFIX"
    finish 125
}

now_us() { echo "${EPOCHREALTIME/./}"; }

# wait_until SECONDS CMD...: poll CMD until it succeeds or SECONDS pass.
wait_until() {
    local deadline=$(($(now_us) + $1 * 1000000))
    shift
    until "$@"; do
        (($(now_us) < deadline)) || return 1
        sleep 0.01
    done
}

port_active() {
    local state
    read -r state < "$IB/$1/ports/1/state" 2> /dev/null && [[ $state == *ACTIVE* ]]
}

# ipv4_mapped_gid A.B.C.D: the sysfs spelling of ::ffff:A.B.C.D.
ipv4_mapped_gid() {
    local a b c d
    IFS=. read -r a b c d <<< "$1"
    printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d"
}

# find_gid DEV GID: set GID_INDEX to the RoCE v2 entry of port 1 equal to GID.
find_gid() {
    local port=$IB/$1/ports/1 n=0 gid type
    while [[ -e $port/gids/$n ]]; do
        if read -r gid < "$port/gids/$n" 2> /dev/null && [[ $gid == "$2" ]] &&
            read -r type < "$port/gid_attrs/types/$n" 2> /dev/null &&
            [[ $type == "RoCE v2" ]]; then
            GID_INDEX=$n
            return 0
        fi
        n=$((n + 1))
    done
    return 1
}

# Run "$@" quietly; on failure leave its output in ERR.
quiet() {
    ERR=$("$@" 2>&1) && return 0
    ERR=${ERR//$'\n'/ }
    return 1
}

# load_modules MOD...: one modprobe per module, all at once (module loading
# is mostly CPU-bound under TCG and the guest has two vCPUs).
load_modules() {
    local m failed=''
    local -A pid=()
    for m in "$@"; do
        modprobe "$m" > "/run/modprobe.$m" 2>&1 &
        pid[$m]=$!
    done
    for m in "$@"; do
        wait "${pid[$m]}" || failed+=" $m: $(tr '\n' ' ' < "/run/modprobe.$m")"
    done
    ERR=${failed# }
    [[ -z $failed ]]
}

setup_network() {
    # One `ip` process: every exec costs under TCG.
    quiet ip -batch - << EOF || setup_failed "network setup: $ERR"
link set lo up
link add $NETDEV type veth peer name veth1
addr add $IP/24 dev $NETDEV
addr add $PEER_IP/24 dev veth1
link set $NETDEV up
link set veth1 up
EOF
}

setup_rxe() {
    quiet rdma link add rxe0 type rxe netdev "$NETDEV" || setup_failed "rdma link add rxe0: $ERR"
    wait_until 20 port_active rxe0 || setup_failed "rxe0 port 1 not ACTIVE after 20 s"
    wait_until 10 find_gid rxe0 "$(ipv4_mapped_gid "$IP")" ||
        setup_failed "rxe0 has no RoCE v2 GID for $IP"
}

# netdev_by_mac MAC: sets NIC to the name of the NIC with that address (QEMU
# gives each link's NIC a fixed MAC, so names do not depend on probe order).
netdev_by_mac() {
    local f mac
    for f in /sys/class/net/*/address; do
        read -r mac < "$f" 2> /dev/null || continue
        if [[ $mac == "$1" ]]; then
            f=${f%/address}
            NIC=${f##*/}
            return 0
        fi
    done
    return 1
}

# The pair's links: rxe on the first NIC, siw on the second.
setup_pair_network() {
    local me=1 peer=2 mac_rxe mac_siw
    [[ $ROLE == b ]] && me=2 peer=1
    IP=10.9.0.$me PEER_IP=10.9.0.$peer SIW_IP=10.9.1.$me SIW_PEER_IP=10.9.1.$peer
    mac_rxe=52:54:00:09:00:0$me mac_siw=52:54:00:09:01:0$me
    wait_until 20 netdev_by_mac "$mac_rxe" || setup_failed "no NIC with MAC $mac_rxe after 20 s"
    NETDEV=$NIC
    wait_until 20 netdev_by_mac "$mac_siw" || setup_failed "no NIC with MAC $mac_siw after 20 s"
    VM_SIW_NETDEV=$NIC
    quiet ip -batch - << EOF || setup_failed "network setup: $ERR"
link set lo up
addr add $IP/24 dev $NETDEV
addr add $SIW_IP/24 dev $VM_SIW_NETDEV
link set $NETDEV up
link set $VM_SIW_NETDEV up
EOF
}

# Sets SIW to up/off/unavailable; never fails the run by itself.
setup_siw() {
    SIW=off
    if [[ -z $VM_SIW_KO ]]; then
        [[ $VM_SIW_REASON == disabled* ]] || SIW=unavailable
        return 0
    fi
    local why=''
    if ! wait "$CRC_PID"; then
        why="modprobe libcrc32c: $(tr '\n' ' ' < /run/modprobe.libcrc32c)"
    elif ! quiet insmod "$VM_SIW_KO"; then
        why="insmod siw.ko: $ERR"
    elif ! quiet rdma link add siw0 type siw netdev "$VM_SIW_NETDEV"; then
        why="rdma link add siw0: $ERR"
    elif ! wait_until 20 port_active siw0; then
        why="siw0 port 1 not ACTIVE after 20 s"
    fi
    if [[ -n $why ]]; then
        SIW=unavailable VM_SIW_REASON=$why
    else
        SIW=up
    fi
}

run_command() {
    local name kv path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    [[ -n $VM_PATH ]] && path=$path:$VM_PATH
    (
        for name in $(compgen -e); do unset "$name"; done
        export HOME=/root USER=root LOGNAME=root SHELL=/bin/bash TERM=dumb LANG=C.UTF-8 PATH="$path"
        for kv in "${VM_ENV[@]}"; do export "${kv?}"; done
        # The host's root, read-only and cached (guest-init.sh): a binary built
        # on the host runs from there without being read again over 9p.
        [[ -d /run/rdma-vm/host/usr ]] && export RDMA_VM_HOST_ROOT=/run/rdma-vm/host
        export RDMA_VM=1 RDMA_TEST_DEVICE=rxe0 RDMA_TEST_GID_INDEX="$GID_INDEX" \
            RDMA_TEST_IP="$IP" RDMA_TEST_PEER_IP="$PEER_IP" RDMA_TEST_NETDEV="$NETDEV"
        if [[ $SIW == up ]]; then
            export RDMA_TEST_IWARP_DEVICE=siw0 RDMA_TEST_IWARP_IP="$SIW_IP"
        else
            unset RDMA_TEST_IWARP_DEVICE RDMA_TEST_IWARP_IP
        fi
        if [[ -n $ROLE ]]; then
            export RDMA_VM_ROLE=$ROLE RDMA_VM_SYNC_DIR=$RUN/sync RDMA_VM_LINK_DIR=$RUN/link \
                RDMA_VM_LINK=$VM_REPO/ci/lib/pair-link RDMA_TEST_IWARP_NETDEV=$VM_SIW_NETDEV
            if [[ $SIW == up ]]; then export RDMA_TEST_IWARP_PEER_IP=$SIW_PEER_IP; fi
        fi
        ulimit -l unlimited
        cd "$VM_REPO" || exit 125
        exec "${VM_CMD[@]}"
    ) < /dev/null
}

GID_INDEX='' SIW=off
trace "stage2 started"
CRC_PID=''
if [[ -n $VM_SIW_KO ]]; then # siw.ko's one dependency outside ib_core
    modprobe libcrc32c > /run/modprobe.libcrc32c 2>&1 &
    CRC_PID=$!
fi
if [[ -n $ROLE ]]; then
    load_modules virtio_net rdma_rxe ib_uverbs rdma_ucm || setup_failed "modprobe failed: $ERR"
    trace "modules loaded"
    setup_pair_network
    trace "links up ($NETDEV, $VM_SIW_NETDEV)"
else
    load_modules veth rdma_rxe ib_uverbs rdma_ucm || setup_failed "modprobe failed: $ERR"
    trace "modules loaded"
    setup_network
    trace "veth up"
fi
setup_rxe
trace "rxe0 ready"
setup_siw
trace "siw done"
if [[ $SIW == unavailable ]]; then
    say "siw unavailable: $VM_SIW_REASON"
    if [[ $VM_SIW_REQUIRED == 1 ]]; then
        setup_failed "siw is required (RDMA_VM_REQUIRE_SIW=1) but unavailable: $VM_SIW_REASON"
    fi
fi
printf '%s ready gid=%s siw=%s ip=%s\n' "$VM_TOKEN" "$GID_INDEX" "$SIW" "$IP"
if [[ -n $ROLE ]]; then
    # Start the command only once the other guest is ready too: a guest that
    # never comes up fails the pair here, not in every test's rendezvous.
    touch "$RUN/up.$ROLE"
    peer_up() { [[ -e $RUN/up.$1 ]]; }
    other=a
    [[ $ROLE == a ]] && other=b
    wait_until 240 peer_up "$other" || setup_failed "guest $other was not ready within 240 s of guest $ROLE"
fi
run_command
finish "$?"
