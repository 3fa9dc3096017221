/* attn_decode against a float64 reference computed here, on random K/V in a
 * paged cache whose page table is shuffled and whose unused rows and pages
 * hold NaN (a read outside the sequence's keys shows up as NaN).
 *
 * Shapes: head_dim 64 / 80 / 128 (standard pages: K [kv_heads][page][d] then V,
 * the second K/V head) and absorbed MLA (one 576-float latent row per token,
 * k = v, v_head_dim 512); groups 1, 4, 8, 16; q_len 1..4; kv_len 1, page-1,
 * page, page+1, across pages, 4096 (300 emulated); page sizes 1, 4, 16, 64; causal without
 * and with a window shorter than kv_len, an explicit mask with a fully masked
 * row, no mask, an explicit mask hiding whole tiles of NaN / Inf rows from every
 * query. Each target the host runs (v16 and v8 on AVX-512 hosts).
 *
 * Checked: the output and log-sum-exp against the reference (max-normalized
 * error <= REF_TOL, lse within LSE_TOL); a fully masked row is zeros with lse
 * -inf; the output row stride's gaps are untouched; the same result from 1, 2,
 * 3 and 7 splits of the keys merged by sneppx_attn_decode_merge() (max-normalized
 * difference <= SPLIT_TOL against the unsplit call, lse too); NaN / Inf in the key or
 * value of a key hidden from a row (causal edge, window edge, explicit mask)
 * does not reach that row, split or not.
 *
 * Cache types (key field kv_type): bfloat16, float16 and int8 pages hold the
 * rows rounded / quantized by the runtime's own conversion (kv_elements.h),
 * int8 with its scales beside the pages as the ABI places them; the reference
 * reads the same rows widened back to float (so the tolerances are float32's),
 * on a subset of the shapes and the hidden NaN / Inf cases (an int8 row with
 * NaN or Inf has scale NaN: the hidden row must stay clean of it too). The
 * target's packed types (bfloat16) are read 2 elements to a lane over the head dims'
 * whole chunks of 2 vectors, the values' over whole P.V chunks, and one vector at a
 * time past them: d 80 has a tail in all but bfloat16's Q.K at v8 (16-dim chunks), and
 * bfloat16's hidden NaN / Inf values take the packed path of the hidden-value pass
 * (int8 values are finite: that pass is never needed). A target with decode_int8_dot
 * (v8) reads int8 by integer dot products, within INT16_TOL; its hidden NaN rows have
 * scale NaN, which the hidden rows' probabilities never meet (0 stays 0) while a
 * visible one sends its tile to the float P.V. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"
#include "host.h"
#include "kernels.h"
#include "kv_elements.h"
#include "test_util.h"

/* fp32 against float64: dot products over up to 576 dims and softmax sums over up to
 * 4096 keys, |q|, |k|, |v| <= 1 (scores up to ~4 after scaling). */
#define REF_TOL 2e-5
#define LSE_TOL 2e-5
/* Merged splits against one call: the same fp32 arithmetic regrouped. At 4096 keys an
 * output row is an average whose entries are ~20x smaller than the values it sums, and
 * the two summation orders differ by up to 3.8e-6 of it (measured); 2e-6 holds up to
 * hundreds of keys. */
#define SPLIT_TOL 5e-6
/* int8 by integer dot products (the target's decode_int8_dot): queries rounded to int16
 * in units of a row's largest / 32767, and a tile's probabilities times their V scales
 * the same per row, so each product carries up to 2^-16 of its row's largest term
 * beside float32's rounding. Measured: up to 5.4e-5 max-normalized against float64 and
 * 4.5e-5 between split and unsplit calls (a split moves the tiles, and so the units)
 * over these shapes, where the rows' own int8 rounding is 1/254 of their largest
 * element. */
#define INT16_TOL 2e-4
#define O_GAP 16
#define GAP_FILL 12345.0f
#define KV_HEADS 2
#define MLA_LATENT 576
#define MLA_V 512

static test_tally tally;
/* The longest cache a shape is checked over: 4096 keys, or 300 (5 key tiles, pages of every
 * size crossed, splits of 43+ keys) on tests/emulated's qemu, which sets SNEPPX_TEST_EMULATED:
 * it runs each FMA lane as a softfloat call (float32_muladd and the host's fmaf: two thirds of
 * the emulated test's time), and its 4096-key passes ran past 15 minutes of an Intel Xeon core. */
static int64_t long_kv_len = 4096;

