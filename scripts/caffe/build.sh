#!/usr/bin/env bash
# Build BVLC Caffe (CPU only) at commit 9b891540183ddc834a02b2bd81b31afae71b2153
# (final master, 2020-02-13) on Debian 12 (bookworm), as a reference tool.
#
# Usage (as root):  SRC_TARBALL=caffe-9b891540.tar.gz scripts/caffe/build.sh
#
# Used to check p2ptrain's `export --format caffe` with Caffe itself (not part of the tests).
# Source: SRC_TARBALL, or caffe-9b891540-src.tar.gz next to this script: the files of BVLC/caffe at
# 9b891540 that the Makefile build compiles (Makefile, Makefile.config.example, LICENSE,
# README.md, include/, src/, tools/, examples/**/*.cpp), made with
#   git archive --format=tar --prefix=caffe-9b891540183ddc834a02b2bd81b31afae71b2153/ \
#     9b891540183ddc834a02b2bd81b31afae71b2153 Makefile Makefile.config.example LICENSE README.md \
#     include src tools ':(glob)examples/**/*.cpp' | gzip -9n > caffe-9b891540-src.tar.gz
# (`zcat caffe-9b891540-src.tar.gz | git get-tar-commit-id` prints the commit; sha256 in SHA256SUMS).
# The full tree works too: SRC_TARBALL=/path/to/caffe-9b891540.tar.gz, e.g. from
#   https://github.com/BVLC/caffe/archive/9b891540183ddc834a02b2bd81b31afae71b2153.tar.gz
# The PyPI sdist brocolli-caffe==9.0.2 is NOT this tree, although its summary says so; see PATCHES.md.
#
# Environment knobs: SRC_TARBALL, CAFFE_DIR (default /opt/caffe), JOBS (default 2), SKIP_APT=1.
# Results: $CAFFE_DIR/build/tools/{caffe,convert_imageset,compute_image_mean}
#          $CAFFE_DIR/build/examples/mnist/convert_mnist_data.bin
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC_TARBALL=${SRC_TARBALL:-$HERE/caffe-9b891540-src.tar.gz}
CAFFE_DIR=${CAFFE_DIR:-/opt/caffe}
JOBS=${JOBS:-2}
SKIP_APT=${SKIP_APT:-0}

log() { echo "[build.sh $(date -u +%H:%M:%S)] $*"; }

# 1. Build dependencies, all from Debian 12.
if [ "$SKIP_APT" != 1 ]; then
  log "apt-get install"
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    build-essential ca-certificates \
    libprotobuf-dev protobuf-compiler libgoogle-glog-dev libgflags-dev \
    libhdf5-dev liblmdb-dev libleveldb-dev libsnappy-dev libopencv-dev \
    libboost-system-dev libboost-thread-dev libboost-filesystem-dev \
    libopenblas-dev
fi

# 2. Unpack (fresh tree every time).
[ -f "$SRC_TARBALL" ] || { echo "missing $SRC_TARBALL (see header)" >&2; exit 2; }
if [ "$SRC_TARBALL" -ef "$HERE/caffe-9b891540-src.tar.gz" ]; then
  (cd "$HERE" && sha256sum -c SHA256SUMS)
fi
log "unpack $SRC_TARBALL -> $CAFFE_DIR"
rm -rf "$CAFFE_DIR"
mkdir -p "$CAFFE_DIR"
tar xzf "$SRC_TARBALL" -C "$CAFFE_DIR" --strip-components=1
cd "$CAFFE_DIR"
# Guard against a wrong tree (e.g. the brocolli-caffe sdist): these exist only in BVLC master.
for f in include/caffe/layers/clip_layer.hpp examples/mnist/convert_mnist_data.cpp; do
  [ -f "$f" ] || { echo "$f missing: $SRC_TARBALL is not BVLC caffe 9b891540" >&2; exit 2; }
done

# 3. Source patches (each one is explained in PATCHES.md).
log "patch"
# P1: OpenCV 4 dropped the C constants CV_LOAD_IMAGE_*.
sed -i -e 's/CV_LOAD_IMAGE_COLOR/cv::IMREAD_COLOR/g' \
       -e 's/CV_LOAD_IMAGE_GRAYSCALE/cv::IMREAD_GRAYSCALE/g' \
    src/caffe/util/io.cpp src/caffe/layers/window_data_layer.cpp src/caffe/test/test_io.cpp
# P2: window_data_layer.cpp calls cv::imread but includes only highgui_c.h.
sed -i 's|#include <opencv2/highgui/highgui_c.h>|#include <opencv2/highgui/highgui_c.h>\n#include <opencv2/imgcodecs.hpp>|' \
    src/caffe/layers/window_data_layer.cpp
# P3: protobuf 3.21 has only the one-argument CodedInputStream::SetTotalBytesLimit.
sed -i 's/SetTotalBytesLimit(kProtoReadBytesLimit, 536870912)/SetTotalBytesLimit(kProtoReadBytesLimit)/' \
    src/caffe/util/io.cpp
# Each patch must have applied.
if grep -n 'CV_LOAD_IMAGE' src/caffe/util/io.cpp src/caffe/layers/window_data_layer.cpp; then exit 1; fi
[ "$(grep -c 'cv::IMREAD_' src/caffe/util/io.cpp)" = 4 ]
grep -q 'cv::imread(image.first, cv::IMREAD_COLOR)' src/caffe/layers/window_data_layer.cpp
grep -q '^#include <opencv2/imgcodecs.hpp>' src/caffe/layers/window_data_layer.cpp
grep -q 'SetTotalBytesLimit(kProtoReadBytesLimit);' src/caffe/util/io.cpp

# 4. Makefile.config from the example.
log "Makefile.config"
sed -e 's/^# CPU_ONLY := 1/CPU_ONLY := 1/' \
    -e 's/^# OPENCV_VERSION := 3/OPENCV_VERSION := 3/' \
    -e 's/^BLAS := atlas/BLAS := open/' \
    -e 's|^INCLUDE_DIRS := $(PYTHON_INCLUDE) /usr/local/include$|INCLUDE_DIRS := $(PYTHON_INCLUDE) /usr/local/include /usr/include/hdf5/serial /usr/include/opencv4|' \
    -e 's|^LIBRARY_DIRS := $(PYTHON_LIB) /usr/local/lib /usr/lib$|LIBRARY_DIRS := $(PYTHON_LIB) /usr/local/lib /usr/lib /usr/lib/x86_64-linux-gnu/hdf5/serial|' \
    Makefile.config.example > Makefile.config
echo 'CXXFLAGS += -std=c++14' >> Makefile.config
grep -q '^CPU_ONLY := 1' Makefile.config
grep -q '^BLAS := open' Makefile.config
grep -q 'hdf5/serial /usr/include/opencv4' Makefile.config
grep -q 'x86_64-linux-gnu/hdf5/serial' Makefile.config

# 5. Build libcaffe, tools and examples (no pycaffe, no tests).
log "make -j$JOBS all"
make -j"$JOBS" all
for t in build/tools/caffe build/tools/convert_imageset build/tools/compute_image_mean \
         build/examples/mnist/convert_mnist_data.bin; do
  [ -x "$t" ] || { echo "missing $t" >&2; exit 1; }
done
build/tools/caffe --version 2>&1 | head -1 || true
log "done"
