"""Loading 16-bit weights without float32 copies: load_safetensors() packs from the
file's own bytes and load_state_dict() hands bfloat16 / float16 tensors to C as their
bits; both take the layer's storage type (dtype=...). Each route must give exactly
what the float32 route gives (the same values widened first, then packed), and a
llama3-8B layer loaded from a BF16 file must stay within 1.1x its packed bytes (plus
the pack threads' buffers) of the RSS it started from.

torch is not installed for /usr/bin/python3: FakeTensor below has exactly the surface
of a torch tensor the package uses (dtype, view(int16), __array__ refusing bfloat16 as
torch's numpy() does); test_torch_in_the_venv runs the same checks with real
torch in scripts/venv.sh's environment when it exists."""
import json
import os
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest

import sneppx
from test_safetensors import GQA, MLA, from_bf16_bits, to_bf16_bits, write_safetensors

DTYPES = ("float32", "bfloat16", "float16")


class _FakeDType:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


fake_torch = types.ModuleType("fake_torch")
fake_torch.bfloat16 = _FakeDType("bfloat16")
fake_torch.int16 = _FakeDType("int16")


class FakeTensor:
    """A CPU torch tensor as far as the package may look: numpy cannot hold bfloat16, so
    __array__ refuses it (torch raises TypeError: Got unsupported ScalarType BFloat16)."""
    __module__ = "fake_torch"

    def __init__(self, bits, dtype):
        self._bits, self.dtype = bits, dtype

    @property
    def shape(self):
        return self._bits.shape

    def view(self, dtype):
        assert dtype is fake_torch.int16, dtype
        return FakeTensor(self._bits.view(np.int16), dtype)

    def __array__(self, dtype=None, copy=None):
        if self.dtype is fake_torch.bfloat16:
            raise TypeError("Got unsupported ScalarType BFloat16")
        return self._bits if dtype is None else self._bits.astype(dtype)


def bf16_tensor(values):
    return FakeTensor(to_bf16_bits(values).view(np.uint16), fake_torch.bfloat16)


@pytest.fixture(autouse=True)
def fake_torch_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "fake_torch", fake_torch)