struct shape {
    int64_t head_dim, v_head_dim, group;
    int mla;
    int64_t page_size;
};

/* A paged cache holding one sequence's keys 0..kv_len-1 for KV_HEADS heads (MLA: one latent). */
typedef struct paged {
    struct shape shape;
    int64_t kv_len, pages_used, pool_pages, page_stride, k_stride, v_stride;
    float *pool;
    int32_t *table;
    const float *k, *v; /* the tested head's bases in page 0 */
    /* The kernel's kv_type; for a narrow one, the rows as the kernel reads them (the
     * pool's element offsets in elements of the type; the pool then holds them widened),
     * and int8's scales at [page * page_stride / 4 + row in page], K and V (MLA: one). */
    sneppx_dtype dtype;
    int int16_dot; /* the kernel reads int8 rows by integer dot products */
    unsigned char *store;
    float *k_scales, *v_scales;
} paged;

static float *key_row(const paged *p, int64_t j)
{
    return (float *)p->k + p->table[j / p->shape.page_size] * p->page_stride + j % p->shape.page_size * p->k_stride;
}

static float *value_row(const paged *p, int64_t j)
{
    return (float *)p->v + p->table[j / p->shape.page_size] * p->page_stride + j % p->shape.page_size * p->v_stride;
}

/* The pool's rows stored as p->dtype (unused rows stay NaN, int8's scales NaN) and
 * read back into the pool, which then holds exactly what the kernel reads. */
static void paged_store(paged *p)
{
    if (p->dtype == SNEPPX_DTYPE_FLOAT32)
        return;
    const int64_t ps = p->shape.page_size, eb = sneppx_dtype_bytes[p->dtype];
    for (int64_t j = 0; j < p->kv_len; j++)
        for (int part = 0; part < (p->shape.mla ? 1 : 2); part++) {
            float *row = part ? value_row(p, j) : key_row(p, j);
            const int64_t n = part ? p->shape.v_head_dim : p->shape.head_dim, at = row - p->pool;
            float *scale = (part ? p->v_scales : p->k_scales) + p->table[j / ps] * p->page_stride / 4 + j % ps;
            sneppx_kv_store_row(p->dtype, p->store + at * eb, scale, row, n);
            sneppx_kv_load_row(p->dtype, row, p->store + at * eb, *scale, n);
        }
}

static int paged_make(paged *p, const struct shape *shape, int64_t kv_len, test_rng *rng, sneppx_dtype dtype,
                      const struct sneppx_target *target)
{
    memset(p, 0, sizeof *p);
    p->shape = *shape;
    p->dtype = dtype;
    p->int16_dot = dtype == SNEPPX_DTYPE_INT8 && target->decode_int8_dot;
    p->kv_len = kv_len;
    const int64_t ps = shape->page_size;
    p->pages_used = (kv_len + ps - 1) / ps;
    p->pool_pages = p->pages_used + 3;
    if (shape->mla) {
        p->page_stride = ps * MLA_LATENT;
        p->k_stride = p->v_stride = MLA_LATENT;
    } else {
        p->page_stride = KV_HEADS * ps * (shape->head_dim + shape->v_head_dim);
        p->k_stride = shape->head_dim;
        p->v_stride = shape->v_head_dim;
    }
    const int64_t floats = p->pool_pages * p->page_stride;
    p->pool = malloc((size_t)floats * sizeof(float));
    p->table = malloc((size_t)p->pool_pages * sizeof(int32_t));
    p->store = malloc((size_t)(floats * sneppx_dtype_bytes[dtype]));
    p->k_scales = malloc((size_t)floats * sizeof(float));
    p->v_scales = shape->mla ? p->k_scales : malloc((size_t)floats * sizeof(float));
    if (!p->pool || !p->table || !p->store || !p->k_scales || !p->v_scales)
        return 0;
    memset(p->store, 0xff, (size_t)(floats * sneppx_dtype_bytes[dtype])); /* NaN in bfloat16 and float16 */
    for (int64_t i = 0; i < floats; i++)
        p->k_scales[i] = p->v_scales[i] = NAN;
    for (int64_t i = 0; i < floats; i++)
        p->pool[i] = NAN;
    /* A shuffled page table over more pages than the sequence uses. */
    for (int64_t i = 0; i < p->pool_pages; i++)
        p->table[i] = (int32_t)i;
    for (int64_t i = p->pool_pages - 1; i > 0; i--) {
        const int64_t j = (int64_t)(test_rng_next(rng) % (uint64_t)(i + 1));
        const int32_t t = p->table[i];
        p->table[i] = p->table[j];
        p->table[j] = t;
    }
    if (shape->mla) {
        p->k = p->v = p->pool;
    } else { /* the second K/V head */
        p->k = p->pool + ps * shape->head_dim;
        p->v = p->pool + KV_HEADS * ps * shape->head_dim + ps * shape->v_head_dim;
    }
    for (int64_t j = 0; j < kv_len; j++) {
        test_fill_uniform(rng, key_row(p, j), shape->head_dim, 1.0f);
        if (!shape->mla)
            test_fill_uniform(rng, value_row(p, j), shape->v_head_dim, 1.0f);
    }
    paged_store(p);
    return 1;
}

