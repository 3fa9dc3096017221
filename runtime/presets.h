/* Internal: the preset table, rendered at build time by `sneppx-gen build
 * presets` from gen/archs.json into build/generated/presets.c. */
#ifndef SNEPPX_RUNTIME_PRESETS_H
#define SNEPPX_RUNTIME_PRESETS_H
#include "sneppx/config.h"

struct sneppx_preset {
    const char *name;            /* CLI name, "llama3-8B" */
    const char *family;          /* "llama3" */
    const char *size;            /* "8B" */
    const char *const *aliases;  /* NULL-terminated extra names */
    sneppx_config config;
};

extern const struct sneppx_preset sneppx_presets[];
extern const int sneppx_presets_count;

#endif
