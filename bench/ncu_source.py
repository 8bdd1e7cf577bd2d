#!/usr/bin/env python3
"""bench/ncu_source.py — where a kernel's warps spent their time, from Nsight
Compute's source page: the warp stall samples per source line, and per span
of the kernel's machine code between given source lines.

  ncu --section SourceCounters --import-source yes -k regex:NAME -c 1 -o rep PROGRAM ...
  ncu -i rep.ncu-rep --page source --csv --print-source cuda,sass > src.csv
  python3 bench/ncu_source.py src.csv [--top N] [--split FILE:LINE,...]

The program needs source lines (build with `make LINEINFO=1`, which builds
in build-lineinfo/). The CSV (plain or .gz) has, per source file, a row per
source line (its samples summed) and under it a row per SASS instruction of
that line. Printed:

  - the samples per source line, the largest first (--top, default 25), each
    with its share of the kernel's samples (those of its instructions; code
    inlined from several lines counts toward each) and its three largest
    stall reasons;
  - with --split, the machine code cut at the first instruction (lowest
    address) of each FILE:LINE given (FILE: a path suffix): the samples of
    each span in address order, and its largest lines. A kernel's code runs
    roughly in source order, so cutting at the first line of a loop and at
    the first line after it gives its start, loop and end.

Nothing here runs a GPU; tests/test_bench.c checks it on a small CSV.
"""
import argparse
import collections
import csv
import gzip
import sys

STALL_PREFIX = "stall_"


def open_text(path):
    if path.endswith(".gz"):
        return gzip.open(path, "rt", newline="")
    return open(path, newline="")


def number(text):
    text = text.replace(",", "").strip()
    try:
        return int(float(text))
    except ValueError:
        return 0


def parse(path):
    """(lines, sass): lines = [(file, line, text, samples, {reason: n})],
    sass = [(address, samples, file, line, text)], one row per address."""
    lines, sass, seen = [], [], set()
    header, file, current = None, None, None
    with open_text(path) as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "File Path":
                file = row[1]
                continue
            if row[0] in ("Function Name", "Kernel Name"):
                continue
            if row[0] == "Line No":
                header = row
                continue
            if header is None or len(row) < 5:
                continue
            if row[0]:   # a source line
                reasons = {h[len(STALL_PREFIX):]: number(v) for h, v in zip(header, row)
                           if h.startswith(STALL_PREFIX) and "Not Issued" not in h and number(v)}
                current = (file, number(row[0]))
                lines.append((file, number(row[0]), row[1].strip(), number(row[4]), reasons))
            elif current and row[2].startswith("0x"):   # an instruction of that line
                address = int(row[2], 16)
                if address not in seen:   # inlined code lists it under each line
                    seen.add(address)
                    sass.append((address, number(row[4]), current[0], current[1], row[3].strip()))
    if header is None:
        raise SystemExit(f"ncu_source: {path}: no 'Line No' header: not an ncu --page source "
                         "--csv export")
    sass.sort()
    return lines, sass


def where(file, line):
    return f"{file.rsplit('/', 1)[-1]}:{line}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="ncu --page source --csv --print-source cuda,sass output (.gz too)")
    ap.add_argument("--top", type=int, default=25, help="source lines to print (default 25)")
    ap.add_argument("--split", default="",
                    help="FILE:LINE,...: cut the machine code at each one's first instruction")
    args = ap.parse_args(argv)
    lines, sass = parse(args.csv)
    # The kernel's samples: its instructions' (inlined code counts toward
    # every source line it came from, so the lines' sum can be more)
    total = sum(n for _, n, _, _, _ in sass) if sass else sum(n for _, _, _, n, _ in lines)
    if total == 0:
        print("no warp stall samples (was the SourceCounters section collected?)")
        return 1
    print(f"{total} warp stall samples, {len(lines)} source lines, {len(sass)} instructions")
    print(f"\n{'share':>6}  {'samples':>7}  line: source | largest stall reasons (share of all)")
    for file, line, text, n, reasons in sorted(lines, key=lambda x: -x[3])[:args.top]:
        top = sorted(reasons.items(), key=lambda kv: -kv[1])[:3]
        why = ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in top)
        print(f"{100 * n / total:5.1f}%  {n:7d}  {where(file, line)}: {text[:70]} | {why}")
    if not args.split:
        return 0
    cuts = []
    for spec in args.split.split(","):
        name, _, number_text = spec.rpartition(":")
        if not name or not number_text.isdigit():
            raise SystemExit(f"ncu_source: --split takes FILE:LINE, not '{spec}'")
        first = [a for a, _, f, l, _ in sass if f.endswith(name) and l == int(number_text)]
        if not first:
            raise SystemExit(f"ncu_source: no instruction of {spec} in the export")
        cuts.append((min(first), spec))
    cuts.sort()
    bounds = [(0, "the kernel's start")] + cuts
    print("\nspans of the machine code (cut at the first instruction of each line given):")
    for i, (lo, name) in enumerate(bounds):
        hi = bounds[i + 1][0] if i + 1 < len(bounds) else float("inf")
        span = [x for x in sass if lo <= x[0] < hi]
        n = sum(x[1] for x in span)
        print(f"  from {name} (0x{lo:x}): {n} samples, {100 * n / total:.1f}%")
        by_line = collections.Counter()
        for _, s, f, l, _ in span:
            by_line[where(f, l)] += s
        for key, s in by_line.most_common(5):
            if s:
                print(f"      {100 * s / total:5.1f}%  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
