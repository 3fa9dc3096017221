"""The Python KV cache (LLMConfig.kv_cache, forward_mha(past_key_value=...), forward_ragged)
against the float64 reference of the whole sequence (reference.mha_forward) and the
cache-free forward. A cached forward computes the same rows as the whole sequence, so
the thresholds are test_numerics.py's (reference.FP32_*)."""
import copy
import pickle
import re

import numpy as np
import pytest

import decode_numerics
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


def test_forks_that_fill_the_pool_get_python_advice(rng):
    """A cache of one row of 16 tokens in pages of 4 has a pool of 5 pages; four forks
    growing by 8 tokens each need 8 more: OutOfMemoryError advising kv_cache()'s batch or
    max_tokens (the C message names capacity_tokens, which Python callers do not set),
    and the cache as it was."""
    hf_config, cfg, weights = _layer("llama3", rng)
    cache = cfg.kv_cache(batch=1, max_tokens=16, page_size=4)
    x = rng.uniform(-1, 1, (1, 4, cfg.hidden_size)).astype(np.float32)
    cfg.forward_mha(x, past_key_value=cache)
    rows = [cache.fork(0) for _ in range(4)]
    before = (cache.lengths, cache.stats())
    grow = [rng.uniform(-1, 1, (8, cfg.hidden_size)).astype(np.float32) for _ in rows]
    with pytest.raises(sneppx.errors.OutOfMemoryError, match=r"pool full: .*a larger batch or max_tokens") as caught:
        cfg.forward_ragged(cache, rows, grow)
    assert "capacity_tokens" not in str(caught.value)
    assert (cache.lengths, cache.stats()) == before


DYNAMIC_ROPE = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    max_position_embeddings=16, rope_scaling={"rope_type": "dynamic", "factor": 2.0})


def test_dynamic_rope_scales_by_the_calls_longest_row(rng):
    """Dynamic NTK past max_position_embeddings (16) scales RoPE by the call's longest
    position over all its rows, as transformers does for a batch: a ragged call of 4, 40
    and 9 new tokens rotates every row by 40's frequencies (the rows alone, by their own,
    are 0.4% apart from that)."""
    cfg = sneppx.LLMConfig(**DYNAMIC_ROPE)
    weights = ref.random_state_dict(DYNAMIC_ROPE, rng, qkv_bias=cfg.qkv_bias, o_bias=cfg.o_bias)
    cfg.load_state_dict(weights)
    xs = [rng.uniform(-1, 1, (n, cfg.hidden_size)).astype(np.float32) for n in (4, 40, 9)]
    outs = cfg.forward_ragged(cfg.kv_cache(batch=3, max_tokens=64, page_size=4), [0, 1, 2], xs)
    for row, (x, out) in enumerate(zip(xs, outs)):
        _assert_close(out, ref.mha_forward(DYNAMIC_ROPE, weights, x[None], rope_length=40)[0], f"row {row}")
    alone = ref.mha_forward(DYNAMIC_ROPE, weights, xs[0][None])[0]
    assert ref.normalized_error(outs[0], alone)[0] > 1e-3, "the rows alone must differ, or this shows nothing"


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


def test_read_under_a_window_starts_at_the_first_held_token(rng):
    """Mistral's window (16) over pages of 4, 40 tokens in: every later query sees tokens
    25 on, so pages 0..5 (tokens 0..23) went back to the pool. first_held says 24, and
    read() starts there by default; an explicit begin before it is refused, naming it."""
    _, cfg, _ = _layer("mistral", rng)
    cache = cfg.kv_cache(batch=1, max_tokens=64, page_size=4)
    cfg.forward_mha(rng.uniform(-1, 1, (1, 40, cfg.hidden_size)).astype(np.float32), past_key_value=cache)
    assert cache.first_held(0) == 24
    k, v = cache.read(0)
    k_held, v_held = cache.read(0, begin=24)
    assert k.shape[0] == 16 and np.array_equal(k, k_held) and np.array_equal(v, v_held)
    with pytest.raises(ValueError, match=r"^begin, end: \[23, 40\) is not within the tokens row 0 holds"):
        cache.read(0, begin=23)
    cache.truncate(0, 0)
    assert cache.first_held(0) == 0 and cache.read(0)[0].shape[0] == 0
    with pytest.raises(IndexError):
        cache.first_held(1)


