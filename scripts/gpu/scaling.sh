#!/usr/bin/env bash
# Scaling from 1 GPU to all of a machine's GPUs (1, 2, 4, ...), p2ptrain beside PyTorch in the same
# run: for each workload and GPU count, `p2ptrain bench` (synthetic data of the net's input shape)
# in each of MATHS and each gradient wire type of WIRES, PyTorch DDP in the workload's FP32/TF32
# mode, and PyTorch AMP (bf16 autocast) with channels-last. Then a table of samples/s and the
# scaling from 1 GPU, and (TIMELINE=1) a Chrome trace of ResNet-50 on every GPU.
#
#   scripts/gpu/scaling.sh BIN_DIR OUT_DIR
#   ONLY="resnet50" MATHS="tf32 bf16" WIRES="fp32 bf16" TIMELINE=1 scripts/gpu/scaling.sh BIN_DIR OUT_DIR
#
# Workloads (batch per GPU): resnet50 (64), cifar10_quick (512), mlp4096 (512); a workload's math
# for PyTorch's non-AMP run is tf32 except cifar10_quick (fp32, as in its anchor figures). MATHS
# defaults to each workload's own math; a WIRES value other than fp32 sets cluster.reduce_dtype;
# PYTORCH=0 leaves PyTorch out (for a second pass over other modes in the same call);
# BN_SYNC=false runs ResNet-50 with every BatchNorm normalising its own GPU's batch
# (`sync = false`, as PyTorch's).
# ITERS=N times N iterations (after the warm-up) of every workload instead of its own count.
# TRANSPORTS="nccl copy_engines" runs each bf16-wire mode over both of `cluster.reduce_transport`'s
# transports (default nccl only).
# SETS="key=value ..." adds `--set`s to every p2ptrain run. Before each run the script waits (up
# to 60 s) until no process holds a GPU, and logs each GPU's clocks, temperature, power and
# throttle reasons to OUT_DIR/scaling/gpu-state.log.
# Appends to OUT_DIR/summary.txt (each p2ptrain run's rate and step split) and writes
# OUT_DIR/scaling.md.
set -uo pipefail
source "$(dirname "$0")/start.sh"
mkdir -p "$OUT/scaling"
NGPU=${NGPU:-$(nvidia-smi -L | grep -c '^GPU')}
COUNTS=""
for n in 1 2 4 8; do [ "$n" -le "$NGPU" ] && COUNTS="$COUNTS $n"; done
failed=0
RES="$OUT/scaling/results.jsonl"

# cifar10_quick reads CIFAR-10 files; for timing, the same net on synthetic 3x32x32 records.
quick="$OUT/scaling/cifar10_quick_synthetic.toml"
python3 scripts/gpu/synthetic_config.py cifar10_quick "$quick" || exit 1

# The ResNet-50 config of the run: the repository's, or with per-GPU BatchNorm (BN_SYNC=false).
resnet="config/resnet50.toml"
if [ "${BN_SYNC:-true}" = false ]; then
  resnet="$OUT/scaling/resnet50_per_gpu_bn.toml"
  sed 's/^sync = true/sync = false/' config/resnet50.toml >"$resnet"
  grep -q '^sync = true' "$resnet" && { echo "BN_SYNC=false: a sync = true is left" >&2; exit 1; }
fi

# Waits until no compute process holds a GPU (a previous run's workers may still be exiting),
# then logs what the GPUs are doing: label, clocks, temperature, power, throttle reasons.
settle() {
  local i
  for i in $(seq 60); do
    [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)" ] && break
    sleep 1
  done
  { echo "-- $1 (waited ${i} s for idle GPUs)"
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>&1
    nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu \
      --format=csv,noheader 2>&1
    nvidia-smi --query-gpu=index,clocks_event_reasons.active --format=csv,noheader 2>/dev/null \
      || nvidia-smi --query-gpu=index,clocks_throttle_reasons.active --format=csv,noheader 2>&1; } >>"$OUT/scaling/gpu-state.log"
}

record() { # framework workload gpus mode samples_per_sec
  printf '{"framework":"%s","workload":"%s","gpus":%s,"mode":"%s","samples_per_sec":%s}\n' "$@" >>"$RES"
}

# name config batch math warmup iters
# The small nets run long enough (about a second) for the GPUs' clocks to settle: with a few
# hundred milliseconds, one-GPU rates moved by a third between runs of the same binary.
ALL=("resnet50 $resnet 64 tf32 5 40"
  "cifar10_quick $quick 512 fp32 50 600"
  "mlp4096 config/mlp4096.toml 512 tf32 100 1000")
