"""The Python KV cache (LLMConfig.kv_cache, forward_mha(past_key_value=...), forward_ragged)
against the float64 reference of the whole sequence (reference.mha_forward) and the
cache-free forward. A cached forward computes the same rows as the whole sequence, so
the thresholds are test_numerics.py's (reference.FP32_*)."""
import numpy as np
import pytest

import reference as ref
import sneppx
from families import FAMILIES

# Vs the cache-free forward of the same layer: the same kernels, different tiles.
SAME_LAYER_MAX_NORMALIZED = 1e-5

CACHED_FAMILIES = ["llama2", "llama3", "llama3.1", "mistral", "qwen2", "deepseek-v2", "deepseek-v2-lite-like"]


def _layer(family, rng):
    hf_config = FAMILIES[family]
    cfg = sneppx.LLMConfig(**hf_config)
    weights = ref.random_state_dict(hf_config, rng, qkv_bias=cfg.qkv_bias, o_bias=cfg.o_bias)
    cfg.load_state_dict(weights)
    return hf_config, cfg, weights


def _assert_close(got, want, what, limit=ref.FP32_MAX_NORMALIZED, rms=ref.FP32_RMS_RELATIVE):
    err_max, err_rms = ref.normalized_error(got, want)
    assert err_max <= limit and err_rms <= rms, f"{what}: max-normalized {err_max:.3e} (limit {limit:.0e}), " \
                                               f"RMS-relative {err_rms:.3e} (limit {rms:.0e})"


def _chunks(total, rng):
    sizes = []
    while total > 0:
        size = int(min(total, rng.integers(1, 9)))
        sizes.append(size)
        total -= size
    return sizes


@pytest.mark.parametrize("family", CACHED_FAMILIES)
def test_chunks_and_decode_equal_the_whole_sequence(family, rng):
    """Prefill in random chunks, then token by token, across pages (size 4) and past the
    window (mistral's is 16): every row equals the float64 reference of the whole sequence."""
    hf_config, cfg, weights = _layer(family, rng)
    seq_len = 45
    x = rng.uniform(-1, 1, (2, seq_len, cfg.hidden_size)).astype(np.float32)
    want = ref.mha_forward(hf_config, weights, x)
    cache = cfg.kv_cache(batch=2, max_tokens=seq_len, page_size=4)
    outputs, begin = [], 0
    for size in _chunks(30, rng) + [1] * (seq_len - 30):
        outputs.append(cfg.forward_mha(x[:, begin:begin + size], past_key_value=cache))
        begin += size
    got = np.concatenate(outputs, axis=1)
    _assert_close(got, want, f"{family} chunked + decode vs reference")
    _assert_close(got, cfg.forward_mha(x).astype(np.float64), f"{family} chunked + decode vs cache-free",
                  SAME_LAYER_MAX_NORMALIZED, SAME_LAYER_MAX_NORMALIZED)
    assert cache.lengths == [seq_len, seq_len] and len(cache) == seq_len


@pytest.mark.parametrize("family", ["llama3", "mistral", "deepseek-v2"])
def test_ragged_batch_equals_each_alone(family, rng):
    """Three rows of different lengths in one forward_ragged call (a prompt chunk beside
    single-token decodes) == each row run alone."""
    hf_config, cfg, weights = _layer(family, rng)
    lengths = [37, 5, 21]
    xs = [rng.uniform(-1, 1, (n, cfg.hidden_size)).astype(np.float32) for n in lengths]
    cache = cfg.kv_cache(batch=3, max_tokens=64, page_size=4)
    # Row 0 prefilled to 30, row 2 to 20, row 1 empty; then one mixed call.
    cfg.forward_ragged(cache, [0, 2], [xs[0][:30], xs[2][:20]])
    outs = cfg.forward_ragged(cache, [2, 0, 1], [xs[2][20:], xs[0][30:], xs[1]])
    assert cache.lengths == lengths
    for row, out in zip([2, 0, 1], outs):
        want = ref.mha_forward(hf_config, weights, xs[row][None])[0]
        begin = lengths[row] - out.shape[0]
        _assert_close(out, want[begin:], f"{family} ragged row {row}")


