/* The C API at the edges of its legal ranges: arguments that are legal but
 * huge must answer at once (not loop or allocate per unit of the argument),
 * and arguments that are not legal must be refused naming the field.
 *
 *   flops        sneppx_layer_flops(layer, 1, INT64_MAX) returns at once, and
 *                for valid sizes equals the per-row count it replaced
 *   rope         one token at a far position (max_position_embeddings 2^40)
 *                gets its cos/sin row without a table of every earlier
 *                position, bitwise equal to the cached rows' formula
 *   yarn         past that cache, rows carry YaRN's attention factor as cached
 *                rows do: a sequence at positions 1000+i and the same one past
 *                the cache give the same output (RoPE is relative), and both
 *                match the float64 reference
 *   threads      num_threads 1: creating a layer (synthetic weights, packing,
 *                RoPE tables) and a forward start no thread beside the caller
 *                (they ran OpenMP's default pool, every core, before)
 */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layer_internal.h"
#include "rope_tables.h"
#include "mha_reference.h"
#include "sneppx/sneppx.h"
#include "test_forward_case.h"
#include "test_util.h"
#include "test_weights.h"

static test_tally tally;

/* GQA 4/2, head_dim 16: small enough to compile in a blink. */
static void small_config(sneppx_config *config, int64_t window, int64_t max_positions)
{
    sneppx_config_init(config);
    config->hidden_size = 64;
    config->num_attention_heads = 4;
    config->num_key_value_heads = 2;
    config->head_dim = 16;
    config->sliding_window = window;
    config->max_position_embeddings = max_positions;
}

static sneppx_layer *make_layer(const sneppx_config *config)
{
    sneppx_layer *layer = NULL;
    if (!TEST_CHECK(&tally, sneppx_layer_create(config, NULL, &layer) == SNEPPX_OK, "layer: %s",
                    sneppx_last_error()))
        return NULL;
    return layer;
}

/* ---- flops ------------------------------------------------------------------------ */

/* The count the runtime used to make, one row at a time. */
static double pairs_by_rows(int64_t seq_len, int64_t window)
{
    double pairs = 0;
    for (int64_t i = 0; i < seq_len; i++)
        pairs += (double)(window > 0 && i + 1 > window ? window : i + 1);
    return pairs;
}

static void test_flops(void)
{
    const int64_t windows[] = {0, 1, 7, 100};
    for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++) {
        sneppx_config config;
        small_config(&config, windows[w], 4096);
        sneppx_layer *layer = make_layer(&config);
        if (!layer)
            return;
        /* hidden 64; qkv 64 + 2*32 = 128; attention dim 64; 4 heads of d = dv = 16. */
        const int64_t sizes[][2] = {{1, 1}, {1, 6}, {2, 7}, {3, 8}, {1, 99}, {2, 100}, {1, 101}, {5, 4096}};
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            const double batch = (double)sizes[s][0], tokens = batch * (double)sizes[s][1];
            const double want = 2 * tokens * 64 * 64 + 2 * tokens * 64 * 128 +
                                2 * batch * 4 * pairs_by_rows(sizes[s][1], windows[w]) * 32;
            const double got = sneppx_layer_flops(layer, sizes[s][0], sizes[s][1]);
            TEST_CHECK(&tally, got == want, "flops(batch %lld, seq %lld, window %lld) = %.17g, want %.17g",
                       (long long)sizes[s][0], (long long)sizes[s][1], (long long)windows[w], got, want);
        }
        /* The largest arguments: closed form (a row loop took 1.5 s at 2^31 and never
         * returned here; ctest's timeout catches that). */
        const double huge = sneppx_layer_flops(layer, 1, INT64_MAX);
        const double again = sneppx_layer_flops(layer, INT64_MAX, INT64_MAX);
        const long double n = (long double)INT64_MAX;
        const long double pairs = windows[w] > 0 ? (n - windows[w]) * windows[w] + windows[w] * (windows[w] + 1) / 2.0L
                                                 : n * (n + 1) / 2;
        const double want = (double)(2 * n * 64 * 64 + 2 * n * 64 * 128 + 2 * 4 * pairs * 32);
        TEST_CHECK(&tally, fabs(huge - want) <= 1e-12 * want && isfinite(again) && again > huge,
                   "flops(1, INT64_MAX) window %lld: %.17g (want %.17g), flops(INT64_MAX, INT64_MAX) %g",
                   (long long)windows[w], huge, want, again);
        sneppx_layer_destroy(layer);
    }
}

