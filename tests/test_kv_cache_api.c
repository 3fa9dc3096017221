/* The paged KV cache's API and bad input to sneppx_layer_forward_cached.
 * Every refused call is checked for its status, a message naming the
 * argument, nothing written to out (a sentinel) and the cache unchanged: each
 * sequence's layer lengths, the free pages and the number of sequences.
 * Also: options (page_size a power of two, the default page size, capacity
 * rounded up to pages, struct_size of an older caller), sequence ids never
 * reused, pages back to the pool on remove / truncate / reset, forks sharing
 * pages, truncation under a window refused once what the next query sees
 * was released, a sequence in use by another call refused by everyone. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_cache_internal.h"
#include "sneppx/sneppx.h"
#include "test_util.h"

#define HIDDEN 64
#define MAX_POSITIONS 64

static test_tally tally;

#define EXPECT_ERROR(call, want, needle)                                                                      \
    do {                                                                                                      \
        sneppx_status got_ = (call);                                                                          \
        TEST_CHECK(&tally, got_ == (want) && strstr(sneppx_last_error(), needle) != NULL,                    \
                   "%s -> %s '%s', want %s naming '%s'", #call, sneppx_status_name(got_), sneppx_last_error(), \
                   sneppx_status_name(want), needle);                                                        \
    } while (0)

#define EXPECT_OK(call) TEST_CHECK(&tally, (call) == SNEPPX_OK, "%s: %s", #call, sneppx_last_error())

static sneppx_config small_config(int64_t kv_heads, int64_t window)
{
    sneppx_config config;
    sneppx_config_init(&config);
    config.hidden_size = HIDDEN;
    config.num_attention_heads = 4;
    config.num_key_value_heads = kv_heads;
    config.head_dim = 16;
    config.sliding_window = window;
    config.max_position_embeddings = MAX_POSITIONS;
    return config;
}

static sneppx_kv_cache *make_cache(const sneppx_config *config, int64_t capacity, int64_t page_size, int64_t layers)
{
    sneppx_kv_cache_options options;
    sneppx_kv_cache_options_init(&options);
    options.capacity_tokens = capacity;
    options.page_size = page_size;
    options.num_layers = layers;
    sneppx_kv_cache *cache = NULL;
    EXPECT_OK(sneppx_kv_cache_create(config, &options, &cache));
    return cache;
}

/* What a refused call must leave as it was. */
typedef struct snapshot {
    int64_t free_pages, sequences;
    int64_t lengths[8][2]; /* the first 8 ids given, 2 layers */
} snapshot;

static snapshot take(sneppx_kv_cache *cache, const int64_t *ids, int count)
{
    snapshot s;
    memset(&s, 0, sizeof s);
    sneppx_kv_cache_stats stats;
    sneppx_kv_cache_stats_get(cache, &stats);
    s.free_pages = stats.free_pages;
    s.sequences = stats.sequences;
    for (int i = 0; i < count && i < 8; i++)
        for (int64_t l = 0; l < stats.num_layers && l < 2; l++)
            if (sneppx_kv_cache_layer_length(cache, ids[i], l, &s.lengths[i][l]) != SNEPPX_OK)
                s.lengths[i][l] = -1;
    return s;
}

#define EXPECT_UNCHANGED(cache, ids, count, before, what)                                                     \
    do {                                                                                                      \
        const snapshot after_ = take(cache, ids, count);                                                      \
        TEST_CHECK(&tally, memcmp(&after_, &(before), sizeof after_) == 0,                                    \
                   "%s changed the cache: free pages %lld -> %lld, sequences %lld -> %lld, length[0] %lld -> %lld", \
                   what, (long long)(before).free_pages, (long long)after_.free_pages,                         \
                   (long long)(before).sequences, (long long)after_.sequences, (long long)(before).lengths[0][0], \
                   (long long)after_.lengths[0][0]);                                                           \
    } while (0)

static float hidden[64 * HIDDEN], out[64 * HIDDEN];

