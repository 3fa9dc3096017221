"""The AOT path: `sneppx-gen` renders a self-contained C layer, plain `cc` builds it
into a shared library, ctypes runs it, and its output must match the float64
reference (reference.py) and the JIT path (the sneppx package) on the same weights.

Configs: hand-built ones given to `sneppx-gen --config FILE.json` (GQA ratios,
windows, bias combinations, every RoPE type and layout, flash and SDPA), every
family's small stand-in (families.py; MLA with and without q LoRA and YaRN), and
the presets llama3-8B, mistral-7B and qwen2-0.5B (`sneppx-gen --arch NAME`); masks
per sequence and one for all, irregular position_ids. The softmax scale literal of
the vendored file is the runtime's float.
Thresholds: reference.FP32_* against float64; AOT vs JIT 5e-5 / 1e-5 (both fp32,
the same kernels, partitioned differently over threads).
"""
# ctest: 4 shards (tests/CMakeLists.txt), each under a minute on 2 cores
import ctypes
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest

import reference as ref
import sneppx
from families import FAMILIES, make_inputs, preset_config

REPO = Path(__file__).resolve().parents[2]
SNEPPX_GEN = REPO / "gen" / "sneppx-gen"
CC = shutil.which("cc") or shutil.which("gcc")
PAIR_MAX_NORMALIZED = 5e-5
PAIR_RMS_RELATIVE = 1e-5

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc) on PATH")

# Hand configs in sneppx-gen's --config form: HF config.json names plus sneppx's
# qkv_bias / o_bias / rotary_dim / rope_interleaved / use_flash_attn.
HAND_CONFIGS: Dict[str, Dict[str, Any]] = {
    "gqa4-window-bias": dict(hidden_size=80, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                             sliding_window=13, qkv_bias=True, o_bias=True),
    "qwen-bias-llama3-rope": dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                                  rope_theta=500000.0, qkv_bias=True, o_bias=False, max_position_embeddings=131072,
                                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "partial-interleaved-yarn": dict(hidden_size=96, num_attention_heads=4, num_key_value_heads=4, head_dim=64,
                                     rotary_dim=16, rope_interleaved=True, qkv_bias=False, o_bias=False,
                                     rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                   "original_max_position_embeddings": 32}),
    "mha-d128-linear-sdpa": dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=2, head_dim=128,
                                 qkv_bias=False, o_bias=True, use_flash_attn=False,
                                 rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "dynamic-ntk-d16": dict(hidden_size=48, num_attention_heads=6, num_key_value_heads=3, head_dim=16,
                            max_position_embeddings=40, qkv_bias=True, o_bias=True,
                            rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
}
PRESETS = ["llama3-8B", "mistral-7B", "qwen2-0.5B"]


class AotLayer:
    """A sneppx-gen layer compiled to a shared library, driven through ctypes."""

    def __init__(self, out_dir: Path, cc: Optional[str] = None, cflags: Sequence[str] = ()):
        manifest = json.loads((out_dir / "manifest.json").read_text())
        self.keys: List[str] = manifest["keys"]
        prefix = manifest["prefix"]
        header = (out_dir / manifest["header"]).read_text()
        struct = re.search(r"struct %s_weights \{(.*?)\};" % re.escape(prefix), header, re.S)
        assert struct, f"{manifest['header']}: no struct {prefix}_weights"
        self.fields = re.findall(r"const float \*(\w+);", struct.group(1))
        self.library_path = out_dir / f"lib{prefix}.so"
        subprocess.run([cc or CC, "-std=c11", "-O2", *cflags, "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror",
                        str(out_dir / manifest["source"]), "-o", str(self.library_path), "-lm"],
                       check=True, capture_output=True, text=True)
        lib = ctypes.CDLL(str(self.library_path))
        self.lib, self.prefix, self.header = lib, prefix, header
        self.Weights = type("Weights", (ctypes.Structure,),
                            {"_fields_": [(name, ctypes.c_void_p) for name in self.fields]})
        self._packed_floats = getattr(lib, prefix + "_packed_floats")
        self._packed_floats.restype, self._packed_floats.argtypes = ctypes.c_int64, []
        self._pack = getattr(lib, prefix + "_pack")
        self._pack.restype, self._pack.argtypes = ctypes.c_int, [ctypes.POINTER(self.Weights), ctypes.c_void_p]
        self._scratch_floats = getattr(lib, prefix + "_scratch_floats")
        self._scratch_floats.restype = ctypes.c_int64
        self._scratch_floats.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
        self._forward = getattr(lib, prefix + "_forward")
        self._forward.restype = ctypes.c_int
        self._forward.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 6 + [ctypes.c_int]
        self._last_error = getattr(lib, prefix + "_last_error")
        self._last_error.restype, self._last_error.argtypes = ctypes.c_char_p, []
        self.packed: Optional[np.ndarray] = None

    def load(self, state_dict: Dict[str, np.ndarray]) -> None:
        """Packs the HF tensors (field q_proj_weight <- "q_proj.weight")."""
        arrays = {}
        for name in self.fields:
            tensor, _, kind = name.rpartition("_")
            arrays[name] = np.ascontiguousarray(state_dict[f"{tensor}.{kind}"], dtype=np.float32)
        weights = self.Weights(**{name: array.ctypes.data for name, array in arrays.items()})
        self.packed = np.empty(self._packed_floats(), np.float32)
        status = self._pack(ctypes.byref(weights), self.packed.ctypes.data)
        assert status == 0, f"pack: {self._last_error().decode()}"

    def forward(self, x: np.ndarray, mask: Optional[np.ndarray], positions: Optional[np.ndarray],
                threads: int = 1) -> np.ndarray:
        status, out = self.run(x, mask, None if mask is None else mask.shape, positions, threads)
        assert status == 0, f"forward: {self._last_error().decode()}"
        return out

    def run(self, x: np.ndarray, mask: Optional[np.ndarray], mask_shape: Optional[Sequence[int]],
            positions: Optional[np.ndarray], threads: int = 1) -> Tuple[int, np.ndarray]:
        """The entry as given (a shape with or without its mask): (status, out)."""
        batch, seq_len, _ = x.shape
        floats = self._scratch_floats(batch, seq_len, threads)
        assert floats > 0
        raw = np.empty(floats + 16, np.float32)
        start = (-raw.ctypes.data % 64) // 4          # scratch must be 64-byte aligned
        scratch = raw[start:start + floats]
        x = np.ascontiguousarray(x, dtype=np.float32)
        mask = None if mask is None else np.ascontiguousarray(mask, dtype=np.float32)
        positions = None if positions is None else np.ascontiguousarray(positions, dtype=np.int64)
        shape = None if mask_shape is None else np.array(mask_shape, np.int64)
        out = np.empty_like(x)
        status = self._forward(self.packed.ctypes.data, batch, seq_len, x.ctypes.data,
                               None if mask is None else mask.ctypes.data,
                               None if shape is None else shape.ctypes.data,
                               None if positions is None else positions.ctypes.data,
                               out.ctypes.data, scratch.ctypes.data, threads)
        return status, out

    def last_error(self) -> str:
        return self._last_error().decode()


