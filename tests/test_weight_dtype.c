/* Narrow weight storage (sneppx_config.weight_dtype), at the kernel and the C API:
 *   - the GEMM's _pack entry rounds to the type, bit for bit: bfloat16 to nearest
 *     even (ties both ways, signs), NaN stays NaN, inf stays inf, the largest floats
 *     round to inf; float16 to nearest even, subnormals, 65504 kept and 65520 to
 *     inf, NaN; for every target (v16 runs only on an AVX-512 host);
 *   - the product widens those panels exactly: with one-hot activations each output
 *     is one stored weight, through the decode sweep (1 row) and both microkernel
 *     heights (2 and 14+ rows), so a wrong widening or element size shows at once;
 *   - sneppx_layer_weight_bytes() counts the narrow panels: half the float32
 *     panels, biases unchanged;
 *   - a weight_dtype outside the enum is refused by sneppx_config_validate and
 *     sneppx_layer_create, naming config.weight_dtype; sneppx_dtype_name().
 * The numerics of whole layers (every family against the float64 reference on
 * the rounded weights, the cached forward, the vendored layer) are in
 * tests/python/test_weight_dtype.py. */
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

static float half_float(uint16_t h)
{
    /* float16 -> float, by the format's definition (independent of the kernels). */
    const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    const float sign = (h & 0x8000) ? -1.0f : 1.0f;
    if (exponent == 0x1f)
        return mantissa ? NAN : sign * INFINITY;
    if (exponent == 0)
        return sign * ldexpf((float)mantissa, -24);
    return sign * ldexpf((float)(mantissa | 0x400), exponent - 25);
}

struct rounding {
    uint32_t in;      /* float32 bits */
    uint16_t out;     /* the type's bits; for a NaN: any NaN of the sign */
};

static const struct rounding bf16_cases[] = {
    {0x3f800000u, 0x3f80}, /* 1 */
    {0x3f808000u, 0x3f80}, /* halfway between 0x3f80 and 0x3f81: to the even one, down */
    {0x3f818000u, 0x3f82}, /* halfway between 0x3f81 and 0x3f82: to the even one, up */
    {0x3f808001u, 0x3f81}, /* just above halfway: up */
    {0x3f807fffu, 0x3f80}, /* just below halfway: down */
    {0xbf818000u, 0xbf82}, /* a negative tie */
    {0x7f800000u, 0x7f80}, /* inf */
    {0xff800000u, 0xff80}, /* -inf */
    {0x7f7fffffu, 0x7f80}, /* FLT_MAX rounds past the largest bfloat16: inf */
    {0x7fc00000u, 0x7fc0}, /* quiet NaN */
    {0x7f800001u, 0x7fc0}, /* a NaN whose payload lies in the dropped bits: still NaN */
    {0xff800001u, 0xffc0}, /* and of its sign */
    {0x00000001u, 0x0000}, /* the smallest subnormal float: to zero */
    {0x80000000u, 0x8000}, /* -0 */
};

static const struct rounding f16_cases[] = {
    {0x3f800000u, 0x3c00}, /* 1 */
    {0x3f801000u, 0x3c00}, /* 1 + 2^-11, halfway to 1 + 2^-10: to even, down */
    {0x3f803000u, 0x3c02}, /* 1 + 3 * 2^-11: to even, up */
    {0x477fe000u, 0x7bff}, /* 65504, the largest float16 */
    {0x477fefffu, 0x7bff}, /* just below 65520: 65504 */
    {0x477ff000u, 0x7c00}, /* 65520, halfway past 65504: inf */
    {0x49742400u, 0x7c00}, /* 1e6: inf */
    {0xc9742400u, 0xfc00}, /* -1e6: -inf */
    {0x7f800000u, 0x7c00}, /* inf */
    {0x7fc00000u, 0x7e00}, /* NaN */
    {0x38800000u, 0x0400}, /* 2^-14, the smallest normal */
    {0x33800000u, 0x0001}, /* 2^-24, the smallest subnormal */
    {0x33000000u, 0x0000}, /* 2^-25, halfway between 0 and 2^-24: to even, 0 */
    {0x33c00000u, 0x0002}, /* 3 * 2^-25, halfway between 1 and 2 subnormal steps: 2 */
    {0x387fe000u, 0x0400}, /* 2^-14 - 2^-25, halfway between 1023 and 1024 steps: to even, the smallest normal */
    {0x387fc000u, 0x03ff}, /* 2^-14 - 2^-24: the largest subnormal */
    {0xb3800000u, 0x8001}, /* -2^-24 */
};

static int is_nan16(uint16_t bits, int bf16)
{
    return bf16 ? ((bits & 0x7f80) == 0x7f80 && (bits & 0x7f)) : ((bits & 0x7c00) == 0x7c00 && (bits & 0x3ff));
}

/* A case's input if it packs to a finite value, else 0.5: column 1 checks the
 * widening of every finite case exactly (subnormals, the largest values). */
