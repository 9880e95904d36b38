#!/usr/bin/env bash
# GPU correctness, then GPU timings, in one command on a GPU machine (which needs no Rust toolchain):
#
#   scripts/gpu/check.sh BIN_DIR OUT_DIR
#
# BIN_DIR holds `p2ptrain` and `p2ptrain-unittests` (the library's test binary:
# `cargo test --release --no-run`, then copy target/release/deps/p2ptrain-<hash>); see
# scripts/gpu/package.sh. Correctness first — the CUDA unit tests (every GPU layer and update rule
# against the CPU one; none may skip here), the topology equivalence on GPUs (np 2 × 1 GPU,
# np 1 × 2 GPUs, np 1 × 1 GPU with twice the batch; on 4 GPUs also np 4 × 1, 2 × 2 and 1 × 4 against
# np 1 × 1 with four times the batch), all reduce modes, the update behind the backward against
# the whole gradient's after it (np 1 in FP32 and bf16, np 2, bit for bit), the bf16 gradient wire against the CPU's
# and across layouts (NCCL's and the copy engines'), CPU–GPU agreement of a whole training run (FP32, and bf16 and fp16 math
# against the CPU's rounding, fp16's overflow steps skipped as on the CPU), a GPU timeline's layer, bucket and update
# spans, and the same for a small CNN with synced BatchNorm and Dropout (np 2 × 1 GPU vs np 1 × 1
# GPU with twice the batch, GPU vs CPU; FP32, and bf16 and fp16 with their fused chains), AdamW and AdaDelta against the CPU with snapshots resumed
# across backends, a stopped and a killed rank ending the job (scripts/gpu/faults.sh), a
# GPU-trained ResNet-50 exported to torchvision and predicted by both — then the benchmarks beside
# PyTorch DDP.
# Exits non-zero if a check fails.
set -uo pipefail
source "$(dirname "$0")/start.sh"
CMP="python3 scripts/gpu/compare_snapshots.py"
failed=0
fail() { echo "FAILED: $*" | tee -a "$OUT/summary.txt"; failed=1; }

nvidia-smi -L | tee "$OUT/summary.txt"
# A one-GPU machine runs every check that fits on one GPU; those that need two are skipped, loudly.
NGPU=$(nvidia-smi -L | grep -c '^GPU')
export NGPU
two_gpus() { # what -- true when this machine has 2 GPUs, else a SKIPPED line in the summary
  [ "$NGPU" -ge 2 ] && return 0
  echo "SKIPPED (needs 2 GPUs, this machine has $NGPU): $1" | tee -a "$OUT/summary.txt"
  return 1
}

echo "== CUDA unit tests" | tee -a "$OUT/summary.txt"
"$BIN/p2ptrain-unittests" cuda:: --test-threads=1 >"$OUT/unittests.log" 2>&1 || fail "CUDA unit tests"
grep -E "^test result|^test .*FAILED|^    cuda::" "$OUT/unittests.log" | tee -a "$OUT/summary.txt"
# Only the tests that need more devices than this machine has may skip (they say so).
skipped_here=$(grep SKIPPED "$OUT/unittests.log" | while read -r line; do
  n=$(echo "$line" | sed -n 's/.*SKIPPED (needs \([0-9]*\) CUDA device.*/\1/p')
  { [ -n "$n" ] && [ "$n" -gt "$NGPU" ]; } || echo "$line"
done)
[ -n "$skipped_here" ] && fail "a CUDA test skipped on a GPU machine: $skipped_here"

grep SKIPPED "$OUT/unittests.log" | sort -u | tee -a "$OUT/summary.txt"

