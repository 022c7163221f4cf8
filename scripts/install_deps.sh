#!/usr/bin/env bash
# Installs the Debian packages iris needs to build, test, run and benchmark. Idempotent: packages
# already installed are skipped, and apt-get runs only when something is missing.
#
#   bash scripts/install_deps.sh          the build, tests, demo and benchmarks
#   bash scripts/install_deps.sh --ci     also what .ci/run's extra stages use (sanitizers, fuzzing,
#                                         the fresh-root check)
#   bash scripts/install_deps.sh --print [--ci]   print the list, install nothing
#
# Every package the README's commands use is named here: scripts/fresh_check.sh proves it on a
# bare Debian 12 root, where nothing else is installed.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ccache
  libabsl-dev nlohmann-json3-dev libssl-dev libicu-dev
  libdnnl-dev ocl-icd-opencl-dev  # dnnl-config.cmake requires OpenCL; Debian only recommends it
  libjpeg62-turbo-dev libpng-dev libopencv-core-dev libopencv-imgcodecs-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libgrpc++-dev libgrpc-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  grpc-proto python3-grpcio python3-protobuf python3-numpy python3-pil openssl
  python3-matplotlib  # iris-bench sweep plots (Agg backend, no display needed)
  libboost-dev curl  # the HTTP front (Boost.Beast, header-only); the HTTP tests drive it with curl
  haproxy            # the load-balancer test (two replicas behind it)
  python3-venv       # the openai-client test makes a venv (pip install openai from PyPI)
)
# .ci/run's extra stages: clang with libFuzzer and the sanitizer runtimes, OpenMP for clang,
# llvm-symbolizer for readable sanitizer reports; debootstrap and rsync for the fresh root;
# qemu-user for the run on an emulated AVX2 processor (scripts/portable_check.sh); prometheus for
# promtool.
CI_PACKAGES=(
  clang-14 libclang-rt-14-dev libomp-14-dev llvm-14
  debootstrap rsync
  qemu-user
  prometheus  # promtool for the /metrics format check (96 MB; the test skips without it)
)

ci=0
print=0
for arg in "$@"; do
  case "$arg" in
    --ci) ci=1 ;;
    --print) print=1 ;;
    *) echo "install_deps: unknown argument '$arg' (expected --ci, --print)" >&2; exit 2 ;;
  esac
done
wanted=("${PACKAGES[@]}")
if [ "$ci" -eq 1 ]; then wanted+=("${CI_PACKAGES[@]}"); fi
if [ "$print" -eq 1 ]; then
  printf '%s\n' "${wanted[@]}"
  exit 0
fi

missing=()
for p in "${wanted[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#wanted[@]} packages present"
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