/* Appends q tokens to one sequence (must succeed). */
static void append(sneppx_layer *layer, sneppx_kv_cache *cache, int64_t layer_index, int64_t id, int64_t q)
{
    EXPECT_OK(sneppx_layer_forward_cached(layer, cache, layer_index, 1, &id, &q, hidden, NULL, NULL, out));
}

static void test_create_options(void)
{
    const sneppx_config config = small_config(2, 0);
    sneppx_kv_cache_options options;
    sneppx_kv_cache *cache = (sneppx_kv_cache *)&options; /* must become NULL on error */
    sneppx_kv_cache_options_init(&options);
    options.capacity_tokens = 17;
    EXPECT_ERROR(sneppx_kv_cache_create(&config, &options, NULL), SNEPPX_ERR_INVALID_ARGUMENT, "cache");
    EXPECT_ERROR(sneppx_kv_cache_create(NULL, &options, &cache), SNEPPX_ERR_INVALID_ARGUMENT, "config");
    TEST_CHECK(&tally, cache == NULL, "a failed create must set *cache to NULL");
    EXPECT_ERROR(sneppx_kv_cache_create(&config, NULL, &cache), SNEPPX_ERR_INVALID_ARGUMENT, "options");
    static const int64_t bad_pages[] = {3, 12, -4, 2 * SNEPPX_KV_MAX_PAGE_SIZE, 48};
    for (size_t i = 0; i < sizeof bad_pages / sizeof bad_pages[0]; i++) {
        options.page_size = bad_pages[i];
        EXPECT_ERROR(sneppx_kv_cache_create(&config, &options, &cache), SNEPPX_ERR_INVALID_ARGUMENT,
                     "options.page_size");
    }
    options.page_size = 4;
    static const int64_t bad_capacity[] = {0, -1, SNEPPX_KV_MAX_CAPACITY_TOKENS + 1};
    for (size_t i = 0; i < sizeof bad_capacity / sizeof bad_capacity[0]; i++) {
        options.capacity_tokens = bad_capacity[i];
        EXPECT_ERROR(sneppx_kv_cache_create(&config, &options, &cache), SNEPPX_ERR_INVALID_ARGUMENT,
                     "options.capacity_tokens");
    }
    options.capacity_tokens = 17;
    options.num_layers = 0;
    EXPECT_ERROR(sneppx_kv_cache_create(&config, &options, &cache), SNEPPX_ERR_INVALID_ARGUMENT, "options.num_layers");
    options.num_layers = SNEPPX_KV_MAX_LAYERS + 1;
    EXPECT_ERROR(sneppx_kv_cache_create(&config, &options, &cache), SNEPPX_ERR_INVALID_ARGUMENT, "options.num_layers");
    options.num_layers = 1;
    options.dtype = (sneppx_dtype)7;
    EXPECT_ERROR(sneppx_kv_cache_create(&config, &options, &cache), SNEPPX_ERR_INVALID_ARGUMENT,
                 "options.dtype: 7 is not a sneppx_dtype");
    options.dtype = SNEPPX_DTYPE_BFLOAT16;
    EXPECT_ERROR(sneppx_kv_cache_create(&config, &options, &cache), SNEPPX_ERR_UNSUPPORTED,
                 "options.dtype: the cache stores float32 only, not bfloat16");
    options.dtype = SNEPPX_DTYPE_FLOAT32;
    static const int64_t bad_max_sequence[] = {-1, SNEPPX_KV_MAX_CAPACITY_TOKENS + 1};
    for (size_t i = 0; i < sizeof bad_max_sequence / sizeof bad_max_sequence[0]; i++) {
        options.max_sequence_tokens = bad_max_sequence[i];
        EXPECT_ERROR(sneppx_kv_cache_create(&config, &options, &cache), SNEPPX_ERR_INVALID_ARGUMENT,
                     "options.max_sequence_tokens");
    }
    options.max_sequence_tokens = 0;
    options.struct_size = 4;
    EXPECT_ERROR(sneppx_kv_cache_create(&config, &options, &cache), SNEPPX_ERR_INVALID_ARGUMENT,
                 "options.struct_size");
    options.struct_size = sizeof options + 8;
    EXPECT_ERROR(sneppx_kv_cache_create(&config, &options, &cache), SNEPPX_ERR_INVALID_ARGUMENT,
                 "options.struct_size");
    options.struct_size = sizeof options;
    sneppx_config bad = config;
    bad.num_key_value_heads = 3;
    EXPECT_ERROR(sneppx_kv_cache_create(&bad, &options, &cache), SNEPPX_ERR_INVALID_ARGUMENT, "num_key_value_heads");

    /* 17 tokens in pages of 4: 5 pages; page bytes = 2 heads x 4 x (16 + 16) floats. */
    EXPECT_OK(sneppx_kv_cache_create(&config, &options, &cache));
    sneppx_kv_cache_stats stats;
    EXPECT_OK(sneppx_kv_cache_stats_get(cache, &stats));
    TEST_CHECK(&tally, stats.total_pages == 5 && stats.free_pages == 5 && stats.page_size == 4 &&
                           stats.page_bytes == 2 * 4 * 32 * 4 && stats.token_elements == 64 && stats.sequences == 0,
               "stats: %lld pages, %lld free, page %lld, %lld bytes, %lld elements", (long long)stats.total_pages,
               (long long)stats.free_pages, (long long)stats.page_size, (long long)stats.page_bytes,
               (long long)stats.token_elements);
    EXPECT_ERROR(sneppx_kv_cache_stats_get(cache, NULL), SNEPPX_ERR_INVALID_ARGUMENT, "stats");
    sneppx_kv_cache_destroy(cache);
    /* page_size 0 = 16; MLA: one latent row per token. */
    options.page_size = 0;
    sneppx_config mla;
    EXPECT_OK(sneppx_config_from_name("deepseek-v2-lite", NULL, &mla));
    EXPECT_OK(sneppx_kv_cache_create(&mla, &options, &cache));
    EXPECT_OK(sneppx_kv_cache_stats_get(cache, &stats));
    TEST_CHECK(&tally, stats.page_size == 16 && stats.total_pages == 2 && stats.token_elements == 512 + 64,
               "deepseek-v2-lite cache: page %lld, %lld pages, %lld elements per token", (long long)stats.page_size,
               (long long)stats.total_pages, (long long)stats.token_elements);
    sneppx_kv_cache_destroy(cache);
    /* A caller whose struct ends at dtype (the first version) gets the defaults past it. */
    options.struct_size = (uint32_t)(offsetof(sneppx_kv_cache_options, dtype) + sizeof(sneppx_dtype));
    EXPECT_OK(sneppx_kv_cache_create(&config, &options, &cache));
    sneppx_kv_cache_destroy(cache);
    sneppx_kv_cache_destroy(NULL);
}