/* ---- rope ------------------------------------------------------------------------- */

/* YaRN without an mscale pair: cos/sin carry 0.1 ln 4 + 1, not 1. */
static void yarn_scaling(sneppx_config *config)
{
    config->rope_scaling.type = SNEPPX_ROPE_YARN;
    config->rope_scaling.factor = 4.0;
    config->rope_scaling.original_max_position_embeddings = 4096;
    config->rope_scaling.beta_fast = 32.0;
    config->rope_scaling.beta_slow = 1.0;
}

/* One far token: its row equals cos/sin(position * inv_freq) * factor computed
 * in double and rounded once, as every cached row is; the cache stays bounded. */
static void test_rope_far_positions(int yarn)
{
    sneppx_config config;
    small_config(&config, 0, (int64_t)1 << 40);
    if (yarn)
        yarn_scaling(&config);
    sneppx_layer *layer = make_layer(&config);
    if (!layer)
        return;
    double inv_freq[8], factor = 0;
    if (!TEST_CHECK(&tally, sneppx_config_rope_frequencies(&config, 1, inv_freq, 8, &factor) == SNEPPX_OK, "%s",
                    sneppx_last_error()))
        goto done;
    const int64_t limit = sneppx_rope_cache_limit(layer);
    TEST_CHECK(&tally, limit > 0 && limit * 2 * 8 * (int64_t)sizeof(float) <= SNEPPX_ROPE_CACHE_BYTES,
               "cache limit %lld positions of 8 pairs exceeds %lld bytes", (long long)limit,
               (long long)SNEPPX_ROPE_CACHE_BYTES);
    /* Cached and direct rows in one call, in both orders, and far past the cache. */
    const int64_t positions[] = {0,         5,         limit - 1,           limit,        limit + 1,
                                 1 << 24,   3,         (int64_t)1 << 28,    ((int64_t)1 << 40) - 1,
                                 limit - 2, 123456789, ((int64_t)1 << 40) - 2};
    enum { COUNT = sizeof positions / sizeof positions[0] };
    float cos_rows[COUNT * 8], sin_rows[COUNT * 8];
    /* One far token alone first: before the bound this filled 2^40 positions,
     * then the whole bounded cache, though no token read a cached row. */
    sneppx_status status = sneppx_rope_tables(layer, 1, 1, &positions[8], positions[8], cos_rows, sin_rows);
    TEST_CHECK(&tally, status == SNEPPX_OK && layer->cached_positions == 0,
               "one token at 2^40 - 1: %s (%s), %lld positions cached", sneppx_status_name(status),
               sneppx_last_error(), (long long)layer->cached_positions);
    status = sneppx_rope_tables(layer, COUNT, COUNT, positions, ((int64_t)1 << 40) - 1, cos_rows, sin_rows);
    TEST_CHECK(&tally, status == SNEPPX_OK, "mixed positions: %s", sneppx_last_error());
    TEST_CHECK(&tally, layer->cached_positions <= limit, "cache grew to %lld positions, limit %lld",
               (long long)layer->cached_positions, (long long)limit);
    int mismatches = 0;
    for (int t = 0; t < COUNT; t++)
        for (int i = 0; i < 8; i++) {
            const double angle = (double)positions[t] * inv_freq[i];
            const float want_cos = (float)(cos(angle) * factor), want_sin = (float)(sin(angle) * factor);
            if (memcmp(&cos_rows[t * 8 + i], &want_cos, sizeof(float)) != 0 ||
                memcmp(&sin_rows[t * 8 + i], &want_sin, sizeof(float)) != 0) {
                if (mismatches++ < 4)
                    printf("  position %lld pair %d: cos %.9g sin %.9g, want %.9g %.9g\n", (long long)positions[t],
                           i, cos_rows[t * 8 + i], sin_rows[t * 8 + i], want_cos, want_sin);
            }
        }
    TEST_CHECK(&tally, mismatches == 0, "%s: %d cos/sin values differ from the double-precision formula (factor %.17g)",
               yarn ? "yarn" : "default", mismatches, factor);
    TEST_CHECK(&tally, !yarn || fabs(factor - (0.1 * log(4.0) + 1.0)) < 1e-12, "yarn attention factor %.17g",
               factor);

    /* Through the public forward: one token at the last legal position. */
    float hidden[64], out[64];
    for (int i = 0; i < 64; i++)
        hidden[i] = (float)(i % 7) * 0.1f - 0.3f;
    const int64_t far = ((int64_t)1 << 40) - 1;
    status = sneppx_layer_forward(layer, 1, 1, hidden, NULL, NULL, &far, out);
    int finite = 1;
    for (int i = 0; i < 64; i++)
        finite &= isfinite(out[i]) != 0;
    TEST_CHECK(&tally, status == SNEPPX_OK && finite, "forward at position 2^40 - 1: %s (%s)",
               sneppx_status_name(status), sneppx_last_error());
done:
    sneppx_layer_destroy(layer);
}

