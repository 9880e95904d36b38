# Sourced first by the GPU scripts run as `SCRIPT BIN_DIR OUT_DIR ...`: BIN (the directory of the
# binaries) and OUT (the output directory, created) from the script's arguments, the environment
# of env.sh, MPI, the mpirun command line (no binding, more ranks than cores allowed), and
# `listed`, the filter of the ONLY-style selections.
BIN=$(realpath "${1:?BIN_DIR}")
OUT=$(realpath -m "${2:?OUT_DIR}")
mkdir -p "$OUT"
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
MPI=(mpirun --bind-to none --oversubscribe)
# Whether the space-separated list $2 (ONLY, MATHS, ...) names $1; an empty list names everything.
listed() { [ -z "$2" ] || [[ " $2 " == *" $1 "* ]]; }
