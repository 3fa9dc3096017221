"""The RoPE types and the config.json model types, each listed once in gen
(config_fields.ROPE_TYPES / ROPE_SCALING_FIELDS, model_types.MODEL_TYPES), against
everything that must follow the list:

- the math, which exists twice: templates/rope_freqs.c.j2 (libsneppx, through
  sneppx_config_rope_frequencies) and gen's config_json.rope_inv_freq. A type whose
  formula is missing from either computes the default frequencies there, or the two
  disagree;
- the two config.json readers (libsneppx's, from the tables rendered from the lists,
  and gen's): every type read alike, each model type's rules and default positions
  as the list gives them, and the lists their messages name;
- the hand-kept texts that name the types: include/sneppx/config.h's
  sneppx_config_from_json comment, LLMConfig.from_config_json's docstring and the
  fuzzer's dictionary.
"""
import ctypes
import json
import math
import re
import sys
from pathlib import Path

import pytest

import sneppx
from sneppx import _structs as S
from sneppx._locate import library_path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "gen"))
from sneppx_gen import config_fields, config_json, model_types  # noqa: E402

HIDDEN, HEADS, ROTARY, MAX_POSITIONS = 256, 4, 64, 1024
# Past MAX_POSITIONS, so that a type reading the call's positions (dynamic) uses them.
CALL_POSITIONS = 4096

# A rope_scaling dict of each type that validation accepts, its parameters away from
# the defaults. A new type needs one here (the first test says so).
SAMPLES = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 512},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512, "mscale": 0.707,
             "mscale_all_dim": 1.0},
}


def _write(tmp_path: Path, fields: dict) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(fields))
    return path


def _library_config(path: Path) -> S.Config:
    return sneppx.LLMConfig.from_config_json(path)._config


def _flat(config: S.Config) -> dict:
    out = {name: getattr(config, name) for name, _ in S.Config._fields_ if name not in ("name", "rope_scaling")}
    out.update({f"rope_scaling.{name}": getattr(config.rope_scaling, name) for name, _ in S.RopeScaling._fields_})
    return out


