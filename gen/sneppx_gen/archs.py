"""Architecture configs: the presets of gen/archs.json and hand-built configs.

An `Arch` mirrors `sneppx_config` (include/sneppx/config.h) field by field, so
the preset table the runtime compiles and the configs the AOT generator
specializes are one data set. Field names and defaults follow HF config.json
and `sneppx_config_init()`.
"""
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from . import config_json, paths
from .config_json import ROPE_TYPES, ConfigError  # noqa: F401  (re-exported)


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


def arch_from_config(c: config_json.CConfig, name: str, family: str = "custom", size: str = "",
                     aliases: Tuple[str, ...] = ()) -> Arch:
    """The Arch of a validated config (config_json.read)."""
    rs = c.rope_scaling
    arch = Arch(
        name=name, family=family, size=size, aliases=tuple(aliases),
        hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, rotary_dim=c.rotary_dim,
        rope_interleaved=c.rope_interleaved, rope_theta=c.rope_theta,
        rope_scaling=RopeScaling(type=rs.type, factor=rs.factor, low_freq_factor=rs.low_freq_factor,
                                 high_freq_factor=rs.high_freq_factor,
                                 original_max_position_embeddings=rs.original_max_position_embeddings,
                                 beta_fast=rs.beta_fast, beta_slow=rs.beta_slow, mscale=rs.mscale,
                                 mscale_all_dim=rs.mscale_all_dim, attention_factor=rs.attention_factor),
        max_position_embeddings=c.max_position_embeddings, sliding_window=c.sliding_window,
        qkv_bias=c.qkv_bias, o_bias=c.o_bias, q_lora_rank=c.q_lora_rank, kv_lora_rank=c.kv_lora_rank,
        qk_nope_head_dim=c.qk_nope_head_dim, qk_rope_head_dim=c.qk_rope_head_dim, v_head_dim=c.v_head_dim,
        use_flash_attn=c.use_flash_attn,
    )
    if arch.is_mla:
        # The preset table and the AOT layer carry MLA's Q/K head dim and rope dim explicitly.
        arch = replace(arch, head_dim=arch.resolved_head_dim, rotary_dim=arch.qk_rope_head_dim)
    return arch


def load_presets(path: Path = paths.ARCHS_JSON) -> List[Arch]:
    """gen/archs.json's presets, each read as a hand config (config_json.read_hand) and validated."""
    with open(path, "rb") as f:
        data = config_json.parse(f.read())
    scope = config_json.Scope(data, "")
    presets = []
    for index, raw in enumerate(scope.lookup("presets")):
        where = config_json.Scope(raw, "")
        name = f"{where.string('family')}-{where.string('size')}"
        try:
            c = config_json.read(raw)
        except ConfigError as error:
            raise ConfigError(f"{path}: presets[{index}] ({name}): {error}") from None
        aliases = raw.first("aliases")[1] or ()
        presets.append(arch_from_config(c, name, where.string("family"), where.string("size"), tuple(aliases)))
    return presets


def find_preset(name: str, presets: Optional[List[Arch]] = None) -> Optional[Arch]:
    """The preset whose name or alias equals name, case-insensitively."""
    wanted = name.lower()
    for arch in presets if presets is not None else load_presets():
        if arch.name.lower() == wanted or any(a.lower() == wanted for a in arch.aliases):
            return arch
    return None


def load_config_file(path: str) -> Arch:
    """The Arch of a config file (an HF config.json, or sneppx's hand form); refuses what the
    runtime refuses (config_json), with ConfigError / OSError naming the file and the field."""
    root, c = config_json.read_file(path)
    name = root.first("name")[1]
    if not isinstance(name, str) or not name.split("\0", 1)[0]:
        name = Path(path).stem
    return arch_from_config(c, name.split("\0", 1)[0])


def preset_summary(arch: Arch) -> Dict[str, object]:
    return {
        "hidden": arch.hidden_size, "heads": arch.num_attention_heads, "kv_heads": arch.num_key_value_heads,
        "head_dim": arch.resolved_head_dim, "window": arch.sliding_window,
        "bias": "qkv" if arch.qkv_bias and not arch.o_bias else ("qkvo" if arch.qkv_bias else "none"),
        "mla": arch.is_mla,
    }