echo "== topology equivalence and reduce modes on GPUs" | tee -a "$OUT/summary.txt"
EQ=tests/configs/equivalence.toml
train() { # name np replicas batch backend [sets...]
  local name=$1 np=$2 r=$3 b=$4 backend=$5; shift 5
  local sets=(--set "data.batch_size=$b" --set "cluster.replicas_per_rank=$r" --set "cluster.backend=\"$backend\"")
  for s in "$@"; do sets+=(--set "$s"); done
  "${MPI[@]}" -np "$np" "$BIN/p2ptrain" train $EQ --no-progress --output "$OUT/runs/$name" "${sets[@]}" \
    >"$OUT/runs-$name.log" 2>&1 || fail "training $name"
}
snap() { echo "$OUT/runs/$1/snapshots/equiv_iter_30.safetensors"; }
# must_differ A B WHAT: the snapshots A and B differ by more than 1e-6 (a rounding happened).
must_differ() {
  local differ
  if differ=$($CMP "$1" "$2" --tol 1e-6 --label "$3"); then
    fail "$3: the same weights (no rounding?): $differ"
  else
    echo "OK   $3 differ, as they must (the rounding happens):${differ#*:}" | tee -a "$OUT/summary.txt"
  fi
}
mkdir -p "$OUT/runs"
train gpu_1x1_b32 1 1 32 cuda
train cpu_1x1_b32 1 1 32 cpu
# The update behind the backward, bucket by bucket on a stream of its own, is the update of the
# whole gradient after the backward (which `non_finite = "skip"` keeps): the same bits, alone and
# in bf16 math (whose copies of the weights the parts write).
train gpu_1x1_b32_whole 1 1 32 cuda 'solver.non_finite="skip"'
train gpu_1x1_b32_bf16 1 1 32 cuda 'cluster.math="bf16"'
train gpu_1x1_b32_bf16_whole 1 1 32 cuda 'cluster.math="bf16"' 'solver.non_finite="skip"'
for pair in "gpu_1x1_b32 gpu_1x1_b32_whole" "gpu_1x1_b32_bf16 gpu_1x1_b32_bf16_whole"; do
  read -r behind whole <<<"$pair"
  $CMP "$(snap "$behind")" "$(snap "$whole")" --tol 0 \
    --label "$behind (update behind the backward) vs $whole, bit for bit" \
    | tee -a "$OUT/summary.txt" || fail "$behind differs from the whole update"
done
if two_gpus "topology equivalence and reduce modes"; then
  train gpu_2x1_b16 2 1 16 cuda
  train gpu_1x2_b16 1 2 16 cuda
  train gpu_2x1_b16_flat 2 1 16 cuda 'cluster.reduce="flat"'
  train gpu_2x1_b16_layerwise 2 1 16 cuda 'cluster.reduce="layerwise"'
  train gpu_2x1_b16_tiny_buckets 2 1 16 cuda 'cluster.bucket_mb=0.001'
  train gpu_2x1_b16_whole 2 1 16 cuda 'solver.non_finite="skip"'
  for other in gpu_2x1_b16 gpu_1x2_b16 gpu_2x1_b16_flat gpu_2x1_b16_layerwise gpu_2x1_b16_tiny_buckets; do
    $CMP "$(snap gpu_1x1_b32)" "$(snap $other)" --tol 2e-4 --label "$other vs gpu_1x1_b32" | tee -a "$OUT/summary.txt" \
      || fail "$other differs"
  done
  # Two replicas add in one order whatever the buckets, and the update bucket by bucket (several
  # buckets) is the update of the whole gradient (one bucket): the same bits.
  for other in gpu_2x1_b16_layerwise gpu_2x1_b16_tiny_buckets gpu_2x1_b16_whole; do
    $CMP "$(snap gpu_2x1_b16)" "$(snap $other)" --tol 0 --label "$other vs gpu_2x1_b16, bit for bit" \
      | tee -a "$OUT/summary.txt" || fail "$other differs from one bucket"
  done
fi
# Four GPUs: every layout of 4 replicas (np 4 x 1, np 2 x 2, np 1 x 4) at 8 samples each against
# one replica at 32.
if [ "$NGPU" -ge 4 ]; then
  train gpu_4x1_b8 4 1 8 cuda
  train gpu_2x2_b8 2 2 8 cuda
  train gpu_1x4_b8 1 4 8 cuda
  train gpu_4x1_b8_layerwise 4 1 8 cuda 'cluster.reduce="layerwise"'
  for other in gpu_4x1_b8 gpu_2x2_b8 gpu_1x4_b8 gpu_4x1_b8_layerwise; do
    $CMP "$(snap gpu_1x1_b32)" "$(snap $other)" --tol 2e-4 --label "$other vs gpu_1x1_b32" | tee -a "$OUT/summary.txt" \
      || fail "$other differs"
  done
