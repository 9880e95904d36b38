#!/usr/bin/env python3
"""Compares two p2ptrain safetensors snapshots tensor by tensor (standard library only).

    compare_snapshots.py A.safetensors B.safetensors TOLERANCE

Prints whether they are bitwise identical and the largest |a - b| / max(1, |a|, |b|) (the measure
of tests/common/mod.rs's max_rel_diff); exits 1 when names, shapes or dtypes differ, a value is not
finite, or the difference exceeds TOLERANCE.
"""

import json
import math
import struct
import sys


def load(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    out = {}
    for name, t in header.items():
        if t["dtype"] != "F32":
            sys.exit(f"{path}: {name} is {t['dtype']}, not F32")
        begin, end = t["data_offsets"]
        out[name] = (t["shape"], struct.unpack(f"<{(end - begin) // 4}f", data[begin:end]))
    return out


def main(argv):
    if len(argv) != 4:
        sys.exit(f"usage: {argv[0]} A.safetensors B.safetensors TOLERANCE")
    a, b, tol = load(argv[1]), load(argv[2]), float(argv[3])
    if sorted(a) != sorted(b):
        sys.exit(f"tensor names differ: {sorted(a)} vs {sorted(b)}")
    worst, identical = 0.0, True
    for name in sorted(a):
        (sa, va), (sb, vb) = a[name], b[name]
        if sa != sb:
            sys.exit(f"shape of {name}: {sa} vs {sb}")
        for x, y in zip(va, vb):
            if not (math.isfinite(x) and math.isfinite(y)):
                sys.exit(f"{name} is not finite")
            identical = identical and x == y
            worst = max(worst, abs(x - y) / max(1.0, abs(x), abs(y)))
    print(f"{len(a)} tensors, bitwise identical: {identical}, max relative difference {worst:e}")
    if worst > tol:
        sys.exit(f"weights differ by {worst:e} > {tol:e}")


if __name__ == "__main__":
    main(sys.argv)
