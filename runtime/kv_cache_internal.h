/* Internal: the paged KV cache (runtime/kv_cache.c) as the cached forward
 * (runtime/forward_cached.c) reads and writes it.
 *
 * Pool: page_count pages of page_bytes each, one allocation. A page holds
 * page_size consecutive tokens of one sequence for every layer: layer l's block
 * starts at byte l * layer_block_bytes (a multiple of 64). Inside a block,
 * offsets are in elements of elem_size bytes (sneppx_dtype), slot s = token
 * index % page_size:
 *   standard: K [kv_heads][page_size][head_dim], then V [kv_heads][page_size][v_head_dim]
 *             (one K/V head's keys in a page are consecutive rows); K after RoPE;
 *   MLA:      [page_size][latent_dim], latent = kv_lora_rank (after kv_a_layernorm)
 *             then qk_rope_head_dim (k_pe after RoPE).
 * int8 (kv_elements.h) adds the rows' float32 scales, from byte scale_offset of
 * the block (a multiple of 64), in floats:
 *   standard: K scales [kv_heads][page_size], then V scales [kv_heads][page_size];
 *   MLA:      [page_size], one per latent row, K and V at once.
 * Every size and offset is computed in sneppx_kv_cache_create (kv_cache.c).
 *
 * Sequence: pages[0 .. held) hold tokens [released * page_size, ...): the first
 * `released` pages went back to the pool (sliding window). A page shared by
 * forks has refcount > 1; a sequence that appends into it gets a copy
 * (copy-on-write), except that when every holder appends into it in one call,
 * the last of them keeps it once the others have copied it (the copies are
 * made under the lock, before any kernel of the call writes; the shared page's
 * other references end with the call). A call that ends without appending
 * (its undo) ends before any kernel wrote, so what it gives back is as it was.
 * The pool's mutex guards the free list,
 * the refcounts and the sequence table; a sequence's own fields change only
 * in calls that name it, which sneppx_kv_call_begin keeps to one at a time. */
#ifndef SNEPPX_RUNTIME_KV_CACHE_INTERNAL_H
#define SNEPPX_RUNTIME_KV_CACHE_INTERNAL_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "sneppx/kv_cache.h"

struct sneppx_kv_sequence {
    int64_t id;
    int64_t *lengths;          /* [num_layers] tokens appended per layer */
    int64_t released;          /* pages released from the front */
    int32_t *pages;            /* [capacity], pages[0 .. held) in use */
    int64_t held, capacity;
    const void *in_call;       /* the call using it now, NULL when idle */
    /* What the call's reserve changed, so that a call ended without appending
     * (a shard's collective refusal) gives it back: the held count when the
     * call began, and the shared pages its copies replaced in [copied_begin,
     * copied_end), replaced[p] (-1: none), still referenced until the end.
     * Between its copy plan and its copies, replaced[p] is COPY_PAGE (kv_cache.c). */
    int64_t call_held, copied_begin, copied_end;
    int32_t *replaced;         /* [capacity] */
};

/* The layer shape a cache is made for. */
struct sneppx_kv_shape {
    int is_mla;
    int64_t kv_heads, head_dim, v_head_dim; /* standard */
    int64_t kv_lora_rank, rope_dim;         /* MLA */
    int64_t window;                         /* 0 = none */
};

struct sneppx_kv_cache {
    struct sneppx_kv_shape shape;
    int64_t page_size, page_shift, num_layers;
    sneppx_dtype dtype;
    int64_t elem_size;
    int64_t token_elems;        /* elements of one token in one layer */
    int64_t k_block_elems;      /* standard: kv_heads * page_size * head_dim (V follows) */
    int64_t scale_offset;       /* int8: bytes from a layer block to its scales; else 0 */
    int64_t token_bytes;        /* bytes of one token in one layer, scales included */
    int64_t layer_block_bytes, page_bytes;
    unsigned char *pool;
    int32_t page_count;
    int64_t table_pages;        /* a new sequence's page table entries */
    int32_t *refcount;          /* [page_count], 0 = free */
    /* A call's reserve, per shared page it writes (under the lock): how many of the
     * call's sequences write it, and the last of them (sneppx_kv_call_reserve). */
    int32_t *call_writers;      /* [page_count] */
    int64_t *call_last_writer;  /* [page_count] */
    int32_t *free_pages;        /* stack of free page indices */
    int32_t free_count;

    pthread_mutex_t lock;
    struct sneppx_kv_sequence **slots; /* by slot; NULL = free (unless retired: generations) */
    uint32_t *generations;             /* [slot_capacity] */
    int64_t slot_count, slot_capacity, live;
};

