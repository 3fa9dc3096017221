"""LLMConfig: one attention layer's configuration, its weights and its forward pass."""
import copy
import ctypes
import os
import re
import threading
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from . import _hf
from . import _structs as S
from ._arrays import (attention_mask_array, cached_mask_planes, hidden_states_array, position_ids_array,
                      row_positions_array, token_rows_array)
from ._kv_cache import KVCache, layer_index, per_row_list
from ._layer import Layer
from ._library import lib
from ._tensors import output_like
from ._weights import CheckpointWeights, StateDictWeights, SyntheticWeights, expected_tensors
from .errors import InvalidArgumentError, check
from ._tensor_parallel import (agreed, is_sharded, keep_sharding, layer_config, refused_on_every_rank, shard_info,
                               tensor_parallel)


def _size(name: str, value: Any, default: int = 0, c_type: str = "int64") -> int:
    """An optional non-negative size; None means default (0 = 'derive' / 'none' in the C struct).

    c_type: the C field's type, "int64" or "int" (_hf.c_count)."""
    return default if value is None else _hf.c_count(name, value, c_type)


def _partial_rotary_dim(config: S.Config, partial_rotary_factor: Any) -> int:
    """int(head_dim * factor), refused as sneppx-gen's hand configs refuse it: a factor
    outside (0, 1], or one that rotates no dimension pair (rotary_dim 0 would mean "the
    whole head" in sneppx_config)."""
    factor = _hf._real("partial_rotary_factor", partial_rotary_factor)
    if not 0.0 < factor <= 1.0:
        raise ValueError(f"partial_rotary_factor: {factor:g} must be in (0, 1]")
    heads = config.num_attention_heads if config.num_attention_heads > 0 else 1
    head_dim = config.head_dim if config.head_dim > 0 else config.hidden_size // heads
    rotary_dim = int(head_dim * factor)
    if rotary_dim < 2:
        raise ValueError(f"partial_rotary_factor: {factor:g} of head_dim {head_dim} rotates no dimension pair")
    return rotary_dim


def _dtype(name: str, value: Any) -> int:
    """A weight type's sneppx_dtype by its name (S.WEIGHT_DTYPES: "float32", "bfloat16", "float16", "int8")."""
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected one of {', '.join(S.WEIGHT_DTYPES)} (a string), got {value!r}")
    if value not in S.WEIGHT_DTYPES:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(S.WEIGHT_DTYPES)}")
    return S.DTYPES.index(value)


def _dtype_name(value: int) -> str:
    return S.DTYPES[value] if 0 <= value < len(S.DTYPES) else str(value)


def _flag(name: str, value: Any) -> int:
    if not isinstance(value, (bool, np.bool_, int)) or value not in (0, 1):
        raise TypeError(f"{name}: expected a bool, got {value!r}")
    return int(bool(value))


def _alias(name: str, value: Any, alias: str, alias_value: Any) -> Any:
    if alias_value is None:
        return value
    if value is not None and value != alias_value:
        raise TypeError(f"{name}={value!r} and its alias {alias}={alias_value!r} disagree")
    return alias_value


