#!/usr/bin/env bash
# ASan+UBSan (clang) build of the suites that touch untrusted input and lifetimes, and the fuzz
# targets, in their own folder ${IRIS_ASAN_BUILD_DIR:-build-asan}; runs them with leak detection on:
# the GoogleTest suites labelled "sanitize" (image decode, preprocess, safetensors, configs,
# tokenizer, detokenizer, chat format, prompt build, request conversion, KV cache, engine incl.
# its cancel paths), the server's end-to-end tests against an ASan iris-server, and every fuzz
# target over its corpus (past findings included). And the SIMT suites (label "simt": iris's own
# CUDA kernels on the host harness), whose global buffers are host vectors and whose __shared__
# arrays are static objects here: a kernel reading or writing outside them is reported —
# compute-sanitizer's memcheck, without a GPU (scripts/racecheck.sh is its racecheck). Extra
# arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${IRIS_ASAN_BUILD_DIR:-build-asan}
bash scripts/install_deps.sh --ci
source scripts/sanitizer_env.sh
configure_clang_build "$BUILD_DIR" -DIRIS_ASAN=ON -DIRIS_FUZZ=ON
suites=$(sed -n '/^set(IRIS_SANITIZE_SUITES/,/)/p' tests/CMakeLists.txt | tr -d '()' | sed 's/set\|IRIS_SANITIZE_SUITES//g')
# shellcheck disable=SC2086  # word lists
cmake --build "$BUILD_DIR" -j "$(nproc)" --target $suites $IRIS_SIMT_SUITES $IRIS_FUZZ_TARGETS iris-make-model iris-server \
  iris-generate iris-tokenize iris_python python_client_test_protos
ctest --test-dir "$BUILD_DIR" --output-on-failure -L 'sanitize|simt' -j "$(nproc)" "$@"
