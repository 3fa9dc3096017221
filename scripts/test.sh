#!/usr/bin/env bash
# Builds and runs every test: C tests, lit + FileCheck, pytest (all through ctest).
# --sanitize builds into build-asan with ASan + UBSan and runs the same suite there.
# --tsan builds into build-tsan with clang and ThreadSanitizer and runs the suite's
# C programs there (the C tests, the MPI shard tests, the examples, the fuzz replays):
# CPython and the lit tools' Python drivers are not instrumented.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/deps.sh"
build="${SNEPPX_BUILD_DIR:-$root/build}"
options=(-DCMAKE_BUILD_TYPE=Release)
what="Release"
only=() # ctest's selection: every test
if [ "${1:-}" = "--sanitize" ]; then
  build="${SNEPPX_BUILD_DIR:-$root/build-asan}"
  options=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DSNEPPX_SANITIZE=ON -DSNEPPX_BUILD_BENCH=OFF)
  what="ASan + UBSan"
  # Leaks are checked in full: the suppressions file (tests/lsan.supp) is where one
  # would go, and it is empty (it says why).
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"
  export LSAN_OPTIONS="suppressions=$root/tests/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
elif [ "${1:-}" = "--tsan" ]; then
  build="${SNEPPX_BUILD_DIR:-$root/build-tsan}"
  options=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang-19 -DSNEPPX_TSAN=ON
           -DSNEPPX_BUILD_BENCH=OFF -DSNEPPX_BUILD_FUZZERS=OFF)
  what="ThreadSanitizer"
  only=(-R '^(test_|mpi_shard_np|example_|fuzz_replay_)')
fi
jobs="$(nproc)"
started=$SECONDS
echo "scripts/test.sh: configuring $build ($what)"
cmake -S "$root" -B "$build" -G Ninja "${options[@]}" >/dev/null
echo "scripts/test.sh: building on $jobs jobs"
cmake --build "$build" -j"$jobs"
cd "$build"
count="$(ctest -N "${only[@]+"${only[@]}"}" | sed -n 's/^Total Tests: //p')"
# Two tests at a time on two cores: each runs single-threaded unless it holds
# both cores (tests/CMakeLists.txt: "ctest: two cores"). ctest prints each test
# as it ends, "n/count", with its time; the slowest are listed at the end.
echo "scripts/test.sh: running $count tests, $jobs at a time (built in $((SECONDS - started)) s)"
status=0
ctest --output-on-failure -j"$jobs" "${only[@]+"${only[@]}"}" | tee ctest-output.txt || status=$?
echo "scripts/test.sh: slowest tests:"
sed -n 's/^ *[0-9]*\/[0-9]* Test *#[0-9]*: \([^ ]*\) .* \([0-9.]*\) sec$/\2 \1/p' ctest-output.txt |
  sort -g -r | head -5 | awk '{ printf "  %-40s %7.1f s\n", $2, $1 }'

echo "scripts/test.sh: done in $((SECONDS - started)) s, $( [ $status -eq 0 ] && echo passed || echo FAILED)"
exit $status
