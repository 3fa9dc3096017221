"""The Python API: the README's from_name / forward_mha snippet, every preset's output shape, the synthetic
weights, load_state_dict's name/prefix/dtype handling, configs from HF names and
config.json, attributes, flash/SDPA switching, extend_context, threads.

Numerics per architecture family (masks, RoPE variants, MLA forms) are in
test_numerics.py; both compare against the float64 reference of reference.py."""
import copy
import json
import threading
from pathlib import Path

import numpy as np
import pytest

import families
import reference as ref
import sneppx
from sneppx import _library


def assert_close(got, want, what=""):
    err_max, err_rms = ref.normalized_error(got, want)
    assert err_max <= ref.FP32_MAX_NORMALIZED and err_rms <= ref.FP32_RMS_RELATIVE, (
        f"{what}: max-normalized {err_max:.3e}, RMS-relative {err_rms:.3e}")


def random_state_dict(cfg, rng, prefix=""):
    return {prefix + name: value for name, value in
            ref.random_state_dict(cfg, rng, qkv_bias=cfg.qkv_bias, o_bias=cfg.o_bias).items()}


# Small stand-ins of the families, for the API tests below.
SMALL = {
    "llama3-gqa": dict(hidden_size=128, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                       rope_theta=500000.0, bias=False),
    "qwen2-bias": dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                       rope_theta=1e6, qkv_bias=True, o_bias=False),
    "spec-default-bias": dict(hidden_size=64, num_heads=4, num_kv_heads=2),
    "deepseek-v2-mla": dict(hidden_size=128, num_attention_heads=4, q_lora_rank=48, kv_lora_rank=32,
                            qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=32, bias=False,
                            rope_interleaved=True),
    "deepseek-v2-lite-mla": dict(hidden_size=128, num_attention_heads=4, kv_lora_rank=32, qk_nope_head_dim=32,
                                 qk_rope_head_dim=16, v_head_dim=16, bias=False, rope_interleaved=True),
}


def test_spec_snippet(rng):
    batch, seq_len = 1, 8
    hidden_states = rng.standard_normal((batch, seq_len, 4096)).astype(np.float32)
    attention_mask = ref.causal_additive_mask(batch, seq_len)
    position_ids = np.arange(seq_len)[None, :]

    import sneppx

    cfg = sneppx.LLMConfig.from_name("llama3", "8B")
    output = cfg.forward_mha(
        hidden_states,  # [batch, seq_len, hidden_size]
        attention_mask, # [batch, 1, seq_len, seq_len]
        position_ids    # [batch, seq_len]
    )
    # output shape: [batch, seq_len, hidden_size]

    assert output.shape == (batch, seq_len, 4096)
    assert output.dtype == np.float32
    assert np.all(np.isfinite(output))
    assert cfg.weights_source == "synthetic(seed=0x5eed5eed)"
    # The explicit causal mask and the built-in one (mask None) are the same attention.
    assert_close(output, cfg.forward_mha(hidden_states).astype(np.float64), "explicit vs implicit causal")


@pytest.mark.parametrize("name", sneppx.LLMConfig.names())
def test_every_preset_output_shape(name, rng):
    cfg = sneppx.LLMConfig.from_name(name)
    # The biggest presets (hidden >= 8192) run one short sequence to stay fast.
    batch, seq_len = (1, 3) if cfg.hidden_size >= 8192 else (2, 4)
    x = rng.standard_normal((batch, seq_len, cfg.hidden_size)).astype(np.float32)
    out = cfg.forward_mha(x)
    assert out.shape == (batch, seq_len, cfg.hidden_size) and out.dtype == np.float32
    assert np.all(np.isfinite(out))
    assert np.abs(out).max() > 0


