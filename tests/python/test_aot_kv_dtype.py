"""The vendored layer's narrow KV caches (`sneppx-gen --kv-dtype`): `_forward_cached`
over caller-owned caches of bfloat16, float16 or int8 (layout in the generated
header) against libsneppx's cached forward over a KV cache of the same dtype.

Both sides run the same kernels on the same inputs: decode-sized runs attn_decode of
the cache's kv_type over the cache in place, prefill chunks the flash kernel over
the keys widened to float32. Built with clang-19 for the host (-march=native
-ffp-contract=fast, as the JIT builds and optimizes its kernels), the vendored
layer's projections and RoPE give the runtime's float32 bits, so:
- what the caches hold, widened to float32 (sneppx_kv_cache_read through KVCache.read,
  and the header's rule for the vendored caches), is equal, value for value;
- every output row agrees within 1e-6 normalized (PAIR_NARROW below).
And with K/V rows the layer does not compute but copies (identity k/v projections at
position 0), the rounding rules alone: ties, subnormals, float16's overflow, int8's
zero and non-finite rows give the runtime's bits, with gcc (cc) and clang builds."""
# ctest: 2 shards (tests/CMakeLists.txt), each under a minute on 2 cores
import ctypes
import json
import os
import re
import shutil

import numpy as np
import pytest

import decode_numerics
import reference as ref
import sneppx
from families import FAMILIES
from test_aot import CC, _assert_close, _generate

CLANG = os.environ.get("SNEPPX_CLANG") or shutil.which("clang-19")
NARROW_TYPES = ["bfloat16", "float16", "int8"]
# Both run the same kernels on the same bits (their outputs have been equal bit for bit);
# the bound leaves room for a compiler's other scheduling of float32 sums.
PAIR_NARROW = 1e-6
P = ctypes.c_void_p
I64 = ctypes.c_int64
CINT = ctypes.c_int
# Floats past the scratch a call is given, which it must leave alone.
CANARY = 64
STORAGE = {"bfloat16": np.uint16, "float16": np.uint16, "int8": np.int8}
# A NaN in every type's cache, so that a row read before it is written poisons the output
# (int8: its scale).
POISON = {"bfloat16": 0x7fc0, "float16": 0x7e00, "int8": 0}

pytestmark = pytest.mark.skipif(CLANG is None or CC is None, reason="needs clang-19 and cc")


def widen(dtype, rows, scales=None):
    """Cache rows [tokens, heads, d] (MLA: [tokens, d]) of dtype as the float32 values they
    stand for: the header's rule (int8: scales [tokens, heads] times q)."""
    if dtype == "bfloat16":
        return (rows.astype(np.uint32) << 16).view(np.float32)
    if dtype == "float16":
        return rows.view(np.float16).astype(np.float32)
    return rows.astype(np.float32) * scales[..., None]


class NarrowLayer:
    """One family's vendored layer with caches of dtype, and the runtime's layer with the
    same weights, both on `threads` threads (1: the vendored layer built without OpenMP)."""

    def __init__(self, family, dtype, directory, rng, cc, cflags=(), weights=None, threads=1, target=None):
        self.family, self.dtype, self.threads = family, dtype, threads
        self.hf_config = FAMILIES[family]
        directory.mkdir(parents=True, exist_ok=True)
        config_file = directory / f"{family}.json"
        config_file.write_text(json.dumps(dict(self.hf_config, name=family)))
        target_args = ["--target", target] if target else []
        self.aot = _generate(["--config", str(config_file), "--kv-dtype", dtype, *target_args],
                             directory / f"{dtype}-{os.path.basename(cc)}{'-' + target if target else ''}",
                             cc=cc, cflags=cflags)
        self.jit = sneppx.LLMConfig(**self.hf_config, num_threads=threads)
        self.weights = weights or ref.random_state_dict(self.hf_config, rng, qkv_bias=self.jit.qkv_bias,
                                                        o_bias=self.jit.o_bias)
        self.aot.load(self.weights)
        self.jit.load_state_dict(self.weights)
        self.hidden = self.jit.hidden_size
        self.mla = ref.is_mla(self.hf_config)
        self.kv_heads = 1 if self.mla else self.hf_config["num_key_value_heads"]
        prefix, lib, header = self.aot.prefix, self.aot.lib, self.aot.header
        self.k_row, self.v_row, scales = (int(re.search(r"#define %s_%s (\d+)" % (prefix.upper(), name), header)[1])
                                          for name in ("K_CACHE_ROW", "V_CACHE_ROW", "CACHE_SCALES"))
        assert scales == (self.kv_heads if dtype == "int8" else 0), header
        assert f'#define {prefix.upper()}_KV_DTYPE "{dtype}"' in header
        self.scratch_floats = getattr(lib, prefix + "_cached_scratch_floats")
        self.scratch_floats.restype, self.scratch_floats.argtypes = I64, [I64, I64, CINT]
        self._forward = getattr(lib, prefix + "_forward_cached")
        self._forward.restype = CINT
        scales = [P, P] if dtype == "int8" else []
        self._forward.argtypes = [P, I64, P, P, P, P] + scales + [I64, P, P, P, P, CINT]


