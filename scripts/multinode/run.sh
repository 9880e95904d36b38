#!/usr/bin/env bash
# Multi-node test over a real network: two containers of the p2ptrain image ("hosts" node0 and
# node1, each with its own hostname and address on a private Docker bridge network, sshd with a key
# generated here), OpenMPI over TCP between them.
#
#   scripts/multinode/run.sh [IMAGE]        # default p2ptrain:latest (scripts/docker/build.sh)
#
# 1. Equivalence: tests/configs/equivalence.toml on 2 hosts x 2 ranks must give the same weights
#    as on 1 host x 4 ranks (same global batch; the tolerance of tests/topology_equivalence.rs).
# 2. Lost host: node1 is killed mid-run (`docker kill`); the job must end with a non-zero exit
#    within LOST_HOST_LIMIT_S seconds, and the message is checked for the lost host's name.
# 3. Silent host: node1 is frozen mid-run (`docker pause`: its connections stay open, nothing
#    answers; where the engine cannot pause, its link is cut with `docker network disconnect`).
#    OpenMPI's TCP transport would wait on it forever; p2ptrain's collective deadline
#    (PAUSE_SETS: collective_timeout_s = 15) must fire within PAUSED_HOST_LIMIT_S, name node1's
#    ranks, and end node0's ranks. mpirun then still waits for node1's daemon in its own
#    teardown (OpenMPI), which the script ends. PAUSE_EXPECT_END=0 (with PAUSE_SETS emptied) shows the
#    behaviour without a deadline: a hang, reported and ended by the script.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/multinode/hosts.sh
image="${1:-p2ptrain:latest}"
LOST_HOST_LIMIT_S="${LOST_HOST_LIMIT_S:-60}"
PAUSED_HOST_LIMIT_S="${PAUSED_HOST_LIMIT_S:-45}"
# A deadline on every collective makes a silent peer an error.
PAUSE_SETS=(--set cluster.collective_timeout_s=15)
PAUSE_EXPECT_END="${PAUSE_EXPECT_END:-1}"

t() { date +%s; }
say() { echo "multinode: $*"; }
fail() { echo "multinode: FAILED: $*" >&2; exit 1; }
t_start=$(t)

docker image inspect "$image" >/dev/null 2>&1 || fail "no image $image: build it with scripts/docker/build.sh"
node_image="p2ptrain-node:test"
docker build -q --build-arg IMAGE="$image" -t "$node_image" -f scripts/multinode/Dockerfile.node scripts/multinode >/dev/null

hosts_init p2ptrain-mn

# Passwordless root login between the hosts, with a key made for this run.
hosts_keys "$work/ssh" "$image"

docker network create "$net" >/dev/null
subnet="$(docker network inspect -f '{{range .IPAM.Config}}{{.Subnet}}{{end}}' "$net")"
for n in node0 node1; do
  docker run -d --name "$id-$n" --hostname "$n" --network "$net" --network-alias "$n" \
    -v "$work/ssh:/root/.ssh:ro" -v "$PWD/tests/configs:/configs:ro" \
    "$node_image" >/dev/null
done
for n in node0 node1; do
  say "$n is $(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$id-$n") on $net ($subnet)"
done
hosts_wait_ssh "$id" || fail "node0 cannot ssh to node1"

# mpirun on node0, over TCP on the private network only (no shared memory between ranks, so the
# single-host reference goes through the same transport). `timeout` runs inside the container, so
# that ending it ends mpirun and its ranks.
mpi() { # LIMIT_S HOSTS OUTPUT_DIR ARGS...
  local limit="$1" hosts="$2" out="$3"
  shift 3
  docker exec "$id-node0" timeout -k 10 "$limit" \
    mpirun -np 4 --host "$hosts" --bind-to none \
    --mca btl tcp,self --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet" \
    p2ptrain train "$@" --output "$out" --no-progress
}
equiv=(/configs/equivalence.toml --set data.batch_size=16)

# 1. Equivalence: 1 host x 4 ranks, then 2 hosts x 2 ranks.
t0=$(t)
mpi 300 node0:4 /work/single "${equiv[@]}" >"$work/single.log" 2>&1 \
  || { cat "$work/single.log"; fail "the single-host run failed"; }
t1=$(t)
mpi 300 node0:2,node1:2 /work/multi "${equiv[@]}" >"$work/multi.log" 2>&1 \
  || { cat "$work/multi.log"; fail "the 2-host run failed"; }
t2=$(t)
tail -n 3 "$work/multi.log"
say "1 host x 4 ranks: $((t1 - t0)) s; 2 hosts x 2 ranks: $((t2 - t1)) s"
# Every rank of the 2-host run really ran on its host.
placement="$(docker exec "$id-node0" mpirun -np 4 --host node0:2,node1:2 \
  --mca btl tcp,self --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet" hostname | sort | uniq -c | xargs)"
[ "$placement" = "2 node0 2 node1" ] || fail "ranks placed as '$placement', expected 2 on node0 and 2 on node1"
snap=snapshots/equiv_iter_30.safetensors
docker cp -q "$id-node0:/work/single/$snap" "$work/single.safetensors"
docker cp -q "$id-node0:/work/multi/$snap" "$work/multi.safetensors"
python3 scripts/multinode/compare_snapshots.py "$work/single.safetensors" "$work/multi.safetensors" 2e-4 \
  || fail "2 hosts x 2 ranks and 1 host x 4 ranks trained different weights"
