"""sneppx.hf's torch side: the module that replaces a transformers self-attention, the
transformers Cache over one sneppx KVCache, and patch(). Imported by sneppx.hf on first
use only: it needs torch and transformers."""
import copy
import ctypes
import importlib
import json
import types
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from transformers.cache_utils import Cache
from transformers.generation import GenerationMode
# Private, and the one place that says whether this forward records attention weights
# (transformers 5.24, pinned by scripts/venv.sh).
from transformers.utils.output_capturing import _active_collector

from . import _hf
from . import _structs as S
from ._kv_cache import _count
from ._library import lib
from .config import LLMConfig
from .errors import Error, UnsupportedError, check

# model_type -> (module, attention class) of the families patch() replaces.
_FAMILIES = {
    "llama": ("transformers.models.llama.modeling_llama", "LlamaAttention"),
    "mistral": ("transformers.models.mistral.modeling_mistral", "MistralAttention"),
    "qwen2": ("transformers.models.qwen2.modeling_qwen2", "Qwen2Attention"),
    "deepseek_v2": ("transformers.models.deepseek_v2.modeling_deepseek_v2", "DeepseekV2Attention"),
}
# The masks these attention implementations make are HF's 4-D bool / additive masks (or
# None for plain causal), which forward_mha reads; flash's 2-D and flex's BlockMask are not.
_MASK_IMPLEMENTATIONS = ("eager", "sdpa")


def _patch_error(layer: str, reason: str, kind: type = UnsupportedError) -> Exception:
    return kind(f"sneppx.hf.patch: {layer}: {reason}; nothing was changed")


# ------------------------------------------------------------------ config and weights

