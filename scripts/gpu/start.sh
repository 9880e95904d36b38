# Sourced first by the GPU scripts run as `SCRIPT BIN_DIR OUT_DIR ...`: BIN (the directory of the
# binaries) and OUT (the output directory, created) from the script's arguments, the environment
# of env.sh, and MPI, the mpirun command line (no binding, more ranks than cores allowed).
BIN=$(realpath "${1:?BIN_DIR}")
OUT=$(realpath -m "${2:?OUT_DIR}")
mkdir -p "$OUT"
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
MPI=(mpirun --bind-to none --oversubscribe)
