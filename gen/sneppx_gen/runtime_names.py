"""The runtime's C names, which a vendored layer's must not take.

A vendored layer's functions are sneppx_<name>_forward, sneppx_<name>_pack, ...:
a layer named "layer" or "kv_cache" would define sneppx_layer_forward beside
libsneppx's own, and a program could not include or link both. The names are
read from the runtime's public headers themselves, so the rule follows them.
"""
import re
from functools import lru_cache
from typing import FrozenSet, Optional

from . import paths

_IDENTIFIER = re.compile(r"\bsneppx_([a-z0-9_]+)")


@lru_cache(maxsize=1)
def _runtime_names() -> FrozenSet[str]:
    """Every sneppx_* identifier of include/sneppx, less the prefix; empty if the headers are absent."""
    if paths.RUNTIME_HEADER_DIR is None:
        return frozenset()
    names = set()
    for header in sorted(paths.RUNTIME_HEADER_DIR.glob("*.h")):
        names.update(_IDENTIFIER.findall(header.read_text(encoding="utf-8")))
    return frozenset(names)


def collision(sanitized: str) -> Optional[str]:
    """A runtime identifier (sneppx_...) in the namespace sneppx_<sanitized>_ of a layer of
    that sanitized name, or None."""
    taken = sorted(n for n in _runtime_names() if n == sanitized or n.startswith(sanitized + "_"))
    return f"sneppx_{taken[0]}" if taken else None
