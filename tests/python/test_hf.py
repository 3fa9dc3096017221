"""sneppx.hf.patch against transformers itself: for each family a small randomly
initialized model (2 layers, vocabulary 256, hidden 64; GQA where the family has it,
Mistral with a 16-token window that 64 generated tokens cross, DeepSeek V2 with small MLA
shapes) runs patched and unpatched (eager):

- each attention layer's output, fed the same inputs, agrees within a normalized error
  max|patched - eager| / max|eager| <= 1e-5 (both float32);
- greedy generate() of 64 tokens gives the same tokens, for one prompt and for a batch of
  two prompts of different lengths, left-padded;
- a model it cannot patch is refused naming the layer, and left as it was.

Needs torch and transformers: ctest runs this file with the venv of scripts/venv.sh
(tests/CMakeLists.txt), where SNEPPX_REQUIRE_TORCH=1 turns a missing torch into a failure;
ctest: 2 shards (about 20 s of tests on an idle machine, twice that when it is shared).
"""
import copy
import json
import os
import re
import types

import numpy as np
import pytest

if os.environ.get("SNEPPX_REQUIRE_TORCH"):
    import torch
    import transformers
else:
    torch = pytest.importorskip("torch", reason="needs the venv of scripts/venv.sh (torch, transformers)")
    transformers = pytest.importorskip("transformers")

import sneppx
import sneppx.hf

TOLERANCE = 1e-5
NEW_TOKENS = 64
COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=512, initializer_range=0.1, bos_token_id=None, eos_token_id=None,
              pad_token_id=0, tie_word_embeddings=False)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=2, head_dim=16)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_key_value_heads=2, head_dim=16, sliding_window=16)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=2)),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM",
                    dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
                         qk_rope_head_dim=16, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1)),
}


def build(family, seed=0, **extra):
    config_name, model_name, fields = FAMILIES[family]
    config = getattr(transformers, config_name)(**{**COMMON, **fields, **extra})
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return getattr(transformers, model_name)(config).eval()


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pair(request):
    """(family, the eager model, a patched copy)."""
    eager = build(request.param)
    patched = sneppx.hf.patch(copy.deepcopy(eager))
    return request.param, eager, patched