class LLMConfig:
    """The configuration of one attention layer, in HuggingFace config.json terms.

    Build one from a preset (``LLMConfig.from_name("llama3", "8B")``,
    ``LLMConfig.from_name("mistral-7B")``; ``LLMConfig.names()`` lists them), from
    a checkpoint's config.json (``LLMConfig.from_config_json(path)``), or by
    keyword with HF's field names (``LLMConfig(hidden_size=4096,
    num_attention_heads=32, num_key_value_heads=8, rope_theta=5e5)``).

    Attributes carry HF's names and are read-only, except ``use_flash_attn``,
    ``mla_naive`` and ``num_threads``. ``forward_mha()`` runs the layer: with deterministic
    synthetic weights (``weights_source`` says which) until
    ``load_state_dict()`` or ``load_safetensors()`` gives real ones.

    The layer (compiled kernels and packed weights) is built at the first
    forward or weight load and reused. Kernels run with the GIL released, and
    one LLMConfig may be used from several threads at once.

    ``copy.copy()`` and ``copy.deepcopy()`` give an independent LLMConfig with the
    same fields and weights (a deep copy also copies load_state_dict()'s arrays; a
    safetensors source is the same path and layer, read again when the copy builds
    its layer); the copy builds its own layer on first use, so changing one (e.g.
    use_flash_attn, extend_context) leaves the other as it was. Pickling is refused
    (TypeError): the layer lives in C memory; pickle the constructor's arguments
    and weights instead.
    """

    __slots__ = ("_config", "_lock", "_layer", "_weights")

    def __init__(self, *, hidden_size: int, num_attention_heads: Optional[int] = None,
                 num_key_value_heads: Optional[int] = None, head_dim: Optional[int] = None,
                 rope_theta: Optional[float] = None, rope_scaling: Optional[Mapping[str, Any]] = None,
                 sliding_window: Optional[int] = None, max_position_embeddings: Optional[int] = None,
                 q_lora_rank: Optional[int] = None, kv_lora_rank: Optional[int] = None,
                 qk_nope_head_dim: Optional[int] = None, qk_rope_head_dim: Optional[int] = None,
                 v_head_dim: Optional[int] = None, bias: Optional[bool] = None,
                 attention_bias: Optional[bool] = None, qkv_bias: Optional[bool] = None,
                 o_bias: Optional[bool] = None, partial_rotary_factor: Optional[float] = None,
                 rope_interleaved: Optional[bool] = None, use_flash_attn: Optional[bool] = None,
                 mla_naive: Optional[bool] = None, num_threads: Optional[int] = None,
                 weight_dtype: Optional[str] = None, compute_dtype: Optional[str] = None,
                 num_heads: Optional[int] = None, num_kv_heads: Optional[int] = None, name: Optional[str] = None):
        """Keyword arguments are HF config.json's names (the fields of sneppx_config,
        S.CONFIG_FIELDS), plus the ones below. None (or leaving one out) means
        sneppx_config_init()'s value: rope_theta 10000, max_position_embeddings 4096,
        use_flash_attn True, mla_naive False, num_threads 0 (the OpenMP default), name "custom".

        bias: q/k/v and o projections carry biases (default True, as for sneppx_config_init);
            ``attention_bias`` is HF's name for it and wins when given;
            ``qkv_bias`` / ``o_bias`` set one side alone (Qwen2: True / False).
        num_heads / num_kv_heads: aliases of num_attention_heads / num_key_value_heads.
        num_key_value_heads: default num_attention_heads.
        head_dim: default hidden_size / num_attention_heads.
        sliding_window: None or 0 = no window; else W keys including the query itself.
        partial_rotary_factor: rotate only int(head_dim * factor) dims of each head; a factor
            outside (0, 1] or one that rotates no pair (int(head_dim * factor) < 2) raises
            ValueError, and so does any factor for MLA, which rotates qk_rope_head_dim dims.
            from_config_json does not read it: transformers' LLaMA, Mistral and
            Qwen2 attention rotates the whole head whatever config.json says.
        rope_interleaved: rotate (x[2i], x[2i+1]) pairs instead of HF's (x[i], x[i+d/2]);
            default: True for MLA (DeepSeek's published weights pair them so, as
            from_config_json assumes), False otherwise.
        q_lora_rank ... v_head_dim: DeepSeek V2 MLA (kv_lora_rank turns it on).
        num_threads: 0 = the OpenMP default.
        weight_dtype: how the projections' weights are stored once packed: "float32" (the
            default), "bfloat16" or "float16" (half the bytes a decode step reads; rounded to
            nearest even at load), or "int8" (9/32 of the bytes: symmetric per group of 32
            input features of an output feature, a float32 scale max|w|/127 each);
            products still accumulate in float32; biases and norm weights stay float32.
            Another value raises ValueError naming weight_dtype.
        compute_dtype: what the projections multiply in: "float32" (the default) or, opt-in,
            "bfloat16": with weight_dtype "bfloat16" only, on hosts with AVX512_BF16, the
            activations entering each projection are rounded to bfloat16 (nearest even) and
            multiplied by vdpbf16ps, sums in float32: other numbers, ~2x the float32 rate on
            AMD Zen 4/5 but 0.7x on an Intel Xeon whose vdpbf16ps issues a quarter as often
            as an FMA (sneppx-bench's peak stage measures both).
            With other weights, or another value, ValueError naming compute_dtype; a host
            without AVX512_BF16 raises sneppx.UnsupportedError naming it.
        name: at most 63 of A-Z a-z 0-9 . _ - (it reaches logs and generated code).
        """
        args = dict(locals())   # every argument by name (no other local exists yet)
        args["num_attention_heads"] = _alias("num_attention_heads", num_attention_heads, "num_heads", num_heads)
        args["num_key_value_heads"] = _alias("num_key_value_heads", num_key_value_heads, "num_kv_heads",
                                             num_kv_heads)
        for field in S.CONFIG_FIELDS:
            if field.required and args[field.name] is None:
                alias = {"num_attention_heads": " (or num_heads)"}.get(field.name, "")
                raise TypeError(f"{field.name}{alias} is required")
        # Checked under their own names: the fields they set (qkv_bias, o_bias) are not what the caller gave.
        for flag_name, flag_value in (("bias", bias), ("attention_bias", attention_bias)):
            if flag_value is not None:
                _flag(flag_name, flag_value)
        if bias is not None and attention_bias is not None and bool(bias) != bool(attention_bias):
            raise TypeError(f"bias={bias!r} and attention_bias={attention_bias!r} disagree")
        both = attention_bias if attention_bias is not None else (True if bias is None else bias)
        args.update(qkv_bias=both if qkv_bias is None else qkv_bias, o_bias=both if o_bias is None else o_bias)

        config = S.Config()
        lib.sneppx_config_init(ctypes.byref(config))
        for field in S.CONFIG_FIELDS:   # in the struct's order, so a later field may default to an earlier one
            if args.get(field.name) is not None:
                _set_field(config, field, args[field.name])
            elif field.default_from:
                setattr(config, field.name, getattr(config, field.default_from))
        if rope_interleaved is None:
            config.rope_interleaved = config.kv_lora_rank > 0
        if partial_rotary_factor is not None:
            if config.kv_lora_rank > 0:   # the runtime reads rotary_dim only without MLA: it was dropped unseen
                raise ValueError(f"partial_rotary_factor: MLA (kv_lora_rank > 0) rotates the qk_rope_head_dim "
                                 f"({config.qk_rope_head_dim}) dims of each head; give that instead")
            config.rotary_dim = _partial_rotary_dim(config, partial_rotary_factor)
        self._init(config)

    def _init(self, config: S.Config) -> None:
        check(lib.sneppx_config_validate(ctypes.byref(config)))
        self._config = config
        self._lock = threading.RLock()
        self._layer: Optional[Layer] = None
        self._weights = SyntheticWeights()

    # ---------------------------------------------------------------- constructors

    @classmethod
    def from_name(cls, family: str, size: Optional[str] = None, *, weight_dtype: Optional[str] = None,
                  compute_dtype: Optional[str] = None, num_threads: Optional[int] = None) -> "LLMConfig":
        """A preset: ("llama3", "8B"), ("mistral", "7B") or a full name ("mistral-7B"), case-insensitive.
        weight_dtype, compute_dtype, num_threads: as for the constructor (default "float32", 0).

        Raises sneppx.UnknownPresetError (a ValueError) listing the valid names."""
        if not isinstance(family, str) or not (size is None or isinstance(size, str)):
            raise TypeError(f"from_name: expected strings, got {family!r}, {size!r}")
        config = S.Config()
        check(lib.sneppx_config_from_name(_c_text(family), _c_text(size) if size is not None else None,
                                          ctypes.byref(config)))
        if weight_dtype is not None:
            config.weight_dtype = _dtype("weight_dtype", weight_dtype)
        if compute_dtype is not None:
            config.compute_dtype = _dtype("compute_dtype", compute_dtype)
        if num_threads is not None:
            config.num_threads = _size("num_threads", num_threads, c_type="int")
        self = cls.__new__(cls)
        self._init(config)
        return self

    @classmethod
    def from_config_json(cls, path: "os.PathLike[str] | str", **overrides: Any) -> "LLMConfig":
        """The attention fields of a HF config.json (or of the directory holding it).

        model_type llama, mistral, qwen2 and deepseek_v2 are understood (Qwen2: q/k/v
        bias, no o bias; Llama, DeepSeek: attention_bias; Mistral: no bias and its
        sliding_window). Keyword overrides (e.g. use_flash_attn=False, num_threads=4) are applied last.

        The file is read by the C runtime's reader (sneppx_config_from_json), so C and
        Python accept the same files. Errors name the file and the field: FormatError
        (ValueError) for malformed files, UnsupportedError (NotImplementedError) for
        valid ones sneppx cannot run (another model_type, rope type, ...), OSError
        when the file cannot be read. The name is the directory holding the file, with
        characters other than A-Z a-z 0-9 . _ - made '_' (a name holds only those)."""
        if not isinstance(path, (str, bytes, os.PathLike)):
            raise TypeError(f"path: expected a file or directory path (str, bytes or os.PathLike), got {path!r}")
        text = os.fsdecode(path)
        if not text:
            # Path("") is ".": an unset variable would read the working directory's config.json.
            raise ValueError("path: an empty path; give a config.json or the directory holding it")
        if "\0" in text:
            raise ValueError(f"path: {text!r} contains a NUL character")
        path = Path(text)
        if path.is_dir():
            path = path / "config.json"
        config = S.Config()
        check(lib.sneppx_config_from_json_file(os.fsencode(path), ctypes.byref(config)))
        config.name = _name_bytes(_derived_name(path.resolve().parent.name) or config.name.decode())
        if overrides:
            kwargs = _hf.constructor_kwargs(config)
            # An override by another name replaces the file's value, not disagrees with it.
            if "bias" in overrides or "attention_bias" in overrides:
                del kwargs["qkv_bias"], kwargs["o_bias"]
            for alias, field in (("num_heads", "num_attention_heads"), ("num_kv_heads", "num_key_value_heads")):
                if alias in overrides:
                    del kwargs[field]
            kwargs.update(overrides)
            return cls(**kwargs)
        self = cls.__new__(cls)
        self._init(config)
        return self

    @staticmethod
    def names() -> List[str]:
        """Every preset name from_name() accepts as one string ("llama3-8B", ...)."""
        return [lib.sneppx_preset_name(i).decode() for i in range(lib.sneppx_preset_count())]

    # ---------------------------------------------------------------- attributes

    # The fields' own attributes (hidden_size, rope_theta, qkv_bias, ...) are made from
    # S.CONFIG_FIELDS below the class; these are computed.

    @property
    def name(self) -> str:
        return self._config.name.decode()

    bias = property(lambda self: bool(self._config.qkv_bias or self._config.o_bias),
                    doc="Any projection carries a bias (qkv_bias / o_bias tell which).")
    attention_bias = bias
    is_mla = property(lambda self: self._config.kv_lora_rank > 0,
                      doc="DeepSeek V2 multi-head latent attention.")

    @property
    def head_dim(self) -> int:
        """Query/key head dim: head_dim, hidden_size / num_attention_heads, or for MLA nope + rope."""
        c = self._config
        if c.kv_lora_rank > 0:
            return c.qk_nope_head_dim + c.qk_rope_head_dim
        return c.head_dim or c.hidden_size // c.num_attention_heads

    @property
    def rotary_dim(self) -> int:
        c = self._config
        if c.kv_lora_rank > 0:
            return c.qk_rope_head_dim
        return c.rotary_dim or self.head_dim

    @property
    def partial_rotary_factor(self) -> float:
        return self.rotary_dim / self.head_dim

    @property
    def rope_scaling(self) -> Optional[Dict[str, Any]]:
        """HF's rope_scaling dict (None for plain RoPE); a fresh copy."""
        return _hf.rope_scaling_dict(self._config.rope_scaling)

    @property
    def softmax_scale(self) -> float:
        """The scale of Q.K^T: head_dim^-0.5 (DeepSeek: (nope+rope)^-0.5 * mscale^2)."""
        return lib.sneppx_config_softmax_scale(ctypes.byref(self._config))

    @property
    def weights_source(self) -> str:
        """Where the weights come from: "synthetic(seed=0x5eed5eed)" (see
        sneppx_layer_create in include/sneppx/layer.h), "state_dict(<n> tensors)",
        "state_dict(<n> tensors, layer=<n>)" or "safetensors('<path>', layer=<n>)"; after
        tensor_parallel(), followed by ", tensor_parallel(rank R of W)"."""
        return self._weights.description

    @property
    def kernel_keys(self) -> List[str]:
        """Canonical keys of the kernels the layer resolved ([] before the layer exists)."""
        layer = self._layer
        return layer.keys() if layer is not None else []

    @property
    def use_flash_attn(self) -> bool:
        """Flash attention (True, default) or the materialized SDPA reference (False)."""
        return bool(self._config.use_flash_attn)

    @use_flash_attn.setter
    def use_flash_attn(self, value: bool) -> None:
        flag = _flag("use_flash_attn", value)
        with self._lock:
            if self._layer is not None:
                self._layer.set_flash(flag)
            self._config.use_flash_attn = flag

    @property
    def mla_naive(self) -> bool:
        """MLA only: expand kv_b_proj to per-head K/V (the verification path) instead of absorbing it.
        A KV cache holds the absorbed form's latent rows: cached forwards refuse a naive layer
        (UnsupportedError naming mla_naive)."""
        return bool(self._config.mla_naive)

    @mla_naive.setter
    def mla_naive(self, value: bool) -> None:
        def change(config: S.Config) -> None:
            flag = _flag("mla_naive", value)
            if flag and config.kv_lora_rank == 0:
                raise ValueError("mla_naive: applies to MLA configs (kv_lora_rank > 0) only")
            config.mla_naive = flag

        with self._lock:
            self._rebuild(change)

    @property
    def num_threads(self) -> int:
        """Threads every parallel region of the layer runs on (0: OpenMP's default)."""
        return self._config.num_threads

    @num_threads.setter
    def num_threads(self, value: int) -> None:
        """An integer in [0, SNEPPX_MAX_THREADS] (0: OpenMP's default): TypeError for another type
        (bool included), ValueError for another value, both naming num_threads. The layer sizes its
        per-thread buffers and packing for its count when it is made, so an existing layer is made
        again (weights repacked from their source, kernels from the cache) before this returns;
        the next forward runs on the new count."""
        def change(config: S.Config) -> None:
            config.num_threads = _hf.c_count("num_threads", value, "int")
            check(lib.sneppx_config_validate(ctypes.byref(config)))   # names config.num_threads

        with self._lock:
            # A shard rebuilds whatever its own count was: the rebuild is collective.
            if is_sharded(self) or _hf.c_count("num_threads", value, "int") != self._config.num_threads:
                self._rebuild(change)

    def extend_context(self, new_max_positions: int) -> None:
        """NTK-aware context extension: rope_theta *= (n / old)^(d / (d - 2)) with d the
        rotary dim, and max_position_embeddings becomes n = new_max_positions (n must
        exceed it and be at most 2^40). The argument has C's name, which the errors use."""
        def change(config: S.Config) -> None:
            n = _hf.c_count("new_max_positions", new_max_positions)
            check(lib.sneppx_config_extend_context(ctypes.byref(config), n))

        with self._lock:
            self._rebuild(change)

    def _rebuild(self, change) -> None:
        """Applies change (which checks its value) to a copy of the config; rebuilds an
        existing layer with the same weights before committing, so a failure leaves
        everything as it was. Tensor-parallel: every rank's change is checked before any
        rank rebuilds (agreed())."""
        def changed() -> S.Config:
            config = S.Config.from_buffer_copy(self._config)
            change(config)
            return config

        config = agreed(self, changed)
        if self._layer is not None:
            self._layer = self._weights.create(config)
        self._config = config

    def _copy(self, weights_copy) -> "LLMConfig":
        with self._lock:
            config = S.Config.from_buffer_copy(self._config)
            weights = weights_copy(self._weights)
        other = type(self).__new__(type(self))
        other._init(config)
        other._weights = weights
        return other

    def __copy__(self) -> "LLMConfig":
        # The weight sources are never changed after construction: sharing one is safe.
        return self._copy(lambda weights: weights)

    def __deepcopy__(self, memo: Dict[int, Any]) -> "LLMConfig":
        return self._copy(lambda weights: copy.deepcopy(weights, memo))

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError("LLMConfig cannot be pickled: its layer (compiled kernels, packed weights) lives in C "
                        "memory; pickle the constructor's keyword arguments (or the preset name / config.json "
                        "path) and the weights instead, and rebuild it. copy.copy / copy.deepcopy work in "
                        "the same process")

    def __repr__(self) -> str:
        c = self._config
        parts = [repr(self.name), f"hidden_size={c.hidden_size}", f"num_attention_heads={c.num_attention_heads}"]
        if self.is_mla:
            parts += [f"q_lora_rank={self.q_lora_rank}", f"kv_lora_rank={c.kv_lora_rank}",
                      f"qk_nope_head_dim={c.qk_nope_head_dim}", f"qk_rope_head_dim={c.qk_rope_head_dim}",
                      f"v_head_dim={c.v_head_dim}"]
        else:
            parts += [f"num_key_value_heads={c.num_key_value_heads}", f"head_dim={self.head_dim}"]
            if self.rotary_dim != self.head_dim:
                parts.append(f"rotary_dim={self.rotary_dim}")
        parts += [f"rope_theta={c.rope_theta:g}"]
        if self.rope_scaling:
            parts.append(f"rope_scaling={self.rope_scaling}")
        parts += [f"max_position_embeddings={c.max_position_embeddings}", f"sliding_window={self.sliding_window}",
                  f"qkv_bias={self.qkv_bias}", f"o_bias={self.o_bias}", f"use_flash_attn={self.use_flash_attn}"]
        if self.is_mla:
            parts.append(f"mla_naive={self.mla_naive}")
        if c.weight_dtype:
            parts.append(f"weight_dtype={self.weight_dtype!r}")
        if c.compute_dtype:
            parts.append(f"compute_dtype={self.compute_dtype!r}")
        parts.append(f"weights={self.weights_source!r}")
        return f"LLMConfig({', '.join(parts)})"

    # ---------------------------------------------------------------- weights and forward

    def tensor_shapes(self) -> Dict[str, Tuple[int, ...]]:
        """The self_attn tensors this config's layer holds, by HF name, with their shapes
        (what load_state_dict() and load_safetensors() expect)."""
        return {name: shape for name, shape, _ in expected_tensors(self._config)}

    def load_state_dict(self, state_dict: Mapping[str, Any], dtype: Optional[str] = None, *,
                        layer: Optional[int] = None) -> None:
        """Loads one self_attn module's tensors by HF name ("q_proj.weight", "q_proj.bias", ...;
        DeepSeek: "q_a_proj.weight", "kv_a_proj_with_mqa.weight", ...), with or without a
        prefix ending in "self_attn." (e.g. "model.layers.0.self_attn.").

        layer: take layer `layer`'s tensors of a whole model's state dict (e.g.
        LlamaForCausalLM.state_dict()), as load_safetensors(path, layer=N) takes them from a
        file: the keys "<prefix>layers.<layer>.self_attn.<name>" ("model.layers.3.self_attn.
        q_proj.weight", "layers.3.self_attn.q_proj.weight") of the one prefix holding every
        tensor the config takes (a multimodal model's vision tower is passed over; two
        complete prefixes raise ValueError); every other tensor is ignored and not read. A
        layer with no such key raises ValueError naming layer (and the layers the state dict
        holds); a negative layer ValueError, a non-integer (bool too) TypeError.

        Values are any float array-likes of exactly the expected shape: numpy arrays, torch
        tensors (bfloat16 ones too, read through their bits; Parameters through .detach(); on
        another device than the CPU, ValueError naming the tensor), ml_dtypes bfloat16 arrays.
        bfloat16 and float16 tensors are copied once as their 16 bits, float32 ones as float32,
        others converted to float32; the copies are kept (so extend_context() / mla_naive can
        repack them; changing the caller's arrays afterwards changes nothing here, as in torch).
        dtype: how the layer stores the projections ("float32", "bfloat16", "float16", "int8";
        the names of sneppx_dtype), which becomes the config's weight_dtype; None keeps the
        config's. Missing, extra or mis-shaped tensors raise ValueError, a non-float dtype
        TypeError, each naming the tensor."""
        self._load(lambda: StateDictWeights(self._config, state_dict, layer), dtype, layer)

    def load_safetensors(self, path: "os.PathLike[str] | str", layer: int = 0, dtype: Optional[str] = None) -> None:
        """Loads layer `layer`'s self_attn tensors from a HF checkpoint: a directory, a
        .safetensors file or a sharded checkpoint's model.safetensors.index.json. Only that
        layer's tensors are read (a file truncated meanwhile is a FileError, not a crash),
        and packed straight from the file's F32/F16/BF16/F64 bytes, a few rows at a time
        (no float32 copy of the layer).

        dtype: how the layer stores the projections, as for load_state_dict (None: the
        config's weight_dtype). Raises sneppx.FormatError (ValueError) for missing, extra or
        mis-shaped tensors and malformed files, sneppx.UnsupportedError for a tensor of
        another dtype, sneppx.FileError (OSError) for unreadable ones, naming the tensor and
        the file."""
        self._load(lambda: CheckpointWeights(path, layer), dtype)

    def _load(self, make_source: Any, dtype: Optional[str], layer: Optional[int] = None) -> None:
        """Creates the layer from make_source() (stored as dtype, if given), then commits both.
        Tensor-parallel: every rank's source and dtype are checked before any rank creates,
        and a state dict's layer compared (a checkpoint's the create compares)."""
        source, weight_dtype = agreed(self, lambda: (make_source(),
                                                     None if dtype is None else _dtype("dtype", dtype)),
                                      ("layer", layer))
        source = keep_sharding(self._weights, source)
        with self._lock:
            config = S.Config.from_buffer_copy(self._config)
            if weight_dtype is not None:
                config.weight_dtype = weight_dtype
            self._layer = source.create(config)
            self._config = config
            self._weights = source

    def tensor_parallel(self, comm: Any) -> None:
        """Splits this layer by heads over the ranks of comm, an mpi4py communicator
        (tensor parallelism; needs the libsneppx_mpi of an MPI build): each rank holds its
        query heads' rows of q_proj, the K/V heads they read (replicated when the ranks
        outnumber them), the matching columns of o_proj (MLA: its heads' rows of q_proj /
        q_b_proj and kv_b_proj; q_a_proj, kv_a_proj_with_mqa and the norms whole), and
        forward_mha returns the whole output on every rank, summed over the ranks.

        Collective: call it, forward_mha, forward_ragged and the loads on every rank of
        comm in the same order with the same arguments (the same hidden states too). The
        weights loaded before or after stay this config's: each rank reads only its rows
        and columns of a checkpoint. A cache from kv_cache() then holds this rank's K/V
        heads. Forwards run over the layer's own duplicate of comm; loads and settings that
        rebuild the layer need comm itself (CommError once freed). Raises
        InvalidArgumentError on every rank for a number of ranks that cannot split the heads
        (listing those that can) or a rank with another config or other weights, naming the
        first difference; CommError when MPI fails."""
        tensor_parallel(self, comm)

    @property
    def shard(self) -> Optional[Dict[str, Any]]:
        """After tensor_parallel(): this rank's {"rank", "world", "q_heads": (first, end),
        "kv_heads": (first, end)}; None otherwise."""
        return shard_info(self)

    def warmup(self) -> None:
        """Compiles (or loads from the disk cache) every kernel this config uses, flash and
        SDPA, with and without a mask, and decode over a KV cache of each element type,
        without creating a layer."""
        check(lib.sneppx_layer_warmup(ctypes.byref(self._config)))

    def _current_layer(self) -> Layer:
        layer = self._layer
        if layer is None:
            with self._lock:
                if self._layer is None:
                    self._layer = self._weights.create(self._config)
                layer = self._layer
        return layer

    def kv_cache(self, batch: int = 1, *, max_tokens: int, page_size: Optional[int] = None, num_layers: int = 1,
                 dtype: Any = "float32") -> KVCache:
        """A paged KV cache for this layer's shape (sneppx_kv_cache_create): `batch` empty rows
        that share one page pool, sized for every row at max_tokens tokens plus one page per
        row for copy-on-write after fork(). max_tokens sizes the pool, it does not cap a row:
        one row may grow past it while pages are free, and a forward that finds the pool
        short raises OutOfMemoryError and leaves the cache as it was. page_size a power of two (None: the
        library's default, SNEPPX_KV_DEFAULT_PAGE_SIZE in sneppx/kv_cache.h);
        num_layers: layers of this shape that share it (forward_mha's layer_idx).
        dtype: how K (after RoPE) and V are stored: "float32" (default), "bfloat16" or
        "float16" (rounded to nearest even), or "int8" (a float32 scale per token and K/V
        head, max|x| / 127; MLA: per latent row); numpy / torch dtypes of those names too.
        Attention widens them to float32. Another value raises ValueError naming dtype."""
        return KVCache(layer_config(self), batch, max_tokens, page_size, num_layers, dtype)

    def forward_mha(self, hidden_states: Any, attention_mask: Any = None, position_ids: Any = None,
                    past_key_value: Optional[KVCache] = None, layer_idx: int = 0) -> Any:
        """The attention module's forward, HF semantics: [batch, seq_len, hidden_size] -> same shape.

        hidden_states: any real array-like; float64, other dtypes and non-contiguous arrays
            are converted once (np.ascontiguousarray(x, dtype=np.float32)); a finite value
            beyond the float32 range raises ValueError rather than becoming inf. A torch
            tensor must be on the CPU (else ValueError); a contiguous float32 one is read in
            place (no copy). Tensors that require grad are read through .detach(): sneppx
            records no autograd graph, and gradients do not flow through it.
        attention_mask: None (causal, plus the sliding window if the config has one), or
            [batch or 1, 1, seq_len, seq_len]: float = additive (<= -1e30 or -inf masks;
            taken as final, nothing added on top), bool = True where attention is allowed.
        position_ids: None (0..seq_len-1) or integers [batch or 1, seq_len].
        past_key_value: a KVCache of `batch` rows (kv_cache()): the seq_len new tokens of each
            row are appended to it at layer_idx and attend to everything the row cached
            before. position_ids then default to each row's cached length + 0..seq_len-1, and
            attention_mask may be [batch or 1, 1, seq_len, cached + seq_len] (HF's 4-D mask
            with a past; every row must then have the same cached length) or HF's 2-D padding
            mask [batch, cached + seq_len] of 1 / 0.

        Returns a new float32 array: a torch tensor (torch.float32, sharing the result's memory,
        requires_grad False) when hidden_states is a torch tensor, else an ndarray. Wrong shapes
        raise ValueError, wrong dtypes TypeError, naming the argument and the expected shape.
        NaN inputs propagate to the output.

        Tensor-parallel (tensor_parallel()): a collective call. A wrong argument on one
        rank raises there and fails the call on every rank ("rank R of W: ..."); an empty
        batch goes to C like any other, which refuses it on every rank."""
        if past_key_value is not None:
            return output_like(hidden_states, self._forward_cached(hidden_states, attention_mask, position_ids,
                                                                   past_key_value, layer_idx))
        with refused_on_every_rank(self):
            x = hidden_states_array(hidden_states, self._config.hidden_size)
            batch, seq_len = x.shape[0], x.shape[1]
            mask = attention_mask_array(attention_mask, batch, seq_len)
            positions = position_ids_array(position_ids, batch, seq_len)
            out = np.empty_like(x)   # in the block: a MemoryError here is this rank's refusal too
        if x.size or is_sharded(self):
            self._current_layer().forward(x, mask, positions, out)
        return output_like(hidden_states, out)

    def _forward_cached(self, hidden_states: Any, attention_mask: Any, position_ids: Any, cache: Any,
                        layer_idx: int) -> np.ndarray:
        with refused_on_every_rank(self):
            x = hidden_states_array(hidden_states, self._config.hidden_size)
            if not isinstance(cache, KVCache):
                raise TypeError(f"past_key_value: expected a sneppx KVCache (LLMConfig.kv_cache()), got "
                                f"{type(cache).__name__}")
            layer_idx = layer_index(layer_idx, cache.num_layers)
            batch, seq_len = x.shape[0], x.shape[1]
            if seq_len == 0:
                raise ValueError("hidden_states: seq_len is 0; a cached forward appends at least one token per row")
        with cache._lock:
            with refused_on_every_rank(self):
                if batch != cache.batch:
                    raise ValueError(f"hidden_states: batch {batch} does not match the cache's {cache.batch} rows")
                masks = None
                if attention_mask is not None:
                    lengths = cache.layer_lengths(layer_idx)
                    if len(set(lengths)) != 1:
                        raise ValueError(f"attention_mask: the cache's rows hold {lengths} tokens at layer "
                                         f"{layer_idx}; a mask needs one cached length for every row (use "
                                         "forward_ragged)")
                    masks = cached_mask_planes(attention_mask, batch, seq_len, lengths[0],
                                               self._config.sliding_window)
                positions = position_ids_array(position_ids, batch, seq_len)
                out = np.empty_like(x)
            layer = self._current_layer()
            try:
                with cache.in_rows("hidden_states"):   # seq_ids[b] is the batch row b
                    layer.forward_cached(cache._handle, layer_idx, cache._rows, [seq_len] * batch,
                                         x.reshape(batch * seq_len, -1), positions, masks,
                                         out.reshape(batch * seq_len, -1))
            except InvalidArgumentError as error:
                # The C call's masks[b] is the plane of attention_mask's batch row b; a sharded
                # layer's ranks name masks too, after "rank R of W: " when another rank refused.
                renamed = _C_MASKS.sub(r"\1attention_mask", str(error), count=1)
                if renamed == str(error):
                    raise
                raise InvalidArgumentError(renamed) from None
        return out

    def forward_ragged(self, cache: KVCache, rows: Any, hidden_states: Any, position_ids: Any = None,
                       layer_idx: int = 0) -> List[Any]:
        """One call for a server's mixed batch: row rows[i] of the cache gets the tokens
        hidden_states[i] ([q_len_i, hidden_size], q_len_i >= 1: a prompt chunk, or one token
        to decode), appended at layer_idx; they attend causally (and within the window) to
        what the row holds. position_ids: None (each row's cached length + 0..q_len_i-1) or a
        list of integer arrays [q_len_i]. Returns the outputs, [q_len_i, hidden_size] float32
        each: a torch tensor where hidden_states[i] is one (as forward_mha), else an ndarray.
        The projections run once over all the rows' tokens. Tensor-parallel: collective, as
        forward_mha; no rows at all go to C like any other call, which refuses them."""
        with refused_on_every_rank(self):
            if not isinstance(cache, KVCache):
                raise TypeError(f"cache: expected a sneppx KVCache (LLMConfig.kv_cache()), got "
                                f"{type(cache).__name__}")
            layer_idx = layer_index(layer_idx, cache.num_layers)
            rows = per_row_list("rows", rows)
            chunks = per_row_list("hidden_states", hidden_states)
            if len(chunks) != len(rows):
                raise ValueError(f"hidden_states: {len(chunks)} arrays for {len(rows)} rows")
            hidden_size = self._config.hidden_size
            packed = []
            for i, chunk in enumerate(chunks):
                packed.append(token_rows_array(f"hidden_states[{i}]", chunk, hidden_size))
            q_lens = [chunk.shape[0] for chunk in packed]
            positions = None
            if position_ids is not None:
                position_list = per_row_list("position_ids", position_ids)
                if len(position_list) != len(rows):
                    raise ValueError(f"position_ids: {len(position_list)} arrays for {len(rows)} rows")
                # np.empty for no rows: np.concatenate refuses an empty list.
                positions = np.concatenate([row_positions_array(f"position_ids[{i}]", p, q_lens[i])
                                            for i, p in enumerate(position_list)] or [np.empty(0, np.int64)])
            x = np.ascontiguousarray(np.concatenate(packed)) if packed else np.empty((0, hidden_size), np.float32)
            out = np.empty_like(x)
        if not rows and not is_sharded(self):
            return []
        with cache._lock:
            with refused_on_every_rank(self):
                seq_ids = cache._distinct_seq_ids(rows)
            with cache.in_rows():
                self._current_layer().forward_cached(cache._handle, layer_idx, seq_ids, q_lens, x, positions, None,
                                                     out)
        return [output_like(chunk, part) for chunk, part in zip(chunks, np.split(out, np.cumsum(q_lens)[:-1]))]


