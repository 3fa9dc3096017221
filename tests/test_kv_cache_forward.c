/* ctest: two cores (threads or processes of its own; ctest -j2 runs it alone) */
/* sneppx_layer_forward_cached against the cache-free sneppx_layer_forward of
 * the whole sequence and against the float64 reference (tests/support), for
 * LLaMA (GQA ratios 1, 2, 4, 8), Mistral (sliding window 13), Qwen2 (q/k/v
 * bias) and DeepSeek V2 MLA (with and without q LoRA), small random configs:
 *   - one-shot prefill == random chunk sizes == prefill then token-by-token
 *     decode, across page boundaries (page_size 4 and 16) and past the window;
 *   - a ragged batch of 4 sequences in one call (prefills of different
 *     lengths, then decode and chunks mixed) == each sequence alone;
 *   - fork (the child continues as a sequence with the parent's prefix would,
 *     the parent as if never forked), truncate then re-append == never appended;
 *     a parent and two forks stepping into their shared page in one call, in a
 *     pool with room for two copies (the last keeps the page);
 *   - position_ids with an offset; an explicit mask per sequence;
 *   - flash and SDPA; two layers sharing one cache;
 *   - under a window the pool does not grow with the sequence;
 *   - two threads decoding their own sequences of one cache and one layer at
 *     once, while a third adds, forks, appends to, truncates and removes others;
 *   - a warm decode step takes the workspace it released the step before, and
 *     30 warm steps of 3 sequences across page boundaries allocate nothing;
 *   - a sequence that outgrows max_sequence_tokens keeps working.
 * Tolerances (max |got - want| / max |want| over the compared rows):
 *   vs the cache-free forward: CACHE_FREE_MAX; the same fp32 projections, the
 *     attention summed in other tiles of keys (online softmax), so a few fp32
 *     roundings apart;
 *   vs the float64 reference: REFERENCE_MAX, as the cache-free forward's own
 *     tests (test_forward_case.h explains the fp32 error budget). */
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layer_internal.h"
#include "mha_reference.h"
#include "sneppx/sneppx.h"
#include "test_util.h"
#include "test_weights.h"

#define CACHE_FREE_MAX 1e-6
#define REFERENCE_MAX 1e-5
#define HIDDEN 64
#define MAX_T 80

static test_tally tally;
static double worst_cache_free, worst_reference; /* printed at the end: the margins */

typedef struct model {
    const char *name;
    sneppx_config config;
    test_weights weights;
    sneppx_layer *layer;
} model;

static sneppx_config gqa_config(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t window, int qkv_bias,
                                int o_bias)
{
    sneppx_config config;
    sneppx_config_init(&config);
    config.hidden_size = HIDDEN;
    config.num_attention_heads = heads;
    config.num_key_value_heads = kv_heads;
    config.head_dim = head_dim;
    config.sliding_window = window;
    config.qkv_bias = qkv_bias;
    config.o_bias = o_bias;
    config.max_position_embeddings = 4096;
    return config;
}

static sneppx_config mla_config(int64_t q_lora_rank)
{
    sneppx_config config;
    sneppx_config_init(&config);
    snprintf(config.name, sizeof config.name, "mla");
    config.hidden_size = HIDDEN;
    config.num_attention_heads = config.num_key_value_heads = 4;
    config.q_lora_rank = q_lora_rank;
    config.kv_lora_rank = 32;
    config.qk_nope_head_dim = 16;
    config.qk_rope_head_dim = 16;
    config.v_head_dim = 32;
    config.rope_interleaved = 1;
    config.qkv_bias = config.o_bias = 0;
    config.max_position_embeddings = 4096;
    return config;
}

static int model_make(model *m, const char *name, sneppx_config config, uint64_t seed)
{
    memset(m, 0, sizeof *m);
    m->name = name;
    m->config = config;
    if (!TEST_CHECK(&tally, test_weights_random(&m->config, seed, &m->weights) == 0, "%s: weights", name))
        return 0;
    sneppx_status status = sneppx_layer_create(&m->config, &m->weights.view, &m->layer);
    return TEST_CHECK(&tally, status == SNEPPX_OK, "%s: sneppx_layer_create: %s", name, sneppx_last_error());
}

static void model_free(model *m)
{
    sneppx_layer_destroy(m->layer);
    test_weights_free(&m->weights);
}

static sneppx_kv_cache *cache_make_limited(const model *m, int64_t capacity, int64_t page_size, int64_t layers,
                                           int64_t max_sequence_tokens)
{
    sneppx_kv_cache_options options;
    sneppx_kv_cache_options_init(&options);
    options.capacity_tokens = capacity;
    options.max_sequence_tokens = max_sequence_tokens;
    options.page_size = page_size;
    options.num_layers = layers;
    sneppx_kv_cache *cache = NULL;
    sneppx_status status = sneppx_kv_cache_create(&m->config, &options, &cache);
    TEST_CHECK(&tally, status == SNEPPX_OK, "%s: sneppx_kv_cache_create: %s", m->name, sneppx_last_error());
    return cache;
}

static sneppx_kv_cache *cache_make(const model *m, int64_t capacity, int64_t page_size, int64_t layers)
{
    return cache_make_limited(m, capacity, page_size, layers, 0);
}