def test_truncate_to_zero_under_a_window_starts_the_row_over(rng):
    """Once the window has released a row's first pages, truncate(row, 0) (what
    SneppxCache.crop does to a short row) still empties it: it keeps no token, so none
    it would need is gone. The row then computes its new sequence from the start."""
    hf_config, cfg, weights = _layer("mistral", rng)
    cache = cfg.kv_cache(batch=1, max_tokens=64, page_size=4)
    x = rng.uniform(-1, 1, (1, 40, cfg.hidden_size)).astype(np.float32)
    cfg.forward_mha(x, past_key_value=cache)
    cache.truncate(0, 0)
    assert cache.lengths == [0] and cache.stats()["free_pages"] == cache.stats()["total_pages"]
    y = rng.uniform(-1, 1, (1, 20, cfg.hidden_size)).astype(np.float32)
    _assert_close(cfg.forward_mha(y, past_key_value=cache), ref.mha_forward(hf_config, weights, y), "after truncate 0")


def test_truncate_rows_cuts_all_or_none(rng):
    """truncate_rows (SneppxCache.crop's call) checks every row before it cuts one: under
    mistral's window of 16 (pages of 4), row 1 past its window cannot go back to 30 of its
    40 tokens, and row 0 then keeps its 10 too. A batch that passes cuts each row as a
    lone truncate does, and the rows then compute their new tokens as the float64
    reference of what they hold."""
    hf_config, cfg, weights = _layer("mistral", rng)
    cache = cfg.kv_cache(batch=2, max_tokens=64, page_size=4)
    x = rng.uniform(-1, 1, (2, 40, cfg.hidden_size)).astype(np.float32)
    cfg.forward_ragged(cache, [0, 1], [x[0, :10], x[1]])
    before = (cache.lengths, cache.stats())
    with pytest.raises(sneppx.InvalidArgumentError, match=r"^lengths\[1\]: 30 is too far back"):
        cache.truncate_rows([0, 1], [4, 30])
    for call, error, message in [
            (lambda: cache.truncate_rows([0, 0], [4, 4]), sneppx.InvalidArgumentError, r"rows\[1\]: row 0 is also"),
            (lambda: cache.truncate_rows([0, 2], [4, 4]), IndexError, r"rows\[1\]: 2 is not a row"),
            (lambda: cache.truncate_rows([0, 1], [4]), ValueError, "lengths: 1 entries for 2 rows"),
            (lambda: cache.truncate_rows([0, 1], [4, -1]), ValueError, r"lengths\[1\]: -1 must be at least 0"),
            (lambda: cache.truncate_rows([0, 1], [11, 39]), sneppx.InvalidArgumentError, r"lengths\[0\]: 11"),
            (lambda: cache.truncate_rows(0, [4]), TypeError, "rows: expected one entry per row")]:
        with pytest.raises(error, match=message):
            call()
    assert (cache.lengths, cache.stats()) == before
    cache.truncate_rows([], [])
    cache.truncate_rows([1, 0], [39, 4])
    lone = cfg.kv_cache(batch=2, max_tokens=64, page_size=4)
    cfg.forward_ragged(lone, [0, 1], [x[0, :10], x[1]])
    lone.truncate(0, 4)
    lone.truncate(1, 39)
    assert cache.lengths == lone.lengths == [4, 39] and cache.stats() == lone.stats()
    y = rng.uniform(-1, 1, (2, 1, cfg.hidden_size)).astype(np.float32)
    got = cfg.forward_ragged(cache, [0, 1], [y[0], y[1]])
    for row, kept in enumerate([4, 39]):
        whole = np.concatenate([x[row:row + 1, :kept], y[row:row + 1]], axis=1)
        _assert_close(got[row], ref.mha_forward(hf_config, weights, whole)[0, -1:], f"row {row} after truncate_rows")


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
    # A layer the cache does not have is named by Python's layer_idx, not C's layer_index.
    for call in (lambda: cfg.forward_mha(x, past_key_value=cache, layer_idx=1),
                 lambda: cfg.forward_mha(x, np.ones((2, 6)), past_key_value=cache, layer_idx=1),
                 lambda: cfg.forward_ragged(cache, [0], [x[0]], layer_idx=1),
                 lambda: cache.read(0, layer_idx=1), lambda: cache.layer_lengths(1)):
        with pytest.raises(sneppx.InvalidArgumentError, match=r"^layer_idx: 1 must be in \[0, 1\) \(the cache's"):
            call()
    # 3 + 12 tokens: 4 pages a row, 8 in all, beyond the pool's 2 x (2 + 1 spare).
    with pytest.raises(sneppx.Error, match="pages"):
        cfg.forward_mha(np.zeros((2, 12, cfg.hidden_size), np.float32), past_key_value=cache)
    with pytest.raises(IndexError, match="row: 2 is not a row"):
        cache.fork(2)
    with pytest.raises(sneppx.Error, match="length"):
        cache.truncate(0, 4)
    with pytest.raises(ValueError, match="page_size"):
        cfg.kv_cache(batch=1, max_tokens=8, page_size=6)
    # No page_size: the C library's default (sneppx_kv_cache_options_init), and the pool
    # sized in pages of it: every row full plus one spare page per row.
    default = cfg.kv_cache(batch=2, max_tokens=40).stats()
    assert default["page_size"] >= 16 and default["page_size"] & (default["page_size"] - 1) == 0
    assert default["total_pages"] == 2 * (-(-40 // default["page_size"]) + 1)
    with pytest.raises(ValueError, match="max_tokens: 0 must be at least 1"):
        cfg.kv_cache(batch=1, max_tokens=0)
    other = sneppx.LLMConfig(**FAMILIES["llama2"])
    with pytest.raises(sneppx.Error, match="cache: made for 2 K/V heads of head_dim 32"):
        other.forward_mha(np.zeros((2, 1, other.hidden_size), np.float32), past_key_value=cache)
    assert (cache.lengths, cache.stats()) == before


def test_row_growing_past_max_positions_is_named(rng):
    """Without position_ids a row's positions continue from its cached length, so the row
    that grows past max_position_embeddings is what the error names (rows[i] / the batch
    row of hidden_states, its length and new tokens), not position_ids, which the caller
    never gave; no row of the call is appended to."""
    hf_config = dict(FAMILIES["llama3"], max_position_embeddings=8)
    cfg = sneppx.LLMConfig(**hf_config)
    cfg.load_state_dict(ref.random_state_dict(hf_config, rng, qkv_bias=cfg.qkv_bias, o_bias=cfg.o_bias))
    cache = cfg.kv_cache(batch=2, max_tokens=16, page_size=4)
    x = rng.uniform(-1, 1, (2, 6, cfg.hidden_size)).astype(np.float32)
    cfg.forward_ragged(cache, [0, 1], [x[0], x[1, :2]])
    before = (cache.lengths, cache.stats())
    with pytest.raises(sneppx.InvalidArgumentError,
                       match=r"^rows\[1\]: row 0 holds 6 tokens at layer 0, and its 3 new ones reach position 8, "
                             r"beyond max_position_embeddings 8 \(position_ids NULL: "):
        cfg.forward_ragged(cache, [1, 0], [x[1, 2:3], x[0, :3]])
    assert (cache.lengths, cache.stats()) == before
    with pytest.raises(sneppx.InvalidArgumentError, match=r"^hidden_states\[0\]: row 0 holds 6 tokens at layer 0, "
                                                          r"and its 3 new ones reach position 8"):
        cfg.forward_mha(x[:, :3], past_key_value=cache)
    assert cache.lengths == [6, 2]


def test_mask_showing_released_tokens_names_attention_mask(rng):
    """Under a window, a 4-D mask that lets a query see a token the cache already released
    is refused naming forward_mha's argument and its batch row (the C call's per-row planes
    are its `masks[i]`, which a Python caller never wrote), and the cache is left as it was."""
    _, cfg, _ = _layer("mistral", rng)
    window = cfg.sliding_window
    cache = cfg.kv_cache(batch=2, max_tokens=2 * window, page_size=1)
    x = rng.uniform(-1, 1, (2, window + 4, cfg.hidden_size)).astype(np.float32)
    cfg.forward_mha(x, past_key_value=cache)
    before = cache.lengths
    keys = window + 5
    mask = np.zeros((2, 1, 1, keys), np.float32)
    mask[0, 0, 0, :keys - window] = -np.inf      # row 0 hides what the window hides; row 1 shows token 0
    with pytest.raises(sneppx.InvalidArgumentError, match=r"^attention_mask\[1\]: row 0 lets the query see token 0"):
        cfg.forward_mha(x[:, :1], attention_mask=mask, past_key_value=cache)
    assert cache.lengths == before


def test_ragged_arguments_must_be_per_row(rng):
    _, cfg, _ = _layer("llama3", rng)
    cache = cfg.kv_cache(batch=1, max_tokens=8)
    token = np.zeros((1, cfg.hidden_size), np.float32)
    for name, args, kwargs in [("rows", (0, [token]), {}), ("hidden_states", ([0], None), {}),
                               ("position_ids", ([0], [token]), dict(position_ids=5))]:
        with pytest.raises(TypeError, match=f"^{name}: expected one entry per row .*, got (int|NoneType)$"):
            cfg.forward_ragged(cache, *args, **kwargs)
    # A negative position is named by the row and its index in the row, and changes nothing.
    two = np.zeros((2, cfg.hidden_size), np.float32)
    with pytest.raises(ValueError, match=r"^position_ids\[0\]\[1\]: position -1 is negative$"):
        cfg.forward_ragged(cache, [0], [two], position_ids=[[0, -1]])
    assert cache.lengths == [0]
    # A row twice in one call is named by forward_ragged's argument.
    with pytest.raises(sneppx.InvalidArgumentError, match=r"^rows\[1\]: row 0 is also rows\[0\]: each row at most "
                       r"once per call$"):
        cfg.forward_ragged(cache, [0, 0], [two, two[:1]])
    assert cache.lengths == [0]
    # A row the cache does not have is named by its place in rows.
    with pytest.raises(IndexError, match=r"^rows\[1\]: 3 is not a row of this cache \(0\.\.0\)$"):
        cfg.forward_ragged(cache, [0, 3], [two, two])
    assert cache.lengths == [0]
    # No rows is no work, with or without (no) positions.
    assert cfg.forward_ragged(cache, [], []) == []
    assert cfg.forward_ragged(cache, [], [], position_ids=[]) == []
    assert cache.lengths == [0]


def test_mla_naive_layer_is_refused_naming_mla_naive(rng):
    """A cache holds the absorbed form's latent rows: a cached forward of an mla_naive layer
    is refused, named by the LLMConfig's attribute (the C message names its layer and
    advises creating it again), and the cache is left as it was."""
    hf_config, cfg, weights = _layer("deepseek-v2", rng)
    cache = cfg.kv_cache(batch=1, max_tokens=8)
    x = rng.uniform(-1, 1, (1, 3, cfg.hidden_size)).astype(np.float32)
    cfg.mla_naive = True
    for call in (lambda: cfg.forward_mha(x, past_key_value=cache), lambda: cfg.forward_ragged(cache, [0], [x[0]])):
        with pytest.raises(sneppx.UnsupportedError, match=r"^mla_naive: True; .*\(set the LLMConfig's mla_naive = "
                                                          r"False\)$"):
            call()
    assert cache.lengths == [0]
    cfg.mla_naive = False
    _assert_close(cfg.forward_mha(x, past_key_value=cache), ref.mha_forward(hf_config, weights, x), "absorbed again")


def test_errors_name_rows_not_the_c_sequences(rng):
    """The C cache names its sequences by id, which after reset() (new ids, with generation
    bits: row 0 is sequence 4294967296 after one) is no row index, and its calls' seq_ids[i]: a Python
    caller gave rows, so every message names the row and the caller's argument."""
    _, cfg, _ = _layer("llama3", rng)
    cache = cfg.kv_cache(batch=2, max_tokens=8, page_size=4)
    cache.reset()
    cfg.forward_mha(np.zeros((2, 5, cfg.hidden_size), np.float32), past_key_value=cache)
    before = (cache.lengths, cache.stats())
    big = np.zeros((40, cfg.hidden_size), np.float32)
    for call, pattern in [
            (lambda: cache.truncate(1, 9), r"^length: 9 must be in \[0, 5\] \(the length of row 1\)$"),
            (lambda: cache.truncate_rows([1, 0], [2, 9]), r"^lengths\[1\]: 9 .*\(the length of row 0\)$"),
            (lambda: cache.read(1, begin=3, end=9), r"^begin, end: \[3, 9\) is not within the tokens row 1 holds"),
            (lambda: cfg.forward_ragged(cache, [1], [big]), r"pool full: row 1 \(rows\[0\]\) needs"),
            (lambda: cfg.forward_mha(big[None].repeat(2, 0), past_key_value=cache),
             r"pool full: row 0 \(hidden_states\[0\]\) needs")]:
        with pytest.raises(sneppx.Error, match=pattern) as caught:
            call()
        assert not re.search(r"sequence \d|seq_ids", str(caught.value))
    assert (cache.lengths, cache.stats()) == before


def test_numpy_bools_are_not_integers(rng):
    # numpy's bool has __index__; like Python's True it is refused where a count, a row or
    # a layer index goes (np.True_ was row 1, np.False_ layer 0).
    _, cfg, _ = _layer("llama3", rng)
    cache = cfg.kv_cache(batch=2, max_tokens=8)
    token = np.zeros((cfg.hidden_size,), np.float32)[None]
    for name, call in [("batch", lambda: cfg.kv_cache(batch=np.True_, max_tokens=8)),
                       ("max_tokens", lambda: cfg.kv_cache(batch=1, max_tokens=np.True_)),
                       ("layer_idx", lambda: cfg.forward_mha(token[None].repeat(2, 0), past_key_value=cache,
                                                             layer_idx=np.False_)),
                       ("rows\\[0\\]", lambda: cfg.forward_ragged(cache, [np.True_], [token])),
                       ("row", lambda: cache.fork(np.False_)),
                       ("length", lambda: cache.truncate(0, np.False_)),
                       ("begin", lambda: cache.read(0, begin=np.False_))]:
        with pytest.raises(TypeError, match=f"{name}: expected an integer, got (np\\.)?(True|False)"):
            call()
    assert cache.lengths == [0, 0] and cache.batch == 2


@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy, pickle.dumps], ids=["copy", "deepcopy", "pickle"])
def test_copy_and_pickle_are_refused(copier, rng):
    # A copy would share the C cache's handle: the first of the two collected frees it
    # and the other then reads freed pages (it crashed the interpreter).
    _, cfg, _ = _layer("llama3", rng)
    cache = cfg.kv_cache(batch=1, max_tokens=8)
    cfg.forward_mha(np.zeros((1, 3, cfg.hidden_size), np.float32), past_key_value=cache)
    with pytest.raises(TypeError, match="KVCache cannot be copied or pickled.*fork"):
        copier(cache)
    assert cache.lengths == [3]


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


