/* The paged KV cache: a fixed pool of pages, per-sequence page tables shared
 * by the layers, refcounted pages for forks, release of pages a sliding
 * window hides. Layout and locking: kv_cache_internal.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"
#include "error.h"
#include "big_alloc.h"
#include "kv_cache_internal.h"
#include "kv_elements.h"

/* The options of the first version of the struct: a caller's struct_size may not be smaller. */
#define OPTIONS_V1_SIZE (offsetof(sneppx_kv_cache_options, dtype) + sizeof(sneppx_dtype))


void sneppx_kv_cache_options_init(sneppx_kv_cache_options *options)
{
    if (!options)
        return;
    memset(options, 0, sizeof *options);
    options->struct_size = sizeof *options;
    options->page_size = SNEPPX_KV_DEFAULT_PAGE_SIZE;
    options->num_layers = 1;
    options->dtype = SNEPPX_DTYPE_FLOAT32;
}

/* The options as this library reads them: the caller's first struct_size bytes over the defaults. */
static sneppx_status read_options(const sneppx_kv_cache_options *given, sneppx_kv_cache_options *options)
{
    sneppx_kv_cache_options_init(options);
    if (!given)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "options: must not be NULL (capacity_tokens has no default)");
    if (given->struct_size < OPTIONS_V1_SIZE || given->struct_size > sizeof *options)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                           "options.struct_size: %u is not the size of a sneppx_kv_cache_options (%zu to %zu); "
                           "call sneppx_kv_cache_options_init",
                           (unsigned)given->struct_size, (size_t)OPTIONS_V1_SIZE, sizeof *options);
    memcpy(options, given, given->struct_size);
    options->struct_size = sizeof *options;
    if (options->page_size == 0)
        options->page_size = SNEPPX_KV_DEFAULT_PAGE_SIZE;
    if (options->page_size < 1 || options->page_size > SNEPPX_KV_MAX_PAGE_SIZE ||
        (options->page_size & (options->page_size - 1)) != 0)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                           "options.page_size: %lld must be a power of two in [1, %d] (0 = %d)",
                           (long long)options->page_size, SNEPPX_KV_MAX_PAGE_SIZE, SNEPPX_KV_DEFAULT_PAGE_SIZE);
    if (options->capacity_tokens < 1 || options->capacity_tokens > SNEPPX_KV_MAX_CAPACITY_TOKENS)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "options.capacity_tokens: %lld must be in [1, 2^31 - 1]",
                           (long long)options->capacity_tokens);
    if (options->num_layers < 1 || options->num_layers > SNEPPX_KV_MAX_LAYERS)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "options.num_layers: %lld must be in [1, %d]",
                           (long long)options->num_layers, SNEPPX_KV_MAX_LAYERS);
    if (options->max_sequence_tokens < 0 || options->max_sequence_tokens > SNEPPX_KV_MAX_CAPACITY_TOKENS)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                           "options.max_sequence_tokens: %lld must be in [0, 2^31 - 1] (0 = the whole pool)",
                           (long long)options->max_sequence_tokens);
    if (!sneppx_dtype_name(options->dtype))
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                           "options.dtype: %d is not a sneppx_dtype (float32, bfloat16, float16 or int8)",
                           (int)options->dtype);
    return SNEPPX_OK;
}

static int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

/* Entries of a new sequence's page table: the most pages it can hold (the pool;
 * under a window, the window and the page it grows into, plus one more when the
 * window does not start on a page; max_sequence_tokens when given), so that
 * appending never grows the table. */
static int64_t table_pages(const sneppx_kv_cache_options *options, const struct sneppx_kv_shape *shape, int64_t pages)
{
    int64_t most = pages;
    if (options->max_sequence_tokens > 0)
        most = (options->max_sequence_tokens + options->page_size - 1) / options->page_size + 1;
    if (shape->window > 0)
        most = most < shape->window / options->page_size + 3 ? most : shape->window / options->page_size + 3;
    return most < pages ? most : pages;
}

