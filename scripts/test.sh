#!/usr/bin/env bash
# Runs every test: installs what is missing, then the unit tests and the integration tests that
# launch the real binary under mpirun (release build: the tests train real networks).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo test --release "$@"
