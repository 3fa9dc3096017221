#!/usr/bin/env bash
# Creates (once) and prints the path of a virtual environment with the pinned
# packages below, outside the checkout so later runs and CI reuse it.
#
# Two kinds, one pinned list:
# - the benchmarks' (default): PyTorch, HF transformers, gguf and llama-cpp-python,
#   in ~/.cache/sneppx-venv-<isa>. llama-cpp-python compiles llama.cpp for the host
#   CPU (-march=native), so each instruction set gets a venv of its own: one built
#   on an AVX-512 host would die of SIGILL on an AVX2 one.
# - the tests' (--tests): only what the tests import (torch, transformers, numpy),
#   in ~/.cache/sneppx-venv-tests, the same on every host: no compile, a few minutes
#   of download. The benchmarks' venv serves the tests too, so --tests prefers it
#   when it is complete.
# $SNEPPX_VENV overrides the directory of either kind.
#   scripts/venv.sh [--tests]            create if missing, print the venv directory
#   scripts/venv.sh [--tests] --check    print it if complete, else exit 1 (installs nothing)
set -euo pipefail
tests=0 check=0
for arg in "$@"; do
    case "$arg" in
        --tests) tests=1 ;;
        --check) check=1 ;;
        *) echo "scripts/venv.sh: unknown argument '$arg' (expected --tests, --check)" >&2; exit 2 ;;
    esac
done
isa=avx2
grep -qw avx512f /proc/cpuinfo && isa=avx512
torch_pins=(
    "torch==2.15.0"
    "transformers==5.24.0"
)
llama_cpp_pins=(
    "gguf==0.19.0"
    "llama-cpp-python==0.3.36"
)
bench_venv="${SNEPPX_VENV:-$HOME/.cache/sneppx-venv-$isa}"
bench_requirements=("${torch_pins[@]}" "${llama_cpp_pins[@]}" numpy)

# Prints the venv if its stamp lists exactly these requirements.
complete() {
    local venv="$1"; shift
    [[ -f "$venv/.sneppx-complete" && "$(cat "$venv/.sneppx-complete")" == "$(printf '%s\n' "$@")" ]] &&
        echo "$venv"
}

if ((tests)); then
    complete "$bench_venv" "${bench_requirements[@]}" && exit 0
    venv="${SNEPPX_VENV:-$HOME/.cache/sneppx-venv-tests}"
    requirements=("${torch_pins[@]}" numpy)
    what="(once; torch's wheels are large, a few minutes of download)"
else
    venv="$bench_venv"
    requirements=("${bench_requirements[@]}")
    what="(once; llama.cpp compiles for a few minutes)"
fi
complete "$venv" "${requirements[@]}" && exit 0
((check)) && exit 1
echo "scripts/venv.sh: installing ${requirements[*]} into $venv $what" >&2
/usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip >&2
# Two jobs: the machine has two cores and the build shares them.
CMAKE_BUILD_PARALLEL_LEVEL=2 CMAKE_ARGS="-DGGML_NATIVE=ON" \
    "$venv/bin/python" -m pip install --quiet "${requirements[@]}" >&2
printf '%s\n' "${requirements[@]}" > "$venv/.sneppx-complete"
echo "$venv"