sneppx_status sneppx_kv_cache_create(const sneppx_config *config, const sneppx_kv_cache_options *given,
                                     sneppx_kv_cache **out)
{
    sneppx_clear_error();
    if (!out)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "cache: output pointer must not be NULL");
    *out = NULL;
    if (!config)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config: must not be NULL");
    sneppx_kv_cache_options options;
    sneppx_status status = read_options(given, &options);
    if (status != SNEPPX_OK)
        return status;
    if ((status = sneppx_config_validate(config)) != SNEPPX_OK)
        return status;

    struct sneppx_kv_shape shape = {0};
    shape.is_mla = config->kv_lora_rank > 0;
    if (shape.is_mla) {
        shape.kv_lora_rank = config->kv_lora_rank;
        shape.rope_dim = config->qk_rope_head_dim;
    } else {
        shape.kv_heads = config->num_key_value_heads;
        shape.head_dim = sneppx_config_head_dim(config);
        shape.v_head_dim = shape.head_dim;
        shape.window = config->sliding_window;
    }
    const int64_t page_size = options.page_size, elem = sneppx_dtype_bytes[options.dtype];
    const int64_t token_elems =
        shape.is_mla ? shape.kv_lora_rank + shape.rope_dim : shape.kv_heads * (shape.head_dim + shape.v_head_dim);
    /* int8 rows carry a float32 scale each: K and V per K/V head, or one per MLA
     * latent row (one for its kv_lora_rank and rope parts: the decode kernel then
     * reads K and V of a key from one row with one scale and one dot product). */
    const int64_t token_scales = options.dtype != SNEPPX_DTYPE_INT8 ? 0 : shape.is_mla ? 1 : 2 * shape.kv_heads;
    /* Every factor is bounded (config ranges, the option bounds above): no overflow
     * below 2^63 until the pool's total, checked against what memory can hold. */
    const int64_t scale_offset = token_scales ? round_up(page_size * token_elems * elem, 64) : 0;
    const int64_t layer_block_bytes =
        round_up(token_scales ? scale_offset + page_size * token_scales * 4 : page_size * token_elems * elem, 64);
    const int64_t page_bytes = layer_block_bytes * options.num_layers;
    const int64_t pages = (options.capacity_tokens + page_size - 1) / page_size;
    if (page_bytes > (int64_t)1 << 40)
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY,
                           "options.page_size, options.num_layers: a page of %lld tokens x %lld layers is %lld bytes, "
                           "more than 2^40",
                           (long long)page_size, (long long)options.num_layers, (long long)page_bytes);
    if (pages > ((int64_t)1 << 62) / page_bytes)
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY,
                           "options.capacity_tokens: %lld pages of %lld bytes do not fit in memory",
                           (long long)pages, (long long)page_bytes);

    sneppx_kv_cache *cache = calloc(1, sizeof *cache);
    if (!cache)
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "cache: out of memory");
    cache->shape = shape;
    cache->page_size = page_size;
    while (((int64_t)1 << cache->page_shift) < page_size)
        cache->page_shift++;
    cache->num_layers = options.num_layers;
    cache->dtype = options.dtype;
    cache->elem_size = elem;
    cache->token_elems = token_elems;
    cache->k_block_elems = shape.kv_heads * page_size * shape.head_dim;
    cache->scale_offset = scale_offset;
    cache->token_bytes = token_elems * elem + token_scales * 4;
    cache->layer_block_bytes = layer_block_bytes;
    cache->page_bytes = page_bytes;
    cache->page_count = (int32_t)pages;
    cache->table_pages = table_pages(&options, &shape, pages);
    pthread_mutex_init(&cache->lock, NULL);
    /* Untouched pages cost no memory until first written. */
    cache->pool = sneppx_alloc_big((size_t)(pages * page_bytes));
    cache->refcount = calloc((size_t)pages, sizeof *cache->refcount);
    cache->call_writers = calloc((size_t)pages, sizeof *cache->call_writers);
    cache->call_last_writer = calloc((size_t)pages, sizeof *cache->call_last_writer);
    cache->free_pages = malloc((size_t)pages * sizeof *cache->free_pages);
    if (!cache->pool || !cache->refcount || !cache->call_writers || !cache->call_last_writer || !cache->free_pages) {
        sneppx_kv_cache_destroy(cache);
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY,
                           "options.capacity_tokens: cannot allocate %lld pages of %lld bytes (%lld tokens x %lld layers)",
                           (long long)pages, (long long)page_bytes, (long long)options.capacity_tokens,
                           (long long)options.num_layers);
    }
    /* Popped from the end: page 0 first. */
    for (int64_t i = 0; i < pages; i++)
        cache->free_pages[i] = (int32_t)(pages - 1 - i);
    cache->free_count = (int32_t)pages;
    *out = cache;
    return SNEPPX_OK;
}

static void sequence_free(struct sneppx_kv_sequence *seq)
{
    if (!seq)
        return;
    free(seq->lengths);
    free(seq->pages);
    free(seq->replaced);
    free(seq);
}

void sneppx_kv_cache_destroy(sneppx_kv_cache *cache)
{
    if (!cache)
        return;
    for (int64_t i = 0; i < cache->slot_count; i++)
        sequence_free(cache->slots[i]);
    free(cache->slots);
    free(cache->generations);
    free(cache->pool);
    free(cache->refcount);
    free(cache->call_writers);
    free(cache->call_last_writer);
    free(cache->free_pages);
    pthread_mutex_destroy(&cache->lock);
    free(cache);
}

/* Drops one reference to a page; the last returns it to the pool. Caller holds the lock. */
static void page_unref(sneppx_kv_cache *cache, int32_t page)
{
    if (--cache->refcount[page] == 0)
        cache->free_pages[cache->free_count++] = page;
}

static int32_t page_take(sneppx_kv_cache *cache)
{
    const int32_t page = cache->free_pages[--cache->free_count];
    cache->refcount[page] = 1;
    return page;
}

/* The live sequence of an id, or NULL with a message naming `what`. Caller holds the lock. */
static struct sneppx_kv_sequence *find_sequence(sneppx_kv_cache *cache, int64_t id, const char *what)
{
    const int64_t slot = id & (((int64_t)1 << SNEPPX_KV_SLOT_BITS) - 1);
    struct sneppx_kv_sequence *seq = NULL;
    if (id >= 0 && slot < cache->slot_count &&
        (uint32_t)((uint64_t)id >> SNEPPX_KV_SLOT_BITS) == cache->generations[slot])
        seq = cache->slots[slot];
    if (!seq)
        sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "%s: %lld is not a live sequence of this cache (unknown or removed)",
                    what, (long long)id);
    return seq;
}

