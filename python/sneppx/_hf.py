"""HuggingFace conventions on the Python side: the rope_scaling dict of the
constructor (docs/MODELS.md section 7), and the constructor arguments of a C config. A
config.json file itself is read by the C runtime (sneppx_config_from_json,
runtime/config_json.c)."""
import math
import numbers
from typing import Any, Dict, Mapping, Optional

import numpy as np

from . import _structs as S

ROPE_TYPES = {"default": S.ROPE_DEFAULT, "linear": S.ROPE_LINEAR, "dynamic": S.ROPE_DYNAMIC,
              "llama3": S.ROPE_LLAMA3, "yarn": S.ROPE_YARN}
_ROPE_KEYS = ("rope_type", "type", "factor", "low_freq_factor", "high_freq_factor",
              "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
              "mscale_all_dim", "attention_factor", "truncate")
# Keys each rope type requires (HF's rope validation asks for the same).
_ROPE_REQUIRED = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
                  "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                             "original_max_position_embeddings")}
# YaRN's correction range defaults (HF and DeepSeek agree).
_YARN_BETA_FAST, _YARN_BETA_SLOW = 32.0, 1.0


# Ranges of the C struct fields Python integers are stored in (ctypes would wrap them silently).
INT64_MAX = 2 ** 63 - 1
INT64_MIN = -2 ** 63
INT_MAX = 2 ** 31 - 1       # C int (sneppx_config.num_threads)


def c_count(name: str, value: Any, c_type: str = "int64") -> int:
    """A non-negative Python or numpy integer for a C int64_t (or int) field or argument:
    TypeError for anything else, ValueError naming name and the value when it is negative
    or beyond the C type (ctypes would store it modulo 2^64 / 2^32)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected an integer, got {value!r}")
    value = int(value)
    if value < 0:
        raise ValueError(f"{name}: {value} must be >= 0")
    maximum = INT64_MAX if c_type == "int64" else INT_MAX
    if value > maximum:
        raise ValueError(f"{name}: {value} does not fit in {c_type} (the C type; at most {maximum})")
    return value


def _real(name: str, value: Any) -> float:
    """A finite real for a C double: TypeError for a non-number, ValueError (naming name and
    the value) for NaN, infinities and integers beyond the double range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a finite number, got {value!r}")
    try:
        result = float(value)
    except OverflowError:
        raise ValueError(f"{name}: expected a finite number, got {value!r} (beyond the range of a C double)") \
            from None
    if not math.isfinite(result):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    return result


def _whole(name: str, value: Any) -> int:
    """An integer (or integral float, as JSON writes them) for a C int64_t field."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected an integer, got {value!r}")
    if isinstance(value, numbers.Integral):
        result = int(value)
    else:
        real = _real(name, value)
        if real != math.floor(real):
            raise TypeError(f"{name}: expected an integer, got {value!r}")
        result = int(real)
    if not INT64_MIN <= result <= INT64_MAX:
        raise ValueError(f"{name}: {value!r} does not fit in int64 (the C field's type)")
    return result


def fill_rope_scaling(scaling: S.RopeScaling, rope_scaling: Optional[Mapping[str, Any]]) -> None:
    """Fills the C struct from HF's rope_scaling dict (None = plain RoPE)."""
    scaling.type = S.ROPE_DEFAULT
    scaling.factor = 1.0
    if rope_scaling is None:
        return
    if not isinstance(rope_scaling, Mapping):
        raise TypeError(f"rope_scaling: expected a dict in HF config.json form or None, got {rope_scaling!r}")
    unknown = sorted(set(rope_scaling) - set(_ROPE_KEYS))
    if unknown:
        raise ValueError(f"rope_scaling: unknown key(s) {unknown}; known: {', '.join(_ROPE_KEYS)}")
    kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
    if "rope_type" in rope_scaling and "type" in rope_scaling and rope_scaling["type"] != kind:
        raise ValueError(f"rope_scaling: 'rope_type' {kind!r} and 'type' {rope_scaling['type']!r} disagree")
    if kind not in ROPE_TYPES:
        raise ValueError(f"rope_scaling: rope_type {kind!r} is not supported "
                         f"(supported: {', '.join(ROPE_TYPES)})")
    missing = [key for key in _ROPE_REQUIRED.get(kind, ()) if rope_scaling.get(key) is None]
    if missing:
        raise ValueError(f"rope_scaling: rope_type {kind!r} needs {', '.join(missing)}")
    if rope_scaling.get("truncate", True) is not True:
        raise NotImplementedError("rope_scaling: truncate=False (YaRN without floor/ceil) is not supported")

    def number(key: str, default: float = 0.0) -> float:
        value = rope_scaling.get(key)
        return default if value is None else _real(f"rope_scaling[{key!r}]", value)

    scaling.type = ROPE_TYPES[kind]
    scaling.factor = number("factor", 1.0)
    scaling.low_freq_factor = number("low_freq_factor")
    scaling.high_freq_factor = number("high_freq_factor")
    original = rope_scaling.get("original_max_position_embeddings")
    scaling.original_max_position_embeddings = (
        0 if original is None else _whole("rope_scaling['original_max_position_embeddings']", original))
    scaling.beta_fast = number("beta_fast", _YARN_BETA_FAST if kind == "yarn" else 0.0)
    scaling.beta_slow = number("beta_slow", _YARN_BETA_SLOW if kind == "yarn" else 0.0)
    scaling.mscale = number("mscale")
    scaling.mscale_all_dim = number("mscale_all_dim")
    scaling.attention_factor = number("attention_factor")


