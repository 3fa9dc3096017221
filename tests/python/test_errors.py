"""Every error path of the Python API: each raises ValueError / TypeError (or the
sneppx subclass of the C status) with a message naming the argument and, for
shapes, the expected shape. Nothing crashes; a failed call changes nothing."""
import json
import os
import re
import signal

import numpy as np
import pytest

import sneppx
from sneppx import _structs, errors
from sneppx._library import lib

SMALL = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)


@pytest.fixture
def cfg():
    return sneppx.LLMConfig(**SMALL)


@pytest.fixture
def x(rng):
    return rng.standard_normal((2, 5, 64)).astype(np.float32)


def test_unknown_preset_lists_valid_names():
    with pytest.raises(sneppx.UnknownPresetError) as error:
        sneppx.LLMConfig.from_name("llama4", "8B")
    message = str(error.value)
    assert "llama4-8B" in message
    for name in sneppx.LLMConfig.names():
        assert name in message
    assert isinstance(error.value, ValueError) and error.value.status == "SNEPPX_ERR_UNKNOWN_PRESET"
    with pytest.raises(ValueError, match="unknown preset 'mistral-8x7B'"):
        sneppx.LLMConfig.from_name("mistral-8x7B")
    with pytest.raises(TypeError, match="from_name"):
        sneppx.LLMConfig.from_name(3, "8B")


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(hidden_size=64), TypeError, "num_attention_heads"),
    (dict(SMALL, num_heads=8), TypeError, "num_attention_heads=4 and its alias num_heads=8 disagree"),
    (dict(SMALL, bias=True, attention_bias=False), TypeError, "disagree"),
    # Named as given, not as the fields they set (qkv_bias / o_bias).
    (dict(SMALL, bias="yes"), TypeError, "^bias: expected a bool, got 'yes'$"),
    (dict(SMALL, attention_bias=2), TypeError, "^attention_bias: expected a bool, got 2$"),
    (dict(SMALL, hidden_size=-64), ValueError, "hidden_size: -64 must be >= 0"),
    (dict(SMALL, hidden_size=64.5), TypeError, "hidden_size: expected an integer"),
    (dict(SMALL, hidden_size=0), ValueError, "config.hidden_size"),
    (dict(SMALL, num_key_value_heads=3), ValueError, "config.num_key_value_heads: 3 does not divide"),
    (dict(SMALL, head_dim=20), NotImplementedError, "config.head_dim: 20 is not supported"),
    (dict(SMALL, rope_theta="big"), TypeError, "rope_theta: expected a finite number"),
    (dict(SMALL, rope_theta=0.5), ValueError, "config.rope_theta"),
    (dict(SMALL, rope_scaling=8.0), TypeError, "rope_scaling: expected a dict"),
    # rope_scaling is read by the C runtime's reader, in its words and statuses (as config.json's).
    (dict(SMALL, rope_scaling={"rope_type": "longrope", "factor": 2.0}), sneppx.UnsupportedError,
     rf"^rope_scaling.rope_type: 'longrope' is not supported \(supported: "
     rf"{re.escape(', '.join(_structs.ROPE_TYPE_NAMES.values()))}\)$"),
    (dict(SMALL, rope_scaling={"rope_type": "linear"}), sneppx.FormatError,
     r"^rope_scaling.factor: missing \(rope_type 'linear' needs it\)$"),
    (dict(SMALL, rope_scaling={"rope_type": "linear", "factr": 2.0}), sneppx.UnsupportedError,
     r"^rope_scaling.factr: unknown key \(known: rope_type, type, factor, "),
    (dict(SMALL, rope_scaling={"type": "yarn", "rope_type": "linear", "factor": 2.0}), sneppx.FormatError,
     r"^rope_scaling: rope_type 'linear' and type 'yarn' disagree$"),
    (dict(SMALL, rope_scaling={"rope_type": "yarn", "factor": 2.0, "truncate": False}), sneppx.UnsupportedError,
     r"^rope_scaling.truncate: only true"),
    (dict(SMALL, rope_scaling={"rope_type": "linear", "factor": [2.0]}), TypeError,
     r"^rope_scaling\['factor'\]: expected a number, a string, a bool or None, got \[2.0\]$"),
    (dict(SMALL, rope_scaling={2: 2.0}), TypeError, r"^rope_scaling: keys are strings, got 2$"),
    (dict(SMALL, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                               "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}),
     ValueError, "low_freq_factor"),
    (dict(SMALL, partial_rotary_factor=1.5), ValueError, "partial_rotary_factor"),
    (dict(SMALL, use_flash_attn="yes"), TypeError, "use_flash_attn: expected a bool"),
    (dict(SMALL, mla_naive=True), ValueError, "mla_naive: applies to MLA configs"),
    (dict(SMALL, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, sliding_window=8),
     NotImplementedError, "MLA has no sliding window"),
    # The latent rows' sizes: kv_lora_rank alone, then with the rope part (named, with their sum).
    (dict(SMALL, kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16), ValueError,
     r"^config.kv_lora_rank: 24 must be a multiple of 16$"),
    (dict(SMALL, kv_lora_rank=32, qk_nope_head_dim=8, qk_rope_head_dim=24, v_head_dim=16), ValueError,
     r"^config.kv_lora_rank \+ qk_rope_head_dim: 56 must be a multiple of 16$"),
    # MLA rotates qk_rope_head_dim dims whatever the factor: it was accepted and ignored.
    (dict(SMALL, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, partial_rotary_factor=0.5),
     ValueError, r"^partial_rotary_factor: MLA \(kv_lora_rank > 0\) rotates the qk_rope_head_dim \(16\) dims"),
    (dict(SMALL, name=7), TypeError, "name: expected a string"),
])
def test_bad_configs(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        sneppx.LLMConfig(**kwargs)


def test_bad_config_json(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gemma", "hidden_size": 64, "num_attention_heads": 4}))
    # The C reader's statuses: a valid file of another model is unsupported, a malformed one a FormatError.
    with pytest.raises(sneppx.UnsupportedError, match=f"^{re.escape(str(path))}: model_type: 'gemma' is not "
                                                      f"supported"):
        sneppx.LLMConfig.from_config_json(path)
    path.write_text(json.dumps({"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4,
                                "use_sliding_window": True, "sliding_window": 16}))
    with pytest.raises(NotImplementedError, match="use_sliding_window"):
        sneppx.LLMConfig.from_config_json(tmp_path)
    path.write_text(json.dumps({"model_type": "llama", "num_attention_heads": 4}))
    with pytest.raises(sneppx.FormatError, match=f"^{re.escape(str(path))}: hidden_size: missing"):
        sneppx.LLMConfig.from_config_json(path)
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
                                "rope_scaling": {"rope_type": "linear", "factor": "2"}}))
    with pytest.raises(ValueError, match=r"config.json: rope_scaling.factor: expected a finite number, got the "
                                         r"string \"2\""):
        sneppx.LLMConfig.from_config_json(path)
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 5}))
    with pytest.raises(ValueError, match="hidden_size"):            # validation, after the reading
        sneppx.LLMConfig.from_config_json(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: not valid JSON"):
        sneppx.LLMConfig.from_config_json(path)
    # An empty path is not the working directory (Path("") is "."), whose config.json this one is.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="^path: an empty path"):
        sneppx.LLMConfig.from_config_json("")
    with pytest.raises(ValueError, match="^" + re.escape("path: 'a\\x00b' contains a NUL character")):
        sneppx.LLMConfig.from_config_json("a\0b")
    # The C runtime reads the file (sneppx_config_from_json_file), as it reads a checkpoint.
    absent = tmp_path / "absent.json"
    with pytest.raises(sneppx.FileError, match=f"^{re.escape(str(absent))}: cannot open: No such file"):
        sneppx.LLMConfig.from_config_json(absent)
    with pytest.raises(sneppx.FileError, match=f"^{re.escape(str(absent))}: cannot open"):
        sneppx.LLMConfig.from_config_json(os.fsencode(absent))
    for not_a_path in (123, None, ["config.json"]):
        with pytest.raises(TypeError, match="^path: expected a file or directory path"):
            sneppx.LLMConfig.from_config_json(not_a_path)
    # A FIFO (or a device) would block the read forever: refused before reading.
    fifo = tmp_path / "fifo" / "config.json"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    signal.alarm(20)
    try:
        with pytest.raises(sneppx.FileError, match=f"^{re.escape(str(fifo))}: not a regular file"):
            sneppx.LLMConfig.from_config_json(fifo.parent)
    finally:
        signal.alarm(0)


@pytest.mark.parametrize("value, error, pattern", [
    (np.zeros((5, 64), np.float32), ValueError, r"hidden_states: expected shape \[batch, seq_len, 64\], got \[5, 64\]"),
    (np.zeros((1, 5, 63), np.float32), ValueError, r"expected shape \[batch, seq_len, 64\], got \[1, 5, 63\]"),
    (np.zeros((1, 2, 64), np.complex64), TypeError, "hidden_states: expected real numbers.*complex64"),
    (np.full((1, 2, 64), "a"), TypeError, "hidden_states: expected real numbers"),
    (np.zeros((1, 2, 64), bool), TypeError, "hidden_states: expected real numbers.*bool"),
    ([[[0.0] * 64, [0.0] * 3]], TypeError, "hidden_states: cannot be read"),
    (None, TypeError, "hidden_states"),
])
def test_bad_hidden_states(cfg, value, error, pattern):
    with pytest.raises(error, match=pattern):
        cfg.forward_mha(value)


def test_bad_attention_mask(cfg, x):
    expected = r"attention_mask: expected shape \[2, 1, 5, 5\] \(or \[1, 1, 5, 5\]\)"
    for shape in [(2, 5, 5), (2, 1, 5, 4), (3, 1, 5, 5), (2, 2, 5, 5), (5, 5)]:
        with pytest.raises(ValueError, match=expected + r", got \[" + ", ".join(map(str, shape)) + r"\]"):
            cfg.forward_mha(x, np.zeros(shape, np.float32))
    with pytest.raises(TypeError, match="attention_mask: expected an additive float mask or a bool mask"):
        cfg.forward_mha(x, np.ones((2, 1, 5, 5), np.int64))
    # Batch 1 has one expected shape, said once.
    with pytest.raises(ValueError, match=r"attention_mask: expected shape \[1, 1, 5, 5\], got \[1, 1, 5, 4\]$"):
        cfg.forward_mha(x[:1], np.zeros((1, 1, 5, 4), np.float32))
    with pytest.raises(ValueError, match=r"position_ids: expected shape \[1, 5\], got \[1, 4\]$"):
        cfg.forward_mha(x[:1], position_ids=np.zeros((1, 4), np.int64))


def test_bool_and_broadcast_masks(cfg, x):
    causal = np.tril(np.ones((5, 5), bool))[None, None]
    additive = np.where(causal, 0.0, -np.inf).astype(np.float32)
    expected = cfg.forward_mha(x)
    np.testing.assert_array_equal(cfg.forward_mha(x, causal), expected)
    np.testing.assert_array_equal(cfg.forward_mha(x, additive), expected)
    np.testing.assert_array_equal(cfg.forward_mha(x, np.repeat(additive, 2, axis=0).astype(np.float64)), expected)


def test_bad_position_ids(cfg, x):
    for shape in [(2, 4), (3, 5), (10,), (2, 5, 1)]:
        with pytest.raises(ValueError, match=r"position_ids: expected shape \[2, 5\] \(or \[1, 5\]\)"):
            cfg.forward_mha(x, position_ids=np.zeros(shape, np.int64))
    with pytest.raises(TypeError, match="position_ids: expected integers, got dtype float64"):
        cfg.forward_mha(x, position_ids=np.zeros((2, 5)))
    with pytest.raises(TypeError, match="position_ids: .*dtype object: ragged lists, or integers beyond 64 bits"):
        cfg.forward_mha(x, position_ids=[[0, 1, 2, 3, 2**70]])
    # Named by the caller's index, not the flattened batch's.
    with pytest.raises(ValueError, match=r"^position_ids\[1, 3\]: position -3 is negative$"):
        cfg.forward_mha(x, position_ids=np.array([[0, 1, 2, 3, 4], [0, 1, 2, -3, 4]]))
    with pytest.raises(ValueError, match=r"^position_ids\[0, 3\]: position -3 is negative$"):
        cfg.forward_mha(x, position_ids=np.array([[0, 1, 2, -3, 4]]))
    with pytest.raises(ValueError, match="position_ids: position 4096 is beyond max_position_embeddings 4096"):
        cfg.forward_mha(x, position_ids=np.array([[0, 1, 2, 3, 4096]]))
    with pytest.raises(ValueError) as beyond:
        cfg.forward_mha(x, position_ids=np.array([[0, 1, 2, 3, 4096]]))
    assert str(beyond.value).endswith(
        "(HF runs on past it with the same frequencies: raising max_position_embeddings does the same; "
        "extend_context() instead rescales theta for a longer context)")
    with pytest.raises(ValueError, match="does not fit in int64"):
        cfg.forward_mha(x, position_ids=np.full((1, 5), 2 ** 63, np.uint64))
    # Without position_ids, the sequence's length made the positions: named as the cause
    # (the message named position_ids, which the caller never gave).
    with pytest.raises(ValueError, match=r"^seq_len: 4097 tokens at positions 0\.\.4096 \(position_ids NULL\) "
                                         r"reach beyond max_position_embeddings 4096 \(HF runs on past it"):
        cfg.forward_mha(np.zeros((1, 4097, cfg.hidden_size), np.float32))
    # A [1, seq] row of positions applies to every batch row; unsigned ints are fine.
    np.testing.assert_array_equal(cfg.forward_mha(x, position_ids=np.arange(5, dtype=np.uint8)[None]),
                                  cfg.forward_mha(x))


@pytest.mark.parametrize("flash", [True, False], ids=["flash", "sdpa"])
def test_nan_input_propagates(cfg, x, flash):
    cfg.use_flash_attn = flash
    x = x.copy()
    x[0, 2, 7] = np.nan
    out = cfg.forward_mha(x)
    # Every query that attends to the NaN token is NaN. Earlier queries may be NaN too, as in
    # HF's eager attention (a masked key's zero weight times its NaN value is NaN); the other
    # sequence of the batch never sees it.
    assert np.all(np.isnan(out[0, 2:]).any(axis=-1))
    assert np.all(np.isfinite(out[1]))


def test_empty_sequence(cfg):
    assert cfg.forward_mha(np.zeros((1, 0, 64), np.float32)).shape == (1, 0, 64)


def test_bad_setters_and_extend_context(cfg, x):
    with pytest.raises(TypeError, match="use_flash_attn: expected a bool"):
        cfg.use_flash_attn = 2
    with pytest.raises(ValueError, match="mla_naive: applies to MLA configs"):
        cfg.mla_naive = True
    with pytest.raises(ValueError, match="new_max_positions: 100 must exceed max_position_embeddings 4096"):
        cfg.extend_context(100)
    with pytest.raises(TypeError, match="new_max_positions: expected an integer"):
        cfg.extend_context(8192.0)
    with pytest.raises(TypeError, match="new_max_positions: expected an integer, got None"):
        cfg.extend_context(None)
    with pytest.raises(ValueError, match="new_max_positions: -1 must be >= 0"):
        cfg.extend_context(-1)
    assert cfg.max_position_embeddings == 4096 and cfg.use_flash_attn is True
    assert cfg.forward_mha(x).shape == x.shape


def test_bad_state_dicts(cfg, rng, x):
    good = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in cfg.tensor_shapes().items()}
    before = cfg.forward_mha(x)
    with pytest.raises(TypeError, match="expected a mapping"):
        cfg.load_state_dict(list(good.items()))
    with pytest.raises(TypeError, match="keys must be strings"):
        cfg.load_state_dict({1: good["q_proj.weight"]})
    missing = {("model.layers.0.self_attn." + k): v for k, v in good.items() if k != "o_proj.bias"}
    with pytest.raises(ValueError, match="missing tensor\\(s\\) 'model.layers.0.self_attn.o_proj.bias'"):
        cfg.load_state_dict(missing)
    with pytest.raises(ValueError, match="unexpected tensor 'q_norm.weight'; config 'custom' takes q_proj.weight"):
        cfg.load_state_dict(dict(good, **{"q_norm.weight": np.ones(16, np.float32)}))
    with pytest.raises(ValueError, match=r"tensor 'k_proj.weight' has shape \[32, 63\], expected \[32, 64\]"):
        cfg.load_state_dict(dict(good, **{"k_proj.weight": np.ones((32, 63), np.float32)}))
    with pytest.raises(TypeError, match="tensor 'v_proj.bias' has dtype int32; expected floating point"):
        cfg.load_state_dict(dict(good, **{"v_proj.bias": np.ones(32, np.int32)}))
    huge = good["o_proj.weight"].astype(np.float64)
    huge[3, 5] = 1e39
    with pytest.raises(ValueError, match=r"^state_dict: tensor 'o_proj.weight': 1e\+39 at index \[3, 5\] is beyond "
                                         r"the float32 range"):
        cfg.load_state_dict(dict(good, **{"o_proj.weight": huge}))
    # A key is outside text (a downloaded checkpoint's): a message shows its control
    # characters escaped, never raw (an escape sequence, a line of its own; SECURITY.md).
    with pytest.raises(ValueError) as raised:
        cfg.load_state_dict(dict(good, **{"q_norm.weight\x1b[31m\n": np.ones(16, np.float32)}))
    assert "unexpected tensor 'q_norm.weight\\x1b[31m\\n'" in str(raised.value)
    assert not any(ord(c) < 0x20 or ord(c) == 0x7f for c in str(raised.value)), repr(str(raised.value))
    mixed = dict(good)
    mixed["model.layers.1.self_attn.q_proj.weight"] = mixed.pop("q_proj.weight")
    with pytest.raises(ValueError, match="different prefixes"):
        cfg.load_state_dict(mixed)
    # Nothing above replaced the weights.
    assert cfg.weights_source == "synthetic(seed=0x5eed5eed)"
    np.testing.assert_array_equal(cfg.forward_mha(x), before)


