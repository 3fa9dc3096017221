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



def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run only the collected tests whose index is I modulo N (ctest splits a long "
                          "file into N tests this way: tests/CMakeLists.txt, \"ctest: N shards\")")


def pytest_collection_modifyitems(config, items):
    shard = config.getoption("--shard")
    if shard is None:
        return
    index, count = (int(part) for part in shard.split("/"))
    if not 0 <= index < count:
        raise pytest.UsageError(f"--shard {shard}: I must be in [0, N)")
    kept = [item for position, item in enumerate(items) if position % count == index]
    config.hook.pytest_deselected(items=[item for item in items if item not in kept])
    items[:] = kept
