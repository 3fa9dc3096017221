"""LLMConfig.num_threads: settable, validated, accepted by from_name / from_config_json, and
in force for the next forward of a config that already has a layer (the layer holds its own
copy of the config and sizes its per-thread buffers when it is made, so the setter makes it
again). Every output is checked against the float64 reference of reference.py within the
fp32 budget (FP32_MAX_NORMALIZED / FP32_RMS_RELATIVE), or bit for bit against a config made
with the same count from the start.

ctest: two cores (a subprocess starts OpenMP threads of its own and counts them).
"""
import ctypes
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import reference as ref
import sneppx

SMALL = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, qkv_bias=True, o_bias=False)


def assert_close(got, want):
    err_max, err_rms = ref.normalized_error(got, want)
    assert err_max <= ref.FP32_MAX_NORMALIZED and err_rms <= ref.FP32_RMS_RELATIVE, (err_max, err_rms)


def layer_threads(cfg):
    """num_threads in the config the C layer holds (sneppx_layer_config), through a CDLL of
    its own so the package's prototypes stay as they are."""
    function = ctypes.CDLL(str(sneppx.library_path())).sneppx_layer_config
    function.restype = ctypes.POINTER(type(cfg._config))
    function.argtypes = [ctypes.c_void_p]
    return function(cfg._layer._handle).contents.num_threads


@pytest.fixture
def state(rng):
    cfg = sneppx.LLMConfig(**SMALL)
    return ref.random_state_dict(cfg, rng, qkv_bias=True, o_bias=False)


@pytest.mark.parametrize("value, error, message", [
    (True, TypeError, "num_threads: expected an integer, got True"),
    (2.0, TypeError, "num_threads: expected an integer, got 2.0"),
    ("2", TypeError, "num_threads: expected an integer, got '2'"),
    (None, TypeError, "num_threads: expected an integer, got None"),
    (-1, ValueError, "num_threads: -1 must be >= 0"),
    (1025, sneppx.InvalidArgumentError, r"config.num_threads: 1025 is outside \[0, 1024\]"),
    (2 ** 31, ValueError, r"num_threads: 2147483648 does not fit in int \(the C type; at most 2147483647\)"),
])
def test_setter_refuses_bad_values_and_changes_nothing(rng, state, value, error, message):
    cfg = sneppx.LLMConfig(**SMALL, num_threads=2)
    cfg.load_state_dict(state)
    layer = cfg._layer
    with pytest.raises(error, match=message):
        cfg.num_threads = value
    assert cfg.num_threads == 2 and cfg._layer is layer and layer_threads(cfg) == 2


def test_set_takes_effect_for_the_next_forward(rng, state):
    x = rng.standard_normal((2, 9, SMALL["hidden_size"])).astype(np.float32)
    want = ref.mha_forward(SMALL, state, x)
    cfg = sneppx.LLMConfig(**SMALL, num_threads=1)
    cfg.load_state_dict(state)
    assert_close(cfg.forward_mha(x), want)
    assert layer_threads(cfg) == 1
    for threads in (2, 3, 1, 0):
        cfg.num_threads = threads
        assert cfg.num_threads == threads and layer_threads(cfg) == threads
        got = cfg.forward_mha(x)
        # The weights survive the rebuild: the same numbers as a config made with this count.
        fresh = sneppx.LLMConfig(**SMALL, num_threads=threads)
        fresh.load_state_dict(state)
        np.testing.assert_array_equal(got, fresh.forward_mha(x))
        assert_close(got, want)
    assert cfg.weights_source == "state_dict(7 tensors)"


def test_setting_the_same_count_keeps_the_layer(state):
    cfg = sneppx.LLMConfig(**SMALL)
    cfg.load_state_dict(state)
    layer = cfg._layer
    cfg.num_threads = cfg.num_threads   # the default, 0, round-trips
    assert cfg._layer is layer


def test_set_before_any_layer_and_between_cached_steps(rng, state):
    x = rng.standard_normal((1, 12, SMALL["hidden_size"])).astype(np.float32)
    want = ref.mha_forward(SMALL, state, x)
    cfg = sneppx.LLMConfig(**SMALL)
    cfg.num_threads = 2                 # no layer yet: the one made by the load has 2
    cfg.load_state_dict(state)
    assert layer_threads(cfg) == 2
    cache = cfg.kv_cache(max_tokens=16)
    first = cfg.forward_mha(x[:, :8], past_key_value=cache)
    cfg.num_threads = 1                 # the cache holds K/V, not the layer: decoding continues
    steps = [cfg.forward_mha(x[:, t:t + 1], past_key_value=cache) for t in range(8, 12)]
    assert cache.lengths == [12]
    assert_close(np.concatenate([first] + steps, axis=1), want)


def test_from_name_and_from_config_json_take_num_threads(tmp_path):
    assert sneppx.LLMConfig.from_name("llama3", "8B", num_threads=3).num_threads == 3
    assert sneppx.LLMConfig.from_name("mistral-7B").num_threads == 0
    with pytest.raises(TypeError, match="num_threads: expected an integer, got False"):
        sneppx.LLMConfig.from_name("llama3", "8B", num_threads=False)
    with pytest.raises(ValueError, match=r"config.num_threads: 4096 is outside \[0, 1024\]"):
        sneppx.LLMConfig.from_name("llama3", "8B", num_threads=4096)
    (tmp_path / "config.json").write_text(json.dumps(dict(
        model_type="llama", hidden_size=128, num_attention_heads=4, num_key_value_heads=2)))
    cfg = sneppx.LLMConfig.from_config_json(tmp_path, num_threads=2)
    assert cfg.num_threads == 2 and cfg.num_key_value_heads == 2
    with pytest.raises(ValueError, match="num_threads: -3 must be >= 0"):
        sneppx.LLMConfig.from_config_json(tmp_path, num_threads=-3)


def test_the_process_runs_the_new_count_of_threads():
    """What the count is for: OpenMP's pool grows to it. In a fresh process on one thread
    (OMP_NUM_THREADS=1), a 1-thread layer starts no thread; after num_threads = 3 the next
    forward's process holds two more."""
    script = textwrap.dedent("""
        import os, numpy as np, sneppx
        tasks = lambda: len(os.listdir("/proc/self/task"))
        cfg = sneppx.LLMConfig(hidden_size=128, num_attention_heads=4, num_threads=1)
        x = np.ones((1, 32, 128), np.float32)
        cfg.forward_mha(x)
        before = tasks()
        cfg.num_threads = 3
        cfg.forward_mha(x)
        print(before, tasks())
    """)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    before, after = map(int, result.stdout.split())
    assert after == before + 2, (before, after)
