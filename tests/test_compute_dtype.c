/* bfloat16 compute (sneppx_config.compute_dtype, the gemm_bf16dot kernels), at the
 * kernel and the C API:
 *   - _pack stores bfloat16 pairs along k, [k/2][NR][2], rounded to nearest even, bit
 *     for bit; an odd k's last pair ends in a zero, columns past n are zero;
 *   - the product rounds each activation to bfloat16 (nearest even, ties both ways):
 *     with one-hot weights each output is one rounded activation, exactly, for 1, 2,
 *     5, 14 and 40 rows (the 4-row and MR-row microkernels, several groups) and k
 *     odd, even and past one k slice (512), with the bias added once;
 *   - random products against a float64 sum of the rounded operands within 1e-5
 *     (max-normalized): rows 1..16, 33 and 100, k 1, 7, 512, 1025, n 3 and 70;
 *   - v8 (the same sums in float32 FMAs) runs on any host, v16 (vdpbf16ps) where
 *     the host has avx512_bf16, and is skipped, saying so, elsewhere;
 *   - the config: compute_dtype bfloat16 with float32 or float16 weights, and values
 *     other than float32 / bfloat16, are refused (INVALID_ARGUMENT naming
 *     config.compute_dtype) by sneppx_config_validate and sneppx_layer_create; without
 *     avx512_bf16 bfloat16 compute is SNEPPX_ERR_UNSUPPORTED naming it; a layer
 *     with it holds gemm_bf16dot keys and pair panels of the bfloat16 weights' bytes.
 * Whole layers against the float64 reference: tests/python/test_compute_dtype.py. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host.h"
#include "kernel_registry.h"
#include "kernels.h"
#include "sneppx/config.h"
#include "sneppx/layer.h"
#include "sneppx_abi.h"
#include "test_util.h"

static test_tally tally;

static float from_bits(uint32_t bits)
{
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* x rounded to bfloat16 by the format's definition, for finite x (independent of the kernels). */
static float bf16_round(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    const uint32_t low = bits & 0xffffu, kept = bits & 0xffff0000u;
    if (low > 0x8000u || (low == 0x8000u && (kept & 0x10000u)))
        return from_bits(kept + 0x10000u);
    return from_bits(kept);
}

static int host_has_bf16(void) { return sneppx_host_has_feature("+avx512bf16"); }

/* The targets this host runs gemm_bf16dot on; says which it skips, once. */
static int runnable(const struct sneppx_target *target)
{
    static int told;
    if (target->vector_width > sneppx_host_target()->vector_width)
        return 0;
    if (target->vector_width == 16 && !host_has_bf16()) {
        if (!told++)
            printf("SKIP gemm_bf16dot %s: this host lacks avx512_bf16 (vdpbf16ps)\n", target->name);
        tally.skipped++;
        return 0;
    }
    return 1;
}

static const sneppx_kernel *resolve(const struct sneppx_target *target, int64_t k, int64_t n, int bias)
{
    const int64_t values[] = {k, n, bias};
    const sneppx_kernel *kernel = NULL;
    TEST_CHECK(&tally, sneppx_kernel_resolve("gemm_bf16dot", values, target, &kernel) == SNEPPX_OK,
               "%s k%lld n%lld: %s", target->name, (long long)k, (long long)n, sneppx_last_error());
    return kernel;
}

static uint16_t *pack(const sneppx_kernel *kernel, const struct sneppx_target *target, const float *hf, int64_t k,
                      int64_t n)
{
    const int64_t bytes = sneppx_gemm_packed_pair_bytes(k, n, target->gemm_nr);
    uint16_t *panels = aligned_alloc(64, (size_t)(bytes + 63) / 64 * 64);
    memset(panels, 0xff, (size_t)bytes); /* padding must come out zero */
    struct sneppx_args args = {.struct_size = sizeof args, .abi_version = SNEPPX_ABI_VERSION, .col_begin = 0,
                               .col_end = n, .src = hf, .src_stride = k, .dst = (float *)panels};
    kernel->entry[SNEPPX_ENTRY_PACK](&args);
    return panels;
}

