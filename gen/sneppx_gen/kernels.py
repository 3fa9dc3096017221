"""The kernel families: template, entry points and the fields of their keys.

One source of truth for key formatting: the generator names AOT functions and
manifest lines with `kernel_key()`, and the runtime's C key table
(build/generated/kernel_table.c) is rendered from KERNELS, so the C runtime
formats exactly the same canonical text.

A key is `<family>-<field><value>-...-v<vector width>`, e.g.
`attn_flash-d128-dv128-g4-w4096-causal-v16`. Every field is an int64 value;
in `jit` mode it becomes the global `spec_<name>` and in `aot` mode a literal.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

MASK_MODES = ("none", "causal", "mask")  # SNEPPX_MASK_NONE / CAUSAL / EXPLICIT


@dataclass(frozen=True)
class Field:
    name: str                      # spec_<name> in jit mode
    prefix: str                    # text before the value in the key
    choices: Optional[Tuple[str, ...]] = None  # value i prints as choices[i]


@dataclass(frozen=True)
class Kernel:
    family: str
    template: str
    fields: Tuple[Field, ...]
    entries: Tuple[str, ...] = ("",)   # suffixes of the entry points, in SNEPPX_ENTRY_* order


ATTN_FIELDS = (
    Field("head_dim", "d"),
    Field("v_head_dim", "dv"),
    Field("group", "g"),
    Field("window", "w"),
    Field("mask_mode", "", MASK_MODES),
)

KERNELS: Dict[str, Kernel] = {k.family: k for k in (
    Kernel("gemm", "gemm.c.j2", (Field("k", "k"), Field("n", "n"), Field("bias", "bias")),
           entries=("", "_pack")),
    Kernel("rope", "rope.c.j2", (Field("rotary_dim", "r"), Field("interleaved", "", ("half", "inter")))),
    Kernel("rmsnorm", "rmsnorm.c.j2", (Field("n", "n"),)),
    Kernel("attn_flash", "attn_flash.c.j2", ATTN_FIELDS),
    Kernel("attn_sdpa", "attn_sdpa.c.j2", ATTN_FIELDS),
)}

VECTOR_WIDTHS = (16, 8)


def kernel_key(family: str, values: Dict[str, int], vector_width: int) -> str:
    kernel = KERNELS[family]
    parts: List[str] = [family]
    for f in kernel.fields:
        v = int(values[f.name])
        parts.append(f.prefix + (f.choices[v] if f.choices else str(v)))
    parts.append(f"v{vector_width}")
    return "-".join(parts)


def symbol_of_key(key: str) -> str:
    """C identifier of a key's entry point: sneppx_ + key with - and . as _."""
    return "sneppx_" + key.replace("-", "_").replace(".", "_")
