/* Configs: presets from the generated registry table, hand configs, validation,
 * context extension and the RoPE quantities the runtime derives from a config. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "config_internal.h"
#include "config_ranges.h"
#include "error.h"
#include "host.h"
#include "kernel_registry.h"
#include "presets.h"
#include "sneppx/config.h"

void sneppx_config_init(sneppx_config *config)
{
    if (config)
        *config = sneppx_config_defaults;
}

const char *sneppx_dtype_name(int dtype)
{
    return dtype >= 0 && dtype < SNEPPX_DTYPE_COUNT ? sneppx_dtype_names[dtype] : NULL;
}

int sneppx_preset_count(void) { return sneppx_presets_count; }

const char *sneppx_preset_name(int index)
{
    if (index < 0 || index >= sneppx_presets_count)
        return NULL;
    return sneppx_presets[index].name;
}

static int preset_matches(const struct sneppx_preset *preset, const char *family, const char *size)
{
    if (size)
        return strcasecmp(preset->family, family) == 0 && strcasecmp(preset->size, size) == 0;
    if (strcasecmp(preset->name, family) == 0)
        return 1;
    for (const char *const *alias = preset->aliases; alias && *alias; alias++)
        if (strcasecmp(*alias, family) == 0)
            return 1;
    return 0;
}

sneppx_status sneppx_config_from_name(const char *family, const char *size, sneppx_config *config)
{
    sneppx_clear_error();
    if (!family)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "family: must not be NULL");
    if (!config)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config: must not be NULL");
    for (int i = 0; i < sneppx_presets_count; i++) {
        if (preset_matches(&sneppx_presets[i], family, size)) {
            *config = sneppx_presets[i].config;
            return SNEPPX_OK;
        }
    }
    char valid[1024] = "";
    size_t used = 0;
    for (int i = 0; i < sneppx_presets_count && used < sizeof valid; i++)
        used += (size_t)snprintf(valid + used, sizeof valid - used, "%s%s", i ? ", " : "",
                                 sneppx_presets[i].name);
    /* The name comes from the caller (often a user): echo it as sneppx_clip does, at
     * most SNEPPX_CLIP_BYTES bytes, so the list of valid names always fits, and no
     * control character. One byte past the clip tells it the name was cut. */
    char name[SNEPPX_CLIP_BYTES + 2];
    snprintf(name, sizeof name, "%s%s%s", family, size ? "-" : "", size ? size : "");
    return sneppx_fail(SNEPPX_ERR_UNKNOWN_PRESET, "name: unknown preset '%s'; valid names: %s", sneppx_clip(name).text,
                       valid);
}

int64_t sneppx_config_head_dim(const sneppx_config *config)
{
    if (config->head_dim > 0)
        return config->head_dim;
    return config->num_attention_heads > 0 ? config->hidden_size / config->num_attention_heads : 0;
}

int64_t sneppx_config_rotary_dim(const sneppx_config *config)
{
    if (config->kv_lora_rank > 0)
        return config->qk_rope_head_dim;
    return config->rotary_dim > 0 ? config->rotary_dim : sneppx_config_head_dim(config);
}

/* The ranges of limits.py (config_ranges.h), in their order; the MLA-only
 * ones when kv_lora_rank > 0, and 0 otherwise: a layer without MLA would
 * ignore them, so a value there is a config mistaken for another. */
static sneppx_status check_ranges(const sneppx_config *config)
{
    const int mla = config->kv_lora_rank > 0;
    for (int i = 0; i < sneppx_config_range_count; i++) {
        const struct sneppx_config_range *range = &sneppx_config_ranges[i];
        const char *member = (const char *)config + range->offset;
        int64_t value;
        if (range->size == sizeof(int)) {
            int narrow;
            memcpy(&narrow, member, sizeof narrow);
            value = narrow;
        } else {
            memcpy(&value, member, sizeof value);
        }
        if (range->mla_only && !mla) {
            if (value != 0)
                return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                                   "config.%s: %lld applies to MLA configs (kv_lora_rank > 0) only; 0 without MLA",
                                   range->field, (long long)value);
            continue;
        }
        if (value < range->low || value > range->high)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config.%s: %lld is outside [%lld, %lld]", range->field,
                               (long long)value, (long long)range->low, (long long)range->high);
    }
    return SNEPPX_OK;
}