static void run(const sneppx_kernel *kernel, const float *src, int64_t rows, int64_t k, const uint16_t *panels,
                const float *bias, float *out, int64_t n)
{
    struct sneppx_args args = {.struct_size = sizeof args, .abi_version = SNEPPX_ABI_VERSION, .row_begin = 0,
                               .row_end = rows, .col_begin = 0, .col_end = n, .src = src, .src_stride = k,
                               .weight = panels, .bias = bias, .dst = out, .dst_stride = n};
    kernel->entry[SNEPPX_ENTRY_RUN](&args);
}

/* Rounding cases (float32 bits in, bfloat16 bits out), as tests/test_weight_dtype.c's. */
static const uint32_t round_in[] = {0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu,
                                    0xbf818000u, 0xc0490fdbu};
static const uint16_t round_out[] = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0x3f80, 0xbf82, 0xc049};
enum { CASES = sizeof round_in / sizeof round_in[0] };

/* W[c, i] = case (c + i) % CASES: every stored element checked against the pair layout. */
static void test_pack_layout(const struct sneppx_target *target)
{
    const int64_t ks[] = {1, 7, 8, 1025};
    const int64_t n = 3, nr = target->gemm_nr;
    for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
        const int64_t k = ks[t], pairs = (k + 1) / 2;
        const sneppx_kernel *kernel = resolve(target, k, n, 0);
        if (!kernel)
            return;
        float *hf = malloc(sizeof(float) * (size_t)(n * k));
        for (int64_t c = 0; c < n; c++)
            for (int64_t i = 0; i < k; i++)
                hf[c * k + i] = from_bits(round_in[(c + i) % CASES]);
        uint16_t *panels = pack(kernel, target, hf, k, n);
        int wrong = 0;
        for (int64_t p = 0; p < pairs && wrong < 8; p++)
            for (int64_t c = 0; c < nr; c++)
                for (int e = 0; e < 2; e++) {
                    const int64_t i = 2 * p + e;
                    const uint16_t want = c < n && i < k ? round_out[(c + i) % CASES] : 0;
                    const uint16_t got = panels[(p * nr + c) * 2 + e];
                    wrong += !TEST_CHECK(&tally, got == want, "%s k%lld: pair %lld column %lld element %d is "
                                         "0x%04x, want 0x%04x", target->name, (long long)k, (long long)p,
                                         (long long)c, e, got, want);
                }
        free(panels);
        free(hf);
    }
}

/* One-hot weights (W[c, i] = 1 iff i == c * stride) pick one activation per output:
 * out[r, c] = bias[c] + bf16(x[r, c * stride]), exact. */
static void test_activation_rounding(const struct sneppx_target *target)
{
    const int64_t ks[] = {7, 64, 1025}, row_counts[] = {1, 2, 5, 14, 40};
    const int64_t n = 3;
    const float bias[3] = {0.0f, 1024.0f, -0.5f};
    for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
        const int64_t k = ks[t], stride = (k - 1) / (n - 1); /* columns pick k = 0, the middle, the last */
        const sneppx_kernel *kernel = resolve(target, k, n, 1);
        if (!kernel)
            return;
        float *hf = calloc((size_t)(n * k), sizeof(float));
        for (int64_t c = 0; c < n; c++)
            hf[c * k + c * stride] = 1.0f;
        uint16_t *panels = pack(kernel, target, hf, k, n);
        float *src = malloc(sizeof(float) * (size_t)(40 * k)), out[40 * 3];
        for (size_t rc = 0; rc < sizeof row_counts / sizeof row_counts[0]; rc++) {
            const int64_t rows = row_counts[rc];
            for (int64_t i = 0; i < rows * k; i++) /* every element a rounding case; NaN-free */
                src[i] = from_bits(round_in[i % CASES]) * (float)(1 + i % 3);
            run(kernel, src, rows, k, panels, bias, out, n);
            int wrong = 0;
            for (int64_t r = 0; r < rows && wrong < 8; r++)
                for (int64_t c = 0; c < n; c++) {
                    const float want = bias[c] + bf16_round(src[r * k + c * stride]);
                    wrong += !TEST_CHECK(&tally, out[r * n + c] == want, "%s k%lld %lld rows: out[%lld, %lld] = "
                                         "%.9g, want %.9g", target->name, (long long)k, (long long)rows,
                                         (long long)r, (long long)c, out[r * n + c], want);
                }
        }
        free(src);
        free(panels);
        free(hf);
    }
}