def _library_frequencies(config: S.Config, positions: int):
    lib = ctypes.CDLL(str(library_path()))
    function = lib.sneppx_config_rope_frequencies
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.POINTER(S.Config), ctypes.c_int64, ctypes.POINTER(ctypes.c_double), ctypes.c_int64,
                         ctypes.POINTER(ctypes.c_double)]
    inv_freq = (ctypes.c_double * (ROTARY // 2))()
    factor = ctypes.c_double()
    assert function(ctypes.byref(config), positions, inv_freq, ROTARY // 2, ctypes.byref(factor)) == 0
    return list(inv_freq), factor.value


def _rope_file(tmp_path: Path, scaling: dict) -> Path:
    return _write(tmp_path, {"model_type": "llama", "hidden_size": HIDDEN, "num_attention_heads": HEADS,
                             "max_position_embeddings": MAX_POSITIONS, "rope_scaling": scaling})


def _close(a: float, b: float) -> bool:
    # Both run the same double operations through the same libm: 1e-13 allows for
    # the compiler contracting or reordering one of them.
    return math.isclose(a, b, rel_tol=1e-13, abs_tol=0.0)


def test_every_rope_type_has_a_sample():
    assert list(SAMPLES) == list(config_fields.ROPE_TYPES), \
        "a RoPE type of config_fields.ROPE_TYPES without a sample dict here (or the reverse)"


@pytest.mark.parametrize("rope_type", config_fields.ROPE_TYPES)
def test_rope_type_has_its_math_in_both_copies(rope_type, tmp_path):
    path = _rope_file(tmp_path, SAMPLES[rope_type])
    library = _library_config(path)
    _, gen = config_json.read_file(str(path))
    assert config_json.describe_config(gen) == _flat(library)
    assert gen.rope_scaling.type == config_fields.ROPE_TYPES.index(rope_type)

    c_freq, c_factor = _library_frequencies(library, CALL_POSITIONS)
    py_freq, py_factor = config_json.rope_inv_freq(gen, ROTARY, CALL_POSITIONS)
    assert all(_close(c, p) for c, p in zip(c_freq, py_freq)), (rope_type, c_freq, py_freq)
    assert _close(c_factor, py_factor), (rope_type, c_factor, py_factor)

    if rope_type != "default":
        plain_freq, plain_factor = _library_frequencies(_library_config(_rope_file(tmp_path, SAMPLES["default"])),
                                                        CALL_POSITIONS)
        differs = [i for i, (a, b) in enumerate(zip(c_freq, plain_freq)) if abs(a - b) > 1e-9 * b]
        assert differs or c_factor != plain_factor, \
            f"{rope_type} gives the default frequencies: its formula is missing from rope_freqs.c.j2"


@pytest.mark.parametrize("rope_type", config_fields.ROPE_TYPES)
def test_each_required_key_is_required_by_both_readers(rope_type, tmp_path):
    for key in config_fields.rope_required(rope_type):
        path = _rope_file(tmp_path, {k: v for k, v in SAMPLES[rope_type].items() if k != key})
        message = f"rope_scaling.{key}: missing (rope_type '{rope_type}' needs it)"
        with pytest.raises(ValueError, match=re.escape(message)):
            _library_config(path)
        with pytest.raises(config_json.ConfigError, match=re.escape(message)):
            config_json.read_file(str(path))


def _refusal_of_both(path: Path) -> str:
    with pytest.raises((ValueError, NotImplementedError)) as library:
        _library_config(path)
    with pytest.raises(config_json.ConfigError) as gen:
        config_json.read_file(str(path))
    assert str(library.value) == str(gen.value)
    return str(gen.value)


def test_messages_name_the_lists(tmp_path):
    types = ", ".join(config_fields.ROPE_TYPES)
    assert _refusal_of_both(_rope_file(tmp_path, {"rope_type": "nope", "factor": 2.0})).endswith(
        f"rope_scaling.rope_type: 'nope' is not supported (supported: {types})")
    keys = ", ".join(config_fields.ROPE_KEYS)
    assert _refusal_of_both(_rope_file(tmp_path, {"rope_type": "linear", "factor": 2.0, "nope": 1})).endswith(
        f"rope_scaling.nope: unknown key (known: {keys})")
    assert _refusal_of_both(_write(tmp_path, {"model_type": "nope", "hidden_size": HIDDEN})).endswith(
        f"model_type: 'nope' is not supported (supported: {model_types.MODEL_TYPE_LIST})")
    assert model_types.MODEL_TYPE_LIST == ", ".join(t.name for t in model_types.MODEL_TYPES)


# What each rule makes of a file with attention_bias true and sliding_window 8.
BIASES = {"attention_bias": (1, 1), "none": (0, 0), "qkv": (1, 0)}
WINDOWS = {"sliding_window": 8, "use_sliding_window": 0, "none": 0}


@pytest.mark.parametrize("kind", model_types.MODEL_TYPES, ids=lambda t: t.name)
def test_model_type_is_read_by_its_rules_in_both_readers(kind, tmp_path):
    # 64 heads of 16: num_key_value_heads is left out, and the class's default (32 for Qwen2) must divide them.
    fields = {"model_type": kind.name, "hidden_size": 1024, "num_attention_heads": 64, "attention_bias": True,
              "sliding_window": 8}
    if kind.mla:
        fields.update(kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32, sliding_window=0)
    path = _write(tmp_path, fields)
    library = _library_config(path)
    _, gen = config_json.read_file(str(path))
    assert config_json.describe_config(gen) == _flat(library)
    assert library.max_position_embeddings == kind.default_max_positions
    assert library.num_key_value_heads == (kind.default_kv_heads or 64)
    assert library.q_lora_rank == kind.default_q_lora_rank   # left out of the file
    assert (library.qkv_bias, library.o_bias) == BIASES[kind.bias]
    assert library.sliding_window == (0 if kind.mla else WINDOWS[kind.window])
    assert (library.kv_lora_rank > 0, library.rope_interleaved) == (kind.mla, int(kind.mla))
    if kind.window == "use_sliding_window":
        assert "use_sliding_window: true" in _refusal_of_both(_write(tmp_path, dict(fields, use_sliding_window=True)))
    # Without the window key: the class's default (Mistral's 4096), in both readers.
    path = _write(tmp_path, {key: value for key, value in fields.items() if key != "sliding_window"})
    library = _library_config(path)
    _, gen = config_json.read_file(str(path))
    assert config_json.describe_config(gen) == _flat(library)
    assert library.sliding_window == kind.default_window


def test_hand_kept_texts_name_every_type():
    header = (REPO / "include" / "sneppx" / "config.h").read_text()
    comment = header[:header.index("SNEPPX_API sneppx_status sneppx_config_from_json(")]
    comment = comment[comment.rindex("/*"):]
    docstring = " ".join(sneppx.LLMConfig.from_config_json.__doc__.split())
    dictionary = (REPO / "fuzz" / "config_json.dict").read_text()
    def names(text: str, word: str) -> bool:
        return re.search(rf"\b{re.escape(word)}\b", text) is not None

    for kind in model_types.MODEL_TYPES:
        assert names(comment, kind.name), f"config.h's sneppx_config_from_json comment lacks model_type {kind.name}"
        assert names(docstring, kind.name), f"LLMConfig.from_config_json's docstring lacks model_type {kind.name}"
    for rope_type in config_fields.ROPE_TYPES:
        assert names(comment, rope_type), f"config.h's sneppx_config_from_json comment lacks rope type {rope_type}"
    for word in [t.name for t in model_types.MODEL_TYPES] + list(config_fields.ROPE_TYPES) + \
            list(config_fields.ROPE_KEYS):
        assert f'"\\"{word}\\""' in dictionary, f"fuzz/config_json.dict lacks {word}"