def test_every_error_class_has_its_c_status():
    """The classes' codes come from the C names of the statuses: each class has one, and a
    status the library names has a class (one added to status.h alone fails here)."""
    assert sorted(errors._BY_STATUS.values(), key=lambda c: c.status) == sorted(errors._CLASSES, key=lambda c: c.status)
    named = [code for code in range(1, 64) if lib.sneppx_status_name(code) != b"SNEPPX_ERR_UNKNOWN"]
    assert sorted(errors._BY_STATUS) == named
    for code, error_class in errors._BY_STATUS.items():
        assert errors.status_code(error_class) == code


def test_errors_are_sneppx_errors():
    with pytest.raises(sneppx.Error) as error:
        sneppx.LLMConfig(**dict(SMALL, head_dim=24))
    assert isinstance(error.value, sneppx.UnsupportedError)
    assert error.value.status == "SNEPPX_ERR_UNSUPPORTED"


@pytest.mark.parametrize("factor", [0.01, 0.1])
def test_partial_rotary_factor_that_rotates_nothing(tmp_path, factor):
    # int(16 * factor) < 2 rotates no pair, and rotary_dim 0 would mean "the whole head" in C.
    message = f"partial_rotary_factor: {factor:g} of head_dim 16 rotates no dimension pair"
    with pytest.raises(ValueError, match=re.escape(message)):
        sneppx.LLMConfig(**SMALL, partial_rotary_factor=factor)
    assert sneppx.LLMConfig(**SMALL, partial_rotary_factor=0.125).rotary_dim == 2
    # config.json's factor is not read: transformers' LLaMA rotates the whole head whatever it says.
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
                                "partial_rotary_factor": factor}))
    assert sneppx.LLMConfig.from_config_json(path).rotary_dim == 16


