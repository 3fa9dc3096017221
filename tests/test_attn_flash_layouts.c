/* attn_flash called directly, against a float64 reference computed here, with K
 * and V laid out three ways, as callers hand them over:
 *   - token-major rows of all heads ([T][kv_heads x d], 4 KiB-like strides: the
 *     kernel copies each V tile into contiguous rows first);
 *   - one head's rows contiguous ([kv_heads][T][d], v_stride == v_head_dim: V is
 *     read in place);
 *   - K and V interleaved in one [T][q | k | v] buffer (a layer's projection).
 * Shapes cross every tile edge: T not a multiple of the 64-key tile or the query
 * block, groups 1, 3, 4 and 7 (block rows that leave 1 or 2 row vectors for the
 * narrower register tiles), causal with and without a window, an explicit mask
 * with a fully masked row, and one laid out in 64-key stripes so that the kernel's
 * tiles meet every kind of mask tile: all 0, hiding every key (its keys' K and V
 * rows hold NaN and infinities, which must not reach any row), adding biases and
 * hiding none, and mixed; sequences long enough for the kernel's taller blocks, and
 * chunked prefills (queries after cached positions) across and past where they begin.
 * Each target the host runs (v16 and v8 on AVX-512 hosts).
 * The three layouts must also agree with each other to the last bit: the copy
 * changes where V is read from, not the arithmetic. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host.h"
#include "kernel_args.h"
#include "kernels.h"
#include "mha_reference.h"
#include "test_util.h"

/* fp32 against float64: dot products over up to 64 dims, softmax over up to 2300 keys. */
#define REF_TOL 2e-5
/* Keys past SNEPPX_ATTN_LONG_BLOCK_KEYS by more than a block, not a multiple of a tile. */
#define LONG_T (SNEPPX_ATTN_LONG_BLOCK_KEYS + 237)

enum layout { TOKEN_MAJOR, HEAD_MAJOR, PROJECTION, LAYOUT_COUNT };
static const char *const layout_names[] = {"token-major", "head-major", "projection"};

/* An explicit mask: random entries, or one in stripes of the 64-key tile (fill_mask). */
enum mask_fill { MASK_RANDOM, MASK_STRIPES };

struct shape {
    int64_t head_dim, group, kv_heads, seq_len, window, mask_mode;
    enum mask_fill mask_fill;
    /* Cached positions before the queries (a chunked prefill): the kernel gets the
     * last seq_len - past queries against all seq_len keys. */
    int64_t past;
};

/* Keys of the stripe whose mask hides them from every query (MASK_STRIPES). */
#define HIDDEN_STRIPE_BEGIN 192
#define HIDDEN_STRIPE_END 256

/* MASK_RANDOM: random hidden keys (30%) and biases, row 1 fully masked. MASK_STRIPES,
 * by key: [0, 64) all 0; [64, 128) hidden before query 150 and 0 from it (the query
 * block across 150 is mixed); [128, 192) biases, none hidden; [192, 256) hidden
 * from every query; from 256 random as MASK_RANDOM. */
static void fill_mask(const struct shape *s, test_rng *rng, float *mask)
{
    const int64_t t = s->seq_len;
    for (int64_t i = 0; i < t; i++)
        for (int64_t j = 0; j < t; j++) {
            const float random = i == 1 || test_rng_uniform(rng) < 0.3 ? -3.4e38f : test_rng_symmetric(rng, 1.0f);
            float entry = random;
            if (s->mask_fill == MASK_STRIPES) {
                if (j < 64)
                    entry = 0.0f;
                else if (j < 128)
                    entry = i < 150 ? -3.4e38f : 0.0f;
                else if (j < HIDDEN_STRIPE_BEGIN)
                    entry = test_rng_symmetric(rng, 1.0f);
                else if (j < HIDDEN_STRIPE_END)
                    entry = -INFINITY;
            }
            mask[i * t + j] = entry;
        }
}

static test_tally tally;

/* o[i][h][e] for query head h of K/V head h / group, in float64 (mha_reference.c). */
static void reference(const struct shape *s, const float *q, const float *k, const float *v, const float *mask,
                      double *o)
{
    const int64_t d = s->head_dim, heads = s->kv_heads * s->group, t = s->seq_len;
    const int64_t q_floats = t * heads * d, kv_floats = t * s->kv_heads * d;
    double *qd = malloc((size_t)q_floats * sizeof(double)), *kd = malloc((size_t)kv_floats * sizeof(double));
    double *vd = malloc((size_t)kv_floats * sizeof(double));
    for (int64_t i = 0; i < q_floats; i++)
        qd[i] = q[i];
    for (int64_t i = 0; i < kv_floats; i++) {
        kd[i] = k[i];
        vd[i] = v[i];
    }
    for (int64_t h = 0; h < heads; h++) {
        const int64_t kv = h / s->group;
        ref_attention_head(qd + h * d, heads * d, kd + kv * d, s->kv_heads * d, vd + kv * d, s->kv_heads * d, t, d,
                           d, 1.0 / sqrt((double)d), s->mask_mode == SNEPPX_MASK_EXPLICIT ? mask : NULL, s->window,
                           o + h * d, heads * d);
    }
    free(vd);
    free(kd);
    free(qd);
}

