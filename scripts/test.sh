#!/usr/bin/env bash
# The test command: installs dependencies, builds, and runs every test (ctest).
# GPU tests (label gpu) are skipped on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${IRIS_BUILD_DIR:-build}
bash scripts/build.sh
# Say whether this build compiled the CUDA backend (CI has the toolkit but no GPU: a CUDA compile
# error fails the build above; the kernels' device code then runs on the SIMT harness below).
if grep -q '^IRIS_HAVE_CUDA_BUILT:INTERNAL=1' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null; then
  echo "test: CUDA backend compiled: $(cd "$BUILD_DIR" && find kernels -name '*.cu.o' | sort | tr '\n' ' ')"
else
  echo "test: CUDA backend not built (no CUDA toolkit, or IRIS_CUDA=OFF)"
fi
LABEL_ARGS=()
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi >/dev/null 2>&1; then
  LABEL_ARGS=(-LE gpu)
fi
ctest --test-dir "$BUILD_DIR" --output-on-failure "${LABEL_ARGS[@]}" "$@"
