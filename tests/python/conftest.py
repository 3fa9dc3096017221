"""pytest setup for the sneppx Python tests.

ctest runs them with PYTHONPATH=<repo>/python and SNEPPX_LIBRARY=<the built
library>; run by hand (``/usr/bin/python3 -m pytest tests/python``) they fall
back to the source package and the library lookup of sneppx._locate (which
also finds the config structs the build rendered beside that library).
"""
import sys
from pathlib import Path

import numpy as np
import pytest

try:
    import sneppx  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))


@pytest.fixture
def rng():
    """A fresh, fixed-seed generator per test: results do not depend on test order."""
    return np.random.default_rng(20240611)

