#!/usr/bin/env bash
# Where a GPU encoder forward's time goes: Nsight Compute times every kernel of two forwards of one
# input (encoder_bench --profile_input: a warm-up and one more, nothing else), and the second
# forward's launches are summed by kernel, with its first launches in order. The clocks and
# caches are left as a run has them (see gpu_profile_decode.sh).
#   scripts/gpu_profile_encoder.sh --bundle .gpu/bundle.tar.xz [--input "448x448 x8"] [--dtype bf16] [--out DIR]
#     [--model DIR] [--detail REGEX [--detail-skip N] [--detail-count M]]
# --model: a model folder with the 3b's vision tower made already (vision-only or whole) instead of
# making one.
# --detail: instead, why the kernels whose names match REGEX take their time: Nsight Compute's
# sections (speed of light, occupancy, launch, warp stalls, scheduler, compute and memory
# workloads) for M of their launches after the first N (default 39 and 2: with 32 layers a
# forward and one launch a layer, the second forward's layers 7 and 8, a full-attention layer and
# a windowed one).
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE=""
INPUT="448x448 x8"
DTYPE=bf16
OUT_DIR=$(mktemp -d)
DETAIL=""
MODEL=""
DETAIL_SKIP=39
DETAIL_COUNT=2
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) BUNDLE=$2; shift 2 ;;
    --input) INPUT=$2; shift 2 ;;
    --dtype) DTYPE=$2; shift 2 ;;
    --out) OUT_DIR=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --detail) DETAIL=$2; shift 2 ;;
    --detail-skip) DETAIL_SKIP=$2; shift 2 ;;
    --detail-count) DETAIL_COUNT=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "gpu_profile_encoder: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT_DIR"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "gpu_profile_encoder: ncu not found" >&2; exit 1; }
if [ -n "$BUNDLE" ]; then
  . scripts/gpu_bundle_unpack.sh
  unpack_gpu_bundle "$BUNDLE" || exit 1
else
  BIN=build/bench
fi
if [ -z "$MODEL" ]; then
  MODEL=$OUT_DIR/vision-3b
  MAKE_MODEL=$(ls "$BIN/iris-make-model" build/tools/iris-make-model/iris-make-model 2>/dev/null | head -1)
  "$MAKE_MODEL" --preset 3b --vision-only --out "$MODEL" >"$OUT_DIR/make_model.log" 2>&1 \
    || { echo "iris-make-model failed" >&2; exit 1; }
fi
if [ -n "$DETAIL" ]; then
  . scripts/ncu_detail.sh
  ncu_detail "$NCU" "$OUT_DIR/ncu_detail.txt" "$DETAIL" "$DETAIL_SKIP" "$DETAIL_COUNT" "$BIN/encoder_bench" --model "$MODEL" --device cuda --dtype "$DTYPE" --profile_input "$INPUT" \
    >"$OUT_DIR/encoder_bench.log" 2>&1 || { tail -20 "$OUT_DIR/encoder_bench.log"; exit 1; }
  cat "$OUT_DIR/ncu_detail.txt"
  exit 0
fi
"$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --log-file "$OUT_DIR/ncu.csv" \
  "$BIN/encoder_bench" --model "$MODEL" --device cuda --dtype "$DTYPE" --profile_input "$INPUT" \
  >"$OUT_DIR/encoder_bench.log" 2>&1 || { tail -20 "$OUT_DIR/encoder_bench.log"; exit 1; }
python3 - "$OUT_DIR/ncu.csv" "$INPUT" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 5]
head = rows[0]
name_i, value_i, unit_i = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
launches = [(r[name_i].split("(")[0][:100], float(r[value_i].replace(",", "")) * scale.get(r[unit_i], 1.0))
            for r in rows[1:]]
# Two forwards with the same launches: the second half is the warm one.
fwd = launches[len(launches) // 2:]
total = sum(u for _, u in fwd)
print(f"encoder forward of {sys.argv[2]}: {len(fwd)} kernels, {total:.1f} us of GPU time (launches {len(launches)})")
print("its first 24 launches, in order:")
for n, u in fwd[:24]:
    print(f"  {u:9.2f} us  {n}")
by = collections.OrderedDict()
for n, u in fwd:
    c, t = by.get(n, (0, 0.0))
    by[n] = (c + 1, t + u)
print("| kernel | launches | us total | share | us each |\n| --- | ---: | ---: | ---: | ---: |")
for n, (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1]):
    print(f"| {n} | {c} | {t:.1f} | {100 * t / total:.0f}% | {t / c:.2f} |")
PY
