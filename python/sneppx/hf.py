"""HuggingFace transformers drop-in: run a model's attention on sneppx.

    import sneppx.hf
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2-0.5B", dtype="float32")
    sneppx.hf.patch(model)              # every self_attn now runs on sneppx layers
    out = model.generate(input_ids, attention_mask=mask, max_new_tokens=64)   # prefill and decode on sneppx

patch() replaces the self-attention modules of a LlamaForCausalLM, MistralForCausalLM,
Qwen2ForCausalLM or DeepseekV2ForCausalLM (or their bare *Model) with sneppx layers built
from the modules' own weights, and makes generate() keep its keys and values in one sneppx
paged KV cache (SneppxCache) for all layers.

torch and transformers are imported only when patch() (or a name below) is first used:
``import sneppx`` never needs them. The torch code lives in sneppx._hf_torch.
"""
from typing import Any

__all__ = ["patch", "make_cache", "SneppxAttention", "SneppxCache"]


def patch(model: Any, *, weight_dtype: str = "float32", num_threads: int = 0, use_flash_attn: bool = True) -> Any:
    """Replaces every self-attention module of `model` with a sneppx layer; returns `model`.

    model: a transformers LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM or
        DeepseekV2ForCausalLM (or the bare LlamaModel, ...), on the CPU, loaded with
        attn_implementation "eager" or "sdpa" (the masks these make are what sneppx reads).
    weight_dtype: how sneppx stores the projections: "float32" (default), "bfloat16",
        "float16" or "int8" (LLMConfig's weight_dtype). The module's tensors are read through
        .detach(), bfloat16 and float16 ones as their 16 bits and others as float32, and
        packed once (each layer keeps its own packed copy; the replaced modules, and their
        tensors, are dropped, so the patched model's state_dict() and save_pretrained()
        raise RuntimeError naming the layer rather than leave its attention out; its
        load_state_dict() packs each layer's attention tensors again, all of a layer's at once:
        a layer given only some is one of the errors torch raises after loading the rest).
    num_threads: the sneppx layers' threads (0 = OpenMP's default); torch's are its own.
    use_flash_attn: flash attention (default) or the materialized SDPA path.

    Inference only: the patched modules take no part in autograd (their outputs do not
    require grad; gradients stop there) and run no dropout; a patched module in training
    mode raises RuntimeError. output_attentions (argument or config) raises ValueError:
    sneppx computes no attention weights, and transformers would silently return none.
    Hidden states may be float32, bfloat16 or float16: sneppx computes in float32 and returns
    the module's dtype (that of the replaced module's weights, which follows model.to(dtype)).

    generate() then makes a SneppxCache sized for the call (batch x max_length) unless
    given one (``cache=sneppx.hf.make_cache(model, batch_size, max_tokens)``, or the cache a
    previous call returned, to continue from). A SneppxCache cannot grow: a given one without
    a row for each of the call's or room for its max_length is refused (ValueError) before it
    is used (room is not checked under a sliding window, where the pages a row holds depend on
    the chunks fed, not on max_length), so make the cache for a whole conversation that
    continues (but a patched model
    that is generate()'s assistant_model, which transformers gives the whole sequence every
    round, starts over in a pool twice as large when it runs out); beam search
    and other strategies that reorder or copy cache rows are refused (before a given cache
    is touched; beam search with use_cache=False, which keeps no cache, runs). So is assisted
    generation (assistant_model, prompt_lookup_num_tokens) with a patched model that has a
    sliding window, as the main model or the assistant: it crops rejected draft tokens, and the
    sneppx cache has given back the tokens the window left (SneppxCache.is_croppable is False).
    transformers' continuous batching (generate_batch, init_continuous_batching: a paged
    cache of its own, requests packed without a mask) raises NotImplementedError.
    A plain forward (model(input_ids)) runs without a cache, even when transformers makes a
    DynamicCache for it; continuing from such a cache raises ValueError (it holds nothing).

    Nothing is changed when a module cannot be patched: an unsupported model_type, an
    attention option sneppx lacks (per-layer sliding windows, a non-causal config, a RoPE
    type it does not implement, another attn_implementation, a device other than the CPU)
    raises NotImplementedError (sneppx.UnsupportedError for what the runtime refuses) or
    ValueError naming the layer (e.g. "model.layers.0.self_attn") and the reason, before
    any module is replaced. An attn_implementation other than "eager" or "sdpa" set later
    (model.set_attn_implementation) is refused by the first layer's next forward, before
    the cache is touched (NotImplementedError naming the layer)."""
    from . import _hf_torch
    return _hf_torch.patch(model, weight_dtype=weight_dtype, num_threads=num_threads,
                           use_flash_attn=use_flash_attn)


def make_cache(model: Any, batch_size: int, max_tokens: int) -> Any:
    """A SneppxCache for a patched model: `batch_size` rows of up to `max_tokens` tokens each
    (prompt, padding included, plus generated tokens), for generate(cache=...) or a forward's
    cache=. One sneppx KVCache (LLMConfig.kv_cache) holds every layer; its pool cannot grow,
    so size it for every generate() that continues from it."""
    from . import _hf_torch
    return _hf_torch.SneppxCache(model, batch_size, max_tokens)


def __getattr__(name: str) -> Any:
    # SneppxAttention and SneppxCache subclass torch / transformers classes: made on first use.
    if name in ("SneppxAttention", "SneppxCache"):
        from . import _hf_torch
        return getattr(_hf_torch, name)
    raise AttributeError(f"module 'sneppx.hf' has no attribute {name!r}")
