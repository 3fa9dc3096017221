/* One layer's forward over sequences that continue from a paged KV cache
 * (include/sneppx/kv_cache.h): the projections of every new token at once
 * (one GEMM stream per step), their K/V (MLA: latent rows) appended to the
 * pages, then attention. A sequence with few new queries (decode) runs the
 * attn_decode kernel over its pages in place, per (sequence, K/V head) and,
 * when there are fewer such tasks than threads, per key range (split-KV,
 * merged by log-sum-exp). Longer runs (prefill chunks) go per (sequence, K/V
 * head, query tile) over keys gathered from the pages, with the layer's own
 * flash or SDPA kernel. The kernels take queries as the last q_len of kv_len
 * positions, so either is one kernel call in the same key coordinates as the
 * cache-free forward, counted from the first token the pages still hold. */
#include <omp.h>
#include <stddef.h>
#include <string.h>

#include "config_internal.h"
#include "error.h"
#include "forward.h"
#include "kernel_args.h"
#include "kv_cache_internal.h"
#include "kv_elements.h"
#include "rope_tables.h"
#include "shard.h"
#include "sneppx_abi.h"
#include "threads.h"
#include "workspace.h"

/* One sequence of the call. */
struct cached_sequence {
    struct sneppx_kv_sequence *seq;
    int64_t token0;       /* its first row in hidden_states / out */
    int64_t q_len;
    int64_t past;         /* its layer length before the call */
    int64_t first_held;   /* the first token its pages still hold */
    int64_t tile0;        /* its first attention tile (gathered path) */
    int decode;           /* attends with attn_decode over the pages in place */
    int64_t splits;       /* decode: key ranges per K/V head */
    int64_t task0;        /* decode: its first task (kv_heads x splits of them) */
    float *split;         /* decode with splits > 1: kv_heads regions of the splits' results */
    const float *mask;    /* [q_len, past + q_len] or NULL (causal) */
};

/* Where the call's bookkeeping lives in ws->plan. */
struct cached_plan {
    struct cached_sequence *sequences;  /* [n_seqs] */
    struct sneppx_kv_sequence **seqs;   /* [n_seqs], for kv_cache.c */
    int64_t *positions;                 /* [tokens] */
    float *splits;                      /* split-KV results, 64-byte aligned */
};

static int64_t plan_head_bytes(int64_t n_seqs, int64_t tokens)
{
    const int64_t bytes = n_seqs * (int64_t)(sizeof(struct cached_sequence) + sizeof(struct sneppx_kv_sequence *)) +
                          tokens * (int64_t)sizeof(int64_t);
    return (bytes + 63) / 64 * 64;
}

static struct cached_plan plan_in(void *memory, int64_t n_seqs, int64_t tokens)
{
    struct cached_plan plan;
    plan.sequences = memory;
    plan.seqs = (struct sneppx_kv_sequence **)(plan.sequences + n_seqs);
    plan.positions = (int64_t *)(plan.seqs + n_seqs);
    plan.splits = (float *)((char *)memory + plan_head_bytes(n_seqs, tokens));
    return plan;
}

/* Split-KV results the call may need, from q_lens alone (before the sequences
 * are read): the most splits any decode sequence can get, for each. */
static int64_t split_floats_bound(const sneppx_layer *layer, int64_t n_seqs, const int64_t *q_lens)
{
    int64_t decode_tasks = 0;
    for (int64_t i = 0; i < n_seqs; i++)
        decode_tasks += q_lens[i] <= SNEPPX_DECODE_MAX_QUERIES ? layer->kv_heads : 0;
    const int64_t splits = sneppx_decode_splits(INT64_MAX, decode_tasks, sneppx_thread_count(layer));
    if (splits == 1)
        return 0;
    int64_t floats = 0;
    for (int64_t i = 0; i < n_seqs; i++)
        if (q_lens[i] <= SNEPPX_DECODE_MAX_QUERIES)
            floats += layer->kv_heads * sneppx_attn_decode_split_floats(splits, q_lens[i], layer->attn_group,
                                                                        layer->attn_v_head_dim);
    return floats;
}

static int64_t next_power_of_two(int64_t value)
{
    int64_t power = 64;
    while (power < value)
        power *= 2;
    return power;
}

/* Floats one gathered key takes (K and V; MLA: one latent row, K and V at once). */
static int64_t gathered_key_floats(const sneppx_kv_cache *cache)
{
    const struct sneppx_kv_shape *shape = &cache->shape;
    return shape->is_mla ? shape->kv_lora_rank + shape->rope_dim : shape->head_dim + shape->v_head_dim;
}

