#!/usr/bin/env bash
# The GPU work that waits for a lent machine, in priority order, in one call that ends within
# --deadline seconds (default 540: one device call may run 600, and a session's device time,
# about 900 s, includes the machine's start). From a bundle made by scripts/gpu_bundle.sh:
#   scripts/gpu_session.sh --bundle .gpu/bundle.tar.xz [--deadline 540] [--out DIR] [--from STAGE]
#       [--only A,B] [--no-detail]
# Stages in this order, each bounded by the time left (one that cannot have its minimum is skipped
# and named):
#   hopper     iris's own Hopper GEMM alone, first, as it has never run on a GPU: its primitives'
#              probes (the copy engine's box, one warpgroup MMA), the GEMM against the double
#              reference, the Linear's paths against cuBLASLt (cuda_linear_test's CudaHopperGemm.*,
#              each test in its own process, at most 60 s: a broken hand-off traps within seconds
#              and the log names the test); the encoder stage then times it
#   tests      every GPU test suite (gpu_check.sh, each suite bounded)
#   decode     decode_bench on the 3b at batches 1, 8, 32, 64, with its same-run tables (graphs,
#              decode attention on the CUDA cores against the tensor cores, the decode rotary in the
#              attention and in the qkv GEMV each against its own launch, the lean paged attention
#              against the default kernel, the prompt step both ways, each op's cost inside the graph-replayed step at batches 1 and 8, each Linear
#              alone)
#   encoder    encoder_bench on the 3b vision tower: the switch table (the three techniques, bf16
#              hand-offs, the pipelined flash kernel, matmul tuning, the Hopper GEMM fused into the
#              gated MLP and everywhere), the tower's matmuls on cuBLASLt against the Hopper GEMM, and
#              the tuned matmuls' table
#   transformers  transformers' Qwen2.5-VL vision tower (sdpa) on the same 3b weights and inputs
#              (bench/hf_vision_tower.py), for the same-run ratio against the encoder stage
#   sampling   sampler_bench --device cuda: a step's sampled rows (1, 8, 64 of 152k logits) brought
#              back and picked on the host vs drawn on the GPU (kernels::SampleRows), same tokens
#   decode_ab  the 3b step at batches 1 and 4 with each candidate as a variant, side by side with
#              the defaults, alternating (gpu_ab.sh): the CUDA-core paged attention's key splits
#              capped at 2 (the default cap, 4, gives 4 splits at batch 1 and 2 at batch 4; 16, 8
#              splits at batch 1, was slower in an earlier run); every GEMV pipelined (each lane's
#              next weight pass in flight while it multiplies: GemvKernel::kCudaCoresPipelined; at
#              batch 4 the variant also puts gate_up and down on the GEMV, so read batch 1); the
#              rotary and KV write as the qkv GEMV's epilogue (--decode_rotary=gemv: one launch a
#              layer fewer), alone and with the pipelined GEMV. The streamed GEMV, the plain GEMV
#              everywhere, the L2 weight prefetch and the fused decode rotary were timed by earlier
#              runs (README) and are not repeated.
#   profile    where the GPU time of a 448x448 x8 encoder forward and of a 3b batch-1 decode step
#              goes (every kernel, Nsight Compute), then why the two attention kernels iris owns
#              take theirs (its sections): the encoder's flash kernel, the decode rows' paged
#              attention
#   sanitize   compute-sanitizer memcheck and racecheck over the kernel suites
# --from STAGE starts at that stage (a second call, after a first ran out of time); --only A,B runs
# just those stages, in the order above; --no-detail keeps profile to the per-kernel sums. Logs go to
# --out (default a temporary folder); where $OUT is set (the device tool's folder that comes
# back, at most 8 files), they are also packed into one $OUT/gpu_session_logs.tar.xz.
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE=""
DEADLINE=540
OUT_DIR=""
FROM=hopper
ONLY=""
PROFILE_DETAIL=1
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) BUNDLE=$2; shift 2 ;;
    --deadline) DEADLINE=$2; shift 2 ;;
    --out) OUT_DIR=$2; shift 2 ;;
    --from) FROM=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --no-detail) PROFILE_DETAIL=0; shift ;;
    -h|--help) sed -n '2,/^set -uo/{/^set -uo/!p}' "$0"; exit 0 ;;
    *) echo "gpu_session: unknown argument $1" >&2; exit 2 ;;
  esac
