#!/usr/bin/env python3
"""Writes the timing twin of a config that reads real files: the same net and solver on synthetic
records of the data's shape, so a benchmark measures no file reading or decoding. The records are
whole 8-bit pixels (`pixels = "u8"`), as the IDX and CIFAR-10 files' are, so the batches travel to
the GPU as bytes, as the real data's do. FLOAT=1 keeps them floats (four times the bytes).

    python3 scripts/gpu/synthetic_config.py lenet OUT.toml          # config/lenet.toml, 1x28x28 IDX
    python3 scripts/gpu/synthetic_config.py cifar10_quick OUT.toml  # config/cifar10_quick.toml, CIFAR-10
    python3 scripts/gpu/synthetic_config.py resnet20 OUT.toml       # config/resnet20.toml, CIFAR-10
"""

import os
import re
import sys

# name -> (the config's data block, the synthetic block replacing it)
DATA = {
    "lenet": (r'format = "idx"\n(?:(?:train|test)_(?:images|labels) = [^\n]*\n)+',
              'format = "synthetic"\nshape = [1, 28, 28]\nclasses = 10\ntrain_size = 60000\n'
              'test_size = 10000\n'),
    "cifar10_quick": (r'format = "cifar10"\ntrain_files = \[.*?\]\ntest_files = \[.*?\]\n',
                      'format = "synthetic"\nshape = [3, 32, 32]\nclasses = 10\ntrain_size = 50000\n'
                      'test_size = 10000\n'),
}
DATA["resnet20"] = DATA["cifar10_quick"]


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in DATA:
        print(__doc__, file=sys.stderr)
        return 2
    name, out = sys.argv[1], sys.argv[2]
    source = f"config/{name}.toml"
    pattern, synthetic = DATA[name]
    if os.environ.get("FLOAT", "0") != "1":
        synthetic += 'pixels = "u8"\n'
    text, n = re.subn(pattern, synthetic, open(source).read(), flags=re.S)
    if n != 1:
        print(f"synthetic_config.py: {source}: no data block to replace", file=sys.stderr)
        return 1
    open(out, "w").write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