/* ---- rows of the cache's dtype <-> float (kv_elements.h) ---- */

/* Stores a row of n floats as row `offset` (elements) of a layer block; int8 puts its
 * scale at scale_offset of the block's scales. */
static void store_row(const sneppx_kv_cache *cache, unsigned char *block, int64_t offset, int64_t scale_offset,
                      const float *src, int64_t n)
{
    float *scale = cache->dtype == SNEPPX_DTYPE_INT8 ? sneppx_kv_scales(cache, block) + scale_offset : NULL;
    sneppx_kv_store_row(cache->dtype, block + offset * cache->elem_size, scale, src, n);
}

/* count consecutive rows of n elements from row `offset` of a block, widened to float;
 * int8 rows take consecutive scales from scale_offset. */
static void load_rows(const sneppx_kv_cache *cache, float *dst, unsigned char *block, int64_t offset,
                      int64_t scale_offset, int64_t count, int64_t n)
{
    if (cache->dtype == SNEPPX_DTYPE_FLOAT32) {
        memcpy(dst, block + offset * cache->elem_size, (size_t)(count * n) * sizeof(float));
        return;
    }
    const float *scales = cache->dtype == SNEPPX_DTYPE_INT8 ? sneppx_kv_scales(cache, block) + scale_offset : NULL;
    for (int64_t r = 0; r < count; r++)
        sneppx_kv_load_row(cache->dtype, dst + r * n, block + (offset + r * n) * cache->elem_size,
                           scales ? scales[r] : 0.0f, n);
}

/* Keys [lo, hi) of K/V head kv_head of seq at `layer`, copied from its pages to
 * k [hi - lo][head_dim] and v [hi - lo][v_head_dim] (MLA: latent rows to k, v
 * unused), widened to float32 (int8: dequantized). The only place attention reads
 * the pages: a kernel that reads them in place (decode) replaces this copy. */
static void gather_sequence_kv(const sneppx_kv_cache *cache, const struct sneppx_kv_sequence *seq, int64_t layer,
                               int64_t kv_head, int64_t lo, int64_t hi, float *k, float *v)
{
    const int64_t page_size = cache->page_size;
    const struct sneppx_kv_shape *shape = &cache->shape;
    for (int64_t token = lo; token < hi;) {
        const int64_t slot = token & (page_size - 1);
        const int64_t run = page_size - slot < hi - token ? page_size - slot : hi - token;
        unsigned char *block = sneppx_kv_block(cache, sneppx_kv_page_of(cache, seq, token), layer);
        if (shape->is_mla) {
            const int64_t latent = shape->kv_lora_rank + shape->rope_dim;
            load_rows(cache, k + (token - lo) * latent, block, sneppx_kv_latent_offset(cache, slot),
                      sneppx_kv_k_scale_offset(cache, 0, slot), run, latent);
        } else {
            load_rows(cache, k + (token - lo) * shape->head_dim, block, sneppx_kv_k_offset(cache, kv_head, slot),
                      sneppx_kv_k_scale_offset(cache, kv_head, slot), run, shape->head_dim);
            load_rows(cache, v + (token - lo) * shape->v_head_dim, block, sneppx_kv_v_offset(cache, kv_head, slot),
                      sneppx_kv_v_scale_offset(cache, kv_head, slot), run, shape->v_head_dim);
        }
        token += run;
    }
}

/* The call's sequence that index `at` falls in: the last whose first index of a
 * kind (token0, task0 or tile0: `offset` bytes into struct cached_sequence,
 * non-decreasing over the sequences) is <= at. A sequence with none of that
 * kind shares its first index with the next, which is then the one returned. */
static const struct cached_sequence *sequence_at(const struct cached_sequence *sequences, int64_t n_seqs,
                                                 size_t offset, int64_t at)
{
    int64_t lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (*(const int64_t *)((const char *)&sequences[mid] + offset) <= at)
            lo = mid;
        else
            hi = mid - 1;
    }
    return &sequences[lo];
}

