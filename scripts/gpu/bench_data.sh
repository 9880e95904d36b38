#!/usr/bin/env bash
# The data-pipeline benchmarks on a GPU machine, in one run: an ImageNet-like folder of synthetic
# JPEGs (scripts/make_jpeg_folder.py), then
#   1. `p2ptrain bench-data` (decode + random_resized_crop(224) + flip + batches of 64) on all the
#      machine's cores, beside torchvision's DataLoader (scripts/dataloader_bench.py, the same
#      transform, pinned memory) at several worker counts on the same files;
#   2. ResNet-50 (config/resnet50_imagenet.toml, MATH, default tf32) trained from that folder on NP
#      GPUs (default: all of them, at most 4), beside the same net on synthetic input (`p2ptrain
#      bench`: images/s and the data wait per step).
#
#   scripts/gpu/bench_data.sh BIN_DIR OUT_DIR
#   CLASSES=100 PER_CLASS=100 WORKERS="8 16 32 60" NP=2 MATH=tf32 scripts/gpu/bench_data.sh BIN_DIR OUT_DIR
#
# Appends its figures to OUT_DIR/summary.txt. Needs python3 with torch, torchvision, numpy, Pillow.
set -uo pipefail
source "$(dirname "$0")/start.sh"
CORES=$(nproc)
CLASSES=${CLASSES:-100}
PER_CLASS=${PER_CLASS:-100}
WORKERS=${WORKERS:-"8 16 32 $CORES"}
JPEGS="$OUT/jpegs"
[ -d "$JPEGS/train" ] || python3 scripts/make_jpeg_folder.py --out "$JPEGS" --classes "$CLASSES" \
  --train-per-class "$PER_CLASS" --val-per-class 10 | tee -a "$OUT/summary.txt"
SOURCES=(--set "data.train_source=\"$JPEGS/train\"" --set "data.test_source=\"$JPEGS/val\"")
failed=0
echo "== bench-data, $CORES workers" | tee -a "$OUT/summary.txt"
"$BIN/p2ptrain" bench-data config/resnet50_imagenet.toml "${SOURCES[@]}" --workers "$CORES" \
  --warmup 5 --batches 100 2>&1 | tee -a "$OUT/summary.txt" || failed=1
"$BIN/p2ptrain" bench-data config/resnet50_imagenet.toml "${SOURCES[@]}" --workers 1 \
  --warmup 2 --batches 10 2>&1 | tee -a "$OUT/summary.txt" || failed=1
echo "== torchvision DataLoader" | tee -a "$OUT/summary.txt"
# shellcheck disable=SC2086
python3 scripts/dataloader_bench.py "$JPEGS/train" --workers $WORKERS --batches 100 2>&1 \
  | tee -a "$OUT/summary.txt" || failed=1
NGPU=$(nvidia-smi -L | grep -c '^GPU')
NP=${NP:-$((NGPU < 4 ? NGPU : 4))}
MATH=${MATH:-tf32}
echo "== ResNet-50 on $NP GPU(s), $MATH: JPEG folder, then synthetic input" | tee -a "$OUT/summary.txt"
MPI=(mpirun --bind-to none --oversubscribe -np "$NP")
"${MPI[@]}" "$BIN/p2ptrain" bench config/resnet50_imagenet.toml "${SOURCES[@]}" --set "cluster.math=\"$MATH\"" \
  --set 'cluster.backend="cuda"' --warmup 10 --iters 100 2>&1 | tail -12 | tee -a "$OUT/summary.txt" || failed=1
"${MPI[@]}" "$BIN/p2ptrain" bench config/resnet50.toml --set 'cluster.backend="cuda"' \
  --set "cluster.math=\"$MATH\"" --warmup 10 --iters 100 2>&1 | tail -12 | tee -a "$OUT/summary.txt" || failed=1
exit $failed