for w in "${ALL[@]}"; do
  set -- $w
  name=$1 cfg=$2 batch=$3 own_math=$4 warmup=$5 iters=${ITERS:-$6}
  listed "$name" "${ONLY:-}" || continue
  echo "== scaling: $name, batch $batch per GPU" | tee -a "$OUT/summary.txt"
  for np in $COUNTS; do
    for math in ${MATHS:-$own_math}; do
      for wire in ${WIRES:-fp32}; do
      for transport in ${TRANSPORTS:-nccl}; do
        # The copy engines carry the bf16 wire only.
        [ "$transport" = nccl ] || [ "$wire" = bf16 ] || continue
        mode="$math wire $wire"
        sets=(--set 'cluster.backend="cuda"' --set "cluster.math=\"$math\"" --set "data.batch_size=$batch")
        [ "$wire" = fp32 ] || sets+=(--set "cluster.reduce_dtype=\"$wire\"")
        if [ "$transport" != nccl ]; then
          sets+=(--set "cluster.reduce_transport=\"$transport\"")
          mode="$mode by $transport"
        fi
        for extra in ${SETS:-}; do sets+=(--set "$extra"); done
        log="$OUT/scaling/p2ptrain-$name-$math-wire$wire-$transport-$np.log"
        settle "p2ptrain $name $mode np $np"
        timeout 300 "${MPI[@]}" -np "$np" "$BIN/p2ptrain" bench "$cfg" --warmup "$warmup" --iters "$iters" \
          "${sets[@]}" >"$log" 2>&1 || { echo "FAILED: p2ptrain $name $mode np $np" | tee -a "$OUT/summary.txt"; failed=1; }
        line=$(grep '^bench:' "$log")
        echo "p2ptrain $name $mode, ${np} GPU(s): $line" | tee -a "$OUT/summary.txt"
        # Where the step went (data wait, passes, exposed all-reduce, update): a one-GPU rate
        # below the others' per GPU shows there.
        grep -A7 '^step split' "$log" | sed 's/^/    /' >>"$OUT/summary.txt"
        rate=$(sed -n 's/.*[^0-9.]\([0-9][0-9.]*\) samples\/s.*/\1/p' <<<"$line" | head -1)
        record p2ptrain "$name" "$np" "$mode" "${rate:-null}"
      done
      done
    done
    torch_modes=("--math $own_math" "--math $own_math --amp --channels-last")
    [ "${PYTORCH:-1}" = 1 ] || torch_modes=()
    for mode in "${torch_modes[@]}"; do
      label=$([[ $mode == *--amp* ]] && echo "AMP bf16 channels-last" || echo "$own_math")
      err="$OUT/scaling/torch-$name-${label// /_}-$np.err"
      settle "pytorch $name $label np $np"
      if [ "$np" -eq 1 ]; then
        # shellcheck disable=SC2086
        json=$(timeout 300 python3 scripts/pytorch_ddp.py --workload "$name" --batch "$batch" \
          --warmup "$warmup" --iters "$iters" $mode 2>"$err")
      else
        # shellcheck disable=SC2086
        json=$(timeout 300 python3 -m torch.distributed.run --nproc_per_node="$np" scripts/pytorch_ddp.py \
          --workload "$name" --batch "$batch" --warmup "$warmup" --iters "$iters" $mode 2>"$err")
      fi
      echo "$json" | tee -a "$OUT/summary.txt"
      rate=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["samples_per_sec"])' "$json" 2>/dev/null)
      [ -n "$rate" ] || { echo "FAILED: PyTorch $name $label np $np" | tee -a "$OUT/summary.txt"; failed=1; }
      record pytorch "$name" "$np" "$label" "${rate:-null}"
    done
  done
done

python3 - "$RES" "$OUT/scaling.md" <<'PY' | tee -a "$OUT/summary.txt"
import collections, json, sys
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows.setdefault((r["workload"], r["framework"], r["mode"]), {})[r["gpus"]] = r["samples_per_sec"]
counts = sorted({g for v in rows.values() for g in v})
head = "| workload | framework | mode | " + " | ".join(f"{g} GPU" for g in counts) + " | scaling 1→max |"
out = [head, "|" + " --- |" * (4 + len(counts))]
for (w, f, m), v in rows.items():
    cells = [f"{v[g]:,.0f}" if v.get(g) else "—" for g in counts]
    top = max(counts)
    sc = f"{100 * v[top] / (top * v[1]):.1f}%" if v.get(1) and v.get(top) and top > 1 else "—"
    out.append(f"| {w} | {f} | {m} | " + " | ".join(cells) + f" | {sc} |")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY

if [ -n "${TIMELINE:-}" ]; then
  np=${COUNTS##* }
  echo "== timeline: ResNet-50, $np GPU(s), 12 iterations" | tee -a "$OUT/summary.txt"
  timeout 300 "${MPI[@]}" -np "$np" "$BIN/p2ptrain" train "$resnet" --no-progress \
    --output "$OUT/scaling/timeline-run" --set 'cluster.backend="cuda"' --set "cluster.math=\"$(set -- ${MATHS:-tf32}; echo "$1")\"" \
    --set 'solver.max_iter=12' --timeline "$OUT/scaling/resnet50-timeline.json" --timeline-iters 12 \
    >"$OUT/scaling/timeline.log" 2>&1 || { echo "FAILED: timeline run" | tee -a "$OUT/summary.txt"; failed=1; }
  ls -la "$OUT/scaling/resnet50-timeline.json" 2>&1 | tee -a "$OUT/summary.txt"
fi
exit $failed
