"""The one list of sneppx_config's fields (include/sneppx/config.h).

Every other description of the config is taken from here:
- at build time, `sneppx-gen build config-fields` renders the C check that pins
  the public header to this list (offset, size and type of every field, and
  the struct's size) and sneppx_config_init()'s defaults; `sneppx-gen build
  python-fields` renders the ctypes structs and field table of the sneppx
  Python package (the module sneppx._config_fields, which _structs.py,
  LLMConfig and _hf.py use);
- gen's Arch (archs.py), its config reader's CConfig (config_json.py) and the
  runtime's preset table (tables.py) are built from it.

The header stays hand-written: it is the C API's documentation. A field added
here and not there (or the reverse) fails the build, and
tests/python/test_config_fields.py compares the two lists name by name.

A field says how HF config.json gives it (`hf`): as a key of the same name
("key"), or derived (the text says from what); "-" for execution fields that
no config.json holds. `python` says how sneppx.LLMConfig shows it: "value",
"none_if_0" (0 means unset: None), "flag" (a 0 / 1 int shown as a bool), "dtype" (a
sneppx_dtype shown by its name in DTYPES), or
"own" (the class computes it); a setter, where there is one, is the class's.
"""
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from types import SimpleNamespace
from typing import Any, List, Tuple


# Sizes and alignments are LP64's (x86-64 and AArch64 Linux), as both the C
# compiler and ctypes lay them out.
@dataclass(frozen=True)
class CType:
    name: str         # as include/sneppx/config.h spells it
    size: int
    align: int
    ctypes: str       # the ctypes type, as Python source
    python: type      # the Python value type gen's dataclasses hold


INT64 = CType("int64_t", 8, 8, "ctypes.c_int64", int)
INT = CType("int", 4, 4, "ctypes.c_int", int)
DOUBLE = CType("double", 8, 8, "ctypes.c_double", float)
ROPE_TYPE = CType("sneppx_rope_type", 4, 4, "ctypes.c_int", int)
DTYPE = CType("sneppx_dtype", 4, 4, "ctypes.c_int", int)
NAME_MAX = 64   # SNEPPX_NAME_MAX
NAME = CType("char[SNEPPX_NAME_MAX]", NAME_MAX, 1, "ctypes.c_char * NAME_MAX", str)


@dataclass(frozen=True)
class Field:
    name: str
    c_type: CType
    default: Any      # sneppx_config_init()'s value
    doc: str
    hf: str = "key"   # "key": config.json's key of the same name; "-": none; else how it is derived
    python: str = "value"
    used_by: Tuple[str, ...] = ()   # rope_scaling: the rope types whose formulas read it
    required_by: Tuple[str, ...] = ()  # rope_scaling: the rope types whose dicts must give it
    type_defaults: Tuple[Tuple[str, Any], ...] = ()  # rope_scaling: (type, value) absent from that type's dict
    required: bool = False  # a config.json, a hand config and LLMConfig must give it
    default_from: str = ""  # absent from them: this other field's value


# sneppx_dtype's values, by name (numpy's and torch's): the storage types of GEMM
# weights (weight_dtype) and of the KV cache. GEMM and attn_decode keys carry them
# too (kernels.py), in this order. WEIGHT_DTYPES: the types weights take (every
# one, today; a cache-only type would stop it there).
DTYPES = ("float32", "bfloat16", "float16", "int8")
WEIGHT_DTYPES = DTYPES
# Bytes of one element of each (int8 weight panels also hold a float32 scale per
# group of k: templates/abi.h.j2's sneppx_gemm_panel_bytes sizes panels; an int8
# cache row one per row: runtime/kv_cache_internal.h).
DTYPE_BYTES = (4, 2, 2, 1)
# The C type of one element of each, as a vendored layer's cache pointers hold it
# (bfloat16 and float16 as their 16 bits).
DTYPE_C_TYPES = ("float", "uint16_t", "uint16_t", "int8_t")

# sneppx_rope_type's values, by HF name.
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")

