"""Numerics of the Python API against the float64 numpy reference (reference.py).

Per architecture family: a small hand config with the family's features (GQA
ratio, bias, RoPE variant, sliding window, MLA) and the family's preset shapes at
a short sequence, weights through load_state_dict, masks None / explicit /
left padding / one for all sequences, irregular position_ids, flash and SDPA. Thresholds: reference.FP32_MAX_NORMALIZED and
FP32_RMS_RELATIVE (fp32 kernels vs float64; justified in
tests/support/test_forward_case.h); flash vs SDPA 5e-5 / 1e-5.
"""

import numpy as np
import pytest

import reference as ref
import sneppx
from decode_numerics import process_target
from families import FAMILIES, MASKS, make_inputs, preset_config

PAIR_MAX_NORMALIZED = 5e-5
PAIR_RMS_RELATIVE = 1e-5

# One preset per family at a short sequence (random weights; the 70B+ presets are
# covered by tests/test_mha_forward.c on synthetic weights).
PRESETS = ["llama2-7B", "llama3-8B", "llama3.1-8B", "mistral-7B", "mistral-7B-v0.3", "qwen2-0.5B",
           "qwen2-1.5B", "deepseek-v2-lite"]

def _assert_close(got, want, what, max_normalized=ref.FP32_MAX_NORMALIZED, rms_relative=ref.FP32_RMS_RELATIVE):
    err_max, err_rms = ref.normalized_error(got, want)
    assert err_max <= max_normalized and err_rms <= rms_relative, (
        f"{what}: max-normalized {err_max:.3e} (limit {max_normalized:.0e}), "
        f"RMS-relative {err_rms:.3e} (limit {rms_relative:.0e})")


def _check_forward(cfg, hf_config, weights, x, mask, positions, what):
    want = ref.mha_forward(hf_config, weights, x, mask, positions)
    outputs = {}
    for flash in (True, False):
        cfg.use_flash_attn = flash
        out = cfg.forward_mha(x, mask, positions)
        assert out.shape == x.shape and out.dtype == np.float32
        _assert_close(out, want, f"{what} {'flash' if flash else 'sdpa'} vs reference")
        outputs[flash] = out
    _assert_close(outputs[True], outputs[False].astype(np.float64), f"{what} flash vs sdpa",
                  PAIR_MAX_NORMALIZED, PAIR_RMS_RELATIVE)


@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_against_reference(family, mask_kind, rng):
    hf_config = FAMILIES[family]
    cfg = sneppx.LLMConfig(**hf_config)
    weights = ref.random_state_dict(hf_config, rng, qkv_bias=cfg.qkv_bias, o_bias=cfg.o_bias)
    cfg.load_state_dict(weights)
    for seq_len in (1, 23, 70):
        x, mask, positions = make_inputs(mask_kind, 2, seq_len, cfg.hidden_size, hf_config.get("sliding_window", 0),
                                         rng)
        _check_forward(cfg, hf_config, weights, x, mask, positions, f"{family} {mask_kind} s{seq_len}")


def test_kernels_are_the_targets(rng):
    """Every kernel is the host's target's, or SNEPPX_TARGET's when set (ctest
    pytest_test_numerics_v8 runs the families above with AVX2 kernels on a wider host)."""
    cfg = sneppx.LLMConfig(**FAMILIES["llama3"])
    cfg.forward_mha(rng.standard_normal((1, 3, cfg.hidden_size)))
    want = process_target().name
    assert cfg.kernel_keys and all(key.endswith(f"-{want}") for key in cfg.kernel_keys), cfg.kernel_keys


@pytest.mark.parametrize("name", PRESETS)
def test_preset_against_reference(name, rng):
    cfg = sneppx.LLMConfig.from_name(name)
    # The reference's config is the published one (gen/archs.json), not the library's copy.
    hf_config = preset_config(name)
    weights = ref.random_state_dict(hf_config, rng, qkv_bias=bool(hf_config["qkv_bias"]),
                                    o_bias=bool(hf_config["o_bias"]))
    cfg.load_state_dict(weights)
    x, mask, positions = make_inputs("left-padding", 2, 6, cfg.hidden_size, hf_config.get("sliding_window") or 0, rng)
    _check_forward(cfg, hf_config, weights, x, mask, positions, name)


