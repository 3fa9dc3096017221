"""Where a layer's weights come from. Each source can create the layer again
(after extend_context() or a mla_naive change) from what it holds:

SyntheticWeights   the runtime's seeded weights (sneppx_layer_create with NULL)
StateDictWeights   copies of a state dict in their own type (float32, or the bits of bfloat16 /
                   float16), checked against the config's tensor list
CheckpointWeights  a safetensors checkpoint, packed from the file by the C loader at each create
"""
import ctypes
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from . import _hf
from . import _structs as S
from ._arrays import array_or_bfloat16_bits, float32_array
from ._layer import Layer
from ._library import lib
from .errors import check

_SELF_ATTN = "self_attn."
_DTYPE_CODES = {name: S.DTYPES.index(name) for name in ("float32", "bfloat16", "float16")}
# Field of sneppx_weights at each byte offset (the C side reports offsetof()).
_FIELD_AT_OFFSET = {getattr(S.Weights, name).offset: name for name, _ in S.Weights._fields_}


def expected_tensors(config: S.Config) -> List[Tuple[str, Tuple[int, ...], str]]:
    """(HF name, shape, sneppx_weights field) of every tensor the config's layer holds."""
    tensors = (S.AttnTensor * S.ATTN_TENSORS_MAX)()
    count = ctypes.c_int()
    check(lib.sneppx_attn_tensors(ctypes.byref(config), tensors, ctypes.byref(count)))
    return [(t.name.decode(), tuple(t.shape[:t.rank]), _FIELD_AT_OFFSET[t.weights_offset])
            for t in tensors[:count.value]]


class SyntheticWeights:
    description = f"synthetic(seed={S.SYNTHETIC_SEED:#x})"

    def create(self, config: S.Config) -> Layer:
        return Layer(config, None)


def _split_prefix(key: Any) -> Tuple[str, str]:
    if not isinstance(key, str):
        raise TypeError(f"state_dict: keys must be strings, got {key!r}")
    at = key.rfind(_SELF_ATTN)
    if at < 0 or (at > 0 and key[at - 1] != "."):
        return "", key
    return key[:at + len(_SELF_ATTN)], key[at + len(_SELF_ATTN):]


# "<prefix>layers.<L>.self_attn.<name>", the prefix empty or ending in '.': the names the
# checkpoint loader picks a layer's tensors by (runtime/safetensors_checkpoint.c, layer_suffix).
_LAYER_KEY = re.compile(r"(?:^|(?<=\.))layers\.(\d+)\.self_attn\.")


def _layer_keys(state_dict: Mapping[str, Any], layer: int, needed: List[str]) -> Dict[str, str]:
    """The keys of layer `layer`'s self_attn tensors in a whole model's state dict, as
    {key: name inside self_attn}; the other layers' tensors, embeddings, MLPs and norms are
    left alone (not even read). ValueError naming layer when it has none.

    needed: the names the config takes. As the checkpoint loader's choose_prefix: a
    multimodal model's state dict holds its language model's layer ("language_model.model.
    layers.0.self_attn.") beside a vision tower's ("vision_tower.vision_model.encoder.layers.
    0.self_attn."); the prefix holding every needed name is the layer's, two such are
    ambiguous, and with none the one holding the most names the missing tensors. Other
    prefixes' tensors are passed over."""
    by_prefix: Dict[str, Dict[str, str]] = {}   # in the state dict's order, as the C loader's candidates
    layers = set()
    for key in state_dict:
        if not isinstance(key, str):
            raise TypeError(f"state_dict: keys must be strings, got {key!r}")
        for match in _LAYER_KEY.finditer(key):
            layers.add(int(match.group(1)))
            if match.group(1) == str(layer):   # as the C loader's pattern: "layers.01." is not layer 1
                name = key[match.end():]
                if not lib.sneppx_attn_tensor_is_ignored(name.encode()):
                    by_prefix.setdefault(key[:match.start()], {})[key] = name
                break
    if not by_prefix:
        held = f"it holds layers {_ranges(sorted(layers))}" if layers else \
            "no key contains 'layers.<n>.self_attn.' (pass one layer's tensors without layer=)"
        raise ValueError(f"layer: state_dict has no tensor of layer {layer}'s self_attn; {held}")
    held = {prefix: set(keys.values()) & set(needed) for prefix, keys in by_prefix.items()}
    complete = [prefix for prefix in by_prefix if len(held[prefix]) == len(set(needed))]
    if len(complete) > 1:
        first, second = (next(k for k, n in by_prefix[p].items() if n == needed[0]) for p in complete[:2])
        raise ValueError(f"state_dict: tensors {first!r} and {second!r} both match layer {layer}'s "
                         f"self_attn.{needed[0]}")
    chosen = complete[0] if complete else max(by_prefix, key=lambda prefix: len(held[prefix]))
    return by_prefix[chosen]


def _ranges(numbers: List[int]) -> str:
    """[0, 1, 2, 5] -> "0..2, 5"."""
    parts, start = [], 0
    for i in range(1, len(numbers) + 1):
        if i == len(numbers) or numbers[i] != numbers[i - 1] + 1:
            first, last = numbers[start], numbers[i - 1]
            parts.append(str(first) if first == last else f"{first}..{last}")
            start = i
    return ", ".join(parts)


