"""Generation in the vendored layer: `<prefix>_forward_cached` over KV caches the
caller owns (templates/layer_cached.c.j2, layout in the generated header), built
and driven as test_aot.py builds and drives the cache-free forward.

Prefill in chunks then token-by-token decode, and ragged calls of 3 sequences,
for llama3-like GQA, mistral (window 16, crossed), qwen2 (bias) and DeepSeek V2
MLA with and without q LoRA (families.py): every row against the float64
reference of the whole sequence (reference.FP32_*) and against the runtime's
paged cached forward on the same calls (test_aot.py's AOT-vs-JIT pair, 5e-5 /
1e-5). The caches hold what the header says (K after RoPE; MLA: normalized c |
rotated k_pe) and only the rows [0, cached + q_len) are read: every other row
is NaN. Every refused argument is named, and leaves out and the caches as they
were."""
import ctypes
import json
import re

import numpy as np
import pytest

import reference as ref
import sneppx
from families import FAMILIES, irregular_positions
from test_aot import CC, PAIR_MAX_NORMALIZED, PAIR_RMS_RELATIVE, _assert_close, _generate

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc) on PATH")

CACHED_FAMILIES = ["llama3", "mistral", "qwen2", "deepseek-v2", "deepseek-v2-lite-like"]
P = ctypes.c_void_p
I64 = ctypes.c_int64


class CachedLayer:
    """A vendored layer's _forward_cached, and caller-side caches and lengths."""

    def __init__(self, family, built, rng):
        self.hf_config = FAMILIES[family]
        self.aot = built(family)
        self.jit = sneppx.LLMConfig(**self.hf_config)
        self.weights = ref.random_state_dict(self.hf_config, rng, qkv_bias=self.jit.qkv_bias, o_bias=self.jit.o_bias)
        self.aot.load(self.weights)
        self.jit.load_state_dict(self.weights)
        self.hidden = self.jit.hidden_size
        prefix, header, lib = self.aot.prefix, self.aot.header, self.aot.lib
        self.k_row, self.v_row = (int(re.search(r"#define %s_%s_CACHE_ROW (\d+)" % (prefix.upper(), kind), header)[1])
                                  for kind in "KV")
        self.scratch_floats = getattr(lib, prefix + "_cached_scratch_floats")
        self.scratch_floats.restype, self.scratch_floats.argtypes = I64, [I64, I64, ctypes.c_int]
        self._forward = getattr(lib, prefix + "_forward_cached")
        self._forward.restype = ctypes.c_int
        self._forward.argtypes = [P, I64, P, P, P, P, I64, P, P, P, P, ctypes.c_int]
        self.last_error = lambda: self.aot._last_error().decode()

    def caches(self, n, capacity):
        """NaN-filled caches: a row the layer reads before writing it poisons the output."""
        k = [np.full((capacity, self.k_row), np.nan, np.float32) for _ in range(n)]
        v = [np.full((capacity, self.v_row), np.nan, np.float32) for _ in range(n)] if self.v_row else None
        return k, v

    @staticmethod
    def scratch(floats):
        raw = np.empty(floats + 32, np.float32)
        start = (-raw.ctypes.data % 64) // 4
        return raw[start:start + floats]

    def call(self, q_lens, cached_lens, k_caches, v_caches, capacity, x, positions=None, threads=1, raw=None):
        """(status, out) of one _forward_cached call; raw replaces arguments as passed to C."""
        tokens = int(sum(q_lens))
        floats = self.scratch_floats(max(tokens, 1), capacity if capacity >= 1 else 1, 1)
        scratch = self.scratch(floats if floats > 0 else 64)
        out = np.full((len(x), self.hidden), 7.0, np.float32)
        q_lens = np.array(q_lens, np.int64)
        cached_lens = np.array(cached_lens, np.int64)
        k_pointers = (P * len(k_caches))(*[c.ctypes.data if c is not None else None for c in k_caches])
        v_pointers = None if v_caches is None else \
            (P * len(v_caches))(*[c.ctypes.data if c is not None else None for c in v_caches])
        x = np.ascontiguousarray(x, np.float32)
        positions = None if positions is None else np.ascontiguousarray(positions, np.int64)
        args = dict(packed=self.aot.packed.ctypes.data, n_seqs=len(q_lens), q_lens=q_lens.ctypes.data,
                    cached_lens=cached_lens.ctypes.data, k_caches=k_pointers, v_caches=v_pointers,
                    capacity=capacity, hidden_states=x.ctypes.data,
                    position_ids=None if positions is None else positions.ctypes.data, out=out.ctypes.data,
                    scratch=scratch.ctypes.data, threads=threads)
        args.update(raw or {})
        status = self._forward(*args.values())
        return status, out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """family -> its vendored layer, generated and compiled once for the module."""
    layers = {}

    def get(family):
        if family not in layers:
            directory = tmp_path_factory.mktemp(family)
            config_file = directory / f"{family}.json"
            config_file.write_text(json.dumps(dict(FAMILIES[family], name=family)))
            layers[family] = _generate(["--config", str(config_file)], directory / "out")
        return layers[family]
    return get


