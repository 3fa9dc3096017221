"""Narrow weight storage (weight_dtype bfloat16 / float16), end to end:

- every family's small stand-in (llama3 GQA, mistral window, qwen2 bias, DeepSeek V2 MLA
  with and without q LoRA) through the runtime, flash and SDPA, against the float64
  reference computed on the SAME rounded weights (reference.round_weights: projection
  matrices rounded to the type, biases and norm weights not). What remains is float32
  accumulation, so the bound is WEIGHT_DTYPE_MAX_NORMALIZED = 1e-5 (measured: 3-7e-7 on
  these configs, float32 weights included), 10x below the budget of the float32 tests:
  a layer that kept float32 panels misses it by 20-400x (the test checks that too, on the
  unrounded reference). MLA's absorbed W_UK^T / W_UV are a transpose and a slice of
  kv_b_proj, so the same rounded kv_b_proj is what the absorbed layer holds;
- flash == SDPA within the float32 pair budget, for each type;
- the cached forward (sneppx_layer_forward_cached, a prefill then decode steps) of a
  bfloat16 layer equals its cache-free forward;
- the vendored layer (sneppx-gen --weight-dtype) for both targets (v8 and, on an AVX-512
  host, v16) against the same reference, its _packed_floats() half the float32 one's
  panels, and AOT == JIT for bfloat16;
- LLMConfig(weight_dtype=...), from_name(..., weight_dtype=...), from_config_json
  overrides; bad names refused naming weight_dtype; sneppx-gen --weight-dtype refuses others.
"""
import json
import subprocess
import sys

import numpy as np
import pytest

import reference as ref
import sneppx
from families import FAMILIES, make_inputs
from test_aot import CC, PAIR_MAX_NORMALIZED, PAIR_RMS_RELATIVE, SNEPPX_GEN, _assert_close, _generate

WEIGHT_DTYPE_MAX_NORMALIZED = 1e-5
WEIGHT_DTYPE_RMS_RELATIVE = 1e-5
NARROW = ["bfloat16", "float16"]
FAMILY_NAMES = ["llama3", "mistral", "qwen2", "deepseek-v2", "deepseek-v2-lite-like"]


def _avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return "avx512f" in cpuinfo.read().split()
    except OSError:
        return False


def _layer(family: str, dtype: str, rng):
    hf_config = FAMILIES[family]
    config = sneppx.LLMConfig(**hf_config, weight_dtype=dtype)
    weights = ref.random_state_dict(hf_config, rng, qkv_bias=config.qkv_bias, o_bias=config.o_bias)
    config.load_state_dict(weights)
    return hf_config, config, weights


@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_runtime_matches_reference_on_rounded_weights(family, dtype, rng):
    hf_config, config, weights = _layer(family, dtype, rng)
    assert config.weight_dtype == dtype
    assert all(f"-{dtype}-" in key for key in config.kernel_keys if key.startswith("gemm-"))
    window = int(hf_config.get("sliding_window") or 0)
    for kind, batch, seq_len in (("none", 2, 37), ("explicit", 1, 21)):
        x, mask, positions = make_inputs(kind, batch, seq_len, hf_config["hidden_size"], window, rng)
        want = ref.mha_forward(hf_config, ref.round_weights(weights, dtype), x, mask, positions)
        config.use_flash_attn = True
        flash = config.forward_mha(x, mask, positions)
        config.use_flash_attn = False
        sdpa = config.forward_mha(x, mask, positions)
        label = f"{family} {dtype} {kind}"
        _assert_close(flash, want, f"{label} flash vs reference", WEIGHT_DTYPE_MAX_NORMALIZED,
                      WEIGHT_DTYPE_RMS_RELATIVE)
        _assert_close(sdpa, want, f"{label} sdpa vs reference", WEIGHT_DTYPE_MAX_NORMALIZED,
                      WEIGHT_DTYPE_RMS_RELATIVE)
        _assert_close(flash, sdpa.astype(np.float64), f"{label} flash vs sdpa", PAIR_MAX_NORMALIZED,
                      PAIR_RMS_RELATIVE)
        # The bound tells the types apart: against the unrounded weights the error is far larger.
        unrounded, _ = ref.normalized_error(flash, ref.mha_forward(hf_config, weights, x, mask, positions))
        assert unrounded > 10 * WEIGHT_DTYPE_MAX_NORMALIZED, f"{label}: {unrounded:.2e} vs unrounded weights"


@pytest.mark.parametrize("family", ["llama3", "deepseek-v2"])
def test_cached_forward_equals_cache_free_bfloat16(family, rng):
    hf_config, config, _ = _layer(family, "bfloat16", rng)
    hidden = hf_config["hidden_size"]
    cache = config.kv_cache(batch=2, max_tokens=64)
    tokens = [rng.uniform(-1, 1, (2, 11, hidden)).astype(np.float32)]
    outs = [config.forward_mha(tokens[0], past_key_value=cache)]
    for _ in range(4):
        tokens.append(rng.uniform(-1, 1, (2, 1, hidden)).astype(np.float32))
        outs.append(config.forward_mha(tokens[-1], past_key_value=cache))
    whole = config.forward_mha(np.concatenate(tokens, axis=1))
    _assert_close(np.concatenate(outs, axis=1), whole.astype(np.float64), f"{family} bfloat16 cached vs cache-free",
                  PAIR_MAX_NORMALIZED, PAIR_RMS_RELATIVE)


def _targets():
    return ["v8", "v16"] if _avx512() else ["v8"]


