"""Owner of one sneppx_layer handle (compiled kernels + packed weights).

A forward call keeps a reference to the Layer it runs on, so replacing an
LLMConfig's layer (extend_context, new weights) while another thread is inside
forward only destroys the old handle once that call has returned.
"""
import ctypes
from typing import List, Optional

import numpy as np

from . import _structs as S
from ._library import lib
from .errors import check


class Layer:
    __slots__ = ("_handle", "_destroy")

    def __init__(self, config: S.Config, weights: Optional[S.Weights]):
        """sneppx_layer_create: validates, resolves kernels, packs (copies) the weights."""
        handle = ctypes.c_void_p()
        self._handle = None
        # Bound now: at interpreter exit module globals may already be gone when __del__ runs.
        self._destroy = lib.sneppx_layer_destroy
        check(lib.sneppx_layer_create(ctypes.byref(config), ctypes.byref(weights) if weights is not None else None,
                                      ctypes.byref(handle)))
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