def rope_scaling_dict(scaling: S.RopeScaling) -> Optional[Dict[str, Any]]:
    """The HF rope_scaling dict of the C struct (None for plain RoPE): only the keys its type uses."""
    kind = S.ROPE_TYPE_NAMES.get(scaling.type, str(scaling.type))
    if scaling.type == S.ROPE_DEFAULT:
        return None
    result: Dict[str, Any] = {"rope_type": kind, "factor": scaling.factor}
    if scaling.type == S.ROPE_LLAMA3:
        result.update(low_freq_factor=scaling.low_freq_factor, high_freq_factor=scaling.high_freq_factor,
                      original_max_position_embeddings=scaling.original_max_position_embeddings)
    elif scaling.type == S.ROPE_YARN:
        if scaling.original_max_position_embeddings:
            result["original_max_position_embeddings"] = scaling.original_max_position_embeddings
        result.update(beta_fast=scaling.beta_fast, beta_slow=scaling.beta_slow)
        for key in ("mscale", "mscale_all_dim", "attention_factor"):
            if getattr(scaling, key):
                result[key] = getattr(scaling, key)
    return result


def constructor_kwargs(config: S.Config) -> Dict[str, Any]:
    """LLMConfig keyword arguments that rebuild the C struct config (from_config_json's
    overrides are applied to these)."""
    c = config
    kwargs: Dict[str, Any] = dict(
        name=c.name.decode("utf-8", "replace"), hidden_size=c.hidden_size,
        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
        head_dim=c.head_dim or None, rope_theta=c.rope_theta, rope_scaling=rope_scaling_dict(c.rope_scaling),
        max_position_embeddings=c.max_position_embeddings, sliding_window=c.sliding_window or None,
        qkv_bias=bool(c.qkv_bias), o_bias=bool(c.o_bias), q_lora_rank=c.q_lora_rank or None,
        kv_lora_rank=c.kv_lora_rank or None, qk_nope_head_dim=c.qk_nope_head_dim or None,
        qk_rope_head_dim=c.qk_rope_head_dim or None, v_head_dim=c.v_head_dim or None,
        rope_interleaved=bool(c.rope_interleaved), use_flash_attn=bool(c.use_flash_attn),
        mla_naive=bool(c.mla_naive), num_threads=c.num_threads)
    if c.rotary_dim and not c.kv_lora_rank:
        head_dim = c.head_dim or c.hidden_size // max(c.num_attention_heads, 1)
        factor = c.rotary_dim / head_dim
        if int(head_dim * factor) < c.rotary_dim:   # the constructor's int(head_dim * factor) rounds down
            factor = math.nextafter(factor, 2.0)
        kwargs["partial_rotary_factor"] = factor
    return kwargs
