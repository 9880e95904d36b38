#!/usr/bin/env python3
"""Sums the kernel times of an Nsight Compute CSV (`ncu --csv --metrics gpu__time_duration.sum`,
as scripts/gpu/kernel_times.sh writes it): a table by kernel name (total, launches, mean,
largest) and one by name and grid (mean and largest), in microseconds, largest totals first.
Where the CSV also holds DRAM bytes, resident warps and registers (kernel_times.sh with
AS_RUN=1), the grid table adds each grid's mean DRAM traffic, its rate, the warps resident
and the registers per thread.

    python3 scripts/gpu/kernel_times.py KERNELS.csv
"""

import collections
import csv
import sys

UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
BYTES = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}
TIME = "gpu__time_duration.sum"
DRAM = ("dram__bytes_read.sum", "dram__bytes_write.sum")
WARPS = "sm__warps_active.avg.pct_of_peak_sustained_active"
REGISTERS = "launch__registers_per_thread"


def number(text):
    return float(text.replace(",", ""))


def launches(path):
    """Each launch's (kernel, grid, block) and its metrics: microseconds (TIME), bytes (DRAM),
    percent (WARPS), registers; ncu's own lines are skipped."""
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    by_id = collections.OrderedDict()
    for r in csv.DictReader(lines):
        key = (r["ID"], r["Kernel Name"], r["Grid Size"], r["Block Size"])
        metrics = by_id.setdefault(key, {})
        name, unit, value = r.get("Metric Name"), r["Metric Unit"], r["Metric Value"]
        if name == TIME:
            if unit not in UNITS:
                raise SystemExit(f"{path}: unknown time unit {unit!r}")
            metrics[name] = number(value) * UNITS[unit]
        elif name in DRAM:
            if unit not in BYTES:
                raise SystemExit(f"{path}: unknown byte unit {unit!r}")
            metrics[name] = number(value) * BYTES[unit]
        elif name in (WARPS, REGISTERS):
            metrics[name] = number(value)
    for (_, kernel, grid, block), metrics in by_id.items():
        if TIME in metrics:
            yield kernel, grid, block, metrics


def table(title, head, groups, extra=None):
    out = [title, "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for key, runs in sorted(groups.items(), key=lambda kv: -sum(m[TIME] for m in kv[1])):
        t = [m[TIME] for m in runs]
        key = key if isinstance(key, tuple) else (key,)
        cells = list(key) + [f"{sum(t):,.1f}", str(len(t)), f"{sum(t) / len(t):,.1f}", f"{max(t):,.1f}"]
        out.append("| " + " | ".join(cells + (extra(runs) if extra else [])) + " |")
    return out


def traffic(runs):
    """Mean DRAM MB a launch, its rate over the launches' time, mean resident warps, registers."""
    dram = sum(sum(m.get(k, 0.0) for k in DRAM) for m in runs)
    time_us = sum(m[TIME] for m in runs)
    warps = sum(m.get(WARPS, 0.0) for m in runs) / len(runs)
    registers = max(m.get(REGISTERS, 0.0) for m in runs)
    rate = dram / time_us / 1e6 if time_us else 0.0
    return [f"{dram / len(runs) / 1e6:,.1f}", f"{rate:.2f}", f"{warps:.1f}", f"{registers:.0f}"]


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    by_name, by_grid = collections.defaultdict(list), collections.defaultdict(list)
    for name, grid, block, metrics in launches(sys.argv[1]):
        by_name[name].append(metrics)
        by_grid[name, grid, block].append(metrics)
    if not by_name:
        print(f"{sys.argv[1]}: no timed kernel", file=sys.stderr)
        return 1
    total = sum(m[TIME] for runs in by_name.values() for m in runs)
    stats = ["total µs", "launches", "mean µs", "largest µs"]
    out = table(f"Kernel times (Nsight Compute), {total:,.1f} µs in all", ["kernel"] + stats, by_name)
    measured = all(DRAM[0] in m for runs in by_grid.values() for m in runs)
    extra = ["DRAM MB", "TB/s", "warps resident %", "registers"] if measured else []
    out += [""] + table("By grid", ["kernel", "grid", "block"] + stats + extra, by_grid,
                        traffic if measured else None)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
