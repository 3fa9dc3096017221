"""HuggingFace config.json conventions: the rope_scaling dict, and the attention
fields of each supported model_type (MODELS.md §1 and §5-6)."""
import json
import math
import numbers
import os
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

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


def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise TypeError(f"{name}: expected a finite number, got {value!r}")
    return float(value)


def _whole(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != int(value):
        raise TypeError(f"{name}: expected an integer, got {value!r}")
    return int(value)


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


# max_position_embeddings of each transformers config class when the file omits it.
_DEFAULT_MAX_POSITIONS = {"llama": 2048, "mistral": 131072, "qwen2": 32768, "deepseek_v2": 2048}
SUPPORTED_MODEL_TYPES = tuple(_DEFAULT_MAX_POSITIONS)


def read_config_json(path: "os.PathLike[str] | str") -> Tuple[str, Dict[str, Any]]:
    """(name, LLMConfig keyword arguments) from a config.json file or a directory holding one."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        with open(path, encoding="utf-8") as stream:
            data = json.load(stream)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    model_type = data.get("model_type")
    if model_type not in _DEFAULT_MAX_POSITIONS:
        raise ValueError(f"{path}: model_type {model_type!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    for key in ("hidden_size", "num_attention_heads"):
        if data.get(key) is None:
            raise ValueError(f"{path}: missing {key!r}")

    def get(key: str, default: Any = None) -> Any:
        value = data.get(key)
        return default if value is None else value

    heads = data["num_attention_heads"]
    kwargs: Dict[str, Any] = dict(
        hidden_size=data["hidden_size"],
        num_attention_heads=heads,
        num_key_value_heads=get("num_key_value_heads", heads),
        head_dim=get("head_dim"),
        rope_theta=get("rope_theta", 10000.0),
        rope_scaling=data.get("rope_scaling"),
        max_position_embeddings=get("max_position_embeddings", _DEFAULT_MAX_POSITIONS[model_type]),
        partial_rotary_factor=get("partial_rotary_factor"),
    )
    if model_type in ("llama", "deepseek_v2"):
        kwargs["attention_bias"] = bool(get("attention_bias", False))
    elif model_type == "mistral":
        kwargs["bias"] = False
        kwargs["sliding_window"] = get("sliding_window")
    else:  # qwen2: biases hard-coded in Qwen2Attention, not a config field
        kwargs["qkv_bias"], kwargs["o_bias"] = True, False
        if data.get("use_sliding_window"):
            raise NotImplementedError(f"{path}: use_sliding_window true (Qwen2 per-layer windows) is not "
                                      f"supported")
    if model_type == "deepseek_v2":
        kwargs.update(q_lora_rank=get("q_lora_rank"), kv_lora_rank=data.get("kv_lora_rank"),
                      qk_nope_head_dim=data.get("qk_nope_head_dim"),
                      qk_rope_head_dim=data.get("qk_rope_head_dim"), v_head_dim=data.get("v_head_dim"),
                      # The published weights rotate (x_2i, x_2i+1) pairs (MODELS.md §3).
                      rope_interleaved=True)
        kwargs.pop("head_dim")
        kwargs.pop("partial_rotary_factor")
    name = path.resolve().parent.name or model_type
    return name, kwargs
