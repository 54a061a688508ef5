"""Where a kernel's warps wait, from an Nsight Compute report (scripts/gpu_ncu.sh runs it there).

    python3 bench/gpu/ncu_stalls.py RAW_CSV [SOURCE_CSV]

RAW_CSV: `ncu --import R.ncu-rep --page raw --csv` (one row per profiled kernel). Prints the warp
state breakdown: for each stall reason, the warp cycles per issued instruction spent in it
(`smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio`), largest first; their sum is
the "Warp Cycles Per Issued Instruction" of the details page.
SOURCE_CSV (optional): `ncu --import R.ncu-rep --page source --csv --print-source sass`. Prints the
40 SASS instructions with the most warp-state samples, with their sample columns, so that a stall
can be tied to an instruction (a barrier, a wgmma wait, an mbarrier try_wait); then the executed
instructions by opcode (the source page's "Instructions Executed" per SASS line, summed over lines
with the same opcode): where a kernel that issues at the same rate as another but runs longer spends
its extra instructions (ours against cuDNN's backward: 481 M against 376 M, perf-notes).
"""
import csv
import sys

STALL = "smsp__average_warps_issue_stalled_"
SUFFIX = "_per_issue_active.ratio"


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def stalls(path):
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    header = next((r for r in rows if any(c.startswith(STALL) for c in r)), None)
    if header is None:
        print(f"{path}: no {STALL}* metrics (was the report taken with --set full?)")
        return
    start = rows.index(header)
    for row in rows[start + 1:]:
        values = {h: number(v) for h, v in zip(header, row)}
        pairs = [(h[len(STALL):-len(SUFFIX)], v) for h, v in values.items()
                 if h.startswith(STALL) and h.endswith(SUFFIX) and v is not None]
        if not pairs:
            continue  # the units row
        total = sum(v for _, v in pairs)
        print(f"warp cycles per issued instruction: {total:.2f}")
        for name, v in sorted(pairs, key=lambda p: -p[1]):
            if v >= 0.01:
                print(f"  {name:<28} {v:6.2f}  {100 * v / total:5.1f} %")


def source_table(path):
    """The source page's header and its SASS rows (those with a cell per column), or None."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    header = next((r for r in rows if "Source" in r), None)
    if header is None:
        print(f"{path}: no Source column")
        return None
    return header, [r for r in rows[rows.index(header) + 1:] if len(r) == len(header)]


def hot_instructions(table, top=40):
    header, rows = table
    src = header.index("Source")
    cols = [i for i, h in enumerate(header) if "sampl" in h.lower() or "stall" in h.lower()]
    if not cols:
        print(f"no sampling columns in {header}")
        return
    key = cols[0]
    body = [r for r in rows if number(r[key]) is not None]
    total = sum(number(r[key]) for r in body) or 1.0
    print(f"top {top} instructions by '{header[key]}' (of {total:.0f} samples); columns: "
          + ", ".join(header[i] for i in cols))
    for r in sorted(body, key=lambda r: -number(r[key]))[:top]:
        share = 100 * number(r[key]) / total
        print(f"  {share:5.1f} %  " + " ".join(f"{r[i]:>7}" for i in cols) + "  " + r[src].strip()[:90])


def opcode(sass):
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def opcode_mix(table, top=25):
    header, rows = table
    src = header.index("Source")
    col = next((i for i, h in enumerate(header) if h.strip().lower() == "instructions executed"), None)
    if col is None:
        col = next((i for i, h in enumerate(header) if "instructions executed" in h.lower()), None)
    if col is None:
        print(f"no 'Instructions Executed' column; columns: {', '.join(header)}")
        return
    counts = {}
    for r in rows:
        if number(r[col]) is not None:
            op = opcode(r[src])
            counts[op] = counts.get(op, 0.0) + number(r[col])
    total = sum(counts.values()) or 1.0
    print(f"executed instructions by opcode ('{header[col]}', {total:,.0f} warp instructions in all):")
    for op, n in sorted(counts.items(), key=lambda p: -p[1])[:top]:
        print(f"  {op:<12} {n:>14,.0f}  {100 * n / total:5.1f} %")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    stalls(sys.argv[1])
    if len(sys.argv) == 3:
        table = source_table(sys.argv[2])
        if table is not None:
            hot_instructions(table)
            opcode_mix(table)