@pytest.mark.skipif(CC is None, reason="no C compiler (cc) on PATH")
@pytest.mark.parametrize("target", _targets())
@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("family", ["qwen2", "deepseek-v2"])
def test_vendored_layer(family, dtype, target, tmp_path, rng):
    hf_config = FAMILIES[family]
    config_file = tmp_path / f"{family}.json"
    config_file.write_text(json.dumps(dict(hf_config, name=family)))
    layer = _generate(["--config", str(config_file), "--target", target, "--weight-dtype", dtype], tmp_path / dtype)
    float32 = _generate(["--config", str(config_file), "--target", target], tmp_path / "float32")
    assert all(f"-{dtype}-{target}" in key for key in layer.keys if key.startswith("gemm-"))
    # Half the bytes for the panels: the float32 buffer less its biases and norms, halved, plus them.
    narrow_floats, wide_floats = layer._packed_floats(), float32._packed_floats()
    assert wide_floats * 0.5 <= narrow_floats < wide_floats * 0.56, (narrow_floats, wide_floats)
    jit = sneppx.LLMConfig(**hf_config, weight_dtype=dtype)
    weights = ref.random_state_dict(hf_config, rng, qkv_bias=jit.qkv_bias, o_bias=jit.o_bias)
    jit.load_state_dict(weights)
    layer.load(weights)
    x, mask, positions = make_inputs("explicit", 2, 29, hf_config["hidden_size"], 0, rng)
    want = ref.mha_forward(hf_config, ref.round_weights(weights, dtype), x, mask, positions)
    got = layer.forward(x, mask, positions)
    _assert_close(got, want, f"{family} {dtype} {target} aot vs reference", WEIGHT_DTYPE_MAX_NORMALIZED,
                  WEIGHT_DTYPE_RMS_RELATIVE)
    _assert_close(got, jit.forward_mha(x, mask, positions).astype(np.float64), f"{family} {dtype} aot vs jit",
                  PAIR_MAX_NORMALIZED, PAIR_RMS_RELATIVE)


def test_config_names_and_defaults(tmp_path):
    config = sneppx.LLMConfig(hidden_size=64, num_attention_heads=2)
    assert config.weight_dtype == "float32" and "weight_dtype" not in repr(config)
    narrow = sneppx.LLMConfig(hidden_size=64, num_attention_heads=2, weight_dtype="float16")
    assert narrow.weight_dtype == "float16" and "weight_dtype='float16'" in repr(narrow)
    preset = sneppx.LLMConfig.from_name("qwen2", "0.5B", weight_dtype="bfloat16")
    assert preset.weight_dtype == "bfloat16" and preset.hidden_size == 896
    assert sneppx.LLMConfig.from_name("qwen2-0.5B").weight_dtype == "float32"
    config_json = tmp_path / "config.json"
    config_json.write_text(json.dumps(dict(model_type="llama", hidden_size=64, num_attention_heads=2)))
    assert sneppx.LLMConfig.from_config_json(config_json, weight_dtype="bfloat16").weight_dtype == "bfloat16"


@pytest.mark.parametrize("value, error", [("int8", ValueError), ("bf16", ValueError), ("", ValueError),
                                          (1, TypeError), (np.float16, TypeError)])
def test_bad_weight_dtype_refused(value, error):
    with pytest.raises(error, match="weight_dtype"):
        sneppx.LLMConfig(hidden_size=64, num_attention_heads=2, weight_dtype=value)
    with pytest.raises(error, match="weight_dtype"):
        sneppx.LLMConfig.from_name("llama3", "8B", weight_dtype=value)


def test_bad_weight_dtype_from_c_struct():
    """A value the C enum lacks, set on the struct directly, is refused by the C check."""
    from sneppx import _structs as S
    from sneppx._library import lib
    import ctypes
    config = S.Config()
    assert lib.sneppx_config_from_name(b"llama3-8B", None, ctypes.byref(config)) == 0
    config.weight_dtype = 3
    assert lib.sneppx_config_validate(ctypes.byref(config)) != 0
    message = lib.sneppx_last_error().decode()
    assert "config.weight_dtype: 3 is not a weight type (float32, bfloat16, float16)" in message


def test_sneppx_gen_refuses_other_types(tmp_path):
    result = subprocess.run([sys.executable, str(SNEPPX_GEN), "--arch", "qwen2-0.5B", "--weight-dtype", "int8",
                             "-o", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 2 and "--weight-dtype: invalid choice: 'int8'" in result.stderr


def test_sneppx_gen_hand_config_weight_dtype(tmp_path):
    """The hand form (LLMConfig's keywords) takes weight_dtype by name; --weight-dtype wins."""
    config_file = tmp_path / "hand.json"
    config_file.write_text(json.dumps(dict(hidden_size=64, num_attention_heads=2, weight_dtype="float16")))
    for extra, want in (([], "float16"), (["--weight-dtype", "bfloat16"], "bfloat16")):
        out = tmp_path / want
        result = subprocess.run([sys.executable, str(SNEPPX_GEN), "--config", str(config_file), *extra,
                                 "-o", str(out)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["weight_dtype"] == want
        assert all(f"-{want}-" in key for key in manifest["keys"] if key.startswith("gemm-"))
    config_file.write_text(json.dumps(dict(hidden_size=64, num_attention_heads=2, weight_dtype="fp8")))
    result = subprocess.run([sys.executable, str(SNEPPX_GEN), "--config", str(config_file), "-o",
                             str(tmp_path / "bad")], capture_output=True, text=True)
    assert result.returncode != 0 and "weight_dtype: 'fp8' is not one of float32, bfloat16, float16" in result.stderr
