#!/usr/bin/env bash
# The test command: installs dependencies, builds, and runs every test (ctest).
# GPU tests (label gpu) are skipped on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${IRIS_BUILD_DIR:-build}
bash scripts/build.sh
LABEL_ARGS=()
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi >/dev/null 2>&1; then
  LABEL_ARGS=(-LE gpu)
fi
ctest --test-dir "$BUILD_DIR" --output-on-failure "${LABEL_ARGS[@]}" "$@"
