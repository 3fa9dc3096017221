/* sneppx — a paged KV cache and the forward pass that uses it (generation).
 *
 * A cache is made for one layer shape (a config) and holds that shape's keys
 * and values for `num_layers` layers: a model's layers share one page table
 * per sequence, so adding, forking or truncating a sequence happens once for
 * all of them. The caller owns the cache; layers never hold one.
 *
 * What a page holds, per layer: standard attention, each token's K (after
 * RoPE) and V for every K/V head; multi-head latent attention (DeepSeek V2),
 * one latent row per token: kv_lora_rank floats after kv_a_layernorm, then
 * qk_rope_head_dim floats of k_pe after RoPE. Pages come from a pool of fixed
 * size made at create; nothing grows it.
 *
 * Lengths. Each layer of a sequence has its own length: the tokens
 * sneppx_layer_forward_cached appended to it at that layer_index. Between two
 * decode steps every layer has the same length; during a step the layers run
 * one after another. sneppx_kv_cache_length gives the largest, and
 * sneppx_kv_cache_layer_length one layer's.
 *
 * Sliding window (config.sliding_window = W > 0). A query at token index p
 * sees keys p - W + 1 .. p, so the pages of tokens no later query can see (every
 * index <= L - W, L the smallest layer length of the sequence) go back to the
 * pool after each call: between calls a sequence holds the pages of its last
 * W - 1 tokens, at most (W - 2) / page_size + 2 pages (fewer than W + 2 *
 * page_size tokens; during a call, plus its new tokens), however long it runs.
 *
 * Threads. The pool and the sequence table are guarded by a mutex. Calls on
 * different sequences may overlap: forwards of any layers, add, remove, fork,
 * truncate and the queries. Two calls that name the same sequence may not
 * (sneppx_layer_forward_cached refuses a sequence another call is using, and
 * so do remove, fork and truncate). reset and destroy may not overlap any
 * other call on the cache.
 *
 * Errors leave the cache as it was: a call first checks its arguments and
 * reserves every page it needs, and only then writes. */
#ifndef SNEPPX_KV_CACHE_H
#define SNEPPX_KV_CACHE_H

#include <stdint.h>
#include "sneppx/config.h"
#include "sneppx/export.h"
#include "sneppx/layer.h"
#include "sneppx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 64 tokens: one K/V head's keys in a page are a 32 KiB run at d 128 (float32), long
 * enough for the hardware prefetchers; pages of 16 (8 KiB runs) made decode attention
 * over a long cache 1.07-1.35x slower (docs/PERFORMANCE.md, What made the difference). */
#define SNEPPX_KV_DEFAULT_PAGE_SIZE 64
/* capacity_tokens is at most this (attention kernels index keys with int32). */
#define SNEPPX_KV_MAX_CAPACITY_TOKENS (((int64_t)1 << 31) - 1)
#define SNEPPX_KV_MAX_PAGE_SIZE 65536
#define SNEPPX_KV_MAX_LAYERS 4096

typedef struct sneppx_kv_cache_options {
    uint32_t struct_size;      /* sizeof(sneppx_kv_cache_options) of the caller; fields past it
                                  take sneppx_kv_cache_options_init's values */
    int64_t capacity_tokens;   /* the pool, in tokens of one layer, rounded up to whole pages;
                                  in [1, SNEPPX_KV_MAX_CAPACITY_TOKENS] */
    int64_t page_size;         /* tokens per page: a power of two up to SNEPPX_KV_MAX_PAGE_SIZE;
                                  0 = SNEPPX_KV_DEFAULT_PAGE_SIZE */
    int64_t num_layers;        /* layers of this shape sharing the page tables, in
                                  [1, SNEPPX_KV_MAX_LAYERS] */
    sneppx_dtype dtype;        /* how K (after RoPE) and V (MLA: the latent rows) are stored
                                  (config.h's types): float32 (the default); bfloat16 or
                                  float16, rounded to nearest even (half the bytes); int8,
                                  symmetric with a float32 scale per row: per token and K/V
                                  head for K and for V (MLA: one per latent row), scale =
                                  max|x| / 127, rounded to nearest even (about a quarter).
                                  Attention widens on load and accumulates in float32 */
    int64_t max_sequence_tokens; /* tokens one sequence holds at most, which sizes every
                                  sequence's page table once, at add and fork, so that no
                                  forward call allocates; 0 = the whole pool (8 bytes per
                                  page of the pool per sequence). A sequence that outgrows it
                                  still works: its table grows once per doubling. In
                                  [0, SNEPPX_KV_MAX_CAPACITY_TOKENS] */
} sneppx_kv_cache_options;