def test_padding_mask_and_4d_mask(rng):
    """HF's 2-D padding mask [B, cached + s] (left padding) and its 4-D mask with a past
    give the reference's rows for the real tokens."""
    hf_config, cfg, weights = _layer("llama3", rng)
    seq_len, pads = 24, [0, 5]
    x = rng.uniform(-1, 1, (2, seq_len, cfg.hidden_size)).astype(np.float32)
    mask4, positions = ref.left_padding(pads, seq_len)
    want = ref.mha_forward(hf_config, weights, x, mask4, positions)
    keep = (np.arange(seq_len)[None, :] >= np.asarray(pads)[:, None]).astype(np.int64)
    for kind in ("2d", "4d"):
        cache = cfg.kv_cache(batch=2, max_tokens=seq_len)
        outputs = []
        for begin, end in ((0, 10), (10, 11), (11, seq_len)):
            mask = keep[:, :end] if kind == "2d" else mask4[:, :, begin:end, :end]
            outputs.append(cfg.forward_mha(x[:, begin:end], mask, positions[:, begin:end], past_key_value=cache))
        got = np.concatenate(outputs, axis=1)
        for b, pad in enumerate(pads):
            _assert_close(got[b, pad:], want[b, pad:], f"{kind} mask row {b}")


def test_fork_truncate_reset_and_positions(rng):
    hf_config, cfg, weights = _layer("llama3", rng)
    x = rng.uniform(-1, 1, (1, 30, cfg.hidden_size)).astype(np.float32)
    y = rng.uniform(-1, 1, (1, 6, cfg.hidden_size)).astype(np.float32)
    cache = cfg.kv_cache(batch=1, max_tokens=40, page_size=4)
    cfg.forward_mha(x[:, :19], past_key_value=cache)
    child = cache.fork(0)
    assert child == 1 and cache.lengths == [19, 19]
    # The parent continues with x, the child with y: each equals its own whole sequence.
    outs = cfg.forward_ragged(cache, [0, 1], [x[0, 19:25], y[0]])
    _assert_close(outs[0], ref.mha_forward(hf_config, weights, x[:, :25])[0, 19:], "parent after fork")
    child_seq = np.concatenate([x[:, :19], y], axis=1)
    _assert_close(outs[1], ref.mha_forward(hf_config, weights, child_seq)[0, 19:], "child after fork")
    # Rollback: truncate the child to 19 and feed x: now it is the parent's sequence.
    cache.truncate(1, 19)
    again = cfg.forward_ragged(cache, [1], [x[0, 19:25]])[0]
    _assert_close(again, outs[0].astype(np.float64), "child truncated then re-fed", SAME_LAYER_MAX_NORMALIZED,
                  SAME_LAYER_MAX_NORMALIZED)
    # position_ids with an offset: positions 100.. as a whole-sequence forward at those positions.
    cache.reset()
    assert cache.lengths == [0, 0]
    positions = np.arange(100, 130)[None]
    fresh = cfg.kv_cache(batch=1, max_tokens=40)
    got = np.concatenate([cfg.forward_mha(x[:, :12], position_ids=positions[:, :12], past_key_value=fresh),
                          cfg.forward_mha(x[:, 12:], position_ids=positions[:, 12:], past_key_value=fresh)], axis=1)
    _assert_close(got, ref.mha_forward(hf_config, weights, x, None, positions), "position offsets")


