#!/usr/bin/env python3
"""Lists the tensors of a p2ptrain weights snapshot with the `safetensors` Python package.

A cross-check of the files written by `p2ptrain::snapshot::save_weights` against the reference
reader; the Rust tests do not need it.

    pip install safetensors numpy
    python3 tests/python/load_safetensors.py runs/mnist/snapshots/model_iter_1000.safetensors

Prints the header metadata, then one line per tensor: name, dtype, shape, and a checksum.
Exits non-zero if the file cannot be read or holds a tensor that is not float32.
"""

import json
import struct
import sys

import numpy as np
from safetensors.numpy import load_file


def header_metadata(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)).get("__metadata__", {})


def main(argv):
    if len(argv) != 2:
        print(f"usage: {argv[0]} FILE.safetensors", file=sys.stderr)
        return 2
    path = argv[1]
    tensors = load_file(path)
    for key, value in sorted(header_metadata(path).items()):
        print(f"# {key} = {value}")
    bad = 0
    for name in sorted(tensors):
        t = tensors[name]
        if t.dtype != np.float32:
            bad += 1
        print(f"{name}\t{t.dtype}\t{list(t.shape)}\tsum={float(t.sum(dtype=np.float64)):.6g}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
