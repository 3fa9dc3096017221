"""Narrow weight storage (weight_dtype bfloat16 / float16 / int8), end to end:

- every family's small stand-in (llama3 GQA, mistral window, qwen2 bias, DeepSeek V2 MLA
  with and without q LoRA, and for int8 a layer whose GEMMs' k are not multiples of the
  32-row group) through the runtime, flash and SDPA, against the float64 reference
  computed on the SAME rounded weights (reference.round_weights: projection matrices
  rounded, or int8-quantized and dequantized, biases and norm weights not). What remains
  is float32 accumulation, so the bound is WEIGHT_DTYPE_MAX_NORMALIZED = 1e-5 (measured:
  3-7e-7 on these configs, float32 weights included), 10x below the budget of the float32
  tests: a layer that kept float32 panels misses it by 20-400x (the test checks that too,
  on the unrounded reference). MLA's absorbed W_UK^T / W_UV are a transpose and a slice
  of kv_b_proj: the same rounded kv_b_proj is what the absorbed layer holds for an
  element type; int8 groups run along each absorbed GEMM's own k (round_weights(...,
  config));
- int8 on the presets' shapes (llama3-8B, deepseek-v2-lite) at a few tokens, the same way;
- flash == SDPA within the float32 pair budget, for each type;
- the cached forward (sneppx_layer_forward_cached, a prefill then decode steps) of a
  bfloat16 and an int8 layer equals its cache-free forward;
- int8's _pack (a GEMM rendered alone by sneppx-gen, compiled with cc) bit for bit
  against reference.quantize_int8, numpy's quantizer: an all-zero group, one large
  value, ties, a negative maximum, tiny and subnormal weights, a short last group,
  padding columns, a non-finite group;
- the vendored layer (sneppx-gen --weight-dtype) for both targets (v8 and, on an AVX-512
  host, v16) against the same reference, its _packed_floats() half the float32 one's
  panels (int8: 9/32 and the short groups' scales), and AOT == JIT;
- LLMConfig(weight_dtype=...), from_name(..., weight_dtype=...), from_config_json
  overrides; bad names refused naming weight_dtype; sneppx-gen --weight-dtype refuses others.
"""
# ctest: 2 shards (tests/CMakeLists.txt), each under a minute on 2 cores
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import reference as ref
import sneppx
from families import FAMILIES, make_inputs, preset_config
from test_aot import CC, PAIR_MAX_NORMALIZED, PAIR_RMS_RELATIVE, SNEPPX_GEN, _assert_close, _generate

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gen"))
from sneppx_gen.targets import cpuinfo_flags  # noqa: E402

WEIGHT_DTYPE_MAX_NORMALIZED = 1e-5
WEIGHT_DTYPE_RMS_RELATIVE = 1e-5
NARROW = ["bfloat16", "float16", "int8"]
FAMILY_NAMES = ["llama3", "mistral", "qwen2", "deepseek-v2", "deepseek-v2-lite-like"]
# GEMM k of 72 (q|k|v: 2 groups and 8 rows) and 48 (o: 1 group and 16 rows).
SHORT_GROUPS = dict(hidden_size=72, num_attention_heads=3, num_key_value_heads=1, head_dim=16, rope_theta=10000.0,
                    qkv_bias=True, o_bias=True)
# Panel bytes per float32 panel byte, less what the groups' scales add at small k.
PACKED_RATIO = {"bfloat16": (0.5, 0.56), "float16": (0.5, 0.56), "int8": (9 / 32, 0.36)}


def _layer(family: str, dtype: str, rng):
    hf_config = SHORT_GROUPS if family == "short-groups" else FAMILIES[family]
    config = sneppx.LLMConfig(**hf_config, weight_dtype=dtype)
    weights = ref.random_state_dict(hf_config, rng, qkv_bias=config.qkv_bias, o_bias=config.o_bias)
    config.load_state_dict(weights)
    return hf_config, config, weights


@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("family", FAMILY_NAMES + ["short-groups"])
def test_runtime_matches_reference_on_rounded_weights(family, dtype, rng):
    hf_config, config, weights = _layer(family, dtype, rng)
    assert config.weight_dtype == dtype
    assert all(f"-{dtype}-" in key for key in config.kernel_keys if key.startswith("gemm-"))
    window = int(hf_config.get("sliding_window") or 0)
    for kind, batch, seq_len in (("none", 2, 37), ("explicit", 1, 21)):
        x, mask, positions = make_inputs(kind, batch, seq_len, hf_config["hidden_size"], window, rng)
        want = ref.mha_forward(hf_config, ref.round_weights(weights, dtype, hf_config), x, mask, positions)
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


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
@pytest.mark.parametrize("family", ["llama3", "deepseek-v2"])
def test_cached_forward_equals_cache_free(family, dtype, rng):
    hf_config, config, _ = _layer(family, dtype, rng)
    hidden = hf_config["hidden_size"]
    cache = config.kv_cache(batch=2, max_tokens=64)
    tokens = [rng.uniform(-1, 1, (2, 11, hidden)).astype(np.float32)]
    outs = [config.forward_mha(tokens[0], past_key_value=cache)]
    for _ in range(4):
        tokens.append(rng.uniform(-1, 1, (2, 1, hidden)).astype(np.float32))
        outs.append(config.forward_mha(tokens[-1], past_key_value=cache))
    whole = config.forward_mha(np.concatenate(tokens, axis=1))
    _assert_close(np.concatenate(outs, axis=1), whole.astype(np.float64), f"{family} {dtype} cached vs cache-free",
                  PAIR_MAX_NORMALIZED, PAIR_RMS_RELATIVE)