static void test_sequences(sneppx_layer *layer)
{
    const sneppx_config config = small_config(2, 0);
    sneppx_kv_cache *cache = make_cache(&config, 64, 4, 2);
    if (!cache)
        return;
    int64_t a = -1, b = -1, child = -1, length = -1;
    EXPECT_ERROR(sneppx_kv_cache_add_sequence(NULL, &a), SNEPPX_ERR_INVALID_ARGUMENT, "cache");
    EXPECT_ERROR(sneppx_kv_cache_add_sequence(cache, NULL), SNEPPX_ERR_INVALID_ARGUMENT, "seq_id");
    EXPECT_OK(sneppx_kv_cache_add_sequence(cache, &a));
    EXPECT_OK(sneppx_kv_cache_add_sequence(cache, &b));
    TEST_CHECK(&tally, a >= 0 && b >= 0 && a != b, "ids %lld %lld", (long long)a, (long long)b);
    /* Layer 0 gets 10 tokens (3 pages), layer 1 6: length is the larger. */
    append(layer, cache, 0, a, 10);
    append(layer, cache, 1, a, 6);
    EXPECT_OK(sneppx_kv_cache_length(cache, a, &length));
    TEST_CHECK(&tally, length == 10, "length %lld, want 10 (the largest layer)", (long long)length);
    EXPECT_OK(sneppx_kv_cache_layer_length(cache, a, 1, &length));
    TEST_CHECK(&tally, length == 6, "layer 1 length %lld, want 6", (long long)length);
    EXPECT_ERROR(sneppx_kv_cache_layer_length(cache, a, 2, &length), SNEPPX_ERR_INVALID_ARGUMENT, "layer_index");
    EXPECT_ERROR(sneppx_kv_cache_layer_length(cache, a, -1, &length), SNEPPX_ERR_INVALID_ARGUMENT, "layer_index");
    EXPECT_ERROR(sneppx_kv_cache_length(cache, a, NULL), SNEPPX_ERR_INVALID_ARGUMENT, "length");
    EXPECT_ERROR(sneppx_kv_cache_length(cache, 12345, &length), SNEPPX_ERR_INVALID_ARGUMENT, "seq_id");
    sneppx_kv_cache_stats stats;
    sneppx_kv_cache_stats_get(cache, &stats);
    TEST_CHECK(&tally, stats.free_pages == 16 - 3, "free pages %lld after 10 tokens in pages of 4, want 13",
               (long long)stats.free_pages);

    /* Fork shares; truncate frees whole pages past the new length. */
    EXPECT_ERROR(sneppx_kv_cache_fork(cache, a, NULL), SNEPPX_ERR_INVALID_ARGUMENT, "child_id");
    EXPECT_ERROR(sneppx_kv_cache_fork(cache, 999, &child), SNEPPX_ERR_INVALID_ARGUMENT, "seq_id");
    EXPECT_OK(sneppx_kv_cache_fork(cache, a, &child));
    EXPECT_OK(sneppx_kv_cache_layer_length(cache, child, 1, &length));
    TEST_CHECK(&tally, length == 6, "the fork's layer 1 length %lld, want 6", (long long)length);
    sneppx_kv_cache_stats_get(cache, &stats);
    TEST_CHECK(&tally, stats.free_pages == 13 && stats.sequences == 3, "fork: %lld free pages (want 13), %lld sequences",
               (long long)stats.free_pages, (long long)stats.sequences);
    /* The child appends into the shared third page: a copy. */
    append(layer, cache, 0, child, 1);
    sneppx_kv_cache_stats_get(cache, &stats);
    TEST_CHECK(&tally, stats.free_pages == 12, "copy-on-write: %lld free pages, want 12", (long long)stats.free_pages);

    const int64_t ids[] = {a, b, child};
    snapshot before = take(cache, ids, 3);
    EXPECT_ERROR(sneppx_kv_cache_truncate(cache, a, 11), SNEPPX_ERR_INVALID_ARGUMENT, "length");
    EXPECT_ERROR(sneppx_kv_cache_truncate(cache, a, -1), SNEPPX_ERR_INVALID_ARGUMENT, "length");
    EXPECT_ERROR(sneppx_kv_cache_truncate(cache, 77, 1), SNEPPX_ERR_INVALID_ARGUMENT, "seq_id");
    EXPECT_UNCHANGED(cache, ids, 3, before, "refused truncate");
    EXPECT_OK(sneppx_kv_cache_truncate(cache, child, 3)); /* pages 1..2 of the child go: one shared, one its own */
    sneppx_kv_cache_stats_get(cache, &stats);
    TEST_CHECK(&tally, stats.free_pages == 13, "truncate to 3: %lld free pages, want 13", (long long)stats.free_pages);
    EXPECT_OK(sneppx_kv_cache_layer_length(cache, child, 0, &length));
    TEST_CHECK(&tally, length == 3, "truncated layer 0 length %lld, want 3", (long long)length);
    EXPECT_OK(sneppx_kv_cache_truncate(cache, a, 8)); /* layer 0 10 -> 8, layer 1 stays 6; page 3 goes */
    sneppx_kv_cache_stats_get(cache, &stats);
    EXPECT_OK(sneppx_kv_cache_layer_length(cache, a, 1, &length));
    TEST_CHECK(&tally, stats.free_pages == 14 && length == 6, "truncate to 8: %lld free (want 14), layer 1 %lld (want 6)",
               (long long)stats.free_pages, (long long)length);

    /* Removed ids stay unknown, even when the slot is reused. */
    EXPECT_OK(sneppx_kv_cache_remove_sequence(cache, b));
    EXPECT_ERROR(sneppx_kv_cache_remove_sequence(cache, b), SNEPPX_ERR_INVALID_ARGUMENT, "seq_id");
    int64_t again = -1;
    EXPECT_OK(sneppx_kv_cache_add_sequence(cache, &again));
    TEST_CHECK(&tally, again != b, "a new sequence got the removed id %lld", (long long)b);
    EXPECT_ERROR(sneppx_kv_cache_length(cache, b, &length), SNEPPX_ERR_INVALID_ARGUMENT, "seq_id");
    EXPECT_ERROR(sneppx_kv_cache_remove_sequence(NULL, a), SNEPPX_ERR_INVALID_ARGUMENT, "cache");

    /* reset: everything back, old ids unknown. */
    EXPECT_OK(sneppx_kv_cache_reset(cache));
    sneppx_kv_cache_stats_get(cache, &stats);
    TEST_CHECK(&tally, stats.free_pages == stats.total_pages && stats.sequences == 0,
               "reset: %lld of %lld free, %lld sequences", (long long)stats.free_pages, (long long)stats.total_pages,
               (long long)stats.sequences);
    EXPECT_ERROR(sneppx_kv_cache_length(cache, a, &length), SNEPPX_ERR_INVALID_ARGUMENT, "seq_id");
    EXPECT_ERROR(sneppx_kv_cache_reset(NULL), SNEPPX_ERR_INVALID_ARGUMENT, "cache");
    sneppx_kv_cache_destroy(cache);
}