/* struct_size = sizeof, capacity_tokens 0 (must be set), page_size
 * SNEPPX_KV_DEFAULT_PAGE_SIZE, num_layers 1, dtype float32, max_sequence_tokens 0 (the pool). */
SNEPPX_API void sneppx_kv_cache_options_init(sneppx_kv_cache_options *options);

typedef struct sneppx_kv_cache sneppx_kv_cache;

/* Makes a cache for layers of config's shape (validated as sneppx_layer_create
 * validates it): standard: num_key_value_heads, head_dim and the sliding
 * window; MLA: kv_lora_rank + qk_rope_head_dim. The pool is allocated here.
 * Errors name the option (options.page_size, options.capacity_tokens, ...). */
SNEPPX_API sneppx_status sneppx_kv_cache_create(const sneppx_config *config, const sneppx_kv_cache_options *options,
                                               sneppx_kv_cache **cache);

/* Frees the cache and every page; NULL does nothing. */
SNEPPX_API void sneppx_kv_cache_destroy(sneppx_kv_cache *cache);

/* A new empty sequence; *seq_id is never reused by this cache. */
SNEPPX_API sneppx_status sneppx_kv_cache_add_sequence(sneppx_kv_cache *cache, int64_t *seq_id);

/* Removes a sequence; its pages go back to the pool (a page a fork still
 * shares stays with the fork). */
SNEPPX_API sneppx_status sneppx_kv_cache_remove_sequence(sneppx_kv_cache *cache, int64_t seq_id);

/* A new sequence that continues from seq_id as it is now (every layer's
 * length): it shares all of the parent's pages; the first append into a
 * shared page copies that page for the one appending (copy-on-write). When
 * every sequence sharing a page appends into it in one forward call (a beam
 * decoding), all but the last copy it and the last keeps it. */
SNEPPX_API sneppx_status sneppx_kv_cache_fork(sneppx_kv_cache *cache, int64_t seq_id, int64_t *child_id);

/* Drops the tokens from index `length` on, in every layer (a layer already
 * shorter keeps its length): speculative decoding's rollback. Refused when
 * length exceeds sneppx_kv_cache_length, and under a sliding window when a
 * token the next query would see (index >= length - W + 1) was already
 * released; length 0 keeps no token and is never refused (the sequence
 * starts over). Pages past the new length go back to the pool. */
SNEPPX_API sneppx_status sneppx_kv_cache_truncate(sneppx_kv_cache *cache, int64_t seq_id, int64_t length);

/* sneppx_kv_cache_truncate for n_seqs sequences at once, all or none: sequence
 * seq_ids[i] keeps lengths[i] tokens. Every one is checked first (as truncate
 * checks it; each sequence at most once), so a refusal, which names seq_ids[i]
 * or lengths[i], cuts none of them: a batch's rollback (transformers' crop).
 * n_seqs 0 does nothing; the arrays may then be NULL. */
SNEPPX_API sneppx_status sneppx_kv_cache_truncate_sequences(sneppx_kv_cache *cache, int64_t n_seqs,
                                                           const int64_t *seq_ids, const int64_t *lengths);

/* The largest of the sequence's layer lengths (tokens appended so far,
 * released ones included). */
SNEPPX_API sneppx_status sneppx_kv_cache_length(sneppx_kv_cache *cache, int64_t seq_id, int64_t *length);

/* One layer's length. */
SNEPPX_API sneppx_status sneppx_kv_cache_layer_length(sneppx_kv_cache *cache, int64_t seq_id, int64_t layer_index,
                                                      int64_t *length);

/* The first token the sequence still holds, at every layer: 0, or under a sliding
 * window the first token of its first page not yet released (a multiple of the page
 * size). sneppx_kv_cache_read can read from it to a layer's length. */
