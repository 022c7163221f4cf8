#!/usr/bin/env bash
# The main job on the embedded default: builds iris, makes the synthetic `small` model if it is
# missing (with the Qwen2 tokenizer from tests/data), encodes the bundled sample image, and
# generates a reply about it through the engine (image + question -> streamed text).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${IRIS_BUILD_DIR:-build}
MODEL_DIR=${IRIS_DEMO_MODEL:-$BUILD_DIR/models/small}
TOKENIZER_DIR=tests/data/tiny-qwen2.5-vl
bash scripts/build.sh
if [ ! -f "$MODEL_DIR/config.json" ]; then
  "$BUILD_DIR/tools/iris-make-model/iris-make-model" --preset small --tokenizer-from "$TOKENIZER_DIR" --out "$MODEL_DIR"
elif [ ! -f "$MODEL_DIR/tokenizer.json" ]; then  # made by an older iris without a tokenizer
  cp "$TOKENIZER_DIR"/tokenizer.json "$TOKENIZER_DIR"/tokenizer_config.json "$TOKENIZER_DIR"/chat_template.json "$MODEL_DIR"/
fi
"$BUILD_DIR/tools/iris-encode/iris-encode" --model "$MODEL_DIR" --image assets/sample_1000x667.jpg \
  --dtype bf16 --out "$BUILD_DIR/demo_embeddings.safetensors"
echo "--- iris-generate (synthetic weights: the words are random, the pipeline is real) ---"
"$BUILD_DIR/tools/iris-generate/iris-generate" --model "$MODEL_DIR" --image assets/sample_1000x667.jpg \
  --prompt "What is shown in this image?" --max-tokens 24 --dtype bf16 --stream
