#!/usr/bin/env bash
# Builds the Debian base image the Dockerfile starts from, out of Debian's own packages
# (debootstrap --variant=minbase into a folder, then `docker import`), for machines whose Docker
# engine cannot pull from a registry. Does nothing when the tag already exists.
#
#   scripts/docker/base-image.sh [TAG]     # default p2ptrain/debian:bookworm
#
# Environment: DEBIAN_SUITE (bookworm), DEBIAN_MIRROR (http://deb.debian.org/debian).
# Where a registry is reachable, `docker build --build-arg BASE=debian:bookworm-slim .` skips this.
set -euo pipefail
tag="${1:-p2ptrain/debian:bookworm}"
suite="${DEBIAN_SUITE:-bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "base image $tag exists"
  exit 0
fi

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if ! command -v debootstrap >/dev/null 2>&1; then
  echo "installing: debootstrap"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap
fi

root="$(mktemp -d "${TMPDIR:-/tmp}/p2ptrain-rootfs.XXXXXX")"
trap '$sudo rm -rf "$root"' EXIT
echo "debootstrap $suite from $mirror into $root"
$sudo debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$root.log" 2>&1 || {
  tail -n 30 "$root.log" >&2
  echo "debootstrap failed (full log: $root.log)" >&2
  exit 1
}
rm -f "$root.log"
# What Docker's Debian images carry: apt sources (with updates and security), no caches, no
# daemon starts while packages install.
$sudo tee "$root/etc/apt/sources.list" >/dev/null <<SRC
deb $mirror $suite main
deb $mirror $suite-updates main
deb http://deb.debian.org/debian-security $suite-security main
SRC
printf '#!/bin/sh\nexit 101\n' | $sudo tee "$root/usr/sbin/policy-rc.d" >/dev/null
$sudo chmod +x "$root/usr/sbin/policy-rc.d"
$sudo rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/dev/*
$sudo tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' - "$tag" >/dev/null
echo "base image $tag built from Debian $suite"