#: The C cached forward's name for forward_mha's attention_mask, as its messages begin.
_C_MASKS = re.compile(r"^((?:rank \d+ of \d+: )?)masks(?=[\[:])")


def _field_property(field: Any) -> property:
    """The read-only attribute of a config field, as the field table says LLMConfig shows it."""
    name = field.name
    if field.python == "flag":
        return property(lambda self: bool(getattr(self._config, name)), doc=field.doc)
    if field.python == "none_if_0":
        return property(lambda self: getattr(self._config, name) or None, doc=field.doc)
    if field.python == "dtype":
        return property(lambda self: _dtype_name(getattr(self._config, name)), doc=field.doc)
    return property(lambda self: getattr(self._config, name), doc=field.doc)


for _field in S.CONFIG_FIELDS:
    if _field.python != "own" and _field.name not in vars(LLMConfig):
        setattr(LLMConfig, _field.name, _field_property(_field))
LLMConfig.num_heads = LLMConfig.num_attention_heads
LLMConfig.num_kv_heads = LLMConfig.num_key_value_heads


def _set_field(config: S.Config, field: Any, value: Any) -> None:
    """One constructor argument into its C field, converted for the field's C type; TypeError /
    ValueError name the argument."""
    if field.name == "name":
        config.name = _name_bytes(value)
    elif field.name == "rope_scaling":
        _hf.fill_rope_scaling(config.rope_scaling, value)
    elif field.c_type == "double":
        setattr(config, field.name, _hf._real(field.name, value))
    elif field.python == "flag":
        setattr(config, field.name, _flag(field.name, value))
    elif field.python == "dtype":
        setattr(config, field.name, _dtype(field.name, value))
    else:   # sizes: int64_t, or int (num_threads)
        setattr(config, field.name, _size(field.name, value, c_type="int" if field.c_type == "int" else "int64"))


def _c_text(text: str) -> bytes:
    """UTF-8 for a C string, every character kept visible: what UTF-8 cannot encode (lone
    surrogates, e.g. from undecodable file names) becomes a backslash escape, and so does
    NUL, which would otherwise end the C string early (from_name("llama3-8B\\0x") was llama3-8B)."""
    return text.encode("utf-8", "backslashreplace").replace(b"\0", b"\\x00")


def _name_bytes(name: str) -> bytes:
    """The name for the C struct, whose bytes sneppx_config_validate checks
    (A-Z a-z 0-9 . _ -: it reaches generated code and logs)."""
    if not isinstance(name, str):
        raise TypeError(f"name: expected a string, got {name!r}")
    encoded = _c_text(name)
    if len(encoded) > S.NAME_MAX - 1:
        raise ValueError(f"name: {len(encoded)} bytes, more than {S.NAME_MAX - 1}")
    return encoded


def _derived_name(text: str) -> str:
    """A name made of a directory's name: characters a name may not hold become '_',
    clipped to the field."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:S.NAME_MAX - 1]
