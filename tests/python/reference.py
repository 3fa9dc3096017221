"""Float64 numpy reference of the attention module forward (HF transformers semantics).

Written from docs/MODELS.md's formulas, independently of sneppx's kernels
and runtime (it never calls the library): tests compare sneppx's float32 output
against it with a normalized error (see ``normalized_error``).

Configs are read by HF config.json field names from either a mapping or an
object with those attributes (a ``sneppx.LLMConfig`` works as is):

    hidden_size, num_attention_heads, num_key_value_heads, head_dim,
    rope_theta, rope_scaling (HF dict: rope_type/type, factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings, beta_fast, beta_slow,
    mscale, mscale_all_dim, attention_factor), max_position_embeddings,
    sliding_window, partial_rotary_factor or rotary_dim, rope_interleaved,
    q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim.

Weights are a state dict with HF names ("q_proj.weight", "q_proj.bias", ...,
DeepSeek's "q_a_proj.weight", "kv_a_layernorm.weight", ...), row-major
[out_features, in_features]. A bias is added exactly when the state dict holds it.
"""
import math
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

#: Explicit mask entries at or below this count as masked (HF fills finfo(float32).min).
MASKED_BELOW = -1.0e30
#: max_position_embeddings when a config leaves it out (sneppx_config_init's and LLMConfig's default).
DEFAULT_MAX_POSITION_EMBEDDINGS = 4096
#: DeepSeek's q_a_layernorm / kv_a_layernorm are built without eps: the RMSNorm default.
MLA_NORM_EPS = 1e-6


def field(config: Any, name: str, default: Any = None) -> Any:
    """config[name] for mappings, getattr(config, name) otherwise; None -> default."""
    value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
    return default if value is None else value


def is_mla(config: Any) -> bool:
    return (field(config, "kv_lora_rank", 0) or 0) > 0


def head_dim(config: Any) -> int:
    """Per-head q/k width: head_dim, else hidden_size / num_attention_heads; MLA: nope + rope."""
    if is_mla(config):
        return int(field(config, "qk_nope_head_dim")) + int(field(config, "qk_rope_head_dim"))
    explicit = field(config, "head_dim", 0)
    return int(explicit) if explicit else int(field(config, "hidden_size")) // int(field(config, "num_attention_heads"))


def rotary_dim(config: Any) -> int:
    """Rotated dims per head: MLA qk_rope_head_dim; else rotary_dim, else
    int(head_dim * partial_rotary_factor), else head_dim."""
    if is_mla(config):
        return int(field(config, "qk_rope_head_dim"))
    explicit = field(config, "rotary_dim", 0)
    if explicit:
        return int(explicit)
    return int(head_dim(config) * float(field(config, "partial_rotary_factor", 1.0)))


