"""Architecture configs: the presets of gen/archs.json and hand-built configs.

An `Arch` mirrors `sneppx_config` (include/sneppx/config.h) field by field, so
the preset table the runtime compiles and the configs the AOT generator
specializes are one data set. Field names and defaults follow HF config.json
and `sneppx_config_init()`.
"""
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from . import paths

# sneppx_rope_type, by the names HF uses in rope_scaling["rope_type" | "type"].
ROPE_TYPES = {"default": 0, "linear": 1, "dynamic": 2, "llama3": 3, "yarn": 4}


class ConfigError(ValueError):
    """A config (preset or hand-built) that sneppx cannot represent."""


@dataclass(frozen=True)
class RopeScaling:
    type: int = 0
    factor: float = 1.0
    low_freq_factor: float = 0.0
    high_freq_factor: float = 0.0
    original_max_position_embeddings: int = 0
    beta_fast: float = 0.0
    beta_slow: float = 0.0
    mscale: float = 0.0
    mscale_all_dim: float = 0.0
    attention_factor: float = 0.0


@dataclass(frozen=True)
class Arch:
    name: str
    family: str = "custom"
    size: str = ""
    aliases: Tuple[str, ...] = ()
    hidden_size: int = 0
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    rotary_dim: int = 0
    rope_interleaved: int = 0
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position_embeddings: int = 4096
    sliding_window: int = 0
    qkv_bias: int = 1
    o_bias: int = 1
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rms_norm_eps: float = 1e-6
    use_flash_attn: int = 1

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def resolved_head_dim(self) -> int:
        """Q/K dim of one head (MLA: nope + rope)."""
        if self.is_mla:
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def resolved_v_head_dim(self) -> int:
        return self.v_head_dim if self.is_mla else self.resolved_head_dim

    @property
    def resolved_rotary_dim(self) -> int:
        if self.is_mla:
            return self.qk_rope_head_dim
        return self.rotary_dim or self.resolved_head_dim

    @property
    def group(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def sanitized_name(self) -> str:
        """The name as a C identifier part: llama3.1-8B -> llama3_1_8b."""
        return "".join(c if c.isalnum() else "_" for c in self.name.lower())

    def softmax_scale(self) -> float:
        """head_dim^-0.5; DeepSeek: (nope + rope)^-0.5 * mscale(factor, mscale_all_dim)^2 (MODELS.md 2)."""
        scale = self.resolved_head_dim ** -0.5
        rs = self.rope_scaling
        if self.is_mla and rs.type == ROPE_TYPES["yarn"] and rs.mscale_all_dim:
            mscale = 1.0 if rs.factor <= 1 else 0.1 * rs.mscale_all_dim * math.log(rs.factor) + 1.0
            scale *= mscale * mscale
        return scale


def _number(value, name: str, kind=float):
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name}: expected a number, got {value!r}")
    if kind is int:
        if float(value) != int(value):
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        return int(value)
    return float(value)


