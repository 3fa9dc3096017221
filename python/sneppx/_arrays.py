"""Checking and converting forward_mha's arguments into the C-contiguous
float32 / int64 buffers the runtime reads. Each input is converted at most
once; errors name the argument and the shape it must have.

bfloat16, which numpy lacks, is read through its bits: a torch tensor as the
int16 view its own module offers (no torch import here), a numpy array of
ml_dtypes' bfloat16 as uint16. torch tensors are read through _tensors (CPU
only, detached, their memory shared)."""
import sys
from typing import Any, Optional, Tuple

import numpy as np

from ._tensors import is_torch_tensor, torch_array

_REAL_KINDS = "fiu"     # float, signed and unsigned integer
_INTEGER_KINDS = "iu"


def _torch_bfloat16_bits(name: str, value: Any) -> Optional[np.ndarray]:
    """The uint16 bits of a torch bfloat16 tensor (a view, no copy when it is on the CPU),
    or None when value is no such tensor. Works with the tensor's own methods: view(int16)
    reinterprets the bits (it needs no grad, unlike numpy()), and the int16 dtype comes from
    the module that defines the tensor's type."""
    if isinstance(value, np.ndarray) or str(getattr(value, "dtype", "")) != "torch.bfloat16":
        return None
    module = sys.modules.get(type(value).__module__.partition(".")[0])
    try:
        return np.asarray(value.view(getattr(module, "int16"))).view(np.uint16)
    except Exception as error:  # a tensor on another device, a torch without view(dtype)
        raise TypeError(f"{name}: cannot read the bits of a bfloat16 tensor ({error})") from None


def array_or_bfloat16_bits(name: str, value: Any) -> Tuple[np.ndarray, bool]:
    """(value as an array, False), or (its bfloat16 bits as uint16, True) for a bfloat16
    tensor or array."""
    if is_torch_tensor(value):
        return torch_array(name, value), str(value.dtype) == "torch.bfloat16"
    bits = _torch_bfloat16_bits(name, value)
    if bits is not None:
        return bits, True
    try:
        array = np.asarray(value)
    except Exception as error:  # ragged lists, tensors that need .detach(), ...
        raise TypeError(f"{name}: cannot be read as an array ({error})") from None
    if array.dtype.name == "bfloat16" and array.dtype.itemsize == 2:   # ml_dtypes
        return array.view(np.uint16), True
    if array.dtype.kind == "O":
        # numpy makes object arrays of ragged lists and of integers beyond 64 bits.
        raise TypeError(f"{name}: cannot be read as a numeric array (got dtype object: ragged lists, or integers "
                        f"beyond 64 bits?)")
    return array, False


