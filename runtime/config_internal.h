/* Internal: quantities derived from a (validated) config. */
#ifndef SNEPPX_RUNTIME_CONFIG_INTERNAL_H
#define SNEPPX_RUNTIME_CONFIG_INTERNAL_H
#include "rope_freqs.h"
#include "sneppx/config.h"

/* sneppx_config_init()'s values: gen/sneppx_gen/config_fields.py's defaults,
 * rendered into config_fields.c with the check of the struct against that list. */
extern const sneppx_config sneppx_config_defaults;

/* config_fields.ROPE_TYPES, rendered beside it: HF's rope_type names by
 * sneppx_rope_type value, their count, and "default, linear, ..." for messages. */
extern const char *const sneppx_rope_type_names[];
extern const int sneppx_rope_type_count;
extern const char sneppx_rope_type_list[];

int64_t sneppx_config_head_dim(const sneppx_config *config);
int64_t sneppx_config_rotary_dim(const sneppx_config *config);
void sneppx_config_rope_params(const sneppx_config *config, struct sneppx_rope_params *params);

#endif
