#!/usr/bin/env python3
"""Checks `p2ptrain export --format torchvision` against torchvision's ResNet-50 (needs PyTorch,
torchvision, safetensors and numpy; run on a GPU host, from the repository root):

    python3 tests/python/check_torchvision_export.py [--p2ptrain target/release/p2ptrain] [--out DIR]

1. trains config/resnet50.toml for 2 iterations on small synthetic data (so that BatchNorm's
   running statistics are not the initial ones) and takes its snapshot;
2. exports it with `p2ptrain export --format torchvision`;
3. loads the file into `torchvision.models.resnet50()` with `load_state_dict(strict=True)`;
4. runs `p2ptrain predict` and the torchvision model (eval mode, FP32, no TF32) on the same four
   random images and compares the top-5 classes and probabilities.

torchvision's ResNet-50 is "v1.5": the stride of a stage's first block sits on its 3x3
convolution, and its max pooling pads by one and rounds down; the Caffe model p2ptrain follows
(v1) strides the first 1x1 convolution and pools with Caffe's round-up rule and no padding. The
state dict loads into the stock model unchanged (the shapes are the same); for the outputs the
check moves those strides and sets the pooling as v1 has them. Exit status 0 when both checks
pass, 1 otherwise.
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np
import torch
import torchvision
from safetensors.torch import load_file


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def as_v1(model):
    """torchvision's ResNet-50 computing Kaiming He's v1: strides on the first 1x1 convolution of
    a stage, max pooling without padding that rounds up (Caffe's rule)."""
    for stage in (model.layer2, model.layer3, model.layer4):
        block = stage[0]
        block.conv1.stride = (2, 2)
        block.conv2.stride = (1, 1)
    model.maxpool.padding = 0
    model.maxpool.ceil_mode = True
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--p2ptrain", default="target/release/p2ptrain")
    ap.add_argument("--out", default="runs/torchvision_check")
    args = ap.parse_args()
    out = args.out
    os.makedirs(out, exist_ok=True)
    small = [
        "--set", "solver.max_iter=2",
        "--set", "data.batch_size=4",
        "--set", "data.train_size=64",
        "--set", "data.test_size=8",
        "--set", "data.test_batch_size=4",
        # A small step: two steps at ResNet-50's 0.1 saturate the softmax, and the top-5 of a
        # saturated output is one class and four ties at 0.
        "--set", "solver.base_lr=0.0001",
    ]
    run([args.p2ptrain, "train", "config/resnet50.toml", "--output", out] + small)
    snapshot = os.path.join(out, "snapshots/resnet50_iter_2.safetensors")
    exported = os.path.join(out, "resnet50_torchvision.safetensors")
    run([args.p2ptrain, "export", snapshot, "--format", "torchvision", "-o", exported])

    state = load_file(exported)
    model = torchvision.models.resnet50()
    model.load_state_dict(state, strict=True)
    print(f"load_state_dict(strict=True): accepted ({len(state)} tensors)")

    rng = np.random.default_rng(1)
    x = rng.random((4, 3, 224, 224), dtype=np.float32)
    inputs = os.path.join(out, "images.npy")
    np.save(inputs, x)
    predictions = os.path.join(out, "predictions.jsonl")
    run([args.p2ptrain, "predict", "config/resnet50.toml", "--weights", snapshot, "--input",
         inputs, "-o", predictions, "--top-k", "5"] + small)
    ours = [json.loads(line) for line in open(predictions)]

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = as_v1(model).eval().to(device)
    with torch.no_grad():
        probs = torch.softmax(model(torch.from_numpy(x).to(device)).double(), dim=1).cpu()
    # Each of p2ptrain's top-5 classes has torchvision's probability for that class (within 1e-3)
    # and torchvision's top-5 the same classes, except where two probabilities lie closer than
    # 1e-5 (a tie, which either side may order either way).
    worst = 0.0
    same = True
    for i, line in enumerate(ours):
        top = torch.topk(probs[i], 5)
        theirs = [(int(c), float(p)) for p, c in zip(top.values, top.indices)]
        mine = [(t["class"], t["prob"]) for t in line["top_k"]]
        worst = max(worst, max(abs(p - float(probs[i][c])) for c, p in mine))
        for (c, p), (d, q) in zip(mine, theirs):
            if c != d and abs(p - q) > 1e-5:
                print(f"input {i}: p2ptrain {mine}\n          torchvision {theirs}")
                same = False
                break
    print(f"top-5 classes equal: {same}; largest probability difference {worst:.2e}")
    ok = same and worst < 1e-3
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