static int64_t add_sequence(sneppx_kv_cache *cache)
{
    int64_t id = -1;
    TEST_CHECK(&tally, sneppx_kv_cache_add_sequence(cache, &id) == SNEPPX_OK, "add_sequence: %s", sneppx_last_error());
    return id;
}

static float *random_floats(int64_t n, uint64_t seed)
{
    float *x = malloc((size_t)n * sizeof *x);
    test_rng rng = test_rng_seeded(seed);
    if (x)
        test_fill_uniform(&rng, x, n, 1.0f);
    return x;
}

/* max |got - want| / max |want| over n floats. */
static double max_normalized(const float *got, const float *want, int64_t n)
{
    const test_error e = test_compare_float(got, want, n);
    return e.non_finite ? 1e30 : e.max_normalized;
}

/* The cache-free forward of one sequence (batch 1). */
static void full_forward(const model *m, int64_t T, const float *x, const int64_t *positions, const float *mask,
                         float *out)
{
    const int64_t shape[4] = {1, 1, T, T};
    sneppx_status status = sneppx_layer_forward(m->layer, 1, T, x, mask, mask ? shape : NULL, positions, out);
    TEST_CHECK(&tally, status == SNEPPX_OK, "%s: sneppx_layer_forward: %s", m->name, sneppx_last_error());
}

/* Checks got against the cache-free forward (want) and, for the rows given,
 * the float64 reference of the same sequence. */
static void expect_rows(const model *m, const char *what, const float *got, const float *want, int64_t T,
                        const float *x, const int64_t *positions, const float *mask)
{
    const double free_error = max_normalized(got, want, T * HIDDEN);
    worst_cache_free = free_error > worst_cache_free ? free_error : worst_cache_free;
    TEST_CHECK(&tally, free_error <= CACHE_FREE_MAX, "%s %s: vs cache-free forward max normalized %.3e > %.0e",
               m->name, what, free_error, CACHE_FREE_MAX);
    double *reference = malloc((size_t)(T * HIDDEN) * sizeof *reference);
    if (!reference)
        return;
    const char *problem = ref_mha_forward(&m->config, &m->weights.view, 1, T, x, mask, positions, reference);
    if (TEST_CHECK(&tally, problem == NULL, "%s: reference: %s", m->name, problem)) {
        const test_error e = test_compare(got, reference, T * HIDDEN);
        worst_reference = e.max_normalized > worst_reference ? e.max_normalized : worst_reference;
        TEST_CHECK(&tally, e.non_finite == 0 && e.max_normalized <= REFERENCE_MAX,
                   "%s %s: vs float64 reference max normalized %.3e > %.0e", m->name, what, e.max_normalized,
                   REFERENCE_MAX);
    }
    free(reference);
}

/* Feeds tokens [begin, end) of one sequence in one call. */
static int feed(const model *m, sneppx_kv_cache *cache, int64_t layer_index, int64_t id, const float *x,
                const int64_t *positions, const float *mask, int64_t T, int64_t begin, int64_t end, float *out)
{
    const int64_t q_len = end - begin;
    float *plane = NULL;
    if (mask) {
        /* Rows [begin, end) of the whole sequence's [T, T] mask, columns [0, end). */
        plane = malloc((size_t)(q_len * end) * sizeof *plane);
        if (!plane)
            return 0;
        for (int64_t r = 0; r < q_len; r++)
            memcpy(plane + r * end, mask + (begin + r) * T, (size_t)end * sizeof *plane);
    }
    const float *planes[1] = {plane};
    sneppx_status status = sneppx_layer_forward_cached(m->layer, cache, layer_index, 1, &id, &q_len,
                                                       x + begin * HIDDEN, positions ? positions + begin : NULL,
                                                       mask ? planes : NULL, out + begin * HIDDEN);
    free(plane);
    return TEST_CHECK(&tally, status == SNEPPX_OK, "%s: forward_cached [%lld, %lld): %s", m->name, (long long)begin,
                      (long long)end, sneppx_last_error());
}

/* One sequence fed in chunks: sizes from `chunks` (cycled), 0 = random 1..23. */
static void run_chunked(const model *m, int64_t page_size, const char *what, const int64_t *chunks, int chunk_count,
                        int64_t T, const float *x, const int64_t *positions, const float *mask, const float *want,
                        uint64_t seed)
{
    sneppx_kv_cache *cache = cache_make(m, MAX_T, page_size, 1);
    float *got = malloc((size_t)(T * HIDDEN) * sizeof *got);
    if (!cache || !got)
        goto done;
    const int64_t id = add_sequence(cache);
    test_rng rng = test_rng_seeded(seed);
    int ok = 1;
    for (int64_t begin = 0, c = 0; begin < T && ok; c++) {
        int64_t size = chunks[c % chunk_count];
        if (size == 0)
            size = 1 + (int64_t)(test_rng_uniform(&rng) * 23);
        const int64_t end = begin + size < T ? begin + size : T;
        ok = feed(m, cache, 0, id, x, positions, mask, T, begin, end, got);
        begin = end;
    }
    int64_t length = -1;
    sneppx_kv_cache_length(cache, id, &length);
    TEST_CHECK(&tally, length == T, "%s %s: length %lld after %lld tokens", m->name, what, (long long)length,
               (long long)T);
    char label[96];
    snprintf(label, sizeof label, "%s page %lld", what, (long long)page_size);
    if (ok)
        expect_rows(m, label, got, want, T, x, positions, mask);
done:
    free(got);
    sneppx_kv_cache_destroy(cache);
}