def widen_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> C-contiguous float32, exactly: the bits are a float32's high half.
    One new array, shifted in place."""
    wide = np.array(bits, dtype=np.uint32, order="C", copy=True)
    wide <<= 16
    return wide.view(np.float32)


def as_array(name: str, value: Any) -> np.ndarray:
    array, is_bfloat16 = array_or_bfloat16_bits(name, value)
    return widen_bfloat16(array) if is_bfloat16 else array


def _shape_text(shape: tuple) -> str:
    return "[" + ", ".join(str(extent) for extent in shape) + "]"


def c_array(array: np.ndarray, dtype) -> np.ndarray:
    """array as C-contiguous and aligned elements of dtype, copied only when it is not: C
    reads it through typed pointers, and a view at an odd byte offset (np.frombuffer with
    an offset) is contiguous without being aligned."""
    return np.require(array, dtype=dtype, requirements=("C", "A", "E"))


def float32_array(name: str, array: np.ndarray, to_minus_inf_ok: bool = False) -> np.ndarray:
    """array as C-contiguous, aligned float32 (the same object when it already is). A finite value
    beyond float32's range would become +-inf: a ValueError naming the argument, except
    towards -inf when to_minus_inf_ok. NaN / inf inputs stay as they are (they propagate
    to the output, as in HF)."""
    if array.dtype.kind != "f" or array.dtype.itemsize <= 4:
        return c_array(array, np.float32)    # integers and float16 always fit
    with np.errstate(over="ignore"):
        converted = c_array(array, np.float32)
    if converted.size and not np.isfinite(converted).all():
        overflowed = np.isinf(converted) & np.isfinite(array)
        if to_minus_inf_ok:
            overflowed &= converted > 0
        if overflowed.any():
            index = tuple(int(i) for i in np.argwhere(overflowed)[0])
            raise ValueError(f"{name}: {array[index]} at index {list(index)} is beyond the float32 range "
                             f"(|x| <= {np.finfo(np.float32).max:.8g}); the layer computes in float32")
    return converted


def hidden_states_array(value: Any, hidden_size: int) -> np.ndarray:
    """[batch, seq_len, hidden_size] as C-contiguous float32 (the same object when it already is)."""
    name = "hidden_states"
    array = real_array(name, value)
    if array.ndim != 3 or array.shape[2] != hidden_size:
        raise ValueError(f"{name}: expected shape [batch, seq_len, {hidden_size}], got {_shape_text(array.shape)}")
    return float32_array(name, array)


def real_array(name: str, value: Any) -> np.ndarray:
    """value as an array of real numbers (bfloat16 widened), else a TypeError naming name."""
    array = as_array(name, value)
    if array.dtype.kind not in _REAL_KINDS:
        raise TypeError(f"{name}: expected real numbers (float32 preferred), got dtype {array.dtype}")
    return array


def token_rows_array(name: str, value: Any, hidden_size: int) -> np.ndarray:
    """One row's new tokens, [q_len >= 1, hidden_size] (or [1, q_len, hidden_size]), as C-contiguous
    float32 [q_len, hidden_size] (forward_ragged's hidden_states[i]); errors name `name` and show
    the shape as given."""
    array = real_array(name, value)
    rows = array[0] if array.ndim == 3 and array.shape[0] == 1 else array
    if rows.ndim != 2 or rows.shape[0] == 0 or rows.shape[1] != hidden_size:
        raise ValueError(f"{name}: expected shape [q_len >= 1, {hidden_size}], got {_shape_text(array.shape)}")
    return float32_array(name, rows)


def _additive_mask_float32(name: str, array: np.ndarray) -> np.ndarray:
    """An additive float mask as float32. HF fills masked places with finfo(dtype).min:
    float16's, -65504, is far above the -1e30 the layer takes for masked (a row of it would
    average its keys, not output zeros; a sliding window's released tokens would look
    visible), so it becomes -inf. A wider type's finfo.min becomes -inf in float32 anyway,
    without numpy's overflow warning; a large positive entry would become +inf (its row NaN)."""
    if array.dtype == np.float16:
        array = np.where(array == np.finfo(np.float16).min, np.float16(-np.inf), array)
    return float32_array(name, array, to_minus_inf_ok=True)


def attention_mask_array(value: Any, batch: int, seq_len: int) -> Optional[np.ndarray]:
    """None, or the additive float32 mask [batch or 1, 1, seq_len, seq_len] (bool: True -> 0, False -> -inf)."""
    if value is None:
        return None
    name = "attention_mask"
    array = as_array(name, value)
    expected = f"[{batch}, 1, {seq_len}, {seq_len}]"
    if batch != 1:
        expected += f" (or [1, 1, {seq_len}, {seq_len}])"
    if array.ndim != 4 or array.shape[0] not in (batch, 1) or array.shape[1:] != (1, seq_len, seq_len):
        raise ValueError(f"{name}: expected shape {expected}, got {_shape_text(array.shape)}")
    if array.dtype.kind == "b":
        return np.where(array, np.float32(0.0), np.float32(-np.inf))
    if array.dtype.kind != "f":
        raise TypeError(f"{name}: expected an additive float mask or a bool mask (True = attend), "
                        f"got dtype {array.dtype}")
    return _additive_mask_float32(name, array)


def _integer_array(name: str, value: Any) -> np.ndarray:
    """value as an array of integers that fit in int64, else an error naming name."""
    array, is_bfloat16 = array_or_bfloat16_bits(name, value)
    if is_bfloat16:     # its bits are uint16, which would pass for integers
        raise TypeError(f"{name}: expected integers, got dtype bfloat16")
    if array.dtype.kind not in _INTEGER_KINDS:
        raise TypeError(f"{name}: expected integers, got dtype {array.dtype}")
    if array.dtype.kind == "u" and array.size and array.max() > np.uint64(np.iinfo(np.int64).max):
        raise ValueError(f"{name}: {array.max()} does not fit in int64")
    return array