/* Appends every new token's K and V (MLA: latent row) to its sequence's pages. */
static void append_tokens(const sneppx_layer *layer, const sneppx_kv_cache *cache, int64_t layer_index,
                          const struct sneppx_workspace *ws, const struct cached_sequence *sequences, int64_t n_seqs,
                          int64_t tokens)
{
    const struct sneppx_kv_shape *shape = &cache->shape;
#pragma omp parallel for schedule(static) num_threads(sneppx_thread_count(layer))
    for (int64_t t = 0; t < tokens; t++) {
        const struct cached_sequence *s = sequence_at(sequences, n_seqs, offsetof(struct cached_sequence, token0), t);
        const int64_t token = s->past + (t - s->token0), slot = token & (cache->page_size - 1);
        unsigned char *block = sneppx_kv_block(cache, sneppx_kv_page_of(cache, s->seq, token), layer_index);
        if (shape->is_mla) {
            const int64_t latent = layer->latent_dim;
            store_row(cache, block, sneppx_kv_latent_offset(cache, slot), sneppx_kv_k_scale_offset(cache, 0, slot),
                      ws->latent + t * latent, latent);
            continue;
        }
        const float *row = ws->qkv + t * layer->qkv_dim;
        for (int64_t h = 0; h < shape->kv_heads; h++) {
            store_row(cache, block, sneppx_kv_k_offset(cache, h, slot), sneppx_kv_k_scale_offset(cache, h, slot),
                      row + layer->q_dim + h * shape->head_dim, shape->head_dim);
            store_row(cache, block, sneppx_kv_v_offset(cache, h, slot), sneppx_kv_v_scale_offset(cache, h, slot),
                      row + layer->q_dim + layer->kv_dim + h * shape->v_head_dim, shape->v_head_dim);
        }
    }
}

/* Decode attention: attn_decode over each decode sequence's pages in place,
 * one task per (sequence, K/V head, key range); then the ranges merged. */
static void attend_decode(const sneppx_layer *layer, const sneppx_kv_cache *cache, int64_t layer_index,
                          const struct sneppx_workspace *ws, const sneppx_kernel *const kernels[2],
                          const struct cached_sequence *sequences, int64_t n_seqs, int64_t tasks)
{
    const int threads = sneppx_thread_count(layer);
    const int64_t kv_heads = layer->kv_heads, group = layer->attn_group;
    const int64_t dq = layer->attn_head_dim, dv = layer->attn_v_head_dim;
    const float *q_base = layer->is_mla ? ws->q_absorbed : ws->qkv;
    const int64_t q_stride = layer->is_mla ? layer->config.num_attention_heads * layer->latent_dim : layer->qkv_dim;
    const int64_t o_stride = group * kv_heads * dv;
    /* The layer's block in page 0; attn_decode adds pages[j / page_size] * page_stride
     * elements of the cache's type (its key's kv_type). */
    unsigned char *layer_base = sneppx_kv_block(cache, 0, layer_index);
    const float *scales = cache->dtype == SNEPPX_DTYPE_INT8 ? sneppx_kv_scales(cache, layer_base) : NULL;
    const int64_t elem = cache->elem_size, page_stride = cache->page_bytes / elem;
    const int64_t window = cache->shape.window;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t task = 0; task < tasks; task++) {
        const struct cached_sequence *s =
            sequence_at(sequences, n_seqs, offsetof(struct cached_sequence, task0), task);
        const int64_t kv_head = (task - s->task0) / s->splits, split = (task - s->task0) % s->splits;
        /* Keys from the first held token: queries are the last q_len of kv_len. */
        const int64_t kv_len = s->past + s->q_len - s->first_held;
        int64_t visible_from = 0;
        if (!s->mask && window > 0 && s->past - s->first_held - window + 1 > 0)
            visible_from = s->past - s->first_held - window + 1;
        const int64_t span = kv_len - visible_from;
        struct sneppx_args args = sneppx_kernel_args();
        args.row_begin = 0;
        args.row_end = s->q_len;
        args.q = q_base + s->token0 * q_stride + kv_head * group * dq;
        args.q_stride = q_stride;
        if (layer->is_mla) {
            args.k = args.v = (const float *)(void *)layer_base;
            args.k_stride = args.v_stride = layer->latent_dim;
        } else {
            args.k = (const float *)(void *)(layer_base + sneppx_kv_k_offset(cache, kv_head, 0) * elem);
            args.v = (const float *)(void *)(layer_base + sneppx_kv_v_offset(cache, kv_head, 0) * elem);
            args.k_stride = dq;
            args.v_stride = dv;
        }
        if (scales) {
            args.k_scale = scales + sneppx_kv_k_scale_offset(cache, layer->is_mla ? 0 : kv_head, 0);
            args.v_scale = layer->is_mla ? args.k_scale : scales + sneppx_kv_v_scale_offset(cache, kv_head, 0);
        }
        args.pages = s->seq->pages;
        args.page_size = cache->page_size;
        args.page_stride = page_stride;
        args.q_len = s->q_len;
        args.kv_len = kv_len;
        args.kv_begin = visible_from + span * split / s->splits;
        args.kv_end = visible_from + span * (split + 1) / s->splits;
        if (s->splits == 1) {
            args.o = ws->attn_out + s->token0 * o_stride + kv_head * group * dv;
            args.o_stride = o_stride;
        } else {
            const int64_t rows = s->q_len * group;
            float *region = s->split + kv_head * sneppx_attn_decode_split_floats(s->splits, s->q_len, group, dv);
            args.o = region + split * rows * dv;
            args.o_stride = group * dv;
            args.lse = region + (s->splits * dv + split) * rows;
        }
        if (s->mask) {
            args.mask = s->mask + s->first_held;
            args.mask_stride = s->past + s->q_len;
        }
        args.softmax_scale = layer->softmax_scale;
        args.scratch = ws->thread_scratch + omp_get_thread_num() * ws->thread_scratch_floats;
        kernels[s->mask != NULL]->entry[SNEPPX_ENTRY_RUN](&args);
    }
    int64_t merges = 0;
    for (int64_t i = 0; i < n_seqs; i++)
        merges += sequences[i].decode && sequences[i].splits > 1 ? kv_heads : 0;
    if (merges == 0)
        return;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n_seqs; i++) {
        const struct cached_sequence *s = &sequences[i];
        if (!s->decode || s->splits == 1)
            continue;
        for (int64_t kv_head = 0; kv_head < kv_heads; kv_head++)
            sneppx_attn_decode_merge(s->split + kv_head * sneppx_attn_decode_split_floats(s->splits, s->q_len, group, dv),
                                     s->splits, s->q_len, group, dv,
                                     ws->attn_out + s->token0 * o_stride + kv_head * group * dv, o_stride, NULL);
    }
}

