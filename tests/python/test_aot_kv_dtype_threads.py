"""The vendored layer's narrow caches on two threads (built with OpenMP): a long
sequence's decode steps are too few (sequence, K/V head) tasks for two threads, so
attn_decode runs per key range (split-KV) and the ranges are merged, as the runtime
does on two threads. Outputs == the runtime's (test_aot_kv_dtype.PAIR_NARROW; one thread's
within decode_numerics' bound where int8 is read by integer dot products), the
caches hold the runtime's values, no call writes past the scratch
_cached_scratch_floats sized (the split results' bound), and the split did happen:
the vendored layer's kernel calls are counted (SNEPPX_AOT_KERNEL_CALL), those of a
key range writing its log-sum-exp."""
# ctest: two cores (both layers run on 2 threads)
import ctypes

import numpy as np
import pytest

import decode_numerics
from test_aot_kv_dtype import CLANG, NATIVE, PAIR_NARROW, Caches, NarrowLayer, _assert_close, _assert_same_cache

pytestmark = pytest.mark.skipif(CLANG is None, reason="needs clang-19")


# Included ahead of the vendored file: counts attn_decode's calls over one key range of
# several (they write args->lse; no other call does).
COUNTER = """int sneppx_test_range_calls;
#define SNEPPX_AOT_KERNEL_CALL(kernel, args) \\
    ((args)->lse ? (void)__atomic_fetch_add(&sneppx_test_range_calls, 1, __ATOMIC_RELAXED) : (void)0, (kernel)(args))
"""


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    return tmp_path_factory.mktemp("kv_dtype_threads")


@pytest.mark.parametrize("family, dtype", [("llama3", "int8"), ("deepseek-v2", "bfloat16"), ("deepseek-v2", "int8")])
def test_split_kv_decode_on_two_threads(family, dtype, directory, rng):
    """One sequence prefilled with 600 tokens (two K/V-head tasks at most, fewer than two per
    thread; 600 keys make two ranges of >= 256), then decode steps and a 3-token run."""
    counter = directory / "counter.h"
    counter.write_text(COUNTER)
    traced = NATIVE + ("-fopenmp", "-include", str(counter))
    layers = {2: NarrowLayer(family, dtype, directory / family / "2", rng, CLANG, traced, threads=2)}
    layers[1] = NarrowLayer(family, dtype, directory / family / "1", rng, CLANG, NATIVE, layers[2].weights)
    range_calls = ctypes.c_int.in_dll(layers[2].aot.lib, "sneppx_test_range_calls")
    hidden, seq_len, prompt = layers[2].hidden, 606, 600
    x = rng.uniform(-1, 1, (seq_len, hidden)).astype(np.float32)
    caches = {threads: Caches(layer, 1, seq_len) for threads, layer in layers.items()}
    cache = layers[2].jit.kv_cache(batch=1, max_tokens=seq_len, page_size=16, dtype=dtype)
    for begin, end in [(0, prompt), (prompt, prompt + 1), (prompt + 1, prompt + 2), (prompt + 2, prompt + 5),
                       (prompt + 5, seq_len)]:
        what = f"{family} {dtype} tokens [{begin}, {end}) on 2 threads"
        got = caches[2].step([0], [x[begin:end]])[0]
        single = caches[1].step([0], [x[begin:end]])[0]
        want = layers[2].jit.forward_mha(x[None, begin:end], past_key_value=cache)[0]
        _assert_close(got, want.astype(np.float64), f"{what}: vendored vs runtime", PAIR_NARROW, PAIR_NARROW)
        # Key ranges regroup an int16 dot product's tiles (decode_numerics).
        split = decode_numerics.tolerance(dtype, PAIR_NARROW)
        _assert_close(got, single.astype(np.float64), f"{what}: vendored 2 vs 1 thread", split, split)
        _assert_same_cache(caches[2], cache, [0], what)
        assert (range_calls.value > 0) == (begin >= prompt), f"{what}: {range_calls.value} calls over key ranges"
        range_calls.value = 0
