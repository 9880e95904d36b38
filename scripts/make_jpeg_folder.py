#!/usr/bin/env python3
"""Writes an ImageNet-like tree of synthetic JPEGs, for tests and data-pipeline benchmarks.

    OUT/train/class_000/img_00000.JPEG ...   (--classes folders × --train-per-class images)
    OUT/val/class_000/img_00000.JPEG ...     (--val-per-class images per class)
    OUT/train.txt, OUT/val.txt               (Caffe list files over the same images)

No image data set can be downloaded where p2ptrain is developed, so this makes images with
ImageNet's typical geometry and coding: 500×375 or 375×500 (landscape three times out of four),
a tenth of them other sizes between 200 and 800 pixels a side, 4:2:0 chroma, quality 90, one in
ten progressive. The pixels are smooth random fields with texture and noise, so that the files
compress about as photographs do (about 66 KiB at 500×375 with the defaults). Deterministic for a
given --seed (each class folder draws from its own generator, seeded by the seed, the split and the
class), whatever --jobs (processes writing class folders in parallel; default: every core).

Needs numpy and Pillow (Debian: python3-numpy python3-pil; both come with torchvision).
Example: python3 scripts/make_jpeg_folder.py --out /tmp/jpegs --classes 10 --train-per-class 100
"""
import argparse
import multiprocessing
import os

import numpy as np
from PIL import Image


def size_of(rng):
    """(width, height) of one image."""
    if rng.random() < 0.1:
        return int(rng.integers(200, 801)), int(rng.integers(200, 801))
    return (500, 375) if rng.random() < 0.75 else (375, 500)


def pixels(rng, width, height):
    """A smooth colour field with texture and noise, uint8 (height, width, 3)."""
    coarse = rng.random((height // 32 + 2, width // 32 + 2, 3)) * 255
    img = Image.fromarray(coarse.astype(np.uint8)).resize((width, height), Image.BICUBIC)
    base = np.asarray(img, dtype=np.float32)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    freq = rng.uniform(0.02, 0.2, size=2)
    texture = 24 * np.sin(x * freq[0] + y * freq[1] + rng.uniform(0, 6.3))[..., None]
    noise = rng.normal(0, 9, size=(height, width, 3))
    return np.clip(base + texture + noise, 0, 255).astype(np.uint8)


def write_class(job):
    """Writes OUT/split/class_c/...; returns the list-file lines of that folder."""
    root, split, split_index, c, per_class, seed, quality, grey_fraction = job
    rng = np.random.default_rng([seed, split_index, c])
    folder = os.path.join(root, split, f"class_{c:03d}")
    os.makedirs(folder, exist_ok=True)
    lines = []
    for i in range(per_class):
        width, height = size_of(rng)
        img = Image.fromarray(pixels(rng, width, height))
        if rng.random() < grey_fraction:
            img = img.convert("L")
        name = f"img_{i:05d}.JPEG"
        img.save(os.path.join(folder, name), "JPEG", quality=quality,
                 progressive=bool(rng.random() < 0.1), subsampling=2)
        lines.append(f"{split}/class_{c:03d}/{name} {c}")
    return lines


def write_split(pool, root, split, split_index, a, per_class):
    """Writes OUT/split/class_*/... on the pool's processes; returns the list-file lines."""
    jobs = [(root, split, split_index, c, per_class, a.seed, a.quality, a.grey_fraction)
            for c in range(a.classes)]
    lines = [line for folder in pool.map(write_class, jobs) for line in folder]
    with open(os.path.join(root, f"{split}.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--train-per-class", type=int, default=100)
    p.add_argument("--val-per-class", type=int, default=10)
    p.add_argument("--quality", type=int, default=90)
    p.add_argument("--grey-fraction", type=float, default=0.02,
                   help="fraction of images stored with one channel (ImageNet has some)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=os.cpu_count(),
                   help="processes writing class folders in parallel (default: every core)")
    a = p.parse_args()
    n = 0
    with multiprocessing.Pool(max(1, a.jobs)) as pool:
        for index, (split, per) in enumerate((("train", a.train_per_class), ("val", a.val_per_class))):
            n += len(write_split(pool, a.out, split, index, a, per))
    sizes = [os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(a.out) for f in fs
             if f.endswith(".JPEG")]
    print(f"{n} JPEGs under {a.out}, mean {sum(sizes) / max(len(sizes), 1) / 1024:.1f} KiB")


if __name__ == "__main__":
    main()