/* Every refused forward: status, message, out untouched, cache unchanged. */
static void test_forward_errors(sneppx_layer *layer)
{
    const sneppx_config config = small_config(2, 0);
    sneppx_kv_cache *cache = make_cache(&config, 16, 4, 2); /* 4 pages */
    if (!cache)
        return;
    int64_t a = -1, b = -1, removed = -1;
    EXPECT_OK(sneppx_kv_cache_add_sequence(cache, &a));
    EXPECT_OK(sneppx_kv_cache_add_sequence(cache, &b));
    EXPECT_OK(sneppx_kv_cache_add_sequence(cache, &removed));
    EXPECT_OK(sneppx_kv_cache_remove_sequence(cache, removed));
    append(layer, cache, 0, a, 5); /* 2 pages */
    const int64_t ids[] = {a, b};
    const snapshot before = take(cache, ids, 2);
    const int64_t pair[] = {a, b}, twice[] = {a, a}, unknown[] = {a, 4242}, gone[] = {a, removed};
    const int64_t q11[] = {1, 1}, q10[] = {1, 0}, qneg[] = {1, -3}, qbig[] = {1, SNEPPX_MAX_TOKENS};
    const int64_t far[] = {0, 1000}, negative[] = {0, -1};
    test_fill_sentinel(out, sizeof out / sizeof out[0]);
#define REFUSED(call, want, needle)                                                                           \
    do {                                                                                                      \
        EXPECT_ERROR(call, want, needle);                                                                     \
        EXPECT_UNCHANGED(cache, ids, 2, before, #call);                                                       \
        TEST_CHECK(&tally, test_all_sentinel(out, sizeof out / sizeof out[0]), "%s wrote to out", #call);     \
    } while (0)
    REFUSED(sneppx_layer_forward_cached(NULL, cache, 0, 2, pair, q11, hidden, NULL, NULL, out),
            SNEPPX_ERR_INVALID_ARGUMENT, "layer");
    REFUSED(sneppx_layer_forward_cached(layer, NULL, 0, 2, pair, q11, hidden, NULL, NULL, out),
            SNEPPX_ERR_INVALID_ARGUMENT, "cache");
    REFUSED(sneppx_layer_forward_cached(layer, cache, 0, 2, NULL, q11, hidden, NULL, NULL, out),
            SNEPPX_ERR_INVALID_ARGUMENT, "seq_ids");
    REFUSED(sneppx_layer_forward_cached(layer, cache, 0, 2, pair, NULL, hidden, NULL, NULL, out),
            SNEPPX_ERR_INVALID_ARGUMENT, "q_lens");
    REFUSED(sneppx_layer_forward_cached(layer, cache, 0, 2, pair, q11, NULL, NULL, NULL, out),
            SNEPPX_ERR_INVALID_ARGUMENT, "hidden_states");
    REFUSED(sneppx_layer_forward_cached(layer, cache, 0, 2, pair, q11, hidden, NULL, NULL, NULL),
            SNEPPX_ERR_INVALID_ARGUMENT, "out");
    REFUSED(sneppx_layer_forward_cached(layer, cache, 2, 2, pair, q11, hidden, NULL, NULL, out),
            SNEPPX_ERR_INVALID_ARGUMENT, "layer_index");
    REFUSED(sneppx_layer_forward_cached(layer, cache, -1, 2, pair, q11, hidden, NULL, NULL, out),
            SNEPPX_ERR_INVALID_ARGUMENT, "layer_index");
    REFUSED(sneppx_layer_forward_cached(layer, cache, 0, 0, pair, q11, hidden, NULL, NULL, out),
            SNEPPX_ERR_INVALID_ARGUMENT, "n_seqs");
    REFUSED(sneppx_layer_forward_cached(layer, cache, 0, 2, unknown, q11, hidden, NULL, NULL, out),
            SNEPPX_ERR_INVALID_ARGUMENT, "seq_ids[1]");
    REFUSED(sneppx_layer_forward_cached(layer, cache, 0, 2, gone, q11, hidden, NULL, NULL, out),
            SNEPPX_ERR_INVALID_ARGUMENT, "seq_ids[1]");
    REFUSED(sneppx_layer_forward_cached(layer, cache, 0, 2, twice, q11, hidden, NULL, NULL, out),
            SNEPPX_ERR_INVALID_ARGUMENT, "also seq_ids[0]");
    REFUSED(sneppx_layer_forward_cached(layer, cache, 0, 2, pair, q10, hidden, NULL, NULL, out),
            SNEPPX_ERR_INVALID_ARGUMENT, "q_lens[1]");
    REFUSED(sneppx_layer_forward_cached(layer, cache, 0, 2, pair, qneg, hidden, NULL, NULL, out),
            SNEPPX_ERR_INVALID_ARGUMENT, "q_lens[1]");
    REFUSED(sneppx_layer_forward_cached(layer, cache, 0, 2, pair, qbig, hidden, NULL, NULL, out),
            SNEPPX_ERR_INVALID_ARGUMENT, "SNEPPX_MAX_TOKENS");
    REFUSED(sneppx_layer_forward_cached(layer, cache, 0, 2, pair, q11, hidden, far, NULL, out),
            SNEPPX_ERR_INVALID_ARGUMENT, "position_ids");
    REFUSED(sneppx_layer_forward_cached(layer, cache, 0, 2, pair, q11, hidden, negative, NULL, out),
            SNEPPX_ERR_INVALID_ARGUMENT, "position_ids");
    /* NULL position_ids continue from the length: 5 + 60 passes max_position_embeddings 64. */
    const int64_t q60[] = {60};
    REFUSED(sneppx_layer_forward_cached(layer, cache, 0, 1, pair, q60, hidden, NULL, NULL, out),
            SNEPPX_ERR_INVALID_ARGUMENT, "position_ids");
    /* Pool full: a's 5 + 3 tokens fit its 2 pages, b's 9 need 3 and 2 are free:
     * the message names b and its 3 pages. */
    const int64_t q39[] = {3, 9};
    REFUSED(sneppx_layer_forward_cached(layer, cache, 0, 2, pair, q39, hidden, NULL, NULL, out),
            SNEPPX_ERR_OUT_OF_MEMORY, "pool full");
    char needle[96];
    snprintf(needle, sizeof needle, "sequence %lld (seq_ids[1]) needs 3 more pages", (long long)b);
    EXPECT_ERROR(sneppx_layer_forward_cached(layer, cache, 0, 2, pair, q39, hidden, NULL, NULL, out),
                 SNEPPX_ERR_OUT_OF_MEMORY, needle);
    /* A sequence another call holds: refused by forward, remove, fork and truncate. */
    struct sneppx_kv_sequence *held[1];
    const char other_call = 0;
    if (EXPECT_OK(sneppx_kv_call_begin(cache, &other_call, 1, &b, held))) {
        REFUSED(sneppx_layer_forward_cached(layer, cache, 0, 2, pair, q11, hidden, NULL, NULL, out),
                SNEPPX_ERR_INVALID_ARGUMENT, "in use by another call");
        int64_t child;
        EXPECT_ERROR(sneppx_kv_cache_remove_sequence(cache, b), SNEPPX_ERR_INVALID_ARGUMENT, "in use");
        EXPECT_ERROR(sneppx_kv_cache_fork(cache, b, &child), SNEPPX_ERR_INVALID_ARGUMENT, "in use");
        EXPECT_ERROR(sneppx_kv_cache_truncate(cache, b, 0), SNEPPX_ERR_INVALID_ARGUMENT, "in use");
        EXPECT_UNCHANGED(cache, ids, 2, before, "calls on a held sequence");
        sneppx_kv_call_end(cache, 0, 1, held, q11, 0);
    }

    /* A cache of another shape: other K/V heads, a window, MLA. */
    const sneppx_config other_heads = small_config(4, 0), windowed = small_config(2, 8);
    sneppx_config mla;
    EXPECT_OK(sneppx_config_from_name("deepseek-v2-lite", NULL, &mla));
    const sneppx_config *others[] = {&other_heads, &windowed, &mla};
    for (int i = 0; i < 3; i++) {
        sneppx_kv_cache *other = make_cache(others[i], 16, 4, 1);
        int64_t id = -1;
        if (other && sneppx_kv_cache_add_sequence(other, &id) == SNEPPX_OK) {
            EXPECT_ERROR(sneppx_layer_forward_cached(layer, other, 0, 1, &id, q11, hidden, NULL, NULL, out),
                         SNEPPX_ERR_INVALID_ARGUMENT, "cache: made for");
            int64_t length = -1;
            sneppx_kv_cache_length(other, id, &length);
            TEST_CHECK(&tally, length == 0 && test_all_sentinel(out, sizeof out / sizeof out[0]),
                       "a refused call on another shape's cache appended %lld tokens", (long long)length);
        }
        sneppx_kv_cache_destroy(other);
    }
    /* The refused calls changed nothing: the sequences continue as before. */
    append(layer, cache, 0, a, 3);
    append(layer, cache, 0, b, 1);
#undef REFUSED
    sneppx_kv_cache_destroy(cache);
}

/* A layer made with mla_naive: refused, SNEPPX_ERR_UNSUPPORTED naming mla_naive. */
static void test_mla_naive(void)
{
    sneppx_config config;
    sneppx_config_init(&config);
    config.hidden_size = HIDDEN;
    config.num_attention_heads = config.num_key_value_heads = 2;
    config.kv_lora_rank = 32;
    config.qk_nope_head_dim = 16;
    config.qk_rope_head_dim = 16;
    config.v_head_dim = 16;
    config.rope_interleaved = 1;
    config.mla_naive = 1;
    config.max_position_embeddings = MAX_POSITIONS;
    sneppx_layer *layer = NULL;
    sneppx_kv_cache *cache = make_cache(&config, 16, 4, 1);
    if (!EXPECT_OK(sneppx_layer_create(&config, NULL, &layer)) || !cache)
        goto done;
    int64_t id = -1;
    const int64_t q = 2;
    EXPECT_OK(sneppx_kv_cache_add_sequence(cache, &id));
    EXPECT_ERROR(sneppx_layer_forward_cached(layer, cache, 0, 1, &id, &q, hidden, NULL, NULL, out),
                 SNEPPX_ERR_UNSUPPORTED, "mla_naive");
done:
    sneppx_layer_destroy(layer);
    sneppx_kv_cache_destroy(cache);
}

/* Under a window of 8 (pages of 4): truncation back past what the next query
 * sees, and a mask that shows a released token, are refused. */
static void test_window_errors(void)
{
    const sneppx_config config = small_config(2, 8);
    sneppx_layer *layer = NULL;
    sneppx_kv_cache *cache = make_cache(&config, 64, 4, 1);
    if (!EXPECT_OK(sneppx_layer_create(&config, NULL, &layer)) || !cache)
        goto done;
    int64_t id = -1;
    EXPECT_OK(sneppx_kv_cache_add_sequence(cache, &id));
    append(layer, cache, 0, id, 20); /* tokens 0..12 are hidden from every later query: pages 0..2 (0..11) released */
    sneppx_kv_cache_stats stats;
    sneppx_kv_cache_stats_get(cache, &stats);
    TEST_CHECK(&tally, stats.total_pages - stats.free_pages == 2, "window 8 at length 20 holds %lld pages, want 2",
               (long long)(stats.total_pages - stats.free_pages));
    const snapshot before = take(cache, &id, 1);
    /* Length 18: the next query (token 18) sees tokens 11..18, and 11 is gone. */
    EXPECT_ERROR(sneppx_kv_cache_truncate(cache, id, 18), SNEPPX_ERR_INVALID_ARGUMENT, "sliding window");
    EXPECT_UNCHANGED(cache, &id, 1, before, "truncate past the window");
    const int64_t q = 2;
    float mask[2 * 22];
    for (int i = 0; i < 2 * 22; i++)
        mask[i] = -3.4028235e38f;
    mask[0 * 22 + 20] = mask[1 * 22 + 20] = mask[1 * 22 + 21] = 0.0f;
    mask[1 * 22 + 3] = 0.0f; /* row 1 sees token 3: released */
    const float *masks[1] = {mask};
    test_fill_sentinel(out, sizeof out / sizeof out[0]);
    EXPECT_ERROR(sneppx_layer_forward_cached(layer, cache, 0, 1, &id, &q, hidden, NULL, masks, out),
                 SNEPPX_ERR_INVALID_ARGUMENT, "masks[0]: row 1 lets the query see token 3");
    EXPECT_UNCHANGED(cache, &id, 1, before, "a mask showing a released token");
    TEST_CHECK(&tally, test_all_sentinel(out, sizeof out / sizeof out[0]), "a refused masked call wrote to out");
    mask[1 * 22 + 3] = -INFINITY;
    EXPECT_OK(sneppx_layer_forward_cached(layer, cache, 0, 1, &id, &q, hidden, NULL, masks, out));
    EXPECT_OK(sneppx_kv_cache_truncate(cache, id, 21)); /* the next query sees 14..21: held */
done:
    sneppx_layer_destroy(layer);
    sneppx_kv_cache_destroy(cache);
}

int main(void)
{
    test_rng rng = test_rng_seeded(5);
    test_fill_uniform(&rng, hidden, sizeof hidden / sizeof hidden[0], 1.0f);
    test_create_options();
    const sneppx_config config = small_config(2, 0);
    sneppx_layer *layer = NULL;
    if (EXPECT_OK(sneppx_layer_create(&config, NULL, &layer))) {
        test_sequences(layer);
        test_forward_errors(layer);
    }
    sneppx_layer_destroy(layer);
    test_mla_naive();
    test_window_errors();
    return test_finish(&tally);
}