def config_dict(hf_config: Any) -> Dict[str, Any]:
    """The model's config as the config.json the runtime's reader takes. transformers 5
    keeps rope_theta, the scaling and partial_rotary_factor in one rope_parameters dict,
    which the reader also takes; they are given at the top, as in older config.json files,
    where it ignores partial_rotary_factor or, beside a scaled RoPE, refuses it
    (runtime/config_json.c)."""
    values = json.loads(hf_config.to_json_string(use_diff=False))
    rope = values.pop("rope_parameters", None)
    if isinstance(rope, dict):
        rope = dict(rope)
        if rope.get("rope_theta") is not None:
            values["rope_theta"] = rope.pop("rope_theta")
        rope.pop("rope_theta", None)
        factor = rope.pop("partial_rotary_factor", None)
        if factor is not None:
            values["partial_rotary_factor"] = factor
        values["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else rope
    return values


def llm_config(hf_config: Any, **overrides: Any) -> LLMConfig:
    """An LLMConfig of a transformers config, read by the runtime's config.json reader
    (sneppx_config_from_json: the same model types, bias and window rules, and errors, as
    LLMConfig.from_config_json); overrides (weight_dtype, num_threads, ...) apply last."""
    text = json.dumps(config_dict(hf_config)).encode()
    config = S.Config()
    check(lib.sneppx_config_from_json(text, len(text), ctypes.byref(config)), "model.config", ("config.json: ",))
    kwargs = _hf.constructor_kwargs(config)
    kwargs.update(overrides)
    return LLMConfig(**kwargs)


def _weight_arrays(tensors: Dict[str, Any]) -> Dict[str, Any]:
    """A module's tensors by HF name, as load_state_dict takes them: read through
    .detach() (no autograd), on the CPU; bfloat16 and float16 tensors as they are (they
    reach the layer as their bits, so a bfloat16 model packed as weight_dtype "bfloat16"
    keeps every bit), any other type as float32."""
    out = {}
    for name, tensor in tensors.items():
        if isinstance(tensor, torch.Tensor):    # load_state_dict's other array-likes go as they are
            tensor = tensor.detach().to(device="cpu")
            if tensor.dtype not in (torch.bfloat16, torch.float16):
                tensor = tensor.to(dtype=torch.float32)
        out[name] = tensor
    return out


# ------------------------------------------------------------------ the cache

class SneppxCache(Cache):
    """A transformers Cache holding one sneppx KVCache (LLMConfig.kv_cache) for every layer
    of a patched model: `batch_size` rows of up to `max_tokens` tokens each. Its lengths
    (get_seq_length, get_mask_sizes) are the rows' cached tokens, so the model's positions
    and masks come out as with a DynamicCache. Beam search's reorder and the batch
    repeat / select of other strategies are refused (NotImplementedError), and so is
    copy.deepcopy (TypeError, as for a KVCache: the pages are not copied behind the
    caller's back); to reuse a prompt's cache, fork its rows (cache.kv.fork(row))."""

    def __init__(self, model: Any, batch_size: int, max_tokens: int):
        state = getattr(model, "_sneppx_hf", None)
        if state is None:
            raise ValueError("model: not patched; call sneppx.hf.patch(model) first")
        super().__init__(layers=[])
        # Checked here so that errors name this call's argument (kv_cache's is "batch").
        batch_size = _count("batch_size", batch_size, 1)
        self.kv = state.config.kv_cache(batch_size, max_tokens=max_tokens, num_layers=state.num_layers)
        self._window = state.config.sliding_window

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.kv.get_seq_length(layer_idx)

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> Tuple[int, int]:
        # Keys are indexed from each row's first token (masks span cached + new tokens).
        return self.get_seq_length(layer_idx) + query_length, 0

    def get_max_length(self, layer_idx: Optional[int] = None) -> int:
        return self.kv.max_tokens

    @property
    def batch_size(self) -> int:
        return self.kv.batch

    @property
    def is_linear(self) -> List[bool]:
        # Cache's own answer reads its (here empty) layers, and all([]) made generate() take
        # this for a Mamba-like cache: a continuation re-fed the tokens already cached.
        return [False] * self.kv.num_layers

    @property
    def is_croppable(self) -> bool:
        # Cache's own answer, all([]) over its (empty) layers, said every rollback works. Under a
        # sliding window the sneppx cache gives back the pages of tokens the window left, which
        # crop() past them would need (transformers' sliding layers keep them while recording).
        return not self._window

    def reset(self) -> None:
        self.kv.reset()

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
        # Only transformers' own attention modules call update(): this cache went to a model (or
        # a module) that sneppx.hf.patch did not patch, and Cache's own update failed on its
        # empty layers with an IndexError.
        raise ValueError(f"cache: a SneppxCache holds sneppx layers' keys and values; layer {layer_idx} is "
                         "transformers' own attention (a model sneppx.hf.patch did not patch): pass it a "
                         "DynamicCache, or this cache to the patched model")

    def crop(self, tokens_to_remove: int) -> None:
        """Drops the last -tokens_to_remove tokens of every row (transformers' convention:
        0 or negative); a refusal cuts no row."""
        if tokens_to_remove > 0:
            raise ValueError(f"tokens_to_remove: {tokens_to_remove}; crop takes 0 or a negative count")
        lengths = self.kv.lengths
        self.kv.truncate_rows(range(len(lengths)), [max(length + tokens_to_remove, 0) for length in lengths])

    def _refuse(self, what: str) -> None:
        raise NotImplementedError(f"SneppxCache: {what} is not supported (beam search and strategies that "
                                  "reorder or copy cache rows); use greedy or sampling decoding")

    def reorder_cache(self, beam_idx: Any) -> None:
        self._refuse("reorder_cache")

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._refuse("batch_repeat_interleave")

    def batch_select_indices(self, indices: Any) -> None:
        self._refuse("batch_select_indices")

    def __repr__(self) -> str:
        return f"SneppxCache({self.kv!r})"


# ------------------------------------------------------------------ the module

class SneppxAttention(torch.nn.Module):
    """A transformers self-attention module's forward on a sneppx layer (`self.sneppx`, an
    LLMConfig holding the replaced module's weights). Called as the decoder layer calls the
    original: hidden_states, attention_mask (HF's 4-D mask or None), position_ids, cache.
    `config` is the replaced module's transformers config, whose attn_implementation says
    what masks the model makes."""

    def __init__(self, sneppx_config: LLMConfig, layer_idx: int, name: str, dtype: torch.dtype, config: Any = None):
        super().__init__()
        self.sneppx = sneppx_config
        self.layer_idx = layer_idx
        self.layer_name = name
        self.config = config
        # Follows model.to(dtype), so outputs keep the model's dtype; holds no data.
        self.register_buffer("dtype_marker", torch.empty(0, dtype=dtype), persistent=False)

    def extra_repr(self) -> str:
        return f"layer_idx={self.layer_idx}, sneppx={self.sneppx!r}"

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        # The replaced module's tensors were packed and dropped: a state_dict without them
        # would save a checkpoint whose attention transformers re-initializes at random.
        raise _no_tensors(self.layer_name, "state_dict")

    def _load_from_state_dict(self, state_dict: Dict[str, Any], prefix: str, local_metadata: Any, strict: bool,
                              missing_keys: List[str], unexpected_keys: List[str], error_msgs: List[str]) -> None:
        # model.load_state_dict() reaches the replaced module's tensors here. Nothing else would
        # take them: the model would run the new weights around the old attention. They are
        # packed into the sneppx layer, all of a layer's at once (its packed copy cannot take
        # one tensor alone); keys are reported missing or unexpected as the replaced module would.
        expected = self.sneppx.tensor_shapes()
        ours = {key[len(prefix):]: value for key, value in state_dict.items() if key.startswith(prefix)}
        given = {name: value for name, value in ours.items() if name in expected}
        missing = [prefix + name for name in expected if name not in given]
        if strict:
            missing_keys.extend(missing)
            unexpected_keys.extend(prefix + name for name in ours if name not in expected)
        if not given:
            return
        if missing:
            error_msgs.append(f"{self.layer_name}: load_state_dict: a patched attention module takes all of its "
                              f"tensors at once; given {sorted(given)}, missing {sorted(missing)}")
            return
        try:
            self.sneppx.load_state_dict(_weight_arrays(given))
        except (Error, ValueError, TypeError) as error:
            error_msgs.append(f"{self.layer_name}: load_state_dict: {error}")

    def forward(self, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None, cache: Any = None, past_key_values: Any = None,
                **kwargs: Any) -> Tuple[torch.Tensor, None]:
        if self.training:
            raise RuntimeError(f"{self.layer_name}: a sneppx layer runs inference only (no autograd, no "
                               "dropout); call model.eval()")
        if hidden_states.device.type != "cpu":
            raise ValueError(f"{self.layer_name}: hidden_states on {hidden_states.device}; sneppx runs on the CPU")
        self._check_implementation()
        if _attentions_recorded():
            raise ValueError(f"{self.layer_name}: output_attentions: a sneppx layer computes no attention weights "
                             "(transformers would return none of them); leave output_attentions unset")
        if cache is None:
            cache = past_key_values
        x = hidden_states.detach().to(torch.float32).numpy()
        mask = _mask_array(attention_mask)
        positions = None if position_ids is None else position_ids.detach().to(torch.int64).numpy()
        if isinstance(cache, SneppxCache):
            out = self.sneppx.forward_mha(x, mask, positions, past_key_value=cache.kv, layer_idx=self.layer_idx)
        else:
            if cache is not None:
                self._claim(cache)
            out = self.sneppx.forward_mha(x, mask, positions)
        return torch.from_numpy(out).to(self.dtype_marker.dtype), None

    def _check_implementation(self) -> None:
        """patch() checked the attn_implementation, but model.set_attn_implementation() can change
        it afterwards: "paged|eager" (and implementations transformers has no mask function for)
        make no mask at all, which sneppx would run as plainly causal, padding attended; flex's
        is a BlockMask. Refused before the cache is touched."""
        implementation = getattr(self.config, "_attn_implementation", None)
        if self.config is not None and implementation not in _MASK_IMPLEMENTATIONS:
            raise UnsupportedError(f"{self.layer_name}: attn_implementation {implementation!r} (set after "
                                   "sneppx.hf.patch) makes masks sneppx cannot read; switch back with "
                                   "model.set_attn_implementation('sdpa') or 'eager'")

    def _claim(self, cache: Any) -> None:
        """Another Cache (transformers makes a DynamicCache for a plain forward with
        use_cache): run without it, once. It holds nothing afterwards, so a forward
        continuing from it would compute the wrong positions: refused. Anything else (continuous
        batching's PagedAttentionCache, whose batches pack several sequences in a row, with no
        mask) is refused outright."""
        if not isinstance(cache, Cache):
            raise UnsupportedError(f"{self.layer_name}: cache is a {type(cache).__name__}, not a transformers "
                                   "Cache (continuous batching's is not supported); use generate()")
        seen = cache.__dict__.setdefault("_sneppx_layers_run", set())
        if self.layer_idx in seen or cache.get_seq_length(self.layer_idx) > 0:
            raise ValueError(f"{self.layer_name}: cache is a {type(cache).__name__} that a sneppx layer cannot "
                             "read or fill; continue from a sneppx.hf.make_cache(model, ...) cache instead")
        seen.add(self.layer_idx)


def _no_tensors(layer_name: str, call: str) -> RuntimeError:
    return RuntimeError(f"{layer_name}: {call}: a patched attention module keeps no torch tensors (sneppx "
                        "packed them); take the state_dict or save_pretrained before sneppx.hf.patch")


def _attentions_recorded() -> bool:
    """Whether the running model forward was asked for attention weights (output_attentions,
    as an argument or in the config). transformers collects them with hooks on its own
    attention classes, which never fire on a sneppx layer: the model would return an empty
    tuple instead."""
    collected = _active_collector.get()
    return collected is not None and "attentions" in collected


def _mask_array(mask: Any) -> Optional[np.ndarray]:
    """HF's 4-D mask as forward_mha reads it: bool stays bool (True = attend); an additive
    mask as an array of its own type where numpy has one (forward_mha reads HF's fill for
    masked places, finfo(dtype).min, as masked, float16's -65504 too), else (bfloat16,
    whose fill is below -1e30 already) float32."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"attention_mask: expected a tensor or None, got {type(mask).__name__}")
    mask = mask.detach()
    if mask.dtype not in (torch.bool, torch.float16, torch.float32, torch.float64):
        mask = mask.to(torch.float32)
    return mask.numpy()


# ------------------------------------------------------------------ patch

class _PatchState:
    """What a patched model keeps: a config of its layers' shape (for caches) and how many."""

    def __init__(self, config: LLMConfig, num_layers: int):
        self.config = config
        self.num_layers = num_layers


def _attention_modules(model: Any, model_type: str) -> List[Tuple[str, Any]]:
    module_name, class_name = _FAMILIES[model_type]
    attention_class = getattr(importlib.import_module(module_name), class_name)
    found = []
    for name, module in model.named_modules():
        if isinstance(module, attention_class):
            found.append((name, module))
        elif isinstance(module, SneppxAttention):
            raise _patch_error(name, "already patched", ValueError)
        elif name.endswith(".self_attn"):
            raise _patch_error(name, f"a {type(module).__name__}, not transformers' {class_name}")
    if not found:
        raise ValueError(f"sneppx.hf.patch: model: no {class_name} module found; nothing was changed")
    return found


def _check_options(model: Any, config: Any, modules: List[Tuple[str, Any]]) -> None:
    """What sneppx's layer does not do, refused per layer before anything changes."""
    implementation = getattr(config, "_attn_implementation", None)
    layer_types = getattr(config, "layer_types", None)
    for name, module in modules:
        if implementation not in _MASK_IMPLEMENTATIONS:
            raise _patch_error(name, f"attn_implementation {implementation!r} makes masks sneppx cannot read; load "
                                     f"the model with attn_implementation='eager' or 'sdpa'")
        if not getattr(config, "is_causal", True):
            raise _patch_error(name, "a non-causal (bidirectional) config; sneppx layers are causal")
        for tensor_name, tensor in module.state_dict().items():
            if tensor.device.type != "cpu":
                raise _patch_error(name, f"{tensor_name} is on {tensor.device}; sneppx runs on the CPU", ValueError)
        if layer_types is not None and config.model_type != "mistral":
            kind = layer_types[module.layer_idx]
            if kind != "full_attention":
                raise _patch_error(name, f"layer type {kind!r} (config.layer_types); sneppx runs one attention "
                                         "kind for every layer: full attention, or Mistral's sliding window")
        if getattr(module, "sliding_window", None) and config.model_type != "mistral":
            raise _patch_error(name, f"a per-layer sliding window of {module.sliding_window}")


def patch(model: Any, *, weight_dtype: str, num_threads: int, use_flash_attn: bool) -> Any:
    """sneppx.hf.patch (documented there)."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in _FAMILIES:
        raise UnsupportedError(f"sneppx.hf.patch: model_type {model_type!r} is not supported (supported: "
                               f"{', '.join(_FAMILIES)}); nothing was changed")
    modules = _attention_modules(model, model_type)
    _check_options(model, config, modules)
    first = modules[0][0]
    try:
        base = llm_config(config, weight_dtype=weight_dtype, num_threads=num_threads,
                          use_flash_attn=use_flash_attn, name=f"hf-{model_type}")
    except (Error, ValueError, TypeError) as error:
        raise type(error)(f"sneppx.hf.patch: {first} (every layer): {error}; nothing was changed") from None
    replacements = []
    for name, module in modules:
        layer = copy.copy(base)
        try:
            layer.load_state_dict(_weight_arrays(module.state_dict()))
        except (Error, ValueError, TypeError) as error:
            raise type(error)(f"sneppx.hf.patch: {name}: {error}; nothing was changed") from None
        dtype = next((t.dtype for t in module.state_dict().values() if t.is_floating_point()), torch.float32)
        replacement = SneppxAttention(layer, module.layer_idx, name, dtype, getattr(module, "config", config))
        replacements.append((name, replacement.train(module.training)))
    # Everything is built: only now is the model changed.
    for name, replacement in replacements:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, replacement)
    num_layers = max(getattr(config, "num_hidden_layers", 0), 1 + max(r.layer_idx for _, r in replacements))
    model._sneppx_hf = _PatchState(base, num_layers)
    if hasattr(model, "_prepare_cache_for_generation"):
        _hook_generate(model)
    if hasattr(model, "save_pretrained"):
        _hook_save(model, replacements[0][0])
    if hasattr(model, "init_continuous_batching"):
        _hook_continuous_batching(model)
    return model


def _hook_continuous_batching(model: Any) -> None:
    """Continuous batching (generate_batch, init_continuous_batching) packs requests into one
    row for its own paged cache and makes no mask; its loop logs a failing forward and returns
    no tokens. On this instance it refuses first."""

    def init_continuous_batching(*args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("continuous batching (generate_batch, init_continuous_batching): a sneppx-patched "
                                  "model keeps its cache in sneppx; use generate() with a batch")

    model.init_continuous_batching = init_continuous_batching


def _hook_save(model: Any, layer_name: str) -> None:
    """save_pretrained writes config.json before it asks for the state_dict, whose refusal
    would leave a checkpoint without weights behind: on this instance it refuses first."""

    def save_pretrained(*args: Any, **kwargs: Any) -> None:
        raise _no_tensors(layer_name, "save_pretrained")

    model.save_pretrained = save_pretrained


def _refuse_rollback_under_window(model: Any, generation_config: Any, generation_mode: Any) -> None:
    """Assisted generation (an assistant_model, prompt lookup) crops the rejected draft tokens from
    both models' caches: under a sliding window a sneppx cache has already given back tokens such
    a rollback needs (SneppxCache.is_croppable), and crop() would fail part-way through generate()."""
    window = model._sneppx_hf.config.sliding_window
    if window and (generation_mode == GenerationMode.ASSISTED_GENERATION
                   or getattr(generation_config, "is_assistant", False)):
        raise NotImplementedError(f"assisted generation: a sneppx-patched model with a sliding window ({window}) "
                                  "cannot roll its cache back past the tokens the window released; generate "
                                  "without assistant_model / prompt_lookup_num_tokens, or leave this model unpatched")


def _check_rows(cache: SneppxCache, rows: int) -> None:
    """A given cache has a row for each of the call's (the first layer's forward would refuse
    it too, but naming its hidden_states)."""
    if cache.kv.batch != rows:
        raise ValueError(f"cache: {cache.kv.batch} rows for a batch of {rows} (batch_size x num_return_sequences); "
                         f"pass sneppx.hf.make_cache(model, {rows}, max_tokens)")


def _lacks_room(cache: SneppxCache, max_cache_length: int, window: Optional[int]) -> Optional[str]:
    """Why a given cache (the user's, or one a previous generate() returned) has no room for
    the call's max_length in each row, or None: its pool cannot grow, and running out of
    pages part-way would raise after the prompt and the first tokens were appended to it.
    Under a sliding window the cache gives back the pages the window left: not checked."""
    if window:
        return None
    stats = cache.kv.stats()
    rows = cache.kv.batch
    pages = rows * -(-max_cache_length // stats["page_size"])
    if pages <= stats["total_pages"]:
        return None
    return (f"cache: its pool holds {stats['total_pages']} pages of {stats['page_size']} tokens, and this generate() "
            f"may need {max_cache_length} tokens (max_length - 1) in each of its {rows} rows, {pages} pages; a sneppx "
            f"cache cannot grow: make it for the whole conversation with sneppx.hf.make_cache(model, {rows}, "
            f"max_tokens >= {max_cache_length})")


def _start_over(cache: SneppxCache, state: _PatchState, max_tokens: int) -> None:
    """An empty pool of max_tokens a row in place of the cache's: generate() then feeds the
    whole sequence, which it slices by the cache's length."""
    cache.kv = state.config.kv_cache(cache.kv.batch, max_tokens=max_tokens, num_layers=state.num_layers)


def _hook_generate(model: Any) -> None:
    """generate() makes its cache in _prepare_cache_for_generation, given the batch and the
    call's max_length: the one place that knows the size a sneppx cache needs. The model's
    own method is replaced (on this instance only) by one that makes a SneppxCache."""

    def prepare_cache(self: Any, generation_config: Any, model_kwargs: Dict[str, Any], generation_mode: Any,
                      batch_size: int, max_cache_length: int) -> None:
        given = model_kwargs.get("cache")
        if given is None and generation_config.use_cache is False:
            return None
        # Before a given cache is used: beam search would fill it with the prompt, then fail.
        if (generation_config.num_beams or 1) > 1:
            raise NotImplementedError("num_beams > 1: beam search reorders cache rows, which SneppxCache does "
                                      "not do; use greedy or sampling decoding (or no cache: use_cache=False "
                                      "and no cache=)")
        _refuse_rollback_under_window(self, generation_config, generation_mode)
        if given is not None:
            if not isinstance(given, SneppxCache):
                raise ValueError(f"cache: a {type(given).__name__} cannot hold a sneppx layer's keys and values; "
                                 "pass sneppx.hf.make_cache(model, batch_size, max_tokens), or no cache")
            _check_rows(given, max(generation_config.num_return_sequences or 1, 1) * batch_size)
            lacking = _lacks_room(given, max_cache_length, self._sneppx_hf.config.sliding_window)
            if lacking and getattr(generation_config, "is_assistant", False):
                # The assistant of assisted generation: transformers hands it back the cache its
                # first round made, sized for that round, with the whole sequence so far every
                # round. It starts over in a pool twice as large (a prefill of the sequence).
                _start_over(given, self._sneppx_hf, max(max_cache_length, 2 * given.kv.max_tokens))
            elif lacking:
                raise ValueError(lacking)
            # The class's own method (not a bound one kept from patch time: a deep copy of the
            # model must not call back into the original).
            return type(self)._prepare_cache_for_generation(self, generation_config, model_kwargs, generation_mode,
                                                            batch_size, max_cache_length)
        if generation_config.cache_implementation not in (None, "dynamic"):
            raise ValueError(f"cache_implementation={generation_config.cache_implementation!r}: a sneppx-patched "
                             "model keeps its cache in sneppx (leave cache_implementation unset)")
        rows = max(generation_config.num_return_sequences or 1, 1) * batch_size
        model_kwargs["cache"] = SneppxCache(self, rows, max_cache_length)
        return None

    model._prepare_cache_for_generation = types.MethodType(prepare_cache, model)
