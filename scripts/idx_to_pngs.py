#!/usr/bin/env python3
"""Writes the images of an MNIST-style IDX data set as PNG files with Caffe list files:

    OUT/train/00000.png ... OUT/test/00000.png ...
    OUT/train.txt, OUT/test.txt     (`train/00000.png label` per line, in IDX order)

    python3 scripts/idx_to_pngs.py /usr/share/datasets/fashion-mnist data/fashion-mnist-png

IDX_DIR holds train-images-idx3-ubyte(.gz), train-labels-idx1-ubyte(.gz), t10k-images-idx3-ubyte(.gz)
and t10k-labels-idx1-ubyte(.gz). `p2ptrain convert-imageset --gray OUT/ OUT/train.txt DB` then
makes a Caffe LMDB of them. Needs numpy and Pillow.
"""
import gzip
import os
import sys

import numpy as np
from PIL import Image


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def find(idx_dir, stem):
    for name in (stem, stem + ".gz"):
        if os.path.exists(os.path.join(idx_dir, name)):
            return os.path.join(idx_dir, name)
    sys.exit(f"{idx_dir}: no {stem} or {stem}.gz")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    idx_dir, out = sys.argv[1], sys.argv[2]
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(find(idx_dir, f"{prefix}-images-idx3-ubyte"))
        labels = read_idx(find(idx_dir, f"{prefix}-labels-idx1-ubyte"))
        os.makedirs(os.path.join(out, split), exist_ok=True)
        lines = []
        for i, (img, label) in enumerate(zip(images, labels)):
            name = f"{split}/{i:05d}.png"
            Image.fromarray(img).save(os.path.join(out, name))
            lines.append(f"{name} {label}")
        with open(os.path.join(out, f"{split}.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"{len(lines)} {split} images in {out}/{split}")


if __name__ == "__main__":
    main()
