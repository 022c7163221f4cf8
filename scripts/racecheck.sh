#!/usr/bin/env bash
# ThreadSanitizer over iris's own CUDA kernels, without a GPU: the SIMT suites (tests/simt_*,
# ctest label "simt"), whose harness (kernels/cuda/simt.h) runs each CUDA thread of a block on a
# thread of its own, with __syncthreads, __syncwarp, the shuffles and the mma/ldmatrix twins as
# barriers. Two threads of a block touching one address (__shared__ or global) with no barrier
# between — what compute-sanitizer's racecheck reports for shared memory, on a GPU — is then a
# data race ThreadSanitizer reports, and the test fails. Blocks run one after another here, so
# races between blocks are not seen (on a GPU those go through fences and atomics).
# clang 14, -O1, its own build folder ${IRIS_TSAN_BUILD_DIR:-build-tsan}, only these targets.
# Extra arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${IRIS_TSAN_BUILD_DIR:-build-tsan}
bash scripts/install_deps.sh --ci
source scripts/sanitizer_env.sh
configure_clang_build "$BUILD_DIR" -DIRIS_TSAN=ON
# shellcheck disable=SC2086  # a word list
cmake --build "$BUILD_DIR" -j "$(nproc)" --target $IRIS_SIMT_SUITES
# halt_on_error: the first race fails its test, with both stacks (history_size: the longer
# suites' earlier access is still in the history). ignore_noninstrumented_modules: the CPU
# reference kernels' oneDNN runs on OpenMP, which is not instrumented.
export TSAN_OPTIONS="halt_on_error=1 history_size=4 second_deadlock_stack=1 ignore_noninstrumented_modules=1"
ctest --test-dir "$BUILD_DIR" --output-on-failure -L simt -j "$(nproc)" "$@"
