#!/usr/bin/env bash
# Configures and builds iris (Release) into ${IRIS_BUILD_DIR:-build}. IRIS_CUDA_TARGETS=sm_90a
# (CMake's IRIS_CUDA_TARGETS) builds only the H100/H200 code, for a bundle to carry to a lent GPU:
#   IRIS_BUILD_DIR=build-sm90a IRIS_CUDA_TARGETS=sm_90a bash scripts/build.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${IRIS_BUILD_DIR:-build}
bash scripts/install_deps.sh
# ccache makes a rebuild in a new clone (as CI does) cost seconds, nvcc's ~3 CPU-minutes of CUDA
# objects included: paths under the checkout are hashed relative to it, and the working directory
# not at all (ccache hashes it for nvcc, this Release build has no debug info that would name it),
# so clones at different paths share the cache.
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache \
    ${IRIS_CUDA_TARGETS:+-DIRIS_CUDA_TARGETS=$IRIS_CUDA_TARGETS}
elif [ -n "${IRIS_CUDA_TARGETS:-}" ]; then
  cmake -DIRIS_CUDA_TARGETS="$IRIS_CUDA_TARGETS" "$BUILD_DIR" > /dev/null
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