/* Attention of every query tile of every sequence, per K/V head. */
static void attend(const sneppx_layer *layer, const sneppx_kv_cache *cache, int64_t layer_index,
                   const struct sneppx_workspace *ws, const sneppx_kernel *const kernels[2],
                   const struct cached_sequence *sequences, int64_t n_seqs, int64_t tile_rows)
{
    const int threads = sneppx_thread_count(layer);
    const int64_t kv_heads = layer->kv_heads, group = layer->attn_group;
    const int64_t dq = layer->attn_head_dim, dv = layer->attn_v_head_dim;
    const struct cached_sequence *last = &sequences[n_seqs - 1];
    const int64_t tiles = last->tile0 + (last->decode ? 0 : (last->q_len + tile_rows - 1) / tile_rows);
    /* Where the queries are and where the output goes, as forward.c lays them out. */
    const float *q_base = layer->is_mla ? ws->q_absorbed : ws->qkv;
    const int64_t q_stride = layer->is_mla ? layer->config.num_attention_heads * layer->latent_dim : layer->qkv_dim;
    const int64_t o_stride = group * kv_heads * dv;
    const int64_t window = cache->shape.window;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t task = 0; task < tiles * kv_heads; task++) {
        const int64_t kv_head = task % kv_heads, tile = task / kv_heads;
        /* Decode sequences have no tiles: the tile's sequence is the last whose tile0 <= tile. */
        const struct cached_sequence *s =
            sequence_at(sequences, n_seqs, offsetof(struct cached_sequence, tile0), tile);
        /* Within a sequence the last tiles (most keys) go first. */
        const int64_t own_tiles = (s->q_len + tile_rows - 1) / tile_rows;
        const int64_t row_begin = (own_tiles - 1 - (tile - s->tile0)) * tile_rows;
        const int64_t row_end = row_begin + tile_rows < s->q_len ? row_begin + tile_rows : s->q_len;
        const int64_t first = s->past + row_begin, last = s->past + row_end - 1;
        int64_t key_lo = s->first_held, key_hi = s->past + s->q_len;
        if (!s->mask) {
            key_hi = last + 1;
            if (window > 0 && first - window + 1 > key_lo)
                key_lo = first - window + 1;
        }
        float *scratch = ws->thread_scratch + omp_get_thread_num() * ws->thread_scratch_floats;
        float *k = scratch + ws->thread_gather_offset;
        float *v = layer->is_mla ? k : k + (key_hi - key_lo) * dq;
        gather_sequence_kv(cache, s->seq, layer_index, kv_head, key_lo, key_hi, k, v);

        struct sneppx_args args = sneppx_kernel_args();
        args.row_begin = 0;
        args.row_end = row_end - row_begin;
        args.q = q_base + (s->token0 + row_begin) * q_stride + kv_head * group * dq;
        args.q_stride = q_stride;
        args.k = k;
        args.k_stride = layer->is_mla ? layer->latent_dim : dq;
        args.v = v;
        args.v_stride = layer->is_mla ? layer->latent_dim : dv;
        args.o = ws->attn_out + (s->token0 + row_begin) * o_stride + kv_head * group * dv;
        args.o_stride = o_stride;
        /* The tile's queries are the last of the gathered keys' positions: its
         * first query sits at key index first - key_lo. */
        args.kv_len = key_hi - key_lo;
        args.q_len = args.kv_len - (first - key_lo);
        if (s->mask) {
            args.mask = s->mask + row_begin * (s->past + s->q_len) + key_lo;
            args.mask_stride = s->past + s->q_len;
        }
        args.softmax_scale = layer->softmax_scale;
        args.scratch = scratch;
        kernels[s->mask != NULL]->entry[SNEPPX_ENTRY_RUN](&args);
    }
}