/* find_sequence for calls that change the sequence: refused while a forward uses it. */
static struct sneppx_kv_sequence *find_idle_sequence(sneppx_kv_cache *cache, int64_t id, const char *what)
{
    struct sneppx_kv_sequence *seq = find_sequence(cache, id, what);
    if (seq && seq->in_call) {
        sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "%s: sequence %lld is in use by a forward call at the same time", what,
                    (long long)id);
        return NULL;
    }
    return seq;
}

static struct sneppx_kv_sequence *sequence_new(const sneppx_kv_cache *cache, int64_t capacity)
{
    struct sneppx_kv_sequence *seq = calloc(1, sizeof *seq);
    if (!seq)
        return NULL;
    seq->lengths = calloc((size_t)cache->num_layers, sizeof *seq->lengths);
    seq->capacity = capacity > 1 ? capacity : 1;
    seq->pages = malloc((size_t)seq->capacity * sizeof *seq->pages);
    seq->replaced = malloc((size_t)seq->capacity * sizeof *seq->replaced);
    if (!seq->lengths || !seq->pages || !seq->replaced) {
        sequence_free(seq);
        return NULL;
    }
    return seq;
}

/* Puts seq in a free slot and gives it its id. Caller holds the lock. */
static sneppx_status sequence_insert(sneppx_kv_cache *cache, struct sneppx_kv_sequence *seq, const char *what)
{
    int64_t slot = 0;
    while (slot < cache->slot_count && (cache->slots[slot] || cache->generations[slot] == SNEPPX_KV_SLOT_RETIRED))
        slot++;
    if (slot == cache->slot_count) {
        if (slot == ((int64_t)1 << SNEPPX_KV_SLOT_BITS) - 1)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "%s: the cache's 2^32 - 1 sequence slots are all live or retired", what);
        if (slot == cache->slot_capacity) {
            const int64_t capacity = cache->slot_capacity ? 2 * cache->slot_capacity : 16;
            struct sneppx_kv_sequence **slots = realloc(cache->slots, (size_t)capacity * sizeof *slots);
            if (slots)
                cache->slots = slots;
            uint32_t *generations = slots ? realloc(cache->generations, (size_t)capacity * sizeof *generations) : NULL;
            if (!generations)
                return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "%s: out of memory for the sequence table", what);
            cache->generations = generations;
            memset(generations + cache->slot_capacity, 0,
                   (size_t)(capacity - cache->slot_capacity) * sizeof *generations);
            cache->slot_capacity = capacity;
        }
        cache->slot_count++;
    }
    cache->slots[slot] = seq;
    cache->live++;
    seq->id = (int64_t)((uint64_t)cache->generations[slot] << SNEPPX_KV_SLOT_BITS) + slot;
    return SNEPPX_OK;
}

/* Frees seq's slot (its ids become unknown) and its pages. Caller holds the lock. */
static void sequence_remove(sneppx_kv_cache *cache, struct sneppx_kv_sequence *seq)
{
    const int64_t slot = seq->id & (((int64_t)1 << SNEPPX_KV_SLOT_BITS) - 1);
    for (int64_t i = 0; i < seq->held; i++)
        page_unref(cache, seq->pages[i]);
    cache->slots[slot] = NULL;
    /* Ids stay non-negative, so a generation has 31 bits; a slot whose generations are
     * spent is retired rather than wrapped, so no id is ever handed out twice. */
    cache->generations[slot] = cache->generations[slot] == SNEPPX_KV_LAST_GENERATION ? SNEPPX_KV_SLOT_RETIRED
                                                                                    : cache->generations[slot] + 1;
    cache->live--;
    sequence_free(seq);
}

sneppx_status sneppx_kv_cache_add_sequence(sneppx_kv_cache *cache, int64_t *seq_id)
{
    sneppx_clear_error();
    if (!cache)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "cache: must not be NULL");
    if (!seq_id)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "seq_id: must not be NULL");
    struct sneppx_kv_sequence *seq = sequence_new(cache, cache->table_pages);
    if (!seq)
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "cache: out of memory for a sequence");
    pthread_mutex_lock(&cache->lock);
    sneppx_status status = sequence_insert(cache, seq, "cache");
    pthread_mutex_unlock(&cache->lock);
    if (status != SNEPPX_OK) {
        sequence_free(seq);
        return status;
    }
    *seq_id = seq->id;
    return SNEPPX_OK;
}

sneppx_status sneppx_kv_cache_remove_sequence(sneppx_kv_cache *cache, int64_t seq_id)
{
    sneppx_clear_error();
    if (!cache)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "cache: must not be NULL");
    pthread_mutex_lock(&cache->lock);
    struct sneppx_kv_sequence *seq = find_idle_sequence(cache, seq_id, "seq_id");
    if (seq)
        sequence_remove(cache, seq);
    pthread_mutex_unlock(&cache->lock);
    return seq ? SNEPPX_OK : SNEPPX_ERR_INVALID_ARGUMENT;
}