def random_state(cfg, rng):
    return {name: (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
            for name, shape in cfg.tensor_shapes().items()}


def test_bfloat16_state_dict_is_passed_as_bits(rng):
    cfg = sneppx.LLMConfig(**GQA)
    state = random_state(cfg, rng)
    x = rng.standard_normal((2, 7, 128)).astype(np.float32)
    for dtype in DTYPES:
        cfg.load_state_dict({name: from_bf16_bits(to_bf16_bits(v)) for name, v in state.items()}, dtype=dtype)
        want = cfg.forward_mha(x)
        cfg.load_state_dict({name: bf16_tensor(v) for name, v in state.items()}, dtype=dtype)
        assert cfg.weight_dtype == dtype
        # What the package keeps (and hands to C) is the 16 bits, not a float32 copy.
        assert {array.dtype for array, _ in cfg._weights.arrays.values()} == {np.dtype(np.uint16)}
        np.testing.assert_array_equal(cfg.forward_mha(x), want)


def test_float16_state_dict_and_inputs(rng):
    cfg = sneppx.LLMConfig(**GQA)
    state = {name: v.astype(np.float16) for name, v in random_state(cfg, rng).items()}
    x = rng.standard_normal((2, 7, 128)).astype(np.float16)
    for dtype in DTYPES:
        cfg.load_state_dict({name: v.astype(np.float32) for name, v in state.items()}, dtype=dtype)
        want = cfg.forward_mha(x.astype(np.float32))
        cfg.load_state_dict(state, dtype=dtype)
        assert {array.dtype for array, _ in cfg._weights.arrays.values()} == {np.dtype(np.float16)}
        np.testing.assert_array_equal(cfg.forward_mha(x), want)


def test_bfloat16_inputs_are_read_through_their_bits(rng):
    cfg = sneppx.LLMConfig(**GQA)
    x = from_bf16_bits(to_bf16_bits(rng.standard_normal((2, 7, 128))))
    mask = np.where(rng.random((2, 1, 7, 7)) < 0.3, np.float32(-1e4), np.float32(0.0))
    mask[..., 0] = 0.0
    want = cfg.forward_mha(x, attention_mask=mask)
    np.testing.assert_array_equal(cfg.forward_mha(bf16_tensor(x), attention_mask=bf16_tensor(mask)), want)
    # A transposed view of the bits reads as the transposed values.
    transposed = FakeTensor(to_bf16_bits(x.transpose(0, 2, 1)).view(np.uint16).transpose(0, 2, 1),
                            fake_torch.bfloat16)
    np.testing.assert_array_equal(cfg.forward_mha(transposed, attention_mask=mask), want)
    with pytest.raises(ValueError, match=r"hidden_states: expected shape \[batch, seq_len, 128\], got \[7, 128\]"):
        cfg.forward_mha(bf16_tensor(x[0]))
    # The cached forwards read them alike: a prefill through forward_mha, a ragged step.
    got, want = cfg.kv_cache(batch=2, max_tokens=16), cfg.kv_cache(batch=2, max_tokens=16)
    np.testing.assert_array_equal(cfg.forward_mha(bf16_tensor(x), past_key_value=got),
                                  cfg.forward_mha(x, past_key_value=want))
    step = from_bf16_bits(to_bf16_bits(rng.standard_normal((2, 128))))
    for a, b in zip(cfg.forward_ragged(got, [0, 1], [bf16_tensor(step[:1]), bf16_tensor(step[1:])]),
                    cfg.forward_ragged(want, [0, 1], [step[:1], step[1:]])):
        np.testing.assert_array_equal(a, b)


def test_ml_dtypes_bfloat16_arrays(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    cfg = sneppx.LLMConfig(**GQA)
    state = random_state(cfg, rng)
    x = rng.standard_normal((1, 5, 128)).astype(np.float32)
    cfg.load_state_dict({name: v.astype(ml_dtypes.bfloat16).astype(np.float32) for name, v in state.items()})
    want = cfg.forward_mha(x.astype(ml_dtypes.bfloat16).astype(np.float32))
    cfg.load_state_dict({name: v.astype(ml_dtypes.bfloat16) for name, v in state.items()})
    np.testing.assert_array_equal(cfg.forward_mha(x.astype(ml_dtypes.bfloat16)), want)


def test_load_safetensors_dtype(tmp_path, rng):
    cfg = sneppx.LLMConfig(**GQA)
    state = random_state(cfg, rng)
    x = rng.standard_normal((2, 7, 128)).astype(np.float32)
    for file_dtype in ("BF16", "F16", "F32"):
        path = tmp_path / f"{file_dtype}.safetensors"
        write_safetensors(path, {f"model.layers.0.self_attn.{n}": (file_dtype, v) for n, v in state.items()})
        widened = {n: (from_bf16_bits(to_bf16_bits(v)) if file_dtype == "BF16" else
                       v.astype(np.float16 if file_dtype == "F16" else np.float32).astype(np.float32))
                   for n, v in state.items()}
        for dtype in DTYPES:
            reference = sneppx.LLMConfig(**GQA, weight_dtype=dtype)
            reference.load_state_dict(widened)
            cfg.load_safetensors(path, dtype=dtype)
            assert cfg.weight_dtype == dtype
            np.testing.assert_array_equal(cfg.forward_mha(x), reference.forward_mha(x))
    # None keeps the config's type; a load that fails changes neither the type nor the weights.
    cfg.load_safetensors(tmp_path / "BF16.safetensors")
    assert cfg.weight_dtype == "float16"
    before = cfg.forward_mha(x)
    with pytest.raises(sneppx.FileError):
        cfg.load_safetensors(tmp_path / "absent.safetensors", dtype="bfloat16")
    assert cfg.weight_dtype == "float16"
    np.testing.assert_array_equal(cfg.forward_mha(x), before)
    with pytest.raises(ValueError, match=r"dtype: 'bf16' is not one of float32, bfloat16, float16"):
        cfg.load_safetensors(tmp_path / "BF16.safetensors", dtype="bf16")
    with pytest.raises(TypeError, match=r"dtype: expected one of float32, bfloat16, float16, int8 \(a string\)"):
        cfg.load_state_dict(state, dtype=np.float16)


def test_unsupported_tensor_dtype_names_tensor_and_dtype(tmp_path, rng):
    cfg = sneppx.LLMConfig(**GQA)
    tensors = {f"model.layers.0.self_attn.{n}": ("BF16", v) for n, v in random_state(cfg, rng).items()}
    tensors["model.layers.0.self_attn.v_proj.weight"] = ("I32", np.zeros((64, 128), np.int32))
    write_safetensors(tmp_path / "i32.safetensors", tensors)
    with pytest.raises(sneppx.UnsupportedError,
                       match=r"tensor 'model.layers.0.self_attn.v_proj.weight': dtype I32 does not convert"):
        cfg.load_safetensors(tmp_path / "i32.safetensors", dtype="bfloat16")
    assert cfg.weight_dtype == "float32"
    with pytest.raises(TypeError, match=r"state_dict: tensor 'q_proj.weight' has dtype int16; expected floating"):
        cfg.load_state_dict({**random_state(cfg, rng), "q_proj.weight": np.zeros((128, 128), np.int16)})


def test_mla_bfloat16_checkpoint(tmp_path, rng):
    cfg = sneppx.LLMConfig(**MLA)
    state = random_state(cfg, rng)
    write_safetensors(tmp_path / "model.safetensors",
                      {f"model.layers.0.self_attn.{n}": ("BF16", v) for n, v in state.items()})
    x = rng.standard_normal((1, 9, 128)).astype(np.float32)
    reference = sneppx.LLMConfig(**MLA, weight_dtype="bfloat16")
    reference.load_state_dict({n: from_bf16_bits(to_bf16_bits(v)) for n, v in state.items()})
    cfg.load_safetensors(tmp_path, dtype="bfloat16")
    np.testing.assert_array_equal(cfg.forward_mha(x), reference.forward_mha(x))
    cfg.load_state_dict({n: bf16_tensor(v) for n, v in state.items()})
    np.testing.assert_array_equal(cfg.forward_mha(x), reference.forward_mha(x))
    cfg.mla_naive = reference.mla_naive = True   # repacked from the kept bits
    np.testing.assert_array_equal(cfg.forward_mha(x), reference.forward_mha(x))


# ---- peak memory ------------------------------------------------------------------

# Output rows per pack task, as runtime/gemm_pack.h defines them.
PACK_COLUMNS = int(re.search(r"#define SNEPPX_PACK_COLUMNS (\d+)",
                             (Path(__file__).resolve().parents[2] / "runtime" / "gemm_pack.h").read_text()).group(1))

_MEASURE = textwrap.dedent("""
    import json, sys
    import sneppx

    def status():
        fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
        return {key: int(fields[key].split()[0]) * 1024 for key in ("VmRSS", "VmHWM")}

    cfg = sneppx.LLMConfig.from_name("llama3", "8B", weight_dtype="bfloat16")
    cfg.warmup()                                   # kernels (and OpenMP's threads) before the baseline
    with open("/proc/self/clear_refs", "w") as f:  # VmHWM := VmRSS (Linux >= 4.0)
        f.write("5")
    baseline = status()["VmRSS"]
    cfg.load_safetensors(sys.argv[1], layer=0)
    print(json.dumps({"baseline": baseline, "peak": status()["VmHWM"]}))
""")


def write_llama3_8b_bf16_layer(path, cfg, rng):
    """Layer 0 of llama3-8B in BF16, written as bits (finite, |x| in [2^-15, 2)): 84 MB."""
    header, arrays, offset = {}, [], 0
    for name, shape in cfg.tensor_shapes().items():
        bits = rng.integers(0x3800, 0x4000, size=shape, dtype=np.uint16)
        bits |= (rng.integers(0, 2, size=shape, dtype=np.uint16) << 15)
        header[f"model.layers.0.self_attn.{name}"] = {"dtype": "BF16", "shape": list(shape),
                                                      "data_offsets": [offset, offset + bits.nbytes]}
        arrays.append(bits.astype("<u2"))
        offset += bits.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as stream:
        stream.write(len(text).to_bytes(8, "little") + text)
        for bits in arrays:
            bits.tofile(stream)


@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""),
                    reason="AddressSanitizer's shadow memory and quarantine make resident-set bounds meaningless")