# ---- narrow caches: bfloat16, float16, int8 ----
# The float64 reference attends over K (after RoPE) and V (MLA: the latent rows) exactly
# as the cache holds them (KVCache.read: the stored values widened), so only float32
# arithmetic separates the two: the float32 cache's budget. (A reference that rounded
# its own float64 K would differ wherever the layer's float32 K sits within a float32
# rounding of a tie: 3e-5 for bfloat16 at llama3-8B's heads.) That the stored values are
# the type's rounding of the layer's float32 K/V is test_stored_values_are_numpy_rounding's.
# An int8 cache read by integer dot products adds their 16-bit rounding (decode_numerics).
NARROW_MAX_NORMALIZED = 1e-5
NARROW_TYPES = ["bfloat16", "float16", "int8"]
# llama3-8B's heads (32 query heads, 8 K/V heads of 128) at a small hidden size.
LLAMA3_8B_HEADS = dict(hidden_size=256, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                       rope_theta=500000.0, attention_bias=False)
NARROW_FAMILIES = {"llama3-8B-heads": LLAMA3_8B_HEADS, "deepseek-v2-lite-like": FAMILIES["deepseek-v2-lite-like"]}


def _narrow_layer(name, rng):
    hf_config = NARROW_FAMILIES[name] if name in NARROW_FAMILIES else FAMILIES[name]
    cfg = sneppx.LLMConfig(**hf_config)
    weights = ref.random_state_dict(hf_config, rng, qkv_bias=cfg.qkv_bias, o_bias=cfg.o_bias)
    cfg.load_state_dict(weights)
    return hf_config, cfg, weights


