#!/usr/bin/env bash
# Fuzzes iris's parsers with libFuzzer under ASan+UBSan (the build of scripts/sanitize.sh).
#
#   bash scripts/fuzz.sh TARGET[,TARGET...] SECONDS   e.g. image_fuzzer 1800
#   bash scripts/fuzz.sh all SECONDS       every target for SECONDS each, two at a time
#
# Targets: tests/fuzz/*_fuzzer.cc (with TARGET.dict, a libFuzzer dictionary, where one helps).
# Seeds come from tests/fuzz/corpus/TARGET (committed); inputs
# that reach new code go to ${IRIS_FUZZ_WORK_DIR:-build-asan/fuzz}/TARGET/corpus (kept between
# runs, not committed; CI keeps it outside the clone so that its runs add up), and a crashing
# input to .../artifacts/. A finding belongs in the seed
# corpus (the corpus ctest then replays it forever) and as a unit test of the code it broke.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${IRIS_ASAN_BUILD_DIR:-build-asan}
WORK_DIR=${IRIS_FUZZ_WORK_DIR:-$BUILD_DIR/fuzz}  # per target: corpus/, artifacts/, last.log
MERGE_ABOVE=${IRIS_FUZZ_MERGE_ABOVE:-4000}  # corpus inputs before a run minimizes it
if [ $# -ne 2 ] || ! [[ "$2" =~ ^[0-9]+$ ]]; then
  echo "usage: scripts/fuzz.sh TARGET[,TARGET...]|all SECONDS" >&2
  exit 2
fi
source scripts/sanitizer_env.sh
ALL=$IRIS_FUZZ_TARGETS
if [ "$1" = all ]; then TARGETS=$ALL; else TARGETS=${1//,/ }; fi
for t in $TARGETS; do
  if ! grep -qx "$t" <<< "$ALL"; then
    echo "fuzz: unknown target '$t' (known: $(echo $ALL))" >&2
    exit 2
  fi
done
SECONDS_EACH=$2
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  bash scripts/sanitize.sh -N > /dev/null  # configures and builds the sanitizer folder
fi
# shellcheck disable=SC2086
cmake --build "$BUILD_DIR" -j "$(nproc)" --target $TARGETS > /dev/null

run_one() {
  local t=$1 work=$WORK_DIR/$1
  mkdir -p "$work/corpus" "$work/artifacts"
  local log=$work/last.log
  local rc=0 dict=()
  if [ -f "tests/fuzz/$t.dict" ]; then dict=(-dict="tests/fuzz/$t.dict"); fi
  # A corpus kept across runs only grows, and replaying it comes out of the fuzzing time: past
  # MERGE_ABOVE inputs it is cut to a subset with the same coverage first (a failed merge, e.g.
  # on a crashing input, keeps the old corpus and the fuzzing run below reports the crash).
  local size
  size=$(find "$work/corpus" -type f | wc -l)
  if [ "$size" -gt "$MERGE_ABOVE" ]; then
    rm -rf "$work/corpus.merged" && mkdir -p "$work/corpus.merged"
    if "$BUILD_DIR/tests/fuzz/$t" -merge=1 -rss_limit_mb=4096 -timeout=30 -artifact_prefix="$work/artifacts/" "$work/corpus.merged" "$work/corpus" \
        > "$work/merge.log" 2>&1; then
      rm -rf "$work/corpus" && mv "$work/corpus.merged" "$work/corpus"
      echo "fuzz: $t corpus merged: $size -> $(find "$work/corpus" -type f | wc -l) inputs"
    else
      rm -rf "$work/corpus.merged"
      echo "fuzz: $t corpus merge failed (log: $work/merge.log); fuzzing the whole corpus"
    fi
  fi
  "$BUILD_DIR/tests/fuzz/$t" "${dict[@]}" -max_total_time="$SECONDS_EACH" -rss_limit_mb=4096 -timeout=30 \
    -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$work/corpus" "tests/fuzz/corpus/$t" \
    > "$log" 2>&1 || rc=$?
  local runs execs
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  execs=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  if [ "$rc" -ne 0 ]; then
    grep -E "ERROR|SUMMARY|property failed|runtime error|Test unit written" "$log" | head -20 >&2
    echo "fuzz: $t FAILED after ${runs:-?} runs (exit code $rc); log: $log" >&2
    return 1
  fi
  echo "fuzz: $t clean: ${runs:-?} runs in ${SECONDS_EACH} s (${execs:-?} exec/s), corpus $(ls "$work/corpus" | wc -l) + $(ls "tests/fuzz/corpus/$t" | wc -l) seeds"
}

# Two at a time (one per core on the 2-core machines this runs on).
pids=()
failed=0
for t in $TARGETS; do
  run_one "$t" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$(nproc)" ]; then
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
exit $failed