static void paged_free(paged *p)
{
    free(p->pool);
    free(p->table);
    free(p->store);
    if (p->v_scales != p->k_scales)
        free(p->v_scales);
    free(p->k_scales);
}

struct scenario {
    int64_t mode, window, q_len;
    const float *mask; /* [q_len][kv_len], EXPLICIT only */
};

static int visible(const struct scenario *sc, int64_t kv_len, int64_t i, int64_t j)
{
    if (sc->mode == SNEPPX_MASK_EXPLICIT)
        return sc->mask[i * kv_len + j] > SNEPPX_MASKED_BELOW;
    if (sc->mode == SNEPPX_MASK_CAUSAL) {
        const int64_t position = i + kv_len - sc->q_len;
        return j <= position && (sc->window <= 0 || position - j < sc->window);
    }
    return 1;
}

/* want[(i*group + g) * dv + e] and want_lse over keys [kb, ke), in float64. */
static void reference(const paged *p, const struct scenario *sc, const float *q, float scale, int64_t kb,
                      int64_t ke, double *want, double *want_lse)
{
    const int64_t d = p->shape.head_dim, dv = p->shape.v_head_dim, group = p->shape.group;
    double *scores = malloc((size_t)(ke > kb ? ke - kb : 1) * sizeof(double));
    for (int64_t i = 0; i < sc->q_len; i++)
        for (int64_t g = 0; g < group; g++) {
            const int64_t r = i * group + g;
            const float *qr = q + r * d;
            double max = -INFINITY;
            for (int64_t j = kb; j < ke; j++) {
                scores[j - kb] = -INFINITY;
                if (!visible(sc, p->kv_len, i, j))
                    continue;
                const float *kj = key_row(p, j);
                double dot = 0;
                for (int64_t c = 0; c < d; c++)
                    dot += (double)qr[c] * kj[c];
                dot *= scale;
                if (sc->mode == SNEPPX_MASK_EXPLICIT)
                    dot += sc->mask[i * p->kv_len + j];
                scores[j - kb] = dot;
                max = dot > max ? dot : max;
            }
            double *out = want + r * dv, sum = 0;
            for (int64_t e = 0; e < dv; e++)
                out[e] = 0;
            for (int64_t j = kb; j < ke; j++) {
                if (scores[j - kb] == -INFINITY)
                    continue;
                const double w = exp(scores[j - kb] - max);
                const float *vj = value_row(p, j);
                sum += w;
                for (int64_t e = 0; e < dv; e++)
                    out[e] += w * vj[e];
            }
            for (int64_t e = 0; sum > 0 && e < dv; e++)
                out[e] /= sum;
            want_lse[r] = sum > 0 ? max + log(sum) : -INFINITY;
        }
    free(scores);
}

/* One call over keys [kb, ke): output rows at o with stride o_stride, lse (may be NULL). */
static void run(const sneppx_kernel *kernel, const paged *p, const struct scenario *sc, const float *q, float scale,
                int64_t kb, int64_t ke, float *o, int64_t o_stride, float *lse, float *scratch)
{
    const int64_t d = p->shape.head_dim, group = p->shape.group;
    struct sneppx_args args = {.struct_size = sizeof args, .abi_version = SNEPPX_ABI_VERSION};
    args.row_begin = 0;
    args.row_end = sc->q_len;
    args.q = q;
    args.q_stride = group * d;
    args.k = p->k;
    args.k_stride = p->k_stride;
    args.v = p->v;
    args.v_stride = p->v_stride;
    if (p->dtype != SNEPPX_DTYPE_FLOAT32) {
        const int64_t eb = sneppx_dtype_bytes[p->dtype];
        args.k = (const float *)(void *)(p->store + (p->k - p->pool) * eb);
        args.v = (const float *)(void *)(p->store + (p->v - p->pool) * eb);
        args.k_scale = p->k_scales;
        args.v_scale = p->v_scales;
    }
    args.o = o;
    args.o_stride = o_stride;
    args.mask = sc->mask;
    args.mask_stride = p->kv_len;
    args.q_len = sc->q_len;
    args.kv_len = p->kv_len;
    args.softmax_scale = scale;
    args.scratch = scratch;
    args.pages = p->table;
    args.page_size = p->shape.page_size;
    args.page_stride = p->page_stride;
    args.kv_begin = kb;
    args.kv_end = ke;
    args.lse = lse;
    kernel->entry[SNEPPX_ENTRY_RUN](&args);
}

