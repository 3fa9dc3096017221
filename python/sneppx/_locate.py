"""Where the package finds libsneppx and the module the build renders for it.

This module owns every path and environment override of the package. The
library is looked up once, at import, in this order:

1. ``$SNEPPX_LIBRARY``: the path of the shared library (nothing else is tried).
2. Inside the package: ``pip install .`` puts ``libsneppx.so`` in ``sneppx/``.
3. The installed layout: ``cmake --install`` puts this package in
   ``<prefix>/<libdir>/python3/dist-packages/sneppx`` and the library in
   ``<prefix>/<libdir>/libsneppx.so``.
4. A build tree: ``<build>/python/sneppx`` (the copy the build makes) next to
   ``<build>/runtime/libsneppx.so``; or, from a source checkout
   (``<repo>/python/sneppx``), ``<repo>/build/runtime/libsneppx.so`` and then
   the most recently built ``<repo>/build*/runtime/libsneppx.so``.

The config structs (``_config_fields``) are rendered at build time from
gen/sneppx_gen/config_fields.py into the build's copy of the package,
``<build>/python/sneppx/``, and installed with it. The package in a source
checkout has no rendered files: it takes the module of the build its library
comes from (``<build>/runtime/libsneppx.so`` -> ``<build>/python/sneppx/``),
so the structs always match the library loaded.
"""
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import List

LIBRARY_ENV = "SNEPPX_LIBRARY"
_NAMES = ("libsneppx.so", "libsneppx.so.0")
_PACKAGE_DIR = Path(__file__).resolve().parent


def _candidates() -> List[Path]:
    installed_libdir = _PACKAGE_DIR.parents[2]
    candidates = [_PACKAGE_DIR / _NAMES[0]] + [installed_libdir / name for name in _NAMES]
    build_root = _PACKAGE_DIR.parents[1]
    candidates += [build_root / "runtime" / name for name in _NAMES]
    repo_builds = sorted(build_root.glob("build*/runtime/libsneppx.so"),
                         key=lambda path: (path.parent.parent.name != "build", -path.stat().st_mtime))
    return candidates + repo_builds


def library_path() -> Path:
    """The path libsneppx is (or would be) loaded from; raises ImportError if none exists."""
    override = os.environ.get(LIBRARY_ENV)
    if override:
        path = Path(override)
        if not path.is_file():
            raise ImportError(f"sneppx: ${LIBRARY_ENV} is {override!r}, which is not a file")
        return path
    candidates = _candidates()
    for path in candidates:
        if path.is_file():
            return path
    tried = "\n  ".join(str(path) for path in candidates)
    raise ImportError(f"sneppx: libsneppx.so not found; set ${LIBRARY_ENV} or build/install sneppx. "
                      f"Tried:\n  {tried}")


def rendered_module(name: str) -> ModuleType:
    """sneppx.<name>, a module the build renders: beside this file (the build's copy of the
    package, or an installed one), else in the package copy of the library's build tree."""
    qualified = f"{__package__}.{name}"
    if qualified in sys.modules:
        return sys.modules[qualified]
    path = _PACKAGE_DIR / f"{name}.py"
    if not path.is_file():
        library = library_path()
        path = library.resolve().parents[1] / "python" / "sneppx" / f"{name}.py"
        if not path.is_file():
            raise ImportError(f"sneppx: {name}.py, rendered by the build, is neither in {_PACKAGE_DIR} nor in "
                              f"{path.parent} (the build tree of {library}): build sneppx")
    spec = importlib.util.spec_from_file_location(qualified, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[qualified] = module
    spec.loader.exec_module(module)
    return module
