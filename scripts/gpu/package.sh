#!/usr/bin/env bash
# Builds what scripts/gpu/check.sh needs into DIR (default .gpu/, ignored by git): the release
# binary and the library's test binary. Run here; carry DIR to the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-.gpu}
mkdir -p "$DIR"
cargo build --release
cp "${CARGO_TARGET_DIR:-target}/release/p2ptrain" "$DIR/"
strip "$DIR/p2ptrain"
test_bin=$(cargo test --release --lib --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["lib"]:
        print(m["executable"])')
cp "$test_bin" "$DIR/p2ptrain-unittests"
strip "$DIR/p2ptrain-unittests"
ls -la "$DIR"
