"""Every bound sneppx puts on a config, a kernel key or a forward call, once.

Rendered at build time into the public header `sneppx/limits.h` (C code and
users read the SNEPPX_MAX_* macros there), into the runtime's config range
table (runtime/config.c walks it) and read here by sneppx-gen's own config
checks (config_json.validate) and by the kernel registry (kernels.py), whose
key ranges are written in terms of these constants. Change a bound here and
every language follows.

Why each bound:
- MAX_DIM: any one dimension; keeps every product of two dimensions (and its
  byte count) far from int64 overflow.
- MAX_HEAD_DIM, MAX_LATENT_DIM: the largest attention head sizes the
  attention kernels are tested at (a kernel key's head_dim reaches
  MAX_LATENT_DIM + MAX_HEAD_DIM in absorbed MLA).
- HEAD_DIM_MULTIPLE: attention kernels step q/k and v dimensions in whole
  16-float tiles, whatever the vector width.
- MAX_POSITIONS: positions stay exact in double and far from int64 overflow.
- MAX_SEQ_LEN, MAX_TOKENS: a forward call's batch and seq_len each, and their
  product; tokens x any dimension stays far from overflow, and int32 lane
  arithmetic in the attention kernels stays exact.
- MAX_ACTIVATION_FLOATS: a forward call's activations (tokens x the floats a
  token keeps, templates/forward_checks.h.j2), far from size_t overflow.
"""
from dataclasses import dataclass
from typing import Tuple

MAX_DIM = 1 << 20
MAX_HEADS = 4096
MAX_HEAD_DIM = 256
MAX_LATENT_DIM = 2048
HEAD_DIM_MULTIPLE = 16
MAX_POSITIONS = 1 << 40
MAX_THREADS = 1024
MAX_SEQ_LEN = 1 << 24
MAX_TOKENS = 1 << 26
MAX_ACTIVATION_FLOATS = 1 << 40
NAME_MAX = 64

# (macro suffix, value, what it bounds) of sneppx/limits.h, in its order.
PUBLIC = (
    ("DIM", MAX_DIM, "any one dimension of a config (hidden_size, q_lora_rank, ...)"),
    ("HEADS", MAX_HEADS, "num_attention_heads"),
    ("HEAD_DIM", MAX_HEAD_DIM, "head_dim, rotary_dim and MLA's per-head dims"),
    ("LATENT_DIM", MAX_LATENT_DIM, "MLA's kv_lora_rank"),
    ("POSITIONS", MAX_POSITIONS, "max_position_embeddings, sliding_window and every position id"),
    ("THREADS", MAX_THREADS, "num_threads"),
    ("SEQ_LEN", MAX_SEQ_LEN, "a forward call's batch, and its seq_len"),
    ("TOKENS", MAX_TOKENS, "a forward call's batch x seq_len"),
)


@dataclass(frozen=True)
class ConfigRange:
    field: str        # sneppx_config member
    low: int
    high: int
    mla_only: bool = False


# sneppx_config_validate's ranges, in the order it checks them (so in the
# order both languages report the first problem).
CONFIG_RANGES: Tuple[ConfigRange, ...] = (
    ConfigRange("hidden_size", 1, MAX_DIM),
    ConfigRange("num_attention_heads", 1, MAX_HEADS),
    ConfigRange("max_position_embeddings", 1, MAX_POSITIONS),
    ConfigRange("sliding_window", 0, MAX_POSITIONS),
    ConfigRange("num_threads", 0, MAX_THREADS),
    ConfigRange("head_dim", 0, MAX_HEAD_DIM),
    ConfigRange("rotary_dim", 0, MAX_HEAD_DIM),
    ConfigRange("kv_lora_rank", HEAD_DIM_MULTIPLE, MAX_LATENT_DIM, mla_only=True),
    ConfigRange("q_lora_rank", 0, MAX_DIM, mla_only=True),
    ConfigRange("qk_nope_head_dim", 1, MAX_HEAD_DIM, mla_only=True),
    ConfigRange("qk_rope_head_dim", 2, MAX_HEAD_DIM, mla_only=True),
    ConfigRange("v_head_dim", HEAD_DIM_MULTIPLE, MAX_HEAD_DIM, mla_only=True),
)