else
  echo "SKIPPED (needs 4 GPUs, this machine has $NGPU): topology equivalence on 4 GPUs" | tee -a "$OUT/summary.txt"
fi
$CMP "$(snap gpu_1x1_b32)" "$(snap cpu_1x1_b32)" --tol 1e-3 --label "GPU vs CPU, 30 iterations" | tee -a "$OUT/summary.txt" \
  || fail "GPU and CPU training differ"

echo "== the bf16 gradient wire (cluster.reduce_dtype = \"bf16\") against the CPU's" | tee -a "$OUT/summary.txt"
if two_gpus "bf16 gradient wire"; then
  BF16='cluster.reduce_dtype="bf16"'
  train gpu_2x1_b16_bf16 2 1 16 cuda "$BF16" 'cluster.reduce="layerwise"'
  train gpu_1x2_b16_bf16 1 2 16 cuda "$BF16"
  train cpu_2x1_b16_bf16 2 1 16 cpu "$BF16"
  # Two replicas: one bfloat16 addition (NCCL's and dist::wire's round alike), so the layouts
  # and reduce modes train the same bits.
  $CMP "$(snap gpu_2x1_b16_bf16)" "$(snap gpu_1x2_b16_bf16)" --tol 0 \
    --label "bf16 wire: np 2 x 1 GPU (layerwise) vs np 1 x 2 GPUs (bucketed)" | tee -a "$OUT/summary.txt" \
    || fail "bf16 wire: GPU layouts differ"
  # Against the CPU's bf16 wire: the FP32 gradients differ at 1e-7 (as GPU vs CPU above), which
  # now and then moves an element across a bfloat16 rounding boundary (2^-8 of it), and training
  # amplifies that as it amplifies a change of the additions' order (8.7e-3 between 4-replica
  # layouts on the CPU, README): 1e-2.
  $CMP "$(snap gpu_2x1_b16_bf16)" "$(snap cpu_2x1_b16_bf16)" --tol 1e-2 \
    --label "bf16 wire: np 2 x 1 GPU vs np 2 x 1 CPU" | tee -a "$OUT/summary.txt" \
    || fail "bf16 wire: GPU and CPU training differ"
  # The rounding happens: the FP32 wire's run must differ (by more than 1e-6).
  must_differ "$(snap gpu_2x1_b16_bf16)" "$(snap gpu_2x1_b16)" "bf16 vs fp32 wire on GPUs"
  echo "== a GPU timeline: layer spans on the compute stream, bucket spans on the communication stream" \
    | tee -a "$OUT/summary.txt"
  "${MPI[@]}" -np 2 "$BIN/p2ptrain" train $EQ --no-progress --output "$OUT/runs/timeline_gpu" \
    --set 'cluster.backend="cuda"' --set 'cluster.reduce="layerwise"' --set "$BF16" \
    --timeline "$OUT/timeline_gpu.json" --timeline-iters 5 >"$OUT/runs-timeline_gpu.log" 2>&1 \
    || fail "training with a GPU timeline"
  python3 scripts/gpu/check_timeline.py "$OUT/timeline_gpu.json" --replicas 2 --iters 5 \
    --layers ip1,ip2,ip3 --buckets 3 --bytes-per-float 2 | tee -a "$OUT/summary.txt" \
    || fail "GPU timeline lacks layer or bucket spans"

  echo "== the bf16 wire moved by the copy engines (cluster.reduce_transport = \"copy_engines\")" \
    | tee -a "$OUT/summary.txt"
  CE='cluster.reduce_transport="copy_engines"'
  train gpu_2x1_b16_ce 2 1 16 cuda "$BF16" "$CE" 'cluster.reduce="layerwise"' # IPC between processes
  train gpu_1x2_b16_ce 1 2 16 cuda "$BF16" "$CE"                              # peers of one process
  train gpu_2x1_b16_ce_tiny 2 1 16 cuda "$BF16" "$CE" 'cluster.bucket_mb=0.001' # slices left empty
  # Two replicas: the sum is one bfloat16 addition whoever adds, so the copy engines' runs are
  # NCCL's bit for bit, in every layout and bucketing.
  for other in gpu_2x1_b16_ce gpu_1x2_b16_ce gpu_2x1_b16_ce_tiny; do
    $CMP "$(snap gpu_2x1_b16_bf16)" "$(snap $other)" --tol 0 --label "$other vs NCCL's bf16 wire, bit for bit" \
      | tee -a "$OUT/summary.txt" || fail "$other differs from NCCL's bf16 wire"
  done
  if [ "$NGPU" -ge 4 ]; then
    # Four replicas add in rank order whatever the layout: the same bits in np 4 x 1, 2 x 2, 1 x 4.
    train gpu_4x1_b8_ce 4 1 8 cuda "$BF16" "$CE"
    train gpu_2x2_b8_ce 2 2 8 cuda "$BF16" "$CE"
    train gpu_1x4_b8_ce 1 4 8 cuda "$BF16" "$CE"
    for other in gpu_2x2_b8_ce gpu_1x4_b8_ce; do
      $CMP "$(snap gpu_4x1_b8_ce)" "$(snap $other)" --tol 0 --label "$other vs gpu_4x1_b8_ce, bit for bit" \
        | tee -a "$OUT/summary.txt" || fail "$other differs from gpu_4x1_b8_ce"
    done
    $CMP "$(snap gpu_1x1_b32)" "$(snap gpu_4x1_b8_ce)" --tol 1e-2 --label "gpu_4x1_b8_ce vs gpu_1x1_b32" \
      | tee -a "$OUT/summary.txt" || fail "gpu_4x1_b8_ce differs"
  else
    echo "SKIPPED (needs 4 GPUs, this machine has $NGPU): the copy engines' wire on 4 GPUs" | tee -a "$OUT/summary.txt"
  fi