static sneppx_status check_shape(const sneppx_layer *layer, const sneppx_kv_cache *cache)
{
    const struct sneppx_kv_shape *shape = &cache->shape;
    const sneppx_config *c = &layer->config;
    if (layer->is_mla && c->mla_naive)
        return sneppx_fail(SNEPPX_ERR_UNSUPPORTED,
                           "layer: made with mla_naive; the cache holds the absorbed form's latent rows "
                           "(create the layer with mla_naive 0)");
    if (layer->is_mla != shape->is_mla)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "cache: made for %s layers, this layer is %s",
                           shape->is_mla ? "MLA" : "standard", layer->is_mla ? "MLA" : "standard");
    if (layer->is_mla && (shape->kv_lora_rank != c->kv_lora_rank || shape->rope_dim != c->qk_rope_head_dim))
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                           "cache: made for latent rows of kv_lora_rank %lld + qk_rope_head_dim %lld, this layer "
                           "has %lld + %lld",
                           (long long)shape->kv_lora_rank, (long long)shape->rope_dim, (long long)c->kv_lora_rank,
                           (long long)c->qk_rope_head_dim);
    if (!layer->is_mla && (shape->kv_heads != layer->kv_heads || shape->head_dim != layer->head_dim ||
                           shape->v_head_dim != layer->v_head_dim || shape->window != layer->attn_window))
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                           "cache: made for %lld K/V heads of head_dim %lld, sliding_window %lld; this layer has "
                           "%lld of %lld, sliding_window %lld",
                           (long long)shape->kv_heads, (long long)shape->head_dim, (long long)shape->window,
                           (long long)layer->kv_heads, (long long)layer->head_dim, (long long)layer->attn_window);
    return SNEPPX_OK;
}

/* Arguments that need no cache lookup; *tokens = sum(q_lens). */
static sneppx_status check_arguments(const sneppx_layer *layer, const sneppx_kv_cache *cache, int64_t layer_index,
                                     int64_t n_seqs, const int64_t *seq_ids, const int64_t *q_lens,
                                     const float *hidden_states, const float *out, int64_t *tokens)
{
    if (!layer)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "layer: must not be NULL");
    if (!cache)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "cache: must not be NULL");
    if (layer_index < 0 || layer_index >= cache->num_layers)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "layer_index: %lld must be in [0, %lld) (the cache's num_layers)",
                           (long long)layer_index, (long long)cache->num_layers);
    sneppx_status status = check_shape(layer, cache);
    if (status != SNEPPX_OK)
        return status;
    char message[256];
    if (sneppx_forward_check_n_seqs(n_seqs, message, sizeof message))
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "%s", message);
    if (!seq_ids)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "seq_ids: must not be NULL");
    if (!q_lens)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "q_lens: must not be NULL");
    if (!hidden_states)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "hidden_states: must not be NULL");
    if (!out)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "out: must not be NULL");
    const int64_t per_token =
        sneppx_forward_floats_per_token(layer->qkv_dim, layer->attn_dim, layer->config.hidden_size);
    if (sneppx_forward_check_q_lens(n_seqs, q_lens, per_token, tokens, message, sizeof message))
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "%s", message);
    return SNEPPX_OK;
}

