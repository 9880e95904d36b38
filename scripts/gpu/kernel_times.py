#!/usr/bin/env python3
"""Sums the kernel times of an Nsight Compute CSV (`ncu --csv --metrics gpu__time_duration.sum`,
as scripts/gpu/kernel_times.sh writes it): a table by kernel name (total, launches, mean,
largest) and one by name and grid (mean and largest), in microseconds, largest totals first.

    python3 scripts/gpu/kernel_times.py KERNELS.csv
"""

import collections
import csv
import sys

UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def rows(path):
    """(kernel, grid, block, microseconds) of each timed launch; ncu's own lines are skipped."""
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(r["Metric Value"].replace(",", ""))
        unit = r["Metric Unit"]
        if unit not in UNITS:
            raise SystemExit(f"{path}: unknown time unit {unit!r}")
        yield r["Kernel Name"], r["Grid Size"], r["Block Size"], value * UNITS[unit]


def table(title, head, groups):
    out = [title, "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for key, t in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
        key = key if isinstance(key, tuple) else (key,)
        out.append("| " + " | ".join(key) + f" | {sum(t):,.1f} | {len(t)} | {sum(t) / len(t):,.1f} | {max(t):,.1f} |")
    return out


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    by_name, by_grid = collections.defaultdict(list), collections.defaultdict(list)
    for name, grid, block, us in rows(sys.argv[1]):
        by_name[name].append(us)
        by_grid[name, grid, block].append(us)
    if not by_name:
        print(f"{sys.argv[1]}: no timed kernel", file=sys.stderr)
        return 1
    total = sum(sum(t) for t in by_name.values())
    stats = ["total µs", "launches", "mean µs", "largest µs"]
    out = table(f"Kernel times (Nsight Compute), {total:,.1f} µs in all", ["kernel"] + stats, by_name)
    out += [""] + table("By grid", ["kernel", "grid", "block"] + stats, by_grid)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