# sneppx_rope_scaling: HF's rope_scaling dict, whose keys are the field names but
# for "type" (HF's "rope_type", or "type" in older files). LLMConfig.rope_scaling
# shows the fields its type uses, but a 0 of a "none_if_0" one.
ROPE_SCALING_FIELDS: Tuple[Field, ...] = (
    Field("type", ROPE_TYPE, 0, "sneppx_rope_type", hf="rope_type (or type), by name",
          used_by=ROPE_TYPES),
    Field("factor", DOUBLE, 1.0, "scaling factor", used_by=("linear", "dynamic", "llama3", "yarn"),
          required_by=("linear", "dynamic", "llama3", "yarn")),
    Field("low_freq_factor", DOUBLE, 0.0, "", used_by=("llama3",), required_by=("llama3",)),
    Field("high_freq_factor", DOUBLE, 0.0, "", used_by=("llama3",), required_by=("llama3",)),
    Field("original_max_position_embeddings", INT64, 0, "0 = max_position_embeddings", used_by=("llama3", "yarn"),
          required_by=("llama3",)),
    # YaRN's correction range defaults (HF and DeepSeek agree).
    Field("beta_fast", DOUBLE, 0.0, "correction range, fast end (absent from a yarn dict: YaRN's default)",
          used_by=("yarn",), type_defaults=(("yarn", 32.0),)),
    Field("beta_slow", DOUBLE, 0.0, "correction range, slow end (absent from a yarn dict: YaRN's default)",
          used_by=("yarn",), type_defaults=(("yarn", 1.0),)),
    Field("mscale", DOUBLE, 0.0, "0 = unset", python="none_if_0", used_by=("yarn",)),
    # MLA's softmax scale reads it beside every scaled type (DeepSeek's code and transformers'
    # DeepseekV2Attention take it from any rope_scaling but the default).
    Field("mscale_all_dim", DOUBLE, 0.0, "0 = unset", python="none_if_0",
          used_by=("linear", "dynamic", "llama3", "yarn")),
    Field("attention_factor", DOUBLE, 0.0, "explicit cos/sin factor (0 = derive)", python="none_if_0",
          used_by=("yarn",)),
)

# The parameters: every field but the type. A rope_scaling dict gives each as the key of
# its name, or, absent, rope_absent(); sneppx_config_validate requires ROPE_FINITE finite
# (factor has its own rule: > 0 where the type reads it).
ROPE_PARAMETERS: Tuple[Field, ...] = ROPE_SCALING_FIELDS[1:]
ROPE_FINITE: Tuple[Field, ...] = tuple(f for f in ROPE_PARAMETERS if f.c_type is DOUBLE and f.name != "factor")
# The keys a rope_scaling dict may hold: HF's "rope_type" (or "type"), the parameters,
# and "truncate" (only true: YaRN with floor/ceil of the correction range).
ROPE_KEYS: Tuple[str, ...] = ("rope_type",) + tuple(f.name for f in ROPE_SCALING_FIELDS) + ("truncate",)


def rope_absent(f: Field, rope_type: str) -> Any:
    """A parameter's value when a dict of rope_type lacks it."""
    return dict(f.type_defaults).get(rope_type, f.default)


def rope_required(rope_type: str) -> Tuple[str, ...]:
    """The keys a dict of rope_type must give, in field order."""
    return tuple(f.name for f in ROPE_PARAMETERS if rope_type in f.required_by)


# Its size and alignment are its fields' (type_size_align).
ROPE_SCALING = CType("sneppx_rope_scaling", 0, 0, "RopeScaling", object)

