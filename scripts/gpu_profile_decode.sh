#!/usr/bin/env bash
# Where a GPU decode step's time goes: Nsight Compute times every kernel of a short decode_bench
# run (GPU time per launch, the kernels serialised), and the last decode step's launches are
# printed in order with their durations, then summed by kernel. Compare the sum with the step's
# wall time from decode_bench: the difference is host time (launch overhead, synchronisation).
# The clocks and caches are left as a run has them (METHOD: ncu's defaults lock base clocks and
# flush the caches before each kernel: the first H200 profile, with them, summed 5.4 ms of kernels
# for a 3b batch-1 step that runs in 4.05 ms).
#   scripts/gpu_profile_decode.sh --bundle .gpu/bundle.tar.xz [--preset small|3b] [--batch 1] [--context 512] [--out DIR]
#     [--model DIR] [--detail REGEX [--detail-skip N] [--detail-count M]] [-- decode_bench flags, e.g. --fold_inputs=false]
# --model: a model folder made already (of --preset's shapes) instead of making one.
# --detail: instead, why the kernels whose names match REGEX take their time (scripts/ncu_detail.sh)
# for M of their launches after the first N (default 80 and 2: with the 3b's 36 layers, a launch a
# layer and 2 warm-up steps first, layer 8 of the first timed step).
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE=""
PRESET=small
MODEL=""
BATCH=1
CONTEXT=512
OUT_DIR=$(mktemp -d)
DETAIL=""
DETAIL_SKIP=80
DETAIL_COUNT=2
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) BUNDLE=$2; shift 2 ;;
    --preset) PRESET=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --context) CONTEXT=$2; shift 2 ;;
    --out) OUT_DIR=$2; shift 2 ;;
    --detail) DETAIL=$2; shift 2 ;;
    --detail-skip) DETAIL_SKIP=$2; shift 2 ;;
    --detail-count) DETAIL_COUNT=$2; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "gpu_profile_decode: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT_DIR"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "gpu_profile_decode: ncu not found" >&2; exit 1; }
if [ -n "$BUNDLE" ]; then
  . scripts/gpu_bundle_unpack.sh
  unpack_gpu_bundle "$BUNDLE" || exit 1
else
  BIN=build/bench
  [ -x "$BIN/decode_bench" ] || BIN=build
fi
if [ -z "$MODEL" ]; then
  MODEL=$OUT_DIR/$PRESET
  MAKE_MODEL=$(ls "$BIN/iris-make-model" build/tools/iris-make-model/iris-make-model 2>/dev/null | head -1)
  "$MAKE_MODEL" --preset "$PRESET" --out "$MODEL" >"$OUT_DIR/make_model.log" 2>&1 || { echo "iris-make-model failed" >&2; exit 1; }
fi
# 2 warm-up + 2 timed steps, issued op by op (no graphs: each launch is then its own record);
# nothing else timed.
if [ -n "$DETAIL" ]; then
  . scripts/ncu_detail.sh
  ncu_detail "$NCU" "$OUT_DIR/ncu_detail.txt" "$DETAIL" "$DETAIL_SKIP" "$DETAIL_COUNT" \
    "$BIN/decode_bench" --model "$MODEL" --device cuda --batches "$BATCH" --context "$CONTEXT" --steps 2 \
    --graphs=false --linears=false --kv_compare_contexts= --prompt 0 "${EXTRA[@]}" >"$OUT_DIR/decode_bench.log" 2>&1 \
    || { tail -20 "$OUT_DIR/decode_bench.log"; exit 1; }
  cat "$OUT_DIR/ncu_detail.txt"
  exit 0
fi
"$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --log-file "$OUT_DIR/ncu.csv" \
  "$BIN/decode_bench" --model "$MODEL" --device cuda --batches "$BATCH" --context "$CONTEXT" --steps 2 \
  --graphs=false --linears=false --kv_compare_contexts= --prompt 16 --prompt_repeats 1 "${EXTRA[@]}" >"$OUT_DIR/decode_bench.log" 2>&1 \
  || { tail -20 "$OUT_DIR/decode_bench.log"; exit 1; }
python3 - "$OUT_DIR/ncu.csv" <<'EOF'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 5]
head = rows[0]
name_i, value_i, unit_i = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
launches = []
for r in rows[1:]:
    us = float(r[value_i].replace(",", "")) / (1000.0 if r[unit_i] in ("nsecond", "ns") else 1.0)
    if r[unit_i] in ("msecond", "ms"):
        us = float(r[value_i].replace(",", "")) * 1000.0
    launches.append((r[name_i].split("(")[0][:120], us))
# The last decode step: from the last embedding lookup to the end (the step starts with it).
start = max(i for i, (n, _) in enumerate(launches) if "Embedding" in n)
# (The bandwidth probe's ReadSumKernel runs after the steps: not part of one.)
step = [l for l in launches[start:] if "ReadSum" not in l[0]]
print(f"last decode step: {len(step)} kernels, {sum(u for _, u in step):.1f} us of GPU time")
print("its first 30 launches, in order (the embedding, then the first layer):")
for n, u in step[:30]:
    print(f"  {u:8.2f} us  {n}")
by = collections.OrderedDict()
for n, u in step:
    c, t = by.get(n, (0, 0.0))
    by[n] = (c + 1, t + u)
print("| kernel | launches | us total | us each |\n| --- | ---: | ---: | ---: |")
for n, (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1]):
    print(f"| {n} | {c} | {t:.1f} | {t / c:.2f} |")
EOF
grep -E '^\| +[0-9]+ \|' "$OUT_DIR/decode_bench.log" | head -3
