/* The C API at the edges of its legal ranges: arguments that are legal but
 * huge must answer at once (not loop or allocate per unit of the argument),
 * and arguments that are not legal must be refused naming the field.
 *
 *   flops        sneppx_layer_flops(layer, 1, INT64_MAX) returns at once, and
 *                for valid sizes equals the per-row count it replaced
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sneppx/sneppx.h"
#include "test_util.h"

static test_tally tally;

static double now_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

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
        /* The largest arguments: closed form, so at once (the row loop took 1.5 s at 2^31). */
        const double start = now_seconds();
        const double huge = sneppx_layer_flops(layer, 1, INT64_MAX);
        const double again = sneppx_layer_flops(layer, INT64_MAX, INT64_MAX);
        const double seconds = now_seconds() - start;
        const long double n = (long double)INT64_MAX;
        const long double pairs = windows[w] > 0 ? (n - windows[w]) * windows[w] + windows[w] * (windows[w] + 1) / 2.0L
                                                 : n * (n + 1) / 2;
        const double want = (double)(2 * n * 64 * 64 + 2 * n * 64 * 128 + 2 * 4 * pairs * 32);
        TEST_CHECK(&tally, seconds < 0.5 && fabs(huge - want) <= 1e-12 * want && isfinite(again) && again > huge,
                   "flops(1, INT64_MAX) window %lld: %.17g (want %.17g), flops(INT64_MAX, INT64_MAX) %g, %.3f s",
                   (long long)windows[w], huge, want, again, seconds);
        sneppx_layer_destroy(layer);
    }
}

int main(void)
{
    test_flops();
    return test_finish(&tally);
}
