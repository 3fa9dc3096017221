"""load_state_dict(state_dict, layer=N): one layer's self_attn tensors out of a whole model's
state dict (keys "model.layers.N.self_attn.q_proj.weight", as LlamaForCausalLM.state_dict()
has them, or without "model."), picked by the rule load_safetensors(path, layer=N) uses;
the other tensors are neither taken nor read. The one-module forms ("q_proj.weight",
"self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.weight" alone) keep working
without layer=.

Outputs are compared bit for bit with the same tensors loaded one module at a time (and
from a safetensors file with the same names), and with the float64 reference of
reference.py within the fp32 budget (FP32_MAX_NORMALIZED / FP32_RMS_RELATIVE)."""
from collections.abc import Mapping

import numpy as np
import pytest

import reference as ref
import sneppx
from test_safetensors import write_safetensors

GQA = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, qkv_bias=True, o_bias=False)
MLA = dict(hidden_size=128, num_attention_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16,
           qk_rope_head_dim=16, v_head_dim=32, bias=False, rope_interleaved=True)
MLA_LITE = dict(hidden_size=128, num_attention_heads=4, kv_lora_rank=32, qk_nope_head_dim=32,
                qk_rope_head_dim=16, v_head_dim=16, bias=False, rope_interleaved=True)
LAYERS = 3


def assert_close(got, want):
    err_max, err_rms = ref.normalized_error(got, want)
    assert err_max <= ref.FP32_MAX_NORMALIZED and err_rms <= ref.FP32_RMS_RELATIVE, (err_max, err_rms)


def layer_tensors(cfg, rng):
    return ref.random_state_dict(cfg, rng, qkv_bias=cfg.qkv_bias, o_bias=cfg.o_bias)


def whole_model(cfg, rng, prefix="model.", layers=LAYERS):
    """A causal LM's state dict: embeddings, per layer its self_attn tensors (as
    layer_tensors), MLP and norms, then the final norm and lm_head. Returns (the dict,
    each layer's self_attn tensors by their names inside self_attn)."""
    hidden = cfg.hidden_size
    model = {f"{prefix}embed_tokens.weight": rng.standard_normal((32, hidden)).astype(np.float32)}
    per_layer = []
    for layer in range(layers):
        attn = layer_tensors(cfg, rng)
        per_layer.append(attn)
        model.update({f"{prefix}layers.{layer}.self_attn.{name}": value for name, value in attn.items()})
        model[f"{prefix}layers.{layer}.mlp.gate_proj.weight"] = rng.standard_normal((64, hidden)).astype(np.float32)
        model[f"{prefix}layers.{layer}.input_layernorm.weight"] = np.ones(hidden, np.float32)
    model[f"{prefix}norm.weight"] = np.ones(hidden, np.float32)
    model["lm_head.weight"] = rng.standard_normal((32, hidden)).astype(np.float32)
    return model, per_layer


class Recording(Mapping):
    """A state dict that records which values were read."""

    def __init__(self, tensors):
        self.tensors, self.read = tensors, set()

    def __getitem__(self, key):
        self.read.add(key)
        return self.tensors[key]

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self):
        return len(self.tensors)


@pytest.fixture
def x(rng):
    return rng.standard_normal((2, 7, 128)).astype(np.float32)


@pytest.mark.parametrize("shape", [GQA, MLA, MLA_LITE], ids=["gqa", "mla", "mla-lite"])
@pytest.mark.parametrize("prefix", ["model.", ""], ids=["model.", "bare"])
def test_each_layer_of_a_whole_model(rng, x, shape, prefix):
    cfg = sneppx.LLMConfig(**shape)
    model, per_layer = whole_model(cfg, rng, prefix)
    one_module = sneppx.LLMConfig(**shape)
    for layer in range(LAYERS):
        recording = Recording(model)
        cfg.load_state_dict(recording, layer=layer)
        assert recording.read == {f"{prefix}layers.{layer}.self_attn.{name}" for name in per_layer[layer]}
        assert cfg.weights_source == f"state_dict({len(per_layer[layer])} tensors, layer={layer})"
        got = cfg.forward_mha(x)
        assert_close(got, ref.mha_forward(cfg, per_layer[layer], x))
        one_module.load_state_dict(per_layer[layer])
        np.testing.assert_array_equal(got, one_module.forward_mha(x))