@pytest.mark.parametrize("kwargs, error, pattern", [
    # Integers beyond the C field's type were stored modulo 2^64 / 2^32.
    (dict(SMALL, hidden_size=2 ** 64 + 64), ValueError, "hidden_size: 18446744073709551680 does not fit in int64"),
    (dict(SMALL, num_attention_heads=2 ** 64), ValueError,
     "num_attention_heads: 18446744073709551616 does not fit in int64"),
    (dict(SMALL, num_key_value_heads=2 ** 63), ValueError, "num_key_value_heads: 9223372036854775808 does not fit"),
    (dict(SMALL, max_position_embeddings=2 ** 64 + 16), ValueError,
     "max_position_embeddings: 18446744073709551632 does not fit in int64"),
    (dict(SMALL, sliding_window=np.uint64(2 ** 64 - 1)), ValueError, "sliding_window: 18446744073709551615 does not"),
    (dict(SMALL, num_threads=2 ** 32 + 1), ValueError, "num_threads: 4294967297 does not fit in int "),
    (dict(SMALL, num_threads=2 ** 31), ValueError, "num_threads: 2147483648 does not fit in int "),
    (dict(SMALL, rope_theta=2 ** 2000), ValueError, "rope_theta: expected a finite number, got 1148130695"),
    (dict(SMALL, rope_theta=float("nan")), ValueError, "rope_theta: expected a finite number, got nan"),
    (dict(SMALL, partial_rotary_factor=float("inf")), ValueError, "partial_rotary_factor: expected a finite number"),
    (dict(SMALL, rope_scaling={"rope_type": "linear", "factor": -float("inf")}), ValueError,
     r"rope_scaling\['factor'\]: expected a finite number, got -inf"),
] + [
    # JSON (what the C reader reads) has no NaN or infinity: refused before it, naming the key;
    # the rest in the C reader's words: integers are exact only up to 2^53 in a double.
    (dict(SMALL, max_position_embeddings=32768,
          rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": value}),
     error, "^" + pattern)
    for value, error, pattern in [
        (1e30, sneppx.FormatError, r"rope_scaling.original_max_position_embeddings: expected an integer, "
                                   r"got 1e\+30$"),
        (2 ** 70, sneppx.FormatError, r"rope_scaling.original_max_position_embeddings: expected an integer, "
                                      r"got 1.1805916207174113e\+21$"),
        (-2 ** 63 - 1, sneppx.FormatError, r"rope_scaling.original_max_position_embeddings: expected an integer, "
                                           r"got -9.2233720368547758e\+18$"),
        (float("nan"), ValueError, r"rope_scaling\['original_max_position_embeddings'\]: expected a finite number, "
                                   r"got nan$"),
        (float("inf"), ValueError, r"rope_scaling\['original_max_position_embeddings'\]: expected a finite number, "
                                   r"got inf$"),
        (4096.5, sneppx.FormatError, r"rope_scaling.original_max_position_embeddings: expected an integer, "
                                     r"got 4096.5$"),
        ("4096", sneppx.FormatError, r"rope_scaling.original_max_position_embeddings: expected an integer, "
                                     r"got the string \"4096\"$"),
    ]
])
def test_out_of_range_numbers(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        sneppx.LLMConfig(**kwargs)


def test_integral_float_original_max_position_embeddings_is_kept():
    cfg = sneppx.LLMConfig(**SMALL, max_position_embeddings=32768,
                           rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192.0})
    assert cfg.rope_scaling["original_max_position_embeddings"] == 8192


def test_out_of_range_extend_context_and_layer(cfg, x, tmp_path):
    with pytest.raises(ValueError, match="new_max_positions: 18446744073709559808 does not fit in int64"):
        cfg.extend_context(2 ** 64 + 8192)
    assert cfg.max_position_embeddings == 4096
    with pytest.raises(ValueError, match="layer: 18446744073709551616 does not fit in int64"):
        cfg.load_safetensors(tmp_path, layer=2 ** 64)
    assert cfg.weights_source == "synthetic(seed=0x5eed5eed)"


@pytest.mark.parametrize("key", ["beta_fast", "beta_slow"])
@pytest.mark.parametrize("value", [0.0, -1.0])
def test_yarn_beta_not_positive_as_the_config_json_reader(tmp_path, key, value):
    # The constructor treats rope_scaling exactly as the C config.json reader does: both
    # accept the value (and report it back), or both refuse it naming the key.
    scaling = {"rope_type": "yarn", "factor": 4.0, key: value}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
                                "num_key_value_heads": 2, "rope_scaling": scaling}))
    outcomes = []
    for make in (lambda: sneppx.LLMConfig(**SMALL, rope_scaling=scaling),
                 lambda: sneppx.LLMConfig.from_config_json(path),
                 lambda: sneppx.LLMConfig.from_config_json(path, use_flash_attn=False)):
        try:
            outcomes.append(make().rope_scaling)
        except ValueError as error:
            assert key in str(error)
            outcomes.append(ValueError)
    assert outcomes[0] == outcomes[1] == outcomes[2]