class _Stored:
    """Each row's K/V as the cache held them when appended (read right after each call,
    so tokens a window releases later are kept)."""

    def __init__(self):
        self.rows = {}

    def record(self, cache, rows, counts):
        for row, count in zip(rows, counts):
            end = cache.layer_lengths(0)[row]
            k, v = cache.read(row, 0, end - count, end)
            parts = self.rows.setdefault(row, [])
            parts.append((k, v))

    def fork(self, parent, child):
        self.rows[child] = list(self.rows[parent])

    def of(self, row):
        ks = np.concatenate([k for k, _ in self.rows[row]])
        vs = None if self.rows[row][0][1] is None else np.concatenate([v for _, v in self.rows[row]])
        return ks, vs


def _check_rows(got, hf_config, weights, sequence, stored, what, dtype):
    """got: the outputs of the last got.shape[0] tokens of `sequence` [s, hidden]."""
    want = ref.mha_forward(hf_config, weights, sequence[None], stored=stored)[0, sequence.shape[0] - got.shape[0]:]
    limit = decode_numerics.tolerance(dtype, NARROW_MAX_NORMALIZED)
    _assert_close(got, want, what, limit, limit)


def _prefill_then_decode(cfg, cache, x, prefill, stored):
    """Both rows of x: a prefill of `prefill` tokens (the gathered path), then one decode
    step per remaining token, each call's K/V recorded in stored; the outputs [2, tokens, hidden]."""
    got = [cfg.forward_mha(x[:, :prefill], past_key_value=cache)]
    stored.record(cache, [0, 1], [prefill, prefill])
    for t in range(prefill, x.shape[1]):
        got.append(cfg.forward_mha(x[:, t:t + 1], past_key_value=cache))
        stored.record(cache, [0, 1], [1, 1])
    return np.concatenate(got, axis=1)


