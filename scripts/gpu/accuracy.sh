#!/usr/bin/env bash
# The accuracy of mixed precision on GPUs: ResNet-20 on Fashion-MNIST (config/resnet20_fashion.toml:
# batch 128, SGD with a cosine rate, 12,000 iterations) trained in each of MATHS (default fp32, bf16,
# fp16) with each of SEEDS (default 1 2 3; solver.random_seed), one single-process run per GPU at
# a time, spread over all the machine's GPUs. Then each run's final test accuracy (all 10,000 test
# images, the last "phase":"test" line of its metrics.jsonl) in a table: per seed, the mean, the
# standard deviation over the seeds and the mean minus fp32's mean in percentage points; and each
# run's wall time and training samples/s (and fp16's loss scale at the end).
#
#   scripts/gpu/accuracy.sh BIN_DIR OUT_DIR
#   MATHS="fp32 bf16" SEEDS="1 2" scripts/gpu/accuracy.sh BIN_DIR OUT_DIR  # some precisions and seeds
#   ITERS=500 scripts/gpu/accuracy.sh BIN_DIR OUT_DIR                      # a quick try (solver.max_iter)
#   SETS='data.shift=4 solver.weight_decay=5e-4' scripts/gpu/accuracy.sh BIN_DIR OUT_DIR
#                                                   # more --set KEY=VALUE, after (over) the script's own
#   NGPU=2 scripts/gpu/accuracy.sh BIN_DIR OUT_DIR  # use only GPUs 0 and 1
#   PER_GPU=3 scripts/gpu/accuracy.sh BIN_DIR OUT_DIR  # runs sharing each GPU at a time (default 1;
#                                                   # ResNet-20's kernels leave an H200 mostly idle)
#   TIMEOUT=1800 scripts/gpu/accuracy.sh BIN_DIR OUT_DIR  # seconds a run may take (default 3600)
#   FASHION=DIR scripts/gpu/accuracy.sh BIN_DIR OUT_DIR   # the IDX files' folder (default Debian's)
#
# The final test runs at max_iter whatever solver.test_interval is, so an ITERS run ends with one
# too. Needs the Fashion-MNIST IDX files (.gz) under /usr/share/datasets/fashion-mnist/ (Debian's
# dataset-fashion-mnist) or FASHION, and python3. Each run writes OUT_DIR/accuracy/<math>-seed<seed>/
# (metrics.jsonl, the final snapshot) and its log OUT_DIR/accuracy/<math>-seed<seed>.log.
# Appends the tables to OUT_DIR/summary.txt and writes them to OUT_DIR/accuracy.md, and the first
# seed's curves of every precision overlaid to OUT_DIR/accuracy-curves-seed<seed>.svg.
# Exits non-zero if a run failed or ended without a final test.
set -uo pipefail
source "$(dirname "$0")/start.sh"
cd "$(dirname "$0")/../.." || exit 1
CFG=config/resnet20_fashion.toml
MATHS=${MATHS:-"fp32 bf16 fp16"}
SEEDS=${SEEDS:-"1 2 3"}
NGPU=${NGPU:-$(nvidia-smi -L | grep -c '^GPU')}
PER_GPU=${PER_GPU:-1}
TIMEOUT=${TIMEOUT:-3600}
RUNS="$OUT/accuracy"
mkdir -p "$RUNS"
failed=0
fail() { echo "FAILED: $*" | tee -a "$OUT/summary.txt"; failed=1; }

[ "$NGPU" -ge 1 ] || { fail "accuracy: no GPU (nvidia-smi -L lists none)"; exit 1; }
FASHION=$(realpath -m "${FASHION:-/usr/share/datasets/fashion-mnist}")
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz \
  t10k-labels-idx1-ubyte.gz; do
  [ -e "$FASHION/$f" ] \
    || { fail "accuracy: $FASHION/$f missing (apt-get install dataset-fashion-mnist, or FASHION=DIR)"; exit 1; }
done