static float *alloc_scratch(const struct shape *s, int64_t q_len)
{
    const int64_t floats = sneppx_attn_decode_scratch_floats(q_len, s->group, s->head_dim, s->v_head_dim);
    return aligned_alloc(64, (size_t)(floats + 15) / 16 * 64);
}

/* Full call, then 1, 2, 3 and 7 splits merged; compared to the reference. `rows_ok`
 * (NULL = every row) limits the comparisons to the rows that must be finite. */
static void check_scenario(const sneppx_kernel *kernel, const paged *p, const struct scenario *sc, const float *q,
                           const unsigned char *rows_ok, const char *what)
{
    const struct shape *s = &p->shape;
    const int64_t group = s->group, dv = s->v_head_dim, rows = sc->q_len * group;
    const int64_t o_stride = group * dv + O_GAP;
    const float scale = 1.0f / sqrtf((float)s->head_dim);
    double *want = malloc((size_t)(rows * dv) * sizeof(double)), *want_lse = malloc((size_t)rows * sizeof(double));
    float *o = malloc((size_t)(sc->q_len * o_stride) * sizeof(float)), *lse = malloc((size_t)rows * sizeof(float));
    float *packed = malloc((size_t)(rows * dv) * sizeof(float)), *merged = malloc((size_t)(rows * dv) * sizeof(float));
    float *split = malloc((size_t)sneppx_attn_decode_split_floats(7, sc->q_len, group, dv) * sizeof(float));
    float *merged_lse = malloc((size_t)rows * sizeof(float));
    float *scratch = alloc_scratch(s, sc->q_len);
    if (!TEST_CHECK(&tally, want && want_lse && o && lse && packed && merged && split && merged_lse && scratch,
                    "%s: out of memory", what))
        goto done;
    reference(p, sc, q, scale, 0, p->kv_len, want, want_lse);
    for (int64_t i = 0; i < sc->q_len * o_stride; i++)
        o[i] = GAP_FILL;
    run(kernel, p, sc, q, scale, 0, p->kv_len, o, o_stride, lse, scratch);

    /* Rows packed ([rows][dv]) for comparison; the gaps of the row stride untouched. */
    int gaps_kept = 1;
    for (int64_t i = 0; i < sc->q_len; i++) {
        memcpy(packed + i * group * dv, o + i * o_stride, (size_t)(group * dv) * sizeof(float));
        for (int64_t e = group * dv; e < o_stride; e++)
            gaps_kept &= o[i * o_stride + e] == GAP_FILL;
    }
    TEST_CHECK(&tally, gaps_kept, "%s: the kernel wrote into the gaps of o_stride", what);

    double worst = 0, worst_lse = 0;
    int masked_ok = 1;
    for (int64_t r = 0; r < rows; r++) {
        if (rows_ok && !rows_ok[r])
            continue;
        if (want_lse[r] == -INFINITY) { /* no visible key: zeros, lse -inf */
            for (int64_t e = 0; e < dv; e++)
                masked_ok &= packed[r * dv + e] == 0.0f;
            masked_ok &= lse[r] == -INFINITY;
            continue;
        }
        double row_max = 0, row_err = 0;
        for (int64_t e = 0; e < dv; e++) {
            const double diff = fabs(packed[r * dv + e] - want[r * dv + e]);
            row_err = diff > row_err || diff != diff ? diff : row_err;
            row_max = fabs(want[r * dv + e]) > row_max ? fabs(want[r * dv + e]) : row_max;
        }
        const double err = row_max > 0 ? row_err / row_max : row_err;
        worst = err > worst || err != err ? err : worst;
        const double lse_err = fabs(lse[r] - want_lse[r]) / (1.0 + fabs(want_lse[r]));
        worst_lse = lse_err > worst_lse || lse_err != lse_err ? lse_err : worst_lse;
    }
    const double ref_tol = p->int16_dot ? INT16_TOL : REF_TOL, split_tol = p->int16_dot ? INT16_TOL : SPLIT_TOL;
    TEST_CHECK(&tally, worst <= ref_tol, "%s: max-normalized error %.3g per row against float64 (<= %g)", what, worst,
               ref_tol);
    TEST_CHECK(&tally, worst_lse <= LSE_TOL, "%s: lse error %.3g against float64 (<= %g)", what, worst_lse, LSE_TOL);
    TEST_CHECK(&tally, masked_ok, "%s: a row without visible keys is not zeros with lse -inf", what);

    static const int split_counts[] = {1, 2, 3, 7};
    for (size_t c = 0; c < sizeof split_counts / sizeof split_counts[0]; c++) {
        const int64_t n = split_counts[c];
        for (int64_t sp = 0; sp < n; sp++) {
            const int64_t kb = p->kv_len * sp / n, ke = p->kv_len * (sp + 1) / n;
            run(kernel, p, sc, q, scale, kb, ke, split + sp * rows * dv, group * dv,
                split + (n * dv + sp) * rows, scratch);
        }
        sneppx_attn_decode_merge(split, n, sc->q_len, group, dv, merged, group * dv, merged_lse);
        double diff = 0, scale_max = 0, lse_diff = 0;
        for (int64_t r = 0; r < rows; r++) {
            if (rows_ok && !rows_ok[r])
                continue;
            for (int64_t e = 0; e < dv; e++) {
                const double x = fabs((double)merged[r * dv + e] - packed[r * dv + e]);
                diff = x > diff || x != x ? x : diff;
                scale_max = fabs(packed[r * dv + e]) > scale_max ? fabs(packed[r * dv + e]) : scale_max;
            }
            if (lse[r] == -INFINITY) {
                lse_diff = merged_lse[r] == -INFINITY ? lse_diff : INFINITY;
            } else {
                const double x = fabs((double)merged_lse[r] - lse[r]) / (1.0 + fabs(lse[r]));
                lse_diff = x > lse_diff || x != x ? x : lse_diff;
            }
        }
        const double norm = scale_max > 0 ? diff / scale_max : diff;
        TEST_CHECK(&tally, norm <= split_tol && lse_diff <= split_tol,
                   "%s: %lld splits merged differ from one call by %.3g max-normalized, lse by %.3g (<= %g)", what,
                   (long long)n, norm, lse_diff, split_tol);
    }
done:
    free(want);
    free(want_lse);
    free(o);
    free(lse);
    free(packed);
    free(merged);
    free(split);
    free(merged_lse);
    free(scratch);
}

