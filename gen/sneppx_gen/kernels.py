"""The kernel families: template, entry points and the fields of their keys.

One source of truth for key formatting: the generator names AOT functions and
manifest lines with `kernel_key()`, and the runtime's C key table
(build/generated/kernel_registry_table.c) is rendered from KERNELS, so the C runtime
formats exactly the same canonical text.

A key is `<family>-<field><value>-...-<target>` (targets.py names the
targets), e.g. `attn_flash-d128-dv128-g4-w4096-causal-v16`. Every field is an
int64 value; in `jit` mode it becomes the global `spec_<name>` and in `aot`
mode a literal.

Each field carries the values it may take (low, high, multiple of): the
runtime checks every key a layer derives against them before compiling
anything, sneppx-gen before rendering. They are what the templates are
written for; config bounds (limits.py) are chosen so that every valid config
derives keys inside them.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from . import jit_pipelines
from .config_fields import DTYPES, WEIGHT_DTYPES
from .limits import HEAD_DIM_MULTIPLE, MAX_DIM, MAX_HEAD_DIM, MAX_HEADS, MAX_LATENT_DIM, MAX_POSITIONS
from .targets import GEMM_KC_MULTIPLE, TARGETS, Target

MASK_MODES = ("none", "causal", "mask")  # SNEPPX_MASK_NONE / CAUSAL / EXPLICIT


@dataclass(frozen=True)
class Field:
    name: str                      # spec_<name> in jit mode
    prefix: str                    # text before the value in the key
    low: int = 0                   # the legal values: low..high, multiples of `multiple`
    high: int = 0
    multiple: int = 1
    choices: Optional[Tuple[str, ...]] = None  # value i prints as choices[i]; low..high = 0..n-1

    def check(self, family: str, value: int) -> None:
        """Raises ValueError naming the field when value is not legal."""
        if not self.low <= value <= self.high:
            raise ValueError(f"{family}: {self.name}={value} is outside [{self.low}, {self.high}]")
        if value % self.multiple:
            raise ValueError(f"{family}: {self.name}={value} is not a multiple of {self.multiple}")


def choice_field(name: str, prefix: str, choices: Tuple[str, ...]) -> Field:
    return Field(name, prefix, 0, len(choices) - 1, 1, choices)


@dataclass(frozen=True)
class Kernel:
    family: str
    template: str
    fields: Tuple[Field, ...]
    entries: Tuple[str, ...] = ("",)   # suffixes of the entry points, in SNEPPX_ENTRY_* order
    # The LLVM pass pipeline the JIT runs on the family's keys (jit_pipelines.py says why
    # each); part of their fingerprints.
    jit_pipeline: str = jit_pipelines.O2


# Attention: q/k head dim up to absorbed MLA's kv_lora_rank + qk_rope_head_dim,
# v head dim up to kv_lora_rank; group up to every head sharing one K/V head.
ATTN_FIELDS = (
    Field("head_dim", "d", HEAD_DIM_MULTIPLE, MAX_LATENT_DIM + MAX_HEAD_DIM, HEAD_DIM_MULTIPLE),
    Field("v_head_dim", "dv", HEAD_DIM_MULTIPLE, MAX_LATENT_DIM, HEAD_DIM_MULTIPLE),
    Field("group", "g", 1, MAX_HEADS),
    Field("window", "w", 0, MAX_POSITIONS),
    choice_field("mask_mode", "", MASK_MODES),
)

# GEMM k: hidden, q/kv LoRA ranks, MLA's nope dim or heads x v_head_dim (at
# most MAX_DIM each); n: the fused q|k|v width, at most three such. weight_type:
# the packed panels' element type (config_fields.WEIGHT_DTYPES, the config's
# weight_dtype), so a narrow and a float32 GEMM never share a kernel.
# kc, mc: the cache blocking, the k slice and the activation block's rows
# (targets.py: each target's defaults and tuning candidates, which bound them:
# the block is on the kernel's stack). The runtime and sneppx-gen fill in the
# target's defaults, or a host's tuning record (runtime/gemm_tiles.c).
GEMM_TILE_FIELDS = (
    Field("kc", "kc", min(min(t.gemm_kc_candidates) for t in TARGETS), max(max(t.gemm_kc_candidates) for t in TARGETS),
          GEMM_KC_MULTIPLE),
    Field("mc", "mc", 1, max(max(t.gemm_mc_candidates + (t.gemm_int8_mc,)) for t in TARGETS)),
)
KERNELS: Dict[str, Kernel] = {k.family: k for k in (
    Kernel("gemm", "gemm.c.j2", (Field("k", "k", 1, MAX_DIM), Field("n", "n", 1, 3 * MAX_DIM),
                                 Field("bias", "bias", 0, 1), choice_field("weight_type", "", WEIGHT_DTYPES))
           + GEMM_TILE_FIELDS,
           entries=("", "_pack"), jit_pipeline=jit_pipelines.GEMM),
    # The opt-in bfloat16-compute GEMM (config compute_dtype): bfloat16 weights in pair
    # panels and activations rounded to bfloat16, so its numbers differ from gemm's.
    Kernel("gemm_bf16dot", "gemm_bf16dot.c.j2", (Field("k", "k", 1, MAX_DIM), Field("n", "n", 1, 3 * MAX_DIM),
                                                 Field("bias", "bias", 0, 1)),
           entries=("", "_pack")),
    Kernel("rope", "rope.c.j2", (Field("rotary_dim", "r", 2, MAX_HEAD_DIM, 2),
                                 choice_field("interleaved", "", ("half", "inter")))),
    Kernel("rmsnorm", "rmsnorm.c.j2", (Field("n", "n", 1, MAX_DIM),)),
    Kernel("attn_flash", "attn_flash.c.j2", ATTN_FIELDS, jit_pipeline=jit_pipelines.FLASH),
    Kernel("attn_sdpa", "attn_sdpa.c.j2", ATTN_FIELDS, jit_pipeline=jit_pipelines.SDPA),
    # Decode over a paged K/V cache, few queries (q_len is run time), split-KV ready.
    # kv_type: the cache's element type (config_fields.DTYPES, the cache's dtype),
    # widened in registers, so caches of two types never share a kernel.
    Kernel("attn_decode", "attn_decode.c.j2", ATTN_FIELDS + (choice_field("kv_type", "", DTYPES),),
           jit_pipeline=jit_pipelines.DECODE),
)}


def check_values(family: str, values: Dict[str, int]) -> None:
    """Raises ValueError naming the field when values lack one or hold an illegal one."""
    kernel = KERNELS[family]
    missing = [f.name for f in kernel.fields if f.name not in values]
    if missing:
        raise ValueError(f"{family}: missing key fields {', '.join(missing)}")
    for f in kernel.fields:
        f.check(family, int(values[f.name]))


def default_tiles(family: str, target: Target, weight_type: int = 0) -> Dict[str, int]:
    """The key's tile fields at the target's defaults (none for a family without):
    a GEMM's kc and mc, the taller int8 block for int8 panels."""
    if family != "gemm":
        return {}
    int8 = WEIGHT_DTYPES.index("int8")
    return {"kc": target.gemm_kc, "mc": target.gemm_int8_mc if weight_type == int8 else target.gemm_mc}


def kernel_key(family: str, values: Dict[str, int], target: Target) -> str:
    kernel = KERNELS[family]
    parts: List[str] = [family]
    for f in kernel.fields:
        v = int(values[f.name])
        parts.append(f.prefix + (f.choices[v] if f.choices else str(v)))
    parts.append(target.name)
    return "-".join(parts)


def symbol_of_key(key: str) -> str:
    """C identifier of a key's entry point: sneppx_ + key with - and . as _."""
    return "sneppx_" + key.replace("-", "_").replace(".", "_")
