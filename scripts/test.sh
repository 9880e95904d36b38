#!/usr/bin/env bash
# Runs every test: installs what is missing, then the unit tests and the integration tests that
# launch the real binary under mpirun (release build: the tests train real networks), then the
# Slurm requeue test on a one-node Slurm cluster (scripts/slurm/test-requeue.sh, as root), the
# container test (scripts/docker/test-image.sh) and the multi-node test over a Docker network
# (scripts/multinode/run.sh). Arguments are passed to `cargo test` and select cargo tests only.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# NVRTC from its PyPI wheel (no GPU needed), so that the GPU kernels' source is compiled here too
# (cuda::kernels::tests::source_compiles_with_nvrtc); without it that test says SKIPPED.
nvrtc_lib() {
  python3 - <<'PY' 2>/dev/null
import glob, os, sys
for p in sys.path:
    for f in glob.glob(os.path.join(p, "nvidia", "cu*", "lib", "libnvrtc.so.*")):
        print(os.path.dirname(f))
        sys.exit(0)
sys.exit(1)
PY
}
if ! nvrtc=$(nvrtc_lib); then
  python3 -m pip install -q --disable-pip-version-check 'nvidia-cuda-nvrtc==13.0.*' >/dev/null 2>&1 \
    || echo "NVRTC wheel not installed: the kernel compile test will say SKIPPED"
  nvrtc=$(nvrtc_lib) || nvrtc=""
fi
[ -z "$nvrtc" ] || export LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cargo test --release "$@"
if [ $# -gt 0 ]; then
  echo "Slurm, container and multi-node tests not run: arguments select cargo tests only"
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
  scripts/slurm/test-requeue.sh
else
  echo "=================================================================================="
  echo "SKIPPED: Slurm requeue test: it installs and starts slurmctld/slurmd and needs root"
  echo "=================================================================================="
fi
if ! docker info >/dev/null 2>&1; then
  echo "=================================================================================="
  echo "SKIPPED: container test and multi-node test: no Docker engine reachable (docker info failed)"
  echo "=================================================================================="
  exit 0
fi
scripts/docker/test-image.sh
scripts/multinode/run.sh