@pytest.mark.parametrize("dtype", NARROW_TYPES)
@pytest.mark.parametrize("family", list(NARROW_FAMILIES))
def test_narrow_cache_prefill_decode_ragged_fork(family, dtype, rng):
    """A prefill (20 tokens: the gathered path), decode steps across pages of 4, then a
    ragged call (a 17-token chunk beside a decode) and a fork that continues both ways:
    every row equals the float64 reference over the K/V the cache holds."""
    hf_config, cfg, weights = _narrow_layer(family, rng)
    x = rng.uniform(-1, 1, (2, 40, cfg.hidden_size)).astype(np.float32)
    cache = cfg.kv_cache(batch=2, max_tokens=64, page_size=4, dtype=dtype)
    stored = _Stored()
    got = _prefill_then_decode(cfg, cache, x[:, :23], 20, stored)
    for row in range(2):
        _check_rows(got[row], hf_config, weights, x[row, :23], stored.of(row), f"{family} {dtype} prefill + decode",
                    dtype)
    # Ragged: row 0 takes a 17-token chunk (gathered), row 1 one token (decode).
    outs = cfg.forward_ragged(cache, [0, 1], [x[0, 23:40], x[1, 23:24]])
    stored.record(cache, [0, 1], [17, 1])
    _check_rows(outs[0], hf_config, weights, x[0, :40], stored.of(0), f"{family} {dtype} ragged chunk", dtype)
    _check_rows(outs[1], hf_config, weights, x[1, :24], stored.of(1), f"{family} {dtype} ragged decode", dtype)
    # Fork row 1 mid-page (24 tokens): parent and child continue with different tokens,
    # the child copying the shared page on its first append.
    child = cache.fork(1)
    stored.fork(1, child)
    y = rng.uniform(-1, 1, (3, cfg.hidden_size)).astype(np.float32)
    outs = cfg.forward_ragged(cache, [1, child], [x[1, 24:27], y])
    stored.record(cache, [1, child], [3, 3])
    _check_rows(outs[0], hf_config, weights, x[1, :27], stored.of(1), f"{family} {dtype} parent after fork", dtype)
    _check_rows(outs[1], hf_config, weights, np.concatenate([x[1, :24], y]), stored.of(child),
                f"{family} {dtype} child after fork", dtype)
    # The parent's shared prefix is untouched by the child's copy-on-write.
    assert np.array_equal(cache.read(1, 0, 0, 24)[0], stored.of(1)[0][:24])
    assert cache.lengths == [40, 27, 27]


