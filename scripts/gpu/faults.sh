#!/usr/bin/env bash
# A stalled or killed rank must end the whole job, on GPUs as on CPUs:
#
#   scripts/gpu/faults.sh BIN_DIR OUT_DIR [BACKEND]     # BACKEND: cuda (default) or cpu
#
# Two ranks train config/mlp4096.toml with `collective_timeout_s = 20`; once training runs, one
# rank is stopped (SIGSTOP) or killed (SIGKILL). Each case passes when `mpirun` ends with a
# non-zero code within the deadline plus 20 s, the stopped rank is named in the log, and no
# process of the job is left (none on a GPU either). Called by scripts/gpu/check.sh; with
# BACKEND=cpu it runs anywhere (the same cases as tests/faults.rs, through this script).
# Exits non-zero if a case fails.
set -uo pipefail
source "$(dirname "$0")/start.sh"
BACKEND=${3:-cuda}
mkdir -p "$OUT/runs"
cd "$(dirname "$0")/../.."
TIMEOUT=20
LIMIT=$((TIMEOUT + 20))
failed=0
fail() { echo "FAILED: $*" | tee -a "$OUT/summary.txt"; failed=1; }

# The PIDs of the job's processes (mpirun's children that run p2ptrain with this output folder).
job_pids() { pgrep -f -- "--output $1( |$)" | grep -vx "$2" || true; }

# The PID of MPI rank $2 among the processes $1.
rank_pid() {
  for p in $1; do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$p"
      return
    fi
  done
}

run_case() { # name signal
  local name=$1 sig=$2 dir="$OUT/runs/fault-$1" log="$OUT/fault-$1.log"
  rm -rf "$dir"
  mpirun --bind-to none --oversubscribe -np 2 "$BIN/p2ptrain" train config/mlp4096.toml \
    --no-progress --output "$dir" --set "cluster.backend=\"$BACKEND\"" \
    --set "cluster.collective_timeout_s=$TIMEOUT" --set solver.max_iter=1000000000 \
    --set solver.display=100 --set solver.snapshot=0 >"$log" 2>&1 &
  local mp=$!
  local i
  for i in $(seq 1200); do grep -q "INFO iter " "$log" && break; sleep 0.1; done
  sleep 3
  local pids victim
  pids=$(job_pids "$dir" "$mp")
  victim=$(rank_pid "$pids" 1)
  if [ -z "$victim" ] || ! grep -q "INFO iter " "$log"; then
    fail "$name: the job did not start training (log: $log)"
    kill -9 $mp $pids 2>/dev/null
    return
  fi
  kill "-$sig" "$victim"
  local start end rc=0
  start=$(date +%s)
  while kill -0 $mp 2>/dev/null && [ $(($(date +%s) - start)) -lt "$LIMIT" ]; do sleep 0.5; done
  if kill -0 $mp 2>/dev/null; then
    fail "$name: the job still runs ${LIMIT} s after SIG$sig of rank 1 (pid $victim)"
    kill -9 $mp $pids 2>/dev/null
    kill -CONT "$victim" 2>/dev/null
  fi
  wait $mp || rc=$?
  end=$(date +%s)
  sleep 2
  local left
  left=$(job_pids "$dir" "$mp")
  if [ -n "$left" ]; then
    fail "$name: processes left after the job ended: $left"
    kill -9 $left 2>/dev/null
  fi
  if [ "$BACKEND" = cuda ] && command -v nvidia-smi >/dev/null; then
    local on_gpu
    on_gpu=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | tr -d ' ' | grep -xF "$pids" || true)
    [ -z "$on_gpu" ] || fail "$name: processes of the job still on a GPU: $on_gpu"
  fi
  [ "$rc" -ne 0 ] || fail "$name: mpirun exited 0 after SIG$sig of rank 1"
  if [ "$sig" = STOP ] && ! grep -q "rank 1 (silent" "$log"; then
    fail "$name: the log does not name the stopped rank 1 (log: $log)"
  fi
  echo "$name ($BACKEND): SIG$sig of rank 1 -> mpirun exit $rc after $((end - start)) s (limit $LIMIT s)" \
    | tee -a "$OUT/summary.txt"
  grep -h "error" "$log" | head -n 3 | tee -a "$OUT/summary.txt"
}

run_case stop STOP
run_case kill KILL
exit $failed
