#!/usr/bin/env bash
# The device seam's rules, checked on the sources (ctest: layering_check):
#   - model code (vision/, llm/) names no backend: no kernels/cpu/ (or kernels/cuda/) header, no
#     oneDNN, OpenMP or CUDA header, no `#pragma omp`;
#   - core/ holds no device API: no kernels/ header, no oneDNN, OpenMP or CUDA header.
# Prints every violation; exit 1 if there is one.
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root"
status=0
report() {  # pattern, what, dirs...
  local pattern=$1 what=$2
  shift 2
  local hits
  hits=$(grep -rnE --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh' "$pattern" "$@" || true)
  if [ -n "$hits" ]; then
    echo "layering: $what:"
    echo "$hits" | sed 's/^/  /'
    status=1
  fi
}
backend_headers='#[[:space:]]*include[[:space:]]*[<"](kernels/cpu/|kernels/cuda/|oneapi/dnnl|dnnl|omp\.h|cuda|cublas|cudnn)'
report "$backend_headers" "model code includes a backend header" vision llm
report '#[[:space:]]*pragma[[:space:]]+omp' "model code has an OpenMP pragma" vision llm
report '#[[:space:]]*include[[:space:]]*[<"](kernels/|oneapi/dnnl|dnnl|omp\.h|cuda|cublas|cudnn)' "core/ includes a device API" core
[ "$status" -eq 0 ] && echo "layering: vision/, llm/ and core/ are device-free"
exit "$status"
