#!/usr/bin/env bash
# Set-up and first run: installs what is missing, builds the release binary, and trains the
# embedded quickstart (an MLP on the bundled digits) under mpirun with 2 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo build --release
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec mpirun --oversubscribe --bind-to none -np "${NP:-2}" target/release/p2ptrain
