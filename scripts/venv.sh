#!/usr/bin/env bash
# Creates (once) and prints the path of the virtual environment that the
# optional baselines and integration tests use: PyTorch 2.x, HF transformers,
# gguf and llama-cpp-python, pinned below. It lives outside the checkout
# (default ~/.cache/sneppx-venv-<isa>; $SNEPPX_VENV overrides), so later runs
# and CI reuse it. llama-cpp-python compiles llama.cpp for the host CPU
# (-march=native), so each instruction set gets a venv of its own: one built
# on an AVX-512 host would die of SIGILL on an AVX2 one.
#   scripts/venv.sh            create if missing, print the venv directory
#   scripts/venv.sh --check    print it if complete, else exit 1 (installs nothing)
set -euo pipefail
isa=avx2
grep -qw avx512f /proc/cpuinfo && isa=avx512
venv="${SNEPPX_VENV:-$HOME/.cache/sneppx-venv-$isa}"
requirements=(
    "torch==2.15.0"
    "transformers==5.24.0"
    "gguf==0.19.0"
    "llama-cpp-python==0.3.36"
    "numpy"
)
stamp="$venv/.sneppx-complete"
want="$(printf '%s\n' "${requirements[@]}")"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "$venv"
    exit 0
fi
[[ "${1:-}" == "--check" ]] && exit 1
echo "scripts/venv.sh: installing ${requirements[*]} into $venv (once; llama.cpp compiles for a few minutes)" >&2
/usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip >&2
# Two jobs: the machine has two cores and the build shares them.
CMAKE_BUILD_PARALLEL_LEVEL=2 CMAKE_ARGS="-DGGML_NATIVE=ON" \
    "$venv/bin/python" -m pip install --quiet "${requirements[@]}" >&2
printf '%s\n' "$want" > "$stamp"
echo "$venv"
