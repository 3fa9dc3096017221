"""Architecture configs: the presets of gen/archs.json and hand-built configs.

An `Arch` mirrors `sneppx_config` (include/sneppx/config.h) field by field, so
the preset table the runtime compiles and the configs the AOT generator
specializes are one data set. Field names and defaults follow HF config.json
and `sneppx_config_init()`.
"""
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from . import config_json, paths
from .config_json import ROPE_TYPES, ConfigError  # noqa: F401  (re-exported)


# sneppx_rope_scaling, as config_json reads it.
RopeScaling = config_json.RopeFields


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
    num_threads: int = 0

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
        """head_dim^-0.5; DeepSeek: (nope + rope)^-0.5 * mscale(factor, mscale_all_dim)^2 (docs/MODELS.md section 6)."""
        scale = self.resolved_head_dim ** -0.5
        rs = self.rope_scaling
        if self.is_mla and rs.type == ROPE_TYPES["yarn"] and rs.mscale_all_dim:
            mscale = 1.0 if rs.factor <= 1 else 0.1 * rs.mscale_all_dim * math.log(rs.factor) + 1.0
            scale *= mscale * mscale
        return scale


# Arch carries every field of the C struct (the reader's CConfig) beside its names.
_MISSING = {item.name for item in fields(config_json.CConfig)} - {item.name for item in fields(Arch)}
if _MISSING:
    raise TypeError(f"Arch lacks sneppx_config field(s) {sorted(_MISSING)} that config_json reads")


def arch_from_config(c: config_json.CConfig, name: str, family: str = "custom", size: str = "",
                     aliases: Tuple[str, ...] = ()) -> Arch:
    """The Arch of a validated config (config_json.read)."""
    arch = Arch(name=name, family=family, size=size, aliases=tuple(aliases),
                **{item.name: getattr(c, item.name) for item in fields(c)})
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