/* One-shot, random chunks, prefill + decode; with and without position offsets. */
static void test_sequence_paths(const model *m, int64_t T, uint64_t seed)
{
    float *x = random_floats(T * HIDDEN, seed);
    float *want = malloc((size_t)(T * HIDDEN) * sizeof *want);
    int64_t *positions = malloc((size_t)T * sizeof *positions);
    if (!TEST_CHECK(&tally, x && want && positions, "out of memory"))
        goto done;
    full_forward(m, T, x, NULL, NULL, want);
    const int64_t one_shot[] = {T}, random[] = {0}, prefill_decode[] = {T / 3, 1};
    for (int64_t page_size = 4; page_size <= 16; page_size *= 4) {
        run_chunked(m, page_size, "one-shot", one_shot, 1, T, x, NULL, NULL, want, seed);
        run_chunked(m, page_size, "random chunks", random, 1, T, x, NULL, NULL, want, seed + 1);
    }
    /* prefill then decode: after the first chunk of T/3, one token per call */
    {
        sneppx_kv_cache *cache = cache_make(m, MAX_T, 4, 1);
        float *got = malloc((size_t)(T * HIDDEN) * sizeof *got);
        if (cache && got) {
            const int64_t id = add_sequence(cache);
            int ok = feed(m, cache, 0, id, x, NULL, NULL, T, 0, prefill_decode[0], got);
            for (int64_t t = prefill_decode[0]; t < T && ok; t++)
                ok = feed(m, cache, 0, id, x, NULL, NULL, T, t, t + 1, got);
            if (ok)
                expect_rows(m, "prefill + decode", got, want, T, x, NULL, NULL);
        }
        free(got);
        sneppx_kv_cache_destroy(cache);
    }
    /* position_ids with an offset (a sequence that starts at position 7, stride 1). */
    for (int64_t t = 0; t < T; t++)
        positions[t] = 7 + t;
    full_forward(m, T, x, positions, NULL, want);
    run_chunked(m, 4, "position offset", random, 1, T, x, positions, NULL, want, seed + 2);
done:
    free(x);
    free(want);
    free(positions);
}

/* Bytes malloc has handed out and not had back. */
static size_t heap_in_use(void) { return mallinfo2().uordblks; }

/* Warm decode steps allocate nothing: 3 sequences, pages of 4 tokens, 30 steps
 * after 2 warm ones (every page table sized at add). Then a cache whose
 * max_sequence_tokens (6) a sequence outgrows: its table grows, and prefill +
 * decode still equals the cache-free forward. */
static void test_decode_heap(const model *m, uint64_t seed)
{
    enum { N = 3, PROMPT = 9, WARM = 2, STEPS = 30, T = PROMPT + WARM + STEPS };
    sneppx_kv_cache *cache = cache_make(m, N * MAX_T, 4, 1);
    float *x = random_floats(N * T * HIDDEN, seed);
    float *out = malloc((size_t)(N * T * HIDDEN) * sizeof *out);
    float *step_x = malloc((size_t)(2 * N * HIDDEN) * sizeof *step_x), *step_out = step_x + N * HIDDEN;
    int ok = cache && x && out && step_x;
    int64_t ids[N];
    for (int s = 0; s < N && ok; s++)
        ok = (ids[s] = add_sequence(cache)) >= 0 &&
             feed(m, cache, 0, ids[s], x + s * T * HIDDEN, NULL, NULL, T, 0, PROMPT, out + s * T * HIDDEN);
    size_t heap_before = 0;
    const int64_t ones[N] = {1, 1, 1};
    for (int64_t t = PROMPT; t < T && ok; t++) {
        if (t == PROMPT + WARM)
            heap_before = heap_in_use();
        for (int s = 0; s < N; s++)
            memcpy(step_x + s * HIDDEN, x + (s * T + t) * HIDDEN, HIDDEN * sizeof(float));
        sneppx_status status =
            sneppx_layer_forward_cached(m->layer, cache, 0, N, ids, ones, step_x, NULL, NULL, step_out);
        ok = TEST_CHECK(&tally, status == SNEPPX_OK, "%s decode heap step %lld: %s", m->name, (long long)t,
                        sneppx_last_error());
    }
    if (ok) {
        const long long growth = (long long)heap_in_use() - (long long)heap_before;
        TEST_CHECK(&tally, growth == 0, "%s: %d warm decode steps of %d sequences allocated %lld bytes (want 0)",
                   m->name, STEPS, N, growth);
    }
    sneppx_kv_cache_destroy(cache);

    sneppx_kv_cache *small = cache_make_limited(m, MAX_T, 4, 1, 6);
    float *want = malloc((size_t)(T * HIDDEN) * sizeof *want);
    if (small && want && ok) {
        full_forward(m, T, x, NULL, NULL, want);
        const int64_t id = add_sequence(small);
        ok = feed(m, small, 0, id, x, NULL, NULL, T, 0, 5, out);
        for (int64_t t = 5; t < T && ok; t++)
            ok = feed(m, small, 0, id, x, NULL, NULL, T, t, t + 1, out);
        if (ok)
            expect_rows(m, "past max_sequence_tokens", out, want, T, x, NULL, NULL);
    }
    sneppx_kv_cache_destroy(small);
    free(want);
    free(x);
    free(out);
    free(step_x);
}