def test_reference_reads_preset_attributes():
    """The reference sees the published values through LLMConfig's attributes."""
    cfg = sneppx.LLMConfig.from_name("llama3.1", "8B")
    inv_freq, factor = ref.rope_inv_freq(cfg)
    assert ref.head_dim(cfg) == 128 and ref.rotary_dim(cfg) == 128 and factor == 1.0
    unscaled = 500000.0 ** (-np.arange(64) / 64.0)
    np.testing.assert_allclose(inv_freq[:29], unscaled[:29], rtol=1e-14)
    np.testing.assert_allclose(inv_freq[35:], unscaled[35:] / 8.0, rtol=1e-14)


@pytest.mark.parametrize("rope_scaling", [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
], ids=["linear", "dynamic", "yarn"])
def test_rope_scaling_types(rope_scaling, rng):
    """Dynamic NTK with positions past max_position_embeddings (40): its base grows."""
    context = 40 if rope_scaling["rope_type"] == "dynamic" else 4096
    hf_config = dict(FAMILIES["llama3"], rope_scaling=rope_scaling, max_position_embeddings=context)
    cfg = sneppx.LLMConfig(**hf_config)
    weights = ref.random_state_dict(hf_config, rng, qkv_bias=False, o_bias=False)
    cfg.load_state_dict(weights)
    for kind in MASKS:
        x, mask, positions = make_inputs(kind, 2, 64, cfg.hidden_size, 0, rng)
        _check_forward(cfg, hf_config, weights, x, mask, positions, f"{rope_scaling['rope_type']} {kind}")


# Static NTK's exponent uses the rotary dim: partial rotary and MLA rotate fewer dims than head_dim.
EXTENDED = {
    "llama2": (dict(FAMILIES["llama2"], max_position_embeddings=64), 2048),
    "partial-rotary": (dict(FAMILIES["llama3"], partial_rotary_factor=0.25, max_position_embeddings=64), 2048),
    "mla-yarn": (FAMILIES["deepseek-v2"], 4096),
    "mla": (dict(FAMILIES["deepseek-v2-lite-like"], max_position_embeddings=64), 2048),
}


@pytest.mark.parametrize("name", list(EXTENDED))
def test_extend_context_static_ntk(name, rng):
    hf_config, n = EXTENDED[name]
    cfg = sneppx.LLMConfig(**hf_config)
    # The explicit inputs' positions (up to ~1060) stay inside the extended context.
    cfg.extend_context(n)
    extended = ref.extend_context(hf_config, n)
    assert cfg.max_position_embeddings == n
    assert cfg.rope_theta == pytest.approx(extended["rope_theta"], rel=1e-12)
    weights = ref.random_state_dict(hf_config, rng, qkv_bias=cfg.qkv_bias, o_bias=cfg.o_bias)
    cfg.load_state_dict(weights)
    x, mask, positions = make_inputs("explicit", 2, 40, cfg.hidden_size, 0, rng)
    _check_forward(cfg, extended, weights, x, mask, positions, f"{name} extend_context -> {n}")


@pytest.mark.parametrize("layout", ["partial", "interleaved"])
def test_rope_layouts(layout, rng):
    extra = {"partial_rotary_factor": 0.5} if layout == "partial" else {"rope_interleaved": True}
    hf_config = dict(FAMILIES["llama3"], **extra)
    cfg = sneppx.LLMConfig(**hf_config)
    weights = ref.random_state_dict(hf_config, rng, qkv_bias=False, o_bias=False)
    cfg.load_state_dict(weights)
    x, mask, positions = make_inputs("explicit", 2, 33, cfg.hidden_size, 0, rng)
    _check_forward(cfg, hf_config, weights, x, mask, positions, layout)


