"""ci/lib/callgrind_format.py: reads callgrind's output format, for
callgrind-split.py and callgrind-lines.py.

`records(path)` yields one tuple per meaningful line:

  ("name", SPACE, KEY, NAME)  a position name: KEY is the line's key (ob,
                              cob, fl, fi, fe, cfi, cfl, fn, cfn), SPACE the
                              table it names in (ob, fl or fn), NAME the
                              name with compression undone
  ("cost", FIELDS)            a self-cost line, split at spaces
  ("call", FIELDS)            the cost line right after a `calls=` line: the
                              call's inclusive cost, not the caller's own
  ("positions", COLUMNS)      e.g. ["instr", "line"] with --dump-instr=yes
  ("events", COLUMNS)         e.g. ["Ir"]
  ("total", N)                the `summary:`/`totals:` count

Names may be compressed: `(id) name` defines an id, `(id)` refers to it;
objects, files and functions each have their own ids; `cob=` shares the
objects', `cfi=`/`cfl=`/`fi=`/`fe=` the files', `cfn=` the functions'. A name
may be defined in a `cob=` line only (a called object), so every key of a
space reads and fills the same table. Positions in cost lines may be
compressed too ("+N"/"-N" relative to the line before, "*" the same):
`position` undoes that for one column.
"""

import re

NAME = re.compile(r"^\((\d+)\)(?: (.*))?$")
SPACE = {"ob": "ob", "cob": "ob", "fl": "fl", "fi": "fl", "fe": "fl", "cfi": "fl",
         "cfl": "fl", "fn": "fn", "cfn": "fn"}


def records(path):
    """The records of one callgrind output file (see the module's text)."""
    names = {"ob": {}, "fl": {}, "fn": {}}
    after_calls = False
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                yield ("call" if after_calls else "cost", line.split())
                after_calls = False
                continue
            key, sep, value = line.partition("=")
            if sep and key in SPACE:
                space = SPACE[key]
                m = NAME.match(value)
                if m:
                    if m.group(2) is not None:
                        names[space][m.group(1)] = m.group(2)
                    name = names[space].get(m.group(1), "???")
                else:
                    name = value
                yield ("name", space, key, name)
                continue
            if line.startswith("calls="):
                after_calls = True
            elif line.startswith("positions:"):
                yield ("positions", line.split()[1:])
            elif line.startswith("events:"):
                yield ("events", line.split()[1:])
            elif line.startswith(("summary:", "totals:")):
                yield ("total", int(line.split()[1]))


def position(token, last):
    """One position column of a cost line, given the same column's value on
    the line before."""
    if token == "*":
        return last
    if token[0] in "+-":
        return last + int(token, 0)
    return int(token, 0)
