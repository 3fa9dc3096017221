"""load_safetensors() round trips through checkpoints the tests write themselves
(8-byte little-endian header length, JSON header, raw little-endian data):
sharded with model.safetensors.index.json, BF16 / F16 / F32 shards, HF's
"model.layers.<L>.self_attn." prefix, single files, MLA names; and its errors."""
import json
import struct

import numpy as np
import pytest

import sneppx

GQA = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, qkv_bias=True, o_bias=False)
MLA = dict(hidden_size=128, num_attention_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16,
           qk_rope_head_dim=16, v_head_dim=32, bias=False, rope_interleaved=True)


def to_bf16_bits(values):
    """float32 -> bfloat16 bits, rounded to nearest even (what torch's .to(bfloat16) does)."""
    bits = np.asarray(values, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")


def from_bf16_bits(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def encode(dtype, values):
    if dtype == "BF16":
        return to_bf16_bits(values).tobytes()
    return np.ascontiguousarray(values, {"F32": "<f4", "F16": "<f2", "I32": "<i4"}[dtype]).tobytes()


def stored_value(dtype, values):
    """The float32 a reader gets back for values stored as dtype."""
    if dtype == "BF16":
        return from_bf16_bits(to_bf16_bits(values))
    return np.asarray(values, {"F32": np.float32, "F16": np.float16}[dtype]).astype(np.float32)


def write_safetensors(path, tensors):
    """tensors: {name: (dtype, array)}. The header is space-padded to 8 bytes like the reference writer's."""
    header, chunks, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, (dtype, values) in tensors.items():
        raw = encode(dtype, values)
        header[name] = {"dtype": dtype, "shape": list(np.shape(values)), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def layer_weights(cfg, rng, layer):
    return {f"model.layers.{layer}.self_attn.{name}": (rng.standard_normal(shape) / np.sqrt(shape[-1]))
            .astype(np.float32) for name, shape in cfg.tensor_shapes().items()}


def write_sharded_checkpoint(directory, cfg, rng, layers=2):
    """Two shards: layer 0's weight matrices in BF16 (+ the embeddings) in the first; every
    other tensor in the second, biases in F32 and the rest in F16. Returns what a reader
    gets back, by full name."""
    directory.mkdir(exist_ok=True)
    shard_names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    shards = [{"model.embed_tokens.weight": ("F32", rng.standard_normal((16, cfg.hidden_size)))}, {}]
    stored = {}
    for layer in range(layers):
        for name, values in layer_weights(cfg, rng, layer).items():
            if layer == 0 and name.endswith(".weight"):
                shard, dtype = 0, "BF16"
            else:
                shard, dtype = 1, ("F32" if name.endswith(".bias") else "F16")
            shards[shard][name] = (dtype, values)
            stored[name] = stored_value(dtype, values)
    weight_map = {}
    for shard_name, tensors in zip(shard_names, shards):
        write_safetensors(directory / shard_name, tensors)
        weight_map.update({name: shard_name for name in tensors})
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return stored


def of_layer(stored, layer):
    prefix = f"model.layers.{layer}.self_attn."
    return {name: value for name, value in stored.items() if name.startswith(prefix)}


@pytest.fixture
def hidden(rng):
    return rng.standard_normal((2, 7, 128)).astype(np.float32)


def test_sharded_checkpoint_round_trip(tmp_path, rng, hidden):
    cfg = sneppx.LLMConfig(**GQA)
    stored = write_sharded_checkpoint(tmp_path / "ckpt", cfg, rng)
    for layer in (0, 1):
        cfg.load_state_dict(of_layer(stored, layer))
        expected = cfg.forward_mha(hidden)
        for path in (tmp_path / "ckpt", tmp_path / "ckpt" / "model.safetensors.index.json",
                     str(tmp_path / "ckpt")):
            cfg.load_safetensors(path, layer=layer)
            assert cfg.weights_source == f"safetensors({str(path)!r}, layer={layer})"
            np.testing.assert_array_equal(cfg.forward_mha(hidden), expected)
    # The second shard alone holds every tensor of layer 1.
    cfg.load_safetensors(tmp_path / "ckpt" / "model-00002-of-00002.safetensors", layer=1)
    cfg2 = sneppx.LLMConfig(**GQA)
    cfg2.load_state_dict(of_layer(stored, 1))
    np.testing.assert_array_equal(cfg.forward_mha(hidden), cfg2.forward_mha(hidden))


def test_bf16_rounding_and_f32_exactness(tmp_path):
    values = np.array([[1.0, -2.5, 1.00390625, 3.14159265, 1e-40, -65504.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8]],
                      np.float32)
    # Ties round to even (1 + 2^-8 -> 1, 1 + 3 * 2^-8 -> 1 + 2^-6); a float32 subnormal keeps its top bits.
    np.testing.assert_array_equal(from_bf16_bits(to_bf16_bits(values)), np.array(
        [[1.0, -2.5, 1.0, 3.140625, 2.0 ** -133, -65536.0, 1.0, 1.015625]], np.float32))
    cfg = sneppx.LLMConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, bias=False)
    rng = np.random.default_rng(3)
    state = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in cfg.tensor_shapes().items()}
    state["q_proj.weight"][0, :8] = values
    x = rng.standard_normal((1, 3, 64)).astype(np.float32)
    for dtype in ("BF16", "F32", "F16"):
        write_safetensors(tmp_path / f"{dtype}.safetensors",
                          {f"layers.0.self_attn.{name}": (dtype, value) for name, value in state.items()})
        cfg.load_safetensors(tmp_path / f"{dtype}.safetensors")
        got = cfg.forward_mha(x)
        cfg.load_state_dict({name: stored_value(dtype, value) for name, value in state.items()})
        np.testing.assert_array_equal(got, cfg.forward_mha(x))


def test_mla_checkpoint_round_trip(tmp_path, rng, hidden):
    cfg = sneppx.LLMConfig(**MLA)
    state = layer_weights(cfg, rng, 3)
    write_safetensors(tmp_path / "model.safetensors", {name: ("BF16", value) for name, value in state.items()})
    cfg.load_safetensors(tmp_path, layer=3)
    got = cfg.forward_mha(hidden)
    cfg.load_state_dict({name: stored_value("BF16", value) for name, value in state.items()})
    np.testing.assert_array_equal(got, cfg.forward_mha(hidden))


def test_rebuild_after_extend_context_rereads_the_checkpoint(tmp_path, rng, hidden):
    cfg = sneppx.LLMConfig(**GQA, max_position_embeddings=64)
    stored = write_sharded_checkpoint(tmp_path / "ckpt", cfg, rng, layers=1)
    cfg.load_safetensors(tmp_path / "ckpt")
    cfg.extend_context(1024)
    positions = np.broadcast_to(np.arange(500, 507), (2, 7))
    got = cfg.forward_mha(hidden, position_ids=positions)
    assert cfg.weights_source.startswith("safetensors(")
    cfg.load_state_dict(of_layer(stored, 0))
    np.testing.assert_array_equal(got, cfg.forward_mha(hidden, position_ids=positions))


@pytest.fixture
def single_file(tmp_path, rng):
    """A valid single-file checkpoint of GQA's layer 0: (path, tensors as written)."""
    cfg = sneppx.LLMConfig(**GQA)
    tensors = {name: ("F32", value) for name, value in layer_weights(cfg, rng, 0).items()}
    return tmp_path / "model.safetensors", tensors


def test_missing_extra_and_misshaped_tensors(single_file, hidden):
    path, tensors = single_file
    cfg = sneppx.LLMConfig(**GQA)
    before = cfg.forward_mha(hidden)
    prefix = "model.layers.0.self_attn."

    missing = dict(tensors)
    del missing[prefix + "k_proj.bias"]
    write_safetensors(path, missing)
    with pytest.raises(sneppx.FormatError, match=f"missing tensor '{prefix}k_proj.bias'"):
        cfg.load_safetensors(path)

    extra = dict(tensors)
    extra[prefix + "q_norm.weight"] = ("F32", np.ones(32, np.float32))
    write_safetensors(path, extra)
    with pytest.raises(ValueError, match=f"unexpected tensor '{prefix}q_norm.weight'"):
        cfg.load_safetensors(path)

    misshaped = dict(tensors)
    misshaped[prefix + "v_proj.weight"] = ("F32", np.ones((64, 127), np.float32))
    write_safetensors(path, misshaped)
    with pytest.raises(ValueError, match=rf"'{prefix}v_proj.weight' has shape \[64, 127\], config 'custom' "
                                         rf"expects \[64, 128\]"):
        cfg.load_safetensors(path)

    wrong_dtype = dict(tensors)
    wrong_dtype[prefix + "q_proj.bias"] = ("I32", np.ones(128, np.int32))
    write_safetensors(path, wrong_dtype)
    with pytest.raises(NotImplementedError, match=f"'{prefix}q_proj.bias': dtype I32"):
        cfg.load_safetensors(path)

    # A failed load leaves the layer as it was.
    assert cfg.weights_source == "synthetic(seed=0x5eed5eed)"
    np.testing.assert_array_equal(cfg.forward_mha(hidden), before)


def test_file_and_layer_errors(single_file, tmp_path):
    path, tensors = single_file
    write_safetensors(path, tensors)
    cfg = sneppx.LLMConfig(**GQA)
    with pytest.raises(sneppx.FormatError, match="no tensor of layer 4's self_attn"):
        cfg.load_safetensors(path, layer=4)
    with pytest.raises(ValueError, match="layer: -1 must be >= 0"):
        cfg.load_safetensors(path, layer=-1)
    with pytest.raises(TypeError, match="layer: expected an integer"):
        cfg.load_safetensors(path, layer="0")
    with pytest.raises(OSError, match="nowhere"):
        cfg.load_safetensors(tmp_path / "nowhere")
    with pytest.raises(sneppx.FileError):
        cfg.load_safetensors(tmp_path / "nowhere.safetensors")
    for empty in ("", b""):   # an unset variable: named as an empty path, not as a file '' not found
        with pytest.raises(ValueError, match="path: an empty path"):
            cfg.load_safetensors(empty)

    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(sneppx.FormatError, match=f"{truncated}.*outside the .*data buffer"):
        cfg.load_safetensors(truncated)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(sneppx.FormatError, match=f"{garbage}: not a safetensors file"):
        cfg.load_safetensors(garbage)
    not_json = tmp_path / "bad.index.json"
    not_json.write_text("{")
    with pytest.raises(sneppx.FormatError, match="weight_map"):
        cfg.load_safetensors(not_json)
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {name: "lost.safetensors" for name in tensors}}))
    with pytest.raises(OSError, match="lost.safetensors"):
        cfg.load_safetensors(index)
    # The directory is read through its model.safetensors, as transformers reads it.
    cfg.load_safetensors(tmp_path)