/* A sequence id is slot + generation * 2^32: a removed slot's ids stay unknown. */
#define SNEPPX_KV_SLOT_BITS 32
/* A slot's generations: 0 .. SNEPPX_KV_LAST_GENERATION (an id's top 31 bits), then
 * SNEPPX_KV_SLOT_RETIRED, which no id carries: the slot is never used again. */
#define SNEPPX_KV_LAST_GENERATION 0x7fffffffu
#define SNEPPX_KV_SLOT_RETIRED 0xffffffffu

static inline unsigned char *sneppx_kv_block(const sneppx_kv_cache *cache, int32_t page, int64_t layer)
{
    return cache->pool + (size_t)page * (size_t)cache->page_bytes + (size_t)layer * (size_t)cache->layer_block_bytes;
}

/* Element offsets inside a layer block. */
static inline int64_t sneppx_kv_k_offset(const sneppx_kv_cache *cache, int64_t kv_head, int64_t slot)
{
    return (kv_head * cache->page_size + slot) * cache->shape.head_dim;
}
static inline int64_t sneppx_kv_v_offset(const sneppx_kv_cache *cache, int64_t kv_head, int64_t slot)
{
    return cache->k_block_elems + (kv_head * cache->page_size + slot) * cache->shape.v_head_dim;
}
static inline int64_t sneppx_kv_latent_offset(const sneppx_kv_cache *cache, int64_t slot)
{
    return slot * (cache->shape.kv_lora_rank + cache->shape.rope_dim);
}

/* int8: the scales of a layer block (the block's address), and offsets in them. */
static inline float *sneppx_kv_scales(const sneppx_kv_cache *cache, unsigned char *block)
{
    return (float *)(void *)(block + cache->scale_offset);
}
static inline int64_t sneppx_kv_k_scale_offset(const sneppx_kv_cache *cache, int64_t kv_head, int64_t slot)
{
    return kv_head * cache->page_size + slot; /* MLA: kv_head 0, the row's one scale */
}
static inline int64_t sneppx_kv_v_scale_offset(const sneppx_kv_cache *cache, int64_t kv_head, int64_t slot)
{
    return (cache->shape.kv_heads + kv_head) * cache->page_size + slot;
}

/* The page holding token index `token` of seq (held, not released). */
static inline int32_t sneppx_kv_page_of(const sneppx_kv_cache *cache, const struct sneppx_kv_sequence *seq,
                                        int64_t token)
{
    return seq->pages[(token >> cache->page_shift) - seq->released];
}

/* The first token index seq still holds. */
static inline int64_t sneppx_kv_first_held(const sneppx_kv_cache *cache, const struct sneppx_kv_sequence *seq)
{
    return seq->released << cache->page_shift;
}

/* Before a call holds its sequences: the most keys one of its sequences will
 * hold after appending q_lens[i] (from its first held token), for sizing the
 * call's scratch. Errors name the unknown seq_ids entry. */
sneppx_status sneppx_kv_call_measure(sneppx_kv_cache *cache, int64_t layer, int64_t n_seqs, const int64_t *seq_ids,
                                     const int64_t *q_lens, int64_t *max_keys);

/* A forward call's hold on its sequences. begin looks every id up and marks
 * the sequences as used by `call` (any address unique to the call); on error
 * none is marked and the message names seq_ids. */
sneppx_status sneppx_kv_call_begin(sneppx_kv_cache *cache, const void *call, int64_t n_seqs, const int64_t *seq_ids,
                                   struct sneppx_kv_sequence **seqs);
/* Makes every page of tokens [length, length + q_lens[i]) of layer
 * `layer` of seqs[i] present and writable (new pages, copies of shared
 * ones), all or nothing: on error (pool full: the message names the sequence
 * and the pages it needed) the cache is as before. */
sneppx_status sneppx_kv_call_reserve(sneppx_kv_cache *cache, int64_t layer, int64_t n_seqs,
                                     struct sneppx_kv_sequence *const *seqs, const int64_t *q_lens);
/* Ends the call: when appended, each layer length grows by q_lens[i] and
 * pages no later query can see are released; when not, the pages the call
 * reserved go back and the shared pages it copied are shared again, so the
 * cache is as before the call. Every sequence is unmarked. */
void sneppx_kv_call_end(sneppx_kv_cache *cache, int64_t layer, int64_t n_seqs, struct sneppx_kv_sequence *const *seqs,
                        const int64_t *q_lens, int appended);

#endif