SNEPPX_API sneppx_status sneppx_kv_cache_first_held(sneppx_kv_cache *cache, int64_t seq_id, int64_t *first);

/* Copies what the cache holds for tokens [begin, end) of a sequence at one layer,
 * widened to float32 (int8: each row times its scale): standard, k [end - begin]
 * [num_key_value_heads][head_dim] (K after RoPE) and v [end - begin]
 * [num_key_value_heads][head_dim]; MLA, k [end - begin][kv_lora_rank +
 * qk_rope_head_dim] (the latent rows), v unused (may be NULL). The tokens must
 * be held: from the first one a sliding window has not released to the layer's
 * length. For inspection, export and tests; a forward never needs it. */
SNEPPX_API sneppx_status sneppx_kv_cache_read(sneppx_kv_cache *cache, int64_t seq_id, int64_t layer_index,
                                             int64_t begin, int64_t end, float *k, float *v);

/* Removes every sequence; every page goes back to the pool. Sequence ids
 * handed out before stay unknown. */
SNEPPX_API sneppx_status sneppx_kv_cache_reset(sneppx_kv_cache *cache);

typedef struct sneppx_kv_cache_stats {
    int64_t page_size;         /* tokens per page */
    int64_t num_layers;
    int64_t total_pages;       /* of the pool */
    int64_t free_pages;        /* in the pool now */
    int64_t sequences;         /* live sequences */
    int64_t page_bytes;        /* bytes of one page, every layer */
    int64_t token_elements;    /* elements one token takes in one layer */
    int64_t token_bytes;       /* bytes one token takes in one layer: elements of dtype, and
                                  int8's float32 scales (page_bytes adds 64-byte alignment) */
    sneppx_dtype dtype;        /* the elements' type (options.dtype) */
} sneppx_kv_cache_stats;

SNEPPX_API sneppx_status sneppx_kv_cache_stats_get(sneppx_kv_cache *cache, sneppx_kv_cache_stats *stats);

/* One layer's forward over a batch of sequences that continue from the cache:
 * prefill, chunked prefill, decode and ragged mixes of them, in one call.
 *
 *   n_seqs         sequences in the call, each at most once
 *   seq_ids        [n_seqs] live sequences of cache
 *   q_lens         [n_seqs] new tokens per sequence, each >= 1; their sum at most
 *                  SNEPPX_MAX_TOKENS
 *   hidden_states  [sum(q_lens), hidden_size], the sequences' tokens one after another
 *   position_ids   [sum(q_lens)], the same order; NULL = each sequence's layer
 *                  length + 0, 1, ... (the checks of sneppx_layer_forward apply)
 *   masks          NULL (causal + sliding window for all), or [n_seqs] planes: NULL
 *                  (causal) or an additive [q_len, L + q_len] plane (row-major, L
 *                  the sequence's layer length before the call), taken as final as
 *                  in sneppx_layer_forward. Under a sliding window the columns of
 *                  released tokens must be masked (<= -1e30).
 *   out            [sum(q_lens), hidden_size]
 *
 * For each sequence the new tokens' K/V (MLA: latent rows) are appended at
 * layer_index, then its queries attend over cached + new tokens: every row
 * equals the row sneppx_layer_forward gives for the whole sequence, except under
 * dynamic RoPE past max_position_embeddings: its frequencies follow the call's
 * longest position over all its sequences, and cached keys keep those of the call
 * that appended them (both as in transformers). Projections run once over all the
 * call's tokens. A layer made with mla_naive is refused
 * (SNEPPX_ERR_UNSUPPORTED): the cache holds the absorbed form's latent rows.
 * The cache must have been made for the layer's shape. On error nothing is
 * written to out or to the cache. */
SNEPPX_API sneppx_status sneppx_layer_forward_cached(sneppx_layer *layer, sneppx_kv_cache *cache, int64_t layer_index,
                                                     int64_t n_seqs, const int64_t *seq_ids, const int64_t *q_lens,
                                                     const float *hidden_states, const int64_t *position_ids,
                                                     const float *const *masks, float *out);

#ifdef __cplusplus
}
#endif
#endif
