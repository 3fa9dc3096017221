"""bfloat16 compute (compute_dtype "bfloat16": the gemm_bf16dot kernels, vdpbf16ps), end to end:

- every family's small stand-in (llama3 GQA, mistral window, qwen2 bias, DeepSeek V2 MLA
  with and without q LoRA, absorbed and naive) and llama3-8B / deepseek-v2-lite at their
  real shapes, flash and SDPA, against a float64 reference in which every GEMM's input is
  rounded to bfloat16 and its weights are the rounded bfloat16 ones: what remains is the
  kernels' float32 sums, within COMPUTE_MAX_NORMALIZED = 1e-5. The GEMM inputs are the
  layer's: x (QKV, or MLA's q / q_a and kv_a), the attention output (O), and for MLA the
  normed q_a (q_b), q_nope per head (absorbed W_UK), the attention's latent output per
  head (W_UV) and the normed latent (naive kv_b). A layer that kept float32 activations
  (gemm with bfloat16 weights) misses that bound (the test checks it too);
- flash == SDPA; AOT (sneppx-gen --compute-dtype bfloat16) == JIT and == the reference;
- the config's rules: bfloat16 compute needs bfloat16 weights (ValueError naming
  compute_dtype), other values are refused naming it, the keys are gemm_bf16dot's.
Skipped, saying why, on hosts without avx512_bf16, where the layer is refused, as it is
under SNEPPX_TARGET=v8 on any host: test_config_refused_without_avx512_bf16 checks that.
"""
import json
import os
from typing import Any, Mapping

import numpy as np
import pytest

import reference as ref
import sneppx
from families import FAMILIES, make_inputs
from test_aot import CC, PAIR_MAX_NORMALIZED, PAIR_RMS_RELATIVE, _assert_close, _generate

COMPUTE_MAX_NORMALIZED = 1e-5
COMPUTE_RMS_RELATIVE = 1e-5
FAMILY_NAMES = ["llama3", "mistral", "qwen2", "deepseek-v2", "deepseek-v2-lite-like"]


def _host_has_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return "avx512_bf16" in cpuinfo.read().split()
    except OSError:
        return False


needs_bf16 = pytest.mark.skipif(not _host_has_bf16(),
                                reason="this host lacks avx512_bf16: bfloat16 compute (vdpbf16ps) cannot run")


