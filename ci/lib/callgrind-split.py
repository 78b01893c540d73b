#!/usr/bin/env python3
"""ci/lib/callgrind-split.py: a process's instruction count from callgrind
output files, split by where the instructions ran (ci/bench-instr).

    callgrind-split.py [--top K] [--harness NAME] PROGRAM FILE...

Prints, for every FILE, one line: the file name, then tab-separated
NAME=VALUE fields:

  total    every instruction of the file (its `summary:`/`totals:` line)
           except the harness's
  own      the program's own binary (PROGRAM, compared by file name: the Rust
           `perf` with the `rdma` crate and Rust's std linked in, or a
           perftest binary)
  verbs    libibverbs.so* and the providers (the files under
           /usr/lib/*/libibverbs/, followed through their symlinks: rxe's
           librxe-rdmav*.so, libmlx5.so.1.*, ...)
  libc     libc.so* and the dynamic loader (ld-linux*)
  other    the rest (libm, libnl, librdmacm, the vDSO, valgrind's preload,
           code in no known object)
  harness  the object named NAME (ci/bench-instr's preloaded library), left
           out of every other field
  rdma_sym self cost of the own binary's functions whose name contains
           `rdma::` (the `rdma` crate's functions, with whatever LTO inlined
           into them)
  rdma_src cost of the own binary's lines whose source file is under
           `rdma/src/` (the crate's code wherever LTO put it, including what
           it inlined into the program's loops; needs line tables)

--top K adds, after each file's line, its K functions with the largest self
cost, one per line: "#", the count, the class, the function, the object.

Self cost only: a cost line right after a `calls=` line is the call's
inclusive cost and is skipped; the self costs must add up to the file's total
(checked). The format (compressed names included) is read by
callgrind_format.py. A cost line has as many position columns as the `positions:` line names
(`line` with --dump-instr=no), then the event counts; Ir must be the first
event.
"""

import glob
import os
import sys

from callgrind_format import records

CLASSES = ("own", "verbs", "libc", "other", "harness")


def provider_files():
    """Real paths of libibverbs' providers (the files its provider directory
    holds or points to)."""
    found = set()
    for p in glob.glob("/usr/lib/*/libibverbs/*") + glob.glob("/usr/lib64/libibverbs/*"):
        found.add(os.path.realpath(p))
    return found


def classify(obj, program, harness, providers):
    base = os.path.basename(obj)
    if harness and base == harness:
        return "harness"
    if base == program:
        return "own"
    if base.startswith("libibverbs.so") or "/libibverbs/" in obj or os.path.realpath(obj) in providers:
        return "verbs"
    if base.startswith("libc.so") or base.startswith("ld-linux"):
        return "libc"
    return "other"


def split(path, program, harness, providers, top=0):
    """The fields of one file, and its `top` most expensive functions."""
    npos = 1
    total = None
    sums = dict.fromkeys(CLASSES, 0)
    per_fn = {}
    rdma_sym = rdma_src = 0
    cls, obj, fn = "other", "???", "???"
    fn_is_rdma = file_is_rdma = fl_is_rdma = False
    for rec in records(path):
        kind = rec[0]
        if kind == "cost":
            fields = rec[1]
            cost = int(fields[npos]) if len(fields) > npos else 0
            sums[cls] += cost
            if top:
                k = (cls, fn, obj)
                per_fn[k] = per_fn.get(k, 0) + cost
            if cls == "own":
                rdma_sym += cost if fn_is_rdma else 0
                rdma_src += cost if file_is_rdma else 0
        elif kind == "name":
            _, _, key, name = rec
            if key == "ob":
                obj = name
                cls = classify(name, program, harness, providers)
            elif key == "fn":
                fn = name
                fn_is_rdma = "rdma::" in name
                file_is_rdma = fl_is_rdma  # a function starts in its own file (fl=)
            elif key == "fl":
                fl_is_rdma = file_is_rdma = "/rdma/src/" in name
            elif key in ("fi", "fe"):
                file_is_rdma = "/rdma/src/" in name
        elif kind == "positions":
            npos = len(rec[1])
        elif kind == "events":
            if rec[1][:1] != ["Ir"]:
                sys.exit(f"{path}: expected Ir as the first event, got {rec[1]!r}")
        elif kind == "total":
            total = rec[1]
    if total is None:
        sys.exit(f"{path}: no summary or totals line (did callgrind finish?)")
    if sum(sums.values()) != total:
        sys.exit(f"{path}: self costs add up to {sum(sums.values())}, not the file's total {total}")
    out = {"total": total - sums["harness"], **sums, "rdma_sym": rdma_sym, "rdma_src": rdma_src}
    ranked = sorted(per_fn.items(), key=lambda kv: -kv[1])[:top]
    return out, ranked


def main():
    args = sys.argv[1:]
    top, harness = 0, None
    while args[:1] in (["--top"], ["--harness"]) and len(args) > 1:
        if args[0] == "--top":
            top = int(args[1])
        else:
            harness = os.path.basename(args[1])
        args = args[2:]
    if len(args) < 2:
        sys.exit("usage: callgrind-split.py [--top K] [--harness NAME] PROGRAM FILE...")
    program = os.path.basename(args[0])
    providers = provider_files()
    for path in args[1:]:
        out, ranked = split(path, program, harness, providers, top)
        print(path + "\t" + "\t".join(f"{k}={v}" for k, v in out.items()))
        for (c, f, o), v in ranked:
            print(f"# {v:>12}  {c:<7} {f}  [{os.path.basename(o)}]")


if __name__ == "__main__":
    main()
