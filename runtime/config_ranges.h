/* Internal: the ranges sneppx_config_validate checks field by field, rendered
 * at build time from gen/sneppx_gen/limits.py (which sneppx-gen's own config
 * checks read too) into build/generated/config_ranges.c. */
#ifndef SNEPPX_RUNTIME_CONFIG_RANGES_H
#define SNEPPX_RUNTIME_CONFIG_RANGES_H
#include <stddef.h>
#include <stdint.h>
#include "sneppx/config.h"

struct sneppx_config_range {
    const char *field;   /* the sneppx_config member, named in errors */
    size_t offset;       /* offsetof(sneppx_config, field) */
    size_t size;         /* sizeof the member: an int or an int64_t */
    int64_t low, high;
    int mla_only;        /* checked only when kv_lora_rank > 0 */
};

extern const struct sneppx_config_range sneppx_config_ranges[];
extern const int sneppx_config_range_count;

#endif