static const sneppx_kernel *resolve(const struct shape *s, int64_t window, int64_t mode,
                                    const struct sneppx_target *target, sneppx_dtype dtype)
{
    const int64_t values[] = {s->head_dim, s->v_head_dim, s->group, window, mode, dtype};
    const sneppx_kernel *kernel = NULL;
    const sneppx_status status = sneppx_kernel_resolve("attn_decode", values, target, &kernel);
    TEST_CHECK(&tally, status == SNEPPX_OK, "resolve attn_decode d%lld g%lld w%lld mode %lld %s %s: %s",
               (long long)s->head_dim, (long long)s->group, (long long)window, (long long)mode,
               sneppx_dtype_name(dtype), target->name, sneppx_last_error());
    return status == SNEPPX_OK ? kernel : NULL;
}

/* A random additive mask with some entries hidden (-inf and finfo.min) and, when q_len > 1,
 * query 1's row fully hidden. */
static float *make_mask(test_rng *rng, int64_t q_len, int64_t kv_len)
{
    float *mask = malloc((size_t)(q_len * kv_len) * sizeof(float));
    for (int64_t i = 0; mask && i < q_len * kv_len; i++) {
        const double u = test_rng_uniform(rng);
        mask[i] = u < 0.15 ? -INFINITY : u < 0.3 ? -3.4028235e38f : test_rng_symmetric(rng, 2.0f);
    }
    for (int64_t j = 0; mask && q_len > 1 && j < kv_len; j++)
        mask[kv_len + j] = -INFINITY;
    return mask;
}

