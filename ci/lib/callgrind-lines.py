#!/usr/bin/env python3
"""ci/lib/callgrind-lines.py: where a program's own instructions went, by the
line of this workspace they came from, however much was inlined.

    callgrind-lines.py [--per N] [--by file|line|asm] PROGRAM FILE

FILE is a callgrind output of PROGRAM's run with --dump-instr=yes (e.g. a
window of `ci/bench-instr --dump-instr`, kept in target/instr/cg/). The self
cost of every instruction address of PROGRAM's own binary is attributed,
through addr2line's chain of inlined frames (innermost first), to the first
frame whose file lies under the workspace (this repository); an instruction
of std or core inlined into the crate counts for the crate's line that
called it. Costs are divided by --per (e.g. the window's message count).

  --by file   one line per source file (the default)
  --by line   one line per file:line
  --by asm    one line per instruction: its cost, address, disassembly
              (objdump) and its three innermost frames

Why: callgrind_annotate charges inlined code to the line of the inlined
function (library/core/src/sync/atomic.rs, ...), which says nothing about
which step of the crate paid for it. Needs binutils (addr2line, objdump)
and PROGRAM built with line tables (ci/bench-instr does), and the very
binary that was counted: a rebuild moves every address.
"""

import argparse
import collections
import os
import re
import signal
import subprocess
import sys

from callgrind_format import position, records


def own_costs(path, program):
    """Self cost per instruction address of `program`'s binary in `path`."""
    want = os.path.basename(program)
    obj = None
    addr = 0
    costs = collections.Counter()
    npos = 1
    for rec in records(path):
        kind = rec[0]
        if kind in ("cost", "call"):
            fields = rec[1]
            # Every cost line moves the address, a call's included.
            addr = position(fields[0], addr)
            if kind == "cost" and obj is not None and os.path.basename(obj) == want \
                    and len(fields) > npos:
                costs[addr] += int(fields[npos])
        elif kind == "name" and rec[2] == "ob":
            obj = rec[3]
        elif kind == "positions":
            if rec[1][:1] != ["instr"]:
                sys.exit(f"{path}: no instruction addresses (run callgrind with --dump-instr=yes)")
            npos = len(rec[1])
    return costs


def frames(program, addrs):
    """addr2line's inlined frames (file:line, innermost first) per address."""
    out = subprocess.run(["addr2line", "-e", program, "-i", "-a"] + [hex(a) for a in addrs],
                         capture_output=True, text=True, check=True).stdout
    chains, cur = {}, None
    for line in out.splitlines():
        if line.startswith("0x"):
            cur = int(line, 16)
            chains[cur] = []
        elif line and cur is not None:
            chains[cur].append(line.split(" ")[0])
    return chains


def main():
    # Piped into head: stop quietly.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per", type=float, default=1.0)
    ap.add_argument("--by", choices=("file", "line", "asm"), default="file")
    ap.add_argument("program")
    ap.add_argument("file")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + "/"
    costs = own_costs(args.file, args.program)
    if not costs:
        sys.exit(f"{args.file}: no cost in {os.path.basename(args.program)}")
    addrs = sorted(costs)
    chains = frames(args.program, addrs)
    short = lambda loc: loc.replace(root, "")
    if args.by == "asm":
        dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--start-address={addrs[0]}",
                              f"--stop-address={addrs[-1] + 16}", args.program],
                             capture_output=True, text=True, check=True).stdout
        text = {}
        for line in dis.splitlines():
            m = re.match(r"^\s+([0-9a-f]+):\s+(.*)$", line)
            if m:
                text[int(m.group(1), 16)] = m.group(2)
        for a in addrs:
            where = " < ".join(short(f) for f in chains.get(a, [])[:3])
            print(f"{costs[a] / args.per:8.2f} {a:8x}  {text.get(a, '?'):40.40s} {where}")
        return
    total = collections.Counter()
    for a in addrs:
        chain = chains.get(a, [])
        ours = next((f for f in chain if f.startswith(root)), None)
        if ours is None:
            key = "(outside the workspace) " + (chain[-1] if chain else "?")
        else:
            key = short(ours) if args.by == "line" else short(ours).rsplit(":", 1)[0]
        total[key] += costs[a]
    for key in sorted(total):
        print(f"{total[key] / args.per:8.2f}  {key}")
    print(f"{sum(total.values()) / args.per:8.2f}  in all")


if __name__ == "__main__":
    main()
