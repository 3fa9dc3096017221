"""Loading libsneppx (found by sneppx._locate), and the prototypes of the C functions the package calls.

The library is loaded with ``ctypes.CDLL``, which releases the GIL for the
duration of every foreign call: kernels (and JIT compiles) run while other
Python threads proceed.
"""
import ctypes

from . import _structs as S
from ._locate import library_path

_i64 = ctypes.c_int64
_int = ctypes.c_int
_status = ctypes.c_int
_str = ctypes.c_char_p
_config_p = ctypes.POINTER(S.Config)
_layer_p = ctypes.c_void_p
_float_p = ctypes.c_void_p   # numpy buffers are passed as addresses
_void_p = ctypes.c_void_p

# name: (restype, argtypes) of every C function the package calls.
_PROTOTYPES = {
    "sneppx_last_error": (_str, []),
    "sneppx_status_name": (_str, [_status]),
    "sneppx_config_init": (None, [_config_p]),
    "sneppx_config_from_name": (_status, [_str, _str, _config_p]),
    "sneppx_config_from_json": (_status, [_str, ctypes.c_size_t, _config_p]),
    "sneppx_config_from_json_file": (_status, [_str, _config_p]),
    "sneppx_rope_scaling_from_json": (_status, [_str, ctypes.c_size_t, ctypes.POINTER(S.RopeScaling)]),
    "sneppx_preset_count": (_int, []),
    "sneppx_preset_name": (_str, [_int]),
    "sneppx_config_validate": (_status, [_config_p]),
    "sneppx_config_extend_context": (_status, [_config_p, _i64]),
    "sneppx_config_softmax_scale": (ctypes.c_double, [_config_p]),
    "sneppx_layer_create": (_status, [_config_p, ctypes.POINTER(S.Weights), ctypes.POINTER(_layer_p)]),
    "sneppx_layer_create_typed": (_status, [_config_p, ctypes.POINTER(S.TypedWeights), ctypes.POINTER(_layer_p)]),
    "sneppx_layer_create_from_safetensors": (_status, [_config_p, _str, _i64, ctypes.POINTER(_layer_p)]),
    "sneppx_layer_forward": (_status, [_layer_p, _i64, _i64, _float_p, _float_p,
                                       ctypes.POINTER(_i64), _void_p, _float_p]),
    "sneppx_layer_warmup": (_status, [_config_p]),
    "sneppx_layer_set_flash": (_status, [_layer_p, _int]),
    "sneppx_layer_keys": (_str, [_layer_p]),
    "sneppx_layer_destroy": (None, [_layer_p]),
    "sneppx_kv_cache_options_init": (None, [_void_p]),
    "sneppx_kv_cache_create": (_status, [_config_p, _void_p, ctypes.POINTER(_void_p)]),
    "sneppx_kv_cache_destroy": (None, [_void_p]),
    "sneppx_kv_cache_add_sequence": (_status, [_void_p, ctypes.POINTER(_i64)]),
    "sneppx_kv_cache_remove_sequence": (_status, [_void_p, _i64]),
    "sneppx_kv_cache_fork": (_status, [_void_p, _i64, ctypes.POINTER(_i64)]),
    "sneppx_kv_cache_truncate": (_status, [_void_p, _i64, _i64]),
    "sneppx_kv_cache_truncate_sequences": (_status, [_void_p, _i64, _void_p, _void_p]),
    "sneppx_kv_cache_length": (_status, [_void_p, _i64, ctypes.POINTER(_i64)]),
    "sneppx_kv_cache_layer_length": (_status, [_void_p, _i64, _i64, ctypes.POINTER(_i64)]),
    "sneppx_kv_cache_first_held": (_status, [_void_p, _i64, ctypes.POINTER(_i64)]),
    "sneppx_kv_cache_reset": (_status, [_void_p]),
    "sneppx_kv_cache_stats_get": (_status, [_void_p, _void_p]),
    "sneppx_kv_cache_read": (_status, [_void_p, _i64, _i64, _i64, _i64, _float_p, _float_p]),
    "sneppx_layer_forward_cached": (_status, [_layer_p, _void_p, _i64, _i64, _void_p, _void_p, _float_p,
                                              _void_p, _void_p, _float_p]),
    "sneppx_attn_tensors": (_status, [_config_p, ctypes.POINTER(S.AttnTensor), ctypes.POINTER(_int)]),
    "sneppx_attn_tensor_is_ignored": (_int, [_str]),
    "sneppx_attn_weights_load": (_status, [_str, _i64, _config_p, ctypes.POINTER(_void_p)]),
    "sneppx_attn_weights_view": (ctypes.POINTER(S.Weights), [_void_p]),
    "sneppx_attn_weights_free": (None, [_void_p]),
}


def _load() -> ctypes.CDLL:
    library = ctypes.CDLL(str(library_path()))
    for name, (restype, argtypes) in _PROTOTYPES.items():
        function = getattr(library, name)
        function.restype = restype
        function.argtypes = argtypes
    return library


lib = _load()
