#!/usr/bin/env bash
# The main job on the embedded default: builds iris, makes the synthetic `small` model if it is
# missing (with the Qwen2 tokenizer from tests/data), starts iris-server on loopback, asks about
# the bundled image through the Python client (streamed reply), runs a short throughput and a
# short latency benchmark with iris-bench, prints both reports and stops the server.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${IRIS_BUILD_DIR:-build}
MODEL_DIR=${IRIS_DEMO_MODEL:-$BUILD_DIR/models/small}
TOKENIZER_DIR=tests/data/tiny-qwen2.5-vl
NUM_PROMPTS=${IRIS_DEMO_PROMPTS:-12}
PY=/usr/bin/python3

bash scripts/build.sh
if [ ! -f "$MODEL_DIR/config.json" ]; then
  "$BUILD_DIR/tools/iris-make-model/iris-make-model" --preset small --tokenizer-from "$TOKENIZER_DIR" --out "$MODEL_DIR"
elif [ ! -f "$MODEL_DIR/tokenizer.json" ]; then  # made by an older iris without a tokenizer
  cp "$TOKENIZER_DIR"/tokenizer.json "$TOKENIZER_DIR"/tokenizer_config.json "$TOKENIZER_DIR"/chat_template.json "$MODEL_DIR"/
fi

SERVER_LOG="$BUILD_DIR/demo-server.log"
"$BUILD_DIR/server/iris-server" --model "$MODEL_DIR" --host 127.0.0.1 --port 0 --dtype bf16 2>"$SERVER_LOG" &
SERVER_PID=$!
stop_server() {
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID"
    local rc=0
    wait "$SERVER_PID" || rc=$?
    echo "iris-server stopped (exit code $rc); its log: $SERVER_LOG"
  fi
}
trap stop_server EXIT

PORT=""
for _ in $(seq 1 240); do
  PORT=$(sed -n 's/^iris-server: listening on .*:\([0-9]*\)$/\1/p' "$SERVER_LOG")
  [ -n "$PORT" ] && break
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    cat "$SERVER_LOG" >&2
    echo "demo: iris-server did not start" >&2
    exit 1
  fi
  sleep 0.5
done
[ -n "$PORT" ] || { cat "$SERVER_LOG" >&2; echo "demo: iris-server not ready after 120 s" >&2; exit 1; }
TARGET=127.0.0.1:$PORT
grep '^iris-server: model' "$SERVER_LOG"
echo "iris-server listening on $TARGET"

export PYTHONPATH="$PWD/$BUILD_DIR/python${PYTHONPATH:+:$PYTHONPATH}"
echo
echo "--- python3 -m iris_client (synthetic weights: the words are random, the pipeline is real) ---"
$PY -m iris_client --target "$TARGET" --image assets/sample_1000x667.jpg --max-tokens 24 "What is shown in this image?"

echo
echo "--- iris-bench, throughput mode: $NUM_PROMPTS vision-arena-like requests, at most 4 at once ---"
$PY bench/iris-bench --backend grpc --target "$TARGET" --mode throughput --num-prompts "$NUM_PROMPTS" \
  --max-concurrency 4 --output-len 32 --seed 1
echo
echo "--- iris-bench, latency mode: $NUM_PROMPTS requests arriving at 0.5/s (gamma gaps, burstiness 5) ---"
$PY bench/iris-bench --backend grpc --target "$TARGET" --mode latency --num-prompts "$NUM_PROMPTS" \
  --request-rate 0.5 --burstiness 5 --output-len 32 --seed 2
echo
stop_server
trap - EXIT