@pytest.mark.parametrize("family, size, shown", [
    ("\udc80", None, r"'\\udc80'"),               # not encodable as UTF-8 (an undecodable file name)
    ("llama3", "8B\udcff", r"'llama3-8B\\udcff'"),
    ("llama3-8B\x00junk", None, r"'llama3-8B\\x00junk'"),   # was llama3-8B: the C string ended at NUL
    ("llama3\x00", "8B", r"'llama3\\x00-8B'"),
])
def test_unencodable_preset_names(family, size, shown):
    with pytest.raises(sneppx.UnknownPresetError, match=f"^name: unknown preset {shown}; valid names: llama2-7B"):
        sneppx.LLMConfig.from_name(family, size)


@pytest.mark.parametrize("name, pattern", [
    ("x*/\nint injected;\n/*", r"config\.name: byte 1 \(0x2a\) is not one of A-Z a-z 0-9 \. _ -"),
    ("a\udc80b\x00c", r"config\.name: byte 1 \(0x5c\)"),     # escaped by _c_text, then refused
    ("my model", r"config\.name: byte 2 \(0x20\)"),
    ("x" * 64, "name: 64 bytes, more than 63"),               # was cut to 63 without a word
])
def test_bad_config_names(name, pattern):
    """A name reaches logs and generated code: only A-Z a-z 0-9 . _ -, at most 63 bytes."""
    with pytest.raises(ValueError, match=pattern):
        sneppx.LLMConfig(**SMALL, name=name)