# The --set values of every run, the script's first so that SETS (and ITERS) override them.
common=(--set 'cluster.backend="cuda"')
for k in train-images-idx3 train-labels-idx1 t10k-images-idx3 t10k-labels-idx1; do
  key=${k%-idx*}; key=${key/t10k/test}; key=${key/-/_}
  common+=(--set "data.$key=\"$FASHION/$k-ubyte.gz\"")
done
[ -z "${ITERS:-}" ] || common+=(--set "solver.max_iter=$ITERS")
read -r -a extra <<<"${SETS:-}"
for s in "${extra[@]}"; do common+=(--set "$s"); done

# The runs, in MATHS-major order; worker w of NGPU × PER_GPU takes runs w, w + workers, ... one
# after another on GPU w mod NGPU.
names=()
for math in $MATHS; do
  for seed in $SEEDS; do names+=("$math seed$seed $seed"); done
done
{
  echo "== accuracy: ResNet-20 on Fashion-MNIST ($CFG${ITERS:+, $ITERS iterations}), maths: $MATHS, seeds: $SEEDS"
  echo "${#names[@]} runs on $NGPU GPU(s), $PER_GPU per GPU at a time${SETS:+; --set $SETS}"
} | tee -a "$OUT/summary.txt"

run_one() { # gpu math seed -- one training run; writes <run>.status: "rc wall_seconds"
  local gpu=$1 math=$2 seed=$3 name="$2-seed$3" t0 t1 rc
  rm -rf "${RUNS:?}/$name" "$RUNS/$name.status"
  t0=$(date +%s.%N)
  CUDA_VISIBLE_DEVICES=$gpu timeout "$TIMEOUT" "$BIN/p2ptrain" train "$CFG" --no-progress --output "$RUNS/$name" \
    --set "cluster.math=\"$math\"" --set "solver.random_seed=$seed" "${common[@]}" \
    >"$RUNS/$name.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  echo "$rc $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')" >"$RUNS/$name.status"
  echo "$name on GPU $gpu: exit $rc, $(cut -d' ' -f2 "$RUNS/$name.status") s"
}

