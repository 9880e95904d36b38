#!/usr/bin/env python3
"""Checks that two safetensors files hold bit-identical tensors (same names, dtypes, shapes and
bytes; the header's free-form metadata may differ). Standard library only. Exit 0 when they do.

    same_weights.py A.safetensors B.safetensors
"""
import json
import struct
import sys


def tensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items()}


def main():
    a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
    if sorted(a) != sorted(b):
        print(f"tensor names differ: {sorted(a)} vs {sorted(b)}")
        return 1
    differ = [k for k in sorted(a) if a[k] != b[k]]
    if differ:
        print(f"{len(differ)} of {len(a)} tensors differ, first: {differ[0]}")
        return 1
    print(f"{len(a)} tensors bit-identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