fi

echo "== a GPU timeline of one replica: the update of each bucket behind the backward, on the update stream" \
  | tee -a "$OUT/summary.txt"
"${MPI[@]}" -np 1 "$BIN/p2ptrain" train $EQ --no-progress --output "$OUT/runs/timeline_gpu_alone" \
  --set 'cluster.backend="cuda"' --set 'cluster.reduce="layerwise"' \
  --timeline "$OUT/timeline_gpu_alone.json" --timeline-iters 5 >"$OUT/runs-timeline_gpu_alone.log" 2>&1 \
  || fail "training with a one-GPU timeline"
python3 scripts/gpu/check_timeline.py "$OUT/timeline_gpu_alone.json" --replicas 1 --iters 5 \
  --layers ip1,ip2,ip3 --buckets 0 --bytes-per-float 4 --update-parts 3 | tee -a "$OUT/summary.txt" \
  || fail "one-GPU timeline lacks layer or update spans"

echo "== mixed precision (cluster.math = \"bf16\" and \"fp16\") against the CPU's rounding" | tee -a "$OUT/summary.txt"
for half in bf16 fp16; do
  M="cluster.math=\"$half\""
  train "gpu_1x1_b32_$half" 1 1 32 cuda "$M"
  train "cpu_1x1_b32_$half" 1 1 32 cpu "$M"
  # A sum taken in another order crosses a half-type rounding boundary now and then (2^-8 of that
  # element in bf16, 2^-11 in fp16), and 30 steps of training amplify it as they amplify the
  # bf16 wire's: 2e-2.
  $CMP "$(snap "gpu_1x1_b32_$half")" "$(snap "cpu_1x1_b32_$half")" --tol 2e-2 \
    --label "$half math: GPU vs CPU, 30 iterations" | tee -a "$OUT/summary.txt" \
    || fail "$half math: GPU and CPU training differ"
  must_differ "$(snap "gpu_1x1_b32_$half")" "$(snap gpu_1x1_b32)" "$half vs fp32 math on a GPU"
  if two_gpus "$half math topology equivalence"; then
    train "gpu_2x1_b16_$half" 2 1 16 cuda "$M"
    train "gpu_1x2_b16_$half" 1 2 16 cuda "$M"
    for other in "gpu_2x1_b16_$half" "gpu_1x2_b16_$half"; do
      $CMP "$(snap "gpu_1x1_b32_$half")" "$(snap "$other")" --tol 2e-2 \
        --label "$half math: $other vs gpu_1x1_b32_$half" | tee -a "$OUT/summary.txt" \
        || fail "$half math: $other differs"
    done
  fi