def test_config_names_from_directories(tmp_path):
    """from_config_json names a config after its directory, made into a valid name."""
    directory = tmp_path / ("Llama 3 (8B) \u00e9*\n" + "x" * 80)
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", **SMALL}))
    assert sneppx.LLMConfig.from_config_json(directory).name == ("Llama_3__8B_____" + "x" * 80)[:63]
    assert sneppx.LLMConfig(**SMALL, name="Meta-Llama-3.1-8B_v2").name == "Meta-Llama-3.1-8B_v2"


@pytest.mark.parametrize("path, error, pattern", [
    (None, TypeError, "path: expected a str, bytes or os.PathLike, got None"),
    (3, TypeError, "path: expected a str, bytes or os.PathLike, got 3"),
    ("/tmp\x00/model.safetensors", ValueError, r"path: '/tmp\\x00/model.safetensors' contains a NUL character"),
])
def test_bad_safetensors_path(cfg, path, error, pattern):
    with pytest.raises(error, match=pattern):
        cfg.load_safetensors(path)
    assert cfg.weights_source == "synthetic(seed=0x5eed5eed)"


@pytest.mark.parametrize("dtype", [np.float64, np.longdouble])
def test_hidden_states_beyond_float32(cfg, x, dtype):
    wide = x.astype(dtype)
    wide[1, 3, 10] = -1e39
    with pytest.raises(ValueError, match=r"hidden_states: -1e\+39 at index \[1, 3, 10\] is beyond the float32 range"):
        cfg.forward_mha(wide)
    # The float32 maximum itself, NaN and inf are converted as they are (NaN / inf propagate).
    wide[1, 3, 10] = np.finfo(np.float32).max
    assert np.all(np.isfinite(cfg.forward_mha(wide)[0]))
    for special in (np.nan, np.inf):
        wide[1, 3, 10] = special
        out = cfg.forward_mha(wide)
        assert np.isnan(out[1, 3:]).any(axis=-1).all() and np.all(np.isfinite(out[0]))


