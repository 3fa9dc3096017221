/* Fuzzes sneppx_config_validate with arbitrary bytes as a sneppx_config (the
 * struct a C caller fills by hand). Promises: a config it accepts has finite
 * RoPE frequencies, attention factor and softmax scale, and stays valid
 * through sneppx_config_extend_context; a refusal names a config field. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fuzz.h"
#include "sneppx/config.h"

static int64_t rotary_dim(const sneppx_config *c)
{
    if (c->kv_lora_rank > 0)
        return c->qk_rope_head_dim;
    if (c->rotary_dim > 0)
        return c->rotary_dim;
    return c->head_dim > 0 ? c->head_dim : c->hidden_size / c->num_attention_heads;
}

/* Everything the runtime derives from a valid config before any kernel runs. */
static void check_derived(const sneppx_config *config, const char *stage)
{
    static double inv_freq[512];
    double factor = 0;
    /* A dynamic-NTK call past the trained length, as a long forward would make. */
    const int64_t positions = config->max_position_embeddings * 2;
    sneppx_status status = sneppx_config_rope_frequencies(config, positions, inv_freq,
                                                          (int64_t)(sizeof inv_freq / sizeof inv_freq[0]), &factor);
    FUZZ_ASSERT(status == SNEPPX_OK, "%s: rope frequencies of a valid config: %s", stage, sneppx_last_error());
    for (int64_t i = 0; i < rotary_dim(config) / 2; i++)
        FUZZ_ASSERT(isfinite(inv_freq[i]) && inv_freq[i] >= 0, "%s: inv_freq[%lld] = %g (rope type %d)", stage,
                    (long long)i, inv_freq[i], (int)config->rope_scaling.type);
    FUZZ_ASSERT(isfinite(factor), "%s: attention factor %g (rope type %d)", stage, factor,
                (int)config->rope_scaling.type);
    const double scale = sneppx_config_softmax_scale(config);
    FUZZ_ASSERT(isfinite(scale) && scale > 0, "%s: softmax scale %g", stage, scale);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sneppx_config config;
    memset(&config, 0, sizeof config);
    memcpy(&config, data, size < sizeof config ? size : sizeof config);
    /* Arbitrary name bytes are refused before any number is looked at: that
     * refusal is checked, then the numbers are fuzzed under a valid name. */
    if (sneppx_config_validate(&config) != SNEPPX_OK)
        FUZZ_ASSERT(strstr(sneppx_last_error(), "config"), "message '%s'", sneppx_last_error());
    snprintf(config.name, sizeof config.name, "fuzz");
    sneppx_status status = sneppx_config_validate(&config);
    if (status != SNEPPX_OK) {
        FUZZ_ASSERT(strstr(sneppx_last_error(), "config"), "status %d, message '%s'", (int)status,
                    sneppx_last_error());
        return 0;
    }
    check_derived(&config, "validated");
    sneppx_config extended = config;
    if (sneppx_config_extend_context(&extended, config.max_position_embeddings * 2) == SNEPPX_OK) {
        FUZZ_ASSERT(sneppx_config_validate(&extended) == SNEPPX_OK, "extend_context made an invalid config: %s",
                    sneppx_last_error());
        check_derived(&extended, "extended");
    }
    return 0;
}
