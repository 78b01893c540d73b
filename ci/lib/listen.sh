# shellcheck shell=bash
# ci/lib/listen.sh: wait_listen, sourced by ci/bench and ci/bench-concurrent.

# wait_listen PORT PID: until a socket LISTENs on TCP PORT (state 0A in
# /proc/net/tcp or tcp6); fails if PID exits first or after 30 s.
wait_listen() {
    local hex i f
    hex=$(printf '%04X' "$1")
    for ((i = 0; i < 3000; i++)); do
        for f in /proc/net/tcp /proc/net/tcp6; do
            [[ -r $f ]] || continue
            # Field 2 is the local address HEXIP:PORT, field 4 the state.
            if awk -v p=":$hex" 'NR > 1 && substr($2, length($2) - 4) == p && $4 == "0A" { found = 1 } END { exit !found }' "$f"; then
                return 0
            fi
        done
        kill -0 "$2" 2> /dev/null || return 1
        sleep 0.01
    done
    return 1
}