static float finite_case(const struct rounding *c, int bf16)
{
    const int finite = bf16 ? (c->out & 0x7f80) != 0x7f80 : (c->out & 0x7c00) != 0x7c00;
    return finite ? from_bits(c->in) : 0.5f;
}

/* Packs the cases as column 0 of an [n, k] matrix (k = the case count) with the
 * _pack entry of a `dtype` GEMM for target, checks the stored bits, then runs the
 * product on one-hot rows and checks that each output is the stored value widened. */
static void check_type(const struct sneppx_target *target, int dtype, const struct rounding *cases, int count)
{
    const int bf16 = dtype == SNEPPX_DTYPE_BFLOAT16;
    const int64_t k = count, n = 3, nr = target->gemm_nr;
    const int64_t values[] = {k, n, 0, dtype};
    const sneppx_kernel *kernel;
    if (!TEST_CHECK(&tally, sneppx_kernel_resolve("gemm", values, target, &kernel) == SNEPPX_OK, "%s %s: %s",
                    target->name, sneppx_dtype_name(dtype), sneppx_last_error()))
        return;
    float hf[3 * 32];
    for (int64_t c = 0; c < n; c++)
        for (int64_t i = 0; i < k; i++)
            hf[c * k + i] = c == 0 ? from_bits(cases[i].in) : c == 1 ? finite_case(&cases[i], bf16)
                                                                       : 0.25f * (float)(c * k + i); /* exact */
    const int64_t bytes = sneppx_gemm_packed_bytes(k, n, nr, 2);
    uint16_t *panels = aligned_alloc(64, (size_t)(bytes + 63) / 64 * 64);
    memset(panels, 0xff, (size_t)bytes); /* columns past n must come out zero */
    struct sneppx_args pack = {.struct_size = sizeof pack, .abi_version = SNEPPX_ABI_VERSION, .col_begin = 0,
                               .col_end = n, .src = hf, .src_stride = k, .dst = (float *)panels};
    kernel->entry[SNEPPX_ENTRY_PACK](&pack);
    int wrong = 0;
    for (int i = 0; i < count; i++) {
        const uint16_t got = panels[i * nr];
        const int ok = is_nan16(cases[i].out, bf16) ? is_nan16(got, bf16) && (got & 0x8000) == (cases[i].out & 0x8000)
                                                    : got == cases[i].out;
        wrong += !TEST_CHECK(&tally, ok, "%s %s: 0x%08x packed as 0x%04x, want 0x%04x", target->name,
                             sneppx_dtype_name(dtype), (unsigned)cases[i].in, got, cases[i].out);
    }
    for (int64_t i = 0; i < k; i++)
        for (int64_t c = n; c < nr; c++)
            wrong += !TEST_CHECK(&tally, panels[i * nr + c] == 0, "%s %s: padding column %lld of k %lld is 0x%04x",
                                 target->name, sneppx_dtype_name(dtype), (long long)c, (long long)i,
                                 panels[i * nr + c]);

    /* Row r of src is one-hot at k = r % k: out[r, c] is the stored W[c, r % k]. */
    enum { MAX_ROWS = 40 };
    const int64_t row_counts[] = {1, 2, MAX_ROWS};
    float src[MAX_ROWS * 32], out[MAX_ROWS * 3];
    for (size_t t = 0; t < sizeof row_counts / sizeof row_counts[0]; t++) {
        const int64_t rows = row_counts[t];
        memset(src, 0, sizeof src);
        for (int64_t r = 0; r < rows; r++)
            src[r * k + r % k] = 1.0f;
        struct sneppx_args run = {.struct_size = sizeof run, .abi_version = SNEPPX_ABI_VERSION, .row_begin = 0,
                                  .row_end = rows, .col_begin = 0, .col_end = n, .src = src, .src_stride = k,
                                  .weight = panels, .dst = out, .dst_stride = n};
        kernel->entry[SNEPPX_ENTRY_RUN](&run);
        for (int64_t r = 0; r < rows && wrong < 8; r++)
            for (int64_t c = 0; c < n; c++) {
                const uint16_t stored = panels[(r % k) * nr + c];
                float want = bf16 ? from_bits((uint32_t)stored << 16) : half_float(stored);
                const float got = out[r * n + c];
                /* 1 * w + 0 * (the other weights): inf * 0 is NaN, as in any float product */
                int has_inf = 0;
                for (int64_t i = 0; i < k; i++) {
                    const uint16_t w = panels[i * nr + c];
                    has_inf |= bf16 ? (w & 0x7fff) >= 0x7f80 : (w & 0x7fff) >= 0x7c00;
                }
                if (has_inf)
                    want = NAN;
                const int ok = isnan(want) ? isnan(got) : got == want;
                wrong += !TEST_CHECK(&tally, ok, "%s %s: %lld rows: out[%lld, %lld] = %g, want %g", target->name,
                                     sneppx_dtype_name(dtype), (long long)rows, (long long)r, (long long)c, got,
                                     want);
            }
    }
    free(panels);
}

