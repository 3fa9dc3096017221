"""ctypes mirrors of the public C structs, field for field in declaration order.

include/sneppx/config.h  -> RopeScaling, Config
include/sneppx/layer.h   -> Weights
include/sneppx/safetensors.h -> AttnTensor
Any change to those headers must be repeated here. tests/python/test_api.py
pins the layouts: Weights against the offsetof() values sneppx_attn_tensors()
reports, Config through presets whose every field is known.
"""
import ctypes

NAME_MAX = 64               # SNEPPX_NAME_MAX
ATTN_TENSORS_MAX = 12       # SNEPPX_ATTN_TENSORS_MAX
SYNTHETIC_SEED = 0x5EED5EED  # SNEPPX_SYNTHETIC_SEED

# sneppx_rope_type
ROPE_DEFAULT, ROPE_LINEAR, ROPE_DYNAMIC, ROPE_LLAMA3, ROPE_YARN = range(5)
ROPE_TYPE_NAMES = {ROPE_DEFAULT: "default", ROPE_LINEAR: "linear", ROPE_DYNAMIC: "dynamic",
                   ROPE_LLAMA3: "llama3", ROPE_YARN: "yarn"}


class RopeScaling(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("factor", ctypes.c_double),
        ("low_freq_factor", ctypes.c_double),
        ("high_freq_factor", ctypes.c_double),
        ("original_max_position_embeddings", ctypes.c_int64),
        ("beta_fast", ctypes.c_double),
        ("beta_slow", ctypes.c_double),
        ("mscale", ctypes.c_double),
        ("mscale_all_dim", ctypes.c_double),
        ("attention_factor", ctypes.c_double),
    ]


class Config(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * NAME_MAX),
        ("hidden_size", ctypes.c_int64),
        ("num_attention_heads", ctypes.c_int64),
        ("num_key_value_heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("rotary_dim", ctypes.c_int64),
        ("rope_interleaved", ctypes.c_int),
        ("rope_theta", ctypes.c_double),
        ("rope_scaling", RopeScaling),
        ("max_position_embeddings", ctypes.c_int64),
        ("sliding_window", ctypes.c_int64),
        ("qkv_bias", ctypes.c_int),
        ("o_bias", ctypes.c_int),
        ("q_lora_rank", ctypes.c_int64),
        ("kv_lora_rank", ctypes.c_int64),
        ("qk_nope_head_dim", ctypes.c_int64),
        ("qk_rope_head_dim", ctypes.c_int64),
        ("v_head_dim", ctypes.c_int64),
        ("mla_naive", ctypes.c_int),
        ("use_flash_attn", ctypes.c_int),
        ("num_threads", ctypes.c_int),
    ]


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


class AttnTensor(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("rank", ctypes.c_int),
        ("shape", ctypes.c_int64 * 2),
        ("weights_offset", ctypes.c_size_t),
    ]
