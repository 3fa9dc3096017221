/* The paged KV cache's API and bad input to sneppx_layer_forward_cached.
 * Every refused call is checked for its status, a message naming the
 * argument, nothing written to out (a sentinel) and the cache unchanged: each
 * sequence's layer lengths, the free pages and the number of sequences.
 * Also: options (page_size a power of two, the default page size, capacity
 * rounded up to pages, struct_size of an older caller), sequence ids never
 * reused, pages back to the pool on remove / truncate / reset, forks sharing
 * pages, truncation under a window refused once what the next query sees
 * was released (to 0 never: the sequence starts over), a batch's truncate all or none,
 * a sequence in use by another call refused by everyone.
 * Cache types: every sneppx_dtype is accepted, its sizes in the stats; the
 * runtime's conversions give numpy's bits on edge cases (ties, NaN / inf,
 * overflow, subnormals, an all-zero int8 row); a forward stores each token's
 * K (after RoPE) and V (MLA: latent row) as those conversions of the float32
 * cache's rows, int8 scales in their place. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_cache_internal.h"
#include "kv_elements.h"
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
    options.dtype = SNEPPX_DTYPE_COUNT;
    EXPECT_ERROR(sneppx_kv_cache_create(&config, &options, &cache), SNEPPX_ERR_INVALID_ARGUMENT,
                 "options.dtype: 4 is not a sneppx_dtype (float32, bfloat16, float16 or int8)");
    options.dtype = (sneppx_dtype)-1;
    EXPECT_ERROR(sneppx_kv_cache_create(&config, &options, &cache), SNEPPX_ERR_INVALID_ARGUMENT, "options.dtype");
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
    /* One page of 2^16 tokens x 4096 layers of 64 K/V heads of 256 is 2^45 bytes, whatever
     * the capacity: the page's options are named. */
    sneppx_config wide = config;
    wide.hidden_size = 64 * 256;
    wide.num_attention_heads = wide.num_key_value_heads = 64;
    wide.head_dim = 256;
    options.page_size = SNEPPX_KV_MAX_PAGE_SIZE;
    options.num_layers = SNEPPX_KV_MAX_LAYERS;
    options.capacity_tokens = 1;
    EXPECT_ERROR(sneppx_kv_cache_create(&wide, &options, &cache), SNEPPX_ERR_OUT_OF_MEMORY,
                 "options.page_size, options.num_layers: a page of 65536 tokens x 4096 layers");
    TEST_CHECK(&tally, cache == NULL, "a failed create must set *cache to NULL");
    options.page_size = 4;
    options.num_layers = 1;
    /* 2^31 - 1 tokens in pages of 2^16 tokens x 4096 layers of 256 bytes: 2^51 bytes, more
     * than any address space (ASan aborts on such a request instead of failing it): the
     * pool that cannot be made is named. */
    if (!TEST_UNDER_ASAN) {
        options.page_size = SNEPPX_KV_MAX_PAGE_SIZE;
        options.num_layers = SNEPPX_KV_MAX_LAYERS;
        options.capacity_tokens = SNEPPX_KV_MAX_CAPACITY_TOKENS;
        EXPECT_ERROR(sneppx_kv_cache_create(&config, &options, &cache), SNEPPX_ERR_OUT_OF_MEMORY,
                     "options.capacity_tokens: cannot allocate 32768 pages of 68719476736 bytes");
        TEST_CHECK(&tally, cache == NULL, "a failed create must set *cache to NULL");
        options.page_size = 4;
        options.num_layers = 1;
    }
    options.capacity_tokens = 17;

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
    /* options_init gives the default page size, and page_size 0 means it too; MLA: one latent
     * row per token. */
    sneppx_kv_cache_options defaults;
    sneppx_kv_cache_options_init(&defaults);
    TEST_CHECK(&tally, defaults.page_size == SNEPPX_KV_DEFAULT_PAGE_SIZE, "options_init: page_size %lld, not %d",
               (long long)defaults.page_size, SNEPPX_KV_DEFAULT_PAGE_SIZE);
    options.page_size = 0;
    sneppx_config mla;
    EXPECT_OK(sneppx_config_from_name("deepseek-v2-lite", NULL, &mla));
    EXPECT_OK(sneppx_kv_cache_create(&mla, &options, &cache));
    EXPECT_OK(sneppx_kv_cache_stats_get(cache, &stats));
    TEST_CHECK(&tally, stats.page_size == SNEPPX_KV_DEFAULT_PAGE_SIZE &&
                           stats.total_pages == (17 + SNEPPX_KV_DEFAULT_PAGE_SIZE - 1) / SNEPPX_KV_DEFAULT_PAGE_SIZE &&
                           stats.token_elements == 512 + 64,
               "deepseek-v2-lite cache: page %lld, %lld pages, %lld elements per token", (long long)stats.page_size,
               (long long)stats.total_pages, (long long)stats.token_elements);
    sneppx_kv_cache_destroy(cache);
    /* A caller whose struct ends at dtype (the first version) gets the defaults past it. */
    options.struct_size = (uint32_t)(offsetof(sneppx_kv_cache_options, dtype) + sizeof(sneppx_dtype));
    EXPECT_OK(sneppx_kv_cache_create(&config, &options, &cache));
    sneppx_kv_cache_destroy(cache);
    sneppx_kv_cache_destroy(NULL);
}