def test_a_tensor_name_with_a_control_character_is_refused_unechoed(single_file, tmp_path, hidden):
    # Every message about a tensor names it: a name that could start a line of its own or
    # send a terminal escape sequence is refused, and shown with '?' for its controls.
    path, tensors = single_file
    cfg = sneppx.LLMConfig(**GQA)
    before = cfg.forward_mha(hidden)
    prefix = "model.layers.0.self_attn."
    named = dict(tensors)
    named[prefix + "q_proj.bias\n\x1b[2Jx"] = named.pop(prefix + "q_proj.bias")
    write_safetensors(path, named)
    with pytest.raises(sneppx.FormatError) as refused:
        cfg.load_safetensors(path)
    assert f"tensor '{prefix}q_proj.bias??[2Jx': a name with a control character" in str(refused.value)
    bad_dtype = dict(tensors)
    bad_dtype[prefix + "q_proj.bias"] = ("F32", tensors[prefix + "q_proj.bias"][1])
    write_safetensors(path, bad_dtype)
    raw = path.read_bytes().replace(b'"dtype": "F32"', b'"dtype": "F\\u001b32"', 1)
    path.write_bytes(raw)
    with pytest.raises(sneppx.FormatError, match=r"unknown dtype 'F\?32'"):
        cfg.load_safetensors(path)
    index = tmp_path / "model.safetensors.index.json"
    write_safetensors(path, tensors)
    index.write_text(json.dumps({"weight_map": {**{name: path.name for name in tensors},
                                                prefix + "o_proj.weight\r": path.name}}))
    with pytest.raises(sneppx.FormatError) as refused:
        cfg.load_safetensors(index)
    assert f"weight_map['{prefix}o_proj.weight?']: a name with a control character" in str(refused.value)
    np.testing.assert_array_equal(cfg.forward_mha(hidden), before)
