#!/usr/bin/env bash
# The device time of each of p2ptrain's own kernels in a few training steps, under Nsight Compute
# (`ncu`, which replays each kernel alone at base clocks with flushed caches: slower than in a
# run, but each kernel's own time, for finding the memory-bound kernels short of bandwidth). Then
# the kernels summed by name and by name and grid (scripts/gpu/kernel_times.py).
#
#   scripts/gpu/kernel_times.sh BIN_DIR OUT_DIR CONFIG [--set KEY=VALUE ...]
#   KERNELS='regex:^(bn_|sum2_)' SKIP=400 COUNT=700 scripts/gpu/kernel_times.sh .gpu OUT config/resnet50.toml \
#     --set 'cluster.math="bf16"'
#
# One GPU, `p2ptrain bench --warmup 3 --iters 3`; SKIP launches of those kernels are left out
# first (the first steps' and cuDNN's algorithm search), then COUNT are timed (default 400 and
# 700: about two ResNet-50 steps of the default KERNELS). KERNELS is ncu's --kernel-name filter
# (default: the BatchNorm, sum, pooling, rounding and channel kernels). AS_RUN=1 leaves the clocks
# and caches as the run has them (`--clock-control none --cache-control none`: a kernel's time
# beside the others' data in L2, as in the step) and adds each launch's DRAM bytes, resident
# warps and registers, which kernels.md then gives per grid. Needs ncu (on PATH or under
# /usr/local/cuda/bin). Writes OUT_DIR/kernels.csv (ncu's) and OUT_DIR/kernels.md.
set -uo pipefail
source "$(dirname "$0")/start.sh"
CFG=${3:?CONFIG}
shift 3
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
[ -n "$NCU" ] || { echo "FAILED: kernel_times: no ncu (Nsight Compute) on this machine" | tee -a "$OUT/summary.txt"; exit 1; }
metrics=gpu__time_duration.sum
as_run=()
if [ "${AS_RUN:-0}" = 1 ]; then
  metrics+=,dram__bytes_read.sum,dram__bytes_write.sum
  metrics+=,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread
  as_run=(--clock-control none --cache-control none)
fi
timeout "${TIMEOUT:-600}" "$NCU" --kernel-name-base function "${as_run[@]}" \
  --kernel-name "${KERNELS:-regex:^(bn_|sum2_|channel_|round_|max_pool|ave_pool)}" \
  --launch-skip "${SKIP:-400}" --launch-count "${COUNT:-700}" --metrics "$metrics" --csv \
  "$BIN/p2ptrain" bench "$CFG" --warmup 3 --iters 3 --set 'cluster.backend="cuda"' "$@" \
  >"$OUT/kernels.csv" 2>"$OUT/kernels.err" \
  || { echo "FAILED: kernel_times: ncu (see $OUT/kernels.err)" | tee -a "$OUT/summary.txt"; exit 1; }
python3 "$(dirname "$0")/kernel_times.py" "$OUT/kernels.csv" | tee "$OUT/kernels.md" | tee -a "$OUT/summary.txt"
