#!/bin/sh
# tests/install/check_pip.sh SOURCE_DIR WORK_DIR BUILD_PYTHON_DIR
# `pip install SOURCE_DIR` into a fresh virtual environment (the build directory
# WORK_DIR/build is kept between runs, so a second run rebuilds only what
# changed); then `import sneppx` from another directory, with no PYTHONPATH or
# SNEPPX_LIBRARY, must load the package and library of that environment and
# give the same forward pass as the build tree's package (BUILD_PYTHON_DIR,
# under Debian's python3): both routes work.
set -eu
source_dir=$1 work=$2 build_python=$3
rm -rf "$work/venv"
/usr/bin/python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --upgrade pip
CMAKE_BUILD_PARALLEL_LEVEL=2 "$work/venv/bin/python" -m pip install --quiet -C build-dir="$work/build" "$source_dir"

forward='
import pathlib, sys
import numpy as np
import sneppx
from sneppx import _locate
cfg = sneppx.LLMConfig.from_name("qwen2", "0.5B")
x = np.random.default_rng(7).standard_normal((1, 9, cfg.hidden_size)).astype(np.float32)
y = cfg.forward_mha(x)
print(pathlib.Path(sneppx.__file__).resolve().parent, _locate.library_path().resolve().parent)
print(np.float64(y.astype(np.float64).sum()).hex(), y.shape)
'
cd /
installed=$(env -u PYTHONPATH -u SNEPPX_LIBRARY "$work/venv/bin/python" -c "$forward")
debian=$(env -u SNEPPX_LIBRARY PYTHONPATH="$build_python" /usr/bin/python3 -c "$forward")
package_dir=$(printf '%s\n' "$installed" | sed -n 1p)
case "$package_dir" in
    "$work/venv/"*/site-packages/sneppx\ "$work/venv/"*/site-packages/sneppx) ;;
    *) echo "check_pip: the installed package or library is not the environment's: $package_dir" >&2; exit 1 ;;
esac
if [ "$(printf '%s\n' "$installed" | sed -n 2p)" != "$(printf '%s\n' "$debian" | sed -n 2p)" ]; then
    echo "check_pip: pip-installed and build-tree forwards differ:" >&2
    echo "$installed" >&2
    echo "$debian" >&2
    exit 1
fi
echo "pip install: $package_dir; forward $(printf '%s\n' "$installed" | sed -n 2p), as the build tree's"