@pytest.mark.parametrize("dtype", [np.float64, np.longdouble])
def test_attention_mask_beyond_float32(cfg, x, dtype):
    """1e300 in a float64 mask used to become +inf in float32, and its row NaN."""
    seq = x.shape[1]
    mask = np.zeros((2, 1, seq, seq), dtype=dtype)
    mask[1, 0, 2, 1] = 1e300
    with pytest.raises(ValueError, match=r"attention_mask: 1e\+300 at index \[1, 0, 2, 1\] is beyond the float32 "
                                         r"range \(\|x\| <= 3\.4028235e\+38\)"):
        cfg.forward_mha(x, attention_mask=mask)
    # HF's float64 mask value, finfo(float64).min, becomes -inf: masked, as in HF.
    mask[1, 0, 2, 1] = np.finfo(np.float64).min
    hf_min = cfg.forward_mha(x, attention_mask=mask)
    mask[1, 0, 2, 1] = -np.inf
    assert np.array_equal(hf_min, cfg.forward_mha(x, attention_mask=mask)) and np.isfinite(hf_min).all()


def test_pickle_is_refused_with_a_reason(cfg):
    import pickle
    with pytest.raises(TypeError, match="LLMConfig cannot be pickled.*copy.deepcopy"):
        pickle.dumps(cfg)