#define CHECK_RANGE(field, lo, hi)                                                              \
    do {                                                                                        \
        if ((config->field) < (lo) || (config->field) > (hi))                                   \
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,                                     \
                               "config." #field ": %lld is outside [%lld, %lld]",               \
                               (long long)(config->field), (long long)(lo), (long long)(hi));    \
    } while (0)

/* The scaling parameters feed formulas (1/factor, YaRN's log(orig / beta),
 * mscale ratios): values that are each finite can still overflow them. Rather
 * than bound every parameter, compute what the runtime will compute and refuse
 * a config whose RoPE tables or softmax scale would not be finite. */
static sneppx_status validate_rope_numbers(const sneppx_config *config, int64_t rotary_dim)
{
    const sneppx_rope_scaling *s = &config->rope_scaling;
    /* The parameters config_fields.py marks (all reals but factor, which has its own rule). */
    for (int i = 0; i < sneppx_rope_field_count; i++) {
        const struct sneppx_rope_field *f = &sneppx_rope_fields[i];
        double value;
        if (!f->finite)
            continue;
        memcpy(&value, (const char *)s + f->offset, sizeof value);
        if (!isfinite(value))
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config.rope_scaling.%s: %g is not finite", f->name,
                               value);
    }
    double inv_freq[SNEPPX_MAX_HEAD_DIM / 2], attention_factor;
    struct sneppx_rope_params params;
    sneppx_config_rope_params(config, &params);
    sneppx_rope_inv_freq(&params, config->max_position_embeddings, inv_freq, &attention_factor);
    for (int64_t i = 0; i < rotary_dim / 2; i++)
        if (!isfinite(inv_freq[i]) || inv_freq[i] < 0)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "config.rope_scaling: these parameters (factor %g) give RoPE frequency %lld = %g",
                               s->factor, (long long)i, inv_freq[i]);
    if (!isfinite(attention_factor) || !(attention_factor > 0))
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                           "config.rope_scaling: these parameters give the cos/sin attention factor %g",
                           attention_factor);
    /* The kernels scale by the float (layer.c, and the vendored file's literal): a double
     * past FLT_MAX would be an inf scale (NaN outputs) and a literal no compiler takes. */
    const double scale = sneppx_config_softmax_scale(config);
    if (!isfinite((float)scale) || !((float)scale > 0))
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                           "config.rope_scaling.mscale_all_dim: %g gives the softmax scale %g, not a finite float > 0",
                           s->mscale_all_dim, scale);
    return SNEPPX_OK;
}

static sneppx_status validate_rope(const sneppx_config *config, int64_t rotary_dim)
{
    const sneppx_rope_scaling *scaling = &config->rope_scaling;
    if (!(config->rope_theta > 1.0) || !isfinite(config->rope_theta))
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config.rope_theta: %g must be a finite number > 1",
                           config->rope_theta);
    if (rotary_dim <= 0 || rotary_dim % 2 != 0)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config.rotary_dim: %lld must be even and > 0",
                           (long long)rotary_dim);
    if ((int)scaling->type < SNEPPX_ROPE_DEFAULT || scaling->type >= SNEPPX_ROPE_TYPE_COUNT)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config.rope_scaling.type: %d is not a sneppx_rope_type",
                           (int)scaling->type);
    if (scaling->type != SNEPPX_ROPE_DEFAULT && (!(scaling->factor > 0) || !isfinite(scaling->factor)))
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config.rope_scaling.factor: %g must be > 0",
                           scaling->factor);
    /* Dynamic NTK grows the base by a power d / (d - 2): transformers divides by zero on
     * d = 2 (at init, whatever the length), and the runtime's pow(x, inf) only hid it. */
    if (scaling->type == SNEPPX_ROPE_DYNAMIC && rotary_dim == 2)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                           "config.rope_scaling.type: dynamic scales the base by a power d / (d - 2) of the rotary "
                           "dim d, which 2 makes infinite");
    if (scaling->type == SNEPPX_ROPE_LLAMA3) {
        if (!(scaling->high_freq_factor > scaling->low_freq_factor) || !(scaling->low_freq_factor > 0))
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "config.rope_scaling: llama3 needs 0 < low_freq_factor (%g) < high_freq_factor (%g)",
                               scaling->low_freq_factor, scaling->high_freq_factor);
    }
    if (scaling->type == SNEPPX_ROPE_LLAMA3 || scaling->type == SNEPPX_ROPE_YARN) {
        if (scaling->original_max_position_embeddings < 0)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "config.rope_scaling.original_max_position_embeddings: %lld must be >= 0",
                               (long long)scaling->original_max_position_embeddings);
    }
    /* YaRN reads 0 as "the default" (betas) or "derive it" (attention_factor), and so
     * read any value below 0 too, silently: transformers fails on a negative beta (the
     * log of a negative number) and scales cos/sin by a negative attention_factor. */
    if (scaling->type == SNEPPX_ROPE_YARN) {
        const struct { const char *name; double value; const char *zero; } unset[] = {
            {"beta_fast", scaling->beta_fast, "YaRN's 32"},
            {"beta_slow", scaling->beta_slow, "YaRN's 1"},
            {"attention_factor", scaling->attention_factor, "derived from factor and mscale"}};
        for (size_t i = 0; i < sizeof unset / sizeof unset[0]; i++)
            if (unset[i].value < 0)
                return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config.rope_scaling.%s: %g must be >= 0 (0: %s)",
                                   unset[i].name, unset[i].value, unset[i].zero);
    }
    return validate_rope_numbers(config, rotary_dim);
}

