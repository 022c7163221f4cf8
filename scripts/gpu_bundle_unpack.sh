# Sourced by the scripts that run a bundle from scripts/gpu_bundle.sh on a GPU machine:
# unpack_gpu_bundle FILE unpacks it into a temporary folder (removed when the shell exits), sets
# BUNDLE_ROOT and BIN (its binaries), and puts its libraries, then this machine's CUDA runtime
# libraries (cuBLASLt, cuDNN: the toolkit's folder, or the pip wheels PyTorch brings), on
# LD_LIBRARY_PATH. Returns 1 if the file cannot be unpacked.
unpack_gpu_bundle() {
  BUNDLE_ROOT=$(mktemp -d)
  trap 'rm -rf "$BUNDLE_ROOT"' EXIT
  if command -v xz >/dev/null 2>&1; then
    tar -C "$BUNDLE_ROOT" -xJf "$1" || return 1
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$1" "$BUNDLE_ROOT" || return 1
  fi
  BIN=$BUNDLE_ROOT/bin
  local cuda_libs d
  cuda_libs=$(for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -d "$d" ] && echo -n "$d:"; done)
  for d in $(python3 -c 'import glob, site; [print(p) for s in site.getsitepackages() for p in glob.glob(s + "/nvidia/*/lib")]' 2>/dev/null); do
    cuda_libs="$cuda_libs$d:"
  done
  export LD_LIBRARY_PATH="$BUNDLE_ROOT/lib:$cuda_libs${LD_LIBRARY_PATH:-}"
}
