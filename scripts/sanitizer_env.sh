# Sourced by scripts/sanitize.sh and scripts/fuzz.sh: the one set of sanitizer options both run
# with, and the list of fuzz targets (tests/fuzz/<name>.cc).
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$PWD/tests/sanitizer/lsan.supp:print_suppressions=0
IRIS_FUZZ_TARGETS=$(cd tests/fuzz && ls ./*_fuzzer.cc | sed 's|./\(.*\)\.cc|\1|')
