#!/usr/bin/env bash
# Local SGD against synchronous SGD across two "hosts" whose link is throttled: the multi-node
# test's two containers (scripts/multinode/run.sh: node0 and node1 on a private Docker bridge,
# mpirun over ssh, OpenMPI over TCP), each container's interface shaped with `tc netem` (RATE,
# DELAY each way), one rank per host. For each workload it trains synchronous SGD
# (`sync = "allreduce"`) and local SGD with H = sync_period in H_VALUES (plain averaging), and
# reports time to a fixed test accuracy, final accuracy and samples/s; the curves are drawn with
# `p2ptrain plot`.
#
#   scripts/multinode/local_sgd.sh [IMAGE]        # default p2ptrain:latest (scripts/docker/build.sh)
#
# Environment:
#   P2PTRAIN_BINARY  a p2ptrain binary built on Debian bookworm (e.g. target/release/p2ptrain):
#                    the hosts then run it in a runtime image made from the base image
#                    (scripts/docker/base-image.sh) with OpenMPI 4.1, instead of IMAGE
#   RATE, DELAY      the link: default 1gbit and 1ms (each way, so 2 ms round trip)
#   H_VALUES         default "4 8 16"
#   WORKLOADS        default "digits fashion": the digits CNN (config/digits_cnn.toml, bundled
#                    data) and LeNet (config/lenet.toml) on Fashion-MNIST, read from
#                    FASHION_DIR (default /usr/share/datasets/fashion-mnist, Debian's
#                    dataset-fashion-mnist)
#   TARGET_DIGITS, TARGET_FASHION   the test accuracies timed (default 0.95 and 0.85)
#   OUT              where the runs' metrics, logs, curves and summary go (default
#                    local-sgd-results)
#   BENCH_RATES      then, for each of these link rates (default "1gbit 100mbit"), samples/s of
#                    `p2ptrain bench` (LeNet, Fashion-MNIST's shape: no tests, no display)
#                    for allreduce and each H, twice in turn (the spread shows the machine's noise)
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/multinode/hosts.sh
image="${1:-p2ptrain:latest}"
RATE="${RATE:-1gbit}"
DELAY="${DELAY:-1ms}"
H_VALUES="${H_VALUES:-4 8 16}"
WORKLOADS="${WORKLOADS-digits fashion}"
FASHION_DIR="${FASHION_DIR:-/usr/share/datasets/fashion-mnist}"
TARGET_DIGITS="${TARGET_DIGITS:-0.95}"
TARGET_FASHION="${TARGET_FASHION:-0.85}"
OUT="$(realpath -m "${OUT:-local-sgd-results}")"
say() { echo "local_sgd: $*"; }
fail() { echo "local_sgd: FAILED: $*" >&2; exit 1; }
mkdir -p "$OUT"

hosts_init p2ptrain-lsgd

if [ -n "${P2PTRAIN_BINARY:-}" ]; then
  # The runtime stage of the repository's Dockerfile, with a binary built outside Docker.
  base="p2ptrain/debian:bookworm"
  docker image inspect "$base" >/dev/null 2>&1 || scripts/docker/base-image.sh "$base"
  mkdir "$work/runtime"
  cp "$P2PTRAIN_BINARY" "$work/runtime/p2ptrain"
  strip "$work/runtime/p2ptrain" 2>/dev/null || true
  cat >"$work/runtime/Dockerfile" <<EOF