sneppx_status sneppx_kv_cache_fork(sneppx_kv_cache *cache, int64_t seq_id, int64_t *child_id)
{
    sneppx_clear_error();
    if (!cache)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "cache: must not be NULL");
    if (!child_id)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "child_id: must not be NULL");
    pthread_mutex_lock(&cache->lock);
    sneppx_status status = SNEPPX_ERR_INVALID_ARGUMENT;
    struct sneppx_kv_sequence *parent = find_idle_sequence(cache, seq_id, "seq_id"), *child = NULL;
    if (parent) {
        child = sequence_new(cache, parent->capacity > cache->table_pages ? parent->capacity : cache->table_pages);
        status = child ? sequence_insert(cache, child, "seq_id")
                       : sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "seq_id: out of memory for the fork of sequence %lld",
                                     (long long)seq_id);
    }
    if (status == SNEPPX_OK) {
        memcpy(child->lengths, parent->lengths, (size_t)cache->num_layers * sizeof *child->lengths);
        memcpy(child->pages, parent->pages, (size_t)parent->held * sizeof *child->pages);
        child->held = parent->held;
        child->released = parent->released;
        for (int64_t i = 0; i < child->held; i++)
            cache->refcount[child->pages[i]]++;
        *child_id = child->id;
    } else {
        sequence_free(child);
    }
    pthread_mutex_unlock(&cache->lock);
    return status;
}

static int64_t largest_length(const sneppx_kv_cache *cache, const struct sneppx_kv_sequence *seq)
{
    int64_t largest = 0;
    for (int64_t l = 0; l < cache->num_layers; l++)
        largest = seq->lengths[l] > largest ? seq->lengths[l] : largest;
    return largest;
}

static int64_t smallest_length(const sneppx_kv_cache *cache, const struct sneppx_kv_sequence *seq)
{
    int64_t smallest = seq->lengths[0];
    for (int64_t l = 1; l < cache->num_layers; l++)
        smallest = seq->lengths[l] < smallest ? seq->lengths[l] : smallest;
    return smallest;
}

/* Pages that cover tokens [0, length) counted from the start (released ones included). */
static int64_t pages_for(const sneppx_kv_cache *cache, int64_t length)
{
    return (length + cache->page_size - 1) >> cache->page_shift;
}

/* Why truncating seq to `length` is refused (the error set, naming length_name), or
 * SNEPPX_OK; nothing changes. */
static sneppx_status truncate_check(const sneppx_kv_cache *cache, const struct sneppx_kv_sequence *seq,
                                    int64_t length, const char *length_name)
{
    const int64_t current = largest_length(cache, seq);
    if (length < 0 || length > current)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "%s: %lld must be in [0, %lld] (the length of sequence %lld)",
                           length_name, (long long)length, (long long)current, (long long)seq->id);
    int64_t smallest = smallest_length(cache, seq);
    smallest = smallest < length ? smallest : length;
    const int64_t window = cache->shape.window, first_held = sneppx_kv_first_held(cache, seq);
    const int64_t first_needed = window > 0 && smallest - window + 1 > 0 ? smallest - window + 1 : 0;
    /* Length 0 keeps no token, so no released one is missed: the sequence starts over. */
    if (length > 0 && first_held > first_needed)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                           "%s: %lld is too far back for sequence %lld: the sliding window (%lld) already released "
                           "tokens 0..%lld, and the next query would see token %lld",
                           length_name, (long long)length, (long long)seq->id, (long long)window,
                           (long long)(first_held - 1), (long long)first_needed);
    return SNEPPX_OK;
}

/* Truncates seq to a length truncate_check accepted; pages past it go back to the pool. */
static void truncate_apply(sneppx_kv_cache *cache, struct sneppx_kv_sequence *seq, int64_t length)
{
    for (int64_t l = 0; l < cache->num_layers; l++)
        seq->lengths[l] = seq->lengths[l] < length ? seq->lengths[l] : length;
    if (length == 0)
        seq->released = 0; /* every held page goes below: the table starts again at token 0 */
    const int64_t keep = pages_for(cache, length) - seq->released;
    while (seq->held > keep)
        page_unref(cache, seq->pages[--seq->held]);
}

sneppx_status sneppx_kv_cache_truncate(sneppx_kv_cache *cache, int64_t seq_id, int64_t length)
{
    sneppx_clear_error();
    if (!cache)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "cache: must not be NULL");
    pthread_mutex_lock(&cache->lock);
    sneppx_status status = SNEPPX_ERR_INVALID_ARGUMENT;
    struct sneppx_kv_sequence *seq = find_idle_sequence(cache, seq_id, "seq_id");
    if (seq && (status = truncate_check(cache, seq, length, "length")) == SNEPPX_OK)
        truncate_apply(cache, seq, length);
    pthread_mutex_unlock(&cache->lock);
    return status;
}

/* The first i < count with ids[i] == ids[count] (a duplicate's first place). */
static int64_t first_index(const int64_t *ids, int64_t count)
{
    int64_t i = 0;
    while (i < count && ids[i] != ids[count])
        i++;
    return i;
}