CONFIG_FIELDS: Tuple[Field, ...] = (
    Field("name", NAME, "custom", '"llama3-8B" for presets, "custom" otherwise',
          hf="model_type (LLMConfig.from_config_json: the file's directory)", python="own"),
    Field("hidden_size", INT64, 0, "model width", required=True),
    Field("num_attention_heads", INT64, 0, "query heads", required=True),
    Field("num_key_value_heads", INT64, 0, "K/V heads", default_from="num_attention_heads"),
    Field("head_dim", INT64, 0, "0 = hidden_size / num_attention_heads", python="own"),
    Field("rotary_dim", INT64, 0, "0 = whole head (partial rotary if smaller)",
          hf="none: the whole head (LLMConfig takes partial_rotary_factor)", python="own"),
    Field("rope_interleaved", INT, 0, "0 = HF rotate_half pairs (i, i+d/2); 1 = (2i, 2i+1) (DeepSeek)",
          hf="1 for deepseek_v2, else 0", python="flag"),
    Field("rope_theta", DOUBLE, 10000.0, "RoPE base"),
    Field("rope_scaling", ROPE_SCALING, None, "HF's rope_scaling dict", hf="rope_scaling (a dict)",
          python="own"),
    Field("max_position_embeddings", INT64, 4096, "positions the model was trained for "
          "(config.json absent: the model type's transformers default)"),
    Field("sliding_window", INT64, 0, "0 = none; else W keys including the query itself",
          hf="sliding_window (mistral only)", python="none_if_0"),
    Field("qkv_bias", INT, 1, "q/k/v projections carry a bias (a hand config: on by default)",
          hf="attention_bias (llama, deepseek_v2); 1 for qwen2; 0 for mistral", python="flag"),
    Field("o_bias", INT, 1, "o projection carries a bias",
          hf="attention_bias (llama, deepseek_v2); 0 for qwen2, mistral", python="flag"),
    Field("q_lora_rank", INT64, 0, "MLA: 0 = plain q_proj", hf="q_lora_rank (deepseek_v2)", python="none_if_0"),
    Field("kv_lora_rank", INT64, 0, "MLA: > 0 turns it on", hf="kv_lora_rank (deepseek_v2)", python="none_if_0"),
    Field("qk_nope_head_dim", INT64, 0, "MLA", hf="qk_nope_head_dim (deepseek_v2)", python="none_if_0"),
    Field("qk_rope_head_dim", INT64, 0, "MLA", hf="qk_rope_head_dim (deepseek_v2)", python="none_if_0"),
    Field("v_head_dim", INT64, 0, "MLA", hf="v_head_dim (deepseek_v2)", python="none_if_0"),
    Field("mla_naive", INT, 0, "1 = expand kv_b_proj to per-head K/V (verification); MLA only", hf="-",
          python="flag"),
    Field("use_flash_attn", INT, 1, "1 = flash, 0 = materialized SDPA", hf="-", python="flag"),
    Field("num_threads", INT, 0, "0 = OpenMP default", hf="-"),
    Field("weight_dtype", DTYPE, 0, "storage type of the projections' weights (float32, bfloat16, float16, int8); "
          "biases and norm weights stay float32, products accumulate in float32", hf="-", python="dtype"),
    # Opt-in: it changes the numbers (the activations entering each projection are rounded).
    Field("compute_dtype", DTYPE, 0, "what the projections multiply in: float32, or bfloat16 (with bfloat16 "
          "weights, on AVX512_BF16 hosts: activations rounded to bfloat16, sums in float32)", hf="-",
          python="dtype"),
)


# ---- layout: the C compiler's (and ctypes') rules for these types ---------------------

def _round_up(value: int, align: int) -> int:
    return (value + align - 1) // align * align


def layout(fields: Tuple[Field, ...]) -> Tuple[List[Tuple[Field, int]], int]:
    """[(field, offset)] in order, and the struct's size."""
    offset, align, out = 0, 1, []
    for f in fields:
        size, field_align = type_size_align(f.c_type)
        offset = _round_up(offset, field_align)
        out.append((f, offset))
        offset += size
        align = max(align, field_align)
    return out, _round_up(offset, align)


def type_size_align(c_type: CType) -> Tuple[int, int]:
    if c_type is ROPE_SCALING:
        return layout(ROPE_SCALING_FIELDS)[1], max(f.c_type.align for f in ROPE_SCALING_FIELDS)
    return c_type.size, c_type.align


# ---- the Python objects gen holds a config in ----------------------------------------------

def dataclass_fields(fields: Tuple[Field, ...], rope_scaling_type: type) -> List[Tuple[str, type, Any]]:
    """(name, type, dataclasses.field) triples for dataclasses.make_dataclass."""
    out = []
    for f in fields:
        if f.c_type is ROPE_SCALING:
            out.append((f.name, rope_scaling_type, dataclass_field(default_factory=rope_scaling_type)))
        else:
            out.append((f.name, f.c_type.python, dataclass_field(default=f.default)))
    return out


def defaults() -> Any:
    """An object with every field's default as an attribute (rope_scaling: its fields')."""
    values = {f.name: f.default for f in CONFIG_FIELDS}
    values["rope_scaling"] = SimpleNamespace(**{f.name: f.default for f in ROPE_SCALING_FIELDS})
    return SimpleNamespace(**values)