/* Random operands against a float64 sum of the rounded ones. */
static void test_random_products(const struct sneppx_target *target)
{
    const int64_t ks[] = {1, 7, 512, 1025}, ns[] = {3, 70};
    const int64_t row_counts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 33, 100};
    test_rng rng = test_rng_seeded(17);
    for (size_t kt = 0; kt < sizeof ks / sizeof ks[0]; kt++)
        for (size_t nt = 0; nt < sizeof ns / sizeof ns[0]; nt++) {
            const int64_t k = ks[kt], n = ns[nt], max_rows = 100;
            const int bias_on = (int)(kt + nt) % 2;
            const sneppx_kernel *kernel = resolve(target, k, n, bias_on);
            if (!kernel)
                return;
            float *hf = malloc(sizeof(float) * (size_t)(n * k));
            float *src = malloc(sizeof(float) * (size_t)(max_rows * k));
            float *out = malloc(sizeof(float) * (size_t)(max_rows * n)), *bias = malloc(sizeof(float) * (size_t)n);
            for (int64_t i = 0; i < n * k; i++)
                hf[i] = test_rng_symmetric(&rng, 1.0f);
            for (int64_t i = 0; i < max_rows * k; i++)
                src[i] = test_rng_symmetric(&rng, 2.0f);
            for (int64_t c = 0; c < n; c++)
                bias[c] = test_rng_symmetric(&rng, 0.5f);
            uint16_t *panels = pack(kernel, target, hf, k, n);
            for (size_t rc = 0; rc < sizeof row_counts / sizeof row_counts[0]; rc++) {
                const int64_t rows = row_counts[rc];
                run(kernel, src, rows, k, panels, bias_on ? bias : NULL, out, n);
                double max_err = 0, peak = 0;
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t c = 0; c < n; c++) {
                        double want = bias_on ? bias[c] : 0.0;
                        for (int64_t i = 0; i < k; i++)
                            want += (double)bf16_round(src[r * k + i]) * (double)bf16_round(hf[c * k + i]);
                        const double err = fabs(out[r * n + c] - want);
                        if (isnan(err) || err > max_err) /* a NaN sticks (fmax drops it) */
                            max_err = err;
                        peak = fmax(peak, fabs(want));
                    }
                TEST_CHECK(&tally, max_err <= 1e-5 * peak, "%s k%lld n%lld %lld rows: max error %.3g of %.3g "
                           "(max-normalized %.3g, limit 1e-5)", target->name, (long long)k, (long long)n,
                           (long long)rows, max_err, peak, max_err / peak);
            }
            free(panels);
            free(hf);
            free(src);
            free(out);
            free(bias);
        }
}

static sneppx_config small_config(sneppx_dtype weight_dtype, int compute_dtype)
{
    sneppx_config config;
    sneppx_config_init(&config);
    config.hidden_size = 96;
    config.num_attention_heads = 4;
    config.num_key_value_heads = 2;
    config.head_dim = 32;
    config.num_threads = 1;
    config.weight_dtype = weight_dtype;
    config.compute_dtype = (sneppx_dtype)compute_dtype;
    return config;
}

static void expect_refused(const sneppx_config *config, sneppx_status want, const char *message, const char *what)
{
    sneppx_status status = sneppx_config_validate(config);
    TEST_CHECK(&tally, status == want && strstr(sneppx_last_error(), message) != NULL, "validate %s: %s '%s'", what,
               sneppx_status_name(status), sneppx_last_error());
    sneppx_layer *layer = (sneppx_layer *)config; /* must be set to NULL */
    status = sneppx_layer_create(config, NULL, &layer);
    TEST_CHECK(&tally, status == want && layer == NULL && strstr(sneppx_last_error(), message) != NULL,
               "create %s: %s '%s'", what, sneppx_status_name(status), sneppx_last_error());
}

