#!/usr/bin/env bash
# Builds the p2ptrain image (the repository's Dockerfile): makes the Debian base image when it is
# missing (scripts/docker/base-image.sh), stages this machine's Rust toolchain and the locked crates
# into the build context (.docker-stage/rust and .docker-stage/vendor; the Dockerfile says why),
# then `docker build`.
#
#   scripts/docker/build.sh [TAG] [docker build options...]     # default TAG p2ptrain:latest
#
# Environment: BASE, an image to build from instead of the debootstrapped one (skips
# base-image.sh), e.g. BASE=debian:bookworm-slim where a registry is reachable.
set -euo pipefail
cd "$(dirname "$0")/../.."
tag="${1:-p2ptrain:latest}"
shift || true
base="${BASE:-p2ptrain/debian:bookworm}"
[ -n "${BASE:-}" ] || scripts/docker/base-image.sh "$base"

sysroot="$(rustc --print sysroot)"
host="$(rustc -vV | sed -n 's/^host: //p')"
if [ "$host" != x86_64-unknown-linux-gnu ] || [ ! -x "$sysroot/bin/cargo" ] || [ ! -d "$sysroot/lib/rustlib/$host/lib" ]; then
  echo "cannot stage the Rust toolchain: expected a rustup-style x86_64-unknown-linux-gnu toolchain at $sysroot" >&2
  exit 2
fi
# Each part is staged again only when it changed (a stamp records what it was staged from), so
# that Docker's layer cache keeps the compiled dependencies between builds.
stage=.docker-stage/rust
stamp="$(rustc -vV | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stage.stamp" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$stage" "$stage.stamp"
  mkdir -p "$stage/bin" "$stage/lib/rustlib"
  # Hard links when the toolchain is on the same file system (instant), copies otherwise. Only
  # what building needs: cargo, rustc, the compiler's libraries and the host's standard library.
  link() { cp -al "$@" 2>/dev/null || cp -a "$@"; }
  link "$sysroot/bin/cargo" "$sysroot/bin/rustc" "$stage/bin/"
  for f in "$sysroot"/lib/*.so*; do link "$f" "$stage/lib/"; done
  link "$sysroot/lib/rustlib/$host" "$stage/lib/rustlib/"
  echo "$stamp" >"$stage.stamp"
fi
echo "staged $(rustc --version) ($(du -sh "$stage" | cut -f1)) for the build"
# The crates Cargo.lock pins, from cargo's cache when it has them all (no network), else crates.io.
vendor=.docker-stage/vendor
stamp="$(sha256sum Cargo.lock | cut -d' ' -f1)"
if [ "$(cat "$vendor.stamp" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$vendor" "$vendor.stamp"
  cargo vendor --locked --offline -q "$vendor" >/dev/null 2>&1 \
    || cargo vendor --locked -q "$vendor" >/dev/null
  echo "$stamp" >"$vendor.stamp"
fi
echo "staged $(ls "$vendor" | wc -l) crates ($(du -sh "$vendor" | cut -f1)) for the build"

docker build --build-arg BASE="$base" -t "$tag" "$@" .