/* A sequence at positions 1000+i and the same sequence past the cache: RoPE is
 * relative, so the outputs agree (flash vs SDPA budget), and each matches the
 * float64 reference (tests/support/test_forward_case.h's budget). */
static void test_yarn_past_the_cache(void)
{
    enum { SEQ = 24, HIDDEN = 64 };
    sneppx_config config;
    small_config(&config, 0, (int64_t)1 << 40);
    yarn_scaling(&config);
    test_weights weights;
    if (!TEST_CHECK(&tally, test_weights_random(&config, 0xfa7, &weights) == 0, "weights: out of memory"))
        return;
    sneppx_layer *layer = NULL;
    if (!TEST_CHECK(&tally, sneppx_layer_create(&config, &weights.view, &layer) == SNEPPX_OK, "layer: %s",
                    sneppx_last_error())) {
        test_weights_free(&weights);
        return;
    }
    const int64_t limit = sneppx_rope_cache_limit(layer);
    static float hidden[SEQ * HIDDEN], near_out[SEQ * HIDDEN], far_out[SEQ * HIDDEN];
    static double near_want[SEQ * HIDDEN], far_want[SEQ * HIDDEN];
    test_rng rng = test_rng_seeded(11);
    test_fill_uniform(&rng, hidden, SEQ * HIDDEN, 1.0f);
    int64_t near[SEQ], far[SEQ];
    for (int64_t i = 0; i < SEQ; i++) {
        near[i] = 1000 + i;
        far[i] = limit + 1000 + i;
    }
    sneppx_status status = sneppx_layer_forward(layer, 1, SEQ, hidden, NULL, NULL, near, near_out);
    if (status == SNEPPX_OK)
        status = sneppx_layer_forward(layer, 1, SEQ, hidden, NULL, NULL, far, far_out);
    TEST_CHECK(&tally, status == SNEPPX_OK, "yarn forward: %s", sneppx_last_error());
    TEST_CHECK(&tally, layer->cached_positions <= limit && far[0] >= limit,
               "positions from %lld must be past the cache (%lld positions)", (long long)far[0], (long long)limit);
    const char *problem = ref_mha_forward(&config, &weights.view, 1, SEQ, hidden, NULL, near, near_want);
    if (!problem)
        problem = ref_mha_forward(&config, &weights.view, 1, SEQ, hidden, NULL, far, far_want);
    TEST_CHECK(&tally, problem == NULL, "reference: %s", problem);
    const test_error shifted = test_compare_float(far_out, near_out, SEQ * HIDDEN);
    TEST_CHECK(&tally, test_error_within(&shifted, TEST_PAIR_MAX_NORMALIZED, TEST_PAIR_RMS_RELATIVE),
               "yarn: positions %lld+i (past the cache) vs 1000+i: max %.2e rms %.2e (limits %.0e / %.0e)",
               (long long)far[0], shifted.max_normalized, shifted.rms_relative, TEST_PAIR_MAX_NORMALIZED,
               TEST_PAIR_RMS_RELATIVE);
    const test_error near_error = test_compare(near_out, near_want, SEQ * HIDDEN);
    const test_error far_error = test_compare(far_out, far_want, SEQ * HIDDEN);
    TEST_CHECK(&tally, test_error_within(&near_error, TEST_REF_MAX_NORMALIZED, TEST_REF_RMS_RELATIVE) &&
                           test_error_within(&far_error, TEST_REF_MAX_NORMALIZED, TEST_REF_RMS_RELATIVE),
               "yarn vs reference: cached positions max %.2e rms %.2e, past the cache max %.2e rms %.2e",
               near_error.max_normalized, near_error.rms_relative, far_error.max_normalized,
               far_error.rms_relative);
    sneppx_layer_destroy(layer);
    test_weights_free(&weights);
}

