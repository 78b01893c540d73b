#!/usr/bin/env python3
"""ci/lib/instr-report.py: the Markdown report of ci/bench-instr.

    instr-report.py OUTDIR COMMAND-LINE

Reads OUTDIR/runs.tsv (one line per client run: test, size, tool, run, N,
window M, first dumped doorbell FROM, doorbells after the last window TAIL,
the least wait after each doorbell and
the quiet time that ended it, program name, callgrind file, seconds), OUTDIR/env.txt (key=value) and the callgrind
files, which ci/lib/callgrind-split.py splits by object.

A run's callgrind file FILE.1 holds everything up to doorbell FROM, FILE.2
to FILE.K one window of M doorbells each, FILE the rest (the last, partial
window and the teardown). A case's count per message is the median window of
both runs (N1 and N2; of an even number, the lower middle one), divided by M;
every column comes from that one window, so the parts add up to the total.
"""

import collections
import datetime
import glob
import importlib.util
import os
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in ci/lib
here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("callgrind_split", os.path.join(here, "callgrind-split.py"))
cgsplit = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cgsplit)

HARNESS = "libinstr-window.so"
SPLITS = (("own", "own code"), ("verbs", "libibverbs + provider"), ("libc", "libc + loader"),
          ("other", "other"))


def parts(cg):
    """The window files of a run (in order) and all its files."""
    numbered = []
    for f in glob.glob(glob.escape(cg) + ".*"):
        m = re.fullmatch(re.escape(cg) + r"\.(\d+)", f)
        if m:
            numbered.append((int(m.group(1)), f))
    numbered.sort()
    windows = [f for k, f in numbered if k >= 2]
    return windows, [cg] + [f for _, f in numbered]


def fmt(x):
    return f"{x:,.1f}"