/* Every type's sizes: elements of its width, int8's scales after each layer block's
 * rows (64-byte aligned), per token and K/V head for K and for V (MLA: one per row). */
static void test_dtype_sizes(void)
{
    const sneppx_config config = small_config(2, 0);
    sneppx_config mla;
    EXPECT_OK(sneppx_config_from_name("deepseek-v2-lite", NULL, &mla));
    static const struct {
        sneppx_dtype dtype;
        int64_t token_bytes, page_bytes, mla_token_bytes, mla_page_bytes;
    } cases[] = {
        /* standard: 2 heads x (16 + 16) elements, pages of 4, 2 layers; MLA: 576, pages of 16 */
        {SNEPPX_DTYPE_FLOAT32, 256, 2 * 1024, 2304, 2 * 36864},
        {SNEPPX_DTYPE_BFLOAT16, 128, 2 * 512, 1152, 2 * 18432},
        {SNEPPX_DTYPE_FLOAT16, 128, 2 * 512, 1152, 2 * 18432},
        {SNEPPX_DTYPE_INT8, 64 + 4 * 4, 2 * (256 + 64), 576 + 4, 2 * (9216 + 64)},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int is_mla = 0; is_mla < 2; is_mla++) {
            sneppx_kv_cache_options options;
            sneppx_kv_cache_options_init(&options);
            options.capacity_tokens = 40;
            options.page_size = is_mla ? 16 : 4;
            options.num_layers = 2;
            options.dtype = cases[i].dtype;
            sneppx_kv_cache *cache = NULL;
            sneppx_kv_cache_stats stats;
            memset(&stats, 0, sizeof stats);
            if (!EXPECT_OK(sneppx_kv_cache_create(is_mla ? &mla : &config, &options, &cache)))
                continue;
            EXPECT_OK(sneppx_kv_cache_stats_get(cache, &stats));
            const int64_t token_bytes = is_mla ? cases[i].mla_token_bytes : cases[i].token_bytes;
            const int64_t page_bytes = is_mla ? cases[i].mla_page_bytes : cases[i].page_bytes;
            TEST_CHECK(&tally, stats.dtype == cases[i].dtype && stats.token_bytes == token_bytes &&
                                   stats.page_bytes == page_bytes && stats.token_elements == (is_mla ? 576 : 64),
                       "%s%s: stats dtype %d, %lld bytes per token (want %lld), %lld per page (want %lld)",
                       sneppx_dtype_name(cases[i].dtype), is_mla ? " MLA" : "", (int)stats.dtype,
                       (long long)stats.token_bytes, (long long)token_bytes, (long long)stats.page_bytes,
                       (long long)page_bytes);
            sneppx_kv_cache_destroy(cache);
        }
    }
}