static void test_shape(const struct shape *s, const struct sneppx_target *target, test_rng *rng, sneppx_dtype dtype)
{
    const int64_t ps = s->page_size;
    const int64_t kv_lens[] = {1, ps - 1, ps, ps + 1, 2 * ps + 3, 37, long_kv_len};
    const struct {
        int64_t mode, window;
    } kinds[] = {{SNEPPX_MASK_CAUSAL, 0}, {SNEPPX_MASK_CAUSAL, 5}, {SNEPPX_MASK_EXPLICIT, 0}, {SNEPPX_MASK_NONE, 0}};
    for (size_t kind = 0; kind < sizeof kinds / sizeof kinds[0]; kind++) {
        const sneppx_kernel *kernel = resolve(s, kinds[kind].window, kinds[kind].mode, target, dtype);
        if (!kernel)
            continue;
        for (size_t l = 0; l < sizeof kv_lens / sizeof kv_lens[0]; l++) {
            const int64_t kv_len = kv_lens[l];
            if (kv_len < 1 || (l > 0 && kv_len == kv_lens[l - 1]))
                continue;
            paged p;
            if (!TEST_CHECK(&tally, paged_make(&p, s, kv_len, rng, dtype, target), "out of memory")) {
                paged_free(&p);
                continue;
            }
            for (int64_t q_len = 1; q_len <= 4 && q_len <= kv_len; q_len++) {
                /* The long sequence at q_len 1 and 3 (MLA and narrow types: 1) only: the
                 * reference dominates the time. */
                if (kv_len == long_kv_len && (q_len == 2 || q_len == 4 || ((s->mla || dtype) && q_len > 1)))
                    continue;
                float *q = malloc((size_t)(q_len * s->group * s->head_dim) * sizeof(float));
                float *mask = kinds[kind].mode == SNEPPX_MASK_EXPLICIT ? make_mask(rng, q_len, kv_len) : NULL;
                if (!TEST_CHECK(&tally, q && (mask || kinds[kind].mode != SNEPPX_MASK_EXPLICIT), "out of memory")) {
                    free(q);
                    free(mask);
                    continue;
                }
                test_fill_uniform(rng, q, q_len * s->group * s->head_dim, 1.0f);
                const struct scenario sc = {kinds[kind].mode, kinds[kind].window, q_len, mask};
                char what[160];
                snprintf(what, sizeof what,
                         "%s %s d%lld dv%lld g%lld%s page %lld mode %lld w%lld q_len %lld kv_len %lld", target->name,
                         sneppx_dtype_name(dtype), (long long)s->head_dim, (long long)s->v_head_dim, (long long)s->group,
                         s->mla ? " mla" : "", (long long)ps, (long long)sc.mode, (long long)sc.window,
                         (long long)q_len, (long long)kv_len);
                check_scenario(kernel, &p, &sc, q, NULL, what);
                free(q);
                free(mask);
            }
            paged_free(&p);
        }
    }
}

/* A poisoned-key case's inputs: a paged cache of kv_len keys, random queries for q_len
 * positions and room for their [q_len][kv_len] mask. 0 (a failed check) when something
 * was not allocated; hidden_case_free in either case. */
typedef struct hidden_case {
    paged p;
    float *q, *mask;
} hidden_case;

static int hidden_case_make(hidden_case *c, const struct shape *s, int64_t kv_len, int64_t q_len, test_rng *rng,
                            sneppx_dtype dtype, const struct sneppx_target *target)
{
    const int64_t rows = q_len * s->group;
    c->q = malloc((size_t)(rows * s->head_dim) * sizeof(float));
    c->mask = malloc((size_t)(q_len * kv_len) * sizeof(float));
    const int made = paged_make(&c->p, s, kv_len, rng, dtype, target);
    if (!TEST_CHECK(&tally, made && c->q && c->mask, "out of memory"))
        return 0;
    test_fill_uniform(rng, c->q, rows * s->head_dim, 1.0f);
    return 1;
}

static void hidden_case_free(hidden_case *c)
{
    paged_free(&c->p);
    free(c->q);
    free(c->mask);
}

