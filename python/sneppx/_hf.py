"""HuggingFace conventions on the Python side: the rope_scaling dict of the
constructor (docs/MODELS.md section 7), and the constructor arguments of a C config. The
C runtime reads both a config.json file (sneppx_config_from_json) and the
constructor's rope_scaling dict (sneppx_rope_scaling_from_json,
runtime/config_json.c)."""
import ctypes
import json
import math
import numbers
from typing import Any, Dict, Mapping, Optional

import numpy as np

from . import _structs as S
from ._library import lib
from .errors import check


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


def _json_value(key: str, value: Any) -> Any:
    """A rope_scaling value as JSON carries it: what JSON cannot (NaN, infinities, other
    objects) is refused here, naming the key; the reader's rules are the C runtime's."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return _real(f"rope_scaling[{key!r}]", value)
    raise TypeError(f"rope_scaling[{key!r}]: expected a number, a string, a bool or None, got {value!r}")


def fill_rope_scaling(scaling: S.RopeScaling, rope_scaling: Optional[Mapping[str, Any]]) -> None:
    """Fills the C struct from HF's rope_scaling dict (None = plain RoPE), read by the C
    runtime (sneppx_rope_scaling_from_json): the rules and messages of config.json's."""
    if rope_scaling is not None and not isinstance(rope_scaling, Mapping):
        raise TypeError(f"rope_scaling: expected a dict in HF config.json form or None, got {rope_scaling!r}")
    if rope_scaling is None:
        text = b"null"
    else:
        for key in rope_scaling:
            if not isinstance(key, str):
                raise TypeError(f"rope_scaling: keys are strings, got {key!r}")
        text = json.dumps({key: _json_value(key, value) for key, value in rope_scaling.items()}).encode()
    check(lib.sneppx_rope_scaling_from_json(text, len(text), ctypes.byref(scaling)))


def rope_scaling_dict(scaling: S.RopeScaling) -> Optional[Dict[str, Any]]:
    """The HF rope_scaling dict of the C struct (None for plain RoPE): the fields its type
    uses (S.ROPE_SCALING_FIELDS' used_by), but a 0 meaning "unset"."""
    if scaling.type == S.ROPE_DEFAULT:
        return None
    kind = S.ROPE_TYPE_NAMES.get(scaling.type, str(scaling.type))
    result: Dict[str, Any] = {"rope_type": kind}
    for field in S.ROPE_SCALING_FIELDS:
        value = getattr(scaling, field.name)
        if field.name != "type" and kind in field.used_by and (value or field.python != "none_if_0"):
            result[field.name] = value
    return result


def constructor_kwargs(config: S.Config) -> Dict[str, Any]:
    """LLMConfig keyword arguments that rebuild the C struct config (from_config_json's
    overrides are applied to these): every field by its own name (flags as bools), but
    rotary_dim, which the constructor takes as partial_rotary_factor."""
    c = config
    kwargs: Dict[str, Any] = {}
    for field in S.CONFIG_FIELDS:
        value = getattr(c, field.name)
        if field.name == "name":
            value = value.decode("utf-8", "replace")
        elif field.name == "rope_scaling":
            value = rope_scaling_dict(value)
        elif field.python == "flag":
            value = bool(value)
        elif field.python == "dtype":
            value = S.DTYPES[value]
        if field.name != "rotary_dim":
            kwargs[field.name] = value
    if c.rotary_dim and not c.kv_lora_rank:
        head_dim = c.head_dim or c.hidden_size // max(c.num_attention_heads, 1)
        factor = c.rotary_dim / head_dim
        if int(head_dim * factor) < c.rotary_dim:   # the constructor's int(head_dim * factor) rounds down
            factor = math.nextafter(factor, 2.0)
        kwargs["partial_rotary_factor"] = factor
    return kwargs