/* Explicit masks: causal rows with a random bias and a few extra masked keys;
 * under a window, keys past it masked too (the cache released them). */
static void test_explicit_mask(const model *m, int64_t T, uint64_t seed)
{
    float *x = random_floats(T * HIDDEN, seed), *mask = malloc((size_t)(T * T) * sizeof *mask);
    float *want = malloc((size_t)(T * HIDDEN) * sizeof *want);
    if (!TEST_CHECK(&tally, x && mask && want, "out of memory"))
        goto done;
    test_rng rng = test_rng_seeded(seed);
    const int64_t window = m->config.sliding_window;
    for (int64_t i = 0; i < T; i++)
        for (int64_t j = 0; j < T; j++)
            mask[i * T + j] = j > i || (window > 0 && i - j >= window) || (j < i && test_rng_uniform(&rng) < 0.2)
                                  ? -3.4028235e38f
                                                                              : -2.0f * (float)test_rng_uniform(&rng);
    full_forward(m, T, x, NULL, mask, want);
    const int64_t random[] = {0};
    run_chunked(m, 4, "explicit mask", random, 1, T, x, NULL, mask, want, seed + 3);
done:
    free(x);
    free(mask);
    free(want);
}

/* Four sequences in one call each step, prefills of different lengths first,
 * then decode and chunks mixed, each sequence == its own cache-free forward. */
static void test_ragged(const model *m, uint64_t seed)
{
    enum { N = 4 };
    const int64_t T[N] = {37, 9, 61, 24};
    float *x[N] = {0}, *want[N] = {0}, *got[N] = {0};
    sneppx_kv_cache *cache = cache_make(m, 4 * MAX_T, 4, 1);
    float *batch_x = malloc((size_t)(4 * MAX_T * HIDDEN) * sizeof *batch_x);
    float *batch_out = malloc((size_t)(4 * MAX_T * HIDDEN) * sizeof *batch_out);
    int ok = cache && batch_x && batch_out;
    int64_t ids[N], done[N] = {0};
    for (int s = 0; s < N && ok; s++) {
        x[s] = random_floats(T[s] * HIDDEN, seed + (uint64_t)s);
        want[s] = malloc((size_t)(T[s] * HIDDEN) * sizeof(float));
        got[s] = malloc((size_t)(T[s] * HIDDEN) * sizeof(float));
        ok = x[s] && want[s] && got[s];
        if (ok) {
            full_forward(m, T[s], x[s], NULL, NULL, want[s]);
            ids[s] = add_sequence(cache);
        }
    }
    test_rng rng = test_rng_seeded(seed);
    for (int step = 0; ok; step++) {
        int64_t n = 0, call_ids[N], q_lens[N], rows = 0, owner[N];
        for (int s = 0; s < N; s++) {
            if (done[s] == T[s])
                continue;
            /* step 0: the prefills (whole prompt minus a tail); later: 1 token or a chunk of up to 7. */
            int64_t q = step == 0 ? T[s] * 2 / 3 : (test_rng_uniform(&rng) < 0.5 ? 1 : 1 + (int64_t)(test_rng_uniform(&rng) * 7));
            q = q < 1 ? 1 : q;
            q = done[s] + q > T[s] ? T[s] - done[s] : q;
            memcpy(batch_x + rows * HIDDEN, x[s] + done[s] * HIDDEN, (size_t)(q * HIDDEN) * sizeof(float));
            call_ids[n] = ids[s];
            q_lens[n] = q;
            owner[n++] = s;
            rows += q;
        }
        if (n == 0)
            break;
        sneppx_status status = sneppx_layer_forward_cached(m->layer, cache, 0, n, call_ids, q_lens, batch_x, NULL,
                                                           NULL, batch_out);
        ok = TEST_CHECK(&tally, status == SNEPPX_OK, "%s ragged step %d: %s", m->name, step, sneppx_last_error());
        for (int64_t i = 0, row = 0; i < n && ok; row += q_lens[i], i++) {
            const int s = (int)owner[i];
            memcpy(got[s] + done[s] * HIDDEN, batch_out + row * HIDDEN, (size_t)(q_lens[i] * HIDDEN) * sizeof(float));
            done[s] += q_lens[i];
        }
    }
    for (int s = 0; s < N && ok; s++) {
        char what[64];
        snprintf(what, sizeof what, "ragged batch sequence %d (T %lld)", s, (long long)T[s]);
        expect_rows(m, what, got[s], want[s], T[s], x[s], NULL, NULL);
    }
    for (int s = 0; s < N; s++) {
        free(x[s]);
        free(want[s]);
        free(got[s]);
    }
    free(batch_x);
    free(batch_out);
    sneppx_kv_cache_destroy(cache);
}