class Generation:
    """The caller's side: each sequence's caches and length."""

    def __init__(self, layer: CachedLayer, n, capacity):
        self.layer, self.capacity = layer, capacity
        self.k, self.v = layer.caches(n, capacity)
        self.lengths = [0] * n

    def step(self, rows, xs, positions=None):
        """xs[i] [q_len_i, hidden] for sequence rows[i]; returns the outputs per row."""
        q_lens = [len(x) for x in xs]
        status, out = self.layer.call(q_lens, [self.lengths[r] for r in rows], [self.k[r] for r in rows],
                                      None if self.v is None else [self.v[r] for r in rows], self.capacity,
                                      np.concatenate(xs), None if positions is None else np.concatenate(positions))
        assert status == 0, f"forward_cached: {self.layer.last_error()}"
        for r, q_len in zip(rows, q_lens):
            self.lengths[r] += q_len
        return np.split(out, np.cumsum(q_lens)[:-1])


def _chunks(total, rng):
    sizes = []
    while total > 0:
        sizes.append(int(min(total, rng.integers(1, 9))))
        total -= sizes[-1]
    return sizes


@pytest.mark.parametrize("positions_kind", ["default", "irregular"])
@pytest.mark.parametrize("family", CACHED_FAMILIES)
def test_chunks_then_decode_equal_the_whole_sequence(family, positions_kind, built, rng):
    """Two sequences, prefilled in random chunks then decoded token by token (past
    mistral's window of 16), caches of exactly the sequence's length: every row ==
    the float64 reference of the whole sequence, == the runtime's cached forward on
    the same calls, == the vendored cache-free forward."""
    layer = CachedLayer(family, built, rng)
    seq_len = 45
    x = rng.uniform(-1, 1, (2, seq_len, layer.hidden)).astype(np.float32)
    positions = irregular_positions(2, seq_len, rng) if positions_kind == "irregular" else None
    want = ref.mha_forward(layer.hf_config, layer.weights, x, None, positions)
    gen = Generation(layer, 2, capacity=seq_len)
    cache = layer.jit.kv_cache(batch=2, max_tokens=seq_len, page_size=4)
    got, runtime, begin = [], [], 0
    for size in _chunks(30, rng) + [1] * (seq_len - 30):
        chunk = slice(begin, begin + size)
        pos = None if positions is None else positions[:, chunk]
        got.append(np.stack(gen.step([0, 1], [x[0, chunk], x[1, chunk]], None if pos is None else list(pos))))
        runtime.append(layer.jit.forward_mha(x[:, chunk], position_ids=pos, past_key_value=cache))
        begin += size
    got, runtime = np.concatenate(got, axis=1), np.concatenate(runtime, axis=1)
    what = f"{family} {positions_kind} chunks + decode"
    _assert_close(got, want, f"{what}: vendored cached vs reference", ref.FP32_MAX_NORMALIZED, ref.FP32_RMS_RELATIVE)
    _assert_close(got, runtime.astype(np.float64), f"{what}: vendored vs runtime cached", PAIR_MAX_NORMALIZED,
                  PAIR_RMS_RELATIVE)
    _assert_close(got, layer.aot.forward(x, None, positions).astype(np.float64),
                  f"{what}: vendored cached vs cache-free", PAIR_MAX_NORMALIZED, PAIR_RMS_RELATIVE)
    assert gen.lengths == [seq_len, seq_len]