class _Rounding:
    """The GEMM inputs' rounding in the reference, with the one ambiguity a float64
    reference has: an input the layer computes in float32 (the attention output, a
    norm, a per-head product) that lies within a hair of a bfloat16 rounding midpoint
    may round either way in the layer, changing that input by one bfloat16 step.
    record() lists such inputs (within WINDOW x their token's largest input of the
    kind, and not a float32 value already, as the given x is); flips makes given
    inputs round the other way."""
    # Measured: 2.5e-7 and 1e-6 leave the same excess (at most 2.4e-6 on the small families,
    # seeds 0-2); the slack stays local to the few inputs it names.
    WINDOW = 1e-6

    def __init__(self, record: bool = False, flips=None):
        self.point, self.ambiguous, self.record, self.flips = 0, [], record, flips or {}

    def __call__(self, a: np.ndarray) -> np.ndarray:
        value = np.asarray(a, dtype=np.float64)
        rounded = ref.round_to(value.astype(np.float32), "bfloat16").astype(np.float64)
        tokens = _token_view(value)
        if self.record:
            toward_zero = (value.astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
            away = (toward_zero.view(np.uint32) + np.uint32(0x10000)).view(np.float32)
            midpoint = _token_view((toward_zero.astype(np.float64) + away) / 2)
            scale = np.abs(tokens).max(axis=1, keepdims=True)
            near = (np.abs(tokens - midpoint) < self.WINDOW * scale) & (tokens != tokens.astype(np.float32))
            for token, element in zip(*np.nonzero(near)):
                self.ambiguous.append((self.point, int(token), int(element)))
        flips = self.flips.get(self.point)
        if flips:
            view = _token_view(rounded).copy()
            for token, element in flips:
                x = tokens[token, element]
                lo = float((np.float32(x).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32))
                hi = float((np.uint32(np.float32(lo).view(np.uint32)) + np.uint32(0x10000)).view(np.float32))
                view[token, element] = hi if view[token, element] == lo else lo
            rounded = _from_token_view(view, value.shape)
        self.point += 1
        return rounded


def _token_view(a: np.ndarray) -> np.ndarray:
    """[tokens, features] of a GEMM input, [batch, seq, f] or per head [batch, heads, seq, d]."""
    if a.ndim == 4:
        return a.transpose(0, 2, 1, 3).reshape(a.shape[0] * a.shape[2], -1)
    return a.reshape(-1, a.shape[-1])


def _from_token_view(view: np.ndarray, shape) -> np.ndarray:
    if len(shape) == 4:
        return view.reshape(shape[0], shape[2], shape[1], shape[3]).transpose(0, 2, 1, 3)
    return view.reshape(shape)


_ROUND = _Rounding()


def _bf16(a: np.ndarray) -> np.ndarray:
    """A GEMM input as the kernel sees it: float32, then rounded to bfloat16 (nearest even)."""
    return _ROUND(a)


def _linear(x: np.ndarray, weights: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    return ref.linear(_bf16(x), weights, name)


def _forward(config, w, x, mask, positions, mla_naive, rounding: _Rounding) -> np.ndarray:
    global _ROUND
    _ROUND = rounding
    if not ref.is_mla(config) or mla_naive:
        # The standard pipeline (and naive MLA) calls ref.linear once per GEMM input.
        original = ref.linear
        ref.linear = lambda a, ws, name: original(_bf16(a), ws, name)
        try:
            return ref.mha_forward(config, w, x, mask, positions)
        finally:
            ref.linear = original
    return _mla_absorbed(config, w, x, mask, positions)


def reference(config: Mapping[str, Any], weights: Mapping[str, np.ndarray], x: np.ndarray, mask, positions,
              mla_naive: bool = False):
    """The float64 forward of a bfloat16-compute layer (weights rounded to bfloat16, every
    GEMM input rounded to bfloat16, everything else in float64), and its slack: per
    output, the sum of |changes| that rounding each ambiguous input (_Rounding) the other
    way makes. A token's GEMM inputs reach only its own output row (queries, per-token
    norms and products; the keys and values enter no GEMM after attention in the absorbed
    form), so pass r flips the r-th ambiguous input of every token at once."""
    w = ref.round_weights(weights, "bfloat16")
    recording = _Rounding(record=True)
    want = _forward(config, w, x, mask, positions, mla_naive, recording)
    per_token = {}
    for point, token, element in recording.ambiguous:
        per_token.setdefault(token, []).append((point, element))
    slack = np.zeros_like(want)
    for r in range(max((len(v) for v in per_token.values()), default=0)):
        flips = {}
        for token, inputs in per_token.items():
            if r < len(inputs):
                point, element = inputs[r]
                flips.setdefault(point, []).append((token, element))
        slack += np.abs(_forward(config, w, x, mask, positions, mla_naive, _Rounding(flips=flips)) - want)
    return want, slack


def _assert_within(got, want, slack, what):
    """_assert_close on what exceeds the slack of ambiguous roundings (normalized by want)."""
    excess = np.maximum(np.abs(np.asarray(got, dtype=np.float64) - want) - slack, 0.0)
    _assert_close(want + excess, want, what, COMPUTE_MAX_NORMALIZED, COMPUTE_RMS_RELATIVE)


def _mla_absorbed(config, w, hidden_states, mask, position_ids) -> np.ndarray:
    """MLA in the absorbed form the runtime runs (runtime/forward.c): attention over the
    shared latent rows (c | k_pe), q_lat = q_nope W_UK and o = o_lat W_UV^T per head."""
    x = np.asarray(hidden_states, dtype=np.float64)
    batch, seq_len, _ = x.shape
    positions = np.broadcast_to(np.arange(seq_len), (batch, seq_len)) if position_ids is None else \
        np.asarray(position_ids, dtype=np.int64).reshape(batch, seq_len)
    inv_freq, factor = ref.rope_inv_freq(config, int(positions.max()) + 1)
    interleaved = bool(ref.field(config, "rope_interleaved", False))
    visible = ref.visible_keys(batch, seq_len, mask, 0)
    heads = int(ref.field(config, "num_attention_heads"))
    nope, rope = int(ref.field(config, "qk_nope_head_dim")), int(ref.field(config, "qk_rope_head_dim"))
    dv, rank = int(ref.field(config, "v_head_dim")), int(ref.field(config, "kv_lora_rank"))
    if ref.field(config, "q_lora_rank", 0):
        q = _linear(ref.rms_norm(_linear(x, w, "q_a_proj"), w["q_a_layernorm.weight"], ref.MLA_NORM_EPS), w,
                    "q_b_proj")
    else:
        q = _linear(x, w, "q_proj")
    q = q.reshape(batch, seq_len, heads, nope + rope).transpose(0, 2, 1, 3)
    compressed = _linear(x, w, "kv_a_proj_with_mqa")
    c = ref.rms_norm(compressed[..., :rank], w["kv_a_layernorm.weight"], ref.MLA_NORM_EPS)[:, None]
    k_pe = ref.apply_rope(compressed[:, None, :, rank:], positions, inv_freq, factor, interleaved)
    q_pe = ref.apply_rope(q[..., nope:], positions, inv_freq, factor, interleaved)
    kv_b = np.asarray(w["kv_b_proj.weight"], dtype=np.float64).reshape(heads, nope + dv, rank)
    q_lat = np.einsum("bhsn,hnr->bhsr", _bf16(q[..., :nope]), kv_b[:, :nope])
    keys = np.broadcast_to(np.concatenate([c, k_pe], axis=-1), (batch, heads, seq_len, rank + rope))
    o_lat = ref.attention(np.concatenate([q_lat, q_pe], axis=-1), keys,
                          np.broadcast_to(c, (batch, heads, seq_len, rank)), ref.softmax_scale(config), visible,
                          mask)
    o = np.einsum("bhsr,hdr->bhsd", _bf16(o_lat), kv_b[:, nope:])
    return _linear(o.transpose(0, 2, 1, 3).reshape(batch, seq_len, heads * dv), w, "o_proj")


def _layer(hf_config, rng, **extra):
    config = sneppx.LLMConfig(**hf_config, weight_dtype="bfloat16", compute_dtype="bfloat16", **extra)
    weights = ref.random_state_dict(hf_config, rng, qkv_bias=config.qkv_bias, o_bias=config.o_bias)
    config.load_state_dict(weights)
    return config, weights


def _check_layer(label, hf_config, config, weights, cases, rng, mla_naive=False):
    window = int(hf_config.get("sliding_window") or 0)
    float_acts = sneppx.LLMConfig(**hf_config, weight_dtype="bfloat16", mla_naive=mla_naive)
    float_acts.load_state_dict(weights)
    for kind, batch, seq_len in cases:
        x, mask, positions = make_inputs(kind, batch, seq_len, hf_config["hidden_size"], window, rng)
        want, slack = reference(hf_config, weights, x, mask, positions, mla_naive)
        config.use_flash_attn = True
        flash = config.forward_mha(x, mask, positions)
        config.use_flash_attn = False
        sdpa = config.forward_mha(x, mask, positions)
        what = f"{label} {kind} b{batch} s{seq_len}"
        _assert_within(flash, want, slack, f"{what} flash vs reference")
        _assert_within(sdpa, want, slack, f"{what} sdpa vs reference")
        # Each may round an ambiguous input its own way: both lie within the slack of want.
        pair = np.maximum(np.abs(flash - sdpa.astype(np.float64)) - 2 * slack, 0.0)
        _assert_close(want + pair, want, f"{what} flash vs sdpa", PAIR_MAX_NORMALIZED, PAIR_RMS_RELATIVE)
        # The bound tells the computes apart: float32 activations miss it, slack and all.
        other = np.maximum(np.abs(float_acts.forward_mha(x, mask, positions) - want) - slack, 0.0)
        other_max, _ = ref.normalized_error(want + other, want)
        assert other_max > 10 * COMPUTE_MAX_NORMALIZED, f"{what}: float32 activations {other_max:.2e} off"


@needs_bf16
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_small_families_match_reference(family, rng):
    hf_config = FAMILIES[family]
    config, weights = _layer(hf_config, rng)
    assert config.compute_dtype == "bfloat16"
    gemms = [key for key in config.kernel_keys if key.startswith("gemm")]
    assert gemms and all(key.startswith("gemm_bf16dot-") for key in gemms), config.kernel_keys
    _check_layer(family, hf_config, config, weights, (("none", 2, 37), ("explicit", 1, 21), ("none", 1, 1)), rng)


PRESET_SHAPES = {
    "llama3-8B": dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
                      attention_bias=False, max_position_embeddings=8192),
    "deepseek-v2-lite": dict(hidden_size=2048, num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512,
                             qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, rope_theta=10000.0,
                             rope_interleaved=True, attention_bias=False),
}


@needs_bf16
@pytest.mark.parametrize("name", sorted(PRESET_SHAPES))
def test_preset_shapes_match_reference(name, rng):
    hf_config = PRESET_SHAPES[name]
    config, weights = _layer(hf_config, rng)
    _check_layer(name, hf_config, config, weights, (("none", 1, 5), ("none", 2, 3)), rng)


@needs_bf16
@pytest.mark.parametrize("family", ["llama3", "deepseek-v2"])
def test_cached_forward_equals_cache_free(family, rng):
    """The cached forward (prefill, then decode steps of one token: the 1-row GEMMs) runs
    the same kernels; rows differ only where an ambiguous input rounds another way."""
    hf_config = FAMILIES[family]
    config, weights = _layer(hf_config, rng)
    hidden = hf_config["hidden_size"]
    cache = config.kv_cache(batch=2, max_tokens=64)
    tokens = [rng.uniform(-1, 1, (2, 11, hidden)).astype(np.float32)]
    outs = [config.forward_mha(tokens[0], past_key_value=cache)]
    for _ in range(4):
        tokens.append(rng.uniform(-1, 1, (2, 1, hidden)).astype(np.float32))
        outs.append(config.forward_mha(tokens[-1], past_key_value=cache))
    x = np.concatenate(tokens, axis=1)
    want, slack = reference(hf_config, weights, x, None, None)
    _assert_within(np.concatenate(outs, axis=1), want, slack, f"{family} cached vs reference")
    _assert_within(config.forward_mha(x), want, slack, f"{family} cache-free vs reference")


@needs_bf16
def test_subnormal_weights_count_as_zero():
    """What config.h and docs/API.md say of bfloat16 compute: vdpbf16ps reads bfloat16
    subnormals (v_proj's weights near 1e-39 here) as zero, whatever MXCSR, so the layer's
    values and output are zero, where float32 compute over the same bfloat16 weights keeps
    them (o_proj's 1e38 brings them back to the reference's size)."""
    hf_config = dict(hidden_size=64, num_attention_heads=1, num_key_value_heads=1, head_dim=16, bias=False)
    weights = ref.random_state_dict(hf_config, np.random.default_rng(5), qkv_bias=False, o_bias=False)
    weights["v_proj.weight"] *= np.float32(1e-39)
    weights["o_proj.weight"] *= np.float32(1e38)
    x = np.random.default_rng(6).standard_normal((1, 3, 64)).astype(np.float32)
    want = ref.mha_forward(hf_config, ref.round_weights(weights, "bfloat16"), x)
    for compute, zero in (("float32", False), ("bfloat16", True)):
        config = sneppx.LLMConfig(**hf_config, weight_dtype="bfloat16", compute_dtype=compute)
        config.load_state_dict(weights)
        got = config.forward_mha(x)
        assert np.all(got == 0) if zero else ref.normalized_error(got, want)[0] < 1e-2, (compute, got[0, 0, :4])


@needs_bf16
@pytest.mark.skipif(CC is None, reason="no C compiler (cc) on PATH")
@pytest.mark.parametrize("target", ["v8", "v16"])
@pytest.mark.parametrize("family", ["qwen2", "deepseek-v2"])
def test_vendored_layer(family, target, tmp_path, rng):
    """v16 runs vdpbf16ps; v8 the same sums in float32 FMAs (a portable build)."""
    hf_config = FAMILIES[family]
    config_file = tmp_path / f"{family}.json"
    config_file.write_text(json.dumps(dict(hf_config, name=family)))
    layer = _generate(["--config", str(config_file), "--target", target, "--weight-dtype", "bfloat16",
                       "--compute-dtype", "bfloat16"], tmp_path / "out")
    gemms = [key for key in layer.keys if key.startswith("gemm")]
    assert gemms and all(key.startswith("gemm_bf16dot-") and key.endswith(target) for key in gemms), layer.keys
    jit, weights = _layer(hf_config, rng)
    layer.load(weights)
    x, mask, positions = make_inputs("explicit", 2, 29, hf_config["hidden_size"], 0, rng)
    want, slack = reference(hf_config, weights, x, mask, positions)
    got = layer.forward(x, mask, positions)
    _assert_within(got, want, slack, f"{family} {target} aot vs reference")
    pair = np.maximum(np.abs(got - jit.forward_mha(x, mask, positions).astype(np.float64)) - 2 * slack, 0.0)
    _assert_close(want + pair, want, f"{family} {target} aot vs jit", PAIR_MAX_NORMALIZED, PAIR_RMS_RELATIVE)


def test_config_names_and_defaults():
    config = sneppx.LLMConfig(hidden_size=64, num_attention_heads=2)
    assert config.compute_dtype == "float32" and "compute_dtype" not in repr(config)
    assert sneppx.LLMConfig.from_name("qwen2-0.5B", weight_dtype="bfloat16").compute_dtype == "float32"


@needs_bf16
def test_config_bfloat16_compute_named():
    config = sneppx.LLMConfig(hidden_size=64, num_attention_heads=2, weight_dtype="bfloat16",
                              compute_dtype="bfloat16")
    assert config.compute_dtype == "bfloat16" and "compute_dtype='bfloat16'" in repr(config)
    preset = sneppx.LLMConfig.from_name("qwen2", "0.5B", weight_dtype="bfloat16", compute_dtype="bfloat16")
    assert preset.compute_dtype == "bfloat16"
    config.forward_mha(np.ones((1, 3, 64), dtype=np.float32))
    assert [k for k in config.kernel_keys if k.startswith("gemm")] == \
        ["gemm_bf16dot-k64-n192-bias1-v16", "gemm_bf16dot-k64-n64-bias1-v16"]


@pytest.mark.parametrize("weight_dtype", ["float32", "float16"])
def test_bfloat16_compute_needs_bfloat16_weights(weight_dtype):
    """Checked before the host: the same message on every host."""
    want = f"config.compute_dtype: bfloat16 needs weight_dtype bfloat16, not {weight_dtype}"
    with pytest.raises(ValueError, match=want):
        sneppx.LLMConfig(hidden_size=64, num_attention_heads=2, weight_dtype=weight_dtype, compute_dtype="bfloat16")
    with pytest.raises(ValueError, match=want):
        sneppx.LLMConfig.from_name("llama3", "8B", weight_dtype=weight_dtype, compute_dtype="bfloat16")


@pytest.mark.parametrize("value, error", [("float16", ValueError), ("int8", ValueError), ("bf16", ValueError),
                                          (1, TypeError)])
def test_bad_compute_dtype_refused(value, error):
    with pytest.raises(error, match="compute_dtype"):
        sneppx.LLMConfig(hidden_size=64, num_attention_heads=2, weight_dtype="bfloat16", compute_dtype=value)
    with pytest.raises(error, match="compute_dtype"):
        sneppx.LLMConfig.from_name("llama3", "8B", weight_dtype="bfloat16", compute_dtype=value)


def test_config_refused_without_avx512_bf16():
    """Refused where the target the process runs lacks avx512_bf16: v8, which every host
    here can run (SNEPPX_TARGET, in a child: the target is chosen once per process), and
    the message names it, since on an AVX-512 host 'this host lacks it' would be untrue."""
    import subprocess
    import sys
    code = ("import sneppx\n"
            "try:\n"
            "    sneppx.LLMConfig(hidden_size=64, num_attention_heads=2, weight_dtype='bfloat16',\n"
            "                     compute_dtype='bfloat16')\n"
            "except sneppx.UnsupportedError as error:\n"
            "    print(error)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "SNEPPX_TARGET": "v8"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ("config.compute_dtype: bfloat16 needs a host with avx512_bf16 (vdpbf16ps), "
                                     "which this process's CPU features (target v8) lack")


def test_sneppx_gen_refusals(tmp_path):
    import subprocess
    import sys
    from test_aot import SNEPPX_GEN
    for args, message in ((["--compute-dtype", "bfloat16"],
                           "--compute-dtype bfloat16 needs bfloat16 weights (--weight-dtype bfloat16), not float32"),
                          (["--weight-dtype", "bfloat16", "--compute-dtype", "float16"],
                           "--compute-dtype: invalid choice: 'float16'")):
        result = subprocess.run([sys.executable, str(SNEPPX_GEN), "--arch", "qwen2-0.5B", *args, "-o",
                                 str(tmp_path)], capture_output=True, text=True)
        assert result.returncode == 2 and message in result.stderr, result.stderr
    config_file = tmp_path / "hand.json"
    config_file.write_text(json.dumps(dict(hidden_size=64, num_attention_heads=2, weight_dtype="bfloat16",
                                           compute_dtype="bfloat16")))
    result = subprocess.run([sys.executable, str(SNEPPX_GEN), "--config", str(config_file), "-o",
                             str(tmp_path / "hand")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    # The config's bfloat16 compute under --weight-dtype float32: the file's compute_dtype and
    # the option are named, not a --compute-dtype nobody gave.
    result = subprocess.run([sys.executable, str(SNEPPX_GEN), "--config", str(config_file), "--weight-dtype",
                             "float32", "-o", str(tmp_path / "refused")], capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr == (
        f"sneppx-gen: {config_file}: compute_dtype bfloat16 needs bfloat16 weights (--weight-dtype bfloat16), "
        "not --weight-dtype float32\n"), result.stderr
    assert not (tmp_path / "refused").exists()
    manifest = json.loads((tmp_path / "hand" / "manifest.json").read_text())
    assert manifest["compute_dtype"] == "bfloat16"
    gemm_keys = [key for key in manifest["keys"] if key.startswith("gemm")]
    assert gemm_keys and all(key.startswith("gemm_bf16dot-") for key in gemm_keys), manifest["keys"]