/* Fork at a token inside a page; both continue with their own tokens. Then
 * truncate: append junk, roll back, append the real tokens. */
static void test_fork_truncate(const model *m, uint64_t seed)
{
    const int64_t T = 45, P = 22; /* fork after token 22: inside page 5 of 4 tokens */
    float *xa = random_floats(T * HIDDEN, seed), *xb = random_floats(T * HIDDEN, seed + 1);
    float *want_a = malloc((size_t)(T * HIDDEN) * sizeof(float)), *want_b = malloc((size_t)(T * HIDDEN) * sizeof(float));
    float *got_a = malloc((size_t)(T * HIDDEN) * sizeof(float)), *got_b = malloc((size_t)(T * HIDDEN) * sizeof(float));
    float *junk = random_floats(T * HIDDEN, seed + 2);
    sneppx_kv_cache *cache = cache_make(m, 2 * MAX_T, 4, 1);
    if (!TEST_CHECK(&tally, xa && xb && want_a && want_b && got_a && got_b && junk && cache, "out of memory"))
        goto done;
    memcpy(xb, xa, (size_t)(P * HIDDEN) * sizeof(float)); /* b shares a's prefix */
    full_forward(m, T, xa, NULL, NULL, want_a);
    full_forward(m, T, xb, NULL, NULL, want_b);
    const int64_t a = add_sequence(cache);
    int ok = feed(m, cache, 0, a, xa, NULL, NULL, T, 0, P, got_a);
    sneppx_kv_cache_stats before, after;
    sneppx_kv_cache_stats_get(cache, &before);
    int64_t b = -1;
    ok = ok && TEST_CHECK(&tally, sneppx_kv_cache_fork(cache, a, &b) == SNEPPX_OK, "fork: %s", sneppx_last_error());
    sneppx_kv_cache_stats_get(cache, &after);
    TEST_CHECK(&tally, after.free_pages == before.free_pages, "%s: fork took %lld pages, it must share them", m->name,
               (long long)(before.free_pages - after.free_pages));
    memcpy(got_b, got_a, (size_t)(P * HIDDEN) * sizeof(float));
    /* Interleaved: b appends into the shared partial page first, then a. */
    for (int64_t t = P; t < T && ok; t += 5) {
        const int64_t end = t + 5 < T ? t + 5 : T;
        ok = feed(m, cache, 0, b, xb, NULL, NULL, T, t, end, got_b) && feed(m, cache, 0, a, xa, NULL, NULL, T, t, end, got_a);
    }
    if (ok) {
        expect_rows(m, "fork parent", got_a, want_a, T, xa, NULL, NULL);
        expect_rows(m, "fork child", got_b, want_b, T, xb, NULL, NULL);
    }
    /* Truncate: a fresh sequence, P tokens, junk tokens (13, across pages; under a
     * window 1, so that what the next query sees is still held), back to P, then the rest. */
    const int64_t junk_tokens = m->config.sliding_window > 0 ? 1 : 13;
    const int64_t c = add_sequence(cache);
    ok = ok && feed(m, cache, 0, c, xa, NULL, NULL, T, 0, P, got_a);
    float *scratch = malloc((size_t)(T * HIDDEN) * sizeof(float));
    ok = ok && scratch && feed(m, cache, 0, c, junk, NULL, NULL, T, P, P + junk_tokens, scratch);
    ok = ok && TEST_CHECK(&tally, sneppx_kv_cache_truncate(cache, c, P) == SNEPPX_OK, "truncate: %s", sneppx_last_error());
    for (int64_t t = P; t < T && ok; t++)
        ok = feed(m, cache, 0, c, xa, NULL, NULL, T, t, t + 1, got_a);
    if (ok)
        expect_rows(m, "truncate + re-append", got_a, want_a, T, xa, NULL, NULL);
    free(scratch);
    /* Every page returns to the pool once the sequences are gone. */
    sneppx_kv_cache_remove_sequence(cache, a);
    sneppx_kv_cache_remove_sequence(cache, b);
    sneppx_kv_cache_remove_sequence(cache, c);
    sneppx_kv_cache_stats_get(cache, &after);
    TEST_CHECK(&tally, after.free_pages == after.total_pages && after.sequences == 0,
               "%s: %lld of %lld pages free, %lld sequences after removing all", m->name, (long long)after.free_pages,
               (long long)after.total_pages, (long long)after.sequences);
done:
    free(xa), free(xb), free(want_a), free(want_b), free(got_a), free(got_b), free(junk);
    sneppx_kv_cache_destroy(cache);
}

/* A beam: a parent and two forks decode in one call, each writing its next token into
 * the page they share. The pool has room for two more pages, as many as the copies:
 * the first two copy the shared page and the last keeps it, so the call is no "pool
 * full" (were the last to copy too, it would be). Each row must be what its own
 * sequence gives. */