/* The int fields that are on/off switches: 0 or 1, nothing else (a 7 would
 * act as 1 in one place and as a distinct key value in another). */
#define CHECK_FLAG(field)                                                                                \
    do {                                                                                                 \
        if (config->field != 0 && config->field != 1)                                                    \
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config." #field ": %d must be 0 or 1",       \
                               config->field);                                                           \
    } while (0)

/* The name reaches file names, C symbols and comments of generated code and
 * log lines: it holds only characters inert in all of them (sneppx-gen's
 * readers apply the same rule, gen/sneppx_gen/config_json.py name_problem). */
static sneppx_status validate_name(const sneppx_config *config)
{
    const char *end = memchr(config->name, '\0', sizeof config->name);
    if (!end)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config.name: not NUL-terminated within its %d bytes",
                           SNEPPX_NAME_MAX);
    for (const char *at = config->name; at < end; at++) {
        const unsigned char c = (unsigned char)*at;
        const int allowed = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                            c == '.' || c == '_' || c == '-';
        if (!allowed)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "config.name: byte %d (0x%02x) is not one of A-Z a-z 0-9 . _ -",
                               (int)(at - config->name), c);
    }
    return SNEPPX_OK;
}

/* bfloat16 compute multiplies bfloat16 weights by vdpbf16ps (the gemm_bf16dot kernels). */
static sneppx_status validate_compute_dtype(const sneppx_config *config)
{
    const int dtype = (int)config->compute_dtype;
    if (dtype != SNEPPX_DTYPE_FLOAT32 && dtype != SNEPPX_DTYPE_BFLOAT16)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config.compute_dtype: %d (%s) is not float32 or bfloat16",
                           dtype, sneppx_dtype_name(dtype) ? sneppx_dtype_name(dtype) : "not a sneppx_dtype");
    if (dtype == SNEPPX_DTYPE_FLOAT32)
        return SNEPPX_OK;
    if (config->weight_dtype != SNEPPX_DTYPE_BFLOAT16)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                           "config.compute_dtype: bfloat16 needs weight_dtype bfloat16, not %s",
                           sneppx_dtype_name((int)config->weight_dtype));
    /* The features are the process's: an AVX-512 host under SNEPPX_TARGET=v8 has its
     * wider ones taken away, so the message names the target too. */
    if (!sneppx_host_has_feature("+avx512bf16"))
        return sneppx_fail(SNEPPX_ERR_UNSUPPORTED,
                           "config.compute_dtype: bfloat16 needs a host with avx512_bf16 (vdpbf16ps), which this "
                           "process's CPU features (target %s) lack", sneppx_host_target()->name);
    return SNEPPX_OK;
}