/* Under a sliding window the pages of old tokens are gone: a mask may not let a query see them.
 * Only an entry <= SNEPPX_MASKED_BELOW hides its key; NaN does not (the kernels add it, and
 * the whole sequence's forward gives a NaN row), so NaN is refused as a shown token. */
static sneppx_status check_masks(const struct cached_sequence *sequences, int64_t n_seqs)
{
    for (int64_t i = 0; i < n_seqs; i++) {
        const struct cached_sequence *s = &sequences[i];
        if (!s->mask)
            continue;
        for (int64_t row = 0; row < s->q_len; row++)
            for (int64_t key = 0; key < s->first_held; key++)
                if (!(s->mask[row * (s->past + s->q_len) + key] <= SNEPPX_MASKED_BELOW))
                    return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                                       "masks[%lld]: row %lld lets the query see token %lld, which the sliding "
                                       "window already released (tokens before %lld are gone; mask them)",
                                       (long long)i, (long long)row, (long long)key, (long long)s->first_held);
    }
    return SNEPPX_OK;
}

/* position_ids NULL: each sequence's positions are its layer length + 0, 1, ...,
 * so a sequence that grows past max_position_embeddings is what the error names
 * (seq_ids[i], its length and new tokens), not position_ids, which the caller did
 * not give. Dynamic RoPE runs past it (sneppx_forward_check_positions). */
static sneppx_status check_implicit_positions(const sneppx_layer *layer, int64_t layer_index,
                                              const struct cached_sequence *sequences, int64_t n_seqs,
                                              const int64_t *seq_ids)
{
    const sneppx_config *config = &layer->config;
    if (config->rope_scaling.type == SNEPPX_ROPE_DYNAMIC)
        return SNEPPX_OK;
    for (int64_t i = 0; i < n_seqs; i++) {
        const struct cached_sequence *s = &sequences[i];
        if (s->past + s->q_len > config->max_position_embeddings)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "seq_ids[%lld]: sequence %lld holds %lld tokens at layer %lld, and its %lld new ones "
                               "reach position %lld, beyond max_position_embeddings %lld%s",
                               (long long)i, (long long)seq_ids[i], (long long)s->past, (long long)layer_index,
                               (long long)s->q_len, (long long)(s->past + s->q_len - 1),
                               (long long)config->max_position_embeddings,
                               sneppx_config_beyond_positions_hint(config, 1));
    }
    return SNEPPX_OK;
}

/* The call; a shard's (agreed non-NULL) takes every rank's verdict, setting *agreed,
 * once nothing can fail but the sums. */