def test_state_dict_prefixes_dtypes_and_layouts(rng):
    cfg = sneppx.LLMConfig(**SMALL["qwen2-bias"])
    state = random_state_dict(cfg, rng)
    x = rng.standard_normal((1, 6, cfg.hidden_size))        # float64 input, converted once
    cfg.load_state_dict(state)
    bare = cfg.forward_mha(x)
    for prefix in ("self_attn.", "model.layers.7.self_attn.", "language_model.model.layers.0.self_attn."):
        cfg.load_state_dict({prefix + name: value for name, value in state.items()})
        np.testing.assert_array_equal(cfg.forward_mha(x), bare)
    # float64, Fortran-ordered and transposed-view weights are converted to the same float32.
    converted = {name: np.asfortranarray(value.astype(np.float64)) for name, value in state.items()}
    converted["q_proj.weight"] = np.ascontiguousarray(state["q_proj.weight"].T).T
    converted["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(32, np.float32)  # ignored buffer
    converted = {("model.layers.0.self_attn." + k if not k.startswith("model.") else k): v
                 for k, v in converted.items()}
    cfg.load_state_dict(converted)
    np.testing.assert_array_equal(cfg.forward_mha(x), bare)
    # Non-contiguous hidden states equal their contiguous copy.
    wide = rng.standard_normal((1, 6, 2 * cfg.hidden_size)).astype(np.float32)
    np.testing.assert_array_equal(cfg.forward_mha(wide[:, :, ::2]), cfg.forward_mha(wide[:, :, ::2].copy()))


def test_state_dict_arrays_are_copied(rng):
    """A caller reusing its arrays (the next layer's tensors into the same buffers) does
    not change a loaded config, also when it repacks them (extend_context)."""
    cfg = sneppx.LLMConfig(**SMALL["llama3-gqa"])
    state = {name: value.astype(np.float32) for name, value in random_state_dict(cfg, rng).items()}
    cfg.load_state_dict(state)
    twin = sneppx.LLMConfig(**SMALL["llama3-gqa"])
    twin.load_state_dict({name: value.copy() for name, value in state.items()})
    for value in state.values():
        value[...] = 0.0
    x = rng.standard_normal((1, 5, cfg.hidden_size)).astype(np.float32)
    cfg.extend_context(2 * cfg.max_position_embeddings)
    twin.extend_context(2 * twin.max_position_embeddings)
    np.testing.assert_array_equal(cfg.forward_mha(x), twin.forward_mha(x))
    assert np.abs(twin.forward_mha(x)).max() > 0


def test_synthetic_weights_follow_the_documented_formula(rng):
    """weights_source 'synthetic(seed=0x5eed5eed)' is reproducible from include/sneppx/layer.h."""
    cfg = sneppx.LLMConfig(**SMALL["llama3-gqa"])
    x = rng.standard_normal((1, 5, cfg.hidden_size)).astype(np.float32)
    out = cfg.forward_mha(x)
    assert cfg.weights_source == "synthetic(seed=0x5eed5eed)"
    assert_close(out, ref.mha_forward(cfg, synthetic_state_dict(cfg), x), "synthetic weights")


WEIGHT_FIELDS = ["q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias",
                 "o_proj.weight", "o_proj.bias", "q_a_proj.weight", "q_a_proj.bias", "q_a_layernorm.weight",
                 "q_b_proj.weight", "kv_a_proj_with_mqa.weight", "kv_a_proj_with_mqa.bias",
                 "kv_a_layernorm.weight", "kv_b_proj.weight"]


def _splitmix64(x):
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def synthetic_state_dict(cfg):
    state = {}
    with np.errstate(over="ignore"):
        for name, shape in cfg.tensor_shapes().items():
            tensor_id = np.uint64(WEIGHT_FIELDS.index(name))
            stream = _splitmix64(np.array([0x5EED5EED], np.uint64) + tensor_id)[0]
            index = np.arange(int(np.prod(shape)), dtype=np.uint64)
            unit = (_splitmix64(stream ^ index) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
            if len(shape) == 2:
                scale, offset = np.float32(1.0 / np.sqrt(shape[1])), np.float32(0.0)
            else:
                scale = np.float32(0.1)
                offset = np.float32(1.0 if name.endswith("layernorm.weight") else 0.0)
            state[name] = (offset + scale * (2.0 * unit - 1.0).astype(np.float32)).reshape(shape)
    return state


def test_flash_and_sdpa_agree_and_switch_kernels(rng):
    cfg = sneppx.LLMConfig.from_name("mistral-7B")
    x = rng.standard_normal((1, 40, cfg.hidden_size)).astype(np.float32)
    flash = cfg.forward_mha(x)
    assert any(key.startswith("attn_flash-") for key in cfg.kernel_keys)
    cfg.use_flash_attn = False
    assert cfg.use_flash_attn is False
    sdpa = cfg.forward_mha(x)
    assert any(key.startswith("attn_sdpa-") for key in cfg.kernel_keys)
    assert_close(flash, sdpa.astype(np.float64), "flash vs sdpa")


def test_extend_context_keeps_weights_and_scales_theta(rng):
    cfg = sneppx.LLMConfig(**SMALL["llama3-gqa"], max_position_embeddings=64)
    state = random_state_dict(cfg, rng)
    cfg.load_state_dict(state)
    x = rng.standard_normal((1, 4, cfg.hidden_size)).astype(np.float32)
    positions = np.array([[100, 101, 102, 103]])
    with pytest.raises(ValueError, match="position_ids"):
        cfg.forward_mha(x, position_ids=positions)
    theta = cfg.rope_theta
    cfg.extend_context(256)
    d = cfg.rotary_dim
    assert cfg.max_position_embeddings == 256
    want_theta = theta * 4.0 ** (d / (d - 2))   # NTK-aware: base * scale^(d / (d - 2))
    assert cfg.rope_theta == pytest.approx(want_theta, rel=1e-12)
    assert cfg.weights_source.startswith("state_dict")
    # The reference's config is the hand config with the expected theta, not the library's.
    extended = dict(SMALL["llama3-gqa"], max_position_embeddings=256, rope_theta=want_theta)
    assert_close(cfg.forward_mha(x, position_ids=positions),
                 ref.mha_forward(extended, state, x, position_ids=positions), "after extend_context")


def test_presets_carry_the_published_values():
    """Pins the ctypes mirror of sneppx_config field by field through known presets."""
    cfg = sneppx.LLMConfig.from_name("llama3.1", "8B")
    assert (cfg.name, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == \
        ("llama3.1-8B", 4096, 32, 8, 128)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.rope_theta, cfg.max_position_embeddings) == (32, 8, 500000.0, 131072)
    assert cfg.rope_scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    assert (cfg.sliding_window, cfg.bias, cfg.use_flash_attn, cfg.is_mla) == (None, False, True, False)
    assert sneppx.LLMConfig.from_name("Mistral-7B").sliding_window == 4096
    qwen = sneppx.LLMConfig.from_name("qwen2", "0.5B")
    assert (qwen.head_dim, qwen.qkv_bias, qwen.o_bias, qwen.num_kv_heads) == (64, True, False, 2)
    ds = sneppx.LLMConfig.from_name("deepseek-v2")
    assert (ds.num_attention_heads, ds.q_lora_rank, ds.kv_lora_rank, ds.qk_nope_head_dim, ds.qk_rope_head_dim,
            ds.v_head_dim, ds.head_dim, ds.is_mla) == (128, 1536, 512, 128, 64, 128, 192, True)
    assert ds.softmax_scale == pytest.approx(0.1147213868, rel=1e-9)
    assert ds.rope_scaling["rope_type"] == "yarn" and ds.rope_scaling["mscale_all_dim"] == 0.707
    lite = sneppx.LLMConfig.from_name("deepseek-v2", "lite")
    assert lite.q_lora_rank is None and "q_proj.weight" in lite.tensor_shapes()
    names = sneppx.LLMConfig.names()
    assert {"llama2-7B", "llama3-8B", "llama3.1-405B", "mistral-7B", "qwen2-72B", "deepseek-v2-lite"} <= set(names)


def test_tensor_shapes_match_the_weights_struct():
    """sneppx_attn_tensors reports offsetof(sneppx_weights, field): every one must be a
    field of the ctypes mirror (GQA with biases and both MLA variants cover every field)."""
    from sneppx import _structs, _weights
    seen = set()
    for kwargs in (SMALL["spec-default-bias"], dict(SMALL["deepseek-v2-mla"], bias=True),
                   SMALL["deepseek-v2-lite-mla"]):
        cfg = sneppx.LLMConfig(**kwargs)
        for name, shape, field in _weights.expected_tensors(cfg._config):
            assert field == name.replace(".", "_")
            seen.add(field)
    assert seen == {name for name, _ in _structs.Weights._fields_}
    shapes = sneppx.LLMConfig(**SMALL["spec-default-bias"]).tensor_shapes()
    assert shapes == {"q_proj.weight": (64, 64), "q_proj.bias": (64,), "k_proj.weight": (32, 64),
                      "k_proj.bias": (32,), "v_proj.weight": (32, 64), "v_proj.bias": (32,),
                      "o_proj.weight": (64, 64), "o_proj.bias": (64,)}


def test_constructor_names_aliases_and_defaults():
    cfg = sneppx.LLMConfig(hidden_size=256, num_heads=8, num_kv_heads=2)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (8, 2, 32)
    assert cfg.bias and cfg.qkv_bias and cfg.o_bias            # hand configs: biases on by default
    assert (cfg.rope_theta, cfg.rope_scaling, cfg.sliding_window, cfg.name) == (10000.0, None, None, "custom")
    assert not sneppx.LLMConfig(hidden_size=256, num_attention_heads=8, attention_bias=False).bias
    partial = sneppx.LLMConfig(hidden_size=256, num_attention_heads=4, partial_rotary_factor=0.5)
    assert (partial.head_dim, partial.rotary_dim, partial.partial_rotary_factor) == (64, 32, 0.5)
    text = repr(sneppx.LLMConfig.from_name("llama3", "8B"))
    for part in ("'llama3-8B'", "hidden_size=4096", "num_key_value_heads=8", "rope_theta=500000",
                 "use_flash_attn=True", "synthetic(seed=0x5eed5eed)"):
        assert part in text
    with pytest.raises(AttributeError):
        cfg.hidden_size = 512
    with pytest.raises(AttributeError):
        cfg.new_attribute = 1


CONFIG_JSONS = {
    "Meta-Llama-3.1-8B": ({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
                           "num_key_value_heads": 8, "rope_theta": 500000.0, "max_position_embeddings": 131072,
                           "attention_bias": False, "vocab_size": 128256,
                           "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 8192, "rope_type": "llama3"}},
                          dict(num_key_value_heads=8, qkv_bias=False, o_bias=False, sliding_window=None,
                               max_position_embeddings=131072)),
    "Llama-2-7b-hf": ({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
                       "max_position_embeddings": 4096, "rope_scaling": None},
                      dict(num_key_value_heads=32, rope_theta=10000.0, qkv_bias=False)),
    "Mistral-7B-v0.1": ({"model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32,
                         "num_key_value_heads": 8, "sliding_window": 4096, "rope_theta": 10000.0},
                        dict(sliding_window=4096, qkv_bias=False, o_bias=False, max_position_embeddings=131072)),
    "Qwen2-0.5B": ({"model_type": "qwen2", "hidden_size": 896, "num_attention_heads": 14, "num_key_value_heads": 2,
                    "sliding_window": 32768, "use_sliding_window": False, "rope_theta": 1000000.0,
                    "max_position_embeddings": 32768},
                   dict(head_dim=64, qkv_bias=True, o_bias=False, sliding_window=None)),
    "DeepSeek-V2-Lite": ({"model_type": "deepseek_v2", "hidden_size": 2048, "num_attention_heads": 16,
                          "num_key_value_heads": 16, "q_lora_rank": None, "kv_lora_rank": 512,
                          "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                          "attention_bias": False, "max_position_embeddings": 163840, "rope_theta": 10000,
                          "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                                           "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
                                           "mscale_all_dim": 0.707}},
                         dict(q_lora_rank=None, kv_lora_rank=512, head_dim=192, rope_interleaved=True, bias=False)),
}


@pytest.mark.parametrize("model", list(CONFIG_JSONS))
def test_from_config_json(model, tmp_path):
    data, expected = CONFIG_JSONS[model]
    directory = tmp_path / model
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(data))
    for path in (directory, directory / "config.json", str(directory)):
        cfg = sneppx.LLMConfig.from_config_json(path)
        assert cfg.name == model
        for key, value in expected.items():
            assert getattr(cfg, key) == value, key
    overridden = sneppx.LLMConfig.from_config_json(directory, use_flash_attn=False)
    assert overridden.use_flash_attn is False
    assert repr(overridden) == repr(cfg).replace("use_flash_attn=True", "use_flash_attn=False")
    if data.get("rope_scaling"):
        assert cfg.rope_scaling["factor"] == data["rope_scaling"]["factor"]


def test_forward_from_many_threads(rng):
    cfg = sneppx.LLMConfig(**SMALL["llama3-gqa"])
    inputs = [rng.standard_normal((2, 16, cfg.hidden_size)).astype(np.float32) for _ in range(4)]
    expected = [cfg.forward_mha(x) for x in inputs]
    results = [[None] * 8 for _ in inputs]
    fresh = sneppx.LLMConfig(**SMALL["llama3-gqa"])  # its layer is created by the racing threads

    def run(worker):
        for repeat in range(8):
            results[worker][repeat] = fresh.forward_mha(inputs[worker])

    threads = [threading.Thread(target=run, args=(worker,)) for worker in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for worker, want in enumerate(expected):
        for got in results[worker]:
            np.testing.assert_array_equal(got, want)


def test_warmup_and_library_path():
    cfg = sneppx.LLMConfig(**SMALL["qwen2-bias"])
    cfg.warmup()
    assert cfg.kernel_keys == []   # warmup compiles kernels without creating the layer
    assert sneppx.library_path().name.startswith("libsneppx")


@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_copies_are_independent(rng, copier):
    cfg = sneppx.LLMConfig(**SMALL["llama3-gqa"], max_position_embeddings=64)
    x = rng.standard_normal((1, 4, cfg.hidden_size)).astype(np.float32)
    synthetic = cfg.forward_mha(x)
    state = random_state_dict(cfg, rng)
    cfg.load_state_dict(state)
    before = cfg.forward_mha(x)
    twin = copier(cfg)
    assert repr(twin) == repr(cfg) and twin.weights_source == cfg.weights_source
    np.testing.assert_array_equal(twin.forward_mha(x), before)
    # Changing the copy leaves the original as it was, and the other way round.
    twin.use_flash_attn = False
    twin.extend_context(128)
    assert cfg.use_flash_attn is True and cfg.max_position_embeddings == 64
    np.testing.assert_array_equal(cfg.forward_mha(x), before)
    cfg.load_state_dict(synthetic_state_dict(cfg))
    np.testing.assert_array_equal(cfg.forward_mha(x), synthetic)
    assert twin.weights_source.startswith("state_dict") and twin.max_position_embeddings == 128
    assert_close(twin.forward_mha(x), ref.mha_forward(twin, state, x), "the copy after extend_context")


def test_package_calls_only_the_public_api():
    # libsneppx exports only runtime/exports.txt (the ctest exported_symbols checks
    # the library against it); a C function outside it is internal and hidden.
    exports = (Path(__file__).resolve().parents[2] / "runtime" / "exports.txt").read_text().split()
    assert sorted(set(_library._PROTOTYPES) - set(exports)) == []


def _unaligned(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of array at an odd byte address (as np.frombuffer with an offset gives)."""
    raw = np.zeros(array.nbytes + 1, np.uint8)
    view = raw[1:].view(array.dtype).reshape(array.shape)
    view[...] = array
    assert view.flags.c_contiguous and not view.flags.aligned
    return view


def test_unaligned_inputs_reach_c_aligned(rng):
    """C reads the arrays through typed pointers: a contiguous view at an odd address is
    copied to an aligned one, not passed as is, and the answer is the aligned input's."""
    from sneppx import _arrays

    cfg = sneppx.LLMConfig(**families.FAMILIES["llama3"])
    batch, seq_len = 2, 5
    x = rng.standard_normal((batch, seq_len, 256)).astype(np.float32)
    mask = ref.causal_additive_mask(batch, seq_len).astype(np.float32)
    positions = np.tile(np.arange(3, 3 + seq_len, dtype=np.int64), (batch, 1))
    assert _arrays.float32_array("hidden_states", _unaligned(x)).flags.aligned
    assert _arrays.position_ids_array(_unaligned(positions), batch, seq_len).flags.aligned
    assert _arrays.row_positions_array("position_ids[0]", _unaligned(positions[0]), seq_len).flags.aligned
    expected = cfg.forward_mha(x, mask, positions)
    got = cfg.forward_mha(_unaligned(x), _unaligned(mask), _unaligned(positions))
    assert np.array_equal(got, expected)
