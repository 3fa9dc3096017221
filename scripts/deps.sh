#!/usr/bin/env bash
# Installs the Debian packages sneppx needs, only those missing (sourced by run.sh and test.sh).
set -euo pipefail
SNEPPX_PACKAGES=(
  cmake ninja-build gcc pkg-config
  llvm-19-dev clang-19 llvm-19-tools libclang-rt-19-dev libomp-19-dev
  libcjson-dev nettle-dev libopenblas-dev
  python3 python3-jinja2 python3-numpy python3-pytest python3-venv
  libopenmpi-dev openmpi-bin python3-mpi4py iproute2
  qemu-user # tests/emulated: an AVX2-only CPU for the tests of the AVX2 target
)
missing=()
for package in "${SNEPPX_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "sneppx: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
