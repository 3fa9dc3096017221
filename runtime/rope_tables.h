/* Internal: the cos/sin rows of a forward call (runtime/rope_tables.c). */
#ifndef SNEPPX_RUNTIME_ROPE_TABLES_H
#define SNEPPX_RUNTIME_ROPE_TABLES_H
#include "layer_internal.h"

/* The per-position cos/sin cache holds positions [0, sneppx_rope_cache_limit):
 * at most max_position_embeddings and at most SNEPPX_ROPE_CACHE_BYTES for both
 * tables. A token past it gets its row computed directly (the same double
 * formula, so the same floats), which keeps one far position (legal up to
 * 2^40) from building a table of every position before it. */
#define SNEPPX_ROPE_CACHE_BYTES ((int64_t)64 << 20)
int64_t sneppx_rope_cache_limit(const sneppx_layer *layer);
sneppx_status sneppx_rope_tables(sneppx_layer *layer, int64_t tokens, int64_t seq_len, const int64_t *positions,
                                 int64_t max_position, float *cos, float *sin);

#endif
