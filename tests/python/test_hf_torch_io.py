"""torch tensors through the plain API (not sneppx.hf): torch in -> torch out for
forward_mha, its cached form, forward_ragged and KVCache.read; a contiguous float32 CPU
tensor is read in place and the result comes back without a copy (proven by the addresses
the C calls receive); other layouts and dtypes are converted once; tensors that require
grad are read through .detach() (no graph: gradients do not flow); other devices are
refused naming the argument. And load_state_dict(model.state_dict(), layer=N) on small
random transformers models (Llama, Qwen2, Mistral, DeepSeek V2).

Every torch output is compared bit for bit with the numpy route's output for the same
values, and forwards with the float64 reference of reference.py within the fp32 budget
(FP32_MAX_NORMALIZED / FP32_RMS_RELATIVE).

Needs torch and transformers: ctest runs this file with the venv of scripts/venv.sh
(tests/CMakeLists.txt, test_hf*.py), and skips it where that venv does not exist.
"""
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

if os.environ.get("SNEPPX_REQUIRE_TORCH"):
    import torch
    import transformers
else:
    torch = pytest.importorskip("torch", reason="needs the venv of scripts/venv.sh (torch, transformers)")
    transformers = pytest.importorskip("transformers")

import reference as ref
from test_hf import COMMON as HF_COMMON, FAMILIES
import sneppx
from sneppx._layer import Layer

GQA = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, qkv_bias=True, o_bias=False)
MLA = dict(hidden_size=128, num_attention_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16,
           qk_rope_head_dim=16, v_head_dim=32, bias=False, rope_interleaved=True)


def assert_close(got, want):
    err_max, err_rms = ref.normalized_error(got, want)
    assert err_max <= ref.FP32_MAX_NORMALIZED and err_rms <= ref.FP32_RMS_RELATIVE, (err_max, err_rms)


def assert_same(tensor, array):
    """A float32 torch tensor holding exactly array's bits."""
    assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32 and not tensor.requires_grad
    assert isinstance(array, np.ndarray)
    np.testing.assert_array_equal(tensor.numpy(), array)


@pytest.fixture
def layer(rng):
    cfg = sneppx.LLMConfig(**GQA)
    state = ref.random_state_dict(cfg, rng, qkv_bias=True, o_bias=False)
    cfg.load_state_dict(state)
    return cfg, state


@pytest.fixture
def seen(monkeypatch):
    """The hidden_states and out arrays each C forward call received, by call kind."""
    calls = {"forward": [], "forward_cached": []}
    forward, forward_cached = Layer.forward, Layer.forward_cached

    def spy_forward(self, hidden_states, mask, position_ids, out):
        calls["forward"].append((hidden_states, out))
        return forward(self, hidden_states, mask, position_ids, out)

    def spy_cached(self, cache, layer_index, seq_ids, q_lens, hidden_states, position_ids, masks, out):
        calls["forward_cached"].append((hidden_states, out))
        return forward_cached(self, cache, layer_index, seq_ids, q_lens, hidden_states, position_ids, masks, out)

    monkeypatch.setattr(Layer, "forward", spy_forward)
    monkeypatch.setattr(Layer, "forward_cached", spy_cached)
    return calls


def test_import_does_not_load_torch():
    code = "import sys, sneppx, sneppx.hf; assert 'torch' not in sys.modules, 'torch imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert result.returncode == 0, result.stderr


def test_float32_tensor_in_place_and_out_without_a_copy(rng, layer, seen):
    cfg, state = layer
    big = torch.randn(3, 7, 128, generator=torch.Generator().manual_seed(1))
    for x in (big, big[1:]):        # a batch slice is contiguous too (at an offset)
        out = cfg.forward_mha(x)
        (x_seen, out_seen), = seen["forward"][-1:]
        assert x_seen.ctypes.data == x.data_ptr() and np.shares_memory(x_seen, big.numpy())
        assert out.data_ptr() == out_seen.ctypes.data and out.shape == x.shape
        assert_same(out, cfg.forward_mha(x.numpy().copy()))
        assert_close(out.numpy(), ref.mha_forward(cfg, state, x.numpy()))
    assert len(seen["forward"]) == 4