def _generate(args: List[str], out_dir: Path, **build) -> AotLayer:
    """sneppx-gen args -o out_dir, built (build: AotLayer's cc and cflags)."""
    result = subprocess.run([sys.executable, str(SNEPPX_GEN), *args, "-o", str(out_dir)],
                            capture_output=True, text=True)
    assert result.returncode == 0, f"sneppx-gen {' '.join(args)} failed:\n{result.stderr}"
    return AotLayer(out_dir, **build)


def _jit_config(hf_config: Dict[str, Any]) -> "sneppx.LLMConfig":
    """The same layer through the sneppx package (LLMConfig takes partial_rotary_factor,
    sneppx-gen's --config takes rotary_dim)."""
    kwargs = {k: v for k, v in hf_config.items() if k != "rotary_dim"}
    if "rotary_dim" in hf_config:
        kwargs["partial_rotary_factor"] = hf_config["rotary_dim"] / hf_config["head_dim"]
    return sneppx.LLMConfig(**kwargs)


def _assert_close(got, want, what, max_normalized, rms_relative):
    err_max, err_rms = ref.normalized_error(got, want)
    assert err_max <= max_normalized and err_rms <= rms_relative, (
        f"{what}: max-normalized {err_max:.3e} (limit {max_normalized:.0e}), "
        f"RMS-relative {err_rms:.3e} (limit {rms_relative:.0e})")


def _check(layer: AotLayer, hf_config: Dict[str, Any], jit: "sneppx.LLMConfig", weights, cases, rng,
           what: str) -> None:
    window = int(hf_config.get("sliding_window") or 0)
    for kind, batch, seq_len in cases:
        x, mask, positions = make_inputs(kind, batch, seq_len, int(hf_config["hidden_size"]), window, rng)
        want = ref.mha_forward(hf_config, weights, x, mask, positions)
        got = layer.forward(x, mask, positions)
        label = f"{what} {kind} b{batch} s{seq_len}"
        _assert_close(got, want, f"{label} aot vs reference", ref.FP32_MAX_NORMALIZED, ref.FP32_RMS_RELATIVE)
        _assert_close(got, jit.forward_mha(x, mask, positions).astype(np.float64), f"{label} aot vs jit",
                      PAIR_MAX_NORMALIZED, PAIR_RMS_RELATIVE)