def test_beyond_max_positions_names_both_ways_and_which_is_hf(x):
    # YaRN without original_max_position_embeddings reads max_position_embeddings in its
    # frequencies (as HF does), so raising it changes the numbers: the hint says so.
    scaled = sneppx.LLMConfig(**SMALL, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ValueError) as beyond:
        scaled.forward_mha(x, position_ids=np.array([[0, 1, 2, 3, 4096]]))
    assert str(beyond.value).endswith(
        "(this RoPE's frequencies depend on max_position_embeddings, in HF too: raise it, or set "
        "original_max_position_embeddings to keep them; extend_context() rescales theta instead)")
    # The default RoPE's frequencies do not: with max_position_embeddings raised, position
    # 4096 gets the rotation every position below it already had the formula for.
    raised = sneppx.LLMConfig(**{**SMALL, "max_position_embeddings": 8192})
    out = raised.forward_mha(x, position_ids=np.array([[0, 1, 2, 3, 4096]]))
    assert np.all(np.isfinite(out))


def test_kv_cache_integers_beyond_int64_are_refused(cfg, x):
    """ctypes would store these modulo 2^64 (begin = 2^64 read as 0 copied a whole row into
    arrays sized for none): every integer argument of the cache is checked first, naming it."""
    cache = cfg.kv_cache(2, max_tokens=16)
    cfg.forward_mha(x, past_key_value=cache)
    beyond = r"does not fit in int64"
    for call, name in [(lambda: cache.read(0, begin=2 ** 64), "begin"), (lambda: cache.read(0, end=2 ** 64), "end"),
                       (lambda: cache.read(0, layer_idx=2 ** 64), "layer_idx"),
                       (lambda: cache.truncate(0, 2 ** 64), "length"),
                       (lambda: cache.layer_lengths(2 ** 64 + 1), "layer_idx"),
                       (lambda: cfg.forward_mha(x[:, :1], past_key_value=cache, layer_idx=2 ** 64 + 1), "layer_idx"),
                       (lambda: cfg.forward_ragged(cache, [0], [x[0, :1]], layer_idx=2 ** 64), "layer_idx"),
                       (lambda: cfg.kv_cache(1, max_tokens=8, page_size=2 ** 64 + 16), "page_size"),
                       (lambda: cfg.kv_cache(1, max_tokens=8, num_layers=2 ** 64 + 1), "num_layers")]:
        with pytest.raises(ValueError, match=f"^{name}: \\d+ {beyond}"):
            call()
    for value in (True, 1.0, "1"):
        with pytest.raises(TypeError, match="^layer_idx: expected an integer"):
            cache.layer_lengths(value)
        with pytest.raises(TypeError, match="^layer_idx: expected an integer"):
            cfg.forward_mha(x[:, :1], past_key_value=cache, layer_idx=value)
    # the pool batch and max_tokens make is named by them, not by the C field they fill
    with pytest.raises(ValueError, match=r"^max_tokens: 2 rows of 2147483648 tokens make a pool of \d+ tokens"):
        cfg.kv_cache(2, max_tokens=2 ** 31)
    # a product past int64 would wrap in the C field (to a valid size): refused in Python
    with pytest.raises(ValueError, match=r"^max_tokens: 4294967296 rows of 4294967296 tokens make a pool of "
                                         r"\d+ tokens .*beyond what a cache holds$"):
        cfg.kv_cache(2 ** 32, max_tokens=2 ** 32)
    # an end far past the row is refused by C, naming it, before anything is allocated for it
    with pytest.raises(ValueError, match=r"begin, end: \[0, 1000000000000\) is not within"):
        cache.read(0, end=10 ** 12)
    assert cache.lengths == [5, 5]