def test_other_layouts_and_dtypes_are_converted(layer, seen):
    cfg, _ = layer
    x = torch.randn(2, 7, 128, generator=torch.Generator().manual_seed(2))
    cases = {
        "transposed view": (x.transpose(1, 2).contiguous().transpose(1, 2), x.numpy()),
        "float64": (x.double(), x.double().numpy()),
        "float16": (x.half(), x.half().numpy()),
        "bfloat16": (x.bfloat16(), x.bfloat16().float().numpy()),   # bfloat16 widens exactly
    }
    for name, (tensor, array) in cases.items():
        assert not (tensor.is_contiguous() and tensor.dtype == torch.float32), name
        out = cfg.forward_mha(tensor)
        x_seen = seen["forward"][-1][0]
        assert x_seen.flags.c_contiguous and x_seen.dtype == np.float32 and x_seen.ctypes.data != tensor.data_ptr()
        assert_same(out, cfg.forward_mha(array))


def test_tensors_that_require_grad_are_detached(layer, seen):
    cfg, _ = layer
    x = torch.randn(2, 7, 128, generator=torch.Generator().manual_seed(3), requires_grad=True)
    for tensor in (x, torch.nn.Parameter(x.detach().clone())):
        out = cfg.forward_mha(tensor)
        assert seen["forward"][-1][0].ctypes.data == tensor.data_ptr()   # still read in place
        assert out.grad_fn is None
        assert_same(out, cfg.forward_mha(tensor.detach().numpy()))
        with pytest.raises(RuntimeError, match="does not require grad"):
            out.sum().backward()        # no graph: gradients do not flow through sneppx
        assert tensor.grad is None


def test_other_devices_are_refused_naming_the_argument(layer):
    cfg, _ = layer
    x = torch.randn(1, 4, 128)
    meta = torch.empty(1, 4, 128, device="meta")
    with pytest.raises(ValueError, match=r"^hidden_states: a tensor on meta; sneppx computes on the CPU"):
        cfg.forward_mha(meta)
    with pytest.raises(ValueError, match=r"^attention_mask: a tensor on meta"):
        cfg.forward_mha(x, attention_mask=torch.zeros(1, 1, 4, 4, device="meta"))
    with pytest.raises(ValueError, match=r"^position_ids: a tensor on meta"):
        cfg.forward_mha(x, position_ids=torch.arange(4, device="meta")[None])
    # bfloat16 positions are refused as floats, not read through their bits as integers
    with pytest.raises(TypeError, match=r"^position_ids: expected integers, got dtype bfloat16$"):
        cfg.forward_mha(x, position_ids=torch.arange(4, dtype=torch.bfloat16)[None])
    cache = cfg.kv_cache(max_tokens=8)
    with pytest.raises(ValueError, match=r"^hidden_states: a tensor on meta"):
        cfg.forward_mha(meta, past_key_value=cache)
    with pytest.raises(ValueError, match=r"^hidden_states\[0\]: a tensor on meta"):
        cfg.forward_ragged(cache, [0], [meta[0]])
    assert cache.lengths == [0]
    state = {name: torch.zeros(shape, device="meta") for name, shape in cfg.tensor_shapes().items()}
    source = cfg.weights_source
    with pytest.raises(ValueError, match=r"^state_dict: tensor 'q_proj.weight': a tensor on meta"):
        cfg.load_state_dict(state)
    assert cfg.weights_source == source


def test_masks_and_positions_as_tensors(layer):
    """HF's float64 mask (finfo(float64).min) as a tensor: no warning, masked as -inf."""
    cfg, state = layer
    x = torch.randn(2, 6, 128, generator=torch.Generator().manual_seed(4))
    visible = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()
    visible[1, :, :, 0] = False
    visible[1, :, 0, 0] = True
    positions = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 0, 1, 2, 3, 4]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for dtype in (torch.float64, torch.float32, torch.bfloat16):
            mask = torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)
            out = cfg.forward_mha(x, attention_mask=mask, position_ids=positions)
            assert_same(out, cfg.forward_mha(x.numpy(), attention_mask=visible.numpy(),
                                             position_ids=positions.numpy()))
    assert_close(out.numpy(), ref.mha_forward(cfg, state, x.numpy(), attention_mask=mask.double().numpy(),
                                              position_ids=positions.numpy()))