@pytest.mark.parametrize("weight_dtype, dtype", [("bfloat16", "bfloat16"), ("bfloat16", "int8"),
                                                  ("int8", "int8"), ("int8", "float16"), ("float16", "bfloat16")])
@pytest.mark.parametrize("family", list(NARROW_FAMILIES))
def test_narrow_weights_with_narrow_cache(family, weight_dtype, dtype, rng):
    """Both narrow at once: a layer of weight_dtype over a cache of dtype, a prefill (the
    gathered path) then decode steps, against the float64 reference computed on the
    rounded / quantized weights (reference.round_weights, as the layer packs them) over
    the K/V the cache holds: the only error left is float32 arithmetic's."""
    hf_config, cfg, weights = _narrow_layer(family, rng)
    cfg.load_state_dict(weights, dtype=weight_dtype)
    rounded = ref.round_weights(weights, weight_dtype, hf_config)
    x = rng.uniform(-1, 1, (2, 24, cfg.hidden_size)).astype(np.float32)
    cache = cfg.kv_cache(batch=2, max_tokens=32, page_size=4, dtype=dtype)
    stored = _Stored()
    got = _prefill_then_decode(cfg, cache, x, 20, stored)
    for row in range(2):
        _check_rows(got[row], hf_config, rounded, x[row], stored.of(row),
                    f"{family} {weight_dtype} weights, {dtype} cache", dtype)
    # The weights' rounding is visible: against the unrounded weights the same check fails.
    with pytest.raises(AssertionError):
        _check_rows(got[0], hf_config, weights, x[0], stored.of(0), "unrounded weights", dtype)


