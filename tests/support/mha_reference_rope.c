/* Reference RoPE: inverse frequencies of every variant, static NTK extension,
 * softmax scale and the rotation itself (docs/MODELS.md sections 2 and 3), written
 * from the formulas, not from sneppx's rope code. */
#include <math.h>
#include <stddef.h>

#include "mha_reference.h"

static const double ref_pi = 3.14159265358979323846;

const char *ref_dims_of(const sneppx_config *config, ref_dims *dims)
{
    if (!config || !dims)
        return "config and dims must not be NULL";
    if (config->hidden_size <= 0 || config->num_attention_heads <= 0)
        return "hidden_size and num_attention_heads must be positive";
    dims->hidden = config->hidden_size;
    dims->heads = config->num_attention_heads;
    dims->mla = config->kv_lora_rank > 0;
    if (dims->mla) {
        dims->kv_heads = dims->heads;
        dims->group = 1;
        dims->nope_dim = config->qk_nope_head_dim;
        dims->rotary_dim = config->qk_rope_head_dim;
        dims->qk_head_dim = config->qk_nope_head_dim + config->qk_rope_head_dim;
        dims->v_head_dim = config->v_head_dim;
        dims->q_lora_rank = config->q_lora_rank;
        dims->kv_lora_rank = config->kv_lora_rank;
        if (dims->rotary_dim <= 0 || dims->rotary_dim % 2 || dims->v_head_dim <= 0)
            return "MLA needs an even qk_rope_head_dim and a positive v_head_dim";
        return NULL;
    }
    if (config->num_key_value_heads <= 0 || config->num_attention_heads % config->num_key_value_heads)
        return "num_key_value_heads must divide num_attention_heads";
    dims->kv_heads = config->num_key_value_heads;
    dims->group = dims->heads / dims->kv_heads;
    dims->qk_head_dim = config->head_dim > 0 ? config->head_dim : config->hidden_size / config->num_attention_heads;
    dims->v_head_dim = dims->qk_head_dim;
    dims->rotary_dim = config->rotary_dim > 0 ? config->rotary_dim : dims->qk_head_dim;
    dims->q_lora_rank = dims->kv_lora_rank = dims->nope_dim = 0;
    if (dims->rotary_dim % 2 || dims->rotary_dim > dims->qk_head_dim)
        return "rotary_dim must be even and at most head_dim";
    return NULL;
}

double ref_yarn_mscale(double scale, double mscale)
{
    if (scale <= 1.0)
        return 1.0;
    return 0.1 * mscale * log(scale) + 1.0;
}

/* The original context the scaled types are relative to (0 means max_position_embeddings). */
static double original_context(const sneppx_config *config)
{
    int64_t orig = config->rope_scaling.original_max_position_embeddings;
    return (double)(orig > 0 ? orig : config->max_position_embeddings);
}

static int64_t rotary_dim_of(const sneppx_config *config)
{
    ref_dims dims;
    if (ref_dims_of(config, &dims))
        return 0;
    return dims.rotary_dim;
}

/* HF _compute_llama3_parameters: keep short wavelengths, divide long ones by
 * factor, blend linearly in between (both band edges inclusive). */
static void scale_llama3(const sneppx_rope_scaling *scaling, double orig, int64_t half, double *inv_freq)
{
    const double low_freq_wavelen = orig / scaling->low_freq_factor;
    const double high_freq_wavelen = orig / scaling->high_freq_factor;
    for (int64_t i = 0; i < half; i++) {
        const double wavelen = 2.0 * ref_pi / inv_freq[i];
        if (wavelen < high_freq_wavelen)
            continue;
        if (wavelen > low_freq_wavelen) {
            inv_freq[i] = inv_freq[i] / scaling->factor;
            continue;
        }
        const double smooth = (orig / wavelen - scaling->low_freq_factor) /
                              (scaling->high_freq_factor - scaling->low_freq_factor);
        inv_freq[i] = (1.0 - smooth) * inv_freq[i] / scaling->factor + smooth * inv_freq[i];
    }
}

/* HF _compute_yarn_parameters with truncate=True: a linear ramp over the pair
 * index between the correction dims of beta_fast and beta_slow. */