@pytest.mark.parametrize("naive", [False, True], ids=["absorbed", "naive"])
def test_mla_forms(naive, rng):
    hf_config = FAMILIES["deepseek-v2"]
    cfg = sneppx.LLMConfig(**hf_config)
    weights = ref.random_state_dict(hf_config, rng, qkv_bias=False, o_bias=False)
    cfg.load_state_dict(weights)
    cfg.mla_naive = naive
    x, mask, positions = make_inputs("left-padding", 2, 40, cfg.hidden_size, 0, rng)
    _check_forward(cfg, hf_config, weights, x, mask, positions, "mla naive" if naive else "mla absorbed")


def test_mla_config_pairs_rope_dims_as_deepseek(rng):
    """Without rope_interleaved, an MLA config rotates (2i, 2i+1) pairs, as DeepSeek's
    weights and from_config_json do; rotate_half here was 18-46% off the reference."""
    hf_config = FAMILIES["deepseek-v2-lite-like"]
    cfg = sneppx.LLMConfig(**{key: value for key, value in hf_config.items() if key != "rope_interleaved"})
    assert cfg.rope_interleaved
    assert not sneppx.LLMConfig(**hf_config | {"rope_interleaved": False}).rope_interleaved
    assert not sneppx.LLMConfig(**FAMILIES["mistral"]).rope_interleaved
    weights = ref.random_state_dict(hf_config, rng, qkv_bias=False, o_bias=False)
    cfg.load_state_dict(weights)
    x, mask, positions = make_inputs("left-padding", 2, 24, cfg.hidden_size, 0, rng)
    _check_forward(cfg, hf_config, weights, x, mask, positions, "mla default pairing")


@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("family", ["llama3", "mistral", "deepseek-v2"])
def test_non_finite_token_stays_in_the_rows_that_see_it(family, mask_kind, rng):
    """NaN or Inf in one token's hidden state: every row that cannot see that token
    (later tokens, outside the window, masked) is finite and matches the reference,
    flash and SDPA alike. Flash used to spread it to every row of the token's
    K/V tile (NaN at token 10 of 20 gave 20 NaN rows, not 10)."""
    hf_config = FAMILIES[family]
    cfg = sneppx.LLMConfig(**hf_config)
    weights = ref.random_state_dict(hf_config, rng, qkv_bias=cfg.qkv_bias, o_bias=cfg.o_bias)
    cfg.load_state_dict(weights)
    window = int(hf_config.get("sliding_window", 0))
    seq_len = 70
    for token, value in ((10, np.nan), (69, np.inf), (0, np.nan), (40, -np.inf)):
        x, mask, positions = make_inputs(mask_kind, 2, seq_len, cfg.hidden_size, window, rng)
        x[:, token, 5] = value
        # [b, s]: row sees token (a broadcast mask's one plane serves every sequence)
        visible = np.broadcast_to(ref.visible_keys(2, seq_len, mask, window), (2, 1, seq_len, seq_len))[:, 0, :, token]
        blind = ~visible
        blind[:, token] = False                                                       # its own query is poisoned
        if not blind.any():
            continue  # token 0 without a mask: every row sees it
        with np.errstate(invalid="ignore", over="ignore"):   # NaN / Inf in the reference's poisoned rows
            want = ref.mha_forward(hf_config, weights, x, mask, positions)
        outputs = {}
        for flash in (True, False):
            cfg.use_flash_attn = flash
            outputs[flash] = cfg.forward_mha(x, mask, positions)
            what = f"{family} {mask_kind} token {token} = {value} {'flash' if flash else 'sdpa'}"
            assert np.isfinite(outputs[flash][blind]).all(), f"{what}: a row that cannot see the token is not finite"
            _assert_close(outputs[flash][blind], want[blind], f"{what} vs reference on the rows blind to it")
            seeing = visible.copy()
            seeing[:, token] = False
            if np.isnan(value):
                assert not np.isfinite(outputs[flash][seeing]).all(axis=-1).any(), \
                    f"{what}: a row that sees the NaN token is finite"
        _assert_close(outputs[True][blind], outputs[False][blind].astype(np.float64),
                      f"{family} {mask_kind} token {token} flash vs sdpa", PAIR_MAX_NORMALIZED, PAIR_RMS_RELATIVE)
