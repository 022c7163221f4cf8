#!/usr/bin/env bash
# Builds iris, makes the 3B vision tower (synthetic weights) if missing, and runs the
# preprocessing, encode-job hand-off and encoder benchmarks. Extra arguments go to encoder_bench.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${IRIS_BUILD_DIR:-build}
MODEL_DIR=${IRIS_BENCH_MODEL:-$BUILD_DIR/models/vision-3b}
bash scripts/build.sh
if [ ! -f "$MODEL_DIR/config.json" ]; then
  "$BUILD_DIR/tools/iris-make-model/iris-make-model" --preset 3b --vision-only --out "$MODEL_DIR"
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
"$BUILD_DIR/bench/preprocess_bench"
"$BUILD_DIR/bench/encode_handoff_bench"
"$BUILD_DIR/bench/encoder_bench" --model "$MODEL_DIR" "$@"
