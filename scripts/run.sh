#!/usr/bin/env bash
# The main job: install what is missing, build, then JIT-compile the presets'
# kernels and run a forward pass of each, printing keys, compile/cache times
# and GFLOP/s. Extra arguments go to sneppx-run (e.g. --arch llama3-8B --seq 512).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/deps.sh"
build="${SNEPPX_BUILD_DIR:-$root/build}"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)"
echo "== sneppx-gen --arch mistral-7B (ahead-of-time C)"
"$root/gen/sneppx-gen" --arch mistral-7B -o "$build/aot/mistral-7B"
exec "$build/runtime/sneppx-run" "$@"