def test_forward_ragged_errors_name_the_row(cfg, x):
    cache = cfg.kv_cache(2, max_tokens=16)
    for chunks, pattern in [([np.ones(64, np.float32)], r"^hidden_states\[0\]: expected shape \[q_len >= 1, 64\], "
                                                         r"got \[64\]$"),
                            ([x[0, :2], np.ones((1, 32), np.float32)], r"^hidden_states\[1\]: .*got \[1, 32\]$"),
                            ([x[0, :0]], r"^hidden_states\[0\]: .*got \[0, 64\]$")]:
        with pytest.raises(ValueError, match=pattern):
            cfg.forward_ragged(cache, list(range(len(chunks))), chunks)
    with pytest.raises(ValueError, match=r"^position_ids\[1\]: expected shape \[2\] \(or \[1, 2\]\), got \[3\]$"):
        cfg.forward_ragged(cache, [0, 1], [x[0, :1], x[1, :2]], [np.arange(1), np.arange(3)])
    with pytest.raises(TypeError, match=r"^position_ids\[0\]: expected integers, got dtype float64$"):
        cfg.forward_ragged(cache, [0], [x[0, :1]], [np.zeros(1)])
    assert cache.lengths == [0, 0]
    # [1, q_len, hidden] is one row's tokens too
    out = cfg.forward_ragged(cache, [0], [x[0:1, :3]], [np.arange(3)[None]])
    assert out[0].shape == (3, 64) and cache.lengths == [3, 0]
