#!/usr/bin/env bash
# Local SGD on GPUs (`[cluster] sync = "local_sgd"`): correctness first, then the bytes each
# replica communicates and the samples/s for synchronous all-reduce and local SGD with
# H = sync_period = 1, 4, 16, in one command on a GPU machine (which needs no Rust toolchain):
#
#   scripts/gpu/local_sgd.sh BIN_DIR OUT_DIR       # BIN_DIR from scripts/gpu/package.sh
#
# Correctness (exits non-zero if a check fails; each needs 2 GPUs, node scope 4):
#  1. sync_period 1, plain averaging, SGD with momentum trains synchronous SGD's weights
#     (tests/configs/equivalence.toml, np 2 x 1 GPU, tolerance 2e-4); with 4 GPUs also node scope
#     (np 2 x 2 GPUs, node_ranks = 1: NCCL all-reduce within each pair, averaging across pairs).
#  2. The Nesterov outer rule, H = 4: two runs on the same GPUs give the same bits (tolerance 0).
#  3. A run stopped between averagings (iteration 12) and resumed to 30 gives a straight run's
#     bits (tolerance 0): the replicas' own parameters, histories and the outer state on the device.
#  4. GPU against CPU, the same local SGD run (Nesterov, H = 4): within 1e-3.
#  5. verify_interval = 1 passes (outer state and node agreement checked on the device's numbers).
# Timings: `p2ptrain bench config/mlp4096.toml` on every GPU up to 4 (np N x 1 GPU, batch 512 per
# GPU): allreduce, then local_sgd with H = 1, 4, 16 (replica scope), and with 4 GPUs node scope
# (node_ranks = 2) with H = 4, 16. Each line gives samples/s and what a replica handed to
# all-reduces ("communicated per replica": payload and ring bytes); OUT/local_sgd.md is the table.
set -uo pipefail
source "$(dirname "$0")/start.sh"
mkdir -p "$OUT/runs"
cd "$(dirname "$0")/../.."
CMP="python3 scripts/gpu/compare_snapshots.py"
EQ=tests/configs/equivalence.toml
failed=0
fail() { echo "FAILED: $*" | tee -a "$OUT/summary.txt"; failed=1; }
nvidia-smi -L | tee "$OUT/summary.txt"
NGPU=$(nvidia-smi -L | grep -c '^GPU')
[ "$NGPU" -ge 2 ] || { echo "local SGD needs at least 2 GPUs, this machine has $NGPU" | tee -a "$OUT/summary.txt"; exit 1; }
LOCAL='cluster.sync="local_sgd"'
NESTEROV='cluster.outer_optimizer="nesterov"'

train() { # name np replicas backend [sets...]; RESUME=1: --resume latest
  local name=$1 np=$2 r=$3 backend=$4; shift 4
  local sets=(--set data.batch_size=16 --set "cluster.replicas_per_rank=$r" --set "cluster.backend=\"$backend\"")
  for s in "$@"; do sets+=(--set "$s"); done
  [ -z "${RESUME:-}" ] || sets+=(--resume latest)
  "${MPI[@]}" -np "$np" "$BIN/p2ptrain" train $EQ --no-progress --output "$OUT/runs/$name" "${sets[@]}" \
    >>"$OUT/runs-$name.log" 2>&1 || fail "training $name"
}
snap() { echo "$OUT/runs/$1/snapshots/equiv_iter_${2:-30}.safetensors"; }
same() { # a b tol label; with tolerance 0 the solver states too (every replica's own state)
  $CMP "$(snap "$1")" "$(snap "$2")" --tol "$3" --label "$4" | tee -a "$OUT/summary.txt" || fail "$4"
  if [ "$3" = 0 ]; then
    local a b
    a=$(snap "$1") b=$(snap "$2")
    $CMP "${a%.safetensors}.solverstate" "${b%.safetensors}.solverstate" --tol 0 --label "$4 (solver state)" \
      | tee -a "$OUT/summary.txt" || fail "$4 (solver state)"
  fi
}