done
STAGES=(hopper tests decode encoder transformers sampling decode_ab profile sanitize)
[[ " ${STAGES[*]} " == *" $FROM "* ]] || { echo "gpu_session: --from must be one of ${STAGES[*]}" >&2; exit 2; }
for s in ${ONLY//,/ }; do
  [[ " ${STAGES[*]} " == *" $s "* ]] || { echo "gpu_session: --only takes stages of ${STAGES[*]}, not $s" >&2; exit 2; }
done
[ -n "$BUNDLE" ] || { echo "gpu_session: --bundle FILE is required (scripts/gpu_bundle.sh makes it)" >&2; exit 2; }
[ -n "$OUT_DIR" ] || OUT_DIR=$(mktemp -d)
mkdir -p "$OUT_DIR"
END=$((SECONDS + DEADLINE))
left() { echo $((END - SECONDS)); }

. scripts/gpu_bundle_unpack.sh
unpack_gpu_bundle "$BUNDLE" || { echo "gpu_session: cannot unpack $BUNDLE" >&2; exit 1; }
echo "gpu_session: bundle $(sed -n 's/^commit //p' "$BUNDLE_ROOT/MANIFEST"); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
MODELS=$(mktemp -d)
trap 'rm -rf "$BUNDLE_ROOT" "$MODELS"' EXIT

SKIPPED=()
FAILED=()
started=0
# run_stage NAME MIN_SECONDS COMMAND...: COMMAND bounded by the time left, if MIN_SECONDS are.
run_stage() {
  local name=$1 min=$2
  shift 2
  [ "$name" = "$FROM" ] && started=1
  [ "$started" = 1 ] || return 0
  [ -z "$ONLY" ] || [[ ",$ONLY," == *",$name,"* ]] || return 0
  if [ "$(left)" -lt "$min" ]; then
    SKIPPED+=("$name")
    return 0
  fi
  echo "gpu_session: === $name ($(left) s left)"
  local t0=$SECONDS
  timeout "$(left)" bash -c '"$@"' "$name" "$@" 2>&1 | tee "$OUT_DIR/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "gpu_session: $name took $((SECONDS - t0)) s, rc $rc"
  [ "$rc" -eq 0 ] || FAILED+=("$name")
}
# The stages below run under `timeout` in a child bash: it sees these.
export BIN BUNDLE MODELS OUT_DIR LD_LIBRARY_PATH PROFILE_DETAIL
# make_model PRESET [FLAGS]: once, under $MODELS/PRESET.
make_model() {
  [ -d "$MODELS/$1" ] && return 0
  "$BIN/iris-make-model" --preset "$@" --out "$MODELS/$1" >"$OUT_DIR/make_model_$1.log" 2>&1
}
decode() {
  make_model 3b || return 1
  "$BIN/decode_bench" --model "$MODELS/3b" --device cuda --batches 1,8,32,64 --context 512 --steps 24 \
    --kv_compare_contexts=
}
hopper() {
  # Each test in its own process, at most 60 s: a broken hand-off traps (the kernel's barrier wait
  # gives up), which ends its process — the other tests still run, and the log names the one.
  local rc=0 t
  for t in $("$BIN/cuda_linear_test" --gtest_list_tests --gtest_filter='CudaHopperGemm.*' |
             awk '/^[^ ]/ {suite = $1} /^  / {print suite $1}'); do
    timeout 60 "$BIN/cuda_linear_test" --gtest_filter="$t" || { echo "hopper: $t failed (exit $?)"; rc=1; }
  done
  return $rc
}
sampling() {
  # A bundle made --without sampler_bench (to fit the device tool's limit) skips this stage.
  [ -x "$BIN/sampler_bench" ] || { echo "sampler_bench is not in the bundle: sampling skipped"; return 0; }
  "$BIN/sampler_bench" --device cuda --rows 10 --batch 64 --draw_batches 1,8,64
}
decode_ab() {
  make_model 3b || return 1
  bash scripts/gpu_ab.sh --bundle "$BUNDLE" --models 3b --models-dir "$MODELS" --batches 1,4 --rounds 2 \
    --out "$OUT_DIR/decode_ab" --variant "splits2: --paged_attention_max_splits=2" \
    --variant "gemv_pipelined: --gemv_kernel=pipelined" \
    --variant "rotary_gemv: --decode_rotary=gemv" \
    --variant "rotary_gemv_pipelined: --decode_rotary=gemv --gemv_kernel=pipelined"
}
encoder() {
  make_model 3b || return 1
  "$BIN/encoder_bench" --model "$MODELS/3b" --device cuda --min_seconds 1 --rounds 2 --slice_gflop=
}
transformers() {
  make_model 3b || return 1
  python3 -c 'import torch, transformers; assert torch.cuda.is_available()' || return 1
  python3 bench/hf_vision_tower.py --model "$MODELS/3b" --min-seconds 1
}
profile() {
  make_model 3b || return 1
  local rc=0
  # Where each forward's and step's GPU time goes (every kernel summed), then why the two
  # attention kernels take theirs.
  bash scripts/gpu_profile_encoder.sh --bundle "$BUNDLE" --model "$MODELS/3b" --out "$OUT_DIR/profile_encoder_sum" || rc=1
  bash scripts/gpu_profile_decode.sh --bundle "$BUNDLE" --model "$MODELS/3b" --preset 3b --batch 1 \
    --out "$OUT_DIR/profile_decode_sum" || rc=1
  [ "$PROFILE_DETAIL" = 1 ] || return $rc
  bash scripts/gpu_profile_encoder.sh --bundle "$BUNDLE" --model "$MODELS/3b" --out "$OUT_DIR/profile_encoder" \
    --detail FlashVarlenMma || rc=1
  bash scripts/gpu_profile_decode.sh --bundle "$BUNDLE" --model "$MODELS/3b" --preset 3b --batch 1 \
    --out "$OUT_DIR/profile_decode" --detail PagedAttentionKernel || rc=1
  return $rc
}
export -f make_model hopper decode sampling decode_ab encoder transformers profile

run_stage hopper 60 hopper
run_stage tests 120 env TEST_TIMEOUT_S=150 bash scripts/gpu_check.sh --bundle "$BUNDLE" --out "$OUT_DIR/check"
run_stage decode 90 decode
run_stage encoder 90 encoder
run_stage transformers 60 transformers
run_stage sampling 30 sampling
run_stage decode_ab 120 decode_ab
run_stage profile 90 profile
run_stage sanitize 60 env SANITIZE_TIMEOUT_S=90 bash scripts/gpu_check.sh --bundle "$BUNDLE" --no-tests --sanitize \
  --out "$OUT_DIR/sanitize"

if [ -n "${OUT:-}" ] && [ "$OUT_DIR" != "$OUT" ]; then
  # Text only, each file under 4 MB: what comes back is bounded.
  (cd "$OUT_DIR" && find . -type f \( -name '*.log' -o -name '*.txt' -o -name '*.xml' \) -size -4M -print0 |
    tar --null -T - -cJf "$OUT/gpu_session_logs.tar.xz") && echo "gpu_session: logs packed into \$OUT/gpu_session_logs.tar.xz"
fi
[ ${#SKIPPED[@]} -eq 0 ] || echo "gpu_session: out of time before: ${SKIPPED[*]} (go on with --from ${SKIPPED[0]})"
[ ${#FAILED[@]} -eq 0 ] || { echo "gpu_session: FAILED: ${FAILED[*]}"; exit 1; }
echo "gpu_session: done; logs in $OUT_DIR"
