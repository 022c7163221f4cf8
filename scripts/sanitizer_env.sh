# shellcheck shell=bash
# Sourced by scripts/sanitize.sh, scripts/fuzz.sh and scripts/racecheck.sh: the one set of
# sanitizer options they run with, the list of fuzz targets (tests/fuzz/<name>.cc), and the
# configuration of their clang build folders.
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$PWD/tests/sanitizer/lsan.supp:print_suppressions=0
IRIS_FUZZ_TARGETS=$(cd tests/fuzz && ls ./*_fuzzer.cc | sed 's|./\(.*\)\.cc|\1|')
# The SIMT suites (tests/simt_*_test.cc, ctest label simt): iris's CUDA kernels on the host harness.
IRIS_SIMT_SUITES=$(cd tests && ls ./simt_*_test.cc | sed 's|./\(.*\)\.cc|\1|')

# configure_clang_build DIR CMAKE_ARGS...: configures DIR (once) as the sanitizer builds are
# configured — clang 14, -O1 with line tables (readable reports at a bearable speed; assertions
# stay on), ccache — plus CMAKE_ARGS (the sanitizer's option). As in scripts/build.sh; with line
# tables on, ccache would also hash the build folder's path: NOHASHDIR lets a new clone reuse
# objects whose line tables name an earlier clone's paths.
configure_clang_build() {
  local dir=$1
  shift
  export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
  if [ ! -f "$dir/build.ninja" ]; then
    cmake -S . -B "$dir" -G Ninja -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
      -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" -DIRIS_BUILD_BENCH=OFF \
      -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache "$@"
  fi
}
