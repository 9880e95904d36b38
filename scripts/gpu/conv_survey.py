#!/usr/bin/env python3
"""ResNet-50's convolutions at batch 64 through PyTorch (cuDNN behind its graph API, benchmark
mode): forward, data gradient and weight gradient times per shape, channels-last, in TF32 on FP32
tensors and in bf16 tensors — the yardstick for the same table printed by the project's cuDNN
survey (`p2ptrain-unittests --ignored --nocapture resnet50_half_type_convolutions`), whose shapes
these are.

  python3 scripts/gpu/conv_survey.py [--reps 20]
"""
import argparse

import torch
import torch.nn.functional as F

# (C, H, W, K, kernel, stride, pad, count), as src/cuda/cudnn/survey.rs's SHAPES.
SHAPES = [
    (3, 224, 224, 64, 7, 2, 3, 1), (64, 56, 56, 256, 1, 1, 0, 1), (64, 56, 56, 64, 1, 1, 0, 1),
    (256, 56, 56, 64, 1, 1, 0, 2), (64, 56, 56, 64, 3, 1, 1, 3), (64, 56, 56, 256, 1, 1, 0, 3),
    (256, 56, 56, 512, 1, 2, 0, 1), (256, 56, 56, 128, 1, 2, 0, 1), (512, 28, 28, 128, 1, 1, 0, 3),
    (128, 28, 28, 128, 3, 1, 1, 4), (128, 28, 28, 512, 1, 1, 0, 4), (512, 28, 28, 1024, 1, 2, 0, 1),
    (512, 28, 28, 256, 1, 2, 0, 1), (1024, 14, 14, 256, 1, 1, 0, 5), (256, 14, 14, 256, 3, 1, 1, 6),
    (256, 14, 14, 1024, 1, 1, 0, 6), (1024, 14, 14, 2048, 1, 2, 0, 1),
    (1024, 14, 14, 512, 1, 2, 0, 1), (2048, 7, 7, 512, 1, 1, 0, 2), (512, 7, 7, 512, 3, 1, 1, 3),
    (512, 7, 7, 2048, 1, 1, 0, 3),
]
BATCH = 64


def timed(fn, reps):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def shape_times(shape, dtype, reps):
    c, h, w, k, r, stride, pad, _ = shape
    x = torch.randn(BATCH, c, h, w, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
    wt = torch.randn(k, c, r, r, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
    y = F.conv2d(x, wt, stride=stride, padding=pad)
    dy = torch.randn_like(y)
    fwd = timed(lambda: F.conv2d(x, wt, stride=stride, padding=pad), reps)
    dgrad = timed(lambda: torch.nn.grad.conv2d_input(x.shape, wt, dy, stride=stride, padding=pad), reps)
    wgrad = timed(lambda: torch.nn.grad.conv2d_weight(x, wt.shape, dy, stride=stride, padding=pad), reps)
    return fwd, dgrad, wgrad


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    totals = {"tf32": [0.0, 0.0, 0.0], "bf16": [0.0, 0.0, 0.0]}
    for shape in SHAPES:
        c, h, w, k, r, stride, _, count = shape
        line = f"c{c} {h}x{w} k{k} r{r} s{stride} (x{count}):"
        for name, dtype in (("tf32", torch.float32), ("bf16", torch.bfloat16)):
            t = shape_times(shape, dtype, args.reps)
            for i in range(3):
                totals[name][i] += t[i] * count
            line += f" {name} {t[0]:.3f} {t[1]:.3f} {t[2]:.3f}"
        print(line, flush=True)
    for name, t in totals.items():
        print(f"TOTAL PyTorch {torch.__version__} channels-last {name}: fwd {t[0]:.2f} bwd_data "
              f"{t[1]:.2f} bwd_filter {t[2]:.2f} ms; sum {sum(t):.2f}")


if __name__ == "__main__":
    main()
