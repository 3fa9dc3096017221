/* Internal: quantities derived from a (validated) config. */
#ifndef SNEPPX_RUNTIME_CONFIG_INTERNAL_H
#define SNEPPX_RUNTIME_CONFIG_INTERNAL_H
#include "rope_freqs.h"
#include "sneppx/config.h"

/* Largest size accepted for any one dimension: keeps every product of two
 * dimensions (and their byte counts) far from int64 overflow. */
#define SNEPPX_MAX_DIM (1 << 20)
#define SNEPPX_MAX_HEADS 4096
#define SNEPPX_MAX_HEAD_DIM 256
#define SNEPPX_MAX_LATENT_DIM 2048

/* Largest max_position_embeddings (and sliding_window) a config may have:
 * positions stay exact in double and far from int64 overflow. */
#define SNEPPX_MAX_POSITIONS ((int64_t)1 << 40)

/* sneppx_config_init()'s values: gen/sneppx_gen/config_fields.py's defaults,
 * rendered into config_fields.c with the check of the struct against that list. */
extern const sneppx_config sneppx_config_defaults;

int64_t sneppx_config_head_dim(const sneppx_config *config);
int64_t sneppx_config_rotary_dim(const sneppx_config *config);
void sneppx_config_rope_params(const sneppx_config *config, struct sneppx_rope_params *params);

#endif
