#!/usr/bin/env bash
# Installs the Debian packages iris needs to build, test and run. Idempotent: packages already
# installed are skipped, and apt-get runs only when something is missing.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libabsl-dev nlohmann-json3-dev libssl-dev libicu-dev
  libdnnl-dev ocl-icd-opencl-dev  # dnnl-config.cmake requires OpenCL; Debian only recommends it
  libjpeg62-turbo-dev libpng-dev libopencv-core-dev libopencv-imgcodecs-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libgrpc++-dev libgrpc-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  grpc-proto python3-grpcio python3-protobuf python3-numpy python3-pil openssl
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
