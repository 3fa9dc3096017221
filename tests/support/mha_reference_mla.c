/* Reference DeepSeek V2 multi-head latent attention in its naive form
 * (docs/MODELS.md section 6): q (LoRA + RMSNorm, or plain q_proj), the compressed
 * kv (kv_a_proj_with_mqa -> [latent | one shared rope key]), kv_a_layernorm,
 * kv_b_proj expanded per head, RoPE on the rope dims only, softmax scale with
 * mscale^2, then o_proj. */
#include <stdlib.h>
#include <string.h>

#include "mha_reference.h"

/* q_a_layernorm and kv_a_layernorm are built without an eps argument in the
 * DeepSeek code, so they use the class default, not config.rms_norm_eps. */
static const double mla_norm_eps = 1e-6;

static const char *check_mla_weights(const sneppx_config *config, const ref_dims *dims,
                                     const sneppx_weights *w)
{
    if (dims->q_lora_rank > 0) {
        if (!w->q_a_proj_weight || !w->q_a_layernorm_weight || !w->q_b_proj_weight)
            return "MLA with q_lora_rank needs q_a_proj, q_a_layernorm and q_b_proj weights";
        if (config->qkv_bias && !w->q_a_proj_bias)
            return "config.qkv_bias is set but q_a_proj_bias is missing";
    } else if (!w->q_proj_weight) {
        return "MLA without q_lora_rank needs q_proj_weight";
    }
    if (!w->kv_a_proj_with_mqa_weight || !w->kv_a_layernorm_weight || !w->kv_b_proj_weight ||
        !w->o_proj_weight)
        return "MLA needs kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj and o_proj weights";
    if (config->qkv_bias && !w->kv_a_proj_with_mqa_bias)
        return "config.qkv_bias is set but kv_a_proj_with_mqa_bias is missing";
    if (config->o_bias && !w->o_proj_bias)
        return "config.o_bias is set but o_proj_bias is missing";
    return NULL;
}

/* q [seq, H*(nope+rope)] of one batch row. */
static void project_queries(const sneppx_config *config, const ref_dims *dims, const sneppx_weights *w,
                            const double *x, int64_t seq_len, double *q)
{
    const int64_t q_width = dims->heads * dims->qk_head_dim;
    if (dims->q_lora_rank == 0) {
        ref_linear(x, seq_len, dims->hidden, w->q_proj_weight, NULL, q_width, q);
        return;
    }
    double *q_latent = malloc((size_t)(seq_len * dims->q_lora_rank) * sizeof *q_latent);
    ref_linear(x, seq_len, dims->hidden, w->q_a_proj_weight, config->qkv_bias ? w->q_a_proj_bias : NULL,
               dims->q_lora_rank, q_latent);
    ref_rmsnorm(q_latent, seq_len, dims->q_lora_rank, w->q_a_layernorm_weight, mla_norm_eps);
    ref_linear(q_latent, seq_len, dims->q_lora_rank, w->q_b_proj_weight, NULL, q_width, q);
    free(q_latent);
}

const char *ref_mla_forward(const sneppx_config *config, const ref_dims *dims,
                            const sneppx_weights *weights, int64_t batch, int64_t seq_len,
                            const float *hidden_states, const float *attention_mask,
                            const int64_t *position_ids, double *out)
{
    const char *problem = check_mla_weights(config, dims, weights);
    if (problem)
        return problem;
    const int64_t hidden = dims->hidden, heads = dims->heads;
    const int64_t nope = dims->nope_dim, rope = dims->rotary_dim, dq = dims->qk_head_dim;
    const int64_t dv = dims->v_head_dim, latent = dims->kv_lora_rank;
    const int64_t q_width = heads * dq, kv_a_width = latent + rope, kv_b_width = heads * (nope + dv);

    double *inv_freq = malloc((size_t)(rope / 2) * sizeof *inv_freq);
    double attention_factor;
    ref_rope_inv_freq(config, ref_dynamic_seq_len(batch, seq_len, position_ids), inv_freq,
                      &attention_factor);
    const double scale = ref_softmax_scale(config);

    double *x = malloc((size_t)(seq_len * hidden) * sizeof *x);
    double *q = malloc((size_t)(seq_len * q_width) * sizeof *q);
    double *kv_a = malloc((size_t)(seq_len * kv_a_width) * sizeof *kv_a);
    double *c = malloc((size_t)(seq_len * latent) * sizeof *c);
    double *kv_b = malloc((size_t)(seq_len * kv_b_width) * sizeof *kv_b);
    double *k_head = malloc((size_t)(seq_len * dq) * sizeof *k_head);
    double *attn = malloc((size_t)(seq_len * heads * dv) * sizeof *attn);

    for (int64_t b = 0; b < batch; b++) {
        for (int64_t i = 0; i < seq_len * hidden; i++)
            x[i] = (double)hidden_states[b * seq_len * hidden + i];
        const int64_t *pos = position_ids ? position_ids + b * seq_len : NULL;
        const float *mask = attention_mask ? attention_mask + b * seq_len * seq_len : NULL;

        project_queries(config, dims, weights, x, seq_len, q);
        ref_linear(x, seq_len, hidden, weights->kv_a_proj_with_mqa_weight,
                   config->qkv_bias ? weights->kv_a_proj_with_mqa_bias : NULL, kv_a_width, kv_a);
        for (int64_t i = 0; i < seq_len; i++)
            memcpy(c + i * latent, kv_a + i * kv_a_width, (size_t)latent * sizeof *c);
        ref_rmsnorm(c, seq_len, latent, weights->kv_a_layernorm_weight, mla_norm_eps);
        ref_linear(c, seq_len, latent, weights->kv_b_proj_weight, NULL, kv_b_width, kv_b);

        /* RoPE on the last `rope` dims of every q head and on the one shared k_pe. */
        for (int64_t i = 0; i < seq_len; i++) {
            const int64_t position = pos ? pos[i] : i;
            for (int64_t h = 0; h < heads; h++)
                ref_apply_rope(q + i * q_width + h * dq + nope, rope, config->rope_interleaved, inv_freq,
                               attention_factor, position);
            ref_apply_rope(kv_a + i * kv_a_width + latent, rope, config->rope_interleaved, inv_freq,
                           attention_factor, position);
        }
        for (int64_t h = 0; h < heads; h++) {
            /* k of head h: [k_nope (kv_b rows h*(nope+dv) ..) | shared k_pe]; v follows k_nope. */
            for (int64_t j = 0; j < seq_len; j++) {
                memcpy(k_head + j * dq, kv_b + j * kv_b_width + h * (nope + dv), (size_t)nope * sizeof *k_head);
                memcpy(k_head + j * dq + nope, kv_a + j * kv_a_width + latent, (size_t)rope * sizeof *k_head);
            }
            ref_attention_head(q + h * dq, q_width, k_head, dq, kv_b + h * (nope + dv) + nope, kv_b_width,
                               seq_len, dq, dv, scale, mask, 0, attn + h * dv, heads * dv);
        }
        ref_linear(attn, seq_len, heads * dv, weights->o_proj_weight, config->o_bias ? weights->o_proj_bias : NULL,
                   hidden, out + b * seq_len * hidden);
    }
    free(inv_freq);
    free(x);
    free(q);
    free(kv_a);
    free(c);
    free(kv_b);
    free(k_head);
    free(attn);
    return NULL;
}
