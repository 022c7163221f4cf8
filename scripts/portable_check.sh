#!/usr/bin/env bash
# Proves that the default build (IRIS_MARCH=x86-64-v3) runs on a processor without AVX-512: the
# kernels suites, cpu_features_test and the tiny model's f32 decoder goldens run under QEMU's
# Haswell model (AVX2 + FMA; QEMU 7.2 raises SIGILL on any AVX-512 instruction) with IRIS_CPU_ISA
# unset, so the binaries must find the avx2 tier themselves. bf16 Linear cases run there on the
# f32 matmul (oneDNN has no bf16 matmul below AVX-512). Takes about 13 minutes on 2 shared cores (the
# attention suites and the decoder goldens about 4 each).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${IRIS_BUILD_DIR:-build}

if ! command -v qemu-x86_64 >/dev/null; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends qemu-user
fi
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  IRIS_BUILD_DIR=$BUILD_DIR bash scripts/build.sh
fi
if grep -q '^IRIS_MARCH:STRING=native$' "$BUILD_DIR/CMakeCache.txt"; then
  echo "portable_check: $BUILD_DIR is built with -march=native; use a default build (IRIS_MARCH=x86-64-v3)" >&2
  exit 2
fi
suites=(kernels_attention_test kernels_elementwise_test kernels_linear_test kernels_paged_attention_test
        kernels_qkv_pad_test kernels_rotary_test)
cmake --build "$BUILD_DIR" -j "$(nproc)" --target "${suites[@]}" cpu_features_test decoder_test iris-make-model
ctest --test-dir "$BUILD_DIR" -R '^make_model_tiny$' --output-on-failure >/dev/null  # the tiny model

unset IRIS_CPU_ISA
export OMP_NUM_THREADS=2
# QEMU warns about Haswell features its TCG lacks (invpcid, rtm); iris uses neither.
run() {
  local name=$1
  shift
  local start=$SECONDS
  if ! qemu-x86_64 -cpu Haswell "$@" --gtest_brief=1 2> >(grep -v "TCG doesn't support" >&2); then
    echo "portable_check: FAILED: $name" >&2
    exit 1
  fi
  echo "portable_check: $name passed in $((SECONDS - start)) s"
}
IRIS_EXPECT_CPU_ISA=avx2 run cpu_features_test "$BUILD_DIR/tests/cpu_features_test"
for s in "${suites[@]}"; do run "$s" "$BUILD_DIR/tests/$s"; done
run "decoder goldens (f32)" "$BUILD_DIR/tests/decoder_test" \
  --gtest_filter='DecoderTest.*:*PrefillLayersAndLogitsF32*:*ForcedDecodeThroughPagedCache*:*ChunkedPrefillEqualsOneShot*'
echo "portable_check: all passed on an emulated AVX2 processor in ${SECONDS} s"