/* Every sequence is checked before any is cut, so a refusal leaves all of them as they
 * were. A duplicate is found by marking each checked sequence's in_call with this call
 * (the lock is held throughout, so no forward sees the mark), as sneppx_kv_call_begin does. */
sneppx_status sneppx_kv_cache_truncate_sequences(sneppx_kv_cache *cache, int64_t n_seqs, const int64_t *seq_ids,
                                                 const int64_t *lengths)
{
    sneppx_clear_error();
    if (!cache)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "cache: must not be NULL");
    if (n_seqs < 0)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "n_seqs: %lld must be at least 0", (long long)n_seqs);
    if (n_seqs > 0 && !seq_ids)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "seq_ids: must not be NULL when n_seqs is %lld",
                           (long long)n_seqs);
    if (n_seqs > 0 && !lengths)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "lengths: must not be NULL when n_seqs is %lld",
                           (long long)n_seqs);
    pthread_mutex_lock(&cache->lock);
    const char token = 0; /* its address marks this call's sequences */
    const void *const call = &token;
    sneppx_status status = SNEPPX_OK;
    int64_t marked = 0;
    for (; marked < n_seqs; marked++) {
        char seq_name[48], length_name[48];
        snprintf(seq_name, sizeof seq_name, "seq_ids[%lld]", (long long)marked);
        snprintf(length_name, sizeof length_name, "lengths[%lld]", (long long)marked);
        struct sneppx_kv_sequence *seq = find_sequence(cache, seq_ids[marked], seq_name);
        if (!seq)
            status = SNEPPX_ERR_INVALID_ARGUMENT;
        else if (seq->in_call == call)
            status = sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                                 "%s: sequence %lld is also seq_ids[%lld]: each sequence at most once per call",
                                 seq_name, (long long)seq_ids[marked], (long long)first_index(seq_ids, marked));
        else if (seq->in_call)
            status = sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                                 "%s: sequence %lld is in use by a forward call at the same time", seq_name,
                                 (long long)seq_ids[marked]);
        else
            status = truncate_check(cache, seq, lengths[marked], length_name);
        if (status != SNEPPX_OK)
            break;
        seq->in_call = call;
    }
    /* The marked sequences are live and idle, so their ids find them again. */
    for (int64_t i = 0; i < marked; i++) {
        struct sneppx_kv_sequence *seq = find_sequence(cache, seq_ids[i], "seq_ids");
        seq->in_call = NULL;
        if (status == SNEPPX_OK)
            truncate_apply(cache, seq, lengths[i]);
    }
    pthread_mutex_unlock(&cache->lock);
    return status;
}

/* What a query asks of a sequence: one layer's length (layer_index), the largest, or the
 * first token it holds. */
enum sequence_query { QUERY_LAYER_LENGTH, QUERY_LARGEST_LENGTH, QUERY_FIRST_HELD };

static sneppx_status query_sequence(sneppx_kv_cache *cache, int64_t seq_id, enum sequence_query query,
                                    int64_t layer_index, const char *out_name, int64_t *out)
{
    if (!cache)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "cache: must not be NULL");
    if (!out)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "%s: must not be NULL", out_name);
    if (query == QUERY_LAYER_LENGTH && (layer_index < 0 || layer_index >= cache->num_layers))
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "layer_index: %lld must be in [0, %lld)",
                           (long long)layer_index, (long long)cache->num_layers);
    pthread_mutex_lock(&cache->lock);
    struct sneppx_kv_sequence *seq = find_sequence(cache, seq_id, "seq_id");
    if (seq)
        *out = query == QUERY_LAYER_LENGTH     ? seq->lengths[layer_index]
               : query == QUERY_LARGEST_LENGTH ? largest_length(cache, seq)
                                               : sneppx_kv_first_held(cache, seq);
    pthread_mutex_unlock(&cache->lock);
    return seq ? SNEPPX_OK : SNEPPX_ERR_INVALID_ARGUMENT;
}

sneppx_status sneppx_kv_cache_length(sneppx_kv_cache *cache, int64_t seq_id, int64_t *length)
{
    sneppx_clear_error();
    return query_sequence(cache, seq_id, QUERY_LARGEST_LENGTH, 0, "length", length);
}

sneppx_status sneppx_kv_cache_layer_length(sneppx_kv_cache *cache, int64_t seq_id, int64_t layer_index,
                                           int64_t *length)
{
    sneppx_clear_error();
    return query_sequence(cache, seq_id, QUERY_LAYER_LENGTH, layer_index, "length", length);
}

sneppx_status sneppx_kv_cache_first_held(sneppx_kv_cache *cache, int64_t seq_id, int64_t *first)
{
    sneppx_clear_error();
    return query_sequence(cache, seq_id, QUERY_FIRST_HELD, 0, "first", first);
}

/* One stored row widened to float (int8: times its scale). */
static void read_row(const sneppx_kv_cache *cache, unsigned char *block, int64_t offset, int64_t scale_offset,
                     float *dst, int64_t n)
{
    const float scale = cache->dtype == SNEPPX_DTYPE_INT8 ? sneppx_kv_scales(cache, block)[scale_offset] : 0.0f;
    sneppx_kv_load_row(cache->dtype, dst, block + offset * cache->elem_size, scale, n);
}

