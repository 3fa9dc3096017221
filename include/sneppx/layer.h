/* sneppx — one attention layer: weights in, forward pass out.
 *
 *   out = o_proj(attention(rope(q_proj(x)), rope(k_proj(x)), v_proj(x), mask))
 *
 * Shapes (row-major float32, HuggingFace layout):
 *   hidden_states  [batch, seq_len, hidden_size]
 *   attention_mask [batch, 1, seq_len, seq_len] additive, taken as final (no causal
 *                  mask is added on top); NULL = causal (+ sliding window).
 *                  mask_shape gives its 4 dimensions (checked); NULL when the mask is
 *                  (a shape without a mask is refused: a forgotten mask pointer).
 *                  Entries <= -1e30 (and -inf) count as masked; a row with every key
 *                  masked gives zeros.
 *   position_ids   [batch, seq_len]; NULL = 0..seq_len-1 for every batch row. Every
 *                  position must be in [0, max_position_embeddings) (the dynamic RoPE
 *                  type excepted: it exists to run past it); extend_context() raises it.
 *   out            [batch, seq_len, hidden_size]
 */
#ifndef SNEPPX_LAYER_H
#define SNEPPX_LAYER_H

#include <stdint.h>
#include "sneppx/cache.h"
#include "sneppx/config.h"
#include "sneppx/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* HF tensors of one self_attn module, row-major [out_features, in_features].
 * Unused entries are NULL. The layer copies (packs) what it needs at create,
 * so the caller may free these afterwards. Tensors in bfloat16 or float16:
 * sneppx_typed_weights below. */
typedef struct sneppx_weights {
    const float *q_proj_weight, *q_proj_bias;   /* [H*D, hidden], [H*D] */
    const float *k_proj_weight, *k_proj_bias;   /* [KV*D, hidden], [KV*D] */
    const float *v_proj_weight, *v_proj_bias;   /* [KV*D, hidden], [KV*D] */
    const float *o_proj_weight, *o_proj_bias;   /* [hidden, H*Dv], [hidden] */
    /* MLA (DeepSeek V2) */
    const float *q_a_proj_weight, *q_a_proj_bias; /* [q_lora, hidden] */
    const float *q_a_layernorm_weight;            /* [q_lora] */
    const float *q_b_proj_weight;                 /* [H*(nope+rope), q_lora] */
    const float *kv_a_proj_with_mqa_weight, *kv_a_proj_with_mqa_bias; /* [kv_lora+rope, hidden] */
    const float *kv_a_layernorm_weight;           /* [kv_lora] */
    const float *kv_b_proj_weight;                /* [H*(nope+v), kv_lora] */
} sneppx_weights;

typedef struct sneppx_layer sneppx_layer;

/* Validates config and weights, resolves (JIT-compiles or loads) every kernel
 * the layer needs, side by side on config->num_threads threads (0: OpenMP's
 * default), and packs the weights. Thread-safe.
 * weights == NULL gives deterministic synthetic weights: every tensor element is
 * uniform in [-1, 1) from splitmix64(SNEPPX_SYNTHETIC_SEED + tensor index, element
 * index), scaled by in_features^-0.5 (biases by 0.1; RMSNorm weights are 1 + 0.1 u). */
#define SNEPPX_SYNTHETIC_SEED 0x5eed5eedULL
SNEPPX_API sneppx_status sneppx_layer_create(const sneppx_config *config, const sneppx_weights *weights,
                                             sneppx_layer **layer);

/* One tensor of a checkpoint as it is stored: row-major elements of dtype.
 * SNEPPX_DTYPE_FLOAT32 (0: a zeroed ref is float32) reads floats; BFLOAT16 and
 * FLOAT16 read uint16_t bits in host byte order (bfloat16: a float32's high
 * half; FLOAT16: IEEE binary16), 2-byte aligned. Other types are refused. */
typedef struct sneppx_tensor_ref {
    const void *data;   /* NULL: not given */
    sneppx_dtype dtype;
} sneppx_tensor_ref;

/* sneppx_weights with each tensor's element type: the same fields in the same
 * order (offsetof(sneppx_weights, f) / sizeof(const float *) is field f's
 * position in both), so a checkpoint in bfloat16 or float16 is handed over as
 * it is, without a float32 copy. A struct and call of their own, so that
 * sneppx_weights and sneppx_layer_create keep their layout and meaning (ABI). */