/* NaN / Inf in hidden keys: q_len 4 over 40 keys (pages of 16), group 4, d 80. */
static void test_hidden_nonfinite(const struct sneppx_target *target, test_rng *rng, sneppx_dtype dtype)
{
    const struct shape s = {80, 80, 4, 0, 16};
    const int64_t kv_len = 40, q_len = 4, rows = q_len * s.group;
    const struct {
        int64_t mode, window;
        int64_t key;  /* the poisoned key */
        int part;     /* 0: value NaN, 1: value +Inf, 2: key NaN */
    } cases[] = {
        {SNEPPX_MASK_CAUSAL, 0, 39, 0},  /* seen by query 3 only (position 39) */
        {SNEPPX_MASK_CAUSAL, 0, 38, 1},  /* seen by queries 2 and 3 */
        {SNEPPX_MASK_CAUSAL, 0, 37, 2},
        {SNEPPX_MASK_CAUSAL, 8, 29, 0},  /* inside query 0's window only (36 - 29 < 8) */
        {SNEPPX_MASK_CAUSAL, 8, 30, 1},  /* queries 0 and 1 */
        {SNEPPX_MASK_EXPLICIT, 0, 5, 0}, /* the mask hides it from queries 1 and 2 */
        {SNEPPX_MASK_EXPLICIT, 0, 20, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const sneppx_kernel *kernel = resolve(&s, cases[c].window, cases[c].mode, target, dtype);
        hidden_case hc;
        if (kernel && hidden_case_make(&hc, &s, kv_len, q_len, rng, dtype, target)) {
            paged *const p = &hc.p;
            float *const mask = hc.mask;
            for (int64_t i = 0; i < q_len * kv_len; i++)
                mask[i] = test_rng_symmetric(rng, 1.0f);
            mask[1 * kv_len + cases[c].key] = -INFINITY;
            mask[2 * kv_len + cases[c].key] = -3.4028235e38f;
            const struct scenario sc = {cases[c].mode, cases[c].window, q_len,
                                        cases[c].mode == SNEPPX_MASK_EXPLICIT ? mask : NULL};
            float *target_row = cases[c].part == 2 ? key_row(p, cases[c].key) : value_row(p, cases[c].key);
            const int64_t n = cases[c].part == 2 ? s.head_dim : s.v_head_dim;
            for (int64_t e = 0; e < n; e += 7)
                target_row[e] = cases[c].part == 1 ? INFINITY : NAN;
            paged_store(p);
            unsigned char rows_ok[16];
            int hidden_rows = 0;
            for (int64_t r = 0; r < rows; r++) {
                rows_ok[r] = !visible(&sc, kv_len, r / s.group, cases[c].key);
                hidden_rows += rows_ok[r];
            }
            char what[160];
            snprintf(what, sizeof what, "%s %s hidden %s in key %lld, mode %lld w%lld", target->name,
                     sneppx_dtype_name(dtype),
                     cases[c].part == 0 ? "NaN value" : cases[c].part == 1 ? "Inf value" : "NaN key",
                     (long long)cases[c].key, (long long)cases[c].mode, (long long)cases[c].window);
            TEST_CHECK(&tally, hidden_rows > 0 && hidden_rows < rows, "%s: %d of %lld rows hidden", what, hidden_rows,
                       (long long)rows);
            check_scenario(kernel, p, &sc, hc.q, rows_ok, what);
        }
        if (kernel)
            hidden_case_free(&hc);
    }
}

/* Whole tiles an explicit mask hides from every query (a padded batch's padding) hold
 * NaN keys and infinite values, and no row may see them: q_len 2 over 300 keys (pages
 * of 16), group 4, d 128, keys [64, 128) and [200, 264) hidden. Unsplit, the first
 * range is one whole 64-key tile, which the kernel skips; the splits' tiles start
 * elsewhere and meet the ranges in part, which the mask pass hides. */
static void test_hidden_tiles(const struct sneppx_target *target, test_rng *rng, sneppx_dtype dtype)
{
    const struct shape s = {128, 128, 4, 0, 16};
    const int64_t kv_len = 300, q_len = 2;
    const sneppx_kernel *kernel = resolve(&s, 0, SNEPPX_MASK_EXPLICIT, target, dtype);
    hidden_case hc;
    if (kernel && hidden_case_make(&hc, &s, kv_len, q_len, rng, dtype, target)) {
        float *const mask = hc.mask;
        for (int64_t i = 0; i < q_len; i++)
            for (int64_t j = 0; j < kv_len; j++) {
                const int hidden = (j >= 64 && j < 128) || (j >= 200 && j < 264);
                mask[i * kv_len + j] = !hidden ? test_rng_symmetric(rng, 1.0f) : j < 128 ? -INFINITY : -3.4028235e38f;
            }
        for (int64_t j = 64; j < 264; j += j == 127 ? 73 : 1) {
            float *k = key_row(&hc.p, j), *v = value_row(&hc.p, j);
            for (int64_t e = 0; e < s.head_dim; e += 5)
                k[e] = NAN;
            for (int64_t e = 0; e < s.v_head_dim; e += 3)
                v[e] = j % 2 ? INFINITY : -INFINITY;
        }
        paged_store(&hc.p);
        const struct scenario sc = {SNEPPX_MASK_EXPLICIT, 0, q_len, mask};
        unsigned char rows_ok[8];
        memset(rows_ok, 1, sizeof rows_ok);
        char what[160];
        snprintf(what, sizeof what, "%s %s explicit mask hiding whole tiles of NaN / Inf rows", target->name,
                 sneppx_dtype_name(dtype));
        check_scenario(kernel, &hc.p, &sc, hc.q, rows_ok, what);
    }
    if (kernel)
        hidden_case_free(&hc);
}

/* The merge alone: a split without a key of a row adds nothing, even if its output is NaN. */
static void test_merge_empty_split(void)
{
    const int64_t splits = 3, dv = 16;
    float split[3 * 16 + 3], o[16], lse;
    for (int64_t e = 0; e < dv; e++) {
        split[e] = 1.0f;
        split[dv + e] = NAN; /* a split that saw nothing: its output is not to be read */
        split[2 * dv + e] = 3.0f;
    }
    split[3 * dv + 0] = logf(1.0f);
    split[3 * dv + 1] = -INFINITY;
    split[3 * dv + 2] = logf(3.0f);
    sneppx_attn_decode_merge(split, splits, 1, 1, dv, o, dv, &lse);
    /* weights 1/4 and 3/4: 0.25 + 2.25 */
    TEST_CHECK(&tally, fabsf(o[0] - 2.5f) < 1e-6f && fabsf(o[dv - 1] - 2.5f) < 1e-6f && fabsf(lse - logf(4.0f)) < 1e-6f,
               "merge: o %g, lse %g, want 2.5, %g", o[0], lse, logf(4.0f));
    split[3 * dv + 0] = split[3 * dv + 2] = -INFINITY;
    sneppx_attn_decode_merge(split, splits, 1, 1, dv, o, dv, &lse);
    TEST_CHECK(&tally, o[0] == 0.0f && o[dv - 1] == 0.0f && lse == -INFINITY,
               "merge of splits without keys: o %g, lse %g, want 0, -inf", o[0], lse);
}

int main(void)
{
    const struct shape shapes[] = {
        {64, 64, 1, 0, 16},   {64, 64, 8, 0, 4},      {128, 128, 4, 0, 16},
        {128, 128, 16, 0, 1}, {576, 512, 16, 1, 16}, {576, 512, 4, 1, 64},
        {80, 80, 4, 0, 16},
    };
    const struct sneppx_target *host = sneppx_host_target();
    const struct sneppx_target *targets[] = {host, sneppx_target_named("v8")};
    const int target_count = targets[1] && targets[1] != host ? 2 : 1;
    test_rng rng = test_rng_seeded(2026);
    if (getenv("SNEPPX_TEST_EMULATED"))
        long_kv_len = 300;
    test_merge_empty_split();
    for (int t = 0; t < target_count; t++) {
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            test_shape(&shapes[i], targets[t], &rng, SNEPPX_DTYPE_FLOAT32);
        test_hidden_nonfinite(targets[t], &rng, SNEPPX_DTYPE_FLOAT32);
        test_hidden_tiles(targets[t], &rng, SNEPPX_DTYPE_FLOAT32);
        /* Narrow caches: GQA 8 over pages of 4, group 1 and llama3's heads, MLA (K and V in one row), d 80;
         * the host's target, and bfloat16's packed pairs and int8's integer dot products (or
         * widening loads) on the other too (float16's text: tests/lit/aot_attn_decode.test,
         * jit_attn_decode.test). */
        for (int dtype = SNEPPX_DTYPE_BFLOAT16; dtype < SNEPPX_DTYPE_COUNT; dtype++) {
            if (t > 0 && dtype == SNEPPX_DTYPE_FLOAT16)
                continue;
            test_shape(&shapes[1], targets[t], &rng, (sneppx_dtype)dtype);
            if (t == 0) {
                /* Group 1: 1..4 rows, whole and partial 4-row blocks (int8's integer tiles). */
                test_shape(&shapes[0], targets[t], &rng, (sneppx_dtype)dtype);
                test_shape(&shapes[2], targets[t], &rng, (sneppx_dtype)dtype);
            }
            test_shape(&shapes[4], targets[t], &rng, (sneppx_dtype)dtype);
            test_shape(&shapes[6], targets[t], &rng, (sneppx_dtype)dtype);
            test_hidden_nonfinite(targets[t], &rng, (sneppx_dtype)dtype);
            test_hidden_tiles(targets[t], &rng, (sneppx_dtype)dtype);
        }
    }
    return test_finish(&tally);
}
