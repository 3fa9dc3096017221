"""The runtime's C names, which a vendored layer's must not take.

A vendored layer's functions are sneppx_<name>_forward, sneppx_<name>_pack, ...:
a layer named "layer" or "kv_cache" would define sneppx_layer_forward beside
libsneppx's own, and a program could not include or link both. Its macros are
SNEPPX_<NAME>_HEAD_DIM, ...: a layer named "max" would redefine limits.h's
SNEPPX_MAX_HEAD_DIM (aot.name_clash checks those one by one). The names are read
from the runtime's public headers themselves (limits.h as the build renders it), so
the rule follows them.
"""
import re
from functools import lru_cache
from typing import FrozenSet, Optional

from . import paths

_IDENTIFIER = re.compile(r"\bsneppx_([a-z0-9_]+)")
# A macro's #define, or an enumerator starting its line (comments name environment
# variables, SNEPPX_TUNE, ..., which are no C names).
_MACRO = re.compile(r"^[ \t]*(?:#[ \t]*define[ \t]+)?SNEPPX_([A-Z0-9_]+)\b", re.MULTILINE)


@lru_cache(maxsize=1)
def _runtime_names() -> FrozenSet[str]:
    """Every sneppx_* identifier of include/sneppx, less the prefix; empty if the headers are absent."""
    if paths.RUNTIME_HEADER_DIR is None:
        return frozenset()
    names = set()
    for header in sorted(paths.RUNTIME_HEADER_DIR.glob("*.h")):
        names.update(_IDENTIFIER.findall(header.read_text(encoding="utf-8")))
    return frozenset(names)


@lru_cache(maxsize=1)
def _runtime_macros() -> FrozenSet[str]:
    """Every SNEPPX_* macro and constant of include/sneppx and of the rendered limits.h, less
    the prefix (limits.h is in the build tree, not beside the other headers, until installed)."""
    from .tables import limits_header  # tables imports far more than this module needs
    texts = [limits_header()]
    if paths.RUNTIME_HEADER_DIR is not None:
        texts += [header.read_text(encoding="utf-8") for header in sorted(paths.RUNTIME_HEADER_DIR.glob("*.h"))]
    return frozenset(name for text in texts for name in _MACRO.findall(text))


def collision(sanitized: str) -> Optional[str]:
    """A runtime identifier (sneppx_...) in the namespace sneppx_<sanitized>_ of a layer of
    that sanitized name, or None."""
    taken = sorted(n for n in _runtime_names() if n == sanitized or n.startswith(sanitized + "_"))
    return f"sneppx_{taken[0]}" if taken else None


def macros() -> FrozenSet[str]:
    """The runtime's SNEPPX_* macros and enumerators: a layer's own macro must be none of
    them (its namespace may hold them: a layer named "export" beside SNEPPX_EXPORT_H)."""
    return frozenset(f"SNEPPX_{name}" for name in _runtime_macros())