def test_same_tensors_as_load_safetensors(tmp_path, rng, x):
    cfg = sneppx.LLMConfig(**GQA)
    model, _ = whole_model(cfg, rng)
    write_safetensors(tmp_path / "model.safetensors", {name: ("F32", value) for name, value in model.items()})
    from_file = sneppx.LLMConfig(**GQA)
    for layer in range(LAYERS):
        cfg.load_state_dict(model, layer=layer, dtype="bfloat16")
        from_file.load_safetensors(tmp_path / "model.safetensors", layer=layer, dtype="bfloat16")
        np.testing.assert_array_equal(cfg.forward_mha(x), from_file.forward_mha(x))


def test_layer_1_is_not_layer_10(rng, x):
    cfg = sneppx.LLMConfig(**GQA)
    model, per_layer = whole_model(cfg, rng, layers=11)
    cfg.load_state_dict(model, layer=1)
    assert_close(cfg.forward_mha(x), ref.mha_forward(cfg, per_layer[1], x))
    cfg.load_state_dict(model, layer=10)
    assert_close(cfg.forward_mha(x), ref.mha_forward(cfg, per_layer[10], x))


def test_one_module_forms_keep_working(rng, x):
    cfg = sneppx.LLMConfig(**GQA)
    tensors = layer_tensors(cfg, rng)
    want = ref.mha_forward(cfg, tensors, x)
    outputs = []
    for prefix in ("", "self_attn.", "model.layers.5.self_attn."):
        cfg.load_state_dict({prefix + name: value for name, value in tensors.items()})
        assert cfg.weights_source == "state_dict(7 tensors)"
        outputs.append(cfg.forward_mha(x))
        assert_close(outputs[-1], want)
    np.testing.assert_array_equal(outputs[0], outputs[1])
    np.testing.assert_array_equal(outputs[0], outputs[2])
    # A module's own prefix works with layer= as well.
    cfg.load_state_dict({"model.layers.5.self_attn." + name: value for name, value in tensors.items()}, layer=5)
    np.testing.assert_array_equal(cfg.forward_mha(x), outputs[0])


def test_whole_model_without_layer_says_to_pass_it(rng):
    cfg = sneppx.LLMConfig(**GQA)
    model, _ = whole_model(cfg, rng)
    with pytest.raises(ValueError, match=r"state_dict: keys carry different prefixes .*; pass layer=N to take "
                                         r"layer N's tensors of a whole model's state dict"):
        cfg.load_state_dict(model)


def test_absent_layer_names_layer_and_the_layers_held(rng):
    cfg = sneppx.LLMConfig(**GQA)
    model, _ = whole_model(cfg, rng)
    before = cfg.weights_source
    with pytest.raises(ValueError, match=r"^layer: state_dict has no tensor of layer 3's self_attn; it holds "
                                         r"layers 0\.\.2$"):
        cfg.load_state_dict(model, layer=3)
    model = {k: v for k, v in model.items() if ".layers.1.self_attn." not in k}
    with pytest.raises(ValueError, match=r"it holds layers 0, 2$"):
        cfg.load_state_dict(model, layer=1)
    one_module = layer_tensors(cfg, rng)
    with pytest.raises(ValueError, match=r"^layer: state_dict has no tensor of layer 0's self_attn; no key "
                                         r"contains 'layers\.<n>\.self_attn\.' \(pass one layer's tensors "
                                         r"without layer=\)$"):
        cfg.load_state_dict(one_module, layer=0)
    assert cfg.weights_source == before


@pytest.mark.parametrize("layer, error, message", [
    (-1, ValueError, "layer: -1 must be >= 0"),
    (True, TypeError, "layer: expected an integer, got True"),
    (1.0, TypeError, "layer: expected an integer, got 1.0"),
    ("1", TypeError, "layer: expected an integer, got '1'"),
    (2 ** 63, ValueError, "layer: 9223372036854775808 does not fit in int64"),
])
def test_bad_layer_values_name_layer(rng, layer, error, message):
    cfg = sneppx.LLMConfig(**GQA)
    model, _ = whole_model(cfg, rng)
    with pytest.raises(error, match=message):
        cfg.load_state_dict(model, layer=layer)
    cfg.load_state_dict(model, layer=np.int64(2))   # numpy integers are integers
    assert cfg.weights_source == "state_dict(7 tensors, layer=2)"


