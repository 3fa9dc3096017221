/* Reference attention forward for Llama / Mistral / Qwen2 (docs/MODELS.md section 5):
 * projections (+bias), RoPE, causal / sliding-window / explicit masks, GQA,
 * o projection. Plain loops in double, one batch row at a time. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mha_reference.h"

/* Explicit mask entries at or below this are "masked" (HF fills finfo.min). */
static const double ref_masked_below = -1.0e30;

void ref_linear(const double *in, int64_t rows, int64_t k, const float *weight, const float *bias,
                int64_t n, double *out)
{
    for (int64_t r = 0; r < rows; r++) {
        const double *x = in + r * k;
        for (int64_t c = 0; c < n; c++) {
            const float *w = weight + c * k;
            double sum = bias ? (double)bias[c] : 0.0;
            for (int64_t i = 0; i < k; i++)
                sum += x[i] * (double)w[i];
            out[r * n + c] = sum;
        }
    }
}

void ref_rmsnorm(double *x, int64_t rows, int64_t n, const float *weight, double eps)
{
    for (int64_t r = 0; r < rows; r++) {
        double *row = x + r * n;
        double sum_sq = 0.0;
        for (int64_t i = 0; i < n; i++)
            sum_sq += row[i] * row[i];
        const double inv_rms = 1.0 / sqrt(sum_sq / (double)n + eps);
        for (int64_t i = 0; i < n; i++)
            row[i] = row[i] * inv_rms * (double)weight[i];
    }
}

static int key_visible(const float *mask, int64_t seq_len, int64_t window, int64_t i, int64_t j)
{
    if (mask)
        return (double)mask[i * seq_len + j] > ref_masked_below;
    if (j > i)
        return 0;
    return window <= 0 || i - j <= window - 1;
}

void ref_attention_head(const double *q, int64_t q_stride, const double *k, int64_t k_stride,
                        const double *v, int64_t v_stride, int64_t seq_len, int64_t qk_dim,
                        int64_t v_dim, double scale, const float *mask, int64_t window,
                        double *out, int64_t out_stride)
{
    double *scores = malloc((size_t)seq_len * sizeof *scores);
    for (int64_t i = 0; i < seq_len; i++) {
        double *o = out + i * out_stride;
        memset(o, 0, (size_t)v_dim * sizeof *o);
        double max_score = -INFINITY;
        for (int64_t j = 0; j < seq_len; j++) {
            if (!key_visible(mask, seq_len, window, i, j))
                continue;
            double dot = 0.0;
            for (int64_t d = 0; d < qk_dim; d++)
                dot += q[i * q_stride + d] * k[j * k_stride + d];
            scores[j] = dot * scale + (mask ? (double)mask[i * seq_len + j] : 0.0);
            max_score = fmax(max_score, scores[j]);
        }
        if (max_score == -INFINITY)
            continue; /* every key masked: the row stays zero */
        double sum = 0.0;
        for (int64_t j = 0; j < seq_len; j++) {
            if (!key_visible(mask, seq_len, window, i, j))
                continue;
            const double p = exp(scores[j] - max_score);
            sum += p;
            for (int64_t d = 0; d < v_dim; d++)
                o[d] += p * v[j * v_stride + d];
        }
        for (int64_t d = 0; d < v_dim; d++)
            o[d] /= sum;
    }
    free(scores);
}

static double *widen(const float *x, int64_t n)
{
    double *wide = malloc((size_t)n * sizeof *wide);
    for (int64_t i = 0; i < n; i++)
        wide[i] = (double)x[i];
    return wide;
}

static const char *check_weights(const sneppx_config *config, const sneppx_weights *w)
{
    if (!w->q_proj_weight || !w->k_proj_weight || !w->v_proj_weight || !w->o_proj_weight)
        return "q/k/v/o_proj_weight must be present";
    if (config->qkv_bias && (!w->q_proj_bias || !w->k_proj_bias || !w->v_proj_bias))
        return "config.qkv_bias is set but q/k/v_proj_bias is missing";
    if (config->o_bias && !w->o_proj_bias)
        return "config.o_bias is set but o_proj_bias is missing";
    return NULL;
}

const char *ref_mha_forward(const sneppx_config *config, const sneppx_weights *weights,
                            int64_t batch, int64_t seq_len, const float *hidden_states,
                            const float *attention_mask, const int64_t *position_ids,
                            double *out)
{
    ref_dims dims;
    const char *problem = ref_dims_of(config, &dims);
    if (problem)
        return problem;
    if (dims.mla)
        return ref_mla_forward(config, &dims, weights, batch, seq_len, hidden_states,
                               attention_mask, position_ids, out);
    if ((problem = check_weights(config, weights)))
        return problem;

    const int64_t hidden = dims.hidden, d = dims.qk_head_dim;
    const int64_t q_width = dims.heads * d, kv_width = dims.kv_heads * d;
    double *inv_freq = malloc((size_t)(dims.rotary_dim / 2) * sizeof *inv_freq);
    double attention_factor;
    ref_rope_inv_freq(config, ref_dynamic_seq_len(batch, seq_len, position_ids), inv_freq,
                      &attention_factor);
    const double scale = ref_softmax_scale(config);
    double *q = malloc((size_t)(seq_len * q_width) * sizeof *q);
    double *k = malloc((size_t)(seq_len * kv_width) * sizeof *k);
    double *v = malloc((size_t)(seq_len * kv_width) * sizeof *v);
    double *attn = malloc((size_t)(seq_len * q_width) * sizeof *attn);

    for (int64_t b = 0; b < batch; b++) {
        double *x = widen(hidden_states + b * seq_len * hidden, seq_len * hidden);
        const int64_t *pos = position_ids ? position_ids + b * seq_len : NULL;
        const float *mask = attention_mask ? attention_mask + b * seq_len * seq_len : NULL;
        ref_linear(x, seq_len, hidden, weights->q_proj_weight, config->qkv_bias ? weights->q_proj_bias : NULL,
                   q_width, q);
        ref_linear(x, seq_len, hidden, weights->k_proj_weight, config->qkv_bias ? weights->k_proj_bias : NULL,
                   kv_width, k);
        ref_linear(x, seq_len, hidden, weights->v_proj_weight, config->qkv_bias ? weights->v_proj_bias : NULL,
                   kv_width, v);
        for (int64_t i = 0; i < seq_len; i++) {
            const int64_t position = pos ? pos[i] : i;
            for (int64_t h = 0; h < dims.heads; h++)
                ref_apply_rope(q + i * q_width + h * d, dims.rotary_dim, config->rope_interleaved,
                               inv_freq, attention_factor, position);
            for (int64_t h = 0; h < dims.kv_heads; h++)
                ref_apply_rope(k + i * kv_width + h * d, dims.rotary_dim, config->rope_interleaved,
                               inv_freq, attention_factor, position);
        }
        for (int64_t h = 0; h < dims.heads; h++) {
            const int64_t kv_head = h / dims.group; /* repeat_kv: blocks of `group` heads */
            ref_attention_head(q + h * d, q_width, k + kv_head * d, kv_width, v + kv_head * d, kv_width,
                               seq_len, d, d, scale, mask, config->sliding_window, attn + h * d, q_width);
        }
        ref_linear(attn, seq_len, q_width, weights->o_proj_weight, config->o_bias ? weights->o_proj_bias : NULL,
                   hidden, out + b * seq_len * hidden);
        free(x);
    }
    free(inv_freq);
    free(q);
    free(k);
    free(v);
    free(attn);
    return NULL;
}