static float float_of(uint32_t bits)
{
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

/* The conversions on edge cases; every expected value is numpy's (float32 bits rounded
 * to nearest even on the bits for bfloat16, astype(float16), and for int8
 * clip(rint(x / (max|x| / 127)), -127, 127) in float32). */
static void test_element_edges(void)
{
    static const struct {
        uint32_t in;
        uint16_t bf16, f16;
    } cases[] = {
        {0x3f808000u, 0x3f80, 0x3c04}, /* 1 + 2^-8: a bfloat16 tie, to even (down) */
        {0x3f818000u, 0x3f82, 0x3c0c}, /* 1 + 3 * 2^-8: a tie, to even (up) */
        {0x3f808001u, 0x3f81, 0x3c04}, /* just past the tie */
        {0x3f801000u, 0x3f80, 0x3c00}, /* 1 + 2^-11: a float16 tie, to even (down) */
        {0x3f803000u, 0x3f80, 0x3c02}, /* 1 + 3 * 2^-11: a float16 tie, to even (up) */
        {0x7f7fffffu, 0x7f80, 0x7c00}, /* FLT_MAX: inf in both */
        {0x477fef00u, 0x4780, 0x7bff}, /* 65519: float16's largest finite */
        {0x477ff000u, 0x4780, 0x7c00}, /* 65520: rounds to float16 inf */
        {0x7f800000u, 0x7f80, 0x7c00}, /* inf */
        {0xff800000u, 0xff80, 0xfc00}, /* -inf */
        {0x80000000u, 0x8000, 0x8000}, /* -0 */
        {0x33000000u, 0x3300, 0x0000}, /* 2^-25: float16 tie between 0 and 2^-24, to 0 */
        {0x33c00000u, 0x33c0, 0x0002}, /* 3 * 2^-25: tie, to even (2 * 2^-24) */
        {0x387fda40u, 0x3880, 0x03ff}, /* 6.1e-5: the largest float16 subnormal */
        {0x00000001u, 0x0000, 0x0000}, /* the smallest float32 subnormal */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const float x = float_of(cases[i].in);
        uint16_t bf16 = 0, f16 = 0;
        sneppx_kv_store_row(SNEPPX_DTYPE_BFLOAT16, &bf16, NULL, &x, 1);
        sneppx_kv_store_row(SNEPPX_DTYPE_FLOAT16, &f16, NULL, &x, 1);
        TEST_CHECK(&tally, bf16 == cases[i].bf16 && f16 == cases[i].f16,
                   "%08x: bfloat16 %04x (want %04x), float16 %04x (want %04x)", (unsigned)cases[i].in, bf16,
                   cases[i].bf16, f16, cases[i].f16);
        float back = 0.0f, want = 0.0f;
        sneppx_kv_load_row(SNEPPX_DTYPE_FLOAT16, &back, &f16, 0.0f, 1);
        want = (float)ldexp(1.0, -24) * (float)(f16 & 0x3ff); /* subnormal or zero */
        if ((f16 & 0x7c00) == 0x7c00)
            want = INFINITY;
        else if (f16 & 0x7c00)
            want = (float)ldexp(1.0 + (f16 & 0x3ff) / 1024.0, ((f16 >> 10) & 0x1f) - 15);
        want = f16 & 0x8000 ? -want : want;
        TEST_CHECK(&tally, back == want && signbit(back) == signbit(want), "float16 %04x widens to %g, want %g", f16,
                   back, want);
    }
    /* NaN stays a quiet NaN of its sign in both (templates/narrow.c.j2 does the same). */
    const float nans[] = {float_of(0x7fc00000u), float_of(0xff800001u)};
    uint16_t bf16[2], f16[2];
    sneppx_kv_store_row(SNEPPX_DTYPE_BFLOAT16, bf16, NULL, nans, 2);
    sneppx_kv_store_row(SNEPPX_DTYPE_FLOAT16, f16, NULL, nans, 2);
    TEST_CHECK(&tally, bf16[0] == 0x7fc0 && bf16[1] == 0xffc0 && f16[0] == 0x7e00 && f16[1] == 0xfe00,
               "NaN: bfloat16 %04x %04x, float16 %04x %04x (want 7fc0 ffc0 7e00 fe00)", bf16[0], bf16[1], f16[0],
               f16[1]);

    /* int8: ties to even at scale 1, the clamp, an all-zero row, a row with NaN. */
    const float ties[8] = {127.0f, 0.5f, 1.5f, 2.5f, -2.5f, -127.0f, 63.5f, -0.49f};
    const int8_t ties_q[8] = {127, 0, 2, 2, -2, -127, 64, 0};
    const float mixed[4] = {3.0f, -1.0f, 0.1f, 2.0f};
    const int8_t mixed_q[4] = {127, -42, 4, 85};
    int8_t q[8];
    float scale = -1.0f;
    sneppx_kv_store_row(SNEPPX_DTYPE_INT8, q, &scale, ties, 8);
    TEST_CHECK(&tally, scale == 1.0f && memcmp(q, ties_q, sizeof ties_q) == 0,
               "int8 ties: scale %g, q %d %d %d %d %d %d %d %d", scale, q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7]);
    sneppx_kv_store_row(SNEPPX_DTYPE_INT8, q, &scale, mixed, 4);
    uint32_t scale_bits;
    memcpy(&scale_bits, &scale, sizeof scale_bits);
    TEST_CHECK(&tally, scale_bits == 0x3cc18306u && memcmp(q, mixed_q, sizeof mixed_q) == 0,
               "int8 row: scale %08x (want 3cc18306), q %d %d %d %d", (unsigned)scale_bits, q[0], q[1], q[2], q[3]);
    const float zeros[4] = {0.0f, -0.0f, 0.0f, 0.0f};
    memset(q, 5, sizeof q);
    sneppx_kv_store_row(SNEPPX_DTYPE_INT8, q, &scale, zeros, 4);
    float back[4];
    sneppx_kv_load_row(SNEPPX_DTYPE_INT8, back, q, scale, 4);
    TEST_CHECK(&tally, scale == 0.0f && q[0] == 0 && q[3] == 0 && back[0] == 0.0f && back[3] == 0.0f,
               "int8 all-zero row: scale %g, q %d, back %g", scale, q[0], back[0]);
    /* A largest |x| whose scale underflows to 0 (here 2^-149 / 127): stored as zeros, as a
     * zero row is (it divided by 0 and converted the NaN to int, undefined behaviour). */
    const float tiny[4] = {float_of(0x00000001u), -float_of(0x00000001u), 0.0f, float_of(0x00000001u)};
    memset(q, 5, sizeof q);
    sneppx_kv_store_row(SNEPPX_DTYPE_INT8, q, &scale, tiny, 4);
    TEST_CHECK(&tally, scale == 0.0f && q[0] == 0 && q[1] == 0 && q[3] == 0,
               "int8 row of subnormals: scale %g, q %d %d", scale, q[0], q[1]);
    const float poisoned[4] = {1.0f, NAN, 2.0f, 3.0f};
    sneppx_kv_store_row(SNEPPX_DTYPE_INT8, q, &scale, poisoned, 4);
    sneppx_kv_load_row(SNEPPX_DTYPE_INT8, back, q, scale, 4);
    TEST_CHECK(&tally, isnan(scale) && isnan(back[0]) && isnan(back[3]), "int8 row with NaN: scale %g, back %g",
               scale, back[0]);
}

