#!/usr/bin/env bash
# Builds and runs every test: C tests, lit + FileCheck, pytest (all through ctest).
# --sanitize builds into build-asan with ASan + UBSan and runs the same suite there.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/deps.sh"
build="${SNEPPX_BUILD_DIR:-$root/build}"
options=(-DCMAKE_BUILD_TYPE=Release)
if [ "${1:-}" = "--sanitize" ]; then
  build="${SNEPPX_BUILD_DIR:-$root/build-asan}"
  options=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DSNEPPX_SANITIZE=ON -DSNEPPX_BUILD_BENCH=OFF)
  # LLVM's own allocations are not ours to leak-check one by one; the suppressions
  # file lists exactly which (tests/lsan.supp).
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"
  export LSAN_OPTIONS="suppressions=$root/tests/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
fi
cmake -S "$root" -B "$build" -G Ninja "${options[@]}" >/dev/null
cmake --build "$build" -j"$(nproc)"
cd "$build"
ctest --output-on-failure -j1
