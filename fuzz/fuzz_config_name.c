/* Fuzzes preset lookup: sneppx_config_from_name(family, size) with arbitrary
 * strings. The input is the family, then optionally a NUL byte and the size
 * (no NUL: size is NULL, the full-name form). Promises: a preset found is
 * valid; a miss is SNEPPX_ERR_UNKNOWN_PRESET with a message that names the
 * argument; nothing else. */
#include <string.h>

#include "fuzz.h"
#include "sneppx/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    const char *family = text;
    const char *separator = memchr(text, '\0', size);
    const char *preset_size = separator && separator < text + size ? separator + 1 : NULL;

    sneppx_config config;
    sneppx_status status = sneppx_config_from_name(family, preset_size, &config);
    if (status == SNEPPX_OK) {
        FUZZ_ASSERT(sneppx_config_validate(&config) == SNEPPX_OK, "preset '%s' '%s' does not validate: %s", family,
                    preset_size ? preset_size : "(null)", sneppx_last_error());
    } else {
        FUZZ_ASSERT(status == SNEPPX_ERR_UNKNOWN_PRESET && strstr(sneppx_last_error(), "name"),
                    "status %d, message '%s'", (int)status, sneppx_last_error());
    }
    free(text);
    return 0;
}
