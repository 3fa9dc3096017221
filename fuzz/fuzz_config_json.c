/* Fuzzes sneppx_config_from_json with arbitrary text. Promises: success gives
 * a config that validates and whose RoPE frequencies, attention factor and
 * softmax scale are finite; failure is FORMAT, UNSUPPORTED or a validation
 * status, with a message. */
#include <math.h>
#include <string.h>

#include "fuzz.h"
#include "sneppx/config.h"

/* RoPE of a validated config: every derived number is finite. */
static void check_rope(const sneppx_config *config)
{
    static double inv_freq[512];
    double factor = 0;
    sneppx_status status = sneppx_config_rope_frequencies(config, config->max_position_embeddings, inv_freq,
                                                          (int64_t)(sizeof inv_freq / sizeof inv_freq[0]), &factor);
    FUZZ_ASSERT(status == SNEPPX_OK, "rope frequencies of a valid config: %s", sneppx_last_error());
    const int64_t rotary = config->kv_lora_rank > 0 ? config->qk_rope_head_dim
                           : config->rotary_dim > 0 ? config->rotary_dim
                           : config->head_dim > 0   ? config->head_dim
                                                    : config->hidden_size / config->num_attention_heads;
    for (int64_t i = 0; i < rotary / 2; i++)
        FUZZ_ASSERT(isfinite(inv_freq[i]) && inv_freq[i] >= 0, "inv_freq[%lld] = %g", (long long)i, inv_freq[i]);
    FUZZ_ASSERT(isfinite(factor), "attention factor %g", factor);
    const double scale = sneppx_config_softmax_scale(config);
    FUZZ_ASSERT(isfinite(scale) && scale > 0, "softmax scale %g", scale);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sneppx_config config;
    sneppx_status status = sneppx_config_from_json((const char *)data, size, &config);
    if (status == SNEPPX_OK) {
        FUZZ_ASSERT(sneppx_config_validate(&config) == SNEPPX_OK, "parsed config does not validate: %s",
                    sneppx_last_error());
        check_rope(&config);
    } else {
        FUZZ_ASSERT(status == SNEPPX_ERR_FORMAT || status == SNEPPX_ERR_UNSUPPORTED ||
                        status == SNEPPX_ERR_INVALID_ARGUMENT,
                    "status %d", (int)status);
        FUZZ_ASSERT(sneppx_last_error()[0] != '\0', "status %d without a message", (int)status);
    }
    return 0;
}