def main():
    out, cmdline = sys.argv[1], sys.argv[2]
    env = {}
    rx = "rxe's `rcvd_pkts` counter"
    with open(os.path.join(out, "env.txt")) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition("=")
            env[k] = v
    providers = cgsplit.provider_files()
    runs = []
    with open(os.path.join(out, "runs.tsv")) as f:
        for line in f:
            test, size, tool, run, n, m, first, tail, wait, quiet, prog, cg, secs = line.rstrip("\n").split("\t")
            runs.append(dict(test=test, size=int(size), tool=tool, run=int(run), n=int(n), m=int(m),
                             first=int(first), tail=int(tail), wait=(int(wait), int(quiet)), prog=prog,
                             cg=os.path.join(out, cg), secs=float(secs)))
    windows = collections.defaultdict(list)  # (test, size, tool, run) -> [(fields, m)]
    whole = {}  # (test, size, tool, run, n) -> fields of the whole process
    params = {}
    order = []
    for r in runs:
        key = (r["test"], r["size"], r["tool"], r["run"])
        case = (r["test"], r["size"])
        if case not in params:
            order.append(case)
            params[case] = dict(ns=[], m=r["m"], first=r["first"], tail=r["tail"], wait=r["wait"])
        if r["run"] == 1 and r["tool"] == "perf":
            params[case]["ns"].append(r["n"])
        wins, files = parts(r["cg"])
        for w in wins:
            windows[key].append((cgsplit.split(w, r["prog"], HARNESS, providers)[0], r["m"]))
        total = collections.Counter()
        for f in files:
            total.update(cgsplit.split(f, r["prog"], HARNESS, providers)[0])
        whole[key + (r["n"],)] = total

    def median(key):
        ws = sorted(windows[key], key=lambda w: w[0]["total"])
        if not ws:
            return None
        fields, m = ws[(len(ws) - 1) // 2]
        return {k: v / m for k, v in fields.items()}

    def spread(key):
        ws = windows[key]
        med = median(key)
        same = sum(1 for f, m in ws if f["total"] / m == med["total"])
        lo = min(f["total"] / m for f, m in ws)
        hi = max(f["total"] / m for f, m in ws)
        return len(ws), same, lo, hi

    def difference(test, size, tool, run=1):
        ns = sorted(n for (t, s, tl, r, n) in whole if (t, s, tl, r) == (test, size, tool, run))
        if len(ns) < 2:
            return None
        a, b = whole[(test, size, tool, run, ns[0])], whole[(test, size, tool, run, ns[-1])]
        return (b["total"] - a["total"]) / (ns[-1] - ns[0])

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"Measured {now} with `{cmdline}` at commit {env.get('commit', '?')} "
          f"(`perf`: the workspace's release profile with `CARGO_PROFILE_RELEASE_DEBUG=line-tables-only`, "
          f"{env.get('rustc', '?')}).")
    print(f"Guest: kernel {env.get('kernel', '?')}, rdma-core {env.get('rdma_core', '?')}, "
          f"perftest {env.get('perftest', '?')}, {env.get('valgrind', '?')}, {env.get('vcpus', '?')} vCPUs "
          f"(QEMU TCG), {env.get('device', '?')}. The client ran under callgrind, the server natively.")
    waits = sorted({p["wait"] for p in params.values()})
    print("After each doorbell the client waited until the exchange was over: in the latency tests until the "
          "server's system call that sent its answer had returned, then "
          + " or ".join(f"at least {w} us, then until {rx} had been still for {q} us" for w, q in waits) + ". "
          f"The guest's part took {env.get('guest_seconds', '?')} s, the whole VM run {env.get('vm_seconds', '?')} s.")
    print()
    print("User-space instructions per message (latency tests: per iteration, i.e. one message each way; "
          "bandwidth tests: per message posted), the median window of M messages divided by M:")
    print()
    head = "| test | size [B] | `perf` | perftest | Rust/C |"
    rule = "|---|---:|---:|---:|---:|"
    for _, label in SPLITS:
        head += f" {label}: `perf` | {label}: perftest |"
        rule += "---:|---:|"
    print(head)
    print(rule)
    for test, size in order:
        rs, cs = median((test, size, "perf", 1)), median((test, size, "perftest", 1))
        if rs is None or cs is None:
            continue
        row = f"| {test} | {size} | {fmt(rs['total'])} | {fmt(cs['total'])} | {rs['total'] / cs['total']:.2f} |"
        for key, _ in SPLITS:
            row += f" {fmt(rs[key])} | {fmt(cs[key])} |"
        print(row)
    print()
    print("The `rdma` crate's own share of `perf`'s latency iterations (one post and its completion on the "
          "client; send_lat also one receive posted and completed): the self cost of functions whose name "
          "contains `rdma::` (with whatever LTO inlined into them), and of the lines whose source is in "
          "`rdma/src/` (wherever LTO put them, including `perf`'s loops):")
    print()
    print("| test | size [B] | `perf` total | `rdma::` functions | share | `rdma/src` lines | share |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for test, size in order:
        if not test.endswith("_lat"):
            continue
        rs = median((test, size, "perf", 1))
        if rs is None:
            continue
        print(f"| {test} | {size} | {fmt(rs['total'])} | {fmt(rs['rdma_sym'])} | "
              f"{rs['rdma_sym'] / rs['total']:.0%} | {fmt(rs['rdma_src'])} | {rs['rdma_src'] / rs['total']:.0%} |")
    print()
    print("Windows: M messages each, from doorbell FROM to doorbell N - TAIL, in the runs with -n N1 and -n N2 "
          "together (send_lat: TAIL is the 512 receives both tools keep posted; in the last 512 iterations they "
          "post none again). A window "
          "above the median holds extra polls (an answer came after the wait had ended); the windows of the 2 B "
          "bandwidth tests also differ by a few instructions among themselves (perftest's alternate between two "
          "counts, `perf`'s follow the allocator's state). Last column: the whole process's (count(N2) - "
          "count(N1)) / (N2 - N1), which also holds whatever runs outside the loop and grows with N (the "
          "latency statistics sort the samples; perftest measures the CPU frequency by spinning on "
          "gettimeofday) and the polls that found nothing:")
    print()
    print("| test | size [B] | tool | N1, N2 | M | FROM | TAIL | windows | identical to the median | "
          "min - max per message | whole process, difference |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---|---:|")
    for test, size in order:
        p = params[(test, size)]
        for tool in ("perf", "perftest"):
            if not windows[(test, size, tool, 1)]:
                continue
            n, same, lo, hi = spread((test, size, tool, 1))
            d = difference(test, size, tool)
            print(f"| {test} | {size} | {tool} | {', '.join(map(str, p['ns']))} | {p['m']} | {p['first']} | "
                  f"{p['tail']} | {n} | "
                  f"{same} | {fmt(lo)} - {fmt(hi)} | {fmt(d) if d is not None else '-'} |")
    repeats = sorted({(t, s) for (t, s, _, r) in windows if r == 2})
    if repeats:
        print()
        print("Repeatability: the same case run again at the end of the same boot (run 2: both tools, -n N2 "
              "only), the median window per message:")
        print()
        print("| test | size [B] | tool | run 1 | run 2 | run 1: windows identical to its median | "
              "run 2: windows identical to its median |")
        print("|---|---:|---|---:|---:|---:|---:|")
        for test, size in repeats:
            for tool in ("perf", "perftest"):
                a, b = median((test, size, tool, 1)), median((test, size, tool, 2))
                if a is None or b is None:
                    continue
                na, sa, _, _ = spread((test, size, tool, 1))
                nb, sb, _, _ = spread((test, size, tool, 2))
                print(f"| {test} | {size} | {tool} | {fmt(a['total'])} | {fmt(b['total'])} | {sa} of {na} | "
                      f"{sb} of {nb} |")


if __name__ == "__main__":
    main()
