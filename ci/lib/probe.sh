# shellcheck shell=bash
# ci/lib/probe.sh: the machine-speed probe of the benchmarks (ci/bench,
# ci/bench-lat, ci/bench-cmtime). ci/lib/speed-probe.c times a fixed compute
# loop; the host's speed moves by a third between runs a second apart and the
# guest's by up to 2x (docs/benchmarks-log.md, session 12), so each table records the
# probe next to its results. It explains a table; nothing filters or rescales
# runs by it.

PROBE_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)/speed-probe.c

# probe_build OUT: compiles the probe to OUT (on the host; the guest runs the
# host's binaries).
probe_build() {
    command -v cc > /dev/null || {
        echo "no C compiler (cc) for ci/lib/speed-probe.c; ci/setup installs one" >&2
        return 1
    }
    cc -O2 -o "$1" "$PROBE_SRC"
}

# probe_pair PROBE [STEPS]: two copies at once, on CPUs 0 and 1 when taskset
# is there; prints the slower copy's milliseconds.
probe_pair() {
    local probe=$1 steps=${2:-4000000} pin0=() pin1=() tmp a b pid
    if command -v taskset > /dev/null && (($(nproc) >= 2)); then
        pin0=(taskset -c 0) pin1=(taskset -c 1)
    fi
    tmp=$(mktemp)
    "${pin1[@]}" "$probe" "$steps" > "$tmp" &
    pid=$!
    a=$("${pin0[@]}" "$probe" "$steps") || { rm -f "$tmp"; echo "the speed probe failed" >&2; return 1; }
    wait "$pid" || { rm -f "$tmp"; echo "the speed probe failed" >&2; return 1; }
    b=$(< "$tmp")
    rm -f "$tmp"
    awk -v a="${a%% *}" -v b="${b%% *}" 'BEGIN { print (a > b ? a : b) }'
}

# probe_summary: "MEDIAN (MIN-MAX)" of the numbers on stdin ("n/a" for none).
probe_summary() {
    sort -g | awk '{ v[NR] = $1 }
        END {
            if (NR == 0) { print "n/a"; exit }
            m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
            printf "%s (%s-%s)\n", m, v[1], v[NR]
        }'
}

# probe_host PROBE: natively, ten pairs of copies of 5x the guest's steps;
# prints "MEDIAN (MIN-MAX) ms" of the slower copy of each.
probe_host() {
    for _ in $(seq 10); do
        probe_pair "$1" 20000000 || return 1
    done | probe_summary | sed 's/$/ ms/'
}
