#!/bin/sh
# Runs pytest in the tests' virtual environment of scripts/venv.sh (torch, transformers):
#   venv_pytest.sh SOURCE_DIR SYSTEM_PYTHON PYTEST_ARGS...
# The venv holds no pytest, and adding it to venv.sh's pinned list would make every
# existing venv reinstall; Debian's pytest (python3-pytest, for the same CPython as the
# venv's) is put after the venv's own packages instead, so torch, transformers and numpy
# still come from the venv.
set -eu
source_dir="$1" system_python="$2"
shift 2
# Without the venv: skipped (exit 77, ctest's SKIP_RETURN_CODE), or with
# SNEPPX_REQUIRE_TORCH=1 a failure.
venv="$("$source_dir/scripts/venv.sh" --tests --check)" || {
    echo "venv_pytest.sh: no complete venv of scripts/venv.sh (torch, transformers): run scripts/venv.sh --tests once" >&2
    [ "${SNEPPX_REQUIRE_TORCH:-0}" = 1 ] && exit 1
    exit 77
}
pytest_dir="$("$system_python" -c 'import os, pytest; print(os.path.dirname(os.path.dirname(pytest.__file__)))')"
exec "$venv/bin/python" -c 'import sys; sys.path.append(sys.argv.pop(1)); import pytest; sys.exit(pytest.main(sys.argv[1:]))' \
    "$pytest_dir" "$@"