/* A forward into a float32 cache and into one of each other type: every stored row
 * (K after RoPE and V per K/V head, MLA's latent rows) is the conversion of the
 * float32 cache's row, at its place; int8's scale too. */
static void test_stored_rows(const sneppx_config *config)
{
    sneppx_layer *layer = NULL;
    if (!EXPECT_OK(sneppx_layer_create(config, NULL, &layer)))
        return;
    sneppx_kv_cache *caches[SNEPPX_DTYPE_COUNT] = {NULL};
    int64_t ids[SNEPPX_DTYPE_COUNT];
    const int64_t q = 6;
    int ok = 1;
    for (int t = 0; t < SNEPPX_DTYPE_COUNT; t++) {
        sneppx_kv_cache_options options;
        sneppx_kv_cache_options_init(&options);
        options.capacity_tokens = 8;
        options.page_size = 4;
        options.dtype = (sneppx_dtype)t;
        ok = ok && EXPECT_OK(sneppx_kv_cache_create(config, &options, &caches[t])) &&
             EXPECT_OK(sneppx_kv_cache_add_sequence(caches[t], &ids[t])) &&
             EXPECT_OK(sneppx_layer_forward_cached(layer, caches[t], 0, 1, &ids[t], &q, hidden, NULL, NULL, out));
    }
    for (int t = 1; ok && t < SNEPPX_DTYPE_COUNT; t++) {
        const sneppx_kv_cache *f32 = caches[0], *c = caches[t];
        const struct sneppx_kv_shape *shape = &c->shape;
        int rows = 0, same = 1;
        for (int64_t token = 0; token < q; token++) {
            const struct sneppx_kv_sequence *s32 = f32->slots[0], *s = c->slots[0];
            unsigned char *b32 = sneppx_kv_block(f32, sneppx_kv_page_of(f32, s32, token), 0);
            unsigned char *b = sneppx_kv_block(c, sneppx_kv_page_of(c, s, token), 0);
            const int64_t slot = token % 4;
            for (int64_t h = 0; h < (shape->is_mla ? 1 : 2 * shape->kv_heads); h++) {
                const int value = !shape->is_mla && h >= shape->kv_heads;
                const int64_t head = value ? h - shape->kv_heads : h;
                const int64_t n = shape->is_mla ? shape->kv_lora_rank + shape->rope_dim
                                                : value ? shape->v_head_dim : shape->head_dim;
                const int64_t at = shape->is_mla ? sneppx_kv_latent_offset(c, slot)
                                   : value       ? sneppx_kv_v_offset(c, head, slot)
                                                 : sneppx_kv_k_offset(c, head, slot);
                const int64_t scale_at = value ? sneppx_kv_v_scale_offset(c, head, slot)
                                               : sneppx_kv_k_scale_offset(c, head, slot);
                unsigned char want[1024 * 4];
                float want_scale = 0.0f;
                sneppx_kv_store_row(c->dtype, want, &want_scale, (const float *)(void *)(b32 + at * 4), n);
                same &= memcmp(b + at * c->elem_size, want, (size_t)(n * c->elem_size)) == 0;
                if (c->dtype == SNEPPX_DTYPE_INT8)
                    same &= memcmp(sneppx_kv_scales(c, b) + scale_at, &want_scale, sizeof want_scale) == 0;
                rows++;
            }
        }
        TEST_CHECK(&tally, same && rows > 0, "%s%s cache: a stored row (of %d) is not the float32 cache's, converted",
                   sneppx_dtype_name(c->dtype), shape->is_mla ? " MLA" : "", rows);
    }
    for (int t = 0; t < SNEPPX_DTYPE_COUNT; t++)
        sneppx_kv_cache_destroy(caches[t]);
    sneppx_layer_destroy(layer);
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
    /* A slot whose 2^31 generations are spent is retired, not wrapped back to its first
     * id (2^31 adds and removes of one slot: ~30 minutes, here set directly). */
    const int64_t slot = again & (((int64_t)1 << SNEPPX_KV_SLOT_BITS) - 1);
    cache->generations[slot] = SNEPPX_KV_LAST_GENERATION;
    cache->slots[slot]->id = (int64_t)((uint64_t)SNEPPX_KV_LAST_GENERATION << SNEPPX_KV_SLOT_BITS) + slot;
    const int64_t last = cache->slots[slot]->id;
    EXPECT_OK(sneppx_kv_cache_remove_sequence(cache, last));
    int64_t after = -1;
    EXPECT_OK(sneppx_kv_cache_add_sequence(cache, &after));
    TEST_CHECK(&tally, (after & (((int64_t)1 << SNEPPX_KV_SLOT_BITS) - 1)) != slot,
               "a spent slot was used again: id %lld (slot %lld)", (long long)after, (long long)slot);
    EXPECT_ERROR(sneppx_kv_cache_length(cache, slot, &length), SNEPPX_ERR_INVALID_ARGUMENT, "seq_id");
    EXPECT_ERROR(sneppx_kv_cache_length(cache, last, &length), SNEPPX_ERR_INVALID_ARGUMENT, "seq_id");

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
    const int64_t later_twice[] = {b, a, a}, q111[] = {1, 1, 1};
    REFUSED(sneppx_layer_forward_cached(layer, cache, 0, 3, later_twice, q111, hidden, NULL, NULL, out),
            SNEPPX_ERR_INVALID_ARGUMENT, "seq_ids[2]: sequence");
    REFUSED(sneppx_layer_forward_cached(layer, cache, 0, 3, later_twice, q111, hidden, NULL, NULL, out),
            SNEPPX_ERR_INVALID_ARGUMENT, "is also seq_ids[1]");
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
    /* NULL position_ids continue from the length: a's 5 + 60 pass max_position_embeddings 64.
     * The caller gave no position_ids: the message names the sequence that grew too long. */
    const int64_t b_then_a[] = {b, a}, q1_60[] = {1, 60};
    char too_long[160];
    snprintf(too_long, sizeof too_long,
             "seq_ids[1]: sequence %lld holds 5 tokens at layer 0, and its 60 new ones reach position 64, beyond "
             "max_position_embeddings 64 (position_ids NULL: ",
             (long long)a);
    REFUSED(sneppx_layer_forward_cached(layer, cache, 0, 2, b_then_a, q1_60, hidden, NULL, NULL, out),
            SNEPPX_ERR_INVALID_ARGUMENT, too_long);
    /* Pool full: a's 5 + 3 tokens fit its 2 pages, b's 9 need 3 and 2 are free:
     * the message names b and its 3 pages. */
    const int64_t q39[] = {3, 9};
    REFUSED(sneppx_layer_forward_cached(layer, cache, 0, 2, pair, q39, hidden, NULL, NULL, out),
            SNEPPX_ERR_OUT_OF_MEMORY, "pool full");
    char needle[96];
    snprintf(needle, sizeof needle, "sequence %lld (seq_ids[1]) needs 3 more pages", (long long)b);
    EXPECT_ERROR(sneppx_layer_forward_cached(layer, cache, 0, 2, pair, q39, hidden, NULL, NULL, out),
                 SNEPPX_ERR_OUT_OF_MEMORY, needle);
    /* Reads need both outputs (a standard cache's K and V), and every call its cache. */
    float k_rows[2 * 16], v_rows[2 * 16];
    int64_t fork_id = -1;
    EXPECT_ERROR(sneppx_kv_cache_read(cache, a, 0, 0, 1, NULL, v_rows), SNEPPX_ERR_INVALID_ARGUMENT, "k: must not");
    EXPECT_ERROR(sneppx_kv_cache_read(cache, a, 0, 0, 1, k_rows, NULL), SNEPPX_ERR_INVALID_ARGUMENT, "v: must not");
    EXPECT_ERROR(sneppx_kv_cache_read(NULL, a, 0, 0, 1, k_rows, v_rows), SNEPPX_ERR_INVALID_ARGUMENT, "cache");
    EXPECT_ERROR(sneppx_kv_cache_fork(NULL, a, &fork_id), SNEPPX_ERR_INVALID_ARGUMENT, "cache");
    EXPECT_ERROR(sneppx_kv_cache_truncate(NULL, a, 0), SNEPPX_ERR_INVALID_ARGUMENT, "cache");
    EXPECT_UNCHANGED(cache, ids, 2, before, "refused reads");
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

static sneppx_config small_mla_config(int64_t kv_lora_rank, int64_t rope_dim)
{
    sneppx_config config;
    sneppx_config_init(&config);
    config.hidden_size = HIDDEN;
    config.num_attention_heads = config.num_key_value_heads = 2;
    config.kv_lora_rank = kv_lora_rank;
    config.qk_nope_head_dim = 16;
    config.qk_rope_head_dim = rope_dim;
    config.v_head_dim = 16;
    config.rope_interleaved = 1;
    config.max_position_embeddings = MAX_POSITIONS;
    return config;
}

/* An MLA layer and a cache of other latent rows (its kv_lora_rank, its rope part):
 * refused naming both shapes, nothing appended, out untouched. */
static void test_mla_shapes(void)
{
    const sneppx_config config = small_mla_config(32, 16);
    sneppx_layer *layer = NULL;
    if (!EXPECT_OK(sneppx_layer_create(&config, NULL, &layer)))
        return;
    const sneppx_config others[] = {small_mla_config(48, 16), small_mla_config(32, 32)};
    const char *const needles[] = {"cache: made for latent rows of kv_lora_rank 48 + qk_rope_head_dim 16, this layer "
                                   "has 32 + 16",
                                   "cache: made for latent rows of kv_lora_rank 32 + qk_rope_head_dim 32, this layer "
                                   "has 32 + 16"};
    const int64_t q = 2;
    for (int i = 0; i < 2; i++) {
        sneppx_kv_cache *cache = make_cache(&others[i], 16, 4, 1);
        int64_t id = -1, length = -1;
        if (cache && EXPECT_OK(sneppx_kv_cache_add_sequence(cache, &id))) {
            test_fill_sentinel(out, sizeof out / sizeof out[0]);
            EXPECT_ERROR(sneppx_layer_forward_cached(layer, cache, 0, 1, &id, &q, hidden, NULL, NULL, out),
                         SNEPPX_ERR_INVALID_ARGUMENT, needles[i]);
            sneppx_kv_cache_length(cache, id, &length);
            TEST_CHECK(&tally, length == 0 && test_all_sentinel(out, sizeof out / sizeof out[0]),
                       "a refused call on another MLA shape's cache appended %lld tokens", (long long)length);
        }
        sneppx_kv_cache_destroy(cache);
    }
    sneppx_layer_destroy(layer);
}

/* A layer made with mla_naive: refused, SNEPPX_ERR_UNSUPPORTED naming mla_naive. */
static void test_mla_naive(void)
{
    sneppx_config config = small_mla_config(32, 16);
    config.mla_naive = 1;
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
    /* The first held token is where reads may start: 12 (page 3), every token before it gone. */
    int64_t first = -1;
    EXPECT_OK(sneppx_kv_cache_first_held(cache, id, &first));
    TEST_CHECK(&tally, first == 12, "window 8 at length 20 (pages of 4): first held token %lld, want 12",
               (long long)first);
    {
        float k_rows[8 * 2 * 16], v_rows[8 * 2 * 16];
        EXPECT_OK(sneppx_kv_cache_read(cache, id, 0, first, 20, k_rows, v_rows));
        EXPECT_ERROR(sneppx_kv_cache_read(cache, id, 0, first - 1, 20, k_rows, v_rows), SNEPPX_ERR_INVALID_ARGUMENT,
                     "[12, 20)");
    }
    EXPECT_ERROR(sneppx_kv_cache_first_held(cache, id, NULL), SNEPPX_ERR_INVALID_ARGUMENT, "first: must not be NULL");
    EXPECT_ERROR(sneppx_kv_cache_first_held(NULL, id, &first), SNEPPX_ERR_INVALID_ARGUMENT, "cache");
    EXPECT_ERROR(sneppx_kv_cache_first_held(cache, id + 1000, &first), SNEPPX_ERR_INVALID_ARGUMENT, "seq_id");
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
    /* NaN does not mask (the kernels add it, so the whole-sequence forward's row is NaN):
     * on a released token it is refused like any other entry that shows the token. */
    mask[1 * 22 + 3] = NAN;
    EXPECT_ERROR(sneppx_layer_forward_cached(layer, cache, 0, 1, &id, &q, hidden, NULL, masks, out),
                 SNEPPX_ERR_INVALID_ARGUMENT, "masks[0]: row 1 lets the query see token 3");
    EXPECT_UNCHANGED(cache, &id, 1, before, "a mask with NaN on a released token");
    mask[1 * 22 + 3] = -INFINITY;
    EXPECT_OK(sneppx_layer_forward_cached(layer, cache, 0, 1, &id, &q, hidden, NULL, masks, out));
    EXPECT_OK(sneppx_kv_cache_truncate(cache, id, 21)); /* the next query sees 14..21: held */
    /* Length 0 keeps nothing, so nothing released is missed: the sequence starts over and
     * computes what a new sequence does. */
    EXPECT_OK(sneppx_kv_cache_truncate(cache, id, 0));
    int64_t length = -1, fresh = -1;
    sneppx_kv_cache_length(cache, id, &length);
    sneppx_kv_cache_stats_get(cache, &stats);
    TEST_CHECK(&tally, length == 0 && stats.free_pages == stats.total_pages,
               "truncate to 0 under a window: length %lld, %lld of %lld pages free", (long long)length,
               (long long)stats.free_pages, (long long)stats.total_pages);
    EXPECT_OK(sneppx_kv_cache_first_held(cache, id, &first));
    TEST_CHECK(&tally, first == 0, "truncate to 0 under a window: first held token %lld, want 0", (long long)first);
    static float again[20 * HIDDEN];
    const int64_t q20 = 20;
    EXPECT_OK(sneppx_layer_forward_cached(layer, cache, 0, 1, &id, &q20, hidden, NULL, NULL, again));
    EXPECT_OK(sneppx_kv_cache_add_sequence(cache, &fresh));
    EXPECT_OK(sneppx_layer_forward_cached(layer, cache, 0, 1, &fresh, &q20, hidden, NULL, NULL, out));
    TEST_CHECK(&tally, memcmp(again, out, sizeof again) == 0,
               "a sequence truncated to 0 computes other rows than a new one");
done:
    sneppx_layer_destroy(layer);
    sneppx_kv_cache_destroy(cache);
}

/* sneppx_kv_cache_truncate_sequences under a window of 8 (pages of 4): a refusal
 * of any entry (the window, a length past the sequence, an unknown id, a
 * duplicate, a sequence in use) cuts none, naming the entry; when every entry
 * passes, each sequence is cut as sneppx_kv_cache_truncate cuts it. */
static void test_truncate_sequences(void)
{
    const sneppx_config config = small_config(2, 8);
    sneppx_layer *layer = NULL;
    sneppx_kv_cache *cache = make_cache(&config, 64, 4, 1);
    if (!EXPECT_OK(sneppx_layer_create(&config, NULL, &layer)) || !cache)
        goto done;
    int64_t ids[3] = {-1, -1, -1};
    const int64_t tokens[3] = {6, 20, 10};
    for (int i = 0; i < 3; i++) {
        EXPECT_OK(sneppx_kv_cache_add_sequence(cache, &ids[i]));
        append(layer, cache, 0, ids[i], tokens[i]);
    }
    const snapshot before = take(cache, ids, 3);
    /* ids[1] holds 20 tokens with 0..11 released: 18 is too far back, after ids[0]'s 2 passed. */
    const int64_t window_back[3] = {2, 18, 9};
    EXPECT_ERROR(sneppx_kv_cache_truncate_sequences(cache, 3, ids, window_back), SNEPPX_ERR_INVALID_ARGUMENT,
                 "lengths[1]: 18 is too far back");
    EXPECT_UNCHANGED(cache, ids, 3, before, "a batch truncate refused by the window");
    const int64_t past_end[3] = {2, 20, 11};
    EXPECT_ERROR(sneppx_kv_cache_truncate_sequences(cache, 3, ids, past_end), SNEPPX_ERR_INVALID_ARGUMENT,
                 "lengths[2]: 11 must be in [0, 10]");
    const int64_t negative[2] = {2, -1};
    EXPECT_ERROR(sneppx_kv_cache_truncate_sequences(cache, 2, ids, negative), SNEPPX_ERR_INVALID_ARGUMENT,
                 "lengths[1]: -1");
    const int64_t twice[3] = {ids[0], ids[2], ids[0]}, unknown[2] = {ids[0], 12345};
    const int64_t short_lengths[3] = {1, 1, 1};
    EXPECT_ERROR(sneppx_kv_cache_truncate_sequences(cache, 3, twice, short_lengths), SNEPPX_ERR_INVALID_ARGUMENT,
                 "seq_ids[2]: sequence 0 is also seq_ids[0]: each sequence at most once");
    EXPECT_ERROR(sneppx_kv_cache_truncate_sequences(cache, 2, unknown, short_lengths), SNEPPX_ERR_INVALID_ARGUMENT,
                 "seq_ids[1]: 12345 is not a live sequence");
    EXPECT_ERROR(sneppx_kv_cache_truncate_sequences(cache, -1, ids, short_lengths), SNEPPX_ERR_INVALID_ARGUMENT,
                 "n_seqs");
    EXPECT_ERROR(sneppx_kv_cache_truncate_sequences(cache, 1, NULL, short_lengths), SNEPPX_ERR_INVALID_ARGUMENT,
                 "seq_ids");
    EXPECT_ERROR(sneppx_kv_cache_truncate_sequences(cache, 1, ids, NULL), SNEPPX_ERR_INVALID_ARGUMENT, "lengths");
    EXPECT_ERROR(sneppx_kv_cache_truncate_sequences(NULL, 1, ids, short_lengths), SNEPPX_ERR_INVALID_ARGUMENT,
                 "cache");
    struct sneppx_kv_sequence *held[1];
    const char other_call = 0;
    if (EXPECT_OK(sneppx_kv_call_begin(cache, &other_call, 1, &ids[2], held))) {
        const int64_t allowed[3] = {1, 19, 1};
        char in_use[96];
        snprintf(in_use, sizeof in_use, "seq_ids[2]: sequence %lld is in use by a forward call", (long long)ids[2]);
        EXPECT_ERROR(sneppx_kv_cache_truncate_sequences(cache, 3, ids, allowed), SNEPPX_ERR_INVALID_ARGUMENT, in_use);
        const int64_t none = 0;
        sneppx_kv_call_end(cache, 0, 1, held, &none, 0);
    }
    EXPECT_UNCHANGED(cache, ids, 3, before, "refused batch truncates");
    EXPECT_OK(sneppx_kv_cache_truncate_sequences(cache, 0, NULL, NULL));
    EXPECT_UNCHANGED(cache, ids, 3, before, "a batch truncate of no sequences");

    /* Each sequence as a lone truncate leaves it: lengths and pages. */
    const int64_t kept[3] = {2, 19, 0};
    EXPECT_OK(sneppx_kv_cache_truncate_sequences(cache, 3, ids, kept));
    const snapshot batched = take(cache, ids, 3);
    sneppx_kv_cache *alone = make_cache(&config, 64, 4, 1);
    int64_t alone_ids[3] = {-1, -1, -1};
    for (int i = 0; alone && i < 3; i++) {
        EXPECT_OK(sneppx_kv_cache_add_sequence(alone, &alone_ids[i]));
        append(layer, alone, 0, alone_ids[i], tokens[i]);
        EXPECT_OK(sneppx_kv_cache_truncate(alone, alone_ids[i], kept[i]));
    }
    if (alone)
        EXPECT_UNCHANGED(alone, alone_ids, 3, batched, "lone truncates against the batch's");
    TEST_CHECK(&tally, batched.lengths[0][0] == 2 && batched.lengths[1][0] == 19 && batched.lengths[2][0] == 0,
               "batch truncate left lengths %lld %lld %lld, want 2 19 0", (long long)batched.lengths[0][0],
               (long long)batched.lengths[1][0], (long long)batched.lengths[2][0]);
    sneppx_kv_cache_destroy(alone);
done:
    sneppx_layer_destroy(layer);
    sneppx_kv_cache_destroy(cache);
}

int main(void)
{
    test_rng rng = test_rng_seeded(5);
    test_fill_uniform(&rng, hidden, sizeof hidden / sizeof hidden[0], 1.0f);
    test_create_options();
    test_dtype_sizes();
    test_element_edges();
    const sneppx_config config = small_config(2, 0);
    test_stored_rows(&config);
    sneppx_config mla;
    if (EXPECT_OK(sneppx_config_from_name("deepseek-v2-lite", NULL, &mla))) {
        mla.hidden_size = HIDDEN;
        mla.num_attention_heads = mla.num_key_value_heads = 2;
        test_stored_rows(&mla);
    }
    sneppx_layer *layer = NULL;
    if (EXPECT_OK(sneppx_layer_create(&config, NULL, &layer))) {
        test_sequences(layer);
        test_forward_errors(layer);
    }
    sneppx_layer_destroy(layer);
    test_mla_naive();
    test_mla_shapes();
    test_window_errors();
    test_truncate_sequences();
    return test_finish(&tally);
}