static void test_config(void)
{
    sneppx_config defaults;
    sneppx_config_init(&defaults);
    TEST_CHECK(&tally, defaults.compute_dtype == SNEPPX_DTYPE_FLOAT32, "default compute_dtype %d",
               defaults.compute_dtype);
    sneppx_config config = small_config(SNEPPX_DTYPE_FLOAT32, SNEPPX_DTYPE_BFLOAT16);
    expect_refused(&config, SNEPPX_ERR_INVALID_ARGUMENT,
                   "config.compute_dtype: bfloat16 needs weight_dtype bfloat16, not float32", "float32 weights");
    config = small_config(SNEPPX_DTYPE_FLOAT16, SNEPPX_DTYPE_BFLOAT16);
    expect_refused(&config, SNEPPX_ERR_INVALID_ARGUMENT,
                   "config.compute_dtype: bfloat16 needs weight_dtype bfloat16, not float16", "float16 weights");
    config = small_config(SNEPPX_DTYPE_BFLOAT16, SNEPPX_DTYPE_FLOAT16);
    expect_refused(&config, SNEPPX_ERR_INVALID_ARGUMENT,
                   "config.compute_dtype: 2 (float16) is not float32 or bfloat16", "float16 compute");
    config = small_config(SNEPPX_DTYPE_BFLOAT16, 1000);
    expect_refused(&config, SNEPPX_ERR_INVALID_ARGUMENT,
                   "config.compute_dtype: 1000 (not a sneppx_dtype) is not float32 or bfloat16", "1000");
    config = small_config(SNEPPX_DTYPE_BFLOAT16, -1);
    expect_refused(&config, SNEPPX_ERR_INVALID_ARGUMENT, "config.compute_dtype: -1", "-1");

    config = small_config(SNEPPX_DTYPE_BFLOAT16, SNEPPX_DTYPE_BFLOAT16);
    if (!host_has_bf16()) {
        expect_refused(&config, SNEPPX_ERR_UNSUPPORTED,
                       "config.compute_dtype: bfloat16 needs a host with avx512_bf16", "no avx512_bf16");
        return;
    }
    /* Pair panels of even k weigh what the bfloat16 weights' panels do: half of float32's. */
    sneppx_layer *layer = NULL, *narrow = NULL;
    sneppx_config plain = small_config(SNEPPX_DTYPE_BFLOAT16, SNEPPX_DTYPE_FLOAT32);
    if (TEST_CHECK(&tally, sneppx_layer_create(&config, NULL, &layer) == SNEPPX_OK, "create: %s",
                   sneppx_last_error()) &&
        TEST_CHECK(&tally, sneppx_layer_create(&plain, NULL, &narrow) == SNEPPX_OK, "create: %s",
                   sneppx_last_error())) {
        const char *keys = sneppx_layer_keys(layer);
        TEST_CHECK(&tally, strstr(keys, "gemm_bf16dot-k96-n256-bias1-v16\n") &&
                               strstr(keys, "gemm_bf16dot-k128-n96-bias1-v16\n") && !strstr(keys, "gemm-"),
                   "keys '%s'", keys);
        TEST_CHECK(&tally, sneppx_layer_weight_bytes(layer) == sneppx_layer_weight_bytes(narrow),
                   "%.0f bytes, bfloat16 weights %.0f", sneppx_layer_weight_bytes(layer),
                   sneppx_layer_weight_bytes(narrow));
    }
    sneppx_layer_destroy(layer);
    sneppx_layer_destroy(narrow);
}

int main(void)
{
    for (int t = 0; t < sneppx_target_count; t++) {
        const struct sneppx_target *target = &sneppx_targets[t];
        if (!runnable(target))
            continue;
        test_pack_layout(target);
        test_activation_rounding(target);
        test_random_products(target);
    }
    test_config();
    return test_finish(&tally);
}