/* ---- threads ---------------------------------------------------------------------- */

static int threads_of_this_process(void)
{
    int count = 0;
    DIR *tasks = opendir("/proc/self/task");
    for (struct dirent *task; tasks && (task = readdir(tasks)) != NULL;)
        count += task->d_name[0] != '.';
    if (tasks)
        closedir(tasks);
    return count;
}

/* ThreadSanitizer starts a thread of its own at a process's first pthread_create (the
 * JIT's code generation makes one): a build with it counts one more. */
#if defined(__SANITIZE_THREAD__)
#define SANITIZER_THREADS 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SANITIZER_THREADS 1
#endif
#endif
#ifndef SANITIZER_THREADS
#define SANITIZER_THREADS 0
#endif

/* First in main: OpenMP starts its pool at the first region with more than
 * one thread, and keeps it, so a later check would see earlier tests' pool. */
static void test_one_thread(void)
{
    const int before = threads_of_this_process();
    sneppx_config config;
    small_config(&config, 0, 4096);
    config.rope_scaling.type = SNEPPX_ROPE_DYNAMIC; /* the per-call table path too */
    config.rope_scaling.factor = 2.0;
    config.num_threads = 1;
    sneppx_layer *layer = make_layer(&config);
    if (!layer)
        return;
    float hidden[2 * 64], out[2 * 64];
    for (int i = 0; i < 2 * 64; i++)
        hidden[i] = (float)(i % 5) * 0.1f;
    const int64_t positions[] = {0, 5000}; /* past max_position_embeddings: dynamic NTK */
    sneppx_status status = sneppx_layer_forward(layer, 1, 2, hidden, NULL, NULL, NULL, out);
    if (status == SNEPPX_OK)
        status = sneppx_layer_forward(layer, 1, 2, hidden, NULL, NULL, positions, out);
    TEST_CHECK(&tally, status == SNEPPX_OK && before == 1 && threads_of_this_process() <= 1 + SANITIZER_THREADS,
               "num_threads 1: %s (%s), threads %d before, %d after", sneppx_status_name(status),
               sneppx_last_error(), before, threads_of_this_process());
    sneppx_layer_destroy(layer);
}

int main(void)
{
    test_one_thread();
    test_flops();
    test_rope_far_positions(0);
    test_rope_far_positions(1);
    test_yarn_past_the_cache();
    return test_finish(&tally);
}