/* Runs the kernel over every K/V head, with K and V (token-major in k, v) copied
 * into `layout` first; o comes out token-major [T][heads x d]. */
static void run(const sneppx_kernel *kernel, const struct shape *s, enum layout layout, const float *q,
                const float *k, const float *v, const float *mask, float *o)
{
    const int64_t d = s->head_dim, t = s->seq_len, kvh = s->kv_heads, q_width = kvh * s->group * d;
    const int64_t width = layout == PROJECTION ? q_width + 2 * kvh * d : kvh * d;
    float *kb = calloc((size_t)(t * width), sizeof(float)), *vb = layout == PROJECTION ? kb : calloc((size_t)(t * width), sizeof(float));
    const int64_t scratch_floats = sneppx_attn_flash_scratch_floats(s->group, d, d);
    float *scratch = aligned_alloc(64, (size_t)((scratch_floats * 4 + 63) / 64 * 64));
    for (int64_t j = 0; j < t; j++)
        for (int64_t h = 0; h < kvh; h++)
            for (int64_t x = 0; x < d; x++) {
                const float kx = k[(j * kvh + h) * d + x], vx = v[(j * kvh + h) * d + x];
                if (layout == TOKEN_MAJOR) {
                    kb[j * width + h * d + x] = kx;
                    vb[j * width + h * d + x] = vx;
                } else if (layout == HEAD_MAJOR) {
                    kb[(h * t + j) * d + x] = kx;
                    vb[(h * t + j) * d + x] = vx;
                } else {
                    kb[j * width + q_width + h * d + x] = kx;
                    kb[j * width + q_width + kvh * d + h * d + x] = vx;
                }
            }
    for (int64_t h = 0; h < kvh; h++) {
        struct sneppx_args args = sneppx_kernel_args();
        args.row_begin = 0;
        args.row_end = t - s->past;
        args.q = q + s->past * q_width + h * s->group * d;
        args.q_stride = q_width;
        args.o = o + s->past * q_width + h * s->group * d;
        args.o_stride = q_width;
        if (layout == HEAD_MAJOR) {
            args.k = kb + h * t * d;
            args.v = vb + h * t * d;
            args.k_stride = args.v_stride = d;
        } else {
            args.k = kb + (layout == PROJECTION ? q_width : 0) + h * d;
            args.v = vb + (layout == PROJECTION ? q_width + kvh * d : 0) + h * d;
            args.k_stride = args.v_stride = width;
        }
        args.q_len = t - s->past;
        args.kv_len = t;
        args.softmax_scale = 1.0f / sqrtf((float)d);
        args.mask = mask ? mask + s->past * t : NULL;
        args.mask_stride = t;
        args.scratch = scratch;
        kernel->entry[SNEPPX_ENTRY_RUN](&args);
    }
    free(scratch);
    if (vb != kb)
        free(vb);
    free(kb);
}

static void test_shape(const struct shape *s, const struct sneppx_target *target, test_rng *rng)
{
    const int64_t values[] = {s->head_dim, s->head_dim, s->group, s->window, s->mask_mode};
    const sneppx_kernel *kernel = NULL;
    const sneppx_status status = sneppx_kernel_resolve("attn_flash", values, target, &kernel);
    if (!TEST_CHECK(&tally, status == SNEPPX_OK, "resolve attn_flash d%lld g%lld on %s: %s", (long long)s->head_dim,
                    (long long)s->group, target->name, sneppx_last_error()))
        return;
    const int64_t d = s->head_dim, t = s->seq_len, heads = s->kv_heads * s->group;
    const int64_t q_floats = t * heads * d, kv_floats = t * s->kv_heads * d;
    float *q = malloc((size_t)q_floats * sizeof(float)), *k = malloc((size_t)kv_floats * sizeof(float));
    float *v = malloc((size_t)kv_floats * sizeof(float)), *mask = malloc((size_t)(t * t) * sizeof(float));
    double *want = malloc((size_t)q_floats * sizeof(double));
    float *got[LAYOUT_COUNT];
    for (int l = 0; l < LAYOUT_COUNT; l++)
        got[l] = calloc((size_t)q_floats, sizeof(float));
    test_fill_uniform(rng, q, q_floats, 1.0f);
    test_fill_uniform(rng, k, kv_floats, 1.0f);
    test_fill_uniform(rng, v, kv_floats, 1.0f);
    fill_mask(s, rng, mask);
    /* Keys no query sees hold what would poison every row that touched them. */
    if (s->mask_fill == MASK_STRIPES)
        for (int64_t j = HIDDEN_STRIPE_BEGIN; j < HIDDEN_STRIPE_END && j < t; j++)
            for (int64_t x = 0; x < s->kv_heads * d; x++) {
                k[j * s->kv_heads * d + x] = x % 2 ? NAN : INFINITY;
                v[j * s->kv_heads * d + x] = x % 3 ? -INFINITY : NAN;
            }
    reference(s, q, k, v, mask, want);
    char what[160];
    for (int l = 0; l < LAYOUT_COUNT; l++) {
        run(kernel, s, (enum layout)l, q, k, v, s->mask_mode == SNEPPX_MASK_EXPLICIT ? mask : NULL, got[l]);
        snprintf(what, sizeof what, "%s d%lld g%lld kv%lld T%lld past %lld w%lld mode %lld%s, %s", target->name,
                 (long long)d, (long long)s->group, (long long)s->kv_heads, (long long)t, (long long)s->past,
                 (long long)s->window, (long long)s->mask_mode,
                 s->mask_fill == MASK_STRIPES ? " (mask in stripes)" : "", layout_names[l]);
        /* The queries' rows: the last t - past of the reference's. */
        const int64_t first = s->past * heads * d;
        const test_error error = test_compare(got[l] + first, want + first, q_floats - first);
        TEST_CHECK(&tally, test_error_within(&error, REF_TOL, REF_TOL),
                   "%s: max-normalized error %.3g against float64 (<= %g), %lld non-finite", what,
                   error.max_normalized, REF_TOL, (long long)error.non_finite);
        if (l > 0)
            TEST_CHECK(&tally, memcmp(got[l] + first, got[0] + first, (size_t)(q_floats - first) * sizeof(float)) == 0,
                       "%s: not bit-identical to the token-major layout", what);
    }
    for (int l = 0; l < LAYOUT_COUNT; l++)
        free(got[l]);
    free(want);
    free(mask);
    free(v);
    free(k);
    free(q);
}

