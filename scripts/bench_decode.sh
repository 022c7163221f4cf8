#!/usr/bin/env bash
# Builds iris, makes the small and 3b models (synthetic weights) if missing, and runs the decoder
# benchmark on both. Extra arguments go to decode_bench (e.g. --batches 1,4 --context 1024).
# The 3b model takes ~15 s and 7.5 GB of disk.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${IRIS_BUILD_DIR:-build}
bash scripts/build.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
for preset in small 3b; do
  MODEL_DIR=$BUILD_DIR/models/$preset
  if [ ! -f "$MODEL_DIR/config.json" ]; then
    "$BUILD_DIR/tools/iris-make-model/iris-make-model" --preset "$preset" --out "$MODEL_DIR"
  fi
  echo "== decode_bench: $preset =="
  "$BUILD_DIR/bench/decode_bench" --model "$MODEL_DIR" "$@"
  echo
done
