#!/usr/bin/env bash
# Decode speed of this build against an older one on the same GPU, in one call: the bundle's
# decode_bench and the baseline's (packed beside it by `gpu_bundle.sh --baseline OLD_BUNDLE`) run
# one after the other, alternating, for each model and setting, --rounds times. A lent GPU
# machine differs from the last one (clocks, HBM, host), so only figures from the same call
# compare; this prints them side by side.
#   scripts/gpu_ab.sh --bundle .gpu/bundle.tar.xz [--models small,3b] [--batches 1,8,32]
#     [--rounds 2] [--steps 48] [--device cuda] [--out DIR] [--variant "NAME: FLAGS"]...
#     [--models-dir DIR] [-- decode_bench flags for all]
# Each line: model, round, which side, then per batch "b<N> <ms/step> (<share of bandwidth>)".
# --variant: one more side, this build's decode_bench with FLAGS (a setting the baseline does not
# know, e.g. --variant "streamed: --gemv_kernel=streamed"); with variants the baseline is
# optional (without one, the sides are this build and its variants). Flags after `--` go to
# every side, so only flags both binaries accept. --models-dir: the models are DIR/<preset>, made
# already (by the caller, and kept); without it they are made under --out and removed after.
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE=""
MODELS=small,3b
BATCHES=1,8,32
ROUNDS=2
STEPS=48
DEVICE=cuda
OUT_DIR=""
MODELS_DIR=""
EXTRA=()
VARIANTS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) BUNDLE=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --batches) BATCHES=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    --out) OUT_DIR=$2; shift 2 ;;
    --models-dir) MODELS_DIR=$2; shift 2 ;;
    --variant) VARIANTS+=("$2"); shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "gpu_ab: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$BUNDLE" ] || { echo "gpu_ab: --bundle FILE is required (made by gpu_bundle.sh --baseline ...)" >&2; exit 2; }
[ -n "$OUT_DIR" ] || OUT_DIR=$(mktemp -d)
mkdir -p "$OUT_DIR"
. scripts/gpu_bundle_unpack.sh
unpack_gpu_bundle "$BUNDLE" || { echo "gpu_ab: cannot unpack $BUNDLE" >&2; exit 1; }
SIDES=()
if [ -x "$BIN/baseline/decode_bench" ]; then
  SIDES+=(baseline)
elif [ ${#VARIANTS[@]} -eq 0 ]; then
  echo "gpu_ab: $BUNDLE has no baseline (pack it with gpu_bundle.sh --baseline OLD_BUNDLE, or name --variant)" >&2
  exit 1
fi
SIDES+=(this)
for v in "${VARIANTS[@]}"; do
  case "$v" in
    *:*) SIDES+=("${v%%:*}") ;;
    *) echo "gpu_ab: --variant wants \"NAME: FLAGS\", got $v" >&2; exit 2 ;;
  esac
done
echo "gpu_ab: this build: $(sed -n 's/^commit //p' "$BUNDLE_ROOT/MANIFEST"); baseline: $(sed -n 's/^baseline //p' "$BUNDLE_ROOT/MANIFEST")"
echo "gpu_ab: sides: ${SIDES[*]}"

# A variant's flags, by its name (word-split: flags hold no spaces).
variant_flags() {
  local v
  for v in "${VARIANTS[@]}"; do
    [ "${v%%:*}" = "$1" ] && { echo "${v#*:}"; return; }
  done
}

# The decode table's rows (`| batch | ms/step | best ms | ... | of bandwidth |`) as one line.
summarise() {
  grep -E '^\| +[0-9]+ \| [0-9.]+ \| ' | awk -F'|' '{gsub(/ /, "", $2); gsub(/ /, "", $3); gsub(/ /, "", $9);
    printf "  b%s %s ms (%s)", $2, $3, $9}'
}

status=0
for model in ${MODELS//,/ }; do
  dir="$OUT_DIR/models/$model"
  [ -n "$MODELS_DIR" ] && dir="$MODELS_DIR/$model"
  if [ -z "$MODELS_DIR" ] && ! "$BIN/iris-make-model" --preset "$model" --out "$dir" >"$OUT_DIR/make_model_$model.log" 2>&1; then
    echo "gpu_ab: iris-make-model --preset $model failed (see $OUT_DIR/make_model_$model.log)" >&2
    status=1
    continue
  fi
  for round in $(seq 1 "$ROUNDS"); do
    for side in "${SIDES[@]}"; do
      bench=$BIN/decode_bench
      [ "$side" = baseline ] && bench=$BIN/baseline/decode_bench
      # shellcheck disable=SC2207
      flags=($(variant_flags "$side"))
      # This build's decode_bench skips its step breakdown (decode's stage runs it; a baseline's has none).
      [ "$side" = baseline ] || flags+=(--step_breakdown=false)
      log="$OUT_DIR/$model.$round.$side.log"
      "$bench" --model "$dir" --device "$DEVICE" --batches "$BATCHES" --steps "$STEPS" --linears=false \
        --kv_compare_contexts= --prompt 0 "${flags[@]}" "${EXTRA[@]}" >"$log" 2>&1 || {
        echo "gpu_ab: $side decode_bench failed on $model (see $log):" >&2
        tail -3 "$log" >&2
        status=1
        continue
      }
      echo "$model round $round $side:$(summarise <"$log")"
    done
  done
  [ -n "$MODELS_DIR" ] || rm -rf "$dir"
done
exit $status