@pytest.mark.parametrize("dtype", NARROW_TYPES)
def test_narrow_cache_sliding_window(dtype, rng):
    """Mistral's window (16) over pages of 4, decoded well past it: released pages and
    the window's edge keep working for every type, and the pool stays bounded."""
    hf_config, cfg, weights = _narrow_layer("mistral", rng)
    seq_len = 48
    x = rng.uniform(-1, 1, (1, seq_len, cfg.hidden_size)).astype(np.float32)
    cache = cfg.kv_cache(batch=1, max_tokens=seq_len, page_size=4, dtype=dtype)
    stored = _Stored()
    got = [cfg.forward_mha(x[:, :18], past_key_value=cache)]
    stored.record(cache, [0], [18])
    for t in range(18, seq_len):
        got.append(cfg.forward_mha(x[:, t:t + 1], past_key_value=cache))
        stored.record(cache, [0], [1])
    _check_rows(np.concatenate(got, axis=1)[0], hf_config, weights, x[0], stored.of(0), f"mistral {dtype} window", dtype)
    stats = cache.stats()
    assert stats["total_pages"] - stats["free_pages"] <= 16 // 4 + 2


@pytest.mark.parametrize("dtype", NARROW_TYPES)
@pytest.mark.parametrize("family", list(NARROW_FAMILIES))
def test_stored_values_are_numpy_rounding(family, dtype, rng):
    """The same tokens into a float32 cache and a narrow one: the narrow cache holds
    exactly numpy's rounding of the float32 cache's K (after RoPE) and V (MLA: latent
    rows), bit for bit (reference.kv_stored: nearest even; int8 per row and K/V head)."""
    _, cfg, _ = _narrow_layer(family, rng)
    x = rng.uniform(-1, 1, (1, 9, cfg.hidden_size)).astype(np.float32)
    wide = cfg.kv_cache(max_tokens=16, page_size=4)
    narrow = cfg.kv_cache(max_tokens=16, page_size=4, dtype=dtype)
    cfg.forward_mha(x, past_key_value=wide)
    cfg.forward_mha(x, past_key_value=narrow)
    for got, full in zip(narrow.read(0), wide.read(0)):
        if full is not None:
            want = ref.kv_stored(full, dtype).astype(np.float32)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"{family} {dtype}: stored values"
            assert not np.array_equal(got, full)


@pytest.mark.parametrize("dtype", ["float32"] + NARROW_TYPES)
@pytest.mark.parametrize("family", list(NARROW_FAMILIES))
def test_decode_kernel_equals_gathered_path(family, dtype, rng):
    """The same 20 tokens after the same prefix, fed to two forks of one sequence: in
    one call (over 16 queries: keys gathered and widened by the runtime, then flash) and
    one token per call (attn_decode widening in registers): the same rows (an int8 cache
    read by integer dot products: within their rounding, decode_numerics)."""
    _, cfg, _ = _narrow_layer(family, rng)
    x = rng.uniform(-1, 1, (1, 50, cfg.hidden_size)).astype(np.float32)
    cache = cfg.kv_cache(batch=1, max_tokens=128, page_size=16, dtype=dtype)  # room for the fork's pages
    cfg.forward_mha(x[:, :30], past_key_value=cache)
    child = cache.fork(0)
    gathered = cfg.forward_ragged(cache, [0], [x[0, 30:]])[0]
    decoded = np.concatenate([cfg.forward_ragged(cache, [child], [x[0, t:t + 1]])[0] for t in range(30, 50)])
    limit = decode_numerics.tolerance(dtype, SAME_LAYER_MAX_NORMALIZED)
    _assert_close(decoded, gathered.astype(np.float64), f"{family} {dtype} decode vs gathered", limit, limit)


def test_narrow_cache_sizes_and_names(rng):
    """dtype by name, numpy type or torch dtype; stats give the type and bytes per token
    (llama3's layer: 2 K/V heads x (32 + 32) elements; int8 adds 4 float32 scales); bad
    names and read() ranges are refused naming the argument."""
    _, cfg, _ = _narrow_layer("llama3", rng)
    want = {"float32": 512, "bfloat16": 256, "float16": 256, "int8": 128 + 16}
    for name, dtype in (("float32", np.float32), ("bfloat16", "bfloat16"), ("float16", np.dtype("float16")),
                        ("int8", np.int8)):
        cache = cfg.kv_cache(batch=1, max_tokens=8, dtype=dtype)
        stats = cache.stats()
        assert cache.dtype == name and stats["dtype"] == name and stats["token_bytes"] == want[name], stats
        assert stats["token_elements"] == 128 and f"dtype={name!r}" in repr(cache)

    class TorchLike:  # what str() of torch.bfloat16 gives, without importing torch
        def __str__(self):
            return "torch.bfloat16"

    assert cfg.kv_cache(max_tokens=8, dtype=TorchLike()).dtype == "bfloat16"
    for bad, error in (("int4", ValueError), ("bf16", ValueError), ("", ValueError), (np.float64, ValueError),
                       (3, TypeError), (None, TypeError)):
        with pytest.raises(error, match="dtype"):
            cfg.kv_cache(max_tokens=8, dtype=bad)
    cache = cfg.kv_cache(max_tokens=8, dtype="int8")
    cfg.forward_mha(rng.uniform(-1, 1, (1, 3, cfg.hidden_size)).astype(np.float32), past_key_value=cache)
    assert cache.read(0)[0].shape == (3, 2, 32) and cache.read(0, 0, 1, 2)[1].shape == (1, 2, 32)
    with pytest.raises(ValueError, match="begin, end"):
        cache.read(0, 0, 2, 5)


