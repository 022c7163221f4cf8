#!/usr/bin/env bash
# Packs what the GPU checks need into one compressed file small enough to carry to a GPU machine
# that has the CUDA toolkit and a driver but none of iris's Debian libraries (the lent H100/H200):
# the GPU test binaries (build/tests/cuda_*_test), the benches and tools named below, and every
# shared library they load except glibc's and CUDA's own (those come from the GPU machine); ICU's
# data library travels as an empty stand-in (scripts/icu_stub_data.c).
# Binaries are stripped copies; a MANIFEST records the commit and the build's -march.
#   scripts/gpu_bundle.sh [--build-dir build] [--out .gpu/bundle.tar.xz] [--max-mib N]
#     [--baseline OLD_BUNDLE] [--without NAME]... [EXTRA_BINARY...]
# Then, there: scripts/gpu_check.sh --bundle .gpu/bundle.tar.xz
# --max-mib: the device tool carries the working tree and this file together in 64 MiB, so by
# default the bundle must fit in 64 MiB less the tracked tree (~49 MiB) and 512 KiB for scripts
# (it fails here, not there).
# --baseline: a bundle made earlier (an older commit); its decode_bench travels too, as
# bin/baseline/decode_bench, for scripts/gpu_ab.sh's same-machine comparison. It costs ~1.3 MiB
# compressed, so --without NAME must leave binaries out to stay under the limit, e.g.
#   --without encoder_bench --without cuda_attention_test --without cuda_device_test
# (14.1 MiB on 2026-11-27, against a 14.5 MiB limit): what the change does not touch.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=build
OUT=.gpu/bundle.tar.xz
MAX_MIB=""
BASELINE=""
WITHOUT=()
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD_DIR=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --max-mib) MAX_MIB=$2; shift 2 ;;
    --baseline) BASELINE=$2; shift 2 ;;
    --without) WITHOUT+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) EXTRA+=("$1"); shift ;;
  esac
done
if ! grep -q '^IRIS_HAVE_CUDA_BUILT:INTERNAL=1' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null; then
  echo "gpu_bundle: $BUILD_DIR has no CUDA backend (configure where nvcc is, IRIS_CUDA=AUTO or ON)" >&2
  exit 1
fi
MARCH=$(sed -n 's/^IRIS_MARCH:STRING=//p' "$BUILD_DIR/CMakeCache.txt")
CUDA_TARGETS=$(sed -n 's/^IRIS_CUDA_TARGETS:STRING=//p' "$BUILD_DIR/CMakeCache.txt")
CUDA_TARGETS=${CUDA_TARGETS:-all}
if [ "$MARCH" = native ]; then
  echo "gpu_bundle: $BUILD_DIR is built with -march=native: its code may not run on the GPU machine's" \
       "processor; use a build with the default IRIS_MARCH=x86-64-v3" >&2
  exit 1
fi

BINS=()
# The GPU suites as the sources name them (a build folder may hold stale binaries of old names).
for src in tests/cuda_*_test.cc; do
  b="$BUILD_DIR/tests/$(basename "$src" .cc)"
  [ -x "$b" ] || { echo "gpu_bundle: $b is not built (run scripts/build.sh)" >&2; exit 1; }
  BINS+=("$b")
done
for b in "$BUILD_DIR"/bench/decode_bench "$BUILD_DIR"/bench/encoder_bench "$BUILD_DIR"/bench/sampler_bench \
         "$BUILD_DIR"/tools/iris-make-model/iris-make-model "${EXTRA[@]}"; do
  [ -x "$b" ] && BINS+=("$b")