sneppx_status sneppx_kv_cache_read(sneppx_kv_cache *cache, int64_t seq_id, int64_t layer_index, int64_t begin,
                                   int64_t end, float *k, float *v)
{
    sneppx_clear_error();
    if (!cache)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "cache: must not be NULL");
    if (layer_index < 0 || layer_index >= cache->num_layers)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "layer_index: %lld must be in [0, %lld) (the cache's num_layers)",
                           (long long)layer_index, (long long)cache->num_layers);
    const struct sneppx_kv_shape *shape = &cache->shape;
    if (!k || (!v && !shape->is_mla))
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "%s: must not be NULL", !k ? "k" : "v");
    /* Held for the copy: no call can begin on the sequence meanwhile. */
    pthread_mutex_lock(&cache->lock);
    struct sneppx_kv_sequence *seq = find_idle_sequence(cache, seq_id, "seq_id");
    sneppx_status status = seq ? SNEPPX_OK : SNEPPX_ERR_INVALID_ARGUMENT;
    const int64_t first = seq ? sneppx_kv_first_held(cache, seq) : 0;
    if (seq && (begin < first || end < begin || end > seq->lengths[layer_index]))
        status = sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                             "begin, end: [%lld, %lld) is not within the tokens sequence %lld holds at layer %lld, "
                             "[%lld, %lld)",
                             (long long)begin, (long long)end, (long long)seq_id, (long long)layer_index,
                             (long long)first, (long long)seq->lengths[layer_index]);
    for (int64_t token = begin; status == SNEPPX_OK && token < end; token++) {
        unsigned char *block = sneppx_kv_block(cache, sneppx_kv_page_of(cache, seq, token), layer_index);
        const int64_t slot = token & (cache->page_size - 1), row = token - begin;
        if (shape->is_mla) {
            const int64_t latent = shape->kv_lora_rank + shape->rope_dim;
            read_row(cache, block, sneppx_kv_latent_offset(cache, slot), sneppx_kv_k_scale_offset(cache, 0, slot),
                     k + row * latent, latent);
            continue;
        }
        for (int64_t h = 0; h < shape->kv_heads; h++) {
            read_row(cache, block, sneppx_kv_k_offset(cache, h, slot), sneppx_kv_k_scale_offset(cache, h, slot),
                     k + (row * shape->kv_heads + h) * shape->head_dim, shape->head_dim);
            read_row(cache, block, sneppx_kv_v_offset(cache, h, slot), sneppx_kv_v_scale_offset(cache, h, slot),
                     v + (row * shape->kv_heads + h) * shape->v_head_dim, shape->v_head_dim);
        }
    }
    pthread_mutex_unlock(&cache->lock);
    return status;
}

sneppx_status sneppx_kv_cache_reset(sneppx_kv_cache *cache)
{
    sneppx_clear_error();
    if (!cache)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "cache: must not be NULL");
    pthread_mutex_lock(&cache->lock);
    for (int64_t i = 0; i < cache->slot_count; i++)
        if (cache->slots[i])
            sequence_remove(cache, cache->slots[i]);
    pthread_mutex_unlock(&cache->lock);
    return SNEPPX_OK;
}

sneppx_status sneppx_kv_cache_stats_get(sneppx_kv_cache *cache, sneppx_kv_cache_stats *stats)
{
    sneppx_clear_error();
    if (!cache)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "cache: must not be NULL");
    if (!stats)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "stats: must not be NULL");
    pthread_mutex_lock(&cache->lock);
    stats->page_size = cache->page_size;
    stats->num_layers = cache->num_layers;
    stats->total_pages = cache->page_count;
    stats->free_pages = cache->free_count;
    stats->sequences = cache->live;
    stats->page_bytes = cache->page_bytes;
    stats->token_elements = cache->token_elems;
    stats->token_bytes = cache->token_bytes;
    stats->dtype = cache->dtype;
    pthread_mutex_unlock(&cache->lock);
    return SNEPPX_OK;
}

/* ---- a forward call's hold on its sequences ---- */

sneppx_status sneppx_kv_call_measure(sneppx_kv_cache *cache, int64_t layer, int64_t n_seqs, const int64_t *seq_ids,
                                     const int64_t *q_lens, int64_t *max_keys)
{
    pthread_mutex_lock(&cache->lock);
    sneppx_status status = SNEPPX_OK;
    *max_keys = 0;
    for (int64_t i = 0; i < n_seqs; i++) {
        char what[48];
        snprintf(what, sizeof what, "seq_ids[%lld]", (long long)i);
        const struct sneppx_kv_sequence *seq = find_sequence(cache, seq_ids[i], what);
        if (!seq) {
            status = SNEPPX_ERR_INVALID_ARGUMENT;
            break;
        }
        const int64_t keys = seq->lengths[layer] + q_lens[i] - sneppx_kv_first_held(cache, seq);
        *max_keys = keys > *max_keys ? keys : *max_keys;
    }
    pthread_mutex_unlock(&cache->lock);
    return status;
}

