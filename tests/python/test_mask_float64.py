"""HF builds additive masks with its dtype's finfo.min; a float64 (or long double) model's
is -1.8e308, beyond float32. forward_mha turns it into float32 without numpy's "overflow
encountered in cast" RuntimeWarning (every test here runs with warnings as errors), and the
position stays masked: the output is bit for bit that of the same mask with -inf (or the
bool mask), and within the fp32 budget of the float64 reference of reference.py, which
treats entries <= -1e30 as masked."""
import warnings

import numpy as np
import pytest

import reference as ref
import sneppx

SMALL = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, qkv_bias=True, o_bias=False)
SEQ = 6


@pytest.fixture(autouse=True)
def warnings_are_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


@pytest.fixture
def layer(rng):
    cfg = sneppx.LLMConfig(**SMALL)
    state = ref.random_state_dict(cfg, rng, qkv_bias=True, o_bias=False)
    cfg.load_state_dict(state)
    return cfg, state


def padded_visible(batch, queries, keys):
    """Causal over `keys` keys ending at the last query, and row 1 left-padded by 2 keys."""
    query = np.arange(keys - queries, keys)[:, None]
    visible = np.broadcast_to(np.arange(keys)[None, :] <= query, (batch, 1, queries, keys)).copy()
    visible[1, :, :, :2] = False
    visible[1, :, :2, :] = False
    visible[1, :, :2, 0] = True     # a pad query row still sees one key (HF's rows of padding)
    return visible


def hf_mask(visible, dtype, fill=None):
    return np.where(visible, 0.0, np.finfo(dtype).min if fill is None else fill).astype(dtype)


def assert_close(got, want):
    err_max, err_rms = ref.normalized_error(got, want)
    assert err_max <= ref.FP32_MAX_NORMALIZED and err_rms <= ref.FP32_RMS_RELATIVE, (err_max, err_rms)


@pytest.mark.parametrize("dtype", [np.float64, np.longdouble, np.float32, np.float16])
def test_finfo_min_masks_without_a_warning(rng, layer, dtype):
    cfg, state = layer
    x = rng.standard_normal((2, SEQ, SMALL["hidden_size"])).astype(np.float32)
    visible = padded_visible(2, SEQ, SEQ)
    got = cfg.forward_mha(x, attention_mask=hf_mask(visible, dtype))
    np.testing.assert_array_equal(got, cfg.forward_mha(x, attention_mask=hf_mask(visible, np.float32, -np.inf)))
    np.testing.assert_array_equal(got, cfg.forward_mha(x, attention_mask=visible))
    assert_close(got, ref.mha_forward(cfg, state, x, attention_mask=hf_mask(visible, np.float64)))


@pytest.mark.parametrize("cached", [False, True])
def test_float16_finfo_min_is_masked_in_a_fully_masked_row(rng, layer, cached):
    """float16's finfo.min, -65504, is far above -1e30; it counts as masked all the same:
    a row whose keys are all masked outputs what the bool mask gives (zeros from attention),
    not the average of its keys, with and without a KV cache."""
    cfg, _ = layer
    x = rng.standard_normal((2, SEQ, SMALL["hidden_size"])).astype(np.float32)
    visible = padded_visible(2, SEQ, SEQ)
    visible[1, :, 3, :] = False
    outputs = []
    for mask in (hf_mask(visible, np.float16), visible):
        if cached:
            cache = cfg.kv_cache(batch=2, max_tokens=SEQ)
            outputs.append(cfg.forward_mha(x, attention_mask=mask, past_key_value=cache))
        else:
            outputs.append(cfg.forward_mha(x, attention_mask=mask))
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_beyond_float32_but_not_finfo_min_masks_too(rng, layer):
    cfg, _ = layer
    x = rng.standard_normal((2, SEQ, SMALL["hidden_size"])).astype(np.float32)
    visible = padded_visible(2, SEQ, SEQ)
    np.testing.assert_array_equal(cfg.forward_mha(x, attention_mask=hf_mask(visible, np.float64, -1e39)),
                                  cfg.forward_mha(x, attention_mask=visible))


@pytest.mark.parametrize("dtype", [np.float64, np.longdouble])
def test_finfo_min_with_a_kv_cache(rng, layer, dtype):
    """HF's 4-D mask with a past [batch, 1, new, cached + new], in float64, over a prefill
    and one decode step; the same steps with bool masks give the same bits."""
    cfg, state = layer
    x = rng.standard_normal((2, SEQ + 1, SMALL["hidden_size"])).astype(np.float32)
    visible = padded_visible(2, SEQ + 1, SEQ + 1)
    outputs = {}
    for kind in ("float", "bool"):
        cache = cfg.kv_cache(batch=2, max_tokens=16)
        steps = []
        for begin, end in ((0, SEQ), (SEQ, SEQ + 1)):
            plane = visible[:, :, begin:end, :end]
            mask = hf_mask(plane, dtype) if kind == "float" else plane
            steps.append(cfg.forward_mha(x[:, begin:end], attention_mask=mask, past_key_value=cache))
        outputs[kind] = np.concatenate(steps, axis=1)
    np.testing.assert_array_equal(outputs["float"], outputs["bool"])
    assert_close(outputs["float"], ref.mha_forward(cfg, state, x, attention_mask=hf_mask(visible, np.float64)))