# ---- random operations on a cache two layers share ----


@pytest.mark.parametrize("family, page_size, window, dtype", [
    ("llama3", 1, 0, "float32"), ("mistral", 2, 5, "float32"), ("qwen2", 8, 9, "int8"),
    ("deepseek-v2-lite-like", 1, 0, "float32"), ("deepseek-v2-lite-like", 4, 0, "int8")])
def test_random_operations_on_two_layers_equal_the_reference(family, page_size, window, dtype, rng):
    """Two layers (their own weights) share one cache of rows that 40 random operations
    grow and cut: ragged calls at either layer (decode steps, runs of 2..16 queries for
    attn_decode, chunks past 16 for the gathered path), forks, truncate and truncate_rows
    between and in the middle of a step (the layers' lengths then differ), under a window
    that releases pages. After each call every row equals the float64 reference of its
    whole sequence at that layer, K/V stored as the cache's type stores them (int8: rows
    quantized; a tie rounded apart by the float64 reference is rare at int8's steps)."""
    hf_config = dict(FAMILIES[family], **({"sliding_window": window} if window else {}))
    layers = []
    for _ in range(2):
        cfg = sneppx.LLMConfig(**hf_config)
        weights = ref.random_state_dict(hf_config, rng, qkv_bias=cfg.qkv_bias, o_bias=cfg.o_bias)
        cfg.load_state_dict(weights)
        layers.append((cfg, weights))
    hidden = layers[0][0].hidden_size
    cache = layers[0][0].kv_cache(batch=2, max_tokens=48, page_size=page_size, num_layers=2, dtype=dtype)
    rows = [[np.zeros((0, hidden), np.float32)] * 2 for _ in range(2)]   # rows[layer][row]: its tokens
    for step in range(40):
        op = rng.integers(10)
        if op == 0 and len(rows[0]) < 5:
            parent = int(rng.integers(len(rows[0])))
            assert cache.fork(parent) == len(rows[0])
            for tokens in rows:
                tokens.append(tokens[parent])
        elif op in (1, 2):
            cut = [int(r) for r in rng.permutation(len(rows[0]))[:rng.integers(1, 3)]]
            keep = [int(rng.integers(max(len(tokens[r]) for tokens in rows) + 1)) for r in cut]
            try:
                cache.truncate_rows(cut, keep) if op == 1 else cache.truncate(cut[0], keep[0])
            except sneppx.InvalidArgumentError as error:
                assert window and "too far back" in str(error), error     # a released token is needed
                continue
            for tokens in rows:
                for r, n in zip(cut if op == 1 else cut[:1], keep):
                    tokens[r] = tokens[r][:n]
        else:
            layer = int(rng.integers(2))
            cfg, weights = layers[layer]
            called = [int(r) for r in rng.permutation(len(rows[0]))[:rng.integers(1, len(rows[0]) + 1)]]
            xs = [rng.uniform(-1, 1, (int(rng.choice([1, 1, 3, 16, 17, 23])), hidden)).astype(np.float32)
                  for _ in called]
            try:
                outs = cfg.forward_ragged(cache, called, xs, layer_idx=layer)
            except sneppx.OutOfMemoryError:
                continue
            for r, x, out in zip(called, xs, outs):
                rows[layer][r] = np.concatenate([rows[layer][r], x])
                want = ref.mha_forward(hf_config, weights, rows[layer][r][None], kv_dtype=dtype)[0, -len(x):]
                _assert_close(out, want, f"step {step}: layer {layer} row {r} at {len(rows[layer][r])} tokens",
                              decode_numerics.tolerance(dtype, ref.FP32_MAX_NORMALIZED),
                              decode_numerics.tolerance(dtype, ref.FP32_RMS_RELATIVE))
        for layer, tokens in enumerate(rows):
            assert cache.layer_lengths(layer) == [len(t) for t in tokens], f"step {step}, layer {layer}"