def prompts(batch_lengths, seed=1):
    """Token ids left-padded with 0 and the matching 2-D attention mask."""
    generator = torch.Generator().manual_seed(seed)
    width = max(batch_lengths)
    ids = torch.zeros((len(batch_lengths), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(batch_lengths):
        ids[row, width - length:] = torch.randint(1, 256, (length,), generator=generator)
        mask[row, width - length:] = 1
    return ids, mask


def greedy(model, ids, mask):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False)


def normalized_error(actual, expected):
    return float((actual - expected).abs().max() / expected.abs().max())


def logits_error(patched, eager, ids, mask):
    """normalized_error of a cacheless forward's logits at the real (unpadded) tokens."""
    real = mask.bool()
    with torch.no_grad():
        expected = eager(ids, attention_mask=mask, use_cache=False).logits
        actual = patched(ids, attention_mask=mask, use_cache=False).logits
    return normalized_error(actual[real], expected[real])


def test_patch_replaces_every_attention_module(pair):
    family, eager, patched = pair
    modules = [m for _, m in patched.named_modules() if isinstance(m, sneppx.hf.SneppxAttention)]
    assert len(modules) == 2
    assert [m.layer_idx for m in modules] == [0, 1]
    assert all(m.sneppx.weights_source.startswith("state_dict(") for m in modules)
    assert not any(type(m).__name__.endswith("Attention") and not isinstance(m, sneppx.hf.SneppxAttention)
                   for _, m in patched.named_modules())
    if family == "mistral":
        assert modules[0].sneppx.sliding_window == 16
    if family == "qwen2":
        assert modules[0].sneppx.qkv_bias and not modules[0].sneppx.o_bias
    if family == "deepseek_v2":
        assert modules[0].sneppx.is_mla and modules[0].sneppx.kv_lora_rank == 32


def test_layer_outputs_agree(pair):
    """Every attention layer, fed what the eager layer was fed (a left-padded batch of two,
    HF's 4-D mask, its position_ids), gives the eager output on the real tokens (padding
    rows attend nothing: HF's output there depends on its fill value, sneppx's is 0)."""
    family, eager, patched = pair
    ids, mask = prompts([20, 13])
    captured = []

    def capture(module, args, kwargs, output):
        captured.append((module.layer_idx, args, dict(kwargs), output[0]))

    handles = [m.register_forward_hook(capture, with_kwargs=True)
               for m in eager.modules() if type(m).__name__.endswith("Attention")]
    try:
        with torch.no_grad():
            eager(ids, attention_mask=mask, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    assert [c[0] for c in captured] == [0, 1]
    layers = {m.layer_idx: m for m in patched.modules() if isinstance(m, sneppx.hf.SneppxAttention)}
    real = mask.bool()
    for layer_idx, args, kwargs, expected in captured:
        with torch.no_grad():
            actual, weights = layers[layer_idx](*args, **kwargs)
        assert weights is None and actual.dtype == expected.dtype and actual.shape == expected.shape
        error = normalized_error(actual[real], expected[real])
        print(f"{family} layer {layer_idx}: normalized error {error:.3g}")
        assert error <= TOLERANCE, f"{family} layer {layer_idx}: normalized error {error:.3g}"
        assert float(actual[~real].abs().max()) == 0.0


def test_generate_one_prompt(pair):
    family, eager, patched = pair
    ids, mask = prompts([11])
    expected = greedy(eager, ids, mask)
    actual = greedy(patched, ids, mask)
    assert expected.shape == (1, 11 + NEW_TOKENS)
    assert torch.equal(actual, expected), f"{family}: first difference at token " \
        f"{int((actual != expected).nonzero()[0, 1]) - 11}"


def test_generate_left_padded_batch(pair):
    family, eager, patched = pair
    ids, mask = prompts([19, 6], seed=2)
    expected = greedy(eager, ids, mask)
    actual = greedy(patched, ids, mask)
    assert torch.equal(actual, expected), f"{family}: rows differ at " \
        f"{(actual != expected).nonzero()[:3].tolist()}"
    # The padded row alone gives the same tokens: the padding changed nothing.
    alone = greedy(eager, ids[1:, -6:], mask[1:, -6:])
    assert torch.equal(actual[1, -(6 + NEW_TOKENS):], alone[0])


ROPE_SCALINGS = {
    "deepseek_v2": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128,
                    "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
    "llama": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "qwen2": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    # max_position_embeddings 64: generation runs past it, where dynamic NTK rescales.
    "mistral": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
}


@pytest.mark.parametrize("family", sorted(ROPE_SCALINGS))
def test_rope_scaling(family):
    """transformers 5 keeps the RoPE fields in config.rope_parameters; each family's scaling
    reaches the sneppx layers (logits within 1e-5, the same greedy tokens)."""
    eager = build(family, rope_parameters=ROPE_SCALINGS[family],
                  max_position_embeddings=64 if family == "mistral" else 512)
    patched = sneppx.hf.patch(copy.deepcopy(eager))
    layer = next(m for m in patched.modules() if isinstance(m, sneppx.hf.SneppxAttention))
    assert layer.sneppx.rope_scaling["rope_type"] == ROPE_SCALINGS[family]["rope_type"]
    assert layer.sneppx.rope_theta == ROPE_SCALINGS[family]["rope_theta"]
    ids, mask = prompts([19, 6], seed=2)
    assert logits_error(patched, eager, ids, mask) <= TOLERANCE
    assert torch.equal(greedy(patched, ids, mask), greedy(eager, ids, mask))


@pytest.mark.parametrize("family", sorted(ROPE_SCALINGS))
def test_config_json_saved_by_transformers(family, tmp_path):
    """transformers 5's save_pretrained writes rope_theta and the scaling only inside
    rope_parameters: from_config_json reads them there (not theta 10000 and plain RoPE),
    as the patched layers have them."""
    eager = build(family, rope_parameters=ROPE_SCALINGS[family])
    eager.config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "rope_parameters" in saved and "rope_theta" not in saved and "rope_scaling" not in saved
    config = sneppx.LLMConfig.from_config_json(tmp_path)
    layer = next(m for m in sneppx.hf.patch(eager).modules() if isinstance(m, sneppx.hf.SneppxAttention)).sneppx
    assert config.rope_theta == layer.rope_theta == ROPE_SCALINGS[family]["rope_theta"]
    assert config.rope_scaling == layer.rope_scaling
    assert config.rope_scaling["rope_type"] == ROPE_SCALINGS[family]["rope_type"]


@pytest.mark.parametrize("rope", [{"rope_type": "linear", "factor": 2.0},
                                  {"rope_type": "dynamic", "factor": 4.0},
                                  {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 64}], ids=lambda rope: rope["rope_type"])
def test_deepseek_mscale_all_dim_beside_any_scaled_rope(rope):
    """DeepseekV2Attention multiplies its softmax scale by m(factor, mscale_all_dim)^2 for
    every RoPE type but the default, not only yarn: so does the patched model (logits
    within 1e-5, the same greedy tokens)."""
    eager = build("deepseek_v2", rope_parameters=dict(rope, rope_theta=10000.0, mscale_all_dim=0.707))
    patched = sneppx.hf.patch(copy.deepcopy(eager))
    layer = next(m for m in patched.modules() if isinstance(m, sneppx.hf.SneppxAttention))
    expected = next(m for m in eager.modules() if type(m).__name__ == "DeepseekV2Attention").scaling
    assert layer.sneppx.softmax_scale == pytest.approx(expected, rel=1e-12)
    ids, mask = prompts([19, 6], seed=2)
    assert logits_error(patched, eager, ids, mask) <= TOLERANCE
    assert torch.equal(greedy(patched, ids, mask), greedy(eager, ids, mask))


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
def test_partial_rotary_factor_is_ignored_as_transformers_does(family):
    """A config.json's partial_rotary_factor lands in rope_parameters, but these families'
    attention rotates the whole head whatever it says: so does the patched model (logits
    within 1e-5)."""
    eager = build(family, partial_rotary_factor=0.5)
    assert eager.config.rope_parameters["partial_rotary_factor"] == 0.5
    patched = sneppx.hf.patch(copy.deepcopy(eager))
    layer = next(m for m in patched.modules() if isinstance(m, sneppx.hf.SneppxAttention))
    assert layer.sneppx.rotary_dim == layer.sneppx.head_dim
    ids, mask = prompts([19, 6], seed=2)
    assert logits_error(patched, eager, ids, mask) <= TOLERANCE


def test_partial_rotary_factor_with_a_scaled_rope_is_refused():
    """transformers fails on that config at its first forward (a linear RoPE over half the
    head, an attention over all of it): patch() refuses it, naming the factor, and changes
    nothing."""
    eager = build("llama", partial_rotary_factor=0.5, rope_scaling={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(RuntimeError):
        with torch.no_grad():
            eager(prompts([5])[0], use_cache=False)
    with pytest.raises(sneppx.UnsupportedError, match="partial_rotary_factor: 0.5 with rope_scaling 'linear'"):
        sneppx.hf.patch(eager)
    assert not any(isinstance(m, sneppx.hf.SneppxAttention) for m in eager.modules())


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_sdpa_masks(family):
    """Under attn_implementation "sdpa" the masks are bool (or None when plainly causal)."""
    eager = build(family)
    patched = sneppx.hf.patch(copy.deepcopy(eager))
    patched.set_attn_implementation("sdpa")
    for lengths in ([19, 6], [25]):
        ids, mask = prompts(lengths, seed=3)
        assert torch.equal(greedy(patched, ids, mask), greedy(eager, ids, mask))


def test_an_attn_implementation_set_after_patch_without_readable_masks_is_refused():
    """patch() refuses a model loaded with attention whose masks sneppx cannot read, but
    set_attn_implementation() can switch it afterwards: under "paged|eager" transformers made
    no mask, and a left-padded batch attended its padding (other tokens than eager's, silently);
    flex's BlockMask raised a TypeError naming no layer. Both are refused naming the layer
    before the cache is touched, and switching back works."""
    eager = build("llama")
    patched = sneppx.hf.patch(copy.deepcopy(eager))
    ids, mask = prompts([19, 6], seed=2)
    cache = sneppx.hf.make_cache(patched, 2, 25 + NEW_TOKENS)
    for implementation in ("paged|eager", "flex_attention"):
        patched.set_attn_implementation(implementation)
        refused = rf"^model\.layers\.0\.self_attn: attn_implementation '{re.escape(implementation)}' \(set after "
        with pytest.raises(NotImplementedError, match=refused):
            with torch.no_grad():
                patched.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, cache=cache)
        assert cache.kv.lengths == [0, 0]
    patched.set_attn_implementation("eager")
    assert torch.equal(greedy(patched, ids, mask), greedy(eager, ids, mask))


def test_continuous_batching_is_refused():
    """transformers' continuous batching (generate_batch) feeds the layers its own paged cache
    and packed batches without a mask: the patched model raised AttributeError inside its loop,
    which logged it and returned no tokens. It is refused when called, and a layer given a
    cache that is no transformers Cache names itself."""
    patched = sneppx.hf.patch(build("llama"))
    config = transformers.GenerationConfig(max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0)
    with pytest.raises(NotImplementedError, match=r"^continuous batching \(generate_batch"):
        patched.generate_batch([[5, 6, 7], [8, 9]], generation_config=config)
    layer = patched.model.layers[0].self_attn
    with pytest.raises(NotImplementedError, match=r"^model\.layers\.0\.self_attn: cache is a SimpleNamespace, not a "
                                                  r"transformers Cache"):
        layer(torch.zeros(1, 3, 64), cache=types.SimpleNamespace())


def test_float16_masks_fill_counts_as_masked():
    """Eager attention fills a float16 model's masked places with finfo(float16).min, -65504,
    far above the -1e30 sneppx counts as masked: once Mistral's window had released tokens
    the mask seemed to show them, and generate() failed ("lets the query see token 0, which
    the sliding window already released"). The fill is read as masked: the same tokens as
    under sdpa's bool masks."""
    models = [sneppx.hf.patch(build("mistral").to(torch.float16)) for _ in range(2)]
    models[1].set_attn_implementation("sdpa")
    ids, mask = prompts([24, 7], seed=2)     # 88 tokens: the window has released the first page
    assert torch.equal(greedy(models[0], ids, mask), greedy(models[1], ids, mask))


def test_bfloat16_hidden_states_return_bfloat16():
    eager = build("llama")
    patched = sneppx.hf.patch(copy.deepcopy(eager), weight_dtype="bfloat16").to(torch.bfloat16)
    assert {m.sneppx.weight_dtype for m in patched.modules() if isinstance(m, sneppx.hf.SneppxAttention)} == \
        {"bfloat16"}
    ids, mask = prompts([9])
    with torch.no_grad():
        logits = patched(ids, attention_mask=mask).logits
        reference = eager.to(torch.bfloat16)(ids, attention_mask=mask).logits
    assert logits.dtype == torch.bfloat16
    # bfloat16 hidden states between the layers: 8 bits of mantissa.
    assert normalized_error(logits.float(), reference.float()) < 3e-2


def test_plain_forward_and_continuing_from_its_cache():
    """model(input_ids) works (transformers makes a DynamicCache, which sneppx runs
    without); continuing from that cache, which holds nothing, is refused."""
    eager = build("qwen2")
    patched = sneppx.hf.patch(copy.deepcopy(eager))
    ids, mask = prompts([12])
    with torch.no_grad():
        out = patched(ids, attention_mask=mask)
        reference = eager(ids, attention_mask=mask)
        assert normalized_error(out.logits, reference.logits) <= 1e-4
        with pytest.raises(ValueError, match="model.layers.0.self_attn: cache is a DynamicCache"):
            patched(ids[:, -1:], cache=out.cache)


def test_given_cache_and_refused_strategies():
    eager = build("llama")
    patched = sneppx.hf.patch(copy.deepcopy(eager))
    ids, mask = prompts([7])
    cache = sneppx.hf.make_cache(patched, 1, 7 + NEW_TOKENS)
    with torch.no_grad():
        given = patched.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, cache=cache)
    assert torch.equal(given, greedy(eager, ids, mask))
    assert cache.get_seq_length() == 7 + NEW_TOKENS - 1 and cache.kv.lengths == [7 + NEW_TOKENS - 1]
    with pytest.raises(ValueError, match="cache: a DynamicCache cannot hold"):
        patched.generate(ids, max_new_tokens=2, cache=transformers.DynamicCache())
    with pytest.raises(NotImplementedError, match="num_beams > 1"):
        patched.generate(ids, max_new_tokens=2, num_beams=2)
    patched.train()
    with pytest.raises(RuntimeError, match="model.layers.0.self_attn: a sneppx layer runs inference only"):
        patched(ids)


def test_make_cache_errors_name_its_arguments():
    """make_cache's arguments are batch_size and max_tokens: its errors named "batch" (the
    argument of LLMConfig.kv_cache, which it calls)."""
    patched = sneppx.hf.patch(build("llama"))
    for batch_size, error in ((0, ValueError), (-1, ValueError), (2.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match=r"^batch_size: "):
            sneppx.hf.make_cache(patched, batch_size, 16)
    with pytest.raises(ValueError, match=r"^max_tokens: 0 must be at least 1"):
        sneppx.hf.make_cache(patched, 2, 0)
    assert sneppx.hf.make_cache(patched, np.int64(2), 16).kv.lengths == [0, 0]


def test_a_sneppx_cache_given_to_an_unpatched_model_is_refused_naming_it():
    """A SneppxCache holds nothing transformers' attention can read: given to an unpatched
    model it raised IndexError ("list index out of range") from Cache.update; it now says
    what it is, and stays empty."""
    eager = build("llama")
    cache = sneppx.hf.make_cache(sneppx.hf.patch(copy.deepcopy(eager)), 2, 64)
    ids, mask = prompts([19, 6], seed=2)
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"^cache: a SneppxCache holds sneppx layers' keys and values; "
                                             r"layer 0 is "):
            eager(ids, attention_mask=mask, cache=cache)
        with pytest.raises(ValueError, match=r"^cache: a SneppxCache"):
            eager.generate(ids, attention_mask=mask, cache=cache, max_new_tokens=3)
    assert cache.kv.lengths == [0, 0]


def test_generate_continues_from_a_returned_cache():
    """A second generate() given the first's cache and the whole conversation so far (a
    left-padded batch of two, one new token each) feeds only the tokens the cache lacks,
    as with transformers' DynamicCache: the same tokens as eager, and as a fresh
    generate() of the whole conversation."""
    eager = build("llama")
    patched = sneppx.hf.patch(copy.deepcopy(eager))
    ids, mask = prompts([19, 6], seed=2)
    steps = dict(max_new_tokens=5, do_sample=False, return_dict_in_generate=True)
    results = []
    for model, cache in ((eager, transformers.DynamicCache(config=eager.config)),
                         (patched, sneppx.hf.make_cache(patched, 2, 64))):
        with torch.no_grad():
            first = model.generate(ids, attention_mask=mask, cache=cache, **steps)
            turn = torch.cat([first.sequences, torch.full((2, 1), 7)], dim=1)
            turn_mask = torch.cat([mask, torch.ones(2, turn.shape[1] - mask.shape[1], dtype=mask.dtype)], dim=1)
            results.append(model.generate(turn, attention_mask=turn_mask, cache=first.cache, **steps).sequences)
    assert cache.kv.lengths == [turn.shape[1] + 4] * 2
    assert torch.equal(results[1], results[0])
    with torch.no_grad():
        fresh = eager.generate(turn, attention_mask=turn_mask, **steps).sequences
    assert torch.equal(results[1], fresh)


def test_crop_cuts_every_row_or_none():
    """SneppxCache.crop (assisted decoding's rollback) keeps every row's first tokens, and
    the model then continues from them as a cache-free forward of the whole prompt does.
    Under mistral's window of 16 a row that the window has taken its first page from (64
    tokens a page) cannot go back past it: crop then cuts no row, not even one that allows
    it (row 0, emptied and given 10 new tokens at layer 0)."""
    eager = build("mistral")
    patched = sneppx.hf.patch(copy.deepcopy(eager))
    ids, mask = prompts([100, 100], seed=3)
    cache = sneppx.hf.make_cache(patched, 2, 128)
    with torch.no_grad():
        patched(ids, attention_mask=mask, cache=cache)
        cache.crop(-5)
        assert cache.kv.lengths == [95, 95]
        continued = patched(ids[:, 95:], attention_mask=mask, cache=cache).logits
        whole = eager(ids, attention_mask=mask, use_cache=False).logits[:, 95:]
    assert normalized_error(continued, whole) <= 1e-4
    cache.kv.truncate(0, 0)
    patched.model.layers[0].self_attn.sneppx.forward_ragged(cache.kv, [0], [np.zeros((10, 64), np.float32)])
    with pytest.raises(sneppx.InvalidArgumentError, match="too far back"):
        cache.crop(-30)
    assert cache.kv.lengths == [10, 100]
    with pytest.raises(ValueError, match="tokens_to_remove: 1"):
        cache.crop(1)


def test_a_given_cache_without_room_for_the_call_is_refused_before_it_is_touched():
    """generate() makes its cache for the call's max_length; a continuation from it (or a
    make_cache cache) that may need more than its pool holds is refused naming the cache,
    before the prompt is appended (running out of pages part-way raised OutOfMemoryError
    with the cache holding half a continuation); so is a cache with another number of rows."""
    patched = sneppx.hf.patch(build("llama"))
    ids, mask = prompts([19, 6], seed=2)
    with torch.no_grad():
        first = patched.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False,
                                 return_dict_in_generate=True)
        turn = torch.cat([first.sequences, torch.full((2, 1), 7)], dim=1)
        turn_mask = torch.cat([mask, torch.ones(2, turn.shape[1] - mask.shape[1], dtype=mask.dtype)], dim=1)
        lengths = first.cache.kv.lengths
        with pytest.raises(ValueError, match=r"^cache: its pool holds 4 pages of 64 tokens, and this generate\(\) may "
                                             r"need 324 tokens .*"
                                             r"sneppx\.hf\.make_cache\(model, 2, max_tokens >= 324\)"):
            patched.generate(turn, attention_mask=turn_mask, cache=first.cache, max_new_tokens=300, do_sample=False)
        assert first.cache.kv.lengths == lengths
        with pytest.raises(ValueError, match=r"^cache: 1 rows for a batch of 2"):
            patched.generate(ids, attention_mask=mask, max_new_tokens=2, cache=sneppx.hf.make_cache(patched, 1, 32))


def test_a_patched_assistant_model_outlives_its_first_cache():
    """Assisted generation hands the assistant back the cache its first round made, sized for
    that round, with the whole sequence so far: a patched assistant starts over in a larger
    pool when it runs out (it raised once the first pool was full), and greedy assisted
    generation gives the main model's own tokens."""
    main = build("llama")
    assistant = sneppx.hf.patch(build("llama", seed=5, num_hidden_layers=1))
    ids, mask = prompts([11], seed=2)
    steps = dict(attention_mask=mask, max_new_tokens=150, do_sample=False)
    with torch.no_grad():
        assert torch.equal(main.generate(ids, assistant_model=assistant, **steps), main.generate(ids, **steps))


def test_assisted_generation_under_a_sliding_window_is_refused_before_it_starts():
    """Assisted generation crops rejected draft tokens from the caches; a sneppx cache under a
    sliding window has given back tokens that rollback needs (it failed part-way, once the
    sequence passed the window and a page: "length: 78 is too far back"). A patched Mistral
    as the main model (assistant or prompt lookup) or as the assistant is refused before a
    token is cached, and its cache says it cannot be cropped."""
    main = sneppx.hf.patch(build("mistral"))
    ids, mask = prompts([11], seed=2)
    refused = r"^assisted generation: a sneppx-patched model with a sliding window \(16\)"
    cache = sneppx.hf.make_cache(main, 1, 128)
    steps = dict(attention_mask=mask, max_new_tokens=100, do_sample=False)
    with torch.no_grad():
        for kwargs in (dict(assistant_model=build("mistral", seed=5, num_hidden_layers=1), cache=cache),
                       dict(prompt_lookup_num_tokens=3)):
            with pytest.raises(NotImplementedError, match=refused):
                main.generate(ids, **steps, **kwargs)
        assert cache.kv.lengths == [0] and not cache.is_croppable
        assert sneppx.hf.make_cache(sneppx.hf.patch(build("llama")), 1, 8).is_croppable
        with pytest.raises(NotImplementedError, match=refused):
            build("mistral").generate(ids, assistant_model=sneppx.hf.patch(build("mistral", num_hidden_layers=1)),
                                      **steps)


def test_output_attentions_is_refused():
    """transformers collects attention weights by hooking its own attention classes; a
    sneppx layer computes none, so output_attentions (argument or config) is refused
    before the first layer stores anything, rather than answered with an empty tuple.
    Hidden states are still recorded, within 1e-5 of eager's."""
    eager = build("llama")
    patched = sneppx.hf.patch(copy.deepcopy(eager))
    ids, mask = prompts([9])
    cache = sneppx.hf.make_cache(patched, 1, 16)
    with torch.no_grad():
        with pytest.raises(ValueError, match="model.layers.0.self_attn: output_attentions"):
            patched(ids, attention_mask=mask, output_attentions=True, cache=cache)
        assert cache.kv.lengths == [0]
        with pytest.raises(ValueError, match="output_attentions"):
            patched.generate(ids, attention_mask=mask, max_new_tokens=2, output_attentions=True,
                             return_dict_in_generate=True)
        patched.config.output_attentions = True
        with pytest.raises(ValueError, match="output_attentions"):
            patched(ids, attention_mask=mask, use_cache=False)
        patched.config.output_attentions = False
        actual = patched(ids, attention_mask=mask, output_hidden_states=True, use_cache=False).hidden_states
        expected = eager(ids, attention_mask=mask, output_hidden_states=True, use_cache=False).hidden_states
    assert len(actual) == len(expected) == 3
    assert max(normalized_error(a, e) for a, e in zip(actual, expected)) <= TOLERANCE


def test_state_dict_of_a_patched_model_is_refused(tmp_path):
    """The replaced modules' tensors are packed and dropped: a state_dict or a checkpoint
    without them would load with the attention re-initialized, so both raise, naming the
    layer, and nothing is written; the unpatched model's state_dict holds every tensor."""
    eager = build("llama")
    patched = sneppx.hf.patch(copy.deepcopy(eager))
    with pytest.raises(RuntimeError, match=r"^model\.layers\.0\.self_attn: state_dict: "):
        patched.state_dict()
    with pytest.raises(RuntimeError, match=r"^model\.layers\.0\.self_attn: save_pretrained: "):
        patched.save_pretrained(tmp_path / "saved")
    assert not (tmp_path / "saved").exists()
    assert "model.layers.0.self_attn.q_proj.weight" in eager.state_dict()
    eager.save_pretrained(tmp_path / "eager")   # the unpatched class's own method is untouched
    assert any((tmp_path / "eager").glob("*.safetensors"))


def test_load_state_dict_of_a_patched_model_reaches_its_sneppx_layers():
    """model.load_state_dict() after patch() packs each layer's attention tensors into its
    sneppx layer (they went nowhere: the model ran the new weights around the old attention,
    silently with strict=False); missing and unexpected keys are those the unpatched model
    reports, and a layer given only some of its tensors is refused, naming it."""
    new = build("llama", seed=1)
    ids, mask = prompts([19, 6], seed=2)
    for strict in (True, False):
        patched = sneppx.hf.patch(build("llama", seed=0))
        result = patched.load_state_dict(new.state_dict(), strict=strict)
        assert not result.missing_keys and not result.unexpected_keys
        assert logits_error(patched, new, ids, mask) <= TOLERANCE
        assert torch.equal(greedy(patched, ids, mask), greedy(new, ids, mask))
    without_attention = {k: v for k, v in new.state_dict().items() if ".self_attn." not in k}
    expected = build("llama").load_state_dict(without_attention, strict=False)
    assert patched.load_state_dict(without_attention, strict=False) == expected and expected.missing_keys
    without_k = {k: v for k, v in new.state_dict().items() if "k_proj" not in k}
    with pytest.raises(RuntimeError, match=r"model\.layers\.0\.self_attn: load_state_dict: a patched attention "
                                           r"module takes all of its tensors at once"):
        patched.load_state_dict(without_k, strict=False)


def test_checkpoint_saved_again_unsharded_loads_its_new_file(tmp_path):
    """A sharded checkpoint saved again without shards into its directory keeps its old
    model.safetensors.index.json (save_pretrained deletes the old shards, not the index);
    from_pretrained loads model.safetensors, and so does load_safetensors: the new
    weights, not the old index's missing shards."""
    build("llama", seed=0).save_pretrained(tmp_path, max_shard_size="20KB")
    new = build("llama", seed=1)
    new.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors.index.json").exists()
    config = sneppx.LLMConfig.from_config_json(tmp_path)
    config.load_safetensors(tmp_path, layer=1)
    expected = sneppx.LLMConfig.from_config_json(tmp_path)
    expected.load_state_dict(new.state_dict(), layer=1)
    x = np.random.default_rng(0).standard_normal((1, 8, 64), dtype=np.float32)
    assert np.array_equal(config.forward_mha(x), expected.forward_mha(x))


def test_beam_search_with_a_given_cache_is_refused_before_it_is_filled():
    patched = sneppx.hf.patch(build("llama"))
    ids, mask = prompts([7])
    cache = sneppx.hf.make_cache(patched, 2, 32)
    with pytest.raises(NotImplementedError, match="num_beams > 1"):
        patched.generate(ids, attention_mask=mask, max_new_tokens=4, num_beams=2, do_sample=False, cache=cache)
    assert cache.kv.lengths == [0, 0]
    # Without a cache there are no rows to reorder: beam search gives eager's beams.
    eager = build("llama")
    beams = dict(attention_mask=mask, max_new_tokens=4, num_beams=2, do_sample=False, use_cache=False)
    with torch.no_grad():
        assert torch.equal(patched.generate(ids, **beams), eager.generate(ids, **beams))


def test_qwen2_use_sliding_window_without_sliding_layers():
    """use_sliding_window with max_window_layers >= num_hidden_layers: Qwen2Config makes
    every layer full attention and transformers runs it plainly causal, so sneppx does
    (config.json too), rather than refuse per-layer windows no layer has."""
    eager = build("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=2)
    assert eager.config.layer_types == ["full_attention"] * 2
    patched = sneppx.hf.patch(copy.deepcopy(eager))
    assert all(m.sneppx.sliding_window is None for m in patched.modules() if isinstance(m, sneppx.hf.SneppxAttention))
    ids, mask = prompts([19, 6], seed=2)
    assert logits_error(patched, eager, ids, mask) <= TOLERANCE
    assert torch.equal(greedy(patched, ids, mask), greedy(eager, ids, mask))


def test_unsupported_is_refused_before_any_change():
    # A Qwen2 with sliding windows on its second layer: sneppx has one window for every layer.
    model = build("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=1)
    before = [type(m) for m in model.modules()]
    with pytest.raises(NotImplementedError, match=r"model.layers.1.self_attn: layer type 'sliding_attention'.*"
                                                  r"nothing was changed"):
        sneppx.hf.patch(model)
    assert [type(m) for m in model.modules()] == before
    # A RoPE type the runtime does not implement.
    model = build("llama", rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8,
                                            "long_factor": [2.0] * 8, "original_max_position_embeddings": 256})
    with pytest.raises(NotImplementedError, match=r"model.layers.0.self_attn \(every layer\): "
                                                  r"model.config: rope_scaling.rope_type: 'longrope' is not supported"):
        sneppx.hf.patch(model)
    assert not any(isinstance(m, sneppx.hf.SneppxAttention) for m in model.modules())
    # Another attention implementation's masks.
    model = build("mistral")
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(NotImplementedError, match="model.layers.0.self_attn: attn_implementation 'flex_attention'"):
        sneppx.hf.patch(model)
    # Another family.
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(NotImplementedError, match="model_type 'gpt2' is not supported"):
        sneppx.hf.patch(gpt2)
    # Twice.
    patched = sneppx.hf.patch(build("llama"))
    with pytest.raises(ValueError, match="model.layers.0.self_attn: already patched"):
        sneppx.hf.patch(patched)


def test_import_sneppx_does_not_import_torch():
    import subprocess
    import sys
    code = "import sys, sneppx; sneppx.hf.patch; print('torch' in sys.modules, 'transformers' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False"]


# A config.json of each model type with only what sneppx requires: the keys sneppx then
# defaults (num_key_value_heads, sliding_window, q_lora_rank) left out.
_REQUIRED_ONLY = {
    "llama": dict(hidden_size=256, num_attention_heads=8),
    "mistral": dict(hidden_size=512, num_attention_heads=16),  # MistralConfig: 8 K/V heads, not 16
    "qwen2": dict(hidden_size=1024, num_attention_heads=32),   # Qwen2Config's 32 K/V heads need as many
    "deepseek_v2": dict(hidden_size=256, num_attention_heads=8, kv_lora_rank=64, qk_nope_head_dim=32,
                        qk_rope_head_dim=32, v_head_dim=32),
}


@pytest.mark.parametrize("model_type", sorted(_REQUIRED_ONLY))
def test_keys_left_out_of_config_json_take_the_config_classes_defaults(model_type, tmp_path):
    """from_config_json fills a left-out key as transformers' config class does (the
    model_types table holds sneppx's copy of those defaults: this compares it with them)."""
    (tmp_path / "config.json").write_text(json.dumps(dict(_REQUIRED_ONLY[model_type], model_type=model_type)))
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    ours = sneppx.LLMConfig.from_config_json(tmp_path)
    if model_type != "deepseek_v2":      # MLA shares one latent among all heads: no K/V head count
        assert ours.num_key_value_heads == hf.num_key_value_heads
    used_window = getattr(hf, "sliding_window", None) if getattr(hf, "use_sliding_window", True) else None
    assert (ours.sliding_window or None) == used_window
    assert ours.q_lora_rank == getattr(hf, "q_lora_rank", None)     # None: no MLA