sneppx_status sneppx_config_validate(const sneppx_config *config)
{
    if (!config)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config: must not be NULL");
    const sneppx_status name_status = validate_name(config);
    if (name_status != SNEPPX_OK)
        return name_status;
    CHECK_FLAG(rope_interleaved);
    CHECK_FLAG(qkv_bias);
    CHECK_FLAG(o_bias);
    CHECK_FLAG(mla_naive);
    CHECK_FLAG(use_flash_attn);
    if ((int)config->weight_dtype < 0 || (int)config->weight_dtype >= sneppx_weight_dtype_count)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config.weight_dtype: %d is not a weight type (%s)",
                           (int)config->weight_dtype, sneppx_weight_dtype_list);
    sneppx_status status = validate_compute_dtype(config);
    if (status != SNEPPX_OK)
        return status;
    status = check_ranges(config);
    if (status != SNEPPX_OK)
        return status;

    /* The attention kernels' head dims step in SNEPPX_HEAD_DIM_MULTIPLE; MLA
     * makes them of sums (absorbed: kv_lora + rope, naive: nope + rope). */
    enum { M = SNEPPX_HEAD_DIM_MULTIPLE };
    if (config->kv_lora_rank > 0) {
        if ((config->qk_nope_head_dim + config->qk_rope_head_dim) % M != 0)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "config.qk_nope_head_dim + qk_rope_head_dim: %lld must be a multiple of %d",
                               (long long)(config->qk_nope_head_dim + config->qk_rope_head_dim), M);
        if (config->kv_lora_rank % M != 0)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config.kv_lora_rank: %lld must be a multiple of %d",
                               (long long)config->kv_lora_rank, M);
        if ((config->kv_lora_rank + config->qk_rope_head_dim) % M != 0)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "config.kv_lora_rank + qk_rope_head_dim: %lld must be a multiple of %d",
                               (long long)(config->kv_lora_rank + config->qk_rope_head_dim), M);
        if (config->v_head_dim % M != 0)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config.v_head_dim: %lld must be a multiple of %d",
                               (long long)config->v_head_dim, M);
        if (config->sliding_window != 0)
            return sneppx_fail(SNEPPX_ERR_UNSUPPORTED, "config.sliding_window: MLA has no sliding window");
        /* MLA rotates qk_rope_head_dim dims (sneppx_config_rotary_dim; the presets say so in
         * rotary_dim too): another rotary_dim would be dropped without a word (LLMConfig
         * refuses partial_rotary_factor so too). */
        if (config->rotary_dim != 0 && config->rotary_dim != config->qk_rope_head_dim)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "config.rotary_dim: %lld, but MLA rotates the qk_rope_head_dim (%lld) dims of each "
                               "head: leave it 0", (long long)config->rotary_dim,
                               (long long)config->qk_rope_head_dim);
        return validate_rope(config, config->qk_rope_head_dim);
    }

    if (config->mla_naive)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                           "config.mla_naive: applies to MLA configs (kv_lora_rank > 0) only");
    CHECK_RANGE(num_key_value_heads, 1, config->num_attention_heads);
    if (config->num_attention_heads % config->num_key_value_heads != 0)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                           "config.num_key_value_heads: %lld does not divide num_attention_heads %lld",
                           (long long)config->num_key_value_heads, (long long)config->num_attention_heads);
    const int64_t head_dim = sneppx_config_head_dim(config);
    if (config->head_dim == 0 && config->hidden_size % config->num_attention_heads != 0)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                           "config.head_dim: 0 means hidden_size/num_attention_heads, but %lld/%lld is not whole",
                           (long long)config->hidden_size, (long long)config->num_attention_heads);
    if (head_dim < M || head_dim > SNEPPX_MAX_HEAD_DIM || head_dim % M != 0)
        return sneppx_fail(SNEPPX_ERR_UNSUPPORTED,
                           "config.head_dim: %lld is not supported (a multiple of %d from %d to %lld)",
                           (long long)head_dim, M, M, (long long)SNEPPX_MAX_HEAD_DIM);
    const int64_t rotary_dim = sneppx_config_rotary_dim(config);
    if (rotary_dim > head_dim)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config.rotary_dim: %lld exceeds head_dim %lld",
                           (long long)rotary_dim, (long long)head_dim);
    return validate_rope(config, rotary_dim);
}

const char *sneppx_config_beyond_positions_hint(const sneppx_config *config, int implicit_positions)
{
    /* HF computes cos/sin for any position; the frequencies read max_position_embeddings
     * only in llama3 and yarn without original_max_position_embeddings. */
    const sneppx_rope_type type = config->rope_scaling.type;
    const int frequencies_fixed = type == SNEPPX_ROPE_DEFAULT || type == SNEPPX_ROPE_LINEAR ||
                                  config->rope_scaling.original_max_position_embeddings > 0;
    if (frequencies_fixed)
        return implicit_positions
                   ? " (position_ids NULL: the sequence's length + i; HF runs on past it with the same "
                     "frequencies: raising max_position_embeddings does the same; extend_context() instead "
                     "rescales theta for a longer context)"
                   : " (HF runs on past it with the same frequencies: raising max_position_embeddings does "
                     "the same; extend_context() instead rescales theta for a longer context)";
    return implicit_positions
               ? " (position_ids NULL: the sequence's length + i; this RoPE's frequencies depend on "
                 "max_position_embeddings, in HF too: raise it, or set original_max_position_embeddings "
                 "to keep them; extend_context() rescales theta instead)"
               : " (this RoPE's frequencies depend on max_position_embeddings, in HF too: raise it, or "
                 "set original_max_position_embeddings to keep them; extend_context() rescales theta "
                 "instead)";
}

