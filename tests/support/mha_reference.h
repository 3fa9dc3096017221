/* Float64 reference of the attention module forward (HF transformers semantics,
 * docs/MODELS.md), written from the formulas and independent of every
 * sneppx kernel and runtime function: it reads the public config and weight
 * structs and nothing else of the library.
 *
 * Everything is computed in double from the float32 inputs; tests compare the
 * float32 kernels against it with a normalized error. */
#ifndef SNEPPX_TEST_MHA_REFERENCE_H
#define SNEPPX_TEST_MHA_REFERENCE_H

#include <stdint.h>
#include "sneppx/config.h"
#include "sneppx/layer.h"

/* Shapes a config implies, resolved as docs/MODELS.md defines them. */
typedef struct ref_dims {
    int mla;                /* kv_lora_rank > 0: DeepSeek V2 multi-head latent attention */
    int64_t hidden;
    int64_t heads;          /* query heads H */
    int64_t kv_heads;       /* K/V heads (MLA: H, one K/V per head in the naive form) */
    int64_t group;          /* H / kv_heads */
    int64_t qk_head_dim;    /* per-head q/k width (MLA: nope + rope) */
    int64_t v_head_dim;
    int64_t rotary_dim;     /* rotated dims per head (MLA: qk_rope_head_dim) */
    int64_t q_lora_rank;    /* MLA, 0 = plain q_proj */
    int64_t kv_lora_rank;   /* MLA latent width */
    int64_t nope_dim;       /* MLA qk_nope_head_dim */
} ref_dims;

/* Fills dims; returns NULL, or a message naming what the reference cannot represent. */
const char *ref_dims_of(const sneppx_config *config, ref_dims *dims);

/* YaRN magnitude correction get_mscale(s, m): 1 for s <= 1, else 0.1 m ln s + 1. */
double ref_yarn_mscale(double scale, double mscale);

/* RoPE inverse frequencies (rotary_dim/2 values) and the cos/sin attention factor
 * for every sneppx_rope_type (docs/MODELS.md section 2). seq_len is max(position_ids)+1
 * over the whole call; only the dynamic type reads it. */
void ref_rope_inv_freq(const sneppx_config *config, int64_t seq_len, double *inv_freq,
                       double *attention_factor);

/* Static NTK-aware context extension, as config.h documents it:
 * rope_theta *= (n/orig)^(d/(d-2)) with d the rotary dim, orig the current
 * max_position_embeddings, which becomes n. */
void ref_extend_context(sneppx_config *config, int64_t new_max_positions);

/* Scale of q.k: head_dim^-0.5; MLA: (nope+rope)^-0.5 * get_mscale(factor, mscale_all_dim)^2
 * when mscale_all_dim is set beside any scaled RoPE type (DeepSeek remote code). */
double ref_softmax_scale(const sneppx_config *config);

/* Rotates one head in place by angle position*inv_freq[i], cos/sin times
 * attention_factor: half layout pairs (i, i+r/2) (HF rotate_half), interleaved
 * pairs (2i, 2i+1). Only the first rotary_dim entries change. */
void ref_apply_rope(double *head, int64_t rotary_dim, int interleaved, const double *inv_freq,
                    double attention_factor, int64_t position);

/* out[rows, n] = in[rows, k] @ weight[n, k]^T (+ bias[n]); in double, weight float. */
void ref_linear(const double *in, int64_t rows, int64_t k, const float *weight, const float *bias,
                int64_t n, double *out);

/* In place: x[rows, n] = x / sqrt(mean(x^2) + eps) * weight. */
void ref_rmsnorm(double *x, int64_t rows, int64_t n, const float *weight, double eps);

/* One head's attention for all query rows of a sequence:
 * out[i, :] = softmax_j(scale * q_i.k_j + mask_ij) v_j over the keys visible to i.
 * q row i at q + i*q_stride; key/value j at k + j*k_stride, v + j*v_stride; out row
 * i at out + i*out_stride. mask (seq x seq, row stride seq) non-NULL: visible iff
 * the entry is > -1e30 (its value is added); NULL: causal, and with window > 0
 * also i - j <= window - 1. A row without visible keys is zero. */
void ref_attention_head(const double *q, int64_t q_stride, const double *k, int64_t k_stride,
                        const double *v, int64_t v_stride, int64_t seq_len, int64_t qk_dim,
                        int64_t v_dim, double scale, const float *mask, int64_t window,
                        double *out, int64_t out_stride);

/* The attention module forward (docs/MODELS.md sections 5 and 6; MLA in its naive form).
 *   hidden_states [batch, seq_len, hidden], attention_mask [batch, 1, seq_len, seq_len]
 *   or NULL (causal + sliding window), position_ids [batch, seq_len] or NULL (0..s-1),
 *   out [batch, seq_len, hidden] in double.
 * Biases are added where the config says so (qkv_bias: q/k/v, MLA q_a_proj and
 * kv_a_proj_with_mqa; o_bias: o_proj); those weights must then be present.
 * Returns NULL, or a message naming the missing weight or unsupported field. */
const char *ref_mha_forward(const sneppx_config *config, const sneppx_weights *weights,
                            int64_t batch, int64_t seq_len, const float *hidden_states,
                            const float *attention_mask, const int64_t *position_ids,
                            double *out);

/* The MLA part of ref_mha_forward (called by it when dims.mla). */
const char *ref_mla_forward(const sneppx_config *config, const ref_dims *dims,
                            const sneppx_weights *weights, int64_t batch, int64_t seq_len,
                            const float *hidden_states, const float *attention_mask,
                            const int64_t *position_ids, double *out);

/* max(position_ids)+1 over the whole call (seq_len when position_ids is NULL):
 * the length HF's dynamic RoPE update sees. */
int64_t ref_dynamic_seq_len(int64_t batch, int64_t seq_len, const int64_t *position_ids);

#endif
