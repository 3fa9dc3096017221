"""Owner of one sneppx_layer handle (compiled kernels + packed weights).

A forward call keeps a reference to the Layer it runs on, so replacing an
LLMConfig's layer (extend_context, new weights) while another thread is inside
forward only destroys the old handle once that call has returned.
"""
import ctypes
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

from . import _structs as S
from ._library import lib
from .errors import OutOfMemoryError, UnsupportedError, check


class Layer:
    __slots__ = ("_handle", "_destroy")

    def __init__(self, config: S.Config, weights: Optional[S.Weights] = None,
                 create: Optional[Callable[[Any], int]] = None):
        """sneppx_layer_create: validates, resolves kernels, packs (copies) the weights;
        or create(&handle), another create call of the C API with its other arguments bound."""
        handle = ctypes.c_void_p()
        self._handle = None
        # Bound now: at interpreter exit module globals may already be gone when __del__ runs.
        self._destroy = lib.sneppx_layer_destroy
        if create is None:
            check(lib.sneppx_layer_create(ctypes.byref(config), ctypes.byref(weights) if weights is not None else None,
                                          ctypes.byref(handle)))
        else:
            check(create(ctypes.byref(handle)))
        self._handle = handle.value

    def __del__(self):
        if self._handle:
            self._destroy(self._handle)
            self._handle = None

    def set_flash(self, use_flash_attn: int) -> None:
        check(lib.sneppx_layer_set_flash(self._handle, use_flash_attn))

    def keys(self) -> List[str]:
        return lib.sneppx_layer_keys(self._handle).decode().split()

    def forward(self, hidden_states: np.ndarray, mask: Optional[np.ndarray], position_ids: Optional[np.ndarray],
                out: np.ndarray) -> None:
        """Arrays are already validated, C-contiguous float32 / int64 (see _arrays)."""
        batch, seq_len = hidden_states.shape[0], hidden_states.shape[1]
        mask_shape = (ctypes.c_int64 * 4)(*mask.shape) if mask is not None else None
        check(lib.sneppx_layer_forward(
            self._handle, batch, seq_len, hidden_states.ctypes.data,
            mask.ctypes.data if mask is not None else None, mask_shape,
            position_ids.ctypes.data if position_ids is not None else None, out.ctypes.data))

    def forward_cached(self, cache_handle: int, layer_index: int, seq_ids: Sequence[int], q_lens: Sequence[int],
                       hidden_states: np.ndarray, position_ids: Optional[np.ndarray],
                       masks: Optional[Sequence[Optional[np.ndarray]]], out: np.ndarray) -> None:
        """sneppx_layer_forward_cached; hidden_states / out packed [sum(q_lens), hidden], already
        validated C-contiguous float32, position_ids packed int64, masks float32 planes."""
        count = len(seq_ids)
        ids = (ctypes.c_int64 * count)(*seq_ids)
        lens = (ctypes.c_int64 * count)(*q_lens)
        planes = None
        if masks is not None:
            planes = (ctypes.c_void_p * count)(*[m.ctypes.data if m is not None else None for m in masks])
        try:
            check(lib.sneppx_layer_forward_cached(
                self._handle, cache_handle, layer_index, count, ids, lens, hidden_states.ctypes.data,
                position_ids.ctypes.data if position_ids is not None else None, planes, out.ctypes.data))
        except UnsupportedError as error:
            # The C message names its layer and how to create it; from Python the layer is
            # the LLMConfig's, and the fix its mla_naive attribute.
            text = str(error).replace("layer: made with mla_naive;", "mla_naive: True;").replace(
                "(create the layer with mla_naive 0)", "(set the LLMConfig's mla_naive = False)")
            if text == str(error):
                raise
            raise UnsupportedError(text) from None
        except OutOfMemoryError as error:
            # The C advice names the pool's size in tokens; from Python, kv_cache()'s batch and
            # max_tokens make it, and forks draw on the same pool.
            text = str(error).replace("create the cache with a larger capacity_tokens",
                                      "make the cache with a larger batch or max_tokens (LLMConfig.kv_cache(): "
                                      "its pool holds batch rows of max_tokens, which forks share)")
            if text == str(error):
                raise
            raise OutOfMemoryError(text) from None
