#!/usr/bin/env bash
# Installs the system packages p2ptrain needs to build and run (Debian/Ubuntu): OpenMPI and the
# headers rsmpi's bindings are generated from, the C compiler and make that linking and
# libffi-sys's build need, and cmake and nasm, with which turbojpeg-sys builds libjpeg-turbo and
# its SIMD code. Does nothing when they are present.
set -euo pipefail
need=()
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)
[ -e /usr/include/x86_64-linux-gnu/openmpi/mpi.h ] || [ -e /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ] \
  || pkg-config --exists ompi 2>/dev/null || need+=(libopenmpi-dev)
# bindgen needs libclang itself (libclang.so / libclang-N.so), not libclang-cpp.
compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null || compgen -G '/usr/lib/llvm-*/lib/libclang-[0-9]*.so*' >/dev/null \
  || need+=(libclang-dev)
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v make >/dev/null 2>&1 || need+=(make)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v nasm >/dev/null 2>&1 || need+=(nasm)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v pgrep >/dev/null 2>&1 || need+=(procps)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing: ${need[*]}"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