static double scale_yarn(const sneppx_rope_scaling *scaling, double base, double orig, int64_t dim,
                         double *inv_freq)
{
    const double beta_fast = scaling->beta_fast > 0 ? scaling->beta_fast : 32.0;
    const double beta_slow = scaling->beta_slow > 0 ? scaling->beta_slow : 1.0;
    const double d = (double)dim;
    const double corr_fast = d * log(orig / (beta_fast * 2.0 * ref_pi)) / (2.0 * log(base));
    const double corr_slow = d * log(orig / (beta_slow * 2.0 * ref_pi)) / (2.0 * log(base));
    double low = fmax(floor(corr_fast), 0.0);
    double high = fmin(ceil(corr_slow), d - 1.0);
    if (low == high)
        high += 0.001;
    for (int64_t i = 0; i < dim / 2; i++) {
        double ramp = ((double)i - low) / (high - low);
        ramp = fmin(fmax(ramp, 0.0), 1.0);
        const double extrapolated = inv_freq[i];
        const double interpolated = inv_freq[i] / scaling->factor;
        inv_freq[i] = interpolated * ramp + extrapolated * (1.0 - ramp);
    }
    if (scaling->attention_factor > 0)
        return scaling->attention_factor;
    if (scaling->mscale != 0 && scaling->mscale_all_dim != 0)
        return ref_yarn_mscale(scaling->factor, scaling->mscale) /
               ref_yarn_mscale(scaling->factor, scaling->mscale_all_dim);
    return ref_yarn_mscale(scaling->factor, 1.0);
}

void ref_rope_inv_freq(const sneppx_config *config, int64_t seq_len, double *inv_freq,
                       double *attention_factor)
{
    const sneppx_rope_scaling *scaling = &config->rope_scaling;
    const int64_t dim = rotary_dim_of(config);
    const int64_t half = dim / 2;
    double base = config->rope_theta;
    *attention_factor = 1.0;

    if (scaling->type == SNEPPX_ROPE_DYNAMIC) {
        /* HF _compute_dynamic_ntk_parameters: L = max(seq_len, MPE). */
        const double mpe = (double)config->max_position_embeddings;
        const double length = seq_len > config->max_position_embeddings ? (double)seq_len : mpe;
        const double grown = scaling->factor * length / mpe - (scaling->factor - 1.0);
        base = base * pow(grown, (double)dim / (double)(dim - 2));
    }
    for (int64_t i = 0; i < half; i++)
        inv_freq[i] = 1.0 / pow(base, (double)(2 * i) / (double)dim);

    switch (scaling->type) {
    case SNEPPX_ROPE_LINEAR:
        for (int64_t i = 0; i < half; i++)
            inv_freq[i] /= scaling->factor;
        break;
    case SNEPPX_ROPE_LLAMA3:
        scale_llama3(scaling, original_context(config), half, inv_freq);
        break;
    case SNEPPX_ROPE_YARN:
        *attention_factor = scale_yarn(scaling, base, original_context(config), dim, inv_freq);
        break;
    default:
        break;
    }
}

void ref_extend_context(sneppx_config *config, int64_t new_max_positions)
{
    const double d = (double)rotary_dim_of(config);
    const double ratio = (double)new_max_positions / (double)config->max_position_embeddings;
    config->rope_theta = config->rope_theta * pow(ratio, d / (d - 2.0));
    config->max_position_embeddings = new_max_positions;
}

double ref_softmax_scale(const sneppx_config *config)
{
    ref_dims dims;
    if (ref_dims_of(config, &dims))
        return 0.0;
    double scale = 1.0 / sqrt((double)dims.qk_head_dim);
    const sneppx_rope_scaling *scaling = &config->rope_scaling;
    /* DeepSeek applies it whenever rope_scaling carries mscale_all_dim: beside any
     * scaled type (linear, dynamic, llama3 too), never with plain RoPE. */
    if (dims.mla && scaling->type != SNEPPX_ROPE_DEFAULT && scaling->mscale_all_dim != 0) {
        const double mscale = ref_yarn_mscale(scaling->factor, scaling->mscale_all_dim);
        scale *= mscale * mscale;
    }
    return scale;
}

void ref_apply_rope(double *head, int64_t rotary_dim, int interleaved, const double *inv_freq,
                    double attention_factor, int64_t position)
{
    const int64_t half = rotary_dim / 2;
    for (int64_t i = 0; i < half; i++) {
        const double angle = (double)position * inv_freq[i];
        const double c = cos(angle) * attention_factor;
        const double s = sin(angle) * attention_factor;
        double *a = interleaved ? &head[2 * i] : &head[i];
        double *b = interleaved ? &head[2 * i + 1] : &head[i + half];
        const double x = *a, y = *b;
        *a = x * c - y * s;
        *b = y * c + x * s;
    }
}

int64_t ref_dynamic_seq_len(int64_t batch, int64_t seq_len, const int64_t *position_ids)
{
    if (!position_ids)
        return seq_len;
    int64_t max_position = 0;
    for (int64_t i = 0; i < batch * seq_len; i++)
        if (position_ids[i] > max_position)
            max_position = position_ids[i];
    return max_position + 1;
}