def position_ids_array(value: Any, batch: int, seq_len: int) -> Optional[np.ndarray]:
    """None, or int64 positions [batch, seq_len] (a [1, seq_len] row is repeated over the batch)."""
    if value is None:
        return None
    name = "position_ids"
    array = _integer_array(name, value)
    if array.ndim != 2 or array.shape[0] not in (batch, 1) or array.shape[1] != seq_len:
        either = f" (or [1, {seq_len}])" if batch != 1 else ""
        raise ValueError(f"{name}: expected shape [{batch}, {seq_len}]{either}, got {_shape_text(array.shape)}")
    _refuse_negative(name, array)
    return c_array(np.broadcast_to(array, (batch, seq_len)), np.int64)


def _refuse_negative(name: str, array: np.ndarray) -> None:
    """Named here by the caller's index: the C call's check counts entries of the flattened batch."""
    negative = np.argwhere(array < 0)
    if negative.size:
        where = ", ".join(str(int(i)) for i in negative[0])
        raise ValueError(f"{name}[{where}]: position {int(array[tuple(negative[0])])} is negative")


def row_positions_array(name: str, value: Any, q_len: int) -> np.ndarray:
    """One row's positions, [q_len] or [1, q_len] (forward_ragged's position_ids[i]), as int64 [q_len]."""
    array = _integer_array(name, value)
    if array.shape not in ((q_len,), (1, q_len)):
        raise ValueError(f"{name}: expected shape [{q_len}] (or [1, {q_len}]), got {_shape_text(array.shape)}")
    _refuse_negative(name, array)
    return c_array(array.reshape(q_len), np.int64)


def cached_mask_planes(value: Any, batch: int, seq_len: int, cached: int, window: int) -> Optional[list]:
    """forward_mha's attention_mask with a KV cache, as one additive float32 plane
    [seq_len, cached + seq_len] per row (sneppx_layer_forward_cached's `masks`).

    None -> None (causal + window). A 4-D [batch or 1, 1, seq_len, cached + seq_len] mask
    (HF's mask with a past; float additive or bool) is taken as final. A 2-D
    [batch, cached + seq_len] padding mask of 1/0 (HF's attention_mask argument to
    generate()) is combined with the causal mask and the sliding window."""
    if value is None:
        return None
    name = "attention_mask"
    array = as_array(name, value)
    keys = cached + seq_len
    if array.ndim == 2:
        if array.shape != (batch, keys):
            raise ValueError(f"{name}: expected a padding mask of shape [{batch}, {keys}] (cached {cached} + new "
                             f"{seq_len} tokens) or a 4-D mask [{batch}, 1, {seq_len}, {keys}], got "
                             f"{_shape_text(array.shape)}")
        if array.dtype.kind not in "biuf":
            raise TypeError(f"{name}: a padding mask holds 1 (attend) / 0 (padding), got dtype {array.dtype}")
        query = np.arange(cached, keys)[:, None]
        key = np.arange(keys)[None, :]
        visible = key <= query
        if window > 0:
            visible &= query - key < window
        padding = np.asarray(array != 0)
        return [c_array(np.where(visible & padding[b][None, :], np.float32(0.0), np.float32(-np.inf)), np.float32)
                for b in range(batch)]
    expected = f"[{batch}, 1, {seq_len}, {keys}]"
    if array.ndim != 4 or array.shape[0] not in (batch, 1) or array.shape[1:] != (1, seq_len, keys):
        either = f" (or [1, 1, {seq_len}, {keys}])" if batch != 1 else ""
        raise ValueError(f"{name}: expected shape {expected}{either} (cached {cached} + new {seq_len} keys) or a "
                         f"padding mask [{batch}, {keys}], got {_shape_text(array.shape)}")
    if array.dtype.kind == "b":
        planes = np.where(array, np.float32(0.0), np.float32(-np.inf))
    elif array.dtype.kind == "f":
        planes = _additive_mask_float32(name, array)
    else:
        raise TypeError(f"{name}: expected an additive float mask or a bool mask (True = attend), "
                        f"got dtype {array.dtype}")
    return [c_array(planes[b if planes.shape[0] == batch else 0, 0], np.float32) for b in range(batch)]
