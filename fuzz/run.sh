#!/usr/bin/env bash
# Builds the libFuzzer harnesses of fuzz/ with clang-19 (coverage, ASan, UBSan)
# in build-fuzz and runs each for a bounded time over its committed seeds and
# regressions.
#
#   fuzz/run.sh [seconds per harness, default 30] [harness ...]   (default: all)
#
# New interesting inputs go to build-fuzz/corpus/<harness>/ (the committed
# seeds are only read). A crash or a broken promise stops that harness and
# leaves build-fuzz/artifacts/<harness>/crash-<sha1>; the script then fails
# naming it. Fix the bug and copy the input to fuzz/regressions/<harness>/:
# the ctest fuzz_replay_<harness> replays it in every build from then on.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/deps.sh" # clang-19, libclang-rt-19-dev (libFuzzer), libomp-19-dev
build="${SNEPPX_FUZZ_BUILD_DIR:-$root/build-fuzz}"
seconds="${1:-30}"
shift || true
harnesses=("$@")
if [ ${#harnesses[@]} -eq 0 ]; then
  for source in "$root"/fuzz/fuzz_*.c; do # each harness file, as fuzz/CMakeLists.txt builds them
    name="$(basename "$source" .c)"
    harnesses+=("${name#fuzz_}")
  done
fi

CC=clang-19 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSNEPPX_BUILD_FUZZERS=ON -DSNEPPX_BUILD_TESTS=OFF -DSNEPPX_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" --target sneppx_fuzzers -j"$(nproc)"

failed=()
for harness in "${harnesses[@]}"; do
  work="$build/corpus/$harness" artifacts="$build/artifacts/$harness"
  mkdir -p "$work" "$artifacts"
  inputs=("$work" "$root/fuzz/corpus/$harness")
  if [ -d "$root/fuzz/regressions/$harness" ]; then
    inputs+=("$root/fuzz/regressions/$harness")
  fi
  dictionary=()
  if [ -f "$root/fuzz/$harness.dict" ]; then
    dictionary=(-dict="$root/fuzz/$harness.dict")
  fi
  echo "== fuzz_$harness: ${seconds}s"
  # Inputs above 64 KiB add time, not coverage: every parser's interesting
  # structure (headers, JSON nesting, entries) fits well below that.
  if ! "$build/fuzz/fuzz_$harness" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -max_len=65536 -print_final_stats=1 -artifact_prefix="$artifacts/" "${dictionary[@]}" "${inputs[@]}" \
        >"$build/fuzz_$harness.log" 2>&1; then
    tail -n 40 "$build/fuzz_$harness.log"
    failed+=("$harness: $(ls -t "$artifacts" | head -n 1)")
  else
    grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$build/fuzz_$harness.log" | tr '\n' ' '
    echo
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  for failure in "${failed[@]}"; do
    echo "FUZZ FAILURE $failure (in $build/artifacts)" >&2
  done
  exit 1
fi
echo "every harness ran ${seconds}s without a crash"