int main(void)
{
    const struct shape shapes[] = {
        {32, 4, 2, 137, 0, SNEPPX_MASK_CAUSAL, MASK_RANDOM, 0},  {32, 3, 2, 100, 0, SNEPPX_MASK_CAUSAL, MASK_RANDOM, 0},
        {16, 7, 1, 75, 0, SNEPPX_MASK_CAUSAL, MASK_RANDOM, 0},   {48, 1, 3, 200, 0, SNEPPX_MASK_CAUSAL, MASK_RANDOM, 0},
        {32, 4, 2, 150, 40, SNEPPX_MASK_CAUSAL, MASK_RANDOM, 0}, {32, 4, 2, 90, 0, SNEPPX_MASK_EXPLICIT, MASK_RANDOM, 0},
        {32, 4, 2, 300, 0, SNEPPX_MASK_EXPLICIT, MASK_STRIPES, 0}, {16, 7, 1, 280, 0, SNEPPX_MASK_EXPLICIT, MASK_STRIPES, 0},
        /* Blocks whose keys reach back SNEPPX_ATTN_LONG_BLOCK_KEYS take twice the
         * positions (groups 1 and 4; 3 at v8, not at v16, whose 48-row block ends in a
         * narrower tile): short blocks then long ones
         * and a short last one, a window that keeps them long, an explicit mask (every
         * block sees all keys). */
        {16, 4, 1, LONG_T, 0, SNEPPX_MASK_CAUSAL, MASK_RANDOM, 0}, {16, 1, 2, LONG_T, 0, SNEPPX_MASK_CAUSAL, MASK_RANDOM, 0},
        {16, 3, 1, LONG_T, 0, SNEPPX_MASK_CAUSAL, MASK_RANDOM, 0},
        {16, 4, 1, LONG_T, SNEPPX_ATTN_LONG_BLOCK_KEYS + 50, SNEPPX_MASK_CAUSAL, MASK_RANDOM, 0},
        {16, 4, 1, LONG_T, 0, SNEPPX_MASK_EXPLICIT, MASK_RANDOM, 0},
        /* A chunked prefill whose queries cross from short blocks to long ones, and one
         * whose every block is long, with an explicit mask's rows for its queries. */
        {16, 4, 1, LONG_T, 0, SNEPPX_MASK_CAUSAL, MASK_RANDOM, SNEPPX_ATTN_LONG_BLOCK_KEYS - 48},
        {16, 1, 2, LONG_T, 0, SNEPPX_MASK_EXPLICIT, MASK_RANDOM, SNEPPX_ATTN_LONG_BLOCK_KEYS + 52},
    };
    /* The long shapes above test long blocks only if a group of 4 has them. */
    TEST_CHECK(&tally, sneppx_attn_flash_scratch_floats(4, 16, 16) >= 2 * SNEPPX_ATTN_BLOCK_Q * 4 * (16 + 16 + 2),
               "flash scratch for a group of 4 holds no long query block: %lld floats",
               (long long)sneppx_attn_flash_scratch_floats(4, 16, 16));
    const struct sneppx_target *host = sneppx_host_target();
    const struct sneppx_target *targets[] = {host, sneppx_target_named("v8")};
    const int target_count = targets[1] && targets[1] != host ? 2 : 1;
    test_rng rng = test_rng_seeded(2027);
    for (int t = 0; t < target_count; t++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            test_shape(&shapes[i], targets[t], &rng);
    return test_finish(&tally);
}