typedef struct sneppx_typed_weights {
    sneppx_tensor_ref q_proj_weight, q_proj_bias;
    sneppx_tensor_ref k_proj_weight, k_proj_bias;
    sneppx_tensor_ref v_proj_weight, v_proj_bias;
    sneppx_tensor_ref o_proj_weight, o_proj_bias;
    sneppx_tensor_ref q_a_proj_weight, q_a_proj_bias;
    sneppx_tensor_ref q_a_layernorm_weight;
    sneppx_tensor_ref q_b_proj_weight;
    sneppx_tensor_ref kv_a_proj_with_mqa_weight, kv_a_proj_with_mqa_bias;
    sneppx_tensor_ref kv_a_layernorm_weight;
    sneppx_tensor_ref kv_b_proj_weight;
} sneppx_typed_weights;

/* sneppx_layer_create() from typed tensors (weights must not be NULL). Each
 * projection is packed into config->weight_dtype straight from the given
 * elements, 64 output rows at a time through a float32 scratch per thread (a
 * narrow source rounds exactly as its float32 widening would: bfloat16 into a
 * bfloat16 layer keeps every bit); biases and norm weights are widened to the
 * float32 the layer keeps them in; MLA's absorption (kv_b_proj) is computed in
 * float32 as with sneppx_layer_create. An unsupported dtype is
 * SNEPPX_ERR_INVALID_ARGUMENT naming the field and the type. Thread-safe, as
 * sneppx_layer_create. */
SNEPPX_API sneppx_status sneppx_layer_create_typed(const sneppx_config *config, const sneppx_typed_weights *weights,
                                                   sneppx_layer **layer);

/* Runs the forward pass. Thread-safe: several threads may call it on one layer
 * at once (each call uses its own scratch). Nothing is written to out on error.
 * batch and seq_len are each at most SNEPPX_MAX_SEQ_LEN, their product at most
 * SNEPPX_MAX_TOKENS (sneppx/limits.h; and the layer's activations at most 2^40 floats). */
SNEPPX_API sneppx_status sneppx_layer_forward(sneppx_layer *layer, int64_t batch, int64_t seq_len,
                                              const float *hidden_states, const float *attention_mask,
                                              const int64_t mask_shape[4], const int64_t *position_ids,
                                              float *out);

/* Resolves (compiles or loads from the disk cache) every kernel a layer of this
 * config uses, flash and SDPA, causal and explicit-mask, and decode over a KV
 * cache of each element type, side by side on config->num_threads threads,
 * without weights: for deployments that warm the cache. */
SNEPPX_API sneppx_status sneppx_layer_warmup(const sneppx_config *config);

/* Switches flash (1) / SDPA (0) on an existing layer (resolves the kernel);
 * any other value is SNEPPX_ERR_INVALID_ARGUMENT. Thread-safe beside forwards
 * and other switches. It writes the use_flash_attn of sneppx_layer_config's
 * config: read that field (or pass the config on) only while no switch runs. */
SNEPPX_API sneppx_status sneppx_layer_set_flash(sneppx_layer *layer, int use_flash_attn);

/* The config the layer was made from. */
SNEPPX_API const sneppx_config *sneppx_layer_config(const sneppx_layer *layer);

/* Canonical keys of the kernels the layer resolved, one per line. The string lives as
 * long as the layer and never changes; a kernel a forward resolves later (an explicit
 * mask, the other flash switch) is in the string of the next call. */
SNEPPX_API const char *sneppx_layer_keys(const sneppx_layer *layer);

/* Number of kernels the layer resolved so far, and how the i-th was found
 * (key, compiled / disk / memory, milliseconds). */
SNEPPX_API int sneppx_layer_kernel_count(const sneppx_layer *layer);
SNEPPX_API sneppx_status sneppx_layer_kernel_timing(const sneppx_layer *layer, int index, sneppx_kernel_timing *timing);

/* Floating-point operations of one forward with a causal (+window) mask: only
 * the arithmetic the mask keeps is counted (GEMMs 2*M*N*K, attention 2*(d+dv)
 * per visible query/key pair and head). */
SNEPPX_API double sneppx_layer_flops(const sneppx_layer *layer, int64_t batch, int64_t seq_len);

/* Bytes of the layer's packed weights (panels, biases, norm weights): what a
 * forward reads once per call, and what bounds a decode step from below. */
SNEPPX_API double sneppx_layer_weight_bytes(const sneppx_layer *layer);

SNEPPX_API void sneppx_layer_destroy(sneppx_layer *layer);

#ifdef __cplusplus
}
#endif
#endif
