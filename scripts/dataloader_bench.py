#!/usr/bin/env python3
"""Times torchvision's standard ImageNet input pipeline on a JPEG folder, the reference that
`p2ptrain bench-data` is compared with (docs/benchmarks.md).

    python3 scripts/dataloader_bench.py /data/jpegs/train --workers 8 16 32 --batches 50

DataLoader(ImageFolder(root, RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor +
Normalize), batch_size=64, shuffle=True, pin_memory=True, persistent workers): for each worker
count, the first --warmup batches are dropped (worker start-up), then --batches batches are
timed; prints images/s and images/s per worker, and the best worker count. The first batch is
checked (shape, finite values, labels in range) before anything is timed.

    python3 scripts/dataloader_bench.py /data/jpegs/train --decode-only --images 384

times Pillow's JPEG decoding alone (libjpeg-turbo) in this one process, over the first --images
files in sorted order, wall clock and CPU time: the figure `p2ptrain bench-data --decode-only
--workers 1` is compared with. This mode needs only Pillow.

Make a folder with scripts/make_jpeg_folder.py. Needs torch and torchvision (not for
--decode-only).
"""
import argparse
import glob
import io
import os
import time


def decode_only(root, images):
    from PIL import Image
    files = sorted(glob.glob(os.path.join(root, "*", "*")))[:images]
    data = [open(f, "rb").read() for f in files]
    for d in data[:16]:
        Image.open(io.BytesIO(d)).convert("RGB")
    wall, cpu = time.perf_counter(), time.process_time()
    for d in data:
        Image.open(io.BytesIO(d)).convert("RGB")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"Pillow {Image.__version__} decode to RGB, 1 thread: {len(data)} images in "
          f"{wall:.3f} s: {len(data) / wall:.1f} images/s; {cpu:.3f} CPU-seconds: "
          f"{len(data) / cpu:.1f} images per CPU-second")


def loader_rate(root, workers, batch, warmup, batches):
    import torch
    from torchvision import datasets, transforms
    tf = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])
    ds = datasets.ImageFolder(root, tf)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                         pin_memory=True, persistent_workers=workers > 0,
                                         drop_last=True)
    it = iter(loader)
    x, y = next(it)
    assert x.shape == (batch, 3, 224, 224), x.shape
    assert torch.isfinite(x).all() and int(y.min()) >= 0 and int(y.max()) < len(ds.classes)
    for _ in range(warmup - 1):
        next(it)
    start = time.perf_counter()
    n = 0
    for _ in range(batches):
        try:
            x, _ = next(it)
        except StopIteration:
            it = iter(loader)
            x, _ = next(it)
        n += x.shape[0]
    return n / (time.perf_counter() - start)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("root", help="an ImageFolder tree (one folder per class)")
    p.add_argument("--workers", type=int, nargs="+", default=[4, 8, 16, 32])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batches", type=int, default=50)
    p.add_argument("--decode-only", action="store_true")
    p.add_argument("--images", type=int, default=384)
    a = p.parse_args()
    if a.decode_only:
        decode_only(a.root, a.images)
        return
    best = None
    for w in a.workers:
        rate = loader_rate(a.root, w, a.batch, a.warmup, a.batches)
        print(f"DataLoader, {w} workers: {rate:.1f} images/s, {rate / max(w, 1):.1f} images/s "
              f"per worker", flush=True)
        if best is None or rate > best[1]:
            best = (w, rate)
    print(f"best: {best[0]} workers, {best[1]:.1f} images/s")


if __name__ == "__main__":
    main()
