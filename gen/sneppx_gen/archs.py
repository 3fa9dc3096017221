"""Architecture configs: the presets of gen/archs.json and hand-built configs.

An `Arch` is a `sneppx_config` (include/sneppx/config.h) with a preset's
family, size and aliases: its fields are config_fields.CONFIG_FIELDS, so the
preset table the runtime compiles and the configs the AOT generator
specializes are one data set. Defaults are sneppx_config_init()'s.
"""
from dataclasses import field, fields, make_dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from . import config_fields, config_json, paths
from .config_json import ROPE_TYPES, ConfigError  # noqa: F401  (re-exported)


# sneppx_rope_scaling, as config_json reads it.
RopeScaling = config_json.RopeFields


class _ArchMethods:
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
        return "".join(c if c.isascii() and c.isalnum() else "_" for c in self.name.lower())

    def softmax_scale(self) -> float:
        """config_json.softmax_scale: runtime/config.c's sneppx_config_softmax_scale."""
        return config_json.softmax_scale(self)


# The preset's names first (name, the C struct's first field, is the CLI name), then the
# rest of sneppx_config.
Arch = make_dataclass(
    "Arch",
    [config_fields.dataclass_fields(config_fields.CONFIG_FIELDS[:1], RopeScaling)[0],
     ("family", str, field(default="custom")), ("size", str, field(default="")),
     ("aliases", Tuple[str, ...], field(default=()))]
    + config_fields.dataclass_fields(config_fields.CONFIG_FIELDS[1:], RopeScaling),
    bases=(_ArchMethods,), frozen=True)


def arch_from_config(c: config_json.CConfig, name: str, family: str = "custom", size: str = "",
                     aliases: Tuple[str, ...] = ()) -> Arch:
    """The Arch of a validated config (config_json.read)."""
    values = {item.name: getattr(c, item.name) for item in fields(c)}
    values.update(name=name, family=family, size=size, aliases=tuple(aliases))
    arch = Arch(**values)
    # The preset table and the AOT layer carry the Q/K head dim (and MLA's rope dim) explicitly.
    arch = replace(arch, head_dim=arch.resolved_head_dim)
    if arch.is_mla:
        arch = replace(arch, rotary_dim=arch.qk_rope_head_dim)
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
        for text in (name, *aliases):
            problem = config_json.name_problem(text)
            if problem:
                raise ConfigError(f"{path}: presets[{index}]: name {text!r}: {problem}")
        presets.append(arch_from_config(c, name, where.string("family"), where.string("size"), tuple(aliases)))
    return presets


def find_preset(name: str, presets: Optional[List[Arch]] = None) -> Optional[Arch]:
    """The preset whose name or alias equals name, case-insensitively."""
    wanted = name.lower()
    for arch in presets if presets is not None else load_presets():
        if arch.name.lower() == wanted or any(a.lower() == wanted for a in arch.aliases):
            return arch
    return None


def renamed(arch: Arch, name: str) -> Arch:
    """arch under the name given by --name (a C-rule name, ConfigError otherwise)."""
    problem = config_json.name_problem(name) if name else "empty"
    if problem:
        raise ConfigError(f"--name: {problem}")
    return replace(arch, name=name)


def load_config_file(path: str, name: Optional[str] = None) -> Arch:
    """The Arch of a config file (an HF config.json, or sneppx's hand form) or of a checkpoint
    directory (its config.json); refuses what the runtime refuses (config_json), with
    ConfigError / OSError naming the file and the field. The Arch's name is `name`, else the
    file's "name", else the checkpoint directory's name (a file called config.json is named
    after its directory, never "config"), else the file's stem."""
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    root, c = config_json.read_file(str(file))
    if name is not None:
        return renamed(arch_from_config(c, "config"), name)
    fallback = file.resolve().parent.name if file.name == "config.json" else file.stem
    try:
        name = config_json.read_name(root, fallback)
    except ConfigError as error:
        raise ConfigError(f"{file}: {error}") from None
    return arch_from_config(c, name)


def preset_summary(arch: Arch) -> Dict[str, object]:
    return {
        "hidden": arch.hidden_size, "heads": arch.num_attention_heads, "kv_heads": arch.num_key_value_heads,
        "head_dim": arch.resolved_head_dim, "window": arch.sliding_window,
        "bias": "qkv" if arch.qkv_bias and not arch.o_bias else ("qkvo" if arch.qkv_bias else "none"),
        "mla": arch.is_mla,
    }