def _targets():
    return ["v8", "v16"] if "avx512f" in cpuinfo_flags() else ["v8"]


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
    assert all(f"-{dtype}-kc" in key and key.endswith(f"-{target}") for key in layer.keys if key.startswith("gemm-"))
    # Half the bytes for the panels (int8: 9/32, more where short groups' scales weigh more):
    # the float32 buffer less its biases and norms, scaled, plus them.
    narrow_floats, wide_floats = layer._packed_floats(), float32._packed_floats()
    low, high = PACKED_RATIO[dtype]
    assert wide_floats * low <= narrow_floats < wide_floats * high, (narrow_floats, wide_floats)
    jit = sneppx.LLMConfig(**hf_config, weight_dtype=dtype)
    weights = ref.random_state_dict(hf_config, rng, qkv_bias=jit.qkv_bias, o_bias=jit.o_bias)
    jit.load_state_dict(weights)
    layer.load(weights)
    x, mask, positions = make_inputs("explicit", 2, 29, hf_config["hidden_size"], 0, rng)
    want = ref.mha_forward(hf_config, ref.round_weights(weights, dtype, hf_config), x, mask, positions)
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


@pytest.mark.parametrize("value, error", [("int4", ValueError), ("bf16", ValueError), ("", ValueError),
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
    config.weight_dtype = 4
    assert lib.sneppx_config_validate(ctypes.byref(config)) != 0
    message = lib.sneppx_last_error().decode()
    assert "config.weight_dtype: 4 is not a weight type (float32, bfloat16, float16, int8)" in message


def test_sneppx_gen_refuses_other_types(tmp_path):
    result = subprocess.run([sys.executable, str(SNEPPX_GEN), "--arch", "qwen2-0.5B", "--weight-dtype", "int4",
                             "-o", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 2 and "--weight-dtype: invalid choice: 'int4'" in result.stderr


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
    assert result.returncode != 0 and "weight_dtype: 'fp8' is not one of float32, bfloat16, float16, int8" in result.stderr


@pytest.mark.parametrize("name", ["llama3-8B", "deepseek-v2-lite"])
def test_int8_presets_match_reference(name, rng):
    """int8 on the presets' shapes (k 4096 and 2048, MLA's absorbed k 128 and 512)."""
    config = sneppx.LLMConfig.from_name(name, weight_dtype="int8")
    # The reference's config is the published one (gen/archs.json), not the library's copy.
    hf_config = preset_config(name)
    weights = ref.random_state_dict(hf_config, rng, qkv_bias=bool(hf_config["qkv_bias"]),
                                    o_bias=bool(hf_config["o_bias"]))
    config.load_state_dict(weights)
    x, mask, positions = make_inputs("left-padding", 2, 5, config.hidden_size, 0, rng)
    want = ref.mha_forward(hf_config, ref.round_weights(weights, "int8", hf_config), x, mask, positions)
    outputs = {}
    for flash in (True, False):
        config.use_flash_attn = flash
        outputs[flash] = config.forward_mha(x, mask, positions)
        _assert_close(outputs[flash], want, f"{name} int8 {'flash' if flash else 'sdpa'} vs reference",
                      WEIGHT_DTYPE_MAX_NORMALIZED, WEIGHT_DTYPE_RMS_RELATIVE)
    _assert_close(outputs[True], outputs[False].astype(np.float64), f"{name} int8 flash vs sdpa",
                  PAIR_MAX_NORMALIZED, PAIR_RMS_RELATIVE)


def _int8_cases(k: int) -> np.ndarray:
    """HF rows [n, k] (k = 45: a group of 32 and one of 13) of the quantizer's edge cases."""
    rows = np.zeros((8, k), np.float32)
    rows[1, 7] = 1000.0                                   # one large value: the rest quantize to 0
    rows[1, :32] += np.float32(1e-3) * (np.arange(32) % 5 - 2)
    rows[2, 32:] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5, 3.5, 127.0, 0.0, -0.0, 4.5]  # scale 1: ties
    rows[2, :32] = np.linspace(-63.5, 63.5, 32)           # scale 0.5: halves are ties too
    rows[3] = np.sin(0.7 * np.arange(k) + 0.3) * 0.37     # spread values; a negative maximum next
    rows[3, 40] = -3.0
    rows[4] = np.float32(1e-39) * (np.arange(k) - 20)     # subnormal weights, subnormal scales
    rows[5] = np.float32(3e38) * np.cos(np.arange(k))     # near float32's largest
    rows[6, 3] = np.inf                                   # a non-finite group: scale NaN, q 0
    rows[6, 32:] = 0.25 * np.arange(13)
    rows[7, :2] = [1.0, 0.035433072596788406]            # 4.50000024 steps: float32 makes it a tie
    return rows


@pytest.mark.skipif(CC is None, reason="no C compiler (cc) on PATH")
def test_int8_pack_matches_numpy_quantizer(tmp_path):
    """_pack of an int8 GEMM (v8, which any x86-64 runs; both targets share the code) against
    reference.quantize_int8 bit for bit, scales and values, padding columns zero."""
    k, n, nr, group = 45, 8, 16, ref.INT8_GROUP
    source = tmp_path / "gemm.c"
    subprocess.run([sys.executable, str(SNEPPX_GEN), "build", "aot-source", "--family", "gemm", "--target", "v8",
                    "--value", f"k={k}", "--value", f"n={n}", "--value", "bias=0", "--value", "weight_type=int8",
                    "-o", str(source)], check=True)
    # The key's cache blocking (kc, mc) is the target's default for int8: read it off the source.
    entry = re.search(rf"sneppx_gemm_k{k}_n{n}_bias0_int8_kc\d+_mc\d+_v8_pack", source.read_text()).group(0)
    (tmp_path / "shim.c").write_text(f"""#include "gemm.c"
#include <string.h>
int64_t packed_bytes(void) {{ return sneppx_gemm_packed_bytes({k}, {n}, {nr}, SNEPPX_GEMM_INT8); }}
void pack(const float *src, void *dst)
{{
    struct sneppx_args args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.abi_version = SNEPPX_ABI_VERSION;
    args.col_begin = 0;
    args.col_end = {n};
    args.src = src;
    args.src_stride = {k};
    args.dst = dst;
    {entry}(&args);
}}
""")
    library = tmp_path / "shim.so"
    subprocess.run([CC, "-std=c11", "-O2", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror", "-o", str(library),
                    str(tmp_path / "shim.c")], check=True)
    import ctypes
    lib = ctypes.CDLL(str(library))
    lib.packed_bytes.restype = ctypes.c_int64
    bytes_ = lib.packed_bytes()
    groups = -(-k // group)
    assert bytes_ == groups * nr * 4 + k * nr
    hf = _int8_cases(k)
    packed = np.full(bytes_, 0xAB, np.uint8)
    lib.pack(hf.ctypes.data_as(ctypes.c_void_p), packed.ctypes.data_as(ctypes.c_void_p))
    want_q, want_scales = ref.quantize_int8(hf)
    got_scales = np.zeros((nr, groups), np.float32)
    got_q = np.zeros((nr, k), np.int8)
    offset = 0
    for g in range(groups):
        rows = min(group, k - g * group)
        got_scales[:, g] = packed[offset:offset + nr * 4].view(np.float32)
        offset += nr * 4
        got_q[:, g * group:g * group + rows] = packed[offset:offset + rows * nr].view(np.int8).reshape(rows, nr).T
        offset += rows * nr
    assert offset == bytes_
    np.testing.assert_array_equal(got_scales[:n].view(np.uint32), want_scales.view(np.uint32))
    np.testing.assert_array_equal(got_q[:n], want_q)
    assert not got_scales[n:].any() and not got_q[n:].any(), "padding columns"
    # The cases say what they test: scales 0, 1000/127, 1 and 0.5 as written, ties to even.
    assert want_scales[0].tolist() == [0.0, 0.0] and want_scales[1, 0] == np.float32(1000) / np.float32(127)
    assert want_q[1, 7] == 127 and not want_q[1, :7].any() and want_q[3, 40] == -127
    assert want_scales[2].tolist() == [0.5, 1.0]
    assert want_q[2, 32:].tolist() == [0, 2, 2, 0, -2, -2, 126, -126, 4, 127, 0, 0, 4]
    assert want_q[2, :32].tolist() == [int(v) for v in np.rint(np.linspace(-127, 127, 32))]
    assert np.isnan(want_scales[6, 0]) and not want_q[6, :32].any() and want_scales[6, 1] == np.float32(3) / np.float32(127)
    assert want_scales[4, 0] > 0 and want_scales[4, 0] < np.finfo(np.float32).tiny
    # q rounds the float32 quotient w / scale, as documented: 4.5 exactly here, so 4 (ties to
    # even), where the exact quotient (float64) is 4.50000024 and would round to 5.
    exact = float(hf[7, 1]) / float(want_scales[7, 0])
    assert np.float32(hf[7, 1] / want_scales[7, 0]) == 4.5 and 4.5 < exact < 4.5 + 1e-6
    assert got_q[7, 1] == 4
