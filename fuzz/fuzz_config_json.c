/* Fuzzes sneppx_config_from_json with arbitrary text. Promises: success gives
 * a config that validates and whose RoPE frequencies, attention factor and
 * softmax scale are finite; failure is FORMAT, UNSUPPORTED or a validation
 * status, with a message. And sneppx_rope_scaling_from_json, which reads the
 * rope_scaling value alone by the same rules (config.h): on the input itself
 * and on the file's rope_scaling value (its one "rope_scaling" key, in a file
 * without "rope_parameters"), printed back as JSON, it fails with a message and
 * leaves scaling as it was, or succeeds; and when the file loaded, the value
 * alone loads too, to the config's rope_scaling. */
#include <cjson/cJSON.h>
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

/* Whether two scalings hold the same values (-0 and 0 alike: JSON printing keeps no sign of zero). */
static int same_scaling(const sneppx_rope_scaling *a, const sneppx_rope_scaling *b)
{
    return a->type == b->type && a->factor == b->factor && a->low_freq_factor == b->low_freq_factor &&
           a->high_freq_factor == b->high_freq_factor &&
           a->original_max_position_embeddings == b->original_max_position_embeddings &&
           a->beta_fast == b->beta_fast && a->beta_slow == b->beta_slow && a->mscale == b->mscale &&
           a->mscale_all_dim == b->mscale_all_dim && a->attention_factor == b->attention_factor;
}

/* sneppx_rope_scaling_from_json on text: a failure says why and leaves scaling as it was. */
static sneppx_status scaling_from(const char *text, size_t length, sneppx_rope_scaling *scaling)
{
    memset(scaling, 0xa5, sizeof *scaling);
    sneppx_rope_scaling before;
    memcpy(&before, scaling, sizeof before);
    const sneppx_status status = sneppx_rope_scaling_from_json(text, length, scaling);
    if (status != SNEPPX_OK) {
        FUZZ_ASSERT(status == SNEPPX_ERR_FORMAT || status == SNEPPX_ERR_UNSUPPORTED, "rope_scaling_from_json: status %d",
                    (int)status);
        FUZZ_ASSERT(sneppx_last_error()[0] != '\0', "rope_scaling_from_json: status %d without a message", (int)status);
        FUZZ_ASSERT(memcmp(&before, scaling, sizeof before) == 0, "a refused rope_scaling_from_json wrote scaling");
    }
    return status;
}

/* Makes every number under item print as exactly its double: cJSON prints 15
 * significant digits when they read back within an epsilon, not the same double. */
static void exact_numbers(cJSON *item)
{
    for (cJSON *child = item->child, *next; child; child = next) {
        next = child->next;
        if (!cJSON_IsNumber(child)) {
            exact_numbers(child);
            continue;
        }
        char text[40];
        snprintf(text, sizeof text, "%.17g", child->valuedouble);
        cJSON *raw = cJSON_CreateRaw(text);
        FUZZ_ASSERT(raw, "out of memory");
        raw->string = child->string; /* the key moves with the value (keys given twice stay twice) */
        child->string = NULL;
        cJSON_ReplaceItemViaPointer(item, child, raw);
    }
}

/* The file's rope_scaling value alone: loads when the file did, to the same scaling. */
static void check_scaling_alone(const uint8_t *data, size_t size, sneppx_status file_status,
                                const sneppx_config *config)
{
    cJSON *root = cJSON_ParseWithLength((const char *)data, size);
    const cJSON *object = cJSON_IsObject(root) ? root : NULL, *item, *value = NULL;
    int count = 0, parameters = 0;
    cJSON_ArrayForEach(item, object) {
        if (item->string && strcmp(item->string, "rope_scaling") == 0)
            value = item, count++;
        parameters |= item->string && strcmp(item->string, "rope_parameters") == 0;
    }
    if (count == 1 && !parameters)
        exact_numbers((cJSON *)value);
    char *text = count == 1 && !parameters ? cJSON_PrintUnformatted(value) : NULL;
    if (text) {
        sneppx_rope_scaling alone;
        const sneppx_status status = scaling_from(text, strlen(text), &alone);
        FUZZ_ASSERT(file_status != SNEPPX_OK || status == SNEPPX_OK,
                    "the file loads, its rope_scaling %s alone does not: %s", text, sneppx_last_error());
        FUZZ_ASSERT(file_status != SNEPPX_OK || same_scaling(&alone, &config->rope_scaling),
                    "the file's rope_scaling %s alone reads as another scaling", text);
        cJSON_free(text);
    }
    cJSON_Delete(root);
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
    sneppx_rope_scaling scaling;
    scaling_from((const char *)data, size, &scaling);
    check_scaling_alone(data, size, status, &config);
    return 0;
}