echo "== 1. sync_period 1 with plain averaging is synchronous SGD" | tee -a "$OUT/summary.txt"
train sync_2x1 2 1 cuda
train h1_2x1 2 1 cuda "$LOCAL" cluster.sync_period=1
same sync_2x1 h1_2x1 2e-4 "local SGD H=1 vs allreduce, np 2 x 1 GPU"
if [ "$NGPU" -ge 4 ]; then
  train sync_2x2 2 2 cuda
  train h1_node_2x2 2 2 cuda "$LOCAL" cluster.sync_period=1 'cluster.sync_scope="node"' cluster.node_ranks=1
  same sync_2x2 h1_node_2x2 2e-4 "local SGD H=1, node scope vs allreduce, np 2 x 2 GPUs"
else
  echo "SKIPPED (needs 4 GPUs, this machine has $NGPU): node scope" | tee -a "$OUT/summary.txt"
fi

echo "== 2. the same GPUs train the same bits" | tee -a "$OUT/summary.txt"
H4=("$LOCAL" "$NESTEROV" cluster.sync_period=4 cluster.sync_warmup=2)
train h4_a 2 1 cuda "${H4[@]}"
train h4_b 2 1 cuda "${H4[@]}"
same h4_a h4_b 0 "Nesterov H=4, run to run"

echo "== 3. resumed between averagings = straight" | tee -a "$OUT/summary.txt"
# Warm-up 2, period 4: averagings after 6, 10, 14, …; the first run stops after 12, between two.
train h4_resumed 2 1 cuda "${H4[@]}" solver.max_iter=12
RESUME=1 train h4_resumed 2 1 cuda "${H4[@]}"
same h4_a h4_resumed 0 "Nesterov H=4, resumed at 10 vs straight"

echo "== 4. GPU vs CPU" | tee -a "$OUT/summary.txt"
train h4_cpu 2 1 cpu "${H4[@]}"
same h4_a h4_cpu 1e-3 "Nesterov H=4, GPU vs CPU"

echo "== 5. verify_interval = 1" | tee -a "$OUT/summary.txt"
train h4_verified 2 1 cuda "${H4[@]}" cluster.verify_interval=1

if [ "$failed" -ne 0 ]; then
  echo "correctness failed: no timings" | tee -a "$OUT/summary.txt"
  exit 1
fi

N=$((NGPU < 4 ? NGPU : 4))
echo "== timings: mlp4096, batch 512 per GPU, np $N x 1 GPU" | tee -a "$OUT/summary.txt"
{
  echo "| sync | H | scope | samples/s | payload per replica per iteration | ring bytes per replica per iteration |"
  echo "| --- | --- | --- | --- | --- | --- |"
} >"$OUT/local_sgd.md"
bench() { # label H scope [sets...]
  local label=$1 h=$2 scope=$3; shift 3
  local sets=(--set 'cluster.backend="cuda"')
  for s in "$@"; do sets+=(--set "$s"); done
  local log="$OUT/bench-$label.log"
  "${MPI[@]}" -np "$N" "$BIN/p2ptrain" bench config/mlp4096.toml --warmup 32 --iters 320 "${sets[@]}" \
    >"$log" 2>&1 || { fail "bench $label"; return; }
  local rate comm payload ring
  rate=$(grep -o '[0-9.]* samples/s' "$log" | tail -n1)
  comm=$(grep '^communicated per replica' "$log")
  payload=$(echo "$comm" | grep -o '^communicated per replica: [0-9.]* MB' | grep -o '[0-9.]* MB')
  ring=$(echo "$comm" | grep -o '[0-9.]* MB per iteration')
  echo "$label: $rate; $comm" | tee -a "$OUT/summary.txt"
  echo "| ${label%%-*} | $h | $scope | ${rate% samples/s} | $payload over 320 iterations | $ring |" >>"$OUT/local_sgd.md"
}
bench allreduce - -
for h in 1 4 16; do
  bench "local_sgd-h$h" "$h" replica "$LOCAL" "cluster.sync_period=$h"
done
if [ "$N" -ge 4 ]; then
  for h in 4 16; do
    bench "local_sgd-node-h$h" "$h" "node (2 ranks)" "$LOCAL" "cluster.sync_period=$h" \
      'cluster.sync_scope="node"' cluster.node_ranks=2
  done
fi
cat "$OUT/local_sgd.md"
exit $failed