class Caches:
    """The caller's side of the vendored layer: per sequence its caches (int8: scales) and length."""

    def __init__(self, layer: NarrowLayer, n, capacity):
        self.layer, self.capacity = layer, capacity
        storage, poison = STORAGE[layer.dtype], POISON[layer.dtype]
        self.k = [np.full((capacity, layer.k_row), poison, storage) for _ in range(n)]
        self.v = [np.full((capacity, layer.v_row), poison, storage) for _ in range(n)] if layer.v_row else None
        int8 = layer.dtype == "int8"
        self.k_scales = [np.full((layer.kv_heads, capacity), np.nan, np.float32) for _ in range(n)] if int8 else None
        self.v_scales = [np.full((layer.kv_heads, capacity), np.nan, np.float32) for _ in range(n)] \
            if int8 and layer.v_row else None
        self.lengths = [0] * n

    @staticmethod
    def _pointers(arrays, rows):
        return None if arrays is None else (P * len(rows))(*[arrays[r].ctypes.data for r in rows])

    def step(self, rows, xs, positions=None):
        """xs[i] [q_len_i, hidden] for sequence rows[i]; the outputs per row."""
        layer = self.layer
        q_lens = np.array([len(x) for x in xs], np.int64)
        cached = np.array([self.lengths[r] for r in rows], np.int64)
        tokens = int(q_lens.sum())
        floats = layer.scratch_floats(tokens, self.capacity, layer.threads)
        assert floats > 0, layer.aot._last_error().decode()
        raw = np.empty(floats + CANARY + 16, np.float32)
        scratch = raw[(-raw.ctypes.data % 64) // 4:][:floats + CANARY]
        scratch[floats:] = 12345.0
        x = np.ascontiguousarray(np.concatenate(xs), np.float32)
        out = np.full((tokens, layer.hidden), 7.0, np.float32)
        positions = None if positions is None else np.ascontiguousarray(positions, np.int64)
        scales = [self._pointers(self.k_scales, rows), self._pointers(self.v_scales, rows)] \
            if layer.dtype == "int8" else []
        status = layer._forward(layer.aot.packed.ctypes.data, len(rows), q_lens.ctypes.data, cached.ctypes.data,
                                self._pointers(self.k, rows), self._pointers(self.v, rows), *scales, self.capacity,
                                x.ctypes.data, None if positions is None else positions.ctypes.data,
                                out.ctypes.data, scratch.ctypes.data, layer.threads)
        assert status == 0, f"forward_cached: {layer.aot._last_error().decode()}"
        assert (scratch[floats:] == 12345.0).all(), f"forward_cached wrote past the {floats} floats of scratch"
        for r, q_len in zip(rows, q_lens):
            self.lengths[r] += int(q_len)
        return np.split(out, np.cumsum(q_lens)[:-1])

    def widened(self, row):
        """(k, v) of a sequence as KVCache.read gives them: [tokens, heads, d] each
        (MLA: latent rows [tokens, d], None)."""
        layer, n = self.layer, self.lengths[row]
        if layer.mla:
            scales = None if self.k_scales is None else self.k_scales[row][0, :n]
            return widen(layer.dtype, self.k[row][:n], scales), None
        heads = layer.kv_heads
        out = []
        for cache, scales in ((self.k, self.k_scales), (self.v, self.v_scales)):
            rows = cache[row][:n].reshape(n, heads, -1)
            out.append(widen(layer.dtype, rows, None if scales is None else scales[row][:, :n].T))
        return tuple(out)


def _assert_same_cache(caches: Caches, cache, rows, what):
    """The rows each sequence's caches hold == what the runtime's cache holds, widened; under a
    sliding window from the first token the next query sees (the runtime released those before)."""
    window = int(caches.layer.hf_config.get("sliding_window") or 0)
    for row in rows:
        begin = max(caches.lengths[row] - window + 1, 0) if window else 0
        for name, got, want in zip("KV", caches.widened(row), cache.read(row, 0, begin)):
            if want is None:
                assert got is None
                continue
            got = got[begin:]
            assert got.shape == want.shape, f"{what} {name}[{row}]: {got.shape} vs {want.shape}"
            differ = ~((got == want) | (np.isnan(got) & np.isnan(want)))
            assert not differ.any(), (f"{what} {name}[{row}]: {int(differ.sum())} of {got.size} values differ, "
                                      f"first at {np.argwhere(differ)[0]}: {got[differ][0]!r} vs {want[differ][0]!r}")


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    return tmp_path_factory.mktemp("kv_dtype")


# clang 19 reads some hosts' CPUID (an Intel Xeon with AVX-512 FP16, seen here) as
# avx10.1-256 and warns about its own -march=native: a driver warning, not our code's.
NATIVE = ("-march=native", "-Wno-invalid-feature-combination", "-ffp-contract=fast", "-fno-math-errno")


@pytest.mark.parametrize("dtype", NARROW_TYPES)
@pytest.mark.parametrize("family", ["llama3", "mistral", "deepseek-v2"])
def test_vendored_cache_equals_the_runtimes(family, dtype, directory, rng):
    """Two sequences: a 20-token prefill (the gathered path), a 5-token chunk (attn_decode
    with 5 queries), then single-token decode steps (past mistral's window of 16), and a
    ragged call: every output row == the runtime's over a cache of the same dtype
    (PAIR_NARROW), and after every call the widened caches are equal, value for value.
    The rounding is real: the float32 cache-free forward is further off than that."""
    layer = NarrowLayer(family, dtype, directory / family, rng, CLANG, NATIVE)
    seq_len = 34
    x = rng.uniform(-1, 1, (2, seq_len, layer.hidden)).astype(np.float32)
    caches = Caches(layer, 2, capacity=seq_len)
    cache = layer.jit.kv_cache(batch=2, max_tokens=seq_len, page_size=4, dtype=dtype)
    got, runtime = [], []
    steps = [(0, 20), (20, 25)] + [(t, t + 1) for t in range(25, seq_len - 3)]
    for begin, end in steps:
        what = f"{family} {dtype} tokens [{begin}, {end})"
        got.append(np.stack(caches.step([0, 1], [x[0, begin:end], x[1, begin:end]])))
        runtime.append(layer.jit.forward_mha(x[:, begin:end], past_key_value=cache))
        _assert_close(got[-1], runtime[-1].astype(np.float64), f"{what}: vendored vs runtime", PAIR_NARROW, PAIR_NARROW)
        _assert_same_cache(caches, cache, [0, 1], what)
    # Ragged: row 1 a 3-token chunk beside row 0's decode step, then the other way round.
    for rows, spans in (([1, 0], [(seq_len - 3, seq_len), (seq_len - 3, seq_len - 2)]),
                        ([0], [(seq_len - 2, seq_len)])):
        chunks = [x[r, b:e] for r, (b, e) in zip(rows, spans)]
        outs = caches.step(rows, chunks)
        for r, g, w in zip(rows, outs, layer.jit.forward_ragged(cache, rows, chunks)):
            _assert_close(g, w.astype(np.float64), f"{family} {dtype} ragged row {r}", PAIR_NARROW, PAIR_NARROW)
        _assert_same_cache(caches, cache, [0, 1], f"{family} {dtype} ragged")
    assert caches.lengths == cache.lengths == [seq_len, seq_len]
    whole = np.concatenate(got, axis=1).astype(np.float64)
    err_max, _ = ref.normalized_error(whole, layer.jit.forward_mha(x[:, :seq_len - 3]).astype(np.float64))
    assert err_max > 10 * PAIR_NARROW, f"{family} {dtype}: no rounding visible ({err_max:.1e})"


# A compiler without _Float16 on the target (clang before 15 on x86, Debian 12's clang):
# the macro it lacks undefined, and the type's name made one no compiler knows.
NO_FLOAT16 = ("-U__FLT16_MAX__", "-D_Float16=no_float16_in_this_compiler")


def test_float16_cache_without_compiler_float16(directory, rng):
    """A float16 cache's vendored layer built by a compiler that has no _Float16 (it did
    not compile: the widening was a _Float16 vector conversion) widens the bits itself,
    exactly: a prefill (the gathered path), a 5-token chunk and decode steps (attn_decode
    over the cache in place) give the runtime's rows (PAIR_NARROW)."""
    layer = NarrowLayer("llama3", "float16", directory / "no-float16", rng, CLANG, NATIVE + NO_FLOAT16)
    seq_len = 28
    x = rng.uniform(-1, 1, (2, seq_len, layer.hidden)).astype(np.float32)
    caches = Caches(layer, 2, capacity=seq_len)
    cache = layer.jit.kv_cache(batch=2, max_tokens=seq_len, page_size=4, dtype="float16")
    for begin, end in [(0, 20), (20, 25)] + [(t, t + 1) for t in range(25, seq_len)]:
        got = np.stack(caches.step([0, 1], [x[0, begin:end], x[1, begin:end]]))
        want = layer.jit.forward_mha(x[:, begin:end], past_key_value=cache).astype(np.float64)
        _assert_close(got, want, f"float16 without _Float16, tokens [{begin}, {end})", PAIR_NARROW, PAIR_NARROW)
        _assert_same_cache(caches, cache, [0, 1], f"float16 without _Float16, tokens [{begin}, {end})")


# The vendored layer for another target against the runtime's for this host: the same
# math in another vector width's summation order (the caches' bits may differ with it).
PAIR_OTHER_TARGET = 2e-5


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
@pytest.mark.parametrize("family", ["llama3", "deepseek-v2"])
def test_vendored_v8_cache_agrees(family, dtype, directory, rng):
    """The v8 vendored layer, whose attn_decode reads bfloat16 caches packed (two
    elements to a 32-bit lane: head dims 32 and MLA's 48 have whole chunks and, for MLA,
    a tail) and int8 ones by integer dot products, through a prefill, a 5-token chunk and
    decode steps: every output row agrees with the runtime's within PAIR_OTHER_TARGET
    (int8: decode_numerics' bound, as one of the two may round to int16), and the
    rounding is visible."""
    layer = NarrowLayer(family, dtype, directory / family, rng, CLANG, NATIVE, target="v8")
    seq_len = 30
    x = rng.uniform(-1, 1, (2, seq_len, layer.hidden)).astype(np.float32)
    caches = Caches(layer, 2, capacity=seq_len)
    cache = layer.jit.kv_cache(batch=2, max_tokens=seq_len, page_size=4, dtype=dtype)
    got = []
    for begin, end in [(0, 20), (20, 25)] + [(t, t + 1) for t in range(25, seq_len)]:
        got.append(np.stack(caches.step([0, 1], [x[0, begin:end], x[1, begin:end]])))
        want = layer.jit.forward_mha(x[:, begin:end], past_key_value=cache).astype(np.float64)
        limit = decode_numerics.tolerance(dtype, PAIR_OTHER_TARGET, "v8", None)
        _assert_close(got[-1], want, f"{family} {dtype} v8 tokens [{begin}, {end})", limit, limit)
    whole = np.concatenate(got, axis=1).astype(np.float64)
    err_max, _ = ref.normalized_error(whole, layer.jit.forward_mha(x).astype(np.float64))
    assert err_max > 5 * PAIR_OTHER_TARGET, f"{family} {dtype} v8: no rounding visible ({err_max:.1e})"


def _copying_weights(hf_config, rng):
    """Weights whose k_proj / v_proj copy x[:, :kv_dim] / x[:, kv_dim:2 kv_dim] (an
    identity block, zeros elsewhere): at position 0 (RoPE the identity) a token's K and V
    rows are those values exactly, whatever the compiler."""
    weights = ref.random_state_dict(hf_config, rng, qkv_bias=False, o_bias=False)
    hidden, kv_dim = hf_config["hidden_size"], weights["k_proj.weight"].shape[0]
    assert 2 * kv_dim <= hidden
    for name, first in (("k_proj.weight", 0), ("v_proj.weight", kv_dim)):
        weights[name] = np.zeros((kv_dim, hidden), np.float32)
        weights[name][:, first:first + kv_dim] = np.eye(kv_dim, dtype=np.float32)
    return weights


def _edge_rows(dtype, heads, d, rng):
    """Rows of heads x d values where the rounding rules differ: exact ties, neighbours of
    ties, subnormals (float32's and float16's), float16's overflow edge, int8 heads of
    scale 1 with .5 ratios (and the same scaled to subnormal and huge scales), all-zero
    rows; then random bit patterns of every finite exponent."""
    f, n = np.float32, heads * d
    rows = []
    if dtype == "bfloat16":
        base = rng.integers(0, 1 << 16, (4, n)).astype(np.uint32) << 16
        for low in (0x8000, 0x7fff, 0x8001):                   # the 16 dropped bits: a tie and its neighbours
            rows += list((base | low).view(f))
    elif dtype == "float16":
        # The 13 dropped bits of float16's exponents -24 .. 15 (subnormal to largest): a tie and its neighbours.
        exponent = rng.integers(127 - 24, 127 + 16, (6, n)).astype(np.uint32)
        mantissa = rng.integers(0, 1 << 10, (6, n)).astype(np.uint32) << 13
        sign = rng.integers(0, 2, (6, n)).astype(np.uint32) << 31
        for low in (0x1000, 0x0fff, 0x1001):
            rows += list((sign | exponent << 23 | mantissa | low).view(f))
        rows.append(np.resize(np.array([65504, 65519.99, 65520, -65520, 1e6, 2 ** -25, 3 * 2 ** -25, 2 ** -26], f), n))
    else:
        ties = np.arange(d, dtype=f) - d // 2 + 0.5                # x / scale = k + 0.5 ...
        ties[0] = 127                                              # ... with scale 1
        ties = np.tile(ties, heads)
        rows += [ties, -ties, ties * f(2 ** -140), ties * f(1e36)]
    rows.append(np.zeros(n, f))
    rows.append(np.where(np.arange(n) % d == 3, f(-0.0), f(0)))
    bits = rng.integers(0, 1 << 32, (8, n), dtype=np.uint64).astype(np.uint32)
    all_ones = (bits >> 23 & 0xff) == 0xff
    bits[all_ones] &= ~np.uint32(1 << 23)                          # finite: no exponent of all ones
    rows += list(bits.view(f))
    rows.append(rng.uniform(-1, 1, n).astype(f))
    return np.stack(rows).astype(f)


@pytest.mark.parametrize("compiler", ["cc", "clang"])
@pytest.mark.parametrize("dtype", NARROW_TYPES)
def test_rounding_rules_equal_the_runtimes(dtype, compiler, directory, rng):
    """K/V rows that are the tokens' own values (copying projections, every position 0):
    the vendored caches hold the runtime's bits for ties, subnormals, overflow, huge and
    zero rows, and (a token of NaN) non-finite rows, whose int8 scale is NaN and q 0; an
    all-zero int8 row has scale 0."""
    weights = _copying_weights(FAMILIES["llama3"], rng)
    cc = CC if compiler == "cc" else CLANG
    layer = NarrowLayer("llama3", dtype, directory / "copying", rng, cc, weights=weights)
    kv_dim, heads = layer.k_row, layer.kv_heads
    values = _edge_rows(dtype, heads, kv_dim // heads, rng)
    pairs = len(values) // 2                       # token t: K = values[2t], V = values[2t + 1]
    x = rng.uniform(-1, 1, (pairs + 1, layer.hidden)).astype(np.float32)
    x[:pairs, :2 * kv_dim] = values[:2 * pairs].reshape(pairs, 2 * kv_dim)
    x[pairs] = np.nan
    positions = np.zeros(pairs + 1, np.int64)
    caches = Caches(layer, 1, capacity=pairs + 1)
    cache = layer.jit.kv_cache(batch=1, max_tokens=pairs + 1, dtype=dtype)
    caches.step([0], [x], positions)
    layer.jit.forward_mha(x[None], position_ids=positions[None], past_key_value=cache)
    _assert_same_cache(caches, cache, [0], f"{compiler} {dtype} edge rows")
    k, v = caches.widened(0)
    assert np.isnan(k[pairs]).all() and np.isnan(v[pairs]).all(), "a NaN token's rows must read back as NaN"
    if dtype == "int8":
        assert np.isnan(caches.k_scales[0][:, pairs]).all() and (caches.k[0][pairs] == 0).all()
        zero_heads = (x[:pairs, :kv_dim].reshape(pairs, heads, -1) == 0).all(axis=-1)
        assert zero_heads.any(), "no all-zero row among the edge rows"
        assert (caches.k_scales[0][:, :pairs].T[zero_heads] == 0).all()
        assert (caches.k_scales[0][:, :pairs].T[~zero_heads] > 0).all()


@pytest.mark.parametrize("family", ["llama3", "deepseek-v2"])
def test_int8_scales_are_checked(family, directory, rng):
    """int8 caches come with scale arrays: a missing one is named (MLA: v_scales must be NULL),
    and the call writes nothing."""
    layer = NarrowLayer(family, "int8", directory / family, rng, CLANG)
    caches = Caches(layer, 2, capacity=8)
    x = rng.uniform(-1, 1, (3, layer.hidden)).astype(np.float32)
    q_lens, cached = np.array([2, 1], np.int64), np.array([0, 0], np.int64)
    scratch = np.zeros(layer.scratch_floats(3, 8, 1) + 16, np.float32)
    scratch = scratch[(-scratch.ctypes.data % 64) // 4:]
    pointers = Caches._pointers
    k, v = pointers(caches.k, [0, 1]), pointers(caches.v, [0, 1])
    k_scales = pointers(caches.k_scales, [0, 1])
    v_scales = pointers(caches.v_scales, [0, 1])

    def call(k_scales, v_scales):
        out = np.full((3, layer.hidden), 7.0, np.float32)
        status = layer._forward(layer.aot.packed.ctypes.data, 2, q_lens.ctypes.data, cached.ctypes.data, k, v,
                                k_scales, v_scales, 8, x.ctypes.data, None, out.ctypes.data, scratch.ctypes.data, 1)
        return status, layer.aot._last_error().decode(), (out == 7.0).all()

    held = caches.k + caches.k_scales + (caches.v or []) + (caches.v_scales or [])
    before = [a.copy() for a in held]
    assert call(None, v_scales) == (1, "k_scales: must not be NULL", True)
    assert call((P * 2)(caches.k_scales[0].ctypes.data, None), v_scales) == \
        (1, "k_scales[1]: must not be NULL", True)
    if layer.mla:
        assert call(k_scales, k_scales) == \
            (1, "v_scales: must be NULL (MLA keeps K and V in one latent cache per sequence, k_scales)", True)
    else:
        assert call(k_scales, None) == (1, "v_scales: must not be NULL", True)
        assert call(k_scales, (P * 2)(None, caches.v_scales[1].ctypes.data)) == \
            (1, "v_scales[0]: must not be NULL", True)
    assert len(before) == len(held) and all(np.array_equal(a, b, equal_nan=True) for a, b in zip(before, held))
    assert call(k_scales, v_scales)[:2] == (0, "")