FROM $base
RUN apt-get update -qq \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openmpi-bin openssh-client procps \\
 && rm -rf /var/lib/apt/lists/*
COPY p2ptrain /usr/local/bin/p2ptrain
ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
WORKDIR /work
EOF
  image="p2ptrain:local-sgd-binary"
  docker build -q -t "$image" "$work/runtime" >/dev/null
fi
docker image inspect "$image" >/dev/null 2>&1 || fail "no image $image: build it with scripts/docker/build.sh, or set P2PTRAIN_BINARY"
node_image="p2ptrain-node:local-sgd"
docker build -q --build-arg IMAGE="$image" -t "$node_image" -f scripts/multinode/Dockerfile.node scripts/multinode >/dev/null

hosts_keys "$work/ssh" "$node_image"
docker network create "$net" >/dev/null
subnet="$(docker network inspect -f '{{range .IPAM.Config}}{{.Subnet}}{{end}}' "$net")"
data_mount=()
[ -d "$FASHION_DIR" ] && data_mount=(-v "$FASHION_DIR:/data/fashion-mnist:ro")
for n in node0 node1; do
  docker run -d --name "$id-$n" --hostname "$n" --network "$net" --network-alias "$n" --cap-add NET_ADMIN \
    -v "$work/ssh:/root/.ssh:ro" -v "$PWD/config:/configs:ro" "${data_mount[@]}" "$node_image" >/dev/null
done
hosts_wait_ssh "$id" || fail "node0 cannot ssh to node1"

# The link: every packet a host sends waits DELAY and leaves at RATE (netem on its interface).
# A kernel without sch_netem (some VMs' kernels) gets the rate alone, from a token bucket (tbf),
# and no added delay: said here and in the summary.
shaping="netem rate $RATE delay $DELAY each way"
for n in node0 node1; do
  if ! docker exec "$id-$n" tc qdisc replace dev eth0 root netem rate "$RATE" delay "$DELAY" 2>/dev/null; then
    shaping="tbf rate $RATE (this kernel has no netem: no added delay)"
    docker exec "$id-$n" tc qdisc replace dev eth0 root tbf rate "$RATE" burst 512kb latency 50ms \
      || fail "tc on $n (the node image needs iproute2)"
  fi
done
rtt="$(docker exec "$id-node0" ping -c 5 -q node1 | tail -n1)"
say "link node0 <-> node1: $shaping; ping: $rtt"
echo "link: $shaping; ping node0 -> node1: $rtt" >"$OUT/link.txt"

mpi() { # OUTPUT_DIR LOG ARGS...
  local out="$1" log="$2"
  shift 2
  docker exec "$id-node0" mpirun -np 2 --host node0:1,node1:1 --bind-to none \
    --mca btl tcp,self --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet" \
    p2ptrain "$@" --output "$out" >"$log" 2>&1
}
# What the shaped link carries: the CPU all-reduce over it, each size checked before it is timed.
docker exec "$id-node0" mpirun -np 2 --host node0:1,node1:1 --bind-to none \
  --mca btl tcp,self --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet" \
  p2ptrain bench-allreduce --backend cpu --min-bytes 4K --max-bytes 16M --iters 10 >"$OUT/bench-allreduce.log" 2>&1 \
  || { cat "$OUT/bench-allreduce.log"; fail "bench-allreduce over the shaped link"; }
grep -v '^\[' "$OUT/bench-allreduce.log"

fashion_sets=(
  --set "data.train_images=\"/data/fashion-mnist/train-images-idx3-ubyte.gz\""
  --set "data.train_labels=\"/data/fashion-mnist/train-labels-idx1-ubyte.gz\""
  --set "data.test_images=\"/data/fashion-mnist/t10k-images-idx3-ubyte.gz\""
  --set "data.test_labels=\"/data/fashion-mnist/t10k-labels-idx1-ubyte.gz\""
  --set solver.max_iter=1500 --set solver.display=20 --set solver.test_interval=150
  --set solver.snapshot=0
)
digits_sets=(--set solver.display=50 --set solver.test_interval=100)
common_sets=(--set cluster.threads_per_replica=1 --no-progress)

for w in $WORKLOADS; do
  case "$w" in
    digits) cfg=/configs/digits_cnn.toml; sets=("${digits_sets[@]}"); target=$TARGET_DIGITS ;;
    fashion)
      [ -d "$FASHION_DIR" ] || fail "no Fashion-MNIST in $FASHION_DIR (apt-get install dataset-fashion-mnist)"
      cfg=/configs/lenet.toml; sets=("${fashion_sets[@]}"); target=$TARGET_FASHION ;;
    *) fail "unknown workload $w" ;;
  esac
  runs=(allreduce)
  for h in $H_VALUES; do runs+=("h$h"); done
  for r in "${runs[@]}"; do
    case "$r" in
      allreduce) sync=() ;;
      h*) sync=(--set 'cluster.sync="local_sgd"' --set "cluster.sync_period=${r#h}") ;;
    esac
    say "$w: $r"
    mpi "/work/$w-$r" "$OUT/$w-$r.log" train "$cfg" "${sets[@]}" "${common_sets[@]}" "${sync[@]}" \
      || { tail -n 30 "$OUT/$w-$r.log"; fail "$w $r"; }
    mkdir -p "$OUT/$w-$r"
    docker cp -q "$id-node0:/work/$w-$r/metrics.jsonl" "$OUT/$w-$r/metrics.jsonl"
    grep -E '^(trained|test:|communicated)' "$OUT/$w-$r.log" || true
  done
  echo "$target" >"$OUT/$w.target"
done

# Time to the target accuracy (test points placed in time as `p2ptrain plot` does: by the train
# lines' elapsed_s, interpolated over iterations), final accuracy, median displayed samples/s.
python3 - "$OUT" $WORKLOADS <<'EOF' | tee "$OUT/summary.md"
import json, os, statistics, sys
out, workloads = sys.argv[1], sys.argv[2:]
print("| workload | sync | time to target (s) | iterations to target | final accuracy | samples/s (median) |")
print("| --- | --- | --- | --- | --- | --- |")
for w in workloads:
    target = float(open(os.path.join(out, w + ".target")).read())
    for d in sorted(x for x in os.listdir(out) if x.startswith(w + "-") and os.path.isdir(os.path.join(out, x))):
        lines = [json.loads(l) for l in open(os.path.join(out, d, "metrics.jsonl"))]
        train = [(l["iter"] + 1, l["elapsed_s"], l["samples_per_sec"]) for l in lines if l["phase"] == "train"]
        tests = [(l["iter"], l["accuracy"]) for l in lines if l["phase"] == "test"]
        def at(k):
            prev = (0, 0.0)
            for it, t, _ in train:
                if it >= k:
                    return prev[1] + (t - prev[1]) * (k - prev[0]) / max(it - prev[0], 1)
                prev = (it, t)
            return train[-1][1]
        hit = next(((k, at(k)) for k, a in tests if a >= target), None)
        rate = statistics.median(s for _, _, s in train[1:]) if len(train) > 1 else float("nan")
        sync = d[len(w) + 1:]
        reach = f"{hit[1]:.1f} | {hit[0]}" if hit else "not reached | -"
        print(f"| {w} (target {target:.2f}) | {sync} | {reach} | {tests[-1][1]:.4f} | {rate:.0f} |")
EOF
# Throughput alone: `p2ptrain bench` (warm-up, then timed steps with no test or display) on LeNet
# at each rate, every sync mode twice in turn.
shape() { # RATE
  for n in node0 node1; do
    docker exec "$id-$n" tc qdisc replace dev eth0 root tbf rate "$1" burst 512kb latency 50ms
  done
}
if [ -n "${BENCH_RATES-1gbit 100mbit}" ]; then
  echo "| link | sync | samples/s (two runs) | ring MB per iteration |" >"$OUT/bench.md"
  echo "| --- | --- | --- | --- |" >>"$OUT/bench.md"
fi
for rate in ${BENCH_RATES-1gbit 100mbit}; do
  shape "$rate"
  for r in allreduce $(for h in $H_VALUES; do echo "h$h"; done); do
    case "$r" in
      allreduce) sync=() ;;
      h*) sync=(--set 'cluster.sync="local_sgd"' --set "cluster.sync_period=${r#h}") ;;
    esac
    rates=()
    for pass in 1 2; do
      log="$OUT/bench-$rate-$r-$pass.log"
      docker exec "$id-node0" mpirun -np 2 --host node0:1,node1:1 --bind-to none \
        --mca btl tcp,self --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet" \
        p2ptrain bench /configs/lenet.toml --warmup 16 --iters 96 "${fashion_sets[@]:0:8}" \
        --set cluster.threads_per_replica=1 "${sync[@]}" >"$log" 2>&1 || { cat "$log"; fail "bench $rate $r"; }
      rates+=("$(grep -o '[0-9.]* samples/s' "$log" | tail -n1 | cut -d' ' -f1)")
    done
    ring=$(grep -o '[0-9.]* MB per iteration' "$log" | cut -d' ' -f1)
    echo "| $rate | $r | ${rates[*]} | ${ring:-0} |" | tee -a "$OUT/bench.md"
  done
done

# The curves, drawn by `p2ptrain plot` on node0 from the runs it wrote.
for w in $WORKLOADS; do
  files=() labels=()
  for d in "$OUT/$w"-*/; do
    files+=("/work/$(basename "$d")/metrics.jsonl")
    labels+=(--label "$(basename "$d")")
  done
  docker exec "$id-node0" p2ptrain plot "${files[@]}" "${labels[@]}" -o "/work/$w.svg" >/dev/null
  docker cp -q "$id-node0:/work/$w.svg" "$OUT/$w.svg"
  say "curves: $OUT/$w.svg"
done
say "summary: $OUT/summary.md"
