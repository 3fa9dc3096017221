"""sneppx: JIT-specialized attention layers (LLaMA 2/3/3.1, Mistral, Qwen 2, DeepSeek V2) on CPUs.

    import numpy as np
    import sneppx

    cfg = sneppx.LLMConfig.from_name("llama3", "8B")
    output = cfg.forward_mha(hidden_states,   # [batch, seq_len, hidden_size]
                             attention_mask,  # [batch, 1, seq_len, seq_len] additive, or None (causal)
                             position_ids)    # [batch, seq_len], or None (0..seq_len-1)
    # output: float32 [batch, seq_len, hidden_size]

    cfg.load_safetensors("/models/Meta-Llama-3-8B", layer=0)   # real weights

A binding of libsneppx through ctypes (no compile step at import; needs only
numpy). ctypes releases the GIL during every C call, so kernels and JIT
compiles run while other Python threads proceed. Where the library is found:
see sneppx._library (``$SNEPPX_LIBRARY`` overrides). Kernels are cached on
disk in ``$SNEPPX_CACHE_DIR`` (else ``$XDG_CACHE_HOME/sneppx``, else
``~/.cache/sneppx``); ``SNEPPX_VERBOSE=1`` logs each compile.
"""
from . import hf    # sneppx.hf.patch(model): torch / transformers load only when it is called
from ._library import library_path
from .config import LLMConfig
from ._kv_cache import KVCache
from .errors import (CommError, Error, FileError, FormatError, InvalidArgumentError, JITError,
                     OutOfMemoryError, UnknownPresetError, UnsupportedError)

__all__ = ["LLMConfig", "KVCache", "Error", "InvalidArgumentError", "UnknownPresetError", "UnsupportedError",
           "OutOfMemoryError", "JITError", "FileError", "FormatError", "CommError", "library_path"]