@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs /proc/self/clear_refs")
def test_peak_memory_of_a_bfloat16_llama3_8b_layer(tmp_path, rng):
    cfg = sneppx.LLMConfig.from_name("llama3", "8B", weight_dtype="bfloat16")
    path = tmp_path / "model.safetensors"
    write_llama3_8b_bf16_layer(path, cfg, rng)
    threads = 2
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    result = subprocess.run([sys.executable, "-c", _MEASURE, str(path)], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    measured = json.loads(result.stdout.splitlines()[-1])
    shapes = cfg.tensor_shapes()
    hidden = cfg.hidden_size
    qkv_rows = shapes["q_proj.weight"][0] + shapes["k_proj.weight"][0] + shapes["v_proj.weight"][0]
    packed = 2 * (qkv_rows * hidden + hidden * shapes["o_proj.weight"][1])     # bfloat16 panels: 80 MiB
    # Each pack thread: its rows as float32 scratch + the file's 2-byte rows read for them.
    panel_buffers = threads * PACK_COLUMNS * max(hidden, shapes["o_proj.weight"][1]) * (4 + 2)
    growth = measured["peak"] - measured["baseline"]
    print(f"baseline RSS {measured['baseline'] / 2**20:.1f} MiB, peak {measured['peak'] / 2**20:.1f} MiB, "
          f"growth {growth / 2**20:.1f} MiB for {packed / 2**20:.1f} MiB packed")
    # The float32 route needed a float32 copy of the layer (+100 %) and a fused float32 QKV (+120 %).
    assert growth <= 1.1 * packed + panel_buffers, (growth, packed, panel_buffers, measured)


# ---- real torch, where the benchmarks' venv has it ---------------------------------

_TORCH_CHECKS = textwrap.dedent("""
    import numpy as np, torch
    import sneppx
    torch.manual_seed(0)
    kwargs = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, qkv_bias=True, o_bias=False)
    cfg = sneppx.LLMConfig(**kwargs)
    state = {name: torch.randn(shape) / shape[-1] ** 0.5 for name, shape in cfg.tensor_shapes().items()}
    bf16 = {name: torch.nn.Parameter(t.to(torch.bfloat16)) for name, t in state.items()}   # requires grad
    x = torch.randn(2, 7, 128).to(torch.bfloat16)
    mask = torch.zeros(2, 1, 7, 7, dtype=torch.bfloat16)
    mask[:, :, :, 3] = -1e4
    for dtype in ("float32", "bfloat16", "float16"):
        cfg.load_state_dict({n: t.detach().float().numpy() for n, t in bf16.items()}, dtype=dtype)
        want = cfg.forward_mha(x.float().numpy(), attention_mask=mask.float().numpy())
        cfg.load_state_dict(bf16, dtype=dtype)
        assert {a.dtype for a, _ in cfg._weights.arrays.values()} == {np.dtype(np.uint16)}
        np.testing.assert_array_equal(cfg.forward_mha(x, attention_mask=mask), want)
        cfg.load_state_dict({n: t.detach().half() for n, t in bf16.items()}, dtype=dtype)
        assert {a.dtype for a, _ in cfg._weights.arrays.values()} == {np.dtype(np.float16)}
    print("torch", torch.__version__, "ok")
""")


def _torch_venv_python():
    venv = subprocess.run([str(Path(__file__).resolve().parents[2] / "scripts" / "venv.sh"), "--tests", "--check"],
                          capture_output=True, text=True)
    python = Path(venv.stdout.strip()) / "bin" / "python"
    return python if venv.returncode == 0 and python.is_file() else None


@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""), reason="the venv's torch is not built for ASan")
def test_torch_in_the_venv():
    python = _torch_venv_python()
    if python is None:
        # CI makes the venv first and sets SNEPPX_REQUIRE_TORCH: a missing one fails there.
        assert not os.environ.get("SNEPPX_REQUIRE_TORCH"), "SNEPPX_REQUIRE_TORCH is set, and there is no venv"
        pytest.skip("no scripts/venv.sh environment (torch) on this machine")
    result = subprocess.run([str(python), "-c", _TORCH_CHECKS], env=dict(os.environ), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout
