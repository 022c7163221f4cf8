#!/usr/bin/env bash
# The main job on the embedded default: builds iris, makes the synthetic `small` model if it is
# missing, and encodes the bundled sample image with it, printing a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${IRIS_BUILD_DIR:-build}
MODEL_DIR=${IRIS_DEMO_MODEL:-$BUILD_DIR/models/small}
bash scripts/build.sh
if [ ! -f "$MODEL_DIR/config.json" ]; then
  "$BUILD_DIR/tools/iris-make-model/iris-make-model" --preset small --out "$MODEL_DIR"
fi
"$BUILD_DIR/tools/iris-encode/iris-encode" --model "$MODEL_DIR" --image assets/sample_1000x667.jpg \
  --dtype bf16 --out "$BUILD_DIR/demo_embeddings.safetensors"
