#!/usr/bin/env bash
# Proves the README's commands work on a bare Debian 12 machine, whatever this one has installed:
# builds a minimal Debian 12 root with debootstrap, copies the checkout in, and inside it (chroot,
# as root) runs scripts/install_deps.sh, configures and builds, runs a quick subset of the tests,
# iris-encode on the bundled sample and a two-request demo.
#
#   bash scripts/fresh_check.sh          the quick check (.ci/run runs this)
#   bash scripts/fresh_check.sh --full   every test (scripts/test.sh) and the full demo instead
#
# The root is kept between runs in ${IRIS_FRESH_DIR:-.fresh} (git-ignored) and reused while the
# package list (scripts/install_deps.sh --print) is unchanged, with its build folder, so a
# repeated run costs an incremental build. A changed list gets a new root from the pristine
# debootstrap copy: a package dropped from the list is then really absent. (The two most
# recently used roots are kept.) Downloaded .deb files
# are kept outside the root, so a new root costs installs, not downloads.
#
# Exit codes: 0 passed, 1 failed, 77 this machine cannot run it (not root, no debootstrap).
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
FRESH_DIR=${IRIS_FRESH_DIR:-$SRC/.fresh}
SUITE=bookworm
MIRROR=${IRIS_FRESH_MIRROR:-http://deb.debian.org/debian}
BASE=$FRESH_DIR/base        # pristine debootstrap output, never entered
ARCHIVES=$FRESH_DIR/apt-archives
MODE=quick
case "${1:-}" in
  "") ;;
  --full) MODE=full ;;
  *) echo "fresh_check: unknown argument '$1' (expected --full)" >&2; exit 2 ;;
esac

if [ "$(id -u)" -ne 0 ]; then
  echo "fresh_check: skipped: needs root (debootstrap, mount, chroot)"
  exit 77
fi
if ! command -v debootstrap >/dev/null 2>&1 || ! command -v rsync >/dev/null 2>&1; then
  echo "fresh_check: skipped: needs debootstrap and rsync (bash scripts/install_deps.sh --ci)"
  exit 77
fi

T0=$SECONDS
phase() { echo "fresh_check: [$((SECONDS - T0)) s] $*"; }

# Mounts under $ROOT, innermost last; unmounted on every exit so that nothing (least of all a
# recursive delete) can reach the host's /dev or /proc through the root.
MOUNTS=(proc sys dev dev/shm dev/pts var/cache/apt/archives)
ROOT=""  # set once the package list is known
unmount_all() {
  local i
  [ -n "$ROOT" ] || return 0
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    # A loop, not an if: a run killed before its trap ran leaves a layer that the next one covers.
    while mountpoint -q "$ROOT/${MOUNTS[$i]}" 2>/dev/null; do
      umount "$ROOT/${MOUNTS[$i]}" || umount -l "$ROOT/${MOUNTS[$i]}"
    done
  done
}
assert_unmounted() {
  if grep -q " $(realpath -m "$1")/" /proc/mounts; then
    echo "fresh_check: something is still mounted under $1; refusing to delete it" >&2
    exit 1
  fi
}
trap unmount_all EXIT

mkdir -p "$FRESH_DIR" "$ARCHIVES"