def _scaling(config: Any) -> Tuple[str, Dict[str, Any]]:
    scaling = dict(field(config, "rope_scaling", None) or {})
    kind = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    return kind, scaling


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN magnitude correction: 1 for scale <= 1, else 0.1 * mscale * ln(scale) + 1."""
    return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(config: Any, seq_len: Optional[int] = None) -> Tuple[np.ndarray, float]:
    """RoPE inverse frequencies (rotary_dim/2, float64) and the cos/sin attention factor.

    seq_len is max(position_ids)+1 of the call (HF's dynamic update); only the
    dynamic type reads it. docs/MODELS.md section 2, every type."""
    dim = rotary_dim(config)
    base = float(field(config, "rope_theta", 10000.0))
    mpe = int(field(config, "max_position_embeddings", DEFAULT_MAX_POSITION_EMBEDDINGS))
    kind, s = _scaling(config)
    factor = float(s.get("factor", 1.0) or 1.0)
    orig = float(s.get("original_max_position_embeddings") or mpe)
    index = np.arange(0, dim // 2, dtype=np.float64)

    if kind == "dynamic":
        length = seq_len if seq_len is not None and seq_len > mpe else mpe
        base = base * ((factor * length / mpe) - (factor - 1.0)) ** (dim / (dim - 2))
    inv_freq = 1.0 / base ** (2.0 * index / dim)
    attention_factor = 1.0

    if kind == "linear":
        inv_freq = inv_freq / factor
    elif kind == "llama3":
        low, high = float(s["low_freq_factor"]), float(s["high_freq_factor"])
        wavelen = 2.0 * math.pi / inv_freq
        smooth = (orig / wavelen - low) / (high - low)
        blended = (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
        inv_freq = np.where(wavelen < orig / high, inv_freq,
                            np.where(wavelen > orig / low, inv_freq / factor, blended))
    elif kind == "yarn":
        beta_fast = float(s.get("beta_fast") or 32.0)
        beta_slow = float(s.get("beta_slow") or 1.0)

        def correction_dim(rotations: float) -> float:
            return dim * math.log(orig / (rotations * 2.0 * math.pi)) / (2.0 * math.log(base))

        low = max(math.floor(correction_dim(beta_fast)), 0)
        high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((index - low) / (high - low), 0.0, 1.0)
        inv_freq = inv_freq / factor * ramp + inv_freq * (1.0 - ramp)
        mscale, mscale_all_dim = s.get("mscale"), s.get("mscale_all_dim")
        if s.get("attention_factor"):
            attention_factor = float(s["attention_factor"])
        elif mscale and mscale_all_dim:
            attention_factor = yarn_get_mscale(factor, float(mscale)) / yarn_get_mscale(factor, float(mscale_all_dim))
        else:
            attention_factor = yarn_get_mscale(factor)
    elif kind not in ("default", "dynamic"):
        raise ValueError(f"rope_scaling: unknown type {kind!r}")
    return inv_freq, attention_factor


def extend_context(config: Mapping[str, Any], new_max_positions: int) -> Dict[str, Any]:
    """Static NTK-aware extension (a new dict): rope_theta *= (n/orig)^(d/(d-2)),
    d the rotary dim, orig the current max_position_embeddings, which becomes n."""
    out = dict(config)
    d = rotary_dim(config)
    ratio = new_max_positions / float(field(config, "max_position_embeddings", DEFAULT_MAX_POSITION_EMBEDDINGS))
    out["rope_theta"] = float(field(config, "rope_theta", 10000.0)) * ratio ** (d / (d - 2))
    out["max_position_embeddings"] = int(new_max_positions)
    return out


def softmax_scale(config: Any) -> float:
    """head_dim^-0.5; MLA: (nope+rope)^-0.5 * get_mscale(factor, mscale_all_dim)^2 when
    mscale_all_dim is set beside any scaled RoPE type (DeepSeek remote code and
    transformers' DeepseekV2Attention: not only yarn)."""
    scale = head_dim(config) ** -0.5
    kind, s = _scaling(config)
    if is_mla(config) and kind not in (None, "default") and s.get("mscale_all_dim"):
        scale *= yarn_get_mscale(float(s["factor"]), float(s["mscale_all_dim"])) ** 2
    return scale


def apply_rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray, attention_factor: float,
               interleaved: bool) -> np.ndarray:
    """Rotates the first 2*len(inv_freq) dims of x[..., batch, seq, (heads), dim].

    x: [batch, heads, seq, d]; positions: [batch, seq]. Half layout pairs (i, i+r/2)
    (HF rotate_half); interleaved pairs (2i, 2i+1). cos/sin carry attention_factor."""
    r = 2 * len(inv_freq)
    angle = positions[:, None, :, None].astype(np.float64) * inv_freq  # [b, 1, s, r/2]
    cos, sin = np.cos(angle) * attention_factor, np.sin(angle) * attention_factor
    out = x.copy()
    if interleaved:
        a, b = x[..., 0:r:2], x[..., 1:r:2]
        out[..., 0:r:2] = a * cos - b * sin
        out[..., 1:r:2] = b * cos + a * sin
    else:
        a, b = x[..., : r // 2], x[..., r // 2: r]
        out[..., : r // 2] = a * cos - b * sin
        out[..., r // 2: r] = b * cos + a * sin
    return out


def visible_keys(batch: int, seq_len: int, attention_mask: Optional[np.ndarray], window: int) -> np.ndarray:
    """Boolean [batch, 1, seq, seq]: explicit mask entries > -1e30, else causal with
    the sliding window (0 <= i - j <= W - 1)."""
    if attention_mask is not None:
        return np.asarray(attention_mask, dtype=np.float64) > MASKED_BELOW
    i = np.arange(seq_len)[:, None]
    j = np.arange(seq_len)[None, :]
    visible = j <= i
    if window and window > 0:
        visible &= (i - j) <= window - 1
    return np.broadcast_to(visible, (batch, 1, seq_len, seq_len))


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, visible: np.ndarray,
              attention_mask: Optional[np.ndarray]) -> np.ndarray:
    """softmax(scale * q k^T + mask) v over visible keys; q [b,H,s,dq], k [b,H,s,dq],
    v [b,H,s,dv] -> [b,H,s,dv]. A row with no visible key is zero."""
    scores = np.einsum("bhid,bhjd->bhij", q, k) * scale
    if attention_mask is not None:
        scores = scores + np.where(visible, np.asarray(attention_mask, dtype=np.float64), 0.0)
    scores = np.where(visible, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)
    any_visible = np.isfinite(row_max)
    p = np.exp(scores - np.where(any_visible, row_max, 0.0))
    p = np.where(visible, p, 0.0)
    total = p.sum(axis=-1, keepdims=True)
    p = np.divide(p, total, out=np.zeros_like(p), where=total > 0)
    # A hidden key adds nothing to a row, whatever its value holds (0 * NaN is NaN):
    # non-finite value rows reach only the rows that see them.
    finite = np.isfinite(v)
    out = np.einsum("bhij,bhjd->bhid", p, np.where(finite, v, 0.0))
    if not finite.all():
        seen = np.broadcast_to(visible, p.shape)
        for b, h, j in zip(*np.nonzero(~finite.all(axis=-1))):
            out[b, h] += np.where(seen[b, h, :, j, None], p[b, h, :, j, None] * v[b, h, j], 0.0)
    return out


def linear(x: np.ndarray, weights: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    """x @ W^T (+ b) in float64, for the state-dict module `name`."""
    out = x @ np.asarray(weights[name + ".weight"], dtype=np.float64).T
    bias = weights.get(name + ".bias")
    return out if bias is None else out + np.asarray(bias, dtype=np.float64)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * np.asarray(weight, dtype=np.float64)


def _positions(batch: int, seq_len: int, position_ids: Optional[np.ndarray]) -> np.ndarray:
    if position_ids is None:
        return np.broadcast_to(np.arange(seq_len, dtype=np.int64), (batch, seq_len))
    return np.asarray(position_ids, dtype=np.int64).reshape(batch, seq_len)


def mha_forward(config: Any, weights: Mapping[str, np.ndarray], hidden_states: np.ndarray,
                attention_mask: Optional[np.ndarray] = None,
                position_ids: Optional[np.ndarray] = None, kv_dtype: str = "float32",
                stored: Optional[Tuple[np.ndarray, Optional[np.ndarray]]] = None,
                rope_length: Optional[int] = None) -> np.ndarray:
    """The attention module forward in float64 -> [batch, seq, hidden].

    hidden_states [b, s, hidden]; attention_mask [b, 1, s, s] additive, taken as
    final, or None (causal + sliding_window); position_ids [b, s] or None (0..s-1).
    Llama / Mistral / Qwen2 per docs/MODELS.md section 5; MLA (kv_lora_rank > 0) in
    the naive form of section 6. kv_dtype: K (after RoPE) and V (MLA: the latent row,
    kv_a_layernorm'd c then k_pe after RoPE) as a KV cache of that type stores them
    (kv_stored), then attention in float64. stored: instead, the K/V a cache holds
    (KVCache.read of the whole sequence, batch 1): standard (k, v) [s, kv_heads, d],
    MLA (latent rows [s, kv_lora_rank + rope], None). rope_length: the length dynamic
    NTK scales by (default max(position_ids) + 1; a call of several sequences takes its
    longest, so a row computed alone needs the call's)."""
    x = np.asarray(hidden_states, dtype=np.float64)
    batch, seq_len, _ = x.shape
    positions = _positions(batch, seq_len, position_ids)
    inv_freq, attention_factor = rope_inv_freq(config, int(positions.max()) + 1 if rope_length is None else rope_length)
    # DeepSeek-V2's published config has no such field: HF's modeling code pairs its MLA
    # RoPE dims interleaved always (MODELS.md section 7's table), so that is MLA's default.
    interleaved = bool(field(config, "rope_interleaved", is_mla(config)))
    visible = visible_keys(batch, seq_len, attention_mask, int(field(config, "sliding_window", 0) or 0))
    if is_mla(config):
        return _mla_forward(config, weights, x, attention_mask, positions, inv_freq, attention_factor,
                            interleaved, visible, kv_dtype, stored)

    heads = int(field(config, "num_attention_heads"))
    kv_heads = int(field(config, "num_key_value_heads", heads))
    d = head_dim(config)
    q = linear(x, weights, "q_proj").reshape(batch, seq_len, heads, d).transpose(0, 2, 1, 3)
    k = linear(x, weights, "k_proj").reshape(batch, seq_len, kv_heads, d).transpose(0, 2, 1, 3)
    v = linear(x, weights, "v_proj").reshape(batch, seq_len, kv_heads, d).transpose(0, 2, 1, 3)
    q = apply_rope(q, positions, inv_freq, attention_factor, interleaved)
    k = kv_stored(apply_rope(k, positions, inv_freq, attention_factor, interleaved), kv_dtype)
    v = kv_stored(v, kv_dtype)
    if stored is not None:
        k, v = (np.asarray(a, dtype=np.float64).transpose(1, 0, 2)[None] for a in stored)
    group = heads // kv_heads
    k = np.repeat(k, group, axis=1)  # repeat_kv: head h reads kv head h // group
    v = np.repeat(v, group, axis=1)
    o = attention(q, k, v, softmax_scale(config), visible, attention_mask)
    return linear(o.transpose(0, 2, 1, 3).reshape(batch, seq_len, heads * d), weights, "o_proj")


def _mla_forward(config: Any, weights: Mapping[str, np.ndarray], x: np.ndarray,
                 attention_mask: Optional[np.ndarray], positions: np.ndarray, inv_freq: np.ndarray,
                 attention_factor: float, interleaved: bool, visible: np.ndarray,
                 kv_dtype: str = "float32",
                 stored: Optional[Tuple[np.ndarray, Optional[np.ndarray]]] = None) -> np.ndarray:
    batch, seq_len, _ = x.shape
    heads = int(field(config, "num_attention_heads"))
    nope, rope = int(field(config, "qk_nope_head_dim")), int(field(config, "qk_rope_head_dim"))
    dv, latent = int(field(config, "v_head_dim")), int(field(config, "kv_lora_rank"))
    if field(config, "q_lora_rank", 0):
        q = linear(rms_norm(linear(x, weights, "q_a_proj"), weights["q_a_layernorm.weight"], MLA_NORM_EPS),
                   weights, "q_b_proj")
    else:
        q = linear(x, weights, "q_proj")
    q = q.reshape(batch, seq_len, heads, nope + rope).transpose(0, 2, 1, 3)
    compressed = linear(x, weights, "kv_a_proj_with_mqa")            # [b, s, latent + rope]
    c = rms_norm(compressed[..., :latent], weights["kv_a_layernorm.weight"], MLA_NORM_EPS)
    k_pe = compressed[:, None, :, latent:]                           # one rope key for all heads
    k_pe = apply_rope(k_pe, positions, inv_freq, attention_factor, interleaved)
    # The cache's latent row [c | k_pe] as stored (one int8 scale for the row), then
    # k_nope and v from it: what the absorbed form computes over the stored rows.
    row = kv_stored(np.concatenate([c, k_pe[:, 0]], axis=-1), kv_dtype)
    if stored is not None:
        row = np.asarray(stored[0], dtype=np.float64)[None]
    c, k_pe = row[..., :latent], row[:, None, :, latent:]
    kv = linear(c, weights, "kv_b_proj").reshape(batch, seq_len, heads, nope + dv).transpose(0, 2, 1, 3)
    q_pe = apply_rope(q[..., nope:], positions, inv_freq, attention_factor, interleaved)
    q = np.concatenate([q[..., :nope], q_pe], axis=-1)
    k = np.concatenate([kv[..., :nope], np.broadcast_to(k_pe, (batch, heads, seq_len, rope))], axis=-1)
    o = attention(q, k, kv[..., nope:], softmax_scale(config), visible, attention_mask)
    return linear(o.transpose(0, 2, 1, 3).reshape(batch, seq_len, heads * dv), weights, "o_proj")


def random_state_dict(config: Any, rng: np.random.Generator, qkv_bias: bool = True,
                      o_bias: bool = True) -> Dict[str, np.ndarray]:
    """Float32 weights in HF names for config: matrices with variance 1/in_features,
    biases in [-0.5, 0.5) (q/k/v or MLA q_a/kv_a when qkv_bias, o when o_bias),
    RMSNorm weights in [0.5, 1.5)."""
    hidden, heads = int(field(config, "hidden_size")), int(field(config, "num_attention_heads"))
    shapes: Dict[str, Tuple[int, int]] = {}
    biases = []
    if is_mla(config):
        dq = head_dim(config)
        latent, rope = int(field(config, "kv_lora_rank")), int(field(config, "qk_rope_head_dim"))
        nope, dv = int(field(config, "qk_nope_head_dim")), int(field(config, "v_head_dim"))
        q_lora = int(field(config, "q_lora_rank", 0) or 0)
        if q_lora:
            shapes.update({"q_a_proj": (q_lora, hidden), "q_b_proj": (heads * dq, q_lora)})
            biases.append("q_a_proj")
        else:
            shapes["q_proj"] = (heads * dq, hidden)
        shapes.update({"kv_a_proj_with_mqa": (latent + rope, hidden), "kv_b_proj": (heads * (nope + dv), latent),
                       "o_proj": (hidden, heads * dv)})
        biases.append("kv_a_proj_with_mqa")
    else:
        d, kv_heads = head_dim(config), int(field(config, "num_key_value_heads", heads))
        shapes.update({"q_proj": (heads * d, hidden), "k_proj": (kv_heads * d, hidden),
                       "v_proj": (kv_heads * d, hidden), "o_proj": (hidden, heads * d)})
        biases += ["q_proj", "k_proj", "v_proj"]

    def uniform(size: Any, low: float, high: float) -> np.ndarray:
        # Drawn in float32 directly: preset-sized matrices need no float64 temporary.
        values = rng.random(size, dtype=np.float32)
        values *= np.float32(high - low)
        values += np.float32(low)
        return values

    out = {}
    for name, (rows, cols) in shapes.items():
        limit = math.sqrt(3.0 / cols)
        out[name + ".weight"] = uniform((rows, cols), -limit, limit)
    for name in biases if qkv_bias else []:
        out[name + ".bias"] = uniform(shapes[name][0], -0.5, 0.5)
    if o_bias:
        out["o_proj.bias"] = uniform(hidden, -0.5, 0.5)
    if is_mla(config):
        if field(config, "q_lora_rank", 0):
            out["q_a_layernorm.weight"] = uniform(int(field(config, "q_lora_rank")), 0.5, 1.5)
        out["kv_a_layernorm.weight"] = uniform(int(field(config, "kv_lora_rank")), 0.5, 1.5)
    return out


#: Rows of k that share an int8 scale, as config.h documents (test_config_fields pins it to
#: templates/abi.h.j2's SNEPPX_GEMM_INT8_GROUP).
INT8_GROUP = 32


def quantize_int8(array: np.ndarray, group: int = INT8_GROUP) -> Tuple[np.ndarray, np.ndarray]:
    """(q, scales) of float32 rows quantized per group of `group` along the last axis
    (weights: INT8_GROUP of a GEMM's k, the last group short when k is not a multiple;
    a KV cache: the whole row): scale = max |w| / 127
    in float32, q = w / scale rounded to nearest even (np.rint) and clipped to
    [-127, 127] as int8; an all-zero group has scale 0 and q 0, a group holding a
    non-finite value scale NaN and q 0. scales has ceil(k / group) per row."""
    array = np.ascontiguousarray(array, dtype=np.float32)
    k = array.shape[-1]
    groups = -(-k // group)
    padded = np.zeros(array.shape[:-1] + (groups * group,), np.float32)
    padded[..., :k] = array
    grouped = padded.reshape(array.shape[:-1] + (groups, group))
    finite = np.isfinite(grouped)
    largest = np.abs(np.where(finite, grouped, np.float32(0))).max(axis=-1)
    scales = np.where(finite.all(axis=-1), largest / np.float32(127), np.float32(np.nan)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.rint(grouped / scales[..., None])
    q = np.where(scales[..., None] > 0, np.clip(ratio, -127, 127), 0).astype(np.int8)
    return q.reshape(padded.shape)[..., :k], scales


def dequantize_int8(q: np.ndarray, scales: np.ndarray, group: int = INT8_GROUP) -> np.ndarray:
    """q * its group's scale, the float32 product the kernels form."""
    k = q.shape[-1]
    return (q.astype(np.float32) * np.repeat(scales, group, axis=-1)[..., :k]).astype(np.float32)


def round_to(array: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values rounded to dtype ("float32", "bfloat16", "float16", "int8") and back,
    exactly as float32: bfloat16 to nearest even on the float32 bits (a NaN stays NaN),
    float16 by numpy's IEEE conversion (nearest even, overflow to inf), int8 quantized
    along the last axis (quantize_int8) and dequantized."""
    array = np.ascontiguousarray(array, dtype=np.float32)
    if dtype == "float32":
        return array.copy()
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return array.astype(np.float16).astype(np.float32)
    if dtype == "int8":
        return dequantize_int8(*quantize_int8(array))
    if dtype != "bfloat16":
        raise ValueError(f"dtype: {dtype!r}")
    bits = array.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    return np.where(np.isnan(array), array, rounded.view(np.float32))


def kv_stored(values: np.ndarray, dtype: str) -> np.ndarray:
    """Rows (last axis) as a KV cache of dtype holds them, read back as float64: the
    float32 values (what the layer computes) rounded by round_to, or int8-quantized
    with one scale per row (quantize_int8 with the row as its group) and scaled back."""
    values32 = np.asarray(values, dtype=np.float32)
    if dtype == "int8":
        row = values32.shape[-1]
        return dequantize_int8(*quantize_int8(values32, row), row).astype(np.float64)
    return round_to(values32, dtype).astype(np.float64)


def round_weights(weights: Mapping[str, np.ndarray], dtype: str, config: Any = None) -> Dict[str, np.ndarray]:
    """The weights a layer of weight_dtype dtype computes with: every projection matrix
    rounded to dtype (round_to, along HF's in_features: the GEMM's k), biases and RMSNorm
    weights as given. MLA's absorbed W_UK^T and W_UV are a transpose and a slice of
    kv_b_proj: an element type rounds them as it rounds kv_b_proj, but int8 groups run
    along each GEMM's own k, and W_UK^T's k is qk_nope_head_dim, not kv_lora_rank; so for
    an absorbed MLA layer (config given, not mla_naive) int8 rounds each head's W_UK^T
    and W_UV as the layer packs them."""
    out = {name: round_to(value, dtype) if name.endswith(".weight") and "layernorm" not in name
           else np.asarray(value) for name, value in weights.items()}
    if dtype == "int8" and config is not None and is_mla(config) and not field(config, "mla_naive", 0):
        heads = int(field(config, "num_attention_heads"))
        nope, dv = int(field(config, "qk_nope_head_dim")), int(field(config, "v_head_dim"))
        kv_b = np.asarray(weights["kv_b_proj.weight"], np.float32)
        per_head = kv_b.reshape(heads, nope + dv, kv_b.shape[-1])
        uk = round_to(per_head[:, :nope].transpose(0, 2, 1), "int8").transpose(0, 2, 1)
        uv = round_to(per_head[:, nope:], "int8")
        out["kv_b_proj.weight"] = np.concatenate([uk, uv], axis=1).reshape(kv_b.shape)
    return out


def causal_additive_mask(batch: int, seq_len: int, window: int = 0,
                         rng: Optional[np.random.Generator] = None) -> np.ndarray:
    """HF's 4-D additive mask [batch, 1, seq, seq]: visible (j <= i, and i - j <= W - 1
    when window > 0) -> 0, or a random bias in [-2, 0) when rng is given; masked ->
    finfo(float32).min."""
    visible = visible_keys(batch, seq_len, None, window)
    values = np.zeros(visible.shape, np.float32) if rng is None else \
        (-2.0 * rng.random(visible.shape)).astype(np.float32)
    return np.where(visible, values, np.finfo(np.float32).min).astype(np.float32)


def left_padding(pads: "list[int]", seq_len: int, window: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Mask and position_ids of a left-padded batch (row b starts with pads[b] pad tokens),
    built as HF does: causal (+ window) AND key is not a pad; position_ids =
    cumsum(attention_mask) - 1 with pads set to 1. Pad query rows see no key."""
    batch = len(pads)
    keep = np.arange(seq_len)[None, :] >= np.asarray(pads)[:, None]                  # [b, s]
    visible = visible_keys(batch, seq_len, None, window) & keep[:, None, None, :]
    mask = np.where(visible, 0.0, np.finfo(np.float32).min).astype(np.float32)
    positions = np.where(keep, np.cumsum(keep, axis=-1) - 1, 1).astype(np.int64)
    return mask, positions


def normalized_error(got: np.ndarray, want: np.ndarray) -> Tuple[float, float]:
    """(max |got - want| / max |want|, RMS-relative sqrt(sum diff^2 / sum want^2));
    absolute values when want is all zero; inf if got has NaN/Inf."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if not np.all(np.isfinite(got)):
        return math.inf, math.inf
    diff = np.abs(got - want)
    peak, energy = float(np.max(np.abs(want), initial=0.0)), float(np.sum(want * want))
    max_err = float(np.max(diff, initial=0.0))
    rms = float(np.sqrt(np.sum(diff * diff) / energy)) if energy > 0 else float(np.sqrt(np.mean(diff * diff)))
    return (max_err / peak if peak > 0 else max_err), rms


#: fp32 kernels vs this float64 reference; the same budget as tests/support/test_forward_case.h
#: (there: why). max-normalized, RMS-relative.
FP32_MAX_NORMALIZED = 1e-4
FP32_RMS_RELATIVE = 2e-5