done
# fp16's dynamic loss scale on the device: from 2^32 the scaled gradient overflows fp16, and the
# steps are skipped and the scale halved until it fits — the same steps and the same scale as the
# CPU's in the same layout (a replica's gradients grow as its batch shrinks, so another layout
# may overflow once more or less), on one GPU and on two.
O=(cluster.math=\"fp16\" cluster.loss_scale_init=4294967296)
over_layouts=("1 1 32")
two_gpus "fp16 overflow steps on 2 GPUs" && over_layouts+=("2 1 16")
scales() { grep -o 'loss scale [0-9.e+]* ([0-9]* overflow' "$OUT/runs-$1.log"; }
for layout in "${over_layouts[@]}"; do
  set -- $layout
  gpu_run="gpu_${1}x${2}_b${3}_fp16_over" cpu_run="cpu_${1}x${2}_b${3}_fp16_over"
  train "$gpu_run" "$1" "$2" "$3" cuda "${O[@]}"
  train "$cpu_run" "$1" "$2" "$3" cpu "${O[@]}"
  if [ -n "$(scales "$cpu_run")" ] && [ "$(scales "$gpu_run")" = "$(scales "$cpu_run")" ]; then
    echo "OK   fp16 loss scale: $gpu_run skips the CPU's steps: $(scales "$gpu_run" | tail -n 1)" \
      | tee -a "$OUT/summary.txt"
  else
    fail "fp16 loss scale: $gpu_run and $cpu_run skip different steps"
  fi
  $CMP "$(snap "$gpu_run")" "$(snap "$cpu_run")" --tol 2e-2 \
    --label "fp16 from a 2^32 scale: $gpu_run vs $cpu_run" | tee -a "$OUT/summary.txt" \
    || fail "fp16 with overflows: $gpu_run and $cpu_run differ"
done

echo "== convolutional nets (cuDNN convolution, pooling, synced BatchNorm, Dropout) on GPUs" | tee -a "$OUT/summary.txt"
train_cfg() { # config name np replicas batch backend [gpu_layout [math]]
  local cfg=$1 name=$2 np=$3 r=$4 b=$5 backend=$6 layout=${7:-auto} math=${8:-fp32}
  "${MPI[@]}" -np "$np" "$BIN/p2ptrain" train "$cfg" --no-progress --output "$OUT/runs/$name" \
    --set "data.batch_size=$b" --set "cluster.replicas_per_rank=$r" --set "cluster.backend=\"$backend\"" \
    --set "cluster.gpu_layout=\"$layout\"" --set "cluster.math=\"$math\"" >"$OUT/runs-$name.log" 2>&1 \
    || fail "training $name"
}
# tests/configs/cnn_bn_dropout.toml: conv (padded, grouped), sync BatchNorm + Scale, max and ave
# pooling, Dropout; 20 iterations. tests/configs/cnn_equivalence.toml: branches joined by concat,
# eltwise, strided conv; 30 iterations.
for w in "cnn_bn_dropout cnn_bn_iter_20" "cnn_equivalence cnn_equiv_iter_30"; do
  set -- $w
  cfg=tests/configs/$1.toml
  s() { echo "$OUT/runs/$1/snapshots/$2.safetensors"; }
  train_cfg "$cfg" "$1_gpu_1x1_b32" 1 1 32 cuda
  train_cfg "$cfg" "$1_cpu_1x1_b32" 1 1 32 cpu
  if two_gpus "$1: np 2 x 1 GPU vs np 1 x 1 GPU"; then
    train_cfg "$cfg" "$1_gpu_2x1_b16" 2 1 16 cuda
    $CMP "$(s "$1_gpu_1x1_b32" "$2")" "$(s "$1_gpu_2x1_b16" "$2")" --tol 2e-4 \
      --label "$1: np 2 x 1 GPU (b16) vs np 1 x 1 GPU (b32)" | tee -a "$OUT/summary.txt" \
      || fail "$1: GPU topologies differ"
  fi
  $CMP "$(s "$1_gpu_1x1_b32" "$2")" "$(s "$1_cpu_1x1_b32" "$2")" --tol 1e-3 \
    --label "$1: GPU vs CPU" | tee -a "$OUT/summary.txt" \
    || fail "$1: GPU and CPU training differ"
  # Channels-last activations (cluster.gpu_layout = "nhwc") against the CPU and across topologies.
  train_cfg "$cfg" "$1_gpu_1x1_b32_nhwc" 1 1 32 cuda nhwc
  $CMP "$(s "$1_gpu_1x1_b32_nhwc" "$2")" "$(s "$1_cpu_1x1_b32" "$2")" --tol 1e-3 \
    --label "$1: GPU channels-last vs CPU" | tee -a "$OUT/summary.txt" \
    || fail "$1: GPU channels-last and CPU training differ"
  if two_gpus "$1: channels-last, np 2 x 1 GPU vs np 1 x 1 GPU"; then
    train_cfg "$cfg" "$1_gpu_2x1_b16_nhwc" 2 1 16 cuda nhwc
    $CMP "$(s "$1_gpu_1x1_b32_nhwc" "$2")" "$(s "$1_gpu_2x1_b16_nhwc" "$2")" --tol 2e-4 \
      --label "$1: channels-last, np 2 x 1 GPU (b16) vs np 1 x 1 GPU (b32)" | tee -a "$OUT/summary.txt" \
      || fail "$1: channels-last GPU topologies differ"
  fi
done
# In bf16 and fp16 the fused chains (BatchNorm → Scale → ReLU, the residual sum → ReLU) round
# where the CPU's layers do: against the CPU's rounding and across topologies, at the mixed
# precision section's tolerance.
for w in "cnn_bn_dropout cnn_bn_iter_20" "cnn_equivalence cnn_equiv_iter_30"; do
  set -- $w
  cfg=tests/configs/$1.toml
  for half in bf16 fp16; do
    train_cfg "$cfg" "$1_gpu_1x1_b32_$half" 1 1 32 cuda auto "$half"
    train_cfg "$cfg" "$1_cpu_1x1_b32_$half" 1 1 32 cpu auto "$half"
    $CMP "$(s "$1_gpu_1x1_b32_$half" "$2")" "$(s "$1_cpu_1x1_b32_$half" "$2")" --tol 2e-2 \
      --label "$1 $half: GPU vs CPU" | tee -a "$OUT/summary.txt" \
      || fail "$1 $half: GPU and CPU training differ"
    if two_gpus "$1 $half: np 2 x 1 GPU vs np 1 x 1 GPU"; then
      train_cfg "$cfg" "$1_gpu_2x1_b16_$half" 2 1 16 cuda auto "$half"
      $CMP "$(s "$1_gpu_1x1_b32_$half" "$2")" "$(s "$1_gpu_2x1_b16_$half" "$2")" --tol 2e-2 \
        --label "$1 $half: np 2 x 1 GPU (b16) vs np 1 x 1 GPU (b32)" | tee -a "$OUT/summary.txt" \
        || fail "$1 $half: GPU topologies differ"
    fi
  done
done
grep -h '"phase":"test"' "$OUT"/runs/*/metrics.jsonl | tail -n 16 > "$OUT/test-metrics.txt"

echo "== AdamW (cosine, warmup) and AdaDelta on GPUs: against the CPU, and snapshot 15 resumed on either backend" \
  | tee -a "$OUT/summary.txt"
resume_run() { # name backend from-snapshot [sets...] -- resumes an EQ run of batch 32 at the snapshot
  local name=$1 backend=$2 from=$3; shift 3
  local sets=(--set "data.batch_size=32" --set "cluster.backend=\"$backend\"")
  for s in "$@"; do sets+=(--set "$s"); done
  "${MPI[@]}" -np 1 "$BIN/p2ptrain" train $EQ --no-progress --output "$OUT/runs/$name" "${sets[@]}" \
    --resume "$from" >"$OUT/runs-$name.log" 2>&1 || fail "training $name"
  grep -q "resuming from" "$OUT/runs-$name.log" || fail "$name did not resume"
}
for rule in adamw adadelta; do
  case $rule in
    adamw) rs=('solver.type="adamw"' solver.base_lr=0.01 solver.weight_decay=0.01 'solver.lr_policy="cosine"'
      solver.warmup_iter=10) ;;
    adadelta) rs=('solver.type="adadelta"' solver.base_lr=1.0 solver.momentum=0.95 solver.delta=1e-6) ;;
  esac
  rs+=(solver.snapshot=15)
  s15() { echo "$OUT/runs/$1/snapshots/equiv_iter_15.safetensors"; }
  train "${rule}_gpu" 1 1 32 cuda "${rs[@]}"
  train "${rule}_cpu" 1 1 32 cpu "${rs[@]}"
  $CMP "$(snap "${rule}_gpu")" "$(snap "${rule}_cpu")" --tol 1e-3 --label "$rule: GPU vs CPU, 30 iterations" \
    | tee -a "$OUT/summary.txt" || fail "$rule: GPU and CPU training differ"
  resume_run "${rule}_gpu_then_gpu" cuda "$(s15 "${rule}_gpu")" "${rs[@]}"
  resume_run "${rule}_gpu_then_cpu" cpu "$(s15 "${rule}_gpu")" "${rs[@]}"
  resume_run "${rule}_cpu_then_gpu" cuda "$(s15 "${rule}_cpu")" "${rs[@]}"
  # A resume on the same backend continues bit for bit; across backends it ends within the
  # GPU-vs-CPU tolerance of the run that did the first half on the other backend.
  $CMP "$(snap "${rule}_gpu")" "$(snap "${rule}_gpu_then_gpu")" --tol 0 --label "$rule: GPU resumed on GPU vs straight" \
    | tee -a "$OUT/summary.txt" || fail "$rule: a GPU run resumed on the GPU differs from the straight one"
  $CMP "$(snap "${rule}_cpu")" "$(snap "${rule}_gpu_then_cpu")" --tol 1e-3 --label "$rule: GPU snapshot resumed on CPU" \
    | tee -a "$OUT/summary.txt" || fail "$rule: a GPU snapshot resumed on the CPU differs"
  $CMP "$(snap "${rule}_gpu")" "$(snap "${rule}_cpu_then_gpu")" --tol 1e-3 --label "$rule: CPU snapshot resumed on GPU" \
    | tee -a "$OUT/summary.txt" || fail "$rule: a CPU snapshot resumed on the GPU differs"
done

echo "== a non-finite loss on GPUs: every rank stops at that iteration, or skips it (solver.non_finite)" \
  | tee -a "$OUT/summary.txt"
nan_case() { # name np expected-rc [sets...]
  local name=$1 np=$2 want=$3 rc=0; shift 3
  local sets=(--set 'cluster.backend="cuda"' --set solver.snapshot=5 --set solver.display=1)
  for s in "$@"; do sets+=(--set "$s"); done
  P2PTRAIN_INJECT_NAN=$((np - 1)):7 "${MPI[@]}" -np "$np" "$BIN/p2ptrain" train $EQ --no-progress \
    --output "$OUT/runs/$name" "${sets[@]}" >"$OUT/runs-$name.log" 2>&1 || rc=$?
  local snaps
  snaps=$(ls "$OUT/runs/$name/snapshots" 2>/dev/null | grep -c safetensors)
  echo "$name: exit $rc (want $want), $snaps weight snapshot(s); $(grep -m1 -o 'iteration 7[^;]*not finite[^.]*' "$OUT/runs-$name.log")" \
    | tee -a "$OUT/summary.txt"
  [ "$rc" -eq "$want" ] || fail "$name: exit $rc, want $want"
  if [ "$want" -ne 0 ]; then
    grep -q "not finite" "$OUT/runs-$name.log" || fail "$name: the log does not say what was not finite"
    [ ! -e "$OUT/runs/$name/snapshots/equiv_iter_10.safetensors" ] || fail "$name: a snapshot after the NaN"
  else
    grep -q '"phase":"skip"' "$OUT/runs/$name/metrics.jsonl" || fail "$name: the skipped step is not in metrics.jsonl"
  fi
}
nan_case nan_gpu_1x1_stop 1 1
if two_gpus "a non-finite loss on one of two GPU ranks"; then
  nan_case nan_gpu_2x1_stop 2 1
  nan_case nan_gpu_2x1_skip 2 0 'solver.non_finite="skip"'
fi

echo "== model commands on a GPU: export --format torchvision, predict against torchvision" | tee -a "$OUT/summary.txt"
# ResNet-50 trained 2 iterations on the GPU, exported, loaded into torchvision's model; `p2ptrain
# predict` (on the GPU: backend auto) and torchvision give the same top-5 on the same images.
python3 tests/python/check_torchvision_export.py --p2ptrain "$BIN/p2ptrain" --out "$OUT/torchvision" \
  >"$OUT/torchvision.log" 2>&1 || fail "torchvision export or predict"
tail -4 "$OUT/torchvision.log" | tee -a "$OUT/summary.txt"

if two_gpus "a stopped and a killed rank end the job (scripts/gpu/faults.sh)"; then
  echo "== a stopped (SIGSTOP) and a killed (SIGKILL) rank end the job, no process left on a GPU" \
    | tee -a "$OUT/summary.txt"
  scripts/gpu/faults.sh "$BIN" "$OUT" cuda || fail "a stopped or killed rank did not end the job"
fi

if [ "$failed" -ne 0 ]; then
  echo "correctness failed: no timings" | tee -a "$OUT/summary.txt"
  exit 1
fi

# P2PTRAIN_BENCH: all (default), cnn (the convolutional nets only), mlp, none.
BENCH=${P2PTRAIN_BENCH:-all}
if [ "$BENCH" = all ] || [ "$BENCH" = cnn ]; then
  scripts/gpu/bench_cnn.sh "$BIN" "$OUT" || failed=1
fi
if [ "$BENCH" != all ] && [ "$BENCH" != mlp ]; then
  exit $failed
fi
echo "== benchmarks: mlp4096, batch 512 per GPU" | tee -a "$OUT/summary.txt"
for math in fp32 tf32; do
  for np in $(seq 1 "$((NGPU < 2 ? NGPU : 2))"); do
    "${MPI[@]}" -np $np "$BIN/p2ptrain" bench config/mlp4096.toml --warmup 30 --iters 300 \
      --set 'cluster.backend="cuda"' --set "cluster.math=\"$math\"" >"$OUT/bench-$math-$np.log" 2>&1 \
      || fail "bench $math np $np"
    echo "p2ptrain $math ${np} GPU(s): $(grep '^bench:' "$OUT/bench-$math-$np.log")" | tee -a "$OUT/summary.txt"
    if [ $np -eq 2 ]; then # the bf16 gradient wire (one GPU has no wire)
      "${MPI[@]}" -np $np "$BIN/p2ptrain" bench config/mlp4096.toml --warmup 30 --iters 300 \
        --set 'cluster.backend="cuda"' --set "cluster.math=\"$math\"" --set 'cluster.reduce_dtype="bf16"' \
        >"$OUT/bench-$math-$np-bf16.log" 2>&1 || fail "bench $math np $np bf16 wire"
      echo "p2ptrain $math ${np} GPU(s), bf16 wire: $(grep '^bench:' "$OUT/bench-$math-$np-bf16.log")" | tee -a "$OUT/summary.txt"
      grep '^communicated' "$OUT/bench-$math-$np.log" "$OUT/bench-$math-$np-bf16.log" | tee -a "$OUT/summary.txt"
    fi
    if [ $np -eq 1 ]; then
      python3 scripts/pytorch_ddp.py --batch 512 --math $math --warmup 30 --iters 300 2>"$OUT/torch-$math-$np.err" | tee -a "$OUT/summary.txt"
    else
      python3 -m torch.distributed.run --nproc_per_node=$np scripts/pytorch_ddp.py --batch 512 --math $math \
        --warmup 30 --iters 300 2>"$OUT/torch-$math-$np.err" | tee -a "$OUT/summary.txt"
    fi
  done
done
if two_gpus "bench-allreduce"; then
  echo "== bench-allreduce (NCCL, 2 GPUs; every size checked before it is timed)" | tee -a "$OUT/summary.txt"
  "${MPI[@]}" -np 2 "$BIN/p2ptrain" bench-allreduce --backend cuda --min-bytes 1M --max-bytes 1G --iters 20 \
    >"$OUT/bench-allreduce.log" 2>&1 || fail "bench-allreduce"
  grep -v '^\[' "$OUT/bench-allreduce.log" | tee -a "$OUT/summary.txt"
fi
exit $failed
