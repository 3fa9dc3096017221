"""What test_numerics.py (the runtime) and test_aot.py (the vendored layer) both run:
each architecture family's small stand-in, HF config.json fields (sneppx.LLMConfig's
keywords, which sneppx-gen's hand configs take too) with the family's features and
sizes shrunk, the inputs of each mask / position kind, and a preset's fields as
gen/archs.json publishes them (the reference's config, not the library's copy)."""
import json
from pathlib import Path
from typing import Any, Dict

import numpy as np

import reference as ref

FAMILIES = {
    "llama2": dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=4, rope_theta=10000.0,
                   attention_bias=False),
    "llama3": dict(hidden_size=256, num_attention_heads=8, num_key_value_heads=2, rope_theta=500000.0,
                   attention_bias=False),
    "llama3.1": dict(hidden_size=256, num_attention_heads=8, num_key_value_heads=2, rope_theta=500000.0,
                     attention_bias=False, max_position_embeddings=131072,
                     rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "llama-attention-bias": dict(hidden_size=256, num_attention_heads=8, num_key_value_heads=4,
                                 rope_theta=10000.0, attention_bias=True),
    "mistral": dict(hidden_size=256, num_attention_heads=8, num_key_value_heads=2, rope_theta=10000.0,
                    sliding_window=16, attention_bias=False),
    "qwen2": dict(hidden_size=224, num_attention_heads=7, num_key_value_heads=1, head_dim=64,
                  rope_theta=1000000.0, qkv_bias=True, o_bias=False),
    "deepseek-v2": dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=48,
                        kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=32,
                        rope_theta=10000.0, rope_interleaved=True, attention_bias=False,
                        max_position_embeddings=1280,
                        rope_scaling={"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 32,
                                      "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707,
                                      "mscale_all_dim": 0.707}),
    # mscale != mscale_all_dim: a cos/sin factor != 1, and a softmax scale from mscale_all_dim alone.
    "deepseek-v2-mscale-pair": dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=4,
                                    kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=32,
                                    rope_theta=10000.0, rope_interleaved=True, attention_bias=False,
                                    max_position_embeddings=1280,
                                    rope_scaling={"rope_type": "yarn", "factor": 40.0,
                                                  "original_max_position_embeddings": 32, "beta_fast": 32.0,
                                                  "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.707}),
    "deepseek-v2-lite-like": dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=4,
                                  kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=32,
                                  rope_theta=10000.0, rope_interleaved=True, attention_bias=False),
}


#: Input kinds of make_inputs.
ARCHS_JSON = Path(__file__).resolve().parents[2] / "gen" / "archs.json"


def preset_config(name: str) -> Dict[str, Any]:
    """The preset's HF fields straight from gen/archs.json (not through the library)."""
    for raw in json.loads(ARCHS_JSON.read_text())["presets"]:
        if f"{raw['family']}-{raw['size']}".lower() == name.lower():
            return raw
    raise KeyError(name)


MASKS = ["none", "explicit", "left-padding", "irregular", "broadcast"]


def irregular_positions(batch: int, seq_len: int, rng: np.random.Generator) -> np.ndarray:
    """Increasing positions with uneven gaps ([0, 5, 6, 20, ...] in row 0): not a
    shift of 0..seq_len-1, so RoPE's relative angles change with them (a layer
    that ignored position_ids would pass every whole-sequence shift)."""
    gaps = rng.integers(1, 6, (batch, seq_len))
    gaps[:, 0] = rng.integers(0, 40, batch)
    positions = np.cumsum(gaps, axis=-1)
    start = [0, 5, 6, 20][:seq_len]
    positions[0, :len(start)] = start
    if seq_len > 4:
        positions[0, 4:] = 20 + np.cumsum(gaps[0, 4:])
    return positions.astype(np.int64)


def make_inputs(kind: str, batch: int, seq_len: int, hidden: int, window: int, rng: np.random.Generator):
    """(hidden_states, attention_mask, position_ids) of a kind of MASKS:
    none          causal (+ window), positions 0..s-1
    explicit      a final mask per sequence (causal, no window on top), random additive
                  bias, positions offset by 1000 + 17 b
    left-padding  HF left padding of sequence 0 (mask and positions as HF builds them)
    irregular     causal (+ window), irregular_positions
    broadcast     one [1, 1, s, s] mask for every sequence, irregular positions"""
    x = rng.uniform(-1.0, 1.0, (batch, seq_len, hidden)).astype(np.float32)
    if kind == "none":
        return x, None, None
    if kind == "explicit":
        positions = 1000 + np.arange(seq_len)[None, :] + 17 * np.arange(batch)[:, None]
        return x, ref.causal_additive_mask(batch, seq_len, 0, rng), positions
    if kind == "left-padding":
        mask, positions = ref.left_padding([seq_len // 3] + [0] * (batch - 1), seq_len, window)
        return x, mask, positions
    if kind == "irregular":
        return x, None, irregular_positions(batch, seq_len, rng)
    if kind == "broadcast":
        return x, ref.causal_additive_mask(1, seq_len, 0, rng), irregular_positions(batch, seq_len, rng)
    raise ValueError(f"unknown input kind {kind!r}")