static void test_beam(const model *m, uint64_t seed)
{
    enum { BEAMS = 3 };
    const int64_t P = 22, T = P + 1, page = 4; /* the prompt ends inside page 5 (tokens 20..23) */
    const int64_t prompt_pages = (P + page - 1) / page;
    float *x[BEAMS] = {0}, *want[BEAMS] = {0}, *got = malloc((size_t)(T * HIDDEN) * sizeof *got);
    float *step_x = malloc((size_t)(BEAMS * HIDDEN) * sizeof *step_x);
    float *step_out = malloc((size_t)(BEAMS * HIDDEN) * sizeof *step_out);
    sneppx_kv_cache *cache = cache_make(m, (prompt_pages + BEAMS - 1) * page, page, 2);
    int ok = got && step_x && step_out && cache;
    for (int b = 0; b < BEAMS && ok; b++) {
        x[b] = random_floats(T * HIDDEN, seed + (uint64_t)b);
        want[b] = malloc((size_t)(T * HIDDEN) * sizeof(float));
        ok = x[b] && want[b];
        if (ok) {
            memcpy(x[b], x[0], (size_t)(P * HIDDEN) * sizeof(float)); /* one prompt, three next tokens */
            full_forward(m, T, x[b], NULL, NULL, want[b]);
        }
    }
    int64_t ids[BEAMS] = {-1, -1, -1};
    if (ok)
        ids[0] = add_sequence(cache);
    for (int64_t layer = 0; layer < 2 && ok; layer++) /* a page holds both layers' rows */
        ok = feed(m, cache, layer, ids[0], x[0], NULL, NULL, T, 0, P, got);
    for (int b = 1; b < BEAMS && ok; b++)
        ok = TEST_CHECK(&tally, sneppx_kv_cache_fork(cache, ids[0], &ids[b]) == SNEPPX_OK, "%s: fork: %s", m->name,
                        sneppx_last_error());
    if (ok) {
        const int64_t q_lens[BEAMS] = {1, 1, 1};
        sneppx_kv_cache_stats before, after;
        sneppx_kv_cache_stats_get(cache, &before);
        for (int b = 0; b < BEAMS; b++)
            memcpy(step_x + b * HIDDEN, x[b] + P * HIDDEN, (size_t)HIDDEN * sizeof(float));
        /* Layer 0's step copies the shared page (whole, both layers' rows) for two of the
         * three; layer 1's then finds each page its own. */
        for (int64_t layer = 0; layer < 2 && ok; layer++) {
            sneppx_status status = sneppx_layer_forward_cached(m->layer, cache, layer, BEAMS, ids, q_lens, step_x,
                                                               NULL, NULL, step_out);
            ok = TEST_CHECK(&tally, status == SNEPPX_OK, "%s: %d forks' step into their shared page at layer %lld, "
                            "2 pages free: %s", m->name, BEAMS, (long long)layer, sneppx_last_error());
            for (int b = 0; b < BEAMS && ok; b++) {
                const double error = max_normalized(step_out + b * HIDDEN, want[b] + P * HIDDEN, HIDDEN);
                TEST_CHECK(&tally, error <= CACHE_FREE_MAX, "%s: layer %lld: beam %d's token: %.3g from its own "
                           "sequence (limit %g)", m->name, (long long)layer, b, error, CACHE_FREE_MAX);
            }
        }
        sneppx_kv_cache_stats_get(cache, &after);
        TEST_CHECK(&tally, !ok || after.free_pages == before.free_pages - (BEAMS - 1),
                   "%s: beam step: %lld pages free after it, want %lld", m->name, (long long)after.free_pages,
                   (long long)(before.free_pages - (BEAMS - 1)));
    }
    for (int b = 0; b < BEAMS; b++) {
        free(x[b]);
        free(want[b]);
    }
    free(got);
    free(step_x);
    free(step_out);
    sneppx_kv_cache_destroy(cache);
}

/* SDPA instead of flash, same chunks. */
static void test_sdpa(model *m, uint64_t seed)
{
    const int64_t T = 50;
    float *x = random_floats(T * HIDDEN, seed), *want = malloc((size_t)(T * HIDDEN) * sizeof *want);
    if (TEST_CHECK(&tally, x && want, "out of memory") &&
        TEST_CHECK(&tally, sneppx_layer_set_flash(m->layer, 0) == SNEPPX_OK, "set_flash: %s", sneppx_last_error())) {
        full_forward(m, T, x, NULL, NULL, want);
        const int64_t random[] = {0};
        run_chunked(m, 4, "sdpa random chunks", random, 1, T, x, NULL, NULL, want, seed);
        sneppx_layer_set_flash(m->layer, 1);
    }
    free(x);
    free(want);
}

