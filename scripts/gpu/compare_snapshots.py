#!/usr/bin/env python3
"""Compares two p2ptrain snapshots (safetensors): same tensor names and shapes, and the largest
relative difference |a-b| / max(1, |a|, |b|) below a tolerance. Exit 0 when they agree, 1 otherwise.

    compare_snapshots.py A.safetensors B.safetensors [--tol 2e-4] [--label TEXT]
"""
import argparse
import sys

import numpy as np
from safetensors.numpy import load_file


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--tol", type=float, default=2e-4)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    a, b = load_file(args.a), load_file(args.b)
    if sorted(a) != sorted(b):
        print(f"FAIL {args.label}: tensor names differ: {sorted(a)} vs {sorted(b)}")
        return 1
    worst, where = 0.0, ""
    for name in sorted(a):
        x, y = a[name].astype(np.float64), b[name].astype(np.float64)
        if x.shape != y.shape:
            print(f"FAIL {args.label}: {name} shape {x.shape} vs {y.shape}")
            return 1
        if not (np.isfinite(x).all() and np.isfinite(y).all()):
            print(f"FAIL {args.label}: {name} is not finite")
            return 1
        rel = np.abs(x - y) / np.maximum(1.0, np.maximum(np.abs(x), np.abs(y)))
        if rel.max() > worst:
            worst, where = float(rel.max()), name
    ok = worst <= args.tol
    print(f"{'OK  ' if ok else 'FAIL'} {args.label}: max relative difference {worst:.3e} ({where}), tolerance {args.tol:.1e}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