@pytest.mark.parametrize("family", CACHED_FAMILIES)
def test_ragged_calls_of_three_sequences(family, built, rng):
    """A prompt chunk beside short prefills and decodes in one call, then ragged
    decode steps: each sequence's rows == the reference of that sequence alone, and
    == the runtime's forward_ragged on the same calls."""
    layer = CachedLayer(family, built, rng)
    lengths = [37, 5, 21]
    steps = 3
    xs = [rng.uniform(-1, 1, (n + steps, layer.hidden)).astype(np.float32) for n in lengths]
    gen = Generation(layer, 3, capacity=64)
    cache = layer.jit.kv_cache(batch=3, max_tokens=64, page_size=4)
    calls = [([0, 2], [slice(0, 30), slice(0, 20)]),
             ([2, 0, 1], [slice(20, 21), slice(30, 37), slice(0, 5)])]
    calls += [([1, 2, 0], [slice(n + s, n + s + 1) for n in (lengths[1], lengths[2], lengths[0])])
              for s in range(steps)]
    outputs = {row: [] for row in range(3)}
    for rows, slices in calls:
        chunks = [xs[r][s] for r, s in zip(rows, slices)]
        got = gen.step(rows, chunks)
        runtime = layer.jit.forward_ragged(cache, rows, chunks)
        for r, g, w in zip(rows, got, runtime):
            _assert_close(g, w.astype(np.float64), f"{family} ragged row {r}: vendored vs runtime cached",
                          PAIR_MAX_NORMALIZED, PAIR_RMS_RELATIVE)
            outputs[r].append(g)
    assert gen.lengths == [n + steps for n in lengths] == cache.lengths
    for r in range(3):
        want = ref.mha_forward(layer.hf_config, layer.weights, xs[r][None])[0]
        _assert_close(np.concatenate(outputs[r]), want, f"{family} ragged row {r}: vendored vs reference",
                      ref.FP32_MAX_NORMALIZED, ref.FP32_RMS_RELATIVE)


@pytest.mark.parametrize("family", ["llama3", "deepseek-v2"])
def test_cache_rows_are_the_documented_layout(family, built, rng):
    """After a prefill, row j of a K cache is token j's K after RoPE, head after head
    (MLA: the latent cache's row is kv_a_layernorm(c) | rope(k_pe)), V's is v_proj's,
    and the rows past the sequence are untouched."""
    layer = CachedLayer(family, built, rng)
    cfg, w = layer.hf_config, layer.weights
    n, capacity = 11, 16
    x = rng.uniform(-1, 1, (n, layer.hidden)).astype(np.float32)
    gen = Generation(layer, 1, capacity)
    gen.step([0], [x])
    x64 = x.astype(np.float64)[None]
    positions = np.arange(n)[None]
    inv_freq, factor = ref.rope_inv_freq(cfg, n)
    interleaved = bool(cfg.get("rope_interleaved", False))
    if ref.is_mla(cfg):
        rank = cfg["kv_lora_rank"]
        latent = ref.linear(x64, w, "kv_a_proj_with_mqa")[0]
        c = ref.rms_norm(latent[:, :rank], w["kv_a_layernorm.weight"], ref.MLA_NORM_EPS)
        k_pe = ref.apply_rope(latent[None, None, :, rank:], positions, inv_freq, factor, interleaved)[0, 0]
        want = {"latent": (gen.k[0], np.concatenate([c, k_pe], axis=-1))}
        assert gen.v is None
    else:
        d = ref.head_dim(cfg)
        k = ref.linear(x64, w, "k_proj").reshape(1, n, -1, d).transpose(0, 2, 1, 3)
        k = ref.apply_rope(k, positions, inv_freq, factor, interleaved)[0].transpose(1, 0, 2).reshape(n, -1)
        want = {"K": (gen.k[0], k), "V": (gen.v[0], ref.linear(x64, w, "v_proj")[0])}
    for name, (cache, rows) in want.items():
        _assert_close(cache[:n], rows, f"{family} {name} cache rows", ref.FP32_MAX_NORMALIZED, ref.FP32_RMS_RELATIVE)
        assert np.isnan(cache[n:]).all(), f"{family} {name} cache: rows past the sequence were written"