@pytest.mark.parametrize("name", list(HAND_CONFIGS))
def test_hand_config(name, tmp_path, rng):
    hf_config = dict(HAND_CONFIGS[name], name=name)
    config_file = tmp_path / f"{name}.json"
    config_file.write_text(json.dumps(hf_config))
    layer = _generate(["--config", str(config_file)], tmp_path / "out")
    attention = "attn_sdpa" if hf_config.get("use_flash_attn") is False else "attn_flash"
    group = hf_config["num_attention_heads"] // hf_config["num_key_value_heads"]
    assert any(k.startswith(f"{attention}-d{hf_config['head_dim']}-") and f"-g{group}-" in k for k in layer.keys), \
        layer.keys
    reference_config = {k: v for k, v in hf_config.items() if k != "name"}
    weights = ref.random_state_dict(reference_config, rng, qkv_bias=hf_config["qkv_bias"],
                                    o_bias=hf_config["o_bias"])
    layer.load(weights)
    jit = _jit_config(reference_config)
    jit.load_state_dict(weights)
    cases = [("none", 2, 1), ("none", 2, 70), ("explicit", 2, 37), ("left-padding", 2, 45), ("irregular", 2, 40),
             ("broadcast", 2, 33)]
    if hf_config.get("rope_scaling", {}).get("rope_type") == "dynamic":
        # Dynamic NTK reacts to positions past max_position_embeddings (40), not to offsets.
        cases = [("none", 2, 1), ("none", 2, 70), ("left-padding", 2, 100), ("irregular", 2, 30)]
    _check(layer, reference_config, jit, weights, cases, rng, name)
    # A mask's shape without the mask is a forgotten pointer, refused as the runtime refuses it.
    status, _ = layer.run(np.zeros((1, 3, hf_config["hidden_size"]), np.float32), None, (1, 1, 3, 3), None)
    assert status != 0 and layer.last_error().startswith("mask_shape: given without attention_mask"), \
        layer.last_error()


@pytest.mark.parametrize("name", PRESETS)
def test_preset(name, tmp_path, rng):
    hf_config = preset_config(name)
    layer = _generate(["--arch", name], tmp_path / "out")
    weights = ref.random_state_dict(hf_config, rng, qkv_bias=bool(hf_config["qkv_bias"]),
                                    o_bias=bool(hf_config["o_bias"]))
    layer.load(weights)
    jit = sneppx.LLMConfig.from_name(name)
    jit.load_state_dict(weights)
    _check(layer, hf_config, jit, weights, [("none", 1, 5), ("left-padding", 2, 9), ("irregular", 2, 7)], rng, name)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family(family, tmp_path, rng):
    """Every family's small stand-in (tests/python/families.py, which test_numerics.py
    runs through the runtime): the vendored layer against the float64 reference and
    the runtime, with every mask and position kind."""
    hf_config = FAMILIES[family]
    config_file = tmp_path / f"{family}.json"
    config_file.write_text(json.dumps(dict(hf_config, name=family)))
    layer = _generate(["--config", str(config_file)], tmp_path / "out")
    jit = sneppx.LLMConfig(**hf_config)
    weights = ref.random_state_dict(hf_config, rng, qkv_bias=jit.qkv_bias, o_bias=jit.o_bias)
    layer.load(weights)
    jit.load_state_dict(weights)
    cases = [("none", 2, 1), ("none", 2, 70), ("explicit", 2, 37), ("left-padding", 2, 45), ("irregular", 2, 40),
             ("broadcast", 2, 33)]
    _check(layer, hf_config, jit, weights, cases, rng, family)


# MLA layers whose softmax scale, printed to 9 digits as a double, reads back as the float
# next to the runtime's (float) of it: the literal must be the float's digits.
# 1 / sqrt(256 + 128): d 384 without scaling; 1 / sqrt(176 + 16) x mscale(40, 0.5)^2.
_MLA = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_rope_head_dim=16,
            v_head_dim=32, rope_interleaved=True, attention_bias=False)
SCALE_ROUNDING = {
    "mla-d384": dict(_MLA, qk_nope_head_dim=256, qk_rope_head_dim=128),
    "mla-d192-yarn": dict(_MLA, qk_nope_head_dim=176, max_position_embeddings=1280,
                          rope_scaling={"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 32,
                                        "mscale": 1.0, "mscale_all_dim": 0.5}),
}


@pytest.mark.parametrize("family", ["deepseek-v2", "deepseek-v2-mscale-pair", "deepseek-v2-lite-like", "qwen2",
                                    *SCALE_ROUNDING])
def test_softmax_scale_is_the_runtimes(family, tmp_path):
    """The vendored file's softmax scale literal is the runtime's float
    (sneppx_config_softmax_scale), also where YaRN's mscale and mscale_all_dim
    differ (the scale takes mscale_all_dim alone), and where the double's own 9
    digits would round to the other float."""
    hf_config = FAMILIES.get(family) or SCALE_ROUNDING[family]
    config_file = tmp_path / f"{family}.json"
    config_file.write_text(json.dumps(dict(hf_config, name=family)))
    _generate(["--config", str(config_file)], tmp_path / "out")
    source = next((tmp_path / "out").glob("sneppx_*.c")).read_text()
    literals = set(re.findall(r"args\.softmax_scale = ([-+.0-9eE]+)f;", source))
    assert len(literals) == 1, f"{family}: softmax scale literals {literals}"
    vendored, runtime = float(literals.pop()), sneppx.LLMConfig(**hf_config).softmax_scale
    assert np.float32(vendored) == np.float32(runtime), \
        f"{family}: vendored softmax scale {vendored!r} is not the runtime's {runtime!r}"
    assert runtime == pytest.approx(ref.softmax_scale(hf_config), rel=1e-12)