def _stored_tensor(full_name: str, value: Any, shape: Tuple[int, ...]) -> Tuple[np.ndarray, int]:
    """value as the layer reads it: (a C-contiguous copy, its sneppx_dtype). bfloat16 (torch,
    ml_dtypes) and float16 keep their 16 bits (no float32 copy); float32 stays float32;
    other floats (float64) become float32."""
    array, is_bfloat16 = array_or_bfloat16_bits(f"state_dict: tensor {full_name!r}", value)
    if not is_bfloat16 and array.dtype.kind != "f":
        raise TypeError(f"state_dict: tensor {full_name!r} has dtype {array.dtype}; expected floating point")
    if array.shape != shape:
        raise ValueError(f"state_dict: tensor {full_name!r} has shape {list(array.shape)}, "
                         f"expected {list(shape)}")
    # A copy even when the caller's array is already what the layer reads: it is kept to repack
    # the weights (extend_context, mla_naive), and a caller reusing the array for the next
    # layer's tensors must not change this layer's.
    if is_bfloat16:
        return np.array(array, dtype=np.uint16, order="C", copy=True), _DTYPE_CODES["bfloat16"]
    if array.dtype == np.float16:
        return np.array(array, dtype=np.float16, order="C", copy=True), _DTYPE_CODES["float16"]
    if array.dtype == np.float32:
        return np.array(array, order="C", copy=True), _DTYPE_CODES["float32"]
    # float64: a finite value beyond float32's range is refused, naming the tensor, not made inf.
    return float32_array(f"state_dict: tensor {full_name!r}", array), _DTYPE_CODES["float32"]


class StateDictWeights:
    def __init__(self, config: S.Config, state_dict: Mapping[str, Any], layer: Optional[int] = None):
        """layer None: state_dict holds one self_attn module's tensors (keys with or without a
        prefix ending in "self_attn."); else a whole model's, of which layer `layer`'s are taken."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict: expected a mapping of names to arrays, got {type(state_dict).__name__}")
        if layer is None:
            names = {key: _split_prefix(key)[1] for key in state_dict}
            prefixes = {_split_prefix(key)[0] for key in state_dict}
            if len(prefixes) > 1:
                whole_model = any(_LAYER_KEY.search(key) for key in state_dict)
                raise ValueError(f"state_dict: keys carry different prefixes {sorted(prefixes)}; "
                                 + ("pass layer=N to take layer N's tensors of a whole model's state dict"
                                    if whole_model else "pass the tensors of one self_attn module"))
            prefix = prefixes.pop() if prefixes else ""
        else:
            layer = _hf.c_count("layer", layer)
            names = _layer_keys(state_dict, layer, [name for name, _, _ in expected_tensors(config)])
            key, name = next(iter(names.items()))
            prefix = key[:len(key) - len(name)]
        expected = {name: (shape, field) for name, shape, field in expected_tensors(config)}
        config_name = config.name.decode()
        self.arrays: Dict[str, Tuple[np.ndarray, int]] = {}   # field: (elements, sneppx_dtype)
        for key, name in names.items():
            if lib.sneppx_attn_tensor_is_ignored(name.encode()):
                continue
            if name not in expected:
                raise ValueError(f"state_dict: unexpected tensor {key!r}; config '{config_name}' takes "
                                 f"{', '.join(expected)}")
            shape, field = expected[name]
            self.arrays[field] = _stored_tensor(key, state_dict[key], shape)
        missing = [prefix + name for name, (_, field) in expected.items() if field not in self.arrays]
        if missing:
            raise ValueError(f"state_dict: missing tensor(s) {', '.join(repr(m) for m in missing)} "
                             f"(config '{config_name}')")
        self.description = f"state_dict({len(self.arrays)} tensors{'' if layer is None else f', layer={layer}'})"

    def create(self, config: S.Config) -> Layer:
        weights = S.TypedWeights()
        for field, (array, dtype) in self.arrays.items():
            setattr(weights, field, S.TensorRef(array.ctypes.data, dtype))
        return Layer(config, create=lambda handle: lib.sneppx_layer_create_typed(
            ctypes.byref(config), ctypes.byref(weights), handle))


class CheckpointWeights:
    def __init__(self, path: "os.PathLike[str] | str", layer: int = 0):
        layer = _hf.c_count("layer", layer)    # sneppx_attn_weights_load's layer is int64_t
        try:
            self.path = os.fsencode(path)
        except TypeError:
            raise TypeError(f"path: expected a str, bytes or os.PathLike, got {path!r}") from None
        if b"\0" in self.path:   # the C string would end there: another file would be read
            raise ValueError(f"path: {path!r} contains a NUL character")
        if not self.path:   # named as from_config_json names it, not as a file '' that cannot be opened
            raise ValueError("path: an empty path; give a checkpoint directory, its model.safetensors.index.json "
                             "or a .safetensors file")
        self.layer = layer
        self.description = f"safetensors({os.fsdecode(self.path)!r}, layer={self.layer})"

    def create(self, config: S.Config) -> Layer:
        # Packed straight from the file, a few rows per thread at a time: no float32 copy.
        return Layer(config, create=lambda handle: lib.sneppx_layer_create_from_safetensors(
            ctypes.byref(config), self.path, self.layer, handle))