def test_problems_within_the_layer_name_the_full_key(rng):
    cfg = sneppx.LLMConfig(**GQA)
    model, _ = whole_model(cfg, rng)
    broken = {k: v for k, v in model.items() if k != "model.layers.1.self_attn.o_proj.weight"}
    with pytest.raises(ValueError, match=r"state_dict: missing tensor\(s\) 'model\.layers\.1\.self_attn\.o_proj"
                                         r"\.weight'"):
        cfg.load_state_dict(broken, layer=1)
    cfg.load_state_dict(broken, layer=0)     # another layer of it is whole
    extra = dict(model, **{"model.layers.1.self_attn.q_norm.weight": np.ones(32, np.float32)})
    with pytest.raises(ValueError, match=r"state_dict: unexpected tensor 'model\.layers\.1\.self_attn\.q_norm"
                                         r"\.weight'"):
        cfg.load_state_dict(extra, layer=1)
    twice = dict(model, **{f"layers.1.self_attn.{name}": model[f"model.layers.1.self_attn.{name}"]
                           for name in cfg.tensor_shapes()})
    with pytest.raises(ValueError, match=r"state_dict: tensors 'model\.layers\.1\.self_attn\.q_proj\.weight' and "
                                         r"'layers\.1\.self_attn\.q_proj\.weight' both match layer 1's "
                                         r"self_attn\.q_proj\.weight"):
        cfg.load_state_dict(twice, layer=1)
    # The RoPE buffer older Llama checkpoints saved is ignored, as the checkpoint loader ignores it.
    cfg.load_state_dict(dict(model, **{"model.layers.1.self_attn.rotary_emb.inv_freq": np.ones(16)}), layer=1)


def test_multimodal_state_dict_takes_the_complete_prefix(tmp_path, rng, x):
    """A vision tower's encoder layers beside the language model's: the prefix holding every
    tensor the config takes is the layer's, as load_safetensors picks it from the same names."""
    cfg = sneppx.LLMConfig(**GQA)
    model, per_layer = whole_model(cfg, rng, prefix="language_model.model.")
    vision = {f"vision_tower.vision_model.encoder.layers.{layer}.self_attn.{proj}.{kind}":
              rng.standard_normal((64, 64) if kind == "weight" else (64,)).astype(np.float32)
              for layer in range(LAYERS) for proj in ("q_proj", "k_proj", "v_proj", "out_proj")
              for kind in ("weight", "bias")}
    model = dict(vision, **model)   # the tower first, as the C test has it
    write_safetensors(tmp_path / "model.safetensors", {name: ("F32", value) for name, value in model.items()})
    from_file = sneppx.LLMConfig(**GQA)
    for layer in range(LAYERS):
        recording = Recording(model)
        cfg.load_state_dict(recording, layer=layer)
        assert recording.read == {f"language_model.model.layers.{layer}.self_attn.{name}"
                                  for name in per_layer[layer]}
        got = cfg.forward_mha(x)
        assert_close(got, ref.mha_forward(cfg, per_layer[layer], x))
        from_file.load_safetensors(tmp_path / "model.safetensors", layer=layer)
        np.testing.assert_array_equal(got, from_file.forward_mha(x))
    # No complete prefix: the fuller one names what it lacks, as the checkpoint loader does.
    gone = ("language_model.model.layers.0.self_attn.o_proj.weight",
            "vision_tower.vision_model.encoder.layers.0.self_attn.k_proj.bias")   # 6 of 7 names against 5
    partial = {k: v for k, v in model.items() if k not in gone}
    with pytest.raises(ValueError, match=r"missing tensor\(s\) 'language_model\.model\.layers\.0\.self_attn\."
                                         r"o_proj\.weight'"):
        cfg.load_state_dict(partial, layer=0)