/* Column 0 holds inf/NaN cases, so its products are NaN (inf * 0); columns 1 and
 * 2 hold finite values only and check the widening exactly. */
static void test_rounding_and_widening(void)
{
    for (int t = 0; t < sneppx_target_count; t++) {
        const struct sneppx_target *target = &sneppx_targets[t];
        if (target->vector_width > sneppx_host_target()->vector_width)
            continue; /* this host cannot run it */
        check_type(target, SNEPPX_DTYPE_BFLOAT16, bf16_cases, (int)(sizeof bf16_cases / sizeof bf16_cases[0]));
        check_type(target, SNEPPX_DTYPE_FLOAT16, f16_cases, (int)(sizeof f16_cases / sizeof f16_cases[0]));
    }
}

static sneppx_config small_config(int bias)
{
    sneppx_config config;
    sneppx_config_init(&config);
    config.hidden_size = 96; /* not a multiple of the panel width */
    config.num_attention_heads = 4;
    config.num_key_value_heads = 2;
    config.head_dim = 32;
    config.qkv_bias = config.o_bias = bias;
    config.num_threads = 1;
    return config;
}

static void test_weight_bytes(void)
{
    for (int bias = 0; bias <= 1; bias++) {
        double bytes[SNEPPX_DTYPE_COUNT];
        for (int dtype = 0; dtype <= SNEPPX_DTYPE_FLOAT16; dtype++) { /* the weight types */
            sneppx_config config = small_config(bias);
            config.weight_dtype = (sneppx_dtype)dtype;
            sneppx_layer *layer = NULL;
            bytes[dtype] = -1;
            if (TEST_CHECK(&tally, sneppx_layer_create(&config, NULL, &layer) == SNEPPX_OK, "%s: %s",
                           sneppx_dtype_name(dtype), sneppx_last_error())) {
                bytes[dtype] = sneppx_layer_weight_bytes(layer);
                char want[64];
                snprintf(want, sizeof want, "-bias%d-%s-", bias, sneppx_dtype_name(dtype));
                TEST_CHECK(&tally, strstr(sneppx_layer_keys(layer), want) != NULL, "keys '%s' lack '%s'",
                           sneppx_layer_keys(layer), want);
            }
            sneppx_layer_destroy(layer);
        }
        /* q|k|v (4 + 2 + 2 heads of 32) and o (96) biases: float32 in every type. */
        const double bias_bytes = bias ? 4.0 * (8 * 32 + 96) : 0.0;
        for (int dtype = 1; dtype <= SNEPPX_DTYPE_FLOAT16; dtype++)
            TEST_CHECK(&tally, bytes[dtype] == (bytes[0] - bias_bytes) / 2 + bias_bytes,
                       "bias %d: %s layer weighs %.0f bytes, float32 %.0f (biases %.0f)", bias,
                       sneppx_dtype_name(dtype), bytes[dtype], bytes[0], bias_bytes);
    }
}

static void test_bad_dtype(void)
{
    const int bad[] = {SNEPPX_DTYPE_INT8, SNEPPX_DTYPE_COUNT, -1, 1000}; /* int8: a KV cache type only */
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sneppx_config config = small_config(0);
        config.weight_dtype = (sneppx_dtype)bad[i];
        sneppx_status status = sneppx_config_validate(&config);
        TEST_CHECK(&tally, status == SNEPPX_ERR_INVALID_ARGUMENT &&
                               strstr(sneppx_last_error(), "config.weight_dtype") &&
                               strstr(sneppx_last_error(), "float32, bfloat16, float16"),
                   "validate %d: %s '%s'", bad[i], sneppx_status_name(status), sneppx_last_error());
        sneppx_layer *layer = (sneppx_layer *)&config; /* must be set to NULL */
        status = sneppx_layer_create(&config, NULL, &layer);
        TEST_CHECK(&tally, status == SNEPPX_ERR_INVALID_ARGUMENT && layer == NULL &&
                               strstr(sneppx_last_error(), "config.weight_dtype"),
                   "create %d: %s '%s'", bad[i], sneppx_status_name(status), sneppx_last_error());
    }
    TEST_CHECK(&tally, strcmp(sneppx_dtype_name(SNEPPX_DTYPE_FLOAT32), "float32") == 0 &&
                           strcmp(sneppx_dtype_name(SNEPPX_DTYPE_BFLOAT16), "bfloat16") == 0 &&
                           strcmp(sneppx_dtype_name(SNEPPX_DTYPE_FLOAT16), "float16") == 0 &&
                           sneppx_dtype_name(SNEPPX_DTYPE_COUNT) == NULL && sneppx_dtype_name(-1) == NULL,
               "sneppx_dtype_name");
    sneppx_config config;
    sneppx_config_init(&config);
    TEST_CHECK(&tally, config.weight_dtype == SNEPPX_DTYPE_FLOAT32, "default weight_dtype %d", config.weight_dtype);
}

int main(void)
{
    test_rounding_and_widening();
    test_weight_bytes();
    test_bad_dtype();
    return test_finish(&tally);
}
