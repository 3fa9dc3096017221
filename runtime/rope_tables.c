/* cos/sin tables of RoPE: computed once per position in double precision,
 * cached per layer up to sneppx_rope_cache_limit() (layer_internal.h), and
 * gathered per token for each call (shared by all heads); a position past the
 * cache is computed for its token alone, with the same formula. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"
#include "error.h"
#include "rope_tables.h"
#include "sneppx/limits.h"
#include "threads.h"

static void fill_rows(const double *inv_freq, int64_t half, double factor, int64_t first, int64_t last,
                      float *cos_rows, float *sin_rows)
{
    for (int64_t position = first; position < last; position++) {
        for (int64_t i = 0; i < half; i++) {
            const double angle = (double)position * inv_freq[i];
            cos_rows[(position - first) * half + i] = (float)(cos(angle) * factor);
            sin_rows[(position - first) * half + i] = (float)(sin(angle) * factor);
        }
    }
}

int64_t sneppx_rope_cache_limit(const sneppx_layer *layer)
{
    const int64_t half = layer->rotary_dim / 2;
    int64_t limit = SNEPPX_ROPE_CACHE_BYTES / (2 * (int64_t)sizeof(float) * half);
    if (limit > layer->config.max_position_embeddings)
        limit = layer->config.max_position_embeddings;
    return limit;
}

/* Grows the per-position cache to cover [0, positions), positions at most
 * sneppx_rope_cache_limit(); caller holds layer->lock. */
static sneppx_status grow_cache(sneppx_layer *layer, int64_t positions)
{
    const int64_t half = layer->rotary_dim / 2;
    const int64_t limit = sneppx_rope_cache_limit(layer);
    int64_t capacity = layer->cached_positions > 0 ? layer->cached_positions : 256;
    while (capacity < positions)
        capacity *= 2;
    if (capacity > limit)
        capacity = limit;
    float *cos_cache = realloc(layer->cos_cache, sizeof(float) * (size_t)(capacity * half));
    if (!cos_cache)
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "position_ids: no memory for RoPE tables");
    layer->cos_cache = cos_cache;
    float *sin_cache = realloc(layer->sin_cache, sizeof(float) * (size_t)(capacity * half));
    if (!sin_cache)
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "position_ids: no memory for RoPE tables");
    layer->sin_cache = sin_cache;
    const int64_t first = layer->cached_positions;
#pragma omp parallel for schedule(static) num_threads(sneppx_thread_count(layer))
    for (int64_t chunk = first; chunk < capacity; chunk += 64) {
        int64_t last = chunk + 64 < capacity ? chunk + 64 : capacity;
        fill_rows(layer->inv_freq, half, layer->attention_factor, chunk, last, cos_cache + chunk * half,
                  sin_cache + chunk * half);
    }
    layer->cached_positions = capacity;
    return SNEPPX_OK;
}

sneppx_status sneppx_rope_tables(sneppx_layer *layer, int64_t tokens, int64_t seq_len, const int64_t *positions,
                                 int64_t max_position, float *cos_out, float *sin_out)
{
    const int64_t half = layer->rotary_dim / 2;
    const sneppx_config *config = &layer->config;
    if (config->rope_scaling.type == SNEPPX_ROPE_DYNAMIC && max_position + 1 > config->max_position_embeddings) {
        /* Dynamic NTK: the frequencies depend on this call's longest position (HF semantics).
         * On the stack (1 KiB at most), so that a warm forward allocates nothing here either. */
        double inv_freq[SNEPPX_MAX_HEAD_DIM / 2];
        struct sneppx_rope_params params;
        double factor;
        sneppx_config_rope_params(config, &params);
        sneppx_rope_inv_freq(&params, max_position + 1, inv_freq, &factor);
#pragma omp parallel for schedule(static) num_threads(sneppx_thread_count(layer))
        for (int64_t token = 0; token < tokens; token++) {
            const int64_t position = positions ? positions[token] : token % seq_len;
            fill_rows(inv_freq, half, factor, position, position + 1, cos_out + token * half, sin_out + token * half);
        }
        return SNEPPX_OK;
    }
    pthread_mutex_lock(&layer->lock);
    sneppx_status status = SNEPPX_OK;
    const int64_t limit = sneppx_rope_cache_limit(layer);
    /* The cache grows to the farthest position it will serve, not past it: a
     * token beyond the limit is computed directly and needs no cached rows. */
    int64_t wanted = max_position + 1;
    if (wanted > limit) {
        wanted = 0;
        for (int64_t token = 0; token < tokens; token++) {
            const int64_t position = positions ? positions[token] : token % seq_len;
            if (position < limit && position + 1 > wanted)
                wanted = position + 1;
        }
    }
    if (wanted > layer->cached_positions)
        status = grow_cache(layer, wanted);
    if (status == SNEPPX_OK) {
        /* Rows past the cache (only when max_position is) are computed here, on all threads. */
        const int64_t cached = layer->cached_positions;
        const float *cos_cache = layer->cos_cache, *sin_cache = layer->sin_cache;
        const double *inv_freq = layer->inv_freq;
        const double factor = layer->attention_factor;
#pragma omp parallel for schedule(static) if (max_position >= cached) num_threads(sneppx_thread_count(layer))
        for (int64_t token = 0; token < tokens; token++) {
            const int64_t position = positions ? positions[token] : token % seq_len;
            if (position < cached) {
                memcpy(cos_out + token * half, cos_cache + position * half, sizeof(float) * (size_t)half);
                memcpy(sin_out + token * half, sin_cache + position * half, sizeof(float) * (size_t)half);
            } else {
                fill_rows(inv_freq, half, factor, position, position + 1, cos_out + token * half,
                          sin_out + token * half);
            }
        }
    }
    pthread_mutex_unlock(&layer->lock);
    return status;
}
