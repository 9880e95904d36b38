#!/usr/bin/env bash
# The convolutional-net benchmarks on a GPU machine, each beside PyTorch (2.11, DDP for 2 GPUs) in
# the same run: LeNet (batch 64 per GPU), cifar10_quick (100 and 512), ResNet-50 (64, fp32 and
# tf32), on 1 and 2 GPUs, synthetic data of each net's input shape on both sides.
#
#   scripts/gpu/bench_cnn.sh BIN_DIR OUT_DIR
#   ONLY="lenet resnet50" scripts/gpu/bench_cnn.sh BIN_DIR OUT_DIR    # some of them
#   MATHS=tf32 scripts/gpu/bench_cnn.sh BIN_DIR OUT_DIR                 # some precisions (fp32, tf32)
#   INEXACT=1 scripts/gpu/bench_cnn.sh BIN_DIR OUT_DIR                  # also with conv_exact = false
#   LAYERS=1 scripts/gpu/bench_cnn.sh BIN_DIR OUT_DIR                   # and each layer's times
#   LAYOUTS="nchw nhwc" scripts/gpu/bench_cnn.sh BIN_DIR OUT_DIR        # cluster.gpu_layout values
#                                                                       # (default: auto)
#   TORCH_CHANNELS_LAST=1 scripts/gpu/bench_cnn.sh BIN_DIR OUT_DIR      # PyTorch also channels_last
#   TORCH_CUDNN_BENCHMARK=1 scripts/gpu/bench_cnn.sh BIN_DIR OUT_DIR    # PyTorch also with
#                                                                       # cudnn.benchmark = True
#
# Run by scripts/gpu/check.sh after its correctness checks; appends to OUT_DIR/summary.txt.
set -uo pipefail
source "$(dirname "$0")/start.sh"
# 1 and 2 GPUs where the machine has two; 1 only on a one-GPU machine (said in the summary).
NGPU=${NGPU:-$(nvidia-smi -L | grep -c '^GPU')}
[ "$NGPU" -ge 2 ] || echo "SKIPPED (needs 2 GPUs, this machine has $NGPU): 2-GPU benchmarks" | tee -a "$OUT/summary.txt"
failed=0
# LeNet reads MNIST IDX files, cifar10_quick CIFAR-10 batches; for timing, the same nets on
# synthetic records of their shapes.
lenet="$OUT/lenet_synthetic.toml"
quick="$OUT/cifar10_quick_synthetic.toml"
python3 scripts/gpu/synthetic_config.py lenet "$lenet" || exit 1
python3 scripts/gpu/synthetic_config.py cifar10_quick "$quick" || exit 1
# name config batch math warmup iters [conv_exact]: conv_exact=false lets cuDNN's FFT, Winograd
# and non-deterministic algorithms in (PyTorch's default); PyTorch runs once per workload.
ALL=("lenet $lenet 64 fp32 50 500"
  "cifar10_quick $quick 100 fp32 50 500"
  "cifar10_quick $quick 512 fp32 20 200"
  "resnet50 config/resnet50.toml 64 fp32 5 30"
  "resnet50 config/resnet50.toml 64 tf32 5 30")
for w in "${ALL[@]}"; do
  set -- $w
  name=$1 cfg=$2 batch=$3 math=$4 warmup=$5 iters=$6
  listed "$name" "${ONLY:-}" && listed "$math" "${MATHS:-}" || continue
  echo "== $name, batch $batch per GPU, $math" | tee -a "$OUT/summary.txt"
  for np in $(seq 1 "$((NGPU < 2 ? NGPU : 2))"); do
    for layout in ${LAYOUTS:-auto}; do
    for exact in true ${INEXACT:+false}; do
      log="$OUT/bench-$name-$batch-$math-$np-exact-$exact-$layout.log"
      timeout 300 "${MPI[@]}" -np $np "$BIN/p2ptrain" bench "$cfg" --warmup "$warmup" --iters "$iters" \
        --set 'cluster.backend="cuda"' --set "cluster.math=\"$math\"" --set "data.batch_size=$batch" \
        --set "cluster.conv_exact=$exact" --set "cluster.gpu_layout=\"$layout\"" ${LAYERS:+--layers} \
        >"$log" 2>&1 || { echo "FAILED: bench $name np $np" | tee -a "$OUT/summary.txt"; tail -5 "$log" >>"$OUT/summary.txt"; failed=1; }
      echo "p2ptrain $name b$batch $math ${np} GPU(s) conv_exact=$exact layout=$layout: $(grep '^bench:' "$log")" \
        | tee -a "$OUT/summary.txt"
      grep -A6 '^step split' "$log" >>"$OUT/summary.txt"
      sed -n '/^per layer/,/^total/p' "$log" >>"$OUT/summary.txt"
    done
    done
    for format in "" ${TORCH_CHANNELS_LAST:+--channels-last}; do
    for tune in "" ${TORCH_CUDNN_BENCHMARK:+--cudnn-benchmark}; do
      err="$OUT/torch-$name-$batch-$math-$np${format:+-cl}${tune:+-tuned}.err"
      if [ $np -eq 1 ]; then
        timeout 300 python3 scripts/pytorch_ddp.py --workload "$name" --batch "$batch" --math "$math" \
          --warmup "$warmup" --iters "$iters" $format $tune 2>"$err" | tee -a "$OUT/summary.txt"
      else
        timeout 300 python3 -m torch.distributed.run --nproc_per_node=$np scripts/pytorch_ddp.py --workload "$name" \
          --batch "$batch" --math "$math" --warmup "$warmup" --iters "$iters" $format $tune \
          2>"$err" | tee -a "$OUT/summary.txt"
      fi
    done
    done
  done
done
exit $failed