done
for w in "${WITHOUT[@]}"; do
  KEPT=()
  for b in "${BINS[@]}"; do [ "$(basename "$b")" = "$w" ] || KEPT+=("$b"); done
  [ ${#KEPT[@]} -lt ${#BINS[@]} ] || { echo "gpu_bundle: --without $w: no such binary in the bundle" >&2; exit 1; }
  BINS=("${KEPT[@]}")
done
[ ${#BINS[@]} -gt 0 ] || { echo "gpu_bundle: nothing built in $BUILD_DIR (run scripts/build.sh)" >&2; exit 1; }

STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/lib"
for b in "${BINS[@]}"; do
  if ldd "$b" | grep -q 'not found'; then
    echo "gpu_bundle: $b has unresolved libraries:" >&2
    ldd "$b" | grep 'not found' >&2
    exit 1
  fi
  # glibc's libraries must be the GPU machine's own (they go with its loader); CUDA's runtime
  # libraries (cuBLASLt, cuDNN) are its toolkit's, matched to its driver.
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
    grep -v -E '/(libc|libm|libpthread|libdl|librt|libresolv|libutil|ld-linux-x86-64)\.so' |
    grep -v -E '/lib(cuda|cudart|cublas|cublasLt|cudnn[a-z_]*|nccl|nvrtc|nvJitLink)\.so' |
    while read -r lib; do
      case "$(basename "$lib")" in
        libicudata.so.*)
          # ICU's 31 MB data file: iris needs none of it (what it uses is compiled into libicuuc),
          # so an empty data library of the same name and entry point travels instead.
          [ -e "$STAGE/lib/$(basename "$lib")" ] && continue
          major=$(basename "$lib" | sed 's/^libicudata\.so\.\([0-9]*\).*/\1/')
          gcc -shared -fPIC -O2 -DICU_DATA_SYMBOL="icudt${major}_dat" -Wl,-soname,"libicudata.so.$major" \
            -o "$STAGE/lib/$(basename "$lib")" scripts/icu_stub_data.c ;;
        *) cp -Ln "$lib" "$STAGE/lib/" ;;
      esac
    done
  strip --strip-unneeded -o "$STAGE/bin/$(basename "$b")" "$b"
done
strip --strip-unneeded "$STAGE"/lib/*.so* 2>/dev/null || true
BASELINE_COMMIT=""
if [ -n "$BASELINE" ]; then
  # The old binary needs the same libraries as this build's (both link the same Debian packages).
  OLD=$(mktemp -d)
  tar -C "$OLD" -xJf "$BASELINE" MANIFEST bin/decode_bench || { echo "gpu_bundle: $BASELINE has no bin/decode_bench" >&2; exit 1; }
  mkdir -p "$STAGE/bin/baseline"
  cp "$OLD/bin/decode_bench" "$STAGE/bin/baseline/decode_bench"
  BASELINE_COMMIT=$(sed -n 's/^commit //p' "$OLD/MANIFEST")
  rm -rf "$OLD"
fi
{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  echo "march $MARCH"
  echo "cuda $CUDA_TARGETS"
  echo "made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
  echo "binaries $(cd "$STAGE/bin" && ls | grep -v '^baseline$' | tr '\n' ' ')"
  [ -z "$BASELINE" ] || echo "baseline $BASELINE_COMMIT"
} > "$STAGE/MANIFEST"

mkdir -p "$(dirname "$OUT")"
# Sorted by name, so that the test binaries (each links every library statically) lie side by
# side inside xz's 64 MiB window: 14242 -> 14168 KiB on 2026-11-29. The x86 branch filter first
# (x86 code's relative call and jump targets made absolute, so repeated calls compress) and the
# extreme preset: 14093 -> 13233 KiB on the same bundle (2026-11-29, evening); `tar -xJf` there
# undoes both. (One xz block: the tar is under three dictionaries, 192 MiB.)
tar -C "$STAGE" --sort=name -cf - MANIFEST bin lib | xz --x86 --lzma2=preset=9e -T2 > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
BYTES=$(stat -c %s "$OUT")
echo "gpu_bundle: $OUT: ${#BINS[@]} binaries, $(ls "$STAGE/lib" | wc -l) libraries, $((BYTES / 1024)) KiB"
if [ "$CUDA_TARGETS" = all ]; then
  # Most of a compressed binary is its sm_80 code and PTX, which an H100/H200 does not load.
  echo "gpu_bundle: (a build with IRIS_CUDA_TARGETS=sm_90a makes this several MiB smaller: see scripts/build.sh)"
fi
if [ -n "$MAX_MIB" ]; then
  LIMIT=$((MAX_MIB * 1024 * 1024))
else
  TREE=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
  LIMIT=$((64 * 1024 * 1024 - TREE - 512 * 1024))
fi
if [ "$BYTES" -gt "$LIMIT" ]; then
  echo "gpu_bundle: over the $((LIMIT / 1024)) KiB the device tool can carry beside the working tree:" \
       "leave binaries out (--without NAME)" >&2
  exit 1
fi