sneppx_status sneppx_kv_call_begin(sneppx_kv_cache *cache, const void *call, int64_t n_seqs, const int64_t *seq_ids,
                                   struct sneppx_kv_sequence **seqs)
{
    pthread_mutex_lock(&cache->lock);
    sneppx_status status = SNEPPX_OK;
    int64_t marked = 0;
    for (; marked < n_seqs; marked++) {
        char what[48];
        snprintf(what, sizeof what, "seq_ids[%lld]", (long long)marked);
        struct sneppx_kv_sequence *seq = find_sequence(cache, seq_ids[marked], what);
        if (!seq) {
            status = SNEPPX_ERR_INVALID_ARGUMENT;
            break;
        }
        if (seq->in_call == call) {
            int64_t first = 0;
            while (seqs[first] != seq)
                first++;
            status = sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "seq_ids[%lld]: sequence %lld is also seq_ids[%lld]: "
                                 "each sequence at most once per call",
                                 (long long)marked, (long long)seq_ids[marked], (long long)first);
            break;
        }
        if (seq->in_call) {
            status = sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                                 "seq_ids[%lld]: sequence %lld is in use by another call at the same time",
                                 (long long)marked, (long long)seq_ids[marked]);
            break;
        }
        seq->in_call = call;
        seq->call_held = seq->held;
        seq->copied_begin = seq->copied_end = 0;
        seqs[marked] = seq;
    }
    if (status != SNEPPX_OK)
        for (int64_t i = 0; i < marked; i++)
            seqs[i]->in_call = NULL;
    pthread_mutex_unlock(&cache->lock);
    return status;
}

/* Grows seq's page table (and its replaced[]) to hold `pages` entries;
 * nothing else changes. */
static int table_reserve(struct sneppx_kv_sequence *seq, int64_t pages)
{
    if (pages <= seq->capacity)
        return 1;
    int64_t capacity = seq->capacity;
    while (capacity < pages)
        capacity *= 2;
    int32_t *grown = realloc(seq->pages, (size_t)capacity * sizeof *grown);
    if (!grown)
        return 0;
    seq->pages = grown;
    grown = realloc(seq->replaced, (size_t)capacity * sizeof *grown);
    if (!grown)
        return 0; /* pages[] grew, capacity did not: still consistent */
    seq->replaced = grown;
    seq->capacity = capacity;
    return 1;
}

/* The held pages of seq's table that appending q_len tokens at `layer` writes
 * into: [*begin, *end). */
static void written_pages(const sneppx_kv_cache *cache, const struct sneppx_kv_sequence *seq, int64_t layer,
                          int64_t q_len, int64_t *begin, int64_t *end)
{
    const int64_t covered = pages_for(cache, seq->lengths[layer] + q_len) - seq->released;
    *begin = (seq->lengths[layer] >> cache->page_shift) - seq->released;
    *end = covered < seq->held ? covered : seq->held;
}

/* Counts, per shared page the call's sequences write into, its writers and the last
 * of them (call_writers, call_last_writer): one pass, so that a call of many forks of
 * one page (a wide beam, parallel samples) decides in linear time under the lock. */
static void count_shared_writers(sneppx_kv_cache *cache, int64_t layer, int64_t n_seqs,
                                 struct sneppx_kv_sequence *const *seqs, const int64_t *q_lens)
{
    for (int pass = 0; pass < 2; pass++)
        for (int64_t i = 0; i < n_seqs; i++) {
            int64_t begin, end;
            written_pages(cache, seqs[i], layer, q_lens[i], &begin, &end);
            for (int64_t p = begin; p < end; p++) {
                const int32_t page = seqs[i]->pages[p];
                if (cache->refcount[page] <= 1)
                    continue;
                if (pass == 0) {
                    cache->call_writers[page] = 0;
                } else {
                    cache->call_writers[page]++;
                    cache->call_last_writer[page] = i;
                }
            }
        }
}

/* Marks, in the call's sequence i's replaced[] over the pages it writes, which shared
 * ones it copies (COPY_PAGE) and which not (-1): its own pages, and a shared page that
 * every holder writes in this call when i is the last of them, which keeps it (a beam's
 * forks decoding side by side take one page less each, step by step); returns the
 * copies. All before any sequence of the call copies, so every decision sees the same
 * tables (count_shared_writers first). */
enum { COPY_PAGE = -2 };
static int64_t plan_copies(const sneppx_kv_cache *cache, int64_t layer, struct sneppx_kv_sequence *const *seqs,
                           const int64_t *q_lens, int64_t i)
{
    struct sneppx_kv_sequence *seq = seqs[i];
    int64_t begin, end, copies = 0;
    written_pages(cache, seq, layer, q_lens[i], &begin, &end);
    for (int64_t p = begin; p < end; p++) {
        const int32_t page = seq->pages[p];
        const int keeps = cache->call_writers[page] == cache->refcount[page] && cache->call_last_writer[page] == i;
        const int copy = cache->refcount[page] > 1 && !keeps;
        seq->replaced[p] = copy ? COPY_PAGE : -1;
        copies += copy;
    }
    return copies;
}

