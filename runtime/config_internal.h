/* Internal: quantities derived from a (validated) config. */
#ifndef SNEPPX_RUNTIME_CONFIG_INTERNAL_H
#define SNEPPX_RUNTIME_CONFIG_INTERNAL_H
#include "rope_freqs.h"
#include "sneppx/config.h"

int64_t sneppx_config_head_dim(const sneppx_config *config);
int64_t sneppx_config_rotary_dim(const sneppx_config *config);
void sneppx_config_rope_params(const sneppx_config *config, struct sneppx_rope_params *params);

#endif