sneppx_status sneppx_config_extend_context(sneppx_config *config, int64_t new_max_positions)
{
    sneppx_clear_error();
    if (!config)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config: must not be NULL");
    sneppx_status status = sneppx_config_validate(config);
    if (status != SNEPPX_OK)
        return status;
    if (new_max_positions <= config->max_position_embeddings)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                           "new_max_positions: %lld must exceed max_position_embeddings %lld",
                           (long long)new_max_positions, (long long)config->max_position_embeddings);
    if (new_max_positions > SNEPPX_MAX_POSITIONS)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                           "new_max_positions: %lld is above the largest max_position_embeddings, 2^40 = %lld",
                           (long long)new_max_positions, (long long)SNEPPX_MAX_POSITIONS);
    const double dim = (double)sneppx_config_rotary_dim(config);
    const double ratio = (double)new_max_positions / (double)config->max_position_embeddings;
    sneppx_config extended = *config;
    extended.rope_theta *= pow(ratio, dim / (dim - 2.0));
    extended.max_position_embeddings = new_max_positions;
    /* A longer context moves YaRN's correction range and grows theta: the
     * result must be as valid as the input, or the input stays as it was. */
    if (sneppx_config_validate(&extended) != SNEPPX_OK) {
        char reason[512];
        snprintf(reason, sizeof reason, "%s", sneppx_last_error());
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "new_max_positions: %lld makes the config invalid (%s)",
                           (long long)new_max_positions, reason);
    }
    *config = extended;
    return SNEPPX_OK;
}

void sneppx_config_rope_params(const sneppx_config *config, struct sneppx_rope_params *params)
{
    const sneppx_rope_scaling *scaling = &config->rope_scaling;
    memset(params, 0, sizeof *params);
    sneppx_rope_params_set_scaling(params, scaling);
    params->theta = config->rope_theta;
    params->rotary_dim = sneppx_config_rotary_dim(config);
    params->max_position_embeddings = config->max_position_embeddings;
}

sneppx_status sneppx_config_rope_frequencies(const sneppx_config *config, int64_t max_position,
                                             double *inv_freq, int64_t inv_freq_len,
                                             double *attention_factor)
{
    sneppx_clear_error();
    sneppx_status status = sneppx_config_validate(config);
    if (status != SNEPPX_OK)
        return status;
    if (!inv_freq)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "inv_freq: must not be NULL");
    if (!attention_factor)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "attention_factor: must not be NULL");
    const int64_t half = sneppx_config_rotary_dim(config) / 2;
    if (inv_freq_len < half)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "inv_freq_len: %lld is less than rotary_dim/2 = %lld",
                           (long long)inv_freq_len, (long long)half);
    struct sneppx_rope_params params;
    sneppx_config_rope_params(config, &params);
    sneppx_rope_inv_freq(&params, max_position, inv_freq, attention_factor);
    return SNEPPX_OK;
}

double sneppx_config_softmax_scale(const sneppx_config *config)
{
    if (!config)
        return 0.0;
    if (config->kv_lora_rank > 0) {
        double scale = 1.0 / sqrt((double)(config->qk_nope_head_dim + config->qk_rope_head_dim));
        const sneppx_rope_scaling *scaling = &config->rope_scaling;
        /* Beside any scaled RoPE type, not only yarn: DeepSeek's code and transformers'
         * DeepseekV2Attention read mscale_all_dim from every rope_scaling but the default. */
        if (scaling->type != SNEPPX_ROPE_DEFAULT && scaling->mscale_all_dim != 0) {
            double mscale = sneppx_yarn_get_mscale(scaling->factor, scaling->mscale_all_dim);
            scale *= mscale * mscale;
        }
        return scale;
    }
    return 1.0 / sqrt((double)sneppx_config_head_dim(config));
}