static sneppx_status forward_cached(sneppx_layer *layer, sneppx_kv_cache *cache, int64_t layer_index,
                                    int64_t n_seqs, const int64_t *seq_ids, const int64_t *q_lens,
                                    const float *hidden_states, const int64_t *position_ids,
                                    const float *const *masks, float *out, int *agreed)
{
    int64_t tokens = 0;
    sneppx_status status =
        check_arguments(layer, cache, layer_index, n_seqs, seq_ids, q_lens, hidden_states, out, &tokens);
    if (status != SNEPPX_OK)
        return status;

    /* The attention kernels the call uses, by path (gathered: the layer's flash
     * or SDPA; decode) and mask mode, compiled at first use. */
    int uses[2][2] = {{0, 0}, {0, 0}}; /* [decode][explicit mask] */
    for (int64_t i = 0; i < n_seqs; i++)
        uses[q_lens[i] <= SNEPPX_DECODE_MAX_QUERIES][masks && masks[i]] = 1;
    const int gathered_kind = atomic_load(&layer->use_flash) ? SNEPPX_ATTN_FLASH : SNEPPX_ATTN_SDPA;
    const sneppx_kernel *kernels[2][2] = {{NULL, NULL}, {NULL, NULL}};
    for (int decode = 0; decode < 2; decode++)
        for (int explicit_mask = 0; explicit_mask < 2; explicit_mask++)
            if (uses[decode][explicit_mask] &&
                (status = decode ? sneppx_layer_decode_kernel(layer, cache->dtype, explicit_mask,
                                                              &kernels[decode][explicit_mask])
                                 : sneppx_layer_attention_kernel(layer, gathered_kind, explicit_mask,
                                                                 &kernels[decode][explicit_mask])) != SNEPPX_OK)
                return status;

    /* Scratch sized by powers of two of the keys, so that a sequence growing by
     * a token per decode step reuses its workspace. */
    int64_t max_keys;
    if ((status = sneppx_kv_call_measure(cache, layer_index, n_seqs, seq_ids, q_lens, &max_keys)) != SNEPPX_OK)
        return status;
    const int64_t key_capacity = next_power_of_two(max_keys);
    const int64_t split_floats = split_floats_bound(layer, n_seqs, q_lens);
    const struct sneppx_workspace_needs needs = {
        key_capacity, key_capacity * gathered_key_floats(cache),
        plan_head_bytes(n_seqs, tokens) + split_floats * (int64_t)sizeof(float)};
    struct sneppx_workspace *ws;
    if ((status = sneppx_workspace_acquire_needs(layer, tokens, &needs, &ws)) != SNEPPX_OK)
        return status;
    const struct cached_plan plan = plan_in(ws->plan, n_seqs, tokens);
    const char call = 0; /* its address marks the sequences this call holds */
    if ((status = sneppx_kv_call_begin(cache, &call, n_seqs, seq_ids, plan.seqs)) != SNEPPX_OK) {
        sneppx_workspace_release(layer, ws);
        return status;
    }

    /* The sequences are ours now: read them once. */
    int64_t token0 = 0;
    for (int64_t i = 0; i < n_seqs; i++) {
        struct cached_sequence *s = &plan.sequences[i];
        s->seq = plan.seqs[i];
        s->token0 = token0;
        s->q_len = q_lens[i];
        s->past = s->seq->lengths[layer_index];
        s->first_held = sneppx_kv_first_held(cache, s->seq);
        s->mask = masks ? masks[i] : NULL;
        token0 += s->q_len;
        if (s->past + s->q_len - s->first_held > key_capacity)
            status = sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                                 "seq_ids[%lld]: sequence %lld changed during the call (another call used it at the "
                                 "same time)",
                                 (long long)i, (long long)seq_ids[i]);
        for (int64_t j = 0; j < s->q_len; j++)
            plan.positions[s->token0 + j] = position_ids ? position_ids[s->token0 + j] : s->past + j;
    }
    /* Decode sequences: tasks of kv_heads x splits each, split results in plan.splits. */
    int64_t decode_tasks = 0, gathered_seqs = 0;
    for (int64_t i = 0; i < n_seqs; i++) {
        plan.sequences[i].decode = plan.sequences[i].q_len <= SNEPPX_DECODE_MAX_QUERIES;
        decode_tasks += plan.sequences[i].decode ? layer->kv_heads : 0;
        gathered_seqs += !plan.sequences[i].decode;
    }
    float *split = plan.splits;
    int64_t task0 = 0, gathered_max_q_len = 0;
    for (int64_t i = 0; i < n_seqs; i++) {
        struct cached_sequence *s = &plan.sequences[i];
        s->task0 = task0;
        s->splits = 1;
        s->split = NULL;
        if (!s->decode) {
            gathered_max_q_len = s->q_len > gathered_max_q_len ? s->q_len : gathered_max_q_len;
            continue;
        }
        s->splits = sneppx_decode_splits(s->past + s->q_len - s->first_held, decode_tasks, sneppx_thread_count(layer));
        if (s->splits > 1) {
            s->split = split;
            split += layer->kv_heads * sneppx_attn_decode_split_floats(s->splits, s->q_len, layer->attn_group,
                                                                       layer->attn_v_head_dim);
        }
        task0 += layer->kv_heads * s->splits;
    }
    const int64_t tile_rows = sneppx_attention_tile_rows(gathered_max_q_len, gathered_seqs, layer->kv_heads,
                                                         sneppx_thread_count(layer));
    for (int64_t i = 0, tile0 = 0; i < n_seqs; i++) {
        plan.sequences[i].tile0 = tile0;
        tile0 += plan.sequences[i].decode ? 0 : (plan.sequences[i].q_len + tile_rows - 1) / tile_rows;
    }
    const sneppx_config *config = &layer->config;
    char message[256];
    int64_t max_position = 0;
    if (status == SNEPPX_OK && !position_ids)
        status = check_implicit_positions(layer, layer_index, plan.sequences, n_seqs, seq_ids);
    if (status == SNEPPX_OK &&
        sneppx_forward_check_positions(plan.positions, tokens, tokens, config->max_position_embeddings,
                                       config->rope_scaling.type == SNEPPX_ROPE_DYNAMIC,
                                       sneppx_config_beyond_positions_hint(config, position_ids == NULL),
                                       &max_position, message, sizeof message))
        status = sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "%s", message);
    if (status == SNEPPX_OK)
        status = check_masks(plan.sequences, n_seqs);
    if (status == SNEPPX_OK)
        status = sneppx_rope_tables(layer, tokens, tokens, plan.positions, max_position, ws->cos, ws->sin);
    if (status == SNEPPX_OK)
        status = sneppx_kv_call_reserve(cache, layer_index, n_seqs, plan.seqs, q_lens);
    if (agreed) {
        uint64_t mask_hash = masks ? SNEPPX_SHARD_HASH_START : 0, lengths_hash = SNEPPX_SHARD_HASH_START;
        for (int64_t i = 0; i < n_seqs; i++)
            lengths_hash = sneppx_shard_hash_step(lengths_hash, (uint64_t)plan.sequences[i].past);
        for (int64_t i = 0; status == SNEPPX_OK && masks && i < n_seqs; i++) {
            /* A row without a plane (causal) hashes as 0, not as a plane of zeros. */
            const struct cached_sequence *s = &plan.sequences[i];
            mask_hash = sneppx_shard_hash_step(
                mask_hash, s->mask ? sneppx_shard_hash_floats(s->mask, s->q_len * (s->past + s->q_len)) : 0);
        }
        const struct sneppx_shard_call call = {
            .cached = 1, .tokens = tokens, .batch = n_seqs, .layer_index = layer_index, .has_mask = masks != NULL,
            .positions = sneppx_shard_hash(plan.positions, tokens), .q_lens = sneppx_shard_hash(q_lens, n_seqs),
            .seq_ids = sneppx_shard_hash(seq_ids, n_seqs), .kv_dtype = cache->dtype, .lengths = lengths_hash,
            .inputs = status == SNEPPX_OK
                          ? sneppx_shard_hash_floats(hidden_states, tokens * layer->config.hidden_size)
                          : 0,
            .mask = mask_hash};
        status = sneppx_shard_agree_call(layer->shard, status, &call);
        *agreed = 1;
    }
    if (status != SNEPPX_OK) { /* the reserved pages go back (sneppx_kv_call_end) */
        sneppx_kv_call_end(cache, layer_index, n_seqs, plan.seqs, q_lens, 0);
        sneppx_workspace_release(layer, ws);
        return status;
    }

    /* Every page is reserved: nothing fails from here but a shard's sums (after
     * which the cache holds the tokens all the same). */
    sneppx_forward_project(layer, ws, tokens, hidden_states);
    append_tokens(layer, cache, layer_index, ws, plan.sequences, n_seqs, tokens);
    if (task0 > 0)
        attend_decode(layer, cache, layer_index, ws, kernels[1], plan.sequences, n_seqs, task0);
    if (gathered_seqs > 0)
        attend(layer, cache, layer_index, ws, kernels[0], plan.sequences, n_seqs, tile_rows);
    status = sneppx_forward_output(layer, ws, tokens, out);
    sneppx_kv_call_end(cache, layer_index, n_seqs, plan.seqs, q_lens, 1);
    sneppx_workspace_release(layer, ws);
    return status;
}

sneppx_status sneppx_layer_forward_cached(sneppx_layer *layer, sneppx_kv_cache *cache, int64_t layer_index,
                                          int64_t n_seqs, const int64_t *seq_ids, const int64_t *q_lens,
                                          const float *hidden_states, const int64_t *position_ids,
                                          const float *const *masks, float *out)
{
    sneppx_clear_error();
    if (!layer || !layer->shard)
        return forward_cached(layer, cache, layer_index, n_seqs, seq_ids, q_lens, hidden_states, position_ids, masks,
                              out, NULL);
    /* A shard: every rank's verdict before the first write (in forward_cached(), or
     * here when it refused before its own agreement), then the sums. */
    int agreed = 0;
    pthread_mutex_lock(&layer->shard->calls);
    sneppx_status status = forward_cached(layer, cache, layer_index, n_seqs, seq_ids, q_lens, hidden_states,
                                          position_ids, masks, out, &agreed);
    if (!agreed) {
        const struct sneppx_shard_call call = {.cached = 1, .batch = n_seqs, .layer_index = layer_index,
                                               .has_mask = masks != NULL};
        status = sneppx_shard_agree_call(layer->shard, status, &call);
    }
    pthread_mutex_unlock(&layer->shard->calls);
    return status;
}