/* Two layers of one shape in one cache, run in turn as a model runs them. */
static void test_two_layers(const model *first, const model *second, uint64_t seed)
{
    const int64_t T = 30;
    sneppx_kv_cache *cache = cache_make(first, MAX_T, 4, 2);
    float *x = random_floats(T * HIDDEN, seed);
    float *want[2] = {malloc((size_t)(T * HIDDEN) * sizeof(float)), malloc((size_t)(T * HIDDEN) * sizeof(float))};
    float *got[2] = {malloc((size_t)(T * HIDDEN) * sizeof(float)), malloc((size_t)(T * HIDDEN) * sizeof(float))};
    const model *layers[2] = {first, second};
    if (!TEST_CHECK(&tally, cache && x && want[0] && want[1] && got[0] && got[1], "out of memory"))
        goto done;
    const int64_t id = add_sequence(cache);
    int ok = 1;
    for (int64_t t = 0; t < T && ok; t = t == 0 ? 11 : t + 1) {
        const int64_t end = t == 0 ? 11 : t + 1;
        for (int l = 0; l < 2 && ok; l++) {
            ok = feed(layers[l], cache, l, id, x, NULL, NULL, T, t, end, got[l]);
            int64_t length = -1;
            sneppx_kv_cache_layer_length(cache, id, l, &length);
            TEST_CHECK(&tally, length == end, "layer %d length %lld, want %lld", l, (long long)length, (long long)end);
        }
    }
    for (int l = 0; l < 2 && ok; l++) {
        full_forward(layers[l], T, x, NULL, NULL, want[l]);
        expect_rows(layers[l], l ? "layer 1 of 2" : "layer 0 of 2", got[l], want[l], T, x, NULL, NULL);
    }
done:
    free(x), free(want[0]), free(want[1]), free(got[0]), free(got[1]);
    sneppx_kv_cache_destroy(cache);
}

/* Under a window of W a sequence holds, between calls, the pages of its last
 * W - 1 tokens: at most (W - 2) / page_size + 2 pages, so a long decode does not
 * grow the pool. A warm decode step takes back the
 * workspace the step before released. */
static void test_window_pool(const model *m, uint64_t seed)
{
    const int64_t W = m->config.sliding_window, page = 4, T = 300;
    sneppx_kv_cache *cache = cache_make(m, 64, page, 1);
    float *x = random_floats(T * HIDDEN, seed), *got = malloc((size_t)(T * HIDDEN) * sizeof *got);
    if (!TEST_CHECK(&tally, cache && x && got, "out of memory"))
        goto done;
    const int64_t id = add_sequence(cache);
    sneppx_kv_cache_stats stats;
    int64_t most_held = 0;
    int ok = 1;
    const struct sneppx_workspace *previous = NULL;
    int same_workspace = 1;
    for (int64_t t = 0; t < T && ok; t++) {
        ok = feed(m, cache, 0, id, x, NULL, NULL, T, t, t + 1, got);
        sneppx_kv_cache_stats_get(cache, &stats);
        const int64_t held = (stats.total_pages - stats.free_pages) * page;
        most_held = held > most_held ? held : most_held;
        /* The keys a step gathers stay below 64 (W + page + 1): the same workspace every step. */
        if (t > 0 && m->layer->free_workspaces != previous)
            same_workspace = 0;
        previous = m->layer->free_workspaces;
    }
    const int64_t bound = ((W - 2) / page + 2) * page;
    TEST_CHECK(&tally, ok && most_held <= bound && most_held >= W - 1,
               "%s: %lld tokens of pages held at most, want in [%lld, %lld] (window %lld, page %lld)", m->name,
               (long long)most_held, (long long)(W - 1), (long long)bound, (long long)W, (long long)page);
    TEST_CHECK(&tally, same_workspace, "%s: a warm decode step made a new workspace", m->name);
    /* The tail of the 300-token decode still matches the whole-sequence forward. */
    float *want = malloc((size_t)(T * HIDDEN) * sizeof *want);
    if (ok && want) {
        full_forward(m, T, x, NULL, NULL, want);
        const double error = max_normalized(got, want, T * HIDDEN);
        TEST_CHECK(&tally, error <= CACHE_FREE_MAX, "%s window decode of %lld: max normalized %.3e", m->name,
                   (long long)T, error);
    }
    free(want);
done:
    free(x);
    free(got);
    sneppx_kv_cache_destroy(cache);
}

/* ---- calls on different sequences at once ---- */

struct decoder {
    const model *m;
    sneppx_kv_cache *cache;
    int64_t id, T;
    const float *x;
    float *got;
    int ok;
};

static void *decode_thread(void *arg)
{
    struct decoder *d = arg;
    const int64_t prefill = 10;
    d->ok = sneppx_layer_forward_cached(d->m->layer, d->cache, 0, 1, &d->id, &prefill, d->x, NULL, NULL, d->got) ==
            SNEPPX_OK;
    for (int64_t t = prefill; t < d->T && d->ok; t++) {
        const int64_t one = 1;
        d->ok = sneppx_layer_forward_cached(d->m->layer, d->cache, 0, 1, &d->id, &one, d->x + t * HIDDEN, NULL, NULL,
                                            d->got + t * HIDDEN) == SNEPPX_OK;
    }
    return NULL;
}

struct churner {
    const model *m;
    sneppx_kv_cache *cache;
    int rounds, ok;
};

