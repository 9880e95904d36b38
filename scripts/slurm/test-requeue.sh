#!/usr/bin/env bash
# A real Slurm test of p2ptrain's cluster life cycle, on a one-node Slurm cluster started on this
# machine (scripts/slurm/local-cluster.sh; needs root): `sbatch` of the repository's templates
# (launch/slurm/*.sbatch), each job is signalled as at its time limit (USR1 to the batch script,
# as `--signal=B:USR1@120` does), snapshots, requeues itself, resumes from its snapshot and
# finishes with weights bit-identical to an uninterrupted run of the same length.
#
#   scripts/slurm/test-requeue.sh [BIN]     # BIN: the p2ptrain binary (default target/release)
#
# The templates' GPU lines are dropped for this CPU-only test (the copy is otherwise the template
# itself); nodes and tasks are set on the sbatch command line.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BIN=$(realpath "${1:-target/release/p2ptrain}")
WORK=$(mktemp -d /tmp/p2ptrain-slurm.XXXXXX)
# Long enough (about half a minute here) that the job is still training when Slurm delivers the
# USR1 and then the TERM. The jobs run at nice 10 (local-cluster.sh propagates sbatch's niceness).
ITERS=${P2PTRAIN_SLURM_ITERS:-40000}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# One rank per core, as a job would place them on a two-core node: the daemons, this script's
# polling, ps and scancel must still run while the ranks train (they once could not: see the
# README's Slurm section), or the USR1 lands only as the run ends and the test fails.
SETS="--set solver.max_iter=$ITERS --set solver.display=100 --set cluster.threads_per_replica=1"

scripts/slurm/local-cluster.sh start

echo "== uninterrupted reference: np 2, $ITERS iterations"
# shellcheck disable=SC2086
mpirun --oversubscribe --bind-to none -np 2 "$BIN" train config/quickstart.toml --no-progress \
  --output "$WORK/reference" $SETS >"$WORK/reference.log" 2>&1
ref="$WORK/reference/snapshots/digits_iter_$ITERS.safetensors"
[ -f "$ref" ] || { echo "no reference snapshot $ref"; cat "$WORK/reference.log"; exit 1; }

state() { scontrol show job "$1" | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
restarts() { scontrol show job "$1" | grep -o 'Restarts=[0-9]*' | cut -d= -f2; }
wait_for() { # job, predicate command, what, seconds
  local job=$1 pred=$2 what=$3 limit=$4
  for _ in $(seq 1 "$limit"); do
    if eval "$pred"; then return 0; fi
    sleep 1
  done
  echo "timed out waiting for $what (job $job: $(state "$job"))"
  scontrol show job "$job" || true
  cat "$WORK"/*.out 2>/dev/null || true
  return 1
}

run_template() { # template launcher-args
  local name=$1 template="launch/slurm/$1.sbatch"
  local script="$WORK/$name.sbatch" out="$WORK/$name-job"
  grep -v -e '--gpus-per-task' -e '--cpus-per-task' "$template" >"$script"
  echo "== sbatch $template (2 tasks on 1 node)"
  local job
  job=$(cd "$WORK" && CONFIG="$ROOT/config/quickstart.toml" P2PTRAIN="$BIN" OUTPUT="$out" \
    P2PTRAIN_ARGS="$SETS" MPIRUN_ARGS="--oversubscribe --bind-to none" \
    nice -n 10 sbatch --parsable --nodes=1 --ntasks=2 --ntasks-per-node=2 --output="$WORK/$name.out" "$script")
  # Rank 0's metrics.jsonl (flushed per line, written by the rank itself) shows training under
  # way; then signal it, well before the end of its run. (The job's log reaches its file through
  # the launcher, one more process that must get its turn.)
  wait_for "$job" "grep -q '\"iter\":200,' '$out/metrics.jsonl' 2>/dev/null" "training to start" 120
  echo "job $job is training; signalling it as at its time limit"
  scancel --signal=USR1 --batch "$job"
  timeout 10 ps -o pid,ni,args -C p2ptrain | cut -c1-120 || true
  wait_for "$job" "grep -q 'time limit near' '$WORK/$name.out'" "the batch script to receive USR1" 60
  wait_for "$job" '[ "$(restarts '"$job"')" -ge 1 ]' "the requeue" 120
  # A requeued job waits (BeginTime, about 2 minutes) before it may start again; once the node
  # has cleaned up the first start's step, let it start now.
  wait_for "$job" '[ "$(state '"$job"')" = PENDING ] && ! pgrep -f "slurmstepd: \[$job\." >/dev/null' \
    "the first start to be cleaned up" 60
  sleep 2
  scontrol update jobid="$job" StartTime=now
  wait_for "$job" 'case "$(state '"$job"')" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) true;; *) false;; esac' \
    "the resumed job to end" 300
  [ "$(state "$job")" = COMPLETED ] || { cat "$WORK/$name.out"; echo "FAIL: $name: job ended $(state "$job")"; exit 1; }
  cat "$WORK/$name.out"
  grep -q "snapshot taken; requeueing" "$WORK/$name.out" || { echo "FAIL: the job did not snapshot and requeue"; exit 1; }
  grep -q "resum" "$WORK/$name.out" || { echo "FAIL: the second start did not resume"; exit 1; }
  local final="$out/snapshots/digits_iter_$ITERS.safetensors"
  python3 scripts/slurm/same_weights.py "$ref" "$final" \
    || { echo "FAIL: $name: the requeued job's weights differ from the uninterrupted run's"; exit 1; }
  echo "PASS: $name: signalled, requeued (restarts $(restarts "$job")), resumed, same weights"
}

run_template p2ptrain-srun
run_template p2ptrain-mpirun
rm -rf "$WORK"
