#!/usr/bin/env bash
# Builds sneppx-bench and runs it: every stage side by side with its baseline.
# The first full run installs the baselines' virtual environment (scripts/venv.sh,
# ~10 minutes once per instruction set; `SNEPPX_BENCH_VENV= bench/run.sh` runs without it).
#   bench/run.sh [--quick] [--stages LIST] [--csv FILE] [--plot FILE.png] [--gemm-tile RxC]
# The build directory is $SNEPPX_BUILD_DIR (default: build-bench beside the sources).
# OpenBLAS reads OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE when it loads; this
# machine sets them to force AVX2 kernels, 1.7-3.9x slower. The baseline
# process runs without them (and prints the core OpenBLAS detected).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SNEPPX_BUILD_DIR:-$root/build-bench}"
# The baselines' Python (PyTorch 2.x, transformers, llama.cpp): made once by
# scripts/venv.sh outside the checkout; --quick runs without it unless it exists.
if [[ -z "${SNEPPX_BENCH_VENV+set}" ]]; then
    if [[ " $* " == *" --quick "* ]]; then
        SNEPPX_BENCH_VENV="$("$root/scripts/venv.sh" --check || true)"
    else
        SNEPPX_BENCH_VENV="$("$root/scripts/venv.sh")"
    fi
fi
export SNEPPX_BENCH_VENV
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target sneppx-bench -j"$(nproc)"
exec env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$build/bench/sneppx-bench" "$@"