static void *churn_thread(void *arg)
{
    struct churner *c = arg;
    float x[9 * HIDDEN], y[9 * HIDDEN];
    test_rng rng = test_rng_seeded(3);
    test_fill_uniform(&rng, x, 9 * HIDDEN, 1.0f);
    c->ok = 1;
    for (int r = 0; r < c->rounds && c->ok; r++) {
        int64_t id = -1, child = -1;
        const int64_t q = 9;
        c->ok = sneppx_kv_cache_add_sequence(c->cache, &id) == SNEPPX_OK &&
                sneppx_layer_forward_cached(c->m->layer, c->cache, 0, 1, &id, &q, x, NULL, NULL, y) == SNEPPX_OK &&
                sneppx_kv_cache_fork(c->cache, id, &child) == SNEPPX_OK &&
                sneppx_layer_forward_cached(c->m->layer, c->cache, 0, 1, &child, &q, x, NULL, NULL, y) == SNEPPX_OK &&
                sneppx_kv_cache_truncate(c->cache, child, 3) == SNEPPX_OK &&
                sneppx_kv_cache_remove_sequence(c->cache, id) == SNEPPX_OK &&
                sneppx_kv_cache_remove_sequence(c->cache, child) == SNEPPX_OK;
    }
    return NULL;
}

static void test_concurrent(const model *m, uint64_t seed)
{
    enum { DECODERS = 2 };
    const int64_t T = 40;
    sneppx_kv_cache *cache = cache_make(m, 4 * MAX_T, 4, 1);
    struct decoder d[DECODERS];
    float *want[DECODERS] = {NULL};
    struct churner churner = {m, cache, 20, 0};
    memset(d, 0, sizeof d);
    int ok = cache != NULL;
    for (int i = 0; i < DECODERS && ok; i++) {
        d[i] = (struct decoder){m, cache, add_sequence(cache), T, random_floats(T * HIDDEN, seed + (uint64_t)i),
                                malloc((size_t)(T * HIDDEN) * sizeof(float)), 0};
        want[i] = malloc((size_t)(T * HIDDEN) * sizeof(float));
        ok = TEST_CHECK(&tally, d[i].x && d[i].got && want[i], "out of memory");
        if (ok)
            full_forward(m, T, d[i].x, NULL, NULL, want[i]);
    }
    pthread_t threads[DECODERS + 1];
    for (int i = 0; i < DECODERS && ok; i++)
        pthread_create(&threads[i], NULL, decode_thread, &d[i]);
    if (ok)
        pthread_create(&threads[DECODERS], NULL, churn_thread, &churner);
    for (int i = 0; i <= DECODERS && ok; i++)
        pthread_join(threads[i], NULL);
    TEST_CHECK(&tally, !ok || churner.ok, "%s: the churning thread's calls failed", m->name);
    for (int i = 0; i < DECODERS && ok; i++) {
        TEST_CHECK(&tally, d[i].ok, "%s: decoder %d failed: a concurrent call broke it", m->name, i);
        const double error = max_normalized(d[i].got, want[i], T * HIDDEN);
        TEST_CHECK(&tally, error <= CACHE_FREE_MAX, "%s concurrent decoder %d: max normalized %.3e", m->name, i, error);
    }
    for (int i = 0; i < DECODERS && cache; i++) {
        free((void *)d[i].x);
        free(d[i].got);
        free(want[i]);
    }
    sneppx_kv_cache_destroy(cache);
}

int main(void)
{
    struct {
        const char *name;
        sneppx_config config;
    } configs[] = {
        {"llama g1", gqa_config(4, 4, 16, 0, 0, 0)},
        {"llama g2", gqa_config(4, 2, 32, 0, 0, 0)},
        {"llama g4", gqa_config(8, 2, 16, 0, 0, 0)},
        {"llama g8", gqa_config(8, 1, 16, 0, 0, 0)},
        {"mistral w13", gqa_config(4, 2, 16, 13, 0, 0)},
        {"qwen2 bias", gqa_config(4, 2, 16, 0, 1, 0)},
        {"deepseek mla", mla_config(0)},
        {"deepseek mla q-lora", mla_config(24)},
    };
    const int count = (int)(sizeof configs / sizeof configs[0]);
    for (int i = 0; i < count; i++) {
        model m;
        if (model_make(&m, configs[i].name, configs[i].config, 1000 + (uint64_t)i)) {
            test_sequence_paths(&m, i % 2 ? 61 : 47, 10 * (uint64_t)i);
            if (i == 1 || i == 4 || i == 6) {
                test_ragged(&m, 20 * (uint64_t)i);
                test_fork_truncate(&m, 30 * (uint64_t)i);
                test_beam(&m, 35 * (uint64_t)i);
                test_explicit_mask(&m, 40, 40 * (uint64_t)i);
                test_sdpa(&m, 50 * (uint64_t)i);
            }
            if (configs[i].config.sliding_window > 0)
                test_window_pool(&m, 60);
            if (i == 2) {
                test_concurrent(&m, 80);
                test_decode_heap(&m, 90);
            }
            if (i == 5) {
                model second;
                if (model_make(&second, "qwen2 bias (second layer)", configs[i].config, 77)) {
                    test_two_layers(&m, &second, 70);
                    model_free(&second);
                }
            }
        }
        model_free(&m);
        printf("[%s] done: %d passed, %d failed so far\n", configs[i].name, tally.passed, tally.failed);
        fflush(stdout);
    }
    printf("worst max normalized error: vs cache-free forward %.2e (limit %.0e), vs float64 reference %.2e (limit %.0e)\n",
           worst_cache_free, CACHE_FREE_MAX, worst_reference, REFERENCE_MAX);
    return test_finish(&tally);
}