def _rope_scaling(raw: Optional[dict], where: str) -> RopeScaling:
    if not raw:
        return RopeScaling()
    kind = raw.get("rope_type", raw.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ConfigError(f"{where}.rope_scaling: unknown type {kind!r} (known: {', '.join(ROPE_TYPES)})")
    values = {"type": ROPE_TYPES[kind]}
    for name, kind_of in (("factor", float), ("low_freq_factor", float), ("high_freq_factor", float),
                          ("original_max_position_embeddings", int), ("beta_fast", float),
                          ("beta_slow", float), ("mscale", float), ("mscale_all_dim", float),
                          ("attention_factor", float)):
        if raw.get(name) is not None:
            values[name] = _number(raw[name], f"{where}.rope_scaling.{name}", kind_of)
    if values["type"] == ROPE_TYPES["yarn"]:
        # HF's and DeepSeek's defaults; other types leave them 0, as the runtime's config.json reader does.
        values.setdefault("beta_fast", 32.0)
        values.setdefault("beta_slow", 1.0)
    return RopeScaling(**values)


def _biases(raw: dict) -> Tuple[int, int]:
    """(qkv_bias, o_bias): explicit keys first, then the model type's rule, then the spec default (on)."""
    if "bias" in raw:
        return int(bool(raw["bias"])), int(bool(raw["bias"]))
    model_type = raw.get("model_type")
    if model_type == "qwen2":          # hard-coded in Qwen2Attention
        qkv, o = 1, 0
    elif model_type == "mistral":      # hard-coded bias=False in MistralAttention
        qkv = o = 0
    elif model_type in ("llama", "deepseek_v2"):
        qkv = o = int(bool(raw.get("attention_bias", False)))
    elif "attention_bias" in raw:
        qkv = o = int(bool(raw["attention_bias"]))
    else:
        qkv, o = 1, 1
    if "qkv_bias" in raw:
        qkv = int(bool(raw["qkv_bias"]))
    if "o_bias" in raw:
        o = int(bool(raw["o_bias"]))
    return qkv, o


def kv_lora_rank_of(raw: dict) -> int:
    value = raw.get("kv_lora_rank")
    return 0 if value is None else int(value)


def arch_from_dict(raw: dict, name: str, family: str = "custom", size: str = "",
                   aliases: Tuple[str, ...] = ()) -> Arch:
    """An Arch from HF config.json fields (plus sneppx's "bias", "qkv_bias",
    "o_bias", "use_flash_attn"). Raises ConfigError naming the bad field."""
    def get_int(key: str, default: int = 0) -> int:
        value = raw.get(key)
        return default if value is None else _number(value, f"{name}.{key}", int)

    hidden = get_int("hidden_size")
    heads = get_int("num_attention_heads")
    if hidden <= 0 or heads <= 0:
        raise ConfigError(f"{name}: hidden_size and num_attention_heads must be > 0")
    kv_heads = get_int("num_key_value_heads", heads)
    kv_lora = get_int("kv_lora_rank")
    window = get_int("sliding_window")
    if raw.get("model_type") == "qwen2" or "use_sliding_window" in raw:
        # Qwen2 windows only the layers listed in layer_types, and only with use_sliding_window.
        if raw.get("use_sliding_window"):
            raise ConfigError(f"{name}.use_sliding_window: true (per-layer windows) is not supported")
        window = 0
    head_dim = get_int("head_dim")
    rotary_dim = get_int("rotary_dim")
    if raw.get("partial_rotary_factor") is not None and kv_lora_rank_of(raw) == 0:
        factor = _number(raw["partial_rotary_factor"], f"{name}.partial_rotary_factor")
        if not 0.0 < factor <= 1.0:
            raise ConfigError(f"{name}.partial_rotary_factor: {factor} must be in (0, 1]")
        rotary_dim = int((head_dim or hidden // heads) * factor)
        if rotary_dim < 2:
            raise ConfigError(f"{name}.partial_rotary_factor: {factor} rotates no dimension pair")
    qkv_bias, o_bias = _biases(raw)
    theta = raw.get("rope_theta")
    arch = Arch(
        name=name, family=family, size=size, aliases=tuple(aliases),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        rope_interleaved=1 if kv_lora > 0 else int(bool(raw.get("rope_interleaved", False))),
        rope_theta=10000.0 if theta is None else _number(theta, f"{name}.rope_theta"),
        rope_scaling=_rope_scaling(raw.get("rope_scaling"), name),
        max_position_embeddings=get_int("max_position_embeddings", 4096),
        sliding_window=window,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        q_lora_rank=get_int("q_lora_rank"),
        kv_lora_rank=kv_lora,
        qk_nope_head_dim=get_int("qk_nope_head_dim"),
        qk_rope_head_dim=get_int("qk_rope_head_dim"),
        v_head_dim=get_int("v_head_dim"),
        rms_norm_eps=_number(raw.get("rms_norm_eps", 1e-6), f"{name}.rms_norm_eps"),
        use_flash_attn=int(bool(raw.get("use_flash_attn", True))),
    )
    if arch.is_mla:
        # DeepSeek: the rope part of each head rotates as interleaved pairs (MODELS.md 3).
        arch = replace(arch, head_dim=arch.resolved_head_dim, rotary_dim=arch.qk_rope_head_dim,
                        rope_interleaved=1)
    validate(arch)
    return arch


def validate(arch: Arch) -> None:
    """The checks that decide whether kernels can be generated (the runtime's
    sneppx_config_validate has the same rules)."""
    if arch.is_mla:
        return
    if arch.num_key_value_heads <= 0 or arch.num_attention_heads % arch.num_key_value_heads:
        raise ConfigError(f"{arch.name}: num_key_value_heads {arch.num_key_value_heads} does not divide "
                          f"num_attention_heads {arch.num_attention_heads}")
    if not arch.head_dim and arch.hidden_size % arch.num_attention_heads:
        raise ConfigError(f"{arch.name}: hidden_size {arch.hidden_size} is not a multiple of "
                          f"num_attention_heads {arch.num_attention_heads}")
    head_dim = arch.resolved_head_dim
    if head_dim % 16 or not 16 <= head_dim <= 256:
        raise ConfigError(f"{arch.name}: head_dim {head_dim} is not supported (a multiple of 16 from 16 to 256)")
    rotary = arch.resolved_rotary_dim
    if rotary % 2 or rotary > head_dim:
        raise ConfigError(f"{arch.name}: rotary_dim {rotary} must be even and at most head_dim {head_dim}")
    if arch.sliding_window < 0:
        raise ConfigError(f"{arch.name}: sliding_window must be >= 0")


def load_presets(path: Path = paths.ARCHS_JSON) -> List[Arch]:
    with open(path) as f:
        data = json.load(f)
    presets = []
    for raw in data["presets"]:
        name = f"{raw['family']}-{raw['size']}"
        presets.append(arch_from_dict(raw, name, raw["family"], raw["size"], tuple(raw.get("aliases", ()))))
    return presets


def find_preset(name: str, presets: Optional[List[Arch]] = None) -> Optional[Arch]:
    """The preset whose name or alias equals name, case-insensitively."""
    wanted = name.lower()
    for arch in presets if presets is not None else load_presets():
        if arch.name.lower() == wanted or any(a.lower() == wanted for a in arch.aliases):
            return arch
    return None


def load_config_file(path: str) -> Arch:
    with open(path) as f:
        try:
            raw = json.load(f)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path}: not JSON: {error}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    name = raw.get("name") or Path(path).stem
    return arch_from_dict(raw, str(name))


def preset_summary(arch: Arch) -> Dict[str, object]:
    return {
        "hidden": arch.hidden_size, "heads": arch.num_attention_heads, "kv_heads": arch.num_key_value_heads,
        "head_dim": arch.resolved_head_dim, "window": arch.sliding_window,
        "bias": "qkv" if arch.qkv_bias and not arch.o_bias else ("qkvo" if arch.qkv_bias else "none"),
        "mla": arch.is_mla,
    }