workers=$((NGPU * PER_GPU))
for ((w = 0; w < workers && w < ${#names[@]}; w++)); do
  (
    for ((i = w; i < ${#names[@]}; i += workers)); do
      read -r math _ seed <<<"${names[i]}"
      run_one "$((w % NGPU))" "$math" "$seed"
    done
  ) &
done
wait

for n in "${names[@]}"; do
  read -r math tag _ <<<"$n"
  name="$math-$tag"
  rc="none (no status file)"
  [ ! -e "$RUNS/$name.status" ] || read -r rc _ <"$RUNS/$name.status"
  if [ "$rc" != 0 ]; then
    fail "accuracy run $name (exit $rc): $(tail -n 3 "$RUNS/$name.log" 2>/dev/null | tr '\n' ' ')"
  elif ! grep -q '"phase":"test"' "$RUNS/$name/metrics.jsonl" 2>/dev/null; then
    fail "accuracy run $name: no test line in $RUNS/$name/metrics.jsonl"
  fi
done

# The tables: the last test line of each run (its iteration must be the run's last), the wall
# time from run_one and the training samples/s from the log's "trained to iteration" line.
python3 - "$RUNS" "$OUT/accuracy.md" "$MATHS" "$SEEDS" <<'PY' | tee -a "$OUT/summary.txt" || failed=1
import json, math, os, re, statistics, sys
runs, md, maths, seeds = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split()

def final(m, s):
    """(accuracy, loss, iter, wall s, samples/s) of run m-seed s; None where missing."""
    name = os.path.join(runs, f"{m}-seed{s}")
    acc = loss = it = wall = rate = None
    try:
        rc, wall = open(name + ".status").read().split()
        wall = float(wall)
        if rc == "0":
            tests = [json.loads(l) for l in open(os.path.join(name, "metrics.jsonl"))
                     if '"phase":"test"' in l]
            if tests:
                acc, loss, it = tests[-1]["accuracy"], tests[-1]["loss"], tests[-1]["iter"]
        log = open(name + ".log").read()
        got = re.search(r"trained to iteration (\d+) in [0-9.]+ s \(([0-9.]+) samples/s\)", log)
        if got:
            rate = float(got.group(2))
            if it is not None and int(got.group(1)) != it:
                print(f"FAILED: accuracy run {m}-seed{s}: last test at iteration {it}, "
                      f"trained to {got.group(1)}")
                acc = None
    except (OSError, ValueError, KeyError):
        pass
    if acc is not None and not (isinstance(loss, (int, float)) and math.isfinite(loss)):
        print(f"FAILED: accuracy run {m}-seed{s}: final test loss {loss}")
        acc = None
    return acc, loss, it, wall, rate

res = {(m, s): final(m, s) for m in maths for s in seeds}
bad = any(r[0] is None for r in res.values())
iters = sorted({r[2] for r in res.values() if r[2] is not None})

def mean(m):
    a = [res[m, s][0] for s in seeds]
    return None if None in a else statistics.mean(a)

def pct(x):
    return "—" if x is None else f"{100 * x:.2f}"

base = mean("fp32") if "fp32" in maths else None
out = [f"Final test accuracy (%, all 10,000 test images) after {', '.join(map(str, iters)) or '?'} "
       "iterations; difference in percentage points.", "",
       "| math | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | sd | mean − fp32 mean |",
       "|" + " --- |" * (len(seeds) + 4)]
for m in maths:
    a = [res[m, s][0] for s in seeds]
    mu = mean(m)
    sd = statistics.stdev(a) if mu is not None and len(a) > 1 else None
    d = "—" if mu is None or base is None else f"{100 * (mu - base):+.2f}"
    out.append(f"| {m} | " + " | ".join(pct(x) for x in a) + f" | {pct(mu)} | {pct(sd)} | {d} |")
out += ["", "Wall time of each run (s; process start to end, tests included) and training samples/s.", "",
        "| math | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|" + " --- |" * (len(seeds) + 1)]
for m in maths:
    cells = []
    for s in seeds:
        w, r = res[m, s][3], res[m, s][4]
        cells.append(("—" if w is None else f"{w:.0f} s") + ("" if r is None else f", {r:,.0f}/s"))
    out.append(f"| {m} | " + " | ".join(cells) + " |")
# Loss scaling (fp16): the last displayed loss scale and the overflow steps skipped by then.
scaled = {}
for m in maths:
    for s in seeds:
        try:
            train = [json.loads(l) for l in open(os.path.join(runs, f"{m}-seed{s}", "metrics.jsonl"))
                     if '"loss_scale"' in l]
        except (OSError, ValueError):
            train = []
        if train:
            scaled[m, s] = f"{train[-1]['loss_scale']:,.0f}, {train[-1].get('overflow_skipped', 0)} skipped"
if scaled:
    out += ["", "Loss scale at the last displayed iteration, overflow steps skipped by then.", "",
            "| math | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|" + " --- |" * (len(seeds) + 1)]
    for m in maths:
        if any((m, s) in scaled for s in seeds):
            out.append(f"| {m} | " + " | ".join(scaled.get((m, s), "—") for s in seeds) + " |")
open(md, "w").write("\n".join(out) + "\n")
print("\n".join(out))
sys.exit(1 if bad else 0)
PY

# The curves of the first seed's run of each precision overlaid (`p2ptrain plot`): training loss
# and test accuracy against the iteration, for docs/mixed-precision/.
seed=${SEEDS%% *}
curves=()
for math in $MATHS; do
  m="$RUNS/$math-seed$seed/metrics.jsonl"
  [ -e "$m" ] && curves+=("$m" --label "$math")
done
if [ ${#curves[@]} -gt 0 ]; then
  "$BIN/p2ptrain" plot "${curves[@]}" -o "$OUT/accuracy-curves-seed$seed.svg" \
    >>"$OUT/summary.txt" 2>&1 || fail "accuracy: p2ptrain plot"
fi
exit $failed