@pytest.mark.parametrize("shape", [GQA, MLA], ids=["gqa", "mla"])
def test_cached_forward_and_read(rng, shape, seen):
    cfg = sneppx.LLMConfig(**shape)
    state = ref.random_state_dict(cfg, rng, qkv_bias=cfg.qkv_bias, o_bias=cfg.o_bias)
    cfg.load_state_dict(state)
    x = torch.randn(1, 9, 128, generator=torch.Generator().manual_seed(5))
    tensors, arrays = cfg.kv_cache(max_tokens=16), cfg.kv_cache(max_tokens=16)
    outputs = []
    for begin, end in ((0, 6), (6, 7), (7, 8)):
        out = cfg.forward_mha(x[:, begin:end], past_key_value=tensors)
        x_seen, out_seen = seen["forward_cached"][-1]
        assert x_seen.ctypes.data == x[:, begin:end].data_ptr() and out.data_ptr() == out_seen.ctypes.data
        assert_same(out, cfg.forward_mha(x[:, begin:end].numpy(), past_key_value=arrays))
        outputs.append(out)
    # forward_ragged: each output follows its input.
    step = cfg.forward_ragged(tensors, [0], [x[0, 8:9]])
    assert_same(step[0], cfg.forward_ragged(arrays, [0], [x[0, 8:9].numpy()])[0])
    outputs.append(step[0][None])
    assert_close(torch.cat(outputs, dim=1).numpy(), ref.mha_forward(cfg, state, x.numpy()))
    # read() gives ndarrays whatever went in, the same values.
    k, v = tensors.read(0)
    k_want, v_want = arrays.read(0)
    assert isinstance(k, np.ndarray) and np.array_equal(k, k_want)
    if cfg.is_mla:
        assert v is None and v_want is None
    else:
        assert isinstance(v, np.ndarray) and np.array_equal(v, v_want)


# ---- whole models' state dicts -----------------------------------------------------

# test_hf's small models of each family, with a smaller vocabulary: only their attention
# layers' tensors are read here.
COMMON = dict(HF_COMMON, vocab_size=64)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_whole_model_state_dict(tmp_path, family):
    config_name, model_name, fields = FAMILIES[family]
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(getattr(transformers, config_name)(**COMMON, **fields)).eval()
    model.config.to_json_file(tmp_path / "config.json")
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == family
    x = torch.randn(2, 20, 64, generator=torch.Generator().manual_seed(6))   # beyond Mistral's 16-token window
    whole, one_module = sneppx.LLMConfig.from_config_json(tmp_path), sneppx.LLMConfig.from_config_json(tmp_path)
    state, parameters = model.state_dict(), dict(model.named_parameters())
    assert all(p.requires_grad for p in parameters.values())
    for index, decoder_layer in enumerate(model.model.layers):
        module_state = decoder_layer.self_attn.state_dict()
        one_module.load_state_dict(module_state)
        want = one_module.forward_mha(x)
        whole.load_state_dict(state, layer=index)
        assert whole.weights_source == f"state_dict({len(module_state)} tensors, layer={index})"
        got = whole.forward_mha(x)
        assert torch.equal(got, want)
        whole.load_state_dict(parameters, layer=index)    # Parameters: read through .detach()
        assert torch.equal(whole.forward_mha(x), want)
        weights = {name: t.detach().double().numpy() for name, t in module_state.items()}
        assert_close(got.numpy(), ref.mha_forward(whole, weights, x.numpy()))
    with pytest.raises(ValueError, match=r"^layer: state_dict has no tensor of layer 2's self_attn; it holds "
                                         r"layers 0\.\.1$"):
        whole.load_state_dict(state, layer=2)