def test_window_keeps_the_pool_bounded(rng):
    """Mistral's window (16) with pages of 4: after the window fills, decoding returns pages
    as fast as it takes them."""
    hf_config, cfg, weights = _layer("mistral", rng)
    cache = cfg.kv_cache(batch=1, max_tokens=200, page_size=4)
    x = rng.uniform(-1, 1, (1, 120, cfg.hidden_size)).astype(np.float32)
    outputs = [cfg.forward_mha(x[:, :20], past_key_value=cache)]
    free_after_window = None
    for t in range(20, 120):
        outputs.append(cfg.forward_mha(x[:, t:t + 1], past_key_value=cache))
        free = cache.stats()["free_pages"]
        if t == 40:
            free_after_window = free
        if t > 40:
            assert free >= free_after_window - 1, f"step {t}: {free} free pages, {free_after_window} at step 40"
    _assert_close(np.concatenate(outputs, axis=1), ref.mha_forward(hf_config, weights, x), "window decode")


def test_errors_name_the_argument_and_leave_the_cache(rng):
    hf_config, cfg, _ = _layer("llama3", rng)
    cache = cfg.kv_cache(batch=2, max_tokens=8, page_size=4)
    x = np.zeros((2, 3, cfg.hidden_size), np.float32)
    cfg.forward_mha(x, past_key_value=cache)
    before = (cache.lengths, cache.stats())
    with pytest.raises(ValueError, match="hidden_states: batch 1 does not match the cache's 2 rows"):
        cfg.forward_mha(x[:1], past_key_value=cache)
    with pytest.raises(ValueError, match=r"attention_mask: expected a padding mask of shape \[2, 6\]"):
        cfg.forward_mha(x, np.ones((2, 5)), past_key_value=cache)
    with pytest.raises(TypeError, match="past_key_value: expected a sneppx KVCache"):
        cfg.forward_mha(x, past_key_value={})
    # 3 + 12 tokens: 4 pages a row, 8 in all, beyond the pool's 2 x (2 + 1 spare).
    with pytest.raises(sneppx.Error, match="pages"):
        cfg.forward_mha(np.zeros((2, 12, cfg.hidden_size), np.float32), past_key_value=cache)
    with pytest.raises(IndexError, match="row: 2 is not a row"):
        cache.fork(2)
    with pytest.raises(sneppx.Error, match="length"):
        cache.truncate(0, 4)
    with pytest.raises(ValueError, match="page_size"):
        cfg.kv_cache(batch=1, max_tokens=8, page_size=6)
    with pytest.raises(ValueError, match="max_tokens: 0 must be at least 1"):
        cfg.kv_cache(batch=1, max_tokens=0)
    other = sneppx.LLMConfig(**FAMILIES["llama2"])
    with pytest.raises(sneppx.Error, match="cache: made for 2 K/V heads of head_dim 32"):
        other.forward_mha(np.zeros((2, 1, other.hidden_size), np.float32), past_key_value=cache)
    assert (cache.lengths, cache.stats()) == before


@pytest.mark.parametrize("family", ["qwen2", "deepseek-v2", "mistral"])
def test_long_decode_splits_keys_across_threads(family, rng):
    """Decode over 1100 cached tokens with one K/V head (qwen2's stand-in; MLA's latent) on
    two threads: the keys are cut into ranges merged by log-sum-exp (split-KV), and
    under mistral's window the visible range is; every row still equals the reference."""
    hf_config, cfg, weights = _layer(family, rng)
    if family == "deepseek-v2":
        hf_config = dict(hf_config, max_position_embeddings=4096)
        cfg = sneppx.LLMConfig(**hf_config)
        cfg.load_state_dict(weights)
    seq_len = 1104
    x = rng.uniform(-1, 1, (1, seq_len, cfg.hidden_size)).astype(np.float32)
    cache = cfg.kv_cache(batch=1, max_tokens=seq_len, page_size=16)
    outputs = [cfg.forward_mha(x[:, :1100], past_key_value=cache)]
    outputs += [cfg.forward_mha(x[:, t:t + 1], past_key_value=cache) for t in range(1100, 1102)]
    outputs.append(cfg.forward_mha(x[:, 1102:], past_key_value=cache))   # 2 queries at once
    got = np.concatenate(outputs, axis=1)[:, 1100:]
    want = ref.mha_forward(hf_config, weights, x)[:, 1100:]
    _assert_close(got, want, f"{family} long decode")