def test_window_never_reads_rows_before_it(built, rng):
    """mistral (window 16): after a prefill of 30, the rows no later query can see
    (0 .. 14) are poisoned with NaN; decoding on still equals the reference."""
    layer = CachedLayer("mistral", built, rng)
    seq_len, window = 40, FAMILIES["mistral"]["sliding_window"]
    x = rng.uniform(-1, 1, (seq_len, layer.hidden)).astype(np.float32)
    gen = Generation(layer, 1, seq_len)
    got = gen.step([0], [x[:30]])
    gen.k[0][:30 - window + 1] = np.nan
    gen.v[0][:30 - window + 1] = np.nan
    got += [gen.step([0], [x[t:t + 1]])[0] for t in range(30, seq_len)]
    want = ref.mha_forward(layer.hf_config, layer.weights, x[None])[0]
    _assert_close(np.concatenate(got), want, "mistral decode past the window", ref.FP32_MAX_NORMALIZED,
                  ref.FP32_RMS_RELATIVE)


@pytest.mark.parametrize("family", ["llama3", "deepseek-v2-lite-like"])
def test_bad_arguments_are_named_and_change_nothing(family, built, rng):
    layer = CachedLayer(family, built, rng)
    mla = layer.v_row == 0
    capacity = 16
    k, v = layer.caches(2, capacity)
    x = rng.uniform(-1, 1, (9, layer.hidden)).astype(np.float32)
    base = dict(q_lens=[2, 7], cached_lens=[3, 9], k_caches=k, v_caches=v, capacity=capacity, x=x)
    mpe = layer.jit.max_position_embeddings

    def case(message, raw=None, **changes):
        args = dict(base, **changes)
        before = [c.copy() for c in args["k_caches"] + (args["v_caches"] or []) if c is not None]
        status, out = layer.call(**args, raw=raw)
        assert (status, layer.last_error()) == (1, message)
        assert (out == 7.0).all(), f"{message}: out was written"
        after = [c for c in args["k_caches"] + (args["v_caches"] or []) if c is not None]
        assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(before, after)), f"{message}: a cache changed"

    case("n_seqs: 0 must be in [1, 2^26]", raw=dict(n_seqs=0))
    case("packed: must not be NULL", raw=dict(packed=None))
    case("q_lens: must not be NULL", raw=dict(q_lens=None))
    case("cached_lens: must not be NULL", raw=dict(cached_lens=None))
    case("k_caches: must not be NULL", raw=dict(k_caches=None))
    if mla:
        case("v_caches: must be NULL (MLA keeps K and V in one latent cache per sequence, k_caches)",
             raw=dict(v_caches=(P * 2)(*[c.ctypes.data for c in k])))
    else:
        case("v_caches: must not be NULL", raw=dict(v_caches=None))
    case("hidden_states: must not be NULL", raw=dict(hidden_states=None))
    case("out: must not be NULL", raw=dict(out=None))
    case("scratch: must not be NULL", raw=dict(scratch=None))
    misaligned = CachedLayer.scratch(layer.scratch_floats(9, capacity, 1) + 16)
    case("scratch: must be 64-byte aligned", raw=dict(scratch=misaligned.ctypes.data + 4))
    case("q_lens[1]: 0 must be at least 1", q_lens=[9, 0])
    case("q_lens: the call's tokens (sum of q_lens) exceed SNEPPX_MAX_TOKENS (2^26) at q_lens[1]",
         q_lens=[2, 1 << 26], x=x[:2])
    case("capacity: 0 must be in [1, 2^31 - 1]", capacity=0)
    case("capacity: 2147483648 must be in [1, 2^31 - 1]", capacity=1 << 31)
    case("threads: 0 must be in [1, 1024]", threads=0)
    case("cached_lens[1]: -1 must not be negative", cached_lens=[3, -1])
    case("cached_lens[1] + q_lens[1]: 10 + 7 tokens exceed capacity 16", cached_lens=[3, 10])
    case("k_caches[0]: must not be NULL", k_caches=[None, k[1]])
    if not mla:
        case("v_caches[1]: must not be NULL", v_caches=[v[0], None])
    case("position_ids: entry 3 is negative (-2)", positions=np.array([0, 1, 0, -2, 4, 5, 6, 7, 8]))
    case(f"position_ids: position {mpe} is beyond max_position_embeddings {mpe}",
         positions=np.array([0, 1, 2, 3, 4, 5, 6, 7, mpe]))
    case(f"cached_lens[1] + q_lens[1]: sequence 1 holds {mpe - 6} tokens, and its 7 new ones reach position "
         f"{mpe}, beyond max_position_embeddings {mpe} (position_ids NULL: the sequence's length + i)",
         cached_lens=[3, mpe - 6], capacity=mpe + 1)
    # The same call, valid, passes.
    status, _ = layer.call(**base)
    assert status == 0, layer.last_error()

    # The scratch size: -1 and a named argument for sizes no call accepts.
    for (tokens, cap, threads), message in [((0, 16, 1), "tokens: 0 must be in [1, 2^26]"),
                                            (((1 << 26) + 1, 16, 1), "tokens: 67108865 must be in [1, 2^26]"),
                                            ((4, 0, 1), "capacity: 0 must be in [1, 2^31 - 1]"),
                                            ((4, 16, 1025), "threads: 1025 must be in [1, 1024]")]:
        assert layer.scratch_floats(tokens, cap, threads) == -1
        assert layer.last_error() == message
    assert layer.scratch_floats(4, 16, 2) > layer.scratch_floats(4, 16, 1) > 0


DYNAMIC_ROPE = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    max_position_embeddings=16, rope_scaling={"rope_type": "dynamic", "factor": 2.0})


def test_dynamic_rope_scales_by_the_calls_longest_row(built, rng, monkeypatch):
    """The vendored cached forward as the runtime's: dynamic NTK past max_position_embeddings
    scales every row of a ragged call (4, 40 and 9 new tokens) by the call's longest
    position, as transformers does for a batch."""
    monkeypatch.setitem(FAMILIES, "dynamic-rope", DYNAMIC_ROPE)
    layer = CachedLayer("dynamic-rope", built, rng)
    xs = [rng.uniform(-1, 1, (n, layer.hidden)).astype(np.float32) for n in (4, 40, 9)]
    outs = Generation(layer, 3, capacity=40).step([0, 1, 2], xs)
    for row, (x, out) in enumerate(zip(xs, outs)):
        _assert_close(out, ref.mha_forward(DYNAMIC_ROPE, layer.weights, x[None], rope_length=40)[0],
                      f"dynamic ragged row {row}", ref.FP32_MAX_NORMALIZED, ref.FP32_RMS_RELATIVE)