sneppx_status sneppx_kv_call_reserve(sneppx_kv_cache *cache, int64_t layer, int64_t n_seqs,
                                     struct sneppx_kv_sequence *const *seqs, const int64_t *q_lens)
{
    pthread_mutex_lock(&cache->lock);
    sneppx_status status = SNEPPX_OK;
    /* Tables first (growing them changes nothing else): plan_copies marks replaced[]. */
    for (int64_t i = 0; i < n_seqs && status == SNEPPX_OK; i++)
        if (!table_reserve(seqs[i], pages_for(cache, seqs[i]->lengths[layer] + q_lens[i]) - seqs[i]->released))
            status = sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "cache: out of memory for the page table of sequence %lld",
                                 (long long)seqs[i]->id);
    if (status == SNEPPX_OK)
        count_shared_writers(cache, layer, n_seqs, seqs, q_lens);
    int64_t needed_total = 0;
    for (int64_t i = 0; i < n_seqs && status == SNEPPX_OK; i++) {
        const struct sneppx_kv_sequence *seq = seqs[i];
        const int64_t covered = pages_for(cache, seq->lengths[layer] + q_lens[i]) - seq->released;
        const int64_t fresh = covered > seq->held ? covered - seq->held : 0;
        const int64_t needed = fresh + plan_copies(cache, layer, seqs, q_lens, i);
        needed_total += needed;
        if (needed_total > cache->free_count)
            status = sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY,
                                 "cache: pool full: sequence %lld (seq_ids[%lld]) needs %lld more pages, and %lld of "
                                 "%lld are free after the sequences before it in the call; remove or truncate "
                                 "sequences, or create the cache with a larger capacity_tokens",
                                 (long long)seq->id, (long long)i, (long long)needed,
                                 (long long)(cache->free_count - (needed_total - needed)), (long long)cache->page_count);
    }
    /* Every page is available: take them. Nothing fails from here. */
    for (int64_t i = 0; i < n_seqs && status == SNEPPX_OK; i++) {
        struct sneppx_kv_sequence *seq = seqs[i];
        const int64_t covered = pages_for(cache, seq->lengths[layer] + q_lens[i]) - seq->released;
        written_pages(cache, seq, layer, q_lens[i], &seq->copied_begin, &seq->copied_end); /* as plan_copies saw */
        for (int64_t p = seq->copied_begin; p < seq->copied_end; p++) {
            const int32_t shared = seq->pages[p];
            if (seq->replaced[p] != COPY_PAGE)
                continue; /* its own page, or a shared one it keeps */
            /* Copy-on-write, whole page (every layer): under the lock, so that no
             * other sharer, once it holds the page alone, writes while we read.
             * Our reference to the shared page stays until the call ends. */
            const int32_t copy = page_take(cache);
            memcpy(sneppx_kv_block(cache, copy, 0), sneppx_kv_block(cache, shared, 0), (size_t)cache->page_bytes);
            seq->replaced[p] = shared;
            seq->pages[p] = copy;
        }
        while (seq->held < covered)
            seq->pages[seq->held++] = page_take(cache);
    }
    pthread_mutex_unlock(&cache->lock);
    return status;
}

/* Releases the pages no later query can see: token indices <= L - window, L
 * the smallest layer length. Caller holds the lock. */
static void release_hidden_pages(sneppx_kv_cache *cache, struct sneppx_kv_sequence *seq)
{
    const int64_t window = cache->shape.window;
    if (window <= 0)
        return;
    const int64_t hidden_tokens = smallest_length(cache, seq) - window + 1; /* tokens [0, hidden_tokens) */
    const int64_t releasable = hidden_tokens > 0 ? (hidden_tokens >> cache->page_shift) - seq->released : 0;
    const int64_t count = releasable < seq->held ? releasable : seq->held;
    if (count <= 0)
        return;
    for (int64_t i = 0; i < count; i++)
        page_unref(cache, seq->pages[i]);
    memmove(seq->pages, seq->pages + count, (size_t)(seq->held - count) * sizeof *seq->pages);
    seq->held -= count;
    seq->released += count;
}

void sneppx_kv_call_end(sneppx_kv_cache *cache, int64_t layer, int64_t n_seqs, struct sneppx_kv_sequence *const *seqs,
                        const int64_t *q_lens, int appended)
{
    pthread_mutex_lock(&cache->lock);
    for (int64_t i = 0; i < n_seqs; i++) {
        struct sneppx_kv_sequence *seq = seqs[i];
        for (int64_t p = seq->copied_begin; p < seq->copied_end; p++) {
            if (seq->replaced[p] < 0)
                continue;
            if (!appended) { /* the copy goes, the shared page comes back */
                page_unref(cache, seq->pages[p]);
                seq->pages[p] = seq->replaced[p];
            } else {
                page_unref(cache, seq->replaced[p]);
            }
        }
        seq->copied_begin = seq->copied_end = 0;
        if (appended) {
            seq->lengths[layer] += q_lens[i];
            release_hidden_pages(cache, seq);
        } else {
            while (seq->held > seq->call_held)
                page_unref(cache, seq->pages[--seq->held]);
        }
        seq->in_call = NULL;
    }
    pthread_mutex_unlock(&cache->lock);
}
