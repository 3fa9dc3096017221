"""ctypes mirrors of the public C structs.

include/sneppx/config.h  -> RopeScaling, Config: rendered at build time from
    gen/sneppx_gen/config_fields.py (sneppx._config_fields; see sneppx._locate),
    with the field tables CONFIG_FIELDS and ROPE_SCALING_FIELDS
include/sneppx/layer.h   -> Weights, TensorRef, TypedWeights
include/sneppx/safetensors.h -> AttnTensor
The last two are written here, field for field in declaration order, as are
_kv_cache's and _tensor_parallel's structs; any change to those headers must be
repeated here. tests/python/test_config_fields.py pins every mirror to the C
layout (clang's) and the constants below to the headers' macros.
"""
import ctypes

from ._locate import rendered_module

_fields = rendered_module("_config_fields")
RopeScaling, Config = _fields.RopeScaling, _fields.Config
CONFIG_FIELDS, ROPE_SCALING_FIELDS = _fields.CONFIG_FIELDS, _fields.ROPE_SCALING_FIELDS
NAME_MAX = _fields.NAME_MAX                    # SNEPPX_NAME_MAX
ATTN_TENSORS_MAX = 12       # SNEPPX_ATTN_TENSORS_MAX
SYNTHETIC_SEED = 0x5EED5EED  # SNEPPX_SYNTHETIC_SEED

# sneppx_rope_type by value, and its HF names.
ROPE_TYPE_NAMES = dict(enumerate(_fields.ROPE_TYPES))
ROPE_DEFAULT = _fields.ROPE_TYPES.index("default")
# sneppx_dtype's names, by value (LLMConfig.weight_dtype, KVCache.dtype); the first
# ones are the weight types.
DTYPES = _fields.DTYPES
WEIGHT_DTYPES = _fields.WEIGHT_DTYPES


_float_p = ctypes.POINTER(ctypes.c_float)


class Weights(ctypes.Structure):
    _fields_ = [(name, _float_p) for name in (
        "q_proj_weight", "q_proj_bias",
        "k_proj_weight", "k_proj_bias",
        "v_proj_weight", "v_proj_bias",
        "o_proj_weight", "o_proj_bias",
        "q_a_proj_weight", "q_a_proj_bias",
        "q_a_layernorm_weight",
        "q_b_proj_weight",
        "kv_a_proj_with_mqa_weight", "kv_a_proj_with_mqa_bias",
        "kv_a_layernorm_weight",
        "kv_b_proj_weight",
    )]


class TensorRef(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int)]   # sneppx_dtype is an enum: an int


class TypedWeights(ctypes.Structure):
    _fields_ = [(name, TensorRef) for name, _ in Weights._fields_]


class AttnTensor(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("rank", ctypes.c_int),
        ("shape", ctypes.c_int64 * 2),
        ("weights_offset", ctypes.c_size_t),
    ]