say "equivalence: passed"

# A long run on 2 hosts x 2 ranks, to break once it is training.
start_long() { # LIMIT_S OUTPUT_DIR LOG ARGS...
  local limit="$1" out="$2" log="$3"
  shift 3
  mpi "$limit" node0:2,node1:2 "$out" /configs/equivalence.toml \
    --set solver.max_iter=1000000 --set solver.display=100 --set solver.test_interval=0 "$@" >"$log" 2>&1 &
}
wait_training() { # LOG PID
  for _ in $(seq 1 300); do
    grep -q 'iter [1-9][0-9]*: loss' "$1" && return 0
    kill -0 "$2" 2>/dev/null || { cat "$1"; fail "the long run ended before training"; }
    sleep 0.2
  done
  cat "$1"
  fail "the long run did not start training within 60 s"
}
# Waits for PID up to LIMIT_S; sets rc to its exit status, or to "hang".
wait_end() { # PID LIMIT_S
  local end=$(($(t) + $2))
  while kill -0 "$1" 2>/dev/null; do
    [ "$(t)" -lt "$end" ] || { rc=hang; return; }
    sleep 0.5
  done
  rc=0
  wait "$1" || rc=$?
}

# 2. Lost host.
log="$work/lost.log"
start_long $((LOST_HOST_LIMIT_S + 120)) /work/lost "$log"
pid=$!
wait_training "$log" "$pid"
t0=$(t)
docker kill "$id-node1" >/dev/null
say "killed node1 mid-run"
wait_end "$pid" "$LOST_HOST_LIMIT_S"
t1=$(t)
tail -n 25 "$log"
[ "$rc" != hang ] || fail "the job did not end within $LOST_HOST_LIMIT_S s of losing node1"
[ "$rc" -ne 0 ] || fail "the job exited 0 after losing node1"
grep -q node1 "$log" && names="names node1" || names="does not name node1"
say "lost host: the job ended with exit $rc $((t1 - t0)) s after node1 was killed; its message $names"
grep -q node1 "$log" || fail "the message of the lost-host failure does not name node1"

# 3. Silent host: a fresh node1.
docker rm -f "$id-node1" >/dev/null
docker run -d --name "$id-node1" --hostname node1 --network "$net" --network-alias node1 \
  -v "$work/ssh:/root/.ssh:ro" -v "$PWD/tests/configs:/configs:ro" "$node_image" >/dev/null
hosts_wait_ssh "$id" || true
log="$work/paused.log"
start_long $((PAUSED_HOST_LIMIT_S + 30)) /work/paused "$log" "${PAUSE_SETS[@]}"
pid=$!
wait_training "$log" "$pid"
t0=$(t)
# Freeze node1 (`docker pause`); where the engine cannot (no cgroup freezer), cut its link instead
# (`docker network disconnect`): either way node1 falls silent without closing a connection.
if docker pause "$id-node1" >/dev/null 2>"$work/pause.err"; then
  silenced=paused
  say "paused node1 mid-run"
else
  docker network disconnect "$net" "$id-node1"
  silenced=disconnected
  say "docker pause is not available here ($(tr -d '\n' <"$work/pause.err")); disconnected node1 from $net mid-run instead"
fi
wait_end "$pid" "$PAUSED_HOST_LIMIT_S"
t1=$(t)
tail -n 25 "$log"
if [ "$rc" = hang ] && [ "$PAUSE_EXPECT_END" = 1 ]; then
  # p2ptrain's part: the deadline fires on node0's ranks, names node1's ranks (2 and 3), and
  # those ranks end (MPI_Abort, then exit after a grace period). mpirun itself keeps waiting
  # for the paused host's daemon (OpenMPI's teardown), so the script ends mpirun.
  grep -q "did not complete within" "$log" || fail "no deadline report with node1 $silenced"
  grep -q "not heard from: rank 2 (" "$log" || fail "the deadline report does not name node1's ranks"
  if docker exec "$id-node0" pgrep -x p2ptrain >/dev/null; then
    fail "p2ptrain ranks on node0 still run $PAUSED_HOST_LIMIT_S s after node1 was $silenced"
  fi
  say "silent host: node0's ranks reported the silent ranks of node1 and exited; mpirun itself" \
    "waits on node1's daemon (OpenMPI's teardown), ended by this script"
  docker exec "$id-node0" pkill -TERM -x timeout || true
  wait "$pid" 2>/dev/null || true
elif [ "$rc" = hang ]; then
  say "KNOWN LIMITATION: with node1 $silenced the job was still waiting after $PAUSED_HOST_LIMIT_S s" \
    "(OpenMPI's TCP transport does not time out on a silent peer; a collective deadline in p2ptrain" \
    "is needed to end it: see PAUSE_SETS in this script). Ending it."
  docker exec "$id-node0" pkill -TERM -x timeout || true
  wait "$pid" 2>/dev/null || true
else
  [ "$rc" -ne 0 ] || fail "the job exited 0 with node1 $silenced"
  if [ "$PAUSE_EXPECT_END" = 1 ]; then
    grep -q "did not complete within" "$log" || fail "no deadline message from p2ptrain"
  fi
  say "silent host: the job ended with exit $rc $((t1 - t0)) s after node1 was $silenced"
fi
say "passed in $(($(t) - t_start)) s"