# 1. The pristine base: debootstrap once (minbase: apt, dpkg and essentials, nothing of ours).
if [ ! -f "$BASE/.iris-base-complete" ]; then
  phase "debootstrap --variant=minbase $SUITE from $MIRROR"
  assert_unmounted "$BASE"
  rm -rf --one-file-system "$BASE"
  debootstrap --variant=minbase "$SUITE" "$BASE" "$MIRROR" > "$FRESH_DIR/debootstrap.log" 2>&1 || {
    tail -20 "$FRESH_DIR/debootstrap.log" >&2
    echo "fresh_check: debootstrap failed (log: $FRESH_DIR/debootstrap.log)" >&2
    exit 1
  }
  rm -f "$BASE"/var/cache/apt/archives/*.deb
  touch "$BASE/.iris-base-complete"
fi

# 2. The root for this package list: a copy of the base, reused while the list is the same. The
# two most recently used roots are kept, so that trying a changed list and going back is cheap.
LIST_HASH=$( { echo "$SUITE $MIRROR"; bash scripts/install_deps.sh --print; } | sha256sum | cut -c1-16)
ROOT=$FRESH_DIR/root-$LIST_HASH
if [ "$(cat "$ROOT/.iris-list-hash" 2>/dev/null)" != "$LIST_HASH" ]; then
  phase "new root for package list $LIST_HASH (copy of the debootstrap base)"
  unmount_all
  assert_unmounted "$ROOT"
  rm -rf --one-file-system "$ROOT"
  cp -a "$BASE" "$ROOT"
  # No service may start inside the root.
  printf '#!/bin/sh\nexit 101\n' > "$ROOT/usr/sbin/policy-rc.d"
  chmod +x "$ROOT/usr/sbin/policy-rc.d"
else
  phase "reusing the root for package list $LIST_HASH"
fi

touch "$ROOT"
for old in $(ls -1dt "$FRESH_DIR"/root-* 2>/dev/null | tail -n +3); do
  phase "removing the least recently used root $(basename "$old")"
  assert_unmounted "$old"
  rm -rf --one-file-system "$old"
done

# 3. Mounts and network (after clearing any left by a run that was killed).
unmount_all
mount -t proc proc "$ROOT/proc"
mount -t sysfs sysfs "$ROOT/sys"
mount --bind /dev "$ROOT/dev"
mount -t tmpfs -o mode=1777 shm "$ROOT/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666 devpts "$ROOT/dev/pts"
mount --bind "$ARCHIVES" "$ROOT/var/cache/apt/archives"
rm -f "$ROOT/etc/resolv.conf"  # never write through a symlink that would resolve on the host
cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"

# 4. The checkout: tracked and untracked-but-not-ignored files, as a clone would have them (plus
# uncommitted edits). Only files whose content changed are rewritten, so the root's build folder
# stays incremental; files gone from the checkout are removed.
phase "copying the checkout to /iris"
mkdir -p "$ROOT/iris"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [ -e "$f" ] && printf '%s\0' "$f"
done > "$FRESH_DIR/files.new"
rsync -rl --checksum --from0 --files-from="$FRESH_DIR/files.new" ./ "$ROOT/iris/"
if [ -f "$ROOT/.iris-files" ]; then
  comm -z -23 <(sort -z "$ROOT/.iris-files") <(sort -z "$FRESH_DIR/files.new") |
    while IFS= read -r -d '' gone; do rm -f "$ROOT/iris/$gone"; done
fi
mv "$FRESH_DIR/files.new" "$ROOT/.iris-files"

# 5. Inside the root, with a clean environment: the README's install, build and test steps.
in_root() {
  chroot "$ROOT" /usr/bin/env -i HOME=/root TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    bash -euo pipefail -c "cd /iris; $1"
}
phase "inside the root: scripts/install_deps.sh"
in_root 'bash scripts/install_deps.sh > /var/log/iris-install-deps.log 2>&1 || { tail -30 /var/log/iris-install-deps.log; exit 1; }; tail -1 /var/log/iris-install-deps.log' || {
  phase "FAILED: install_deps.sh inside the root"
  exit 1
}
echo "$LIST_HASH" > "$ROOT/.iris-list-hash"

if [ "$MODE" = full ]; then
  INSIDE='
    mkdir -p build
    echo "fresh_check: [inside] scripts/test.sh (every test)"
    bash scripts/test.sh -j 2 > build/fresh-ctest.log 2>&1 || { tail -60 build/fresh-ctest.log; exit 1; }
    tail -5 build/fresh-ctest.log
    # A test that skipped itself for want of a tool or module means a package is missing.
    if grep -nE "skipped=|\*\*\*Skipped|SKIPPED" build/fresh-ctest.log build/Testing/Temporary/LastTest.log; then
      echo "fresh_check: tests skipped inside the fresh root (above)"; exit 1
    fi
    echo "fresh_check: [inside] scripts/demo.sh"
    bash scripts/demo.sh
  '
else
  INSIDE='
    mkdir -p build
    echo "fresh_check: [inside] scripts/build.sh"
    bash scripts/build.sh > build/fresh-build.log 2>&1 || { tail -40 build/fresh-build.log; exit 1; }
    echo "fresh_check: [inside] quick tests"
    ctest --test-dir build --output-on-failure -j 2 \
      -R "^(make_model_tiny|Safetensors|ModelConfig|ImageDecode|Preprocess|Tokenizer|RequestConversion|python_client_unit|python_bench_metrics|python_client_e2e_generate)"
    echo "fresh_check: [inside] iris-encode on the bundled sample"
    build/tools/iris-encode/iris-encode --model build/test-models/tiny --image assets/sample_1000x667.jpg --out build/fresh-embeds.safetensors
    echo "fresh_check: [inside] scripts/demo.sh (2 requests per mode)"
    IRIS_DEMO_PROMPTS=2 bash scripts/demo.sh > build/fresh-demo.log 2>&1 || { tail -40 build/fresh-demo.log; exit 1; }
    grep -E "^(Successful|Failed) requests" build/fresh-demo.log
  '
fi
phase "inside the root: $MODE check"
rc=0
in_root "$INSIDE" || rc=$?
if [ "$rc" -ne 0 ]; then
  phase "FAILED (exit code $rc)"
  exit 1
fi
phase "passed"
